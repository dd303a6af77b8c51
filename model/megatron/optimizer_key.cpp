#include "model/megatron/optimizer_key.h"

#include <fmt/format.h>

#include <charconv>

namespace ckptsim::model {

namespace {

constexpr std::string_view kGroup = "dp_group_idx_";
constexpr std::string_view kGbuf = ".gbuf_idx_";
constexpr std::string_view kDtype = ".dtype_";
constexpr std::string_view kBucket = ".bucket_idx_";

// Reads a non-negative decimal at the front of `s` and drops it; false when there is none.
bool take_index(std::string_view& s, int64_t& out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc() || end == s.data() || out < 0) return false;
  s.remove_prefix(static_cast<size_t>(end - s.data()));
  return true;
}

bool take(std::string_view& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.remove_prefix(prefix.size());
  return true;
}

}  // namespace

std::string format_bucket_prefix(const OptimizerBucketKey& key) {
  return fmt::format("{}{}{}{}{}{}{}{}{}", kDistributedOptimizerKeyPrefix, kGroup, key.dp_group_idx,
                     kGbuf, key.gbuf_idx, kDtype, key.dtype, kBucket, key.bucket_idx);
}

std::string format_bucket_key(const OptimizerBucketKey& key) {
  return format_bucket_prefix(key) + "." + key.state;
}

std::optional<OptimizerBucketKey> parse_bucket_key(std::string_view key) {
  OptimizerBucketKey out;
  std::string_view s = key;
  if (!take(s, kDistributedOptimizerKeyPrefix) || !take(s, kGroup) ||
      !take_index(s, out.dp_group_idx) || !take(s, kGbuf) || !take_index(s, out.gbuf_idx) ||
      !take(s, kDtype)) {
    return std::nullopt;
  }
  // The dtype is a tuple repr that contains dots ("(torch.bfloat16, torch.float32)"): it ends
  // at the last ".bucket_idx_".
  const size_t bucket = s.rfind(kBucket);
  if (bucket == std::string_view::npos || bucket == 0) return std::nullopt;
  out.dtype = std::string(s.substr(0, bucket));
  s.remove_prefix(bucket + kBucket.size());
  if (!take_index(s, out.bucket_idx) || !take(s, ".") || s.empty()) return std::nullopt;
  out.state = std::string(s);
  return out;
}

std::string format_object_key(int64_t dp_group_idx, std::string_view name) {
  return fmt::format("{}{}{}.{}", kDistributedOptimizerKeyPrefix, kGroup, dp_group_idx, name);
}

bool is_distributed_optimizer_key(std::string_view key) {
  return key.starts_with(kDistributedOptimizerKeyPrefix);
}

std::string format_chained_prefix(int64_t part) { return fmt::format("chained_{}.", part); }

ChainedKey parse_chained_key(std::string_view key) {
  std::string_view s = key;
  int64_t part = -1;
  if (!take(s, "chained_") || !take_index(s, part) || !take(s, "."))
    return {std::nullopt, std::string(key)};
  return {part, std::string(s)};
}

std::string format_model_space_key(const ModelSpaceKey& key) {
  return fmt::format("{}{}.{}", kModelSpaceKeyPrefix, key.state, key.model_key);
}

std::optional<ModelSpaceKey> parse_model_space_key(std::string_view key) {
  std::string_view s = key;
  if (!take(s, kModelSpaceKeyPrefix)) return std::nullopt;
  const size_t dot = s.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == s.size()) return std::nullopt;
  return ModelSpaceKey{std::string(s.substr(0, dot)), std::string(s.substr(dot + 1))};
}

}  // namespace ckptsim::model
