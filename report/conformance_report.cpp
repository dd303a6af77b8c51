#include "report/conformance_report.h"

#include <fmt/format.h>

#include <map>

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

struct Totals {
  int traces = 0;
  int agree = 0;
  int verdicts = 0;
  int verdicts_agree = 0;
  int64_t counters = 0;
  int64_t counters_equal = 0;
  int64_t hashes = 0;
  int64_t hashes_equal = 0;
  int bitwise = 0;  // traces whose every hash is equal
  void add(const properties::Conformance& c) {
    ++traces;
    agree += c.agrees() ? 1 : 0;
    for (const auto& p : c.properties) {
      ++verdicts;
      verdicts_agree += p.agree() ? 1 : 0;
    }
    counters += c.counters_compared;
    counters_equal += c.counters_equal;
    hashes += c.hashes_compared;
    hashes_equal += c.hashes_equal;
    bitwise += c.hashes_equal == c.hashes_compared ? 1 : 0;
  }
};

std::string totals_row(const std::string& label, const Totals& t) {
  return fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", label, t.traces,
                     ratio(t.agree, t.traces), ratio(t.verdicts_agree, t.verdicts),
                     ratio(t.counters_equal, t.counters), ratio(t.hashes_equal, t.hashes),
                     ratio(t.bitwise, t.traces));
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

}  // namespace

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
      "A trace agrees when every verdict a trace can judge, every step counter and every run's "
      "first error (type, site, merge() key path) agree; hashes are bitwise state equality, "
      "reported, not required.\n\n";
  out +=
      "| revisions | traces | agree | verdicts agree | step counters equal | hashes equal | "
      "traces bitwise equal |\n|---|---|---|---|---|---|---|\n";
  for (const auto& [key, t] : groups) out += totals_row(key.first + ", " + key.second, t);
  out += totals_row("**all**", all);
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
