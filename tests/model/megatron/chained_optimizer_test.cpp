// ChainedOptimizer (optimizer.py): the 'chained_<i>.' prefix rule, the step synchronization and
// the load's entry count, on two parts built over two models of one rank. Mutations caught: the
// prefix always or never added (PrefixFollowsTheMetadata), _synchronize_steps not asserting
// (DifferingStepsAssertAtTheNextSave), a count mismatch zipped silently
// (ALoadOfAnotherPartCountIsARuntimeError), one part forwarding a prefixed or list state dict
// (OnePartIsThatPart).
#include <gtest/gtest.h>

#include <functional>

#include "model/errors.h"
#include "model/megatron/chained_optimizer.h"
#include "sim/local_world.h"

using namespace ckptsim;
using namespace ckptsim::model;

namespace {

// Two models on one rank (each a DDP over the same group) and their chain, stepped once.
void with_chain(size_t parts, const std::function<void(ChainedOptimizer&)>& body) {
  sim::LocalWorld world(1);
  auto outcomes = world.run([&](ProcessGroup& pg) {
    Runtime rt(1, 0, 0);
    const std::vector<ParamSpec> a = {{"w0", 200, DType::kBFloat16, 1.0, 1.0}};
    const std::vector<ParamSpec> b = {{"e0", 100, DType::kBFloat16, 1.0, 1.0}};
    DistributedDataParallel ddp_a(rt, a, LayoutOptions{}, pg);
    DistributedDataParallel ddp_b(rt, b, LayoutOptions{}, pg);
    RevisionSwitches switches;
    OptimizerConfig config;
    std::vector<std::unique_ptr<DistributedOptimizer>> v;
    v.push_back(std::make_unique<DistributedOptimizer>(rt, ddp_a, config, switches));
    if (parts > 1) v.push_back(std::make_unique<DistributedOptimizer>(rt, ddp_b, config, switches));
    ChainedOptimizer chain(std::move(v));
    ddp_a.main_grad(0).fill_(0.5);
    ddp_b.main_grad(0).fill_(0.25);
    chain.step();
    body(chain);
  });
  sim::rethrow_root_cause(outcomes);
}

// Every ShardedTensor key of a tree.
void keys_of(const Value& v, std::vector<std::string>& out) {
  if (v.is_sharded_tensor()) out.push_back(v.sharded_tensor()->key);
  if (v.is_sharded_object()) out.push_back(v.sharded_object()->key);
  if (v.is_dict()) {
    for (const auto& [k, x] : *v.dict()) keys_of(x, out);
  }
  if (v.is_list()) {
    for (const Value& x : *v.list()) keys_of(x, out);
  }
}

}  // namespace

TEST(ChainedOptimizer, PrefixFollowsTheMetadata) {
  const CheckpointFormat dp{ShardingType::kDpReshardable};
  const CheckpointFormat fr{ShardingType::kFullyReshardable};
  EXPECT_TRUE(ChainedOptimizer::should_add_prefix(dp));
  EXPECT_FALSE(ChainedOptimizer::should_add_prefix(fr));
  EXPECT_TRUE(ChainedOptimizer::should_add_prefix(std::nullopt));  // no metadata
  EXPECT_TRUE(ChainedOptimizer::should_add_prefix(
      CheckpointFormat{ShardingType::kFullyReshardable, false, false}));  // pre-0.14 checkpoint
  with_chain(2, [&](ChainedOptimizer& chain) {
    const Value sd = chain.sharded_state_dict(Value(Dict::make()), false, dp);
    ASSERT_TRUE(sd.is_dict());
    EXPECT_EQ(sd.dict()->size(), 2u);
    for (int64_t i = 0; i < 2; ++i) {
      std::vector<std::string> keys;
      keys_of(sd.dict()->at(i), keys);
      ASSERT_FALSE(keys.empty());
      for (const auto& k : keys)
        EXPECT_TRUE(k.starts_with(fmt::format("chained_{}.optimizer.", i))) << k;
    }
  });
}

TEST(ChainedOptimizer, OnePartIsThatPart) {
  with_chain(1, [&](ChainedOptimizer& chain) {
    const Value sd = chain.sharded_state_dict(Value(Dict::make()), false, CheckpointFormat{});
    std::vector<std::string> keys;
    keys_of(sd, keys);
    ASSERT_FALSE(keys.empty());
    for (const auto& k : keys) EXPECT_TRUE(k.starts_with("optimizer.")) << k;
    EXPECT_TRUE(chain.state_dict().is_dict());
    EXPECT_EQ(&chain.param_groups(), &chain.part(0).param_groups());
  });
}

TEST(ChainedOptimizer, DifferingStepsAssertAtTheNextSave) {
  with_chain(2, [&](ChainedOptimizer& chain) {
    EXPECT_EQ(chain.param_groups().size(), 2u);  // one group per part, concatenated
    // One step each: the synchronization keeps 1.
    EXPECT_NO_THROW(chain.sharded_state_dict(Value(Dict::make()), false, CheckpointFormat{}));
    chain.part(1).step();  // the expert part steps alone: its group step is 2
    try {
      chain.sharded_state_dict(Value(Dict::make()), false, CheckpointFormat{});
      FAIL() << "steps 1 and 2 passed _synchronize_steps";
    } catch (const PyAssertionError& e) {
      EXPECT_NE(std::string(e.what()).find("steps: [1, 2]"), std::string::npos) << e.what();
    }
  });
}

TEST(ChainedOptimizer, ALoadOfAnotherPartCountIsARuntimeError) {
  with_chain(2, [&](ChainedOptimizer& chain) {
    auto one = List::make();
    one->append(chain.part(0).state_dict());
    try {
      chain.load_state_dict(Value(one));
      FAIL() << "one entry loaded into two parts";
    } catch (const UpstreamError& e) {
      EXPECT_EQ(e.py_type(), "RuntimeError");
      EXPECT_NE(e.message().find("Expected 2 entries in state dict, but got 1."),
                std::string::npos);
    }
  });
}
