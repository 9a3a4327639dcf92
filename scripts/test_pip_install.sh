#!/usr/bin/env bash
# The Python package as a user installs it: a fresh venv (system site packages, for Debian's torch),
# `pip wheel .` from this checkout, `pip install` of that wheel into the venv, import, 5 training steps
# of a small model with a Scaler, `pip uninstall`. The wheel is built by .venv's pip and build backend
# on the build directory of scripts/build.sh (${BUILD_DIR:-build}), so nothing is compiled again (and
# .venv's own install is left alone). Run by scripts/test.sh after scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build_dir=${BUILD_DIR:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip_from_checkout() {  # pip of .venv (where scikit-build-core is), on this checkout and build directory
  local generator
  generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build_dir/CMakeCache.txt")
  CMAKE_GENERATOR="$generator" .venv/bin/python -m pip "$@" --no-build-isolation --no-deps -q \
    --config-settings=build-dir="$build_dir" .
}
passed=0
check() { echo "pip install: $1"; passed=$((passed + 1)); }

start=$(date +%s)
pip_from_checkout wheel -w "$tmp/dist"
wheel=$(ls "$tmp"/dist/gradscale-*.whl)
contents=$(python3 -m zipfile -l "$wheel")
for f in gradscale/__init__.py gradscale/py.typed gradscale/torch/scaler.py gradscale/_core. gradscale/libgradscale_core.so; do
  grep -q "$f" <<<"$contents" || { echo "pip install: FAILED: $wheel lacks $f"; exit 1; }
done
if grep -q "_core_cpu_target" <<<"$contents"; then echo "pip install: FAILED: $wheel holds the tests' module"; exit 1; fi
check "pip wheel built $(basename "$wheel") ($(( $(date +%s) - start )) s)"

/usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
start=$(date +%s)
"$tmp/venv/bin/python" -m pip install -q --no-deps --no-index "$wheel"
check "pip install of the wheel into a fresh venv ($(( $(date +%s) - start )) s)"

cli_version=$("$build_dir"/gradscale --version 2>/dev/null | awk '{print $2}' || true)
(cd "$tmp" && CLI_VERSION="$cli_version" "$tmp/venv/bin/python" - <<'PY')
import os
import sys

import torch
from torch import nn
import torch.nn.functional as F

import gradscale
from gradscale.torch import Scaler

here = os.path.dirname(gradscale.__file__)
assert here.startswith(sys.prefix), f"gradscale imported from {here}, not from the venv {sys.prefix}"
assert os.path.exists(os.path.join(here, "py.typed")), "py.typed is missing"
cli = os.environ["CLI_VERSION"]
assert not cli or cli == gradscale.__version__, f"gradscale --version says {cli}, gradscale.__version__ {gradscale.__version__}"
mapped = {line.split("/")[-1].strip() for line in open("/proc/self/maps")
          if any(f"/lib{name}." in line for name in ("cudart", "cublas", "cublasLt", "cuda"))}
assert not mapped, f"a CPU-only import mapped CUDA libraries: {sorted(mapped)}"

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, format="fp16", grad_format="fp8_e5m2")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 16, generator=torch.Generator().manual_seed(1)), torch.arange(64) % 4
first = [p.detach().clone() for p in model.parameters()]
losses = []
for _ in range(5):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    losses.append(loss.item())
assert scaler.last_step is not None and len(scaler.layer_scales()) == 2
assert any(not torch.equal(a, b) for a, b in zip(first, model.parameters())), "5 steps left the weights as they were"
assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
print(f"pip install: gradscale {gradscale.__version__} (torch {torch.__version__}) from {here}: "
      f"5 steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
PY
check "import and 5 training steps in the fresh venv"

"$tmp/venv/bin/python" -m pip uninstall -y -q gradscale
if (cd "$tmp" && "$tmp/venv/bin/python" -c 'import gradscale' 2>/dev/null); then
  echo "pip install: FAILED: gradscale still imports after pip uninstall"
  exit 1
fi
check "pip uninstall removed it"
echo "pip install: $passed passed, 0 failed"
