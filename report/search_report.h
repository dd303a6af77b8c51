// The outputs of a search (`check`) and of a gate: JUnit cases, the gate's Markdown report and
// the JSON objects `--json` prints. Each finding is reported with the file its minimal scenario
// was written to.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "report/junit.h"
#include "search/gate.h"
#include "search/search.h"

namespace ckptsim::report {

struct ReportedFailure {
  const search::Failure* failure = nullptr;
  std::string file;            // the minimal scenario, replayable with `ckptsim run`
  std::string classification;  // gate: search::gate_class_name(); check: ""
  bool counts_as_new = false;  // gate: the class counts against the candidate
};

// check: one case per property, failed with every finding of that property.
std::vector<JunitCase> check_junit_cases(const std::string& revision,
                                         const std::vector<ReportedFailure>& reported,
                                         const std::string& repeat);
// gate: one case per finding (failed when it counts as new), or one passing case.
std::vector<JunitCase> gate_junit_cases(const std::vector<ReportedFailure>& reported,
                                        const std::string& repeat);

// The gate's Markdown report: verdict, the repeat command, each search's figures, each finding.
std::string gate_markdown(const std::string& baseline, const std::string& candidate,
                          const std::string& repeat, const search::GateResult& result,
                          const std::vector<ReportedFailure>& reported);

nlohmann::json failure_json(const ReportedFailure& r);
nlohmann::json check_json(const std::string& revision, uint64_t seed,
                          const search::SearchResult& result, const std::string& repeat,
                          const std::vector<ReportedFailure>& reported,
                          const std::vector<JunitCase>& cases);
nlohmann::json gate_json(const std::string& baseline, const std::string& candidate, uint64_t seed,
                         const std::string& repeat, bool introduced,
                         const std::vector<ReportedFailure>& reported);

}  // namespace ckptsim::report
