// The model's trace and the replay plan (report/trace_json.h). Expected values are hand-made:
// the base64 of 1.0f and -2.0f written out from their IEEE-754 bytes, FNV-1a's offset basis for
// an empty array, and bug 2's counters from the spec (5 saved, 1 after the load). The Python
// side checks the same files with its own decoder and hash (ctest model_files_match_the_runner).
// Mutations caught: big-endian bytes or a lost '=' pad (Base64OfKnownFloats), hashing the whole
// param instead of the rank's shard (ShardHashesCoverTheRankRange), the after-load counters
// taken from the reference (Bug2TraceShowsTheReset), a plan without the reference run or with
// unscaled gradients (PlanHoldsEveryRunAndScaledGradients).
#include "report/trace_json.h"

#include <gtest/gtest.h>

#include "tests/testing.h"

using namespace ckptsim;

TEST(TraceJson, Base64OfKnownFloats) {
  // 1.0f = 0x3F800000 -> bytes 00 00 80 3F -> "AACAPw=="; -2.0f = 0xC0000000 -> 00 00 00 C0.
  EXPECT_EQ(report::base64_f32(std::vector<float>{1.0F}), "AACAPw==");
  EXPECT_EQ(report::base64_f32(std::vector<float>{1.0F, -2.0F}), "AACAPwAAAMA=");
  EXPECT_EQ(report::base64_f32(std::vector<float>{}), "");
  EXPECT_EQ(report::hash_f32(std::vector<float>{}), "cbf29ce484222325");
}

TEST(TraceJson, Bug2TraceShowsTheReset) {
  const auto run = test::run(test::scenario_file("scenarios/bug2-step-reset-dp2-to-4.json"));
  const nlohmann::json t = report::trace_json(run);
  EXPECT_EQ(t["source"], "model");
  ASSERT_EQ(t["runs"].size(), 3u);  // reference, phase0, phase1
  EXPECT_EQ(t["runs"][0]["id"], "reference");
  const auto& resumed = t["runs"][2];
  EXPECT_EQ(resumed["id"], "phase1");
  EXPECT_EQ(resumed["dp"], 4);
  EXPECT_EQ(resumed["load_from"], "phase0");
  int after_load = 0;
  for (const auto& e : resumed["events"]) {
    if (e["at"] != "after_load") continue;
    ++after_load;
    EXPECT_EQ(e["global_step"], 5);
    for (const auto& p : e["parts"]) {
      EXPECT_EQ(p["part"], "HDO cpu AdamW");
      EXPECT_EQ(p["step"], 1.0) << p.dump();
    }
  }
  EXPECT_EQ(after_load, 4);  // one per rank
  for (const auto& e : t["runs"][1]["events"]) {
    if (e["at"] != "at_save") continue;
    for (const auto& p : e["parts"]) EXPECT_EQ(p["step"], 5.0) << p.dump();
  }
}

TEST(TraceJson, ShardHashesCoverTheRankRange) {
  const auto run = test::run(test::scenario_file("scenarios/bug2-step-reset-dp2-to-4.json"));
  const nlohmann::json t = report::trace_json(run, /*values=*/true);
  const auto& e = t["runs"][1]["events"][0];  // phase0 init, rank 0
  ASSERT_EQ(e["rank"], 0);
  for (const auto& p : e["parts"]) {
    const std::string param = p["param"];
    const int64_t n = p["range"][1].get<int64_t>() - p["range"][0].get<int64_t>();
    // base64 of n floats: 4n bytes -> ceil(4n/3)*4 characters.
    EXPECT_EQ(e["values"]["master"][param].get<std::string>().size(),
              static_cast<size_t>((4 * n + 2) / 3 * 4));
  }
}

TEST(TraceJson, PlanHoldsEveryRunAndScaledGradients) {
  const auto s = test::scenario_file("scenarios/bug2-step-reset-dp2-to-4.json");
  const nlohmann::json plan = report::replay_plan_json(s);
  EXPECT_EQ(plan["format"], "ckptsim-replay-plan");
  ASSERT_EQ(plan["runs"].size(), 3u);
  EXPECT_EQ(plan["runs"][0]["id"], "reference");
  EXPECT_EQ(plan["runs"][0]["steps"], 8);
  EXPECT_EQ(plan["runs"][2]["start_step"], 5);
  EXPECT_EQ(plan["runs"][2]["grads"].size(), 3u);
  EXPECT_EQ(plan["runs"][2]["grads"][0].size(), 4u);  // dp 4
  EXPECT_EQ(plan["revisions"]["upstream-2874"]["upstream"]["commit"],
            "f4502eb1c92f77e0ed190cac00293e8ac192543b");
  // A gradient is k * 2^-16 / samples_per_step (8): 1000 + 600 floats, base64 of 6400 bytes.
  EXPECT_EQ(plan["runs"][1]["grads"][0][0].get<std::string>().size(), (6400u + 2) / 3 * 4);
}
