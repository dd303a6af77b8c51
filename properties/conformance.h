// Conformance: does the model agree with the real code? Both sides are traces of the same
// scenario in the one trace format (report/trace_json.h, replay/PLAN_AND_TRACE.md): the model's,
// and the replay runner's from real Megatron-LM. The properties that a trace can judge are
// judged on each trace by the same code (so a verdict is compared with a verdict reached the
// same way), and the traces are compared event by event for the first divergence.
//
// Judged from a trace (the rest need what a trace does not hold, and are listed as not compared):
//   no_duplicate_leaves               no primary error with a merge() key path in a resumed run
//   resume_completes                  no primary error in any run
//   step_matches_uninterrupted        every resumed part's counter after the load, and the t it
//                                     then uses, equal the reference run's for the shard holding
//                                     the same first element (a missing counter counts as 0)
//   trajectory_matches_uninterrupted  the model params after every load and step hash equal to
//                                     the reference run's at that global step (bitwise only: a
//                                     trace carries hashes, not values)
//   round_trip_identity               after a load the model params hash equal to what the
//                                     previous run saved, and every counter equals the saved one
//   step_tensors_not_aliased          no part shares its step tensor (where a trace says)
//
// Invariants:
//   1. conform() never throws on a malformed trace: it returns a Status naming the file and the
//      field (the CLI's exit 2).
//   2. Verdicts agree or not per property; the divergences are facts about the traces, listed
//      in run, event and field order, the first one first.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "model/status.h"
#include "properties/properties.h"

namespace ckptsim::properties {

struct TraceVerdict {
  std::string property;
  Verdict verdict = Verdict::kPass;
  std::string detail;
};

// The verdicts of the properties a trace can judge, in registry order.
std::vector<TraceVerdict> judge_trace(const nlohmann::json& trace);

struct PropertyAgreement {
  std::string property;
  TraceVerdict model;
  TraceVerdict real;
  bool agree() const { return model.verdict == real.verdict; }
};

// One difference between the traces: where, and the two values.
struct Divergence {
  std::string run;  // run id ("reference", "phase1")
  int64_t global_step = -1;
  int rank = -1;
  std::string at;     // "after_load", "after_step", "error", ... ("" for the run itself)
  std::string field;  // "HDO cpu AdamW w1[0:416] step", "model_param w0", "status", ...
  std::string model;
  std::string real;
  std::string describe() const;
};

struct Conformance {
  std::vector<PropertyAgreement> properties;
  std::vector<std::string> not_compared;  // properties a trace cannot judge
  // Every divergence found, first first: statuses, first errors, events, step counters ...
  std::vector<Divergence> divergences;
  // ... and, apart, the state hashes that differ (the model's torch AdamW rounds differently
  // from torch's own kernels, so these are facts to read, not a verdict).
  std::vector<Divergence> hash_divergences;
  int64_t counters_compared = 0;
  int64_t counters_equal = 0;
  int64_t hashes_compared = 0;
  int64_t hashes_equal = 0;
  // Per run, the first primary error (none, or its Python type, site and merge() key path).
  int64_t errors_compared = 0;
  int64_t errors_equal = 0;
  bool verdicts_agree() const;
  bool counters_agree() const { return counters_equal == counters_compared; }
  bool errors_agree() const { return errors_equal == errors_compared; }
  // What `ckptsim conform` exits 0 on: verdicts, step counters and first errors all agree
  // (hashes are reported: the model's torch AdamW is not bitwise torch's own kernel).
  bool agrees() const { return verdicts_agree() && counters_agree() && errors_agree(); }
};

// Compares the model's trace with the real one. `real_source` names the real trace in errors.
// Fails (Status) when either is not a trace of the format, or when they are traces of different
// scenarios or runs.
Result<Conformance> conform(const nlohmann::json& model_trace, const nlohmann::json& real_trace,
                            const std::string& real_source);

}  // namespace ckptsim::properties
