// Named fault sites: deliberately broken variants of the model, for showing that each
// checker catches what it claims to (a checker that never fails proves nothing).
//
// FoundationDB's BUGGIFY, narrowed: a site fires only when a scenario lists it in its
// "faults" field (never at random, never outside simulation), and every firing is counted
// so the trace shows it. Each site names the property that must catch it.
#pragma once

#include <string>
#include <vector>

namespace ckptsim::model {

struct FaultSite {
  std::string name;
  std::string effect;
  std::string caught_by;  // the property that must fail when the site fires
};

const std::vector<FaultSite>& fault_sites();
bool is_fault_site(const std::string& name);

// Site names used in model code (one constant per site, so a typo is a compile error).
namespace fault {
inline constexpr const char* kDropEndPadding = "dp_reshardable.drop_end_padding";
inline constexpr const char* kPerturbLoadedExpAvg = "load.perturb_exp_avg";
inline constexpr const char* kRankDependentCommon = "save.rank_dependent_common";
inline constexpr const char* kMisalignParamStart = "layout.misalign_param_start";
inline constexpr const char* kStepCounterBf16 = "optimizer.step_counter_bf16";
inline constexpr const char* kSkipLoadPiece = "load.skip_piece";
inline constexpr const char* kSchedulerPerIteration = "scheduler.increment_per_iteration";
inline constexpr const char* kTrackerBeforeData = "save.tracker_before_data";
inline constexpr const char* kSkipDamagedPieces = "load.skip_damaged_pieces";
inline constexpr const char* kAsyncFinalizeReadsLiveIteration =
    "save.async_finalize_reads_live_iteration";
inline constexpr const char* kAsyncReusesCachedHandles = "save.async_writer_reuses_cached_handles";
inline constexpr const char* kReloadSkipsModelParams = "load.reload_skips_model_params";
inline constexpr const char* kFinetuneKeepsIteration = "load.finetune_keeps_iteration";
inline constexpr const char* kLowPrecisionMomentKeptFp32 = "load.low_precision_moment_kept_fp32";
inline constexpr const char* kChainedPrefixDropped = "save.chained_prefix_dropped";
inline constexpr const char* kExpertStepBehind = "save.expert_step_behind";
inline constexpr const char* kExpertStepFromDense = "load.expert_step_from_dense";
inline constexpr const char* kExpertPartNotLoaded = "load.expert_part_not_loaded";
}  // namespace fault

}  // namespace ckptsim::model
