// hyperparams_follow_schedule: the learning rate and weight decay of every param group at
// every optimizer step equal what the schedule in force says for that step (absolute: the
// uninterrupted run is checked the same way, against the same schedule). The schedule in
// force is sim::intended_schedules(): the first phase's arguments, and after each resume
// what Megatron's --override-opt_param-scheduler / --use-checkpoint-opt_param-scheduler say
// it becomes. The values are computed here from Megatron's documented schedule (warmup, then
// constant, linear, cosine or inverse-square-root decay; constant, linear or cosine weight
// decay increment), not read from the model's scheduler.
#include <fmt/format.h>

#include <cmath>
#include <numbers>

#include "properties/common.h"

namespace ckptsim::properties {

namespace {

// A schedule in samples, with one group's bounds.
struct GroupSchedule {
  double peak = 0;   // max_lr: lr x lr_mult
  double floor = 0;  // min_lr x lr_mult
  double warmup_from = 0;
  double warmup = 0;  // samples
  double decay = 0;   // samples
  model::LrDecayStyle style = model::LrDecayStyle::kConstant;
  double wd_from = 0;
  double wd_to = 0;
  double wd_ramp = 0;  // samples
  model::WdIncrStyle wd_style = model::WdIncrStyle::kConstant;
};

GroupSchedule group_schedule(const model::ScheduleConfig& c, double lr_mult,
                             int64_t samples_per_step) {
  const auto per = static_cast<double>(samples_per_step);
  return {c.lr * lr_mult,
          c.min_lr * lr_mult,
          c.lr_warmup_init,
          static_cast<double>(c.lr_warmup_iters) * per,
          static_cast<double>(c.lr_decay_iters) * per,
          c.lr_decay_style,
          c.start_wd,
          c.end_wd,
          static_cast<double>(c.wd_incr_iters) * per,
          c.wd_incr_style};
}

// The lr after `n` samples.
double scheduled_lr(const GroupSchedule& g, double n) {
  if (g.warmup > 0 && n <= g.warmup) return g.warmup_from + (g.peak - g.warmup_from) * n / g.warmup;
  switch (g.style) {
    case model::LrDecayStyle::kConstant:
      return g.peak;
    case model::LrDecayStyle::kInverseSquareRoot:
      if (n > g.decay) return g.floor;
      return std::max(g.floor, g.peak * std::sqrt(std::max(g.warmup, 1.0) / std::max(n, 1.0)));
    case model::LrDecayStyle::kLinear:
    case model::LrDecayStyle::kCosine:
      break;
  }
  if (n > g.decay) return g.floor;
  const double progress = (n - g.warmup) / (g.decay - g.warmup);
  const double left = g.style == model::LrDecayStyle::kLinear
                          ? 1.0 - progress
                          : (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
  return g.floor + left * (g.peak - g.floor);
}

// The weight decay (before wd_mult) after `n` samples.
double scheduled_wd(const GroupSchedule& g, double n) {
  if (n > g.wd_ramp || g.wd_style == model::WdIncrStyle::kConstant) return g.wd_to;
  const double progress = n / g.wd_ramp;
  const double done = g.wd_style == model::WdIncrStyle::kLinear
                          ? progress
                          : (1.0 + std::cos(std::numbers::pi * (1.0 - progress))) / 2.0;
  return g.wd_from + done * (g.wd_to - g.wd_from);
}

bool same_value(double observed, double expected) {
  return std::abs(observed - expected) <= 1e-12 + 1e-9 * std::abs(expected);
}

// What checking one run needs: the scenario's intended schedules and where each phase starts.
struct Checker {
  const sim::RunResult& run;
  std::vector<model::ScheduleConfig> intended;
  std::vector<int64_t> first_step;  // per phase: its first global step
  std::vector<std::string> failures;
  std::string signature;
  int first_phase = -1;
  int64_t checks = 0;

  explicit Checker(const sim::RunResult& r)
      : run(r), intended(sim::intended_schedules(r.scenario)) {
    int64_t g = 1;
    for (const auto& p : r.scenario.phases) {
      first_step.push_back(g);
      g += p.steps;
    }
  }

  // The phase whose steps include global step `g` (the last phase for steps beyond).
  size_t phase_of(int64_t g) const {
    size_t i = 0;
    while (i + 1 < first_step.size() && first_step[i + 1] <= g) ++i;
    return i;
  }

  std::string how(size_t phase) const {
    if (phase == 0) return "the first phase's arguments";
    const auto flag = run.scenario.phases[phase].opt_param_scheduler;
    return flag == model::SchedulerResume::kOverride ? "--override-opt_param-scheduler"
           : flag == model::SchedulerResume::kUseCheckpoint
               ? "--use-checkpoint-opt_param-scheduler"
               : "the arguments, equal to the checkpoint's";
  }

  void check(const sim::GlobalState& st, const std::string& where, const char* run_kind,
             int phase_index) {
    const size_t phase = phase_of(st.global_step);
    const double n = static_cast<double>((st.global_step - 1) * run.scenario.samples_per_step);
    for (const sim::GroupHyper& h : st.hypers) {
      const GroupSchedule g =
          group_schedule(intended[phase], h.lr_mult, run.scenario.samples_per_step);
      const double lr = scheduled_lr(g, n);
      const double wd = scheduled_wd(g, n) * h.wd_mult;
      checks += 2;
      for (const auto& [what, observed, expected] :
           {std::tuple{"lr", h.lr, lr}, std::tuple{"weight_decay", h.weight_decay, wd}}) {
        if (same_value(observed, expected)) continue;
        if (signature.empty()) {
          signature = fmt::format("hyperparams_follow_schedule:{}:{}", what, run_kind);
          first_phase = phase_index;
        }
        failures.push_back(fmt::format(
            "{}, global step {}: the param group with wd_mult {} and lr_mult {} used {} {} (the "
            "schedule says {}, from {})",
            where, st.global_step, num(h.wd_mult), num(h.lr_mult), what, observed, expected,
            how(phase)));
      }
    }
  }
};

std::string joined(const std::vector<std::string>& failures) {
  std::string detail = failures.front();
  if (failures.size() > 1) detail += fmt::format(" (+{} more)", failures.size() - 1);
  return detail;
}

}  // namespace

PropertyResult hyperparams_follow_schedule(const sim::RunResult& run) {
  PropertyResult r = pass("hyperparams_follow_schedule");
  Checker c(run);
  for (const sim::GlobalState& st : run.reference)
    c.check(st, "the uninterrupted run", "reference", -1);
  std::string not_evaluated;
  for (const auto& p : run.phases) {
    if (!p.ran || p.after_step.size() < static_cast<size_t>(p.spec.steps)) {
      if (not_evaluated.empty()) not_evaluated = phase_label(p) + ": its steps did not all run";
    }
    if (!p.ran) continue;
    const std::string kind =
        p.index == 0 ? "first_phase"
                     : model::scheduler_resume_name(p.spec.opt_param_scheduler) + "_resume";
    for (const auto& st : p.after_step) {
      c.check(st, phase_label(p), kind.c_str(), static_cast<int>(p.index));
    }
  }
  if (!c.failures.empty())
    return fail(std::move(r), c.first_phase, c.signature, joined(c.failures));
  if (!not_evaluated.empty()) return mark_not_evaluated(std::move(r), not_evaluated);
  r.detail = fmt::format(
      "{} lr and weight-decay values (the uninterrupted run's too) equal the schedule in force",
      c.checks);
  return r;
}

}  // namespace ckptsim::properties
