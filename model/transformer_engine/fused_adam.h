// Transformer Engine's FusedAdam as an executable model (model/torch/optimizer.h has the
// Optimizer base it shares with torch's optimizers).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

#include "model/torch/optimizer.h"

namespace ckptsim::model {

// repr(type(optimizer)): how a class is named in a state dict or an HDO defaults dict.
inline constexpr const char* kFusedAdamClassRepr =
    "<class 'transformer_engine.pytorch.optimizers.fused_adam.FusedAdam'>";

// FusedAdam's constructor options beyond Adam's hyper-parameters: what Megatron's precision-aware
// optimizer passes (get_megatron_optimizer: master_weights, use_decoupled_grad,
// master_weight_dtype = main_params_dtype (fp32 only here), the state dtypes, and, TE >= 2.1,
// store_param_remainders). The defaults are TE's: fp32 states, no master weights (the plain
// FusedAdam and the HDO's GPU part).
struct FusedAdamOptions {
  bool master_weights = false;
  bool use_decoupled_grad = false;
  StateDType exp_avg_dtype = StateDType::kFloat32;
  StateDType exp_avg_sq_dtype = StateDType::kFloat32;
  // As passed; TE keeps it only with master_weights (and an fp32 master_weight_dtype).
  bool store_param_remainders = false;
};

// Mirrors transformer_engine/pytorch/optimizers/fused_adam.py FusedAdam (TE HEAD d0067d0da6),
// non-capturable, adam_w_mode 1, with fp32 or bf16 params, fp32/bf16/fp16 states and fp32 master
// weights kept whole or as int16 remainders. Two differences from TE HEAD, both the runner's
// stand-in's too (replay/emulation.py): an empty group's step is not advanced (TE before #3318),
// and the update's arithmetic is ckptsim's uncontracted op order (adam_math.h).
//
// States per param (name_to_dtype_map): 'exp_avg', 'exp_avg_sq' in their dtype; with master
// weights 'master_param': an fp32 copy, or for a bf16 param with remainders the int16 low halves
// of the fp32 masters (the bf16 param holds the high halves, rounded: see step()). Every
// non-fp32 state has a scale in _scales (used by fp16 only; bf16 keeps its [1] of ones).
class FusedAdam final : public Optimizer {
 public:
  FusedAdam(Runtime& rt, std::vector<DictPtr> groups, DictPtr defaults = nullptr,
            FusedAdamOptions options = {});
  std::string class_name() const override { return "FusedAdam"; }
  Value class_symbol() const override;
  void step() override;
  // Every state through get_unscaled_state (fp32, or int16 remainders).
  Value state_dict() override;
  // torch's loader, then every state re-created through set_scaled_state from the original
  // values: `.float()`, or verbatim for a remainder master.
  void load_state_dict(const Value& state_dict) override;

  // get_unscaled_state: fp32 and remainder states are returned as they are (the live tensor);
  // bf16 as a new `.float()`; fp16 as `.float() * scale`. Asserts the stored dtype.
  at::Tensor get_unscaled_state(const at::Tensor& param, const std::string& name);
  // set_scaled_state: asserts `value` is fp32 (int16 for a remainder master), creates the state
  // (torch.empty) when missing, then copy_ (fp32) or _apply_scale (bf16: RNE copy; fp16: a new
  // scale amax / 32752, and `value` multiplied IN PLACE by its reciprocal before the copy).
  void set_scaled_state(const at::Tensor& param, const std::string& name, const at::Tensor& value);

  // The fp32 value step() updates for `param` (read-only, a new tensor): its master (reassembled
  // from the bf16 param and the remainder where remainders are kept), or the param itself for an
  // fp32 param (and for every param without master weights). Before the first step: the
  // param's value, which is what the first step's master starts from.
  at::Tensor master_value(const at::Tensor& param) const;
  // The unscaled fp32 value of a state (a new tensor; undefined where the state is absent).
  at::Tensor unscaled_copy(const at::Tensor& param, const std::string& name) const;
  // The dtype a state is stored in (nullopt where absent): "fp32", "bf16", "fp16", "int16".
  std::optional<std::string> stored_dtype(const at::Tensor& param, const std::string& name) const;
  const FusedAdamOptions& options() const { return options_; }
  // TE's self.store_param_remainders: the option, kept only with master weights.
  bool store_param_remainders() const {
    return options_.store_param_remainders && options_.master_weights;
  }

  // The group step each updated param used in the last step(), in group/param order. A param
  // without a gradient (with use_decoupled_grad off, one whose gradient is only in
  // .decoupled_grad) gets its state created but is skipped: no entry.
  const std::vector<UsedStep>& last_used_steps() const { return last_used_steps_; }

 private:
  // Whether `param`'s master is kept as remainders (TE: store_param_remainders and bf16).
  bool remainders_for(const at::Tensor& param) const;
  // name_to_dtype_map[name] (fp32 for a moment the fault site load.low_precision_moment_kept_fp32
  // left fp32 on `param`).
  StateDType dtype_of(const at::Tensor& param, const std::string& name) const;
  void initialize_state(const at::Tensor& param);
  void step_precision_aware(const at::Tensor& p, const at::Tensor& g, const AdamHyper& hyper,
                            int64_t t);
  void initialize_one(const at::Tensor& param, const std::string& name, bool zero_buffer);
  void apply_scale(const at::Tensor& param, const std::string& name, at::Tensor unscaled,
                   const at::Tensor& scaled, at::Tensor& scale);
  FusedAdamOptions options_;
  TensorMap<DictPtr> scales_;  // _scales[param][name]: fp32 [1] tensors
  TensorMap<bool> promoted_;   // params whose moments a fault left fp32
  std::vector<UsedStep> last_used_steps_;
};

// The fp32 master of a bf16 value and its int16 remainder (adam.cu "undo rounding": the high
// half is the bf16 bits minus one where the remainder is negative), and the inverse split of an
// fp32 master into them ("round up": the bf16 bits are the high half plus one where the low half
// is negative, i.e. round to nearest on the 16 dropped bits, ties away from zero). Elementwise
// over CPU tensors of one size.
at::Tensor master_from_remainder(const at::Tensor& bf16_param, const at::Tensor& remainder);
void split_master(const at::Tensor& master, at::Tensor& bf16_param, at::Tensor& remainder);

}  // namespace ckptsim::model
