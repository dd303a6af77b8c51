// The torch/TE optimizer models: the behaviors the bugs depend on, each pinned by hand.
// Mutations caught: AdamW incrementing each step right before its own update instead of all
// first (SharedStepTensorAdvancesOncePerParam: 7 -> 8, 9, 10 per param instead of 10 for
// all); FusedAdam incrementing empty groups (EmptyGroupKeepsNoStep); base load_state_dict
// reusing the per-param dicts (LoadMakesNewStateDictsButKeepsTensors); TE load keeping the
// tensors (TeLoadRecreatesStateTensors).
#include <gtest/gtest.h>

#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>

#include "model/torch/adamw.h"
#include "model/transformer_engine/fused_adam.h"

using namespace ckptsim::model;

namespace {

DictPtr group_of(std::vector<at::Tensor> params, double lr = 0.01) {
  return Dict::make({{"params", params_list(params)},
                     {"lr", Value(lr)},
                     {"weight_decay", Value(0.0)},
                     {"betas", Value::tuple({Value(0.9), Value(0.95)})},
                     {"eps", Value(1e-8)}});
}

}  // namespace

TEST(TorchAdamW, StepsArePerParamFloat32Tensors) {
  Runtime rt(1, 0, 0);
  at::Tensor p = rt.zeros({4}, at::kFloat, Device::kCpu);
  TorchAdamW opt(rt, {group_of({p})});
  rt.set_grad(p, at::ones({4}));
  opt.step();
  const Value& step = opt.state.find(p)->get()->at("step");
  ASSERT_TRUE(step.is_tensor());
  EXPECT_EQ(step.tensor().dim(), 0);
  EXPECT_EQ(step.tensor().scalar_type(), at::kFloat);
  EXPECT_EQ(step.tensor().item<float>(), 1.0F);
  EXPECT_EQ(opt.state.find(p)->get()->keys(), (std::vector<Key>{"step", "exp_avg", "exp_avg_sq"}));
}

TEST(TorchAdamW, SharedStepTensorAdvancesOncePerParam) {
  // Spec §17 extra check: one step tensor shared by 3 params reads 10 after one step from 7,
  // and every param's update uses t=10 (foreach/fused increments all steps first).
  Runtime rt(1, 0, 0);
  std::vector<at::Tensor> ps = {rt.zeros({2}, at::kFloat, Device::kCpu),
                                rt.zeros({2}, at::kFloat, Device::kCpu),
                                rt.zeros({2}, at::kFloat, Device::kCpu)};
  TorchAdamW opt(rt, {group_of(ps)});
  at::Tensor shared = at::full({}, 7.0F);
  for (const auto& p : ps) {
    opt.state.set(p, Dict::make({{"step", Value(shared)},
                                 {"exp_avg", Value(at::zeros({2}))},
                                 {"exp_avg_sq", Value(at::zeros({2}))}}));
    rt.set_grad(p, at::ones({2}));
  }
  opt.step();
  EXPECT_EQ(shared.item<float>(), 10.0F);
  for (const auto& used : opt.last_used_steps()) EXPECT_EQ(used.step, 10.0);
}

TEST(FusedAdam, GroupStepIntIncrementedBeforeUpdateEvenWithoutGrads) {
  Runtime rt(1, 0, 0);
  at::Tensor a = rt.zeros({4}, at::kFloat, Device::kCuda);
  at::Tensor b = rt.zeros({4}, at::kFloat, Device::kCuda);
  FusedAdam opt(rt, {group_of({a}), group_of({b})});
  rt.set_grad(a, at::ones({4}));  // b has no grad
  opt.step();
  opt.step();
  EXPECT_EQ(opt.param_groups->at(0).dict()->at("step").as_int(), 2);
  EXPECT_EQ(opt.param_groups->at(1).dict()->at("step").as_int(), 2);
  // State is created for b too (TE initializes before checking the grad), but b never moves.
  EXPECT_TRUE(opt.state.contains(b));
  EXPECT_EQ(b.abs().sum().item<float>(), 0.0F);
  EXPECT_NE(a.abs().sum().item<float>(), 0.0F);
}

TEST(FusedAdam, EmptyGroupKeepsNoStep) {
  Runtime rt(1, 0, 0);
  at::Tensor a = rt.zeros({4}, at::kFloat, Device::kCuda);
  FusedAdam opt(rt, {group_of({a}), group_of({})});
  rt.set_grad(a, at::ones({4}));
  opt.step();
  EXPECT_FALSE(opt.param_groups->at(1).dict()->contains("step"));
}

TEST(OptimizerBase, LoadMakesNewStateDictsButKeepsTensors) {
  Runtime rt(1, 0, 0);
  at::Tensor p = rt.zeros({3}, at::kFloat, Device::kCpu);
  TorchAdamW opt(rt, {group_of({p})});
  rt.set_grad(p, at::ones({3}));
  opt.step();
  const DictPtr before = *opt.state.find(p);
  const at::Tensor exp_avg = before->at("exp_avg").tensor();
  Value sd = opt.state_dict();
  sd.dict()->at("param_groups").list()->at(0).dict()->set("lr", Value(0.5));
  opt.load_state_dict(sd);
  const DictPtr after = *opt.state.find(p);
  EXPECT_NE(after.get(), before.get());
  EXPECT_TRUE(after->at("exp_avg").tensor().is_same(exp_avg));
  // Saved group scalars win over the current group's.
  EXPECT_EQ(opt.param_groups->at(0).dict()->at("lr").as_float(), 0.5);
}

TEST(OptimizerBase, FusedStepIsCastToTheParamDevice) {
  // torch: for a fused (or capturable) group, a loaded 'step' becomes float32 on the param's
  // device.
  Runtime rt(1, 0, 0);
  at::Tensor p = rt.zeros({3}, at::kFloat, Device::kCuda);
  DictPtr g = group_of({p});
  g->set("fused", Value(true));
  TorchAdamW opt(rt, {g});
  rt.set_grad(p, at::ones({3}));
  opt.step();
  Value sd = opt.state_dict();
  const at::Tensor cpu_step = rt.scalar_tensor(5.0, at::kFloat, Device::kCpu);
  sd.dict()->at("state").dict()->at(0).dict()->set("step", Value(cpu_step));
  opt.load_state_dict(sd);
  const at::Tensor loaded = opt.state.find(p)->get()->at("step").tensor();
  EXPECT_FALSE(loaded.is_same(cpu_step));
  EXPECT_EQ(rt.device_of(loaded), Device::kCuda);
  EXPECT_EQ(loaded.item<float>(), 5.0F);
}

TEST(FusedAdam, TeLoadRecreatesStateTensors) {
  Runtime rt(1, 0, 0);
  at::Tensor p = rt.zeros({3}, at::kFloat, Device::kCuda);
  FusedAdam opt(rt, {group_of({p})});
  rt.set_grad(p, at::ones({3}));
  opt.step();
  const at::Tensor exp_avg = opt.state.find(p)->get()->at("exp_avg").tensor();
  opt.load_state_dict(opt.state_dict());
  const at::Tensor reloaded = opt.state.find(p)->get()->at("exp_avg").tensor();
  EXPECT_FALSE(reloaded.is_same(exp_avg));
  EXPECT_TRUE(reloaded.equal(exp_avg));
  EXPECT_EQ(opt.param_groups->at(0).dict()->at("step").as_int(), 1);
}
