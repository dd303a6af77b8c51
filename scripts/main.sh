#!/usr/bin/env bash
# The main job: install what is missing, build, run every bundled reproduction scenario,
# check that each gives the verdicts it expects, and write the Markdown report.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh --target ckptsim
build_dir="${CKPTSIM_BUILD_DIR:-build}"
report="${CKPTSIM_REPORT:-reports/reproduction.md}"
"$build_dir"/ckptsim run --expect --report "$report" --checkpoint-dir "$build_dir"/checkpoints scenarios/*.json
