// The properties a correct save -> reshard -> resume must keep, checked on what the
// simulator recorded (sim::RunResult). Checkers live apart from the code they check: they
// read only the recorded run, never the model.
//
// Each property has a name (a user interface: reports, --json and expectations use it), a
// verdict, and a detail that names the path, the expected and the observed value.
//   no_duplicate_leaves               no merge() in any load met a duplicate leaf or lists of
//                                     different lengths (spec I7, I10; bugs B2, B3)
//   resume_completes                  every save and load ran to the end on every rank
//   step_matches_uninterrupted        after every resume every Adam part (CPU AdamW per param,
//                                     FusedAdam groups inside and outside HDO) holds and then
//                                     uses the uninterrupted run's bias-correction step
//                                     (I11, I12, I14; B1, B5, B6, B9)
//   step_counts_optimizer_steps       every Adam part's counter equals the number of optimizer
//                                     steps taken, and each step uses t = that number: after
//                                     global step g, t = g and the counter is g; after a load at
//                                     g, the counter is g. True of each run on its own, the
//                                     uninterrupted one included, so a counter bug both runs
//                                     share (a narrow counter type) is still seen
//   hyperparams_follow_schedule       every param group's lr and weight decay at every step
//                                     equal the schedule in force for that step (the first
//                                     phase's arguments; after a resume as Megatron's
//                                     --override-opt_param-scheduler / --use-checkpoint-
//                                     opt_param-scheduler say), each group's bounds times its
//                                     lr_mult and its weight decay times its wd_mult; true of
//                                     the uninterrupted run too (issues #1138, #7173, PR #7468)
//   trajectory_matches_uninterrupted  master params, exp_avg, exp_avg_sq and model params equal
//                                     the uninterrupted run after every step and every load:
//                                     bit for bit where the same kind of kernel updated the
//                                     element in both runs so far; within kTrajectoryRtol /
//                                     kTrajectoryAtol (fp32 states) or one bf16 ulp (bf16
//                                     params), plus kTrajectoryRtolPerStep a step since, where
//                                     a reshard moved it between a CPU AdamW and a FusedAdam
//                                     part (I13, I16); with TP, every TP rank's copy of a
//                                     replicated param equals TP rank 0's; with TP or PP, the
//                                     whole param assembled from every rank's piece
//   shards_tile_buckets               every checkpoint's optimizer pieces tile [0,
//                                     numel_unpadded) of every bucket and key exactly once (I3, I4)
//   common_state_rank_independent     every rank's common state equals rank 0's, the only one
//                                     persisted (I8)
//   layout_invariants                 every buffer layout and DP shard keeps I1 (bucket sizes,
//                                     padding, 64-alignment), I2 (disjoint sorted shards that
//                                     partition every param) and I4 (numel_unpadded of a bucket
//                                     does not change with the DP size)
//   round_trip_identity               a load gives back exactly what the previous phase saved:
//                                     master params, moments, model params, step counters and
//                                     param groups (incl. 'step') — no reference run needed (I13)
//   reshard_round_trip_bytes          a phase that resumes and saves again without a step writes
//                                     the same bytes in every param region (not alignment gaps)
//                                     as the checkpoint it loaded, at any DP size (I5)
//   step_tensors_not_aliased          no two params share one step tensor object (I14; B9)
//   load_writes_every_element         every element a load requests (each rank's optimizer
//                                     state, model params) is written from the checkpoint: none
//                                     keeps the value the request was built with
//   state_dtypes_survive_resume       every state of TE's precision-aware FusedAdam (moments in
//                                     their dtypes, the master whole or as int16 remainders) is
//                                     stored after every load and step of a resumed run in the
//                                     dtype the uninterrupted run stores it in (issue 26)
//
// A verdict is pass, fail, or not_evaluated (the run never reached what the property
// judges, e.g. a resume whose load crashed); only pass counts as ok.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "sim/record.h"

namespace ckptsim::properties {

// Tolerance for elements a reshard moved between kernel kinds (spec I16: FusedAdam and torch
// AdamW agree up to rounding). Measured worst case over the bundled scenarios and the tests
// is far below these; a bias-correction restart moves masters by ~1e-2 (spec §17).
inline constexpr double kTrajectoryRtol = 1e-5;
inline constexpr double kTrajectoryAtol = 1e-6;
// The two runs round differently at every step after an element moved, and the difference adds
// up over a long phase: at every step since the move the tolerance grows by this much (8 fp32
// ulps) of the uninterrupted run's value plus its change in that step (the update, which is
// rounded too, and dominates near zero). Measured, check --revision fix-complete --seed 1,
// elements under CPU AdamW in the resumed run and GPU FusedAdam in the uninterrupted one:
// 3.28e-6 apart at 0.2267 after 1864 steps (0.12 ulp of the value per step), 4.51e-6 apart at
// 0.0087 after 1440 steps (3.4 ulps of the value per step), both over the fixed tolerance.
inline constexpr double kTrajectoryRtolPerStep = 0x1p-20;

enum class Verdict { kPass, kFail, kNotEvaluated };
std::string verdict_name(Verdict v);  // "pass", "fail", "not_evaluated"

struct PropertyResult {
  std::string name;
  Verdict verdict = Verdict::kPass;
  std::string detail;
  // A failure's coarse cause (e.g. "resume_completes:AssertionError@distrib_optimizer.py
  // sharded_param_state_dp_reshardable()"): the search keeps one minimal case per signature
  // and shrinks only toward cases with the same one. Empty unless the verdict is fail.
  std::string signature;
  int phase = -1;  // the phase where the failure was seen (-1: the reference run or none)
  bool ok() const { return verdict == Verdict::kPass; }
};

namespace trace {
struct Trace;  // properties/trace.h
}
struct CheckpointInput;  // properties/checkpoint_inspection.h
struct CheckpointCheck;

// A property's verdict on a trace (the model's or the real code's, properties/trace.h).
struct TraceVerdict {
  std::string property;
  Verdict verdict = Verdict::kPass;
  std::string detail;
  // A failure's coarse cause, as PropertyResult::signature (empty unless the verdict is fail);
  // the same on the model's trace and the real one, and through shrinking.
  std::string signature;
  std::string run;  // the run a failure was seen in ("reference", "phase1"; "" unless fail)
};

// One property, in one place: its name, its description, its check over the model's run record,
// where a trace can show it its check over a trace, and where a checkpoint's files can show it
// its check over a real checkpoint. The model's verdicts (check), the real code's (judge_trace:
// the real engine, conform), inspect's static checks (checkpoint_check) and the listings
// (--help, `ckptsim properties`, the README's table, which a test holds to this registry) all
// come from here.
struct Property {
  std::string name;
  std::string description;  // one line, for listings
  // Pure: reads only the run, never the model; never throws for any recorded run (a run the
  // simulator could not finish is judged not_evaluated or fail, not an exception).
  std::function<PropertyResult(const sim::RunResult&)> check;
  // Pure, never throws; empty where a trace cannot judge the property.
  std::function<TraceVerdict(const trace::Trace&)> trace_check;
  // What makes it fail on purpose (a fault or a revision profile of tests/properties/
  // canary_test.cpp), shown in the listings.
  std::string canary;
  // Pure, never throws; empty where a checkpoint's files cannot judge the property. Its result
  // carries the check's own name (`checkpoint_check_name`: what it reads of the files).
  std::function<CheckpointCheck(const CheckpointInput&)> checkpoint_check;
  std::string checkpoint_check_name;
};

const std::vector<Property>& all_properties();
const Property* find_property(const std::string& name);
// "no_duplicate_leaves, resume_completes, ...", for messages that list the valid names.
std::string property_names();
// What the property is judged on, for listings: "run, trace, checkpoint".
std::string judged_on(const Property& p);
std::vector<PropertyResult> check_all(const sim::RunResult& run);
// Where a gate compares a candidate's failure in `phase` (-1: the uninterrupted run) with the
// all-baseline run: why the baseline's run never reached the stage where the candidate's first
// primary error was raised (init < load < train < save), or "" when it did (or the candidate's
// run raised nothing there). The trace form is properties/trace.h's stopped_before.
std::string stopped_before(const sim::RunResult& baseline, const sim::RunResult& candidate,
                           int phase);
bool all_ok(const std::vector<PropertyResult>& results);

}  // namespace ckptsim::properties
