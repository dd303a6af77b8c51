// The outputs of a search (`check`) and of a gate: JUnit cases, the gate's Markdown report and
// the JSON objects `--json` prints. Each finding is reported with the file its minimal scenario
// was written to and, when the search was given --megatron, what the real Megatron-LM said
// about that scenario (RealCodeVerdict): every output then carries it.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "report/junit.h"
#include "search/gate.h"
#include "search/search.h"

namespace ckptsim::report {

// What replaying a minimal scenario on the real Megatron-LM said (check/gate --megatron).
enum class RealCodeOutcome {
  kConfirmed,      // the traces agree and the real run fails the property too
  kNotConfirmed,   // the real code disagrees with the model (a verdict, a counter or an error)
  kNotJudgeable,   // the traces agree, but a trace does not show the property's failure
  kCouldNotReplay  // no trace to judge: the runner was missing or failed, or skipped a run
};

struct RealCodeVerdict {
  RealCodeOutcome outcome = RealCodeOutcome::kCouldNotReplay;
  std::string text;   // the sentence a reader sees: "confirmed on the real code (...)", ...
  std::string plan;   // the replay plan written next to the minimal scenario ("" if none)
  std::string trace;  // the real trace ("" if none was written)
};

// "confirmed", "not_confirmed", "not_judgeable", "could_not_replay" (the JSON's "outcome").
const char* real_code_outcome_name(RealCodeOutcome outcome);

struct ReportedFailure {
  const search::Failure* failure = nullptr;
  std::string file;                          // the minimal scenario, replayable with `ckptsim run`
  std::string classification;                // gate: search::gate_class_name(); check: ""
  bool counts_as_new = false;                // gate: the class counts against the candidate
  std::optional<RealCodeVerdict> real_code;  // set only when the search ran with --megatron
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
