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
// What one `check` (or one shard of it) found, written beside its minimal scenarios as
// <out>/ckptsim-summary.json, so that `ckptsim merge` can keep one minimal scenario per cause
// across shards (search::merge_shards). Invariants: `search` is the repeat line of the whole
// search (no --shard), equal for every shard of one search; each failure names its minimal
// scenario's file, in the same directory; read_check_summary(write(x)) gives back every field
// merge uses (Failure::original is not kept).
inline constexpr const char* kCheckSummaryFile = "ckptsim-summary.json";

struct CheckSummary {
  std::string revision;
  uint64_t seed = 0;
  std::string search;  // the whole search's repeat line
  std::string repeat;  // this run's own (with --shard when sharded)
  search::Shard shard;
  bool keep_going = true;
  int jobs = 1;
  search::SearchResult result;     // failures with their minimal scenarios
  std::vector<std::string> files;  // per failure: its minimal scenario's file name
};

// REQUIRES: reported[i].failure == &s.result.failures[i].
nlohmann::json check_summary_json(const CheckSummary& s,
                                  const std::vector<ReportedFailure>& reported);
// Reads <dir>/ckptsim-summary.json and every minimal scenario it names (with `registry`).
// Status: a missing or malformed file, named with the field.
Result<CheckSummary> read_check_summary(const std::string& dir, model::RevisionRegistry& registry);

nlohmann::json gate_json(const std::string& baseline, const std::string& candidate, uint64_t seed,
                         const std::string& repeat, bool introduced,
                         const std::vector<ReportedFailure>& reported);

}  // namespace ckptsim::report
