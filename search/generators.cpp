#include "search/generators.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <rapidcheck/state.h>

#include "model/faults.h"
#include "model/megatron/param_and_grad_buffer.h"

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

rc::Gen<model::ParamSpec> gen_param(uint32_t bf16_weight) {
  return gen::exec([bf16_weight] {
    model::ParamSpec p;
    p.numel = *gen_numel();
    p.dtype = *gen::weightedElement<model::DType>(
        {{bf16_weight, model::DType::kBFloat16}, {1, model::DType::kFloat32}});
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

// A resume with the arguments the previous phase was started with: under Megatron's default
// (neither flag) mostly, or either flag now and then; the previous flag when the checkpoint's
// schedule differs from those arguments (after a --use-checkpoint resume with new arguments).
void keep_resume_arguments(sim::Scenario& s, size_t i) {
  using model::SchedulerResume;
  sim::PhaseSpec& p = s.phases[i];
  const model::ScheduleConfig& before = s.schedule_of(i - 1);
  if (before != s.schedule) p.schedule = before;
  const bool checkpoint_differs = sim::intended_schedules(s)[i - 1] != before;
  p.opt_param_scheduler =
      checkpoint_differs
          ? s.phases[i - 1].opt_param_scheduler
          : *gen::weightedElement<SchedulerResume>({{4, SchedulerResume::kNeither},
                                                    {1, SchedulerResume::kOverride},
                                                    {1, SchedulerResume::kUseCheckpoint}});
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
    keep_resume_arguments(s, i);
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

// --no-load-optim in one resume of eight (drawn last but for --finetune, so the rest of a case is
// what it was before this was drawn; not with storage faults, which the scenario refuses it with).
void draw_no_load_optim(sim::Scenario& s) {
  for (size_t i = 1; i < s.phases.size(); ++i)
    s.phases[i].no_load_optim = *gen::weightedElement<bool>({{7, false}, {1, true}});
}

// --finetune in one of the other resumes of sixteen (drawn after --no-load-optim, so a case
// without it is what it was before; not a job of no steps that saves: train() makes no save at
// iteration 0, which the scenario refuses).
void draw_finetune(sim::Scenario& s) {
  for (size_t i = 1; i < s.phases.size(); ++i) {
    sim::PhaseSpec& p = s.phases[i];
    if (p.no_load_optim || (p.steps == 0 && p.saves())) continue;
    p.finetune = *gen::weightedElement<bool>({{15, false}, {1, true}});
  }
}

// Long phases may add up past what a scenario file allows: the later phases give up steps.
void cap_total_steps(sim::Scenario& s) {
  int64_t left = sim::Scenario::kStepsMax;
  for (sim::PhaseSpec& p : s.phases) {
    p.steps = std::min(p.steps, left);
    left -= p.steps;
  }
}

// Fewer params first: the count shrinks, then each param shrinks. One param in bf16_weight + 1
// is fp32.
std::vector<model::ParamSpec> draw_params(const GeneratorConfig& config, int size,
                                          uint32_t bf16_weight) {
  std::vector<model::ParamSpec> params =
      *gen::resize(config.params_max, gen::nonEmpty(gen::container<std::vector<model::ParamSpec>>(
                                          gen::resize(size, gen_param(bf16_weight)))));
  // nonEmpty() may retry at a larger size: keep the configured bound.
  if (params.size() > static_cast<size_t>(config.params_max))
    params.resize(static_cast<size_t>(config.params_max));
  for (size_t i = 0; i < params.size(); ++i) params[i].name = fmt::format("p{}", i);
  return params;
}

// The optimizer kind and Adam's hyper-parameters; for the hybrid, its offload fraction (drawn
// from `offload`), overlap option and TE presence.
void draw_optimizer(const GeneratorConfig& config, const rc::Gen<double>& offload,
                    sim::Scenario& s) {
  s.optimizer.kind = *gen::elementOf(config.kinds);
  s.optimizer.adam.lr = 0.01;
  s.optimizer.adam.beta1 = 0.9;
  s.optimizer.adam.beta2 = 0.95;
  s.optimizer.adam.eps = 1e-8;
  s.optimizer.adam.weight_decay = 0.1;
  if (s.optimizer.kind == model::OptimizerKind::kHybrid) {
    s.optimizer.offload_fraction = *offload;
    s.optimizer.overlap_cpu_optimizer_d2h_h2d =
        *gen::weightedElement<bool>({{4, false}, {1, true}});
    s.optimizer.te_installed = *gen_te_installed(config.te_installed);
  }
}

// The precision-aware optimizer and its state dtypes (GeneratorConfig::state_dtypes), drawn
// after everything else. torch_adamw cases stay as they are (Megatron without TE refuses it).
void draw_state_dtypes(const GeneratorConfig& config, sim::Scenario& s) {
  if (config.state_dtypes.empty() || s.optimizer.kind == model::OptimizerKind::kTorchAdamW) return;
  model::OptimizerConfig& o = s.optimizer;
  if (o.kind == model::OptimizerKind::kFusedAdam)
    o.precision_aware = *gen::weightedElement<bool>({{1, false}, {3, true}});
  if (!o.uses_precision_aware()) return;
  // fp32 first (elementOf shrinks toward it), each other dtype twice as often.
  std::vector<model::StateDType> choices = {model::StateDType::kFloat32};
  for (model::StateDType d : config.state_dtypes) {
    if (d != model::StateDType::kFloat32) choices.insert(choices.end(), 2, d);
  }
  o.exp_avg_dtype = *gen::elementOf(choices);
  o.exp_avg_sq_dtype = *gen::elementOf(choices);
  o.store_param_remainders = *gen::weightedElement<bool>({{4, true}, {1, false}});
}

// MoE expert params (GeneratorConfig::ep_max), drawn after everything else: nothing where a
// phase has TP or PP above 1 (not modeled with experts) or the case has one param. An EP size
// above 1 rounds every phase's DP down to a multiple of it (DP 7 at EP 2 becomes 6), so that
// odd DP sizes do not keep the draw at EP 1.
void draw_experts(const GeneratorConfig& config, sim::Scenario& s) {
  if (config.ep_max == 1 || s.params.size() < 2) return;
  for (const sim::PhaseSpec& p : s.phases) {
    if (p.tp * p.pp != 1) return;
  }
  if (!*gen::weightedElement<bool>({{1, false}, {1, true}})) return;
  // Shrinks toward EP 1.
  const int64_t ep = config.ep_max >= 4 ? *gen::weightedElement<int64_t>({{1, 1}, {2, 2}, {1, 4}})
                                        : *gen::weightedElement<int64_t>({{1, 1}, {2, 2}});
  const auto sure =
      static_cast<size_t>(*gen::inRange<int64_t>(1, static_cast<int64_t>(s.params.size())));
  for (size_t i = 1; i < s.params.size(); ++i) {
    model::ParamSpec& p = s.params[i];
    p.expert = i == sure || *gen::weightedElement<bool>({{1, false}, {1, true}});
    if (p.expert) p.numel = (p.numel + ep - 1) / ep * ep;
  }
  for (sim::PhaseSpec& p : s.phases) {
    p.ep = ep;
    p.dp = std::max(ep, p.dp / ep * ep);
  }
}

// One bucket or several, the 65536 padding option now and then. REQUIRES: s.params drawn.
void draw_layout(sim::Scenario& s) {
  const int64_t total = s.total_numel();
  const bool one_bucket = *gen::weightedElement<bool>({{1, true}, {1, false}});
  if (!one_bucket) s.bucket_size = *gen::inRange<int64_t>(64, total + 65);
  s.pad_buckets_for_high_nccl_busbw = *gen::weightedElement<bool>({{9, false}, {1, true}});
  s.samples_per_step = 8;
}

// The checkpoint formats: the training loop's default (dp_reshardable) mostly, fully_reshardable
// (--dist-ckpt-optim-fully-reshardable, a third of those mem_efficient) often, and the
// deprecated dp_zero_gather_scatter (what a checkpoint of an older Megatron loads as) now and
// then; a resume switches the flag in one of five. Never fully_sharded_model_space, which no
// training loop saves. Shrinks toward dp_reshardable throughout. Drawn after everything else, so
// that the draws before it are those of the generator without formats.
void draw_formats(const GeneratorConfig& config, sim::Scenario& s) {
  using model::ShardingType;
  const auto allowed = [&](ShardingType t) {
    return config.sharding_types.empty() ||
           std::find(config.sharding_types.begin(), config.sharding_types.end(), t) !=
               config.sharding_types.end();
  };
  const bool all = config.sharding_types.empty();
  std::vector<std::pair<uint32_t, model::CheckpointFormat>> weights;
  if (allowed(ShardingType::kDpReshardable))
    weights.push_back({all ? 6U : 3U, {ShardingType::kDpReshardable, false}});
  if (allowed(ShardingType::kFullyReshardable)) {
    weights.push_back({2, {ShardingType::kFullyReshardable, false}});
    weights.push_back({1, {ShardingType::kFullyReshardable, true}});
  }
  if (allowed(ShardingType::kDpZeroGatherScatter))
    weights.push_back({all ? 1U : 3U, {ShardingType::kDpZeroGatherScatter, false}});
  uint32_t total = 0;
  for (const auto& [w, f] : weights) total += w;
  // A weighted choice that shrinks toward the first entry (dp_reshardable where allowed), at
  // the same odds whatever the case's size (RapidCheck scales inRange with it).
  const auto pick = gen::resize(rc::kNominalSize, gen::inRange<uint32_t>(0, total));
  const auto format = gen::map(pick, [weights](uint32_t x) {
    for (const auto& [w, f] : weights) {
      if (x < w) return f;
      x -= w;
    }
    return weights.back().second;
  });
  s.format = *format;
  for (size_t i = 1; i < s.phases.size(); ++i) {
    if (!*gen::weightedElement<bool>({{4, false}, {1, true}})) continue;
    const model::CheckpointFormat f = *format;
    if (f == s.format) continue;
    s.phases[i].sharding_type = f.sharding_type;
    if (f.mem_efficient) s.phases[i].mem_efficient = true;
  }
}

// TP and PP (GeneratorConfig::tp_max, pp_max): every param a 2-D shape near its drawn numel
// with dims that TP 4 divides, a split (replicated, column or row; shrinking to replicated) and
// a layer (param i in layer i mod L, L the largest of 1, 2, 4 that the params fill and pp_max
// allows), then each phase a TP and a PP in {1, 2, 4}: a resume keeps the previous phase's in
// one draw of two, else draws anew (TP, PP or both change), where the checkpoint it loads is in a
// fully reshardable format. Shrinks toward TP = PP = 1. A phase's world stays within
// `world_max` ranks (PP drawn among the sizes that fit next to its TP; DP cut down).
// Drawn last: a config without them draws nothing here.
void draw_model_parallel(const GeneratorConfig& config, sim::Scenario& s, int64_t world_max) {
  if (config.tp_max == 1 && config.pp_max == 1) return;
  constexpr int64_t kDim = kModelParallelMax;
  int64_t layers = 1;
  while (layers * 2 <= std::min<int64_t>(config.pp_max, static_cast<int64_t>(s.params.size())))
    layers *= 2;
  for (size_t i = 0; i < s.params.size(); ++i) {
    model::ParamSpec& p = s.params[i];
    const auto root = static_cast<int64_t>(std::sqrt(static_cast<double>(p.numel)));
    const int64_t rows = kDim * std::max<int64_t>(1, root / kDim);
    const int64_t cols = kDim * std::max<int64_t>(1, p.numel / rows / kDim);
    p.shape = {rows, cols};
    p.numel = rows * cols;
    p.tp_split = *gen::weightedElement<model::TpSplit>({{1, model::TpSplit::kReplicated},
                                                        {2, model::TpSplit::kColumn},
                                                        {2, model::TpSplit::kRow}});
    p.layer = static_cast<int64_t>(i) % layers;
  }
  const auto sizes = [](int64_t max) {
    std::vector<int64_t> out;
    for (int64_t x = 1; x <= max; x *= 2) out.push_back(x);
    return out;
  };
  const std::vector<int64_t> tps = sizes(std::min(config.tp_max, kModelParallelMax));
  const std::vector<int64_t> pps = sizes(std::min(layers, config.pp_max));
  for (size_t i = 0; i < s.phases.size(); ++i) {
    sim::PhaseSpec& phase = s.phases[i];
    const bool keep = i > 0 && *gen::weightedElement<bool>({{1, false}, {1, true}});
    phase.tp = keep ? s.phases[i - 1].tp : *gen::elementOf(tps);
    std::vector<int64_t> fitting;
    for (int64_t pp : pps) {
      if (phase.tp * pp <= world_max) fitting.push_back(pp);
    }
    phase.pp = keep ? s.phases[i - 1].pp : *gen::elementOf(fitting);
    // Only a model-space checkpoint loads at another TP or PP; a bucket-space one is refused by
    // design (checkpointing.py), which the bundled dp-reshardable-refuses-tp-change shows once.
    if (i > 0 && !model::fully_reshardable_format(s.format_of(i - 1).sharding_type)) {
      phase.tp = s.phases[i - 1].tp;
      phase.pp = s.phases[i - 1].pp;
    }
    phase.dp = std::max<int64_t>(1, std::min(phase.dp, world_max / (phase.tp * phase.pp)));
  }
}

// With config.require_revision_change and two or more revisions: if no phase changed revision,
// the last one takes another (a phase is added to a one-phase scenario).
void ensure_revision_change(const GeneratorConfig& config, sim::Scenario& s) {
  if (!config.require_revision_change || config.revisions.size() < 2) return;
  for (size_t i = 1; i < s.phases.size(); ++i) {
    if (s.phases[i].revision != s.phases[i - 1].revision) return;
  }
  if (s.phases.size() == 1) s.phases.push_back(s.phases.front());
  const std::string& last = s.phases[s.phases.size() - 2].revision;
  s.phases.back().set_revision(last == config.revisions[0].name ? config.revisions[1]
                                                                : config.revisions[0]);
  if (s.phases.back().steps == 0) s.phases.back().steps = 1;
}

// --- The campaign profile (GeneratorConfig::campaign) ---------------------------------------

// Every value of [lo, hi] alike, whatever the case's size (gen::inRange scales its range by it).
rc::Gen<int64_t> full_range(int64_t lo, int64_t hi) {
  return gen::resize(rc::kNominalSize, gen::inRange<int64_t>(lo, hi + 1));
}

// The hybrid's offload fraction: strictly between 0 and 1 in three draws of five (where the
// CPU and GPU parts each hold some params, fp32 ones among them), else 0 or 1.
rc::Gen<double> gen_campaign_offload() {
  return gen::weightedOneOf<double>({
      {1, gen::just(1.0)},
      {1, gen::just(0.0)},
      {1, gen::just(0.5)},
      {2, gen::map(full_range(1, 99), [](int64_t x) { return static_cast<double>(x) / 100.0; })},
  });
}

// The first phase's DP: 1 once in 2 * (dp_max - 1) + 1 draws, every other size twice as often.
int64_t draw_campaign_first_dp(int64_t dp_max) {
  if (dp_max == 1) return 1;
  return *gen::weightedOneOf<int64_t>(
      {{1, gen::just<int64_t>(1)}, {2 * (dp_max - 1), full_range(2, dp_max)}});
}

// A resume's DP: its reshard class first (kCampaignReshardWeights: the same DP, a DP that
// divides or is divided by the previous one, or neither), then a DP of that class in
// [1, dp_max], each alike. A class with no DP in range (neither, after DP 1) is not drawn.
int64_t draw_campaign_resume_dp(int64_t prev, int64_t dp_max) {
  std::vector<int64_t> dividing, not_dividing;
  for (int64_t d = 1; d <= dp_max; ++d) {
    if (d == prev) continue;
    (d % prev == 0 || prev % d == 0 ? dividing : not_dividing).push_back(d);
  }
  const auto [same_w, dividing_w, not_dividing_w] = kCampaignReshardWeights;
  const int reshard = *gen::weightedElement<int>({{same_w, 0},
                                                  {dividing.empty() ? 0 : dividing_w, 1},
                                                  {not_dividing.empty() ? 0 : not_dividing_w, 2}});
  if (reshard == 0) return prev;
  return *gen::elementOf(reshard == 1 ? dividing : not_dividing);
}

// The phases: two or more in nine scenarios of ten (one phase saves but never resumes), DP as
// above, 0, 1 or a few steps each; in one scenario of kCampaignLongPhaseOneIn, one phase of
// about 2^8 steps (kLongBand8), where the search's long phases start.
std::vector<sim::PhaseSpec> draw_campaign_phases(const GeneratorConfig& config, int64_t dp_max,
                                                 int size) {
  const int64_t count = config.phases_max == 1
                            ? 1
                            : *gen::weightedOneOf<int64_t>({{1, gen::just<int64_t>(1)},
                                                            {9, full_range(2, config.phases_max)}});
  std::vector<sim::PhaseSpec> phases(static_cast<size_t>(count));
  for (size_t i = 0; i < phases.size(); ++i) {
    sim::PhaseSpec& p = phases[i];
    p.dp =
        i == 0 ? draw_campaign_first_dp(dp_max) : draw_campaign_resume_dp(phases[i - 1].dp, dp_max);
    p.steps = *gen::resize(size, gen_steps(config.steps_max, 0));
    p.set_revision(*gen::elementOf(config.revisions));
  }
  const bool long_phase =
      config.long_steps_max > kLongBand8.second &&
      *gen::weightedElement<bool>({{kCampaignLongPhaseOneIn - 1, false}, {1, true}});
  if (long_phase) {
    const auto at = static_cast<size_t>(*full_range(0, count - 1));
    phases[at].steps = *full_range(kLongBand8.first, kLongBand8.second);
  }
  return phases;
}

// min_lr never above max_lr (upstream asserts it when the scheduler is built).
void keep_min_lr_below_lr(model::ScheduleConfig& c) {
  if (c.min_lr > c.lr) c.min_lr = c.lr / 10;
  c.lr_warmup_init = std::min(c.lr_warmup_init, c.lr);
}

// A resume in the campaign: new arguments in one resume of four (a new --lr fails upstream-head's
// real load with a KeyError, and the phases after it never run: more would leave upstream-head's
// reshards untried),
// under --override-opt_param-scheduler or --use-checkpoint-opt_param-scheduler alike; what
// changes is --lr, --min-lr, both, the weight decay (--weight-decay, start and end), or --lr and
// the weight decay. A --min-lr change from 0 sets lr / 10.
void draw_campaign_resume_arguments(sim::Scenario& s, size_t i) {
  using model::SchedulerResume;
  const bool change = *gen::weightedElement<bool>({{3, false}, {1, true}});
  if (!change) {
    keep_resume_arguments(s, i);
    return;
  }
  sim::PhaseSpec& p = s.phases[i];
  p.opt_param_scheduler = *gen::elementOf(
      std::vector<SchedulerResume>{SchedulerResume::kOverride, SchedulerResume::kUseCheckpoint});
  model::ScheduleConfig c = s.schedule_of(i - 1);
  enum What { kLr = 1, kMinLr = 2, kWd = 4 };
  const int what = *gen::elementOf(std::vector<int>{kLr, kMinLr, kLr | kMinLr, kWd, kLr | kWd});
  const double factor = *gen::elementOf(std::vector<double>{0.5, 2.0});
  if (what & kLr) c.lr *= factor;
  if (what & kMinLr) c.min_lr = c.min_lr == 0 ? c.lr / 10 : c.min_lr * factor;
  if (what & kWd) {
    c.start_wd *= factor;
    c.end_wd *= factor;
  }
  keep_min_lr_below_lr(c);
  p.schedule = c;
}

// The scenario's params in buffers as Megatron's DDP groups them: one per param dtype, in order
// of first appearance; each a list of indices into s.params.
std::vector<std::vector<size_t>> buffers_of(const sim::Scenario& s) {
  std::vector<std::pair<model::DType, bool>> keys;
  std::vector<std::vector<size_t>> out;
  for (size_t i = 0; i < s.params.size(); ++i) {
    const std::pair<model::DType, bool> key{s.params[i].dtype, s.params[i].expert};
    const auto at = std::find(keys.begin(), keys.end(), key);
    if (at == keys.end()) {
      keys.push_back(key);
      out.push_back({i});
    } else {
      out[static_cast<size_t>(at - keys.begin())].push_back(i);
    }
  }
  return out;
}

// Bucket `b` of the buffer of `numels` holds the params `params` (in layout order) at every DP
// of `dps`, and at each every rank's shard of it holds a param element.
bool bucket_fits(const std::vector<int64_t>& numels, const sim::Scenario& s, size_t b,
                 const std::vector<size_t>& params, const std::vector<int64_t>& dps) {
  for (int64_t dp : dps) {
    const model::LayoutOptions options{dp, s.bucket_size, s.pad_buckets_for_high_nccl_busbw};
    const model::BufferLayout layout = model::build_buffer_layout(numels, options);
    if (b >= layout.buckets.size() || layout.buckets[b].params != params) return false;
    for (int64_t rank = 0; rank < dp; ++rank) {
      if (model::build_bucket_shard(layout, b, rank, dp).param_map.empty()) return false;
    }
  }
  return true;
}

// Bucket b of one buffer, made to fit at every phase's DP by changing the numel of the param
// that closes it (the last one laid out in it: its end is the bucket's unpadded end) to the
// nearest value that fits, up to kCampaignFitNumelMax. Only that bucket moves: the later ones
// start at a multiple of the bucket alignment, so their own layout stays as it was.
void fit_bucket(sim::Scenario& s, const std::vector<size_t>& buffer, size_t b,
                const std::vector<int64_t>& dps, int64_t multiple) {
  std::vector<int64_t> numels;
  for (size_t i : buffer) numels.push_back(s.params[i].numel);
  const model::BufferLayout drawn = model::build_buffer_layout(
      numels, model::LayoutOptions{1, s.bucket_size, s.pad_buckets_for_high_nccl_busbw});
  if (b >= drawn.buckets.size()) return;
  const std::vector<size_t> params = drawn.buckets[b].params;
  if (bucket_fits(numels, s, b, params, dps)) return;
  const size_t closing = params.back();
  const int64_t numel = numels[closing];
  for (int64_t delta = 1; delta < kCampaignFitNumelMax; ++delta) {
    for (const int64_t candidate : {numel + delta, numel - delta}) {
      if (candidate < 1 || candidate > kCampaignFitNumelMax || candidate % multiple != 0) continue;
      numels[closing] = candidate;
      if (bucket_fits(numels, s, b, params, dps)) {
        s.params[buffer[closing]].numel = candidate;
        return;
      }
    }
  }
}

// The campaign's layouts fit every phase's DP: upstream's dp_reshardable save and load assert
// 'empty bucket encountered' where a rank's shard of a bucket holds no param element (B12, which
// only fix-complete allows), and the phases after it never run; with DP up to 8 and small
// params that was most scenarios' first save. So each bucket's closing param grows or shrinks to
// the nearest numel that fits (DP 5 and 7 together need a bucket of 1537 elements or more). Not
// with the 65536 padding option: a bucket of lcm(dp, 128, 65536) fits only at about that many
// elements, so those scenarios (one in ten) keep their drawn params, and with them the
// empty-bucket assertion in the campaign.
void fit_layout(sim::Scenario& s) {
  if (s.pad_buckets_for_high_nccl_busbw) return;
  for (const std::vector<size_t>& buffer : buffers_of(s)) {
    // An expert buffer is sharded over the expert-DP group (DP / EP ranks), and its params'
    // numel stays a multiple of the EP size (the same in every phase).
    const bool expert = s.params[buffer.front()].expert;
    const int64_t ep = expert ? s.phases.front().ep : 1;
    std::vector<int64_t> dps;
    for (const sim::PhaseSpec& p : s.phases) {
      if (std::find(dps.begin(), dps.end(), p.dp / ep) == dps.end()) dps.push_back(p.dp / ep);
    }
    // A buffer has at most one bucket per param; fit_bucket skips the indices past its last.
    for (size_t b = 0; b < buffer.size(); ++b) fit_bucket(s, buffer, b, dps, ep);
  }
}

// The first buffer of some (TP, PP) rank at some phase whose bucket leaves a DP rank's shard
// without a param element, as the scenario's params (indices) it holds; empty when every
// bucket of every buffer of every stage fits. A buffer holds the stage's params of one dtype,
// each its TP piece (local_param_spec).
std::vector<size_t> unfit_model_parallel_buffer(const sim::Scenario& s) {
  for (const sim::PhaseSpec& phase : s.phases) {
    for (int64_t stage = 0; stage < phase.pp; ++stage) {
      const model::ModelParallelRank mp{phase.tp, 0, phase.pp, stage};
      const std::vector<size_t> held = model::params_of_stage(s.params, mp);
      sim::Scenario local = s;
      local.params.clear();
      for (size_t i : held) local.params.push_back(model::local_param_spec(s.params[i], mp));
      // Stages after the first build one bucket per buffer (stage_layout_options).
      local.bucket_size = model::stage_layout_options({phase.dp, s.bucket_size}, stage).bucket_size;
      for (const std::vector<size_t>& buffer : buffers_of(local)) {
        std::vector<int64_t> numels;
        for (size_t i : buffer) numels.push_back(local.params[i].numel);
        const model::BufferLayout layout = model::build_buffer_layout(
            numels,
            model::LayoutOptions{phase.dp, local.bucket_size, s.pad_buckets_for_high_nccl_busbw});
        for (size_t b = 0; b < layout.buckets.size(); ++b) {
          if (bucket_fits(numels, local, b, layout.buckets[b].params, {phase.dp})) continue;
          std::vector<size_t> out;
          for (size_t i : buffer) out.push_back(held[i]);
          return out;
        }
      }
    }
  }
  return {};
}

// The campaign's fit at TP and PP (after draw_model_parallel, which reshapes the params and
// splits them over stages and TP pieces): while some (TP, PP) rank's bucket leaves a DP rank's
// shard empty at some phase, the params of that buffer double their rows (a multiple of 4
// stays one, so every TP size still divides them), up to kCampaignFitNumelMax elements each.
// What still does not fit keeps upstream's empty-bucket assertion, as with the padding option.
void fit_model_parallel_layout(sim::Scenario& s) {
  if (s.pad_buckets_for_high_nccl_busbw) return;
  for (int round = 0; round < 16; ++round) {
    bool grew = false;
    for (size_t i : unfit_model_parallel_buffer(s)) {
      model::ParamSpec& p = s.params[i];
      if (p.shape.size() != 2 || 2 * p.numel > kCampaignFitNumelMax) continue;
      p.shape[0] *= 2;
      p.numel *= 2;
      grew = true;
    }
    if (!grew) return;
  }
}

rc::Gen<sim::Scenario> gen_campaign_scenario(const GeneratorConfig& config) {
  return gen::exec([config] {
    const int size = *gen::withSize([](int s) { return gen::just(s); });
    sim::Scenario s;
    s.seed = *full_range(0, 999);
    s.params = draw_params(config, size, /*bf16_weight=*/2);
    draw_optimizer(config, gen_campaign_offload(), s);
    draw_layout(s);
    s.phases = draw_campaign_phases(config, phase_dp_max(config, s), size);
    ensure_revision_change(config, s);
    fit_layout(s);
    draw_group_mults(s);
    s.schedule = *gen_schedule(s.optimizer.adam.lr, s.optimizer.adam.weight_decay);
    for (size_t i = 1; i < s.phases.size(); ++i) draw_campaign_resume_arguments(s, i);
    draw_formats(config, s);
    // A real replay runs the world on one GPU: TP x PP x DP processes within --dp-max.
    draw_model_parallel(config, s, config.dp_max);
    if (config.tp_max > 1 || config.pp_max > 1) fit_model_parallel_layout(s);
    draw_state_dtypes(config, s);
    draw_experts(config, s);
    if (std::any_of(s.params.begin(), s.params.end(),
                    [](const model::ParamSpec& p) { return p.expert; }))
      fit_layout(s);
    s.faults = config.faults;
    s.name = "generated";
    return s;
  });
}

}  // namespace

Status GeneratorConfig::validate() const {
  auto range = [](const char* flag, int64_t v, int64_t hi) {
    return v >= 1 && v <= hi
               ? Status::ok()
               : Status::invalid_input(fmt::format("{} must be in [1, {}], got {}", flag, hi, v));
  };
  for (Status s :
       {range("--dp-max", dp_max, sim::Scenario::kDpMax),
        range("--params-max", params_max, kParamsMaxLimit),
        range("--phases-max", phases_max, kPhasesMaxLimit),
        range("--steps-max", steps_max, kStepsMaxLimit),
        range("--tp-max", tp_max, kModelParallelMax), range("--pp-max", pp_max, kModelParallelMax),
        range("--ep-max", ep_max, kModelParallelMax)}) {
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
  if (campaign && stateful)
    return Status::invalid_input("--campaign draws its own phases: it takes no --stateful");
  if (ep_max > 1 && stateful)
    return Status::invalid_input(
        "--ep-max draws MoE params for the phase generator: it takes no --stateful");
  for (const auto& fault : faults) {
    if (!model::is_fault_site(fault))
      return Status::invalid_input("--fault: unknown fault site " + fault);
  }
  return Status::ok();
}

namespace {

// A fault in the save of a job of `phase`'s revision. No `object` fault where the revision keeps
// the common state as a ShardedObject (HEAD): the model writes it as objects/*.pt, the real save
// as an item of rank 0's .distcp, so such a fault has no real counterpart (two crash replays of
// 2026-12-04 fired it in the model only; reports/crash-replay-2026-12-04.md). An `any` fault
// still counts that file among rank 0's writes there: `any` is the kind whose nth write differs
// between the model and the real save anyway (the real one writes a metadata.json marker too).
rc::Gen<sim::StorageFaultSpec> gen_storage_fault(const sim::PhaseSpec& phase) {
  const bool object_file = !phase.profile->switches.common_state_as_sharded_object;
  return gen::exec([object_file] {
    sim::StorageFaultSpec f;
    f.kind = *gen::element(model::StorageFaultKind::kCrashBefore,
                           model::StorageFaultKind::kCrashAfter, model::StorageFaultKind::kTorn,
                           model::StorageFaultKind::kShort, model::StorageFaultKind::kDiskFull);
    f.file = *gen::weightedElement<sim::SaveFile>({{1, sim::SaveFile::kAny},
                                                   {2, sim::SaveFile::kShard},
                                                   {object_file ? 1 : 0, sim::SaveFile::kObject},
                                                   {2, sim::SaveFile::kMetadata},
                                                   {2, sim::SaveFile::kTracker}});
    f.nth = *gen::weightedOneOf<int64_t>(
        {{4, gen::just<int64_t>(0)}, {2, gen::just<int64_t>(1)}, {1, gen::inRange<int64_t>(2, 9)}});
    return f;
  });
}

// GeneratorConfig::storage_faults: a second phase where there is one, one fault in the save of
// a phase before the last, now and then another in a later phase; interval and async saves;
// no resume arguments.
void draw_storage_faults(sim::Scenario& s) {
  if (s.phases.size() < 2) {
    sim::PhaseSpec resume = s.phases.front();
    resume.steps = *gen::inRange<int64_t>(0, 4);
    s.phases.push_back(resume);
    cap_total_steps(s);
  }
  for (auto& p : s.phases) {
    p.save = true;
    p.schedule.reset();
    p.opt_param_scheduler = model::SchedulerResume::kNeither;
    // The training loop's --save-interval and --async-save, with a slow disk now and then.
    p.save_interval = *gen::weightedElement<int64_t>({{4, 0}, {1, 1}, {2, 2}, {1, 3}});
    p.async_save = *gen::weightedElement<bool>({{2, false}, {1, true}});
    if (p.async_save)
      p.async_write_steps = *gen::weightedElement<int64_t>({{2, 0}, {2, 1}, {1, 2}});
  }
  const auto last = static_cast<int64_t>(s.phases.size()) - 1;
  const auto first = static_cast<size_t>(*gen::inRange<int64_t>(0, last));
  s.phases[first].storage_faults.push_back(*gen_storage_fault(s.phases[first]));
  if (*gen::weightedElement<bool>({{3, false}, {1, true}})) {
    const auto second =
        static_cast<size_t>(*gen::inRange<int64_t>(static_cast<int64_t>(first), last + 1));
    if (s.phases[second].storage_faults.size() < sim::Scenario::kStorageFaultsMax)
      s.phases[second].storage_faults.push_back(*gen_storage_fault(s.phases[second]));
  }
}

}  // namespace

int64_t phase_dp_max(const GeneratorConfig& config, const sim::Scenario& s) {
  return s.pad_buckets_for_high_nccl_busbw ? std::min<int64_t>(config.dp_max, kPaddedDpMax)
                                           : config.dp_max;
}

rc::Gen<sim::Scenario> gen_scenario(const GeneratorConfig& config) {
  CKPTSIM_CHECK(!config.revisions.empty(), "a generator config names no revision");
  if (config.campaign) return gen_campaign_scenario(config);
  return gen::exec([config] {
    // The case's size: gen::resize below bounds the container lengths, and would otherwise
    // also shrink every element generator's range (RapidCheck passes the size down).
    const int size = *gen::withSize([](int s) { return gen::just(s); });
    sim::Scenario s;
    s.seed = *gen::inRange<uint64_t>(0, 1000);
    s.params = draw_params(config, size, /*bf16_weight=*/3);
    draw_optimizer(config, gen_offload(), s);
    draw_layout(s);
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
    ensure_revision_change(config, s);
    draw_group_mults(s);
    s.schedule = *gen_schedule(s.optimizer.adam.lr, s.optimizer.adam.weight_decay);
    for (size_t i = 1; i < s.phases.size(); ++i) draw_resume_arguments(s, i);
    draw_formats(config, s);
    draw_model_parallel(config, s, kModelParallelWorldMax);
    if (config.storage_faults) {
      draw_storage_faults(s);
    } else {
      draw_no_load_optim(s);
      draw_finetune(s);
    }
    draw_state_dtypes(config, s);
    draw_experts(config, s);
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
  base.ep_max = 1;  // validate() refuses --ep-max with --stateful
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
