// Markdown reports of simulated runs: what ran (timeline), what each property concluded
// (with expected and observed values), and the step counters of the resumed run next to
// the uninterrupted run's. A report must let a reader of a graft see a bug without
// building anything, so it states its inputs (scenario file, seed, revisions) in full.
#pragma once

#include <string>
#include <vector>

#include "properties/properties.h"
#include "sim/record.h"

namespace ckptsim::report {

struct ScenarioReport {
  const sim::RunResult* run = nullptr;
  std::vector<properties::PropertyResult> results;
  std::vector<std::string> expectation_mismatches;  // empty when the verdicts are as expected
  bool has_expectations = false;
  std::string plot;  // the picture of the run (`ckptsim plot`), as a link from the report; or ""
};

// One scenario's section.
std::string scenario_section(const ScenarioReport& r);

// The whole document: a summary table then one section per scenario. `header` lines (the
// command that made it, the commit) go first.
std::string render(const std::vector<ScenarioReport>& reports,
                   const std::vector<std::string>& header);

// Text for one Markdown table cell: '|' escaped, line breaks as spaces.
std::string md_escape(const std::string& s);

// The step-counter table (one row per resumed global step and part, both runs side by side).
std::string step_table(const sim::RunResult& run, size_t rows_max = 40);

}  // namespace ckptsim::report
