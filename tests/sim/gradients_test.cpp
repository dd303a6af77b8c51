// Tests of sim/gradients.h: the dyadic, DP-size-independent gradient source.
//
// Expectations are computed independently of local_gradient: per-sample values are turned
// back into their integer k (checking that they are integers, |k| <= kGradMagnitudeMax),
// summed in int64 and scaled once at the end; fp32 sums over DP ranks are formed here in
// several orders.
//
// Mutations each test catches (deliberately broken variants of gradients.cpp):
//   SumOverRanksIsExactForEveryDpSize   a non-dyadic scale (k / 1000 instead of k * 2^-16)
//                                       [tried: caught]; a magnitude bound too large for
//                                       2^24 (k up to 2^20) [tried: caught]; a rank skipping
//                                       or double-counting samples. (The first two are also
//                                       caught by the next test and by
//                                       ValuesCoverTheGridSymmetrically.)
//   LocalGradientIsItsRanksSamples      samples dealt to ranks in contiguous blocks instead of
//                                       s % dp_size (sums over all ranks still agree) [tried:
//                                       caught, by this test only]; every rank starting at
//                                       sample 0; the last element of every full block of 64
//                                       (local_gradient's vectorized loop) left at zero
//                                       [tried: caught, by this test only].
//   SubrangeMatchesFullRange            the hash uses the offset i in `out` instead of the
//                                       element index element_begin + i [tried: caught].
//   SameInputsSameBits                  hidden state (a counter or cache) in the source.
//   EveryInputChangesTheValue           an input left out of the hash; inputs combined
//                                       symmetrically (xor), so swapped step and param collide
//                                       [tried: caught, by this test only].
//   ValuesCoverTheGridSymmetrically     k drawn from [0, 2K] (no negatives) or from 2K buckets
//                                       (off by one: K never reached); zero too frequent.
//   PreconditionsAreChecked             a missing REQUIRES check.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "model/errors.h"
#include "sim/gradients.h"

namespace ckptsim::sim {
namespace {

constexpr int64_t kDpSizes[] = {1, 2, 3, 4, 5, 8, 16, 24};

// The integer k behind a per-sample value; asserts it is an integer within bounds.
int64_t units_of_value(float v) {
  const double scaled = std::ldexp(static_cast<double>(v), kGradExponent);
  const auto k = static_cast<int64_t>(scaled);
  RC_ASSERT(static_cast<double>(k) == scaled);
  RC_ASSERT(std::llabs(k) <= kGradMagnitudeMax);
  return k;
}

// Exact value of sum_k * 2^-kGradExponent as fp32; asserts the conversion is exact.
float scaled_exactly(int64_t sum_units) {
  const double exact = std::ldexp(static_cast<double>(sum_units), -kGradExponent);
  const auto f = static_cast<float>(exact);
  RC_ASSERT(static_cast<double>(f) == exact);
  return f;
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

rc::Gen<int64_t> samples_per_step_gen() {
  return rc::gen::weightedOneOf<int64_t>({
      {4, rc::gen::inRange<int64_t>(1, 65)},
      {3, rc::gen::inRange<int64_t>(65, 2049)},
      {1, rc::gen::just(kGradientSamplesMax)},
      {1, rc::gen::inRange<int64_t>(kGradientSamplesMax - 64, kGradientSamplesMax + 1)},
  });
}

struct Case {
  GradientSpec spec;
  int64_t step = 1;
  int64_t param_index = 0;
  int64_t element_begin = 0;
  std::size_t n = 1;
};

Case case_gen() {
  Case c;
  c.spec.seed = *rc::gen::arbitrary<uint64_t>();
  c.spec.samples_per_step = *samples_per_step_gen();
  c.step = *rc::gen::weightedOneOf<int64_t>(
      {{1, rc::gen::just<int64_t>(1)}, {4, rc::gen::inRange<int64_t>(1, 1'000'001)}});
  c.param_index = *rc::gen::inRange<int64_t>(0, 1000);
  c.element_begin = *rc::gen::inRange<int64_t>(0, int64_t{1} << 24);
  c.n = *rc::gen::inRange<std::size_t>(1, 17);
  return c;
}

// Independent exact total over all samples: int64 sum of k, scaled once.
std::vector<float> exact_total(const Case& c) {
  std::vector<float> total(c.n);
  for (std::size_t i = 0; i < c.n; ++i) {
    int64_t sum_units = 0;
    for (int64_t s = 0; s < c.spec.samples_per_step; ++s) {
      sum_units += units_of_value(
          sample_gradient(c.spec, c.step, c.param_index, c.element_begin + int64_t(i), s));
    }
    total[i] = scaled_exactly(sum_units);
  }
  return total;
}

RC_GTEST_PROP(Gradients, SumOverRanksIsExactForEveryDpSize, ()) {
  const Case c = case_gen();
  const std::vector<float> want = exact_total(c);
  for (int64_t dp : kDpSizes) {
    std::vector<std::vector<float>> local(static_cast<std::size_t>(dp), std::vector<float>(c.n));
    for (int64_t r = 0; r < dp; ++r) {
      local_gradient(c.spec, c.step, c.param_index, c.element_begin, r, dp,
                     local[static_cast<std::size_t>(r)]);
    }
    for (std::size_t i = 0; i < c.n; ++i) {
      float forward = 0.0f, backward = 0.0f;
      for (int64_t r = 0; r < dp; ++r) forward += local[std::size_t(r)][i];
      for (int64_t r = dp - 1; r >= 0; --r) backward += local[std::size_t(r)][i];
      // Pairwise (tree) order, as a ring or tree reduction might add.
      std::vector<float> level;
      for (int64_t r = 0; r < dp; ++r) level.push_back(local[std::size_t(r)][i]);
      while (level.size() > 1) {
        std::vector<float> next;
        for (std::size_t j = 0; j + 1 < level.size(); j += 2)
          next.push_back(level[j] + level[j + 1]);
        if (level.size() % 2 == 1) next.push_back(level.back());
        level = next;
      }
      RC_ASSERT(bits(forward) == bits(want[i]));
      RC_ASSERT(bits(backward) == bits(want[i]));
      RC_ASSERT(bits(level[0]) == bits(want[i]));
    }
  }
}

RC_GTEST_PROP(Gradients, LocalGradientIsItsRanksSamples, ()) {
  Case c = case_gen();
  c.spec.samples_per_step = *rc::gen::inRange<int64_t>(1, 200);
  // Up to 300 elements: local_gradient hashes in blocks of 64, so ranges cross block ends.
  c.n = *rc::gen::inRange<std::size_t>(1, 300);
  const int64_t dp = *rc::gen::inRange<int64_t>(1, 25);
  const int64_t rank = *rc::gen::inRange<int64_t>(0, dp);
  std::vector<float> got(c.n);
  local_gradient(c.spec, c.step, c.param_index, c.element_begin, rank, dp, got);
  for (std::size_t i = 0; i < c.n; ++i) {
    int64_t sum_units = 0;
    for (int64_t s = 0; s < c.spec.samples_per_step; ++s) {
      if (s % dp != rank) continue;
      sum_units += units_of_value(
          sample_gradient(c.spec, c.step, c.param_index, c.element_begin + int64_t(i), s));
    }
    RC_ASSERT(bits(got[i]) == bits(scaled_exactly(sum_units)));
  }
}

RC_GTEST_PROP(Gradients, SubrangeMatchesFullRange, ()) {
  Case c = case_gen();
  c.spec.samples_per_step = *rc::gen::inRange<int64_t>(1, 100);
  c.n = 16;
  const int64_t dp = *rc::gen::inRange<int64_t>(1, 9);
  const int64_t rank = *rc::gen::inRange<int64_t>(0, dp);
  const std::size_t offset = *rc::gen::inRange<std::size_t>(1, 16);
  std::vector<float> full(c.n), tail(c.n - offset), single(1);
  local_gradient(c.spec, c.step, c.param_index, c.element_begin, rank, dp, full);
  local_gradient(c.spec, c.step, c.param_index, c.element_begin + int64_t(offset), rank, dp, tail);
  for (std::size_t i = 0; i < tail.size(); ++i) RC_ASSERT(bits(tail[i]) == bits(full[offset + i]));
  local_gradient(c.spec, c.step, c.param_index, c.element_begin + int64_t(offset), rank, dp,
                 single);
  RC_ASSERT(bits(single[0]) == bits(full[offset]));
}

TEST(Gradients, SameInputsSameBits) {
  const GradientSpec spec{.seed = 42, .samples_per_step = 96};
  std::vector<float> a(300), b(300);
  local_gradient(spec, 7, 3, 1000, 2, 5, a);
  // Interleave unrelated calls: a hidden state would show up as a different second answer.
  std::vector<float> other(50);
  local_gradient(GradientSpec{.seed = 43, .samples_per_step = 8}, 1, 0, 0, 0, 1, other);
  (void)sample_gradient(spec, 9, 9, 9, 9);
  local_gradient(spec, 7, 3, 1000, 2, 5, b);
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(bits(a[i]), bits(b[i])) << "element " << i;
  EXPECT_EQ(bits(sample_gradient(spec, 7, 3, 1000, 4)), bits(sample_gradient(spec, 7, 3, 1000, 4)));
}

TEST(Gradients, EveryInputChangesTheValue) {
  constexpr int kTrials = 4000;
  constexpr int kCollisionsMax = 40;  // 1%; a good hash collides with probability 1/2047
  std::mt19937_64 rng(0x6772616473656e73ULL);
  const int64_t samples = 64;
  int same_seed = 0, same_step = 0, same_param = 0, same_element = 0, same_sample = 0;
  int same_step_param_swap = 0, same_element_sample_swap = 0, same_total_step = 0;
  for (int t = 0; t < kTrials; ++t) {
    const GradientSpec spec{.seed = rng(), .samples_per_step = samples};
    const int64_t step = 1 + int64_t(rng() % 60);
    const int64_t param = int64_t(rng() % 60);
    const int64_t element = int64_t(rng() % 60);
    const int64_t sample = int64_t(rng() % (samples - 1));
    const float base = sample_gradient(spec, step, param, element, sample);
    const GradientSpec spec2{.seed = spec.seed + 1, .samples_per_step = samples};
    same_seed += base == sample_gradient(spec2, step, param, element, sample);
    same_step += base == sample_gradient(spec, step + 1, param, element, sample);
    same_param += base == sample_gradient(spec, step, param + 1, element, sample);
    same_element += base == sample_gradient(spec, step, param, element + 1, sample);
    same_sample += base == sample_gradient(spec, step, param, element, sample + 1);
    if (step - 1 != param) {  // swap the values of step and param (step is 1-based)
      same_step_param_swap += base == sample_gradient(spec, param + 1, step - 1, element, sample);
    }
    if (element != sample) {
      same_element_sample_swap += base == sample_gradient(spec, step, param, sample, element);
    }
    std::vector<float> total(1), total_next(1);
    local_gradient(spec, step, param, element, 0, 1, total);
    local_gradient(spec, step + 1, param, element, 0, 1, total_next);
    same_total_step += total[0] == total_next[0];
  }
  EXPECT_LE(same_seed, kCollisionsMax);
  EXPECT_LE(same_step, kCollisionsMax);
  EXPECT_LE(same_param, kCollisionsMax);
  EXPECT_LE(same_element, kCollisionsMax);
  EXPECT_LE(same_sample, kCollisionsMax);
  EXPECT_LE(same_step_param_swap, kCollisionsMax);
  EXPECT_LE(same_element_sample_swap, kCollisionsMax);
  EXPECT_LE(same_total_step, kCollisionsMax);
}

TEST(Gradients, ValuesCoverTheGridSymmetrically) {
  const GradientSpec spec{.seed = 0x5eed, .samples_per_step = 200};
  int64_t positive = 0, negative = 0, zero = 0, abs_sum = 0;
  int64_t k_min = 0, k_max = 0;
  constexpr int64_t kCount = 200 * 1000;
  for (int64_t element = 0; element < 1000; ++element) {
    for (int64_t s = 0; s < 200; ++s) {
      const float v = sample_gradient(spec, 3, 1, element, s);
      const double scaled = std::ldexp(static_cast<double>(v), kGradExponent);
      const auto k = static_cast<int64_t>(scaled);
      ASSERT_EQ(static_cast<double>(k), scaled) << "not on the 2^-16 grid: " << v;
      ASSERT_LE(std::llabs(k), kGradMagnitudeMax);
      positive += k > 0;
      negative += k < 0;
      zero += k == 0;
      abs_sum += std::llabs(k);
      k_min = std::min(k_min, k);
      k_max = std::max(k_max, k);
    }
  }
  // Uniform over 2047 values: expected 49.98% each sign, 0.05% zeros, mean |k| = 511.75.
  EXPECT_GT(positive, kCount * 48 / 100);
  EXPECT_GT(negative, kCount * 48 / 100);
  EXPECT_LT(zero, kCount * 2 / 1000);
  EXPECT_EQ(k_min, -kGradMagnitudeMax);
  EXPECT_EQ(k_max, kGradMagnitudeMax);
  const double mean_abs = double(abs_sum) / double(kCount);
  EXPECT_GT(mean_abs, 0.48 * kGradMagnitudeMax);
  EXPECT_LT(mean_abs, 0.52 * kGradMagnitudeMax);
}

TEST(Gradients, PreconditionsAreChecked) {
  using model::InvariantViolation;
  const GradientSpec spec{.seed = 1, .samples_per_step = 4};
  std::vector<float> out(2);
  EXPECT_THROW(sample_gradient(spec, 0, 0, 0, 0), InvariantViolation);  // steps are 1-based
  EXPECT_THROW(sample_gradient(spec, 1, -1, 0, 0), InvariantViolation);
  EXPECT_THROW(sample_gradient(spec, 1, 0, -1, 0), InvariantViolation);
  EXPECT_THROW(sample_gradient(spec, 1, 0, 0, 4), InvariantViolation);
  EXPECT_THROW(sample_gradient(spec, 1, 0, 0, -1), InvariantViolation);
  EXPECT_THROW(local_gradient(spec, 1, 0, 0, 3, 3, out), InvariantViolation);
  EXPECT_THROW(local_gradient(spec, 1, 0, 0, 0, 0, out), InvariantViolation);
  EXPECT_THROW(local_gradient(spec, 1, 0, -5, 0, 1, out), InvariantViolation);
  EXPECT_THROW(local_gradient(GradientSpec{.seed = 1, .samples_per_step = 0}, 1, 0, 0, 0, 1, out),
               InvariantViolation);
  EXPECT_THROW(local_gradient(GradientSpec{.seed = 1, .samples_per_step = kGradientSamplesMax + 1},
                              1, 0, 0, 0, 1, out),
               InvariantViolation);
  EXPECT_NO_THROW(local_gradient(GradientSpec{.seed = 1, .samples_per_step = kGradientSamplesMax},
                                 1, 0, 0, 0, 1, out));
  // A rank without samples (dp_size > samples_per_step) gets +0.0 exactly.
  local_gradient(spec, 1, 0, 0, 7, 8, out);
  EXPECT_EQ(bits(out[0]), 0u);
  EXPECT_EQ(bits(out[1]), 0u);
}

}  // namespace
}  // namespace ckptsim::sim

// An expert param's local gradient (issue 26) is its EP group's tokens: summed over an
// expert-DP group (one rank of each EP group) it is every sample's sum, whatever the DP and EP
// sizes. Mutations caught: the rank's own samples only (each expert-DP group then sums one EP
// rank's residue class of samples) [tried: caught]; the EP group taken as a strided set.
TEST(Gradients, AnExpertDpGroupSumsEverySample) {
  const ckptsim::sim::GradientSpec spec{.seed = 7, .samples_per_step = 24};
  constexpr int64_t kN = 16;
  std::vector<float> all(kN, 0.0F);
  ckptsim::sim::local_gradient(spec, 3, 1, 5, 0, 1, all);
  for (const auto& [dp, ep] :
       {std::pair{4, 2}, std::pair{6, 3}, std::pair{8, 4}, std::pair{2, 1}}) {
    for (int64_t e = 0; e < ep; ++e) {
      std::vector<float> sum(kN, 0.0F), part(kN);
      for (int64_t r = e; r < dp; r += ep) {
        ckptsim::sim::expert_local_gradient(spec, 3, 1, 5, r, dp, ep, part);
        for (int64_t k = 0; k < kN; ++k) sum[k] += part[k];
      }
      EXPECT_EQ(sum, all) << "dp " << dp << " ep " << ep << " EP rank " << e;
    }
  }
}
