// The gate's classification (search/gate.h), without the CLI: the rule on hand-made inputs,
// then the whole gate on the reviewer's bug 1. Mutations each test here catches: unresolved
// checked after pre-existing (NotEvaluatedBaselineIsUnresolved), the same-cause test dropped
// (CandidateFailureWithAnotherBaselineCauseIsNew), the baseline-phase test dropped
// (BaselinePhaseFailing*), new-compat counted as not new (CountsAsNew).
#include "search/gate.h"

#include <gtest/gtest.h>

#include "tests/testing.h"

using namespace ckptsim;
using properties::PropertyResult;
using properties::Verdict;
using search::GateClass;

namespace {

search::Finding finding(const std::string& signature, const std::string& phase_revision) {
  return search::Finding{"step_matches_uninterrupted", signature, "detail", phase_revision,
                         std::nullopt};
}

PropertyResult baseline_result(Verdict v, const std::string& signature = "") {
  return PropertyResult{"step_matches_uninterrupted", v, "detail", signature};
}

const std::string kCause = "step_matches_uninterrupted:after_load:HDO cpu AdamW";

}  // namespace

TEST(GateClass, BaselineKeepingThePropertyMakesACandidateFailureNew) {
  EXPECT_EQ(
      search::gate_class(finding(kCause, "candidate"), baseline_result(Verdict::kPass), "baseline"),
      GateClass::kNew);
}

TEST(GateClass, SameCauseOnTheBaselineIsPreExisting) {
  EXPECT_EQ(search::gate_class(finding(kCause, "candidate"),
                               baseline_result(Verdict::kFail, kCause), "baseline"),
            GateClass::kPreExisting);
  // A failure without a signature is its property name.
  EXPECT_EQ(search::gate_class(finding("step_matches_uninterrupted", "candidate"),
                               baseline_result(Verdict::kFail, ""), "baseline"),
            GateClass::kPreExisting);
}

TEST(GateClass, CandidateFailureWithAnotherBaselineCauseIsNew) {
  EXPECT_EQ(search::gate_class(finding(kCause, "candidate"),
                               baseline_result(Verdict::kFail, kCause + ":other"), "baseline"),
            GateClass::kNew);
}

TEST(GateClass, BaselinePhaseFailingOnTheCandidatesCheckpointIsNewCompat) {
  EXPECT_EQ(
      search::gate_class(finding(kCause, "baseline"), baseline_result(Verdict::kPass), "baseline"),
      GateClass::kNewCompat);
}

TEST(GateClass, BaselinePhaseFailingWhereTheBaselineFailsAnywayIsPreExisting) {
  EXPECT_EQ(search::gate_class(finding(kCause, "baseline"),
                               baseline_result(Verdict::kFail, kCause + ":other"), "baseline"),
            GateClass::kPreExisting);
}

TEST(GateClass, NotEvaluatedBaselineIsUnresolved) {
  for (const char* phase : {"candidate", "baseline"}) {
    EXPECT_EQ(search::gate_class(finding(kCause, phase), baseline_result(Verdict::kNotEvaluated),
                                 "baseline"),
              GateClass::kUnresolved)
        << phase;
  }
}

TEST(GateClass, CountsAsNew) {
  EXPECT_TRUE(search::counts_as_new(GateClass::kNew));
  EXPECT_TRUE(search::counts_as_new(GateClass::kNewCompat));
  EXPECT_FALSE(search::counts_as_new(GateClass::kPreExisting));
  EXPECT_FALSE(search::counts_as_new(GateClass::kUnresolved));
  EXPECT_EQ(search::gate_class_name(GateClass::kNewCompat),
            "new (the baseline cannot resume from it)");
}

// Bug 1 through the library: miles-main saves, upstream-2874 resumes, merge() meets the raw
// step. The gate calls it new, and the findings do not depend on running the two searches at
// once or one after the other.
// gate --real judges every failing property of a scenario: the first new one is reported, so a
// failure the baseline shares (HEAD's HDO step, on every hybrid resume) never hides a new one.
// (Caught: picking the first failing property whatever its class.)
TEST(GateClass, APreExistingFailureNeverHidesANewOneInTheSameScenario) {
  auto finding = [](const std::string& property, GateClass c) {
    search::Finding f{property, property + ":x", "", "candidate", c};
    return f;
  };
  EXPECT_FALSE(search::gate_pick({}).has_value());
  const auto picked =
      search::gate_pick({finding("step_matches_uninterrupted", GateClass::kPreExisting),
                         finding("round_trip_identity", GateClass::kUnresolved),
                         finding("load_writes_every_element", GateClass::kNew),
                         finding("step_tensors_not_aliased", GateClass::kNew)});
  ASSERT_TRUE(picked.has_value());
  EXPECT_EQ(picked->property, "load_writes_every_element");
  const auto compat = search::gate_pick({finding("resume_completes", GateClass::kPreExisting),
                                         finding("no_duplicate_leaves", GateClass::kNewCompat)});
  EXPECT_EQ(compat->property, "no_duplicate_leaves");
  const auto none_new =
      search::gate_pick({finding("step_matches_uninterrupted", GateClass::kPreExisting),
                         finding("round_trip_identity", GateClass::kUnresolved)});
  EXPECT_EQ(none_new->property, "step_matches_uninterrupted");
}

// A baseline that stopped earlier never reached the candidate's failure: at HEAD a native fp32
// param with offload 1.0 fails the HDO's init; PR #2872 (fp32 shards detached) gets through it
// and then meets HEAD's own load KeyError (the new --lr changes the group's identity, N1). The
// gate called that "new"; it is unresolved. (Caught: stopped_before always "".)
TEST(GateClass, ABaselineThatStoppedEarlierLeavesTheFindingUnresolved) {
  if (!test::registry().get("test-fp32-detached").is_ok()) {
    ASSERT_TRUE(test::registry()
                    .add(R"({"name": "test-fp32-detached", "extends": "upstream-head",
                             "switches": {"fp32_shards_detached": true}})",
                         "gate_test.cpp")
                    .is_ok());
  }
  const std::string json = R"({"name": "fp32-offload-lr-change", "seed": 0,
    "optimizer": {"kind": "hybrid", "lr": 0.01, "offload_fraction": 1.0, "weight_decay": 0.1,
                  "betas": [0.9, 0.95], "eps": 1e-8},
    "params": [{"name": "p0", "numel": 1, "dtype": "fp32"}],
    "phases": [{"dp": 1, "revision": "REV", "steps": 1},
               {"dp": 1, "revision": "REV", "steps": 0,
                "schedule": {"lr": 0.005, "start_weight_decay": 0.05, "end_weight_decay": 0.05}}]})";
  auto with = [&](const std::string& rev) {
    std::string j = json;
    for (size_t at; (at = j.find("REV")) != std::string::npos;) j.replace(at, 3, rev);
    return test::run(test::scenario_from_json(j));
  };
  const auto base = with("upstream-head");
  const auto cand = with("test-fp32-detached");
  const auto on_cand = test::verdict(cand, "resume_completes");
  ASSERT_EQ(on_cand.verdict, Verdict::kFail);
  EXPECT_NE(on_cand.signature.find("KeyError"), std::string::npos) << on_cand.signature;
  ASSERT_EQ(test::verdict(base, "resume_completes").verdict, Verdict::kFail);  // at init
  // Phase 0 failed at init, so phase 1 never ran: it never reached the load.
  const std::string why = properties::stopped_before(base, cand, on_cand.phase);
  EXPECT_NE(why.find("never ran phase 1 (the candidate's fails at its load)"), std::string::npos)
      << why;
  EXPECT_EQ(properties::stopped_before(cand, cand, on_cand.phase), "");
  // Through the gate's own judge: unresolved, not new.
  const auto finding = search::gate_judge(test::revisions({"upstream-head"}).front(),
                                          {"resume_completes"})(test::scenario_from_json([&] {
    std::string j = json;
    for (size_t at; (at = j.find("REV")) != std::string::npos;)
      j.replace(at, 3, "test-fp32-detached");
    return j;
  }()));
  ASSERT_TRUE(finding.has_value());
  EXPECT_EQ(finding->gate_class, GateClass::kUnresolved);
}

TEST(Gate, CallsTheDuplicateLeafNewSequentialOrConcurrent) {
  search::GateOptions o;
  o.baseline = test::revisions({"miles-main"}).front();
  o.candidate = test::revisions({"upstream-2874"}).front();
  o.search.cases = 150;
  o.search.generator.kinds = {model::OptimizerKind::kHybrid};
  o.search.generator.dp_max = 4;
  o.properties = {"no_duplicate_leaves"};
  auto summary = [](const search::GateResult& r) {
    std::vector<std::string> out;
    for (const auto& f : r.findings()) {
      out.push_back(f.part + "|" + search::gate_class_name(f.gate_class) + "|" +
                    f.failure->finding.signature + "|" + std::to_string(f.failure->case_index) +
                    "|" + sim::scenario_to_json(f.failure->minimal).dump());
    }
    return out;
  };
  o.concurrent = false;
  const search::GateResult one = search::gate(o);
  o.concurrent = true;
  const search::GateResult two = search::gate(o);
  EXPECT_EQ(summary(one), summary(two));
  EXPECT_TRUE(one.introduced());
  bool dup = false;
  for (const auto& f : one.findings()) {
    if (f.gate_class != GateClass::kNew) continue;
    dup = dup || f.failure->finding.signature == "no_duplicate_leaves:duplicate leaf";
    EXPECT_LE(f.failure->minimal.phases.size(), 2u);
  }
  EXPECT_TRUE(dup);
}
