#!/usr/bin/env bash
# The readers of untrusted files under AddressSanitizer and UndefinedBehaviorSanitizer, alone:
# the fuzz targets of fuzz/ built with GCC (CMake preset `sanitize-readers`, into
# build-sanitize-readers/) and run by fuzz/sanitized_replay.cpp on their committed reproducers
# (tests/fixtures/fuzz-regressions/), their seeds and deterministic mutants of the seeds.
# A small part of scripts/sanitize.sh (whose FuzzShortRun.* runs the same targets under the
# sanitizers among every other test), for a change to a reader. Not part of CI: its cold build
# alone is several times the time CI can spare (reports/sanitizers.md has the measurement).
# Arguments go to the replay: [--mutants N] [FUZZER...].
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake --preset sanitize-readers >/dev/null
cmake --build --preset sanitize-readers
# Leak checking off, as in scripts/sanitize.sh: libtorch 1.13's zip reader leaks on a damaged
# archive (fuzz/lsan.supp), which is not ours.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:detect_odr_violation=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
exec build-sanitize-readers/ckptsim_sanitized_replay "$@"
