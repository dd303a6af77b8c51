#include "model/megatron/param_and_grad_buffer.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "model/errors.h"

namespace ckptsim::model {

std::string Range::repr() const { return fmt::format("{},{} [{}]", start, end, size()); }

int64_t pad_to_multiple(int64_t x, int64_t divisor) {
  CKPTSIM_CHECK(x >= 0, fmt::format("pad_to_multiple of a negative value {}", x));
  CKPTSIM_CHECK(divisor >= 1, fmt::format("pad_to_multiple by a non-positive divisor {}", divisor));
  // Upstream pads with math.ceil(x / divisor) in float64; integer arithmetic gives the same
  // result for every x < 2^53, which kBufferNumelMax guarantees.
  return (x + divisor - 1) / divisor * divisor;
}

namespace {

void check_dp_size(int64_t dp_size) {
  CKPTSIM_CHECK(dp_size >= 1 && dp_size <= kDpSizeMax,
                fmt::format("dp_size {} outside [1, {}]", dp_size, kDpSizeMax));
}

}  // namespace

int64_t bucket_size_divisor(const LayoutOptions& options) {
  check_dp_size(options.dp_size);
  int64_t divisor = std::lcm(options.dp_size, kBucketEndAlignmentNumel);
  if (options.pad_buckets_for_high_nccl_busbw) {
    divisor = std::lcm(divisor, kHighNcclBusbwAlignmentNumel);
  }
  return divisor;
}

LayoutOptions stage_layout_options(LayoutOptions options, int64_t pp_rank) {
  if (pp_rank > 0) options.bucket_size.reset();
  return options;
}

BufferLayout build_buffer_layout(std::span<const int64_t> param_numels,
                                 const LayoutOptions& options) {
  const int64_t divisor = bucket_size_divisor(options);
  CKPTSIM_CHECK(!options.bucket_size.has_value() || *options.bucket_size >= 1,
                fmt::format("bucket_size {} is not positive", options.bucket_size.value_or(0)));
  CKPTSIM_CHECK(!param_numels.empty(), "a buffer must not be built without params");
  CKPTSIM_CHECK(param_numels.size() <= kParamsPerBufferMax,
                fmt::format("{} params in one buffer exceed kParamsPerBufferMax={}",
                            param_numels.size(), kParamsPerBufferMax));
  for (size_t i = 0; i < param_numels.size(); ++i) {
    CKPTSIM_CHECK(
        param_numels[i] >= 1 && param_numels[i] <= kBufferNumelMax,
        fmt::format("param {} numel {} outside [1, {}]", i, param_numels[i], kBufferNumelMax));
  }

  BufferLayout layout;
  layout.param_index_map.resize(param_numels.size());
  int64_t bucket_start = 0;
  std::vector<size_t> bucket_params;

  // Mirrors _update_bucket_metadata(): U counts everything from the bucket start to the
  // closing param's end (alignment gaps included); only the end padding is excluded.
  auto close_bucket = [&](int64_t param_end) -> int64_t {
    const int64_t bucket_end = pad_to_multiple(param_end, divisor);
    layout.buckets.push_back(BucketLayout{.offset = bucket_start,
                                          .numel = bucket_end - bucket_start,
                                          .numel_unpadded = param_end - bucket_start,
                                          .params = std::move(bucket_params)});
    bucket_params.clear();
    bucket_start = bucket_end;
    return bucket_end;
  };

  // Reverse model order, as upstream, to roughly follow backprop order.
  int64_t param_start = 0;
  int64_t param_end = 0;
  for (size_t k = param_numels.size(); k-- > 0;) {
    param_start = pad_to_multiple(param_start, kParamStartAlignmentNumel);
    param_end = param_start + param_numels[k];
    layout.param_index_map[k] =
        ParamIndex{.start = param_start,
                   .end = param_end,
                   .bucket_id = static_cast<int64_t>(layout.buckets.size())};
    bucket_params.push_back(k);
    if (options.bucket_size.has_value() && param_end - bucket_start >= *options.bucket_size) {
      param_start = close_bucket(param_end);
    } else {
      param_start = param_end;
    }
  }
  if (!bucket_params.empty()) close_bucket(param_end);

  layout.numel = bucket_start;
  for (const BucketLayout& b : layout.buckets) layout.numel_unpadded += b.numel_unpadded;
  CKPTSIM_CHECK(
      layout.numel <= kBufferNumelMax,
      fmt::format("buffer numel {} exceeds kBufferNumelMax={}", layout.numel, kBufferNumelMax));
  // Upstream asserts both right after the loop.
  CKPTSIM_CHECK(
      layout.numel_unpadded <= layout.numel,
      fmt::format("buffer numel_unpadded {} > numel {}", layout.numel_unpadded, layout.numel));
  CKPTSIM_CHECK(
      layout.numel % options.dp_size == 0,
      fmt::format("buffer numel {} not a multiple of dp_size {}", layout.numel, options.dp_size));
  return layout;
}

BucketShard build_bucket_shard(const BufferLayout& layout, size_t bucket_idx, int64_t dp_rank,
                               int64_t dp_size) {
  check_dp_size(dp_size);
  CKPTSIM_CHECK(dp_rank >= 0 && dp_rank < dp_size,
                fmt::format("dp_rank {} outside [0, {})", dp_rank, dp_size));
  CKPTSIM_CHECK(bucket_idx < layout.buckets.size(),
                fmt::format("bucket_idx {} but the buffer has {} buckets", bucket_idx,
                            layout.buckets.size()));
  const BucketLayout& bucket = layout.buckets[bucket_idx];
  // Upstream asserts this ("Each bucket's buffer size should be divisible by ..."); it holds
  // for any layout built at this dp, so a failure means ckptsim paired a layout with the
  // wrong dp.
  CKPTSIM_CHECK(bucket.numel % dp_size == 0,
                fmt::format("bucket {} numel {} not divisible by dp_size {}", bucket_idx,
                            bucket.numel, dp_size));

  BucketShard shard;
  shard.local_numel = bucket.numel / dp_size;
  const int64_t shard_start = dp_rank * shard.local_numel;
  const int64_t shard_end = std::min(bucket.numel, shard_start + shard.local_numel);
  shard.world_range = Range{bucket.offset + shard_start, bucket.offset + shard_end};
  const Range& world = shard.world_range;

  // Upstream walks the whole buffer's param_index_map in insertion order, which is reverse
  // model order (= ascending offset); params of other buckets never intersect.
  for (size_t k = layout.param_index_map.size(); k-- > 0;) {
    const ParamIndex& index = layout.param_index_map[k];
    const int64_t local_start = std::max<int64_t>(0, index.start - world.start);
    const int64_t local_end = std::min(world.size(), index.end - world.start);
    if (local_end <= local_start) continue;
    ParamRangeMap m;
    m.gbuf_local = Range{local_start, local_end};
    m.gbuf_world = m.gbuf_local.normalize(local_start + world.start);
    m.gbuf_world_in_bucket =
        Range{m.gbuf_world.start - bucket.offset, m.gbuf_world.end - bucket.offset};
    m.param = m.gbuf_local.normalize(std::max<int64_t>(0, world.start - index.start));
    shard.param_map.emplace_back(k, m);
  }
  return shard;
}

std::vector<BucketShard> build_bucket_shards(const BufferLayout& layout, size_t bucket_idx,
                                             int64_t dp_size) {
  check_dp_size(dp_size);
  std::vector<BucketShard> shards;
  shards.reserve(static_cast<size_t>(dp_size));
  for (int64_t r = 0; r < dp_size; ++r) {
    shards.push_back(build_bucket_shard(layout, bucket_idx, r, dp_size));
  }
  return shards;
}

}  // namespace ckptsim::model
