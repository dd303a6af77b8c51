// What a model run is configured with: the params, the optimizer and the buffer layout
// options. Plain data without libtorch, so that scenarios, generators, reports and the CLI can
// carry a configuration without compiling ATen's headers (only model/ turns it into tensors).
//
// Invariants:
//   1. One name table per enum: dtype_name()/parse_dtype() and optimizer_kind_name()/
//      parse_optimizer_kind() are the only places the user-facing names are spelled.
//   2. Defaults are upstream's (OptimizerConfig: torch's Adam defaults; LayoutOptions: one
//      bucket, no 65536 padding).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/kernels/adam_math.h"

namespace ckptsim::model {

// The param dtypes a model can hold (bf16 training: bf16 params, and fp32 ones such as norms).
enum class DType { kBFloat16, kFloat32 };
std::string dtype_name(DType d);                          // "bf16", "fp32"
std::optional<DType> parse_dtype(std::string_view name);  // inverse of dtype_name

// How tensor parallelism splits a param (megatron/core/tensor_parallel/layers.py):
// ColumnParallelLinear's weight (and bias) on dim 0, RowParallelLinear's weight on dim 1, and
// everything else (norms, a row-parallel layer's bias) replicated on every TP rank.
enum class TpSplit { kReplicated, kColumn, kRow };
std::string tp_split_name(TpSplit s);  // "replicated", "column", "row"
std::optional<TpSplit> parse_tp_split(std::string_view name);

struct ParamSpec {
  std::string name;
  int64_t numel = 0;
  DType dtype = DType::kBFloat16;
  double wd_mult = 1.0;  // param group key: weight decay multiplier (0 for biases/norms)
  // Param group key. Upstream's scheduler never reads lr_mult (POST, HEAD and RX alike: its
  // get_lr() reads the group's max_lr and min_lr); a group with lr_mult m is what a config
  // override {lr_mult: m, max_lr: lr * m, min_lr: min_lr * m} gives, which is how the model
  // and the replay runner both build it.
  double lr_mult = 1.0;
  // The global shape (empty: 1-D, {numel}); its product is numel. A row split needs 2 dims.
  std::vector<int64_t> shape{};
  TpSplit tp_split = TpSplit::kReplicated;
  // The transformer layer that holds it: with PP stages, stage s holds layers
  // [s * L / pp, (s + 1) * L / pp) of the L = max(layer) + 1 layers (Megatron's even split;
  // the embedding is a first-stage param, the output layer a last-stage one).
  int64_t layer = 0;
  // An expert param (issue 26): Megatron's `param.allreduce = False`, what an MoE layer's
  // experts get at expert_model_parallel_size > 1. DDP keeps it in its expert buffers on the
  // expert-data-parallel group and get_megatron_optimizer gives it a DistributedOptimizer of its
  // own (the expert part of the chain). Split over EP on dim 0 (expert_split_spec), never over TP
  // (the model has no expert TP).
  bool expert = false;
};

// The dtypes TE's FusedAdam can keep a state in (fused_adam.py name_to_dtype_map): fp32, and
// for a precision-aware optimizer bf16 or fp16 (scaled per tensor by amax / 32752). FP8
// (uint8, a Float8Tensor) is not modeled.
enum class StateDType { kFloat32, kBFloat16, kFloat16 };
std::string state_dtype_name(StateDType d);  // "fp32", "bf16", "fp16"
std::optional<StateDType> parse_state_dtype(std::string_view name);

// The inner optimizer Megatron builds (get_megatron_optimizer): TE FusedAdam when TE/apex is
// installed, torch AdamW when not (HAVE_APEX_OR_TE false), the HybridDeviceOptimizer with
// --optimizer-cpu-offload.
enum class OptimizerKind { kFusedAdam, kTorchAdamW, kHybrid };
std::string optimizer_kind_name(OptimizerKind k);  // "fused_adam", "torch_adamw", "hybrid"
std::optional<OptimizerKind> parse_optimizer_kind(std::string_view name);
// "fused_adam, torch_adamw, hybrid", for messages that list the valid names.
std::string optimizer_kind_names();

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kFusedAdam;
  AdamHyper adam;  // lr, betas, eps, weight_decay (bias_correction on)
  // OptimizerConfig.min_lr: every param group's min_lr (times its lr_mult, see ParamSpec).
  double min_lr = 0.0;
  double offload_fraction = 0.0;               // hybrid only
  bool overlap_cpu_optimizer_d2h_h2d = false;  // hybrid only: one CPU AdamW per param
  // hybrid only: whether Transformer Engine (or apex) is installed where the run happens.
  // Without it Megatron takes its no-TE branches: HAVE_APEX_OR_TE is false (the pure-torch
  // state_dict/load_state_dict), the HDO's GPU part is torch AdamW instead of TE's FusedAdam,
  // and the precision-aware OptimizerConfig (which --optimizer-cpu-offload requires) asks
  // is_te_min_version() about a TE version of None. fused_adam without TE is kind torch_adamw,
  // and torch_adamw is Megatron's optimizer only without TE, so the field is hybrid's alone.
  bool te_installed = true;
  // --use-precision-aware-optimizer (OptimizerConfig.use_precision_aware_optimizer): the
  // distributed optimizer keeps no fp32 main params; TE's FusedAdam holds the master weights
  // (master_weights=True, use_decoupled_grad=True) and its states in the dtypes below. Always on
  // for kind hybrid (Megatron's arguments require it with --optimizer-cpu-offload; the HDO then
  // ignores the dtypes: every state stays fp32, research low-precision-states §2.3). Never with
  // torch_adamw (Megatron without TE raises RuntimeError for it).
  bool precision_aware = false;
  // OptimizerConfig.exp_avg_dtype / exp_avg_sq_dtype (--exp-avg-dtype, --exp-avg-sq-dtype).
  StateDType exp_avg_dtype = StateDType::kFloat32;
  StateDType exp_avg_sq_dtype = StateDType::kFloat32;
  // OptimizerConfig.store_param_remainders as __post_init__ leaves it (upstream's default True,
  // kept where TE >= 2.1): with bf16 params TE keeps each fp32 master as the bf16 param plus an
  // int16 remainder (fused_adam.py; adam.cu AdamFunctorMasterParamRemainder).
  bool store_param_remainders = true;

  // OptimizerConfig.use_precision_aware_optimizer as the job passes it.
  bool uses_precision_aware() const { return precision_aware || kind == OptimizerKind::kHybrid; }
  // Whether TE's FusedAdam holds low-precision states or remainders: precision-aware FusedAdam.
  bool te_precision_aware() const { return precision_aware && kind == OptimizerKind::kFusedAdam; }
};

// The learning-rate and weight-decay schedule: Megatron's arguments (--lr, --min-lr,
// --lr-warmup-init, --lr-warmup-iters, --lr-decay-iters, --lr-decay-style,
// --start-weight-decay, --end-weight-decay, --weight-decay-incr-style, and --train-iters for
// the weight decay's increment), in iterations. get_optimizer_param_scheduler() turns the
// iteration counts into samples (times the global batch size); so does the model.
enum class LrDecayStyle { kConstant, kLinear, kCosine, kInverseSquareRoot };
enum class WdIncrStyle { kConstant, kLinear, kCosine };
std::string lr_decay_style_name(LrDecayStyle s);  // "constant", "linear", "cosine",
                                                  // "inverse-square-root"
std::optional<LrDecayStyle> parse_lr_decay_style(std::string_view name);
std::string wd_incr_style_name(WdIncrStyle s);  // "constant", "linear", "cosine"
std::optional<WdIncrStyle> parse_wd_incr_style(std::string_view name);

struct ScheduleConfig {
  double lr = 1e-3;  // --lr: the scheduler's max_lr and OptimizerConfig.lr
  double min_lr = 0.0;
  double lr_warmup_init = 0.0;
  int64_t lr_warmup_iters = 0;
  int64_t lr_decay_iters = 1;  // REQUIRES: > lr_warmup_iters (upstream asserts it)
  LrDecayStyle lr_decay_style = LrDecayStyle::kConstant;
  double start_wd = 0.0;  // constant increment style: REQUIRES start_wd == end_wd
  double end_wd = 0.0;
  int64_t wd_incr_iters = 1;  // --train-iters
  WdIncrStyle wd_incr_style = WdIncrStyle::kConstant;

  bool operator==(const ScheduleConfig&) const = default;
  // The schedule of a run that only sets --lr and --weight-decay (constant both).
  static ScheduleConfig constant(double lr, double weight_decay);
};

// How a resume treats the scheduler values in the checkpoint: Megatron's
// --override-opt_param-scheduler (the arguments win), --use-checkpoint-opt_param-scheduler
// (the checkpoint wins), or neither (they must agree: _check_and_set asserts).
enum class SchedulerResume { kNeither, kOverride, kUseCheckpoint };
std::string scheduler_resume_name(SchedulerResume r);  // "neither", "override", "use_checkpoint"
std::optional<SchedulerResume> parse_scheduler_resume(std::string_view name);

// The scenario spelling of te_installed: "installed", "absent".
std::string te_presence_name(bool te_installed);
std::optional<bool> parse_te_presence(std::string_view name);

// The distributed optimizer's checkpoint formats (metadata['distrib_optim_sharding_type'], spec
// §7.1): dp_reshardable (bucket space, the default of the training loop), fully_reshardable
// (model space, gathered over DP: --dist-ckpt-optim-fully-reshardable), and the two deprecated
// ones, dp_zero_gather_scatter (one object per DP group, written by DP rank 0) and
// fully_sharded_model_space (the default of a caller that passes no metadata; its ShardedTensors
// carry a flattened_range, which mapping.py refuses at every modeled revision).
enum class ShardingType {
  kDpReshardable,
  kFullyReshardable,
  kDpZeroGatherScatter,
  kFullyShardedModelSpace
};
std::string sharding_type_name(ShardingType t);  // upstream's spelling: "dp_reshardable", ...
std::optional<ShardingType> parse_sharding_type(std::string_view name);
std::string sharding_type_names();  // the four names, for messages
// DistributedOptimizer.checkpoint_fully_reshardable_formats: the formats in model space, which
// a resume at another TP or PP may load (and whose state_dict() stays plain common state).
bool fully_reshardable_format(ShardingType t);

// What the training loop passes to sharded_state_dict() as metadata, and saves as the
// checkpoint's content_metadata: the sharding type and, for fully_reshardable,
// --distrib-optim-fully-reshardable-mem-efficient (gather over Gloo to DP rank 0, which alone
// returns the state, instead of an all-gather to every rank).
struct CheckpointFormat {
  ShardingType sharding_type = ShardingType::kDpReshardable;
  bool mem_efficient = false;
  // metadata['chained_optim_avoid_prefix']: what every save by the training loop writes since
  // 8e9d56d898 (core 0.14), true; false for a checkpoint whose content metadata lacks it (an
  // older one, or one without content metadata: the chained optimizer then prefixes its parts'
  // keys 'chained_<i>.' whatever the sharding type).
  bool chained_optim_avoid_prefix = true;
  bool operator==(const CheckpointFormat&) const = default;
};

// One rank's place in a TP x PP x DP job (parallel_state with the default order
// tp-cp-ep-dp-pp: global rank = tp_rank + tp_size * (dp_rank + dp_size * pp_rank)).
struct ModelParallelRank {
  int64_t tp_size = 1;
  int64_t tp_rank = 0;
  int64_t pp_size = 1;
  int64_t pp_rank = 0;
  // expert_model_parallel_size and this rank's EP rank (tp-cp-ep-dp-pp at TP = PP = 1: rank %
  // ep_size; its expert-DP rank is rank / ep_size).
  int64_t ep_size = 1;
  int64_t ep_rank = 0;
  // The rank in the model-parallel (TP x PP) group: the distributed optimizer's
  // data_parallel_group_idx, `dp_group_idx_<g>` in its bucket keys.
  int64_t data_parallel_group_idx() const { return pp_rank * tp_size + tp_rank; }
  bool operator==(const ModelParallelRank&) const = default;
  // The place of global rank `rank` in a job of these sizes.
  static ModelParallelRank of(int64_t rank, int64_t tp, int64_t pp, int64_t dp, int64_t ep = 1) {
    return {tp, rank % tp, pp, rank / (tp * dp), ep, (rank % (tp * dp)) / tp % ep};
  }
  // How an expert param is split: over EP as a column split over TP would be (the expert part's
  // data_parallel_group_idx is then the EP rank: its rank in the expert TP x EP x PP group).
  ModelParallelRank expert_view() const { return {ep_size, ep_rank, pp_size, pp_rank, 1, 0}; }
};

// An expert param's spec as its EP split sees it: a column split (dim 0) over the EP ranks.
ParamSpec expert_split_spec(const ParamSpec& spec);

// A param's global shape: spec.shape, or {numel}.
std::vector<int64_t> global_shape(const ParamSpec& spec);
// The number of layers the params name (max layer + 1).
int64_t num_layers(const std::vector<ParamSpec>& specs);
// The pipeline stage that holds `spec` when `layers` layers are split over pp_size stages.
// REQUIRES: pp_size divides layers.
int64_t pipeline_stage(const ParamSpec& spec, int64_t layers, int64_t pp_size);
// The dim TP splits (-1: replicated).
int64_t tp_axis(const ParamSpec& spec);
// The piece of the param a TP rank holds: its shape and its offset in the global tensor.
// REQUIRES: tp_size divides the split dim.
std::vector<int64_t> tp_local_shape(const ParamSpec& spec, const ModelParallelRank& mp);
std::vector<int64_t> tp_global_offset(const ParamSpec& spec, const ModelParallelRank& mp);
// The global (row-major, flattened) element of local element `local` of the TP rank's piece.
int64_t tp_global_element(const ParamSpec& spec, const ModelParallelRank& mp, int64_t local);
// The TP piece's elements as runs of the global (flattened) param, in local order: (global
// first element, length). One run, except a row split's at TP > 1: one per row.
std::vector<std::pair<int64_t, int64_t>> tp_element_runs(const ParamSpec& spec,
                                                         const ModelParallelRank& mp);
// The params rank `mp` holds (indices into `specs`, model order) and each as that rank's model
// holds it: numel and shape its TP piece's, everything else as given.
std::vector<size_t> params_of_stage(const std::vector<ParamSpec>& specs,
                                    const ModelParallelRank& mp);
ParamSpec local_param_spec(const ParamSpec& spec, const ModelParallelRank& mp);

// Limits of one DP group and one buffer: exceeding one throws InvariantViolation rather than
// overflowing or hanging.
inline constexpr int64_t kDpSizeMax = 4096;

struct LayoutOptions {
  int64_t dp_size = 1;                           // REQUIRES: 1 <= dp_size <= kDpSizeMax
  std::optional<int64_t> bucket_size;            // nullopt = one bucket (upstream None); else >= 1
  bool pad_buckets_for_high_nccl_busbw = false;  // divisor lcm(dp,128,65536) instead of lcm(dp,128)
};

}  // namespace ckptsim::model
