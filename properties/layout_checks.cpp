#include "properties/layout_checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "model/errors.h"

namespace ckptsim::properties {

using model::bucket_size_divisor;
using model::BucketLayout;
using model::build_bucket_shards;
using model::kBucketEndAlignmentNumel;
using model::kParamStartAlignmentNumel;
using model::pad_to_multiple;
using model::ParamIndex;
using model::Range;

namespace {

Status violation(std::string message) { return Status::corruption(std::move(message)); }

// Invariant 1 (I1) and invariant 2 (structure) of layout.h.
Status check_structure(const BufferLayout& layout, const LayoutOptions& options) {
  const int64_t dp = options.dp_size;
  const int64_t divisor = bucket_size_divisor(options);
  const size_t n = layout.param_index_map.size();
  if (n == 0) return violation("structure: the layout has no params");
  if (layout.buckets.empty()) return violation("structure: the layout has no buckets");

  std::vector<int> bucket_count(n, 0);
  int64_t expected_offset = 0;
  int64_t unpadded_sum = 0;
  for (size_t b = 0; b < layout.buckets.size(); ++b) {
    const BucketLayout& bucket = layout.buckets[b];
    const int64_t S = bucket.numel;
    const int64_t U = bucket.numel_unpadded;
    if (bucket.offset != expected_offset) {
      return violation(
          fmt::format("structure: bucket {} offset expected {} (end of previous "
                      "bucket) observed {}",
                      b, expected_offset, bucket.offset));
    }
    if (S <= 0 || S % dp != 0) {
      return violation(
          fmt::format("I1: bucket {} numel S={} is not a positive multiple of "
                      "dp_size {} (S % dp = {})",
                      b, S, dp, S % dp));
    }
    if (S % kBucketEndAlignmentNumel != 0) {
      return violation(fmt::format("I1: bucket {} numel S={} is not a multiple of {} (S % {} = {})",
                                   b, S, kBucketEndAlignmentNumel, kBucketEndAlignmentNumel,
                                   S % kBucketEndAlignmentNumel));
    }
    if (U <= 0 || U > S) {
      return violation(fmt::format("I1: bucket {} numel_unpadded U={} outside [1, S={}]", b, U, S));
    }
    if (pad_to_multiple(U, divisor) != S) {
      return violation(fmt::format("I1: bucket {} numel expected pad(U={}, {})={} observed S={}", b,
                                   U, divisor, pad_to_multiple(U, divisor), S));
    }
    if (bucket.params.empty())
      return violation(fmt::format("structure: bucket {} has no params", b));

    int64_t expected_start = bucket.offset;
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      const size_t k = bucket.params[j];
      if (k >= n) {
        return violation(
            fmt::format("structure: bucket {} names param {} but the buffer has {}", b, k, n));
      }
      if (++bucket_count[k] > 1) {
        return violation(
            fmt::format("structure: param {} listed in more than one bucket slot "
                        "(again in bucket {})",
                        k, b));
      }
      if (j > 0 && k >= bucket.params[j - 1]) {
        return violation(
            fmt::format("structure: bucket {} lists param {} after param {}; layout "
                        "order must be descending model index",
                        b, k, bucket.params[j - 1]));
      }
      const ParamIndex& index = layout.param_index_map[k];
      if (index.bucket_id != static_cast<int64_t>(b)) {
        return violation(fmt::format("structure: param {} bucket_id expected {} observed {}", k, b,
                                     index.bucket_id));
      }
      if (index.start % kParamStartAlignmentNumel != 0) {
        return violation(
            fmt::format("I1: param {} start {} is not a multiple of {} "
                        "(start % {} = {})",
                        k, index.start, kParamStartAlignmentNumel, kParamStartAlignmentNumel,
                        index.start % kParamStartAlignmentNumel));
      }
      if (index.start != expected_start) {
        return violation(fmt::format("structure: bucket {} param {} start expected {} observed {}",
                                     b, k, expected_start, index.start));
      }
      if (index.end <= index.start) {
        return violation(
            fmt::format("structure: param {} range [{}, {}) is empty", k, index.start, index.end));
      }
      expected_start = pad_to_multiple(index.end, kParamStartAlignmentNumel);
    }
    const int64_t last_end = layout.param_index_map[bucket.params.back()].end;
    if (last_end != bucket.offset + U) {
      return violation(
          fmt::format("structure: bucket {} last param {} end expected offset+U={} "
                      "observed {}",
                      b, bucket.params.back(), bucket.offset + U, last_end));
    }
    expected_offset = bucket.offset + S;
    unpadded_sum += U;
  }
  for (size_t k = 0; k < n; ++k) {
    if (bucket_count[k] != 1) {
      return violation(fmt::format("structure: param {} is in no bucket", k));
    }
  }
  if (layout.numel != expected_offset) {
    return violation(
        fmt::format("structure: buffer numel expected {} (last bucket end) "
                    "observed {}",
                    expected_offset, layout.numel));
  }
  if (layout.numel_unpadded != unpadded_sum) {
    return violation(
        fmt::format("structure: buffer numel_unpadded expected {} (sum of U) "
                    "observed {}",
                    unpadded_sum, layout.numel_unpadded));
  }
  return Status::ok();
}

// True when `pieces` (any order) tile [lo, hi) exactly.
bool tiles(std::vector<Range> pieces, int64_t lo, int64_t hi) {
  std::sort(pieces.begin(), pieces.end(),
            [](const Range& a, const Range& b) { return a.start < b.start; });
  int64_t cursor = lo;
  for (const Range& r : pieces) {
    if (r.start != cursor || r.end <= r.start) return false;
    cursor = r.end;
  }
  return cursor == hi;
}

std::string ranges_repr(const std::vector<Range>& pieces) {
  std::string out = "[";
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i > 0) out += "; ";
    out += pieces[i].repr();
  }
  return out + "]";
}

}  // namespace

Status check_bucket_shards(const BufferLayout& layout, size_t bucket_idx, int64_t dp_size,
                           std::span<const BucketShard> shards) {
  CKPTSIM_CHECK(dp_size >= 1 && dp_size <= model::kDpSizeMax,
                fmt::format("dp_size {} outside [1, {}]", dp_size, model::kDpSizeMax));
  CKPTSIM_CHECK(bucket_idx < layout.buckets.size(),
                fmt::format("bucket_idx {} but the buffer has {} buckets", bucket_idx,
                            layout.buckets.size()));
  const BucketLayout& bucket = layout.buckets[bucket_idx];
  const size_t n = layout.param_index_map.size();
  const size_t b = bucket_idx;
  if (shards.size() != static_cast<size_t>(dp_size)) {
    return violation(
        fmt::format("I2: bucket {} has {} shards for dp_size {}", b, shards.size(), dp_size));
  }
  if (bucket.numel % dp_size != 0) {
    return violation(fmt::format("I1: bucket {} numel {} not divisible by dp_size {}", b,
                                 bucket.numel, dp_size));
  }
  const int64_t L = bucket.numel / dp_size;

  std::vector<std::vector<Range>> param_pieces(n);
  std::vector<std::vector<Range>> world_pieces(n);
  for (int64_t r = 0; r < dp_size; ++r) {
    const BucketShard& shard = shards[static_cast<size_t>(r)];
    const Range expected_world{bucket.offset + r * L,
                               bucket.offset + std::min(bucket.numel, (r + 1) * L)};
    if (shard.world_range != expected_world) {
      return violation(fmt::format("I2: bucket {} rank {} world_range expected {} observed {}", b,
                                   r, expected_world.repr(), shard.world_range.repr()));
    }
    if (shard.local_numel != L) {
      return violation(fmt::format("I2: bucket {} rank {} local_numel expected {} observed {}", b,
                                   r, L, shard.local_numel));
    }
    int64_t prev_local_end = 0;
    std::vector<size_t> seen;
    for (const auto& [k, m] : shard.param_map) {
      const std::string where = fmt::format("bucket {} rank {} param {}", b, r, k);
      if (k >= n) return violation(fmt::format("I2: {}: no such param (buffer has {})", where, n));
      if (std::find(seen.begin(), seen.end(), k) != seen.end()) {
        return violation(fmt::format("I2: {}: appears twice in one param_map", where));
      }
      seen.push_back(k);
      const ParamIndex& index = layout.param_index_map[k];
      if (index.bucket_id != static_cast<int64_t>(b)) {
        return violation(fmt::format("I2: {}: belongs to bucket {}", where, index.bucket_id));
      }
      if (m.gbuf_local.start < prev_local_end) {
        return violation(
            fmt::format("I2: {}: gbuf_local {} starts before the previous entry's "
                        "end {} (entries must be sorted and disjoint)",
                        where, m.gbuf_local.repr(), prev_local_end));
      }
      if (m.gbuf_local.start < 0 || m.gbuf_local.end > L || m.gbuf_local.size() <= 0) {
        return violation(fmt::format("I2: {}: gbuf_local {} not a non-empty sub-range of [0, {})",
                                     where, m.gbuf_local.repr(), L));
      }
      prev_local_end = m.gbuf_local.end;
      const Range expected_gw =
          m.gbuf_local.normalize(m.gbuf_local.start + shard.world_range.start);
      if (m.gbuf_world != expected_gw) {
        return violation(fmt::format("I2: {}: gbuf_world expected {} observed {}", where,
                                     expected_gw.repr(), m.gbuf_world.repr()));
      }
      const Range expected_gwb{m.gbuf_world.start - bucket.offset,
                               m.gbuf_world.end - bucket.offset};
      if (m.gbuf_world_in_bucket != expected_gwb) {
        return violation(fmt::format("I2: {}: gbuf_world_in_bucket expected {} observed {}", where,
                                     expected_gwb.repr(), m.gbuf_world_in_bucket.repr()));
      }
      // The param sub-range is where gbuf_world sits inside the param's [ws, we).
      const Range expected_param = m.gbuf_world.normalize(m.gbuf_world.start - index.start);
      if (m.param != expected_param) {
        return violation(
            fmt::format("I2: {}: param expected {} (gbuf_world minus param start {}) "
                        "observed {}",
                        where, expected_param.repr(), index.start, m.param.repr()));
      }
      param_pieces[k].push_back(m.param);
      world_pieces[k].push_back(m.gbuf_world);
    }
  }
  for (size_t k : bucket.params) {
    if (k >= n) continue;  // reported by the structure check
    const ParamIndex& index = layout.param_index_map[k];
    if (!tiles(param_pieces[k], 0, index.end - index.start)) {
      return violation(
          fmt::format("I2: bucket {} param {}: param ranges over all ranks expected "
                      "to partition [0, {}) observed {}",
                      b, k, index.end - index.start, ranges_repr(param_pieces[k])));
    }
    if (!tiles(world_pieces[k], index.start, index.end)) {
      return violation(
          fmt::format("I2: bucket {} param {}: gbuf_world ranges over all ranks "
                      "expected to partition [{}, {}) observed {}",
                      b, k, index.start, index.end, ranges_repr(world_pieces[k])));
    }
  }
  return Status::ok();
}

Status check_layout_invariants(const BufferLayout& layout, const LayoutOptions& options) {
  Status s = check_structure(layout, options);
  if (!s.is_ok()) return s;
  for (size_t b = 0; b < layout.buckets.size(); ++b) {
    const std::vector<BucketShard> shards = build_bucket_shards(layout, b, options.dp_size);
    s = check_bucket_shards(layout, b, options.dp_size, shards);
    if (!s.is_ok()) return s;
  }
  return Status::ok();
}

}  // namespace ckptsim::properties
