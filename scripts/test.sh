#!/usr/bin/env bash
# Fresh machine -> every test: installs what is missing, configures, builds, runs the whole suite
# (ctest, output on failure). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "${JOBS:-$(nproc)}"
