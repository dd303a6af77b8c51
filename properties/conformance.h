// Conformance: does the model agree with the real code? Both sides are traces of the same
// scenario in the one trace format (report/trace_json.h, replay/PLAN_AND_TRACE.md): the model's,
// and the replay runner's from real Megatron-LM. The properties that a trace can judge are
// judged on each trace by the same code (so a verdict is compared with a verdict reached the
// same way), and the traces are compared event by event for the first divergence.
//
// Judged from a trace: every property of the registry with a trace check (Property::trace_check,
// properties/trace_checks.h says what each checks); the rest need what a trace does not hold,
// and are listed as not compared.
//
// What agreement is (Conformance::agrees, the strict judge): every verdict above, every run's
// status and first primary error, every event (a rank's state at a point of a run), every
// optimizer part (kind, param, range: the device is the kind's) and every counter of every part
// (step, step_used, step_aliases) agree, on both sides: a part or an event present on one side
// only is a disagreement. State hashes must be equal where the model claims to compute what the
// real kernel computes (claimed_kernel_pair): each part names its kernel ("kernel"; traces
// recorded before it existed get it from the part and the run's setup), and a hash is required
// unless the param it is of was, in this run or in the runs its checkpoints came from, updated
// by a kernel pair the model does not claim, or rests on uninitialized memory (the model's
// trace marks those: "uninitialized"). The others are reported per kernel pair.
//
// Invariants:
//   1. conform() never throws on a malformed trace: it returns a Status naming the file and the
//      field (the CLI's exit 2).
//   2. Verdicts agree or not per property; the divergences are facts about the traces, listed
//      in run, event and field order, the first one first.
//   3. Symmetric presence: whatever one side has (an event, a part, a hash, a run's error) is
//      looked for on the other side, and its absence counted.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "model/status.h"
#include "properties/properties.h"

namespace ckptsim::properties {

// The verdicts of the properties a trace can judge, in registry order. `spec`, where the caller
// knows the scenario the trace replays, is what the checks that need its schedule read
// (hyperparams_follow_schedule: not evaluated without it).
std::vector<TraceVerdict> judge_trace(const nlohmann::json& trace,
                                      const sim::Scenario* spec = nullptr);

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

// How many things of one field were compared, and how many were equal.
struct Tally {
  int64_t compared = 0;
  int64_t equal = 0;
  bool agree() const { return equal == compared; }
  void add(bool same) {
    ++compared;
    equal += same ? 1 : 0;
  }
};

// Whether the model claims to compute, bit for bit, what `real_kernel` computes when it runs
// `model_kernel`; `reason` says why not (or what the claim rests on).
bool claimed_kernel_pair(const std::string& model_kernel, const std::string& real_kernel,
                         std::string* reason = nullptr);

// The hashes of one (model kernel, real kernel) pair: those the judge required and the others.
struct KernelPairHashes {
  std::string model_kernel;
  std::string real_kernel;
  bool claimed = false;
  std::string reason;  // claimed_kernel_pair's
  Tally required;      // hashes whose lineage this pair and other claimed pairs made
  Tally reported;      // the others (an unclaimed update, or uninitialized memory, before)
  // Element by element, where both traces carry the values (run --trace-values, replay
  // --values), bit for bit (every NaN alike, as the hash does).
  Tally required_elements;
  Tally reported_elements;
};

struct Conformance {
  std::vector<PropertyAgreement> properties;
  std::vector<std::string> not_compared;  // properties a trace cannot judge
  // Every divergence found, first first: statuses, first errors, events, step counters ...
  std::vector<Divergence> divergences;
  // (required hashes that differ are among them) ... and, apart, the reported state hashes that
  // differ (a kernel pair the model does not claim: facts to read, not a verdict).
  std::vector<Divergence> hash_divergences;
  int64_t counters_compared = 0;
  int64_t counters_equal = 0;
  int64_t hashes_compared = 0;
  int64_t hashes_equal = 0;
  // Per run, the first primary error (none, or its Python type, site and merge() key path).
  int64_t errors_compared = 0;
  int64_t errors_equal = 0;
  Tally statuses;      // per run
  Tally events;        // per (run, rank, point), looked for on both sides
  Tally parts;         // per part of an event, looked for on both sides
  Tally step_aliases;  // where both sides record it
  Tally state_dtypes;  // per part where either side records its states' dtypes
  Tally groups;        // param groups' lr and weight decay per step, where both sides record them
  Tally unwritten;     // per load probed on both sides: its unwritten ranges (none: one equal)
  // Scenarios with storage faults (issue 25): per run whose save met one on either side, whether
  // the job died and which faults fired (kind, file kind, a shard's rank); per phase after the
  // first, where it resumed (loaded or started from random, the iteration, the saving run). The
  // first error of a run that crashed on both sides is not compared: the model raises at the
  // crashed write, the real job is killed.
  Tally crashes;
  Tally resumes;
  Tally hashes_required;
  std::vector<KernelPairHashes> hash_pairs;  // in order of first appearance
  bool verdicts_agree() const;
  bool counters_agree() const { return counters_equal == counters_compared; }
  bool errors_agree() const { return errors_equal == errors_compared; }
  // What `ckptsim conform` exits 0 on: every field above agrees, and every required hash.
  bool agrees() const {
    return verdicts_agree() && counters_agree() && errors_agree() && statuses.agree() &&
           events.agree() && parts.agree() && step_aliases.agree() && state_dtypes.agree() &&
           groups.agree() && unwritten.agree() && hashes_required.agree() && crashes.agree() &&
           resumes.agree();
  }
};

// Compares the model's trace with the real one. `real_source` names the real trace in errors.
// Fails (Status) when either is not a trace of the format, or when they are traces of different
// scenarios or runs.
Result<Conformance> conform(const nlohmann::json& model_trace, const nlohmann::json& real_trace,
                            const std::string& real_source, const sim::Scenario* spec = nullptr);

}  // namespace ckptsim::properties
