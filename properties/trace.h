// A trace as the properties read it: the one trace format (report/trace_json.h,
// replay/PLAN_AND_TRACE.md) of the model's run or of the replay runner's run on real Megatron-LM,
// parsed once into plain structs. The trace checks of properties/properties.h (each property's
// `trace_check`) and the conformance judge (properties/conformance.h) read these.
//
// Invariants:
//   1. parse() never throws on a malformed trace: a Status naming `source` and the field.
//   2. Every part has a kernel: the one the trace names, else the one its part and its run's
//      setup imply (traces recorded before "kernel" existed).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/status.h"

namespace ckptsim::sim {
struct Scenario;
}

namespace ckptsim::properties::trace {

struct Part {
  std::string part;
  std::string param;
  int64_t begin = 0;
  int64_t end = 0;
  std::optional<double> step;
  std::optional<double> step_used;
  std::optional<int64_t> aliases;
  std::string kernel;  // as the trace names it, or inferred
  // The optional state_dtypes: state name ("exp_avg", "exp_avg_sq", "master_param") -> the dtype
  // its tensor is stored in ("fp32", "bf16", "fp16", "int16"); nullopt where the field is absent
  // (every part but TE's precision-aware FusedAdam's).
  std::optional<std::map<std::string, std::string>> state_dtypes;
  // The optional `chain`: the part of a chained optimizer of several that holds the shard.
  std::optional<int64_t> chain;
  std::string label() const;  // "HDO cpu AdamW w1[0:416]"
  bool same_place(const Part& o) const {
    return part == o.part && param == o.param && begin == o.begin && end == o.end;
  }
};

// The lr and weight decay one param group held when a step ran (after_step events only).
struct Group {
  double wd_mult = 1.0;
  double lr_mult = 1.0;
  double lr = 0.0;
  double weight_decay = 0.0;
  std::string label() const;  // "the param group with wd_mult 1 and lr_mult 1"
};

// A requested range a load left unwritten on one rank (after_load events only): the key's
// global elements [begin, end); missing_key where the checkpoint has no such key at all.
struct Unwritten {
  std::string key;
  int64_t begin = 0;
  int64_t end = 0;
  bool missing_key = false;
  bool operator==(const Unwritten&) const = default;
  auto operator<=>(const Unwritten&) const = default;
  std::string label() const;  // "k[3:8] (missing key)"
};

// The unwritten ranges as one canonical list: sorted, and ranges of one key and kind that touch
// or overlap merged (two requests of one key may split a range the other side reports whole).
std::vector<Unwritten> merged(std::vector<Unwritten> ranges);

struct Event {
  int rank = 0;
  std::string at;
  int64_t global_step = 0;
  std::vector<Part> parts;
  // kind -> param -> hash ("null" where the tensor does not exist)
  std::map<std::string, std::map<std::string, std::string>> hashes;
  // kind -> param -> base64 float32 values ("null" where the tensor does not exist), where
  // the trace carries them
  std::map<std::string, std::map<std::string, std::string>> values;
  // kind -> params whose hash rests on uninitialized memory (the model's trace says)
  std::map<std::string, std::set<std::string>> uninitialized;
  // after_step events of a trace that records them: every param group of the rank
  std::optional<std::vector<Group>> groups;
  // after_load events of a trace that probes the load: what it left unwritten ([] for nothing)
  std::optional<std::vector<Unwritten>> unwritten;
  // error events
  std::string stage, py_type, message, site;
  std::optional<std::vector<std::string>> merge_path;
  std::string merge_kind;  // "duplicate_leaf", "list_length_mismatch" or ""
  bool secondary = false;
};

struct Run {
  std::string id;
  int64_t dp = 0;
  int64_t tp = 1;  // "tp" and "pp", where the run names them
  int64_t pp = 1;
  int phase = -1;  // the scenario's phase (-1: the reference run)
  std::string status;
  bool load = false;
  int64_t start_step = 0;
  int64_t steps = 0;
  std::string load_from;
  std::string te;  // "real", "emulated", "absent", "modeled", or "" (a skipped run)
  bool fused_adam_standin = false;
  // The storage faults its save met ("storage_faults": model::FaultyStorage::fired()).
  std::vector<std::string> storage_faults;
  bool crashed = false;  // "crashed": the job died in its save at a storage fault
  std::vector<Event> events;
};

struct Trace {
  std::string scenario;
  std::string source;  // "model" or "real"
  std::vector<Run> runs;
  // The scenario the trace replays, where the caller knows it (judge_trace's `spec`): what the
  // absolute checks that need the scenario's schedule read; not owned, null when unknown.
  const sim::Scenario* spec = nullptr;
  const Run* find(const std::string& id) const;
};

Result<Trace> parse(const nlohmann::json& j, const std::string& source);

// A number as a detail prints it: "none" when absent or NaN, integers without a fraction.
std::string num(const std::optional<double>& x);
// Every event of a run at one point (all ranks).
std::vector<const Event*> events_at(const Run& run, const std::string& at, int64_t global_step);
// The reference run's state at a global step: init at 0, else after that step.
std::vector<const Event*> reference_at(const Trace& t, int64_t global_step);
// The global steps `run` took before its optimizer began counting (sim::optimizer_origins: a
// --no-load-optim resume starts one afresh; the reference run restarts its own there): 0
// where the trace's scenario is unknown or has no such resume. For the reference run, at
// global step `global_step` (its last restart before it).
int64_t optimizer_origin(const Trace& t, const Run& run, int64_t global_step);
// Whether `run`'s optimizer began at its start step (a --no-load-optim resume, or a resume of
// what one saved without a step): its load restores no optimizer state to compare.
bool starts_optimizer_afresh(const Trace& t, const Run& run);
// The part of `events` that holds element `element` of `param`, or null.
const Part* part_at(const std::vector<const Event*>& events, const std::string& param,
                    int64_t element);
// The first error that is not another rank's failure seen through a collective, else the first
// error, else null.
const Event* first_primary_error(const Run& run);
// The run was not skipped and recorded its state after its load.
bool load_completed(const Run& run);
// The order of a run's stages: init 0, load 1, train 2, save 3 (an error event's `stage`).
int stage_rank(const std::string& stage);
// Where a gate compares a candidate's failure with the all-baseline run of the same scenario:
// why the baseline's run `run_id` never reached the point where the candidate's run failed (its
// first primary error's stage: init < load < train < save), or "" when it did (or the candidate's
// run raised nothing). A baseline that stopped earlier cannot say whether the candidate's error
// is its own: HEAD failing a native fp32 param at init hides its later load KeyError, which a
// candidate fixing the init then meets (PR #2872's gate).
std::string stopped_before(const Trace& baseline, const Trace& candidate,
                           const std::string& run_id);

}  // namespace ckptsim::properties::trace
