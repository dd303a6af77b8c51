// Resume family: the load itself. no_duplicate_leaves (merge() never collides: I7, I10; B2,
// B3), resume_completes (every save and load runs to the end on every rank),
// first_step_continues_from_loaded_weights (a --no-load-optim or --finetune resume trains on
// from the weights it loaded, with an optimizer that starts afresh from them) and
// iteration_follows_resume_mode (the iteration the saves name: kept, or reset by --finetune).
#include <fmt/format.h>

#include <cmath>

#include "properties/common.h"
#include "properties/trace.h"

namespace ckptsim::properties {

PropertyResult no_duplicate_leaves(const sim::RunResult& run) {
  PropertyResult r = pass("no_duplicate_leaves");
  int loads = 0;
  for (const auto& p : run.phases) {
    if (!p.ran || p.index == 0) continue;
    ++loads;
    for (const auto& e : p.errors) {
      if (!e.merge_kind.has_value()) continue;
      const char* what = *e.merge_kind == model::MergeError::Kind::kDuplicateLeaf
                             ? "duplicate leaf"
                             : "lists of different lengths";
      return fail(std::move(r), static_cast<int>(p.index),
                  std::string("no_duplicate_leaves:") + what,
                  fmt::format("{} load, rank {}: merge() met {} at path {}; expected no overlap "
                              "between the checkpoint's common state and the load request; "
                              "observed {}: {}",
                              phase_label(p), e.rank, what, model::repr(e.merge_path), e.py_type,
                              e.message));
    }
  }
  r.detail = fmt::format(
      "{} load(s) merged common state, local objects and loaded shards without a collision", loads);
  return r;
}

PropertyResult resume_completes(const sim::RunResult& run) {
  PropertyResult r = pass("resume_completes");
  if (const auto* e = first_primary(run.reference_errors)) {
    return fail(std::move(r), -1, "resume_completes:reference:" + e->py_type + "@" + e->site,
                "the uninterrupted reference run failed: " + e->summary());
  }
  int saves = 0;
  int loads = 0;
  for (const auto& p : run.phases) {
    if (!p.ran) continue;
    if (const auto* e = first_primary(p.errors); e != nullptr && !storage_fault_error(p, *e)) {
      return fail(
          std::move(r), static_cast<int>(p.index),
          "resume_completes:" + e->stage + ":" + e->py_type + "@" + e->site + ":" +
              message_shape(e->message),
          fmt::format("{}: expected every rank to {} without error; observed {}", phase_label(p),
                      p.index == 0 ? "train and save" : "load, train and save", e->summary()));
    }
    saves += p.spec.save ? 1 : 0;
    loads += p.index > 0 ? 1 : 0;
  }
  r.detail = fmt::format("{} save(s) and {} load(s) completed on every rank", saves, loads);
  return r;
}

std::string stopped_before(const sim::RunResult& baseline, const sim::RunResult& candidate,
                           int phase) {
  const auto errors_of = [phase](const sim::RunResult& r) -> const std::vector<sim::RankError>* {
    if (phase < 0) return &r.reference_errors;
    return static_cast<size_t>(phase) < r.phases.size() ? &r.phases[phase].errors : nullptr;
  };
  const auto* candidate_errors = errors_of(candidate);
  const sim::RankError* c = candidate_errors ? first_primary(*candidate_errors) : nullptr;
  if (c == nullptr) return "";
  const std::string run =
      phase < 0 ? std::string("uninterrupted run") : fmt::format("phase {}", phase);
  if (phase >= 0 &&
      (static_cast<size_t>(phase) >= baseline.phases.size() || !baseline.phases[phase].ran)) {
    return fmt::format("the all-baseline run never ran {} (the candidate's fails at its {})", run,
                       c->stage);
  }
  const sim::RankError* b = first_primary(*errors_of(baseline));
  if (b == nullptr || trace::stage_rank(b->stage) >= trace::stage_rank(c->stage)) return "";
  return fmt::format(
      "the all-baseline run's {} stopped at its {} ({}), before the {} where the "
      "candidate's fails",
      run, b->stage, b->py_type, c->stage);
}

namespace {

// The first place where phase `p`'s state right after its --no-load-optim load is not the
// fresh start from the weights it loaded (`saved`: the checkpoint's state): model params other
// than the saved ones, a main param other than its model param, Adam state already there.
std::optional<std::pair<std::string, std::string>> fresh_start_difference(
    const sim::RunResult& run, const sim::GlobalState& loaded, const sim::GlobalState& saved) {
  for (size_t q = 0; q < loaded.param.size() && q < saved.param.size(); ++q) {
    for (size_t e = 0; e < loaded.param[q].size() && e < saved.param[q].size(); ++e) {
      if (bitwise_equal(loaded.param[q][e], saved.param[q][e])) continue;
      return std::pair{
          "model_param",
          fmt::format("after the load, model param {}[{}] is {}; the checkpoint "
                      "holds {}",
                      param_name(run, q), e, num(loaded.param[q][e]), num(saved.param[q][e]))};
    }
  }
  for (size_t q = 0; q < loaded.master.size() && q < loaded.param.size(); ++q) {
    for (size_t e = 0; e < loaded.master[q].size() && e < loaded.param[q].size(); ++e) {
      const float m = loaded.master[q][e];
      if (std::isnan(m) || std::isnan(loaded.param[q][e]) || bitwise_equal(m, loaded.param[q][e]))
        continue;
      return std::pair{"main_param",
                       fmt::format("after the load, the optimizer's main param of {}[{}] is {}, "
                                   "but the loaded weight is {}: the first step would update "
                                   "other weights than the ones loaded",
                                   param_name(run, q), e, num(m), num(loaded.param[q][e]))};
    }
  }
  for (size_t q = 0; q < loaded.moments_present.size(); ++q) {
    for (size_t e = 0; e < loaded.moments_present[q].size(); ++e) {
      if (loaded.moments_present[q][e] == 0) continue;
      return std::pair{"moments", fmt::format("after the load, {}[{}] already has Adam moments "
                                              "(exp_avg {}): the optimizer did not start afresh",
                                              param_name(run, q), e, num(loaded.exp_avg[q][e]))};
    }
  }
  return std::nullopt;
}

// The first element of the first step after a --no-load-optim load that moved further from
// its loaded value than Adam's first step can: |update| = lr |g| / (|g| + eps) < lr, plus the
// decoupled weight decay lr wd |p| (AdamW), plus the rounding to the param's dtype.
std::optional<std::string> first_step_beyond_adam(const sim::RunResult& run,
                                                  const sim::GlobalState& loaded,
                                                  const sim::GlobalState& first) {
  const auto& params = run.scenario.params;
  for (size_t q = 0; q < params.size() && q < loaded.param.size() && q < first.param.size(); ++q) {
    const sim::GroupHyper* h = nullptr;
    for (const sim::GroupHyper& g : first.hypers) {
      if (g.wd_mult == params[q].wd_mult && g.lr_mult == params[q].lr_mult) h = &g;
    }
    if (h == nullptr) continue;  // a pipeline stage's group: rank 0 does not hold it
    for (size_t e = 0; e < loaded.param[q].size() && e < first.param[q].size(); ++e) {
      const double p0 = loaded.param[q][e];
      const double p1 = first.param[q][e];
      if (std::isnan(p0) || std::isnan(p1)) continue;
      const double bound = h->lr * (1.0 + h->weight_decay * std::abs(p0)) * (1.0 + 1e-3) +
                           ulp_of(p1, params[q].dtype);
      if (std::abs(p1 - p0) <= bound) continue;
      return fmt::format(
          "the first step moved {}[{}] from the loaded {} to {}, by more than "
          "Adam's first step with lr {} and weight decay {} can ({}): it did not "
          "start from the loaded weights",
          param_name(run, q), e, num(p0), num(p1), num(h->lr), num(h->weight_decay), num(bound));
    }
  }
  return std::nullopt;
}

}  // namespace

PropertyResult first_step_continues_from_loaded_weights(const sim::RunResult& run) {
  PropertyResult r = pass("first_step_continues_from_loaded_weights");
  int judged = 0;
  int finetuned = 0;
  std::string not_evaluated;
  for (const auto& p : run.phases) {
    if (!p.ran || p.index == 0 || !p.spec.fresh_optimizer() || p.started_fresh) continue;
    const sim::GlobalState* saved = run.loaded_state(p);
    if (!p.after_load.has_value() || saved == nullptr) {
      if (not_evaluated.empty()) not_evaluated = phase_label(p) + ": the load did not complete";
      continue;
    }
    ++judged;
    finetuned += p.spec.finetune ? 1 : 0;
    if (auto d = fresh_start_difference(run, *p.after_load, *saved)) {
      return fail(std::move(r), static_cast<int>(p.index),
                  "first_step_continues_from_loaded_weights:" + d->first,
                  fmt::format("{} ({}): {}", phase_label(p), p.spec.fresh_start_flag(), d->second));
    }
    if (p.after_step.empty()) continue;
    if (auto d = first_step_beyond_adam(run, *p.after_load, p.after_step.front())) {
      return fail(std::move(r), static_cast<int>(p.index),
                  "first_step_continues_from_loaded_weights:first_step",
                  fmt::format("{} ({}): {}", phase_label(p), p.spec.fresh_start_flag(), *d));
    }
  }
  if (judged == 0 && !not_evaluated.empty()) return mark_not_evaluated(std::move(r), not_evaluated);
  const int plain = judged - finetuned;
  const std::string resumes =
      plain > 0 && finetuned > 0
          ? fmt::format("{} --no-load-optim and {} --finetune resume(s)", plain, finetuned)
          : fmt::format("{} {} resume(s)", judged,
                        finetuned > 0 ? "--finetune" : "--no-load-optim");
  r.detail = judged == 0 ? "no phase resumed with --no-load-optim or --finetune"
                         : resumes +
                               " loaded the saved weights, started the optimizer afresh from "
                               "them, and took a first step from them";
  return r;
}

namespace {

// The iteration phase `p`'s last save names, as the scenario says the training loop counts:
// from the iteration it resumed at (0 after --finetune: sim::iteration_origins) through its
// steps; an interval save's where the job ends without an exit save. nullopt: the job makes no
// save of its own (an interval longer than its steps).
std::optional<int64_t> expected_last_save_iteration(const sim::PhaseRecord& p, int64_t origin) {
  const int64_t first = p.start_step - origin;
  const int64_t end = first + p.spec.steps;
  if (p.spec.save) return end;
  const int64_t last = end / p.spec.save_interval * p.spec.save_interval;
  return last > first ? std::optional<int64_t>(last) : std::nullopt;
}

}  // namespace

PropertyResult iteration_follows_resume_mode(const sim::RunResult& run) {
  PropertyResult r = pass("iteration_follows_resume_mode");
  const std::vector<int64_t> origins = sim::iteration_origins(run.scenario);
  int judged = 0;
  int finetuned = 0;
  for (const auto& p : run.phases) {
    // A save that met a storage fault leaves what the disk kept: tracker_names_saved_state and
    // resume_after_crash_is_complete judge it, not the loop's count.
    if (!p.completed || !p.spec.saves() || !p.on_disk.has_value() || p.index >= origins.size() ||
        !p.storage_faults_fired.empty())
      continue;
    const int64_t origin = origins[p.index];
    const std::optional<int64_t> want = expected_last_save_iteration(p, origin);
    if (!want.has_value()) continue;
    ++judged;
    finetuned += origin > 0 ? 1 : 0;
    const std::optional<int64_t>& named = p.on_disk->named;
    if (named == want && (!p.on_disk->files_iteration || *p.on_disk->files_iteration == *want))
      continue;
    const int64_t first = p.start_step - origin;
    const std::string how =
        p.spec.finetune ? fmt::format(
                              "0 at its --finetune resume (global step {}), plus its {} "
                              "step(s)",
                              origin, p.spec.steps)
        : origin == 0 ? fmt::format("the iteration it resumed at, {}, plus its {} step(s)", first,
                                    p.spec.steps)
                      : fmt::format(
                            "the iteration it resumed at, {} (counted from the "
                            "--finetune resume at global step {}), plus its {} step(s)",
                            first, origin, p.spec.steps);
    return fail(std::move(r), static_cast<int>(p.index), "iteration_follows_resume_mode:iteration",
                fmt::format("{}: after its last save the tracker names iteration {} (the files "
                            "{}); expected {}, {}",
                            phase_label(p), named ? std::to_string(*named) : "none",
                            p.on_disk->files_iteration ? std::to_string(*p.on_disk->files_iteration)
                                                       : "hold none",
                            *want, how));
  }
  r.detail = fmt::format(
      "{} job(s) ended with the tracker and the files naming the training loop's iteration{}",
      judged,
      finetuned > 0 ? fmt::format(" ({} counting from a --finetune resume)", finetuned) : "");
  return r;
}

}  // namespace ckptsim::properties
