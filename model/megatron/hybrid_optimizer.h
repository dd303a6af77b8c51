// HybridDeviceOptimizer (HDO): the CPU-offload optimizer of --optimizer-cpu-offload.
// Mirrors megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py (POST; spec §10).
//
// What it is: a torch Optimizer over the DistributedOptimizer's shard params ("orig" params:
// bf16/fp32 views of the model param buffer, simulated on 'cuda') that does no math itself.
// It splits the params greedily by numel: the first `offload_fraction` of the numel goes to
// CPU copies stepped by torch AdamW sub-optimizers (fused=True, per-param 'step' tensors);
// the rest to a Transformer Engine FusedAdam sub-optimizer (group 'step' ints), or, without TE
// (gpu_optimizer_cls torch AdamW), to a torch AdamW over the GPU-resident params. With
// param_update_in_fp32, every non-fp32 param gets an fp32 "inner" clone that the
// sub-optimizer updates and that is copied back into the orig param after each step.
//
// The aliasing that the bugs live in (invariant I15):
//   1. After step() and after load_state_dict(), HDO.state[orig] IS sub.state[inner] (the
//      same dict object), and HDO.state[orig]['master_param'] is the inner param (set by
//      _sync_sub_optimizers_state_to_hdo after a step; after a load it is whatever object
//      the load left there).
//   2. _sync_hdo_param_groups_to_sub_optimizers copies every HDO group attribute except
//      'params' into the sub-groups at every step — including 'step' once a resume has put
//      one into the HDO groups (B5), unless the revision's hdo_group_sync_skips_step is set.
//   3. load_state_dict's post-hook builds brand-new inner clones and sub-optimizers (empty
//      state, no group step), then re-aliases state and copies master_param into the clones.
//   4. dummy_step() is a real step with random gradients: it changes the model params and
//      leaves step=1 in every CPU AdamW and the FusedAdam groups.
#pragma once

#include <memory>
#include <vector>

#include "model/revision.h"
#include "model/torch/adamw.h"
#include "model/transformer_engine/fused_adam.h"

namespace ckptsim::model {

class HybridDeviceOptimizer final : public Optimizer {
 public:
  // Mirrors HybridDeviceOptimizer.__init__: `defaults` holds offload_fraction,
  // cpu_optimizer_cls, gpu_optimizer_cls, param_update_in_fp32, pin_cpu_grads,
  // pin_cpu_params, overlap_cpu_optimizer_d2h_h2d and the sub-optimizer kwargs (lr,
  // weight_decay, betas, eps, bias_correction, fused), exactly as upstream's defaults dict.
  HybridDeviceOptimizer(Runtime& rt, std::vector<DictPtr> groups, DictPtr defaults,
                        const RevisionSwitches& switches);

  std::string class_name() const override { return "HybridDeviceOptimizer"; }
  Value class_symbol() const override;
  void step() override;
  void zero_grad() override;
  void dummy_step();

  // CPU optimizers first, then the GPU one (if any).
  std::vector<Optimizer*> sub_optimizers() const;

  // Mirrors the private methods of the same names.
  void init_sub_optimizers();
  void sync_sub_optimizers_state_to_hdo();
  void sync_hdo_state_to_sub_optimizers();
  void sync_hdo_param_groups_to_sub_optimizers();
  void move_new_state_to_right_device();
  void update_fp32_params_by_new_state();
  // Mirrors update_fp32_param_by_new_param(): every fp32 copy of param_to_fp32_param copies
  // its orig param (what reload_model_params() does for the HDO). The CPU copies of params
  // that have no fp32 copy (fp32 params, or any param without param_update_in_fp32) are
  // refreshed too where the revision's hdo_reload_refreshes_cpu_copies says so (radixark's
  // param_to_inner_param), not at NVIDIA's revisions.
  void update_fp32_param_by_new_param();

  double offload_fraction() const { return offload_fraction_; }
  bool param_update_in_fp32() const { return param_update_in_fp32_; }

  std::vector<std::unique_ptr<TorchAdamW>> cpu_optimizers;
  // TE FusedAdam, or torch AdamW without TE; null when every param is offloaded.
  std::unique_ptr<Optimizer> gpu_optimizer;
  // The GPU part as TE's FusedAdam; null without one or without TE.
  const FusedAdam* gpu_fused_adam() const {
    return dynamic_cast<const FusedAdam*>(gpu_optimizer.get());
  }

  TensorMap<at::Tensor> param_to_fp32_param;
  TensorMap<at::Tensor> gpu_params_map_cpu_copy;
  TensorMap<at::Tensor> cpu_copys_map_gpu_param;
  TensorMap<at::Tensor> param_to_inner_param;
  TensorMap<at::Tensor> inner_param_to_orig_param;
  TensorMap<at::Tensor> fp32_param_to_orig_param;
  TensorMap<at::Tensor> cpu_copy_map_grad;

 protected:
  Value load_state_dict_pre_hook(Value state_dict) override;
  void load_state_dict_post_hook() override;

 private:
  struct SubGroups {
    std::vector<DictPtr> cpu_param_groups;
    std::vector<DictPtr> gpu_param_groups;
  };
  SubGroups get_sub_optimizer_param_groups();
  void set_sub_optimizer_grads();
  void param_copy_back_gpu(Optimizer& cpu_optimizer);
  void fp32_param_copy_back_gpu();

  const RevisionSwitches& switches_;
  double offload_fraction_ = 0.5;
  bool gpu_part_is_torch_adamw_ = false;  // gpu_optimizer_cls is torch AdamW (no TE)
  bool param_update_in_fp32_ = false;
  bool overlap_cpu_optimizer_d2h_h2d_ = true;
};

}  // namespace ckptsim::model
