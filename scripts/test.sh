#!/usr/bin/env bash
# The README's test command: setup (apt packages, as root) + Release build + the whole ctest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cd build
ctest --output-on-failure -j"${MOH_TEST_JOBS:-2}" --timeout 1200
