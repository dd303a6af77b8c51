// --async-save: the training loop's save split as upstream's persistent checkpoint worker splits
// it (reports/research/save-protocol-2026-12-04.md, section 2). Mirrors checkpointing.py
// save_checkpoint(..., async_save=True) -> schedule_async_save, and training/async_utils.py
// maybe_finalize_async_save:
//
//   schedule  (in save_checkpoint, at the iteration of the save) the state dict, the plan and
//             its collectives, the device-to-host staging (the trainer waits on preload_q.join()
//             until the worker has copied the tensors); what upstream writes synchronously
//             then: common.pt (before HEAD: save_common runs before the async request is
//             built), the removal of a directory being replaced;
//   write     (the worker, in the background) every rank's data files: its .distcp (the
//             model's shards/rank_R.bin) and the ShardedObjects (HEAD's common_state among
//             them);
//   finalize  (maybe_finalize_async_save, at the top of a later iteration once every rank's
//             worker is done, or blocking at the end of the job) the finalize fns in order:
//             .metadata and metadata.json (the model's metadata.json), the directory
//             replacement, then iter_finalize_fn: rank 0 writes the tracker with the iteration
//             its closure captured when the save was scheduled (no revision reads a live
//             counter there; Megatron-Bridge #3267 did).
//
// How: the save runs as the synchronous one does (save_checkpoint_to_root) against a recording
// view of the checkpoint directory that performs the schedule-time operations at once and keeps
// the others, in order, as the request's writes and finalize operations; finalize_async_save
// performs them on the directory. So the files are byte for byte the synchronous save's, only
// later, unless a fault site below fires.
//
// Fault sites (switches of ours, canaries of the crash properties):
//   save.async_finalize_reads_live_iteration  the tracker gets the iteration the training loop
//       is at when the finalize runs, not the save's (Megatron-Bridge #3267, fixed by its
//       PR #3269): after a slow write the tracker names a later iteration than the one saved;
//   save.async_writer_reuses_cached_handles  the persistent worker keeps the tensors it staged
//       for the job's first async save and, for every later save of the same structure, writes
//       the optimizer state ('optimizer.' keys) from them (the NVRx cached-structure path with
//       the optimizer state reallocated between saves: NVIDIA-NeMo/RL PR #4183). The files
//       then hold the first save's moments under a later iteration.
//
// Invariants:
//   1. Without the fault sites, schedule + finalize leave the same files as save_checkpoint_to_root
//      would have at the save's iteration, and the tracker names the request's iteration.
//   2. Nothing of the request reaches the directory before finalize_async_save, except what
//      upstream writes synchronously (above).
//   3. Collective over `group`, schedule and finalize alike; every rank finalizes the same
//      requests in the same (FIFO) order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/megatron/checkpointing.h"

namespace ckptsim::model {

struct AsyncSaveRequest {
  struct Op {
    enum class Kind { kWrite, kRemoveAll, kRename };
    Kind kind = Kind::kWrite;
    std::string path;  // relative to the checkpoint directory
    std::string to;    // kRename only
    std::vector<char> bytes;
  };
  int64_t iteration = 0;     // the save's (the closure's)
  std::vector<Op> writes;    // this rank's worker: its data files
  std::vector<Op> finalize;  // this rank's finalize fns (rank 0's: metadata, tracker)
};

// One rank's persistent worker across the job's async saves (fault site
// save.async_writer_reuses_cached_handles): what the first one staged.
struct AsyncWriterCache {
  bool primed = false;
  std::vector<SavedPiece> pieces;  // this rank's, in its data file's order
  std::vector<char> shard;         // its data file's bytes
};

// Schedules the save of `iteration` (as save_checkpoint_to_root saves it) into `request`;
// returns what the save reports. Collective over `group`. Raises what the synchronous save
// raises before its writes. `caches`: the run's (save_checkpoint_to_root's).
SaveReport schedule_async_save(DistributedDataParallel& ddp, ChainedOptimizer& opt,
                               const OptimizerParamScheduler* scheduler, int64_t iteration,
                               Storage& root, ProcessGroup& group, const RevisionSwitches& switches,
                               const CheckpointFormat& format, Runtime& rt, AsyncWriterCache& cache,
                               AsyncSaveRequest& request, CheckpointCaches* caches = nullptr);

// Finalizes `request` into `root`: this rank's writes, a barrier (every rank's worker done),
// this rank's finalize operations, a barrier. `live_iteration`: the iteration the training loop
// is at (read only by the fault site). A write that fails raises OSError (the job ends).
// Collective over `group`.
void finalize_async_save(const AsyncSaveRequest& request, Storage& root, ProcessGroup& group,
                         int64_t live_iteration, Runtime& rt);

}  // namespace ckptsim::model
