#!/usr/bin/env bash
# Fresh machine -> every test: installs what is missing (the plug-in's too, and the Python package into
# .venv by pip), configures, builds everything once, then: the docs as a newcomer reads them
# (scripts/check_docs.py --all: the README's paths, its 150 lines, no "round N" outside the changelog),
# the package as a user installs it (scripts/test_pip_install.sh: fresh venv, pip install, 5 steps,
# uninstall) and the whole suite (ctest, output on failure; the plug-in's pytest, on the package pip
# installed, is one of its tests). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --torch
scripts/build.sh
python3 scripts/check_docs.py --all
scripts/test_pip_install.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "${JOBS:-$(nproc)}"
