#!/usr/bin/env bash
# Install what is missing, check the habits (scripts/tidy.sh), build everything, run the whole
# test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/tidy.sh
./scripts/build.sh
build_dir="${CKPTSIM_BUILD_DIR:-build}"
# The production-DP run too (label scale: DP 4096 -> 3072, about 10 s and 1 GB on 2 cores).
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)"
# The replay runner's torch-free parts (Debian's pytest; the parts that need torch and a GPU skip
# here with the reason, and run on the GPU machine).
python=/usr/bin/python3
[ -x "$python" ] || python=python3
"$python" -m pytest -q tests/replay
