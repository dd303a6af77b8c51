// Divergence N4 of the fidelity audit (2026-12-02): upstream HEAD's --override-opt_param-scheduler
// block after the scheduler's load (d98e8a64dd training/checkpointing.py:3033-3041) resets the
// scheduler's num_steps to args.consumed_train_samples where they differ, before its step(0).
// They differ only when the scheduler was not stepped by the global batch size: the fault site
// scheduler.increment_per_iteration steps it by one an iteration, so the checkpoint holds
// num_steps = iteration while the training loop consumed iteration * samples_per_step samples.
// HEAD then resumes on the schedule of the samples consumed; the broken variant (the model
// before this test: no reset) resumes at the fault's count.
#include <gtest/gtest.h>

#include "model/faults.h"
#include "tests/testing.h"

using namespace ckptsim;

namespace {

// fused_adam, DP 2 -> 2, a linear warmup and decay over 6 iterations that moves every step;
// phase 1 resumes with --override-opt_param-scheduler (no argument changed: HEAD's group
// identity would refuse another --lr, N1).
sim::RunResult run(const std::string& revision, bool fault) {
  std::string json = R"({"seed": 3, "name": "n4", "samples_per_step": 8,
      "params": [{"name": "w0", "numel": 300, "dtype": "bf16"}],
      "optimizer": {"kind": "fused_adam", "lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8,
                    "weight_decay": 0.1},
      "schedule": {"lr_decay_style": "linear", "lr_warmup_iters": 1, "lr_decay_iters": 6,
                   "min_lr": 0.001},
      "phases": [{"dp": 2, "revision": ")" +
                     revision + R"(", "steps": 2},
                 {"dp": 2, "revision": ")" +
                     revision + R"(", "steps": 2, "opt_param_scheduler": "override"}])";
  if (fault)
    json += R"(, "faults": [")" + std::string(model::fault::kSchedulerPerIteration) + "\"]";
  return test::run(test::scenario_from_json(json + "}"));
}

// The lr the first step after the resume used (rank 0's first group).
double first_resumed_lr(const sim::RunResult& r) {
  const auto& phase = r.phases.at(1);
  EXPECT_TRUE(phase.completed);
  return phase.after_step.at(0).hypers.at(0).lr;
}

}  // namespace

TEST(N4OverrideResetsNumSteps, HeadResumesOnTheScheduleOfTheSamplesConsumed) {
  // Without the fault num_steps already equals the samples consumed: the reset changes nothing.
  const double clean = first_resumed_lr(run("upstream-head", false));
  const auto faulty = run("upstream-head", true);
  const double reset = first_resumed_lr(faulty);
  EXPECT_EQ(reset, clean) << "HEAD resets num_steps to consumed_train_samples (16)";
  // The uninterrupted run shares the fault and never loads: its step 3 runs at num_steps 2.
  const sim::GlobalState* ref = faulty.reference_at(3);
  ASSERT_NE(ref, nullptr);
  EXPECT_NE(ref->hypers.at(0).lr, reset);
}

// Only HEAD's block resets: upstream-2874 has no such block and resumes at the fault's count,
// as the uninterrupted run does.
TEST(N4OverrideResetsNumSteps, OlderRevisionsKeepTheCheckpointsCount) {
  const auto faulty = run("upstream-2874", true);
  const sim::GlobalState* ref = faulty.reference_at(3);
  ASSERT_NE(ref, nullptr);
  EXPECT_EQ(first_resumed_lr(faulty), ref->hypers.at(0).lr);
  EXPECT_NE(first_resumed_lr(faulty), first_resumed_lr(run("upstream-2874", false)));
}
