#!/usr/bin/env bash
# Installs what gradscale needs from Debian's packages, and only what is missing. Idempotent; works
# as root or through sudo. matplotlib (for the trace and result plots) is part of the default set;
# `--peer` adds what the PyTorch comparison needs.
#   scripts/setup.sh [--peer]
set -euo pipefail

packages=(cmake g++ make pkg-config zlib1g-dev libeigen3-dev libboost-program-options-dev
          nlohmann-json3-dev catch2 dataset-fashion-mnist python3 python3-matplotlib)
# With clang present the build adds the fuzz targets (tests/fuzz, docs/fuzzing.md), which need clang's
# libFuzzer and sanitizer runtimes and its OpenMP.
if command -v clang++ >/dev/null 2>&1; then
  clang_major=$(clang++ --version | sed -n 's/.*clang version \([0-9][0-9]*\).*/\1/p' | head -n 1)
  [ -z "$clang_major" ] || packages+=("libclang-rt-$clang_major-dev" "libomp-$clang_major-dev")
fi
for arg in "$@"; do
  case "$arg" in
    --peer) packages+=(python3-torch libopenblas0-pthread python3-numpy) ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (allowed: --peer)" >&2; exit 2 ;;
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
echo "setup: done"
