# The libFuzzer targets of fuzz/ (option CKPTSIM_FUZZ, preset `fuzz`, scripts/fuzz.sh), included
# from the top-level CMakeLists.txt so that they can use the generated embedded_revisions.cpp.
#
# Each fuzzer links only the translation units it needs, compiled here once more with
# -fsanitize=fuzzer-no-link,address,undefined (the build preset `fuzz` builds none of the layer
# libraries above). The readers' libtorch units (torch_save_format, distributed_checkpoint,
# torch_dist_checkpoint, value, mapping) share one precompiled header.
#
# ctest: one entry per fuzzer, label `fuzz`: a short run over its seed corpus
# (CKPTSIM_FUZZ_SECONDS each), never in the default build. The seed corpora are written at build
# time into ${CMAKE_BINARY_DIR}/fuzz-seeds/<fuzzer>/ by ckptsim_fuzz_seeds from the real fixtures,
# scenarios/ and revisions/; the committed crash reproducers of tests/fixtures/fuzz-regressions/
# are one more corpus folder of each run (read, never written).

# Two ways to build them:
# - clang (the `fuzz` preset): -fsanitize=fuzzer, per-edge coverage counters.
# - GCC with libFuzzer's archive from clang, CKPTSIM_LIBFUZZER=<libclang_rt.fuzzer-x86_64.a>
#   (scripts/fuzz-device.sh, on the GPU machine, which has GCC but no clang): GCC's
#   -fsanitize-coverage=trace-pc,trace-cmp calls __sanitizer_cov_trace_pc and the comparison
#   hooks, which libFuzzer implements (its "best-effort" trace-pc coverage: caller PCs hashed
#   into a table, coarser than clang's counters). Same sources, same ASan and UBSan.
set(CKPTSIM_LIBFUZZER "" CACHE FILEPATH
    "GCC only: libFuzzer's static library (clang's libclang_rt.fuzzer-x86_64.a)")
set(CKPTSIM_FUZZ_SANITIZERS -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
if(CKPTSIM_SANITIZE_READERS)
  # The readers' sanitizer subset (preset `sanitize-readers`, scripts/sanitize-readers.sh): the
  # same reader libraries with ASan and UBSan and no libFuzzer, and one replay program (below)
  # instead of the fuzzers.
  set(CKPTSIM_FUZZ_FLAGS -fsanitize=address,undefined ${CKPTSIM_FUZZ_SANITIZERS})
  set(CKPTSIM_FUZZ_LINK_FLAGS -fsanitize=address,undefined)
  set(CKPTSIM_FUZZ_ENGINE "")
elseif(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  set(CKPTSIM_FUZZ_FLAGS -fsanitize=fuzzer-no-link,address,undefined ${CKPTSIM_FUZZ_SANITIZERS})
  set(CKPTSIM_FUZZ_LINK_FLAGS -fsanitize=fuzzer,address,undefined)
  set(CKPTSIM_FUZZ_ENGINE "")
elseif(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND EXISTS "${CKPTSIM_LIBFUZZER}")
  set(CKPTSIM_FUZZ_FLAGS -fsanitize=address,undefined -fsanitize-coverage=trace-pc,trace-cmp
                         ${CKPTSIM_FUZZ_SANITIZERS})
  set(CKPTSIM_FUZZ_LINK_FLAGS -fsanitize=address,undefined)
  set(CKPTSIM_FUZZ_ENGINE ${CKPTSIM_LIBFUZZER})
else()
  message(FATAL_ERROR "CKPTSIM_FUZZ needs clang (the `fuzz` preset, CMAKE_CXX_COMPILER="
                      "clang++-14) or GCC with CKPTSIM_LIBFUZZER naming libFuzzer's archive; "
                      "got ${CMAKE_CXX_COMPILER_ID}, CKPTSIM_LIBFUZZER='${CKPTSIM_LIBFUZZER}'")
endif()

set(CKPTSIM_FUZZ_SECONDS 20 CACHE STRING "Seconds of each fuzzer's ctest run (label fuzz)")
set(CKPTSIM_FUZZ_DIR ${CMAKE_SOURCE_DIR}/fuzz)

# ckptsim_fuzz_library(<name> [TORCH] SOURCES ...): the units one group of fuzzers needs.
function(ckptsim_fuzz_library name)
  cmake_parse_arguments(arg "TORCH" "" "SOURCES" ${ARGN})
  add_library(${name} STATIC ${arg_SOURCES})
  ckptsim_layer_includes(${name} model)
  ckptsim_layer_includes(${name} sim)
  target_compile_options(${name} PRIVATE ${CKPTSIM_WARNINGS} ${CKPTSIM_FP_FLAGS}
                         ${CKPTSIM_FUZZ_FLAGS})
  target_compile_definitions(${name} PRIVATE CKPTSIM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  target_link_libraries(${name} PUBLIC ${CKPTSIM_FMT_TARGET} nlohmann_json::nlohmann_json)
  if(arg_TORCH)
    target_include_directories(${name} SYSTEM PUBLIC ${TORCH_INCLUDE_DIRS})
    target_link_libraries(${name} PUBLIC ${TORCH_LIBRARIES})
    target_precompile_headers(${name} PRIVATE ${CKPTSIM_FUZZ_DIR}/torch_prelude.h)
  else()
    # errors.cpp (whose InvariantViolation Result<T> throws) names c10::Error; nothing else
    # of libtorch.
    target_include_directories(${name} SYSTEM PUBLIC ${TORCH_INCLUDE_DIRS})
    target_link_libraries(${name} PUBLIC c10)
  endif()
endfunction()

set(M ${CMAKE_SOURCE_DIR}/model)
# What every fuzzer needs, and the pickle reader (no libtorch but c10, for errors.cpp).
ckptsim_fuzz_library(ckptsim_fuzz_base SOURCES
  ${M}/py/pickle_tree.cpp ${M}/errors.cpp ${M}/py/key.cpp ${M}/json_depth.cpp ${M}/status.cpp
  ${M}/storage.cpp ${M}/zip_layout.cpp)
# The checkpoint readers: torch.save blobs, torch.distributed.checkpoint, Megatron's torch_dist.
ckptsim_fuzz_library(ckptsim_fuzz_readers TORCH SOURCES
  ${M}/torch/torch_save_format.cpp ${M}/torch/distributed_checkpoint.cpp
  ${M}/megatron/torch_dist_checkpoint.cpp ${M}/megatron/checkpoint_damage.cpp
  ${M}/megatron/optimizer_key.cpp
  ${M}/megatron/mapping.cpp ${M}/py/value.cpp ${M}/py/pickle_writer.cpp)
target_link_libraries(ckptsim_fuzz_readers PUBLIC ckptsim_fuzz_base)
# The JSON readers: scenarios and revision profiles (a scenario's storage faults name their
# kinds through faulty_storage.cpp).
ckptsim_fuzz_library(ckptsim_fuzz_json SOURCES
  ${CMAKE_SOURCE_DIR}/sim/scenario.cpp ${M}/revision.cpp ${M}/config.cpp ${M}/faults.cpp
  ${M}/faulty_storage.cpp ${CKPTSIM_EMBEDDED})
target_link_libraries(ckptsim_fuzz_json PUBLIC ckptsim_fuzz_base)
# The trace readers: properties/trace.cpp's parse() and the conformance judge, whose checks are
# the property registry's, which reaches the simulator and the whole model: every unit of the
# model, sim/ and properties/, on its own (the libraries above would define their units twice).
file(GLOB CKPTSIM_FUZZ_TRACE_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/sim/*.cpp
     ${CMAKE_SOURCE_DIR}/properties/*.cpp)
ckptsim_fuzz_library(ckptsim_fuzz_trace TORCH SOURCES ${CKPTSIM_MODEL_SOURCES}
  ${CKPTSIM_FUZZ_TRACE_SOURCES} ${CKPTSIM_EMBEDDED})
ckptsim_layer_includes(ckptsim_fuzz_trace properties)
target_link_libraries(ckptsim_fuzz_trace PUBLIC ckptsim_adam ckptsim_cuda Eigen3::Eigen
                      Threads::Threads)

# ckptsim_fuzzer(<name> <library>): fuzz/<name>.cpp, an LLVMFuzzerTestOneInput. A fuzzer of
# the libtorch readers reuses their precompiled header (and with it torch_prelude.h).
set(CKPTSIM_FUZZERS "")
function(ckptsim_fuzzer name library)
  add_executable(${name} ${CKPTSIM_FUZZ_DIR}/${name}.cpp)
  ckptsim_fuzz_executable(${name} ${library})
  target_link_options(${name} PRIVATE ${CKPTSIM_FUZZ_LINK_FLAGS})
  target_link_libraries(${name} PRIVATE ${CKPTSIM_FUZZ_ENGINE})  # GCC: libFuzzer and its main
  set(CKPTSIM_FUZZERS ${CKPTSIM_FUZZERS} ${name} PARENT_SCOPE)
endfunction()
function(ckptsim_fuzz_executable name library)
  target_link_libraries(${name} PRIVATE ${library})
  ckptsim_layer_includes(${name} fuzz)
  target_compile_options(${name} PRIVATE ${CKPTSIM_WARNINGS} ${CKPTSIM_FP_FLAGS}
                         ${CKPTSIM_FUZZ_FLAGS})
  target_compile_definitions(${name} PRIVATE CKPTSIM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  if(library STREQUAL "ckptsim_fuzz_readers")
    target_precompile_headers(${name} REUSE_FROM ckptsim_fuzz_readers)
  endif()
  if(CKPTSIM_FUZZ_ENGINE)
    target_sources(${name} PRIVATE ${CKPTSIM_FUZZ_DIR}/gcc_coverage.cpp)
  endif()
endfunction()

if(CKPTSIM_SANITIZE_READERS)
  # fuzz/sanitized_replay.cpp runs every fuzz target (fuzz/*_fuzzer.cpp without their libFuzzer
  # entry points, as in the tests) on its seeds, its committed reproducers and a few
  # deterministic mutants, in one process; a sanitizer report or a broken promise fails it.
  file(GLOB CKPTSIM_FUZZ_TARGET_SOURCES CONFIGURE_DEPENDS ${CKPTSIM_FUZZ_DIR}/*_fuzzer.cpp)
  add_executable(ckptsim_sanitized_replay ${CKPTSIM_FUZZ_DIR}/sanitized_replay.cpp
                 ${CKPTSIM_FUZZ_DIR}/seeds.cpp ${CKPTSIM_FUZZ_TARGET_SOURCES})
  # trace_fuzzer's library holds every unit of the model, sim/ and properties/: the others'
  # units too, so it is the one library linked (two would define those units twice).
  ckptsim_fuzz_executable(ckptsim_sanitized_replay ckptsim_fuzz_trace)
  target_compile_definitions(ckptsim_sanitized_replay PRIVATE CKPTSIM_FUZZ_IN_TESTS)
  target_link_options(ckptsim_sanitized_replay PRIVATE ${CKPTSIM_FUZZ_LINK_FLAGS})
  return()
endif()

ckptsim_fuzzer(pickle_tree_fuzzer ckptsim_fuzz_base)
ckptsim_fuzzer(torch_save_fuzzer ckptsim_fuzz_readers)
ckptsim_fuzzer(dcp_metadata_fuzzer ckptsim_fuzz_readers)
ckptsim_fuzzer(dcp_reader_fuzzer ckptsim_fuzz_readers)
ckptsim_fuzzer(torch_dist_checkpoint_fuzzer ckptsim_fuzz_readers)
ckptsim_fuzzer(scenario_fuzzer ckptsim_fuzz_json)
ckptsim_fuzzer(revision_profile_fuzzer ckptsim_fuzz_json)
ckptsim_fuzzer(trace_fuzzer ckptsim_fuzz_trace)

# The seed corpora, from the repository's real files (fuzz/make_seeds.cpp, fuzz/seeds.h). Rewritten when a
# fixture, scenario or profile changes.
add_executable(ckptsim_fuzz_seeds ${CKPTSIM_FUZZ_DIR}/make_seeds.cpp ${CKPTSIM_FUZZ_DIR}/seeds.cpp)
ckptsim_fuzz_executable(ckptsim_fuzz_seeds ckptsim_fuzz_readers)
target_link_options(ckptsim_fuzz_seeds PRIVATE -fsanitize=address,undefined)
file(GLOB_RECURSE CKPTSIM_FUZZ_SEED_INPUTS CONFIGURE_DEPENDS
     ${CMAKE_SOURCE_DIR}/tests/fixtures/real-checkpoints/*
     ${CMAKE_SOURCE_DIR}/scenarios/*.json ${CMAKE_SOURCE_DIR}/revisions/*.json
     ${CMAKE_SOURCE_DIR}/tests/fixtures/model-traces/*.trace.json
     ${CMAKE_SOURCE_DIR}/tests/conformance/crash/*.trace.json)
set(CKPTSIM_FUZZ_SEEDS ${CMAKE_BINARY_DIR}/fuzz-seeds)
add_custom_command(
  OUTPUT ${CKPTSIM_FUZZ_SEEDS}/stamp
  COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=0
          $<TARGET_FILE:ckptsim_fuzz_seeds> ${CMAKE_SOURCE_DIR} ${CKPTSIM_FUZZ_SEEDS}
  COMMAND ${CMAKE_COMMAND} -E touch ${CKPTSIM_FUZZ_SEEDS}/stamp
  DEPENDS ckptsim_fuzz_seeds ${CKPTSIM_FUZZ_SEED_INPUTS}
  COMMENT "Fuzz seed corpora from the real fixtures, scenarios and revision profiles")
add_custom_target(ckptsim_fuzz_corpora ALL DEPENDS ${CKPTSIM_FUZZ_SEEDS}/stamp)

enable_testing()
set(CKPTSIM_FUZZ_REGRESSIONS ${CMAKE_SOURCE_DIR}/tests/fixtures/fuzz-regressions)
foreach(fuzzer ${CKPTSIM_FUZZERS})
  # A run: the fuzzer grows a scratch copy of its seeds (the seed folder stays as built) plus
  # the committed reproducers of its own folder, for CKPTSIM_FUZZ_SECONDS; any crash, leak or
  # sanitizer report fails the entry.
  add_test(NAME fuzz_${fuzzer}
           COMMAND ${CMAKE_COMMAND} -DFUZZER=$<TARGET_FILE:${fuzzer}>
                   -DSEEDS=${CKPTSIM_FUZZ_SEEDS}/${fuzzer}
                   -DREGRESSIONS=${CKPTSIM_FUZZ_REGRESSIONS}/${fuzzer}
                   -DWORK=${CMAKE_BINARY_DIR}/fuzz-work/${fuzzer}
                   -DSECONDS=${CKPTSIM_FUZZ_SECONDS}
                   -DSUPPRESSIONS=${CKPTSIM_FUZZ_DIR}/lsan.supp
                   -P ${CKPTSIM_FUZZ_DIR}/run_fuzzer.cmake)
  set_tests_properties(fuzz_${fuzzer} PROPERTIES LABELS "fuzz" TIMEOUT 600)
endforeach()
message(STATUS "ckptsim: fuzzers ${CKPTSIM_FUZZERS} (ctest -L fuzz: ${CKPTSIM_FUZZ_SECONDS} s each)")
