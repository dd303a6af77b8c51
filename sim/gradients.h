// The simulator's gradient source: deterministic per-sample gradients on a dyadic grid, so
// that the gradient of a step is the same fp32 value bit for bit however the global batch
// is split over data-parallel ranks and in whatever order the partial sums are added. This
// is what lets a run resumed at another DP size be compared bit for bit with a continuous
// run (spec and issue: "gradients are deterministic functions of (seed, step, param,
// element, sample) on a dyadic grid").
//
// The per-sample gradient of element `element` of param `param_index` at global step `step`
// for sample `sample` is k * 2^-kGradExponent, with the integer k in
// [-kGradMagnitudeMax, kGradMagnitudeMax] drawn (almost uniformly) from a counter-based
// splitmix64-style hash of (seed, step, param_index, element, sample). No state, no
// allocation: any value can be recomputed anywhere.
//
// Invariants:
//   1. Exactness. Every per-sample value and every sum of per-sample values of one
//      (step, param, element) over any subset of the step's samples is m * 2^-16 with an
//      integer |m| <= samples_per_step * kGradMagnitudeMax <= 16384 * 1023 = 16,760,832
//      < 2^24 = 16,777,216. An fp32 (24-bit significand) holds every such value exactly:
//      |m| < 2^24 fits the significand, and 2^-16 .. 2^8 is far inside the normal exponent
//      range, so nothing underflows or overflows. Adding two such partial sums over disjoint
//      subsets is therefore exact in fp32, and the total is the same bits for every DP size,
//      grouping and order. (static_assert below.)
//   2. The exactness holds only for sums within one step and only in fp32. Multiplying by a
//      non-power-of-two factor (e.g. 1/dp_size, upstream's gradient averaging when dp_size is
//      not a power of two) or rounding to bf16 breaks it; a caller that must stay exact scales
//      once, after the full sum, by a power of two or by a factor that does not depend on DP.
//   3. No negative zero: k == 0 gives +0.0f, and exact sums that cancel give +0.0f in
//      round-to-nearest, so the sign of zero does not depend on the grouping either.
//   4. Values are non-degenerate: both signs, zero with probability 1/(2*kGradMagnitudeMax+1),
//      and changing any of seed, step, param_index, element or sample changes the value
//      except with probability about 1/2047.
#pragma once

#include <cstdint>
#include <span>

namespace ckptsim::sim {

inline constexpr int kGradExponent = 16;
inline constexpr float kGradUnit = 0x1p-16f;  // 2^-kGradExponent
inline constexpr int32_t kGradMagnitudeMax = 1023;
inline constexpr int64_t kGradientSamplesMax = 16384;  // global batch, in samples
static_assert(kGradientSamplesMax * kGradMagnitudeMax < (int64_t{1} << 24),
              "invariant 1: every partial sum must be an integer multiple of 2^-16 below 2^24");
static_assert(kGradUnit * float(1 << kGradExponent) == 1.0f, "kGradUnit is 2^-kGradExponent");

struct GradientSpec {
  uint64_t seed = 0;
  int64_t samples_per_step =
      1;  // global batch; REQUIRES: 1 <= samples_per_step <= kGradientSamplesMax
};

// REQUIRES: step >= 1; param_index >= 0; element >= 0; 0 <= sample < spec.samples_per_step.
float sample_gradient(const GradientSpec& spec, int64_t step, int64_t param_index, int64_t element,
                      int64_t sample);

// Sum of sample_gradient over the samples that DP rank `dp_rank` of `dp_size` processes
// (sample s belongs to rank s % dp_size), for the elements
// [element_begin, element_begin + out.size()) of param `param_index`, written to out[i].
// A rank with no samples (dp_size > samples_per_step) gets zeros.
// REQUIRES: step >= 1; param_index >= 0; element_begin >= 0; 1 <= dp_size;
// 0 <= dp_rank < dp_size; spec.samples_per_step in [1, kGradientSamplesMax].
void local_gradient(const GradientSpec& spec, int64_t step, int64_t param_index,
                    int64_t element_begin, int64_t dp_rank, int64_t dp_size, std::span<float> out);

// An expert param's local gradient on DP rank `dp_rank` of `dp_size` with `ep` EP ranks (issue
// 26): the tokens of its EP group (the DP ranks dp_rank / ep * ep + j, j < ep) reach its experts
// through the all-to-all, so it is the sum of local_gradient over those ranks; the reduction over
// the expert-DP group then gives every sample's sum, as a dense param's over the DP group.
// REQUIRES: ep divides dp_size; local_gradient's.
void expert_local_gradient(const GradientSpec& spec, int64_t step, int64_t param_index,
                           int64_t element_begin, int64_t dp_rank, int64_t dp_size, int64_t ep,
                           std::span<float> out);

// The initial value of element `element` of model param `param`: k/64 with |k| <= 32, exact in
// bf16 and fp32, deterministic in (seed, param, element). Every phase's fresh model starts from
// it (a load then overwrites it), as does the uninterrupted run.
float initial_param_value(uint64_t seed, size_t param, int64_t element);

}  // namespace ckptsim::sim
