#include "model/megatron/optimizer_param_scheduler.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>

#include "model/errors.h"

namespace ckptsim::model {

namespace {

constexpr const char* kFile = "optimizer_param_scheduler.py";

void upstream_assert(bool ok, const char* what, const char* function) {
  if (!ok) throw PyAssertionError(what, fmt::format("{} {}", kFile, function));
}

// Python's str() of a scheduler value, as the f-string of _check_and_set prints it.
std::string py_str(const Value& v) { return v.is_str() ? v.as_str() : v.repr(); }

bool py_equal_scalar(const Value& a, const Value& b) {
  if (a.is_str() || b.is_str()) return a.is_str() && b.is_str() && a.as_str() == b.as_str();
  return a.as_float() == b.as_float();
}

// The first of `keys` the state dict holds (upstream's backward-compatible spellings, newest
// last), else the KeyError for the last one.
const Value& saved(const Dict& sd, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    if (const Value* v = sd.find(k)) return *v;
  }
  throw PyKeyError(Value(*(keys.end() - 1)).repr(), std::string(kFile) + " load_state_dict()");
}

}  // namespace

OptimizerParamScheduler::OptimizerParamScheduler(ChainedOptimizer& optimizer,
                                                 const ScheduleConfig& config,
                                                 int64_t samples_per_iteration,
                                                 SchedulerResume resume,
                                                 const RevisionSwitches& switches)
    : optimizer_(optimizer),
      resume_(resume),
      restores_wd_before_step_(switches.scheduler_restores_wd_before_step),
      init_lr_(config.lr_warmup_init),
      max_lr_(config.lr),
      min_lr_(config.min_lr),
      lr_warmup_steps_(config.lr_warmup_iters * samples_per_iteration),
      lr_decay_steps_(config.lr_decay_iters * samples_per_iteration),
      lr_decay_style_(lr_decay_style_name(config.lr_decay_style)),
      start_wd_(config.start_wd),
      end_wd_(config.end_wd),
      wd_incr_steps_(config.wd_incr_iters * samples_per_iteration),
      wd_incr_style_(wd_incr_style_name(config.wd_incr_style)),
      samples_per_iteration_(samples_per_iteration) {
  CKPTSIM_CHECK(samples_per_iteration >= 1, "samples_per_iteration must be >= 1");
  upstream_assert(min_lr_ >= 0.0, "", "__init__()");
  upstream_assert(max_lr_ >= min_lr_, "", "__init__()");
  upstream_assert(init_lr_ <= max_lr_, "", "__init__()");
  upstream_assert(lr_decay_steps_ > 0, "", "__init__()");
  upstream_assert(lr_warmup_steps_ < lr_decay_steps_, "", "__init__()");
  upstream_assert(start_wd_ >= 0.0, "", "__init__()");
  upstream_assert(end_wd_ >= start_wd_, "", "__init__()");
  step(0);
}

double OptimizerParamScheduler::get_wd(const Dict& param_group) const {
  const double start_wd = param_group.get("start_wd", Value(start_wd_)).as_float();
  const double end_wd = param_group.get("end_wd", Value(end_wd_)).as_float();
  if (num_steps_ > wd_incr_steps_) return end_wd;
  if (wd_incr_style_ == "constant") {
    upstream_assert(start_wd == end_wd, "", "get_wd()");
    return end_wd;
  }
  const double incr_ratio = static_cast<double>(num_steps_) / static_cast<double>(wd_incr_steps_);
  upstream_assert(incr_ratio >= 0.0 && incr_ratio <= 1.0, "", "get_wd()");
  const double delta_wd = end_wd - start_wd;
  const double coeff = wd_incr_style_ == "linear"
                           ? incr_ratio
                           : 0.5 * (std::cos(std::numbers::pi * (1 - incr_ratio)) + 1.0);
  return start_wd + coeff * delta_wd;
}

double OptimizerParamScheduler::get_lr(const Dict& param_group) const {
  const double max_lr = param_group.get("max_lr", Value(max_lr_)).as_float();
  const double min_lr = param_group.get("min_lr", Value(min_lr_)).as_float();
  const auto steps = static_cast<double>(num_steps_);
  if (lr_warmup_steps_ > 0 && num_steps_ <= lr_warmup_steps_) {
    return init_lr_ + ((max_lr - init_lr_) * steps / static_cast<double>(lr_warmup_steps_));
  }
  if (lr_decay_style_ == "constant") return max_lr;
  if (num_steps_ > lr_decay_steps_) return min_lr;
  if (lr_decay_style_ == "inverse-square-root") {
    const double warmup = static_cast<double>(std::max<int64_t>(lr_warmup_steps_, 1));
    const double lr = max_lr * std::pow(warmup, 0.5) / std::pow(std::max(steps, 1.0), 0.5);
    return std::max(min_lr, lr);
  }
  const double decay_ratio = static_cast<double>(num_steps_ - lr_warmup_steps_) /
                             static_cast<double>(lr_decay_steps_ - lr_warmup_steps_);
  upstream_assert(decay_ratio >= 0.0 && decay_ratio <= 1.0, "", "get_lr()");
  const double delta_lr = max_lr - min_lr;
  const double coeff = lr_decay_style_ == "linear"
                           ? 1.0 - decay_ratio
                           : 0.5 * (std::cos(std::numbers::pi * decay_ratio) + 1.0);
  return min_lr + coeff * delta_lr;
}

void OptimizerParamScheduler::step(int64_t increment) {
  num_steps_ += increment;
  for (Value& g : optimizer_.param_groups()) {
    Dict& group = *g.dict();
    group.set("lr", Value(get_lr(group)));
    group.set("weight_decay", Value(get_wd(group) * group.get("wd_mult", Value(1.0)).as_float()));
  }
}

Value OptimizerParamScheduler::state_dict() const {
  return Value(Dict::make({{"max_lr", Value(max_lr_)},
                           {"lr_warmup_steps", Value(lr_warmup_steps_)},
                           {"num_steps", Value(num_steps_)},
                           {"lr_decay_style", Value(lr_decay_style_)},
                           {"lr_decay_steps", Value(lr_decay_steps_)},
                           {"min_lr", Value(min_lr_)},
                           {"start_wd", Value(start_wd_)},
                           {"end_wd", Value(end_wd_)},
                           {"wd_incr_style", Value(wd_incr_style_)},
                           {"wd_incr_steps", Value(wd_incr_steps_)}}));
}

Value OptimizerParamScheduler::check_and_set(const Value& cls_value, const Value& sd_value,
                                             const char* name) const {
  if (resume_ == SchedulerResume::kOverride) return cls_value;
  if (resume_ != SchedulerResume::kUseCheckpoint && !py_equal_scalar(cls_value, sd_value)) {
    // The message as upstream's f-string spells it (no space before "value").
    throw PyAssertionError(
        fmt::format("OptimizerParamScheduler: class input value {} and checkpointvalue {} for "
                    "{} do not match",
                    py_str(cls_value), py_str(sd_value), name),
        std::string(kFile) + " _check_and_set()");
  }
  return sd_value;
}

void OptimizerParamScheduler::load_state_dict(const Value& state_dict) {
  const Dict& sd = *state_dict.dict();
  max_lr_ =
      check_and_set(Value(max_lr_), saved(sd, {"start_lr", "max_lr"}), "learning rate").as_float();
  min_lr_ =
      check_and_set(Value(min_lr_), saved(sd, {"min_lr"}), "minimum learning rate").as_float();
  lr_warmup_steps_ = check_and_set(Value(lr_warmup_steps_),
                                   saved(sd, {"warmup_iter", "warmup_steps", "lr_warmup_steps"}),
                                   "warmup iterations")
                         .as_int();
  lr_decay_steps_ = check_and_set(Value(lr_decay_steps_),
                                  saved(sd, {"end_iter", "decay_steps", "lr_decay_steps"}),
                                  "total number of iterations")
                        .as_int();
  lr_decay_style_ =
      check_and_set(Value(lr_decay_style_), saved(sd, {"decay_style", "lr_decay_style"}),
                    "learning rate decay style")
          .as_str();
  // Upstream steps here, before the weight decay's values are restored: the groups get the
  // config's weight decay until the next step (Megatron-LM PR #7468 moves the step last).
  const int64_t num_steps = saved(sd, {"num_iters", "num_steps"}).as_int();
  if (restores_wd_before_step_) {
    load_wd(sd);
    step(num_steps);
  } else {
    step(num_steps);
    load_wd(sd);
  }
}

void OptimizerParamScheduler::load_wd(const Dict& sd) {
  if (sd.find("start_wd") == nullptr) return;
  start_wd_ =
      check_and_set(Value(start_wd_), saved(sd, {"start_wd"}), "start weight decay").as_float();
  end_wd_ = check_and_set(Value(end_wd_), saved(sd, {"end_wd"}), "end weight decay").as_float();
  wd_incr_steps_ = check_and_set(Value(wd_incr_steps_), saved(sd, {"wd_incr_steps"}),
                                 "total number of weight decay iterations")
                       .as_int();
  wd_incr_style_ =
      check_and_set(Value(wd_incr_style_), saved(sd, {"wd_incr_style"}), "weight decay incr style")
          .as_str();
}

void OptimizerParamScheduler::reapply_lr_bounds(int64_t consumed_train_samples) {
  for (Value& g : optimizer_.param_groups()) {
    Dict& group = *g.dict();
    group.set("max_lr", Value(max_lr_));
    group.set("min_lr", Value(min_lr_));
  }
  // "Synchronize scheduler num_steps with consumed_train_samples".
  if (num_steps_ != consumed_train_samples) num_steps_ = consumed_train_samples;
  step(0);
}

}  // namespace ckptsim::model
