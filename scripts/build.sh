#!/usr/bin/env bash
# Configures and builds gradscale into ${BUILD_DIR:-build} (Release; CUDA auto-detected unless
# GRADSCALE_CUDA=ON|OFF is set). Extra arguments go to cmake's configure step.
#   scripts/build.sh [cmake args]            everything: library, CLI, tests, fuzz targets; and, with the
#                                            .venv of scripts/setup.sh --torch, the Python package, built
#                                            by pip in this build directory and installed there (editable)
#   BUILD_TARGET=gradscale scripts/build.sh  that target and what it needs only (e.g. the CLI)
#   scripts/build.sh --package [cmake args]  configure, then only the Python package into .venv (setup.sh --torch)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
package_only=0
if [ "${1:-}" = "--package" ]; then
  package_only=1
  shift
fi
# The plug-in's core is built for the .venv's interpreter when there is one (scripts/setup.sh --torch).
python_args=()
[ -x .venv/bin/python ] && python_args=(-DPython3_EXECUTABLE="$PWD/.venv/bin/python")
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DGRADSCALE_CUDA="${GRADSCALE_CUDA:-AUTO}" "${python_args[@]}" "$@"

# The Python package (pyproject.toml) from this same build directory, so nothing is compiled twice:
# pip's configure keeps the options set above, builds the package's targets and installs them into
# .venv, editable (python/gradscale's sources are used in place). scikit-build-core is in .venv
# (setup.sh --torch); pybind11 is Debian's.
install_package() {
  local generator
  generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build_dir/CMakeCache.txt")
  CMAKE_GENERATOR="$generator" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" .venv/bin/python -m pip install -q \
    --no-build-isolation --no-deps -e . --config-settings=build-dir="$build_dir"
}
if [ "$package_only" = 1 ]; then
  install_package
  exit 0
fi
if [ -n "${BUILD_TARGET:-}" ]; then
  cmake --build "$build_dir" -j "$jobs" --target "$BUILD_TARGET"
  exit 0
fi
if [ -x .venv/bin/python ] && .venv/bin/python -c 'import scikit_build_core' 2>/dev/null; then
  install_package
fi
cmake --build "$build_dir" -j "$jobs"
