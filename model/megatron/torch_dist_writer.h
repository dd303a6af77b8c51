// A checkpoint in the model's own format (model/megatron/serialization.h: metadata.json,
// shards/rank_<r>.bin, objects/<unique_key>.pt, common.pt) exported as the real Megatron-LM
// `torch_dist` checkpoint of the same save, in the training loop's layout, so that
// megatron.core.dist_checkpointing.load (torch_dist strategy) loads it as it loads one it
// wrote itself. The read side is model/megatron/torch_dist_checkpoint.h.
//
//   <dir>/latest_checkpointed_iteration.txt  the iteration, no newline (checkpointing.py)
//   <dir>/iter_NNNNNNN/metadata.json         {"sharded_backend": "torch_dist",
//                                            "sharded_backend_version": 1[, "common_backend":
//                                            "torch", "common_backend_version": 1]}
//   <dir>/iter_NNNNNNN/.metadata, __R_0.distcp  torch.distributed.checkpoint
//                                            (model/torch/distributed_checkpoint.h)
//   <dir>/iter_NNNNNNN/common.pt             torch.save of the common state (absent when the
//                                            model saved it as the ShardedObject
//                                            'common_state', upstream HEAD)
//
// Mirrors dist_checkpointing/serialization.py save() (content_metadata into the common
// state; metadata.json: core.py save_config), strategies/common.py save_common (common.pt),
// strategies/torch.py (_mcore_to_torch_sharded_object: a ShardedObject is the bytes item
// '<unique_key>' holding torch.save([data]); MCoreSavePlanner: every rank writes its own
// items) and training/checkpointing.py (tracker, iter_%07d).
//
// What is exported, and how:
//   - every saved tensor piece of rank r as a chunk (global offset, numel) of its key in rank
//     r's data file, its dtype and the key's global size kept;
//   - every ShardedObject as a bytes item of rank 0 (the model's ShardedObjects are all
//     (1,)-shaped with DP rank 0 as main replica, as upstream's dp_reshardable ones);
//   - the common state: common.pt, or inside 'common_state' where the model put it there.
//     The training loop's content_metadata (what checkpointing.py save_checkpoint passes to
//     dist_checkpointing.save: distrib_optim_sharding_type from the optimizer's
//     param_state_sharding_type, singleton_local_shards False, chained_optim_avoid_prefix
//     True) is added at its end when the model's common state has none: the model takes the
//     sharding type as an argument and never saves it, but a real load reads it
//     (load_content_metadata) to build its request.
//   - values are the model's, bit for bit; only what the model's own format loses is
//     restored: its codec writes a class symbol as the str "<class 'M.C'>" and tuple dict keys
//     as their repr (decoded back by pickle_codec), so a str value of exactly that form
//     becomes the class global again (AMBIGUITY: a genuine str spelled so would too; Megatron
//     state dicts hold none).
//
// Not exported: anything the model does not save (args, rng_state, opt_param_scheduler,
// num_floating_point_operations_so_far, rerun_state_machine of a real training checkpoint;
// torch 2.x AdamW's param-group key decoupled_weight_decay, which the model does not model),
// `.data/serialization_id` records, more than one data file per rank (torch's thread_count).
//
// Invariants:
//   1. The export reads the source only; on any error nothing is promised about <dir>, and
//      the Status names the source file or key.
//   2. read_torch_dist_checkpoint(target, dir) gives back every tensor of the source, bit for
//      bit, every ShardedObject and the common state (plus content_metadata).
//   3. Deterministic: the same source and options give the same bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "model/status.h"
#include "model/storage.h"

namespace ckptsim::model {

struct TorchDistExportOptions {
  // storage_meta.checkpoint_id of `.metadata` is "<checkpoint_root>/iter_NNNNNNN" (torch
  // writes the directory it saved to; nothing reads it). Empty: the iteration directory as
  // the target storage names it.
  std::string checkpoint_root;
  // Classes written under another name, "module.Class" -> "module.Class": e.g. TE's
  // "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam" ->
  // "replay.emulation.StandinFusedAdam" for a load where TE is absent but the replay's
  // stand-in is importable (unpickling a param group imports its classes).
  std::map<std::string, std::string> class_renames;
  // As a script's plain dist_checkpointing.save leaves it: the common state without the
  // training loop's keys ('iteration', 'checkpoint_version', 'args', 'opt_param_scheduler')
  // and no tracker; the iteration directory is still named by the run's iteration.
  bool without_training_loop_state = false;
};

struct TorchDistExportReport {
  int64_t iteration = 0;
  std::string iter_dir;      // "<dir>/iter_NNNNNNN"
  int64_t writer_ranks = 0;  // data files written
  int64_t tensors = 0;       // keys
  int64_t chunks = 0;
  int64_t objects = 0;  // bytes items (the common state's included when it is one)
  bool common_pt = false;
};

// Exports the own-format checkpoint at the root of `source` to `<dir>` of `target`.
Result<TorchDistExportReport> export_torch_dist_checkpoint(
    const Storage& source, Storage& target, const std::string& dir,
    const TorchDistExportOptions& options = {});

// Parses "A=B" (a class_renames entry as the CLI takes it); invalid_input naming `text`.
Status parse_class_rename(const std::string& text, std::map<std::string, std::string>& renames);

}  // namespace ckptsim::model
