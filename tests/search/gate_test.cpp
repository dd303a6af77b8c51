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
