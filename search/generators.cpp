#include "search/generators.h"

#include <algorithm>

#include <fmt/format.h>
#include <rapidcheck/state.h>

#include "model/faults.h"

namespace ckptsim::search {

namespace {

namespace gen = rc::gen;

rc::Gen<int64_t> gen_numel() {
  return gen::weightedOneOf<int64_t>({
      {3, gen::inRange<int64_t>(1, 65)},
      {2, gen::elementOf(std::vector<int64_t>{63, 64, 65, 127, 128, 129, 192, 256})},
      {3, gen::inRange<int64_t>(65, 700)},
      {1, gen::inRange<int64_t>(700, 4000)},
  });
}

rc::Gen<model::ParamSpec> gen_param() {
  return gen::exec([] {
    model::ParamSpec p;
    p.numel = *gen_numel();
    p.dtype = *gen::weightedElement<model::DType>(
        {{3, model::DType::kBFloat16}, {1, model::DType::kFloat32}});
    p.wd_mult = *gen::weightedElement<double>({{3, 1.0}, {1, 0.0}});
    return p;
  });
}

rc::Gen<int64_t> gen_dp(int64_t dp_max) {
  return gen::weightedOneOf<int64_t>({
      {5, gen::inRange<int64_t>(1, std::min<int64_t>(dp_max, 5) + 1)},
      {1, gen::elementOf(std::vector<int64_t>{std::min<int64_t>(dp_max, 8),
                                              std::min<int64_t>(dp_max, 16),
                                              std::min<int64_t>(dp_max, 24)})},
      {1, gen::inRange<int64_t>(1, dp_max + 1)},
  });
}

// A long phase: next to 2^8 (where a bf16 counter stops counting) most often, next to 2^11
// (fp16's) less, anything up to long_max now and then. REQUIRES: long_max > kLongBand8.second.
rc::Gen<int64_t> gen_long_steps(int64_t long_max) {
  const auto band8 = gen::inRange<int64_t>(kLongBand8.first, kLongBand8.second + 1);
  const auto beyond = gen::inRange<int64_t>(kLongBand8.second + 1, long_max + 1);
  if (long_max < kLongBand11.first) return gen::weightedOneOf<int64_t>({{6, band8}, {1, beyond}});
  const auto band11 =
      gen::inRange<int64_t>(kLongBand11.first, std::min<int64_t>(kLongBand11.second, long_max) + 1);
  return gen::weightedOneOf<int64_t>({{6, band8}, {3, band11}, {1, beyond}});
}

// The steps of one phase. The short choices come first, so that a failing long phase shrinks
// toward a short one where the failure allows it, and a long one toward its band's start.
rc::Gen<int64_t> gen_steps(int64_t steps_max, int64_t long_max) {
  const auto none = gen::just<int64_t>(0);
  const auto one = gen::just<int64_t>(1);
  const auto few = gen::inRange<int64_t>(1, steps_max + 1);
  if (long_max <= kLongBand8.second) {
    return gen::weightedOneOf<int64_t>({{1, none}, {2, one}, {4, few}});
  }
  return gen::weightedOneOf<int64_t>(
      {{10, none}, {20, one}, {40, few}, {kLongPhaseWeight, gen_long_steps(long_max)}});
}

rc::Gen<double> gen_offload() {
  return gen::weightedOneOf<double>({
      {3, gen::just(1.0)},
      {1, gen::just(0.0)},
      {1, gen::just(0.5)},
      {1, gen::map(gen::inRange(1, 100), [](int x) { return x / 100.0; })},
  });
}

rc::Gen<bool> gen_te_installed(const std::vector<bool>& allowed) {
  const bool installed = std::find(allowed.begin(), allowed.end(), true) != allowed.end();
  const bool absent = std::find(allowed.begin(), allowed.end(), false) != allowed.end();
  if (installed && absent) return gen::weightedElement<bool>({{4, true}, {1, false}});
  return gen::just(installed);
}

// Group hyper-parameters beyond Megatron's standard 0/1 weight decay: lr_mult 0.5 or 2 (a
// group with its own max_lr/min_lr), wd_mult 0.5. Drawn after everything else, so that a seed
// draws the same params, layout and phases it drew before these existed.
void draw_group_mults(sim::Scenario& s) {
  for (model::ParamSpec& p : s.params) {
    p.lr_mult = *gen::weightedElement<double>({{8, 1.0}, {1, 0.5}, {1, 2.0}});
    if (*gen::weightedElement<bool>({{9, false}, {1, true}})) p.wd_mult = 0.5;
  }
}

// The scenario's schedule: constant most often; else a warmup and a decay that move within
// the few steps a case takes (iterations of samples_per_step), and a weight decay that rises.
rc::Gen<model::ScheduleConfig> gen_schedule(double lr, double weight_decay) {
  const auto constant = gen::just(model::ScheduleConfig::constant(lr, weight_decay));
  const auto moving = gen::exec([lr, weight_decay] {
    model::ScheduleConfig c = model::ScheduleConfig::constant(lr, weight_decay);
    c.lr_decay_style = *gen::elementOf(
        std::vector<model::LrDecayStyle>{model::LrDecayStyle::kLinear, model::LrDecayStyle::kCosine,
                                         model::LrDecayStyle::kInverseSquareRoot});
    c.lr_warmup_iters = *gen::inRange<int64_t>(0, 4);
    c.lr_decay_iters = c.lr_warmup_iters + *gen::inRange<int64_t>(1, 25);
    c.min_lr = *gen::elementOf(std::vector<double>{0.0, lr / 10});
    c.wd_incr_style = *gen::elementOf(std::vector<model::WdIncrStyle>{
        model::WdIncrStyle::kConstant, model::WdIncrStyle::kLinear, model::WdIncrStyle::kCosine});
    if (c.wd_incr_style != model::WdIncrStyle::kConstant) {
      c.start_wd = weight_decay / 2;
      c.wd_incr_iters = *gen::inRange<int64_t>(1, 25);
    }
    return c;
  });
  return gen::weightedOneOf<model::ScheduleConfig>({{3, constant}, {1, moving}});
}

// A resume's scheduler flag and arguments: mostly the arguments the previous phase was
// started with, under Megatron's default (neither flag); now and then a job restarted with
// another lr or weight decay, under --override-opt_param-scheduler or
// --use-checkpoint-opt_param-scheduler. With neither flag, arguments that differ from the
// checkpoint's fail the load (AssertionError), which is not a resume a user can run: after a
// --use-checkpoint resume with new arguments, the later resumes keep that flag.
void draw_resume_arguments(sim::Scenario& s, size_t i) {
  using model::SchedulerResume;
  sim::PhaseSpec& p = s.phases[i];
  const model::ScheduleConfig& before = s.schedule_of(i - 1);
  const bool change = *gen::weightedElement<bool>({{5, false}, {1, true}});
  if (!change) {
    if (before != s.schedule) p.schedule = before;
    const bool checkpoint_differs = sim::intended_schedules(s)[i - 1] != before;
    p.opt_param_scheduler =
        checkpoint_differs
            ? s.phases[i - 1].opt_param_scheduler
            : *gen::weightedElement<SchedulerResume>({{4, SchedulerResume::kNeither},
                                                      {1, SchedulerResume::kOverride},
                                                      {1, SchedulerResume::kUseCheckpoint}});
    return;
  }
  p.opt_param_scheduler = *gen::elementOf(
      std::vector<SchedulerResume>{SchedulerResume::kOverride, SchedulerResume::kUseCheckpoint});
  model::ScheduleConfig c = before;
  const double lr_factor = *gen::elementOf(std::vector<double>{1.0, 0.5, 2.0});
  const double wd_factor = lr_factor == 1.0 ? *gen::elementOf(std::vector<double>{0.5, 2.0})
                                            : *gen::elementOf(std::vector<double>{1.0, 0.5, 2.0});
  c.lr *= lr_factor;
  c.min_lr *= lr_factor;
  c.lr_warmup_init *= lr_factor;
  c.start_wd *= wd_factor;
  c.end_wd *= wd_factor;
  p.schedule = c;
}

// Long phases may add up past what a scenario file allows: the later phases give up steps.
void cap_total_steps(sim::Scenario& s) {
  int64_t left = sim::Scenario::kStepsMax;
  for (sim::PhaseSpec& p : s.phases) {
    p.steps = std::min(p.steps, left);
    left -= p.steps;
  }
}

}  // namespace

Status GeneratorConfig::validate() const {
  auto range = [](const char* flag, int64_t v, int64_t hi) {
    return v >= 1 && v <= hi
               ? Status::ok()
               : Status::invalid_input(fmt::format("{} must be in [1, {}], got {}", flag, hi, v));
  };
  for (Status s : {range("--dp-max", dp_max, sim::Scenario::kDpMax),
                   range("--params-max", params_max, kParamsMaxLimit),
                   range("--phases-max", phases_max, kPhasesMaxLimit),
                   range("--steps-max", steps_max, kStepsMaxLimit)}) {
    if (!s.is_ok()) return s;
  }
  if (long_steps_max != 0 &&
      (long_steps_max <= kLongBand8.second || long_steps_max > kLongStepsMaxLimit)) {
    return Status::invalid_input(
        fmt::format("--long-steps-max must be 0 (no long phases) or in "
                    "[{}, {}], got {}",
                    kLongBand8.second + 1, kLongStepsMaxLimit, long_steps_max));
  }
  if (te_installed.empty())
    return Status::invalid_input("--transformer-engine names neither installed nor absent");
  for (const auto& fault : faults) {
    if (!model::is_fault_site(fault))
      return Status::invalid_input("--fault: unknown fault site " + fault);
  }
  return Status::ok();
}

int64_t phase_dp_max(const GeneratorConfig& config, const sim::Scenario& s) {
  return s.pad_buckets_for_high_nccl_busbw ? std::min<int64_t>(config.dp_max, kPaddedDpMax)
                                           : config.dp_max;
}

rc::Gen<sim::Scenario> gen_scenario(const GeneratorConfig& config) {
  CKPTSIM_CHECK(!config.revisions.empty(), "a generator config names no revision");
  return gen::exec([config] {
    // The case's size: gen::resize below bounds the container lengths, and would otherwise
    // also shrink every element generator's range (RapidCheck passes the size down).
    const int size = *gen::withSize([](int s) { return gen::just(s); });
    sim::Scenario s;
    s.seed = *gen::inRange<uint64_t>(0, 1000);
    // Fewer params first: the count shrinks, then each param shrinks.
    s.params =
        *gen::resize(config.params_max, gen::nonEmpty(gen::container<std::vector<model::ParamSpec>>(
                                            gen::resize(size, gen_param()))));
    // nonEmpty() may retry at a larger size: keep the configured bound.
    if (s.params.size() > static_cast<size_t>(config.params_max))
      s.params.resize(static_cast<size_t>(config.params_max));
    for (size_t i = 0; i < s.params.size(); ++i) s.params[i].name = fmt::format("p{}", i);
    s.optimizer.kind = *gen::elementOf(config.kinds);
    s.optimizer.adam.lr = 0.01;
    s.optimizer.adam.beta1 = 0.9;
    s.optimizer.adam.beta2 = 0.95;
    s.optimizer.adam.eps = 1e-8;
    s.optimizer.adam.weight_decay = 0.1;
    if (s.optimizer.kind == model::OptimizerKind::kHybrid) {
      s.optimizer.offload_fraction = *gen_offload();
      s.optimizer.overlap_cpu_optimizer_d2h_h2d =
          *gen::weightedElement<bool>({{4, false}, {1, true}});
      s.optimizer.te_installed = *gen_te_installed(config.te_installed);
    }
    const int64_t total = s.total_numel();
    const bool one_bucket = *gen::weightedElement<bool>({{1, true}, {1, false}});
    if (!one_bucket) s.bucket_size = *gen::inRange<int64_t>(64, total + 65);
    s.pad_buckets_for_high_nccl_busbw = *gen::weightedElement<bool>({{9, false}, {1, true}});
    s.samples_per_step = 8;
    const int64_t dp_max = phase_dp_max(config, s);
    const auto phase_gen = gen::resize(size, gen::exec([config, dp_max] {
                                         sim::PhaseSpec p;
                                         p.dp = *gen_dp(dp_max);
                                         p.steps =
                                             *gen_steps(config.steps_max, config.long_steps_max);
                                         p.set_revision(*gen::elementOf(config.revisions));
                                         return p;
                                       }));
    s.phases = *gen::resize(config.phases_max,
                            gen::nonEmpty(gen::container<std::vector<sim::PhaseSpec>>(phase_gen)));
    if (s.phases.size() > static_cast<size_t>(config.phases_max))
      s.phases.resize(static_cast<size_t>(config.phases_max));
    cap_total_steps(s);
    if (config.require_revision_change && config.revisions.size() > 1) {
      bool changed = false;
      for (size_t i = 1; i < s.phases.size(); ++i)
        changed = changed || s.phases[i].revision != s.phases[i - 1].revision;
      if (!changed) {
        if (s.phases.size() == 1) s.phases.push_back(s.phases.front());
        const std::string& last = s.phases[s.phases.size() - 2].revision;
        s.phases.back().set_revision(last == config.revisions[0].name ? config.revisions[1]
                                                                      : config.revisions[0]);
        if (s.phases.back().steps == 0) s.phases.back().steps = 1;
      }
    }
    draw_group_mults(s);
    s.schedule = *gen_schedule(s.optimizer.adam.lr, s.optimizer.adam.weight_decay);
    for (size_t i = 1; i < s.phases.size(); ++i) draw_resume_arguments(s, i);
    s.faults = config.faults;
    s.name = "generated";
    return s;
  });
}

namespace {

struct ScenarioBuilder {
  std::vector<sim::PhaseSpec> phases;
};

using CycleCommand = rc::state::Command<CycleModel, ScenarioBuilder>;

struct Train : CycleCommand {
  int64_t k;
  // Long phases may add up past what a scenario file allows: a step count that would is cut.
  explicit Train(const CycleModel& m)
      : k(std::min(*gen_steps(m.steps_max, m.long_steps_max),
                   sim::Scenario::kStepsMax - m.total_steps)) {}
  void apply(CycleModel& m) const override {
    m.steps_in_phase += k;
    m.total_steps += k;
  }
  void run(const CycleModel&, ScenarioBuilder& b) const override { b.phases.back().steps += k; }
  void show(std::ostream& os) const override { os << "Train(" << k << ")"; }
};

struct SaveResume : CycleCommand {
  int64_t dp;
  sim::Revision revision;
  explicit SaveResume(const CycleModel& m)
      : dp(*gen_dp(m.dp_max)), revision(*gen::elementOf(m.revisions)) {}
  void checkPreconditions(const CycleModel& m) const override {
    RC_PRE(static_cast<int>(m.start_steps.size()) < m.phases_max);
  }
  void apply(CycleModel& m) const override {
    m.dp = dp;
    m.revision = revision;
    m.steps_in_phase = 0;
    m.start_steps.push_back(m.total_steps);
  }
  void run(const CycleModel&, ScenarioBuilder& b) const override {
    sim::PhaseSpec p;
    p.dp = dp;
    p.set_revision(revision);
    b.phases.push_back(p);
  }
  void show(std::ostream& os) const override {
    os << "SaveResume(dp=" << dp << ", " << revision.name << ")";
  }
};

}  // namespace

rc::Gen<sim::Scenario> gen_scenario_stateful(const GeneratorConfig& config) {
  GeneratorConfig base = config;
  base.stateful = false;
  base.phases_max = 1;
  return gen::exec([config, base] {
    sim::Scenario s = *gen_scenario(base);  // params, optimizer and layout; phases follow
    CycleModel m0;
    m0.revisions = config.revisions;
    m0.phases_max = config.phases_max;
    m0.dp_max = phase_dp_max(config, s);
    m0.steps_max = config.steps_max;
    m0.long_steps_max = config.long_steps_max;
    m0.dp = *gen_dp(m0.dp_max);
    m0.revision = *gen::elementOf(config.revisions);
    // At most 8 commands: the step and phase counts stay small.
    const auto commands =
        *gen::resize(8, rc::state::gen::commands(m0, [](const CycleModel& m) {
                       return rc::state::gen::execOneOfWithArgs<Train, SaveResume>()(m);
                     }));
    ScenarioBuilder builder;
    sim::PhaseSpec first;
    first.dp = m0.dp;
    first.set_revision(m0.revision);
    builder.phases.push_back(first);
    rc::state::runAll(commands, m0, builder);
    CycleModel end = m0;
    rc::state::applyAll(commands, end);
    CKPTSIM_CHECK(end.start_steps.size() == builder.phases.size(),
                  "command model and scenario disagree on phases");
    s.phases = builder.phases;
    CKPTSIM_CHECK(expected_start_steps(s) == end.start_steps,
                  "command model and scenario disagree on steps");
    return s;
  });
}

std::vector<int64_t> expected_start_steps(const sim::Scenario& s) {
  std::vector<int64_t> out;
  int64_t at = 0;
  for (const auto& p : s.phases) {
    out.push_back(at);
    at += p.steps;
  }
  return out;
}

rc::Gen<sim::Scenario> gen_for(const GeneratorConfig& config) {
  if (!config.stateful) return gen_scenario(config);
  if (!config.require_revision_change || config.revisions.size() < 2)
    return gen_scenario_stateful(config);
  // A resume under another revision is what a cross-revision search is for: keep only command
  // sequences with one (RapidCheck retries, and shrinks within the predicate).
  return gen::suchThat(gen_scenario_stateful(config), [](const sim::Scenario& s) {
    for (size_t i = 1; i < s.phases.size(); ++i) {
      if (s.phases[i].revision != s.phases[i - 1].revision) return true;
    }
    return false;
  });
}

}  // namespace ckptsim::search
