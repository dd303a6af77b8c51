// Conformance of the model with a real trace (properties/conformance.h), on the model's own
// traces and on mutated copies of them: a changed step counter and a missing exception must come
// out as disagreements, the unchanged trace as agreement. Mutations of the comparison caught:
// counters not compared (AStepCounterChangedInTheRealTraceDisagrees), errors ignored
// (AMissingExceptionDisagrees), runs matched by position instead of id (ATraceOfAnotherScenario
// IsBadInput).
#include "properties/conformance.h"

#include <gtest/gtest.h>

#include "report/trace_json.h"
#include "tests/testing.h"

using namespace ckptsim;

namespace {

nlohmann::json model_trace(const std::string& scenario) {
  return report::trace_json(test::run(test::scenario_file(scenario)));
}

// `name` a string_view: GCC 13's -Wdangling-reference takes a reference returned from a call
// with a temporary std::string argument for one into that temporary.
const properties::PropertyAgreement& agreement(const properties::Conformance& c,
                                               std::string_view name) {
  for (const auto& p : c.properties) {
    if (p.property == name) return p;
  }
  throw std::runtime_error("no property " + std::string(name));
}

}  // namespace

TEST(Conformance, ATraceAgreesWithItself) {
  const auto t = model_trace("scenarios/bug2-step-reset-dp2-to-4.json");
  auto c = properties::conform(t, t, "same.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(c.value().verdicts_agree());
  EXPECT_TRUE(c.value().counters_agree());
  EXPECT_TRUE(c.value().divergences.empty()) << c.value().divergences.front().describe();
  EXPECT_GT(c.value().counters_compared, 0);
  EXPECT_EQ(agreement(c.value(), "step_matches_uninterrupted").model.verdict,
            properties::Verdict::kFail);  // bug 2, judged from the trace
}

TEST(Conformance, AStepCounterChangedInTheRealTraceDisagrees) {
  const auto model = model_trace("scenarios/bug2-step-reset-dp2-to-4.json");
  nlohmann::json real = model;
  // The real code keeps the step: every counter after the load reads 5, every later t is 6, 7, 8.
  for (auto& e : real["runs"][2]["events"]) {
    for (auto& p : e["parts"]) {
      if (e["at"] == "after_load") p["step"] = 5.0;
      if (e["at"] == "after_step" || e["at"] == "at_save") {
        p["step"] = e["global_step"].get<double>();
        if (e["at"] == "after_step") p["step_used"] = e["global_step"].get<double>();
      }
    }
  }
  auto c = properties::conform(model, real, "real.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_FALSE(c.value().verdicts_agree());
  EXPECT_FALSE(c.value().counters_agree());
  const auto& step = agreement(c.value(), "step_matches_uninterrupted");
  EXPECT_EQ(step.model.verdict, properties::Verdict::kFail);
  EXPECT_EQ(step.real.verdict, properties::Verdict::kPass) << step.real.detail;
  ASSERT_FALSE(c.value().divergences.empty());
  const auto& d = c.value().divergences.front();
  EXPECT_EQ(d.run, "phase1");
  EXPECT_EQ(d.at, "after_load");
  EXPECT_EQ(d.model, "1");
  EXPECT_EQ(d.real, "5");
}

TEST(Conformance, AMissingExceptionDisagrees) {
  const auto model = model_trace("scenarios/bug1-duplicate-leaf-dp2-to-2.json");
  ASSERT_EQ(model["runs"][2]["status"], "failed");
  nlohmann::json real = model;
  nlohmann::json kept = nlohmann::json::array();
  for (const auto& e : real["runs"][2]["events"]) {
    if (e["at"] != "error") kept.push_back(e);
  }
  real["runs"][2]["events"] = kept;
  real["runs"][2]["status"] = "completed";
  auto c = properties::conform(model, real, "real.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_FALSE(agreement(c.value(), "no_duplicate_leaves").agree());
  EXPECT_FALSE(agreement(c.value(), "resume_completes").agree());
  bool error_divergence = false;
  for (const auto& d : c.value().divergences) error_divergence |= d.field == "first primary error";
  EXPECT_TRUE(error_divergence);
}

TEST(Conformance, ATraceOfAnotherScenarioIsBadInput) {
  const auto a = model_trace("scenarios/bug2-step-reset-dp2-to-4.json");
  const auto b = model_trace("scenarios/bug1-duplicate-leaf-dp2-to-2.json");
  EXPECT_FALSE(properties::conform(a, b, "other.json").is_ok());
  EXPECT_FALSE(properties::conform(a, nlohmann::json::object(), "empty.json").is_ok());
  nlohmann::json fewer = a;
  fewer["runs"].erase(2);
  EXPECT_FALSE(properties::conform(a, fewer, "fewer.json").is_ok());
}
