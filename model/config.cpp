#include "model/config.h"

#include <algorithm>

#include <array>
#include <utility>

namespace ckptsim::model {

std::string dtype_name(DType d) { return d == DType::kBFloat16 ? "bf16" : "fp32"; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType d : {DType::kBFloat16, DType::kFloat32}) {
    if (dtype_name(d) == name) return d;
  }
  return std::nullopt;
}

std::string optimizer_kind_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::kFusedAdam:
      return "fused_adam";
    case OptimizerKind::kTorchAdamW:
      return "torch_adamw";
    case OptimizerKind::kHybrid:
      return "hybrid";
  }
  return "?";
}

namespace {
constexpr OptimizerKind kAllKinds[] = {OptimizerKind::kFusedAdam, OptimizerKind::kTorchAdamW,
                                       OptimizerKind::kHybrid};
}  // namespace

std::optional<OptimizerKind> parse_optimizer_kind(std::string_view name) {
  for (OptimizerKind k : kAllKinds) {
    if (optimizer_kind_name(k) == name) return k;
  }
  return std::nullopt;
}

std::string optimizer_kind_names() {
  std::string out;
  for (OptimizerKind k : kAllKinds) out += (out.empty() ? "" : ", ") + optimizer_kind_name(k);
  return out;
}

bool fully_reshardable_format(ShardingType t) {
  return t == ShardingType::kFullyReshardable || t == ShardingType::kFullyShardedModelSpace;
}

namespace {

// One name table per enum (invariant 1): the enum's values and their names, in order.
template <typename E, size_t N>
std::optional<E> parse_named(const std::array<std::pair<E, const char*>, N>& table,
                             std::string_view name) {
  for (const auto& [value, text] : table) {
    if (name == text) return value;
  }
  return std::nullopt;
}
template <typename E, size_t N>
std::string name_of(const std::array<std::pair<E, const char*>, N>& table, E value) {
  for (const auto& [v, text] : table) {
    if (v == value) return text;
  }
  return "?";
}

constexpr std::array<std::pair<LrDecayStyle, const char*>, 4> kLrDecayStyles = {{
    {LrDecayStyle::kConstant, "constant"},
    {LrDecayStyle::kLinear, "linear"},
    {LrDecayStyle::kCosine, "cosine"},
    {LrDecayStyle::kInverseSquareRoot, "inverse-square-root"},
}};
constexpr std::array<std::pair<WdIncrStyle, const char*>, 3> kWdIncrStyles = {{
    {WdIncrStyle::kConstant, "constant"},
    {WdIncrStyle::kLinear, "linear"},
    {WdIncrStyle::kCosine, "cosine"},
}};
constexpr std::array<std::pair<SchedulerResume, const char*>, 3> kSchedulerResumes = {{
    {SchedulerResume::kNeither, "neither"},
    {SchedulerResume::kOverride, "override"},
    {SchedulerResume::kUseCheckpoint, "use_checkpoint"},
}};

constexpr std::array<std::pair<ShardingType, const char*>, 4> kShardingTypes = {{
    {ShardingType::kDpReshardable, "dp_reshardable"},
    {ShardingType::kFullyReshardable, "fully_reshardable"},
    {ShardingType::kDpZeroGatherScatter, "dp_zero_gather_scatter"},
    {ShardingType::kFullyShardedModelSpace, "fully_sharded_model_space"},
}};

constexpr std::array<std::pair<StateDType, const char*>, 3> kStateDTypes = {{
    {StateDType::kFloat32, "fp32"},
    {StateDType::kBFloat16, "bf16"},
    {StateDType::kFloat16, "fp16"},
}};

constexpr std::array<std::pair<TpSplit, const char*>, 3> kTpSplits = {{
    {TpSplit::kReplicated, "replicated"},
    {TpSplit::kColumn, "column"},
    {TpSplit::kRow, "row"},
}};

}  // namespace

std::string state_dtype_name(StateDType d) { return name_of(kStateDTypes, d); }
std::optional<StateDType> parse_state_dtype(std::string_view name) {
  return parse_named(kStateDTypes, name);
}

std::string tp_split_name(TpSplit s) { return name_of(kTpSplits, s); }
std::optional<TpSplit> parse_tp_split(std::string_view name) {
  return parse_named(kTpSplits, name);
}

std::vector<int64_t> global_shape(const ParamSpec& spec) {
  return spec.shape.empty() ? std::vector<int64_t>{spec.numel} : spec.shape;
}

int64_t num_layers(const std::vector<ParamSpec>& specs) {
  int64_t layers = 1;
  for (const ParamSpec& p : specs) layers = std::max(layers, p.layer + 1);
  return layers;
}

int64_t pipeline_stage(const ParamSpec& spec, int64_t layers, int64_t pp_size) {
  return spec.layer / (layers / pp_size);
}

int64_t tp_axis(const ParamSpec& spec) {
  switch (spec.tp_split) {
    case TpSplit::kColumn:
      return 0;
    case TpSplit::kRow:
      return 1;
    case TpSplit::kReplicated:
      break;
  }
  return -1;
}

std::vector<int64_t> tp_local_shape(const ParamSpec& spec, const ModelParallelRank& mp) {
  std::vector<int64_t> shape = global_shape(spec);
  const int64_t axis = tp_axis(spec);
  if (axis >= 0) shape.at(static_cast<size_t>(axis)) /= mp.tp_size;
  return shape;
}

std::vector<int64_t> tp_global_offset(const ParamSpec& spec, const ModelParallelRank& mp) {
  const std::vector<int64_t> local = tp_local_shape(spec, mp);
  std::vector<int64_t> offset(local.size(), 0);
  const int64_t axis = tp_axis(spec);
  if (axis >= 0)
    offset.at(static_cast<size_t>(axis)) = mp.tp_rank * local[static_cast<size_t>(axis)];
  return offset;
}

int64_t tp_global_element(const ParamSpec& spec, const ModelParallelRank& mp, int64_t local) {
  const std::vector<int64_t> global = global_shape(spec);
  const std::vector<int64_t> shape = tp_local_shape(spec, mp);
  const std::vector<int64_t> offset = tp_global_offset(spec, mp);
  // Row-major: unravel in the local shape, shift by the offset, ravel in the global shape.
  int64_t element = 0;
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    const int64_t index = local % shape[d] + offset[d];
    local /= shape[d];
    element += index * stride;
    stride *= global[d];
  }
  return element;
}

std::vector<std::pair<int64_t, int64_t>> tp_element_runs(const ParamSpec& spec,
                                                         const ModelParallelRank& mp) {
  const std::vector<int64_t> global = global_shape(spec);
  if (spec.tp_split == TpSplit::kRow && mp.tp_size > 1) {
    const int64_t cols = global.at(1) / mp.tp_size;
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (int64_t r = 0; r < global.at(0); ++r)
      runs.emplace_back(r * global[1] + mp.tp_rank * cols, cols);
    return runs;
  }
  if (spec.tp_split == TpSplit::kColumn) {
    const int64_t piece = spec.numel / mp.tp_size;
    return {{mp.tp_rank * piece, piece}};
  }
  return {{0, spec.numel}};
}

std::vector<size_t> params_of_stage(const std::vector<ParamSpec>& specs,
                                    const ModelParallelRank& mp) {
  const int64_t layers = num_layers(specs);
  std::vector<size_t> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (pipeline_stage(specs[i], layers, mp.pp_size) == mp.pp_rank) out.push_back(i);
  }
  return out;
}

ParamSpec expert_split_spec(const ParamSpec& spec) {
  ParamSpec out = spec;
  out.tp_split = TpSplit::kColumn;
  return out;
}

ParamSpec local_param_spec(const ParamSpec& spec, const ModelParallelRank& mp) {
  ParamSpec local = spec;
  local.shape = tp_local_shape(spec, mp);
  local.numel = 1;
  for (const int64_t d : local.shape) local.numel *= d;
  return local;
}

std::string sharding_type_name(ShardingType t) { return name_of(kShardingTypes, t); }
std::optional<ShardingType> parse_sharding_type(std::string_view name) {
  return parse_named(kShardingTypes, name);
}
std::string sharding_type_names() {
  std::string out;
  for (const auto& [t, text] : kShardingTypes) out += (out.empty() ? "" : ", ") + std::string(text);
  return out;
}

std::string lr_decay_style_name(LrDecayStyle s) { return name_of(kLrDecayStyles, s); }
std::optional<LrDecayStyle> parse_lr_decay_style(std::string_view name) {
  return parse_named(kLrDecayStyles, name);
}
std::string wd_incr_style_name(WdIncrStyle s) { return name_of(kWdIncrStyles, s); }
std::optional<WdIncrStyle> parse_wd_incr_style(std::string_view name) {
  return parse_named(kWdIncrStyles, name);
}
std::string scheduler_resume_name(SchedulerResume r) { return name_of(kSchedulerResumes, r); }
std::optional<SchedulerResume> parse_scheduler_resume(std::string_view name) {
  return parse_named(kSchedulerResumes, name);
}

ScheduleConfig ScheduleConfig::constant(double lr, double weight_decay) {
  ScheduleConfig c;
  c.lr = lr;
  c.start_wd = weight_decay;
  c.end_wd = weight_decay;
  return c;
}

std::string te_presence_name(bool te_installed) { return te_installed ? "installed" : "absent"; }

std::optional<bool> parse_te_presence(std::string_view name) {
  if (name == "installed") return true;
  if (name == "absent") return false;
  return std::nullopt;
}

}  // namespace ckptsim::model
