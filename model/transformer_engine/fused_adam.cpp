#include "model/transformer_engine/fused_adam.h"

#include <fmt/format.h>

#include "model/errors.h"
#include "model/faults.h"
#include "model/kernels/fused_adam_cuda.h"

namespace ckptsim::model {

FusedAdam::FusedAdam(Runtime& rt, std::vector<DictPtr> groups, DictPtr defaults_in)
    : Optimizer(rt, std::move(groups),
                with_defaults(std::move(defaults_in),
                              {{"lr", Value(1e-3)},
                               {"bias_correction", Value(true)},
                               {"betas", Value::tuple({Value(0.9), Value(0.999)})},
                               {"eps", Value(1e-8)},
                               {"weight_decay", Value(0.0)}})) {}

Value FusedAdam::class_symbol() const { return Value::symbol(kFusedAdamClassRepr); }

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
    int64_t t = step != nullptr ? step->as_int() + 1 : 1;
    if (rt_.fault(fault::kStepCounterBf16))
      t = static_cast<int64_t>(float(c10::BFloat16(float(t))));
    group.set("step", Value(t));
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
      last_used_steps_.push_back({p, static_cast<double>(t)});
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
