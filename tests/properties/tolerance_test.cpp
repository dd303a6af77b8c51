// within_tolerance, the comparison trajectory_matches_uninterrupted makes for an element a reshard
// moved between kernel kinds: fixed at the move, plus the drift the steps since allow
// (kTrajectoryRtolPerStep of the uninterrupted run's value and change per step, added up by
// trajectory.cpp). The figures are those of the two scenarios/found/long-phase-* scenarios (read
// off their failures under the fixed tolerance) and of spec §17's bias-correction restart (~1e-2).
// Mutations caught: the drift ignored (LongPhaseDriftPassesOnlyWithItsSteps; the two found
// scenarios fail too); kTrajectoryRtolPerStep 64 times larger (ABiasCorrectionRestartStillFails).
// MovedElementsAreComparedWithinTolerance: the whole-array fast path taken for a param with a
// moved element, or the per-param moved flag never set (every element then counts bit for bit);
// a run of the walk over the reference's shards ending at the shard's end where no reference
// shard holds its first element (element 2 then counts as moved).
#include <gtest/gtest.h>

#include "properties/common.h"
#include "properties/properties.h"

namespace ckptsim::properties {
namespace {

// What `steps` steps at `value`, each changing it by `change`, allow.
double drift(int64_t steps, double value, double change) {
  return static_cast<double>(steps) * kTrajectoryRtolPerStep * (value + change);
}

TEST(TrajectoryTolerance, LongPhaseDriftPassesOnlyWithItsSteps) {
  // long-phase-cross-kernel-drift: 3.28e-6 apart at 0.2267 after 1864 steps.
  EXPECT_FALSE(within_tolerance(0.226697877f, 0.226694599f, false, 0.0));
  EXPECT_TRUE(within_tolerance(0.226697877f, 0.226694599f, false, drift(1864, 0.2267, 0.0)));
  // long-phase-small-value-drift: 4.51e-6 apart at 0.0087 after 1440 steps, the value a
  // fraction of what a step changes it by (lr 0.01).
  EXPECT_FALSE(within_tolerance(0.00871622097f, 0.00871171523f, false, 0.0));
  EXPECT_TRUE(within_tolerance(0.00871622097f, 0.00871171523f, false, drift(1440, 0.0087, 0.001)));
  // Ten times the first drift after 100 steps is more than 100 steps of rounding.
  EXPECT_FALSE(within_tolerance(0.2267328f, 0.226694599f, false, drift(100, 0.2267, 0.01)));
}

TEST(TrajectoryTolerance, ABiasCorrectionRestartStillFails) {
  const float expected = 0.25f;
  const float restarted = expected * (1.0f + 1e-2f);
  for (const int64_t steps : {0, 4, 256, 2048, 4096}) {
    EXPECT_FALSE(within_tolerance(restarted, expected, false, drift(steps, 0.25, 0.01)))
        << steps << " steps";
  }
}

TEST(TrajectoryTolerance, Bf16ValuesGetOneUlpPlusTheDrift) {
  // bf16 at 1.0: one ulp is 2^-7.
  EXPECT_TRUE(within_tolerance(1.0f + 0x1p-7f, 1.0f, true, 0.0));
  EXPECT_FALSE(within_tolerance(1.0f + 0x1p-6f, 1.0f, true, 0.0));
  EXPECT_TRUE(within_tolerance(1.0f + 0x1p-6f, 1.0f, true, 0x1p-7));
  EXPECT_TRUE(within_tolerance(0.0f, 0.0f, false, 0.0));
  EXPECT_FALSE(within_tolerance(1.0f, -1.0f, false, 1.0));
}

sim::ShardRecord shard_record(int rank, int64_t start, int64_t end, sim::Kernel kernel) {
  sim::ShardRecord s;
  s.param = 0;
  s.range = {start, end};
  s.rank = rank;
  s.kernel = kernel;
  return s;
}

sim::GlobalState state_at(int64_t global_step, std::vector<sim::ShardRecord> shards) {
  sim::GlobalState st;
  st.global_step = global_step;
  const std::vector<float> values = {0.5F, -1.25F, 2.0F, 0.125F};
  st.master = {values};
  st.exp_avg = {values};
  st.exp_avg_sq = {values};
  st.param = {values};
  st.moments_present = {std::vector<uint8_t>(values.size(), 1)};
  st.shards = std::move(shards);
  return st;
}

TEST(TrajectoryTolerance, MovedElementsAreComparedWithinTolerance) {
  sim::RunResult run;
  run.scenario.params = {{.name = "p", .numel = 4, .dtype = model::DType::kFloat32}};
  // The uninterrupted run's FusedAdam holds [0, 1) and [2, 4); nothing holds element 1.
  for (const int64_t step : {1, 2}) {
    run.reference.push_back(state_at(step, {shard_record(0, 0, 1, sim::Kernel::kFusedAdam),
                                            shard_record(0, 2, 4, sim::Kernel::kFusedAdam)}));
  }
  // The resumed run's FusedAdam holds [0, 3), torch's single-tensor AdamW [3, 4): elements 1
  // (no reference shard) and 3 (another kernel kind) moved, 0 and 2 did not.
  sim::PhaseRecord phase;
  phase.ran = true;
  for (const int64_t step : {1, 2}) {
    phase.after_step.push_back(
        state_at(step, {shard_record(0, 0, 3, sim::Kernel::kFusedAdam),
                        shard_record(1, 3, 4, sim::Kernel::kTorchSingleTensorCpu)}));
  }
  run.phases = {phase};
  const PropertyResult r = trajectory_matches_uninterrupted(run);
  EXPECT_TRUE(r.ok()) << r.detail;
  // 2 states x 4 fields: elements 0 and 2 bit for bit, 1 and 3 within tolerance.
  EXPECT_NE(r.detail.find("2 states compared with the uninterrupted run: 16 element values bit "
                          "for bit, 16 within tolerance"),
            std::string::npos)
      << r.detail;
}

}  // namespace
}  // namespace ckptsim::properties
