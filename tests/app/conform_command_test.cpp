// `ckptsim conform SCENARIO TRACE` judges both traces with the scenario beside them, as
// conform-campaign does: a --finetune phase starts its optimizer afresh, so the resume is judged by
// the fresh-start contract, not against the uninterrupted run's step counters. The trace is the
// real code's (H100, TE emulated, FusedAdam stand-in, tests/conformance/crash/), where the
// fine-tuned job's steps continue right.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "app/commands.h"
#include "tests/testing.h"

namespace {

using namespace ckptsim;

TEST(ConformCommand, JudgesAFreshOptimizerPhaseByTheFreshStartContract) {
  app::ConformCommand c;
  c.scenario = test::source_path("scenarios/finetune-upstream-head.json");
  c.real_trace = test::source_path(
      "tests/conformance/crash/"
      "finetune-upstream-head__nv-d98e8a64dd__h100x1-te-emulated__2026-12-05.trace.json");
  c.json = true;
  std::ostringstream out;
  std::ostringstream err;
  ASSERT_EQ(app::conform_command(c, out, err), app::kExitOk) << err.str() << out.str();
  const nlohmann::json j = nlohmann::json::parse(out.str());
  int judged = 0;
  for (const auto& p : j["properties"]) {
    if (p["name"] != "step_matches_uninterrupted" && p["name"] != "step_counts_optimizer_steps" &&
        p["name"] != "hyperparams_follow_schedule")
      continue;
    EXPECT_EQ(p["model"], "pass") << p.dump();
    EXPECT_EQ(p["real"], "pass") << p.dump();
    ++judged;
  }
  EXPECT_EQ(judged, 3);
}

}  // namespace
