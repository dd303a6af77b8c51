// The fuzz targets of fuzz/, one function per fuzzer: what its LLVMFuzzerTestOneInput runs on
// one input. A broken promise (fuzz/fuzz_support.h) aborts in a fuzzer; built into the tests
// (CKPTSIM_FUZZ_IN_TESTS, no LLVMFuzzerTestOneInput) it throws BrokenPromise instead, so that
// tests/fuzz/fuzz_regressions_test.cpp replays the committed reproducers under GCC.
#pragma once

#include <span>
#include <string_view>

#include "fuzz/fuzz_support.h"

namespace ckptsim::fuzz {

void fuzz_pickle_tree(std::span<const char> input);
void fuzz_torch_save(std::span<const char> input);
void fuzz_dcp_metadata(std::span<const char> input);
void fuzz_dcp_reader(std::span<const char> input);
void fuzz_torch_dist_checkpoint(std::span<const char> input);
void fuzz_scenario(std::span<const char> input);
void fuzz_revision_profile(std::span<const char> input);
void fuzz_trace(std::span<const char> input);

struct FuzzTarget {
  std::string_view name;  // the fuzzer's binary, and its folder of reproducers
  void (*run)(std::span<const char> input);
};

inline constexpr FuzzTarget kFuzzTargets[] = {
    {"pickle_tree_fuzzer", &fuzz_pickle_tree},
    {"torch_save_fuzzer", &fuzz_torch_save},
    {"dcp_metadata_fuzzer", &fuzz_dcp_metadata},
    {"dcp_reader_fuzzer", &fuzz_dcp_reader},
    {"torch_dist_checkpoint_fuzzer", &fuzz_torch_dist_checkpoint},
    {"scenario_fuzzer", &fuzz_scenario},
    {"revision_profile_fuzzer", &fuzz_revision_profile},
    {"trace_fuzzer", &fuzz_trace},
};

}  // namespace ckptsim::fuzz
