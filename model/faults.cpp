#include "model/faults.h"

#include <utility>

namespace ckptsim::model {

namespace {

// The sites of the optimizer, its checkpoint's layout and its load.
std::vector<FaultSite> state_sites() {
  return {
      {fault::kDropEndPadding,
       "sharded_param_state_dp_reshardable leaves out the padding piece after a rank's last param, "
       "so the saved pieces no longer tile [0, numel_unpadded)",
       "shards_tile_buckets"},
      {fault::kPerturbLoadedExpAvg,
       "load_parameter_state_from_dp_reshardable adds one ulp to the first exp_avg element it "
       "restores on "
       "DP rank 0",
       "trajectory_matches_uninterrupted"},
      {fault::kMisalignParamStart,
       "the DDP buffer layout moves one param that has room after it one element up, breaking the "
       "64-element "
       "alignment of its start",
       "layout_invariants"},
      {fault::kRankDependentCommon,
       "the saved training state carries a rank-dependent common leaf ('ckptsim_rank')",
       "common_state_rank_independent"},
      {fault::kStepCounterBf16,
       "every Adam part keeps its step counter rounded to bfloat16 as it increments it (the "
       "narrow counter of torchao PR #4915 and DeepSpeed PR #8496): past 256 it stops counting. "
       "The uninterrupted run shares it, so only an absolute check sees it",
       "step_counts_optimizer_steps"},
      {fault::kSkipLoadPiece,
       "on global rank 0 the load skips the first saved piece of every optimizer key that its "
       "request overlaps, so those elements keep the values the load request was built with",
       "load_writes_every_element"},
      {fault::kSchedulerPerIteration,
       "the training loop steps the lr/weight-decay scheduler by 1 per iteration instead of the "
       "global batch size, so a warmup, decay or increment given in iterations runs that many "
       "times slower. The uninterrupted run shares it, so only an absolute check sees it",
       "hyperparams_follow_schedule"},
      {fault::kLowPrecisionMomentKeptFp32,
       "TE FusedAdam's load_state_dict casts a bf16 or fp16 moment to fp32 and keeps it there "
       "(the promotion torchtitan PR #4615 fixed for torch's loader): the resumed run's moments "
       "are no longer rounded to their dtype at each step",
       "state_dtypes_survive_resume"},
      {fault::kChainedPrefixDropped,
       "the chained optimizer of an MoE model saves its parts' keys without the 'chained_<i>.' "
       "prefix the dp_reshardable format needs: the dense and the expert part's bucket keys "
       "(both dp_group_idx_0 on EP rank 0) collide",
       "resume_completes"},
      {fault::kExpertStepBehind,
       "the expert part of an MoE model's chained optimizer saves its param groups' step one "
       "behind the dense part's, as a checkpoint whose parts were written at different steps "
       "(Megatron-LM #2016: 'steps: [2250, 1300]'): the next load's _synchronize_steps refuses it",
       "resume_completes"},
      {fault::kExpertStepFromDense,
       "the chained optimizer's load restores the expert part's param-group step from the dense "
       "part's instead of the expert part's own saved one, so a checkpoint whose parts' steps "
       "differ loads without a word (scenarios/moe-steps-differ-load-refused-upstream-head.json "
       "expects the refusal)",
       "resume_completes"},
      {fault::kExpertPartNotLoaded,
       "the chained optimizer's load gives the checkpoint to the dense part only: the expert "
       "part keeps the state it was built with, re-initialized without an error (NVIDIA-NeMo/RL "
       "PR #3345's resume, which missed the 'chained_<i>.' keys)",
       "round_trip_identity"},
  };
}

// The sites of the save protocol (tracker, async save) and of the resume flags.
std::vector<FaultSite> protocol_sites() {
  return {
      {fault::kTrackerBeforeData,
       "save_checkpoint writes the tracker (latest_checkpointed_iteration.txt) before the "
       "checkpoint's files, so a save that stops part-way leaves the tracker naming an "
       "iteration whose files are not all there",
       "tracker_names_saved_state"},
      {fault::kSkipDamagedPieces,
       "the load skips a saved piece whose file is missing or too short (its elements keep "
       "what the load request held) instead of failing, as a reader that tolerates a partial "
       "checkpoint would",
       "resume_after_crash_is_complete"},
      {fault::kAsyncFinalizeReadsLiveIteration,
       "an async save's finalize writes the tracker with the iteration the training loop is at "
       "when it runs, not the save's (Megatron-Bridge #3267): after a slow write the tracker "
       "names a later iteration than the one saved",
       "tracker_names_saved_state"},
      {fault::kAsyncReusesCachedHandles,
       "the persistent async checkpoint worker writes the optimizer state of every async save "
       "after the job's first (of the same structure) from the tensors it staged for the first "
       "(NVRx's cached handles after the optimizer state was reallocated, NVIDIA-NeMo/RL PR "
       "#4183): later checkpoints hold the first one's moments",
       "tracker_names_saved_state"},
      {fault::kReloadSkipsModelParams,
       "a resume that loads no optimizer state (--no-load-optim) does not copy the loaded "
       "model params into the optimizer's main params (reload_model_params() does nothing): "
       "the first step updates the weights the job was built with",
       "first_step_continues_from_loaded_weights"},
      {fault::kFinetuneKeepsIteration,
       "a --finetune resume continues from the checkpoint's iteration instead of 0, so the "
       "job's saves, its tracker and its --save-interval count on from the pretrained run's "
       "iterations",
       "iteration_follows_resume_mode"},
  };
}

}  // namespace

const std::vector<FaultSite>& fault_sites() {
  static const std::vector<FaultSite> sites = [] {
    std::vector<FaultSite> out = state_sites();
    for (FaultSite& f : protocol_sites()) out.push_back(std::move(f));
    return out;
  }();
  return sites;
}

bool is_fault_site(const std::string& name) {
  for (const auto& s : fault_sites()) {
    if (s.name == name) return true;
  }
  return false;
}

}  // namespace ckptsim::model
