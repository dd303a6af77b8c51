// `ckptsim inspect` on the checkpoints issue 26 added to the model: a chained (MoE) optimizer's,
// whose keys carry 'chained_<i>.', and a precision-aware FusedAdam's (int16 remainders, moments
// saved unscaled from bf16). Each checkpoint is the model's own torch_dist save of a scenario;
// every expected value comes from that scenario (its params, expert flags, EP, DP, optimizer
// fields), never from inspect's own output.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "model/megatron/optimizer_key.h"
#include "model/megatron/torch_dist_checkpoint.h"
#include "model/revision.h"
#include "model/storage.h"
#include "sim/checkpoint_scenario.h"
#include "tests/app/inspect_testing.h"
#include "tests/testing.h"

namespace {

namespace fs = std::filesystem;
using namespace ckptsim;
using json = nlohmann::json;

const std::string kScenarios = std::string(CKPTSIM_SOURCE_DIR) + "/scenarios/";
const std::string kMoe = "moe-expert-part-dp2-to-4-upstream-head";
const std::string kStepsDiffer = "moe-steps-differ-load-refused-upstream-head";
const std::string kBf16Moments = "precision-aware-bf16-moments-dp2-to-4-upstream-head";

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

// The model's torch_dist save of `scenario`'s first phase alone (its checkpoint dir, phase_0).
fs::path save_first_phase(const std::string& name, json scenario) {
  scenario["phases"] = json::array({scenario["phases"][0]});
  scenario.erase("expect");
  const fs::path dir = fs::temp_directory_path() / ("ckptsim-inspect-chained-" + name);
  fs::remove_all(dir);
  sim::RunOptions options;
  options.checkpoint_dir = dir.string();
  options.checkpoint_format = sim::CheckpointFormat::kTorchDist;
  test::run(test::scenario_from_json(scenario.dump(), name), options);
  return dir / "phase_0";
}

model::TorchDistCheckpoint read_saved(const fs::path& phase_dir) {
  model::DirectoryStorage storage(phase_dir.string());
  auto c = model::read_torch_dist_checkpoint(storage, "");
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return c.is_ok() ? c.value() : model::TorchDistCheckpoint{};
}

sim::Revision upstream_head() { return test::revisions({"upstream-head"}).front(); }

const json* check_named(const json& out, const std::string& name) {
  for (const auto& k : out["checks"]) {
    if (k["name"] == name) return &k;
  }
  return nullptr;
}

TEST(ChainedKey, ParsesWhatItFormats) {
  for (int64_t part : {0, 1, 12}) {
    const std::string rest = "optimizer.distributed.dp_group_idx_1.optimizer";
    const std::string key = model::format_chained_prefix(part) + rest;  // `rest` views into it
    const model::ChainedKey k = model::parse_chained_key(key);
    ASSERT_TRUE(k.part.has_value());
    EXPECT_EQ(*k.part, part);
    EXPECT_EQ(k.rest, rest);
  }
  for (const char* plain :
       {"optimizer.distributed.x", "chained_.x", "chained_1x", "chained_-1.x"}) {
    const model::ChainedKey k = model::parse_chained_key(plain);
    EXPECT_FALSE(k.part.has_value()) << plain;
    EXPECT_EQ(k.rest, plain);
  }
}

// The MoE checkpoint: the expert params (and only they) with the scenario's EP, DP at save
// proven by the dense part's files, and both parts' buckets reproduced (bucket_size None).
TEST(InferScenario, ReadsAChainedCheckpointsExpertParamsAndEp) {
  const json scenario = read_json(kScenarios + kMoe + ".json");
  const auto c = read_saved(save_first_phase("infer-moe", scenario));
  EXPECT_EQ(model::chained_parts(c), 2);
  EXPECT_EQ(c.dp_size_at_save, scenario["phases"][0]["dp"].get<int64_t>());
  auto s = sim::infer_scenario(c, upstream_head());
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const sim::Scenario& got = s.value().scenario;
  ASSERT_EQ(got.phases.size(), 1u);
  EXPECT_EQ(got.phases[0].ep, scenario["phases"][0]["ep"].get<int64_t>());
  EXPECT_EQ(got.phases[0].dp, scenario["phases"][0]["dp"].get<int64_t>());
  EXPECT_FALSE(got.bucket_size.has_value());
  ASSERT_EQ(got.params.size(), scenario["params"].size());
  for (const auto& want : scenario["params"]) {
    const auto p = std::find_if(got.params.begin(), got.params.end(),
                                [&](const auto& q) { return q.name == want["name"]; });
    ASSERT_NE(p, got.params.end()) << want;
    EXPECT_EQ(p->numel, want["numel"].get<int64_t>()) << want;
    EXPECT_EQ(p->expert, want.value("expert", false)) << want;
  }
}

// inspect of the MoE checkpoint: both parts' buckets tile, both parts' steps agree, and the
// resume at the scenario's next DP resumes it correctly (as `ckptsim run` of the scenario says:
// its expect), every loaded element equal to the checkpoint's.
TEST(Inspect, ResumesAChainedMoeCheckpointAsTheScenarioDoes) {
  const json scenario = read_json(kScenarios + kMoe + ".json");
  const fs::path dir = save_first_phase("inspect-moe", scenario);
  app::InspectCommand c;
  c.dir = dir.string();
  c.revisions = {scenario["phases"][1]["revision"].get<std::string>()};
  c.dp = scenario["phases"][1]["dp"].get<int64_t>();
  const test::Inspected r = test::inspect_json(c);
  ASSERT_EQ(r.code, app::kExitOk) << r.err << r.out.dump(1);
  EXPECT_EQ(r.out["ep"], scenario["phases"][0]["ep"]);
  const json* tiles = check_named(r.out, "shards_tile_buckets");
  ASSERT_NE(tiles, nullptr);
  EXPECT_EQ((*tiles)["outcome"], "holds");
  EXPECT_NE((*tiles)["detail"].get<std::string>().find("chained_1."), std::string::npos)
      << (*tiles)["detail"];
  const json* steps = check_named(r.out, "step_counters_agree");
  ASSERT_NE(steps, nullptr);
  EXPECT_EQ((*steps)["outcome"], "holds") << (*steps)["detail"];
  ASSERT_EQ(r.out["resumes"].size(), 1u);
  const json& j = r.out["resumes"][0];
  EXPECT_EQ(j["class"], "resumes correctly") << j.dump(1);
  EXPECT_GT(j["elements_compared"].get<int64_t>(), 0);
  EXPECT_EQ(j["elements_equal"], j["elements_compared"]);
  fs::remove_all(dir.parent_path());
}

// A chain whose expert part saved its step one behind the dense part's (the bundled scenario's
// fault save.expert_step_behind): step_counters_agree fails, naming both parts' steps, as the
// next load's _synchronize_steps refuses it (that scenario's expectation).
TEST(Inspect, FindsAChainsPartsSavedAtDifferentSteps) {
  const json scenario = read_json(kScenarios + kStepsDiffer + ".json");
  const fs::path dir = save_first_phase("steps-differ", scenario);
  app::InspectCommand c;
  c.dir = dir.string();
  c.revisions = {"upstream-head"};
  const test::Inspected r = test::inspect_json(c);
  const json* steps = check_named(r.out, "step_counters_agree");
  ASSERT_NE(steps, nullptr) << r.err;
  EXPECT_EQ((*steps)["outcome"], "FAILS") << (*steps)["detail"];
  const int64_t saved = scenario["phases"][0]["steps"].get<int64_t>();
  EXPECT_NE((*steps)["detail"].get<std::string>().find(
                fmt::format("part 0 says step {}, part 1 says step {}", saved, saved - 1)),
            std::string::npos)
      << (*steps)["detail"];
  fs::remove_all(dir.parent_path());
}

// A precision-aware FusedAdam with bf16 moments and remainders: what the files say of it is
// inferred (precision_aware, both moments bf16, store_param_remainders); with an fp32 moment,
// that moment is upstream's default fp32 and the guesses say the files cannot tell.
TEST(InferScenario, ReadsAPrecisionAwareOptimizerFromItsSavedStates) {
  json scenario = read_json(kScenarios + kBf16Moments + ".json");
  // Groups the default rule gives (no weight decay for a name ending in 'bias').
  scenario["params"][1]["name"] = "b0.bias";
  for (const char* sq : {"bf16", "fp32"}) {
    scenario["optimizer"]["exp_avg_sq_dtype"] = sq;
    const fs::path dir = save_first_phase(std::string("pa-") + sq, scenario);
    const auto c = read_saved(dir);
    auto s = sim::infer_scenario(c, upstream_head());
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    const model::OptimizerConfig& o = s.value().scenario.optimizer;
    EXPECT_TRUE(o.precision_aware) << sq;
    EXPECT_EQ(model::state_dtype_name(o.exp_avg_dtype), scenario["optimizer"]["exp_avg_dtype"]);
    EXPECT_EQ(model::state_dtype_name(o.exp_avg_sq_dtype), sq);
    EXPECT_EQ(o.store_param_remainders,
              scenario["optimizer"].value("store_param_remainders", true));
    const auto& g = s.value().guesses;
    EXPECT_EQ(std::any_of(g.begin(), g.end(),
                          [](const auto& x) { return x.starts_with("exp_avg_sq_dtype: fp32"); }),
              std::string(sq) == "fp32")
        << sq;
    fs::remove_all(dir.parent_path());
  }
}

// The precision-aware checkpoint resumed with the scenario that saved it (its param groups are
// not the default rule's): the remainders joined to the saved bf16 params are the masters the
// load restored, and the resume is correct, as `ckptsim run` of the scenario says.
TEST(Inspect, ResumesAPrecisionAwareCheckpointWithItsRemainders) {
  const json scenario = read_json(kScenarios + kBf16Moments + ".json");
  const fs::path dir = save_first_phase("inspect-pa", scenario);
  app::InspectCommand c;
  c.dir = dir.string();
  c.scenario = kScenarios + kBf16Moments + ".json";
  c.revisions = {scenario["phases"][1]["revision"].get<std::string>()};
  c.dp = scenario["phases"][1]["dp"].get<int64_t>();
  const test::Inspected r = test::inspect_json(c);
  ASSERT_EQ(r.code, app::kExitOk) << r.err << r.out.dump(1);
  const json& j = r.out["resumes"][0];
  EXPECT_EQ(j["class"], "resumes correctly") << j.dump(1);
  EXPECT_GT(j["elements_compared"].get<int64_t>(), 0);
  EXPECT_EQ(j["elements_equal"], j["elements_compared"]);
  fs::remove_all(dir.parent_path());
}

}  // namespace
