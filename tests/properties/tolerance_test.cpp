// within_tolerance, the comparison trajectory_matches_uninterrupted makes for an element a reshard
// moved between kernel kinds: fixed at the move, plus the drift the steps since allow
// (kTrajectoryRtolPerStep of the uninterrupted run's value and change per step, added up by
// trajectory.cpp). The figures are those of the two scenarios/found/long-phase-* scenarios (read
// off their failures under the fixed tolerance) and of spec §17's bias-correction restart (~1e-2).
// Mutations caught: the drift ignored (LongPhaseDriftPassesOnlyWithItsSteps; the two found
// scenarios fail too); kTrajectoryRtolPerStep 64 times larger (ABiasCorrectionRestartStillFails).
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

}  // namespace
}  // namespace ckptsim::properties
