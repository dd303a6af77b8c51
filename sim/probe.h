// The simulator's probe: reads one rank's optimizer state the way a checker needs it, through
// the DistributedOptimizer's read-only accessors, after the modeled code has run. The model
// itself records nothing for checkers (FoundationDB's simulator reaches into the system under
// test the same way: through seams, never by instrumenting it).
//
// Invariants:
//   1. Reading never changes the model: no call here mutates an optimizer, a tensor or a
//      Runtime stream (so a probed run and an unprobed run are the same run).
//   2. The snapshot walks the params the inner optimizer actually updates, not the index maps,
//      so a mix-up in the maps (B8) shows as wrong data rather than as a wrong snapshot.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/megatron/chained_optimizer.h"
#include "model/megatron/serialization.h"

namespace ckptsim::sim {

// Which Adam of the optimizer holds (and steps) a shard.
enum class OptimizerPart {
  kFusedAdam,        // TE FusedAdam, the inner optimizer
  kAdamW,            // torch AdamW, the inner optimizer (no TE/apex)
  kHdoCpuAdamW,      // HybridDeviceOptimizer's CPU torch AdamW
  kHdoGpuFusedAdam,  // HybridDeviceOptimizer's GPU FusedAdam
  kHdoGpuAdamW,      // HybridDeviceOptimizer's GPU torch AdamW (no TE)
};
// "FusedAdam", "AdamW", "HDO cpu AdamW", "HDO gpu FusedAdam", "HDO gpu AdamW" (reports,
// details, signatures; the replay runner's trace uses the same names).
std::string part_name(OptimizerPart part);

// Which arithmetic updates a part's shards: the model's TE FusedAdam (the op order of
// model/kernels/adam_math.h fused_adam_update, which the replay runner's stand-in copies) or one
// of torch AdamW's implementations. Each rounds differently.
enum class Kernel {
  kFusedAdam,
  kTorchForeachCuda,
  kTorchFusedCpu,
  kTorchFusedCuda,
  kTorchSingleTensorCpu,
  kTorchSingleTensorCuda,
};
// "ckptsim_fused_adam", or model::kernel_name of torch's ("torch_foreach_cuda", ...): the
// trace's part "kernel".
std::string kernel_name(Kernel kernel);
bool is_torch_adamw(Kernel kernel);
// Elements of one rounding class are updated by the same arithmetic: the kernel and, for
// torch's fused CPU AdamW, whether the element falls in the scalar tail of its tensor (the
// shard: `index` of `numel`).
int rounding_class(Kernel kernel, int64_t index, int64_t numel);

// The bias-correction step t one part used for one model param's shard in the last step().
struct StepUse {
  size_t model_param = 0;
  OptimizerPart part = OptimizerPart::kFusedAdam;
  double step = 0;
};

// The optimizer state of one model param's shard on this rank, as the kernels see it.
struct ShardSnapshot {
  size_t model_param = 0;
  model::Range param_range;  // sub-range of the flattened model param
  OptimizerPart part = OptimizerPart::kFusedAdam;
  Kernel kernel = Kernel::kFusedAdam;
  std::vector<float> master;   // fp32 master (main param / HDO inner param)
  std::vector<float> exp_avg;  // empty if the state does not exist yet
  std::vector<float> exp_avg_sq;
  std::optional<double> step;  // the step counter the next update will advance from
  // How many other shards on this rank hold the very same step tensor object (torch AdamW
  // steps are per-param objects; >0 is B9's aliasing).
  int step_aliases = 0;
  // Where a rank holds a TP piece, record.h's capture() gives model_param and param_range in the
  // whole model's params (a row-split shard becomes one snapshot per row) and says where the
  // elements sat in the tensor the kernel updated: element e of param_range is element
  // e - param_range.start + kernel_offset of kernel_numel (-1: param_range's own size).
  int64_t kernel_offset = 0;
  int64_t kernel_numel = -1;
  // A TP rank > 0's copy of a replicated param (TP rank 0 holds the main one).
  bool replica = false;
  // TE's precision-aware FusedAdam only: the dtype each state is stored in ("fp32", "bf16",
  // "fp16", "int16"), for 'exp_avg', 'exp_avg_sq', 'master_param' where it exists; empty for
  // every other part (the trace's optional state_dtypes).
  std::vector<std::pair<std::string, std::string>> state_dtypes;
  // The part of the chained optimizer that holds the shard, where the chain has several (an MoE
  // model: 0 dense, 1 expert; the trace's optional `chain`); nullopt in a chain of one.
  std::optional<int> chain;
};

// Every shard this rank's optimizer updates, in param-group order.
std::vector<ShardSnapshot> snapshot(const model::ChainedOptimizer& opt);

// The step each part used in the last step() (read from the Adams' own records of it), in
// part and group order. REQUIRES: called after opt.step() and before anything else steps.
std::vector<StepUse> step_uses(const model::ChainedOptimizer& opt);

// The optimizer tensors of a shard a state records (sim/record.h).
enum class StateField { kMaster, kExpAvg, kExpAvgSq };

// Elements of one model param's shard on this rank that a load left holding uninitialized
// memory: the load did not write them (LoadReport::unwritten: RX allow_partial_load skipped
// the key, or no saved piece covered them) and the request's tensor there was allocated by
// torch.empty (DistributedOptimizer::state_allocated_by_torch_empty).
struct UninitializedSlice {
  size_t model_param = 0;
  model::Range range;  // of the flattened model param
  StateField field = StateField::kExpAvg;
  std::string why;  // "skipped optimizer key <key>" or "left <key>[a:b] unwritten"
};

// Every such slice of this rank after its load (in the order of `load.unwritten`); empty when
// the request's optimizer state held live values (an HDO after dummy_step(), or state that
// existed before the load) or when the load wrote everything.
std::vector<UninitializedSlice> uninitialized_after_load(const model::ChainedOptimizer& opt,
                                                         const model::DistributedDataParallel& ddp,
                                                         const model::LoadReport& load);

}  // namespace ckptsim::sim
