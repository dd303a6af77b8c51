#include "report/json.h"

#include <fmt/format.h>

namespace ckptsim::report {

nlohmann::json results_json(const std::vector<properties::PropertyResult>& results) {
  nlohmann::json j{{"ok", properties::all_ok(results)}, {"properties", nlohmann::json::array()}};
  for (const auto& r : results) {
    j["properties"].push_back({{"name", r.name},
                               {"ok", r.ok()},
                               {"verdict", properties::verdict_name(r.verdict)},
                               {"detail", r.detail}});
  }
  return j;
}

nlohmann::json scenario_json(const ScenarioReport& rep) {
  nlohmann::json j = results_json(rep.results);
  const sim::RunResult& r = *rep.run;
  j["scenario"] = r.scenario.name;
  j["file"] = r.scenario.source;
  j["seed"] = r.scenario.seed;
  j["revisions"] = nlohmann::json::array();
  for (const auto& p : r.scenario.phases) j["revisions"].push_back(p.revision);
  j["trace_hash"] = fmt::format("{:016x}", r.trace_hash);
  j["checkpoints"] = r.checkpoint_location;
  j["gpu_resident"] = r.gpu_resident;
  if (rep.has_expectations) j["as_expected"] = rep.expectation_mismatches.empty();
  return j;
}

}  // namespace ckptsim::report
