#include "model/config.h"

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

std::string te_presence_name(bool te_installed) { return te_installed ? "installed" : "absent"; }

std::optional<bool> parse_te_presence(std::string_view name) {
  if (name == "installed") return true;
  if (name == "absent") return false;
  return std::nullopt;
}

}  // namespace ckptsim::model
