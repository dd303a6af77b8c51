// HybridDeviceOptimizer: the aliasing of spec I15 and the behaviors behind B5, B10, B14.
// Mutations caught: _sync_sub_optimizers_state_to_hdo copying the dicts instead of sharing them
// (StateIsAliasedWithSubOptimizers); group sync skipping 'step' by default
// (GroupSyncFreezesGpuStep: B5 would pass unnoticed); update_fp32 never raising
// (PostRaisesKeyErrorForNativeFp32Params); dummy_step not touching the params
// (DummyStepPerturbsModelParams).
#include <gtest/gtest.h>

#include <ATen/ops/ones.h>

#include "model/errors.h"
#include "model/megatron/hybrid_optimizer.h"

using namespace ckptsim::model;

namespace {

// gpu_optimizer_cls is TE's FusedAdam, or torch AdamW where TE is absent.
DictPtr hdo_defaults(double offload, bool te_installed = true) {
  return Dict::make({{"offload_fraction", Value(offload)},
                     {"cpu_optimizer_cls", Value::symbol(kTorchAdamWClassRepr)},
                     {"gpu_optimizer_cls",
                      Value::symbol(te_installed ? kFusedAdamClassRepr : kTorchAdamWClassRepr)},
                     {"param_update_in_fp32", Value(true)},
                     {"pin_cpu_grads", Value(true)},
                     {"pin_cpu_params", Value(true)},
                     {"overlap_cpu_optimizer_d2h_h2d", Value(false)},
                     {"lr", Value(0.01)},
                     {"weight_decay", Value(0.0)},
                     {"betas", Value::tuple({Value(0.9), Value(0.95)})},
                     {"eps", Value(1e-8)},
                     {"bias_correction", Value(true)},
                     {"fused", Value(true)}});
}

struct Fixture {
  Runtime rt{1, 0, 0};
  std::vector<at::Tensor> params;
  std::unique_ptr<HybridDeviceOptimizer> hdo;
  Fixture(double offload, at::ScalarType dtype, RevisionSwitches s = {}, bool te_installed = true)
      : switches(s) {
    // 8 + 16 + 8 'cuda' params; offload 0.5 -> threshold 16: the first two go to the CPU.
    for (int64_t n : {8, 16, 8}) params.push_back(rt.zeros({n}, dtype, Device::kCuda));
    hdo = std::make_unique<HybridDeviceOptimizer>(
        rt, std::vector<DictPtr>{Dict::make({{"params", params_list(params)}})},
        hdo_defaults(offload, te_installed), switches);
  }
  void grads() {
    for (const auto& p : params)
      rt.set_grad(p, at::ones(p.sizes(), at::TensorOptions().dtype(at::kFloat)));
  }
  // What a precision-aware DistributedOptimizer hands over: .decoupled_grad, never .grad.
  void decoupled_grads() {
    for (const auto& p : params)
      rt.set_decoupled_grad(p, at::ones(p.sizes(), at::TensorOptions().dtype(at::kFloat)));
  }
  RevisionSwitches switches;
};

}  // namespace

TEST(HybridDeviceOptimizer, OffloadSplitIsGreedyByNumel) {
  Fixture f(0.5, at::kBFloat16);
  ASSERT_EQ(f.hdo->cpu_optimizers.size(), 1u);
  ASSERT_NE(f.hdo->gpu_optimizer, nullptr);
  EXPECT_TRUE(f.hdo->gpu_params_map_cpu_copy.contains(f.params[0]));
  EXPECT_TRUE(f.hdo->gpu_params_map_cpu_copy.contains(f.params[1]));
  EXPECT_FALSE(f.hdo->gpu_params_map_cpu_copy.contains(f.params[2]));
  // Every bf16 param has an fp32 inner clone.
  for (const auto& p : f.params)
    EXPECT_EQ(f.hdo->param_to_inner_param.find(p)->scalar_type(), at::kFloat);
}

TEST(HybridDeviceOptimizer, StateIsAliasedWithSubOptimizers) {
  Fixture f(0.5, at::kBFloat16);
  f.grads();
  f.hdo->step();
  for (const auto& p : f.params) {
    const at::Tensor inner = *f.hdo->param_to_inner_param.find(p);
    const DictPtr hdo_state = *f.hdo->state.find(p);
    const DictPtr* sub_state = nullptr;
    for (Optimizer* sub : f.hdo->sub_optimizers()) {
      if (const DictPtr* s = sub->state.find(inner)) sub_state = s;
    }
    ASSERT_NE(sub_state, nullptr);
    EXPECT_EQ(hdo_state.get(), sub_state->get()) << "HDO.state[orig] must be sub.state[inner]";
    EXPECT_TRUE(hdo_state->at("master_param").tensor().is_same(inner));
  }
  // CPU params carry a per-param step; the GPU part keeps its step in the group.
  EXPECT_TRUE(f.hdo->state.find(f.params[0])->get()->contains("step"));
  EXPECT_FALSE(f.hdo->state.find(f.params[2])->get()->contains("step"));
  EXPECT_EQ(f.hdo->gpu_optimizer->param_groups->at(0).dict()->at("step").as_int(), 1);
  // The bf16 originals received the rounded fp32 update.
  for (const auto& p : f.params) {
    EXPECT_TRUE(p.to(at::kFloat)
                    .equal(f.hdo->param_to_inner_param.find(p)->to(at::kBFloat16).to(at::kFloat)));
  }
}

TEST(HybridDeviceOptimizer, LoadRebuildsSubOptimizersAndReAliases) {
  Fixture f(0.5, at::kBFloat16);
  f.grads();
  f.hdo->step();
  std::vector<at::Tensor> old_inner;  // held, so no new clone can reuse an old address
  for (const auto& p : f.params) old_inner.push_back(*f.hdo->param_to_inner_param.find(p));
  f.hdo->load_state_dict(f.hdo->state_dict());
  for (size_t i = 0; i < f.params.size(); ++i) {
    EXPECT_FALSE(f.hdo->param_to_inner_param.find(f.params[i])->is_same(old_inner[i]))
        << "brand-new inner clones";
    EXPECT_TRUE(f.hdo->param_to_inner_param.find(f.params[i])->equal(old_inner[i]));
  }
  EXPECT_FALSE(f.hdo->gpu_optimizer->param_groups->at(0).dict()->contains("step"))
      << "a new FusedAdam has no step";
  for (const auto& p : f.params) {
    const at::Tensor inner = *f.hdo->param_to_inner_param.find(p);
    bool aliased = false;
    for (Optimizer* sub : f.hdo->sub_optimizers()) {
      if (const DictPtr* s = sub->state.find(inner))
        aliased = s->get() == f.hdo->state.find(p)->get();
    }
    EXPECT_TRUE(aliased);
  }
}

TEST(HybridDeviceOptimizer, GroupSyncFreezesGpuStep) {
  // B5: a 'step' in the HDO group (put there by a resume) is pushed into FusedAdam before
  // every step, so the GPU part uses t = N+1 forever.
  Fixture f(0.0, at::kBFloat16);
  f.hdo->param_groups->at(0).dict()->set("step", Value(int64_t{5}));
  for (int i = 0; i < 3; ++i) {
    f.grads();
    f.hdo->step();
    EXPECT_EQ(f.hdo->gpu_fused_adam()->last_used_steps().at(0).step, 6);
  }
  RevisionSwitches fixed;
  fixed.hdo_group_sync_skips_step = true;
  Fixture g(0.0, at::kBFloat16, fixed);
  g.hdo->gpu_optimizer->param_groups->at(0).dict()->set("step", Value(int64_t{5}));
  g.hdo->param_groups->at(0).dict()->set("step", Value(int64_t{5}));
  std::vector<double> used;
  for (int i = 0; i < 3; ++i) {
    g.grads();
    g.hdo->step();
    used.push_back(g.hdo->gpu_fused_adam()->last_used_steps().at(0).step);
  }
  EXPECT_EQ(used, (std::vector<double>{6, 7, 8}));
}

TEST(HybridDeviceOptimizer, PostRaisesKeyErrorForNativeFp32Params) {
  // B10: fp32 params have no fp32 clone; POST's _update_fp32_params_by_new_state raises.
  Fixture f(0.5, at::kFloat);
  f.grads();
  f.hdo->step();
  EXPECT_THROW(f.hdo->load_state_dict(f.hdo->state_dict()), PyKeyError);
  RevisionSwitches fixed;
  fixed.hdo_update_fp32_skips_native_fp32 = true;
  Fixture g(0.5, at::kFloat, fixed);
  g.grads();
  g.hdo->step();
  EXPECT_NO_THROW(g.hdo->load_state_dict(g.hdo->state_dict()));
}

TEST(HybridDeviceOptimizer, DummyStepPerturbsModelParamsAndLeavesStepOne) {
  Fixture f(0.5, at::kBFloat16);
  f.hdo->dummy_step();
  EXPECT_NE(f.params[0].abs().sum().item<float>(), 0.0F);  // B14: a real update with random grads
  EXPECT_EQ(f.hdo->state.find(f.params[0])->get()->at("step").tensor().item<float>(), 1.0F);
  EXPECT_EQ(f.hdo->gpu_optimizer->param_groups->at(0).dict()->at("step").as_int(), 1);
  EXPECT_FALSE(f.rt.grad(f.params[0]).defined());  // zero_grad(set_to_none)
}

TEST(HybridDeviceOptimizer, GpuPartNeverUpdatesFp32ParamsWhoseGradIsDecoupled) {
  // Real-code behavior (miles-main, recorded in tests/conformance): an fp32 shard kept on the
  // GPU has no fp32 clone, so the GPU FusedAdam (built without use_decoupled_grad) reads its
  // .grad, which is None: state created, param never updated, no step used. bf16 params go
  // through their fp32 clones (getattr(p, "decoupled_grad", p.grad)) and are updated.
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    Fixture f(0.0, dtype);
    for (int i = 0; i < 2; ++i) {
      f.decoupled_grads();
      f.hdo->step();
    }
    const bool fp32 = dtype == at::kFloat;
    for (const auto& p : f.params) {
      EXPECT_EQ(p.to(at::kFloat).abs().sum().item<float>() == 0.0f, fp32)
          << (fp32 ? "an fp32 GPU param must stay untouched" : "a bf16 param must train");
    }
    EXPECT_EQ(f.hdo->gpu_fused_adam()->last_used_steps().size(), fp32 ? 0u : f.params.size());
    EXPECT_EQ(f.hdo->gpu_optimizer->param_groups->at(0).dict()->at("step").as_int(), 2)
        << "the group step still counts";
  }
  // Offloaded fp32 params are read through getattr(gpu_param, "decoupled_grad", ...): updated.
  Fixture cpu(1.0, at::kFloat);
  cpu.decoupled_grads();
  cpu.hdo->step();
  for (const auto& p : cpu.params) EXPECT_NE(p.abs().sum().item<float>(), 0.0f);
  // Our fix (fix-complete): the HDO hands the decoupled grad to the GPU part as .grad.
  RevisionSwitches fixed;
  fixed.hdo_gpu_part_gets_decoupled_grad = true;
  Fixture gpu(0.0, at::kFloat, fixed);
  gpu.decoupled_grads();
  gpu.hdo->step();
  for (const auto& p : gpu.params) EXPECT_NE(p.abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(gpu.hdo->gpu_fused_adam()->last_used_steps().size(), gpu.params.size());
}

// Without TE both parts are torch AdamW, and _move_new_state_to_right_device's
// isinstance(opt, cpu_optimizer_cls) sends the GPU part's state to the CPU after a load: the
// next step fails. Our fix (hdo_moves_state_by_role) keeps it on the GPU.
TEST(HybridDeviceOptimizer, WithoutTeTheGpuPartsStateGoesToTheCpuOnLoad) {
  for (const bool by_role : {false, true}) {
    RevisionSwitches s;
    s.hdo_moves_state_by_role = by_role;
    Fixture f(0.5, at::kBFloat16, s, /*te_installed=*/false);
    ASSERT_EQ(f.hdo->gpu_fused_adam(), nullptr);
    ASSERT_NE(dynamic_cast<TorchAdamW*>(f.hdo->gpu_optimizer.get()), nullptr);
    f.grads();
    f.hdo->step();
    // The GPU part's per-param step tensors, as torch AdamW keeps them.
    EXPECT_EQ(f.hdo->state.find(f.params[2])->get()->at("step").tensor().item<float>(), 1.0F);
    f.hdo->load_state_dict(f.hdo->state_dict());
    const at::Tensor gpu_inner = *f.hdo->param_to_inner_param.find(f.params[2]);
    const DictPtr gpu_state = *f.hdo->gpu_optimizer->state.find(gpu_inner);
    EXPECT_EQ(f.rt.device_of(gpu_state->at("exp_avg").tensor()),
              by_role ? Device::kCuda : Device::kCpu);
    f.grads();
    if (by_role) {
      EXPECT_NO_THROW(f.hdo->step());
      continue;
    }
    try {
      f.hdo->step();
      ADD_FAILURE() << "a GPU param stepped with its state on the CPU";
    } catch (const UpstreamError& e) {
      EXPECT_EQ(e.py_type(), "RuntimeError");
      EXPECT_EQ(e.site(), "hybrid_optimizer.py step()");
      EXPECT_NE(e.message().find("exp_avgs is on cpu"), std::string::npos) << e.message();
    }
  }
}
