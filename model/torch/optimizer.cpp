#include "model/torch/optimizer.h"

#include <fmt/format.h>

#include <span>

#include "model/errors.h"
#include "model/kernels/fused_adam_cuda.h"

namespace ckptsim::model {

namespace {

// torch's elementwise ops reject operands of different sizes; so do the fused kernels.
void check_same_size(const at::Tensor& a, const at::Tensor& b, const char* site) {
  if (a.defined() && b.defined() && a.numel() != b.numel()) {
    throw UpstreamError(
        "RuntimeError",
        fmt::format(
            "The size of tensor a ({}) must match the size of tensor b ({}) at non-singleton "
            "dimension 0",
            a.numel(), b.numel()),
        site);
  }
}

std::span<float> fp32_span(const at::Tensor& t, const char* what) {
  CKPTSIM_CHECK(t.defined() && t.scalar_type() == at::kFloat && t.dim() <= 1 && t.is_contiguous(),
                std::string(what) + " must be a defined, contiguous, fp32, at most 1-D tensor");
  return {t.data_ptr<float>(), static_cast<size_t>(t.numel())};
}

bool group_flag(const Dict& group, const char* key) {
  const Value* v = group.find(key);
  return v != nullptr && !v->is_none() && v->as_bool();
}

// torch's Optimizer._process_value_according_to_param_policy.
Value process_value(Runtime& rt, const at::Tensor& param, const Value& value, int64_t param_id,
                    const ListPtr& saved_groups, const Key& key) {
  bool fused = false;
  bool capturable = false;
  for (const Value& g : *saved_groups) {
    const Dict& group = *g.dict();
    bool found = false;
    for (const Value& id : *group.at("params").list()) {
      if (id.is_int() && id.as_int() == param_id) found = true;
    }
    if (found) {
      fused = group_flag(group, "fused");
      capturable = group_flag(group, "capturable");
      break;
    }
  }
  const at::Tensor& v = value.tensor();
  if (key == Key("step")) {
    if (capturable || fused) return Value(rt.to(v, at::kFloat, rt.device_of(param)));
    return value;
  }
  if (param.is_floating_point()) return Value(rt.to(v, param.scalar_type(), rt.device_of(param)));
  return Value(rt.to(v, v.scalar_type(), rt.device_of(param)));
}

// torch's load_state_dict _cast(): tensors by policy, dicts and sequences element-wise.
Value cast_value(Runtime& rt, const at::Tensor& param, const Value& value, int64_t param_id,
                 const ListPtr& saved_groups, const Key& key) {
  if (value.is_tensor()) return process_value(rt, param, value, param_id, saved_groups, key);
  if (value.is_dict()) {
    auto out = Dict::make();
    for (const auto& [k, v] : *value.dict())
      out->set(k, cast_value(rt, param, v, param_id, saved_groups, k));
    return Value(out);
  }
  if (value.is_list()) {
    auto out = List::make();
    for (const auto& v : *value.list())
      out->append(cast_value(rt, param, v, param_id, saved_groups, key));
    return Value(out);
  }
  return value;
}

}  // namespace

std::vector<at::Tensor> group_params(const Dict& group) {
  std::vector<at::Tensor> out;
  for (const Value& v : *group.at("params", "param_group['params']").list())
    out.push_back(v.tensor());
  return out;
}

Value params_list(const std::vector<at::Tensor>& params) {
  auto l = List::make();
  for (const auto& p : params) l->append(Value(p));
  return Value(l);
}

AdamHyper group_hyper(const Dict& group) {
  AdamHyper h;
  h.lr = group.at("lr").as_float();
  const auto& betas = group.at("betas");
  if (betas.is_tuple()) {
    h.beta1 = betas.as_tuple().at(0).as_float();
    h.beta2 = betas.as_tuple().at(1).as_float();
  } else {
    h.beta1 = betas.list()->at(0).as_float();
    h.beta2 = betas.list()->at(1).as_float();
  }
  h.eps = group.at("eps").as_float();
  h.weight_decay = group.at("weight_decay").as_float();
  const Value* bc = group.find("bias_correction");
  h.bias_correction = bc == nullptr || bc->as_bool();
  return h;
}

// ---------------------------------------------------------------------------------------------

Optimizer::Optimizer(Runtime& rt, std::vector<DictPtr> groups, DictPtr defaults_in)
    : param_groups(List::make()), defaults(std::move(defaults_in)), rt_(rt) {
  CKPTSIM_CHECK(defaults != nullptr, "Optimizer defaults must be a dict");
  for (auto& g : groups) {
    CKPTSIM_CHECK(g != nullptr && g->contains("params"), "a param group needs 'params'");
    for (const auto& [k, v] : *defaults) g->setdefault(k, v);
    param_groups->append(Value(g));
  }
}

Value Optimizer::state_dict() {
  // param_mappings: id(p) -> running index over all groups; first occurrence wins.
  TensorMap<int64_t> mappings;
  int64_t start_index = 0;
  auto packed_groups = List::make();
  for (const Value& gv : *param_groups) {
    const Dict& group = *gv.dict();
    auto packed = Dict::make();
    for (const auto& [k, v] : group) {
      if (!(k == Key("params"))) packed->set(k, v);
    }
    auto ids = List::make();
    int64_t i = start_index;
    for (const at::Tensor& p : group_params(group)) {
      if (!mappings.contains(p)) mappings.set(p, i);
      ++i;
      ids->append(Value(*mappings.find(p)));
    }
    start_index += static_cast<int64_t>(ids->size());
    packed->set("params", Value(ids));
    packed_groups->append(Value(packed));
  }
  auto packed_state = Dict::make();
  for (const auto& [p, s] : state) {
    const int64_t* id = mappings.find(p);
    CKPTSIM_CHECK(id != nullptr, "optimizer state holds a tensor that is in no param group");
    packed_state->set(*id, Value(s));
  }
  return dict_value({{"state", Value(packed_state)}, {"param_groups", Value(packed_groups)}});
}

void Optimizer::load_state_dict(const Value& state_dict_in) {
  static constexpr const char* kSite = "torch/optim/optimizer.py Optimizer.load_state_dict()";
  Value sd = Value(state_dict_in.dict()->copy());
  sd = load_state_dict_pre_hook(sd);
  const ListPtr groups = param_groups;
  const Value saved_groups_v = deepcopy(sd.dict()->at("param_groups"));
  const ListPtr& saved_groups = saved_groups_v.list();
  if (groups->size() != saved_groups->size()) {
    throw UpstreamError("ValueError",
                        "loaded state dict has a different number of parameter groups", kSite);
  }
  for (size_t i = 0; i < groups->size(); ++i) {
    if (groups->at(i).dict()->at("params").list()->size() !=
        saved_groups->at(i).dict()->at("params").list()->size()) {
      throw UpstreamError("ValueError",
                          "loaded state dict contains a parameter group that doesn't match the "
                          "size of optimizer's group",
                          kSite);
    }
  }
  // id_map: saved param index -> current param, over all groups in order.
  std::vector<std::pair<int64_t, at::Tensor>> id_map;
  for (size_t i = 0; i < groups->size(); ++i) {
    const auto current = group_params(*groups->at(i).dict());
    const auto& saved_ids = *saved_groups->at(i).dict()->at("params").list();
    for (size_t j = 0; j < current.size(); ++j)
      id_map.emplace_back(saved_ids.at(j).as_int(), current[j]);
  }
  auto find_param = [&](int64_t id) -> const at::Tensor* {
    for (const auto& [k, p] : id_map) {
      if (k == id) return &p;
    }
    return nullptr;
  };
  // The casting policy reads the state dict's own groups (not the deep copy's identity).
  const ListPtr& policy_groups = sd.dict()->at("param_groups").list();
  ParamState new_state;
  for (const auto& [k, v] : *sd.dict()->at("state").dict()) {
    CKPTSIM_CHECK(k.is_int(), "optimizer state dict keys must be ints");
    const at::Tensor* param = find_param(k.as_int());
    CKPTSIM_CHECK(param != nullptr, "state entry " + k.repr() +
                                        " matches no param (torch keeps it keyed by int; "
                                        "not modeled)");
    new_state.set(*param, cast_value(rt_, *param, v, k.as_int(), policy_groups, k).dict());
  }
  auto new_groups = List::make();
  for (size_t i = 0; i < groups->size(); ++i) {
    DictPtr ng = saved_groups->at(i).dict();
    ng->set("params", groups->at(i).dict()->at("params"));
    new_groups->append(Value(ng));
  }
  state = std::move(new_state);
  param_groups = new_groups;
  after_setstate();
  load_state_dict_post_hook();
}

void Optimizer::zero_grad() {
  for (const Value& g : *param_groups) {
    for (const at::Tensor& p : group_params(*g.dict())) {
      if (rt_.grad(p).defined()) rt_.set_grad(p, at::Tensor());
    }
  }
}

// ---------------------------------------------------------------------------------------------

namespace {

DictPtr with_defaults(DictPtr base, std::initializer_list<Dict::Item> torch_defaults) {
  auto d = Dict::make(torch_defaults);
  if (base != nullptr) {
    for (const auto& [k, v] : *base) d->set(k, v);
  }
  return d;
}

}  // namespace

TorchAdamW::TorchAdamW(Runtime& rt, std::vector<DictPtr> groups, DictPtr defaults_in)
    : Optimizer(rt, std::move(groups),
                with_defaults(std::move(defaults_in),
                              {{"lr", Value(1e-3)},
                               {"betas", Value::tuple({Value(0.9), Value(0.999)})},
                               {"eps", Value(1e-8)},
                               {"weight_decay", Value(1e-2)},
                               {"amsgrad", Value(false)},
                               {"foreach", Value()},
                               {"maximize", Value(false)},
                               {"capturable", Value(false)},
                               {"differentiable", Value(false)},
                               {"fused", Value()}})) {}

Value TorchAdamW::class_symbol() const {
  return Value::symbol("<class 'torch.optim.adamw.AdamW'>");
}

void TorchAdamW::after_setstate() {
  // AdamW.__setstate__: a non-tensor 'step' becomes a float32 tensor (on the param's device
  // when fused or capturable).
  for (const Value& gv : *param_groups) {
    const Dict& group = *gv.dict();
    const bool on_param_device = group_flag(group, "fused") || group_flag(group, "capturable");
    for (const at::Tensor& p : group_params(group)) {
      DictPtr* s = state.find(p);
      if (s == nullptr || (*s)->empty()) continue;
      Value& step = (*s)->at("step", "AdamW.__setstate__");
      if (!step.is_tensor()) {
        step = Value(rt_.scalar_tensor(step.as_float(), at::kFloat,
                                       on_param_device ? rt_.device_of(p) : Device::kCpu));
      }
    }
  }
}

void TorchAdamW::step() {
  last_used_steps_.clear();
  for (const Value& gv : *param_groups) {
    const Dict& group = *gv.dict();
    CKPTSIM_CHECK(!group_flag(group, "amsgrad") && !group_flag(group, "maximize"),
                  "AdamW amsgrad/maximize are not modeled");
    const bool fused_or_capturable = group_flag(group, "fused") || group_flag(group, "capturable");
    const AdamHyper hyper = group_hyper(group);
    // _init_group: params with a grad, lazily initialized state.
    std::vector<at::Tensor> params;
    std::vector<at::Tensor> steps;
    for (const at::Tensor& p : group_params(group)) {
      if (!rt_.grad(p).defined()) continue;
      DictPtr& s = state.get_or_insert(p, [] { return Dict::make(); });
      if (s->empty()) {
        s->set("step",
               Value(fused_or_capturable ? rt_.zeros({}, at::kFloat, rt_.device_of(p))
                                         : rt_.scalar_tensor(0.0, at::kFloat, Device::kCpu)));
        s->set("exp_avg", Value(rt_.zeros_like(p)));
        s->set("exp_avg_sq", Value(rt_.zeros_like(p)));
      }
      params.push_back(p);
      steps.push_back(s->at("step", "AdamW._init_group").tensor());
    }
    // _foreach_add_(state_steps, 1): every step tensor first, so a shared one advances k times.
    for (at::Tensor& st : steps) {
      CKPTSIM_CHECK(st.numel() == 1 && st.scalar_type() == at::kFloat,
                    "AdamW step must be a one-element float32 tensor");
      if (st.is_cuda()) {
        st.add_(1.0);
      } else {
        st.data_ptr<float>()[0] += 1.0F;
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      const DictPtr& s = *state.find(p);
      const float t = steps[i].is_cuda() ? steps[i].item<float>() : steps[i].data_ptr<float>()[0];
      for (const char* k : {"exp_avg", "exp_avg_sq"})
        check_same_size(p, s->at(k).tensor(), "torch.optim.AdamW.step()");
      check_same_size(p, rt_.grad(p), "torch.optim.AdamW.step()");
      at::Tensor m = s->at("exp_avg").tensor();
      at::Tensor v = s->at("exp_avg_sq").tensor();
      if (p.is_cuda() || m.is_cuda()) {
        // torch AdamW's math has a CPU reference only: GPU-resident state goes through host
        // copies (the same bits, since the update is elementwise and exact-order).
        at::Tensor hp = p.cpu(), hg = rt_.grad(p).cpu(), hm = m.cpu(), hv = v.cpu();
        torch_adamw_update(fp32_span(hp, "AdamW param"), fp32_span(hg, "AdamW grad"),
                           fp32_span(hm, "exp_avg"), fp32_span(hv, "exp_avg_sq"), hyper, t);
        at::Tensor pp = p;
        pp.copy_(hp);
        m.copy_(hm);
        v.copy_(hv);
      } else {
        torch_adamw_update(fp32_span(p, "AdamW param"), fp32_span(rt_.grad(p), "AdamW grad"),
                           fp32_span(m, "exp_avg"), fp32_span(v, "exp_avg_sq"), hyper, t);
      }
      last_used_steps_.push_back({p, t});
    }
  }
}

// ---------------------------------------------------------------------------------------------

FusedAdam::FusedAdam(Runtime& rt, std::vector<DictPtr> groups, DictPtr defaults_in)
    : Optimizer(rt, std::move(groups),
                with_defaults(std::move(defaults_in),
                              {{"lr", Value(1e-3)},
                               {"bias_correction", Value(true)},
                               {"betas", Value::tuple({Value(0.9), Value(0.999)})},
                               {"eps", Value(1e-8)},
                               {"weight_decay", Value(0.0)}})) {}

Value FusedAdam::class_symbol() const {
  return Value::symbol("<class 'transformer_engine.pytorch.optimizers.fused_adam.FusedAdam'>");
}

namespace {
// TE FusedAdam.name_to_dtype_map (all fp32 here): any other state name is a KeyError.
void check_state_name(const std::string& name, const char* site) {
  if (name != "exp_avg" && name != "exp_avg_sq" && name != "master_param") {
    throw PyKeyError(py_str_repr(name), site);
  }
}
}  // namespace

void FusedAdam::initialize_state(const at::Tensor& param, const std::string& name,
                                 bool zero_buffer) {
  check_state_name(name, "fused_adam.py FusedAdam._initialize_state()");
  at::Tensor data = zero_buffer ? rt_.zeros(param.sizes(), at::kFloat, rt_.device_of(param))
                                : rt_.empty_like(param, at::kFloat);
  state.get_or_insert(param, [] { return Dict::make(); })->set(name, Value(data));
}

at::Tensor FusedAdam::get_unscaled_state(const at::Tensor& param, const std::string& name) {
  check_state_name(name, "fused_adam.py FusedAdam.get_unscaled_state()");
  const at::Tensor& t = state.at(param, "FusedAdam.state[param]")->at(name).tensor();
  if (t.scalar_type() != at::kFloat) {
    throw PyAssertionError("assert state[state_name].dtype == torch.float32 failed",
                           "fused_adam.py FusedAdam.get_unscaled_state()");
  }
  return t;
}

void FusedAdam::set_scaled_state(const at::Tensor& param, const std::string& name,
                                 const at::Tensor& value) {
  if (value.scalar_type() != at::kFloat) {
    throw PyAssertionError("assert unscaled_state.dtype == torch.float32 failed",
                           "fused_adam.py FusedAdam.set_scaled_state()");
  }
  DictPtr& s = state.get_or_insert(param, [] { return Dict::make(); });
  if (!s->contains(name)) initialize_state(param, name, /*zero_buffer=*/false);
  s->at(name).tensor().copy_(value);
}

Value FusedAdam::state_dict() {
  Value sd = Optimizer::state_dict();
  // TE: every state value goes through get_unscaled_state (KeyError for unknown names).
  int64_t running = 0;
  TensorMap<int64_t> seen;
  std::vector<at::Tensor> by_id;
  for (const Value& gv : *param_groups) {
    for (const at::Tensor& p : group_params(*gv.dict())) {
      if (!seen.contains(p)) seen.set(p, running);
      by_id.push_back(p);
      ++running;
    }
  }
  auto& packed = *sd.dict()->at("state").dict();
  for (auto& [k, v] : packed) {
    const at::Tensor& param = by_id.at(static_cast<size_t>(k.as_int()));
    auto new_v = Dict::make();
    for (const auto& [name, _] : *v.dict())
      new_v->set(name, Value(get_unscaled_state(param, name.str())));
    v = Value(new_v);
  }
  return sd;
}

void FusedAdam::load_state_dict(const Value& sd) {
  Optimizer::load_state_dict(sd);
  // TE re-creates every state tensor through set_scaled_state(param, name, v.float()).
  std::vector<std::pair<int64_t, at::Tensor>> id_map;
  const Value saved_groups = deepcopy(sd.dict()->at("param_groups"));
  for (size_t i = 0; i < param_groups->size(); ++i) {
    const auto current = group_params(*param_groups->at(i).dict());
    const auto& ids = *saved_groups.list()->at(i).dict()->at("params").list();
    for (size_t j = 0; j < current.size(); ++j) id_map.emplace_back(ids.at(j).as_int(), current[j]);
  }
  for (const auto& [k, v] : *sd.dict()->at("state").dict()) {
    for (const auto& [id, param] : id_map) {
      if (id != k.as_int()) continue;
      state.set(param, Dict::make());
      for (const auto& [name, value] : *v.dict()) {
        if (value.is_none()) continue;
        if (!value.is_tensor()) {
          throw UpstreamError("AttributeError",
                              "'" + value.type_name() + "' object has no attribute 'float'",
                              "fused_adam.py FusedAdam.load_state_dict()");
        }
        at::Tensor f = rt_.to(value.tensor(), at::kFloat, rt_.device_of(value.tensor()));
        set_scaled_state(param, name.str(), f);
      }
      break;
    }
  }
}

void FusedAdam::step() {
  last_used_steps_.clear();
  for (const Value& gv : *param_groups) {
    Dict& group = *gv.dict();
    const auto params = group_params(group);
    if (params.empty()) continue;
    Value* step = group.find("step");
    const int64_t t = step != nullptr ? step->as_int() + 1 : 1;
    group.set("step", Value(t));
    last_used_steps_.push_back(t);
    const AdamHyper hyper = group_hyper(group);
    // GPU-resident params go to the CUDA kernel in one multi-tensor apply per group.
    std::vector<FusedAdamTensors> on_gpu;
    std::vector<at::Tensor> keep_alive;
    for (const at::Tensor& p : params) {
      DictPtr& s = state.get_or_insert(p, [] { return Dict::make(); });
      if (s->empty()) {
        initialize_state(p, "exp_avg", /*zero_buffer=*/true);
        initialize_state(p, "exp_avg_sq", /*zero_buffer=*/true);
      }
      const at::Tensor g = rt_.grad(p);
      if (!g.defined()) continue;
      check_same_size(p, g, "fused_adam.py FusedAdam.step()");
      for (const char* k : {"exp_avg", "exp_avg_sq"})
        check_same_size(p, s->at(k).tensor(), "fused_adam.py FusedAdam.step()");
      const at::Tensor m = get_unscaled_state(p, "exp_avg");
      const at::Tensor v = get_unscaled_state(p, "exp_avg_sq");
      if (p.is_cuda()) {
        CKPTSIM_CHECK(g.is_cuda() && m.is_cuda() && v.is_cuda() && p.is_contiguous() &&
                          g.is_contiguous() && m.is_contiguous() && v.is_contiguous() &&
                          p.scalar_type() == at::kFloat && g.scalar_type() == at::kFloat,
                      "GPU FusedAdam operands must be contiguous fp32 CUDA tensors");
        on_gpu.push_back({p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                          v.data_ptr<float>(), p.numel()});
        keep_alive.push_back(g);
        continue;
      }
      fused_adam_update(fp32_span(p, "FusedAdam param"), fp32_span(g, "FusedAdam grad"),
                        fp32_span(m, "exp_avg"), fp32_span(v, "exp_avg_sq"), hyper, t);
    }
    if (!on_gpu.empty()) cuda_fused_adam(on_gpu, hyper, t);
  }
}

}  // namespace ckptsim::model
