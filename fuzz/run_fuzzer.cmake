# One short fuzz run, for ctest (fuzz/fuzzers.cmake registers one per fuzzer, label `fuzz`):
#   cmake -DFUZZER=<binary> -DSEEDS=<seed folder> -DREGRESSIONS=<reproducer folder>
#         -DWORK=<scratch folder> -DSECONDS=<n> [-DSUPPRESSIONS=<lsan.supp>] -P run_fuzzer.cmake
# The fuzzer starts from the seeds and the committed reproducers (both read only; the
# reproducer folder may be absent) and writes what it finds new into WORK/corpus, emptied
# first; a crash, leak, timeout or sanitizer report leaves its input in WORK/ and fails the run.
foreach(v FUZZER SEEDS WORK SECONDS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_fuzzer.cmake: -D${v}= is required")
  endif()
endforeach()
if(NOT IS_DIRECTORY "${SEEDS}")
  message(FATAL_ERROR "no seed corpus ${SEEDS} (build the target ckptsim_fuzz_corpora)")
endif()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/corpus")
set(corpora "${WORK}/corpus" "${SEEDS}")
if(IS_DIRECTORY "${REGRESSIONS}")
  list(APPEND corpora "${REGRESSIONS}")
endif()
set(ENV{ASAN_OPTIONS} "abort_on_error=1:detect_odr_violation=0")
set(ENV{UBSAN_OPTIONS} "print_stacktrace=1:halt_on_error=1")
if(DEFINED SUPPRESSIONS)
  set(ENV{LSAN_OPTIONS} "suppressions=${SUPPRESSIONS}")
endif()
execute_process(
  COMMAND "${FUZZER}" -max_total_time=${SECONDS} -timeout=30 -print_final_stats=1
          -artifact_prefix=${WORK}/ ${corpora}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (exit ${rc}); its input is in ${WORK}/")
endif()
