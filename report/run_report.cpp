#include "report/run_report.h"

#include <fmt/format.h>

#include <cmath>
#include <map>

#include "properties/step.h"

namespace ckptsim::report {

namespace {

std::string num(const std::optional<double>& x) {
  if (!x.has_value() || std::isnan(*x)) return "—";
  if (*x == std::floor(*x)) return fmt::format("{:.0f}", *x);
  return fmt::format("{:.6g}", *x);
}

std::string phase_outcome(const sim::PhaseRecord& p) {
  if (!p.ran) return "not run (the previous phase failed)";
  if (p.completed) return p.spec.save ? "ok, saved" : "ok";
  for (const auto& e : p.errors) {
    if (!e.secondary) return "**failed**: " + md_escape(e.summary());
  }
  return "**failed**";
}

}  // namespace

std::string md_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n') {
      out += ' ';
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string step_table(const sim::RunResult& run, size_t rows_max) {
  // One row per (phase, moment, part, counter in this run, counter uninterrupted); shards with
  // identical values are merged into one row listing their params.
  struct Row {
    std::string when;
    std::string part;
    std::string observed;
    std::string expected;
    std::vector<std::string> shards;
  };
  std::vector<Row> rows;
  auto add = [&](const std::string& when, const sim::ShardRecord& s, const std::string& observed,
                 const std::string& expected) {
    const std::string shard = fmt::format("{}[{}:{}]@r{}", run.scenario.params[s.param].name,
                                          s.range.start, s.range.end, s.rank);
    const std::string part = sim::part_name(s.part);
    for (auto& r : rows) {
      if (r.when == when && r.part == part && r.observed == observed && r.expected == expected) {
        r.shards.push_back(shard);
        return;
      }
    }
    rows.push_back({when, part, observed, expected, {shard}});
  };
  for (const auto& p : run.phases) {
    for (const auto& c : properties::step_comparisons(run, p)) {
      if (c.moment == properties::StepComparison::Moment::kAfterLoad) {
        add(fmt::format("phase {} after load (step {})", p.index, p.start_step), c.shard,
            "counter " + num(c.observed), "counter " + num(c.expected));
      } else {
        add(fmt::format("phase {} step {}", p.index, c.global_step), c.shard,
            "t=" + num(c.observed), "t=" + num(c.expected));
      }
    }
  }
  if (rows.empty()) return "_No resumed phase: nothing to compare._\n";
  std::string out = "| when | part | this run | uninterrupted | shards |\n|---|---|---|---|---|\n";
  size_t shown = 0;
  for (const auto& r : rows) {
    if (shown++ == rows_max) {
      out += fmt::format("| … | | | | {} more rows |\n", rows.size() - rows_max);
      break;
    }
    std::string shards;
    for (size_t i = 0; i < r.shards.size() && i < 4; ++i) {
      if (i) shards += ", ";
      shards += r.shards[i];
    }
    if (r.shards.size() > 4) shards += fmt::format(", +{}", r.shards.size() - 4);
    const bool mismatch = r.observed != r.expected;
    out += fmt::format("| {} | {} | {}{}{} | {} | {} |\n", r.when, r.part, mismatch ? "**" : "",
                       r.observed, mismatch ? "**" : "", r.expected, shards);
  }
  return out;
}

std::string scenario_section(const ScenarioReport& r) {
  const sim::RunResult& run = *r.run;
  const sim::Scenario& s = run.scenario;
  std::string out = fmt::format("## {}\n\n", s.name);
  if (!s.description.empty()) out += s.description + "\n\n";
  std::string params;
  for (const auto& p : s.params) {
    params += fmt::format("{}{} ({}, {})", params.empty() ? "" : ", ", p.name, p.numel,
                          model::dtype_name(p.dtype));
  }
  out += fmt::format("- file: `{}`, seed {}, trace hash `{:016x}`\n", s.source, s.seed,
                     run.trace_hash);
  out += fmt::format("- optimizer: {}{}, lr {}, betas ({}, {}), eps {}, weight decay {}\n",
                     model::optimizer_kind_name(s.optimizer.kind),
                     s.optimizer.kind == model::OptimizerKind::kHybrid
                         ? fmt::format(" (offload_fraction {})", s.optimizer.offload_fraction)
                         : "",
                     s.optimizer.adam.lr, s.optimizer.adam.beta1, s.optimizer.adam.beta2,
                     s.optimizer.adam.eps, s.optimizer.adam.weight_decay);
  out += fmt::format("- params: {}; bucket_size {}; sharding {}\n", params,
                     s.bucket_size ? std::to_string(*s.bucket_size) : "None (one bucket)",
                     model::sharding_type_name(s.format.sharding_type) +
                         (s.format.mem_efficient ? " (mem_efficient)" : ""));
  if (!s.faults.empty()) {
    std::string f;
    for (const auto& x : s.faults) f += (f.empty() ? "" : ", ") + x;
    out += "- fault sites enabled (deliberately broken model): " + f + "\n";
  }
  out +=
      "\n**Timeline** (each phase after the first resumes from the previous phase's "
      "checkpoint):\n\n";
  out += "| phase | dp | revision | global steps | outcome |\n|---|---|---|---|---|\n";
  for (const auto& p : run.phases) {
    std::string steps = "—";
    if (p.ran && (p.index == 0 || p.after_load.has_value())) {
      steps = fmt::format("{} → {}", p.start_step,
                          p.start_step + static_cast<int64_t>(p.after_step.size()));
    }
    out += fmt::format("| {} | {} | {} | {} | {} |\n", p.index, p.spec.dp, p.spec.revision, steps,
                       phase_outcome(p));
  }
  out += fmt::format("\nUninterrupted reference run: dp={}, {} steps.\n\n", s.phases.front().dp,
                     s.total_steps());
  out += "**Verdicts:**\n\n| property | verdict | detail |\n|---|---|---|\n";
  for (const auto& res : r.results) {
    const std::string v = properties::verdict_name(res.verdict);
    out += fmt::format("| {} | {} | {} |\n", res.name, res.ok() ? v : "**" + v + "**",
                       md_escape(res.detail));
  }
  if (r.has_expectations) {
    out += r.expectation_mismatches.empty()
               ? "\nThese verdicts are the ones this scenario expects.\n"
               : "\n**Unexpected verdicts:**\n\n";
    for (const auto& m : r.expectation_mismatches) out += "- " + md_escape(m) + "\n";
  }
  if (!r.plot.empty()) {
    out += fmt::format(
        "\n**Picture** (`ckptsim plot`: every Adam part's step counter and the largest divergence "
        "from the uninterrupted run, against the global step):\n\n![{}: step counters and "
        "divergence]({})\n",
        s.name, r.plot);
  }
  out += "\n**Step counters, resumed run vs uninterrupted run** (bold: they differ):\n\n";
  out += step_table(run);
  out += "\n";
  return out;
}

std::string render(const std::vector<ScenarioReport>& reports,
                   const std::vector<std::string>& header) {
  std::string out = "# ckptsim report\n\n";
  for (const auto& h : header) out += h + "\n";
  out += "\n| scenario | revisions | verdicts | as expected | picture |\n|---|---|---|---|---|\n";
  for (const auto& r : reports) {
    std::string revisions;
    for (const auto& p : r.run->scenario.phases) {
      if (revisions.find(p.revision) == std::string::npos)
        revisions += (revisions.empty() ? "" : " → ") + p.revision;
    }
    std::string failing;
    for (const auto& res : r.results) {
      if (!res.ok())
        failing +=
            (failing.empty() ? "" : ", ") + res.name + " " + properties::verdict_name(res.verdict);
    }
    const std::string& name = r.run->scenario.name;
    out += fmt::format(
        "| {} | {} | {} | {} | {} |\n", name, revisions, failing.empty() ? "all pass" : failing,
        !r.has_expectations ? "—" : (r.expectation_mismatches.empty() ? "yes" : "**no**"),
        r.plot.empty() ? "—" : fmt::format("[png]({})", r.plot));
  }
  out += "\n";
  for (const auto& r : reports) out += scenario_section(r);
  return out;
}

}  // namespace ckptsim::report
