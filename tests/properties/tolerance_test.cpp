// within_tolerance, the comparison trajectory_matches_uninterrupted makes for an element a reshard
// moved between kernel kinds: fixed at the move, growing by kTrajectoryRtolPerStep per step since.
// The figures are those of scenarios/found/long-phase-cross-kernel-drift.json (read off its
// failure under the fixed tolerance) and of spec §17's bias-correction restart (~1e-2).
// Mutations caught: no growth (the long-phase drift fails); growth per step too large (the
// restart's 1e-2 passes at 4096 steps, or 5e-4 at 1000); growth taken from the
// a fixed amount per step instead of a fraction of the values (FarFromZeroStillBounded).
#include <gtest/gtest.h>

#include "properties/common.h"
#include "properties/properties.h"

namespace ckptsim::properties {
namespace {

TEST(TrajectoryTolerance, LongPhaseDriftPassesOnlyWithItsSteps) {
  const float expected = 0.226694599f;
  const float observed = 0.226697877f;  // 3.28e-6 apart after 1864 steps under CPU AdamW
  EXPECT_FALSE(within_tolerance(observed, expected, false, 0));
  EXPECT_TRUE(within_tolerance(observed, expected, false, 1864));
  // Ten times that drift after 100 steps is more than 100 steps of rounding.
  EXPECT_FALSE(within_tolerance(expected + 10 * (observed - expected), expected, false, 100));
}

TEST(TrajectoryTolerance, ABiasCorrectionRestartStillFails) {
  const float expected = 0.25f;
  const float restarted = expected * (1.0f + 1e-2f);
  for (const int64_t steps : {0, 4, 256, 2048, 4096})
    EXPECT_FALSE(within_tolerance(restarted, expected, false, steps)) << steps << " steps";
  // 5e-4 relative: caught for the first thousand steps after a move, not at 4096.
  const float small = expected * (1.0f + 5e-4f);
  EXPECT_FALSE(within_tolerance(small, expected, false, 1000));
  EXPECT_TRUE(within_tolerance(small, expected, false, 4096));
}

TEST(TrajectoryTolerance, FarFromZeroStillBounded) {
  // The growth is a fraction of the values compared, not of their difference.
  EXPECT_FALSE(within_tolerance(1.0f, -1.0f, false, 4096));
  EXPECT_FALSE(within_tolerance(2e-6f, 0.0f, false, 4096));
  EXPECT_TRUE(within_tolerance(0.0f, 0.0f, false, 0));
}

TEST(TrajectoryTolerance, Bf16ValuesGetOneUlpAndTheSameGrowth) {
  // bf16 at 1.0: one ulp is 2^-7.
  EXPECT_TRUE(within_tolerance(1.0f + 0x1p-7f, 1.0f, true, 0));
  EXPECT_FALSE(within_tolerance(1.0f + 0x1p-6f, 1.0f, true, 0));
  EXPECT_TRUE(within_tolerance(1.0f + 0x1p-6f, 1.0f, true, 40000));
}

}  // namespace
}  // namespace ckptsim::properties
