// The inner optimizers, as executable models of their Python classes.
//
//   Optimizer   mirrors torch/optim/optimizer.py Optimizer: param_groups (a list of dicts
//               whose 'params' is a list of tensors), state (tensor -> dict), state_dict()
//               packing, and load_state_dict() with its pre/post hooks and value casts.
//   TorchAdamW  mirrors torch.optim.AdamW: per-param state {'step': 0-dim float32 tensor,
//               'exp_avg', 'exp_avg_sq'}; foreach/fused stepping (every step tensor of the
//               group is incremented before any update, so a step tensor shared by k params
//               advances by k — spec §13, B9).
//   FusedAdam   mirrors Transformer Engine's FusedAdam (adam_w_mode=1, fp32 params, no master
//               weights): 'step' is a python int per *non-empty* param group, incremented
//               before the update even if no param has a grad; state {'exp_avg','exp_avg_sq'}
//               created lazily; state_dict()/load_state_dict() overridden as TE does
//               (load_state_dict re-creates every state tensor, so identities change).
//
// Ownership and identity: param_groups, the group dicts, the params lists and the per-param
// state dicts are shared Python objects (DictPtr/ListPtr); code that upstream assigns
// (`opt.state = new_state`, `group['step'] = x`) assigns here too. Math runs in
// model/kernels/adam_math.h on the tensors' fp32 storage.
//
// Invariants:
//   1. state iterates in insertion order; state[p] is keyed by tensor identity.
//   2. step() never reads a clock or a random source.
//   3. Only fp32, 1-D, contiguous params are stepped (what every modeled path passes);
//      anything else is an InvariantViolation, not a silent wrong answer.
#pragma once

#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/kernels/adam_math.h"
#include "model/py/runtime.h"
#include "model/py/tensor_map.h"
#include "model/py/value.h"

namespace ckptsim::model {

using ParamState = TensorMap<DictPtr>;

// The tensors of group['params'], in order.
std::vector<at::Tensor> group_params(const Dict& group);
// group['params'] as a new list value built from tensors.
Value params_list(const std::vector<at::Tensor>& params);

class Optimizer {
 public:
  // Mirrors torch Optimizer.__init__ + add_param_group: each group dict is used as is (not
  // copied) and receives every default it lacks (setdefault).
  Optimizer(Runtime& rt, std::vector<DictPtr> groups, DictPtr defaults);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Python class name ("AdamW") and the symbol a Python repr of the class prints.
  virtual std::string class_name() const = 0;
  virtual Value class_symbol() const = 0;

  virtual void step() = 0;
  // Mirrors Optimizer.state_dict(): {'state': {int: <live per-param dict>}, 'param_groups':
  // [<new dict per group with 'params' as ints>]}.
  virtual Value state_dict();
  // Mirrors Optimizer.load_state_dict() (torch 2.x), hooks included.
  virtual void load_state_dict(const Value& state_dict);
  // Mirrors Optimizer.zero_grad(set_to_none=True).
  virtual void zero_grad();

  Runtime& runtime() { return rt_; }

  ListPtr param_groups;  // list of group dicts
  ParamState state;
  DictPtr defaults;

 protected:
  // Optimizer.register_load_state_dict_pre_hook / post_hook equivalents.
  virtual Value load_state_dict_pre_hook(Value state_dict) { return state_dict; }
  virtual void load_state_dict_post_hook() {}
  // Optimizer.__setstate__ override point (AdamW turns non-tensor steps into tensors).
  virtual void after_setstate() {}

  Runtime& rt_;
};

// Shared by the Adam implementations (torch/adamw.h, transformer_engine/fused_adam.h):
// torch's size check of elementwise operands (RuntimeError naming `site`); a tensor's fp32
// storage as a span (InvariantViolation unless defined, fp32, contiguous, at most 1-D); a
// group's boolean option (false when absent or None); torch's defaults under `base`'s values.
void check_same_size(const at::Tensor& a, const at::Tensor& b, const char* site);
std::span<float> fp32_span(const at::Tensor& t, const char* what);
bool group_flag(const Dict& group, const char* key);
DictPtr with_defaults(DictPtr base, std::initializer_list<Dict::Item> torch_defaults);

// The bias-correction step t one param's update used in the last step() (for the simulator's
// trace). Params without a gradient are skipped by every Adam step and get no entry.
struct UsedStep {
  at::Tensor param;
  double step;
};

// Hyper-parameters of one group as the kernels take them (lr, betas, eps, weight_decay,
// bias_correction) read from the group dict the way the Python step() reads them.
AdamHyper group_hyper(const Dict& group);

}  // namespace ckptsim::model
