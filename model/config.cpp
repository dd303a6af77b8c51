#include "model/config.h"

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

}  // namespace

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
