// Step family: step_matches_uninterrupted (every Adam part resumes at, and then uses, the
// uninterrupted run's bias-correction step: I11, I12, I14; B1, B5, B6, B9),
// step_counts_optimizer_steps (the same, absolutely: every counter equals the number of
// optimizer steps taken, in every run including the uninterrupted one) and
// step_tensors_not_aliased (no two params share one step tensor: I14, B9).
#include "properties/step.h"

#include <fmt/format.h>

#include <cmath>

#include "properties/common.h"

namespace ckptsim::properties {

namespace {

void add_comparisons(const sim::RunResult& run, const sim::PhaseRecord& phase,
                     const sim::GlobalState& st, StepComparison::Moment moment,
                     std::vector<StepComparison>& out) {
  const sim::GlobalState* ref = moment == StepComparison::Moment::kAfterLoad
                                    ? run.reference_after_load(phase)
                                    : run.reference_at(st.global_step);
  for (const auto& s : st.shards) {
    StepComparison c;
    c.phase = phase.index;
    c.global_step = st.global_step;
    c.moment = moment;
    c.shard = s;
    c.reference_known = ref != nullptr;
    const sim::ShardRecord* rs = ref != nullptr ? ref->shard_at(s.param, s.range.start) : nullptr;
    if (moment == StepComparison::Moment::kAfterLoad) {
      c.observed = s.counter;
      if (rs != nullptr) c.expected = rs->counter;
    } else {
      c.observed = s.step_used;
      if (rs != nullptr) c.expected = rs->step_used;
    }
    out.push_back(std::move(c));
  }
}

// The mismatch a comparison shows, as a detail line; "" when it agrees (or says nothing).
std::string mismatch(const sim::RunResult& run, const sim::PhaseRecord& p,
                     const StepComparison& c) {
  if (c.moment == StepComparison::Moment::kAfterLoad) {
    const double expected = counter_value(c.expected);
    const double observed = counter_value(c.observed);
    if (expected == observed) return "";
    return fmt::format(
        "{}, after the load at global step {}: the step counter of {} is {} (expected {}, as in "
        "the uninterrupted run){}",
        phase_label(p), p.start_step, shard_label(run, c.shard),
        c.observed ? num(observed) : "none", num(expected),
        !c.observed ? ": no step was restored, so bias correction restarts at t=1" : "");
  }
  const double expected = c.expected.value_or(std::nan(""));
  if (*c.observed == expected) return "";
  return fmt::format(
      "{}, global step {}: {} used bias-correction step t={} (uninterrupted run: t={})",
      phase_label(p), c.global_step, shard_label(run, c.shard), num(*c.observed), num(expected));
}

std::string joined_failures(const std::vector<std::string>& failures) {
  std::string detail = failures.front();
  if (failures.size() > 1)
    detail += fmt::format(" (+{} more mismatches; first ones: ", failures.size() - 1);
  for (size_t i = 1; i < failures.size() && i < 4; ++i) detail += (i > 1 ? "; " : "") + failures[i];
  if (failures.size() > 1) detail += ")";
  return detail;
}

}  // namespace

std::vector<StepComparison> step_comparisons(const sim::RunResult& run,
                                             const sim::PhaseRecord& phase) {
  std::vector<StepComparison> out;
  if (!phase.ran || phase.index == 0 || !phase.after_load.has_value()) return out;
  add_comparisons(run, phase, *phase.after_load, StepComparison::Moment::kAfterLoad, out);
  for (const auto& st : phase.after_step)
    add_comparisons(run, phase, st, StepComparison::Moment::kTraining, out);
  return out;
}

PropertyResult step_matches_uninterrupted(const sim::RunResult& run) {
  PropertyResult r = pass("step_matches_uninterrupted");
  int resumes = 0;
  int64_t checks = 0;
  std::string not_evaluated;
  std::vector<std::string> failures;
  std::string signature;
  int first_phase = -1;
  for (const auto& p : run.phases) {
    if (p.index == 0 || p.started_fresh) continue;  // no resume (no tracker: from random)
    if (!p.ran) {
      // No resume to judge: the checkpoint it would load does not exist (a trace says the
      // same of its skipped run).
      if (not_evaluated.empty())
        not_evaluated = phase_label(p) + ": not run (the checkpoint to resume from does not exist)";
      continue;
    }
    if (!p.after_load.has_value()) {
      if (not_evaluated.empty()) {
        const auto* e = first_primary(p.errors);
        not_evaluated = fmt::format("{}: the load did not complete ({})", phase_label(p),
                                    e != nullptr ? e->summary() : "no state");
      }
      continue;
    }
    ++resumes;
    if (run.reference_after_load(p) == nullptr) {
      failures.push_back(fmt::format("{}: resumed at global step {}, beyond the reference run",
                                     phase_label(p), p.start_step));
      continue;
    }
    for (const StepComparison& c : step_comparisons(run, p)) {
      const bool training = c.moment == StepComparison::Moment::kTraining;
      if (training && (!c.reference_known || !c.observed)) continue;
      ++checks;
      std::string m = mismatch(run, p, c);
      if (m.empty()) continue;
      if (signature.empty()) {
        signature = std::string("step_matches_uninterrupted:") +
                    (training ? "training:" : "after_load:") + sim::part_name(c.shard.part);
      }
      if (first_phase < 0) first_phase = static_cast<int>(p.index);
      failures.push_back(std::move(m));
    }
  }
  if (!failures.empty())
    return fail(std::move(r), first_phase, signature, joined_failures(failures));
  if (!not_evaluated.empty()) return mark_not_evaluated(std::move(r), not_evaluated);
  r.detail = fmt::format(
      "{} resume(s): {} step counters and bias-correction steps equal the uninterrupted run's",
      resumes, checks);
  return r;
}

namespace {

// The absolute check of one recorded state: after global step g (`after_step`) every shard
// that took the step used t = g and advances from g next; right after a load at global step g
// every shard advances from g (no counter counts as 0: a fresh Adam starts there). Steps are
// counted from `origin`, the global steps done before the optimizer started (a --no-load-optim
// resume starts one afresh: sim::optimizer_origins).
void count_mismatches(const sim::RunResult& run, const sim::GlobalState& st, bool after_step,
                      int64_t origin, const std::string& where, std::vector<std::string>& failures,
                      std::string& signature, int64_t& checks) {
  const auto g = static_cast<double>(st.global_step - origin);
  for (const sim::ShardRecord& s : st.shards) {
    if (after_step && !s.step_used.has_value()) continue;  // this part took no step
    ++checks;
    const double counter = counter_value(s.counter);
    const std::optional<double> used = after_step ? s.step_used : std::nullopt;
    if (counter == g && (!used || *used == g)) continue;
    if (signature.empty()) {
      signature = fmt::format("step_counts_optimizer_steps:{}{}",
                              after_step ? "training:" : "after_load:", sim::part_name(s.part));
    }
    failures.push_back(
        used
            ? fmt::format("{}, after global step {}: {} used t={} and holds step {} (right: {})",
                          where, st.global_step, shard_label(run, s), num(*used), num(counter),
                          num(g)) +
                  (origin > 0 ? fmt::format(" (the optimizer started after global step {})", origin)
                              : "")
            : fmt::format("{}, after the load at global step {}: {} holds step {} (right: {})",
                          where, st.global_step, shard_label(run, s), num(counter), num(g)));
  }
}

}  // namespace

PropertyResult step_counts_optimizer_steps(const sim::RunResult& run) {
  PropertyResult r = pass("step_counts_optimizer_steps");
  std::vector<std::string> failures;
  std::string signature;
  int64_t checks = 0;
  int first_phase = -1;
  const std::vector<int64_t> origins = sim::optimizer_origins(run.scenario);
  // The uninterrupted run's optimizer restarts where each --no-load-optim phase resumes.
  const auto reference_origin = [&](int64_t global_step) {
    int64_t origin = 0;
    for (const auto& [at, state] : run.reference_restarts) origin = at < global_step ? at : origin;
    return origin;
  };
  for (const sim::GlobalState& st : run.reference) {
    count_mismatches(run, st, true, reference_origin(st.global_step), "the uninterrupted run",
                     failures, signature, checks);
  }
  for (const auto& p : run.phases) {
    if (!p.ran) continue;
    const size_t before = failures.size();
    const int64_t origin = p.index < origins.size() ? origins[p.index] : 0;
    if (p.after_load) {
      count_mismatches(run, *p.after_load, false, origin, phase_label(p), failures, signature,
                       checks);
    }
    for (const auto& st : p.after_step) {
      count_mismatches(run, st, true, origin, phase_label(p), failures, signature, checks);
    }
    if (before == 0 && failures.size() > before) {  // the first failure (-1: reference run)
      first_phase = static_cast<int>(p.index);
    }
  }
  if (!failures.empty())
    return fail(std::move(r), first_phase, signature, joined_failures(failures));
  r.detail = fmt::format(
      "{} step counters and bias-correction steps (the uninterrupted run's too) equal the number "
      "of optimizer steps taken",
      checks);
  return r;
}

PropertyResult step_tensors_not_aliased(const sim::RunResult& run) {
  PropertyResult r = pass("step_tensors_not_aliased");
  int64_t checked = 0;
  // The first shard of a state whose step tensor is shared, or null.
  auto scan = [&](const sim::GlobalState& st) -> const sim::ShardRecord* {
    for (const auto& s : st.shards) {
      ++checked;
      if (s.step_aliases != 0) return &s;
    }
    return nullptr;
  };
  auto failed = [&](const sim::PhaseRecord& p, const sim::ShardRecord& s, const std::string& when) {
    return fail(
        std::move(r), static_cast<int>(p.index),
        "step_tensors_not_aliased:" + sim::part_name(s.part),
        fmt::format("{} {}: the step tensor of {} is the same object as {} other param(s)' "
                    "(each step() then advances it {} times)",
                    phase_label(p), when, shard_label(run, s), s.step_aliases, s.step_aliases + 1));
  };
  // Every state a trace records too (a trace check reads its init, load, step and save events,
  // the uninterrupted run's included): the same verdict either way.
  for (const auto& p : run.phases) {
    if (!p.ran) continue;
    if (p.initial) {
      if (const auto* s = scan(*p.initial)) return failed(p, *s, "before its first step");
    }
    if (p.after_load) {
      const std::string when = fmt::format("after the load at global step {}", p.start_step);
      if (const auto* s = scan(*p.after_load)) return failed(p, *s, when);
    }
    for (const auto& st : p.after_step) {
      const std::string when = fmt::format("after global step {}", st.global_step);
      if (const auto* s = scan(st)) return failed(p, *s, when);
    }
    if (p.at_save) {
      const std::string when = fmt::format("at the save of global step {}", p.at_save->global_step);
      if (const auto* s = scan(*p.at_save)) return failed(p, *s, when);
    }
  }
  if (checked == 0) return mark_not_evaluated(std::move(r), "no shard state was recorded");
  r.detail = fmt::format("{} shard states: every param has its own step tensor", checked);
  return r;
}

}  // namespace ckptsim::properties
