// The fuzzers whose readers go through libtorch's zip reader (torch_save, dcp_reader,
// torch_dist_checkpoint) call skip_libtorch_backtraces() once, from LLVMFuzzerInitialize.
//
// libtorch builds a backtrace for every c10::Error it throws (c10::get_backtrace:
// backtrace_symbols, dladdr per frame, demangling), and its zip reader throws one for each
// damaged archive. The readers keep only what_without_backtrace() (torch_save_format.cpp
// load_torch_save), so the backtrace is thrown away; under ASan it was about a third of
// dcp_reader_fuzzer's time per input (reports/fuzzing.md). The fetcher installed here returns
// one fixed line instead. Messages, and so everything the fuzzers check, stay as they were.
// Not used by the tests' build of the targets (CKPTSIM_FUZZ_IN_TESTS): the process there is
// the whole test suite, whose other tests should see libtorch as it is.
#pragma once

#include <c10/util/Logging.h>

#include <functional>
#include <string>

namespace ckptsim::fuzz {

// The std::function<std::string()> overload: libtorch 1.13 has only it, libtorch 2.x also
// one of a lazy c10::Backtrace.
inline void skip_libtorch_backtraces() {
  c10::SetStackTraceFetcher(
      std::function<std::string()>([] { return std::string("(backtrace not taken: fuzzing)\n"); }));
}

}  // namespace ckptsim::fuzz
