// dist_checkpointing save/load (spec §9.3-9.4): LNOs dropped at save, common state from rank
// 0 only, ShardedTensors read in place (identity kept) and resliced for another DP size,
// missing keys and shape mismatches raise upstream's errors.
// Mutations caught: load allocating new tensors instead of filling the request's
// (LoadFillsRequestTensorsInPlace); LNOs persisted (LnosAreNotSaved); no reslicing
// (ReslicesPiecesForAnotherDpSize); shape check missing (GlobalShapeMismatchRaises).
#include <gtest/gtest.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/add.h>
#include <ATen/ops/zeros.h>

#include "model/errors.h"
#include "model/mapping.h"
#include "model/serialization.h"
#include "sim/process_group.h"

using namespace ckptsim;
using namespace ckptsim::model;

namespace {

Value piece(const std::string& key, at::Tensor data, int64_t global, int64_t offset) {
  ShardedTensor st;
  st.key = key;
  st.dtype = data.scalar_type();
  st.local_shape = {data.numel()};
  st.global_shape = {global};
  st.global_offset = {offset};
  st.replica_id = {0, 0, 0};
  st.data = std::move(data);
  return Value(ShardedTensor::make(std::move(st)));
}

// Runs f(rank, group) on `n` ranks and rethrows the first real error.
void on_ranks(int n, const std::function<void(int, ProcessGroup&)>& f) {
  sim::LocalWorld world(n);
  const auto outcomes = world.run([&](ProcessGroup& pg) { f(pg.rank(), pg); });
  sim::rethrow_root_cause(outcomes);
}

}  // namespace

TEST(Serialization, LnosAreNotSavedAndCommonIsRank0s) {
  MemoryStorage store;
  on_ranks(2, [&](int rank, ProcessGroup& pg) {
    Value sd = dict_value({{"iteration", Value(7)},
                           {"local", make_nonpersistent(Value(rank))},
                           {"rank_field", Value(rank)},
                           {"t", piece("t", at::arange(4, at::TensorOptions().dtype(at::kFloat)).add(4 * rank), 8, 4 * rank)}});
    const SaveReport report = save(sd, store, pg);
    EXPECT_EQ(report.common_state_differences.empty(), rank == 0) << "rank 1's rank_field differs from rank 0's";
  });
  auto common = read_common_state(store);
  ASSERT_TRUE(common.is_ok());
  EXPECT_EQ(common.value().dict()->at("iteration").as_int(), 7);
  EXPECT_EQ(common.value().dict()->at("rank_field").as_int(), 0);
  EXPECT_FALSE(common.value().dict()->contains("local"));
  EXPECT_FALSE(common.value().dict()->contains("t"));
  auto pieces = read_checkpoint_pieces(store);
  ASSERT_TRUE(pieces.is_ok());
  EXPECT_EQ(pieces.value().size(), 2u);
}

TEST(Serialization, LoadFillsRequestTensorsInPlaceAndReslicesForAnotherDpSize) {
  MemoryStorage store;
  // Saved by 2 ranks: [0,1,2,3] and [4,5,6,7].
  on_ranks(2, [&](int rank, ProcessGroup& pg) {
    save(dict_value({{"t", piece("t", at::arange(4, at::TensorOptions().dtype(at::kFloat)).add(4 * rank), 8, 4 * rank)}}),
         store, pg);
  });
  // Loaded by 4 ranks of 2 elements, plus a LNO and a request-side plain leaf.
  on_ranks(4, [&](int rank, ProcessGroup& pg) {
    Runtime rt(1, 0, rank);
    at::Tensor buffer = at::zeros({2});
    at::Tensor local = at::zeros({1});
    const Value request = dict_value({{"t", piece("t", buffer, 8, 2 * rank)},
                                      {"mine", make_nonpersistent(Value(local))},
                                      {"plain", Value(123)}});
    const Value loaded = load(request, store, pg, rt, {});
    EXPECT_TRUE(loaded.dict()->at("t").tensor().is_same(buffer)) << "read in place into the request's tensor";
    EXPECT_EQ(buffer[0].item<float>(), static_cast<float>(2 * rank));
    EXPECT_EQ(buffer[1].item<float>(), static_cast<float>(2 * rank + 1));
    EXPECT_TRUE(loaded.dict()->at("mine").tensor().is_same(local)) << "LNO gives back the local object";
    EXPECT_FALSE(loaded.dict()->contains("plain")) << "request-side plain leaves come only from common state";
  });
}

TEST(Serialization, MissingKeyAndGlobalShapeMismatchRaise) {
  MemoryStorage store;
  on_ranks(1, [&](int, ProcessGroup& pg) { save(dict_value({{"t", piece("t", at::zeros({4}), 4, 0)}}), store, pg); });
  on_ranks(1, [&](int rank, ProcessGroup& pg) {
    Runtime rt(1, 0, rank);
    EXPECT_THROW(load(dict_value({{"u", piece("u", at::zeros({4}), 4, 0)}}), store, pg, rt, {}), PyKeyError);
    EXPECT_THROW(load(dict_value({{"t", piece("t", at::zeros({4}), 5, 0)}}), store, pg, rt, {}), CheckpointingException);
  });
}

TEST(Serialization, CommonLeafCollidingWithLnoRaisesDuplicateLeaf) {
  MemoryStorage store;
  on_ranks(1, [&](int, ProcessGroup& pg) { save(dict_value({{"opt", dict_value({{"step", Value(5)}})}}), store, pg); });
  on_ranks(1, [&](int rank, ProcessGroup& pg) {
    Runtime rt(1, 0, rank);
    try {
      load(dict_value({{"opt", dict_value({{"step", make_nonpersistent(Value(1))}})}}), store, pg, rt, {});
      FAIL() << "expected the duplicate leaf";
    } catch (const MergeError& e) {
      EXPECT_EQ(repr(e.path()), "('opt', 'step')");
    }
  });
}
