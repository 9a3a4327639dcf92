#!/usr/bin/env bash
# Fresh machine -> the default job: installs what is missing, configures, builds, then runs the
# default experiment (experiments/configs/default.json when training is built; the format table).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build=${BUILD_DIR:-build}
"$build"/gradscale formats
