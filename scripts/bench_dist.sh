#!/usr/bin/env bash
# Data-parallel benchmark (docs/distributed.md): the same training run in one process and under
# `mpirun -np 2` (each rank half of every batch), printing the time per step and what the reductions
# moved per step and rank — the statistics (per-layer queries inside backward, the join maxima, the
# step summary) against the gradients (each weight gradient, summed before its rounding).
#   scripts/bench_dist.sh [--steps N] [--batch B] [--model M] [--scaler JSON] [--threads T] [-- TRAIN_ARGS...]
# Defaults: 60 steps of the mlp on synthetic data, batch 256, fp16, adaptive/measured, 1 thread per rank.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=60 batch=256 model=mlp threads=1 scaler='{"policy":"adaptive","method":"measured"}'
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --scaler) scaler="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "bench_dist.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
gs="${GRADSCALE:-build/gradscale}"
[ -x "$gs" ] || { echo "bench_dist.sh: no $gs (build first, or set GRADSCALE)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "bench_dist.sh: no mpirun (scripts/setup.sh installs openmpi-bin)" >&2; exit 2; }
mpi=(mpirun --oversubscribe -np 2)
[ "$(id -u)" != 0 ] || mpi+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=none
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# synthetic data large enough that no epoch ends inside the measured steps
args=(train --model "$model" --data "synthetic:$((steps * batch + batch))" --format fp16 --scaler "$scaler"
      --batch "$batch" --max-steps "$steps" --threads "$threads" --quiet "${extra[@]}")
"$gs" "${args[@]}" --result "$out/r1.json" >/dev/null
"${mpi[@]}" "$gs" "${args[@]}" --result "$out/r2.json" >/dev/null
python3 - "$out/r1.json" "$out/r2.json" "$steps" "$batch" "$model" <<'PY'
import json, sys
r1, r2 = (json.load(open(p)) for p in sys.argv[1:3])
steps, batch, model = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
print(f"model {model}, batch {batch} ({r1['parameters']} parameters), {steps} steps, "
      f"{r1['config']['threads']} thread(s) per rank; scaler {r1['config']['scaler'].get('policy')}"
      f"/{r1['config']['scaler'].get('method', '-')}")
print("ranks  ms/step  statistics: B/step (collectives) ms/step  gradients: B/step (collectives) ms/step  skipped")
for n, r in ((1, r1), (2, r2)):
    s = r["steps"]
    ms = 1e3 * r["train_seconds"] / s
    d = r.get("data_parallel", {})
    st = f"{d.get('statistics_bytes', 0) / s:.0f} ({d.get('statistics_collectives', 0) / s:.1f}) {1e3 * d.get('statistics_seconds', 0) / s:.2f}"
    gr = f"{d.get('gradient_bytes', 0) / s:.0f} ({d.get('gradient_collectives', 0) / s:.1f}) {1e3 * d.get('gradient_seconds', 0) / s:.2f}"
    print(f"{n:5d}  {ms:7.2f}  {st:>39}  {gr:>38}  {r['skipped_steps']}")
PY
