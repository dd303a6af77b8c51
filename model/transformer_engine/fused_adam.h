// Transformer Engine's FusedAdam as an executable model (model/torch/optimizer.h has the
// Optimizer base it shares with torch's optimizers).
#pragma once

#include <string>
#include <vector>

#include "model/torch/optimizer.h"

namespace ckptsim::model {

// repr(type(optimizer)): how a class is named in a state dict or an HDO defaults dict.
inline constexpr const char* kFusedAdamClassRepr =
    "<class 'transformer_engine.pytorch.optimizers.fused_adam.FusedAdam'>";

// Mirrors transformer_engine/pytorch/optimizers/fused_adam.py FusedAdam (fp32, no master).
class FusedAdam final : public Optimizer {
 public:
  FusedAdam(Runtime& rt, std::vector<DictPtr> groups, DictPtr defaults = nullptr);
  std::string class_name() const override { return "FusedAdam"; }
  Value class_symbol() const override;
  void step() override;
  Value state_dict() override;
  void load_state_dict(const Value& state_dict) override;

  // TE get_unscaled_state / set_scaled_state for fp32 states (what our paths use).
  at::Tensor get_unscaled_state(const at::Tensor& param, const std::string& name);
  void set_scaled_state(const at::Tensor& param, const std::string& name, const at::Tensor& value);

  // The group step each updated param used in the last step(), in group/param order. A param
  // without a gradient (with use_decoupled_grad off, one whose gradient is only in
  // .decoupled_grad) gets its state created but is skipped: no entry.
  const std::vector<UsedStep>& last_used_steps() const { return last_used_steps_; }

 private:
  void initialize_state(const at::Tensor& param, const std::string& name, bool zero_buffer);
  std::vector<UsedStep> last_used_steps_;
};

}  // namespace ckptsim::model
