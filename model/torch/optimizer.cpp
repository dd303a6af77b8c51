#include "model/torch/optimizer.h"

#include <fmt/format.h>

#include <span>

#include "model/errors.h"

namespace ckptsim::model {

namespace {

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

DictPtr with_defaults(DictPtr base, std::initializer_list<Dict::Item> torch_defaults) {
  auto d = Dict::make(torch_defaults);
  if (base != nullptr) {
    for (const auto& [k, v] : *base) d->set(k, v);
  }
  return d;
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
    packed->reserve(group.size());
    const Key params_key("params");
    for (const auto& [k, v] : group) {
      if (!(k == params_key)) packed->set_new(k, v);  // the group's keys are distinct
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
    packed_state->set(*id, Value(s));  // set: two params of one id would be one entry
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

}  // namespace ckptsim::model
