// DistributedOptimizer's _get/_set (spec §6): HDO returns and assigns live objects; the
// non-precision-aware path copies into the live tensors. Upstream's key order for a CPU HDO
// entry is (step, exp_avg, exp_avg_sq, param). Mutations caught: _set copying in the HDO path
// (HdoSetAssigns: identity would not change), _set assigning in the FusedAdam path
// (FusedAdamSetCopies: identity would change), _get copying (HdoGetReturnsLiveObjects).
#include <gtest/gtest.h>

#include <ATen/ops/full.h>

#include "model/errors.h"
#include "model/megatron/distrib_optimizer.h"
#include "sim/local_world.h"

using namespace ckptsim;
using namespace ckptsim::model;

namespace {

struct OneRank {
  std::vector<ParamSpec> specs = {{"w0", 200, DType::kBFloat16, 1.0, 1.0},
                                  {"w1", 100, DType::kBFloat16, 1.0, 1.0}};
  RevisionSwitches switches;
  OptimizerConfig config;
  std::function<void(Runtime&, DistributedDataParallel&, DistributedOptimizer&)> body;

  void run() {
    sim::LocalWorld world(1);
    auto outcomes = world.run([&](ProcessGroup& pg) {
      Runtime rt(1, 0, 0);
      LayoutOptions layout;
      DistributedDataParallel ddp(rt, specs, layout, pg);
      DistributedOptimizer opt(rt, ddp, config, switches);
      for (size_t i = 0; i < specs.size(); ++i) ddp.main_grad(i).fill_(0.5);
      opt.step();
      body(rt, ddp, opt);
    });
    sim::rethrow_root_cause(outcomes);
  }
};

}  // namespace

TEST(DistributedOptimizer, HdoGetReturnsLiveObjectsInUpstreamOrder) {
  OneRank t;
  t.config.kind = OptimizerKind::kHybrid;
  t.config.offload_fraction = 1.0;
  t.body = [](Runtime&, DistributedDataParallel&, DistributedOptimizer& opt) {
    DictPtr tensors = opt.get_main_param_and_optimizer_states(0);
    EXPECT_EQ(tensors->keys(), (std::vector<Key>{"step", "exp_avg", "exp_avg_sq", "param"}));
    bool found = false;
    for (const auto& [p, s] : opt.optimizer().state) {
      if (s->at("exp_avg").is(tensors->at("exp_avg"))) {
        found = true;
        EXPECT_TRUE(s->at("step").is(tensors->at("step")));
        EXPECT_TRUE(s->at("master_param").is(tensors->at("param")));
      }
    }
    EXPECT_TRUE(found) << "_get must hand out the live state objects";
  };
  t.run();
}

TEST(DistributedOptimizer, HdoSetAssignsObjectsIncludingStep) {
  OneRank t;
  t.config.kind = OptimizerKind::kHybrid;
  t.config.offload_fraction = 1.0;
  t.body = [](Runtime& rt, DistributedDataParallel&, DistributedOptimizer& opt) {
    DictPtr tensors = opt.get_main_param_and_optimizer_states(0);
    const at::Tensor new_step = rt.scalar_tensor(42.0, at::kFloat, Device::kCpu);
    const at::Tensor new_avg = at::full({tensors->at("exp_avg").tensor().numel()}, 3.0F);
    Dict incoming;
    incoming.set("step", Value(new_step));
    incoming.set("exp_avg", Value(new_avg));
    incoming.set("padding", Value(false));
    opt.set_main_param_and_optimizer_states(0, incoming, /*no_grad=*/false);
    DictPtr after = opt.get_main_param_and_optimizer_states(0);
    EXPECT_TRUE(after->at("step").tensor().is_same(new_step)) << "assignment, not copy";
    EXPECT_TRUE(after->at("exp_avg").tensor().is_same(new_avg));
    EXPECT_TRUE(after->contains("padding")) << "POST assigns non-tensors too (B13)";
  };
  t.run();
}

TEST(DistributedOptimizer, HeadSkipsNonTensorsInSet) {
  OneRank t;
  t.config.kind = OptimizerKind::kHybrid;
  t.config.offload_fraction = 1.0;
  t.switches.set_skips_non_tensors = true;
  t.body = [](Runtime&, DistributedDataParallel&, DistributedOptimizer& opt) {
    Dict incoming;
    incoming.set("padding", Value(false));
    opt.set_main_param_and_optimizer_states(0, incoming, /*no_grad=*/false);
    EXPECT_FALSE(opt.get_main_param_and_optimizer_states(0)->contains("padding"));
  };
  t.run();
}

TEST(DistributedOptimizer, FusedAdamSetCopiesIntoLiveTensors) {
  OneRank t;
  t.config.kind = OptimizerKind::kFusedAdam;
  t.body = [](Runtime&, DistributedDataParallel&, DistributedOptimizer& opt) {
    DictPtr before = opt.get_main_param_and_optimizer_states(0);
    EXPECT_EQ(before->keys(), (std::vector<Key>{"param", "exp_avg", "exp_avg_sq"}));
    const at::Tensor live_avg = before->at("exp_avg").tensor();
    Dict incoming;
    for (const auto& [k, v] : *before) incoming.set(k, Value(at::full({v.tensor().numel()}, 2.0F)));
    opt.set_main_param_and_optimizer_states(0, incoming, /*no_grad=*/false);
    DictPtr after = opt.get_main_param_and_optimizer_states(0);
    EXPECT_TRUE(after->at("exp_avg").tensor().is_same(live_avg)) << "copy_, not assignment";
    EXPECT_EQ(live_avg[0].item<float>(), 2.0F);
    Dict missing;
    missing.set("param", incoming.at("param"));
    EXPECT_THROW(opt.set_main_param_and_optimizer_states(0, missing, /*no_grad=*/false),
                 PyKeyError);
  };
  t.run();
}

TEST(DistributedOptimizer, StateDictAlignsFusedAdamStepAcrossGroups) {
  OneRank t;
  t.specs[1].wd_mult = 0.0;  // two param groups
  t.config.kind = OptimizerKind::kFusedAdam;
  t.body = [](Runtime&, DistributedDataParallel&, DistributedOptimizer& opt) {
    const Value sd = opt.state_dict();
    const auto& groups = *sd.dict()->at("optimizer").dict()->at("param_groups").list();
    ASSERT_EQ(groups.size(), 2u);
    for (const auto& g : groups) {
      EXPECT_EQ(g.dict()->at("step").as_int(), 1);
      EXPECT_FALSE(g.dict()->contains("params"));
    }
  };
  t.run();
}

// --optimizer-cpu-offload without TE: the precision-aware OptimizerConfig compares TE's version,
// None before HEAD (TypeError on every rank, at init) and 0.0.0 at HEAD. Only the hybrid is
// precision-aware here, and with TE installed nothing is compared with None.
TEST(OptimizerConfig, PrecisionAwareWithoutTeRaisesTypeErrorBeforeHead) {
  OptimizerConfig hybrid;
  hybrid.kind = OptimizerKind::kHybrid;
  hybrid.te_installed = false;
  RevisionSwitches post;
  try {
    check_optimizer_config(hybrid, post);
    ADD_FAILURE() << "no TypeError";
  } catch (const UpstreamError& e) {
    EXPECT_EQ(e.py_type(), "TypeError");
    EXPECT_EQ(e.site(), "utils.py is_te_min_version()");
    EXPECT_EQ(e.message(), "'>=' not supported between instances of 'NoneType' and 'Version'");
  }
  RevisionSwitches head;
  head.te_absent_version_is_zero = true;
  EXPECT_NO_THROW(check_optimizer_config(hybrid, head));
  hybrid.te_installed = true;
  EXPECT_NO_THROW(check_optimizer_config(hybrid, post));
  OptimizerConfig torch_adamw;
  torch_adamw.kind = OptimizerKind::kTorchAdamW;
  EXPECT_NO_THROW(check_optimizer_config(torch_adamw, post));
}
