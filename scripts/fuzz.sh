#!/usr/bin/env bash
# The fuzz job: libFuzzer on the readers of untrusted files (fuzz/, README "Fuzzing"). Not part
# of CI: building the fuzzers with clang takes about 5 minutes on 2 cores (reports/fuzzing.md).
# Configures the CMake preset `fuzz` (clang 14, -fsanitize=fuzzer,address,undefined, into
# build-fuzz/), builds the fuzzers and their seed corpora (build-fuzz/fuzz-seeds/), then:
#
#   scripts/fuzz.sh                      the short run: ctest -L fuzz, every fuzzer for
#                                        CKPTSIM_FUZZ_SECONDS (20) seconds from its seeds
#   scripts/fuzz.sh long [SEC [FUZZER...]]
#                                        every fuzzer (or those named) for SEC seconds (300),
#                                        one after the other, one process each; the corpus grows
#                                        in build-fuzz/fuzz-corpus/<fuzzer>/ and is kept between
#                                        runs; a crash's input goes to
#                                        build-fuzz/fuzz-artifacts/<fuzzer>/; the last lines of
#                                        each run go to build-fuzz/fuzz-logs/<fuzzer>.log and a
#                                        summary (executions, exec/s, cov, ft, corpus) to stdout
#   CKPTSIM_FUZZ_ARGS="..."              more libFuzzer flags for `long` (e.g. -detect_leaks=0:
#                                        reports/fuzzing.md says what the leak checks cost)
#
# Exit 0 when no fuzzer found anything; 1 otherwise. A reproducer worth keeping goes to
# tests/fixtures/fuzz-regressions/<fuzzer>/ (replayed by the normal tests, tests/fuzz/), with a
# named regression test beside the reader's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --fuzz
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz

build=build-fuzz
export ASAN_OPTIONS="abort_on_error=1:detect_odr_violation=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/fuzz/lsan.supp"

if [ "${1:-short}" = short ]; then
  exec ctest --test-dir "$build" --output-on-failure -L fuzz
fi
[ "$1" = long ] || { echo "usage: $0 [short | long [SEC [FUZZER...]]]" >&2; exit 2; }
seconds=${2:-300}
shift $(($# > 2 ? 2 : $#))
fuzzers=("$@")
if [ "${#fuzzers[@]}" -eq 0 ]; then
  fuzzers=(pickle_tree_fuzzer dcp_metadata_fuzzer torch_save_fuzzer dcp_reader_fuzzer
           torch_dist_checkpoint_fuzzer scenario_fuzzer revision_profile_fuzzer trace_fuzzer)
fi

status=0
printf '%-30s %6s %10s %7s %6s %7s %7s %9s %s\n' fuzzer sec execs exec/s cov ft corpus bytes result
for f in "${fuzzers[@]}"; do
  corpus="$build/fuzz-corpus/$f" artifacts="$build/fuzz-artifacts/$f" log="$build/fuzz-logs/$f.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  regressions=()
  [ -d "tests/fixtures/fuzz-regressions/$f" ] && regressions=("tests/fixtures/fuzz-regressions/$f")
  rc=0
  # shellcheck disable=SC2086
  "$build/$f" ${CKPTSIM_FUZZ_ARGS:-} -max_total_time="$seconds" -timeout=30 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "$corpus" "$build/fuzz-seeds/$f" "${regressions[@]}" \
    >"$log" 2>&1 || rc=$?
  done_line=$(grep -a -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
  [ -n "$done_line" ] || done_line=$(grep -a -E '^#[0-9]+[[:space:]]' "$log" | tail -1 || true)
  execs=$(grep -a 'stat::number_of_executed_units' "$log" | awk '{print $2}')
  rate=$(grep -a 'stat::average_exec_per_sec' "$log" | awk '{print $2}')
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$done_line")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$done_line")
  corp=$(sed -nE 's/.* corp: ([0-9]+)\/([0-9]+[a-zA-Z]*).*/\1 \2/p' <<<"$done_line")
  result=ok
  if [ "$rc" -ne 0 ]; then
    result="FOUND (exit $rc): $(ls -t "$artifacts" | head -1)"
    status=1
  fi
  # shellcheck disable=SC2086
  printf '%-30s %6s %10s %7s %6s %7s %7s %9s %s\n' "$f" "$seconds" "${execs:-?}" "${rate:-?}" \
    "${cov:-?}" "${ft:-?}" ${corp:-? ?} "$result"
done
exit "$status"
