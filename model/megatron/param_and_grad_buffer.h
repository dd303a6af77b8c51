// The param/grad buffer layout of one _ParamAndGradBuffer and its DP sharding, with the
// distributed optimizer on (spec §2.1-2.3, invariants §15 I1-I2).
// Mirrors megatron/core/distributed/param_and_grad_buffer.py _ParamAndGradBuffer.__init__
// (the index arithmetic only, POST lines 586-893) and the range maps of
// megatron/core/optimizer/distrib_optimizer.py (Range, _build_model_gbuf_param_range_map,
// _build_model_gbuf_range).
//
// A buffer is a flat array of `numel` elements. The params (given in model order) are laid
// out in *reverse* model order, each param start padded to a multiple of 64 elements. The
// buffer is cut into buckets; a bucket closes after the param whose end reaches `bucket_size`
// elements past the bucket start, and its end is padded to a multiple of the bucket divisor
// lcm(dp, 128) (lcm(dp, 128, 65536) with pad_buckets_for_high_nccl_busbw). Each bucket is
// then split into dp equal shards of L = S / dp elements; rank r owns
// [O + r*L, O + (r+1)*L) and, for every param intersecting it, a ParamRangeMap.
//
// Invariants (properties/layout_checks.h checks all of them and names the culprit):
//   1. (I1) For each bucket: S % dp == 0, S % 128 == 0, U <= S, S == pad(U, divisor);
//      every param start is a multiple of 64.
//   2. (structure) Buckets are contiguous from offset 0; buffer numel is the last bucket's
//      end and a multiple of dp; buffer numel_unpadded is the sum of the buckets' U. A
//      bucket's params, in ascending offset, are its inputs in descending model index; the
//      first starts at the bucket offset, each next one at pad(prev end, 64), and the last
//      one ends at offset + U. Every param is in exactly one bucket, the one its
//      ParamIndex names.
//   3. (I2) For each bucket and rank, param_map entries are sorted by gbuf_local.start and
//      disjoint, lie inside [0, L), and their four ranges agree (same size; gbuf_world =
//      gbuf_local + rank start; gbuf_world_in_bucket = gbuf_world - O). For each param, the
//      `param` ranges over all ranks partition [0, numel(P)) and the `gbuf_world` ranges
//      partition [ws, we).
//   4. A bucket's U, its param set and the params' offsets relative to the bucket start do
//      not depend on dp or on the padding option for a fixed bucket_size: every bucket
//      starts at a multiple of 128 (hence of 64), so its inner layout and its closing
//      decision are the same at every dp. (U changes with dp only through DDP's default
//      bucket_size = max(4e7, 1e6 * dp); that choice is the caller's, not this file's.)
//
// Not modeled: the shared-embedding rule (_does_param_require_new_bucket: a param with
// `shared_embedding` gets a bucket of its own), which only applies to the tied embedding on
// the first/last pipeline stage; the non-distributed-optimizer path (no padding at all); and
// buffer storage, MXFP8 sharing, NCCL user buffers. Only offsets and sizes are modeled.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/status.h"

namespace ckptsim::model {

// Limits: exceeding one throws InvariantViolation rather than overflowing or hanging.
// (kDpSizeMax is in model/config.h, beside LayoutOptions.)
inline constexpr size_t kParamsPerBufferMax = 65536;
// Per param and for the whole padded buffer. 2^40 keeps every sum of kParamsPerBufferMax
// params plus padding far from int64 overflow.
inline constexpr int64_t kBufferNumelMax = int64_t{1} << 40;

// Upstream's alignment constants (param_and_grad_buffer.py _pad_start_of_param_if_needed,
// _pad_end_of_bucket_if_needed).
inline constexpr int64_t kParamStartAlignmentNumel = 64;
inline constexpr int64_t kBucketEndAlignmentNumel = 128;
inline constexpr int64_t kHighNcclBusbwAlignmentNumel = int64_t{1} << 16;

// Mirrors distrib_optimizer.py Range: [start, end).
struct Range {
  int64_t start = 0;
  int64_t end = 0;

  int64_t size() const { return end - start; }
  // Mirrors Range.normalize(): the same size, moved to begin at new_start.
  Range normalize(int64_t new_start = 0) const { return Range{new_start, new_start + size()}; }
  bool operator==(const Range&) const = default;
  // Upstream's Range.__str__: "start,end [size]".
  std::string repr() const;
};

// ceil(x / divisor) * divisor, upstream's _pad(). REQUIRES: x >= 0, divisor >= 1.
int64_t pad_to_multiple(int64_t x, int64_t divisor);

// The bucket end divisor: lcm(dp, 128), or lcm(dp, 128, 65536) with the NCCL busbw option.
// REQUIRES: options.dp_size in [1, kDpSizeMax].
int64_t bucket_size_divisor(const LayoutOptions& options);

// Absolute offsets of one param in its buffer (param_index_map value).
struct ParamIndex {
  int64_t start;
  int64_t end;
  int64_t bucket_id;
  bool operator==(const ParamIndex&) const = default;
};

struct BucketLayout {
  int64_t offset;          // bucket start in the buffer (bucket.offset)
  int64_t numel;           // padded size S (bucket.grad_data.numel())
  int64_t numel_unpadded;  // U: includes intra-bucket 64-alignment gaps, excludes end padding
  // Indices into the buffer's params, in layout (ascending offset) order.
  std::vector<size_t> params;
};

// One _ParamAndGradBuffer's layout. Params are given in model (named_parameters) order; the
// layout walks them reversed, as upstream does, so param_index_map[0] has the highest offset.
struct BufferLayout {
  std::vector<ParamIndex> param_index_map;  // indexed like the input params
  std::vector<BucketLayout> buckets;
  int64_t numel = 0;           // last bucket end; multiple of dp_size
  int64_t numel_unpadded = 0;  // sum of bucket numel_unpadded
};

// Mirrors param_and_grad_buffer.py _ParamAndGradBuffer.__init__ (layout part).
// REQUIRES: 1 <= param_numels.size() <= kParamsPerBufferMax; every numel in [1, kBufferNumelMax];
// valid options (see LayoutOptions); the padded buffer numel <= kBufferNumelMax.
// Throws InvariantViolation otherwise.
BufferLayout build_buffer_layout(std::span<const int64_t> param_numels,
                                 const LayoutOptions& options);

// The layout options a pipeline stage's buffers are built with: DistributedDataParallel.__init__
// turns bucketing off (bucket_size None: one bucket per buffer) on every stage but the first
// ("pp_rank > 0", at every revision profiled).
LayoutOptions stage_layout_options(LayoutOptions options, int64_t pp_rank);

// Mirrors distrib_optimizer.py _build_model_gbuf_param_range_map's per-param dict.
struct ParamRangeMap {
  Range gbuf_local;            // inside this rank's shard, [0, L)
  Range gbuf_world;            // absolute in the buffer
  Range gbuf_world_in_bucket;  // gbuf_world - bucket offset
  Range param;                 // sub-range of the flattened param
  bool operator==(const ParamRangeMap&) const = default;
};

// One rank's shard of one bucket: _build_model_gbuf_range for (bucket, dp_rank).
struct BucketShard {
  Range world_range;    // absolute [O + r*L, O + min(S, (r+1)L))
  int64_t local_numel;  // L = S / dp_size ("max_gbuf_range_size" upstream)
  // (param index into the buffer's params, its range map), ascending gbuf_local.start; only
  // params that intersect this rank's range. May be empty (the rank owns only padding): the
  // dp_reshardable save then asserts 'empty bucket encountered' (spec §7.3).
  std::vector<std::pair<size_t, ParamRangeMap>> param_map;
};

// Mirrors distrib_optimizer.py _build_model_gbuf_range (with
// _build_model_gbuf_param_range_map). Like upstream, every param of the buffer is tested
// against the rank's range, not just the bucket's own.
// REQUIRES: bucket_idx < layout.buckets.size(); 1 <= dp_size <= kDpSizeMax;
// 0 <= dp_rank < dp_size; the bucket's numel % dp_size == 0 (upstream asserts it; with a
// layout built at this dp it always holds, so a failure is a ckptsim bug).
BucketShard build_bucket_shard(const BufferLayout& layout, size_t bucket_idx, int64_t dp_rank,
                               int64_t dp_size);

// build_bucket_shard for every rank 0..dp_size-1, in rank order. Same REQUIRES.
std::vector<BucketShard> build_bucket_shards(const BufferLayout& layout, size_t bucket_idx,
                                             int64_t dp_size);

}  // namespace ckptsim::model
