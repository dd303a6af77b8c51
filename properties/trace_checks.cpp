// The trace checks: each property that a trace can judge, judged on a trace (the model's or the
// real code's; properties/trace.h). Registered with the property's run check in
// properties/properties.cpp, so that a property has one home; conformance compares the verdicts
// these give on the two traces of one scenario.
#include "properties/trace_checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "properties/common.h"

namespace ckptsim::properties {

using trace::Event;
using trace::events_at;
using trace::first_primary_error;
using trace::load_completed;
using trace::num;
using trace::Part;
using trace::part_at;
using trace::reference_at;
using trace::Run;
using trace::Trace;

namespace {

TraceVerdict verdict(const std::string& property, Verdict v, std::string detail) {
  return {property, v, std::move(detail), "", ""};
}

// A failing verdict: seen in run `run`, for the cause `signature` (property:cause), which a
// search keeps one minimal scenario per and shrinks toward.
TraceVerdict failed(const std::string& property, const std::string& run, std::string signature,
                    std::string detail) {
  return {property, Verdict::kFail, std::move(detail), std::move(signature), run};
}

}  // namespace

TraceVerdict trace_no_duplicate_leaves(const Trace& t) {
  for (const auto& run : t.runs) {
    if (!run.load) continue;
    for (const auto& e : run.events) {
      if (e.at != "error" || e.secondary || !e.merge_path) continue;
      std::string path;
      for (const auto& k : *e.merge_path) path += (path.empty() ? "" : ", ") + k;
      const std::string what =
          e.merge_kind == "list_length_mismatch" ? "lists of different lengths" : "duplicate leaf";
      return failed(
          "no_duplicate_leaves", run.id, "no_duplicate_leaves:" + what,
          fmt::format("{} rank {}: {} at ({}): {}", run.id, e.rank, e.py_type, path, e.message));
    }
  }
  return verdict("no_duplicate_leaves", Verdict::kPass, "no merge() error");
}

TraceVerdict trace_resume_completes(const Trace& t) {
  bool after_storage_fault = false;  // as resume_completes: what a storage fault caused is not
  for (const auto& run : t.runs) {   // counted (runs are in phase order, the reference first)
    const Event* e = first_primary_error(run);
    const bool caused = e != nullptr && ((e->stage == "save" && !run.storage_faults.empty()) ||
                                         (e->stage == "load" && after_storage_fault));
    after_storage_fault = after_storage_fault || !run.storage_faults.empty();
    if (e != nullptr && !caused) {
      return failed(
          "resume_completes", run.id,
          "resume_completes:" + std::string(run.id == "reference" ? "reference:" : "") + e->stage +
              ":" + e->py_type + "@" + e->site + ":" + message_shape(e->message),
          fmt::format("{} rank {} {}: {} [{}]", run.id, e->rank, e->stage, e->py_type, e->site));
    }
  }
  return verdict("resume_completes", Verdict::kPass, "every run completed");
}

namespace {

struct Mismatch {
  std::string run;
  std::string signature;
  std::string text;
};

// A resumed run's step mismatches against the reference.
void step_mismatches(const Trace& t, const Run& run, std::vector<Mismatch>& out, int64_t& checks) {
  const auto loaded = events_at(run, "after_load", run.start_step);
  const auto ref = reference_at(t, run.start_step);
  if (ref.empty()) {
    out.push_back({run.id, "step_matches_uninterrupted:beyond_reference",
                   fmt::format("{}: resumed at global step {}, beyond the reference run", run.id,
                               run.start_step)});
    return;
  }
  // An optimizer that starts afresh at the load holds no step: the uninterrupted run's restarts
  // there too.
  const bool fresh = starts_optimizer_afresh(t, run);
  for (const auto* e : loaded) {
    for (const auto& p : e->parts) {
      const Part* r = part_at(ref, p.param, p.begin);
      ++checks;
      const double expected = fresh || r == nullptr ? 0.0 : r->step.value_or(0.0);
      if (p.step.value_or(0.0) == expected) continue;
      out.push_back(
          {run.id, "step_matches_uninterrupted:after_load:" + p.part,
           fmt::format("{} after the load at global step {}: {} (rank {}) counter {} "
                       "(reference {})",
                       run.id, run.start_step, p.label(), e->rank, num(p.step), num(expected))});
    }
  }
  for (const auto& e : run.events) {
    if (e.at != "after_step") continue;
    const auto rs = reference_at(t, e.global_step);
    if (rs.empty()) continue;
    for (const auto& p : e.parts) {
      if (!p.step_used) continue;
      const Part* r = part_at(rs, p.param, p.begin);
      ++checks;
      const std::optional<double> expected = r != nullptr ? r->step_used : std::nullopt;
      if (expected && *expected == *p.step_used) continue;
      out.push_back(
          {run.id, "step_matches_uninterrupted:training:" + p.part,
           fmt::format("{} global step {}: {} (rank {}) used t={} (reference t={})", run.id,
                       e.global_step, p.label(), e.rank, num(p.step_used), num(expected))});
    }
  }
}

}  // namespace

TraceVerdict trace_step_matches_uninterrupted(const Trace& t) {
  std::vector<Mismatch> mismatches;
  int64_t checks = 0;
  std::string not_evaluated;
  for (const auto& run : t.runs) {
    if (!run.load) continue;
    if (!load_completed(run)) {
      if (not_evaluated.empty()) not_evaluated = run.id + ": the load did not complete";
      continue;
    }
    step_mismatches(t, run, mismatches, checks);
  }
  if (!mismatches.empty()) {
    return failed("step_matches_uninterrupted", mismatches.front().run,
                  mismatches.front().signature,
                  mismatches.front().text + fmt::format(" ({} mismatch(es))", mismatches.size()));
  }
  if (!not_evaluated.empty())
    return verdict("step_matches_uninterrupted", Verdict::kNotEvaluated, not_evaluated);
  return verdict("step_matches_uninterrupted", Verdict::kPass,
                 fmt::format("{} counters and steps used equal the reference's", checks));
}

namespace {

// Whether any event of `events` marks `param` as resting on uninitialized memory.
bool uninitialized(const std::vector<const Event*>& events, const std::string& param) {
  for (const auto* e : events) {
    for (const auto& [kind, params] : e->uninitialized) {
      if (params.count(param) > 0) return true;
    }
  }
  return false;
}

// Whether rank r of run `a` holds the same pieces of the model params as rank r of run `b`
// (their TP and PP sizes are the same): a model-param hash is over the rank's TP piece of its
// stage's params, so across a TP/PP reshard two ranks' hashes cover other elements.
bool same_pieces(const Run& a, const Run& b) { return a.tp == b.tp && a.pp == b.pp; }

// Each model-param piece's events: at TP = PP = 1 every rank holds every param whole; else a
// rank holds its (TP rank, PP rank)'s piece, the same on every DP rank. The lowest rank of each.
std::map<std::pair<int64_t, int64_t>, const Event*> by_piece(const std::vector<const Event*>& evs,
                                                             const Run& run) {
  std::map<std::pair<int64_t, int64_t>, const Event*> out;
  for (const Event* e : evs) {
    const int64_t tp = std::max<int64_t>(run.tp, 1);
    const int64_t dp = std::max<int64_t>(run.dp, 1);
    const std::pair<int64_t, int64_t> piece{e->rank % tp, e->rank / (tp * dp)};
    const Event*& at = out[piece];
    at = (at == nullptr || e->rank < at->rank) ? e : at;
  }
  return out;
}

// The first param whose model-param hash differs between two states of runs `ra` and `rb` at
// the same TP and PP sizes (each piece's lowest rank on each side), or "". A param that either
// state marks uninitialized is not compared, equal or not: `skipped` names the first one.
std::string param_hash_difference(const std::vector<const Event*>& a, const Run& ra,
                                  const std::vector<const Event*>& b, const Run& rb,
                                  std::string& skipped) {
  const auto pieces_b = by_piece(b, rb);
  for (const auto& [piece, x] : by_piece(a, ra)) {
    const auto found = pieces_b.find(piece);
    if (found == pieces_b.end()) continue;
    const Event* y = found->second;
    const auto xs = x->hashes.find("model_param");
    const auto ys = y->hashes.find("model_param");
    if (xs == x->hashes.end() || ys == y->hashes.end()) continue;
    for (const auto& [param, h] : xs->second) {
      auto it = ys->second.find(param);
      if (it == ys->second.end()) continue;
      if (uninitialized(a, param) || uninitialized(b, param)) {
        if (skipped.empty()) skipped = param;
        continue;
      }
      if (it->second != h) return param;
    }
  }
  return "";
}

// The first (kind, param) whose shard a load gave back with another hash than the save's, where
// the loaded rank holds the very shard the saving rank of the same number held (a resume at the
// same DP and layout; across a reshard the shards differ and a hash says nothing), as
// "master of w0 (rank 1)"; "" when none. A tensor that does not exist on one side (moments
// before the first step) and a value that rests on uninitialized memory are not compared.
std::string shard_hash_difference(const std::vector<const Event*>& loaded,
                                  const std::vector<const Event*>& saved) {
  for (const Event* l : loaded) {
    const Event* s = nullptr;
    for (const Event* e : saved) s = e->rank == l->rank ? e : s;
    if (s == nullptr) continue;
    for (const Part& part : l->parts) {
      // The hash is over every part of the param the rank holds: each must be in place.
      const auto held_there = [&](const Event* from, const Event* in) {
        return std::all_of(from->parts.begin(), from->parts.end(), [&](const Part& p) {
          return p.param != part.param ||
                 std::any_of(in->parts.begin(), in->parts.end(),
                             [&](const Part& o) { return o.same_place(p); });
        });
      };
      if (!held_there(l, s) || !held_there(s, l)) continue;
      for (const char* kind : {"master", "exp_avg", "exp_avg_sq"}) {
        const auto lk = l->hashes.find(kind);
        const auto sk = s->hashes.find(kind);
        if (lk == l->hashes.end() || sk == s->hashes.end()) continue;
        const auto lh = lk->second.find(part.param);
        const auto sh = sk->second.find(part.param);
        if (lh == lk->second.end() || sh == sk->second.end()) continue;
        if (lh->second == "null" || sh->second == "null" || lh->second == sh->second) continue;
        const auto marked = [&](const Event* e) {
          const auto u = e->uninitialized.find(kind);
          return u != e->uninitialized.end() && u->second.contains(part.param);
        };
        if (marked(l) || marked(s)) continue;
        return fmt::format("{} of {} (rank {})", kind, part.param, l->rank);
      }
    }
  }
  return "";
}

std::string rests_on_uninitialized(const std::string& run, const std::string& param) {
  return fmt::format(
      "{}: model param {} rests on uninitialized memory (a tensor the load skipped keeps "
      "torch.empty contents), so its comparison is no verdict",
      run, param);
}

}  // namespace

TraceVerdict trace_trajectory_matches_uninterrupted(const Trace& t) {
  std::string not_evaluated;
  std::string skipped;
  std::string skipped_run;
  int64_t states = 0;
  int64_t other_pieces = 0;  // states at another TP or PP than the reference's: not comparable
  for (const auto& run : t.runs) {
    if (run.id == "reference") continue;
    if (run.load && !load_completed(run)) {
      if (not_evaluated.empty()) not_evaluated = run.id + ": the load did not complete";
      continue;
    }
    std::map<int64_t, std::string> points;  // global step -> point, in order
    for (const auto& e : run.events) {
      if (e.at == "after_load" || e.at == "after_step") points.emplace(e.global_step, e.at);
    }
    const Run* reference = t.find("reference");
    if (reference == nullptr) continue;
    if (!same_pieces(run, *reference)) {
      other_pieces += static_cast<int64_t>(points.size());
      continue;
    }
    for (const auto& [g, at] : points) {
      const auto ref = reference_at(t, g);
      if (ref.empty()) continue;
      ++states;
      const std::string before = skipped;
      const std::string p =
          param_hash_difference(events_at(run, at, g), run, ref, *reference, skipped);
      if (before.empty() && !skipped.empty()) skipped_run = run.id;
      if (!p.empty()) {
        return failed("trajectory_matches_uninterrupted", run.id,
                      "trajectory_matches_uninterrupted:model_param",
                      fmt::format("{} {} global step {}: model param {} differs from the "
                                  "reference's (hash)",
                                  run.id, at, g, p));
      }
    }
  }
  if (!not_evaluated.empty())
    return verdict("trajectory_matches_uninterrupted", Verdict::kNotEvaluated, not_evaluated);
  if (!skipped.empty()) {
    return verdict("trajectory_matches_uninterrupted", Verdict::kNotEvaluated,
                   rests_on_uninitialized(skipped_run, skipped));
  }
  std::string detail = fmt::format("{} states: model params hash equal to the reference's", states);
  if (other_pieces > 0) {
    detail += fmt::format(
        "; {} states at another TP or PP size than the reference's not compared "
        "(each rank hashes its own TP piece; the model's properties compare "
        "whole params)",
        other_pieces);
  }
  return verdict("trajectory_matches_uninterrupted", Verdict::kPass, detail);
}

TraceVerdict trace_round_trip_identity(const Trace& t) {
  int loads = 0;
  std::string not_evaluated;
  std::string skipped;
  std::string skipped_run;
  for (const auto& run : t.runs) {
    // A --no-load-optim resume gives back the model params only (the run check leaves it out).
    if (!run.load || (t.spec != nullptr && run.phase > 0 &&
                      static_cast<size_t>(run.phase) < t.spec->phases.size() &&
                      t.spec->phases[static_cast<size_t>(run.phase)].fresh_optimizer()))
      continue;
    const Run* prev = t.find(run.load_from);
    const auto saved =
        prev != nullptr ? events_at(*prev, "at_save", run.start_step) : std::vector<const Event*>{};
    if (!load_completed(run) || saved.empty()) {
      if (not_evaluated.empty()) not_evaluated = run.id + ": the load did not complete";
      continue;
    }
    ++loads;
    const auto loaded = events_at(run, "after_load", run.start_step);
    const std::string before = skipped;
    const std::string p = same_pieces(run, *prev)
                              ? param_hash_difference(loaded, run, saved, *prev, skipped)
                              : std::string();
    if (before.empty() && !skipped.empty()) skipped_run = run.id;
    if (!p.empty()) {
      return failed(
          "round_trip_identity", run.id, "round_trip_identity:model_param",
          fmt::format("{}: model param {} after the load differs from the save", run.id, p));
    }
    if (const std::string d = shard_hash_difference(loaded, saved); !d.empty()) {
      return failed("round_trip_identity", run.id, "round_trip_identity:shard",
                    fmt::format("{}: the {} after the load differs from the save (the same "
                                "shard, hashed)",
                                run.id, d));
    }
    for (const auto* e : loaded) {
      for (const auto& part : e->parts) {
        const Part* s = part_at(saved, part.param, part.begin);
        const double want = s != nullptr ? s->step.value_or(0.0) : 0.0;
        if (part.step.value_or(0.0) == want) continue;
        return failed("round_trip_identity", run.id, "round_trip_identity:step:" + part.part,
                      fmt::format("{}: the counter of {} (rank {}) is {} after the load, {} when "
                                  "saved",
                                  run.id, part.label(), e->rank, num(part.step), num(want)));
      }
    }
  }
  if (!not_evaluated.empty() && loads == 0)
    return verdict("round_trip_identity", Verdict::kNotEvaluated, not_evaluated);
  if (!skipped.empty())
    return verdict("round_trip_identity", Verdict::kNotEvaluated,
                   rests_on_uninitialized(skipped_run, skipped));
  return verdict("round_trip_identity", Verdict::kPass,
                 fmt::format("{} load(s) gave back the saved params and counters (and each shard "
                             "the same rank saved, hashed)",
                             loads));
}

TraceVerdict trace_step_tensors_not_aliased(const Trace& t) {
  bool recorded = false;
  for (const auto& run : t.runs) {
    for (const auto& e : run.events) {
      for (const auto& p : e.parts) {
        if (!p.aliases) continue;
        recorded = true;
        if (*p.aliases > 0) {
          return failed("step_tensors_not_aliased", run.id, "step_tensors_not_aliased:" + p.part,
                        fmt::format("{} {} global step {}: {} (rank {}) shares its step tensor "
                                    "with {} other(s)",
                                    run.id, e.at, e.global_step, p.label(), e.rank, *p.aliases));
        }
      }
    }
  }
  if (!recorded) {
    return verdict("step_tensors_not_aliased", Verdict::kNotEvaluated,
                   "the trace does not record step tensor identity");
  }
  return verdict("step_tensors_not_aliased", Verdict::kPass, "no shared step tensor");
}

namespace {

// Every part of `e` whose counter (none counts as 0, as a fresh Adam starts from 0) or step used
// is not `g`, the number of optimizer steps taken.
void count_mismatches(const Run& run, const Event& e, int64_t g, int64_t origin, bool after_step,
                      std::vector<Mismatch>& out, int64_t& checks) {
  const auto want = static_cast<double>(g - origin);
  for (const auto& p : e.parts) {
    ++checks;
    const double counter = p.step.value_or(0.0);
    const std::optional<double> used = after_step ? p.step_used : std::nullopt;
    if (counter == want && (!used || *used == want)) continue;
    out.push_back(
        {run.id,
         fmt::format("step_counts_optimizer_steps:{}{}",
                     after_step ? "training:" : "after_load:", p.part),
         used ? fmt::format("{} after global step {}: {} (rank {}) used t={} and holds step {} "
                            "(right: {})",
                            run.id, g, p.label(), e.rank, num(used), num(p.step), want)
              : fmt::format("{} after the load at global step {}: {} (rank {}) holds step {} "
                            "(right: {})",
                            run.id, g, p.label(), e.rank, num(p.step), want)});
  }
}

}  // namespace

TraceVerdict trace_step_counts_optimizer_steps(const Trace& t) {
  std::vector<Mismatch> mismatches;
  int64_t checks = 0;
  for (const auto& run : t.runs) {
    if (run.status == "skipped") continue;
    for (const auto& e : run.events) {
      const int64_t origin = optimizer_origin(t, run, e.global_step);
      if (e.at == "after_load" && run.load)
        count_mismatches(run, e, e.global_step, origin, false, mismatches, checks);
      if (e.at == "after_step")
        count_mismatches(run, e, e.global_step, origin, true, mismatches, checks);
    }
  }
  if (!mismatches.empty()) {
    return failed("step_counts_optimizer_steps", mismatches.front().run,
                  mismatches.front().signature,
                  mismatches.front().text + fmt::format(" ({} mismatch(es))", mismatches.size()));
  }
  return verdict("step_counts_optimizer_steps", Verdict::kPass,
                 fmt::format("{} step counters and steps used (the uninterrupted run's too) equal "
                             "the number of optimizer steps taken",
                             checks));
}

TraceVerdict trace_load_writes_every_element(const Trace& t) {
  const char* name = "load_writes_every_element";
  int loads = 0;
  int probed = 0;
  std::string not_evaluated;
  for (const auto& run : t.runs) {
    if (!run.load || run.status == "skipped") continue;
    if (!load_completed(run)) {
      if (not_evaluated.empty()) not_evaluated = run.id + ": the load did not complete";
      continue;
    }
    ++loads;
    bool seen = false;
    std::vector<std::pair<int, trace::Unwritten>> left;
    for (const auto& e : run.events) {
      if (e.at != "after_load" || !e.unwritten) continue;
      seen = true;
      for (const auto& u : trace::merged(*e.unwritten)) left.emplace_back(e.rank, u);
    }
    if (!seen) continue;
    ++probed;
    if (left.empty()) continue;
    const bool missing =
        std::any_of(left.begin(), left.end(), [](const auto& x) { return x.second.missing_key; });
    std::string ranges;
    for (size_t i = 0; i < left.size() && i < 4; ++i)
      ranges += fmt::format("{}rank {} {}", i ? ", " : "", left[i].first, left[i].second.label());
    if (left.size() > 4) ranges += fmt::format(", +{} more", left.size() - 4);
    return failed(name, run.id,
                  std::string("load_writes_every_element:") + (missing ? "missing_key" : "gap"),
                  fmt::format("{} (dp={}): the load left {} requested range(s) unwritten, holding "
                              "what the load request was built with: {}",
                              run.id, run.dp, left.size(), ranges));
  }
  if (loads == 0 && !not_evaluated.empty())
    return verdict(name, Verdict::kNotEvaluated, not_evaluated);
  if (loads == 0) return verdict(name, Verdict::kPass, "no load in this run");
  if (probed == 0) {
    return verdict(name, Verdict::kNotEvaluated,
                   "the trace does not say which elements its loads wrote (no after_load "
                   "'unwritten': recorded before the runner probed loads)");
  }
  return verdict(
      name, Verdict::kPass,
      fmt::format("{} load(s) wrote every requested element from the checkpoint{}", probed,
                  probed < loads ? fmt::format(" ({} not probed)", loads - probed) : ""));
}

}  // namespace ckptsim::properties
