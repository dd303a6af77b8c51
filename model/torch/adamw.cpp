#include "model/torch/adamw.h"

#include <fmt/format.h>

#include "model/errors.h"
#include "model/faults.h"
#include "model/kernels/fused_adam_cuda.h"

namespace ckptsim::model {

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

Value TorchAdamW::class_symbol() const { return Value::symbol(kTorchAdamWClassRepr); }

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

// _foreach_add_(state_steps, 1): every step tensor first, so a shared one advances k times.
void TorchAdamW::advance_steps(std::vector<at::Tensor>& steps) {
  for (at::Tensor& st : steps) {
    CKPTSIM_CHECK(st.numel() == 1 && st.scalar_type() == at::kFloat,
                  "AdamW step must be a one-element float32 tensor");
    if (st.is_cuda()) {
      st.add_(1.0);
    } else {
      st.data_ptr<float>()[0] += 1.0F;
    }
    // Fault site optimizer.step_counter_bf16: the counter kept in bf16 as it is incremented.
    if (rt_.fault(fault::kStepCounterBf16)) st.copy_(st.to(at::kBFloat16));
  }
}

// torch/optim/adam.py: `fused` runs _fused_adamw on the params' device; `foreach` None (the
// default) runs _multi_tensor_adam where every param is on CUDA, as does `foreach` True there;
// anything else _single_tensor_adam (a foreach over CPU params is not told apart from it).
TorchAdamWKernel TorchAdamW::kernel_for(const Dict& group,
                                        const std::vector<at::Tensor>& params) const {
  bool all_cuda = true;
  bool all_cpu = true;
  for (const at::Tensor& p : params) {
    all_cuda = all_cuda && rt_.device_of(p) == Device::kCuda;
    all_cpu = all_cpu && rt_.device_of(p) == Device::kCpu;
  }
  if (group_flag(group, "fused")) {
    CKPTSIM_CHECK(all_cuda || all_cpu,
                  "torch AdamW(fused=True) over CPU and CUDA params at once is not modeled");
    return all_cuda ? TorchAdamWKernel::kFusedCuda : TorchAdamWKernel::kFusedCpu;
  }
  const Value foreach = group.get("foreach", Value());
  const bool foreach_off = foreach.is_bool() && !foreach.as_bool();
  if (all_cuda && !foreach_off) return TorchAdamWKernel::kForeachCuda;
  return all_cuda ? TorchAdamWKernel::kSingleTensorCuda : TorchAdamWKernel::kSingleTensorCpu;
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
      // _fused_adamw / _multi_tensor_adamw: every list must be on the params' device (the HDO
      // without TE moves its GPU part's state to the CPU after a load).
      const Device state_device = rt_.device_of(s->at("exp_avg", "AdamW._init_group").tensor());
      if (state_device != rt_.device_of(p)) {
        throw UpstreamError("RuntimeError",
                            fmt::format("exp_avgs is on {}, params on {}",
                                        state_device == Device::kCpu ? "cpu" : "cuda:0",
                                        rt_.device_of(p) == Device::kCpu ? "cpu" : "cuda:0"),
                            "adamw.py adamw()");
      }
      params.push_back(p);
      steps.push_back(s->at("step", "AdamW._init_group").tensor());
    }
    advance_steps(steps);
    const TorchAdamWKernel kernel = kernel_for(group, params);
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
        // copies (the same bits: the update of one tensor does not depend on where it runs).
        at::Tensor hp = p.cpu(), hg = rt_.grad(p).cpu(), hm = m.cpu(), hv = v.cpu();
        torch_adamw_update(kernel, fp32_span(hp, "AdamW param"), fp32_span(hg, "AdamW grad"),
                           fp32_span(hm, "exp_avg"), fp32_span(hv, "exp_avg_sq"), hyper, t);
        at::Tensor pp = p;
        pp.copy_(hp);
        m.copy_(hm);
        v.copy_(hv);
      } else {
        torch_adamw_update(kernel, fp32_span(p, "AdamW param"),
                           fp32_span(rt_.grad(p), "AdamW grad"), fp32_span(m, "exp_avg"),
                           fp32_span(v, "exp_avg_sq"), hyper, t);
      }
      last_used_steps_.push_back({p, t});
    }
  }
}

}  // namespace ckptsim::model
