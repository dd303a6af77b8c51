#include "model/transformer_engine/fused_adam.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>

#include "model/errors.h"
#include "model/faults.h"
#include "model/kernels/fused_adam_cuda.h"
#include "model/megatron/mapping.h"

namespace ckptsim::model {

namespace {

constexpr const char* kSite = "fused_adam.py FusedAdam";

std::string site(const char* function) { return fmt::format("{}.{}", kSite, function); }

at::ScalarType scalar_type(StateDType d) {
  switch (d) {
    case StateDType::kFloat32:
      return at::kFloat;
    case StateDType::kBFloat16:
      return at::kBFloat16;
    case StateDType::kFloat16:
      return at::kHalf;
  }
  return at::kFloat;
}

std::string short_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "fp32";
    case at::kBFloat16:
      return "bf16";
    case at::kHalf:
      return "fp16";
    case at::kShort:
      return "int16";
    default:
      return "other";
  }
}

// TE's bare `assert x.dtype == torch.<want>`.
void assert_dtype(const at::Tensor& t, at::ScalarType want, const char* what,
                  const char* function) {
  if (t.scalar_type() != want) {
    throw PyAssertionError(fmt::format("assert {}.dtype == {} failed (it is {})", what,
                                       torch_dtype_name(want), torch_dtype_name(t.scalar_type())),
                           site(function));
  }
}

// A state name TE knows (name_to_dtype_map): any other is a KeyError.
void check_state_name(const std::string& name, const char* function) {
  if (name != "exp_avg" && name != "exp_avg_sq" && name != "master_param") {
    throw PyKeyError(py_str_repr(name), site(function));
  }
}

// An fp32, contiguous CPU copy of `t` (a new tensor even when `t` already is one).
at::Tensor fp32_cpu_copy(const at::Tensor& t) {
  return t.to(at::kCPU).to(at::kFloat).contiguous().clone();
}

// torch.finfo(torch.float16).max / 2.0, as the fp32 [1] tensor dtype_to_range_map holds.
constexpr float kFp16Range = 65504.0f / 2.0f;

}  // namespace

at::Tensor master_from_remainder(const at::Tensor& bf16_param, const at::Tensor& remainder) {
  CKPTSIM_CHECK(bf16_param.scalar_type() == at::kBFloat16 &&
                    remainder.scalar_type() == at::kShort &&
                    bf16_param.numel() == remainder.numel(),
                "master_from_remainder: a bf16 param and an int16 remainder of one size");
  const at::Tensor p = bf16_param.to(at::kCPU).contiguous();
  const at::Tensor r = remainder.to(at::kCPU).contiguous();
  at::Tensor out = at::empty({p.numel()}, at::TensorOptions().dtype(at::kFloat));
  const auto* pb = reinterpret_cast<const uint16_t*>(p.data_ptr());
  const auto* rb = r.data_ptr<int16_t>();
  auto* ob = out.data_ptr<float>();
  for (int64_t i = 0; i < p.numel(); ++i) {
    uint16_t hi = pb[i];
    if (rb[i] < 0) hi = static_cast<uint16_t>(hi - 1);  // undo rounding
    const uint32_t bits = (uint32_t{hi} << 16) | static_cast<uint16_t>(rb[i]);
    std::memcpy(&ob[i], &bits, sizeof bits);
  }
  return out.view(p.sizes());
}

void split_master(const at::Tensor& master, at::Tensor& bf16_param, at::Tensor& remainder) {
  CKPTSIM_CHECK(master.scalar_type() == at::kFloat && bf16_param.scalar_type() == at::kBFloat16 &&
                    remainder.scalar_type() == at::kShort && master.numel() == bf16_param.numel() &&
                    master.numel() == remainder.numel(),
                "split_master: an fp32 master, a bf16 param and an int16 remainder of one size");
  const at::Tensor m = master.to(at::kCPU).contiguous();
  at::Tensor p = at::empty({m.numel()}, at::TensorOptions().dtype(at::kBFloat16));
  at::Tensor r = at::empty({m.numel()}, at::TensorOptions().dtype(at::kShort));
  const auto* mb = m.data_ptr<float>();
  auto* pb = reinterpret_cast<uint16_t*>(p.data_ptr());
  auto* rb = r.data_ptr<int16_t>();
  for (int64_t i = 0; i < m.numel(); ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &mb[i], sizeof bits);
    uint16_t hi = static_cast<uint16_t>(bits >> 16);
    const auto lo = static_cast<int16_t>(static_cast<uint16_t>(bits & 0xFFFFu));
    if (lo < 0) hi = static_cast<uint16_t>(hi + 1);  // round up
    pb[i] = hi;
    rb[i] = lo;
  }
  bf16_param.copy_(p.view(bf16_param.sizes()));
  remainder.copy_(r.view(remainder.sizes()));
}

FusedAdam::FusedAdam(Runtime& rt, std::vector<DictPtr> groups, DictPtr defaults_in,
                     FusedAdamOptions options)
    : Optimizer(rt, std::move(groups),
                with_defaults(std::move(defaults_in),
                              {{"lr", Value(1e-3)},
                               {"bias_correction", Value(true)},
                               {"betas", Value::tuple({Value(0.9), Value(0.999)})},
                               {"eps", Value(1e-8)},
                               {"weight_decay", Value(0.0)}})),
      options_(options) {}

Value FusedAdam::class_symbol() const { return Value::symbol(kFusedAdamClassRepr); }

StateDType FusedAdam::dtype_of(const at::Tensor& param, const std::string& name) const {
  if (name != "master_param" && promoted_.contains(param)) return StateDType::kFloat32;
  if (name == "exp_avg") return options_.exp_avg_dtype;
  if (name == "exp_avg_sq") return options_.exp_avg_sq_dtype;
  return StateDType::kFloat32;  // master_param: master_weight_dtype, fp32 only here
}

bool FusedAdam::remainders_for(const at::Tensor& param) const {
  return store_param_remainders() && param.scalar_type() == at::kBFloat16;
}

// _initialize_state(param, name, zero_buffer, store_param_remainders).
void FusedAdam::initialize_one(const at::Tensor& param, const std::string& name, bool zero_buffer) {
  check_state_name(name, "_initialize_state()");
  const Device device = rt_.device_of(param);
  at::Tensor data;
  if (name == "master_param" && remainders_for(param)) {
    data = rt_.zeros(param.sizes(), at::kShort, device);
  } else {
    const at::ScalarType t = scalar_type(dtype_of(param, name));
    data = zero_buffer ? rt_.zeros(param.sizes(), t, device) : rt_.empty_like(param, t);
  }
  state.get_or_insert(param, [] { return Dict::make(); })->set(name, Value(data));
  if (dtype_of(param, name) != StateDType::kFloat32) {
    DictPtr& s = scales_.get_or_insert(param, [] { return Dict::make(); });
    s->set(name, Value(rt_.zeros({1}, at::kFloat, device).fill_(1.0)));
  }
}

// initialize_state(param, store_param_remainders).
void FusedAdam::initialize_state(const at::Tensor& param) {
  initialize_one(param, "exp_avg", /*zero_buffer=*/true);
  initialize_one(param, "exp_avg_sq", /*zero_buffer=*/true);
  if (!options_.master_weights) return;
  initialize_one(param, "master_param", /*zero_buffer=*/false);
  if (!remainders_for(param)) {
    set_scaled_state(param, "master_param",
                     rt_.to(rt_.clone(param), at::kFloat, rt_.device_of(param)));
  }
}

// _apply_scale(state_name, unscaled_state, scaled_state, scale).
void FusedAdam::apply_scale(const at::Tensor& param, const std::string& name, at::Tensor unscaled,
                            const at::Tensor& scaled, at::Tensor& scale) {
  assert_dtype(unscaled, at::kFloat, "unscaled_state", "_apply_scale()");
  if (scaled.scalar_type() == at::kBFloat16) {
    scaled.copy_(unscaled.to(at::kBFloat16));  // round to nearest even
    return;
  }
  const at::ScalarType want = scalar_type(dtype_of(param, name));
  assert_dtype(scaled, want, "scaled_state", "_apply_scale()");
  CKPTSIM_CHECK(want == at::kHalf, "_apply_scale of an fp32 state");
  if (unscaled.numel() == 0) {
    throw UpstreamError("RuntimeError",
                        "aminmax(): cannot compute aminmax over an empty dimension as the "
                        "operation has no identity.",
                        "torch.aminmax()");
  }
  const at::Tensor min_val = unscaled.min();
  const at::Tensor max_val = unscaled.max();
  const at::Tensor absmax = at::maximum(-min_val, max_val).to(at::kFloat);
  const at::Tensor range = at::full({1}, kFp16Range, absmax.options());
  scale.copy_(at::div(absmax, range));
  const at::Tensor rscale = at::where(scale > 0, scale.reciprocal(), at::zeros_like(scale));
  unscaled.mul_(rscale.to(unscaled.device()));
  scaled.copy_(unscaled);
}

at::Tensor FusedAdam::get_unscaled_state(const at::Tensor& param, const std::string& name) {
  check_state_name(name, "get_unscaled_state()");
  const at::Tensor& t = state.at(param, "FusedAdam.state[param]")->at(name).tensor();
  switch (dtype_of(param, name)) {
    case StateDType::kFloat16: {
      assert_dtype(t, at::kHalf, "unscaled_local_state", "get_unscaled_state()");
      at::Tensor unscaled = rt_.to(t, at::kFloat, rt_.device_of(t));
      const at::Tensor& scale = scales_.at(param, "FusedAdam._scales[param]")->at(name).tensor();
      unscaled.mul_(scale.to(unscaled.device()));
      return unscaled;
    }
    case StateDType::kFloat32:
      assert_dtype(t, name == "master_param" && remainders_for(param) ? at::kShort : at::kFloat,
                   "unscaled_local_state", "get_unscaled_state()");
      return t;
    case StateDType::kBFloat16:
      assert_dtype(t, at::kBFloat16, "unscaled_local_state", "get_unscaled_state()");
      return rt_.to(t, at::kFloat, rt_.device_of(t));
  }
  return t;
}

void FusedAdam::set_scaled_state(const at::Tensor& param, const std::string& name,
                                 const at::Tensor& value) {
  const bool remainder = name == "master_param" && remainders_for(param);
  assert_dtype(value, remainder ? at::kShort : at::kFloat, "unscaled_state", "set_scaled_state()");
  DictPtr& s = state.get_or_insert(param, [] { return Dict::make(); });
  if (!s->contains(name)) initialize_one(param, name, /*zero_buffer=*/false);
  const at::Tensor& local = s->at(name).tensor();
  if (dtype_of(param, name) != StateDType::kFloat32) {
    at::Tensor scale = scales_.at(param, "FusedAdam._scales[param]")->at(name).tensor();
    apply_scale(param, name, value, local, scale);
  } else {
    local.copy_(value);
  }
}

at::Tensor FusedAdam::master_value(const at::Tensor& param) const {
  if (!options_.master_weights || param.scalar_type() != at::kBFloat16) return fp32_cpu_copy(param);
  const DictPtr* s = state.find(param);
  const Value* m = s != nullptr ? (*s)->find("master_param") : nullptr;
  // No master yet: the one the first step will create (a copy of the param, or remainders 0).
  if (m == nullptr || !m->is_tensor()) return fp32_cpu_copy(param);
  if (m->tensor().scalar_type() == at::kShort) return master_from_remainder(param, m->tensor());
  return fp32_cpu_copy(m->tensor());
}

at::Tensor FusedAdam::unscaled_copy(const at::Tensor& param, const std::string& name) const {
  const DictPtr* s = state.find(param);
  const Value* v = s != nullptr ? (*s)->find(name) : nullptr;
  if (v == nullptr || !v->is_tensor()) return {};
  at::Tensor out = fp32_cpu_copy(v->tensor());
  if (v->tensor().scalar_type() == at::kHalf) {
    if (const DictPtr* sc = scales_.find(param)) {
      if (const Value* scale = (*sc)->find(name)) out.mul_(scale->tensor().to(at::kCPU));
    }
  }
  return out;
}

std::optional<std::string> FusedAdam::stored_dtype(const at::Tensor& param,
                                                   const std::string& name) const {
  const DictPtr* s = state.find(param);
  const Value* v = s != nullptr ? (*s)->find(name) : nullptr;
  if (v == nullptr || !v->is_tensor()) return std::nullopt;
  return short_name(v->tensor().scalar_type());
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
  // TE re-creates every state tensor through set_scaled_state from the original values.
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
                              site("load_state_dict()"));
        }
        if (name.str() == "master_param" && remainders_for(param)) {
          set_scaled_state(param, name.str(), value.tensor());
          continue;
        }
        // Fault site load.low_precision_moment_kept_fp32: the param's moments are cast to fp32
        // and stay fp32 from this load on (the mutation issue 26 names).
        if (name.str() != "master_param" && dtype_of(param, name.str()) != StateDType::kFloat32 &&
            rt_.fault(fault::kLowPrecisionMomentKeptFp32)) {
          promoted_.set(param, true);
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
    if (params.empty()) continue;  // TE before #3318: an empty group's step does not advance
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
      if (s->empty()) initialize_state(p);
      at::Tensor g;
      if (options_.use_decoupled_grad) {
        if (rt_.has_decoupled_grad(p)) g = rt_.decoupled_grad(p);
      } else {
        g = rt_.grad(p);
      }
      if (!g.defined()) continue;
      last_used_steps_.push_back({p, static_cast<double>(t)});
      check_same_size(p, g, "fused_adam.py FusedAdam.step()");
      for (const char* k : {"exp_avg", "exp_avg_sq"})
        check_same_size(p, s->at(k).tensor(), "fused_adam.py FusedAdam.step()");
      if (options_.master_weights || p.scalar_type() != at::kFloat || promoted_.contains(p) ||
          options_.exp_avg_dtype != StateDType::kFloat32 ||
          options_.exp_avg_sq_dtype != StateDType::kFloat32) {
        step_precision_aware(p, g, hyper, t);
        continue;
      }
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

// One param's update through fp32 temporaries, as TE's step() does it for master weights and
// low-precision states: the master (fp32 master_param, or the bf16 param and its remainder
// reassembled; an fp32 param itself), the grad and the unscaled moments go to the kernel's
// arithmetic (fused_adam_update: the same op order as every FusedAdam here); afterwards the
// master is stored back (split into bf16 param and remainder, or kept whole with the bf16 param
// its round-to-nearest-even cast), and each low-precision moment through _apply_scale.
void FusedAdam::step_precision_aware(const at::Tensor& p, const at::Tensor& g,
                                     const AdamHyper& hyper, int64_t t) {
  DictPtr& s = state.at(p, "FusedAdam.state[p]");
  const bool bf16_master = options_.master_weights && p.scalar_type() == at::kBFloat16;
  const bool remainder = bf16_master && remainders_for(p);
  at::Tensor master = bf16_master ? master_value(p) : fp32_cpu_copy(p);
  if (remainder) {
    assert_dtype(s->at("master_param").tensor(), at::kShort, "unscaled_state['master_param']",
                 "step()");
  }
  at::Tensor grad = fp32_cpu_copy(g);
  at::Tensor m = fp32_cpu_copy(get_unscaled_state(p, "exp_avg"));
  at::Tensor v = fp32_cpu_copy(get_unscaled_state(p, "exp_avg_sq"));
  fused_adam_update(fp32_span(master, "FusedAdam master"), fp32_span(grad, "FusedAdam grad"),
                    fp32_span(m, "exp_avg"), fp32_span(v, "exp_avg_sq"), hyper, t);
  at::Tensor param = p;
  if (remainder) {
    at::Tensor rem = s->at("master_param").tensor();
    split_master(master.view(p.sizes()), param, rem);
  } else if (bf16_master) {
    s->at("master_param").tensor().copy_(master.view(p.sizes()));
    param.copy_(master.view(p.sizes()).to(at::kBFloat16));
  } else {
    param.copy_(master.view(p.sizes()));  // the kernel's static_cast<PARAM_T>
  }
  for (auto& [name, value] : std::initializer_list<std::pair<const char*, at::Tensor*>>{
           {"exp_avg", &m}, {"exp_avg_sq", &v}}) {
    const at::Tensor& stored = s->at(name).tensor();
    if (stored.scalar_type() == at::kFloat) {
      stored.copy_(value->view(p.sizes()));
    } else {
      at::Tensor scale = scales_.at(p, "FusedAdam._scales[param]")->at(name).tensor();
      apply_scale(p, name, value->view(p.sizes()), stored, scale);
    }
  }
}

}  // namespace ckptsim::model
