#include "properties/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "model/py/key.h"
#include "sim/scenario.h"

namespace ckptsim::properties::trace {

using nlohmann::json;

std::string Part::label() const { return fmt::format("{} {}[{}:{}]", part, param, begin, end); }

std::string Group::label() const {
  return fmt::format("the param group with wd_mult {} and lr_mult {}", num(wd_mult), num(lr_mult));
}

std::string Unwritten::label() const {
  return fmt::format("{}[{}:{}]{}", key, begin, end, missing_key ? " (missing key)" : "");
}

std::vector<Unwritten> merged(std::vector<Unwritten> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const Unwritten& a, const Unwritten& b) {
    return std::tie(a.key, a.missing_key, a.begin, a.end) <
           std::tie(b.key, b.missing_key, b.begin, b.end);
  });
  std::vector<Unwritten> out;
  for (auto& u : ranges) {
    if (!out.empty() && out.back().key == u.key && out.back().missing_key == u.missing_key &&
        u.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, u.end);
      continue;
    }
    out.push_back(std::move(u));
  }
  return out;
}

const Run* Trace::find(const std::string& id) const {
  for (const auto& r : runs) {
    if (r.id == id) return &r;
  }
  return nullptr;
}

namespace {

// A trace the format cannot hold (a field out of its range, two records of one event): thrown
// inside parse(), which turns it into its Status, as it does json's own exceptions.
struct Malformed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The limits of the integers a trace holds, far above any real run's and far below where
// arithmetic on them overflows (a rank's world is dp * tp * pp).
constexpr int64_t kSizeMax = int64_t{1} << 20;     // dp, tp, pp; a phase's index
constexpr int64_t kStepMax = int64_t{1} << 40;     // iterations, step aliases
constexpr int64_t kElementMax = int64_t{1} << 53;  // a range's ends

// `v`, a JSON integer within [lo, hi] (a float, a string or an integer out of range is refused:
// the checks index and count with these).
int64_t integer_in(const json& v, const std::string& what, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) throw Malformed(what + " is not an integer");
  // A parsed non-negative number is stored unsigned: past int64's range it is out of any range
  // here, and within it, it is bounded like the signed ones (lo too: dp 0 must not pass).
  const bool huge = v.is_number_unsigned() &&
                    v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (huge || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    throw Malformed(fmt::format("{} is {}, outside [{}, {}]", what, v.dump(), lo, hi));
  }
  return v.get<int64_t>();
}

// A [begin, end) range of elements: two integers, 0 <= begin <= end.
std::pair<int64_t, int64_t> range_at(const json& owner, const std::string& what) {
  const json& r = owner.at("range");
  const int64_t begin = integer_in(r.at(0), what + " range[0]", 0, kElementMax);
  const int64_t end = integer_in(r.at(1), what + " range[1]", begin, kElementMax);
  return {begin, end};
}

std::optional<double> number_or_null(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return j[key].get<double>();
}

// A part's state_dtypes: an object naming some of exp_avg, exp_avg_sq, master_param, each
// one of fp32, bf16, fp16, int16.
std::map<std::string, std::string> state_dtypes(const json& d, const std::string& what) {
  static const std::set<std::string> states = {"exp_avg", "exp_avg_sq", "master_param"};
  static const std::set<std::string> dtypes = {"fp32", "bf16", "fp16", "int16"};
  if (!d.is_object()) throw Malformed(what + " state_dtypes: must be an object");
  std::map<std::string, std::string> out;
  for (const auto& [state, dtype] : d.items()) {
    if (!states.contains(state)) {
      throw Malformed(what + " state_dtypes: unknown state \"" + state +
                      "\" (exp_avg, exp_avg_sq, master_param)");
    }
    if (!dtype.is_string() || !dtypes.contains(dtype.get<std::string>())) {
      throw Malformed(what + " state_dtypes." + state +
                      ": must be one of fp32, bf16, "
                      "fp16, int16, got " +
                      dtype.dump());
    }
    out[state] = dtype.get<std::string>();
  }
  return out;
}

// One event of a run whose ranks are [0, world); `what` names it in errors.
Event parse_event(const json& e, int64_t world, const std::string& what) {
  Event ev;
  ev.rank = static_cast<int>(integer_in(e.at("rank"), what + " rank", 0, world - 1));
  ev.at = e.at("at").get<std::string>();
  if (e.contains("global_step") && !e["global_step"].is_null())
    ev.global_step = integer_in(e["global_step"], what + " global_step", 0, kStepMax);
  if (ev.at == "error") {
    ev.stage = e.at("stage").get<std::string>();
    ev.py_type = e.at("py_type").get<std::string>();
    ev.message = e.at("message").get<std::string>();
    ev.site = e.at("site").get<std::string>();
    if (!e.at("merge_path").is_null())
      ev.merge_path = e["merge_path"].get<std::vector<std::string>>();
    if (const auto k = e.find("merge_kind"); k != e.end() && k->is_string()) ev.merge_kind = *k;
    ev.secondary = e.value("secondary", false);
    return ev;
  }
  for (const auto& p : e.at("parts")) {
    const auto [begin, end] = range_at(p, what + " part");
    Part part{p.at("part").get<std::string>(),
              p.at("param").get<std::string>(),
              begin,
              end,
              number_or_null(p, "step"),
              number_or_null(p, "step_used"),
              std::nullopt,
              "",
              std::nullopt,
              std::nullopt};
    if (p.contains("step_aliases"))
      part.aliases = integer_in(p["step_aliases"], what + " step_aliases", 0, kStepMax);
    if (p.contains("kernel")) part.kernel = p["kernel"].get<std::string>();
    if (const auto d = p.find("state_dtypes"); d != p.end())
      part.state_dtypes = state_dtypes(*d, what);
    if (p.contains("chain")) part.chain = integer_in(p["chain"], what + " chain", 0, 1);
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
  if (const auto gs = e.find("groups"); gs != e.end() && gs->is_array()) {
    std::vector<Group> groups;
    for (const auto& g : *gs) {
      groups.push_back({g.value("wd_mult", 1.0), g.value("lr_mult", 1.0), g.at("lr").get<double>(),
                        g.at("weight_decay").get<double>()});
    }
    ev.groups = std::move(groups);
  }
  if (const auto us = e.find("unwritten"); us != e.end() && us->is_array()) {
    std::vector<Unwritten> ranges;
    for (const auto& u : *us) {
      const auto [begin, end] = range_at(u, what + " unwritten");
      ranges.push_back(
          {u.at("key").get<std::string>(), begin, end, u.at("missing_key").get<bool>()});
    }
    ev.unwritten = std::move(ranges);
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

// An optional integer field of `j`, `fallback` where absent.
int64_t optional_integer(const json& j, const char* key, int64_t fallback, const std::string& what,
                         int64_t lo, int64_t hi) {
  const auto it = j.find(key);
  return it == j.end() ? fallback : integer_in(*it, what + " " + key, lo, hi);
}

// Two events of one rank, kind and global step (error events aside) would be judged as one:
// the checks and the conformance judge find an event by those three; so would two parts of one
// event in one place (Part::same_place).
void refuse_repeated_events(const Run& run) {
  std::set<std::tuple<int, std::string, int64_t>> seen;
  for (const Event& e : run.events) {
    if (e.at != "error" && !seen.emplace(e.rank, e.at, e.global_step).second) {
      throw Malformed(fmt::format("run {} has two {} events of rank {} at global step {}",
                                  model::py_str_repr(run.id), e.at, e.rank, e.global_step));
    }
    std::set<std::tuple<std::string, std::string, int64_t, int64_t>> places;
    for (const Part& p : e.parts) {
      if (!places.emplace(p.part, p.param, p.begin, p.end).second) {
        throw Malformed(
            fmt::format("run {} has two parts {} in its {} event of rank {} at "
                        "global step {}",
                        model::py_str_repr(run.id), p.label(), e.at, e.rank, e.global_step));
      }
    }
  }
}

Run parse_run(const json& r) {
  Run run;
  run.id = r.at("id").get<std::string>();
  const std::string what = "run " + model::py_str_repr(run.id);
  run.dp = integer_in(r.at("dp"), what + " dp", 1, kSizeMax);
  run.tp = optional_integer(r, "tp", 1, what, 1, kSizeMax);
  run.pp = optional_integer(r, "pp", 1, what, 1, kSizeMax);
  if (const auto ph = r.find("phase"); ph != r.end())  // the reference run names none
    run.phase = static_cast<int>(integer_in(*ph, what + " phase", 0, kSizeMax));
  run.status = r.at("status").get<std::string>();
  run.load = r.value("load", false);
  run.start_step = optional_integer(r, "start_step", 0, what, 0, kStepMax);
  run.steps = optional_integer(r, "steps", 0, what, 0, kStepMax);
  run.load_from = r.value("load_from", std::string());
  if (const auto te = r.find("te"); te != r.end() && te->is_string()) run.te = *te;
  run.fused_adam_standin = r.value("fused_adam_standin", false);
  if (const auto f = r.find("storage_faults"); f != r.end() && f->is_array()) {
    for (const auto& x : *f) run.storage_faults.push_back(x.get<std::string>());
  }
  run.crashed = r.value("crashed", false);
  const int64_t world = run.dp * run.tp * run.pp;
  for (const auto& e : r.at("events")) {
    run.events.push_back(
        parse_event(e, world, fmt::format("{} event {}", what, run.events.size())));
  }
  refuse_repeated_events(run);
  return run;
}

}  // namespace

Result<Trace> parse(const json& j, const std::string& source) {
  try {
    // The version as an integer only: value<int>() of a float out of int's range is undefined
    // (trace_fuzzer, 2026-12-05).
    const auto version = j.is_object() ? j.find("version") : j.end();
    const bool version_1 =
        version != j.end() && version->is_number_integer() && version->get<int64_t>() == 1;
    if (!j.is_object() || j.value("format", "") != "ckptsim-trace" || !version_1) {
      return Status::invalid_input(source + ": not a ckptsim trace of version 1");
    }
    Trace t;
    t.scenario = j.at("scenario").get<std::string>();
    for (const auto& r : j.at("runs")) {
      t.runs.push_back(parse_run(r));
      if (&t.runs.back() != t.find(t.runs.back().id))  // find() would only ever see the first
        throw Malformed("two runs " + model::py_str_repr(t.runs.back().id));
    }
    // Which side wrote it: the files its storage faults name are that side's (conformance).
    t.source = j.at("source").get<std::string>();
    if (t.source != "model" && t.source != "real")
      throw Malformed("source is " + model::py_str_repr(t.source) + ", not 'model' or 'real'");
    infer_kernels(t);
    return t;
  } catch (const json::exception& e) {
    return Status::invalid_input(source + ": not a readable trace: " + e.what());
  } catch (const Malformed& e) {
    // What the trace names is quoted above; a part's label keeps a param's name as written, so
    // the message is made one line here too.
    std::string why = e.what();
    for (size_t at = why.find('\n'); at != std::string::npos; at = why.find('\n', at))
      why.replace(at, 1, "\\n");
    return Status::invalid_input(source + ": not a readable trace: " + why);
  }
}

std::string num(const std::optional<double>& x) {
  if (!x.has_value() || std::isnan(*x)) return "none";
  if (*x == std::floor(*x)) return fmt::format("{:.0f}", *x);
  return fmt::format("{:.9g}", *x);
}

std::vector<const Event*> events_at(const Run& run, const std::string& at, int64_t global_step) {
  std::vector<const Event*> out;
  for (const auto& e : run.events) {
    if (e.at == at && e.global_step == global_step) out.push_back(&e);
  }
  return out;
}

std::vector<const Event*> reference_at(const Trace& t, int64_t global_step) {
  const Run* ref = t.find("reference");
  if (ref == nullptr) return {};
  return events_at(*ref, global_step == 0 ? "init" : "after_step", global_step);
}

int64_t optimizer_origin(const Trace& t, const Run& run, int64_t global_step) {
  if (t.spec == nullptr) return 0;
  const std::vector<int64_t> origins = sim::optimizer_origins(*t.spec);
  if (run.phase >= 0)
    return static_cast<size_t>(run.phase) < origins.size() ? origins[run.phase] : 0;
  int64_t origin = 0;
  for (size_t i = 0; i < origins.size(); ++i) {
    if (t.spec->phases[i].fresh_optimizer() && origins[i] < global_step) origin = origins[i];
  }
  return origin;
}

bool starts_optimizer_afresh(const Trace& t, const Run& run) {
  const int64_t origin = optimizer_origin(t, run, run.start_step);
  return run.phase > 0 && origin > 0 && origin == run.start_step;
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

bool load_completed(const Run& run) {
  return run.status != "skipped" && !events_at(run, "after_load", run.start_step).empty();
}

int stage_rank(const std::string& stage) {
  if (stage == "init") return 0;
  if (stage == "load") return 1;
  if (stage == "train") return 2;
  return 3;  // save
}

std::string stopped_before(const Trace& baseline, const Trace& candidate,
                           const std::string& run_id) {
  const Run* c = candidate.find(run_id);
  const Event* ce = c != nullptr ? first_primary_error(*c) : nullptr;
  if (ce == nullptr) return "";
  const Run* b = baseline.find(run_id);
  if (b == nullptr || b->status == "skipped")
    return fmt::format("the all-baseline run never ran {} (the candidate's fails at its {})",
                       run_id, ce->stage);
  const Event* be = first_primary_error(*b);
  if (be == nullptr || stage_rank(be->stage) >= stage_rank(ce->stage)) return "";
  return fmt::format(
      "the all-baseline run's {} stopped at its {} ({}), before the {} where the candidate's "
      "fails",
      run_id, be->stage, be->py_type, ce->stage);
}

}  // namespace ckptsim::properties::trace
