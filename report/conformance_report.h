// reports/conformance.md: how often the model agrees with the real Megatron-LM, over a set of
// real traces (`ckptsim conform-campaign`), per revision and optimizer kind, then per trace.
#pragma once

#include <string>
#include <vector>

#include "properties/conformance.h"
#include "sim/scenario.h"

namespace ckptsim::report {

struct ConformanceRow {
  std::string trace_file;
  sim::Scenario scenario;
  std::string setup;        // "gloo, TE emulated, FusedAdam stand-in"
  std::string real_errors;  // the real trace's first primary error per failing run, or "none"
  properties::Conformance result;
  std::string plot;  // the picture of a disagreement (`ckptsim plot`), as a link; or ""
};

// `header` lines (the command, the date) go first.
std::string conformance_markdown(const std::vector<ConformanceRow>& rows,
                                 const std::vector<std::string>& header);

}  // namespace ckptsim::report
