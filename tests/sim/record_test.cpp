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
//   OverlappingShardsAreRefused first_held() looking only at the range that starts at or before
//                               a shard's start (a shard that begins in a gap and runs into a
//                               later range passes), or refusing ranges that only touch
//   AShardOutsideItsParamIsOutOfRange
//                               a shard that starts before its param accepted (put_shard then
//                               writes before the array), or its end checked against the
//                               param's numel plus one
//   GivenUpStatesGatherAlike    gather_given_states taking rank 0's params where ranks hold
//                               pieces (gather_params_of_pieces then reads emptied params), or
//                               moving them before the other ranks are compared with them
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/errors.h"
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

sim::ShardSnapshot shard_of(size_t param, int64_t start, int64_t end) {
  sim::ShardSnapshot shard;
  shard.model_param = param;
  shard.param_range = {start, end};
  const auto n = static_cast<size_t>(end - start);
  shard.master.assign(n, 1.0F);
  shard.exp_avg.assign(n, 0.5F);
  shard.exp_avg_sq.assign(n, 0.25F);
  return shard;
}

// The message of the `Raised` that gathering `ranks` raises ("" when none; anything else
// propagates).
template <typename Raised>
std::string raised_by_gather(const sim::Scenario& s,
                             const std::vector<const sim::RankState*>& ranks) {
  try {
    (void)sim::gather_state(s, 1, ranks);
  } catch (const Raised& e) {
    return e.what();
  }
  return "";
}

std::string gather_refusal(const sim::Scenario& s,
                           const std::vector<const sim::RankState*>& ranks) {
  return raised_by_gather<model::InvariantViolation>(s, ranks);
}

TEST(StateGather, OverlappingShardsAreRefused) {
  sim::Scenario s;
  s.params = {{.name = "p", .numel = 8, .dtype = model::DType::kFloat32},
              {.name = "q", .numel = 4, .dtype = model::DType::kFloat32}};
  sim::RankState r0;
  sim::RankState r1;
  sim::RankState r2;
  // Ranges that touch, over both params, and one rank holding two: no refusal, and every element
  // of both params gathered.
  r0.shards = {shard_of(0, 0, 3), shard_of(1, 2, 4)};
  r1.shards = {shard_of(0, 3, 5), shard_of(0, 6, 8)};
  r2.shards = {shard_of(0, 5, 6), shard_of(1, 0, 2)};
  EXPECT_EQ(gather_refusal(s, {&r0, &r1, &r2}), "");
  const sim::GlobalState st = sim::gather_state(s, 1, {&r0, &r1, &r2});
  EXPECT_EQ(st.master[0], std::vector<float>(8, 1.0F));
  EXPECT_EQ(st.master[1], std::vector<float>(4, 1.0F));
  EXPECT_EQ(st.exp_avg_sq[1], std::vector<float>(4, 0.25F));
  EXPECT_EQ(st.shards.size(), 6U);
  // Rank 2's shard starts inside rank 0's.
  r2.shards = {shard_of(0, 2, 4)};
  EXPECT_NE(gather_refusal(s, {&r0, &r1, &r2}).find("element 2 of param p held by ranks 0 and 2"),
            std::string::npos)
      << gather_refusal(s, {&r0, &r1, &r2});
  // Rank 2's shard starts in a gap (rank 1 holds [3, 5) and [6, 8), nobody 5) and runs into
  // rank 1's second range.
  r2.shards = {shard_of(0, 5, 7)};
  EXPECT_NE(gather_refusal(s, {&r0, &r1, &r2}).find("element 6 of param p held by ranks 1 and 2"),
            std::string::npos)
      << gather_refusal(s, {&r0, &r1, &r2});
  // A replica is compared with the main copy, not counted as a holder.
  r2.shards.front().replica = true;
  EXPECT_EQ(gather_refusal(s, {&r0, &r1, &r2}), "");
}

std::string out_of_range_of(const sim::Scenario& s,
                            const std::vector<const sim::RankState*>& ranks) {
  return raised_by_gather<std::out_of_range>(s, ranks);
}

TEST(StateGather, AShardOutsideItsParamIsOutOfRange) {
  sim::Scenario s;
  s.params = {{.name = "p", .numel = 4, .dtype = model::DType::kFloat32}};
  sim::RankState r0;
  r0.shards = {shard_of(0, 0, 2)};
  sim::RankState r1;
  // Past the end: the first element outside, 4 of 4 (what the table of holders' at() said).
  r1.shards = {shard_of(0, 2, 5)};
  EXPECT_EQ(out_of_range_of(s, {&r0, &r1}),
            "vector::_M_range_check: __n (which is 4) >= this->size() (which is 4)");
  // A param the scenario lacks: its index against the number of params.
  r1.shards = {shard_of(3, 0, 1)};
  EXPECT_EQ(out_of_range_of(s, {&r0, &r1}),
            "vector::_M_range_check: __n (which is 3) >= this->size() (which is 1)");
  // Before the start: element -1 as the size_t index it was, before any overlap is looked at.
  sim::ShardSnapshot before = shard_of(0, 0, 3);
  before.param_range = {-1, 3};
  r1.shards = {before};
  EXPECT_EQ(out_of_range_of(s, {&r0, &r1}),
            "vector::_M_range_check: __n (which is 18446744073709551615) >= this->size() (which "
            "is 4)");
}

TEST(StateGather, GivenUpStatesGatherAlike) {
  sim::Scenario s;
  s.params = {{.name = "p", .numel = 4, .dtype = model::DType::kFloat32}};
  // Every rank holds the whole of every model param; rank 2's differ from rank 0's.
  sim::RankState r0;
  r0.shards = {shard_of(0, 0, 2)};
  r0.params = {{1.0F, 2.0F, 3.0F, 4.0F}};
  sim::RankState r1 = r0;
  r1.shards = {shard_of(0, 2, 4)};
  sim::RankState r2 = r1;
  r2.shards = {};
  r2.params = {{1.0F, 2.0F, 3.0F, 5.0F}};
  const sim::GlobalState kept = sim::gather_state(s, 1, {&r0, &r1, &r2});
  std::vector<sim::RankState> given = {r0, r1, r2};
  const sim::GlobalState moved = sim::gather_given_states(s, 1, {&given[0], &given[1], &given[2]});
  EXPECT_EQ(moved.param, kept.param);
  EXPECT_EQ(moved.param_on_rank, kept.param_on_rank);
  EXPECT_EQ(moved.param_on_rank.count(2), 1U);
  EXPECT_EQ(moved.hash(), kept.hash());
  // Ranks that hold pieces (TP): each rank's params in place, NaN where it holds none.
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  r0.params = {{1.0F, 2.0F, kNaN, kNaN}};
  r0.params_held = {{1, 1, 0, 0}};
  r1.params = {{kNaN, kNaN, 3.0F, 4.0F}};
  r1.params_held = {{0, 0, 1, 1}};
  const sim::GlobalState pieces = sim::gather_state(s, 1, {&r0, &r1});
  std::vector<sim::RankState> given_pieces = {r0, r1};
  const sim::GlobalState moved_pieces =
      sim::gather_given_states(s, 1, {&given_pieces[0], &given_pieces[1]});
  EXPECT_EQ(pieces.param, (std::vector<std::vector<float>>{{1.0F, 2.0F, 3.0F, 4.0F}}));
  EXPECT_EQ(moved_pieces.param, pieces.param);
  EXPECT_EQ(moved_pieces.hash(), pieces.hash());
}

}  // namespace
