#!/usr/bin/env bash
# Fresh machine -> the default job: installs what is missing, configures, builds the CLI (and what it
# needs: not the tests, fuzz targets or the Python package; scripts/test.sh builds those), then runs the quick
# ablation (experiments/ablations/quick.json: deep-mlp with fp16 and fp8 gradients under three
# scalers, 2 seeds, 12 short runs; under 2 minutes on 2 cores) into runs/quick and prints its table.
# Plots (runs/quick/table.png, per-run trace plots) when /usr/bin/python3 has matplotlib. Run it again
# and it resumes: finished runs are kept, the table is printed again.
#   DEMO_OUT=DIR (default runs/quick), DEMO_JOBS=N runs at a time (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_TARGET=gradscale scripts/build.sh
build=${BUILD_DIR:-build}
out=${DEMO_OUT:-runs/quick}
"$build"/gradscale ablate experiments/ablations/quick.json --out "$out" --jobs "${DEMO_JOBS:-2}"
echo "demo: the table above is $out/table.md (also table.csv, table.tex); each run is in $out/runs/<name>/"
