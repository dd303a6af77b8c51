#include "search/search.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "model/py/runtime.h"
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
  return options.time_budget_s > 0 && clock.seconds() >= options.time_budget_s;
}

// Shrink candidates without repeats: a candidate is kept unless it equals the scenario it
// shrinks or an earlier candidate, compared as scenario files (sim::scenario_to_json).
class Candidates {
 public:
  explicit Candidates(const sim::Scenario& from) : from_(key(from)) {}
  void add(const sim::Scenario& c) {
    std::string k = key(c);
    if (k == from_ || std::find(keys_.begin(), keys_.end(), k) != keys_.end()) return;
    keys_.push_back(std::move(k));
    out_.push_back(c);
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

Judge property_judge(std::vector<std::string> only) {
  return [only](const sim::Scenario& s) -> std::optional<Finding> {
    auto run = sim::run_scenario(s);
    CKPTSIM_CHECK(run.is_ok(), "a generated scenario could not run: " + run.status().to_string());
    for (const auto& p : properties::all_properties()) {
      if (!only.empty() && std::find(only.begin(), only.end(), p.name) == only.end()) continue;
      const properties::PropertyResult r = p.check(run.value());
      if (r.verdict == properties::Verdict::kFail) {
        const std::string revision = r.phase >= 0 && static_cast<size_t>(r.phase) < s.phases.size()
                                         ? s.phases[r.phase].revision
                                         : "";
        return Finding{r.name, r.signature.empty() ? r.name : r.signature, r.detail, revision,
                       std::nullopt};
      }
    }
    return std::nullopt;
  };
}

namespace {

// Shrinks one failing case toward the same cause, in two stages (search.h): RapidCheck's own
// shrinks, then domain shrinks to a fixpoint. Every judge run counts against shrink_runs_max.
class Shrinker {
 public:
  Shrinker(const SearchOptions& options, const Judge& judge, const Clock& clock,
           SearchResult& result)
      : options_(options), judge_(judge), clock_(clock), result_(result) {}

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
      while (auto candidate = candidates.next()) {
        if (!within_budget(failure)) break;
        const sim::Scenario value = candidate->value();
        lock.unlock();
        const bool same = judged_same(value, failure, current);
        lock.lock();
        if (same) {
          shrinkable = *candidate;
          progressed = true;
          break;
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

  // Runs the judge on a candidate; true (and `current` updated) when it fails for the same cause.
  bool judged_same(const sim::Scenario& candidate, Failure& failure, Finding& current) {
    ++failure.shrink_runs;
    ++result_.judge_runs;
    const std::optional<Finding> f = judge_(candidate);
    if (!f || !f->same_cause(current)) return false;
    current = *f;
    ++failure.shrink_steps;
    return true;
  }

  void shrink_by_domain(Failure& failure, Finding& current) {
    for (bool progressed = true; progressed && within_budget(failure);) {
      progressed = false;
      for (const sim::Scenario& candidate : domain_shrinks(failure.minimal)) {
        if (!within_budget(failure)) break;
        if (judged_same(candidate, failure, current)) {
          failure.minimal = candidate;
          progressed = true;
          break;
        }
      }
    }
  }

  const SearchOptions& options_;
  const Judge& judge_;
  const Clock& clock_;
  SearchResult& result_;
};

}  // namespace

SearchResult search(const SearchOptions& options, const Judge& judge) {
  CKPTSIM_CHECK(options.cases >= 0 && options.cases <= SearchOptions::kCasesMax,
                "cases out of range");
  CKPTSIM_CHECK(
      options.shrink_runs_max >= 0 && options.shrink_runs_max <= SearchOptions::kShrinkRunsMax,
      "shrink_runs_max out of range");
  SearchResult result;
  const Clock clock;
  Shrinker shrinker(options, judge, clock, result);
  const rc::Gen<sim::Scenario> gen = gen_for(options.generator);
  double last_progress = 0;
  for (int64_t k = 0; k < options.cases; ++k) {
    if (out_of_time(options, clock)) {
      result.stopped_by_time = true;
      break;
    }
    const uint64_t case_seed = model::mix_seed(options.seed, static_cast<uint64_t>(k));
    const int size = static_cast<int>(k % (options.size_max + 1));
    std::unique_lock rc_lock(rapidcheck_mutex());
    rc::Shrinkable<sim::Scenario> shrinkable = gen(rc::Random(case_seed), size);
    const sim::Scenario original = shrinkable.value();
    rc_lock.unlock();
    result.coverage.add(original);
    ++result.cases_run;
    ++result.judge_runs;
    std::optional<Finding> finding = judge(original);
    if (options.progress && (clock.seconds() - last_progress >= 2.0 || k + 1 == options.cases)) {
      last_progress = clock.seconds();
      options.progress(fmt::format("{} / {} cases, {} failure(s), {:.0f} cases/s", k + 1,
                                   options.cases, result.failures.size(),
                                   (k + 1) / std::max(clock.seconds(), 1e-9)));
    }
    if (!finding) continue;
    const bool known =
        std::any_of(result.failures.begin(), result.failures.end(),
                    [&](const Failure& f) { return f.finding.same_cause(*finding); });
    if (known) continue;
    rc_lock.lock();
    Failure failure = shrinker.shrink(std::move(shrinkable), *finding, k, rc_lock);
    rc_lock.unlock();
    if (options.progress) {
      options.progress(fmt::format("case {}: {} ({}); shrunk in {} steps over {} runs", k,
                                   failure.finding.property, failure.finding.signature,
                                   failure.shrink_steps, failure.shrink_runs));
    }
    result.failures.push_back(std::move(failure));
    if (!options.keep_going) break;
  }
  result.seconds = clock.seconds();
  return result;
}

nlohmann::json found_scenario_json(const Failure& f, uint64_t seed, const std::string& how,
                                   const std::string& tag) {
  sim::Scenario s = f.minimal;
  s.name = fmt::format("found-{}-seed{}-{}case{}", f.finding.property, seed,
                       tag.empty() ? "" : tag + "-", f.case_index);
  s.description = fmt::format("Found by `{}` (case {}, shrunk in {} steps): {}", how, f.case_index,
                              f.shrink_steps, f.finding.detail);
  s.expect = nullptr;
  return sim::scenario_to_json(s);
}

std::vector<sim::Scenario> draw(const SearchOptions& options) {
  CKPTSIM_CHECK(options.cases >= 0 && options.cases <= SearchOptions::kCasesMax,
                "cases out of range");
  const rc::Gen<sim::Scenario> gen = gen_for(options.generator);
  std::vector<sim::Scenario> out;
  std::unique_lock lock(rapidcheck_mutex());
  for (int64_t k = 0; k < options.cases; ++k) {
    const uint64_t case_seed = model::mix_seed(options.seed, static_cast<uint64_t>(k));
    out.push_back(gen(rc::Random(case_seed), static_cast<int>(k % (options.size_max + 1))).value());
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
