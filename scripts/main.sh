#!/usr/bin/env bash
# The main job: install what is missing, build, run every bundled reproduction scenario,
# check that each gives the verdicts it expects, and write the Markdown report, with a picture
# (`ckptsim plot`, gnuplot) of every scenario that fails a property in <report's folder>/plots/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh --target ckptsim
build_dir="${CKPTSIM_BUILD_DIR:-build}"
report="${CKPTSIM_REPORT:-reports/reproduction.md}"
plots="$(dirname "$report")/plots"
# A scenario that no longer fails must not keep its old picture.
for f in scenarios/*.json; do rm -f "$plots/$(basename "$f" .json).png"; done
"$build_dir"/ckptsim run --expect --report "$report" --plots "$plots" \
  --checkpoint-dir "$build_dir"/checkpoints scenarios/*.json
