#!/usr/bin/env bash
# Fresh machine -> the default job: installs what is missing, builds the CLI alone into a build directory
# of its own, then runs the quick ablation (experiments/ablations/quick.json: deep-mlp with fp16 and fp8
# gradients under none, torch and adaptive measured with derived and with reference bounds, and the fp32-gradient
# row, 2 seeds, 18 short runs) into runs/quick and prints its table.
# Plots (runs/quick/table.png, per-run trace plots) when /usr/bin/python3 has matplotlib. Run it again
# and it resumes: finished runs are kept, the table is printed again.
#
# The build is what the demo runs and nothing more: the CPU engine and the CLI (no CUDA backend, MPI,
# tests, fuzz targets or Python package, whatever the machine has; scripts/build.sh and scripts/test.sh
# build those into build/), compiled as a unity build (CMAKE_UNITY_BUILD, cmake/unity_build.cmake: a
# few large translation units instead of ~115 small ones that each parse Eigen and nlohmann/json
# again), warnings not fatal.
#   DEMO_BUILD_DIR=DIR (default build-demo), DEMO_OUT=DIR (default runs/quick),
#   DEMO_JOBS=N runs at a time (default 2), JOBS=N compile jobs (default nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${DEMO_BUILD_DIR:-build-demo}
configure() {
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD="$1" \
    -DGRADSCALE_CUDA=OFF -DGRADSCALE_MPI=OFF -DGRADSCALE_PYTHON=OFF -DGRADSCALE_TESTS=OFF \
    -DGRADSCALE_INSTALL=OFF -DGRADSCALE_WERROR=OFF
}
configure ON
if ! cmake --build "$build" -j "${JOBS:-$(nproc)}" --target gradscale; then
  echo "demo: the unity build failed (two sources of one batch define the same file-local name? see" \
       "cmake/unity_build.cmake); building file by file" >&2
  configure OFF
  cmake --build "$build" -j "${JOBS:-$(nproc)}" --target gradscale
fi
out=${DEMO_OUT:-runs/quick}
"$build"/gradscale ablate experiments/ablations/quick.json --out "$out" --jobs "${DEMO_JOBS:-2}"
echo "demo: the table above is $out/table.md (also table.csv, table.tex); each run is in $out/runs/<name>/"
echo "demo: the CLI is $build/gradscale (CPU only); scripts/build.sh builds everything into build/"
