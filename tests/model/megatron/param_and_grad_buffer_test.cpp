// Tests of model/megatron/param_and_grad_buffer.h: buffer layout, buckets, padding and DP sharding
// (spec §2, §15 I1-I2).
//
// Every expected value below was written by hand from the spec (§2.1 pseudocode, §2.3 table)
// and the arithmetic shown in the comments, never printed from the code under test.
//
// Mutations of param_and_grad_buffer.cpp (and of properties/layout_checks.cpp), all tried locally
// (then reverted), and the tests that failed:
//   - param start not padded to 64: LayoutGolden.*, LayoutMultiBucket.FourParamsTwoBuckets,
//       LayoutDpNotDividing128.*, LayoutHighNcclBusbw.*, LayoutProperty.* (and canaries whose
//       untampered baseline changed).
//   - params walked in model order instead of reversed: LayoutGolden.*, LayoutMultiBucket.*,
//       LayoutDpNotDividing128.*, LayoutHighNcclBusbw.*, LayoutProperty.*.
//   - bucket divisor 128 instead of lcm(dp,128): LayoutPad.DivisorAndPad,
//       LayoutDpNotDividing128.*, LayoutHighNcclBusbw.MultiBucketDp24, LayoutProperty.*.
//   - the 65536 option ignored: LayoutPad.DivisorAndPad, LayoutHighNcclBusbw.*,
//       LayoutProperty.Invariants (through the divisor it recomputes itself).
//   - closing test `>=` replaced by `>`: LayoutMultiBucket.ClosesWhenReachingBucketSize.
//   - U measured to the padded bucket end instead of the param end: LayoutGolden.*,
//       LayoutMultiBucket.*, LayoutDpNotDividing128.*, LayoutHighNcclBusbw.*, LayoutProperty.*.
//   - the `param` sub-range taken as gbuf_local instead of starting at max(0, G.start - ws):
//       LayoutGolden.*, LayoutMultiBucket.FourParamsTwoBuckets, LayoutDpNotDividing128.*,
//       LayoutHighNcclBusbw.*, LayoutProperty.Invariants, LayoutCanary.TamperedShards.
//   - check_layout_invariants always ok (vacuous checker): LayoutCanary.{StartShiftedByOne,
//       AlignmentDropped, LayoutCheckedAtWrongDp, UnpaddedSizeWrong,
//       ModelOrderInsteadOfReversed}, LayoutHighNcclBusbw.WorkedExampleDp2.
#include "model/megatron/param_and_grad_buffer.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/errors.h"
#include "properties/layout_checks.h"

namespace ckptsim::model {
namespace {

// The checkers of properties/ are the oracle for every layout built here.
using properties::check_bucket_shards;
using properties::check_layout_invariants;

LayoutOptions opts(int64_t dp_size, std::optional<int64_t> bucket_size = std::nullopt,
                   bool pad_buckets_for_high_nccl_busbw = false) {
  LayoutOptions o;
  o.dp_size = dp_size;
  o.bucket_size = bucket_size;
  o.pad_buckets_for_high_nccl_busbw = pad_buckets_for_high_nccl_busbw;
  return o;
}

// Spec §2.3: params = [A(100), B(30), C(200)] in model order; indices A=0, B=1, C=2.
constexpr size_t kA = 0, kB = 1, kC = 2;
const std::vector<int64_t> kWorkedExample = {100, 30, 200};

// One expected param_map entry, written out in full.
struct Piece {
  size_t param;
  Range local;
  Range world;
  Range param_range;
};

// Bucket offset is 0 in the worked example, so gbuf_world_in_bucket == gbuf_world there;
// `offset` lets multi-bucket tests use the same helper.
void expect_shard(const BufferLayout& layout, size_t bucket, int64_t rank, int64_t dp, Range world,
                  int64_t local_numel, const std::vector<Piece>& pieces, int64_t offset = 0) {
  SCOPED_TRACE("bucket " + std::to_string(bucket) + " rank " + std::to_string(rank) + " dp " +
               std::to_string(dp));
  const BucketShard shard = build_bucket_shard(layout, bucket, rank, dp);
  EXPECT_EQ(shard.world_range, world) << shard.world_range.repr();
  EXPECT_EQ(shard.local_numel, local_numel);
  ASSERT_EQ(shard.param_map.size(), pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    SCOPED_TRACE("entry " + std::to_string(i));
    const auto& [k, m] = shard.param_map[i];
    EXPECT_EQ(k, pieces[i].param);
    EXPECT_EQ(m.gbuf_local, pieces[i].local) << m.gbuf_local.repr();
    EXPECT_EQ(m.gbuf_world, pieces[i].world) << m.gbuf_world.repr();
    const Range in_bucket{pieces[i].world.start - offset, pieces[i].world.end - offset};
    EXPECT_EQ(m.gbuf_world_in_bucket, in_bucket) << m.gbuf_world_in_bucket.repr();
    EXPECT_EQ(m.param, pieces[i].param_range) << m.param.repr();
  }
}

// The worked-example layout is the same at dp 1, 2, 4, 8 (divisor 128 in all four).
void expect_worked_example_layout(const BufferLayout& layout, int64_t S) {
  // Reversed: C=[0,200); B at pad64(200)=256 -> [256,286); A at pad64(286)=320 -> [320,420).
  ASSERT_EQ(layout.param_index_map.size(), 3u);
  EXPECT_EQ(layout.param_index_map[kC], (ParamIndex{0, 200, 0}));
  EXPECT_EQ(layout.param_index_map[kB], (ParamIndex{256, 286, 0}));
  EXPECT_EQ(layout.param_index_map[kA], (ParamIndex{320, 420, 0}));
  ASSERT_EQ(layout.buckets.size(), 1u);
  EXPECT_EQ(layout.buckets[0].offset, 0);
  EXPECT_EQ(layout.buckets[0].numel, S);
  EXPECT_EQ(layout.buckets[0].numel_unpadded, 420);
  EXPECT_EQ(layout.buckets[0].params, (std::vector<size_t>{kC, kB, kA}));
  EXPECT_EQ(layout.numel, S);
  EXPECT_EQ(layout.numel_unpadded, 420);
}

TEST(LayoutRange, ReprAndNormalize) {
  EXPECT_EQ((Range{3, 10}).repr(), "3,10 [7]");
  EXPECT_EQ((Range{3, 10}).size(), 7);
  EXPECT_EQ((Range{3, 10}).normalize(100), (Range{100, 107}));
  EXPECT_EQ((Range{3, 10}).normalize(), (Range{0, 7}));
}

TEST(LayoutPad, DivisorAndPad) {
  EXPECT_EQ(pad_to_multiple(0, 64), 0);
  EXPECT_EQ(pad_to_multiple(1, 64), 64);
  EXPECT_EQ(pad_to_multiple(64, 64), 64);
  EXPECT_EQ(pad_to_multiple(65, 64), 128);
  EXPECT_EQ(bucket_size_divisor(opts(1)), 128);
  EXPECT_EQ(bucket_size_divisor(opts(8)), 128);
  EXPECT_EQ(bucket_size_divisor(opts(3)), 384);   // 3 * 128
  EXPECT_EQ(bucket_size_divisor(opts(24)), 384);  // 3 * 8 and 2^7
  EXPECT_EQ(bucket_size_divisor(opts(256)), 256);
  EXPECT_EQ(bucket_size_divisor(opts(2, std::nullopt, true)), 65536);
  EXPECT_EQ(bucket_size_divisor(opts(24, std::nullopt, true)), 3 * 65536);
}

// §2.3 table, dp=1: S=512, L=512; r0 owns C, B, A with their gaps; [420,512) is end padding.
TEST(LayoutGolden, Dp1) {
  const BufferLayout layout = build_buffer_layout(kWorkedExample, opts(1));
  expect_worked_example_layout(layout, 512);
  expect_shard(layout, 0, 0, 1, {0, 512}, 512,
               {{kC, {0, 200}, {0, 200}, {0, 200}},
                {kB, {256, 286}, {256, 286}, {0, 30}},
                {kA, {320, 420}, {320, 420}, {0, 100}}});
  EXPECT_TRUE(check_layout_invariants(layout, opts(1)).is_ok());
}

// dp=2: L=256. r0: C local[0,200). r1 [256,512): B local[0,30), A local[64,164).
TEST(LayoutGolden, Dp2) {
  const BufferLayout layout = build_buffer_layout(kWorkedExample, opts(2));
  expect_worked_example_layout(layout, 512);
  expect_shard(layout, 0, 0, 2, {0, 256}, 256, {{kC, {0, 200}, {0, 200}, {0, 200}}});
  expect_shard(layout, 0, 1, 2, {256, 512}, 256,
               {{kB, {0, 30}, {256, 286}, {0, 30}}, {kA, {64, 164}, {320, 420}, {0, 100}}});
  EXPECT_TRUE(check_layout_invariants(layout, opts(2)).is_ok());
}

// dp=4: L=128. r0: C[0,128). r1: C[0,72) = C elements 128..200. r2: B[0,30), A[64,128) =
// A elements 0..64. r3: A[0,36) = A elements 64..100, then end padding.
TEST(LayoutGolden, Dp4) {
  const BufferLayout layout = build_buffer_layout(kWorkedExample, opts(4));
  expect_worked_example_layout(layout, 512);
  expect_shard(layout, 0, 0, 4, {0, 128}, 128, {{kC, {0, 128}, {0, 128}, {0, 128}}});
  expect_shard(layout, 0, 1, 4, {128, 256}, 128, {{kC, {0, 72}, {128, 200}, {128, 200}}});
  expect_shard(layout, 0, 2, 4, {256, 384}, 128,
               {{kB, {0, 30}, {256, 286}, {0, 30}}, {kA, {64, 128}, {320, 384}, {0, 64}}});
  expect_shard(layout, 0, 3, 4, {384, 512}, 128, {{kA, {0, 36}, {384, 420}, {64, 100}}});
  EXPECT_TRUE(check_layout_invariants(layout, opts(4)).is_ok());
}

// dp=8: L=64. C spans r0..r3 (r3 holds C[192,200)), B is r4, A spans r5..r6, and r7 =
// [448,512) is pure end padding: an EMPTY param_map.
TEST(LayoutGolden, Dp8) {
  const BufferLayout layout = build_buffer_layout(kWorkedExample, opts(8));
  expect_worked_example_layout(layout, 512);
  expect_shard(layout, 0, 0, 8, {0, 64}, 64, {{kC, {0, 64}, {0, 64}, {0, 64}}});
  expect_shard(layout, 0, 1, 8, {64, 128}, 64, {{kC, {0, 64}, {64, 128}, {64, 128}}});
  expect_shard(layout, 0, 2, 8, {128, 192}, 64, {{kC, {0, 64}, {128, 192}, {128, 192}}});
  expect_shard(layout, 0, 3, 8, {192, 256}, 64, {{kC, {0, 8}, {192, 200}, {192, 200}}});
  expect_shard(layout, 0, 4, 8, {256, 320}, 64, {{kB, {0, 30}, {256, 286}, {0, 30}}});
  expect_shard(layout, 0, 5, 8, {320, 384}, 64, {{kA, {0, 64}, {320, 384}, {0, 64}}});
  expect_shard(layout, 0, 6, 8, {384, 448}, 64, {{kA, {0, 36}, {384, 420}, {64, 100}}});
  expect_shard(layout, 0, 7, 8, {448, 512}, 64, {});
  EXPECT_TRUE(build_bucket_shard(layout, 0, 7, 8).param_map.empty());
  EXPECT_TRUE(check_layout_invariants(layout, opts(8)).is_ok());
}

// Model order [P0(1000), P1(50), P2(300), P3(10)], bucket_size=300. Reversed:
//   P3 [0,10)     10-0 < 300, stay open
//   P2 [64,364)   364-0 >= 300: close bucket 0, U=364, end pad(364,128)=384
//   P1 [384,434)  434-384=50 < 300
//   P0 [448,1448) 1448-384=1064 >= 300: close bucket 1, U=1064, end pad(1448,128)=1536
// numel=1536, numel_unpadded=364+1064=1428. Same at dp=3: pad(364,384)=384, pad(1448,384)=1536.
TEST(LayoutMultiBucket, FourParamsTwoBuckets) {
  const std::vector<int64_t> numels = {1000, 50, 300, 10};
  for (int64_t dp : {1, 2, 3}) {
    SCOPED_TRACE("dp " + std::to_string(dp));
    const LayoutOptions options = opts(dp, 300);
    const BufferLayout layout = build_buffer_layout(numels, options);
    EXPECT_EQ(layout.param_index_map[3], (ParamIndex{0, 10, 0}));
    EXPECT_EQ(layout.param_index_map[2], (ParamIndex{64, 364, 0}));
    EXPECT_EQ(layout.param_index_map[1], (ParamIndex{384, 434, 1}));
    EXPECT_EQ(layout.param_index_map[0], (ParamIndex{448, 1448, 1}));
    ASSERT_EQ(layout.buckets.size(), 2u);
    EXPECT_EQ(layout.buckets[0].offset, 0);
    EXPECT_EQ(layout.buckets[0].numel, 384);
    EXPECT_EQ(layout.buckets[0].numel_unpadded, 364);
    EXPECT_EQ(layout.buckets[0].params, (std::vector<size_t>{3, 2}));
    EXPECT_EQ(layout.buckets[1].offset, 384);
    EXPECT_EQ(layout.buckets[1].numel, 1152);
    EXPECT_EQ(layout.buckets[1].numel_unpadded, 1064);
    EXPECT_EQ(layout.buckets[1].params, (std::vector<size_t>{1, 0}));
    EXPECT_EQ(layout.numel, 1536);
    EXPECT_EQ(layout.numel_unpadded, 1428);
    EXPECT_TRUE(check_layout_invariants(layout, options).is_ok());
  }
  // Bucket 1 at dp=2: L=1152/2=576. r0 world [384,960): P1 local [0,50); P0 local [64,576) =
  // world [448,960) = P0 elements [0,512). r1 world [960,1536): P0 local [0,488) = world
  // [960,1448) = P0 elements [512,1000). in_bucket = world - 384.
  const BufferLayout layout = build_buffer_layout(numels, opts(2, 300));
  expect_shard(layout, 1, 0, 2, {384, 960}, 576,
               {{1, {0, 50}, {384, 434}, {0, 50}}, {0, {64, 576}, {448, 960}, {0, 512}}},
               /*offset=*/384);
  expect_shard(layout, 1, 1, 2, {960, 1536}, 576, {{0, {0, 488}, {960, 1448}, {512, 1000}}},
               /*offset=*/384);
  // Bucket 0 at dp=2: L=192. r0 [0,192): P3 [0,10), P2 local [64,192) = P2 elements [0,128).
  // r1 [192,384): P2 local [0,172) = world [192,364) = P2 elements [128,300).
  expect_shard(layout, 0, 0, 2, {0, 192}, 192,
               {{3, {0, 10}, {0, 10}, {0, 10}}, {2, {64, 192}, {64, 192}, {0, 128}}});
  expect_shard(layout, 0, 1, 2, {192, 384}, 192, {{2, {0, 172}, {192, 364}, {128, 300}}});
}

// A trailing param that does not reach bucket_size still gets its own (last) bucket.
// Model order [P0(10), P1(1000)], bucket_size=500, dp=1. Reversed: P1 [0,1000) closes
// bucket 0 (U=1000, end 1024); P0 [1024,1034) stays open; the loop ends: bucket 1 U=10,
// end pad(1034,128)=1152.
TEST(LayoutMultiBucket, TrailingOpenBucket) {
  const BufferLayout layout = build_buffer_layout(std::vector<int64_t>{10, 1000}, opts(1, 500));
  EXPECT_EQ(layout.param_index_map[1], (ParamIndex{0, 1000, 0}));
  EXPECT_EQ(layout.param_index_map[0], (ParamIndex{1024, 1034, 1}));
  ASSERT_EQ(layout.buckets.size(), 2u);
  EXPECT_EQ(layout.buckets[0].numel, 1024);
  EXPECT_EQ(layout.buckets[0].numel_unpadded, 1000);
  EXPECT_EQ(layout.buckets[1].offset, 1024);
  EXPECT_EQ(layout.buckets[1].numel, 128);
  EXPECT_EQ(layout.buckets[1].numel_unpadded, 10);
  EXPECT_EQ(layout.numel, 1152);
  EXPECT_EQ(layout.numel_unpadded, 1010);
}

// The closing test is `param_end - bucket_start >= bucket_size`: reaching it exactly closes.
// Model order [P0(7), P1(64)], bucket_size=64: P1 [0,64) closes bucket 0 at exactly 64.
// With bucket_size=65 nothing closes until the end: P0 at [64,71), one bucket, U=71.
TEST(LayoutMultiBucket, ClosesWhenReachingBucketSize) {
  const std::vector<int64_t> numels = {7, 64};
  const BufferLayout exact = build_buffer_layout(numels, opts(1, 64));
  ASSERT_EQ(exact.buckets.size(), 2u);
  EXPECT_EQ(exact.buckets[0].numel_unpadded, 64);
  EXPECT_EQ(exact.buckets[0].numel, 128);
  EXPECT_EQ(exact.param_index_map[0], (ParamIndex{128, 135, 1}));
  EXPECT_EQ(exact.buckets[1].numel_unpadded, 7);

  const BufferLayout above = build_buffer_layout(numels, opts(1, 65));
  ASSERT_EQ(above.buckets.size(), 1u);
  EXPECT_EQ(above.param_index_map[0], (ParamIndex{64, 71, 0}));
  EXPECT_EQ(above.buckets[0].numel_unpadded, 71);
  EXPECT_EQ(above.buckets[0].numel, 128);
}

// pad_buckets_for_high_nccl_busbw at dp=2: divisor lcm(2,128,65536)=65536, so the worked
// example's bucket is S=65536, L=32768; rank 0 owns all three params, rank 1 only padding.
// U stays 420 (I4: the checkpoint shape does not see this option).
TEST(LayoutHighNcclBusbw, WorkedExampleDp2) {
  const LayoutOptions options = opts(2, std::nullopt, true);
  const BufferLayout layout = build_buffer_layout(kWorkedExample, options);
  expect_worked_example_layout(layout, 65536);
  expect_shard(layout, 0, 0, 2, {0, 32768}, 32768,
               {{kC, {0, 200}, {0, 200}, {0, 200}},
                {kB, {256, 286}, {256, 286}, {0, 30}},
                {kA, {320, 420}, {320, 420}, {0, 100}}});
  expect_shard(layout, 0, 1, 2, {32768, 65536}, 32768, {});
  EXPECT_TRUE(check_layout_invariants(layout, options).is_ok());
  // Checked against the divisor without the option, S=65536 != pad(420,128)=512.
  EXPECT_FALSE(check_layout_invariants(layout, opts(2)).is_ok());
}

// Multi-bucket with the option at dp=24 (divisor 3*65536=196608): the FourParamsTwoBuckets
// partition is unchanged (U 364 and 1064), bucket 1 starts at 196608.
TEST(LayoutHighNcclBusbw, MultiBucketDp24) {
  const LayoutOptions options = opts(24, 300, true);
  const BufferLayout layout = build_buffer_layout(std::vector<int64_t>{1000, 50, 300, 10}, options);
  ASSERT_EQ(layout.buckets.size(), 2u);
  EXPECT_EQ(layout.buckets[0].numel, 196608);
  EXPECT_EQ(layout.buckets[0].numel_unpadded, 364);
  EXPECT_EQ(layout.buckets[1].offset, 196608);
  EXPECT_EQ(layout.param_index_map[1], (ParamIndex{196608, 196658, 1}));
  EXPECT_EQ(layout.param_index_map[0], (ParamIndex{196672, 197672, 1}));  // 196608 + 64
  EXPECT_EQ(layout.buckets[1].numel, 196608);
  EXPECT_EQ(layout.buckets[1].numel_unpadded, 1064);
  EXPECT_EQ(layout.numel, 2 * 196608);
  EXPECT_EQ(layout.numel_unpadded, 1428);
  EXPECT_TRUE(check_layout_invariants(layout, options).is_ok());
}

// dp=3: divisor lcm(3,128)=384, S=pad(420,384)=768, L=256. r0 [0,256): C[0,200).
// r1 [256,512): B local[0,30), A local[64,164). r2 [512,768): empty.
TEST(LayoutDpNotDividing128, WorkedExampleDp3) {
  const BufferLayout layout = build_buffer_layout(kWorkedExample, opts(3));
  expect_worked_example_layout(layout, 768);
  expect_shard(layout, 0, 0, 3, {0, 256}, 256, {{kC, {0, 200}, {0, 200}, {0, 200}}});
  expect_shard(layout, 0, 1, 3, {256, 512}, 256,
               {{kB, {0, 30}, {256, 286}, {0, 30}}, {kA, {64, 164}, {320, 420}, {0, 100}}});
  expect_shard(layout, 0, 2, 3, {512, 768}, 256, {});
  EXPECT_TRUE(check_layout_invariants(layout, opts(3)).is_ok());
}

// dp=24: divisor lcm(24,128)=384, S=768, L=32. C=[0,200) spans r0..r6 (r6 = [192,224) holds
// C[192,200)); r7 [224,256) empty; B=[256,286) is r8; r9 [288,320) empty; A=[320,420) spans
// r10..r13 (r13 = [416,448) holds A[96,100)); r14..r23 empty.
TEST(LayoutDpNotDividing128, WorkedExampleDp24) {
  const BufferLayout layout = build_buffer_layout(kWorkedExample, opts(24));
  expect_worked_example_layout(layout, 768);
  for (int64_t r = 0; r < 6; ++r) {
    expect_shard(layout, 0, r, 24, {32 * r, 32 * r + 32}, 32,
                 {{kC, {0, 32}, {32 * r, 32 * r + 32}, {32 * r, 32 * r + 32}}});
  }
  expect_shard(layout, 0, 6, 24, {192, 224}, 32, {{kC, {0, 8}, {192, 200}, {192, 200}}});
  expect_shard(layout, 0, 7, 24, {224, 256}, 32, {});
  expect_shard(layout, 0, 8, 24, {256, 288}, 32, {{kB, {0, 30}, {256, 286}, {0, 30}}});
  expect_shard(layout, 0, 9, 24, {288, 320}, 32, {});
  expect_shard(layout, 0, 10, 24, {320, 352}, 32, {{kA, {0, 32}, {320, 352}, {0, 32}}});
  expect_shard(layout, 0, 11, 24, {352, 384}, 32, {{kA, {0, 32}, {352, 384}, {32, 64}}});
  expect_shard(layout, 0, 12, 24, {384, 416}, 32, {{kA, {0, 32}, {384, 416}, {64, 96}}});
  expect_shard(layout, 0, 13, 24, {416, 448}, 32, {{kA, {0, 4}, {416, 420}, {96, 100}}});
  for (int64_t r = 14; r < 24; ++r) {
    expect_shard(layout, 0, r, 24, {32 * r, 32 * r + 32}, 32, {});
  }
  EXPECT_TRUE(check_layout_invariants(layout, opts(24)).is_ok());
}

TEST(LayoutRequires, RejectsBadInputs) {
  const std::vector<int64_t> none;
  EXPECT_THROW(build_buffer_layout(none, {}), InvariantViolation);
  EXPECT_THROW(build_buffer_layout(std::vector<int64_t>{5, 0}, {}), InvariantViolation);
  EXPECT_THROW(build_buffer_layout(std::vector<int64_t>{-3}, {}), InvariantViolation);
  EXPECT_THROW(build_buffer_layout(kWorkedExample, opts(0)), InvariantViolation);
  EXPECT_THROW(build_buffer_layout(kWorkedExample, opts(kDpSizeMax + 1)), InvariantViolation);
  EXPECT_THROW(build_buffer_layout(kWorkedExample, opts(1, 0)), InvariantViolation);
  EXPECT_THROW(build_buffer_layout(std::vector<int64_t>{kBufferNumelMax + 1}, {}),
               InvariantViolation);
  // Two params of kBufferNumelMax each overflow the buffer limit.
  EXPECT_THROW(build_buffer_layout(std::vector<int64_t>{kBufferNumelMax, kBufferNumelMax}, {}),
               InvariantViolation);
  EXPECT_THROW(build_buffer_layout(std::vector<int64_t>(kParamsPerBufferMax + 1, 1), {}),
               InvariantViolation);
  EXPECT_NO_THROW(build_buffer_layout(std::vector<int64_t>{1}, opts(kDpSizeMax)));

  const BufferLayout layout = build_buffer_layout(kWorkedExample, opts(4));
  EXPECT_THROW(build_bucket_shard(layout, 1, 0, 4), InvariantViolation);  // no bucket 1
  EXPECT_THROW(build_bucket_shard(layout, 0, 4, 4), InvariantViolation);  // rank == dp
  EXPECT_THROW(build_bucket_shard(layout, 0, -1, 4), InvariantViolation);
  EXPECT_THROW(build_bucket_shard(layout, 0, 0, 3), InvariantViolation);  // 512 % 3 != 0
}

// ---------------------------------------------------------------------------------------
// Canaries: the checker must reject broken layouts and shards, naming what is wrong.

bool message_contains(const Status& s, const std::string& needle) {
  return s.message().find(needle) != std::string::npos;
}

TEST(LayoutCanary, StartShiftedByOne) {
  BufferLayout layout = build_buffer_layout(kWorkedExample, opts(2));
  layout.param_index_map[kB].start += 1;  // 257: breaks the 64-alignment
  layout.param_index_map[kB].end += 1;
  const Status s = check_layout_invariants(layout, opts(2));
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(message_contains(s, "I1: param 1 start 257 is not a multiple of 64")) << s.message();
}

// The worked example laid out without 64-alignment: C [0,200), B [200,230), A [230,330),
// U=330, S=384 (valid padding of U to 128, so only the alignment is wrong).
TEST(LayoutCanary, AlignmentDropped) {
  BufferLayout layout;
  layout.param_index_map = {{230, 330, 0}, {200, 230, 0}, {0, 200, 0}};
  layout.buckets = {
      BucketLayout{.offset = 0, .numel = 384, .numel_unpadded = 330, .params = {kC, kB, kA}}};
  layout.numel = 384;
  layout.numel_unpadded = 330;
  const Status s = check_layout_invariants(layout, opts(1));
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(message_contains(s, "I1: param 1 start 200")) << s.message();
}

TEST(LayoutCanary, LayoutCheckedAtWrongDp) {
  const BufferLayout layout = build_buffer_layout(kWorkedExample, opts(1));  // S=512
  const Status s = check_layout_invariants(layout, opts(3));
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(message_contains(s, "I1: bucket 0 numel S=512")) << s.message();
}

TEST(LayoutCanary, UnpaddedSizeWrong) {
  BufferLayout layout = build_buffer_layout(kWorkedExample, opts(2));
  layout.buckets[0].numel_unpadded = 419;  // still pads to 512, but the last param ends at 420
  layout.numel_unpadded = 419;
  const Status s = check_layout_invariants(layout, opts(2));
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(message_contains(s, "end expected offset+U=419 observed 420")) << s.message();
}

TEST(LayoutCanary, ModelOrderInsteadOfReversed) {
  // A [0,100), B [128,158), C [192,392): aligned and padded correctly, but not reversed.
  BufferLayout layout;
  layout.param_index_map = {{0, 100, 0}, {128, 158, 0}, {192, 392, 0}};
  layout.buckets = {
      BucketLayout{.offset = 0, .numel = 512, .numel_unpadded = 392, .params = {kA, kB, kC}}};
  layout.numel = 512;
  layout.numel_unpadded = 392;
  const Status s = check_layout_invariants(layout, opts(1));
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(message_contains(s, "descending model index")) << s.message();
}

TEST(LayoutCanary, TamperedShards) {
  const BufferLayout layout = build_buffer_layout(kWorkedExample, opts(4));
  const std::vector<BucketShard> good = build_bucket_shards(layout, 0, 4);
  ASSERT_TRUE(check_bucket_shards(layout, 0, 4, good).is_ok());

  {  // Rank 1 loses its piece of C: C's pieces no longer cover [0, 200).
    std::vector<BucketShard> bad = good;
    bad[1].param_map.clear();
    const Status s = check_bucket_shards(layout, 0, 4, bad);
    ASSERT_FALSE(s.is_ok());
    EXPECT_TRUE(message_contains(s,
                                 "param 2: param ranges over all ranks expected to partition "
                                 "[0, 200)"))
        << s.message();
  }
  {  // Rank 2's entries swapped: not sorted by gbuf_local.start.
    std::vector<BucketShard> bad = good;
    std::swap(bad[2].param_map[0], bad[2].param_map[1]);
    const Status s = check_bucket_shards(layout, 0, 4, bad);
    ASSERT_FALSE(s.is_ok());
    EXPECT_TRUE(message_contains(s, "sorted and disjoint")) << s.message();
  }
  {  // Rank 3's `param` sub-range computed from gbuf_local (the classic off-by-shard bug).
    std::vector<BucketShard> bad = good;
    bad[3].param_map[0].second.param = Range{0, 36};
    const Status s = check_bucket_shards(layout, 0, 4, bad);
    ASSERT_FALSE(s.is_ok());
    EXPECT_TRUE(message_contains(s, "rank 3 param 0: param expected 64,100 [36]")) << s.message();
  }
  {  // Rank 0's gbuf_world_in_bucket shifted.
    std::vector<BucketShard> bad = good;
    bad[0].param_map[0].second.gbuf_world_in_bucket = Range{1, 129};
    EXPECT_FALSE(check_bucket_shards(layout, 0, 4, bad).is_ok());
  }
  {  // One shard missing.
    std::vector<BucketShard> bad = good;
    bad.pop_back();
    EXPECT_FALSE(check_bucket_shards(layout, 0, 4, bad).is_ok());
  }
}

// ---------------------------------------------------------------------------------------
// Properties.

rc::Gen<int64_t> gen_numel() {
  return rc::gen::weightedOneOf<int64_t>({
      {3, rc::gen::element<int64_t>(1, 2, 63, 64, 65, 127, 128, 129, 192, 384)},
      {6, rc::gen::inRange<int64_t>(1, 5000)},
      {1, rc::gen::inRange<int64_t>(1, 2'000'000)},
  });
}

rc::Gen<int64_t> gen_dp() {
  return rc::gen::weightedOneOf<int64_t>({
      {5, rc::gen::inRange<int64_t>(1, 9)},
      {4, rc::gen::element<int64_t>(3, 5, 6, 7, 12, 16, 24, 32, 48, 64, 96, 128, 256)},
      {1, rc::gen::element<int64_t>(1000, 1024, 4096)},
  });
}

rc::Gen<std::optional<int64_t>> gen_bucket_size() {
  return rc::gen::weightedOneOf<std::optional<int64_t>>({
      {2, rc::gen::just(std::optional<int64_t>())},
      {3, rc::gen::map(rc::gen::inRange<int64_t>(1, 20000),
                       [](int64_t v) { return std::optional<int64_t>(v); })},
      {1, rc::gen::map(rc::gen::element<int64_t>(1, 64, 128, 300, 40'000'000),
                       [](int64_t v) { return std::optional<int64_t>(v); })},
  });
}

rc::Gen<std::vector<int64_t>> gen_numels() {
  return rc::gen::resize(30,
                         rc::gen::nonEmpty(rc::gen::container<std::vector<int64_t>>(gen_numel())));
}

// I1 + structure + I2 hold for every layout the builder produces.
RC_GTEST_PROP(LayoutProperty, Invariants, ()) {
  const auto numels = *gen_numels();
  const LayoutOptions options{.dp_size = *gen_dp(),
                              .bucket_size = *gen_bucket_size(),
                              .pad_buckets_for_high_nccl_busbw = *rc::gen::arbitrary<bool>()};
  const BufferLayout layout = build_buffer_layout(numels, options);
  const Status s = check_layout_invariants(layout, options);
  RC_LOG() << s.message() << "\n";
  RC_ASSERT(s.is_ok());
  // Independent of the code under test (the checker shares bucket_size_divisor() with the
  // builder, so the divisor is recomputed here from the spec's formula).
  int64_t divisor = std::lcm(options.dp_size, int64_t{128});
  if (options.pad_buckets_for_high_nccl_busbw) divisor = std::lcm(divisor, int64_t{65536});
  for (const BucketLayout& bucket : layout.buckets) {
    RC_ASSERT(bucket.numel % divisor == 0);
    RC_ASSERT(bucket.numel - bucket.numel_unpadded < divisor);
  }
  // U holds every element, and at most 63 alignment elements per param.
  int64_t total = 0;
  for (int64_t v : numels) total += v;
  RC_ASSERT(layout.numel_unpadded >= total);
  RC_ASSERT(layout.numel_unpadded <= total + 63 * static_cast<int64_t>(numels.size() - 1));
}

// Header invariant 4 / spec I4: for a fixed bucket_size, the bucket partition, each U and the
// params' offsets relative to their bucket do not depend on dp or the padding option. With
// one bucket, U also equals an independent walk of the spec's rule (reverse order, pad64).
RC_GTEST_PROP(LayoutProperty, UnpaddedSizeIndependentOfDp, ()) {
  const auto numels = *gen_numels();
  const auto bucket_size = *gen_bucket_size();
  const LayoutOptions a{.dp_size = *gen_dp(),
                        .bucket_size = bucket_size,
                        .pad_buckets_for_high_nccl_busbw = *rc::gen::arbitrary<bool>()};
  const LayoutOptions b{.dp_size = *gen_dp(),
                        .bucket_size = bucket_size,
                        .pad_buckets_for_high_nccl_busbw = *rc::gen::arbitrary<bool>()};
  const BufferLayout la = build_buffer_layout(numels, a);
  const BufferLayout lb = build_buffer_layout(numels, b);
  RC_ASSERT(la.buckets.size() == lb.buckets.size());
  RC_ASSERT(la.numel_unpadded == lb.numel_unpadded);
  for (size_t i = 0; i < la.buckets.size(); ++i) {
    RC_ASSERT(la.buckets[i].numel_unpadded == lb.buckets[i].numel_unpadded);
    RC_ASSERT(la.buckets[i].params == lb.buckets[i].params);
  }
  for (size_t k = 0; k < numels.size(); ++k) {
    const ParamIndex& pa = la.param_index_map[k];
    const ParamIndex& pb = lb.param_index_map[k];
    RC_ASSERT(pa.bucket_id == pb.bucket_id);
    const int64_t oa = la.buckets[static_cast<size_t>(pa.bucket_id)].offset;
    const int64_t ob = lb.buckets[static_cast<size_t>(pb.bucket_id)].offset;
    RC_ASSERT(pa.start - oa == pb.start - ob);
    RC_ASSERT(pa.end - pa.start == numels[k]);
  }
  if (!bucket_size.has_value()) {
    int64_t cursor = 0;
    for (size_t k = numels.size(); k-- > 0;) {
      cursor = (cursor + 63) / 64 * 64 + numels[k];
    }
    RC_ASSERT(la.buckets.size() == 1u);
    RC_ASSERT(la.buckets[0].numel_unpadded == cursor);
  }
}

}  // namespace
}  // namespace ckptsim::model
