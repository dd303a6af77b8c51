// Resume family: the load itself. no_duplicate_leaves (merge() never collides: I7, I10; B2,
// B3) and resume_completes (every save and load runs to the end on every rank).
#include <fmt/format.h>

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

}  // namespace ckptsim::properties
