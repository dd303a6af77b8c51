// The distributed optimizer's checkpoint keys (model/megatron/optimizer_key.h): one format, one
// parser. Mutations caught: parsing the dtype up to the first '.bucket_idx_' or without the dot
// after the bucket index (RejectsWhatIsNotABucketStateKey), a prefix other than upstream's
// f-string (FormatsUpstreamsKey).
#include "model/megatron/optimizer_key.h"

#include <gtest/gtest.h>

using namespace ckptsim::model;

TEST(OptimizerKey, FormatsUpstreamsKey) {
  const OptimizerBucketKey k{0, 1, "(torch.bfloat16, torch.float32)", 3, "exp_avg"};
  // distrib_optimizer.py sharded_param_state_dp_reshardable's f-string, written out by hand.
  EXPECT_EQ(format_bucket_key(k),
            "optimizer.distributed.dp_group_idx_0.gbuf_idx_1.dtype_(torch.bfloat16, "
            "torch.float32).bucket_idx_3.exp_avg");
  EXPECT_EQ(format_object_key(0, "per_bucket_numel"),
            "optimizer.distributed.dp_group_idx_0.per_bucket_numel");
}

TEST(OptimizerKey, ParsesWhatItFormats) {
  for (const OptimizerBucketKey& k :
       {OptimizerBucketKey{0, 0, "(torch.float32, torch.float32)", 0, "param"},
        OptimizerBucketKey{2, 11, "(torch.bfloat16, torch.float32)", 107, "exp_avg_sq"},
        OptimizerBucketKey{0, 1, "(torch.bfloat16, torch.float32)", 1, "step"}}) {
    const auto parsed = parse_bucket_key(format_bucket_key(k));
    ASSERT_TRUE(parsed.has_value()) << format_bucket_key(k);
    EXPECT_EQ(*parsed, k) << format_bucket_key(k);
  }
}

TEST(OptimizerKey, RejectsWhatIsNotABucketStateKey) {
  for (const char* key : {
           "optimizer.distributed.dp_group_idx_0.per_bucket_numel",
           "optimizer.distributed.dp_group_idx_0.optimizer",
           "w0",
           "optimizer.distributed.dp_group_idx_0.gbuf_idx_1.dtype_(x).bucket_idx_3",
           "optimizer.distributed.dp_group_idx_0.gbuf_idx_1.dtype_(x).bucket_idx_3x.exp_avg",
           "optimizer.distributed.dp_group_idx_0.gbuf_idx_.dtype_(x).bucket_idx_3.exp_avg",
           "optimizer.distributed.dp_group_idx_0.gbuf_idx_1.bucket_idx_3.exp_avg",
       }) {
    EXPECT_FALSE(parse_bucket_key(key).has_value()) << key;
  }
  EXPECT_TRUE(is_distributed_optimizer_key("optimizer.distributed.dp_group_idx_0.optimizer"));
  EXPECT_FALSE(is_distributed_optimizer_key("w0"));
}
