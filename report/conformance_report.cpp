#include "report/conformance_report.h"

#include <fmt/format.h>

#include <map>
#include <set>
#include <tuple>

#include "report/run_report.h"

namespace ckptsim::report {

namespace {

std::string revisions_of(const sim::Scenario& s) {
  std::string out;
  std::string last;
  for (const auto& p : s.phases) {
    if (p.profile->name == last) continue;
    out += (out.empty() ? "" : " → ") + p.profile->name;
    last = p.profile->name;
  }
  return out;
}

// The kind, and for a hybrid whether the scenario has TE (Megatron's other branches).
std::string kind_and_te(const sim::Scenario& s) {
  std::string k = model::optimizer_kind_name(s.optimizer.kind);
  if (s.optimizer.kind == model::OptimizerKind::kHybrid && !s.optimizer.te_installed)
    k += " without TE";
  return k;
}

std::string kind_of(const sim::Scenario& s) {
  std::string k = kind_and_te(s);
  if (s.optimizer.kind == model::OptimizerKind::kHybrid)
    k += fmt::format(" (offload {:g})", s.optimizer.offload_fraction);
  return k;
}

std::string dps_of(const sim::Scenario& s) {
  std::string out;
  for (const auto& p : s.phases) out += (out.empty() ? "" : "→") + std::to_string(p.dp);
  return out;
}

std::string ratio(int64_t a, int64_t b) { return fmt::format("{} / {}", a, b); }

// Short names of the kernels, for tables.
std::string short_kernel(const std::string& k) {
  if (k == "torch_foreach_cuda") return "foreach";
  if (k == "torch_fused_cpu") return "fused cpu";
  if (k == "torch_fused_cuda") return "fused cuda";
  if (k == "ckptsim_fused_adam") return "ckptsim FusedAdam";
  if (k == "standin_fused_adam") return "stand-in";
  if (k == "te_fused_adam") return "TE";
  return k;
}

std::string pair_label(const std::string& model, const std::string& real) {
  if (model == real) return short_kernel(model);
  return short_kernel(model) + " / " + short_kernel(real);
}

struct PairTotals {
  bool claimed = false;
  std::string reason;
  properties::Tally required;
  properties::Tally reported;
  properties::Tally elements;  // every element value compared (traces with --values)
};

struct Totals {
  int traces = 0;
  int agree = 0;
  int verdicts = 0;
  int verdicts_agree = 0;
  int64_t counters = 0;
  int64_t counters_equal = 0;
  properties::Tally parts;
  properties::Tally required;
  int64_t hashes = 0;
  int64_t hashes_equal = 0;
  int bitwise = 0;  // traces whose every hash is equal
  std::map<std::pair<std::string, std::string>, PairTotals> pairs;
  void add(const properties::Conformance& c) {
    ++traces;
    agree += c.agrees() ? 1 : 0;
    for (const auto& p : c.properties) {
      ++verdicts;
      verdicts_agree += p.agree() ? 1 : 0;
    }
    counters += c.counters_compared;
    counters_equal += c.counters_equal;
    parts.compared += c.parts.compared;
    parts.equal += c.parts.equal;
    required.compared += c.hashes_required.compared;
    required.equal += c.hashes_required.equal;
    hashes += c.hashes_compared;
    hashes_equal += c.hashes_equal;
    bitwise += c.hashes_equal == c.hashes_compared ? 1 : 0;
    for (const auto& h : c.hash_pairs) {
      PairTotals& t = pairs[{h.model_kernel, h.real_kernel}];
      t.claimed = h.claimed;
      t.reason = h.reason;
      t.required.compared += h.required.compared;
      t.required.equal += h.required.equal;
      t.reported.compared += h.reported.compared;
      t.reported.equal += h.reported.equal;
      t.elements.compared += h.required_elements.compared + h.reported_elements.compared;
      t.elements.equal += h.required_elements.equal + h.reported_elements.equal;
    }
  }
  // "foreach 120/120 · fused cpu 30/32": every hash of each kernel pair.
  std::string per_pair() const {
    std::string out;
    for (const auto& [k, t] : pairs) {
      if (k.first == "model_param") continue;
      out += fmt::format("{}{} {}/{}", out.empty() ? "" : " · ", pair_label(k.first, k.second),
                         t.required.equal + t.reported.equal,
                         t.required.compared + t.reported.compared);
    }
    return out.empty() ? "—" : out;
  }
};

std::string totals_row(const std::string& label, const Totals& t) {
  return fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", label, t.traces,
                     ratio(t.agree, t.traces), ratio(t.verdicts_agree, t.verdicts),
                     ratio(t.counters_equal, t.counters), ratio(t.parts.equal, t.parts.compared),
                     ratio(t.required.equal, t.required.compared), ratio(t.hashes_equal, t.hashes),
                     t.per_pair());
}

// ---- the features of a scenario where the real code has been seen to differ ----

bool divides(int64_t a, int64_t b) { return a % b == 0 || b % a == 0; }

std::string reshard_class(const sim::Scenario& s) {
  if (s.phases.size() < 2) return "no resume";
  bool moved = false;
  for (size_t i = 1; i < s.phases.size(); ++i) {
    const int64_t a = s.phases[i - 1].dp, b = s.phases[i].dp;
    if (!divides(a, b)) return "a non-dividing reshard";
    moved = moved || a != b;
  }
  return moved ? "dividing reshards only" : "same DP throughout";
}

std::string scheduler_change(const sim::Scenario& s) {
  std::string out;
  for (size_t i = 1; i < s.phases.size(); ++i) {
    if (s.schedule_of(i) == s.schedule_of(i - 1)) continue;
    const std::string flag =
        s.phases[i].opt_param_scheduler == model::SchedulerResume::kOverride ? "override"
        : s.phases[i].opt_param_scheduler == model::SchedulerResume::kUseCheckpoint
            ? "use_checkpoint"
            : "neither";
    if (out.find(flag) == std::string::npos) out += (out.empty() ? "" : ", ") + flag;
  }
  return out.empty() ? "no change" : "new arguments under " + out;
}

std::string groups_of(const sim::Scenario& s) {
  std::set<std::pair<double, double>> mults;
  bool own_lr = false;
  for (const auto& p : s.params) {
    mults.insert({p.wd_mult, p.lr_mult});
    own_lr = own_lr || p.lr_mult != 1.0;
  }
  if (mults.size() == 1) return own_lr ? "one group, own lr bounds" : "one group";
  return own_lr ? "several groups, own lr bounds" : "several groups";
}

std::string fp32_mix(const sim::Scenario& s) {
  bool fp32 = false, bf16 = false;
  for (const auto& p : s.params) (p.dtype == model::DType::kFloat32 ? fp32 : bf16) = true;
  return fp32 && bf16 ? "bf16 and fp32" : fp32 ? "fp32 only" : "bf16 only";
}

std::string long_phase(const sim::Scenario& s) {
  for (const auto& p : s.phases) {
    if (p.steps >= 250) return "a long phase (250+ steps)";
  }
  return "short phases";
}

struct Feature {
  const char* name;
  std::string (*of)(const sim::Scenario&);
};

constexpr Feature kFeatures[] = {{"reshard class", reshard_class},
                                 {"scheduler change on a resume", scheduler_change},
                                 {"param groups", groups_of},
                                 {"fp32 mix", fp32_mix},
                                 {"long phase", long_phase}};

constexpr const char* kTableHead =
    "| traces | agree | verdicts agree | step counters equal | parts equal | required hashes "
    "equal | hashes equal | hashes equal per kernel pair |";
constexpr const char* kTableRule = "|---|---|---|---|---|---|---|---|---|";

std::string feature_tables(const std::vector<ConformanceRow>& rows) {
  std::string out =
      "\n## Per revision, kind and feature\n\nThe features of a scenario where the real code has "
      "been seen to differ from the model. Kernel pairs: foreach = torch AdamW on CUDA "
      "(_multi_tensor_adam), fused cpu / fused cuda = torch AdamW(fused=True), ckptsim FusedAdam "
      "/ stand-in = the model's TE FusedAdam arithmetic against the runner's stand-in (which "
      "copies it: equal hashes there show stand-in = model, not TE = model).\n";
  for (const Feature& f : kFeatures) {
    std::map<std::tuple<std::string, std::string, std::string>, Totals> groups;
    for (const auto& r : rows)
      groups[{revisions_of(r.scenario), kind_and_te(r.scenario), f.of(r.scenario)}].add(r.result);
    out += fmt::format("\n### {}\n\n| revisions, kind | {} {}\n|---|---{}\n", f.name, f.name,
                       kTableHead, kTableRule);
    for (const auto& [k, t] : groups) {
      const auto& [rev, kind, value] = k;
      out += fmt::format("| {}, {} | {} |", rev, kind, value) + totals_row("", t).substr(4);
    }
  }
  return out;
}

std::string kernel_pair_table(const Totals& all) {
  std::string out =
      "\n## State hashes per kernel pair\n\nA hash is required where the model claims to "
      "compute what the real kernel computes, and every update of that param before it, in "
      "this run and in the runs its checkpoints came from, was by a claimed pair (and no load "
      "left it with uninitialized memory); the others are reported. Element values are compared "
      "where a real trace was recorded with `--values` (tests/conformance/values/).\n\n| model "
      "kernel | real kernel | claimed | required hashes equal | reported hashes equal | all equal "
      "| element values equal | why |\n|---|---|---|---|---|---|---|---|\n";
  for (const auto& [k, t] : all.pairs) {
    const int64_t eq = t.required.equal + t.reported.equal;
    const int64_t n = t.required.compared + t.reported.compared;
    out += fmt::format("| {} | {} | {} | {} | {} | {} ({:.1f} %) | {} | {} |\n", k.first, k.second,
                       t.claimed ? "yes" : "no", ratio(t.required.equal, t.required.compared),
                       ratio(t.reported.equal, t.reported.compared), ratio(eq, n),
                       n == 0 ? 100.0 : 100.0 * static_cast<double>(eq) / static_cast<double>(n),
                       ratio(t.elements.equal, t.elements.compared), t.reason);
  }
  return out;
}

// The pictures of the disagreements (`ckptsim plot --real`), one after the other.
std::string pictures(const std::vector<ConformanceRow>& rows) {
  std::string out;
  for (const auto& r : rows) {
    if (r.plot.empty()) continue;
    out += fmt::format(
        "\n### {}\n\n`{}`\n\n![{}: the model, its uninterrupted run and the "
        "real code]({})\n",
        r.scenario.name, r.trace_file, r.scenario.name, r.plot);
  }
  if (out.empty()) return out;
  return "\n## The disagreements, as pictures\n\nEvery Adam part's step counter and the largest "
         "divergence from the uninterrupted run against the global step (`ckptsim plot "
         "SCENARIO --real TRACE`): the model, its uninterrupted run, the real run and the real "
         "uninterrupted run. A real trace holds hashes only: its divergence is equal or "
         "differs, not a size.\n" +
         out;
}

// The fields of the strict judge, in the order they are read.
std::vector<std::pair<std::string, properties::Tally>> fields_of(const properties::Conformance& c) {
  properties::Tally verdicts;
  for (const auto& p : c.properties) verdicts.add(p.agree());
  return {{"verdicts", verdicts},
          {"statuses", c.statuses},
          {"first errors", {c.errors_compared, c.errors_equal}},
          {"events", c.events},
          {"parts", c.parts},
          {"step counters", {c.counters_compared, c.counters_equal}},
          {"step_aliases", c.step_aliases},
          {"param groups", c.groups},
          {"load coverage", c.unwritten},
          {"required hashes", c.hashes_required}};
}

}  // namespace

std::string conformance_fields(const properties::Conformance& c) {
  std::string out;
  auto fields = fields_of(c);
  // Only where a side records state dtypes (a precision-aware FusedAdam), likewise.
  if (c.state_dtypes.compared > 0) fields.emplace_back("state dtypes", c.state_dtypes);
  // Only where the scenario has storage faults, so that other scenarios' lines stay as they were.
  if (c.crashes.compared + c.resumes.compared > 0) {
    fields.emplace_back("crashes", c.crashes);
    fields.emplace_back("resumes", c.resumes);
  }
  for (const auto& [name, t] : fields)
    out += fmt::format("{}{} {}/{}", out.empty() ? "" : ", ", name, t.equal, t.compared);
  return out;
}

std::vector<std::string> conformance_kernel_pairs(const properties::Conformance& c) {
  std::vector<std::string> out;
  for (const auto& h : c.hash_pairs) {
    std::string elements;
    if (h.required_elements.compared + h.reported_elements.compared > 0) {
      elements = fmt::format("; element values: required {}/{}, reported {}/{}",
                             h.required_elements.equal, h.required_elements.compared,
                             h.reported_elements.equal, h.reported_elements.compared);
    }
    out.push_back(fmt::format("{} / {} ({}): required {}/{}, reported {}/{}{}", h.model_kernel,
                              h.real_kernel, h.claimed ? "claimed" : "not claimed: " + h.reason,
                              h.required.equal, h.required.compared, h.reported.equal,
                              h.reported.compared, elements));
  }
  return out;
}

nlohmann::json conformance_fields_json(const properties::Conformance& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, t] : fields_of(c))
    j[name] = {{"compared", t.compared}, {"equal", t.equal}};
  return j;
}

nlohmann::json conformance_kernel_pairs_json(const properties::Conformance& c) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& h : c.hash_pairs) {
    j.push_back(
        {{"model_kernel", h.model_kernel},
         {"real_kernel", h.real_kernel},
         {"claimed", h.claimed},
         {"reason", h.reason},
         {"required", {{"compared", h.required.compared}, {"equal", h.required.equal}}},
         {"reported", {{"compared", h.reported.compared}, {"equal", h.reported.equal}}},
         {"required_elements",
          {{"compared", h.required_elements.compared}, {"equal", h.required_elements.equal}}},
         {"reported_elements",
          {{"compared", h.reported_elements.compared}, {"equal", h.reported_elements.equal}}}});
  }
  return j;
}

std::string conformance_markdown(const std::vector<ConformanceRow>& rows,
                                 const std::vector<std::string>& header) {
  std::string out = "# ckptsim conformance: the model against the real Megatron-LM\n\n";
  for (const auto& h : header) out += h + "\n";
  std::map<std::pair<std::string, std::string>, Totals> groups;
  Totals all;
  for (const auto& r : rows) {
    groups[{revisions_of(r.scenario), kind_and_te(r.scenario)}].add(r.result);
    all.add(r.result);
  }
  out += "\n## Per revision and optimizer kind\n\n";
  out +=
      "A trace agrees (the strict judge, properties/conformance.h) when every verdict a trace "
      "can judge, every run's status and first error (type, site, merge() key path), every event "
      "and every optimizer part on both sides, every counter of every part, and every required "
      "state hash agree.\n\n";
  out += std::string("| revisions ") + kTableHead + "\n|---" + kTableRule + "\n";
  for (const auto& [key, t] : groups) out += totals_row(key.first + ", " + key.second, t);
  out += totals_row("**all**", all);
  out += kernel_pair_table(all);
  out += feature_tables(rows);
  out += "\n## Per trace\n\n";
  out +=
      "| scenario | revisions | kind | dp | real setup | real errors | agree | counters | "
      "hashes | first divergence |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    const auto& c = r.result;
    std::string first = c.divergences.empty() ? "—" : md_escape(c.divergences.front().describe());
    if (c.divergences.empty() && !c.hash_divergences.empty())
      first = "hash only: " + md_escape(c.hash_divergences.front().describe());
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", r.scenario.name,
                       revisions_of(r.scenario), kind_of(r.scenario), dps_of(r.scenario), r.setup,
                       md_escape(r.real_errors),
                       c.agrees()       ? "yes"
                       : r.plot.empty() ? "**no**"
                                        : fmt::format("**no** ([picture]({}))", r.plot),
                       ratio(c.counters_equal, c.counters_compared),
                       ratio(c.hashes_equal, c.hashes_compared), first);
  }
  out += pictures(rows);
  return out;
}

}  // namespace ckptsim::report
