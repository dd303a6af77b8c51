#include "properties/conformance.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>
#include <map>
#include <optional>
#include <set>

#include "model/py/key.h"
#include "properties/trace.h"
#include "sim/float_codec.h"

namespace ckptsim::properties {

namespace {

using nlohmann::json;

using trace::Event;
using trace::first_primary_error;
using trace::Part;
using trace::Run;
using trace::Trace;

// The verdicts of the properties a trace can judge, in registry order.
std::vector<TraceVerdict> judge(const Trace& t) {
  std::vector<TraceVerdict> out;
  for (const auto& p : all_properties()) {
    if (p.trace_check) out.push_back(p.trace_check(t));
  }
  return out;
}

// ---- divergences ------------------------------------------------------------------------------

// The params of a run whose state no longer rests on claimed kernel pairs alone (an update by a
// pair the model does not claim, or uninitialized memory), with the first reason for each.
using Taint = std::map<std::string, std::string>;

// A fired storage fault as both sides can name it: "<kind> <file kind>[ rank R]". The model
// names its own files (shards/rank_R.bin, *.pt, metadata.json: its piece index), the runner the
// real ones (__R_0.distcp, common.pt, .metadata: DCP's piece index); replay/storage_faults.py
// maps one onto the other.
std::string fault_key(const std::string& fired, const std::string& source) {
  const std::string kind = fired.substr(0, fired.find(' '));
  std::string path =
      fired.substr(fired.rfind(": ") == std::string::npos ? 0 : fired.rfind(": ") + 2);
  if (const auto paren = path.find(" ("); paren != std::string::npos) path.resize(paren);
  const std::string base =
      path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  const auto rank_of = [&](const std::string& prefix) {
    return base.starts_with(prefix)
               ? base.substr(prefix.size(),
                             base.find_first_not_of("0123456789", prefix.size()) - prefix.size())
               : std::string("?");
  };
  std::string file = "other";
  if (base == "latest_checkpointed_iteration.txt")
    file = "tracker";
  else if (source == "model" && base.ends_with(".bin"))
    file = "shard rank " + rank_of("rank_");
  else if (source != "model" && base.ends_with(".distcp"))
    file = "shard rank " + rank_of("__");
  else if (base.ends_with(".pt"))
    file = "object";
  else if (source == "model" ? base == "metadata.json" : base.starts_with(".metadata"))
    file = "metadata";
  return kind + " " + file;
}

std::string fault_keys(const Run& run, const std::string& source) {
  std::string out;
  for (const auto& f : run.storage_faults) out += (out.empty() ? "" : "; ") + fault_key(f, source);
  return out.empty() ? "none" : out;
}

class RunComparison {
 public:
  RunComparison(const Run& model, const Run& real, Taint inherited, Conformance& out)
      : m_(model), r_(real), taint_(std::move(inherited)), out_(out) {}

  // Where the scenario has storage faults: the crash and the resume after it. The fired faults'
  // files are named as the trace that recorded them names its files: `model_names` and
  // `real_names` are the two traces' sources ("model": the model's files, else DCP's).
  void compare_crash_and_resume(const std::string& model_names, const std::string& real_names) {
    if (!m_.storage_faults.empty() || !r_.storage_faults.empty() || m_.crashed || r_.crashed) {
      const std::string mk = fault_keys(m_, model_names);
      const std::string rk = fault_keys(r_, real_names);
      out_.crashes.add(m_.crashed == r_.crashed && mk == rk);
      if (m_.crashed != r_.crashed)
        run_divergence("crashed", m_.crashed ? "true" : "false", r_.crashed ? "true" : "false");
      if (mk != rk) run_divergence("storage faults fired", mk, rk);
    }
    if (m_.phase <= 0 || m_.status == "skipped" || r_.status == "skipped") return;
    const auto resume = [](const Run& r) {
      return r.load ? fmt::format("loaded iteration {} (saved by {})", r.start_step, r.load_from)
                    : fmt::format("started at iteration {} without a load", r.start_step);
    };
    out_.resumes.add(resume(m_) == resume(r_));
    if (resume(m_) != resume(r_)) run_divergence("resumed", resume(m_), resume(r_));
  }

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

  void run_divergence(const std::string& field, const std::string& mv, const std::string& rv) {
    out_.divergences.push_back({m_.id, -1, -1, "", field, mv, rv});
  }

  void compare_status_and_error() {
    out_.statuses.add(m_.status == r_.status);
    if (m_.status != r_.status) run_divergence("status", m_.status, r_.status);
    if (m_.crashed && r_.crashed) return;  // an exception at the crashed write vs a killed job
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
    if (m.groups && r.groups) compare_groups(m, *m.groups, *r.groups);
    if (m.unwritten && r.unwritten) compare_unwritten(m, *m.unwritten, *r.unwritten);
  }

  // What the load left unwritten on this rank, both ways (merged: the two sides may split one
  // range over two requests of one key).
  void compare_unwritten(const Event& e, const std::vector<trace::Unwritten>& mu,
                         const std::vector<trace::Unwritten>& ru) {
    const auto m = trace::merged(mu);
    const auto r = trace::merged(ru);
    std::vector<trace::Unwritten> only_m;
    std::vector<trace::Unwritten> only_r;
    std::set_difference(m.begin(), m.end(), r.begin(), r.end(), std::back_inserter(only_m));
    std::set_difference(r.begin(), r.end(), m.begin(), m.end(), std::back_inserter(only_r));
    const int64_t same = static_cast<int64_t>(m.size() - only_m.size());
    for (int64_t i = 0; i < same; ++i) out_.unwritten.add(true);
    for (const auto& u : only_m) {
      out_.unwritten.add(false);
      add(e, "unwritten " + u.label(), "left unwritten", "written");
    }
    for (const auto& u : only_r) {
      out_.unwritten.add(false);
      add(e, "unwritten " + u.label(), "written", "left unwritten");
    }
    if (m.empty() && r.empty()) out_.unwritten.add(true);  // both probed, both wrote everything
  }

  // The lr and weight decay of each param group (keyed by its multipliers), both ways, bit for
  // bit: both sides compute the schedule in doubles by the same formulas.
  void compare_groups(const Event& e, const std::vector<trace::Group>& mg,
                      const std::vector<trace::Group>& rg) {
    using Key = std::pair<double, double>;
    auto by_key = [](const std::vector<trace::Group>& gs) {
      std::map<Key, std::vector<std::pair<double, double>>> out;
      for (const auto& g : gs) out[{g.wd_mult, g.lr_mult}].emplace_back(g.lr, g.weight_decay);
      for (auto& [key, values] : out) std::sort(values.begin(), values.end());
      return out;
    };
    const auto m = by_key(mg);
    const auto r = by_key(rg);
    auto text = [](const std::vector<std::pair<double, double>>* v) {
      if (v == nullptr) return std::string("absent");
      std::string out;
      for (const auto& [lr, wd] : *v)
        out += fmt::format("{}lr {:.17g} weight_decay {:.17g}", out.empty() ? "" : "; ", lr, wd);
      return out;
    };
    std::set<Key> keys;
    for (const auto& [k, v] : m) keys.insert(k);
    for (const auto& [k, v] : r) keys.insert(k);
    for (const Key& k : keys) {
      const auto mi = m.find(k);
      const auto ri = r.find(k);
      const auto* mv = mi == m.end() ? nullptr : &mi->second;
      const auto* rv = ri == r.end() ? nullptr : &ri->second;
      const bool same = mv != nullptr && rv != nullptr && *mv == *rv;
      out_.groups.add(same);
      if (!same) {
        const trace::Group g{k.first, k.second, 0, 0};
        add(e, g.label() + " lr and weight_decay", text(mv), text(rv));
      }
    }
  }

  static std::string dtypes_text(const std::optional<std::map<std::string, std::string>>& d) {
    if (!d.has_value()) return "absent";
    std::string out;
    for (const auto& [state, dtype] : *d)
      out += fmt::format("{}{} {}", out.empty() ? "" : ", ", state, dtype);
    return out.empty() ? "none" : out;
  }

  void compare_counters(const Event& e, const Part& mp, const Part& rp) {
    for (const auto& [name, a, b] : {std::tuple{"step", mp.step, rp.step},
                                     std::tuple{"step_used", mp.step_used, rp.step_used}}) {
      ++out_.counters_compared;
      if (a == b) {
        ++out_.counters_equal;
      } else {
        add(e, mp.label() + " " + name, trace::num(a), trace::num(b));
      }
    }
    // The chain part that holds the shard: wherever either side records it, both must, alike.
    if (mp.chain != rp.chain) {
      out_.parts.add(false);
      add(e, mp.label() + " chain", mp.chain ? std::to_string(*mp.chain) : "absent",
          rp.chain ? std::to_string(*rp.chain) : "absent");
    }
    // The dtypes each state is stored in: wherever either side records them, both must, alike.
    if (mp.state_dtypes.has_value() || rp.state_dtypes.has_value()) {
      const bool same = mp.state_dtypes == rp.state_dtypes;
      out_.state_dtypes.add(same);
      if (!same)
        add(e, mp.label() + " state_dtypes", dtypes_text(mp.state_dtypes),
            dtypes_text(rp.state_dtypes));
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
  const auto faulted = [](const Trace& t) {
    return std::any_of(t.runs.begin(), t.runs.end(),
                       [](const Run& run) { return !run.storage_faults.empty() || run.crashed; });
  };
  const bool storage_faults = faulted(m) || faulted(r);
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
    if (storage_faults) c.compare_crash_and_resume(m.source, r.source);
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

std::vector<TraceVerdict> judge_trace(const nlohmann::json& trace, const sim::Scenario* spec) {
  auto t = trace::parse(trace, "trace");
  if (!t.is_ok()) return {};
  t.value().spec = spec;
  return judge(t.value());
}

namespace {

// A real run without TE is no replay of a scenario that has it, nor the other way round: the
// model's setup says which the scenario needs, each real run which it had.
Status check_te_presence(const nlohmann::json& model_trace, const nlohmann::json& real_trace,
                         const std::string& real_source) {
  const auto setup = model_trace.find("setup");
  if (setup == model_trace.end() || !setup->contains("transformer_engine")) return Status::ok();
  if (!(*setup)["transformer_engine"].is_boolean()) {
    return Status::invalid_input(
        "the model's trace: setup.transformer_engine is not true or false");
  }
  const std::string needed = (*setup)["transformer_engine"].get<bool>() ? "installed" : "absent";
  for (const auto& run : real_trace.value("runs", nlohmann::json::array())) {
    const auto te = run.find("te");
    if (te == run.end() || !te->is_string()) continue;  // a skipped run
    const std::string had = *te == "absent" ? "absent" : "installed";
    if (had != needed) {
      // The trace's own strings are quoted as Python's repr writes them: one line whatever they
      // hold (trace_fuzzer found a 'te' with a newline in it).
      const auto id = run.find("id");
      return Status::invalid_input(fmt::format(
          "{}: run {} ran with TE {} ({}), the scenario needs TE {} "
          "(optimizer.transformer_engine)",
          real_source,
          id != run.end() && id->is_string() ? model::py_str_repr(id->get<std::string>()) : "?",
          had, model::py_str_repr(te->get<std::string>()), needed));
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

// A field one side did not record is compared nowhere: where the real trace's event has no
// param groups or no load probe (`unwritten`: traces recorded before the runner wrote them), the
// model's event drops its own, so that both sides' verdicts rest on the same facts.
void drop_unrecorded_fields(Trace& model, const Trace& real) {
  for (auto& mr : model.runs) {
    const Run* rr = real.find(mr.id);
    if (rr == nullptr) continue;
    for (auto& me : mr.events) {
      for (const auto& re : rr->events) {
        if (re.rank != me.rank || re.at != me.at || re.global_step != me.global_step) continue;
        if (!re.groups) me.groups.reset();
        if (!re.unwritten) me.unwritten.reset();
      }
    }
  }
}

}  // namespace

Result<Conformance> conform(const nlohmann::json& model_trace, const nlohmann::json& real_trace,
                            const std::string& real_source, const sim::Scenario* spec) {
  auto m = trace::parse(model_trace, "the model's trace");
  if (!m.is_ok()) return m.status();
  auto r = trace::parse(real_trace, real_source);
  if (!r.is_ok()) return r.status();
  m.value().spec = spec;
  r.value().spec = spec;
  if (m.value().scenario != r.value().scenario) {
    return Status::invalid_input(fmt::format("{}: a trace of scenario '{}', not of '{}'",
                                             real_source, r.value().scenario, m.value().scenario));
  }
  if (Status te = check_te_presence(model_trace, real_trace, real_source); !te.is_ok()) return te;
  Conformance out;
  copy_uninitialized_marks(m.value(), r.value());
  drop_unrecorded_fields(m.value(), r.value());
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
    if (real->dp != run.dp || real->tp != run.tp || real->pp != run.pp) {
      return Status::invalid_input(
          fmt::format("{}: run '{}' ran at tp {} pp {} dp {}, the scenario says tp {} pp {} dp {}",
                      real_source, run.id, real->tp, real->pp, real->dp, run.tp, run.pp, run.dp));
    }
  }
  compare_all_runs(m.value(), r.value(), out);
  return out;
}

}  // namespace ckptsim::properties
