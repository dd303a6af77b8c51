#include "sim/probe.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/errors.h"
#include "model/megatron/optimizer_key.h"
#include "model/py/host_tensor.h"

namespace ckptsim::sim {

namespace {

using model::Dict;
using model::Optimizer;
using model::TorchAdamW;
using model::Value;

std::vector<float> floats(const Value* v) {
  std::vector<float> out;
  if (v == nullptr || !v->is_tensor() || !v->tensor().defined()) return out;
  return model::host::floats(v->tensor());
}

size_t owner_of(const model::DistributedOptimizer& opt, const at::Tensor& t) {
  const std::optional<size_t> p = opt.model_param_of(t);
  CKPTSIM_CHECK(p.has_value(), "an optimizer param that is no shard of a model param");
  return *p;
}

bool is_adamw(const Optimizer* o) { return dynamic_cast<const TorchAdamW*>(o) != nullptr; }

// Where an optimizer param's state lives: the sub-optimizer (HDO) or the inner optimizer, the
// group that holds it, and the master tensor the kernel updates.
struct StateOwner {
  const Optimizer* optimizer = nullptr;
  const Dict* group = nullptr;
  at::Tensor master;
  OptimizerPart part = OptimizerPart::kFusedAdam;
  Kernel kernel = Kernel::kFusedAdam;
};

Kernel kernel_of(const Optimizer* o, const Dict& group) {
  const auto* adamw = dynamic_cast<const TorchAdamW*>(o);
  if (adamw == nullptr) return Kernel::kFusedAdam;
  switch (adamw->kernel_for(group, model::group_params(group))) {
    case model::TorchAdamWKernel::kForeachCuda:
      return Kernel::kTorchForeachCuda;
    case model::TorchAdamWKernel::kFusedCpu:
      return Kernel::kTorchFusedCpu;
    case model::TorchAdamWKernel::kFusedCuda:
      return Kernel::kTorchFusedCuda;
    case model::TorchAdamWKernel::kSingleTensorCpu:
      return Kernel::kTorchSingleTensorCpu;
    case model::TorchAdamWKernel::kSingleTensorCuda:
      return Kernel::kTorchSingleTensorCuda;
  }
  return Kernel::kFusedAdam;
}

StateOwner state_owner(const model::DistributedOptimizer& opt, const at::Tensor& x,
                       const Dict& group) {
  const model::HybridDeviceOptimizer* h = opt.hdo();
  if (h == nullptr) {
    return {&opt.optimizer(), &group, x,
            is_adamw(&opt.optimizer()) ? OptimizerPart::kAdamW : OptimizerPart::kFusedAdam,
            kernel_of(&opt.optimizer(), group)};
  }
  StateOwner out;
  out.master = h->param_to_inner_param.at(x, "param_to_inner_param");
  for (Optimizer* sub : h->sub_optimizers()) {
    for (const Value& sg : *sub->param_groups) {
      for (const at::Tensor& q : model::group_params(*sg.dict())) {
        if (q.is_same(out.master)) {
          out.optimizer = sub;
          out.group = sg.dict().get();
        }
      }
    }
  }
  CKPTSIM_CHECK(out.optimizer != nullptr, "HDO inner param owned by no sub-optimizer");
  out.kernel = kernel_of(out.optimizer, *out.group);
  if (out.optimizer != h->gpu_optimizer.get()) {
    out.part = OptimizerPart::kHdoCpuAdamW;
  } else {
    out.part =
        is_adamw(out.optimizer) ? OptimizerPart::kHdoGpuAdamW : OptimizerPart::kHdoGpuFusedAdam;
  }
  return out;
}

// One shard's snapshot; `step_object` receives the identity of its step tensor (or null).
ShardSnapshot snapshot_one(const model::DistributedOptimizer& opt, const at::Tensor& x,
                           const Dict& group, const void*& step_object) {
  ShardSnapshot snap;
  snap.model_param = owner_of(opt, x);
  snap.param_range = opt.range_map(snap.model_param).param;
  const StateOwner owner = state_owner(opt, x, group);
  snap.part = owner.part;
  snap.kernel = owner.kernel;
  step_object = nullptr;
  const auto* fused = dynamic_cast<const model::FusedAdam*>(owner.optimizer);
  if (fused != nullptr && opt.te_precision_aware()) {
    // TE's precision-aware FusedAdam: the fp32 master it updates (reassembled from the bf16
    // param and its remainder, or its fp32 master_param; an fp32 param itself) and the unscaled
    // moments, with the dtypes each state is stored in.
    const Value master_value(fused->master_value(x));
    snap.master = floats(&master_value);
    for (const char* name : {"exp_avg", "exp_avg_sq", "master_param"}) {
      const std::optional<std::string> d = fused->stored_dtype(x, name);
      if (d.has_value()) snap.state_dtypes.emplace_back(name, *d);
    }
    const Value m(fused->unscaled_copy(x, "exp_avg"));
    const Value v(fused->unscaled_copy(x, "exp_avg_sq"));
    snap.exp_avg = floats(&m);
    snap.exp_avg_sq = floats(&v);
    if (const Value* step = owner.group->find("step"); step != nullptr && !step->is_none())
      snap.step = step->as_float();
    return snap;
  }
  const Value master_value(owner.master);
  snap.master = floats(&master_value);
  if (const model::DictPtr* st = owner.optimizer->state.find(owner.master)) {
    snap.exp_avg = floats((*st)->find("exp_avg"));
    snap.exp_avg_sq = floats((*st)->find("exp_avg_sq"));
    if (is_torch_adamw(snap.kernel)) {
      if (const Value* v = (*st)->find("step");
          v != nullptr && v->is_tensor() && v->tensor().numel() == 1) {
        snap.step = model::py_item(v->tensor());
        step_object = v->tensor().unsafeGetTensorImpl();
      }
    }
  }
  if (!is_torch_adamw(snap.kernel)) {
    if (const Value* v = owner.group->find("step"); v != nullptr && !v->is_none())
      snap.step = v->as_float();
  }
  return snap;
}

// FusedAdam's group step of the last step(), for every param it updated.
void fused_uses(const model::DistributedOptimizer& opt, const model::FusedAdam& fused,
                const model::HybridDeviceOptimizer* h, OptimizerPart part,
                std::vector<StepUse>& out) {
  for (const auto& u : fused.last_used_steps()) {
    const at::Tensor& orig =
        h != nullptr ? h->inner_param_to_orig_param.at(u.param, "inner_param_to_orig_param")
                     : u.param;
    out.push_back({owner_of(opt, orig), part, u.step});
  }
}

// torch AdamW's per-param step tensors of the last step(), for every param it updated.
void adamw_uses(const model::DistributedOptimizer& opt, const TorchAdamW& adamw,
                const model::HybridDeviceOptimizer* h, OptimizerPart part,
                std::vector<StepUse>& out) {
  for (const auto& u : adamw.last_used_steps()) {
    const at::Tensor& orig =
        h != nullptr ? h->inner_param_to_orig_param.at(u.param, "inner_param_to_orig_param")
                     : u.param;
    out.push_back({owner_of(opt, orig), part, u.step});
  }
}

}  // namespace

std::string part_name(OptimizerPart part) {
  switch (part) {
    case OptimizerPart::kFusedAdam:
      return "FusedAdam";
    case OptimizerPart::kAdamW:
      return "AdamW";
    case OptimizerPart::kHdoCpuAdamW:
      return "HDO cpu AdamW";
    case OptimizerPart::kHdoGpuFusedAdam:
      return "HDO gpu FusedAdam";
    case OptimizerPart::kHdoGpuAdamW:
      return "HDO gpu AdamW";
  }
  return "?";
}

std::string kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::kFusedAdam:
      return "ckptsim_fused_adam";
    case Kernel::kTorchForeachCuda:
      return model::kernel_name(model::TorchAdamWKernel::kForeachCuda);
    case Kernel::kTorchFusedCpu:
      return model::kernel_name(model::TorchAdamWKernel::kFusedCpu);
    case Kernel::kTorchFusedCuda:
      return model::kernel_name(model::TorchAdamWKernel::kFusedCuda);
    case Kernel::kTorchSingleTensorCpu:
      return model::kernel_name(model::TorchAdamWKernel::kSingleTensorCpu);
    case Kernel::kTorchSingleTensorCuda:
      return model::kernel_name(model::TorchAdamWKernel::kSingleTensorCuda);
  }
  return "?";
}

bool is_torch_adamw(Kernel kernel) { return kernel != Kernel::kFusedAdam; }

int rounding_class(Kernel kernel, int64_t index, int64_t numel) {
  const int base = 2 * static_cast<int>(kernel);
  return kernel == Kernel::kTorchFusedCpu && model::torch_fused_cpu_scalar_tail(index, numel)
             ? base + 1
             : base;
}

namespace {

std::vector<ShardSnapshot> snapshot_part(const model::DistributedOptimizer& opt) {
  std::vector<ShardSnapshot> out;
  std::vector<const void*> step_objects;  // per snapshot entry, the step tensor's identity
  for (const Value& gv : *opt.optimizer().param_groups) {
    for (const at::Tensor& x : model::group_params(*gv.dict())) {
      const void* step_object = nullptr;
      out.push_back(snapshot_one(opt, x, *gv.dict(), step_object));
      step_objects.push_back(step_object);
    }
  }
  // Identity comparison only (never ordered by address).
  for (size_t i = 0; i < out.size(); ++i) {
    if (step_objects[i] == nullptr) continue;
    for (size_t j = 0; j < out.size(); ++j) {
      if (i != j && step_objects[j] == step_objects[i]) ++out[i].step_aliases;
    }
  }
  return out;
}

std::vector<StepUse> step_uses_part(const model::DistributedOptimizer& opt) {
  std::vector<StepUse> out;
  if (const model::HybridDeviceOptimizer* h = opt.hdo()) {
    for (const auto& cpu : h->cpu_optimizers)
      adamw_uses(opt, *cpu, h, OptimizerPart::kHdoCpuAdamW, out);
    if (const model::FusedAdam* gpu = h->gpu_fused_adam()) {
      fused_uses(opt, *gpu, h, OptimizerPart::kHdoGpuFusedAdam, out);
    } else if (const auto* gpu_adamw = dynamic_cast<const TorchAdamW*>(h->gpu_optimizer.get())) {
      adamw_uses(opt, *gpu_adamw, h, OptimizerPart::kHdoGpuAdamW, out);
    }
    return out;
  }
  if (const auto* adamw = dynamic_cast<const TorchAdamW*>(&opt.optimizer())) {
    adamw_uses(opt, *adamw, nullptr, OptimizerPart::kAdamW, out);
    return out;
  }
  const auto* fused = dynamic_cast<const model::FusedAdam*>(&opt.optimizer());
  CKPTSIM_CHECK(fused != nullptr, "an inner optimizer that is neither HDO, AdamW nor FusedAdam");
  fused_uses(opt, *fused, nullptr, OptimizerPart::kFusedAdam, out);
  return out;
}

// The part's slices; `prefix` is what its keys begin with in the checkpoint ('chained_<i>.' in
// a chain of several parts whose keys are prefixed, else "").
void uninitialized_after_load_part(const model::DistributedOptimizer& opt,
                                   const model::DistributedDataParallel& ddp,
                                   const model::LoadReport& load, const std::string& prefix,
                                   std::vector<UninitializedSlice>& out) {
  if (!opt.state_allocated_by_torch_empty()) return;
  for (const model::UnwrittenRange& u : load.unwritten) {
    if (!u.key.starts_with(prefix)) continue;
    const auto key = model::parse_bucket_key(u.key.substr(prefix.size()));
    if (!key || key->dp_group_idx != 0) continue;  // the model's keys: loaded into live params
    StateField field = StateField::kExpAvg;
    if (key->state == "exp_avg_sq") {
      field = StateField::kExpAvgSq;
    } else if (key->state == "param" && opt.precision_aware()) {
      field = StateField::kMaster;  // dummy_state's master_param, renamed 'param' by _get
    } else if (key->state != "exp_avg") {
      continue;  // the fp32 main param: a clone of the model param, never torch.empty
    }
    const auto& ranges = opt.gbuf_ranges();
    const auto g = static_cast<size_t>(key->gbuf_idx);
    const auto b = static_cast<size_t>(key->bucket_idx);
    if (g >= ranges.size() || b >= ranges[g].size()) continue;
    const int64_t begin = u.global_offset;
    const int64_t end = u.global_offset + u.numel;
    for (const auto& [local_index, rm] : ranges[g][b].param_map) {
      // The bucket key's global coordinates are the bucket's own (gbuf_world_in_bucket).
      const int64_t lo = std::max(begin, rm.gbuf_world_in_bucket.start);
      const int64_t hi = std::min(end, rm.gbuf_world_in_bucket.end);
      if (lo >= hi) continue;
      const int64_t at = rm.param.start + (lo - rm.gbuf_world_in_bucket.start);
      out.push_back({ddp.buffers()[g].params.at(local_index),
                     {at, at + (hi - lo)},
                     field,
                     u.missing_key ? "skipped optimizer key " + u.key
                                   : fmt::format("left {}[{}:{}] unwritten", u.key, u.global_offset,
                                                 u.global_offset + u.numel)});
    }
  }
}

}  // namespace

std::vector<ShardSnapshot> snapshot(const model::ChainedOptimizer& opt) {
  std::vector<ShardSnapshot> out;
  for (size_t i = 0; i < opt.size(); ++i) {
    for (ShardSnapshot& s : snapshot_part(opt.part(i))) {
      if (opt.size() > 1) s.chain = static_cast<int>(i);
      out.push_back(std::move(s));
    }
  }
  return out;
}

std::vector<StepUse> step_uses(const model::ChainedOptimizer& opt) {
  std::vector<StepUse> out;
  for (size_t i = 0; i < opt.size(); ++i) {
    for (const StepUse& u : step_uses_part(opt.part(i))) out.push_back(u);
  }
  return out;
}

std::vector<UninitializedSlice> uninitialized_after_load(const model::ChainedOptimizer& opt,
                                                         const model::DistributedDataParallel& ddp,
                                                         const model::LoadReport& load) {
  std::vector<UninitializedSlice> out;
  for (size_t i = 0; i < opt.size(); ++i) {
    const std::string prefix = opt.size() > 1 ? fmt::format("chained_{}.", i) : "";
    uninitialized_after_load_part(opt.part(i), ddp, load, prefix, out);
  }
  return out;
}

}  // namespace ckptsim::sim
