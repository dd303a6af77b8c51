// Trajectory family: trajectory_matches_uninterrupted (master params, moments and model params
// equal the uninterrupted run after every step and load: I13, I16) and round_trip_identity (a
// load gives back exactly what was saved: I13).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "properties/common.h"

namespace ckptsim::properties {

namespace {

// The start of the first shard of `param` in `st` that begins in (element, end); `end` if none.
int64_t next_shard_start(const sim::GlobalState& st, size_t param, int64_t element, int64_t end) {
  for (const auto& s : st.shards) {
    if (s.param == param && s.range.start > element && s.range.start < end) end = s.range.start;
  }
  return end;
}

// Compares recorded states with the uninterrupted run's, element by element: bit for bit where
// the same kind of kernel updated the element in both runs so far, within tolerance where a
// reshard moved it to another kernel kind (remembered per element).
class TrajectoryComparison {
 public:
  explicit TrajectoryComparison(const sim::RunResult& run) : run_(run) {
    moved_in_param_.assign(run.scenario.params.size(), false);
    for (const auto& p : run.scenario.params) {
      moved_.emplace_back(static_cast<size_t>(p.numel), kNeverMoved);
      for (auto& field : drift_) field.emplace_back(static_cast<size_t>(p.numel), 0.0);
    }
  }

  // Remembers which elements a step ran under another kernel kind than the reference's, counts
  // the steps since each first did, and adds to each such element's tolerance what this step's
  // rounding may add (kTrajectoryRtolPerStep of the reference's value and of its change since
  // `prev`, the reference one step earlier; nothing where there is none).
  void update_moved(const sim::GlobalState& st, const sim::GlobalState& ref,
                    const sim::GlobalState* prev) {
    if (any_moved_) {
      for (auto& per_param : moved_) {
        for (int64_t& m : per_param) {
          if (m != kNeverMoved) ++m;
        }
      }
    }
    for (const auto& s : st.shards) {
      // The reference's shards hold disjoint ranges (gather_state's invariant 1): walk `s` in
      // runs of one reference shard (or of none), looking each run's shard up once.
      for (int64_t e = s.range.start; e < s.range.end;) {
        const sim::ShardRecord* rs = ref.shard_at(s.param, e);
        const int64_t run_end = rs != nullptr ? std::min(rs->range.end, s.range.end)
                                              : next_shard_start(ref, s.param, e, s.range.end);
        for (; e < run_end; ++e) {
          int64_t& m = moved_[s.param][static_cast<size_t>(e)];
          if (m == kNeverMoved && (rs == nullptr || rs->rounding_class(e) != s.rounding_class(e))) {
            m = 0;
            any_moved_ = true;
            moved_in_param_[s.param] = true;
          }
        }
      }
    }
    if (prev == nullptr || !any_moved_) return;
    const ComparedFields step(ref, *prev);  // a: the reference now, b: a step earlier
    for (size_t i = 0; i < step.fields().size(); ++i) {
      const auto& f = step.fields()[i];
      for (size_t p = 0; p < moved_.size() && p < f.a->size() && p < f.b->size(); ++p) {
        const auto& now = (*f.a)[p];
        const auto& before = (*f.b)[p];
        for (size_t e = 0; e < moved_[p].size() && e < now.size() && e < before.size(); ++e) {
          const double x = now[e];
          const double change = std::fabs(x - static_cast<double>(before[e]));
          if (moved_[p][e] == kNeverMoved || std::isnan(x) || std::isnan(change)) continue;
          drift_[i][p][e] += kTrajectoryRtolPerStep * (std::fabs(x) + change);
        }
      }
    }
  }

  // A failed result when `st` differs from `ref`; nullopt when they agree. Values of `st` that
  // rest on uninitialized memory are not compared (the reference never holds any): they are
  // counted, and the verdict rests on them when nothing else differs.
  std::optional<PropertyResult> compare(const PropertyResult& r, const sim::PhaseRecord& phase,
                                        const sim::GlobalState& st, const sim::GlobalState& ref,
                                        const char* when) {
    ++states_;
    const ComparedFields compared(st, ref);  // a: observed, b: expected
    for (size_t i = 0; i < compared.fields().size(); ++i) {
      const auto& f = compared.fields()[i];
      if (f.a->empty() || f.b->empty()) continue;
      for (size_t p = 0; p < run_.scenario.params.size(); ++p) {
        skip_uninitialized(st, i, p, phase, when);
        if (auto detail = compare_param(f, drift_[i][p], p, phase, st, when)) {
          return fail(r, static_cast<int>(phase.index),
                      std::string("trajectory_matches_uninterrupted:") + f.name, *detail);
        }
      }
    }
    return std::nullopt;
  }

  std::string summary() const {
    return fmt::format(
        "{} states compared with the uninterrupted run: {} element values bit for bit, {} within "
        "tolerance (moved between kernel kinds)",
        states_, bitwise_, tolerant_);
  }

  // Why the verdict rests on uninitialized memory; empty when no compared value does.
  std::string resting_on_uninitialized() const {
    if (uninitialized_ == 0) return "";
    return fmt::format(
        "rests on uninitialized memory: {}; {} element values derive from it (the first: {}), "
        "the real code's are whatever the CUDA allocator handed back; every other value agrees "
        "({})",
        origin_, uninitialized_, first_uninitialized_, summary());
  }

 private:
  // Marks which elements of field `i` (ComparedFields order) of param `p` compare_param skips.
  void skip_uninitialized(const sim::GlobalState& st, size_t i, size_t p,
                          const sim::PhaseRecord& phase, const char* when) {
    skip_.clear();
    const sim::Uninitialized& u = st.uninitialized;
    if (!u.any()) return;
    const std::array<const sim::Uninitialized::Field*, 4> marks = {&u.master, &u.exp_avg,
                                                                   &u.exp_avg_sq, &u.param};
    const auto& field = *marks.at(i);
    if (p >= field.size()) return;
    skip_ = field[p];
    const auto n = static_cast<int64_t>(std::count(skip_.begin(), skip_.end(), uint8_t{1}));
    if (n == 0) return;
    if (uninitialized_ == 0) {
      static constexpr std::array<const char*, 4> kNames = {"master param", "exp_avg", "exp_avg_sq",
                                                            "model param"};
      const auto e = std::find(skip_.begin(), skip_.end(), uint8_t{1}) - skip_.begin();
      origin_ = u.origin;
      first_uninitialized_ =
          fmt::format("{} of {}[{}] in {}, {} global step {}", kNames.at(i),
                      run_.scenario.params[p].name, e, phase_label(phase), when, st.global_step);
    }
    uninitialized_ += n;
  }

  std::optional<std::string> compare_param(const ComparedFields::Field& f,
                                           const std::vector<double>& drift, size_t p,
                                           const sim::PhaseRecord& phase,
                                           const sim::GlobalState& st, const char* when) {
    const auto& params = run_.scenario.params;
    const auto& o = (*f.a)[p];
    const auto& x = (*f.b)[p];
    // Where no element of the param has moved or is skipped, every element is compared bit for
    // bit: equal bytes are equal values (bitwise_equal), so one comparison of the arrays does.
    if (!moved_in_param_[p] && skip_.empty() && o.size() == x.size() &&
        std::memcmp(o.data(), x.data(), o.size() * sizeof(float)) == 0) {
      bitwise_ += static_cast<int64_t>(o.size());
      return std::nullopt;
    }
    const bool bf16 =
        std::string(f.name) == "model param" && params[p].dtype == model::DType::kBFloat16;
    int64_t differing = 0;
    double max_diff = 0;
    int64_t first = -1;
    bool first_moved = false;
    int64_t first_steps = 0;
    double first_drift = 0;
    for (size_t e = 0; e < o.size(); ++e) {
      if (e < skip_.size() && skip_[e] != 0) continue;  // rests on uninitialized memory
      const int64_t steps = moved_[p][e];
      const bool m = steps != kNeverMoved;
      const bool ok = m ? within_tolerance(o[e], x[e], bf16, drift[e]) : bitwise_equal(o[e], x[e]);
      (m ? tolerant_ : bitwise_)++;
      if (ok) continue;
      ++differing;
      max_diff =
          std::max(max_diff, std::fabs(static_cast<double>(o[e]) - static_cast<double>(x[e])));
      if (first < 0) {
        first = static_cast<int64_t>(e);
        first_moved = m;
        first_steps = steps;
        first_drift = drift[e];
      }
    }
    if (differing == 0) return std::nullopt;
    const sim::ShardRecord* s = st.shard_at(p, first);
    return fmt::format(
        "{}, {} global step {}: {} of {}[{}] is {} (uninterrupted run: {}); comparison {}; {} of "
        "{} elements of {} differ, max |diff| {:.3g}{}",
        phase_label(phase), when, st.global_step, f.name, params[p].name, first, num(o[first]),
        num(x[first]),
        first_moved
            ? fmt::format("within tolerance (rtol {:g}, atol {:g}, plus {:.3g} for the {} "
                          "steps since the reshard moved the element to another kernel kind)",
                          kTrajectoryRtol, kTrajectoryAtol, first_drift, first_steps)
            : "bitwise (the same kernel kind updated the element in both runs)",
        differing, o.size(), params[p].name, max_diff,
        s != nullptr ? ", updated by " + shard_label(run_, *s) : "");
  }

  const sim::RunResult& run_;
  static constexpr int64_t kNeverMoved = -1;
  // Per param and element: kNeverMoved, or the steps since it first moved (0 at that step).
  std::vector<std::vector<int64_t>> moved_;
  // Per compared field (ComparedFields order), param and element: the tolerance the steps since
  // the move add (update_moved).
  std::array<std::vector<std::vector<double>>, 4> drift_;
  bool any_moved_ = false;            // no drift to add up before an element has moved
  std::vector<bool> moved_in_param_;  // per param: whether any of its elements has moved
  std::vector<uint8_t> skip_;         // per element of the param compare_param compares next
  int64_t uninitialized_ = 0;  // element values not compared: they rest on uninitialized memory
  std::string origin_;
  std::string first_uninitialized_;
  int64_t bitwise_ = 0;
  int64_t tolerant_ = 0;
  int64_t states_ = 0;
};

// Per element, the step counter of the shard that holds it (none counts as 0).
std::vector<double> element_counters(const sim::GlobalState& st, size_t p, int64_t numel) {
  std::vector<double> out(static_cast<size_t>(numel), 0.0);
  for (const auto& s : st.shards) {
    if (s.param != p) continue;
    for (int64_t e = s.range.start; e < s.range.end && e < numel; ++e)
      out[static_cast<size_t>(e)] = counter_value(s.counter);
  }
  return out;
}

// What differs between the loaded and the saved state, as (signature part, detail); nullopt
// when the load gave everything back. `groups`: compare the param groups too (not where the
// resumed job was started with other schedule arguments: their lr and bounds then differ by
// design, and hyperparams_follow_schedule judges them).
// `resting`: counts the values not compared because the loaded one rests on uninitialized memory
// the saved one did not hold (the load left it as torch.empty made it; a value that was already
// uninitialized when saved and was loaded back is a copy, compared like any other), and keeps
// the first such as "<field> of <param>[<e>]".
struct Resting {
  int64_t count = 0;
  std::string first;
};

std::optional<std::pair<std::string, std::string>> round_trip_difference(
    const sim::RunResult& run, const sim::GlobalState& loaded, const sim::GlobalState& saved,
    bool groups, Resting& resting) {
  const ComparedFields compared(loaded, saved);
  const std::array<std::pair<const sim::Uninitialized::Field*, const sim::Uninitialized::Field*>, 4>
      marks = {{{&loaded.uninitialized.master, &saved.uninitialized.master},
                {&loaded.uninitialized.exp_avg, &saved.uninitialized.exp_avg},
                {&loaded.uninitialized.exp_avg_sq, &saved.uninitialized.exp_avg_sq},
                {&loaded.uninitialized.param, &saved.uninitialized.param}}};
  for (size_t i = 0; i < compared.fields().size(); ++i) {
    const auto& f = compared.fields()[i];
    for (size_t q = 0; q < run.scenario.params.size() && q < f.a->size() && q < f.b->size(); ++q) {
      for (size_t e = 0; e < (*f.a)[q].size(); ++e) {
        const auto at = static_cast<int64_t>(e);
        if (sim::Uninitialized::marked(*marks[i].first, q, at) &&
            !sim::Uninitialized::marked(*marks[i].second, q, at)) {
          if (resting.count++ == 0)
            resting.first = fmt::format("{} of {}[{}]", f.name, param_name(run, q), e);
          continue;
        }
        if (bitwise_equal((*f.a)[q][e], (*f.b)[q][e])) continue;
        return std::make_pair(
            std::string(f.name),
            fmt::format("{} of {}[{}] is {} after the load, {} when saved", f.name,
                        param_name(run, q), e, num((*f.a)[q][e]), num((*f.b)[q][e])));
      }
    }
  }
  for (size_t q = 0; q < run.scenario.params.size(); ++q) {
    const int64_t n = run.scenario.params[q].numel;
    const auto a = element_counters(loaded, q, n);
    const auto b = element_counters(saved, q, n);
    for (size_t e = 0; e < a.size(); ++e) {
      if (a[e] == b[e]) continue;
      const sim::ShardRecord* s = loaded.shard_at(q, static_cast<int64_t>(e));
      return std::make_pair(
          std::string("step"),
          fmt::format("the step counter of {} is {} after the load, {} when saved",
                      s != nullptr ? shard_label(run, *s) : param_name(run, q), num(a[e]),
                      num(b[e])));
    }
  }
  if (groups && loaded.param_groups != saved.param_groups) {
    return std::make_pair(std::string("param_groups"),
                          fmt::format("param groups after the load {} ; when saved {}",
                                      loaded.param_groups, saved.param_groups));
  }
  return std::nullopt;
}

}  // namespace

// A TP rank's copy of a replicated param that is not TP rank 0's: the uninterrupted run's
// replicas are equal (every TP rank gets the same gradient), so the resumed run's must be too.
std::optional<PropertyResult> replicas_differ(PropertyResult& r, const sim::PhaseRecord& p,
                                              const sim::GlobalState& st, const char* when) {
  if (st.replica_differences.empty()) return std::nullopt;
  return fail(std::move(r), static_cast<int>(p.index), "trajectory_matches_uninterrupted:replica",
              fmt::format("{} {} global step {}: {}", phase_label(p), when, st.global_step,
                          st.replica_differences.front()));
}

PropertyResult trajectory_matches_uninterrupted(const sim::RunResult& run) {
  PropertyResult r = pass("trajectory_matches_uninterrupted");
  TrajectoryComparison comparison(run);
  std::string not_evaluated;
  for (const auto& p : run.phases) {
    if (!p.ran) continue;
    if (p.index > 0 && !p.started_fresh) {  // a phase that found no tracker loaded nothing
      if (!p.after_load.has_value()) {
        if (not_evaluated.empty()) not_evaluated = phase_label(p) + ": the load did not complete";
        continue;
      }
      if (auto f = replicas_differ(r, p, *p.after_load, "after the load at")) return *f;
      // A restored state holds no kernel decision yet: compare with the history so far.
      if (const sim::GlobalState* ref = run.reference_after_load(p)) {
        if (auto f = comparison.compare(r, p, *p.after_load, *ref, "after the load at")) return *f;
      }
    }
    for (const auto& st : p.after_step) {
      const sim::GlobalState* ref = run.reference_at(st.global_step);
      if (ref == nullptr) continue;
      if (auto f = replicas_differ(r, p, st, "after")) return *f;
      comparison.update_moved(st, *ref, run.reference_at(st.global_step - 1));
      if (auto f = comparison.compare(r, p, st, *ref, "after")) return *f;
    }
  }
  if (!not_evaluated.empty()) return mark_not_evaluated(std::move(r), not_evaluated);
  // Nothing else differs, but some values were not compared: the verdict would rest on them.
  if (const std::string why = comparison.resting_on_uninitialized(); !why.empty())
    return mark_not_evaluated(std::move(r), why);
  r.detail = comparison.summary();
  return r;
}

PropertyResult round_trip_identity(const sim::RunResult& run) {
  PropertyResult r = pass("round_trip_identity");
  int loads = 0;
  std::string not_evaluated;
  Resting resting;
  std::string resting_origin;
  for (const auto& p : run.phases) {
    // A --no-load-optim resume gives back the model params only, and its optimizer starts
    // from them: first_step_continues_from_loaded_weights judges it.
    if (p.index == 0 || p.started_fresh || p.spec.fresh_optimizer()) continue;
    const sim::PhaseRecord* prev = run.loaded_from(p);
    const sim::GlobalState* saved = run.loaded_state(p);
    if (!p.ran || !p.after_load.has_value() || saved == nullptr) {
      if (not_evaluated.empty()) not_evaluated = phase_label(p) + ": the load did not complete";
      continue;
    }
    ++loads;
    const bool same_arguments =
        run.scenario.schedule_of(p.index) == run.scenario.schedule_of(prev->index);
    const int64_t resting_before = resting.count;
    if (auto d = round_trip_difference(run, *p.after_load, *saved, same_arguments, resting)) {
      return fail(std::move(r), static_cast<int>(p.index), "round_trip_identity:" + d->first,
                  fmt::format("{}: the load did not give back what phase {} saved at global "
                              "step {}: {}",
                              phase_label(p), prev->index, saved->global_step, d->second));
    }
    if (resting_before == 0 && resting.count > 0) {
      resting_origin =
          fmt::format("{} (the first: {} after the load of {})", p.after_load->uninitialized.origin,
                      resting.first, phase_label(p));
    }
  }
  if (!not_evaluated.empty() && loads == 0) return mark_not_evaluated(std::move(r), not_evaluated);
  // Everything else was given back; the values the load left uninitialized were not compared.
  if (resting.count > 0) {
    return mark_not_evaluated(
        std::move(r),
        fmt::format("rests on uninitialized memory: {}; {} loaded element values derive from it "
                    "where the checkpoint held other values (the real code's are whatever the "
                    "CUDA allocator handed back); every other value, step counter and param group "
                    "was given back",
                    resting_origin, resting.count));
  }
  r.detail = fmt::format(
      "{} load(s) gave back the saved master params, moments, model params, step counters and "
      "param groups exactly",
      loads);
  return r;
}

}  // namespace ckptsim::properties
