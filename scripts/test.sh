#!/usr/bin/env bash
# Install what is missing, check the habits (scripts/tidy.sh), build everything, run the whole
# test suite but the production-DP run.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/tidy.sh
./scripts/build.sh
build_dir="${CKPTSIM_BUILD_DIR:-build}"
# Not the production-DP run (label scale: DP 4096, 2.4 GB and 4096 threads; `ctest -L scale`).
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" -LE scale
# The replay runner's torch-free parts (Debian's pytest; the parts that need torch and a GPU skip
# here with the reason, and run on the GPU machine).
python=/usr/bin/python3
[ -x "$python" ] || python=python3
"$python" -m pytest -q tests/replay
