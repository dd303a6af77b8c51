// ChainedOptimizer: what get_megatron_optimizer() returns at every modeled revision, even for a
// model with one part (a dense DistributedOptimizer), and, for an MoE model, the dense part and
// the expert part (issue 26). Mirrors megatron/core/optimizer/optimizer.py ChainedOptimizer
// (POST :1076-1422, HEAD :1451-2054; the same text where it matters here).
//
// What it does over its parts (research reports/research/chained-optimizer-2026-12-05.md §2):
//   - param_groups: the parts' groups, concatenated (what the scheduler walks);
//   - step(): each part's step in order (the model clips nothing);
//   - state_dict(): one part: that part's; more: a list of the parts';
//   - sharded_state_dict(): one part: that part's, as it is; more: _synchronize_steps() first,
//     then each part's with every ShardedBase key prefixed 'chained_<i>.' where the metadata asks
//     for it (should_add_prefix below), as {0: sd_0, 1: sd_1};
//   - load_state_dict(): one part: forwarded; more: the parts' entries in key order, zipped with
//     the parts (RuntimeError on a count mismatch), then _synchronize_steps();
//   - _synchronize_steps(): the 'step' of every param group (of each part's inner optimizer) that
//     has params and a step, asserted to be one value and written back into those groups.
//
// Invariants:
//   1. With one part every method is that part's, so a dense model behaves and saves exactly as
//      a bare DistributedOptimizer would (the key format of every checkpoint before issue 26).
//   2. The parts are owned; param_groups() returns the same group dicts the parts hold (a write
//      to a group is the part's).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "model/megatron/distrib_optimizer.h"

namespace ckptsim::model {

class ChainedOptimizer {
 public:
  explicit ChainedOptimizer(std::vector<std::unique_ptr<DistributedOptimizer>> parts);

  size_t size() const { return parts_.size(); }
  DistributedOptimizer& part(size_t i) { return *parts_.at(i); }
  const DistributedOptimizer& part(size_t i) const { return *parts_.at(i); }

  // The parts' param groups, concatenated (rebuilt at every call: the same dicts).
  List& param_groups();
  void step();
  Value state_dict();
  void load_state_dict(const Value& state_dict);
  Value sharded_state_dict(const Value& model_sharded_state_dict, bool is_loading,
                           const std::optional<CheckpointFormat>& metadata);
  void reload_model_params();
  // Whether a sharded state dict built for `metadata` prefixes its parts' keys (optimizer.py
  // sharded_state_dict: the sharding type is not a fully reshardable one, or the metadata does
  // not say chained_optim_avoid_prefix; nullopt is a caller that passes no metadata).
  static bool should_add_prefix(const std::optional<CheckpointFormat>& metadata);

 private:
  void synchronize_steps();
  std::vector<std::unique_ptr<DistributedOptimizer>> parts_;
  List param_groups_;
};

// The 'param_state_sharding_type' a saved optimizer state records (`optimizer` as the common
// state holds it): the optimizer's own, or, for a ChainedOptimizer of several parts ({0: sd_0,
// 1: sd_1, ...}), part 0's (the parts save in the checkpoint's one format). nullptr where none is
// recorded or `optimizer` is null.
const Value* saved_param_state_sharding_type(const Value* optimizer);

// Mirrors optimizer/__init__.py get_megatron_optimizer() for one dense model chunk:
// check_optimizer_config (building the OptimizerConfig),
// _get_param_groups (its all_gather_object aligns every rank's group keys), the
// DistributedOptimizer in a ChainedOptimizer of one part, then _get_param_groups again for the
// expert-parallel params (none here) with a second all_gather_object. Collective over `world`
// (upstream: the default group; null: the DP group, the world of a job at TP = PP = 1): every rank
// builds the groups any rank has, so the pipeline stages hold the same groups. A rank that raised
// while building (e.g. HDO's "can't optimize a non-leaf Tensor", which only the ranks owning a
// shard of an fp32 param raise) leaves its peers failing in that second collective.
std::unique_ptr<ChainedOptimizer> get_megatron_optimizer(Runtime& rt, DistributedDataParallel& ddp,
                                                         const OptimizerConfig& config,
                                                         const RevisionSwitches& switches,
                                                         ProcessGroup* world = nullptr);

}  // namespace ckptsim::model
