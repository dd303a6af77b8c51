#!/usr/bin/env bash
# The test suite built with AddressSanitizer and UndefinedBehaviorSanitizer (CMake preset
# `sanitize`, into build-sanitize/), then run: every test of the model, the simulator, the
# properties and the search, and the CLI's. Not part of CI (it takes about as long again as
# the normal build and tests on 2 cores); run it before a change to memory handling lands.
# Extra arguments go to ctest (e.g. -R Serialization).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake --preset sanitize >/dev/null
cmake --build --preset sanitize
# Leak checking is off: libtorch's static registries are never freed and are not ours.
# protect_shadow_gap=0: with a CUDA build of libtorch (the GPU machine's PyTorch), CUDA's
# initialization fails inside ASan's protected shadow gap ("cudaGetDeviceCount(): out of
# memory") and libtorch prints a warning into the CLI's output; harmless without CUDA.
# log_path: the simulator's ranks are fibers (sim/fiber.h), and ASan's swapcontext interceptor
# prints "ASan doesn't fully support makecontext/swapcontext" once per process into stderr,
# which the CLI tests read as ckptsim's output. Reports go to files instead; every report
# other than that warning is printed after the run and fails it.
logs="build-sanitize/sanitizer-logs"
rm -rf "$logs" && mkdir -p "$logs"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:detect_odr_violation=0:protect_shadow_gap=0:log_path=$PWD/$logs/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$PWD/$logs/ubsan"
# A time limit per ctest entry for this run only. ctest has none by default here (CMake's
# enable_testing without CTest's DartConfiguration: 10^7 s); under ASan a unit-test shard takes
# several times its normal 25 to 75 s (on the H200 host shards 1 and 6 and
# real_megatron_recorded_traces ran past the 400 s given there), and on a shared 2-core machine
# far longer. CKPTSIM_SANITIZE_TIMEOUT sets it; a --timeout among the arguments wins.
timeout_s="${CKPTSIM_SANITIZE_TIMEOUT:-3600}"
status=0
ctest --test-dir build-sanitize --output-on-failure -j "$(nproc)" -L cpu --timeout "$timeout_s" \
  "$@" || status=$?
# The slowest test cases of the run (GoogleTest's own times, from ctest's log of every entry's
# output): where the sanitizer run's time goes.
echo "slowest test cases under the sanitizers (ms):"
grep -hoE '\[ +OK \] [^ ]+ \([0-9]+ ms\)' build-sanitize/Testing/Temporary/LastTest.log 2>/dev/null |
  sed -E 's/.*\] ([^ ]+) \(([0-9]+) ms\)/\2 \1/' | sort -rn | head -20 || true
reports="$(cat "$logs"/* 2>/dev/null | grep -v "doesn't fully support makecontext/swapcontext" || true)"
if [[ -n "$reports" ]]; then
  echo "sanitizer reports (in $logs):"
  echo "$reports"
  status=1
fi
exit "$status"
