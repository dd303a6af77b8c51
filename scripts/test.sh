#!/usr/bin/env bash
# Install what is missing, check the habits (scripts/tidy.sh), build everything, run the whole
# test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/tidy.sh
./scripts/build.sh
build_dir="${CKPTSIM_BUILD_DIR:-build}"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)"
