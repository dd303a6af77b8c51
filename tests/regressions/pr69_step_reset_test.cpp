// Bug 2 of radixark/Megatron-LM PR #69 (spec B1, §11.2 T12): with --optimizer-cpu-offload the
// load skeleton is built after HDO.dummy_step(), the LocalNonpersistentObject keeps that step
// (1.0) and _set_main_param_and_optimizer_states assigns it over the step restored from the
// param groups; Adam bias correction restarts at t=2. The expected counters (1 after the load
// instead of 5; t=2 at global step 6 instead of 6) are the spec's, derived by hand.
#include <gtest/gtest.h>

#include "tests/testing.h"

using namespace ckptsim;

TEST(Pr69StepReset, Upstream2874RestartsTheStepAtDp2To4) {
  const auto run = test::run(test::scenario_file("scenarios/bug2-step-reset-dp2-to-4.json"));
  const auto& resumed = run.phases.at(1);
  ASSERT_TRUE(resumed.after_load.has_value());
  EXPECT_EQ(resumed.start_step, 5);
  for (const auto& s : resumed.after_load->shards) {
    EXPECT_EQ(s.part, sim::OptimizerPart::kHdoCpuAdamW);
    ASSERT_TRUE(s.counter.has_value());
    EXPECT_EQ(*s.counter, 1.0) << "the skeleton-time step (HDO.dummy_step) survived the load";
  }
  const auto& first = resumed.after_step.at(0);
  EXPECT_EQ(first.global_step, 6);
  for (const auto& s : first.shards) EXPECT_EQ(s.step_used.value_or(-1), 2.0);
  const auto r = test::verdict(run, "step_matches_uninterrupted");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail);
  EXPECT_NE(r.detail.find("is 1 (expected 5"), std::string::npos) << r.detail;
  // The reference itself counts 1..8 without a gap.
  EXPECT_EQ(run.reference.back().shards.front().step_used.value_or(-1), 8.0);
}

TEST(Pr69StepReset, FixRecommendedRestoresStepAndTrajectory) {
  const auto run = test::run(test::scenario_file("scenarios/bug2-fixed-dp2-to-4.json"));
  for (const auto& s : run.phases.at(1).after_load->shards) EXPECT_EQ(s.counter.value_or(-1), 5.0);
  for (const auto& r : properties::check_all(run))
    EXPECT_TRUE(r.ok()) << r.name << ": " << r.detail;
}

TEST(Pr69StepReset, EitherFixAloneRestoresTheStepOfAnLnoCheckpoint) {
  // Spec §12: Fix A alone (skip in _set) and Fix B alone (omit from the request) each restore
  // N for a checkpoint saved with the LNO step.
  for (const char* fix : {"fix-skip-step", "fix-drop-on-load"}) {
    const auto run = test::run(
        test::scenario_from_json(test::two_phase_json("hybrid", 1.0, 2, 4, "upstream-2874", fix)));
    EXPECT_TRUE(test::verdict(run, "step_matches_uninterrupted").ok()) << fix;
    EXPECT_TRUE(test::verdict(run, "trajectory_matches_uninterrupted").ok()) << fix;
  }
}
