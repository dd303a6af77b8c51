// Divergence N2 of the fidelity audit (2026-12-02): every revision's _get_param_groups sorts the
// param groups by `(x[0] is not None, x[0])`, x[0] the override tuple
// param_group_override_to_tuple(override) (the override's items sorted by name) or None for
// params no override matches (POST/RX optimizer/__init__.py:189, HEAD :374). The model kept the
// groups in order of first appearance, which changes what the HybridDeviceOptimizer's greedy
// offload (it walks the groups in order) puts on its CPU part. The broken variants: groups in
// order of first appearance (the model before this test), and groups sorted by their
// multipliers as numbers instead of Python's tuple order; each fails here.
#include <gtest/gtest.h>

#include "model/megatron/distrib_optimizer.h"
#include "sim/local_world.h"
#include "tests/testing.h"

using namespace ckptsim;

namespace {

// The (wd_mult, lr_mult) of each param group of a DistributedOptimizer over `specs` (DP 1).
std::vector<std::pair<double, double>> group_order(const std::vector<model::ParamSpec>& specs,
                                                   model::OptimizerKind kind) {
  std::vector<std::pair<double, double>> out;
  sim::LocalWorld world(1);
  auto outcomes = world.run([&](model::ProcessGroup& pg) {
    model::Runtime rt(1, 0, 0);
    model::DistributedDataParallel ddp(rt, specs, model::LayoutOptions{}, pg);
    model::OptimizerConfig config;
    config.kind = kind;
    config.offload_fraction = 0.5;
    model::RevisionSwitches switches;
    switches.fp32_shards_detached = true;
    model::DistributedOptimizer opt(rt, ddp, config, switches);
    for (const model::Value& g : opt.param_groups()) {
      out.emplace_back(g.dict()->at("wd_mult").as_float(), g.dict()->at("lr_mult").as_float());
    }
  });
  sim::rethrow_root_cause(outcomes);
  return out;
}

}  // namespace

// Overrides, as the replay runner passes them: {wd_mult: w} and {lr_mult: m, max_lr, min_lr}.
// Python orders their tuples by the first item's name ('lr_mult' < 'wd_mult'), then value, and
// a tuple before the longer one it starts (lr_mult 0.5 before lr_mult 0.5 with wd_mult 0).
TEST(N2GroupOrder, GroupsSortNoneFirstThenByTheOverrideTupleAsPythonDoes) {
  const std::vector<model::ParamSpec> specs = {
      {"a", 64, model::DType::kBFloat16, 0.0, 1.0},  // (('wd_mult', 0.0),)
      {"b", 64, model::DType::kBFloat16, 1.0, 2.0},  // (('lr_mult', 2.0), max_lr, min_lr)
      {"c", 64, model::DType::kBFloat16, 0.0, 0.5},  // (('lr_mult', 0.5), ..., ('wd_mult', 0.0))
      {"d", 64, model::DType::kBFloat16, 1.0, 1.0},  // None
      {"e", 64, model::DType::kBFloat16, 1.0, 0.5},  // (('lr_mult', 0.5), max_lr, min_lr)
      {"f", 64, model::DType::kBFloat16, 0.5, 1.0},  // (('wd_mult', 0.5),)
      {"g", 64, model::DType::kBFloat16, 0.0, 1.0},  // a's group
  };
  const std::vector<std::pair<double, double>> expected = {{1.0, 1.0}, {1.0, 0.5}, {0.0, 0.5},
                                                           {1.0, 2.0}, {0.0, 1.0}, {0.5, 1.0}};
  for (const auto kind : {model::OptimizerKind::kFusedAdam, model::OptimizerKind::kHybrid}) {
    EXPECT_EQ(group_order(specs, kind), expected) << model::optimizer_kind_name(kind);
  }
}

// The bundled scenario: p0 (wd_mult 0, 300 elements) first in param order, p1 (64) second,
// offload 0.5. Sorted, the offload walks p1 then p0 and puts both on the CPU AdamW; in order of
// first appearance it would keep p1 on the GPU FusedAdam, and miles-main's raw step lists would
// no longer line up at the load (B3).
TEST(N2GroupOrder, TheHdoOffloadWalksTheSortedGroups) {
  const auto run = test::run(test::scenario_file("scenarios/n2-group-order-hdo-split.json"));
  ASSERT_TRUE(run.phases.at(0).initial.has_value());
  for (const sim::GlobalState* st : {&run.reference_initial, &*run.phases.at(0).initial}) {
    ASSERT_EQ(st->shards.size(), 2u);
    for (const auto& s : st->shards) {
      EXPECT_EQ(s.part, sim::OptimizerPart::kHdoCpuAdamW)
          << run.scenario.params[s.param].name << " is not on the CPU part";
    }
  }
  for (const auto& r : properties::check_all(run))
    EXPECT_TRUE(r.ok()) << r.name << ": " << r.detail;
}
