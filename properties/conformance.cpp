#include "properties/conformance.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <optional>

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
  std::string label() const { return fmt::format("{} {}[{}:{}]", part, param, begin, end); }
};

struct Event {
  int rank = 0;
  std::string at;
  int64_t global_step = 0;
  std::vector<Part> parts;
  std::map<std::string, std::map<std::string, std::string>> hashes;  // kind -> param -> hash
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
  std::vector<Event> events;
};

struct Trace {
  std::string scenario;
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
              std::nullopt};
    if (p.contains("step_aliases")) part.aliases = p["step_aliases"].get<int64_t>();
    ev.parts.push_back(std::move(part));
  }
  for (const auto& [kind, m] : e.at("hashes").items()) {
    for (const auto& [param, h] : m.items()) {
      if (!h.is_null()) ev.hashes[kind][param] = h.get<std::string>();
    }
  }
  return ev;
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
      for (const auto& e : r.at("events")) run.events.push_back(parse_event(e));
      t.runs.push_back(std::move(run));
    }
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
std::string param_hash_difference(const std::vector<const Event*>& a,
                                  const std::vector<const Event*>& b) {
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
    if (it != ys->second.end() && it->second != h) return param;
  }
  return "";
}

TraceVerdict judge_trajectory(const Trace& t) {
  std::string not_evaluated;
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
      const std::string p = param_hash_difference(events_at(run, at, g), ref);
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
  return verdict("trajectory_matches_uninterrupted", Verdict::kPass,
                 fmt::format("{} states: model params hash equal to the reference's", states));
}

TraceVerdict judge_round_trip(const Trace& t) {
  int loads = 0;
  std::string not_evaluated;
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
    if (const std::string p = param_hash_difference(loaded, saved); !p.empty()) {
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

void compare_parts(const Run& run, const Event& m, const Event& r, Conformance& out) {
  auto add = [&](const std::string& field, const std::string& mv, const std::string& rv) {
    out.divergences.push_back({run.id, m.global_step, m.rank, m.at, field, mv, rv});
  };
  for (const auto& mp : m.parts) {
    const Part* rp = nullptr;
    for (const auto& p : r.parts) {
      if (p.part == mp.part && p.param == mp.param && p.begin == mp.begin && p.end == mp.end)
        rp = &p;
    }
    if (rp == nullptr) {
      add(mp.label(), "present", "absent");
      continue;
    }
    for (const auto& [name, a, b] : {std::tuple{"step", mp.step, rp->step},
                                     std::tuple{"step_used", mp.step_used, rp->step_used}}) {
      ++out.counters_compared;
      if (a == b) {
        ++out.counters_equal;
      } else {
        add(mp.label() + " " + name, num(a), num(b));
      }
    }
  }
  for (const auto& rp : r.parts) {
    bool found = false;
    for (const auto& p : m.parts)
      found = found || (p.part == rp.part && p.param == rp.param && p.begin == rp.begin);
    if (!found) add(rp.label(), "absent", "present");
  }
  for (const auto& [kind, params] : m.hashes) {
    auto rk = r.hashes.find(kind);
    for (const auto& [param, h] : params) {
      if (rk == r.hashes.end() || rk->second.count(param) == 0) continue;
      ++out.hashes_compared;
      if (rk->second.at(param) == h) {
        ++out.hashes_equal;
      } else {
        out.hash_divergences.push_back(
            {run.id, m.global_step, m.rank, m.at, kind + " " + param, h, rk->second.at(param)});
      }
    }
  }
}

void compare_runs(const Run& m, const Run& r, Conformance& out) {
  if (m.status != r.status)
    out.divergences.push_back({m.id, -1, -1, "", "status", m.status, r.status});
  const Event* me = first_primary_error(m);
  const Event* re = first_primary_error(r);
  ++out.errors_compared;
  if ((me != nullptr) != (re != nullptr) ||
      (me != nullptr &&
       (me->py_type != re->py_type || me->site != re->site || me->merge_path != re->merge_path))) {
    auto describe = [](const Event* e) {
      if (e == nullptr) return std::string("no error");
      std::string path;
      if (e->merge_path) {
        for (const auto& k : *e->merge_path) path += (path.empty() ? " at (" : ", ") + k;
        path += ")";
      }
      return fmt::format("rank {} {}: {} [{}]{}", e->rank, e->stage, e->py_type, e->site, path);
    };
    out.divergences.push_back({m.id, -1, me ? me->rank : re->rank, "error", "first primary error",
                               describe(me), describe(re)});
  } else {
    ++out.errors_equal;
  }
  for (const auto& e : m.events) {
    if (e.at == "error") continue;
    const Event* match = nullptr;
    for (const auto& x : r.events) {
      if (x.rank == e.rank && x.at == e.at && x.global_step == e.global_step) match = &x;
    }
    if (match == nullptr) {
      out.divergences.push_back({m.id, e.global_step, e.rank, e.at, "event", "present", "absent"});
      continue;
    }
    compare_parts(m, e, *match, out);
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
    compare_runs(run, *real, out);
  }
  return out;
}

}  // namespace ckptsim::properties
