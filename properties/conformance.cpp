#include "properties/conformance.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "sim/float_codec.h"

namespace ckptsim::properties {

namespace {

using nlohmann::json;

// ---- a trace, as the judges read it ----------------------------------------------------------

struct Part {
  std::string part;
  std::string param;
  int64_t begin = 0;
  int64_t end = 0;
  std::optional<double> step;
  std::optional<double> step_used;
  std::optional<int64_t> aliases;
  std::string kernel;  // as the trace names it, or inferred (infer_kernels)
  std::string label() const { return fmt::format("{} {}[{}:{}]", part, param, begin, end); }
  bool same_place(const Part& o) const {
    return part == o.part && param == o.param && begin == o.begin && end == o.end;
  }
};

struct Event {
  int rank = 0;
  std::string at;
  int64_t global_step = 0;
  std::vector<Part> parts;
  // kind -> param -> hash ("null" where the tensor does not exist)
  std::map<std::string, std::map<std::string, std::string>> hashes;
  // kind -> param -> base64 float32 values ("null" where the tensor does not exist), where
  // the trace carries them
  std::map<std::string, std::map<std::string, std::string>> values;
  // kind -> params whose hash rests on uninitialized memory (the model's trace says)
  std::map<std::string, std::set<std::string>> uninitialized;
  // error events
  std::string stage, py_type, message, site;
  std::optional<std::vector<std::string>> merge_path;
  bool secondary = false;
};

struct Run {
  std::string id;
  int64_t dp = 0;
  std::string status;
  bool load = false;
  int64_t start_step = 0;
  std::string load_from;
  std::string te;  // "real", "emulated", "absent", "modeled", or "" (a skipped run)
  bool fused_adam_standin = false;
  std::vector<Event> events;
};

struct Trace {
  std::string scenario;
  std::string source;  // "model" or "real"
  std::vector<Run> runs;
  const Run* find(const std::string& id) const {
    for (const auto& r : runs) {
      if (r.id == id) return &r;
    }
    return nullptr;
  }
};

std::optional<double> number_or_null(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return j[key].get<double>();
}

Event parse_event(const json& e) {
  Event ev;
  ev.rank = e.at("rank").get<int>();
  ev.at = e.at("at").get<std::string>();
  if (e.contains("global_step") && !e["global_step"].is_null())
    ev.global_step = e["global_step"].get<int64_t>();
  if (ev.at == "error") {
    ev.stage = e.at("stage").get<std::string>();
    ev.py_type = e.at("py_type").get<std::string>();
    ev.message = e.at("message").get<std::string>();
    ev.site = e.at("site").get<std::string>();
    if (!e.at("merge_path").is_null())
      ev.merge_path = e["merge_path"].get<std::vector<std::string>>();
    ev.secondary = e.value("secondary", false);
    return ev;
  }
  for (const auto& p : e.at("parts")) {
    Part part{p.at("part").get<std::string>(),
              p.at("param").get<std::string>(),
              p.at("range").at(0).get<int64_t>(),
              p.at("range").at(1).get<int64_t>(),
              number_or_null(p, "step"),
              number_or_null(p, "step_used"),
              std::nullopt,
              ""};
    if (p.contains("step_aliases")) part.aliases = p["step_aliases"].get<int64_t>();
    if (p.contains("kernel")) part.kernel = p["kernel"].get<std::string>();
    ev.parts.push_back(std::move(part));
  }
  for (const auto& [kind, m] : e.at("hashes").items()) {
    for (const auto& [param, h] : m.items())
      ev.hashes[kind][param] = h.is_null() ? "null" : h.get<std::string>();
  }
  if (const auto vs = e.find("values"); vs != e.end() && vs->is_object()) {
    for (const auto& [kind, m] : vs->items()) {
      for (const auto& [param, v] : m.items())
        ev.values[kind][param] = v.is_string() ? v.get<std::string>() : "null";
    }
  }
  if (const auto u = e.find("uninitialized"); u != e.end()) {
    for (const auto& [kind, params] : u->items()) {
      for (const auto& param : params) ev.uninitialized[kind].insert(param.get<std::string>());
    }
  }
  return ev;
}

// A part without a "kernel" (traces recorded before it existed): what it ran follows from the
// part and the run's setup, as the runner builds it: Megatron's AdamW without TE is foreach on
// the CUDA main params, the HDO builds its AdamWs with fused=True (CPU part, and GPU part without
// TE), FusedAdam is the stand-in where the run injected it, TE's own where TE is real, and the
// model's own arithmetic in the model's trace.
std::string inferred_kernel(const Part& p, const Run& run, const std::string& source) {
  if (p.part == "AdamW") return "torch_foreach_cuda";
  if (p.part == "HDO cpu AdamW") return "torch_fused_cpu";
  if (p.part == "HDO gpu AdamW") return "torch_fused_cuda";
  if (source == "model") return "ckptsim_fused_adam";
  if (run.fused_adam_standin) return "standin_fused_adam";
  return run.te == "real" ? "te_fused_adam" : "unknown";
}

void infer_kernels(Trace& t) {
  for (Run& run : t.runs) {
    for (Event& e : run.events) {
      for (Part& p : e.parts) {
        if (p.kernel.empty()) p.kernel = inferred_kernel(p, run, t.source);
      }
    }
  }
}

Result<Trace> parse_trace(const json& j, const std::string& source) {
  try {
    if (!j.is_object() || j.value("format", "") != "ckptsim-trace" || j.value("version", 0) != 1) {
      return Status::invalid_input(source + ": not a ckptsim trace of version 1");
    }
    Trace t;
    t.scenario = j.at("scenario").get<std::string>();
    for (const auto& r : j.at("runs")) {
      Run run;
      run.id = r.at("id").get<std::string>();
      run.dp = r.at("dp").get<int64_t>();
      run.status = r.at("status").get<std::string>();
      run.load = r.value("load", false);
      run.start_step = r.value("start_step", int64_t{0});
      run.load_from = r.value("load_from", std::string());
      if (const auto te = r.find("te"); te != r.end() && te->is_string()) run.te = *te;
      run.fused_adam_standin = r.value("fused_adam_standin", false);
      for (const auto& e : r.at("events")) run.events.push_back(parse_event(e));
      t.runs.push_back(std::move(run));
    }
    t.source = j.value("source", std::string());
    infer_kernels(t);
    return t;
  } catch (const json::exception& e) {
    return Status::invalid_input(source + ": not a readable trace: " + e.what());
  }
}

// ---- the judges -------------------------------------------------------------------------------

std::string num(const std::optional<double>& x) {
  if (!x.has_value() || std::isnan(*x)) return "none";
  if (*x == std::floor(*x)) return fmt::format("{:.0f}", *x);
  return fmt::format("{:.9g}", *x);
}

// Every part of a run's events at one point (all ranks).
std::vector<const Event*> events_at(const Run& run, const std::string& at, int64_t global_step) {
  std::vector<const Event*> out;
  for (const auto& e : run.events) {
    if (e.at == at && e.global_step == global_step) out.push_back(&e);
  }
  return out;
}

// The reference run's state at a global step: init at 0, else after that step.
std::vector<const Event*> reference_at(const Trace& t, int64_t global_step) {
  const Run* ref = t.find("reference");
  if (ref == nullptr) return {};
  return events_at(*ref, global_step == 0 ? "init" : "after_step", global_step);
}

const Part* part_at(const std::vector<const Event*>& events, const std::string& param,
                    int64_t element) {
  for (const auto* e : events) {
    for (const auto& p : e->parts) {
      if (p.param == param && p.begin <= element && element < p.end) return &p;
    }
  }
  return nullptr;
}

const Event* first_primary_error(const Run& run) {
  const Event* any = nullptr;
  for (const auto& e : run.events) {
    if (e.at != "error") continue;
    if (!e.secondary) return &e;
    if (any == nullptr) any = &e;
  }
  return any;
}

TraceVerdict verdict(const std::string& property, Verdict v, std::string detail) {
  return {property, v, std::move(detail)};
}

TraceVerdict judge_duplicate_leaves(const Trace& t) {
  for (const auto& run : t.runs) {
    if (!run.load) continue;
    for (const auto& e : run.events) {
      if (e.at != "error" || e.secondary || !e.merge_path) continue;
      std::string path;
      for (const auto& k : *e.merge_path) path += (path.empty() ? "" : ", ") + k;
      return verdict(
          "no_duplicate_leaves", Verdict::kFail,
          fmt::format("{} rank {}: {} at ({}): {}", run.id, e.rank, e.py_type, path, e.message));
    }
  }
  return verdict("no_duplicate_leaves", Verdict::kPass, "no merge() error");
}

TraceVerdict judge_resume_completes(const Trace& t) {
  for (const auto& run : t.runs) {
    if (const Event* e = first_primary_error(run)) {
      return verdict(
          "resume_completes", Verdict::kFail,
          fmt::format("{} rank {} {}: {} [{}]", run.id, e->rank, e->stage, e->py_type, e->site));
    }
  }
  return verdict("resume_completes", Verdict::kPass, "every run completed");
}

// A resumed run's step mismatches against the reference, as detail lines.
void step_mismatches(const Trace& t, const Run& run, std::vector<std::string>& out,
                     int64_t& checks) {
  const auto loaded = events_at(run, "after_load", run.start_step);
  const auto ref = reference_at(t, run.start_step);
  if (ref.empty()) {
    out.push_back(fmt::format("{}: resumed at global step {}, beyond the reference run", run.id,
                              run.start_step));
    return;
  }
  for (const auto* e : loaded) {
    for (const auto& p : e->parts) {
      const Part* r = part_at(ref, p.param, p.begin);
      ++checks;
      const double expected = r != nullptr ? r->step.value_or(0.0) : 0.0;
      if (p.step.value_or(0.0) == expected) continue;
      out.push_back(
          fmt::format("{} after the load at global step {}: {} (rank {}) counter {} "
                      "(reference {})",
                      run.id, run.start_step, p.label(), e->rank, num(p.step), num(expected)));
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
      out.push_back(fmt::format("{} global step {}: {} (rank {}) used t={} (reference t={})",
                                run.id, e.global_step, p.label(), e.rank, num(p.step_used),
                                num(expected)));
    }
  }
}

bool load_completed(const Run& run) {
  return run.status != "skipped" && !events_at(run, "after_load", run.start_step).empty();
}

TraceVerdict judge_step(const Trace& t) {
  std::vector<std::string> mismatches;
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
    return verdict("step_matches_uninterrupted", Verdict::kFail,
                   mismatches.front() + fmt::format(" ({} mismatch(es))", mismatches.size()));
  }
  if (!not_evaluated.empty())
    return verdict("step_matches_uninterrupted", Verdict::kNotEvaluated, not_evaluated);
  return verdict("step_matches_uninterrupted", Verdict::kPass,
                 fmt::format("{} counters and steps used equal the reference's", checks));
}

// The first param whose model-param hash differs between two states (rank 0's), or "".
// Whether any event of `events` marks `param` as resting on uninitialized memory.
bool uninitialized(const std::vector<const Event*>& events, const std::string& param) {
  for (const auto* e : events) {
    for (const auto& [kind, params] : e->uninitialized) {
      if (params.count(param) > 0) return true;
    }
  }
  return false;
}

// The first param whose model-param hash differs between two states (rank 0's), or "". A param
// that either state marks uninitialized is not compared, equal or not: `skipped` names the
// first one.
std::string param_hash_difference(const std::vector<const Event*>& a,
                                  const std::vector<const Event*>& b, std::string& skipped) {
  const Event* x = nullptr;
  const Event* y = nullptr;
  for (const auto* e : a) x = (x == nullptr || e->rank < x->rank) ? e : x;
  for (const auto* e : b) y = (y == nullptr || e->rank < y->rank) ? e : y;
  if (x == nullptr || y == nullptr) return "";
  const auto xs = x->hashes.find("model_param");
  const auto ys = y->hashes.find("model_param");
  if (xs == x->hashes.end() || ys == y->hashes.end()) return "";
  for (const auto& [param, h] : xs->second) {
    auto it = ys->second.find(param);
    if (it == ys->second.end()) continue;
    if (uninitialized(a, param) || uninitialized(b, param)) {
      if (skipped.empty()) skipped = param;
      continue;
    }
    if (it->second != h) return param;
  }
  return "";
}

std::string rests_on_uninitialized(const std::string& run, const std::string& param) {
  return fmt::format(
      "{}: model param {} rests on uninitialized memory (a tensor the load skipped keeps "
      "torch.empty contents), so its comparison is no verdict",
      run, param);
}

TraceVerdict judge_trajectory(const Trace& t) {
  std::string not_evaluated;
  std::string skipped;
  std::string skipped_run;
  int64_t states = 0;
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
    for (const auto& [g, at] : points) {
      const auto ref = reference_at(t, g);
      if (ref.empty()) continue;
      ++states;
      const std::string before = skipped;
      const std::string p = param_hash_difference(events_at(run, at, g), ref, skipped);
      if (before.empty() && !skipped.empty()) skipped_run = run.id;
      if (!p.empty()) {
        return verdict("trajectory_matches_uninterrupted", Verdict::kFail,
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
  return verdict("trajectory_matches_uninterrupted", Verdict::kPass,
                 fmt::format("{} states: model params hash equal to the reference's", states));
}

TraceVerdict judge_round_trip(const Trace& t) {
  int loads = 0;
  std::string not_evaluated;
  std::string skipped;
  std::string skipped_run;
  for (const auto& run : t.runs) {
    if (!run.load) continue;
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
    const std::string p = param_hash_difference(loaded, saved, skipped);
    if (before.empty() && !skipped.empty()) skipped_run = run.id;
    if (!p.empty()) {
      return verdict(
          "round_trip_identity", Verdict::kFail,
          fmt::format("{}: model param {} after the load differs from the save", run.id, p));
    }
    for (const auto* e : loaded) {
      for (const auto& part : e->parts) {
        const Part* s = part_at(saved, part.param, part.begin);
        const double want = s != nullptr ? s->step.value_or(0.0) : 0.0;
        if (part.step.value_or(0.0) == want) continue;
        return verdict("round_trip_identity", Verdict::kFail,
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
                 fmt::format("{} load(s) gave back the saved params and counters", loads));
}

TraceVerdict judge_aliasing(const Trace& t) {
  bool recorded = false;
  for (const auto& run : t.runs) {
    for (const auto& e : run.events) {
      for (const auto& p : e.parts) {
        if (!p.aliases) continue;
        recorded = true;
        if (*p.aliases > 0) {
          return verdict("step_tensors_not_aliased", Verdict::kFail,
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

std::vector<TraceVerdict> judge(const Trace& t) {
  return {judge_duplicate_leaves(t), judge_resume_completes(t), judge_step(t),
          judge_trajectory(t),       judge_round_trip(t),       judge_aliasing(t)};
}

// ---- divergences ------------------------------------------------------------------------------

// The params of a run whose state no longer rests on claimed kernel pairs alone (an update by a
// pair the model does not claim, or uninitialized memory), with the first reason for each.
using Taint = std::map<std::string, std::string>;

class RunComparison {
 public:
  RunComparison(const Run& model, const Run& real, Taint inherited, Conformance& out)
      : m_(model), r_(real), taint_(std::move(inherited)), out_(out) {}

  void compare() {
    compare_status_and_error();
    for (const auto& e : m_.events) {
      if (e.at == "error") continue;
      const Event* match = find_event(r_, e);
      out_.events.add(match != nullptr);
      if (match == nullptr) {
        add(e, "event", "present", "absent");
        continue;
      }
      compare_event(e, *match);
    }
    for (const auto& e : r_.events) {
      if (e.at == "error" || find_event(m_, e) != nullptr) continue;
      out_.events.add(false);
      add(e, "event", "absent", "present");
    }
  }

  const Taint& taint() const { return taint_; }

 private:
  static const Event* find_event(const Run& run, const Event& e) {
    for (const auto& x : run.events) {
      if (x.rank == e.rank && x.at == e.at && x.global_step == e.global_step) return &x;
    }
    return nullptr;
  }

  void add(const Event& e, const std::string& field, const std::string& mv, const std::string& rv) {
    out_.divergences.push_back({m_.id, e.global_step, e.rank, e.at, field, mv, rv});
  }

  void compare_status_and_error() {
    out_.statuses.add(m_.status == r_.status);
    if (m_.status != r_.status)
      out_.divergences.push_back({m_.id, -1, -1, "", "status", m_.status, r_.status});
    const Event* me = first_primary_error(m_);
    const Event* re = first_primary_error(r_);
    ++out_.errors_compared;
    if ((me != nullptr) != (re != nullptr) ||
        (me != nullptr && (me->py_type != re->py_type || me->site != re->site ||
                           me->merge_path != re->merge_path))) {
      auto describe = [](const Event* e) {
        if (e == nullptr) return std::string("no error");
        std::string path;
        if (e->merge_path) {
          for (const auto& k : *e->merge_path) path += (path.empty() ? " at (" : ", ") + k;
          path += ")";
        }
        return fmt::format("rank {} {}: {} [{}]{}", e->rank, e->stage, e->py_type, e->site, path);
      };
      out_.divergences.push_back({m_.id, -1, me ? me->rank : re->rank, "error",
                                  "first primary error", describe(me), describe(re)});
    } else {
      ++out_.errors_equal;
    }
  }

  void compare_event(const Event& m, const Event& r) {
    // Parts, both ways, and every counter of the parts on both sides.
    std::map<std::string, std::pair<std::string, std::string>> pair_of;  // param -> kernels
    for (const auto& mp : m.parts) {
      const Part* rp = nullptr;
      for (const auto& p : r.parts) {
        if (p.same_place(mp)) rp = &p;
      }
      out_.parts.add(rp != nullptr);
      pair_of[mp.param] = {mp.kernel, rp != nullptr ? rp->kernel : "absent"};
      if (rp == nullptr) {
        add(m, mp.label(), "present", "absent");
        continue;
      }
      compare_counters(m, mp, *rp);
    }
    for (const auto& rp : r.parts) {
      bool found = false;
      for (const auto& p : m.parts) found = found || p.same_place(rp);
      if (found) continue;
      out_.parts.add(false);
      pair_of.emplace(rp.param, std::pair<std::string, std::string>{"absent", rp.kernel});
      add(m, rp.label(), "absent", "present");
    }
    update_taint(m, pair_of);
    compare_hashes(m, r, pair_of);
  }

  void compare_counters(const Event& e, const Part& mp, const Part& rp) {
    for (const auto& [name, a, b] : {std::tuple{"step", mp.step, rp.step},
                                     std::tuple{"step_used", mp.step_used, rp.step_used}}) {
      ++out_.counters_compared;
      if (a == b) {
        ++out_.counters_equal;
      } else {
        add(e, mp.label() + " " + name, num(a), num(b));
      }
    }
    if (mp.aliases.has_value() && rp.aliases.has_value()) {
      out_.step_aliases.add(*mp.aliases == *rp.aliases);
      if (*mp.aliases != *rp.aliases)
        add(e, mp.label() + " step_aliases", std::to_string(*mp.aliases),
            std::to_string(*rp.aliases));
    }
  }

  // A step by an unclaimed pair, or state the model marks uninitialized, taints the param for
  // the rest of this run and of the runs that load its checkpoints.
  void update_taint(const Event& m,
                    const std::map<std::string, std::pair<std::string, std::string>>& pair_of) {
    if (m.at == "after_step") {
      for (const auto& [param, pair] : pair_of) {
        if (!claimed_kernel_pair(pair.first, pair.second))
          taint_.emplace(param, fmt::format("updated by {} (model) / {} (real) at global step {}",
                                            pair.first, pair.second, m.global_step));
      }
    }
    for (const auto& [kind, params] : m.uninitialized) {
      for (const auto& param : params)
        taint_.emplace(param, fmt::format("{} rests on uninitialized memory at {} global step {}",
                                          kind, m.at, m.global_step));
    }
  }

  KernelPairHashes& pair_tally(const std::pair<std::string, std::string>& pair) {
    for (auto& h : out_.hash_pairs) {
      if (h.model_kernel == pair.first && h.real_kernel == pair.second) return h;
    }
    KernelPairHashes h;
    h.model_kernel = pair.first;
    h.real_kernel = pair.second;
    h.claimed = claimed_kernel_pair(pair.first, pair.second, &h.reason);
    out_.hash_pairs.push_back(h);
    return out_.hash_pairs.back();
  }

  void compare_hashes(const Event& m, const Event& r,
                      const std::map<std::string, std::pair<std::string, std::string>>& pair_of) {
    for (const auto& [kind, params] : m.hashes) {
      const auto rk = r.hashes.find(kind);
      for (const auto& [param, h] : params) {
        const bool on_real = rk != r.hashes.end() && rk->second.count(param) > 0;
        const std::string rh = on_real ? rk->second.at(param) : "absent";
        const auto pair_it = pair_of.find(param);
        // A model param without a part on this rank: the pair of the part that holds it
        // elsewhere is not known here; its hash is attributed to "model_param".
        const std::pair<std::string, std::string> pair =
            pair_it != pair_of.end()
                ? pair_it->second
                : std::pair<std::string, std::string>{"model_param", "model_param"};
        const bool required = taint_.count(param) == 0;
        KernelPairHashes& tally = pair_tally(pair);
        (required ? tally.required : tally.reported).add(rh == h);
        ++out_.hashes_compared;
        if (rh == h) {
          ++out_.hashes_equal;
        }
        if (required) out_.hashes_required.add(rh == h);
        const std::string element = compare_values(m, r, kind, param, required, tally);
        if (rh == h) continue;
        Divergence d{m_.id, m.global_step, m.rank, m.at, kind + " " + param + element, h, rh};
        (required ? out_.divergences : out_.hash_divergences).push_back(std::move(d));
      }
    }
  }

  // Where both events carry the values of (kind, param): counts the elements equal bit for bit
  // (NaN equal to NaN) and returns the first that differs as " [i: model x, real y]", or "".
  std::string compare_values(const Event& m, const Event& r, const std::string& kind,
                             const std::string& param, bool required, KernelPairHashes& tally) {
    const auto a = value_of(m, kind, param);
    const auto b = value_of(r, kind, param);
    if (!a || !b) return "";
    std::string first;
    Tally& t = required ? tally.required_elements : tally.reported_elements;
    const size_t n = std::max(a->size(), b->size());
    for (size_t i = 0; i < n; ++i) {
      const bool same = i < a->size() && i < b->size() &&
                        (std::bit_cast<uint32_t>((*a)[i]) == std::bit_cast<uint32_t>((*b)[i]) ||
                         (std::isnan((*a)[i]) && std::isnan((*b)[i])));
      t.add(same);
      if (!same && first.empty()) {
        first = fmt::format(" [{}: model {}, real {}]", i,
                            i < a->size() ? fmt::format("{:.9g}", (*a)[i]) : "none",
                            i < b->size() ? fmt::format("{:.9g}", (*b)[i]) : "none");
      }
    }
    return first;
  }

  static std::optional<std::vector<float>> value_of(const Event& e, const std::string& kind,
                                                    const std::string& param) {
    const auto k = e.values.find(kind);
    if (k == e.values.end()) return std::nullopt;
    const auto v = k->second.find(param);
    if (v == k->second.end() || v->second == "null") return std::nullopt;
    return sim::floats_of_base64(v->second);
  }

  const Run& m_;
  const Run& r_;
  Taint taint_;
  Conformance& out_;
};

}  // namespace

bool claimed_kernel_pair(const std::string& model_kernel, const std::string& real_kernel,
                         std::string* reason) {
  auto say = [&](bool claimed, const char* why) {
    if (reason != nullptr) *reason = why;
    return claimed;
  };
  if (model_kernel == "model_param" && real_kernel == "model_param")
    return say(true, "model params: bf16 copies of the master params of every rank");
  if (model_kernel != "ckptsim_fused_adam" && model_kernel != real_kernel)
    return say(false, "the two sides ran different kernels (the parts differ)");
  if (model_kernel == "torch_foreach_cuda" || model_kernel == "torch_fused_cpu")
    return say(true, "torch's own arithmetic, with its FMAs (model/kernels/adam_math.h)");
  if (model_kernel == "torch_fused_cuda")
    return say(false,
               "torch's fused CUDA AdamW: the GPU's powf (bias correction) is not correctly "
               "rounded, ckptsim's is (model/kernels/adam_math.h)");
  if (model_kernel == "ckptsim_fused_adam" && real_kernel == "standin_fused_adam")
    return say(true,
               "the runner's FusedAdam stand-in copies ckptsim's op order: equal hashes show "
               "stand-in = model, not TE = model");
  if (model_kernel == "ckptsim_fused_adam" && real_kernel == "te_fused_adam")
    return say(false,
               "TE's multi_tensor_adam is built with FMA contraction; ckptsim models the "
               "uncontracted order");
  return say(false, "a kernel pair ckptsim makes no claim about");
}

namespace {

// Compares the runs in trace order; a run that loads starts from the taint its source run had.
void compare_all_runs(const Trace& m, const Trace& r, Conformance& out) {
  std::map<std::string, Taint> taint_at_end;
  for (const auto& run : m.runs) {
    const Run* real = r.find(run.id);
    Taint inherited;
    if (run.load) {
      if (auto it = taint_at_end.find(run.load_from); it != taint_at_end.end())
        inherited = it->second;
    }
    RunComparison c(run, *real, std::move(inherited), out);
    c.compare();
    taint_at_end[run.id] = c.taint();
  }
}

}  // namespace

std::string Divergence::describe() const {
  std::string where = run;
  if (!at.empty()) where += " " + at;
  if (global_step >= 0) where += fmt::format(" global step {}", global_step);
  if (rank >= 0) where += fmt::format(" rank {}", rank);
  return fmt::format("{}: {}: model {}, real {}", where, field, model, real);
}

bool Conformance::verdicts_agree() const {
  return std::all_of(properties.begin(), properties.end(),
                     [](const PropertyAgreement& p) { return p.agree(); });
}

std::vector<TraceVerdict> judge_trace(const nlohmann::json& trace) {
  auto t = parse_trace(trace, "trace");
  if (!t.is_ok()) return {};
  return judge(t.value());
}

namespace {

// A real run without TE is no replay of a scenario that has it, nor the other way round: the
// model's setup says which the scenario needs, each real run which it had.
Status check_te_presence(const nlohmann::json& model_trace, const nlohmann::json& real_trace,
                         const std::string& real_source) {
  const auto setup = model_trace.find("setup");
  if (setup == model_trace.end() || !setup->contains("transformer_engine")) return Status::ok();
  const std::string needed = (*setup)["transformer_engine"].get<bool>() ? "installed" : "absent";
  for (const auto& run : real_trace.value("runs", nlohmann::json::array())) {
    const auto te = run.find("te");
    if (te == run.end() || !te->is_string()) continue;  // a skipped run
    const std::string had = *te == "absent" ? "absent" : "installed";
    if (had != needed) {
      return Status::invalid_input(
          fmt::format("{}: run '{}' ran with TE {} ({}), the scenario needs TE {} "
                      "(optimizer.transformer_engine)",
                      real_source, run.value("id", "?"), had, te->get<std::string>(), needed));
    }
  }
  return Status::ok();
}

}  // namespace

namespace {

// Uninitialized memory is a fact of the run, not of one side: the real run's state rests on the
// same skipped tensors, and the model, which knows which, says so in its trace. The real
// trace's matching events get the model's marks, so that both sides are judged alike.
void copy_uninitialized_marks(const Trace& model, Trace& real) {
  for (const auto& mr : model.runs) {
    for (auto& rr : real.runs) {
      if (rr.id != mr.id) continue;
      for (const auto& me : mr.events) {
        if (me.uninitialized.empty()) continue;
        for (auto& re : rr.events) {
          if (re.rank == me.rank && re.at == me.at && re.global_step == me.global_step)
            re.uninitialized = me.uninitialized;
        }
      }
    }
  }
}

}  // namespace

Result<Conformance> conform(const nlohmann::json& model_trace, const nlohmann::json& real_trace,
                            const std::string& real_source) {
  auto m = parse_trace(model_trace, "the model's trace");
  if (!m.is_ok()) return m.status();
  auto r = parse_trace(real_trace, real_source);
  if (!r.is_ok()) return r.status();
  if (m.value().scenario != r.value().scenario) {
    return Status::invalid_input(fmt::format("{}: a trace of scenario '{}', not of '{}'",
                                             real_source, r.value().scenario, m.value().scenario));
  }
  if (Status te = check_te_presence(model_trace, real_trace, real_source); !te.is_ok()) return te;
  Conformance out;
  copy_uninitialized_marks(m.value(), r.value());
  const auto mv = judge(m.value());
  const auto rv = judge(r.value());
  for (size_t i = 0; i < mv.size(); ++i) out.properties.push_back({mv[i].property, mv[i], rv[i]});
  for (const auto& p : all_properties()) {
    bool judged = false;
    for (const auto& v : mv) judged = judged || v.property == p.name;
    if (!judged) out.not_compared.push_back(p.name);
  }
  for (const auto& run : m.value().runs) {
    const Run* real = r.value().find(run.id);
    if (real == nullptr) {
      return Status::invalid_input(fmt::format(
          "{}: has no run '{}' (not a trace of this scenario's plan)", real_source, run.id));
    }
    if (real->dp != run.dp) {
      return Status::invalid_input(fmt::format("{}: run '{}' ran at dp {}, the scenario says {}",
                                               real_source, run.id, real->dp, run.dp));
    }
  }
  compare_all_runs(m.value(), r.value(), out);
  return out;
}

}  // namespace ckptsim::properties
