#!/usr/bin/env bash
# Configures and builds gradscale into ${BUILD_DIR:-build} (Release; CUDA auto-detected unless
# GRADSCALE_CUDA=ON|OFF is set). Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DGRADSCALE_CUDA="${GRADSCALE_CUDA:-AUTO}" "$@"
cmake --build "$build_dir" -j "$jobs"
