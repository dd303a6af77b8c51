// The coverage of a GCC fuzz build (fuzz/fuzzers.cmake, CKPTSIM_LIBFUZZER; used by
// scripts/fuzz-device.sh on the GPU machine, which has no clang).
//
// GCC instruments with -fsanitize-coverage=trace-pc,trace-cmp: a call of
// __sanitizer_cov_trace_pc at every basic block, and the comparison hooks, which libFuzzer
// implements. libFuzzer 14 refuses trace-pc itself (its __sanitizer_cov_trace_pc aborts; the
// archive that `scripts/fuzz-device.sh prepare` carries has that symbol made weak), so the
// hook here counts each block, by its return address hashed into kCounters slots, in
// libFuzzer's extra counters (the section __libfuzzer_extra_counters, which libFuzzer reads as
// features after every input, as it reads clang's inline 8-bit counters). Coarser than clang's
// per-edge counters: blocks, not edges, and distinct blocks may share a slot.
// GCC also hooks float and double comparisons, which libFuzzer does not define or use.
#include <cstddef>
#include <cstdint>

namespace {
constexpr size_t kCounters = size_t{1} << 16;
}  // namespace

extern "C" {
__attribute__((section("__libfuzzer_extra_counters"), used))
uint8_t ckptsim_gcc_block_counters[kCounters];

__attribute__((no_sanitize_coverage, no_sanitize_address)) void __sanitizer_cov_trace_pc() {
  const auto pc = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  uint8_t& c = ckptsim_gcc_block_counters[(pc ^ (pc >> 16)) & (kCounters - 1)];
  c = static_cast<uint8_t>(c + 1);
}
__attribute__((no_sanitize_coverage)) void __sanitizer_cov_trace_cmpf(float, float) {}
__attribute__((no_sanitize_coverage)) void __sanitizer_cov_trace_cmpd(double, double) {}
}
