#!/usr/bin/env bash
# Fresh machine -> every test: installs what is missing (the plug-in's too), configures, builds, runs
# the whole suite (ctest, output on failure; the plug-in's pytest is one of its tests). Exits non-zero
# on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --torch
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "${JOBS:-$(nproc)}"
