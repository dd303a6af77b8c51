// infer_scenario on real checkpoints (tests/fixtures/real-checkpoints): what it reads from a
// fully_reshardable checkpoint, and where it refuses and asks for the scenario. Expected values
// come from the scenario whose real run wrote the fixture (runs/).
#include "sim/checkpoint_scenario.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/megatron/torch_dist_checkpoint.h"
#include "model/revision.h"
#include "model/storage.h"

namespace {

using namespace ckptsim;
using json = nlohmann::json;

const std::string kFixtures = std::string(CKPTSIM_SOURCE_DIR) + "/tests/fixtures/real-checkpoints";
const std::string kFullyReshardableTp2 = "nv-d98e8a64dd__hybrid-offload1-fr-tp2-dp1";

model::TorchDistCheckpoint read_fixture(const std::string& dir) {
  model::DirectoryStorage storage(kFixtures);
  auto c = model::read_torch_dist_checkpoint(storage, dir);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return c.is_ok() ? c.value() : model::TorchDistCheckpoint{};
}

sim::Revision upstream_head() {
  static auto registry = model::RevisionRegistry::load_embedded();
  auto r = sim::resolve_revision(registry.value(), "upstream-head");
  EXPECT_TRUE(r.is_ok());
  return r.value();
}

TEST(InferScenario, ReadsAFullyReshardableCheckpointsSplitsFromItsChunks) {
  std::ifstream in(kFixtures + "/runs/fx-upstream-head-fr-tp2-hybrid.scenario.json");
  const json scenario = json::parse(in);
  const auto c = read_fixture(kFullyReshardableTp2);
  auto s = sim::infer_scenario(c, upstream_head(), {2, 1, std::nullopt});
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const sim::Scenario& got = s.value().scenario;
  EXPECT_EQ(got.format.sharding_type, model::ShardingType::kFullyReshardable);
  ASSERT_EQ(got.phases.size(), 1u);
  EXPECT_EQ(got.phases[0].tp, 2);
  EXPECT_EQ(got.phases[0].dp, scenario["phases"][0]["dp"].get<int64_t>());
  ASSERT_EQ(got.params.size(), scenario["params"].size());
  for (const auto& want : scenario["params"]) {
    const auto p = std::find_if(got.params.begin(), got.params.end(), [&](const auto& q) {
      return q.name == want["name"].get<std::string>();
    });
    ASSERT_NE(p, got.params.end()) << want;
    EXPECT_EQ(model::tp_split_name(p->tp_split), want.value("tp_split", "replicated")) << want;
    EXPECT_EQ(p->wd_mult, want.value("wd_mult", 1.0)) << want;
  }
}

TEST(InferScenario, AsksForTheScenarioWhereTheCheckpointDoesNotSay) {
  const auto fr = read_fixture(kFullyReshardableTp2);
  // Which layer holds a param is in no checkpoint.
  auto pp = sim::infer_scenario(fr, upstream_head(), {2, 2, std::nullopt});
  ASSERT_FALSE(pp.is_ok());
  EXPECT_NE(pp.status().message().find("saved at PP 2"), std::string::npos)
      << pp.status().message();
  EXPECT_NE(pp.status().message().find("--scenario"), std::string::npos);
  // Chunks that are no TP 4 split (the files hold two pieces per split param).
  auto tp4 = sim::infer_scenario(fr, upstream_head(), {4, 1, std::nullopt});
  ASSERT_FALSE(tp4.is_ok());
  EXPECT_NE(tp4.status().message().find("no TP 4 split"), std::string::npos)
      << tp4.status().message();
  // dp_reshardable buckets are inferred at TP = PP = 1 only.
  const auto dp = read_fixture("nv-d98e8a64dd__fused-adam-dp2-common-state-object");
  auto tp2 = sim::infer_scenario(dp, upstream_head(), {2, 1, std::nullopt});
  ASSERT_FALSE(tp2.is_ok());
  EXPECT_NE(tp2.status().message().find("dp_reshardable checkpoint saved at TP 2 x PP 1"),
            std::string::npos)
      << tp2.status().message();
  EXPECT_TRUE(sim::infer_scenario(dp, upstream_head()).is_ok());
}

}  // namespace
