// Every property must be able to fail: each one is shown failing on a deliberately broken
// variant (a buggy upstream revision, or a named fault site of model/faults.h) and passing on
// the same scenario without the breakage. A property that passed both would assert nothing.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "model/faults.h"
#include "tests/testing.h"

using namespace ckptsim;

namespace {

// The clean baseline: both of the reviewer's fixes, hybrid offload 1.0, DP 2 -> 4.
std::string clean(const std::string& extra = "") {
  return test::two_phase_json("hybrid", 1.0, 2, 4, "fix-recommended", "fix-recommended", extra);
}

void expect_only_failures(const sim::RunResult& run, const std::vector<std::string>& failing) {
  for (const auto& r : properties::check_all(run)) {
    if (std::find(failing.begin(), failing.end(), r.name) != failing.end()) {
      EXPECT_EQ(r.verdict, properties::Verdict::kFail) << r.name << ": " << r.detail;
    } else {
      EXPECT_TRUE(r.ok()) << r.name << " should hold here: " << r.detail;
    }
  }
}

// The clean scenario with `fault` (a storage fault of phase 0's save, JSON) and `extra`.
std::string with_storage_fault(const std::string& fault, const std::string& extra = "") {
  std::string json = clean(extra);
  json.replace(json.find("\"steps\": 3"), 10, "\"steps\": 3, \"storage_faults\": [" + fault + "]");
  return json;
}

// No property fails (one may be not_evaluated: a resume after a storage fault that failed
// loudly reaches no step to judge).
void expect_no_failures(const sim::RunResult& run) {
  for (const auto& r : properties::check_all(run))
    EXPECT_NE(r.verdict, properties::Verdict::kFail) << r.name << ": " << r.detail;
}

}  // namespace

TEST(PropertyCanary, CleanBaselinePassesEverything) {
  const auto run = test::run(test::scenario_from_json(clean()));
  for (const auto& r : properties::check_all(run))
    EXPECT_TRUE(r.ok()) << r.name << ": " << r.detail;
}

TEST(PropertyCanary, NoDuplicateLeavesCatchesRawStepUnderLnoRequest) {
  const auto run = test::run(test::scenario_from_json(
      test::two_phase_json("hybrid", 1.0, 1, 1, "miles-main", "upstream-2874")));
  EXPECT_EQ(test::verdict(run, "no_duplicate_leaves").verdict, properties::Verdict::kFail);
}

TEST(PropertyCanary, ResumeCompletesCatchesThePre2874SaveAssert) {
  const auto run = test::run(test::scenario_from_json(
      test::two_phase_json("hybrid", 1.0, 2, 2, "upstream-pre-2874", "upstream-pre-2874")));
  const auto r = test::verdict(run, "resume_completes");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail);
  EXPECT_NE(r.detail.find("torch.Size([])"), std::string::npos) << r.detail;
}

TEST(PropertyCanary, StepMatchesCatchesTheSkeletonStep) {
  const auto run = test::run(test::scenario_from_json(
      test::two_phase_json("hybrid", 1.0, 2, 4, "upstream-2874", "upstream-2874")));
  EXPECT_EQ(test::verdict(run, "step_matches_uninterrupted").verdict, properties::Verdict::kFail);
}

// A counter kept in bf16 (torchao PR #4915, DeepSpeed PR #8496) stops at 256: from global step
// 257 on every Adam part uses t=256. The uninterrupted run shares the bug, so every property
// that compares the two runs holds; only the absolute count sees it, for each optimizer kind.
TEST(PropertyCanary, StepCountsCatchesANarrowCounterTheUninterruptedRunShares) {
  for (const std::string kind : {"hybrid", "fused_adam", "torch_adamw"}) {
    auto scenario = [&](const std::string& extra) {
      std::string json =
          test::two_phase_json(kind, 1.0, 2, 4, "fix-complete", "fix-complete", extra);
      json.replace(json.find("\"steps\": 3"), 10, "\"steps\": 258");
      return test::scenario_from_json(json);
    };
    const auto run = test::run(scenario(R"(, "faults": ["optimizer.step_counter_bf16"])"));
    expect_only_failures(run, {"step_counts_optimizer_steps"});
    const auto r = test::verdict(run, "step_counts_optimizer_steps");
    EXPECT_NE(r.detail.find("the uninterrupted run, after global step 257:"), std::string::npos)
        << kind << ": " << r.detail;
    EXPECT_NE(r.detail.find("used t=256 and holds step 256 (right: 257)"), std::string::npos)
        << kind << ": " << r.detail;
    EXPECT_TRUE(test::verdict(test::run(scenario("")), "step_counts_optimizer_steps").ok()) << kind;
  }
}

// The reviewer's bug 2 (the skeleton step over the restored one) fails the absolute count too.
TEST(PropertyCanary, StepCountsCatchesTheSkeletonStep) {
  const auto run = test::run(test::scenario_from_json(
      test::two_phase_json("hybrid", 1.0, 2, 4, "upstream-2874", "upstream-2874")));
  const auto r = test::verdict(run, "step_counts_optimizer_steps");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail);
  EXPECT_NE(r.detail.find("after the load at global step 3: HDO cpu AdamW"), std::string::npos)
      << r.detail;
  EXPECT_NE(r.detail.find("holds step 1 (right: 3)"), std::string::npos) << r.detail;
}

// A load that leaves a saved piece unread: those elements keep the request's values. The
// absolute check names the ranges; without the fault the same run writes every element.
TEST(PropertyCanary, LoadWritesEveryElementCatchesASkippedPiece) {
  const auto run = test::run(test::scenario_from_json(clean(R"(, "faults": ["load.skip_piece"])")));
  const auto r = test::verdict(run, "load_writes_every_element");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail) << r.detail;
  EXPECT_NE(r.detail.find("phase 1 (dp=4, fix-recommended): the load left"), std::string::npos)
      << r.detail;
  EXPECT_NE(r.detail.find("optimizer.distributed."), std::string::npos) << r.detail;
  EXPECT_TRUE(
      test::verdict(test::run(test::scenario_from_json(clean())), "load_writes_every_element")
          .ok());
}

// Phase 0's first shard file lands empty though its write reported success (a short write):
// the resume must fail loudly. A loader that skips the damaged pieces loads the rest silently.
TEST(PropertyCanary, ResumeAfterCrashCatchesALoaderThatSkipsDamagedPieces) {
  const std::string fault = R"({"kind": "short", "file": "shard"})";
  const auto loud = test::run(test::scenario_from_json(with_storage_fault(fault)));
  expect_no_failures(loud);
  ASSERT_EQ(loud.phases.size(), 2u);
  ASSERT_FALSE(loud.phases[1].errors.empty());
  for (const auto& e : loud.phases[1].errors) {
    if (!e.secondary) {
      EXPECT_EQ(e.stage + " " + e.py_type, "load CheckpointException");
    }
  }
  EXPECT_NE(test::verdict(loud, "resume_after_crash_is_complete").detail.find("1 failed loudly"),
            std::string::npos);
  const auto run = test::run(test::scenario_from_json(
      with_storage_fault(fault, R"(, "faults": ["load.skip_damaged_pieces"])")));
  const auto r = test::verdict(run, "resume_after_crash_is_complete");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail) << r.detail;
  EXPECT_NE(r.detail.find("phase 1 (dp=4, fix-recommended): silently loaded a partial checkpoint "
                          "of iteration 3"),
            std::string::npos)
      << r.detail;
}

// Phase 0's save stops at its first shard file. Written last, the tracker still names nothing
// and phase 1 starts from random; written first, it names iteration 3, whose files are not all
// there.
TEST(PropertyCanary, TrackerNamesSavedStateCatchesATrackerWrittenBeforeTheData) {
  const std::string fault = R"({"kind": "crash_before", "file": "shard"})";
  const auto clean_run = test::run(test::scenario_from_json(with_storage_fault(fault)));
  expect_no_failures(clean_run);
  ASSERT_EQ(clean_run.phases.size(), 2u);
  EXPECT_TRUE(clean_run.phases[0].crashed);
  EXPECT_TRUE(clean_run.phases[1].started_fresh);
  const auto run = test::run(test::scenario_from_json(
      with_storage_fault(fault, R"(, "faults": ["save.tracker_before_data"])")));
  const auto r = test::verdict(run, "tracker_names_saved_state");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail) << r.detail;
  EXPECT_NE(r.detail.find("after phase 0 (dp=2, fix-recommended)'s save the tracker names "
                          "iteration 3, whose files are not a whole checkpoint"),
            std::string::npos)
      << r.detail;
}

TEST(PropertyCanary, TrajectoryCatchesOneUlpInOneRestoredMoment) {
  // Steps are right (fix-recommended); only exp_avg[0] on rank 0 is off by one ulp after the load.
  const auto run =
      test::run(test::scenario_from_json(clean(R"(, "faults": ["load.perturb_exp_avg"])")));
  // The load no longer gives back what was saved: round_trip_identity sees it too.
  expect_only_failures(run, {"trajectory_matches_uninterrupted", "round_trip_identity"});
  const auto r = test::verdict(run, "trajectory_matches_uninterrupted");
  EXPECT_NE(r.detail.find("exp_avg"), std::string::npos) << r.detail;
  EXPECT_NE(r.detail.find("after the load"), std::string::npos) << r.detail;
}

TEST(PropertyCanary, ShardsTileBucketsCatchesADroppedPad) {
  // Layout by hand: w1 [0,100), gap [100,128), w0 [128,428); U = 428. At DP 4 (L = 128) rank 0's
  // shard ends inside the gap, so its pieces end with a pad [100,128); dropping it leaves a gap.
  std::string json = test::two_phase_json("hybrid", 1.0, 2, 4, "fix-recommended", "fix-recommended",
                                          R"(, "faults": ["dp_reshardable.drop_end_padding"])");
  json.replace(json.find("\"numel\": 130"), 12, "\"numel\": 100");
  const auto run = test::run(test::scenario_from_json(json));
  const auto r = test::verdict(run, "shards_tile_buckets");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail) << r.detail;
  EXPECT_NE(r.detail.find("[100, 128) of [0, 428)"), std::string::npos) << r.detail;
  // Without the fault the same scenario tiles.
  std::string clean_json =
      test::two_phase_json("hybrid", 1.0, 2, 4, "fix-recommended", "fix-recommended");
  clean_json.replace(clean_json.find("\"numel\": 130"), 12, "\"numel\": 100");
  EXPECT_TRUE(
      test::verdict(test::run(test::scenario_from_json(clean_json)), "shards_tile_buckets").ok());
}

TEST(PropertyCanary, CommonStateCatchesRankDependentLeaf) {
  const auto run =
      test::run(test::scenario_from_json(clean(R"(, "faults": ["save.rank_dependent_common"])")));
  const auto r = test::verdict(run, "common_state_rank_independent");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail);
  EXPECT_NE(r.detail.find("ckptsim_rank"), std::string::npos) << r.detail;
}

TEST(PropertyCanary, LayoutInvariantsCatchAMisalignedParam) {
  const auto run =
      test::run(test::scenario_from_json(clean(R"(, "faults": ["layout.misalign_param_start"])")));
  const auto r = test::verdict(run, "layout_invariants");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail);
  EXPECT_NE(r.detail.find("not a multiple of 64"), std::string::npos) << r.detail;
  EXPECT_TRUE(
      test::verdict(test::run(test::scenario_from_json(clean())), "layout_invariants").ok());
}

TEST(PropertyCanary, RoundTripIdentityCatchesTheSkeletonStep) {
  // Bug 2: the load gives back step 1 where 3 was saved — without consulting the reference run.
  const auto run = test::run(test::scenario_from_json(
      test::two_phase_json("hybrid", 1.0, 2, 4, "upstream-2874", "upstream-2874")));
  const auto r = test::verdict(run, "round_trip_identity");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail);
  EXPECT_NE(r.detail.find("is 1 after the load, 3 when saved"), std::string::npos) << r.detail;
}

TEST(PropertyCanary, ReshardRoundTripBytesCatchesAChangedMomentAfterAZeroStepResume) {
  // dp 2 -> 3 with no step, then save: one ulp in a restored moment changes the saved bytes.
  std::string json = test::two_phase_json("hybrid", 1.0, 2, 3, "fix-complete", "fix-complete",
                                          R"(, "faults": ["load.perturb_exp_avg"])");
  json.replace(json.find("\"steps\": 2"), 10, "\"steps\": 0");
  const auto run = test::run(test::scenario_from_json(json));
  const auto r = test::verdict(run, "reshard_round_trip_bytes");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail);
  EXPECT_NE(r.detail.find("exp_avg"), std::string::npos) << r.detail;
  std::string clean_json =
      test::two_phase_json("hybrid", 1.0, 2, 3, "fix-complete", "fix-complete");
  clean_json.replace(clean_json.find("\"steps\": 2"), 10, "\"steps\": 0");
  EXPECT_TRUE(
      test::verdict(test::run(test::scenario_from_json(clean_json)), "reshard_round_trip_bytes")
          .ok());
}

TEST(PropertyCanary, StepTensorsNotAliasedCatchesB9) {
  auto& reg = test::registry();
  if (!reg.get("test-b9-canary").is_ok()) {
    ASSERT_TRUE(reg.add(R"({"name": "test-b9-canary", "extends": "fix-complete",
                           "switches": {"pure_torch_load_clones_step": false}})",
                        "canary_test.cpp")
                    .is_ok());
  }
  const auto run = test::run(test::scenario_from_json(
      test::two_phase_json("torch_adamw", 0, 1, 1, "test-b9-canary", "test-b9-canary")));
  const auto r = test::verdict(run, "step_tensors_not_aliased");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail);
  EXPECT_NE(r.detail.find("same object"), std::string::npos) << r.detail;
  // B9's other symptom: the shared step advances once per param each step.
  EXPECT_EQ(test::verdict(run, "step_matches_uninterrupted").verdict, properties::Verdict::kFail);
  EXPECT_TRUE(test::verdict(test::run(test::scenario_from_json(test::two_phase_json(
                                "torch_adamw", 0, 1, 1, "fix-complete", "fix-complete"))),
                            "step_tensors_not_aliased")
                  .ok());
}

// A linear warmup and decay, and a rising weight decay, that move within a few steps.
constexpr const char* kDecaySchedule =
    R"(, "schedule": {"lr_decay_style": "linear", "lr_warmup_iters": 1, "lr_decay_iters": 6,
        "min_lr": 0.001, "start_weight_decay": 0.05, "weight_decay_incr_style": "cosine",
        "train_iters": 5})";

// A scheduler stepped by one iteration instead of the global batch size (the fault site):
// the uninterrupted run shares it, so only the absolute check sees the schedule running
// eight times slower; without the fault the same run follows it.
TEST(PropertyCanary, HyperparamsFollowScheduleCatchesASchedulerSteppedPerIteration) {
  for (const std::string kind : {"hybrid", "fused_adam", "torch_adamw"}) {
    auto scenario = [&](const std::string& extra) {
      return test::scenario_from_json(test::two_phase_json(
          kind, 1.0, 2, 4, "fix-complete", "fix-complete", std::string(kDecaySchedule) + extra));
    };
    const auto run = test::run(scenario(R"(, "faults": ["scheduler.increment_per_iteration"])"));
    expect_only_failures(run, {"hyperparams_follow_schedule"});
    const auto r = test::verdict(run, "hyperparams_follow_schedule");
    EXPECT_NE(r.detail.find("the uninterrupted run, global step 2:"), std::string::npos)
        << kind << ": " << r.detail;
    EXPECT_TRUE(test::verdict(test::run(scenario("")), "hyperparams_follow_schedule").ok()) << kind;
  }
}

// Megatron-LM issue #1138: a resume with a new lr under --override-opt_param-scheduler keeps
// the checkpoint's lr on upstream-2874; fix-complete takes the new one.
TEST(PropertyCanary, HyperparamsFollowScheduleCatchesAnOverrideThatKeepsTheOldLr) {
  auto scenario = [](const std::string& revision) {
    std::string json = test::two_phase_json("fused_adam", 1.0, 2, 4, revision, revision);
    const std::string resumed = R"("dp": 4, "revision": ")" + revision + "\"";
    json.replace(json.find(resumed), resumed.size(),
                 resumed + R"(, "schedule": {"lr": 0.02}, "opt_param_scheduler": "override")");
    return test::scenario_from_json(json);
  };
  const auto r = test::verdict(test::run(scenario("upstream-2874")), "hyperparams_follow_schedule");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail) << r.detail;
  EXPECT_EQ(r.signature, "hyperparams_follow_schedule:lr:override_resume");
  EXPECT_NE(r.detail.find("(the schedule says 0.02, from --override-opt_param-scheduler)"),
            std::string::npos)
      << r.detail;
  EXPECT_TRUE(
      test::verdict(test::run(scenario("fix-complete")), "hyperparams_follow_schedule").ok());
}

// Every fault site names the property that must catch it (FaultSite::caught_by): switched on in
// a scenario where it fires, it fails exactly that property (the others may fail too), and the
// same scenario without it keeps that property.
TEST(PropertyCanary, EveryFaultSiteFailsThePropertyItNames) {
  // w1 of 100 elements leaves a gap [100, 128) at the end of rank 0's shard at DP 4, where the
  // dropped end pad shows (see ShardsTileBucketsCatchesADroppedPad).
  auto scenario = [](const std::string& fault) {
    // A scheduler stepped at the wrong rate shows only in a schedule that moves.
    const std::string schedule =
        fault == model::fault::kSchedulerPerIteration ? kDecaySchedule : "";
    std::string json = test::two_phase_json(
        "hybrid", 1.0, 2, 4, "fix-recommended", "fix-recommended",
        schedule + (fault.empty() ? "" : R"(, "faults": [")" + fault + R"("])"));
    json.replace(json.find("\"numel\": 130"), 12, "\"numel\": 100");
    // A moment kept fp32 needs TE's precision-aware FusedAdam with a low-precision moment.
    if (fault == model::fault::kLowPrecisionMomentKeptFp32) {
      const std::string hybrid =
          "\"kind\": \"hybrid\", \"lr\": 0.01, \"betas\": [0.9, 0.95], \"eps\": 1e-8, "
          "\"weight_decay\": 0.1, \"offload_fraction\": " +
          std::to_string(1.0);
      json.replace(json.find(hybrid), hybrid.size(),
                   "\"kind\": \"fused_adam\", \"lr\": 0.01, \"betas\": [0.9, 0.95], "
                   "\"eps\": 1e-8, \"weight_decay\": 0.1, \"precision_aware\": true, "
                   "\"exp_avg_dtype\": \"bf16\"");
      // POST hands the load's 'padding': False to TE's set_scaled_state (AttributeError).
      for (std::string::size_type at; (at = json.find("fix-recommended")) != std::string::npos;)
        json.replace(at, 15, "upstream-head");
    }
    // The chain's prefix shows only with an expert part (issue 26): w1 an expert param, EP 2.
    if (fault == model::fault::kChainedPrefixDropped) {
      const std::string w1 = "{\"name\": \"w1\", \"numel\": 100, \"dtype\": \"bf16\"}";
      json.replace(json.find(w1), w1.size(),
                   "{\"name\": \"w1\", \"numel\": 100, \"dtype\": \"bf16\", \"expert\": true}");
      for (const char* dp : {"\"dp\": 2,", "\"dp\": 4,"}) {
        const std::string d = dp;
        json.replace(json.find(d), d.size(), d + " \"ep\": 2,");
      }
    }
    // The chain's step sites (issue 26): an MoE model (w1 an expert param of 512 elements, so
    // that every expert-DP rank's shard holds elements at DP 4 and the load gets as far as the
    // chain) whose first phase's checkpoint holds the expert part one step behind;
    // load.expert_step_from_dense is then the load that hides it.
    if (fault == model::fault::kExpertStepBehind || fault == model::fault::kExpertStepFromDense ||
        fault == model::fault::kExpertPartNotLoaded) {
      const std::string w1 = "{\"name\": \"w1\", \"numel\": 100, \"dtype\": \"bf16\"}";
      json.replace(json.find(w1), w1.size(),
                   "{\"name\": \"w1\", \"numel\": 512, \"dtype\": \"bf16\", \"expert\": true}");
      for (const char* dp : {"\"dp\": 2,", "\"dp\": 4,"}) {
        const std::string d = dp;
        json.replace(json.find(d), d.size(), d + " \"ep\": 2,");
      }
      if (fault == model::fault::kExpertStepFromDense) {
        const std::string one = "\"faults\": [\"" + fault + "\"]";
        json.replace(json.find(one), one.size(),
                     "\"faults\": [\"save.expert_step_behind\", \"" + fault + "\"]");
      }
    }
    // A narrow counter goes wrong only past 256 steps.
    if (fault == model::fault::kStepCounterBf16) {
      json.replace(json.find("\"steps\": 3"), 10, "\"steps\": 258");
    }
    // The crash sites show only where a save meets a storage fault.
    if (fault == model::fault::kTrackerBeforeData || fault == model::fault::kSkipDamagedPieces) {
      const std::string kind = fault == model::fault::kTrackerBeforeData ? "crash_before" : "short";
      json.replace(
          json.find("\"steps\": 3"), 10,
          "\"steps\": 3, \"storage_faults\": [{\"kind\": \"" + kind + "\", \"file\": \"shard\"}]");
    }
    // The async save's sites: saves at iterations 2 and 4 of one job; a slow disk and a crash
    // in the second save leave the tracker the first save's finalize wrote.
    if (fault == model::fault::kAsyncFinalizeReadsLiveIteration ||
        fault == model::fault::kAsyncReusesCachedHandles) {
      const bool live = fault == model::fault::kAsyncFinalizeReadsLiveIteration;
      json.replace(json.find("\"steps\": 3"), 10,
                   std::string("\"steps\": 4, \"save_interval\": 2, \"async_save\": true") +
                       (live ? ", \"async_write_steps\": 1, \"storage_faults\": [{\"kind\": "
                               "\"crash_before\", \"file\": \"shard\", \"nth\": 2}]"
                             : ""));
    }
    // The reload runs only where a resume loads no optimizer state; the iteration resets only
    // under --finetune.
    if (fault == model::fault::kReloadSkipsModelParams) {
      json.replace(json.find("\"steps\": 2}"), 11, "\"steps\": 2, \"no_load_optim\": true}");
    }
    if (fault == model::fault::kFinetuneKeepsIteration) {
      json.replace(json.find("\"steps\": 2}"), 11, "\"steps\": 2, \"finetune\": true}");
    }
    return test::scenario_from_json(json);
  };
  ASSERT_FALSE(model::fault_sites().empty());
  const auto clean_run = test::run(scenario(""));
  for (const auto& site : model::fault_sites()) {
    ASSERT_NE(properties::find_property(site.caught_by), nullptr) << site.name;
    const auto run = test::run(scenario(site.name));
    int64_t fired = 0;
    for (const auto& p : run.phases) {
      for (const auto& [name, count] : p.fault_firings) fired += name == site.name ? count : 0;
    }
    EXPECT_GT(fired, 0) << site.name << " never fired";
    if (site.name == model::fault::kExpertStepFromDense) {
      // A load that hides a refusal: with the checkpoint of save.expert_step_behind the load
      // must fail (scenarios/moe-steps-differ-load-refused-upstream-head.json expects it), and
      // this site makes it pass.
      const auto refused = test::run(scenario(model::fault::kExpertStepBehind));
      EXPECT_EQ(test::verdict(refused, site.caught_by).verdict, properties::Verdict::kFail);
      EXPECT_TRUE(test::verdict(run, site.caught_by).ok())
          << site.name << " does not hide the refusal";
      continue;
    }
    EXPECT_EQ(test::verdict(run, site.caught_by).verdict, properties::Verdict::kFail)
        << site.name << " is not caught by " << site.caught_by;
    EXPECT_TRUE(test::verdict(clean_run, site.caught_by).ok()) << site.caught_by;
  }
}

TEST(PropertyCanary, EveryPropertyNamesACanaryTestThatExists) {
  // Each property's registry entry (its one home) names its canary: a test of this file.
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  std::set<std::string> tests;
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j)
      tests.insert(std::string(suite.name()) + "." + suite.GetTestInfo(j)->name());
  }
  for (const auto& p : properties::all_properties()) {
    EXPECT_TRUE(p.canary.starts_with("PropertyCanary.")) << p.name << ": " << p.canary;
    EXPECT_EQ(tests.count(p.canary), 1u) << p.name << " names no existing canary: " << p.canary;
  }
}

TEST(PropertyRegistry, TheReadmeTableHasARowForEveryProperty) {
  std::ifstream in(test::source_path("README.md"));
  std::set<std::string> rows;
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("| `")) continue;
    const size_t end = line.find('`', 3);
    const std::string name = line.substr(3, end - 3);
    if (name.find('_') != std::string::npos && name.find(' ') == std::string::npos &&
        name.find('-') == std::string::npos && name.find('.') == std::string::npos)
      rows.insert(name);
  }
  std::set<std::string> names;
  for (const auto& p : properties::all_properties()) names.insert(p.name);
  for (const auto& n : names) EXPECT_EQ(rows.count(n), 1u) << n << " has no row in README.md";
}

TEST(PropertyTolerance, MovedElementsUseTheDocumentedToleranceAndStillCatchAStepBug) {
  // Offload 0.5 at DP 2 -> 4 moves elements between the CPU AdamW and the GPU FusedAdam parts.
  // With every step right (the reviewer's fixes plus the B5 fix) the trajectory must pass using
  // the tolerance for moved elements; with the #2874 step handling it must still fail.
  auto& reg = test::registry();
  if (!reg.get("test-steps-right").is_ok()) {
    ASSERT_TRUE(reg.add(R"({"name": "test-steps-right", "extends": "fix-recommended",
                           "switches": {"hdo_group_sync_skips_step": true}})",
                        "canary_test.cpp")
                    .is_ok());
  }
  const auto good = test::run(test::scenario_from_json(
      test::two_phase_json("hybrid", 0.5, 2, 4, "test-steps-right", "test-steps-right")));
  const auto r = test::verdict(good, "trajectory_matches_uninterrupted");
  EXPECT_TRUE(r.ok()) << r.detail;
  EXPECT_EQ(r.detail.find(" 0 within tolerance"), std::string::npos)
      << "elements did move: " << r.detail;
  EXPECT_TRUE(test::verdict(good, "step_matches_uninterrupted").ok());

  const auto bad = test::run(test::scenario_from_json(
      test::two_phase_json("hybrid", 0.5, 2, 4, "upstream-2874", "upstream-2874")));
  EXPECT_EQ(test::verdict(bad, "trajectory_matches_uninterrupted").verdict,
            properties::Verdict::kFail);
}

// Phase 1 resumes with --no-load-optim: the model params are loaded, the optimizer starts afresh
// from them (reload_model_params) and the uninterrupted run restarts its optimizer there too.
// With the reload skipped, the main params keep the weights the job was built with: the first
// step trains those, not the loaded ones.
TEST(PropertyCanary, FirstStepContinuesFromLoadedWeightsCatchesASkippedReload) {
  for (const std::string kind : {"fused_adam", "hybrid"}) {
    auto scenario = [&](const std::string& extra) {
      std::string json =
          test::two_phase_json(kind, 1.0, 2, 4, "fix-complete", "fix-complete", extra);
      json.replace(json.find("\"steps\": 2}"), 11, "\"steps\": 2, \"no_load_optim\": true}");
      return test::scenario_from_json(json);
    };
    const auto clean_run = test::run(scenario(""));
    for (const auto& r : properties::check_all(clean_run))
      EXPECT_TRUE(r.ok()) << kind << ": " << r.name << ": " << r.detail;
    EXPECT_NE(test::verdict(clean_run, "first_step_continues_from_loaded_weights")
                  .detail.find("1 --no-load-optim resume(s)"),
              std::string::npos)
        << kind;
    const auto run = test::run(scenario(R"(, "faults": ["load.reload_skips_model_params"])"));
    const auto r = test::verdict(run, "first_step_continues_from_loaded_weights");
    EXPECT_EQ(r.verdict, properties::Verdict::kFail) << kind << ": " << r.detail;
    EXPECT_EQ(r.signature, "first_step_continues_from_loaded_weights:main_param") << kind;
    EXPECT_NE(r.detail.find("phase 1 (dp=4, fix-complete) (--no-load-optim): after the load, the "
                            "optimizer's main param of w0[0]"),
              std::string::npos)
        << kind << ": " << r.detail;
  }
}

// The first step's bound on its own (the main params right, the step wrong): a recorded run
// whose first step after a --no-load-optim load moved one weight by 0.5, far beyond what
// Adam's first step with lr 0.01 can.
TEST(PropertyCanary, FirstStepContinuesFromLoadedWeightsBoundsTheFirstStep) {
  std::string json = test::two_phase_json("fused_adam", 1.0, 2, 4, "fix-complete", "fix-complete");
  json.replace(json.find("\"steps\": 2}"), 11, "\"steps\": 2, \"no_load_optim\": true}");
  auto run = test::run(test::scenario_from_json(json));
  ASSERT_TRUE(test::verdict(run, "first_step_continues_from_loaded_weights").ok());
  ASSERT_FALSE(run.phases[1].after_step.empty());
  run.phases[1].after_step.front().param[1][7] += 0.5F;
  const auto r = test::verdict(run, "first_step_continues_from_loaded_weights");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail) << r.detail;
  EXPECT_EQ(r.signature, "first_step_continues_from_loaded_weights:first_step");
  EXPECT_NE(r.detail.find("the first step moved w1[7] from the loaded"), std::string::npos)
      << r.detail;
}

// Phase 1 resumes with --finetune after 3 steps: the weights are loaded, the optimizer and the
// scheduler start afresh, and the training loop counts from iteration 0, so its save after 2
// steps is iter_0000002 (global step 5). With the reset skipped the job counts on from 3: the
// save and the tracker name iteration 5, which only this property judges (the files and the
// tracker agree, and the training is the same).
TEST(PropertyCanary, IterationFollowsResumeModeCatchesAFinetuneThatKeepsTheIteration) {
  for (const std::string kind : {"fused_adam", "hybrid"}) {
    auto scenario = [&](const std::string& extra) {
      std::string json =
          test::two_phase_json(kind, 1.0, 2, 4, "upstream-head", "upstream-head", extra);
      json.replace(json.find("\"steps\": 2}"), 11, "\"steps\": 2, \"finetune\": true}");
      return test::scenario_from_json(json);
    };
    const auto clean_run = test::run(scenario(""));
    for (const auto& r : properties::check_all(clean_run)) {
      if (kind == "hybrid" && r.name == "step_matches_uninterrupted") continue;  // HEAD's B5
      EXPECT_TRUE(r.ok()) << kind << ": " << r.name << ": " << r.detail;
    }
    EXPECT_EQ(clean_run.phases[1].start_step, 3) << kind;
    EXPECT_EQ(clean_run.phases[1].iteration_origin, 3) << kind;
    EXPECT_EQ(sim::saved_directory(clean_run, 1), "iter_0000002") << kind;
    EXPECT_NE(test::verdict(clean_run, "iteration_follows_resume_mode")
                  .detail.find("2 job(s) ended with the tracker and the files naming the training "
                               "loop's iteration (1 counting from a --finetune resume)"),
              std::string::npos)
        << kind;
    const auto run = test::run(scenario(R"(, "faults": ["load.finetune_keeps_iteration"])"));
    EXPECT_EQ(sim::saved_directory(run, 1), "iter_0000005") << kind;
    const auto r = test::verdict(run, "iteration_follows_resume_mode");
    EXPECT_EQ(r.verdict, properties::Verdict::kFail) << kind << ": " << r.detail;
    EXPECT_EQ(r.signature, "iteration_follows_resume_mode:iteration") << kind;
    EXPECT_NE(r.detail.find("phase 1 (dp=4, upstream-head): after its last save the tracker "
                            "names iteration 5 (the files 5); expected 2, 0 at its --finetune "
                            "resume (global step 3), plus its 2 step(s)"),
              std::string::npos)
        << kind << ": " << r.detail;
    EXPECT_TRUE(test::verdict(run, "tracker_names_saved_state").ok()) << kind;
    EXPECT_TRUE(test::verdict(run, "trajectory_matches_uninterrupted").ok()) << kind;
  }
}

// What the disk kept after a storage fault is not the loop's count: a short tracker write leaves
// the tracker empty (found by check --revision fix-complete --fault-space storage, case 13), and
// the property leaves that save to tracker_names_saved_state.
TEST(PropertyCanary, IterationFollowsResumeModeLeavesAFaultedSaveToTheDisk) {
  std::string json = test::two_phase_json("fused_adam", 0, 2, 4, "fix-complete", "fix-complete");
  json.replace(json.find("\"steps\": 2}"), 11,
               "\"steps\": 2, \"storage_faults\": [{\"kind\": \"short\", \"file\": "
               "\"tracker\"}]}");
  const auto run = test::run(test::scenario_from_json(json));
  ASSERT_TRUE(run.phases[1].on_disk.has_value());
  EXPECT_EQ(run.phases[1].on_disk->named, std::nullopt);  // the short write left it empty
  const auto r = test::verdict(run, "iteration_follows_resume_mode");
  EXPECT_TRUE(r.ok()) << r.detail;
  EXPECT_NE(r.detail.find("1 job(s) ended"), std::string::npos) << r.detail;  // phase 0 only
}

// A precision-aware FusedAdam with bf16 moments, DP 2 -> 4 at HEAD: the resumed run stores its
// moments in bf16 as the uninterrupted one does; with the moments cast to fp32 and kept there at
// the load (the fault site) the property fails, and the trajectory with it.
TEST(PropertyCanary, StateDtypesSurviveResumeCatchesAMomentKeptFp32) {
  std::string json = test::two_phase_json("fused_adam", 0, 2, 4, "upstream-head", "upstream-head");
  const std::string kind = "\"kind\": \"fused_adam\"";
  json.replace(json.find(kind), kind.size(),
               kind +
                   ", \"precision_aware\": true, \"exp_avg_dtype\": \"bf16\", "
                   "\"exp_avg_sq_dtype\": \"bf16\"");
  const auto clean_run = test::run(test::scenario_from_json(json));
  const auto ok = test::verdict(clean_run, "state_dtypes_survive_resume");
  EXPECT_EQ(ok.verdict, properties::Verdict::kPass) << ok.detail;
  EXPECT_NE(ok.detail.find("shard states of resumed runs"), std::string::npos) << ok.detail;
  expect_no_failures(clean_run);
  json.insert(json.size() - 1,
              ", \"faults\": [\"" + std::string(model::fault::kLowPrecisionMomentKeptFp32) + "\"]");
  const auto run = test::run(test::scenario_from_json(json));
  const auto r = test::verdict(run, "state_dtypes_survive_resume");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail);
  EXPECT_NE(r.detail.find("stores exp_avg fp32 (uninterrupted run: bf16)"), std::string::npos)
      << r.detail;
  EXPECT_EQ(test::verdict(run, "trajectory_matches_uninterrupted").verdict,
            properties::Verdict::kFail);
}

// Issue 26's "no chained part is re-initialized silently when its keys are in the checkpoint":
// the bundled MoE resume keeps every property; with its expert part left unloaded
// (load.expert_part_not_loaded, NVIDIA-NeMo/RL #3345) round_trip_identity and
// step_matches_uninterrupted fail, and the step detail names the part. Mutations caught: the
// label without the chain part (no "expert part"), the fault not skipping the part (passes).
TEST(PropertyCanary, ASilentlyReinitializedExpertPartFailsAndIsNamed) {
  sim::Scenario s = test::scenario_file("scenarios/moe-expert-part-dp2-to-4-upstream-head.json");
  const auto clean = test::run(s);
  for (const char* p : {"round_trip_identity", "step_matches_uninterrupted"})
    EXPECT_TRUE(test::verdict(clean, p).ok()) << p;
  s.faults = {model::fault::kExpertPartNotLoaded};
  const auto run = test::run(s);
  EXPECT_EQ(test::verdict(run, "round_trip_identity").verdict, properties::Verdict::kFail);
  const auto step = test::verdict(run, "step_matches_uninterrupted");
  EXPECT_EQ(step.verdict, properties::Verdict::kFail);
  EXPECT_NE(step.detail.find("expert part) is none (expected 3"), std::string::npos) << step.detail;
}
