// Tests of sim/record.h's hashes: a state hash is the model's, not the hardware's.
//
// Which deliberately broken variant each test catches:
//   NanPayloadsHashAlike        hashing a NaN's raw bits (x86's 0xffc00000 and CUDA's
//                               0x7fffffff then hash apart: a GPU-resident run's trace differed
//                               from the CPU run's on fused-adam-save-before-first-step-miles-main)
//   OtherValuesHashAsTheirBytes canonicalizing more than NaNs (-0.0 as 0.0, or every
//                               non-finite value), which would hide a real difference
//   EachRankKeepsItsOwnModelParams
//                               rank 0's model params given to every rank (gather_state before
//                               2026-12-02): after a load each rank writes only its own range of
//                               an fp32 param, and the real ranks then differ (campaign2
//                               gen-miles-main-to-upstream-2874-seed36-case61)
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <vector>

#include "sim/record.h"

using namespace ckptsim;

namespace {

float from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }

TEST(StateHash, NanPayloadsHashAlike) {
  const std::vector<float> x86 = {1.5F, from_bits(0xffc00000U), -2.0F};
  const std::vector<float> cuda = {1.5F, from_bits(0x7fffffffU), -2.0F};
  EXPECT_EQ(sim::fnv1a_floats(x86, 7), sim::fnv1a_floats(cuda, 7));
  sim::GlobalState a;
  a.master = {x86};
  sim::GlobalState b;
  b.master = {cuda};
  EXPECT_EQ(a.hash(), b.hash());
  b.master = {{1.5F, 0.0F, -2.0F}};
  EXPECT_NE(a.hash(), b.hash()) << "a NaN and a number must still differ";
}

TEST(StateHash, OtherValuesHashAsTheirBytes) {
  const std::vector<float> values = {0.0F,
                                     -0.0F,
                                     std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity(),
                                     std::numeric_limits<float>::denorm_min(),
                                     3.25F};
  EXPECT_EQ(sim::fnv1a_floats(values, 11), sim::fnv1a(values.data(), values.size() * 4, 11));
  EXPECT_NE(sim::fnv1a_floats(std::vector<float>{0.0F}, 11),
            sim::fnv1a_floats(std::vector<float>{-0.0F}, 11));
}

TEST(StateGather, EachRankKeepsItsOwnModelParams) {
  sim::Scenario s;
  s.params = {{.name = "p", .numel = 3, .dtype = model::DType::kFloat32}};
  sim::RankState r0;
  r0.params = {{1.0F, 2.0F, 3.0F}};
  sim::RankState r1 = r0;
  sim::RankState r2 = r0;
  r2.params = {{1.0F, 2.0F, 4.0F}};
  const sim::GlobalState alike = sim::gather_state(s, 1, {&r0, &r1, &r0});
  EXPECT_TRUE(alike.param_on_rank.empty());
  const sim::GlobalState st = sim::gather_state(s, 1, {&r0, &r1, &r2});
  EXPECT_EQ(st.params_of(0), r0.params);
  EXPECT_EQ(st.params_of(1), r0.params);
  EXPECT_EQ(st.params_of(2), r2.params);
  EXPECT_EQ(st.param_on_rank.size(), 1U);
  EXPECT_NE(st.hash(), alike.hash()) << "a rank's own params are part of the state";
}

}  // namespace
