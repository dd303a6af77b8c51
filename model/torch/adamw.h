// torch.optim.AdamW as an executable model (model/torch/optimizer.h has the Optimizer base
// and what the model holds for every optimizer).
#pragma once

#include <string>
#include <vector>

#include "model/kernels/adam_math.h"
#include "model/torch/optimizer.h"

namespace ckptsim::model {

// repr(type(optimizer)).
inline constexpr const char* kTorchAdamWClassRepr = "<class 'torch.optim.adamw.AdamW'>";

// Mirrors torch.optim.AdamW.
class TorchAdamW final : public Optimizer {
 public:
  // `defaults` overrides torch's defaults (lr=1e-3, betas=(0.9,0.999), eps=1e-8,
  // weight_decay=1e-2, amsgrad=False, foreach=None, maximize=False, capturable=False,
  // differentiable=False, fused=None).
  TorchAdamW(Runtime& rt, std::vector<DictPtr> groups, DictPtr defaults = nullptr);
  std::string class_name() const override { return "AdamW"; }
  Value class_symbol() const override;
  void step() override;

  // The implementation torch/optim/adam.py picks for a step() of `params` (a group's params
  // with a grad) under `group`'s flags: fused on their device, else foreach on CUDA.
  TorchAdamWKernel kernel_for(const Dict& group, const std::vector<at::Tensor>& params) const;

  // The step tensor values each updated param used in the last step(), in group/param order.
  const std::vector<UsedStep>& last_used_steps() const { return last_used_steps_; }

 protected:
  void after_setstate() override;

 private:
  void advance_steps(std::vector<at::Tensor>& steps);

  std::vector<UsedStep> last_used_steps_;
};

}  // namespace ckptsim::model
