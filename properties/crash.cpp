// The crash properties (issue 25): a resume after a storage fault loads the newest committed
// checkpoint or fails loudly (resume_after_crash_is_complete), and the tracker names the
// iteration its directory holds, whole (tracker_names_saved_state). Both read what the driver
// saw of the checkpoint directory (sim::PhaseRecord::committed_before, on_disk), not what the
// code under test says.
#include <fmt/format.h>

#include <cmath>

#include "model/megatron/torch_dist_checkpoint.h"
#include "properties/common.h"

namespace ckptsim::properties {

namespace {

// The first element where the loaded state differs from the saved one, bitwise (NaN equal to
// NaN), as a detail; nullopt when none does.
std::optional<std::string> state_difference(const sim::RunResult& run,
                                            const sim::GlobalState& loaded,
                                            const sim::GlobalState& saved,
                                            const char* saved_holds = "the committed save holds") {
  const ComparedFields compared(loaded, saved);
  for (const auto& f : compared.fields()) {
    for (size_t q = 0; q < f.a->size() && q < f.b->size(); ++q) {
      const auto& a = (*f.a)[q];
      const auto& b = (*f.b)[q];
      if (a.size() != b.size()) {
        return fmt::format("{} of {} has {} elements, the save had {}", f.name, param_name(run, q),
                           a.size(), b.size());
      }
      for (size_t e = 0; e < a.size(); ++e) {
        if (bitwise_equal(a[e], b[e])) continue;
        return fmt::format("{} of {}[{}] is {}, {} {}", f.name, param_name(run, q), e, num(a[e]),
                           saved_holds, num(b[e]));
      }
    }
  }
  return std::nullopt;
}

// What the committed save of `iteration` by phase `j` holds: its state right after the save,
// else (the job stopped right after its last save's tracker write) the state it saved, its
// last step's.
const sim::GlobalState* committed_state(const sim::RunResult& run, size_t j, int64_t iteration) {
  const sim::PhaseRecord& saver = run.phases[j];
  if (const sim::GlobalState* s = saver.saved_at(iteration)) return s;
  return saver.save_iteration == iteration ? saver.final_state() : nullptr;
}

// The optimizer state phase `p`'s save left in its files (PhaseRecord::saved_state read back
// from them), over the state it held when it saved: where the files hold an element, theirs.
// Under TE's precision-aware FusedAdam the saved 'param' of a bf16 param is its fp32
// master_param, or with remainders its int16 remainder, whose master is reassembled with the
// bf16 param the job held; that of an fp32 param is a master_param TE never updates (the step
// updates the param itself), so it is not the job's master and is not compared.
sim::GlobalState state_in_files(const sim::RunResult& run, const sim::PhaseRecord& p) {
  sim::GlobalState files = *p.at_save;
  const model::OptimizerConfig& o = run.scenario.optimizer;
  const auto overlay = [&](const char* key, std::vector<std::vector<float>>& field, bool moment) {
    const auto it = p.saved_state.find(key);
    if (it == p.saved_state.end()) return;
    const bool master = !moment && o.te_precision_aware();
    for (size_t q = 0; q < field.size() && q < it->second.size(); ++q) {
      const bool bf16 = run.scenario.params[q].dtype == model::DType::kBFloat16;
      if (master && !bf16) continue;
      const bool remainder = master && o.store_param_remainders;
      for (size_t e = 0; e < field[q].size() && e < it->second[q].size(); ++e) {
        float v = it->second[q][e];
        if (std::isnan(v)) continue;
        if (remainder) {
          if (q >= files.param.size() || e >= files.param[q].size()) continue;
          v = sim::master_from_remainder(files.param[q][e], v);
        }
        field[q][e] = v;
        // Adam's lazily created state reads as zero: a saved zero is no state.
        if (moment && q < files.moments_present.size() && e < files.moments_present[q].size() &&
            !bitwise_equal(v, 0.0F))
          files.moments_present[q][e] = 1;
      }
    }
  };
  overlay("param", files.master, false);
  overlay("exp_avg", files.exp_avg, true);
  overlay("exp_avg_sq", files.exp_avg_sq, true);
  return files;
}

}  // namespace

bool storage_fault_error(const sim::PhaseRecord& p, const sim::RankError& e) {
  return (e.stage == "save" && !p.storage_faults_fired.empty()) ||
         (e.stage == "load" && p.after_storage_fault);
}

PropertyResult resume_after_crash_is_complete(const sim::RunResult& run) {
  PropertyResult r = pass("resume_after_crash_is_complete");
  int judged = 0;
  int loud = 0;
  for (const auto& p : run.phases) {
    if (!p.ran || p.index == 0 || !p.after_storage_fault) continue;
    ++judged;
    const auto& want = p.committed_before;
    const std::string newest =
        want.has_value() ? fmt::format("iteration {} (phase {}'s save)", want->first, want->second)
                         : std::string("none");
    const sim::RankError* e = first_primary(p.errors);
    if (e != nullptr && e->stage == "load" && !e->site.empty()) {
      ++loud;  // an upstream error: the job stops and says why
      continue;
    }
    if (e != nullptr && e->stage == "load") {
      return fail(std::move(r), static_cast<int>(p.index),
                  "resume_after_crash_is_complete:load:" + e->py_type,
                  fmt::format("{}: the load after a storage fault failed outside the modeled "
                              "code: {}",
                              phase_label(p), e->summary()));
    }
    if (p.started_fresh) {
      if (!want.has_value()) continue;
      return fail(std::move(r), static_cast<int>(p.index),
                  "resume_after_crash_is_complete:started_fresh",
                  fmt::format("{}: started from random (no tracker), while the newest committed "
                              "checkpoint is {}",
                              phase_label(p), newest));
    }
    if (!p.after_load.has_value()) continue;
    if (!want.has_value() || p.start_step != want->first) {
      return fail(std::move(r), static_cast<int>(p.index),
                  "resume_after_crash_is_complete:iteration",
                  fmt::format("{}: silently loaded iteration {}; the newest committed checkpoint "
                              "is {}",
                              phase_label(p), p.start_step, newest));
    }
    const sim::GlobalState* saved = committed_state(run, want->second, want->first);
    if (saved == nullptr) continue;
    if (auto d = state_difference(run, *p.after_load, *saved)) {
      return fail(std::move(r), static_cast<int>(p.index), "resume_after_crash_is_complete:partial",
                  fmt::format("{}: silently loaded a partial checkpoint of iteration {}: {}",
                              phase_label(p), p.start_step, *d));
    }
  }
  if (judged == 0) {
    r.detail = "no phase resumed after a storage fault";
    return r;
  }
  r.detail = fmt::format(
      "{} resume(s) after a storage fault: {} loaded the newest committed checkpoint or started "
      "fresh where none was, {} failed loudly",
      judged, judged - loud, loud);
  return r;
}

PropertyResult tracker_names_saved_state(const sim::RunResult& run) {
  PropertyResult r = pass("tracker_names_saved_state");
  int judged = 0;
  for (const auto& p : run.phases) {
    if (!p.on_disk.has_value() || !p.on_disk->named.has_value()) continue;
    const sim::PhaseRecord::OnDisk& d = *p.on_disk;
    const int64_t named = *d.named;
    // A short write is the disk losing what it reported written, not the protocol's doing:
    // where one hit a save of this iteration, its directory is not judged.
    bool lost_by_disk = false;
    const std::string dir = model::iteration_dir_name(named);
    for (size_t j = 0; j <= p.index; ++j) {
      for (const std::string& f : run.phases[j].storage_faults_fired) {
        lost_by_disk = lost_by_disk ||
                       (f.starts_with("short") && (f.find(dir + "/") != std::string::npos ||
                                                   f.find(dir + ".saving/") != std::string::npos));
      }
    }
    if (lost_by_disk) continue;
    ++judged;
    if (!d.problem.empty()) {
      return fail(std::move(r), static_cast<int>(p.index), "tracker_names_saved_state:incomplete",
                  fmt::format("after {}'s save the tracker names iteration {}, whose files are "
                              "not a whole checkpoint: {}",
                              phase_label(p), named, d.problem));
    }
    if (d.files_iteration != named) {
      return fail(std::move(r), static_cast<int>(p.index), "tracker_names_saved_state:iteration",
                  fmt::format("after {}'s save the tracker names iteration {}, but its files "
                              "hold iteration {}",
                              phase_label(p), named,
                              d.files_iteration ? std::to_string(*d.files_iteration) : "none"));
    }
    // The state in the files is the state the job held when it saved that iteration.
    if (named != p.save_iteration || !p.at_save.has_value() || p.saved_state.empty()) continue;
    if (auto diff =
            state_difference(run, state_in_files(run, p), *p.at_save, "where the job held")) {
      return fail(std::move(r), static_cast<int>(p.index), "tracker_names_saved_state:state",
                  fmt::format("after {}'s save the tracker names iteration {}, but its files do "
                              "not hold the state the job saved there: {}",
                              phase_label(p), named, *diff));
    }
  }
  if (judged == 0) {
    r.detail = "no save left a tracker that names an iteration";
    return r;
  }
  r.detail = fmt::format(
      "{} save(s): the tracker named an iteration whose directory holds it whole", judged);
  return r;
}

}  // namespace ckptsim::properties
