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

namespace {

const nlohmann::json& event_of(const nlohmann::json& run, int64_t rank, const std::string& at) {
  for (const auto& e : run["events"]) {
    if (e["rank"] == rank && e["at"] == at) return e;
  }
  throw std::runtime_error("no event " + at + " of rank " + std::to_string(rank));
}

}  // namespace

// At TP 2 x PP 2 a rank's model_param hashes are over what its module holds: its stage's params,
// each its TP piece in local order, as the real runner hashes them. Worked by hand from the
// scenario: layers 0 (stage 0) and 1 (stage 1); rank 1 is (tp 1, dp 0, pp 0), rank 4 is (tp 0,
// dp 0, pp 1). The pieces are cut here from the whole values that phase1 (TP 1, PP 1) holds
// right after its load of the same checkpoint (global step 3): layers.0.proj [32, 48] row split,
// TP rank 1's piece = columns 24..47 of every row; embedding [48, 32] column split, rows 24..47.
// (Caught: held_params hashing whole params at TP > 1; a row piece cut as one contiguous run.)
TEST(TraceJson, TpPpRanksHashTheirStagesTpPieces) {
  const auto run = test::run(
      test::scenario_file("scenarios/fully-reshardable-reshards-tp-pp-dp-upstream-head.json"));
  const nlohmann::json t = report::trace_json(run, /*values=*/true);
  const auto& phase0 = t["runs"][1];
  ASSERT_EQ(phase0["tp"], 2);
  ASSERT_EQ(phase0["pp"], 2);
  const auto names = [](const nlohmann::json& e) {
    std::vector<std::string> out;
    for (const auto& [name, h] : e["hashes"]["model_param"].items()) out.push_back(name);
    return out;
  };
  const nlohmann::json saved1 = event_of(phase0, 1, "at_save");
  EXPECT_EQ(names(saved1), (std::vector<std::string>{"embedding", "layers.0.norm", "layers.0.proj",
                                                     "layers.0.qkv"}));
  EXPECT_EQ(names(event_of(phase0, 4, "at_save")),
            (std::vector<std::string>{"layers.1.fc", "layers.1.norm"}));
  const nlohmann::json whole = event_of(t["runs"][2], 0, "after_load")["values"]["model_param"];
  const std::vector<float> proj =
      report::floats_of_base64(whole["layers.0.proj"].get<std::string>()).value();
  ASSERT_EQ(proj.size(), 32u * 48u);
  std::vector<float> proj_piece;
  for (size_t r = 0; r < 32; ++r)
    for (size_t c = 24; c < 48; ++c) proj_piece.push_back(proj[r * 48 + c]);
  EXPECT_EQ(saved1["hashes"]["model_param"]["layers.0.proj"], report::hash_f32(proj_piece));
  const std::vector<float> emb =
      report::floats_of_base64(whole["embedding"].get<std::string>()).value();
  const std::vector<float> emb_piece(emb.begin() + 24 * 32, emb.end());
  EXPECT_EQ(saved1["hashes"]["model_param"]["embedding"], report::hash_f32(emb_piece));
  const std::vector<float> norm =
      report::floats_of_base64(whole["layers.0.norm"].get<std::string>()).value();
  EXPECT_EQ(saved1["hashes"]["model_param"]["layers.0.norm"], report::hash_f32(norm));
}
