// reports/conformance.md: how often the model agrees with the real Megatron-LM, over a set of
// real traces (`ckptsim conform-campaign`), per revision and optimizer kind, then per trace.
#pragma once

#include <nlohmann/json.hpp>

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

// What agrees, field by field: "verdicts 6/6, statuses 3/3, ..., required hashes 120/120".
std::string conformance_fields(const properties::Conformance& c);
// The hashes per kernel pair, one line each: "torch_fused_cpu / torch_fused_cpu (claimed):
// required 80/80, reported 0/0".
std::vector<std::string> conformance_kernel_pairs(const properties::Conformance& c);
// The same as JSON: {"verdicts": {"compared", "equal"}, ...} and [{"model_kernel", ...}].
nlohmann::json conformance_fields_json(const properties::Conformance& c);
nlohmann::json conformance_kernel_pairs_json(const properties::Conformance& c);

// `header` lines (the command, the date) go first.
std::string conformance_markdown(const std::vector<ConformanceRow>& rows,
                                 const std::vector<std::string>& header);

}  // namespace ckptsim::report
