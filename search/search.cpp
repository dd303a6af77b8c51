#include "search/search.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>

#include "model/megatron/param_and_grad_buffer.h"
#include "model/py/runtime.h"
#include "search/parallel.h"
#include "sim/driver.h"

namespace ckptsim::search {

namespace {

// RapidCheck's generation context (rc::detail::ImplicitParam) lives in process-wide stacks:
// two threads evaluating generators or shrinks at once would corrupt them (invariant 4).
std::mutex& rapidcheck_mutex() {
  static std::mutex m;
  return m;
}

class Clock {
 public:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

bool out_of_time(const SearchOptions& options, const Clock& clock) {
  if (options.stop != nullptr && options.stop->load()) return true;
  return options.time_budget_s > 0 && clock.seconds() >= options.time_budget_s;
}

// Shrink candidates without repeats: a candidate is kept unless it equals the scenario it
// shrinks or an earlier candidate, compared as scenario files (sim::scenario_to_json).
class Candidates {
 public:
  explicit Candidates(const sim::Scenario& from) : from_(key(from)) {}
  void add(sim::Scenario c) {
    // A shrink that breaks the TP/PP rules (fewer elements than a shape, a stage left empty) is
    // not a scenario.
    if (sim::model_parallel_problem(c)) return;
    // The first phase loads nothing: a --no-load-optim or --finetune resume that became it is
    // a plain start.
    if (!c.phases.empty()) c.phases.front().no_load_optim = c.phases.front().finetune = false;
    // A --finetune job of no steps that saves is no scenario (train() saves no iteration 0).
    for (const sim::PhaseSpec& p : c.phases) {
      if (p.finetune && p.steps == 0 && p.saves()) return;
    }
    std::string k = key(c);
    if (k == from_ || std::find(keys_.begin(), keys_.end(), k) != keys_.end()) return;
    keys_.push_back(std::move(k));
    out_.push_back(std::move(c));
  }
  std::vector<sim::Scenario> take() { return std::move(out_); }

 private:
  static std::string key(const sim::Scenario& s) { return sim::scenario_to_json(s).dump(); }
  std::string from_;
  std::vector<std::string> keys_;
  std::vector<sim::Scenario> out_;
};

// Values from lo up to n (exclusive), most aggressive first: lo, then n - d for
// d = (n - lo) / 2, (n - lo) / 4, ..., 1 — so an accepted shrink halves the distance still to
// go, and a value that must stay large is found in O(log n) steps, not n (a param that needs
// 65 elements, shrunk from 128 by n - 1 alone, took 63 steps).
std::vector<int64_t> toward(int64_t lo, int64_t n) {
  std::vector<int64_t> out;
  if (n <= lo) return out;
  out.push_back(lo);
  for (int64_t d = (n - lo) / 2; d >= 1; d /= 2) {
    if (n - d != out.back()) out.push_back(n - d);
  }
  return out;
}

}  // namespace

namespace {

// TP and PP toward 1; a param's split toward replicated, its layer toward 0, its shape toward
// fewer rows and columns (multiples of 4, so that TP 4 still divides them).
void add_model_parallel_shrinks(const sim::Scenario& s, Candidates& out) {
  for (size_t i = 0; i < s.phases.size(); ++i) {
    for (const bool tp : {true, false}) {
      const int64_t size = tp ? s.phases[i].tp : s.phases[i].pp;
      for (int64_t x = 1; x < size; x *= 2) {
        sim::Scenario c = s;
        (tp ? c.phases[i].tp : c.phases[i].pp) = x;
        out.add(c);
      }
    }
  }
  for (size_t i = 0; i < s.params.size(); ++i) {
    const model::ParamSpec& p = s.params[i];
    if (p.tp_split != model::TpSplit::kReplicated) {
      sim::Scenario c = s;
      c.params[i].tp_split = model::TpSplit::kReplicated;
      out.add(c);
    }
    if (p.layer != 0) {
      sim::Scenario c = s;
      c.params[i].layer = 0;
      out.add(c);
    }
    for (size_t d = 0; d < p.shape.size(); ++d) {
      for (int64_t n : toward(1, p.shape[d] / 4)) {
        sim::Scenario c = s;
        c.params[i].shape[d] = 4 * n;
        c.params[i].numel = p.numel / p.shape[d] * 4 * n;
        out.add(c);
      }
    }
  }
}

// Fewer phases (a phase's steps merged into its neighbour), fewer params, DP toward 1, fewer
// elements, fewer steps.
void add_smaller(const sim::Scenario& s, Candidates& out) {
  // Fewer phases: merge phase i into phase i-1 (its steps run before the checkpoint instead),
  // or drop the first phase (its steps move to the next), or drop the last.
  for (size_t i = 0; i < s.phases.size() && s.phases.size() > 1; ++i) {
    sim::Scenario c = s;
    if (i == 0) {
      c.phases[1].steps += c.phases[0].steps;
    } else {
      c.phases[i - 1].steps += c.phases[i].steps;
    }
    c.phases.erase(c.phases.begin() + static_cast<std::ptrdiff_t>(i));
    c.phases.back().save = true;
    out.add(c);
  }
  // Fewer params.
  for (size_t i = 0; i < s.params.size() && s.params.size() > 1; ++i) {
    sim::Scenario c = s;
    c.params.erase(c.params.begin() + static_cast<std::ptrdiff_t>(i));
    for (size_t k = 0; k < c.params.size(); ++k) c.params[k].name = fmt::format("p{}", k);
    if (c.bucket_size && *c.bucket_size > c.total_numel() + 64)
      c.bucket_size = c.total_numel() + 64;
    out.add(c);
  }
  add_model_parallel_shrinks(s, out);
  // DP toward 1.
  for (size_t i = 0; i < s.phases.size(); ++i) {
    for (int64_t dp : toward(1, s.phases[i].dp)) {
      sim::Scenario c = s;
      c.phases[i].dp = dp;
      out.add(c);
    }
  }
  // Fewer elements.
  for (size_t i = 0; i < s.params.size(); ++i) {
    for (int64_t n : toward(1, s.params[i].numel)) {
      sim::Scenario c = s;
      c.params[i].numel = n;
      out.add(c);
    }
  }
  // Fewer steps.
  for (size_t i = 0; i < s.phases.size(); ++i) {
    for (int64_t k : toward(0, s.phases[i].steps)) {
      sim::Scenario c = s;
      c.phases[i].steps = k;
      out.add(c);
    }
  }
}

// One bucket, no 65536 padding, TE installed, offload 0 or 1, bf16, wd_mult and lr_mult 1, a
// constant schedule, resumes with the first phase's arguments and neither scheduler flag,
// seed 0.
void add_simpler(const sim::Scenario& s, Candidates& out) {
  // Simpler options.
  auto variant = [&](auto&& edit) {
    sim::Scenario c = s;
    edit(c);
    out.add(c);
  };
  if (s.bucket_size) variant([](sim::Scenario& c) { c.bucket_size.reset(); });
  if (s.pad_buckets_for_high_nccl_busbw)
    variant([](sim::Scenario& c) { c.pad_buckets_for_high_nccl_busbw = false; });
  if (s.optimizer.overlap_cpu_optimizer_d2h_h2d) {
    variant([](sim::Scenario& c) { c.optimizer.overlap_cpu_optimizer_d2h_h2d = false; });
  }
  if (!s.optimizer.te_installed) variant([](sim::Scenario& c) { c.optimizer.te_installed = true; });
  // fp32 states, then no precision-aware optimizer, and remainders on (upstream's default).
  using DtypeField = model::StateDType model::OptimizerConfig::*;
  for (DtypeField d :
       {&model::OptimizerConfig::exp_avg_dtype, &model::OptimizerConfig::exp_avg_sq_dtype}) {
    if (s.optimizer.*d != model::StateDType::kFloat32)
      variant([d](sim::Scenario& c) { c.optimizer.*d = model::StateDType::kFloat32; });
  }
  if (s.optimizer.precision_aware && s.optimizer.exp_avg_dtype == model::StateDType::kFloat32 &&
      s.optimizer.exp_avg_sq_dtype == model::StateDType::kFloat32) {
    variant([](sim::Scenario& c) {
      c.optimizer.precision_aware = false;
      c.optimizer.store_param_remainders = true;
    });
  }
  if (!s.optimizer.store_param_remainders)
    variant([](sim::Scenario& c) { c.optimizer.store_param_remainders = true; });
  if (s.optimizer.kind == model::OptimizerKind::kHybrid) {
    // Strictly simpler only (1.0 < 0.0 < 0.5 < anything else), so shrinking cannot cycle.
    auto rank = [](double f) { return f == 1.0 ? 0 : f == 0.0 ? 1 : f == 0.5 ? 2 : 3; };
    for (double f : {1.0, 0.0, 0.5}) {
      if (rank(f) < rank(s.optimizer.offload_fraction)) {
        variant([f](sim::Scenario& c) { c.optimizer.offload_fraction = f; });
      }
    }
  }
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.params[i].dtype != model::DType::kBFloat16)
      variant([i](sim::Scenario& c) { c.params[i].dtype = model::DType::kBFloat16; });
    if (s.params[i].wd_mult != 1.0) variant([i](sim::Scenario& c) { c.params[i].wd_mult = 1.0; });
    if (s.params[i].lr_mult != 1.0) variant([i](sim::Scenario& c) { c.params[i].lr_mult = 1.0; });
  }
  // The schedule: constant, then each resume without its own arguments or flag.
  const auto constant =
      model::ScheduleConfig::constant(s.optimizer.adam.lr, s.optimizer.adam.weight_decay);
  if (s.schedule != constant) variant([&](sim::Scenario& c) { c.schedule = constant; });
  for (size_t i = 0; i < s.phases.size(); ++i) {
    if (s.phases[i].schedule) variant([i](sim::Scenario& c) { c.phases[i].schedule.reset(); });
    if (s.phases[i].opt_param_scheduler != model::SchedulerResume::kNeither) {
      variant([i](sim::Scenario& c) {
        c.phases[i].opt_param_scheduler = model::SchedulerResume::kNeither;
      });
    }
    if (s.phases[i].no_load_optim)
      variant([i](sim::Scenario& c) { c.phases[i].no_load_optim = false; });
    if (s.phases[i].finetune) variant([i](sim::Scenario& c) { c.phases[i].finetune = false; });
  }
  if (s.seed != 0) variant([](sim::Scenario& c) { c.seed = 0; });
}

}  // namespace

std::vector<sim::Scenario> domain_shrinks(const sim::Scenario& s) {
  Candidates out(s);
  add_smaller(s, out);
  add_simpler(s, out);
  return out.take();
}

sim::RunResult run_to_judge(const sim::Scenario& s) {
  sim::RunOptions options;
  options.trace_steps = false;  // no property reads the trace
  auto run = sim::run_scenario(s, options);
  CKPTSIM_CHECK(run.is_ok(), "a generated scenario could not run: " + run.status().to_string());
  return std::move(run.value());
}

std::optional<Finding> first_failure(const sim::Scenario& s, const sim::RunResult& run,
                                     const std::vector<std::string>& only, int* phase) {
  for (const auto& p : properties::all_properties()) {
    if (!only.empty() && std::find(only.begin(), only.end(), p.name) == only.end()) continue;
    const properties::PropertyResult r = p.check(run);
    if (r.verdict != properties::Verdict::kFail) continue;
    const std::string revision = r.phase >= 0 && static_cast<size_t>(r.phase) < s.phases.size()
                                     ? s.phases[r.phase].revision
                                     : "";
    if (phase != nullptr) *phase = r.phase;
    return Finding{r.name, r.signature.empty() ? r.name : r.signature, r.detail, revision,
                   std::nullopt};
  }
  return std::nullopt;
}

Judge property_judge(std::vector<std::string> only) {
  return [only](const sim::Scenario& s) -> std::optional<Finding> {
    return first_failure(s, run_to_judge(s), only);
  };
}

namespace {

// Shrinks one failing case toward the same cause, in two stages (search.h): RapidCheck's own
// shrinks, then domain shrinks to a fixpoint. Every judge run counts against shrink_runs_max.
// Candidates are judged up to `jobs` at once, and the first in candidate order that keeps the
// cause wins (invariant 5): the shrink is the sequential one.
class Shrinker {
 public:
  Shrinker(const SearchOptions& options, const Judge& judge, const Clock& clock,
           SearchResult& result, WorkPool& pool, std::atomic<int64_t>& runs)
      : options_(options),
        judge_(judge),
        clock_(clock),
        result_(result),
        pool_(pool),
        runs_(runs) {}

  // REQUIRES: `lock` holds the RapidCheck mutex; it holds it again on return.
  Failure shrink(rc::Shrinkable<sim::Scenario> shrinkable, Finding finding, int64_t case_index,
                 std::unique_lock<std::mutex>& lock) {
    Failure failure;
    failure.original = shrinkable.value();
    failure.case_index = case_index;
    const double start = clock_.seconds();
    Finding current = std::move(finding);
    for (bool progressed = true; progressed && within_budget(failure);) {
      progressed = false;
      auto candidates = shrinkable.shrinks();
      for (bool more = true; more && !progressed && within_budget(failure);) {
        // A batch of candidates, drawn under the lock; judged without it.
        std::vector<rc::Shrinkable<sim::Scenario>> batch;
        auto values = std::make_shared<std::vector<sim::Scenario>>();
        while (static_cast<int64_t>(batch.size()) < batch_max(failure)) {
          auto candidate = candidates.next();
          if (!candidate) {
            more = false;
            break;
          }
          values->push_back(candidate->value());
          batch.push_back(std::move(*candidate));
        }
        lock.unlock();
        const int64_t accepted = first_same_cause(values, failure, current);
        lock.lock();
        if (accepted >= 0) {
          shrinkable = batch[static_cast<size_t>(accepted)];
          progressed = true;
        }
      }
    }
    failure.minimal = shrinkable.value();
    lock.unlock();
    shrink_by_domain(failure, current);
    lock.lock();
    failure.finding = current;
    result_.shrink_seconds += clock_.seconds() - start;
    return failure;
  }

 private:
  bool within_budget(const Failure& f) const {
    return f.shrink_runs < options_.shrink_runs_max && !out_of_time(options_, clock_);
  }

  int64_t batch_max(const Failure& f) const {
    return std::min<int64_t>(std::max(1, pool_.workers()),
                             options_.shrink_runs_max - f.shrink_runs);
  }

  // Judges the candidates in order (up to `jobs` at once) until one fails for the same cause;
  // returns its index (and updates `current`), or -1. Counts each candidate up to that one,
  // exactly as the sequential loop does; the runs judged past it are discarded.
  int64_t first_same_cause(std::shared_ptr<const std::vector<sim::Scenario>> candidates,
                           Failure& failure, Finding& current) {
    const auto count = static_cast<int64_t>(candidates->size());
    JudgedInOrder judged(
        pool_, count, pool_.workers(), /*urgent=*/true,
        [candidates, judge = &judge_](int64_t i) {
          return Judged{std::nullopt, {}, (*judge)((*candidates)[static_cast<size_t>(i)])};
        },
        runs_);
    for (int64_t i = 0; i < count && within_budget(failure); ++i) {
      const Judged j = judged.take(i);
      ++failure.shrink_runs;
      ++result_.judge_runs;
      if (!j.finding || !j.finding->same_cause(current)) continue;
      current = *j.finding;
      ++failure.shrink_steps;
      return i;
    }
    return -1;
  }

  void shrink_by_domain(Failure& failure, Finding& current) {
    for (bool progressed = true; progressed && within_budget(failure);) {
      const auto candidates =
          std::make_shared<const std::vector<sim::Scenario>>(domain_shrinks(failure.minimal));
      const int64_t accepted = first_same_cause(candidates, failure, current);
      progressed = accepted >= 0;
      if (progressed) failure.minimal = (*candidates)[static_cast<size_t>(accepted)];
    }
  }

  const SearchOptions& options_;
  const Judge& judge_;
  const Clock& clock_;
  SearchResult& result_;
  WorkPool& pool_;
  std::atomic<int64_t>& runs_;
};

// Case k as the search draws and judges it: seed mix(seed, k), size case_size(options, k).
// Case k as the search draws it: seed mix(seed, k), size case_size(options, k), under the
// RapidCheck lock (invariant 4).
rc::Shrinkable<sim::Scenario> draw(const rc::Gen<sim::Scenario>& gen, const SearchOptions& options,
                                   int64_t k) {
  const uint64_t case_seed = model::mix_seed(options.seed, static_cast<uint64_t>(k));
  std::lock_guard rc_lock(rapidcheck_mutex());
  return gen(rc::Random(case_seed), case_size(options, k));
}

// Case k drawn and judged.
Judged draw_and_judge(const rc::Gen<sim::Scenario>& gen, const Judge& judge,
                      const SearchOptions& options, int64_t k) {
  Judged out;
  out.shrinkable = draw(gen, options, k);
  {
    std::lock_guard rc_lock(rapidcheck_mutex());
    out.scenario = out.shrinkable->value();
  }
  const Clock clock;
  out.finding = judge(out.scenario);
  out.seconds = clock.seconds();
  return out;
}

void check_options(const SearchOptions& options) {
  CKPTSIM_CHECK(options.cases >= 0 && options.cases <= SearchOptions::kCasesMax,
                "cases out of range");
  CKPTSIM_CHECK(
      options.shrink_runs_max >= 0 && options.shrink_runs_max <= SearchOptions::kShrinkRunsMax,
      "shrink_runs_max out of range");
  CKPTSIM_CHECK(options.jobs >= 1 && options.jobs <= SearchOptions::kJobsMax, "jobs out of range");
  CKPTSIM_CHECK(options.shard.count >= 1 && options.shard.count <= Shard::kCountMax &&
                    options.shard.index >= 1 && options.shard.index <= options.shard.count,
                "shard out of range");
}

// "12 / 250 cases, 1 failure(s), 31 cases/s, jobs 2 (shard 1/2)"
std::string progress_line(const SearchOptions& options, const SearchResult& result,
                          int64_t shard_cases, double seconds) {
  return fmt::format("{} / {} cases, {} failure(s), {:.0f} cases/s, jobs {}{}", result.cases_run,
                     shard_cases, result.failures.size(),
                     static_cast<double>(result.cases_run) / std::max(seconds, 1e-9), options.jobs,
                     options.shard.whole()
                         ? ""
                         : fmt::format(" (shard {}/{})", options.shard.index, options.shard.count));
}

// Case k's new finding as a failure: shrunk (unless options.shrink_if refuses), with when it was
// found and when its shrinking ended, told to the progress line.
Failure commit_finding(const SearchOptions& options, Shrinker& shrinker, const Clock& clock,
                       Judged& judged, int64_t k) {
  const Finding& finding = *judged.finding;
  const double found_s = clock.seconds();
  Failure failure;
  if (options.shrink_if && !options.shrink_if(finding)) {
    failure.original = failure.minimal = judged.scenario;
    failure.finding = finding;
    failure.case_index = k;
    failure.not_shrunk = options.not_shrunk_reason;
  } else {
    std::unique_lock rc_lock(rapidcheck_mutex());
    failure = shrinker.shrink(std::move(*judged.shrinkable), finding, k, rc_lock);
  }
  failure.found_s = found_s;
  failure.shrunk_s = clock.seconds();
  if (options.progress) {
    options.progress(fmt::format(
        "case {}: {} ({}); found at {:.2f} s, {}", k, failure.finding.property,
        failure.finding.signature, failure.found_s,
        failure.not_shrunk.empty() ? fmt::format("shrunk in {} steps over {} runs",
                                                 failure.shrink_steps, failure.shrink_runs)
                                   : failure.not_shrunk));
  }
  return failure;
}

}  // namespace

SearchResult search(const SearchOptions& options, const Judge& judge) {
  check_options(options);
  SearchResult result;
  const Clock clock;
  const rc::Gen<sim::Scenario> gen = gen_for(options.generator);
  std::atomic<int64_t> runs{0};
  // Declared after everything its tasks refer to: destroyed (joined) before them.
  WorkPool pool(options.jobs == 1 ? 0 : options.jobs);
  Shrinker shrinker(options, judge, clock, result, pool, runs);
  // The shard's cases: k = first, first + stride, ... below options.cases.
  const int64_t first = options.shard.index - 1;
  const int64_t stride = options.shard.count;
  const int64_t count = options.cases > first ? (options.cases - first + stride - 1) / stride : 0;
  std::optional<DearFirst> dear_first;
  if (options.dear_first) {
    dear_first = DearFirst{[&gen, &options, first, stride](int64_t i) {
      const rc::Shrinkable<sim::Scenario> drawn = draw(gen, options, first + i * stride);
      std::lock_guard rc_lock(rapidcheck_mutex());
      return predicted_cost(drawn.value());
    }};
  }
  JudgedInOrder cases(
      pool, count, SearchOptions::kCasesAhead, /*urgent=*/false,
      [&gen, &judge, &options, first, stride](int64_t i) {
        return draw_and_judge(gen, judge, options, first + i * stride);
      },
      runs, std::move(dear_first));
  double last_progress = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (out_of_time(options, clock)) {
      result.stopped_by_time = true;
      break;
    }
    const int64_t k = first + i * stride;
    Judged judged = cases.take(i);
    if (options.record_case_times) {
      const CostTerms terms = cost_terms(judged.scenario);
      result.case_times.push_back(
          {k, case_size(options, k), terms, predicted_cost(terms), judged.seconds});
    }
    result.coverage.add(judged.scenario);
    ++result.cases_run;
    ++result.judge_runs;
    if (options.progress && (clock.seconds() - last_progress >= 2.0 || i + 1 == count)) {
      last_progress = clock.seconds();
      options.progress(progress_line(options, result, count, clock.seconds()));
    }
    if (!judged.finding) continue;
    const Finding& finding = *judged.finding;
    const bool known = std::any_of(result.failures.begin(), result.failures.end(),
                                   [&](const Failure& f) { return f.finding.same_cause(finding); });
    if (known) continue;
    Failure failure = commit_finding(options, shrinker, clock, judged, k);
    result.failures.push_back(std::move(failure));
    if (!options.keep_going) break;
  }
  pool.shutdown();
  result.discarded_runs = runs - result.judge_runs;
  result.seconds = clock.seconds();
  return result;
}

namespace {

// Each rank's grad buffer in phase p, in elements: the params' share of one TP rank laid out in
// buckets padded as the DDP pads them (to lcm(DP, 128), or 65,536 with
// pad_buckets_for_high_nccl_busbw: a small model at DP 5 then holds 327,680 elements a bucket),
// split among the PP stages. Every step zeroes, reduces and gathers the whole buffer.
double buffer_share(const sim::Scenario& s, const sim::PhaseSpec& p) {
  const auto elements = static_cast<double>(s.total_numel()) / static_cast<double>(p.tp * p.pp);
  std::vector<int64_t> numels;
  for (auto it = s.params.rbegin(); it != s.params.rend(); ++it) {
    numels.push_back(std::max<int64_t>(1, it->numel / p.tp));
  }
  model::LayoutOptions options;
  options.dp_size = p.dp;
  options.bucket_size = s.bucket_size;
  options.pad_buckets_for_high_nccl_busbw = s.pad_buckets_for_high_nccl_busbw;
  try {
    const model::BufferLayout layout = model::build_buffer_layout(numels, options);
    return static_cast<double>(layout.numel) / static_cast<double>(p.pp);
  } catch (const std::exception&) {
    return elements;  // a shape the DDP refuses: the case fails early, whatever it costs
  }
}

}  // namespace

CostTerms cost_terms(const sim::Scenario& s) {
  const auto numel = static_cast<double>(s.total_numel());
  const auto params = static_cast<double>(s.params.size());
  CostTerms t;
  auto add = [&](const sim::PhaseSpec& p, int64_t steps) {
    const auto ranks = static_cast<double>(p.world());
    t.element_steps +=
        ranks * static_cast<double>(steps) * numel / static_cast<double>(p.tp * p.pp);
    t.buffer_steps += ranks * static_cast<double>(steps) * buffer_share(s, p);
    t.rank_steps += ranks * static_cast<double>(steps);
    t.rank_phases += ranks;
    t.rank_phase_params += ranks * params;
  };
  for (const sim::PhaseSpec& p : s.phases) add(p, p.steps);
  // The uninterrupted reference run: the first phase's ranks, every step.
  if (!s.phases.empty()) add(s.phases.front(), s.total_steps());
  return t;
}

double predicted_cost(const sim::Scenario& s) { return predicted_cost(cost_terms(s)); }

double predicted_cost(const CostTerms& t) {
  // Weights fitted to the judge times of check --revision fix-complete --cases 2000 --jobs 1,
  // seeds 1 and 3 (reports/search-speed.md), relative to one param element's step on one rank.
  return t.element_steps + t.buffer_steps / 32 + 400 * t.rank_steps + 4'000 * t.rank_phases +
         2'400 * t.rank_phase_params;
}

SearchResult merge_shards(std::vector<SearchResult> shards, bool keep_going) {
  SearchResult out;
  std::vector<Failure> all;
  for (SearchResult& s : shards) {
    out.cases_run += s.cases_run;
    out.judge_runs += s.judge_runs;
    out.discarded_runs += s.discarded_runs;
    out.stopped_by_time = out.stopped_by_time || s.stopped_by_time;
    out.seconds = std::max(out.seconds, s.seconds);
    out.shrink_seconds += s.shrink_seconds;
    out.coverage.merge(s.coverage);
    for (Failure& f : s.failures) all.push_back(std::move(f));
  }
  // The first case index of each cause wins: the one the whole search shrinks (invariant 6).
  std::stable_sort(all.begin(), all.end(),
                   [](const Failure& a, const Failure& b) { return a.case_index < b.case_index; });
  for (Failure& f : all) {
    const bool known = std::any_of(out.failures.begin(), out.failures.end(), [&](const Failure& g) {
      return g.finding.same_cause(f.finding);
    });
    if (known) continue;
    out.failures.push_back(std::move(f));
    if (!keep_going) break;
  }
  return out;
}

nlohmann::json found_scenario_json(const Failure& f, uint64_t seed, const std::string& how,
                                   const std::string& tag) {
  sim::Scenario s = f.minimal;
  s.name = fmt::format("found-{}-seed{}-{}case{}", f.finding.property, seed,
                       tag.empty() ? "" : tag + "-", f.case_index);
  s.description = fmt::format(
      "Found by `{}` (case {}, {}): {}", how, f.case_index,
      f.not_shrunk.empty() ? fmt::format("shrunk in {} steps", f.shrink_steps) : f.not_shrunk,
      f.finding.detail);
  s.expect = nullptr;
  return sim::scenario_to_json(s);
}

int case_size(const SearchOptions& options, int64_t case_index) {
  CKPTSIM_CHECK(options.size_max >= 0 && case_index >= 0, "size_max or case index out of range");
  const auto sizes = static_cast<uint64_t>(options.size_max) + 1;
  switch (options.sizes) {
    case SizeSchedule::kRamp:
      return static_cast<int>(static_cast<uint64_t>(case_index) % sizes);
    case SizeSchedule::kFixed:
      CKPTSIM_CHECK(options.fixed_size >= 0 && options.fixed_size <= options.size_max,
                    "fixed size out of range");
      return options.fixed_size;
    case SizeSchedule::kSpread: {
      // u_k = u_0 + k * 2^64 / phi (mod 2^64): the golden-ratio Weyl sequence. Its top 32 bits
      // as a fraction of 2^32, scaled to the sizes: any n consecutive cases leave gaps of at
      // most three lengths between their sizes (the three-distance theorem), none much wider
      // than sizes / n.
      constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
      const uint64_t start = model::mix_seed(options.seed, 0x5157E5ULL);
      const uint64_t u = start + static_cast<uint64_t>(case_index) * kGolden;
      return static_cast<int>(((u >> 32) * sizes) >> 32);
    }
  }
  CKPTSIM_CHECK(false, "unknown size schedule");
  return 0;
}

std::vector<sim::Scenario> draw(const SearchOptions& options) {
  CKPTSIM_CHECK(options.cases >= 0 && options.cases <= SearchOptions::kCasesMax,
                "cases out of range");
  const rc::Gen<sim::Scenario> gen = gen_for(options.generator);
  std::vector<sim::Scenario> out;
  std::unique_lock lock(rapidcheck_mutex());
  for (int64_t k = 0; k < options.cases; ++k) {
    const uint64_t case_seed = model::mix_seed(options.seed, static_cast<uint64_t>(k));
    out.push_back(gen(rc::Random(case_seed), case_size(options, k)).value());
  }
  return out;
}

Status prepare_out_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir, ec)) {
    return Status::io_error(dir + ": cannot create the output directory" +
                            (ec ? ": " + ec.message() : ""));
  }
  return Status::ok();
}

Result<std::string> write_found(const std::string& dir, const Failure& failure, uint64_t seed,
                                const std::string& how, const std::string& tag) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::io_error(dir + ": cannot create: " + ec.message());
  const nlohmann::json j = found_scenario_json(failure, seed, how, tag);
  const std::string path = dir + "/" + j["name"].get<std::string>() + ".json";
  std::ofstream out(path);
  if (!out) return Status::io_error(path + ": cannot write");
  out << j.dump(2) << "\n";
  return path;
}

}  // namespace ckptsim::search
