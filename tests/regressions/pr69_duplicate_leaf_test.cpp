// Bug 1 of radixark/Megatron-LM PR #69 (spec B2, §11.2 T6, §17 D): a checkpoint saved by
// miles-main holds the raw 'step' in rank 0's common state; a request built by the #2874 step
// handling holds a LocalNonpersistentObject at the same path; serialization.py load() merges
// the two and raises ValueError on the duplicate leaf. Fix B (omit 'step' from the request)
// makes the merge clean.
#include <gtest/gtest.h>

#include "tests/testing.h"

using namespace ckptsim;

TEST(Pr69DuplicateLeaf, MilesCheckpointFailsUnderUpstream2874) {
  const auto run = test::run(test::scenario_file("scenarios/bug1-duplicate-leaf-dp2-to-2.json"));
  const auto& resumed = run.phases.at(1);
  ASSERT_FALSE(resumed.completed);
  const auto& e = resumed.errors.front();
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.stage, "load");
  EXPECT_EQ(e.py_type, "ValueError");
  ASSERT_TRUE(e.merge_kind.has_value());
  EXPECT_EQ(*e.merge_kind, model::MergeError::Kind::kDuplicateLeaf);
  EXPECT_EQ(model::repr(e.merge_path),
            "('optimizer', 'param_state', 0, (torch.bfloat16, torch.float32), 0, 0, 'step')");
  // Rank 1 has one entry where rank 0 saved three: its merge fails on the list lengths.
  const auto& e1 = resumed.errors.at(1);
  ASSERT_TRUE(e1.merge_kind.has_value());
  EXPECT_EQ(*e1.merge_kind, model::MergeError::Kind::kListLengthMismatch);
  const auto r = test::verdict(run, "no_duplicate_leaves");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail);
  EXPECT_NE(r.detail.find("'step')"), std::string::npos) << r.detail;
}

TEST(Pr69DuplicateLeaf, OmittingStepFromTheRequestLoadsAtDp1) {
  // Spec §17 E: saved raw, loaded without 'step' in the request: the entry takes rank 0's common
  // step (5), right by accident at DP 1 with offload 1.0.
  const auto run = test::run(test::scenario_file("scenarios/spec17-E-raw-omit.json"));
  EXPECT_TRUE(test::verdict(run, "no_duplicate_leaves").ok());
  EXPECT_TRUE(test::verdict(run, "step_matches_uninterrupted").ok());
}

TEST(Pr69DuplicateLeaf, RankDependentCommonStateBreaksFixBWhenRank0SavedFewerEntries) {
  // Spec §12 / B3: rank 0's compacted common step list is persisted for every rank. Layout (by
  // hand, spec §2.1): params [a(10), b(10), big(200)] lie reversed: big [0,200), b [256,266),
  // a [320,330); U = 330. Saved at DP 2 (L = 192) rank 0 holds only `big` (one entry with a raw
  // step); loaded at DP 1 the request has 5 entries (3 params, 2 pads). The RX merge patch only
  // truncates a longer common list, so even Fix B (no step in the request) fails to merge.
  const std::string json = R"({"seed": 3, "name": "b3", "params": [
      {"name": "a", "numel": 10, "dtype": "bf16"}, {"name": "b", "numel": 10, "dtype": "bf16"},
      {"name": "big", "numel": 200, "dtype": "bf16"}],
    "optimizer": {"kind": "hybrid", "offload_fraction": 1.0, "lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8,
                  "weight_decay": 0.1},
    "phases": [{"dp": 2, "revision": "miles-main", "steps": 2}, {"dp": 1, "revision": "fix-drop-on-load", "steps": 1}]})";
  const auto run = test::run(test::scenario_from_json(json));
  EXPECT_FALSE(test::verdict(run, "common_state_rank_independent").ok());
  const auto r = test::verdict(run, "no_duplicate_leaves");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail);
  EXPECT_NE(r.detail.find("Cannot merge two lists with different lengths (1 and 5"),
            std::string::npos)
      << r.detail;
}
