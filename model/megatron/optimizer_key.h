// The checkpoint keys of the distributed optimizer, in one place: formatted by the model when it
// saves and parsed by whoever reads a checkpoint back (the simulator's records, the checkers).
// Mirrors the f-strings of megatron/core/optimizer/distrib_optimizer.py: sharded_state_dict()
// (`f'optimizer.distributed.dp_group_idx_{data_parallel_group_idx}.{k}'`) and
// sharded_param_state_dp_reshardable() (`...gbuf_idx_{gbuf_idx}.dtype_{dtype}.bucket_idx_{b}`,
// then `.{tensor key}` per state tensor, e.g. `.exp_avg`).
//
// Invariants:
//   1. parse_bucket_key(format_bucket_key(k)) == k for every key (a test checks it), so no
//      reader splits a key by hand.
//   2. Object keys (optimizer.distributed.dp_group_idx_G.<name>) never parse as bucket keys.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ckptsim::model {

// The prefix every distributed-optimizer key starts with.
inline constexpr std::string_view kDistributedOptimizerKeyPrefix = "optimizer.distributed.";

// One state tensor of one bucket: optimizer.distributed.dp_group_idx_G.gbuf_idx_g.dtype_D
// .bucket_idx_b.<state>, where D is the buffer's (param dtype, grad dtype) repr.
struct OptimizerBucketKey {
  int64_t dp_group_idx = 0;
  int64_t gbuf_idx = 0;
  std::string dtype;  // "(torch.bfloat16, torch.float32)"
  int64_t bucket_idx = 0;
  std::string state;  // "param", "exp_avg", "exp_avg_sq", ... (empty: the bucket prefix alone)
  bool operator==(const OptimizerBucketKey&) const = default;
};

// The bucket's key without the state part, as upstream's sharded_bucket_key.
std::string format_bucket_prefix(const OptimizerBucketKey& key);
// The whole key: the bucket prefix, '.', the state name.
std::string format_bucket_key(const OptimizerBucketKey& key);
// nullopt when `key` is not a bucket state key of the distributed optimizer.
std::optional<OptimizerBucketKey> parse_bucket_key(std::string_view key);

// optimizer.distributed.dp_group_idx_G.<name>: the ShardedObjects of sharded_state_dict() and
// of sharded_param_state_dp_reshardable() (per_bucket_numel, per_bucket_numel_unpadded).
std::string format_object_key(int64_t dp_group_idx, std::string_view name);

bool is_distributed_optimizer_key(std::string_view key);

// A ChainedOptimizer of several parts (an MoE model's dense and expert parts) prefixes each
// part's keys 'chained_<i>.' in the formats that are not fully reshardable (optimizer.py
// ChainedOptimizer.sharded_state_dict, `add_prefix_for_sharding(..., f'chained_{idx}.')`).
std::string format_chained_prefix(int64_t part);  // "chained_<part>."
struct ChainedKey {
  std::optional<int64_t> part;  // nullopt: the key has no 'chained_<i>.' prefix
  std::string rest;             // the key without it
};
// 'chained_<i>.<rest>' -> {i, rest}; any other key -> {nullopt, key}.
// parse_chained_key(format_chained_prefix(i) + k) == {i, k} for every k (a test checks it).
ChainedKey parse_chained_key(std::string_view key);

// The model-space formats (fully_reshardable, fully_sharded_model_space): one state tensor of one
// model param, f'optimizer.state.{state_key}.{model ShardedTensor key}' (sharded_param_state_
// fully_reshardable). The state key has no dot; the model key may have several.
inline constexpr std::string_view kModelSpaceKeyPrefix = "optimizer.state.";
struct ModelSpaceKey {
  std::string state;      // "param", "exp_avg", "exp_avg_sq" ("fp32_param" in fs_model_space)
  std::string model_key;  // the model param's ShardedTensor key
  bool operator==(const ModelSpaceKey&) const = default;
};
std::string format_model_space_key(const ModelSpaceKey& key);
// nullopt when `key` is not a model-space state key (parse(format(k)) == k, as for buckets).
std::optional<ModelSpaceKey> parse_model_space_key(std::string_view key);

}  // namespace ckptsim::model
