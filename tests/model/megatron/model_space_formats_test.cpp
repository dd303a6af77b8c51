// The DistributedOptimizer's formats besides dp_reshardable (distrib_optimizer_model_space.cpp)
// and the training loop's choice of format (checkpointing.h). Expected values come from
// upstream's code as read (spec §7-§8, /work/notes of issue 24), not from the model.
// Mutations caught: the fully_reshardable loader passing 'step' on to _set
// (FullyReshardableLoaderSkipsStep: the HDO's restored step would be replaced); the world tensors
// keeping the bucket end padding (WorldTensorsStripBucketPadding); the B7 switch ignored
// (B7ShiftsLaterBuckets); a metadata-less caller getting dp_reshardable (NoMetadataIs...); the
// content metadata fallback (CheckpointFormatOf...).
#include <gtest/gtest.h>

#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>

#include "model/errors.h"
#include "model/megatron/checkpointing.h"
#include "model/megatron/distrib_optimizer.h"
#include "model/megatron/optimizer_key.h"
#include "sim/local_world.h"

using namespace ckptsim;
using namespace ckptsim::model;

namespace {

struct OneRank {
  // Three params in three buckets (bucket_size 200): w2 is first in the buffer (reverse order).
  std::vector<ParamSpec> specs = {{"w0", 1000, DType::kBFloat16, 1.0, 1.0},
                                  {"w1", 600, DType::kBFloat16, 1.0, 1.0},
                                  {"w2", 300, DType::kBFloat16, 1.0, 1.0}};
  RevisionSwitches switches;
  OptimizerConfig config;
  std::optional<int64_t> bucket_size = 200;
  std::function<void(Runtime&, DistributedDataParallel&, DistributedOptimizer&)> body;

  void run() {
    sim::LocalWorld world(1);
    auto outcomes = world.run([&](ProcessGroup& pg) {
      Runtime rt(1, 0, 0);
      LayoutOptions layout{1, bucket_size, false};
      DistributedDataParallel ddp(rt, specs, layout, pg);
      // Distinct values everywhere, so that a slice at the wrong offset shows.
      for (size_t i = 0; i < specs.size(); ++i) {
        const at::Tensor p = ddp.param(i);
        for (int64_t e = 0; e < p.numel(); ++e)
          p[e].fill_(static_cast<double>(i) + 0.001 * static_cast<double>(e % 256));
      }
      DistributedOptimizer opt(rt, ddp, config, switches);
      for (size_t i = 0; i < specs.size(); ++i) ddp.main_grad(i).fill_(0.5);
      opt.step();
      body(rt, ddp, opt);
    });
    sim::rethrow_root_cause(outcomes);
  }
};

// The saved tensor of `state` for model param `name` in a fully_reshardable param state.
at::Tensor saved(const Value& param_state, int64_t param_idx, const char* state) {
  return param_state.dict()->at(param_idx).dict()->at(state).sharded_tensor()->data;
}

}  // namespace

TEST(ModelSpaceFormats, ShardingTypeNamesRoundTrip) {
  for (ShardingType t :
       {ShardingType::kDpReshardable, ShardingType::kFullyReshardable,
        ShardingType::kDpZeroGatherScatter, ShardingType::kFullyShardedModelSpace}) {
    EXPECT_EQ(parse_sharding_type(sharding_type_name(t)), t);
  }
  EXPECT_EQ(parse_sharding_type("fully_sharded_bucket_space"), std::nullopt);
  EXPECT_TRUE(fully_reshardable_format(ShardingType::kFullyReshardable));
  EXPECT_TRUE(fully_reshardable_format(ShardingType::kFullyShardedModelSpace));
  EXPECT_FALSE(fully_reshardable_format(ShardingType::kDpReshardable));
  EXPECT_FALSE(fully_reshardable_format(ShardingType::kDpZeroGatherScatter));
}

TEST(ModelSpaceFormats, ModelSpaceKeysRoundTrip) {
  const ModelSpaceKey k{"exp_avg_sq", "decoder.layers.0.mlp.weight"};
  EXPECT_EQ(format_model_space_key(k), "optimizer.state.exp_avg_sq.decoder.layers.0.mlp.weight");
  EXPECT_EQ(parse_model_space_key(format_model_space_key(k)), k);
  EXPECT_EQ(parse_model_space_key("optimizer.state.param"), std::nullopt);
  EXPECT_EQ(parse_model_space_key("optimizer.distributed.dp_group_idx_0.param_state"),
            std::nullopt);
}

TEST(ModelSpaceFormats, WorldTensorsStripBucketPadding) {
  OneRank t;
  t.body = [](Runtime&, DistributedDataParallel& ddp, DistributedOptimizer& opt) {
    const Value state = opt.get_parameter_state_dp_zero(false, false, false);
    const ParamAndGradBuffer& buffer = ddp.buffers()[0];
    ASSERT_EQ(buffer.layout.buckets.size(), 3U);
    const Dict& world = *state.dict()->at(int64_t{0}).dict()->at(buffer.dtype_key()).dict();
    EXPECT_EQ(world.at("numel_unpadded").as_int(), buffer.layout.numel_unpadded);
    const at::Tensor param = world.at("param").tensor();
    EXPECT_EQ(param.numel(), buffer.layout.numel_unpadded);
    // Bucket b's elements start at the sum of the earlier buckets' numel_unpadded.
    int64_t offset = 0;
    for (const BucketLayout& bucket : buffer.layout.buckets) {
      const size_t local = bucket.params.front();
      const at::Tensor live =
          opt.get_main_param_and_optimizer_states(buffer.params[local])->at("param").tensor();
      EXPECT_TRUE(at::equal(param.narrow(0, offset, live.numel()), live));
      offset += bucket.numel_unpadded;
    }
  };
  t.run();
}

TEST(ModelSpaceFormats, B7ShiftsLaterBucketsUnlessFixed) {
  for (const bool fixed : {false, true}) {
    OneRank t;
    t.switches.fully_reshardable_strips_bucket_padding = fixed;
    t.body = [fixed](Runtime&, DistributedDataParallel& ddp, DistributedOptimizer& opt) {
      const Value ps =
          opt.sharded_param_state_fully_reshardable(ddp.sharded_state_dict(), false, false);
      // param_index_map order: w2 (bucket 0), w1 (bucket 1), w0 (bucket 2).
      const std::vector<size_t> params = {2, 1, 0};
      for (int64_t idx = 0; idx < 3; ++idx) {
        const size_t p = params[static_cast<size_t>(idx)];
        const at::Tensor live = opt.get_main_param_and_optimizer_states(p)->at("param").tensor();
        const bool equal = at::equal(saved(ps, idx, "param"), live);
        EXPECT_EQ(equal, fixed || idx == 0) << "param index " << idx << (fixed ? " fixed" : "");
      }
    };
    t.run();
  }
}

TEST(ModelSpaceFormats, FullyReshardableKeysCarryTheModelParamsSharding) {
  OneRank t;
  t.body = [](Runtime&, DistributedDataParallel& ddp, DistributedOptimizer& opt) {
    const Value model_sd = ddp.sharded_state_dict();
    const Value ps = opt.sharded_param_state_fully_reshardable(model_sd, false, false);
    const ShardedTensor& st = *ps.dict()->at(int64_t{0}).dict()->at("exp_avg").sharded_tensor();
    EXPECT_EQ(st.key, "optimizer.state.exp_avg.w2");
    EXPECT_EQ(st.global_shape, (Shape{300}));
    EXPECT_EQ(st.replica_id, model_sd.dict()->at("w2").sharded_tensor()->replica_id);
    EXPECT_EQ(st.dtype, at::kFloat);
  };
  t.run();
}

TEST(ModelSpaceFormats, FullyReshardableLoaderSkipsStep) {
  OneRank t;
  t.config.kind = OptimizerKind::kHybrid;
  t.config.offload_fraction = 1.0;
  t.switches.fully_reshardable_strips_bucket_padding = true;
  t.body = [](Runtime& rt, DistributedDataParallel& ddp, DistributedOptimizer& opt) {
    const Value ps =
        opt.sharded_param_state_fully_reshardable(ddp.sharded_state_dict(), false, false);
    const at::Tensor live_step = opt.get_main_param_and_optimizer_states(2)->at("step").tensor();
    // A loaded entry that carries a step (upstream skips any 'step' key it meets).
    auto loaded = Dict::make();
    for (int64_t idx = 0; idx < 3; ++idx) {
      auto entry = Dict::make();
      for (const char* k : {"param", "exp_avg", "exp_avg_sq"})
        entry->set(k, Value(saved(ps, idx, k).clone()));
      entry->set("step", Value(rt.scalar_tensor(99.0, at::kFloat, Device::kCpu)));
      loaded->set(idx, Value(entry));
    }
    opt.load_parameter_state_from_fully_reshardable(Value(loaded));
    const at::Tensor after = opt.get_main_param_and_optimizer_states(2)->at("step").tensor();
    EXPECT_TRUE(after.is_same(live_step)) << "the step survives the load";
    EXPECT_EQ(after.item<float>(), 1.0F);
  };
  t.run();
}

TEST(ModelSpaceFormats, NoMetadataIsFullyShardedModelSpaceWhichMappingRefuses) {
  OneRank t;
  t.body = [](Runtime&, DistributedDataParallel& ddp, DistributedOptimizer& opt) {
    try {
      (void)opt.sharded_state_dict(ddp.sharded_state_dict(), false, std::nullopt);
      ADD_FAILURE() << "no exception";
    } catch (const CheckpointingException& e) {
      EXPECT_NE(std::string(e.what()).find("ShardedTensor.flattened_range is not supported."),
                std::string::npos)
          << e.what();
    }
  };
  t.run();
}

TEST(ModelSpaceFormats, FullyReshardableParamGroupsStayCommonState) {
  OneRank t;
  t.body = [](Runtime&, DistributedDataParallel& ddp, DistributedOptimizer& opt) {
    const Value fr = opt.sharded_state_dict(
        ddp.sharded_state_dict(), false, CheckpointFormat{ShardingType::kFullyReshardable, false});
    EXPECT_TRUE(fr.dict()->at("optimizer").is_dict()) << "plain, not a ShardedObject";
    EXPECT_EQ(fr.dict()->at("param_state_sharding_type").as_str(), "fully_reshardable");
    const Value dz = opt.sharded_state_dict(ddp.sharded_state_dict(), false,
                                            CheckpointFormat{ShardingType::kDpZeroGatherScatter});
    EXPECT_TRUE(dz.dict()->at("optimizer").is_sharded_object());
    EXPECT_TRUE(dz.dict()->at("param_state").is_sharded_object()) << "DP rank 0 holds the object";
  };
  t.run();
}

TEST(ModelSpaceFormats, CheckpointFormatOfTheCommonState) {
  const CheckpointFormat fr{ShardingType::kFullyReshardable, true};
  const Value common = dict_value({{"content_metadata", content_metadata(fr)}});
  EXPECT_EQ(checkpoint_format(common).format, fr);
  const Value md_value = content_metadata(fr);
  const Dict& md = *md_value.dict();
  EXPECT_EQ(md.at("distrib_optim_sharding_type").as_str(), "fully_reshardable");
  EXPECT_TRUE(md.at("distrib_optim_fully_reshardable_mem_efficient").as_bool());
  EXPECT_FALSE(content_metadata(CheckpointFormat{})
                   .dict()
                   ->contains("distrib_optim_fully_reshardable_mem_efficient"));
  // No content metadata: an older checkpoint whose args lack ckpt_fully_parallel_save.
  EXPECT_EQ(checkpoint_format(dict_value({{"iteration", Value(int64_t{3})}})).format,
            (CheckpointFormat{ShardingType::kDpZeroGatherScatter, false, false}));
  const LoadedFormat unknown = checkpoint_format(
      dict_value({{"content_metadata",
                   dict_value({{"distrib_optim_sharding_type", Value("fsdp_dtensor")}})}}));
  EXPECT_FALSE(unknown.format.has_value());
  EXPECT_EQ(unknown.sharding_type, "fsdp_dtensor");
}
