// Checkers of the buffer layout and DP sharding invariants of
// model/megatron/param_and_grad_buffer.h (invariants 1-3 there; spec §15 I1-I2). They live with
// the checkers, apart from the code they check: the model builds layouts, these judge them.
#pragma once

#include <span>

#include "model/megatron/param_and_grad_buffer.h"
#include "model/status.h"

namespace ckptsim::properties {

using model::BucketShard;
using model::BufferLayout;
using model::LayoutOptions;

// Checks invariants 1-3 of the header for `layout` sharded at options.dp_size (the layout is
// expected to have been built with `options`). Returns ok, or a corruption Status whose
// message names the invariant, the bucket/param/rank and the expected vs observed values.
// Never throws for a malformed layout (that is what it is for); throws only when
// options.dp_size is outside [1, kDpSizeMax].
Status check_layout_invariants(const BufferLayout& layout, const LayoutOptions& options);

// Invariant 3 (I2) alone, for externally supplied shards of one bucket (one per rank, rank
// order) — lets a canary feed a tampered shard. REQUIRES: the layout passes invariants 1-2,
// bucket_idx < layout.buckets.size().
Status check_bucket_shards(const BufferLayout& layout, size_t bucket_idx, int64_t dp_size,
                           std::span<const BucketShard> shards);

}  // namespace ckptsim::properties
