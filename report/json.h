// The JSON objects `ckptsim run --json` prints.
#pragma once

#include <nlohmann/json.hpp>

#include <vector>

#include "properties/properties.h"
#include "report/run_report.h"

namespace ckptsim::report {

// {"ok", "properties": [{"name", "ok", "verdict", "detail"}]}
nlohmann::json results_json(const std::vector<properties::PropertyResult>& results);

// results_json plus the scenario's name, file, seed, revisions, trace hash, checkpoint
// location, where its device state lived, and (with an expect block) "as_expected".
nlohmann::json scenario_json(const ScenarioReport& r);

}  // namespace ckptsim::report
