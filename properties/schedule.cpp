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
#include "properties/trace.h"

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

// The schedule in force at every global step of a scenario: the intended schedules, and where
// each phase starts.
struct ScheduleInForce {
  const sim::Scenario& scenario;
  std::vector<model::ScheduleConfig> intended;
  std::vector<int64_t> first_step;  // per phase: its first global step

  std::vector<int64_t> origins;  // per phase: the steps before its scheduler began counting
  explicit ScheduleInForce(const sim::Scenario& s)
      : scenario(s), intended(sim::intended_schedules(s)), origins(sim::optimizer_origins(s)) {
    int64_t g = 1;
    for (const auto& p : s.phases) {
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

  // The lr and weight decay the schedule says a group with these multipliers uses at step `g`.
  std::pair<double, double> expected(int64_t g, double wd_mult, double lr_mult) const {
    const size_t phase = phase_of(g);
    const GroupSchedule gs = group_schedule(intended[phase], lr_mult, scenario.samples_per_step);
    const double n = static_cast<double>((g - 1 - origins[phase]) * scenario.samples_per_step);
    return {scheduled_lr(gs, n), scheduled_wd(gs, n) * wd_mult};
  }

  std::string how(size_t phase) const {
    if (phase == 0) return "the first phase's arguments";
    if (scenario.phases[phase].fresh_optimizer())
      return fmt::format("{}: the phase's arguments from global step {}",
                         scenario.phases[phase].fresh_start_flag(), origins[phase] + 1);
    const auto flag = scenario.phases[phase].opt_param_scheduler;
    return flag == model::SchedulerResume::kOverride ? "--override-opt_param-scheduler"
           : flag == model::SchedulerResume::kUseCheckpoint
               ? "--use-checkpoint-opt_param-scheduler"
               : "the arguments, equal to the checkpoint's";
  }

  // The run kind a signature names: "reference", "first_phase", "<flag>_resume".
  std::string run_kind(int phase_index) const {
    if (phase_index < 0) return "reference";
    if (phase_index == 0) return "first_phase";
    return model::scheduler_resume_name(
               scenario.phases[static_cast<size_t>(phase_index)].opt_param_scheduler) +
           "_resume";
  }
};

// The values seen, checked against the schedule in force, and what differed.
struct Checker {
  ScheduleInForce schedule;
  std::vector<std::string> failures;
  std::string signature;
  int first_phase = -1;
  std::string first_run;  // the trace run of the first failure
  int64_t checks = 0;

  explicit Checker(const sim::Scenario& s) : schedule(s) {}

  // One group's values at global step `g`, seen in `where` (a run of phase `phase_index`, -1
  // for the uninterrupted one).
  void check(const std::string& where, int phase_index, int64_t g, double wd_mult, double lr_mult,
             double lr, double weight_decay, const std::string& run = "") {
    const auto [want_lr, want_wd] = schedule.expected(g, wd_mult, lr_mult);
    checks += 2;
    for (const auto& [what, observed, expected] :
         {std::tuple{"lr", lr, want_lr}, std::tuple{"weight_decay", weight_decay, want_wd}}) {
      if (same_value(observed, expected)) continue;
      if (signature.empty()) {
        signature =
            fmt::format("hyperparams_follow_schedule:{}:{}", what, schedule.run_kind(phase_index));
        first_phase = phase_index;
        first_run = run;
      }
      failures.push_back(fmt::format(
          "{}, global step {}: the param group with wd_mult {} and lr_mult {} used {} {} (the "
          "schedule says {}, from {})",
          where, g, num(wd_mult), num(lr_mult), what, observed, expected,
          schedule.how(schedule.phase_of(g))));
    }
  }

  void check(const sim::GlobalState& st, const std::string& where, int phase_index) {
    for (const sim::GroupHyper& h : st.hypers)
      check(where, phase_index, st.global_step, h.wd_mult, h.lr_mult, h.lr, h.weight_decay);
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
  Checker c(run.scenario);
  for (const sim::GlobalState& st : run.reference) c.check(st, "the uninterrupted run", -1);
  std::string not_evaluated;
  for (const auto& p : run.phases) {
    if (!p.ran || p.after_step.size() < static_cast<size_t>(p.spec.steps)) {
      if (not_evaluated.empty()) not_evaluated = phase_label(p) + ": its steps did not all run";
    }
    if (!p.ran) continue;
    for (const auto& st : p.after_step) c.check(st, phase_label(p), static_cast<int>(p.index));
  }
  if (!c.failures.empty())
    return fail(std::move(r), c.first_phase, c.signature, joined(c.failures));
  if (!not_evaluated.empty()) return mark_not_evaluated(std::move(r), not_evaluated);
  r.detail = fmt::format(
      "{} lr and weight-decay values (the uninterrupted run's too) equal the schedule in force",
      c.checks);
  return r;
}

TraceVerdict trace_hyperparams_follow_schedule(const trace::Trace& t) {
  const char* name = "hyperparams_follow_schedule";
  if (t.spec == nullptr)
    return {name, Verdict::kNotEvaluated, "the trace's scenario is not known here", "", ""};
  Checker c(*t.spec);
  int64_t events = 0;
  std::string not_evaluated;
  for (const trace::Run& run : t.runs) {
    // As the run check: a phase whose steps did not all run leaves the verdict open (unless
    // something failed), since the steps it never took are not judged.
    int64_t steps_taken = 0;
    for (const trace::Event& e : run.events) steps_taken += e.at == "after_step" && e.rank == 0;
    if (run.phase >= 0 && not_evaluated.empty() &&
        (run.status == "skipped" || steps_taken < run.steps)) {
      not_evaluated = fmt::format("phase {} (dp={}): its steps did not all run", run.phase, run.dp);
    }
    // Rank 0's groups only: each rank holds every group, and the schedule is the same on all.
    for (const trace::Event& e : run.events) {
      if (e.at != "after_step" || !e.groups || e.rank != 0) continue;
      ++events;
      const std::string where = run.phase < 0 ? "the uninterrupted run"
                                              : fmt::format("phase {} (dp={})", run.phase, run.dp);
      for (const trace::Group& g : *e.groups) {
        c.check(where, run.phase, e.global_step, g.wd_mult, g.lr_mult, g.lr, g.weight_decay,
                run.id);
      }
    }
  }
  if (!c.failures.empty())
    return {name, Verdict::kFail, joined(c.failures), c.signature, c.first_run};
  if (!not_evaluated.empty()) return {name, Verdict::kNotEvaluated, not_evaluated, "", ""};
  if (events == 0)
    return {name, Verdict::kNotEvaluated, "the trace records no param group's lr and weight decay",
            "", ""};
  return {name, Verdict::kPass,
          fmt::format("{} lr and weight-decay values in {} steps equal the schedule in force",
                      c.checks, events),
          "", ""};
}

}  // namespace ckptsim::properties
