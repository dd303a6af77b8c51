#include "model/megatron/hybrid_optimizer.h"

#include "model/errors.h"
#include "model/py/host_tensor.h"

namespace ckptsim::model {

namespace {

bool is_floating32(const at::Tensor& t) { return t.scalar_type() == at::kFloat; }

}  // namespace

HybridDeviceOptimizer::HybridDeviceOptimizer(Runtime& rt, std::vector<DictPtr> groups,
                                             DictPtr defaults_in, const RevisionSwitches& switches)
    : Optimizer(rt, std::move(groups), std::move(defaults_in)), switches_(switches) {
  offload_fraction_ = defaults->at("offload_fraction").as_float();
  param_update_in_fp32_ = defaults->at("param_update_in_fp32").as_bool();
  overlap_cpu_optimizer_d2h_h2d_ = defaults->at("overlap_cpu_optimizer_d2h_h2d").as_bool();
  const std::string& gpu_cls = defaults->at("gpu_optimizer_cls").as_symbol().name;
  gpu_part_is_torch_adamw_ = gpu_cls == kTorchAdamWClassRepr;
  CKPTSIM_CHECK(gpu_part_is_torch_adamw_ || gpu_cls == kFusedAdamClassRepr,
                "HDO gpu_optimizer_cls must be TE's FusedAdam or torch AdamW");
  init_sub_optimizers();
}

Value HybridDeviceOptimizer::class_symbol() const {
  return Value::symbol(
      "<class 'megatron.core.optimizer.cpu_offloading.hybrid_optimizer.HybridDeviceOptimizer'>");
}

std::vector<Optimizer*> HybridDeviceOptimizer::sub_optimizers() const {
  std::vector<Optimizer*> out;
  for (const auto& o : cpu_optimizers) out.push_back(o.get());
  if (gpu_optimizer) out.push_back(gpu_optimizer.get());
  return out;
}

// Mirrors _get_sub_optimizer_param_groups().
HybridDeviceOptimizer::SubGroups HybridDeviceOptimizer::get_sub_optimizer_param_groups() {
  int64_t gpu_params_total_numel = 0;
  for (const Value& g : *param_groups) {
    for (const at::Tensor& p : group_params(*g.dict())) {
      if (rt_.device_of(p) == Device::kCuda) gpu_params_total_numel += p.numel();
    }
  }
  const double offload_threshold = static_cast<double>(gpu_params_total_numel) * offload_fraction_;
  int64_t offload_params_numel = 0;
  SubGroups out;
  gpu_params_map_cpu_copy = {};
  cpu_copys_map_gpu_param = {};
  param_to_fp32_param = {};
  for (const Value& gv : *param_groups) {
    const Dict& group = *gv.dict();
    DictPtr gpu_group = group.copy();
    DictPtr cpu_group = group.copy();
    std::vector<at::Tensor> gpu_params;
    std::vector<at::Tensor> cpu_params;
    for (const at::Tensor& orig_param : group_params(group)) {
      at::Tensor param = orig_param;
      bool cpu_copy = false;
      if (static_cast<double>(offload_params_numel) < offload_threshold &&
          rt_.device_of(param) == Device::kCuda) {
        // param.detach().clone().cpu().pin_memory()
        param = rt_.to(rt_.clone(param), Device::kCpu);
        offload_params_numel += param.numel();
        cpu_copy = true;
      }
      if (param_update_in_fp32_ && !is_floating32(param)) {
        param = rt_.to(rt_.clone(param), at::kFloat, rt_.device_of(param));
        param_to_fp32_param.set(orig_param, param);
      }
      if (cpu_copy) {
        gpu_params_map_cpu_copy.set(orig_param, param);
        cpu_copys_map_gpu_param.set(param, orig_param);
      }
      (rt_.device_of(param) == Device::kCuda ? gpu_params : cpu_params).push_back(param);
    }
    gpu_group->set("params", params_list(gpu_params));
    cpu_group->set("params", params_list(cpu_params));
    if (!gpu_params.empty()) out.gpu_param_groups.push_back(gpu_group);
    if (!cpu_params.empty()) out.cpu_param_groups.push_back(cpu_group);
  }
  return out;
}

// Mirrors _init_sub_optimizers() (+ _register_param_copy_back_gpu_hook, which step() calls).
void HybridDeviceOptimizer::init_sub_optimizers() {
  SubGroups groups = get_sub_optimizer_param_groups();
  param_to_inner_param = {};
  inner_param_to_orig_param = {};
  for (const Value& gv : *param_groups) {
    for (const at::Tensor& param : group_params(*gv.dict())) {
      at::Tensor inner = param;
      if (const at::Tensor* f = param_to_fp32_param.find(param)) {
        inner = *f;
      } else if (const at::Tensor* c = gpu_params_map_cpu_copy.find(param)) {
        inner = *c;
      }
      param_to_inner_param.set(param, inner);
      inner_param_to_orig_param.set(inner, param);
    }
  }
  fp32_param_to_orig_param = {};
  for (const auto& [orig, fp32] : param_to_fp32_param) fp32_param_to_orig_param.set(fp32, orig);

  cpu_optimizers.clear();
  if (overlap_cpu_optimizer_d2h_h2d_) {
    // build_cpu_optimizer_list: one AdamW per CPU param.
    for (const DictPtr& group : groups.cpu_param_groups) {
      DictPtr group_defaults = group->copy();
      const auto params = group_params(*group_defaults);
      group_defaults->pop("params");
      for (const at::Tensor& p : params) {
        DictPtr g = group_defaults->copy();
        g->set("params", params_list({p}));
        cpu_optimizers.push_back(std::make_unique<TorchAdamW>(rt_, std::vector<DictPtr>{g}));
      }
    }
  } else if (!groups.cpu_param_groups.empty()) {
    cpu_optimizers.push_back(std::make_unique<TorchAdamW>(rt_, groups.cpu_param_groups));
  }
  gpu_optimizer.reset();
  if (!groups.gpu_param_groups.empty()) {
    if (gpu_part_is_torch_adamw_) {
      gpu_optimizer = std::make_unique<TorchAdamW>(rt_, groups.gpu_param_groups);
    } else {
      gpu_optimizer = std::make_unique<FusedAdam>(rt_, groups.gpu_param_groups);
    }
  }
  cpu_copy_map_grad = {};
}

// Mirrors _set_sub_optimizer_grads().
void HybridDeviceOptimizer::set_sub_optimizer_grads() {
  if (param_update_in_fp32_) {
    for (const auto& [param, fp32_param] : param_to_fp32_param) {
      if (gpu_params_map_cpu_copy.contains(param)) continue;
      const at::Tensor grad = rt_.decoupled_grad_or_grad(param);
      if (grad.defined())
        rt_.set_grad(fp32_param, rt_.to(grad, fp32_param.scalar_type(), rt_.device_of(grad)));
    }
  }
  if (switches_.hdo_gpu_part_gets_decoupled_grad && gpu_optimizer) {
    for (const Value& gv : *gpu_optimizer->param_groups) {
      for (const at::Tensor& param : group_params(*gv.dict())) {
        if (fp32_param_to_orig_param.contains(param) || !rt_.has_decoupled_grad(param)) continue;
        rt_.set_grad(param, rt_.decoupled_grad(param));
      }
    }
  }
  for (const auto& optimizer : cpu_optimizers) {
    for (const Value& gv : *optimizer->param_groups) {
      for (const at::Tensor& param : group_params(*gv.dict())) {
        const at::Tensor& gpu_param =
            cpu_copys_map_gpu_param.at(param, "cpu_copys_map_gpu_param[param]");
        const at::Tensor grad = rt_.decoupled_grad_or_grad(gpu_param);
        if (!grad.defined()) continue;
        if (!cpu_copy_map_grad.contains(param)) {
          cpu_copy_map_grad.set(param, rt_.empty(param.sizes(), param.scalar_type(), Device::kCpu));
          rt_.set_grad(param, *cpu_copy_map_grad.find(param));
        }
        host::copy_(*cpu_copy_map_grad.find(param), grad);
      }
    }
  }
}

// The post-step hook of a CPU sub-optimizer: updated CPU params back into the 'cuda' originals.
void HybridDeviceOptimizer::param_copy_back_gpu(Optimizer& cpu_optimizer) {
  for (const Value& gv : *cpu_optimizer.param_groups) {
    for (const at::Tensor& param : group_params(*gv.dict())) {
      host::copy_(cpu_copys_map_gpu_param.at(param, "cpu_copys_map_gpu_param[param]"), param);
    }
  }
}

// The post-step hook of the GPU sub-optimizer with param_update_in_fp32.
void HybridDeviceOptimizer::fp32_param_copy_back_gpu() {
  for (const Value& gv : *param_groups) {
    for (const at::Tensor& param : group_params(*gv.dict())) {
      if (gpu_params_map_cpu_copy.contains(param)) continue;
      if (const at::Tensor* fp32_param = param_to_fp32_param.find(param)) {
        host::copy_(param, *fp32_param);
      }
    }
  }
}

void HybridDeviceOptimizer::step() {
  sync_hdo_param_groups_to_sub_optimizers();
  set_sub_optimizer_grads();
  if (gpu_optimizer) {
    try {
      gpu_optimizer->step();
    } catch (const UpstreamError& e) {
      // torch raises inside the sub-optimizer; the innermost Megatron frame is this step().
      throw UpstreamError(e.py_type(), e.message(), "hybrid_optimizer.py step()");
    }
    if (param_update_in_fp32_) fp32_param_copy_back_gpu();
  }
  for (const auto& cpu_optimizer : cpu_optimizers) {
    cpu_optimizer->step();
    param_copy_back_gpu(*cpu_optimizer);
  }
  sync_sub_optimizers_state_to_hdo();
}

void HybridDeviceOptimizer::sync_sub_optimizers_state_to_hdo() {
  ParamState new_state;
  for (Optimizer* optimizer : sub_optimizers()) {
    for (const auto& [param, s] : optimizer->state) {
      const at::Tensor& orig =
          inner_param_to_orig_param.at(param, "inner_param_to_orig_param[param]");
      new_state.set(orig, s);
      if (param_update_in_fp32_) s->set("master_param", Value(param));
    }
  }
  state = std::move(new_state);
}

void HybridDeviceOptimizer::sync_hdo_state_to_sub_optimizers() {
  for (Optimizer* optimizer : sub_optimizers()) {
    ParamState new_state;
    for (const Value& gv : *optimizer->param_groups) {
      for (const at::Tensor& param : group_params(*gv.dict())) {
        const at::Tensor& orig =
            inner_param_to_orig_param.at(param, "inner_param_to_orig_param[param]");
        // self.state is a defaultdict: a missing orig gets a new empty dict.
        new_state.set(param, state.get_or_insert(orig, [] { return Dict::make(); }));
      }
    }
    optimizer->state = std::move(new_state);
  }
  update_fp32_params_by_new_state();
  move_new_state_to_right_device();
}

void HybridDeviceOptimizer::sync_hdo_param_groups_to_sub_optimizers() {
  static constexpr const char* kSite =
      "hybrid_optimizer.py _sync_hdo_param_groups_to_sub_optimizers()";
  TensorMap<size_t> param_in_param_group_index;
  for (size_t i = 0; i < param_groups->size(); ++i) {
    for (const at::Tensor& param : group_params(*param_groups->at(i).dict())) {
      param_in_param_group_index.set(param_to_inner_param.at(param, kSite), i);
    }
  }
  for (Optimizer* optimizer : sub_optimizers()) {
    auto new_param_groups = List::make();
    for (const Value& gv : *optimizer->param_groups) {
      const Dict& group = *gv.dict();
      DictPtr new_group = group.copy();
      const auto params = group_params(group);
      if (params.empty()) throw PyAssertionError("param_groups should not be empty", kSite);
      const size_t group_id = param_in_param_group_index.at(params.front(), kSite);
      DictPtr update_group_attrs = param_groups->at(group_id).dict()->copy();
      update_group_attrs->pop("params");
      for (const auto& [k, v] : *update_group_attrs) {
        // Revision switch hdo_group_sync_skips_step (B5 fix): the HDO group's 'step' is the
        // value loaded at the last resume and must not reset the sub-optimizer's own.
        if (switches_.hdo_group_sync_skips_step && k == Key("step")) continue;
        new_group->set(k, v);
      }
      new_param_groups->append(Value(new_group));
    }
    optimizer->param_groups = new_param_groups;
  }
}

void HybridDeviceOptimizer::move_new_state_to_right_device() {
  for (Optimizer* optimizer : sub_optimizers()) {
    // Upstream: isinstance(optimizer, cpu_optimizer_cls), true for the GPU part too when both
    // classes are torch AdamW (no TE). Revision switch hdo_moves_state_by_role (fix, ours).
    const bool to_cpu = switches_.hdo_moves_state_by_role
                            ? optimizer != gpu_optimizer.get()
                            : dynamic_cast<TorchAdamW*>(optimizer) != nullptr;
    const Device target = to_cpu ? Device::kCpu : Device::kCuda;
    for (const auto& [param, s] : optimizer->state) {
      const at::Tensor* orig_p = inner_param_to_orig_param.find(param);
      const at::Tensor orig = orig_p != nullptr ? *orig_p : param;
      for (auto& [k, v] : *s) {
        if (!v.is_tensor()) continue;
        Value moved(rt_.to(v.tensor(), target));
        state.get_or_insert(orig, [] { return Dict::make(); })->set(k, moved);
        v = moved;
      }
    }
  }
}

void HybridDeviceOptimizer::update_fp32_param_by_new_param() {
  for (const auto& [param, fp32_param] : param_to_fp32_param) host::copy_(fp32_param, param);
  // Revision switch hdo_reload_refreshes_cpu_copies (radixark since ae20f4132).
  if (!switches_.hdo_reload_refreshes_cpu_copies) return;
  for (const auto& [param, cpu_copy] : gpu_params_map_cpu_copy) {
    if (!param_to_fp32_param.contains(param)) host::copy_(cpu_copy, param);
  }
}

void HybridDeviceOptimizer::update_fp32_params_by_new_state() {
  static constexpr const char* kSite = "hybrid_optimizer.py _update_fp32_params_by_new_state()";
  if (!param_update_in_fp32_) return;
  for (const auto& [param, v] : state) {
    at::Tensor target;
    if (switches_.hdo_update_fp32_skips_native_fp32) {
      // HEAD #5929 / RX: copy into the inner param unless the param is its own inner param.
      const at::Tensor* inner = param_to_inner_param.find(param);
      if (inner == nullptr || inner->is_same(param)) continue;
      target = *inner;
    } else {
      // POST: param_to_fp32_param[param] raises KeyError for params that are fp32 already (B10).
      const at::Tensor* fp32 = param_to_fp32_param.find(param);
      if (fp32 == nullptr) throw PyKeyError("Parameter containing: tensor(...)", kSite);
      target = *fp32;
    }
    host::copy_(target, v->at("master_param", kSite).tensor());
  }
}

Value HybridDeviceOptimizer::load_state_dict_pre_hook(Value state_dict) {
  if (!param_update_in_fp32_) return state_dict;
  ParamState new_state;
  for (const auto& [param, v] : state) {
    const at::Tensor* f = param_to_fp32_param.find(param);
    new_state.set(f != nullptr ? *f : param, v);
  }
  state = std::move(new_state);
  for (const Value& gv : *param_groups) {
    for (Value& p : *gv.dict()->at("params").list()) {
      if (const at::Tensor* f = param_to_fp32_param.find(p.tensor())) p = Value(*f);
    }
  }
  return state_dict;
}

void HybridDeviceOptimizer::load_state_dict_post_hook() {
  if (param_update_in_fp32_) {
    ParamState new_state;
    for (const auto& [param, v] : state) {
      const at::Tensor* o = fp32_param_to_orig_param.find(param);
      new_state.set(o != nullptr ? *o : param, v);
    }
    state = std::move(new_state);
    for (const Value& gv : *param_groups) {
      for (Value& p : *gv.dict()->at("params").list()) {
        if (const at::Tensor* o = fp32_param_to_orig_param.find(p.tensor())) p = Value(*o);
      }
    }
  }
  init_sub_optimizers();
  sync_hdo_param_groups_to_sub_optimizers();
  sync_hdo_state_to_sub_optimizers();
}

void HybridDeviceOptimizer::zero_grad() {
  // torch zero_grad(set_to_none=True) over the HDO params, then decoupled_grad = None where the
  // attribute exists.
  Optimizer::zero_grad();
  for (const Value& gv : *param_groups) {
    for (const at::Tensor& param : group_params(*gv.dict())) {
      if (rt_.has_decoupled_grad(param)) rt_.set_decoupled_grad(param, at::Tensor());
    }
  }
}

void HybridDeviceOptimizer::dummy_step() {
  for (const Value& gv : *param_groups) {
    for (const at::Tensor& param : group_params(*gv.dict()))
      rt_.set_grad(param, rt_.randn_like(param));
  }
  step();
  zero_grad();
}

}  // namespace ckptsim::model
