#!/usr/bin/env bash
# On a GPU machine without package registries (docs/gpu.md): configures gradscale with CUDA ON against
# the dependencies gathered by scripts/gpu_bundle.sh, builds, runs the GPU tests (or the whole suite)
# and the benchmarks (`gradscale bench cuda`, `bench step` on resnet-mini next to PyTorch AMP), and copies
# the logs to $OUT when that is set. Exits non-zero when the build or a test fails.
# Only what the GPU answers is built: the CLI, the test binary and, when python3 has pybind11 and its
# headers, the plug-in's core (its pytest then runs with the GPU tests, under the machine's torch 2.x).
# The CPU execution target and the fuzz targets are CI's business and are left out, and so is -Werror:
# the machine's compiler is not CI's, and a new warning there should not stop the run.
#   scripts/gpu_run.sh [--deps DIR] [--build DIR] [--all-tests] [--no-bench] [--arch LIST]
#     --deps DIR    the bundle (default build-deps/gpu)     --build DIR  build folder (default build-gpu)
#     --all-tests   the whole suite, not only the CUDA tests --no-bench  skip `gradscale bench cuda`
#     --arch LIST   CMAKE_CUDA_ARCHITECTURES (default 90: the H100 / H200 only, the quickest build)
set -euo pipefail
cd "$(dirname "$0")/.."
deps=build-deps/gpu
build=build-gpu
all_tests=0
bench=1
arch=90
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) deps=$2; shift ;;
    --build) build=$2; shift ;;
    --all-tests) all_tests=1 ;;
    --no-bench) bench=0 ;;
    --arch) arch=$2; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "gpu_run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -d "$deps/usr/include" ] || { echo "gpu_run.sh: no bundle in $deps: run scripts/gpu_bundle.sh where apt works and carry it" >&2; exit 2; }
prefix=$(realpath "$deps/usr")
logs=${OUT:-$build/logs}
mkdir -p "$logs"
export PATH="/usr/local/cuda/bin:$PATH"
# The bundle's shared libraries (Boost.Program_options) for the programs built here.
export LD_LIBRARY_PATH="$prefix/lib/x86_64-linux-gnu:$(realpath "$deps")/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
  echo "== machine"
  nvidia-smi -L || echo "nvidia-smi: not available"
  nvcc --version | tail -2 || true
  cmake --version | head -1
  cat "$deps/MANIFEST" 2>/dev/null || true
} 2>&1 | tee "$logs/configure.txt"

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
echo "== configure and build ($build, CUDA architectures $arch)"
start=$(date +%s)
phase() { echo "[$(( $(date +%s) - start )) s] $*"; }
python_args=()
command -v python3 >/dev/null 2>&1 && python_args=(-DPython3_EXECUTABLE="$(command -v python3)")
# -g: symbols for a backtrace (below), the same optimised code.
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g -DGRADSCALE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_PREFIX_PATH="$prefix" -DGRADSCALE_CUDA_ON_CPU=OFF \
  -DGRADSCALE_FUZZ=OFF -DGRADSCALE_WERROR=OFF "${python_args[@]}" 2>&1 | tee -a "$logs/configure.txt"
targets=(gradscale gradscale_tests)
plugin=0
if grep -q "gradscale: Python module ON" "$logs/configure.txt"; then targets+=(gradscale_core); plugin=1; fi
target_args=(--target "${targets[@]}")
[ "$all_tests" -eq 1 ] && target_args=()  # the whole suite needs every target (the install test, MPI)
phase "building ${targets[*]}$([ "$all_tests" -eq 1 ] && echo " and every other target")"
if ! cmake --build "$build" -j "$(nproc)" "${target_args[@]}" >"$logs/build.txt" 2>&1; then
  tail -40 "$logs/build.txt"
  echo "gpu_run.sh: build failed (log: $logs/build.txt)" >&2
  exit 1
fi
phase "built: $(grep -c "Building" "$logs/build.txt") sources, $(grep -c "warning" "$logs/build.txt") warning lines"
# The plug-in's pytest runs on the package as pip installs it (editable, from this build directory);
# pip needs scikit-build-core on the machine (no index there: carry its wheel, docs/gpu.md). Unstripped,
# so that a backtrace below names the core's functions.
if [ "$plugin" -eq 1 ]; then
  if python3 -c 'import scikit_build_core' 2>/dev/null &&
     python3 -m pip install -q --no-build-isolation --no-deps -e . --config-settings=build-dir="$build" \
       --config-settings=install.strip=false \
       >>"$logs/build.txt" 2>&1; then
    phase "the Python package installed (editable)"
  else
    echo "gpu_run.sh: the plug-in's pytest is left out: pip could not install the package (scikit-build-core missing?)"
    plugin=0
  fi
fi

echo "== tests"
filter=()
# The GPU tests; not their CPU-target twins ("cpu target: ...", label cuda_on_cpu), which CI runs.
# With the plug-in built, its pytest too: the image's torch is 2.x, CI's Debian torch 1.13.
if [ "$all_tests" -eq 0 ]; then
  if [ "$plugin" -eq 1 ]; then filter=(-R "cuda|CUDA|python plug-in" -LE cuda_on_cpu); else filter=(-R "cuda|CUDA" -LE cuda_on_cpu); fi
fi
status=0
(cd "$build" && ctest --output-on-failure --timeout 120 -j 4 "${filter[@]}") 2>&1 | tee "$logs/tests.txt" || status=1
phase "tests done"
# A test process that died (Python's "Fatal Python error", a signal): that one test again under the
# debugger, and its native backtrace appended to tests.txt (the Python stack names the test).
crashed=$(grep -A40 "Fatal Python error" "$logs/tests.txt" | sed -n 's/^ *File "\(.*\/tests\/test_[a-z0-9_]*\.py\)", line [0-9]* in \(test_[A-Za-z0-9_]*\)$/\1::\2/p' | head -1 || true)
debugger=$(command -v gdb || command -v cuda-gdb || true)
if [ -n "$crashed" ] && [ -n "$debugger" ]; then
  echo "== $crashed crashed: its native backtrace ($debugger)" | tee -a "$logs/tests.txt"
  (cd python && timeout 120 "$debugger" -q -batch -ex run -ex bt --args python3 -m pytest -q -p no:cacheprovider "$crashed") 2>&1 |
    grep -v "^\[New Thread\|^\[Thread\|^\[Detaching\|Cuda Driver error" | tail -60 | tee -a "$logs/tests.txt" || true
fi

# Data-parallel on the GPU (docs/distributed.md, "On GPUs"): 2 ranks against one process, the same
# decisions expected at every step. `host` collectives (one GPU takes both ranks); NCCL too when the
# machine has two GPUs. Only when the machine has mpirun and this build found MPI.
echo "== mpirun -np 2 gradscale train --device cuda against one process"
if command -v mpirun >/dev/null 2>&1 && ldd "$build/gradscale" | grep -q libmpi; then
  dp=(train --model deep-mlp:depth=6,width=64,gain=0.5 --data synthetic:1024 --format fp8_e5m2 --batch 64
      --max-steps 16 --threads 1 --trace-every 1 --quiet --device cuda
      --scaler '{"policy":"adaptive","method":"measured"}')
  mpi=(mpirun --oversubscribe -np 2)
  [ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
  kinds=(host)
  [ "$(nvidia-smi -L 2>/dev/null | grep -c GPU)" -ge 2 ] && kinds+=(nccl)
  # The traces stay in the build folder: what comes back from a lent machine is at most 8 files.
  mkdir -p "$build/dp"
  "$build/gradscale" "${dp[@]}" --trace "$build/dp/one" >"$logs/dp.txt" 2>&1 || status=1
  for kind in "${kinds[@]}"; do
    env OMPI_MCA_btl_vader_single_copy_mechanism=none "${mpi[@]}" "$build/gradscale" "${dp[@]}" \
      --gpu-collectives "$kind" --trace "$build/dp/two_$kind" --result "$build/dp/two_$kind.result.json" >>"$logs/dp.txt" 2>&1 || status=1
    python3 - "$build/dp/one.jsonl" "$build/dp/two_$kind.jsonl" "$kind" <<'PY' 2>&1 | tee -a "$logs/dp.txt" || status=1
import json, sys
def steps(p):
    return [j for j in map(json.loads, open(p)) if j.get("type") == "step"]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
keys = ("S0", "skipped", "found_inf", "phi")
diff = sum(x.get(k) != y.get(k) for x, y in zip(a, b) for k in keys)
layers = [(u, v) for x, y in zip(a, b) for u, v in zip(x["layers"], y["layers"])]
ldiff = sum(u.get(k) != v.get(k) for u, v in layers for k in ("s", "S", "S_in"))
print(f"data-parallel {sys.argv[3]}: {len(a)}/{len(b)} steps, {diff} step decisions and {ldiff} of "
      f"{3 * len(layers)} layer decisions differ from one process")
sys.exit(0 if len(a) == len(b) and diff == 0 and ldiff == 0 else 1)
PY
  done
  # Time per step with 1 and 2 ranks on the GPU, and what the reductions moved (docs/distributed.md).
  echo "== scripts/bench_dist.sh --model resnet-mini --batch 256 -- --device cuda --gpu-collectives host" | tee -a "$logs/dp.txt"
  GRADSCALE="$build/gradscale" bash scripts/bench_dist.sh --model resnet-mini --batch 256 --steps 30 -- \
    --device cuda --gpu-collectives host 2>&1 | tee -a "$logs/dp.txt" || status=1
  phase "data-parallel done"
else
  echo "skipped: no mpirun on this machine, or this build has no MPI"
fi

if [ "$bench" -eq 1 ]; then
  echo "== gradscale bench cuda"
  timeout 120 "$build/gradscale" bench cuda 2>&1 | tee "$logs/bench_cuda.txt" || status=1
  phase "bench cuda done"
  # Below the layer: every kernel's device time in two steps of resnet-mini (Nsight Compute, where the
  # machine has it), grouped by kernel (scripts/ncu_summary.py); appended to bench_cuda.txt.
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true)
  if [ -n "$ncu" ]; then
    echo "== ncu: kernels of gradscale bench step --model resnet-mini --batch 256 --scaler measured, 2 steps" |
      tee -a "$logs/bench_cuda.txt"
    if timeout 240 "$ncu" --clock-control none --csv --page raw --metrics gpu__time_duration.sum \
        "$build/gradscale" bench step --model resnet-mini --data synthetic:1024 --format fp16 --batch 256 \
        --scaler '{"policy":"adaptive","method":"measured"}' --device cuda --steps 2 --warmup 1 \
        >"$build/ncu_raw.csv" 2>"$build/ncu_err.txt"; then
      python3 scripts/ncu_summary.py "$build/ncu_raw.csv" --top 30 2>&1 | tee -a "$logs/bench_cuda.txt" || status=1
    else
      tail -5 "$build/ncu_err.txt" | tee -a "$logs/bench_cuda.txt"
      status=1
    fi
    phase "ncu done"
  fi
  # What ptxas gave each kernel (registers, spills, blocks per SM) with this machine's nvcc, beside the
  # times above: appended to bench_cuda.txt.
  echo "== scripts/kernel_registers.py (sm_90)" | tee -a "$logs/bench_cuda.txt"
  timeout 120 python3 scripts/kernel_registers.py --build "$build" --jobs "$(nproc)" 2>&1 |
    tee -a "$logs/bench_cuda.txt" || status=1
  # The training step of resnet-mini at batch 256 on the GPU: static vs adaptive approx_range vs
  # measured (with the share in cuBLAS GEMMs), then PyTorch AMP (autocast fp16 + GradScaler) and fp32
  # on the same model; the mlp on the GPU next to the CPU; the plug-in on CUDA tensors.
  for scaler in static:1024 '{"policy":"adaptive","method":"approx_range"}' \
    '{"policy":"adaptive","method":"measured"}'; do
    echo "== gradscale bench step --model resnet-mini --format fp16 --batch 256 --scaler $scaler --device cuda"
    timeout 90 "$build/gradscale" bench step --model resnet-mini --data synthetic:4096 --format fp16 --batch 256 \
      --scaler "$scaler" --device cuda --steps 50 --warmup 5 2>&1 |
      tee -a "$logs/bench_step.txt" || status=1
  done
  # The convolutions' forward pass without columns (conv_algorithm implicit), static and measured.
  for scaler in static:1024 '{"policy":"adaptive","method":"measured"}'; do
    echo "== gradscale bench step --model resnet-mini --format fp16 --batch 256 --scaler $scaler --device cuda --conv-algorithm implicit"
    timeout 90 "$build/gradscale" bench step --model resnet-mini --data synthetic:4096 --format fp16 --batch 256 \
      --scaler "$scaler" --device cuda --conv-algorithm implicit --steps 50 --warmup 5 2>&1 |
      tee -a "$logs/bench_step.txt" || status=1
  done
  for mode in amp fp32; do
    echo "== peer_torch_amp.py --mode $mode --batch 256"
    timeout 90 python3 scripts/peer_torch_amp.py --mode "$mode" --batch 256 --steps 50 --warmup 5 2>&1 |
      tee -a "$logs/peer_amp.txt" || status=1
  done
  for device in cuda cpu; do
    echo "== gradscale bench step --model mlp --format fp16 --batch 256 --scaler static:1024 --device $device"
    timeout 90 "$build/gradscale" bench step --model mlp --data synthetic:4096 --format fp16 --batch 256 \
      --scaler static:1024 --device "$device" --steps 50 --warmup 5 2>&1 |
      tee -a "$logs/bench_step.txt" || status=1
  done
  phase "bench step and peer done"
  if [ "$plugin" -eq 1 ]; then
    # The plug-in on CUDA tensors (lib/cuda's roundings and statistics) next to PyTorch AMP.
    echo "== python/examples/bench_overhead.py --device cuda"
    (cd python && PYTHONUNBUFFERED=1 timeout 150 python3 examples/bench_overhead.py --device cuda --steps 20) 2>&1 |
      tee "$logs/plugin_cuda.txt" || status=1
    # The same at 16 times the batches: whether the GEMMs or the host's work per layer set the step.
    echo "== python/examples/bench_overhead.py --device cuda --batch-mult 16" | tee -a "$logs/plugin_cuda.txt"
    (cd python && PYTHONUNBUFFERED=1 timeout 150 python3 examples/bench_overhead.py --device cuda --steps 10 \
      --batch-mult 16) 2>&1 | tee -a "$logs/plugin_cuda.txt" || status=1
    phase "plug-in bench done"
  fi
fi
exit "$status"
