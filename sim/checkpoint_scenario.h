// The scenario a checkpoint implies: which params, optimizer and buffer layout the run that
// saved a real Megatron torch_dist checkpoint (model/megatron/torch_dist_checkpoint.h) had, so
// that the model can resume from that very checkpoint (`ckptsim inspect`).
//
// What is read, and from where:
//   params          every ShardedTensor that is no optimizer state: name = key, numel, dtype
//                   (bf16 or fp32; any other dtype is outside the model)
//   optimizer kind  the param groups of 'optimizer.distributed.dp_group_idx_0.optimizer':
//                   'cpu_optimizer_cls' -> hybrid (offload_fraction, overlap flag, and TE
//                   installed unless 'gpu_optimizer_cls' is torch AdamW); else 'amsgrad' (torch
//                   AdamW's own default) -> torch_adamw; else 'bias_correction' -> fused_adam
//   lr, betas, eps, weight decay   the groups (max_lr, else lr, / lr_mult; min_lr / lr_mult;
//                   weight_decay / wd_mult); the schedule: constant at that lr and min_lr (a
//                   checkpoint's optimizer holds no schedule arguments)
//   param order, bucket_size, pad_buckets_for_high_nccl_busbw   searched: the first candidate
//                   whose layout (model/megatron/param_and_grad_buffer.h, at the DP size at
//                   save) reproduces every bucket's numel_unpadded and padded numel, and puts
//                   every param's master copy where the bucket holds the saved param
//   chained (MoE)   keys 'chained_0.' (the dense part) and 'chained_1.' (the expert part,
//                   dp_group_idx_<EP rank>): EP = the expert part's DP groups; the expert params
//                   those whose `.metadata` chunks split dim 0 into EP pieces (EP 1, where every
//                   param is whole: refused); each part's buckets searched as above (the expert
//                   part's EP pieces at expert-DP = DP / EP), each part's params against its own
//                   param groups
//   precision-aware (fused_adam, dp_reshardable)   an int16 'param' state: TE's remainders of
//                   bf16 masters (store_param_remainders); a moment whose saved values are all
//                   bf16 values (one not zero): kept in bf16. fp16 and fp32 moments save alike
//                   (unscaled fp32): fp32, upstream's default, listed in `guesses`; so is
//                   precision-aware off where nothing shows it. Its masters are not compared in
//                   the layout search (remainders; TE's fp32 master_param of an fp32 param is
//                   never updated).
//   fully_reshardable (saved at PP 1; TP and PP from the common state's args)   each param's
//                   shape from its tensor and TP split from its `.metadata` chunks (one chunk
//                   of the whole shape: replicated; TP equal pieces along dim 0: column, dim 1:
//                   row; saved at TP 1: replicated, a guess); no bucket layout is in the
//                   checkpoint: one bucket per buffer, names in natural order, each param
//                   group's params together in the groups' order (guesses); DP at save from
//                   args.data_parallel_size, else the writers per TP x PP rank (a guess). The
//                   param groups are the common state's ['optimizer']['optimizer'].
//   param groups    which group a param is in is not in a checkpoint. One group: every param.
//                   Two groups {wd_mult 1, wd_mult 0} of one lr_mult: Megatron's default rule,
//                   names ending in 'bias' or holding 'norm' have no weight decay; it must
//                   give the groups in the checkpoint's order. Anything else: an error asking
//                   for the scenario (`inspect --scenario`).
//
// Invariants:
//   1. The scenario is valid (parse_scenario accepts scenario_to_json of it); phases[0] is
//      the save (DP at save, the revision given, one step as a placeholder: the steps before a
//      checkpoint are not in it), and every other field is the scenario format's default.
//   2. Every guess is listed in `guesses`; every refusal is a Status naming the key.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/megatron/torch_dist_checkpoint.h"
#include "model/status.h"
#include "sim/scenario.h"

namespace ckptsim::sim {

struct InferredScenario {
  Scenario scenario;
  int64_t dp_at_save = 1;
  std::vector<std::string> guesses;  // what was guessed rather than read, one line each
};

// The model-parallel sizes of the run that saved (Megatron's saved args, where the checkpoint
// holds them; inspect's --tp/--pp otherwise default to 1), and its DP size where the args say.
struct SaveParallelism {
  int64_t tp = 1;
  int64_t pp = 1;
  std::optional<int64_t> dp;
};

// `save_revision` names the phase that saved (phases[0]); REQUIRES: its profile is set.
Result<InferredScenario> infer_scenario(const model::TorchDistCheckpoint& checkpoint,
                                        const Revision& save_revision,
                                        const SaveParallelism& at_save = {});

// Checks that `scenario` (a user's, `inspect --scenario`) describes the checkpoint: the same
// params (names, numels, dtypes) and, for dp_reshardable, a layout that reproduces every bucket
// (a fully_reshardable checkpoint holds every param whole, in no bucket). Errors name the param
// or bucket.
Status check_scenario_fits(const model::TorchDistCheckpoint& checkpoint, const Scenario& scenario,
                           int64_t dp_at_save);

}  // namespace ckptsim::sim
