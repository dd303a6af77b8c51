#include "sim/gradients.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "model/errors.h"
#include "model/py/runtime.h"

namespace ckptsim::sim {

namespace {

// splitmix64's output function (Steele, Lea, Flood 2014): a bijection on 64 bits with good
// avalanche, so consecutive counters give unrelated outputs.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// One link of the counter chain: injective in `counter` for a fixed `state` (the odd gamma
// makes counter -> counter*gamma a bijection), then mixed. Chaining links, rather than
// xor-ing the inputs together, keeps (step=1, param=2) and (step=2, param=1) apart.
// link(state, counter) is mix64(state + counter_offset(counter)).
inline uint64_t counter_offset(int64_t counter) {
  constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;
  return (static_cast<uint64_t>(counter) + 1) * kGamma;
}

inline uint64_t link(uint64_t state, int64_t counter) {
  return mix64(state + counter_offset(counter));
}

// Hash of (seed, step, param): computed once per local_gradient call.
inline uint64_t param_step_hash(uint64_t seed, int64_t step, int64_t param_index) {
  constexpr uint64_t kDomain = 0x636b707473696d67ULL;  // "ckptsimg": not shared with other streams
  return link(link(mix64(seed ^ kDomain), step), param_index);
}

// k in [-kGradMagnitudeMax, kGradMagnitudeMax]: the top 32 bits scaled into 2K+1 buckets by
// multiply-shift (bias below 2^-21, irrelevant here).
inline int32_t units_of(uint64_t hash) {
  constexpr uint64_t kBuckets = 2 * static_cast<uint64_t>(kGradMagnitudeMax) + 1;
  return static_cast<int32_t>(((hash >> 32) * kBuckets) >> 32) - kGradMagnitudeMax;
}

void check_common(const GradientSpec& spec, int64_t step, int64_t param_index) {
  CKPTSIM_CHECK(spec.samples_per_step >= 1 && spec.samples_per_step <= kGradientSamplesMax,
                fmt::format("samples_per_step {} outside [1, kGradientSamplesMax={}]",
                            spec.samples_per_step, kGradientSamplesMax));
  CKPTSIM_CHECK(step >= 1, fmt::format("gradient for step {}: steps are 1-based", step));
  CKPTSIM_CHECK(param_index >= 0, fmt::format("gradient for param index {}", param_index));
}

}  // namespace

float sample_gradient(const GradientSpec& spec, int64_t step, int64_t param_index, int64_t element,
                      int64_t sample) {
  check_common(spec, step, param_index);
  CKPTSIM_CHECK(element >= 0, fmt::format("gradient for element {}", element));
  CKPTSIM_CHECK(
      sample >= 0 && sample < spec.samples_per_step,
      fmt::format("sample {} outside [0, samples_per_step={})", sample, spec.samples_per_step));
  const uint64_t element_hash = link(param_step_hash(spec.seed, step, param_index), element);
  return static_cast<float>(units_of(link(element_hash, sample))) * kGradUnit;
}

namespace {

// The hashing loop of local_gradient, over elements in blocks: every element of a block takes
// sample s together, so the loop over the block has no dependence between iterations and the
// compiler vectorizes it (64-bit multiplies: AVX-512DQ's vpmullq in the x86-64-v4 clone).
// Integer arithmetic only: every clone gives the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void hash_gradients(uint64_t prefix, int64_t element_begin, int64_t first_sample,
                    int64_t sample_stride, int64_t samples, std::span<float> out) {
  constexpr size_t kBlock = 64;
  std::array<uint64_t, kBlock> element_hash{};
  std::array<int32_t, kBlock> sum_units{};
  for (size_t b = 0; b < out.size(); b += kBlock) {
    const size_t n = std::min(kBlock, out.size() - b);
    for (size_t i = 0; i < n; ++i) {
      element_hash[i] = link(prefix, element_begin + static_cast<int64_t>(b + i));
      sum_units[i] = 0;
    }
    // Integer accumulation: |sum| <= kGradientSamplesMax * kGradMagnitudeMax < 2^24 (header
    // invariant 1), so the conversion below is exact and equals any fp32 summation order.
    for (int64_t s = first_sample; s < samples; s += sample_stride) {
      const uint64_t offset = counter_offset(s);  // link(h, s) for every h of the block
      for (size_t i = 0; i < n; ++i) sum_units[i] += units_of(mix64(element_hash[i] + offset));
    }
    for (size_t i = 0; i < n; ++i) out[b + i] = static_cast<float>(sum_units[i]) * kGradUnit;
  }
}

}  // namespace

void local_gradient(const GradientSpec& spec, int64_t step, int64_t param_index,
                    int64_t element_begin, int64_t dp_rank, int64_t dp_size, std::span<float> out) {
  check_common(spec, step, param_index);
  CKPTSIM_CHECK(element_begin >= 0, fmt::format("gradient from element {}", element_begin));
  CKPTSIM_CHECK(dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size,
                fmt::format("dp rank {} of dp size {}", dp_rank, dp_size));
  hash_gradients(param_step_hash(spec.seed, step, param_index), element_begin, dp_rank, dp_size,
                 spec.samples_per_step, out);
}

float initial_param_value(uint64_t seed, size_t param, int64_t element) {
  model::Rng r(
      model::mix_seed(model::mix_seed(seed ^ 0x5eedULL, param), static_cast<uint64_t>(element)));
  const int64_t k = static_cast<int64_t>(r.next_u64() % 65) - 32;
  return static_cast<float>(k) / 64.0F;
}

void expert_local_gradient(const GradientSpec& spec, int64_t step, int64_t param_index,
                           int64_t element_begin, int64_t dp_rank, int64_t dp_size, int64_t ep,
                           std::span<float> out) {
  CKPTSIM_CHECK(ep >= 1 && dp_size % ep == 0, "ep must divide the DP size");
  std::fill(out.begin(), out.end(), 0.0F);
  std::vector<float> part(out.size());
  const int64_t first = dp_rank / ep * ep;
  for (int64_t j = 0; j < ep; ++j) {
    local_gradient(spec, step, param_index, element_begin, first + j, dp_size, part);
    // Sums of samples on a dyadic grid: exact in any order (see sample_gradient).
    for (size_t k = 0; k < out.size(); ++k) out[k] += part[k];
  }
}

}  // namespace ckptsim::sim
