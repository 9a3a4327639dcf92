#!/usr/bin/env bash
# Configures and builds gradscale into ${BUILD_DIR:-build} (Release; CUDA auto-detected unless
# GRADSCALE_CUDA=ON|OFF is set). Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
# The plug-in's core is built for the .venv's interpreter when there is one (scripts/setup.sh --torch).
python_args=()
[ -x .venv/bin/python ] && python_args=(-DPython3_EXECUTABLE="$PWD/.venv/bin/python")
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DGRADSCALE_CUDA="${GRADSCALE_CUDA:-AUTO}" "${python_args[@]}" "$@"
cmake --build "$build_dir" -j "$jobs"
