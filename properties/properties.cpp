// The registry of properties, in the order they are checked and reported. Each family lives
// in its own file (resume, step, trajectory, checkpoint, layout).
#include "properties/properties.h"

#include "properties/checkpoint_inspection.h"
#include "properties/common.h"
#include "properties/trace_checks.h"

namespace ckptsim::properties {

std::string verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kPass:
      return "pass";
    case Verdict::kFail:
      return "fail";
    case Verdict::kNotEvaluated:
      return "not_evaluated";
  }
  return "?";
}

namespace {

// The save protocol's properties and the resume modes' (issue 25).
std::vector<Property> save_protocol_properties() {
  return {
      {"resume_after_crash_is_complete",
       "after a storage fault the resume loads the newest committed checkpoint whole, or fails "
       "loudly; never a partial or older one",
       resume_after_crash_is_complete, nullptr,
       "PropertyCanary.ResumeAfterCrashCatchesALoaderThatSkipsDamagedPieces", nullptr, ""},
      {"tracker_names_saved_state",
       "the iteration the tracker names is the iteration its directory holds, whole",
       tracker_names_saved_state, nullptr,
       "PropertyCanary.TrackerNamesSavedStateCatchesATrackerWrittenBeforeTheData", nullptr, ""},
      {"first_step_continues_from_loaded_weights",
       "after a --no-load-optim or --finetune resume the optimizer starts afresh from the loaded "
       "weights, and "
       "the first step moves each weight no further than Adam's first step can",
       first_step_continues_from_loaded_weights, nullptr,
       "PropertyCanary.FirstStepContinuesFromLoadedWeightsCatchesASkippedReload", nullptr, ""},
      {"iteration_follows_resume_mode",
       "every job's last save and its tracker name the training loop's iteration: the loaded "
       "one plus the steps taken, counted from 0 after a --finetune resume",
       iteration_follows_resume_mode, nullptr,
       "PropertyCanary.IterationFollowsResumeModeCatchesAFinetuneThatKeepsTheIteration", nullptr,
       ""},
  };
}

}  // namespace

const std::vector<Property>& all_properties() {
  static const std::vector<Property> props = [] {
    std::vector<Property> out = {
        {"no_duplicate_leaves",
         "no merge() in any load meets a duplicate leaf or lists of different lengths",
         no_duplicate_leaves, trace_no_duplicate_leaves,
         "PropertyCanary.NoDuplicateLeavesCatchesRawStepUnderLnoRequest",
         check_common_state_not_wrapped, "common_state_not_wrapped"},
        {"resume_completes", "every save and load runs to the end on every rank", resume_completes,
         trace_resume_completes, "PropertyCanary.ResumeCompletesCatchesThePre2874SaveAssert",
         nullptr, ""},
        {"step_matches_uninterrupted",
         "after every resume every Adam part holds and uses the uninterrupted run's "
         "bias-correction "
         "step",
         step_matches_uninterrupted, trace_step_matches_uninterrupted,
         "PropertyCanary.StepMatchesCatchesTheSkeletonStep", nullptr, ""},
        {"step_counts_optimizer_steps",
         "every Adam counter equals the number of optimizer steps taken (absolute: no reference)",
         step_counts_optimizer_steps, trace_step_counts_optimizer_steps,
         "PropertyCanary.StepCountsCatchesANarrowCounterTheUninterruptedRunShares",
         check_step_counters_agree, "step_counters_agree"},
        {"hyperparams_follow_schedule",
         "every param group's lr and weight decay at every step equal the schedule in force "
         "(absolute: no reference)",
         hyperparams_follow_schedule, trace_hyperparams_follow_schedule,
         "PropertyCanary.HyperparamsFollowScheduleCatchesASchedulerSteppedPerIteration", nullptr,
         ""},
        {"trajectory_matches_uninterrupted",
         "master params, moments and model params equal the uninterrupted run (bitwise for the "
         "same "
         "kernel kind)",
         trajectory_matches_uninterrupted, trace_trajectory_matches_uninterrupted,
         "PropertyCanary.TrajectoryCatchesOneUlpInOneRestoredMoment", nullptr, ""},
        {"shards_tile_buckets",
         "saved optimizer pieces tile [0, numel_unpadded) of every bucket and key exactly once",
         shards_tile_buckets, nullptr, "PropertyCanary.ShardsTileBucketsCatchesADroppedPad",
         check_shards_tile_buckets_of, "shards_tile_buckets"},
        {"common_state_rank_independent",
         "every rank's common state equals rank 0's, the only one persisted",
         common_state_rank_independent, nullptr,
         "PropertyCanary.CommonStateCatchesRankDependentLeaf", check_common_state_rank_independent,
         "common_state_rank_independent"},
        {"layout_invariants", "buffer layouts and DP shards keep I1, I2 and I4", layout_invariants,
         nullptr, "PropertyCanary.LayoutInvariantsCatchAMisalignedParam", nullptr, ""},
        {"round_trip_identity", "a load gives back exactly what the previous phase saved (I13)",
         round_trip_identity, trace_round_trip_identity,
         "PropertyCanary.RoundTripIdentityCatchesTheSkeletonStep", nullptr, ""},
        {"reshard_round_trip_bytes",
         "resume then save with no step writes the same param-region bytes (I5)",
         reshard_round_trip_bytes, nullptr,
         "PropertyCanary.ReshardRoundTripBytesCatchesAChangedMomentAfterAZeroStepResume", nullptr,
         ""},
        {"step_tensors_not_aliased", "no two params share one step tensor object (I14)",
         step_tensors_not_aliased, trace_step_tensors_not_aliased,
         "PropertyCanary.StepTensorsNotAliasedCatchesB9", nullptr, ""},
        {"load_writes_every_element",
         "every element a load requests is written from the checkpoint (absolute: no reference)",
         load_writes_every_element, trace_load_writes_every_element,
         "PropertyCanary.LoadWritesEveryElementCatchesASkippedPiece", nullptr, ""},
        {"state_dtypes_survive_resume",
         "a precision-aware FusedAdam's states keep the uninterrupted run's dtypes after a resume",
         state_dtypes_survive_resume, trace_state_dtypes_survive_resume,
         "PropertyCanary.StateDtypesSurviveResumeCatchesAMomentKeptFp32", nullptr, ""},
    };
    for (Property& p : save_protocol_properties()) out.push_back(std::move(p));
    return out;
  }();
  return props;
}

const Property* find_property(const std::string& name) {
  for (const auto& p : all_properties()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::string property_names() {
  std::string out;
  for (const auto& p : all_properties()) out += (out.empty() ? "" : ", ") + p.name;
  return out;
}

std::string judged_on(const Property& p) {
  std::string out = "run";
  if (p.trace_check) out += ", trace";
  if (p.checkpoint_check) out += ", checkpoint";
  return out;
}

std::vector<PropertyResult> check_all(const sim::RunResult& run) {
  std::vector<PropertyResult> out;
  for (const auto& p : all_properties()) out.push_back(p.check(run));
  return out;
}

bool all_ok(const std::vector<PropertyResult>& results) {
  return std::all_of(results.begin(), results.end(),
                     [](const PropertyResult& r) { return r.ok(); });
}

}  // namespace ckptsim::properties
