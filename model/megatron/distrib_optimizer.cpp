#include "model/megatron/distrib_optimizer.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/errors.h"
#include "model/faults.h"
#include "model/megatron/chained_optimizer.h"
#include "model/megatron/dict_utils.h"
#include "model/megatron/mapping.h"
#include "model/megatron/optimizer_key.h"
#include "model/py/host_tensor.h"

namespace ckptsim::model {

namespace {

constexpr const char* kFile = "distrib_optimizer.py";

std::string site(const char* function) { return std::string(kFile) + " " + function; }

// Megatron's param_group_identifier_keys: POST's four; HEAD's (switch
// group_identity_by_override_keys) are ParamGroupOverride's fields in sorted order, then the
// three structural flags (d98e8a64dd optimizer.py:136-149).
const std::vector<std::string>& identifier_keys(bool override_keys) {
  static const std::vector<std::string> post = {"wd_mult", "lr_mult", "is_expert_parallel",
                                                "is_decoupled_lr"};
  static const std::vector<std::string> head = {
      "end_wd",         "max_lr",  "min_lr",  "optimizer",
      "start_wd",       "wd_mult", "lr_mult", "is_expert_parallel",
      "is_decoupled_lr"};
  return override_keys ? head : post;
}

// load_state_dict's make_needed_groups(): the identity tuple of a group. A key missing (as
// itself and as pre_<key>) is a ValueError at POST, None at HEAD.
std::vector<Value> make_needed_groups(const Dict& param_group, bool override_keys) {
  std::vector<Value> out;
  for (const std::string& key : identifier_keys(override_keys)) {
    if (const Value* v = param_group.find(key)) {
      out.push_back(*v);
    } else if (const Value* pre = param_group.find("pre_" + key)) {
      out.push_back(*pre);
    } else if (override_keys) {
      out.emplace_back();
    } else {
      throw UpstreamError("ValueError",
                          fmt::format("Key {} (or pre_{}) not found in param_group {}.", key, key,
                                      Value(param_group.copy()).repr()),
                          site("load_state_dict() make_needed_groups"));
    }
  }
  return out;
}

bool same_identity(const std::vector<Value>& a, const std::vector<Value>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!py_equal(a[i], b[i])) return false;
  }
  return true;
}

std::string identity_repr(const std::vector<Value>& t) { return Value::tuple(t).repr(); }

std::string size_repr(const at::Tensor& t) {
  std::string out = "torch.Size([";
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (i) out += ", ";
    out += std::to_string(t.size(i));
  }
  return out + "])";
}

}  // namespace

double py_item(const at::Tensor& t) {
  if (t.numel() != 1) {
    throw UpstreamError(
        "RuntimeError",
        fmt::format("a Tensor with {} elements cannot be converted to Scalar", t.numel()),
        "Tensor.item()");
  }
  return host::item(t);
}

void py_copy_(const at::Tensor& dst, const at::Tensor& src) {
  try {
    host::copy_(dst, src);
  } catch (const c10::Error& e) {
    throw UpstreamError("RuntimeError", e.what_without_backtrace(), "Tensor.copy_()");
  }
}

// ---------------------------------------------------------------------------------------------

DistributedOptimizer::DistributedOptimizer(
    Runtime& rt, DistributedDataParallel& ddp, const OptimizerConfig& config,
    const RevisionSwitches& switches, const std::vector<std::pair<double, double>>& world_groups,
    bool expert)
    : rt_(rt),
      ddp_(ddp),
      dp_group_(ddp.group_of(expert)),
      config_(config),
      switches_(switches),
      expert_(expert) {
  // The rank in the model-parallel group (spec §1); the expert part's is its rank in the expert
  // TP x EP x PP group (__init__.py: expt_tp_pp_group), the EP rank here.
  data_parallel_group_idx_ = expert ? ddp.mp().expert_view().data_parallel_group_idx()
                                    : ddp.mp().data_parallel_group_idx();
  build_param_groups(world_groups);
  // Model grad buffer ranges (__init__): per buffer, per bucket, this rank's shard.
  const int64_t dp = dp_group_.size();
  const int64_t rank = dp_group_.rank();
  per_bucket_numel_ = Value(List::make());
  per_bucket_numel_unpadded_ = Value(List::make());
  param_range_maps_.assign(ddp_.num_params(), std::nullopt);
  for (const ParamAndGradBuffer& buffer : ddp_.buffers(expert_)) {
    auto numel = List::make();
    auto unpadded = List::make();
    std::vector<BucketShard> shards;
    for (size_t b = 0; b < buffer.layout.buckets.size(); ++b) {
      numel->append(Value(buffer.layout.buckets[b].numel));
      unpadded->append(Value(buffer.layout.buckets[b].numel_unpadded));
      shards.push_back(build_bucket_shard(buffer.layout, b, rank, dp));
      for (const auto& [local_index, rm] : shards.back().param_map) {
        param_range_maps_[buffer.params.at(local_index)] = rm;
      }
    }
    per_bucket_numel_.list()->append(dict_value({{buffer.dtype_key(), Value(numel)}}));
    per_bucket_numel_unpadded_.list()->append(dict_value({{buffer.dtype_key(), Value(unpadded)}}));
    gbuf_ranges_.push_back(std::move(shards));
  }
  build_optimizer_group_ranges();
  build_model_and_main_param_groups();
  create_inner_optimizer();
}

namespace {

// param_group_override_to_tuple() of the config override that puts a param in its group (the
// one the replay runner passes, config.h ParamSpec): {wd_mult: w} when w != 1, {lr_mult: m,
// max_lr: lr*m, min_lr: min_lr*m} when m != 1, its items sorted by name; nullopt (None) for a
// param no override matches.
using OverrideTuple = std::optional<std::vector<std::pair<std::string, double>>>;

OverrideTuple override_tuple(const ParamSpec& s, double lr, double min_lr) {
  std::vector<std::pair<std::string, double>> items;
  if (s.lr_mult != 1.0) {
    items = {{"lr_mult", s.lr_mult}, {"max_lr", lr * s.lr_mult}, {"min_lr", min_lr * s.lr_mult}};
  }
  if (s.wd_mult != 1.0) items.emplace_back("wd_mult", s.wd_mult);
  if (items.empty()) return std::nullopt;
  std::sort(items.begin(), items.end());
  return items;
}

// _get_param_groups' sort key, (x[0] is not None, x[0]): None first, then the tuples as Python
// orders them, item by item ((name, value) pairs: name first), a prefix before what it starts.
bool override_sorts_before(const OverrideTuple& a, const OverrideTuple& b) {
  if (!a.has_value() || !b.has_value()) return !a.has_value() && b.has_value();
  return std::lexicographical_compare(a->begin(), a->end(), b->begin(), b->end());
}

}  // namespace

// Mirrors megatron/core/optimizer/__init__.py _get_param_groups(): one group per distinct
// (wd_mult, lr_mult) (is_expert_parallel and is_decoupled_lr are false here) that a param of this
// rank or a group of `world_groups` has (the all_gather_object that aligns the ranks' groups,
// HEAD :361-369, every revision :177-185), sorted as every revision sorts them: None first, then
// by the override tuple (POST/RX __init__.py:189, HEAD :374). The order decides which params the
// HybridDeviceOptimizer's greedy offload puts on its CPU part (get_sub_optimizer_param_groups
// walks the groups in order).
void DistributedOptimizer::build_param_groups(
    const std::vector<std::pair<double, double>>& world_groups) {
  std::vector<std::pair<double, double>> mults;  // per distinct group, in order of appearance
  const auto group_of = [&](const std::pair<double, double>& m) {
    const auto it = std::find(mults.begin(), mults.end(), m);
    if (it != mults.end()) return static_cast<size_t>(it - mults.begin());
    mults.push_back(m);
    return mults.size() - 1;
  };
  std::vector<size_t> appearance(ddp_.num_params(), 0);
  for (size_t i = 0; i < ddp_.num_params(); ++i) {
    if (ddp_.is_expert(i) != expert_) continue;  // the other part's
    appearance[i] = group_of({ddp_.specs()[i].wd_mult, ddp_.specs()[i].lr_mult});
  }
  for (const auto& m : world_groups) group_of(m);
  std::vector<OverrideTuple> keys;
  for (const auto& [wd_mult, lr_mult] : mults) {
    ParamSpec s;
    s.wd_mult = wd_mult;
    s.lr_mult = lr_mult;
    keys.push_back(override_tuple(s, config_.adam.lr, config_.min_lr));
  }
  std::vector<size_t> order(mults.size());
  for (size_t g = 0; g < order.size(); ++g) order[g] = g;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return override_sorts_before(keys[a], keys[b]); });
  std::vector<size_t> rank_of(order.size());
  for (size_t g = 0; g < order.size(); ++g) rank_of[order[g]] = g;
  for (size_t g : order) {
    const auto [wd_mult, lr_mult] = mults[g];
    // The schedule's keys as _get_param_groups sets them: max_lr the config's lr and
    // min_lr its min_lr, both times lr_mult (the override that makes a group with that
    // lr_mult, config.h ParamSpec); default_config false when the override names an lr key.
    // Upstream HEAD identifies a group at load by max_lr and min_lr too (switch
    // group_identity_by_override_keys).
    param_groups_.push_back(Dict::make({{"params", Value(List::make())},
                                        {"wd_mult", Value(wd_mult)},
                                        {"lr_mult", Value(lr_mult)},
                                        {"is_expert_parallel", Value(expert_)},
                                        {"is_decoupled_lr", Value(false)},
                                        {"default_config", Value(lr_mult == 1.0)},
                                        {"max_lr", Value(config_.adam.lr * lr_mult)},
                                        {"min_lr", Value(config_.min_lr * lr_mult)}}));
  }
  world_param_group_map_.assign(ddp_.num_params(), 0);
  for (size_t i = 0; i < ddp_.num_params(); ++i) {
    if (ddp_.is_expert(i) != expert_) continue;
    const size_t g = rank_of[appearance[i]];
    param_groups_[g]->at("params").list()->append(Value(ddp_.param(i)));
    world_param_group_map_[i] = g;
  }
}

// Mirrors _build_optimizer_group_ranges().
void DistributedOptimizer::build_optimizer_group_ranges() {
  model_param_group_index_map_.assign(ddp_.num_params(), std::nullopt);
  opt_group_ranges_.assign(param_groups_.size(), GroupRange{});
  for (size_t b = 0; b < gbuf_ranges_.size(); ++b) {
    for (const BucketShard& shard : gbuf_ranges_[b]) {
      for (const auto& [local_index, rm] : shard.param_map) {
        const size_t p = ddp_.buffers(expert_)[b].params.at(local_index);
        const size_t g = world_param_group_map_[p];
        opt_group_ranges_[g].params.push_back(p);
        model_param_group_index_map_[p] = std::make_pair(g, opt_group_ranges_[g].params.size() - 1);
      }
    }
  }
  for (size_t g = 0; g < opt_group_ranges_.size(); ++g)
    opt_group_ranges_[g].orig_group = param_groups_[g];
}

std::optional<size_t> DistributedOptimizer::model_param_of(
    const at::Tensor& shard_or_main_param) const {
  const size_t* p = shard_owner_.find(shard_or_main_param);
  return p != nullptr ? std::optional<size_t>(*p) : std::nullopt;
}

const ParamRangeMap& DistributedOptimizer::range_map(size_t model_param) const {
  const auto& rm = param_range_maps_.at(model_param);
  CKPTSIM_CHECK(rm.has_value(), "model param has no range on this rank");
  return *rm;
}

// Mirrors _build_model_and_main_param_groups().
void DistributedOptimizer::build_model_and_main_param_groups() {
  for (GroupRange& group_range : opt_group_ranges_) {
    std::vector<size_t> model_float16;
    std::vector<size_t> model_fp32;
    std::vector<at::Tensor> shard_float16;
    std::vector<at::Tensor> shard_fp32;
    std::vector<at::Tensor> shard_fp32_from_float16;
    for (size_t p : group_range.params) {
      const Range& pr = range_map(p).param;
      const at::Tensor& model_param = ddp_.param(p);
      // model_param.detach().view(-1)[param_range.start:param_range.end]
      at::Tensor shard_model_param =
          host::narrow(host::view_flat(model_param), pr.start, pr.size());
      if (model_param.scalar_type() == at::kBFloat16) {
        at::Tensor shard_main_param;
        if (!precision_aware()) {
          shard_main_param = rt_.to(rt_.clone(shard_model_param), at::kFloat, Device::kCuda);
          shard_owner_.set(shard_main_param, p);
        }
        model_float16.push_back(p);
        shard_float16.push_back(shard_model_param);
        shard_fp32_from_float16.push_back(shard_main_param);
      } else {
        model_fp32.push_back(p);
        shard_fp32.push_back(shard_model_param);
        // Revision switch fp32_shards_detached: upstream's fp32 shard is a view of the param
        // (which requires grad), so a non-leaf that requires grad; RX detaches it first.
        if (!switches_.fp32_shards_detached) grad_views_.set(shard_model_param, true);
      }
      shard_owner_.set(shard_model_param, p);
    }
    std::vector<at::Tensor> installed = shard_fp32;
    const auto& second = precision_aware() ? shard_float16 : shard_fp32_from_float16;
    installed.insert(installed.end(), second.begin(), second.end());
    group_range.orig_group->set("params", params_list(installed));

    // Revision switch group_index_map_installed_order (B8 fix, upstream dev #5835): record
    // each param's position in the installed [fp32..., bf16...] list instead of gbuf order.
    if (switches_.group_index_map_installed_order) {
      for (size_t i = 0; i < model_fp32.size(); ++i)
        model_param_group_index_map_[model_fp32[i]]->second = i;
      for (size_t i = 0; i < model_float16.size(); ++i) {
        model_param_group_index_map_[model_float16[i]]->second = model_fp32.size() + i;
      }
    }
    model_float16_groups_.push_back(std::move(model_float16));
    model_fp32_groups_.push_back(std::move(model_fp32));
    shard_float16_groups_.push_back(std::move(shard_float16));
    shard_fp32_groups_.push_back(std::move(shard_fp32));
    shard_fp32_from_float16_groups_.push_back(std::move(shard_fp32_from_float16));
  }
}

void DistributedOptimizer::create_inner_optimizer() {
  std::vector<DictPtr> groups;
  for (const GroupRange& g : opt_group_ranges_) groups.push_back(g.orig_group);
  const Value betas = Value::tuple({Value(config_.adam.beta1), Value(config_.adam.beta2)});
  auto adam_defaults = [&] {
    return Dict::make({{"lr", Value(config_.adam.lr)},
                       {"weight_decay", Value(config_.adam.weight_decay)},
                       {"betas", betas},
                       {"eps", Value(config_.adam.eps)}});
  };
  switch (config_.kind) {
    case OptimizerKind::kFusedAdam: {
      // get_megatron_optimizer: TE Adam(params, lr, weight_decay, betas, eps, adam_w_mode=True),
      // precision-aware: plus exp_avg_dtype, exp_avg_sq_dtype, master_weights=True,
      // use_decoupled_grad=True, master_weight_dtype (fp32) and, TE >= 2.1,
      // store_param_remainders (POST __init__.py:365-387, HEAD :564-588).
      FusedAdamOptions options;
      if (config_.precision_aware) {
        options.master_weights = true;
        options.use_decoupled_grad = true;
        options.exp_avg_dtype = config_.exp_avg_dtype;
        options.exp_avg_sq_dtype = config_.exp_avg_sq_dtype;
        options.store_param_remainders = config_.store_param_remainders;
      }
      optimizer_ = std::make_unique<FusedAdam>(rt_, groups, adam_defaults(), options);
      optimizer_->load_state_dict(optimizer_->state_dict());
      break;
    }
    case OptimizerKind::kTorchAdamW:
      optimizer_ = std::make_unique<TorchAdamW>(rt_, groups, adam_defaults());
      optimizer_->load_state_dict(optimizer_->state_dict());
      break;
    case OptimizerKind::kHybrid: {
      // get_megatron_optimizer's HybridDeviceOptimizer defaults, rebuilt over the shard groups.
      auto defaults = Dict::make({
          {"offload_fraction", Value(config_.offload_fraction)},
          // get_megatron_optimizer: gpu_optimizer_cls is TE's Adam, or torch AdamW without TE.
          {"cpu_optimizer_cls", Value::symbol(kTorchAdamWClassRepr)},
          {"gpu_optimizer_cls",
           Value::symbol(config_.te_installed ? kFusedAdamClassRepr : kTorchAdamWClassRepr)},
          {"param_update_in_fp32", Value(true)},
          {"pin_cpu_grads", Value(true)},
          {"pin_cpu_params", Value(true)},
          {"overlap_cpu_optimizer_d2h_h2d", Value(config_.overlap_cpu_optimizer_d2h_h2d)},
          {"lr", Value(config_.adam.lr)},
          {"weight_decay", Value(config_.adam.weight_decay)},
          {"betas", betas},
          {"eps", Value(config_.adam.eps)},
          {"bias_correction", Value(true)},
          {"fused", Value(true)},
      });
      // torch's Optimizer.add_param_group (through HybridDeviceOptimizer.__init__) refuses a
      // param that is not a leaf: an upstream fp32 shard view.
      for (const DictPtr& g : groups) {
        for (const at::Tensor& p : group_params(*g)) {
          if (grad_views_.contains(p)) {
            throw UpstreamError("ValueError", "can't optimize a non-leaf Tensor",
                                "hybrid_optimizer.py __init__()");
          }
        }
      }
      optimizer_ = std::make_unique<HybridDeviceOptimizer>(rt_, groups, defaults, switches_);
      break;
    }
  }
}

at::Tensor DistributedOptimizer::optimizer_param(size_t model_param) {
  const auto& gi = model_param_group_index_map_.at(model_param);
  CKPTSIM_CHECK(gi.has_value(), "model param has no optimizer param on this rank");
  const auto& [g, o] = *gi;
  const Value& params = optimizer_->param_groups->at(g).dict()->at("params");
  return params.list()->at(o).tensor();
}

// ---------------------------------------------------------------------------------------------
// Training.

void DistributedOptimizer::step() {
  // _copy_model_grads_to_main_grads.
  auto copy_group_grads = [&](const std::vector<std::vector<size_t>>& model_groups,
                              const std::vector<std::vector<at::Tensor>>& shard_groups) {
    for (size_t g = 0; g < model_groups.size(); ++g) {
      for (size_t i = 0; i < model_groups[g].size(); ++i) {
        const size_t p = model_groups[g][i];
        const Range& pr = range_map(p).param;
        const at::Tensor& shard_main_param = shard_groups[g][i];
        CKPTSIM_CHECK(pr.size() == shard_main_param.numel(), "param range size != shard size");
        at::Tensor shard_model_grad = host::narrow(ddp_.main_grad(p), pr.start, pr.size());
        // Precision-aware: .decoupled_grad, which torch optimizers and a FusedAdam built without
        // use_decoupled_grad never read; otherwise .grad = grad.float(), the same view since
        // grads are fp32.
        if (precision_aware())
          rt_.set_decoupled_grad(shard_main_param, shard_model_grad);
        else
          rt_.set_grad(shard_main_param, shard_model_grad);
      }
    }
  };
  if (precision_aware()) {
    copy_group_grads(model_float16_groups_, shard_float16_groups_);
  } else {
    copy_group_grads(model_float16_groups_, shard_fp32_from_float16_groups_);
  }
  copy_group_grads(model_fp32_groups_, shard_fp32_groups_);

  optimizer_->step();

  // _copy_main_params_to_model_params (precision-aware optimizers write the params themselves).
  if (!precision_aware()) {
    for (size_t g = 0; g < model_float16_groups_.size(); ++g) {
      for (size_t i = 0; i < model_float16_groups_[g].size(); ++i) {
        py_copy_(shard_float16_groups_[g][i], shard_fp32_from_float16_groups_[g][i]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// state_dict / load_state_dict.

std::optional<double> DistributedOptimizer::hdo_step_for_state_dict() {
  HybridDeviceOptimizer* h = mutable_hdo();
  for (Optimizer* sub : h->sub_optimizers()) {
    if (dynamic_cast<TorchAdamW*>(sub) == nullptr) continue;
    if (sub->state.empty()) continue;
    std::vector<double> steps;
    for (const auto& [p, s] : sub->state) {
      const double v = py_item(s->at("step", "DistributedOptimizer.state_dict()").tensor());
      if (std::find(steps.begin(), steps.end(), v) == steps.end()) steps.push_back(v);
    }
    if (steps.size() != 1) {
      throw PyAssertionError(fmt::format("steps: {} distinct values", steps.size()),
                             site("state_dict()"));
    }
    return steps[0];
  }
  // Revision switch hdo_step_source (B6 fix): with no CPU AdamW state, take the GPU
  // FusedAdam's group step so that offload_fraction=0 still saves it.
  if (switches_.hdo_step_source == HdoStepSource::kAnySubOptimizer && h->gpu_optimizer) {
    std::vector<int64_t> steps;
    for (const Value& gv : *h->gpu_optimizer->param_groups) {
      const Dict& g = *gv.dict();
      if (g.at("params").list()->empty() || !g.contains("step")) continue;
      const int64_t v = g.at("step").as_int();
      if (std::find(steps.begin(), steps.end(), v) == steps.end()) steps.push_back(v);
    }
    if (steps.size() > 1) {
      throw PyAssertionError(fmt::format("steps: {} distinct values", steps.size()),
                             site("state_dict()"));
    }
    if (steps.size() == 1) return static_cast<double>(steps[0]);
  }
  return std::nullopt;
}

Value DistributedOptimizer::state_dict() {
  const Value inner = optimizer_->state_dict();
  std::optional<double> step;
  if (!have_apex_or_te()) {
    std::vector<double> steps;
    for (const auto& [k, s] : *inner.dict()->at("state").dict()) {
      const double v = py_item(s.dict()->at("step", "DistributedOptimizer.state_dict()").tensor());
      if (std::find(steps.begin(), steps.end(), v) == steps.end()) steps.push_back(v);
    }
    if (steps.size() == 1) {
      step = steps[0];
    } else if (!(steps.empty() && switches_.pure_torch_state_dict_allows_empty_state)) {
      // `assert len(steps) == 1`: also fails on a fresh optimizer whose state is empty.
      throw PyAssertionError(
          fmt::format(
              "assert len(steps) == 1 failed: {} distinct per-param steps{}", steps.size(),
              steps.empty() ? " (the optimizer state is empty: nothing has stepped yet)" : ""),
          site("state_dict()"));
    }
  } else if (hdo() != nullptr) {
    step = hdo_step_for_state_dict();
  } else {
    std::vector<int64_t> steps;
    for (const Value& gv : *inner.dict()->at("param_groups").list()) {
      const Dict& g = *gv.dict();
      if (g.at("params").list()->empty() || !g.contains("step")) continue;
      const int64_t v = g.at("step").as_int();
      if (std::find(steps.begin(), steps.end(), v) == steps.end()) steps.push_back(v);
    }
    if (steps.size() > 1)
      throw PyAssertionError(fmt::format("steps: {} values", steps.size()), site("state_dict()"));
    if (steps.size() == 1) step = static_cast<double>(steps[0]);
  }

  auto optimizer_sd = Dict::make();
  for (const auto& [k, v] : *inner.dict()) {
    if (!(k == Key("state"))) optimizer_sd->set(k, v);
  }
  for (Value& gv : *optimizer_sd->at("param_groups").list()) {
    Dict& g = *gv.dict();
    g.pop("params");
    if (!have_apex_or_te()) {
      g.set("step", step.has_value() ? Value(*step) : Value());
    } else if (step.has_value()) {
      g.set("step", Value(static_cast<int64_t>(*step)));
    }
    // Revision switch state_dict_drops_none_step (RX-MILES 714-715).
    if (switches_.state_dict_drops_none_step && g.contains("step") && g.at("step").is_none()) {
      g.erase("step");
    }
  }
  return dict_value({{"optimizer", Value(optimizer_sd)}});
}

// load_state_dict's param_groups_map: each saved group by its identity tuple (a later group
// with the same identity wins, as a Python dict assignment does).
DistributedOptimizer::SavedGroups DistributedOptimizer::saved_param_groups(const Dict& sd,
                                                                           bool override_keys) {
  SavedGroups param_groups_map;
  for (const Value& gv : *sd.at("optimizer").dict()->at("param_groups").list()) {
    auto needed = make_needed_groups(*gv.dict(), override_keys);
    auto it = std::find_if(param_groups_map.begin(), param_groups_map.end(),
                           [&](const auto& e) { return same_identity(e.first, needed); });
    if (it != param_groups_map.end()) {
      it->second = gv.dict();
    } else {
      param_groups_map.emplace_back(std::move(needed), gv.dict());
    }
  }
  return param_groups_map;
}

// Each live group with the saved group of the same identity: the saved scalars (incl. 'step')
// win, the live 'params' stay. A live group no saved one matches is the KeyError of
// `param_groups_map[needed_groups]` (HEAD distrib_optimizer.py:970): str() of a KeyError of a
// tuple is the tuple's repr.
ListPtr DistributedOptimizer::matched_param_groups(const SavedGroups& param_groups_map,
                                                   const Value& inner_state_dict,
                                                   bool override_keys) {
  auto state_dict_param_groups = List::make();
  for (const Value& gv : *inner_state_dict.dict()->at("param_groups").list()) {
    const auto needed = make_needed_groups(*gv.dict(), override_keys);
    auto it = std::find_if(param_groups_map.begin(), param_groups_map.end(),
                           [&](const auto& e) { return same_identity(e.first, needed); });
    if (it == param_groups_map.end())
      throw PyKeyError(identity_repr(needed), site("load_state_dict()"));
    DictPtr g = it->second->copy();
    g->set("params", gv.dict()->at("params"));
    state_dict_param_groups->append(Value(g));
  }
  return state_dict_param_groups;
}

// The state of an optimizer that never stepped: torch.empty tensors keyed by state order, as
// load_state_dict allocates them for the real data to be copied in later.
Value DistributedOptimizer::dummy_state(const Value& inner_state_dict) {
  std::vector<std::pair<int64_t, DictPtr>> entries;
  for (size_t b = 0; b < gbuf_ranges_.size(); ++b) {
    for (const BucketShard& shard : gbuf_ranges_[b]) {
      for (const auto& [local_index, rm] : shard.param_map) {
        const size_t p = ddp_.buffers(expert_)[b].params.at(local_index);
        const auto& [g, o] = *model_param_group_index_map_.at(p);
        const int64_t state_order = inner_state_dict.dict()
                                        ->at("param_groups")
                                        .list()
                                        ->at(g)
                                        .dict()
                                        ->at("params")
                                        .list()
                                        ->at(o)
                                        .as_int();
        const int64_t numel = rm.gbuf_world.size();
        // The states in the config's dtypes (POST :797-798; HEAD _get_state_key_dtype); a
        // precision-aware master int16 where store_param_remainders and bf16 (the config's
        // flag: every param, fp32 ones included), else main_params_dtype (fp32).
        const auto state_type = [](StateDType d) {
          return d == StateDType::kBFloat16  ? at::kBFloat16
                 : d == StateDType::kFloat16 ? at::kHalf
                                             : at::kFloat;
        };
        auto tensors = Dict::make(
            {{"exp_avg",
              Value(rt_.empty({numel}, state_type(config_.exp_avg_dtype), Device::kCuda))},
             {"exp_avg_sq",
              Value(rt_.empty({numel}, state_type(config_.exp_avg_sq_dtype), Device::kCuda))}});
        if (precision_aware()) {
          const bool remainders = config_.store_param_remainders && te_precision_aware();
          tensors->set(
              "master_param",
              Value(rt_.empty({numel}, remainders ? at::kShort : at::kFloat, Device::kCuda)));
        }
        entries.emplace_back(state_order, tensors);
      }
    }
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  auto d = Dict::make();
  for (const auto& [order, tensors] : entries) d->set(order, Value(tensors));
  return Value(d);
}

// The saved step, put into the state to be loaded: pure torch gives every entry one shared
// tensor (B9), HDO a clone per entry of its own state.
void DistributedOptimizer::restore_step(const Dict& sd, Value& state_dict_state) {
  if (!have_apex_or_te()) {
    // Pure torch: one distinct step over the saved groups, one tensor shared by every entry (B9).
    std::vector<Value> steps;
    const bool tolerant = switches_.pure_torch_state_dict_allows_empty_state;
    for (const Value& gv : *sd.at("optimizer").dict()->at("param_groups").list()) {
      const Dict& g = *gv.dict();
      if (tolerant && (!g.contains("step") || g.at("step").is_none())) continue;
      const Value& v = g.at("step", "distrib_optimizer.py load_state_dict() g['step']");
      if (std::none_of(steps.begin(), steps.end(), [&](const Value& s) { return py_equal(s, v); }))
        steps.push_back(v);
    }
    if (tolerant && steps.empty()) {
      // No step saved (nothing had stepped): every entry gets a fresh step of 0, as AdamW's
      // own state initialization would give it.
      for (auto& [k, s] : *state_dict_state.dict()) {
        if (!s.dict()->contains("step"))
          s.dict()->set("step", Value(rt_.scalar_tensor(0.0, at::kFloat, Device::kCpu)));
      }
    } else {
      if (steps.size() != 1) {
        throw PyAssertionError(
            fmt::format(
                "assert len(steps) == 1 failed: {} distinct steps in the saved param groups",
                steps.size()),
            site("load_state_dict()"));
      }
      if (steps[0].is_none()) {
        throw UpstreamError("RuntimeError", "Could not infer dtype of NoneType", "torch.tensor()");
      }
      const at::Tensor step = rt_.scalar_tensor(steps[0].as_float(), at::kFloat, Device::kCpu);
      for (auto& [k, s] : *state_dict_state.dict()) {
        // Revision switch pure_torch_load_clones_step (B9 fix).
        s.dict()->set("step",
                      Value(switches_.pure_torch_load_clones_step ? rt_.clone(step) : step));
      }
    }
  } else if (HybridDeviceOptimizer* h = mutable_hdo()) {
    std::vector<Value> steps;
    for (const Value& gv : *sd.at("optimizer").dict()->at("param_groups").list()) {
      const Dict& g = *gv.dict();
      if (!g.contains("step")) continue;
      const Value& v = g.at("step");
      if (std::none_of(steps.begin(), steps.end(), [&](const Value& s) { return py_equal(s, v); }))
        steps.push_back(v);
    }
    if (!steps.empty()) {
      if (steps.size() != 1)
        throw PyAssertionError(fmt::format("steps: {} values", steps.size()),
                               site("load_state_dict()"));
      const at::Tensor step = rt_.scalar_tensor(steps[0].as_float(), at::kFloat, Device::kCpu);
      for (auto& [p, v] : h->state) v->set("step", Value(rt_.clone(step)));
    }
  }
}

void DistributedOptimizer::reload_model_params() {
  if (optimizer_->param_groups->empty() || rt_.fault(fault::kReloadSkipsModelParams)) return;
  if (HybridDeviceOptimizer* h = mutable_hdo()) {
    h->update_fp32_param_by_new_param();
    return;
  }
  // TE's FusedAdam holds the masters (POST :2558-2559, HEAD :3096-3097): nothing to copy.
  if (te_precision_aware()) return;
  const auto copy_group_params = [&](const std::vector<std::vector<size_t>>& model_groups,
                                     const std::vector<std::vector<at::Tensor>>& main_groups) {
    for (size_t g = 0; g < model_groups.size(); ++g) {
      for (size_t i = 0; i < model_groups[g].size(); ++i) {
        const size_t p = model_groups[g][i];
        const Range& pr = range_map(p).param;
        const at::Tensor& shard_main_param = main_groups[g][i];
        CKPTSIM_CHECK(pr.size() == shard_main_param.numel(), "param range size != shard size");
        shard_main_param.copy_(ddp_.param(p).view(-1).narrow(0, pr.start, pr.size()));
      }
    }
  };
  copy_group_params(model_float16_groups_, shard_fp32_from_float16_groups_);
  copy_group_params(model_fp32_groups_, shard_fp32_groups_);
}

void DistributedOptimizer::load_state_dict(const Value& state_dict) {
  const Dict& sd = *state_dict.dict();
  if (optimizer_->state.empty()) {
    if (HybridDeviceOptimizer* h = mutable_hdo()) h->dummy_step();
  }
  // Revision switch group_identity_by_override_keys (HEAD's param_group_identifier_keys).
  const bool override_keys = switches_.group_identity_by_override_keys;
  const SavedGroups saved_groups = saved_param_groups(sd, override_keys);
  const Value inner_state_dict = optimizer_->state_dict();
  const ListPtr state_dict_param_groups =
      matched_param_groups(saved_groups, inner_state_dict, override_keys);
  if (optimizer_->state.empty()) state_allocated_by_torch_empty_ = true;
  Value state_dict_state = optimizer_->state.empty() ? dummy_state(inner_state_dict)
                                                     : inner_state_dict.dict()->at("state");
  restore_step(sd, state_dict_state);
  try {
    optimizer_->load_state_dict(dict_value(
        {{"state", state_dict_state}, {"param_groups", Value(state_dict_param_groups)}}));
  } catch (const c10::Error& e) {
    // torch's or TE's own code raised; the innermost Megatron frame is this one.
    throw UpstreamError("RuntimeError", e.what_without_backtrace(), site("load_state_dict()"));
  }

  if (const Value* param_state = sd.find("param_state")) {
    const Value* type = sd.find("param_state_sharding_type");
    if (type == nullptr)
      throw PyAssertionError("assert 'param_state_sharding_type' in state_dict failed",
                             site("load_state_dict()"));
    const std::optional<ShardingType> t =
        type->is_str() ? parse_sharding_type(type->as_str()) : std::nullopt;
    if (!t.has_value()) {
      throw UpstreamError(
          "NotImplementedError",
          "Unknown sharding_type: " + (type->is_str() ? type->as_str() : type->repr()),
          site("load_state_dict()"));
    }
    switch (*t) {
      case ShardingType::kDpZeroGatherScatter:
        load_parameter_state_from_dp_zero(*param_state);
        break;
      case ShardingType::kFullyReshardable:
        load_parameter_state_from_fully_reshardable(*param_state);
        break;
      case ShardingType::kDpReshardable:
        load_parameter_state_from_dp_reshardable(*param_state);
        break;
      case ShardingType::kFullyShardedModelSpace:
        load_parameter_state_from_fs_model_space(*param_state);
        break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// _get / _set.

DictPtr DistributedOptimizer::get_main_param_and_optimizer_states(size_t model_param) {
  const at::Tensor x = optimizer_param(model_param);
  auto tensors = Dict::make();
  if (precision_aware()) {
    // HDO: raw live objects of HDO.state[X] (state is a defaultdict: a miss inserts {}); TE's
    // FusedAdam: get_unscaled_state of each (fp32, int16 remainders, or a new unscaled copy).
    DictPtr& s = optimizer_->state.get_or_insert(x, [] { return Dict::make(); });
    auto* fused = dynamic_cast<FusedAdam*>(optimizer_.get());
    for (const auto& [k, v] : *s) {
      // Revision switch get_drops_non_tensors (HEAD:1097-1110).
      if (switches_.get_drops_non_tensors && !v.is_tensor()) continue;
      tensors->set(k, fused != nullptr ? Value(fused->get_unscaled_state(x, k.str())) : v);
    }
    tensors->set("param",
                 tensors->pop("master_param",
                              "distrib_optimizer.py _get_main_param_and_optimizer_states()"));
    return tensors;
  }
  tensors->set("param", Value(x));
  DictPtr& s = optimizer_->state.get_or_insert(x, [] { return Dict::make(); });
  for (const auto& [k, v] : *s) tensors->set(k, v);
  return tensors;
}

void DistributedOptimizer::set_main_param_and_optimizer_states(size_t model_param,
                                                               const Dict& tensors, bool no_grad) {
  const at::Tensor x = optimizer_param(model_param);
  if (auto* fused = dynamic_cast<FusedAdam*>(optimizer_.get()); fused && te_precision_aware()) {
    for (const auto& [k, v] : tensors) {
      // Revision switch set_skips_non_tensors (HEAD); POST hands 'padding': False to TE too.
      if (switches_.set_skips_non_tensors && !v.is_tensor()) continue;
      if (!v.is_tensor()) {
        throw UpstreamError("AttributeError",
                            "'" + v.type_name() + "' object has no attribute 'dtype'",
                            "fused_adam.py FusedAdam.set_scaled_state()");
      }
      fused->set_scaled_state(x, k == Key("param") ? "master_param" : k.str(), v.tensor());
    }
    return;
  }
  if (precision_aware()) {
    DictPtr& s = optimizer_->state.get_or_insert(x, [] { return Dict::make(); });
    for (const auto& [k, v] : tensors) {
      // Revision switch set_skips_non_tensors (HEAD; POST assigns 'padding': False, B13).
      if (switches_.set_skips_non_tensors && !v.is_tensor()) continue;
      if (switches_.set_skips_step && k == Key("step")) continue;
      // Assignment, not a copy: the request's objects become the live state (spec §6).
      s->set(k == Key("param") ? Key("master_param") : k, v);
    }
    return;
  }
  DictPtr& s = optimizer_->state.get_or_insert(x, [] { return Dict::make(); });
  std::vector<std::pair<Key, Value>> dst = {{Key("param"), Value(x)}};
  for (const auto& [k, v] : *s) dst.emplace_back(k, v);
  for (const auto& [key, d] : dst) {
    if (switches_.set_skips_step && key == Key("step")) continue;
    const Value* src = tensors.find(key);
    if (src == nullptr)
      throw PyKeyError(key.repr(), site("_set_main_param_and_optimizer_states()"));
    if (switches_.set_skips_non_tensors && !src->is_tensor()) continue;
    if (!d.is_tensor()) {
      throw UpstreamError("AttributeError",
                          "'" + d.type_name() + "' object has no attribute 'copy_'",
                          site("_set_main_param_and_optimizer_states()"));
    }
    if (!src->is_tensor()) {
      throw UpstreamError("TypeError",
                          "copy_(): argument 'src' must be Tensor, not " + src->type_name(),
                          site("_set_main_param_and_optimizer_states()"));
    }
    // Outside no_grad, torch refuses an in-place copy into a view of a leaf that requires grad
    // (an upstream fp32 shard).
    if (!no_grad && grad_views_.contains(d.tensor())) {
      throw UpstreamError(
          "RuntimeError",
          "a view of a leaf Variable that requires grad is being used in an in-place operation.",
          site("_set_main_param_and_optimizer_states()"));
    }
    py_copy_(d.tensor(), src->tensor());
  }
}

// ---------------------------------------------------------------------------------------------
// dp_reshardable.

Value DistributedOptimizer::get_parameter_state_dp_reshardable() {
  auto state = Dict::make({{"per_bucket_numel", per_bucket_numel_},
                           {"per_bucket_numel_unpadded", per_bucket_numel_unpadded_}});
  for (size_t b = 0; b < gbuf_ranges_.size(); ++b) {
    const ParamAndGradBuffer& buffer = ddp_.buffers(expert_)[b];
    auto buckets_state = List::make();
    for (const BucketShard& shard : gbuf_ranges_[b]) {
      auto bucket_state = List::make();
      for (const auto& [local_index, rm] : shard.param_map) {
        DictPtr tensors = get_main_param_and_optimizer_states(buffer.params.at(local_index));
        tensors->set("gbuf_local_start", Value(rm.gbuf_local.start));
        tensors->set("gbuf_local_end", Value(rm.gbuf_local.end));
        bucket_state->append(Value(tensors));
      }
      buckets_state->append(Value(bucket_state));
    }
    state->set(static_cast<int64_t>(b), dict_value({{buffer.dtype_key(), Value(buckets_state)}}));
  }
  return Value(state);
}

Value DistributedOptimizer::sharded_param_state_dp_reshardable(bool is_loading) {
  const int64_t dp_rank = dp_group_.rank();
  const int64_t dp_size = dp_group_.size();
  Value state = get_parameter_state_dp_reshardable();
  for (const char* per_bucket_key : {"per_bucket_numel", "per_bucket_numel_unpadded"}) {
    ShardedObject so;
    so.key = format_object_key(data_parallel_group_idx_, per_bucket_key);
    so.data = state.dict()->at(per_bucket_key);
    so.global_shape = {1};
    so.global_offset = {0};
    so.replica_id = {distributed_optimizer_instance_id_, 0, dp_rank};
    state.dict()->set(per_bucket_key, Value(ShardedObject::make(std::move(so))));
  }

  for (size_t gbuf_idx = 0; gbuf_idx < gbuf_ranges_.size(); ++gbuf_idx) {
    const ParamAndGradBuffer& buffer = ddp_.buffers(expert_)[gbuf_idx];
    for (auto& [dtype, buckets] : *state.dict()->at(static_cast<int64_t>(gbuf_idx)).dict()) {
      for (size_t bucket_idx = 0; bucket_idx < buckets.list()->size(); ++bucket_idx) {
        const ListPtr bucket_state = buckets.list()->at(bucket_idx).list();
        const int64_t unpadded = buffer.layout.buckets[bucket_idx].numel_unpadded;
        const int64_t numel = buffer.layout.buckets[bucket_idx].numel;
        if (!(unpadded <= numel)) {
          throw PyAssertionError("assert gbuf_world_numel_unpadded <= gbuf_world_numel failed",
                                 site("sharded_param_state_dp_reshardable()"));
        }
        if (numel % dp_size != 0) {
          throw PyAssertionError("assert gbuf_world_numel % data_parallel_world_size == 0 failed",
                                 site("sharded_param_state_dp_reshardable()"));
        }
        const OptimizerBucketKey key{data_parallel_group_idx_, static_cast<int64_t>(gbuf_idx),
                                     dtype.repr(), static_cast<int64_t>(bucket_idx), ""};
        const ShardExtent extent{dp_rank, numel / dp_size, unpadded};
        pad_bucket_state(*bucket_state, extent);
        wrap_bucket_entries(*bucket_state, key, is_loading, extent);
      }
    }
  }
  return state;
}

// One bucket's entries of sharded_param_state_dp_reshardable, padded so that they tile this
// rank's shard [0, local_numel) up to numel_unpadded.
void DistributedOptimizer::pad_bucket_state(List& bucket_state, const ShardExtent& extent) {
  if (bucket_state.empty()) {
    // Revision switch allow_empty_bucket (B12 fix): a rank whose shard holds no param
    // element writes its in-range padding (if any) instead of asserting.
    if (!switches_.allow_empty_bucket) {
      throw PyAssertionError("empty bucket encountered",
                             site("sharded_param_state_dp_reshardable()"));
    }
    // Always one entry, so that no rank's bucket list is empty: an empty list would be
    // compacted away by extract_matching_values and shift every later bucket's position.
    const int64_t in_range = std::clamp<int64_t>(
        extent.unpadded - extent.dp_rank * extent.local_numel, 0, extent.local_numel);
    auto pad = Dict::make();
    for (const char* k : {"param", "exp_avg", "exp_avg_sq"}) {
      pad->set(k, Value(rt_.empty({in_range}, at::kFloat, Device::kCuda)));
    }
    pad->set("gbuf_local_start", Value(int64_t{0}));
    pad->set("gbuf_local_end", Value(in_range));
    pad->set("padding", Value(true));
    bucket_state.append(Value(pad));
  }

  // Padding between (and around) params so the pieces tile the shard up to U.
  std::vector<std::pair<size_t, DictPtr>> all_pad_tensors;
  const auto n = static_cast<int64_t>(bucket_state.size());
  for (int64_t i = -1; i < n && n > 0; ++i) {
    const int64_t next_param_start =
        i == n - 1
            ? extent.local_numel
            : bucket_state.at(static_cast<size_t>(i + 1)).dict()->at("gbuf_local_start").as_int();
    const int64_t cur_param_end =
        i == -1 ? 0 : bucket_state.at(static_cast<size_t>(i)).dict()->at("gbuf_local_end").as_int();
    const int64_t world_param_end = extent.dp_rank * extent.local_numel + cur_param_end;
    // Fault site dp_reshardable.drop_end_padding: lose the pad after the last param.
    if (i == n - 1 && rt_.fault(fault::kDropEndPadding)) continue;
    if (next_param_start != cur_param_end && world_param_end < extent.unpadded) {
      // Python's bucket_state[-1] is the last entry: the template for the front pad.
      const Dict& templ = *bucket_state.at(static_cast<size_t>(i == -1 ? n - 1 : i)).dict();
      auto pad = Dict::make();
      for (const auto& [k, v] : templ) {
        if (!v.is_tensor()) continue;
        pad->set(k, Value(rt_.empty({next_param_start - cur_param_end}, v.tensor().scalar_type(),
                                    rt_.device_of(v.tensor()))));
      }
      pad->set("gbuf_local_start", Value(cur_param_end));
      pad->set("gbuf_local_end", Value(next_param_start));
      pad->set("padding", Value(true));
      all_pad_tensors.emplace_back(static_cast<size_t>(i + 1), pad);
    }
  }
  for (auto it = all_pad_tensors.rbegin(); it != all_pad_tensors.rend(); ++it) {
    bucket_state.insert(it->first, Value(it->second));
  }
}

// One bucket's entries as sharded_param_state_dp_reshardable wraps them: every tensor a
// ShardedTensor of the bucket key, 'padding' an LNO, 'step' as the sharded_step switch says.
void DistributedOptimizer::wrap_bucket_entries(List& bucket_state, OptimizerBucketKey bucket_key,
                                               bool is_loading, const ShardExtent& extent) {
  for (Value& entry_v : bucket_state) {
    Dict& tensors = *entry_v.dict();
    const int64_t gbuf_local_start = tensors.pop("gbuf_local_start").as_int();
    const int64_t gbuf_local_end = tensors.pop("gbuf_local_end").as_int();
    if (!tensors.contains("padding")) tensors.set("padding", Value(false));
    // Revision switch omit_step_when_loading (Fix B): the load request has no 'step'.
    if (is_loading && switches_.omit_step_when_loading) tensors.erase("step");
    for (auto& [key, value] : tensors) {
      if (key == Key("padding")) {
        value = make_nonpersistent(value);
        continue;
      }
      if (key == Key("step")) {
        // Revision switch sharded_step: the one line PR #2874 added (and RX-MILES's own).
        if (switches_.sharded_step == ShardedStepMode::kNonpersistent) {
          value = make_nonpersistent(value);
          continue;
        }
        if (switches_.sharded_step == ShardedStepMode::kRawLeaf) continue;
      }
      if (!value.is_tensor()) {
        throw UpstreamError("AttributeError",
                            "'" + value.type_name() + "' object has no attribute 'shape'",
                            site("sharded_param_state_dp_reshardable()"));
      }
      const at::Tensor& t = value.tensor();
      if (!(t.dim() == 1 && t.size(0) == gbuf_local_end - gbuf_local_start)) {
        throw PyAssertionError(
            fmt::format("({}, {}, {})", size_repr(t), gbuf_local_start, gbuf_local_end),
            site("sharded_param_state_dp_reshardable()"));
      }
      ShardedTensor st;
      bucket_key.state = key.str();
      st.key = format_bucket_key(bucket_key);
      st.data = t;
      st.dtype = t.scalar_type();
      st.local_shape = {t.size(0)};
      st.global_shape = {extent.unpadded};
      st.global_offset = {extent.dp_rank * extent.local_numel + gbuf_local_start};
      // Under allow_empty_bucket a zero-length pad of a rank past numel_unpadded sits at its
      // end.
      if (switches_.allow_empty_bucket)
        st.global_offset[0] = std::min(st.global_offset[0], extent.unpadded);
      st.axis_fragmentations = std::nullopt;
      st.replica_id = {distributed_optimizer_instance_id_, 0, 0};
      value = Value(ShardedTensor::make(std::move(st)));
    }
  }
}

void DistributedOptimizer::load_parameter_state_from_dp_reshardable(const Value& state_dict) {
  static const std::string kSite = site("load_parameter_state_from_dp_reshardable()");
  const Dict& sd = *state_dict.dict();
  if (const Value* ckpt = sd.find("per_bucket_numel_unpadded")) {
    if (!py_equal(per_bucket_numel_unpadded_, *ckpt)) {
      throw PyAssertionError(
          fmt::format(
              "Number of unpadded elements in each bucket need to be the same in current run "
              "({}) and checkpoint ({})",
              per_bucket_numel_unpadded_.repr(), ckpt->repr()),
          kSite);
    }
  }
  for (size_t gbuf_idx = 0; gbuf_idx < gbuf_ranges_.size(); ++gbuf_idx) {
    const ParamAndGradBuffer& buffer = ddp_.buffers(expert_)[gbuf_idx];
    const Dict& dtype_state = *sd.at(static_cast<int64_t>(gbuf_idx), kSite.c_str()).dict();
    for (size_t bucket_idx = 0; bucket_idx < gbuf_ranges_[gbuf_idx].size(); ++bucket_idx) {
      const BucketShard& shard = gbuf_ranges_[gbuf_idx][bucket_idx];
      const Value& buckets = dtype_state.at(buffer.dtype_key(), kSite.c_str());
      std::vector<DictPtr> entries;
      for (const Value& e : *buckets.list()->at(bucket_idx).list()) {
        if (!e.dict()->at("padding", kSite.c_str()).as_bool()) entries.push_back(e.dict());
      }
      if (entries.size() != shard.param_map.size()) {
        throw PyAssertionError(fmt::format("({}, {})", entries.size(), shard.param_map.size()),
                               kSite);
      }
      for (size_t i = 0; i < entries.size(); ++i) {
        const size_t p = buffer.params.at(shard.param_map[i].first);
        // Revision switch dp_reshardable_load_skips_step (Fix A), as the fs_model_space loader.
        if (switches_.dp_reshardable_load_skips_step) {
          DictPtr src = Dict::make();
          for (const auto& [k, v] : *entries[i]) {
            if (!(k == Key("step"))) src->set(k, v);
          }
          set_main_param_and_optimizer_states(p, *src, switches_.dp_reshardable_load_no_grad);
        } else {
          set_main_param_and_optimizer_states(p, *entries[i],
                                              switches_.dp_reshardable_load_no_grad);
        }
      }
    }
  }
  // Fault site load.perturb_exp_avg: one ulp into the first restored exp_avg on DP rank 0.
  if (dp_group_.rank() == 0 && rt_.fault(fault::kPerturbLoadedExpAvg)) {
    for (size_t p = 0; p < ddp_.num_params(); ++p) {
      if (!model_param_group_index_map_[p].has_value()) continue;
      DictPtr tensors = get_main_param_and_optimizer_states(p);
      if (const Value* m = tensors->find("exp_avg");
          m != nullptr && m->is_tensor() && m->tensor().numel() > 0) {
        at::Tensor first = m->tensor().narrow(0, 0, 1);
        const float x = first.item<float>();
        first.fill_(std::nextafter(x, x >= 0 ? 1.0F : -1.0F));
        break;
      }
    }
  }
  // Revision switch dp_reshardable_load_syncs_hdo (B11).
  if (switches_.dp_reshardable_load_syncs_hdo) {
    if (HybridDeviceOptimizer* h = mutable_hdo()) h->sync_hdo_state_to_sub_optimizers();
  }
}

// Revision switch init_empty_state_before_save, a fix of ours (no upstream code does this): an
// initial state for every param that has none yet (and, for HDO, through its sub-optimizers):
// zero moments, torch AdamW's step 0, the HDO's master_param. Megatron's init_state_fn, which it
// resembles, runs only when loading and writes no step and no master_param.
void DistributedOptimizer::init_empty_state() {
  auto init_adam = [&](Optimizer& opt, const at::Tensor& p) {
    DictPtr& s = opt.state.get_or_insert(p, [] { return Dict::make(); });
    if (!s->empty()) return;
    if (dynamic_cast<TorchAdamW*>(&opt) != nullptr) {
      const Dict& g = *opt.param_groups->at(0).dict();
      const bool fused =
          g.get("fused", Value(false)).is_bool() && g.get("fused", Value(false)).as_bool();
      s->set("step", Value(fused ? rt_.zeros({}, at::kFloat, rt_.device_of(p))
                                 : rt_.scalar_tensor(0.0, at::kFloat, Device::kCpu)));
    }
    s->set("exp_avg", Value(rt_.zeros_like(p)));
    s->set("exp_avg_sq", Value(rt_.zeros_like(p)));
  };
  if (HybridDeviceOptimizer* h = mutable_hdo()) {
    for (Optimizer* sub : h->sub_optimizers()) {
      for (const Value& gv : *sub->param_groups) {
        for (const at::Tensor& p : group_params(*gv.dict())) init_adam(*sub, p);
      }
    }
    h->sync_sub_optimizers_state_to_hdo();
    return;
  }
  for (const Value& gv : *optimizer_->param_groups) {
    for (const at::Tensor& p : group_params(*gv.dict())) init_adam(*optimizer_, p);
  }
}

namespace {

// Fault site save.expert_step_behind: every saved param group's 'step' one less (a number stays
// its kind; a group without one, or with None, is left alone).
void step_saved_groups_back(Value& sd) {
  const Value* inner = sd.dict()->find("optimizer");
  const Value* groups =
      inner != nullptr && inner->is_dict() ? inner->dict()->find("param_groups") : nullptr;
  if (groups == nullptr || !groups->is_list()) return;
  for (const Value& g : *groups->list()) {
    const Value* step = g.is_dict() ? g.dict()->find("step") : nullptr;
    if (step == nullptr) continue;
    if (step->is_int()) g.dict()->set("step", Value(step->as_int() - 1));
    if (step->is_float()) g.dict()->set("step", Value(step->as_float() - 1.0));
  }
}

}  // namespace

Value DistributedOptimizer::sharded_state_dict(const Value& model_sharded_state_dict,
                                               bool is_loading,
                                               const std::optional<CheckpointFormat>& metadata) {
  // A caller without metadata gets upstream's default.
  const CheckpointFormat format =
      metadata.value_or(CheckpointFormat{ShardingType::kFullyShardedModelSpace, false});
  if (!is_loading && switches_.init_empty_state_before_save) init_empty_state();
  Value sd = state_dict();
  // Fault site save.expert_step_behind: the expert part's saved groups' step, one behind.
  if (!is_loading && expert_ && rt_.fault(fault::kExpertStepBehind)) step_saved_groups_back(sd);
  // A format that depends on the buffers' structure keeps each top-level value as a
  // ShardedObject whose main replica is DP rank 0; the fully reshardable ones leave them plain
  // (common state, rank 0's).
  if (!fully_reshardable_format(format.sharding_type)) {
    for (auto& [k, v] : *sd.dict()) {
      ShardedObject so;
      so.key = format_object_key(data_parallel_group_idx_, k.str());
      so.data = v;
      so.global_shape = {1};
      so.global_offset = {0};
      so.replica_id = {distributed_optimizer_instance_id_, 0, dp_group_.rank()};
      v = Value(ShardedObject::make(std::move(so)));
    }
  }
  if (is_loading) load_state_dict(state_dict());
  Value param_state;
  switch (format.sharding_type) {
    case ShardingType::kDpReshardable:
      param_state = sharded_param_state_dp_reshardable(is_loading);
      break;
    case ShardingType::kDpZeroGatherScatter:
      param_state = sharded_param_state_dp_zero(is_loading);
      break;
    case ShardingType::kFullyReshardable:
      param_state = sharded_param_state_fully_reshardable(model_sharded_state_dict, is_loading,
                                                          format.mem_efficient);
      break;
    case ShardingType::kFullyShardedModelSpace:
      param_state = sharded_param_state_fs_model_space(model_sharded_state_dict);
      break;
  }
  sd.dict()->set("param_state", param_state);
  sd.dict()->set("param_state_sharding_type", Value(sharding_type_name(format.sharding_type)));
  return sd;
}

void check_optimizer_config(const OptimizerConfig& config, const RevisionSwitches& switches) {
  const bool precision_aware = config.kind == OptimizerKind::kHybrid;
  if (precision_aware && !config.te_installed && !switches.te_absent_version_is_zero) {
    throw UpstreamError("TypeError",
                        "'>=' not supported between instances of 'NoneType' and 'Version'",
                        "utils.py is_te_min_version()");
  }
}

namespace {

// _get_param_groups' all_gather_object of each rank's group keys over `group`: the
// (wd_mult, lr_mult) of every group any rank has, each rank's in rank order (computed once for
// all ranks that share the gathered objects).
std::vector<std::pair<double, double>> gather_group_keys(ProcessGroup& group,
                                                         const DistributedDataParallel& ddp,
                                                         bool expert) {
  using Mults = std::vector<std::pair<double, double>>;
  constexpr size_t kEntry = 2 * sizeof(double);
  std::vector<char> bytes;
  for (size_t i = 0; i < ddp.num_params(); ++i) {
    if (ddp.is_expert(i) != expert) continue;
    const ParamSpec& s = ddp.specs()[i];
    const double m[2] = {s.wd_mult, s.lr_mult};
    const char* b = reinterpret_cast<const char*>(m);
    bytes.insert(bytes.end(), b, b + kEntry);
  }
  const auto gathered = group.all_gather_object_shared(bytes);
  return *gathered->derived<Mults>([&](const std::vector<std::vector<char>>& objects) {
    Mults out;
    for (const auto& one : objects) {
      for (size_t at = 0; at + kEntry <= one.size(); at += kEntry) {
        double m[2];
        std::memcpy(m, one.data() + at, kEntry);
        if (std::find(out.begin(), out.end(), std::pair{m[0], m[1]}) == out.end())
          out.emplace_back(m[0], m[1]);
      }
    }
    return out;
  });
}

}  // namespace

std::unique_ptr<ChainedOptimizer> get_megatron_optimizer(Runtime& rt, DistributedDataParallel& ddp,
                                                         const OptimizerConfig& config,
                                                         const RevisionSwitches& switches,
                                                         ProcessGroup* world) {
  check_optimizer_config(config, switches);
  ProcessGroup& group = world != nullptr ? *world : ddp.dp_group();
  const auto world_groups = gather_group_keys(group, ddp, false);  // _get_param_groups: dense
  std::vector<std::unique_ptr<DistributedOptimizer>> parts;
  parts.push_back(std::make_unique<DistributedOptimizer>(rt, ddp, config, switches, world_groups));
  // _get_param_groups for the expert-parallel params: an expert part where any rank has a group
  // of them (moe_param_groups is world-aligned, so every rank builds it or none does).
  const auto expert_groups = gather_group_keys(group, ddp, true);
  if (!expert_groups.empty()) {
    parts.push_back(std::make_unique<DistributedOptimizer>(rt, ddp, config, switches, expert_groups,
                                                           /*expert=*/true));
  }
  return std::make_unique<ChainedOptimizer>(std::move(parts));
}

}  // namespace ckptsim::model
