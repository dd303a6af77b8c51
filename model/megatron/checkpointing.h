// The training loop's side of a checkpoint, for one model chunk: what state dict it asks
// dist_checkpointing to save or load, in which order it loads, and one training step.
// Mirrors megatron/training/checkpointing.py generate_state_dict(), save_checkpoint() and
// load_checkpoint() (the dist_checkpointing path), and megatron/training/training.py
// train_step() without the forward/backward pass (the caller's `backward` fills the grads).
//
// Invariants:
//   1. Load order is upstream's: build the load request (generate_state_dict with
//      is_loading=True, which runs the optimizer's sharded_state_dict(is_loading=True) and so
//      its side effects, see distrib_optimizer.h), dist_checkpointing.load, then
//      model.load_state_dict, then optimizer.load_state_dict.
//   2. A training step is zero_grad_buffer → backward → finish_grad_sync → step →
//      start_param_sync → scheduler step, as upstream's train_step with overlap off.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "model/megatron/chained_optimizer.h"
#include "model/megatron/distributed_data_parallel.h"
#include "model/megatron/optimizer_param_scheduler.h"
#include "model/megatron/serialization.h"
#include "model/process_group.h"
#include "model/py/runtime.h"
#include "model/revision.h"
#include "model/storage.h"

namespace ckptsim::model {

// Mirrors checkpointing.py generate_state_dict() for one model chunk:
// {checkpoint_version, iteration, model, optimizer, opt_param_scheduler} (the scheduler's
// state when `scheduler` is given), the optimizer's with `format` as its metadata (nullopt: a
// caller that passes none). The fault site save.rank_dependent_common adds a common leaf that
// differs per rank (saving only).
// `opt` null: the request has no 'optimizer' (load_checkpoint() passes None where it loads no
// optimizer state).
Value generate_state_dict(DistributedDataParallel& ddp, ChainedOptimizer* opt,
                          const OptimizerParamScheduler* scheduler, int64_t iteration,
                          bool is_loading, const std::optional<CheckpointFormat>& format,
                          Runtime& rt);

// The content_metadata save_checkpoint() stores in the common state
// (_build_sharded_state_dict_metadata without dp_cp_group): distrib_optim_sharding_type,
// distrib_optim_fully_reshardable_mem_efficient (fully_reshardable only),
// singleton_local_shards False, chained_optim_avoid_prefix True.
Value content_metadata(const CheckpointFormat& format);
// What load_checkpoint() takes the checkpoint's format from: the common state's
// content_metadata (dist_checkpointing.load_content_metadata), or, for a checkpoint that has
// none, dp_zero_gather_scatter (upstream's fallback for a checkpoint whose args do not say
// ckpt_fully_parallel_save; the model saves no args). A sharding type the model does not know
// is NotImplementedError later, at the optimizer's dispatch: returned here as its name.
struct LoadedFormat {
  std::optional<CheckpointFormat> format;  // nullopt: an unknown sharding type
  std::string sharding_type;               // as the checkpoint spells it
};
LoadedFormat checkpoint_format(const Value& common_state);

// Mirrors checkpointing.py load_checkpoint() (dist_checkpointing, non-strict=False path):
// returns the checkpoint's iteration. Collective over `group`. First the common state
// (load_common_state_dict, as _load_base_checkpoint does) and its content metadata, whose
// sharding type the request is built with (checkpoint_format), then the request, then the load.
// The switches that change the load itself (merge_truncates_param_state_lists,
// load_strips_common_param_state, load_allows_missing_keys, common_state_as_sharded_object)
// are read from `switches`; `report` (optional) receives what the load did not cover.
// Then the scheduler (when given) loads the checkpoint's 'opt_param_scheduler', and under
// --override-opt_param-scheduler the groups' lr bounds are set as override_lr_bounds says
// (HEAD's `arguments` also resets the scheduler's num_steps to the samples consumed, the
// iteration times the scheduler's samples per iteration, where they differ).
// A checkpoint without 'opt_param_scheduler' (the replay runner's, which saves none) leaves
// the scheduler as it was built; upstream raises KeyError there.
// `caches` (optional, here and in every save and load below): the run's, passed to the
// serialization's options (model/megatron/checkpoint_caches.h).
//
// With args.no_load_optim (--no-load-optim) the request holds neither 'optimizer' nor
// 'opt_param_scheduler' (load_checkpoint() passes None for both: no dummy_step, no optimizer
// load_state_dict), the optimizer's main params are reloaded from the loaded model params
// (DistributedOptimizer::reload_model_params) and the scheduler keeps the state it was built
// with; the iteration is the checkpoint's (research/save-protocol-2026-12-04.md section 5).
// With args.finetune (--finetune) the load is the same as --no-load-optim's (HEAD
// checkpointing.py :2613 and :2779 request no optimizer, :3001 loads no scheduler, :3058 the
// main params are reloaded; 2874's :1585 and :1791 likewise), the RNG state is not requested
// (neither side holds one), and the training loop continues from iteration 0 (:2852 "if
// args.finetune or release: iteration = 0"; 2874's :1737).
struct ResumeArgs {
  bool no_load_optim = false;
  bool finetune = false;
  bool loads_optimizer() const { return !no_load_optim && !finetune; }
};
// What a resume leaves the training loop with: the iteration it continues from, and the
// iteration of the checkpoint it loaded (the two differ only under --finetune).
struct Resumed {
  int64_t iteration = 0;
  int64_t checkpoint_iteration = 0;
  bool operator==(const Resumed&) const = default;
};
Resumed load_checkpoint(DistributedDataParallel& ddp, ChainedOptimizer& opt,
                        OptimizerParamScheduler* scheduler, const Storage& storage,
                        ProcessGroup& group, const RevisionSwitches& switches, Runtime& rt,
                        LoadReport* report = nullptr, const ResumeArgs& args = {},
                        CheckpointCaches* caches = nullptr);

// What a script of its own does with a checkpoint, outside Megatron's training loop (the
// checkpoint holds no training-loop state: no 'iteration', 'args', scheduler or RNG):
//   state = dist_checkpointing.load({'model': model.sharded_state_dict(),
//       'optimizer': optimizer.sharded_state_dict(model_sd, is_loading=True, metadata=...)}, dir)
//   model.load_state_dict(state['model']); optimizer.load_state_dict(state['optimizer'])
// with the format the checkpoint says (content_metadata, else the optimizer's own
// param_state_sharding_type, else dp_zero_gather_scatter). No (TP, PP) check, no scheduler.
// Returns the common state's 'iteration' where it holds one, else 0. Collective over `group`;
// the load's switches as load_checkpoint reads them.
int64_t load_distributed_checkpoint(DistributedDataParallel& ddp, ChainedOptimizer& opt,
                                    const Storage& storage, ProcessGroup& group,
                                    const RevisionSwitches& switches, Runtime& rt,
                                    LoadReport* report = nullptr,
                                    CheckpointCaches* caches = nullptr);

// Mirrors checkpointing.py save_checkpoint(): generate_state_dict(is_loading=False) then
// dist_checkpointing.save with content_metadata(format) (where the common state goes:
// common_state_as_sharded_object).
// Collective over `group`.
SaveReport save_checkpoint(DistributedDataParallel& ddp, ChainedOptimizer& opt,
                           const OptimizerParamScheduler* scheduler, int64_t iteration,
                           Storage& storage, ProcessGroup& group, const RevisionSwitches& switches,
                           const CheckpointFormat& format, Runtime& rt,
                           CheckpointCaches* caches = nullptr);

// The training loop's checkpoint directory (--save, --load): one iter_NNNNNNN/ per saved
// iteration (model::iteration_dir_name) and the tracker latest_checkpointed_iteration.txt,
// written last by global rank 0 (reports/research/save-protocol-2026-12-04.md, section 1).
//
// Mirrors save_checkpoint()'s directory work around save_checkpoint above: the state goes to
// `root`/iter_NNNNNNN/ (a directory that exists is written over, its other files kept, as
// upstream only logs "Overwriting old incomplete / corrupted checkpoint"), then a barrier, then
// rank 0 writes the iteration (no newline) to the tracker, then a barrier. A write that fails
// raises (the job ends). Fault site save.tracker_before_data: rank 0 writes the tracker before
// the state. Collective over `group`.
SaveReport save_checkpoint_to_root(DistributedDataParallel& ddp, ChainedOptimizer& opt,
                                   const OptimizerParamScheduler* scheduler, int64_t iteration,
                                   Storage& root, ProcessGroup& group,
                                   const RevisionSwitches& switches, const CheckpointFormat& format,
                                   Runtime& rt, CheckpointCaches* caches = nullptr);

// Mirrors load_checkpoint()'s way to the iteration directory (read_metadata,
// _load_base_checkpoint, _get_checkpoint_format), then load_checkpoint above on it:
//   no tracker       nullopt: upstream warns "could not find the metadata file" and starts from
//                    random (iteration 0; nothing loaded);
//   not an integer   SystemExit: read_metadata prints "ERROR: Invalid metadata file" and calls
//                    sys.exit() (an empty tracker too: open('w') truncated it);
//   negative         AssertionError "error parsing metadata file";
//   no iter_N/       FileNotFoundError (the format check lists the directory).
// Returns what load_checkpoint returns. Collective over `group` (every rank reads the tracker).
std::optional<Resumed> load_latest_checkpoint(
    DistributedDataParallel& ddp, ChainedOptimizer& opt, OptimizerParamScheduler* scheduler,
    const Storage& root, ProcessGroup& group, const RevisionSwitches& switches, Runtime& rt,
    LoadReport* report = nullptr, const ResumeArgs& args = {}, CheckpointCaches* caches = nullptr);

// The tracker's bytes as read_metadata() reads them (int() of the stripped text): nullopt when
// they are no integer.
std::optional<int64_t> parse_tracker(const std::vector<char>& bytes);
// The iteration the tracker in `root` names; nullopt when there is no tracker or it names
// none (what the driver and the checks read, not a mirror of upstream).
std::optional<int64_t> tracker_iteration(const Storage& root);

// Mirrors training.py train_step() with overlap off and no clipping: `backward(i, main_grad)`
// writes model param i's local gradient into its main_grad view (fp32), then the grads are
// reduce-scattered, the optimizer stepped (with the lr and weight_decay the scheduler left in
// the groups), the params all-gathered, and the scheduler stepped by the global batch size
// (`samples_per_iteration`; the fault site scheduler.increment_per_iteration steps it by 1).
void train_step(DistributedDataParallel& ddp, ChainedOptimizer& opt,
                OptimizerParamScheduler& scheduler, int64_t samples_per_iteration, Runtime& rt,
                const std::function<void(size_t, at::Tensor&)>& backward);

}  // namespace ckptsim::model
