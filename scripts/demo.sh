#!/usr/bin/env bash
# Fresh machine -> the default job: installs what is missing, configures, builds, then trains the
# default experiment (experiments/configs/default.json: mlp on Fashion-MNIST in emulated fp16 with
# PyTorch's dynamic loss scaling) and writes runs/default/result.json (+ a PNG when matplotlib is there).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build=${BUILD_DIR:-build}
out=runs/default
mkdir -p "$out"
"$build"/gradscale formats
"$build"/gradscale train --config experiments/configs/default.json --result "$out/result.json"
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 scripts/plot_result.py "$out/result.json" --out "$out/curves.png"
else
  echo "demo: matplotlib not installed (scripts/setup.sh installs it): no plot"
fi
echo "demo: result in $out/result.json"
