#!/usr/bin/env bash
# Installs what gradscale needs from Debian's packages, and only what is missing. Idempotent; works
# as root or through sudo. matplotlib (for the trace and result plots) is part of the default set;
# `--peer` adds what the PyTorch comparison needs; `--torch` what the PyTorch plug-in needs (Debian's
# torch and torchvision (real architectures for the tests), pybind11, Python's headers, pytest), a venv at .venv (system site packages) and, in it, the
# package installed by pip (`pip install -e .` through scripts/build.sh --package: scikit-build-core from
# PyPI builds gradscale._core in the build directory that scripts/build.sh uses).
#   scripts/setup.sh [--peer] [--torch]
set -euo pipefail

packages=(cmake g++ make pkg-config zlib1g-dev libeigen3-dev libboost-program-options-dev
          nlohmann-json3-dev catch2 dataset-fashion-mnist python3 python3-matplotlib)
# MPI for data-parallel training (`mpirun -np N build/gradscale train`, docs/distributed.md) and its
# CI test; the build still works without it (one process, no MPI at run time).
packages+=(libopenmpi-dev openmpi-bin)
# With clang present the build adds the fuzz targets (tests/fuzz, docs/fuzzing.md), which need clang's
# libFuzzer and sanitizer runtimes and its OpenMP.
if command -v clang++ >/dev/null 2>&1; then
  clang_major=$(clang++ --version | sed -n 's/.*clang version \([0-9][0-9]*\).*/\1/p' | head -n 1)
  [ -z "$clang_major" ] || packages+=("libclang-rt-$clang_major-dev" "libomp-$clang_major-dev")
fi
want_venv=0
# The venv for the plug-in: Debian's interpreter (where Debian's torch lives), its site packages
# visible, and the package installed by pip; the package's build backend (scikit-build-core) is
# installed into it from PyPI, so that later builds reuse the same build directory (build.sh).
make_venv() {
  [ "$want_venv" = 1 ] || return 0
  local root
  root=$(cd "$(dirname "$0")/.." && pwd)
  if [ ! -x "$root/.venv/bin/python" ]; then
    /usr/bin/python3 -m venv --system-site-packages "$root/.venv"
  fi
  local site
  site=$("$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rm -f "$site/gradscale.pth"  # the .pth into python/ that an older set-up wrote
  if ! "$root/.venv/bin/python" -c 'import scikit_build_core' 2>/dev/null; then
    "$root/.venv/bin/python" -m pip install -q 'scikit-build-core>=0.10'
  fi
  "$root/scripts/build.sh" --package
  echo "setup: .venv ready ($(cd / && "$root/.venv/bin/python" -c 'import torch, gradscale.torch, gradscale; print("torch", torch.__version__, "gradscale", gradscale.__version__)'))"
}
for arg in "$@"; do
  case "$arg" in
    --peer) packages+=(python3-torch libopenblas0-pthread python3-numpy) ;;
    --torch) packages+=(python3-torch python3-torchvision libopenblas0-pthread python3-numpy python3-dev python3-venv
                        pybind11-dev python3-pybind11 python3-pytest); want_venv=1 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (allowed: --peer, --torch)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present (${packages[*]})"
  make_venv
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "setup: need root or sudo to install: ${missing[*]}" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
make_venv
echo "setup: done"
