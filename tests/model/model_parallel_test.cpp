// TP and PP (model/config.h's placement of a param's pieces, the N-D ShardedTensors that
// dist_checkpointing saves and reslices, DistributedDataParallel's pieces and replica ids,
// load_checkpoint()'s (TP, PP) check) and the scenario rules that bound them.
// Expected values are worked out here by hand from the row-major layout, never taken from the
// code under test.
// Mutations caught: a TP split offset off by one (tp_global_offset + 1: GlobalElementsOfPieces,
// RowSplitPiecesReadBackAtTp1, the bundled fully-reshardable-reshards-tp-pp-dp-upstream-head);
// row runs of a full-width piece (RowSplitRunsAreRows); replica ids ignored at the save
// (every replica writes: ReplicatedParamHasOneMainReplica); the (TP, PP) check skipped for
// dp_reshardable (the bundled dp-reshardable-refuses-tp-change-upstream-head).
#include <gtest/gtest.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/zeros.h>

#include "model/config.h"
#include "model/errors.h"
#include "model/megatron/distributed_data_parallel.h"
#include "model/megatron/mapping.h"
#include "model/megatron/serialization.h"
#include "model/revision.h"
#include "sim/local_world.h"
#include "sim/scenario.h"
#include "tests/testing.h"

using namespace ckptsim;
using namespace ckptsim::model;

namespace {

ParamSpec spec(int64_t rows, int64_t cols, TpSplit split, int64_t layer = 0) {
  ParamSpec p;
  p.name = "w";
  p.numel = rows * cols;
  p.shape = {rows, cols};
  p.tp_split = split;
  p.layer = layer;
  return p;
}

void on_ranks(int n, const std::function<void(int, ProcessGroup&)>& f) {
  sim::LocalWorld world(n);
  sim::rethrow_root_cause(world.run([&](ProcessGroup& pg) { f(pg.rank(), pg); }));
}

}  // namespace

TEST(ModelParallel, GlobalElementsOfPieces) {
  // [4, 6]: element (r, c) is 6r + c.
  const ModelParallelRank tp1{2, 1, 1, 0};
  const ParamSpec row = spec(4, 6, TpSplit::kRow);  // TP rank 1 holds columns 3..5
  EXPECT_EQ(tp_local_shape(row, tp1), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(tp_global_offset(row, tp1), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(tp_global_element(row, tp1, 0), 3);
  EXPECT_EQ(tp_global_element(row, tp1, 4), 10);  // local (1, 1) -> (1, 4)
  EXPECT_EQ(tp_global_element(row, tp1, 11), 23);
  const ParamSpec column = spec(4, 6, TpSplit::kColumn);  // TP rank 1 holds rows 2..3
  EXPECT_EQ(tp_global_offset(column, tp1), (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(tp_global_element(column, tp1, 0), 12);
  EXPECT_EQ(tp_global_element(column, tp1, 11), 23);
  const ParamSpec replicated = spec(4, 6, TpSplit::kReplicated);
  EXPECT_EQ(tp_global_element(replicated, tp1, 7), 7);
}

TEST(ModelParallel, RowSplitRunsAreRows) {
  const ModelParallelRank tp1{2, 1, 1, 0};
  using Runs = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(tp_element_runs(spec(4, 6, TpSplit::kRow), tp1),
            (Runs{{3, 3}, {9, 3}, {15, 3}, {21, 3}}));
  EXPECT_EQ(tp_element_runs(spec(4, 6, TpSplit::kColumn), tp1), (Runs{{12, 12}}));
  EXPECT_EQ(tp_element_runs(spec(4, 6, TpSplit::kReplicated), tp1), (Runs{{0, 24}}));
}

TEST(ModelParallel, StagesHoldTheirLayers) {
  std::vector<ParamSpec> specs = {spec(4, 4, TpSplit::kColumn, 0), spec(4, 4, TpSplit::kRow, 1),
                                  spec(4, 4, TpSplit::kRow, 2), spec(4, 4, TpSplit::kRow, 3)};
  EXPECT_EQ(num_layers(specs), 4);
  EXPECT_EQ(params_of_stage(specs, {1, 0, 2, 0}), (std::vector<size_t>{0, 1}));
  EXPECT_EQ(params_of_stage(specs, {1, 0, 2, 1}), (std::vector<size_t>{2, 3}));
  EXPECT_EQ(params_of_stage(specs, {1, 0, 4, 2}), (std::vector<size_t>{2}));
  EXPECT_EQ(ModelParallelRank({2, 1, 2, 1}).data_parallel_group_idx(), 3);
}

// Two TP ranks save the two column halves of a row-split [4, 6] param (values 6r + c); one
// rank at TP 1 reads the whole: each element back in its place.
TEST(ModelParallel, RowSplitPiecesReadBackAtTp1) {
  MemoryStorage store;
  const ParamSpec w = spec(4, 6, TpSplit::kRow);
  on_ranks(2, [&](int rank, ProcessGroup& pg) {
    const ModelParallelRank mp{2, rank, 1, 0};
    at::Tensor local = at::zeros({4, 3});
    for (int64_t e = 0; e < 12; ++e)
      local.view(-1)[e] = static_cast<float>(tp_global_element(w, mp, e));
    ShardedTensor st;
    st.key = "w";
    st.data = local;
    st.local_shape = {4, 3};
    st.global_shape = {4, 6};
    st.global_offset = tp_global_offset(w, mp);
    st.axis_fragmentations = Shape{1, 2};
    st.replica_id = {0, 0, 0};
    save(dict_value({{"w", Value(ShardedTensor::make(std::move(st)))}}), store, pg);
  });
  on_ranks(1, [&](int, ProcessGroup& pg) {
    at::Tensor whole = at::zeros({4, 6});
    ShardedTensor st;
    st.key = "w";
    st.data = whole;
    st.local_shape = {4, 6};
    st.global_shape = {4, 6};
    st.global_offset = {0, 0};
    st.replica_id = {0, 0, 0};
    LoadReport report;
    load(dict_value({{"w", Value(ShardedTensor::make(std::move(st)))}}), store, pg, {}, &report);
    EXPECT_TRUE(report.uncovered.empty());
    for (int64_t e = 0; e < 24; ++e)
      EXPECT_EQ(whole.view(-1)[e].item<float>(), static_cast<float>(e)) << "element " << e;
  });
}

// TP 2 x DP 1: a row-split weight's pieces are main replicas on both TP ranks, a replicated
// norm's only on TP rank 0 (make_sharded_tensor_for_checkpoint's replica_id (0, tp_rank,
// dp_rank)): the checkpoint holds the norm once.
TEST(ModelParallel, ReplicatedParamHasOneMainReplica) {
  MemoryStorage store;
  std::vector<ParamSpec> specs = {spec(4, 6, TpSplit::kRow)};
  ParamSpec norm;
  norm.name = "norm";
  norm.numel = 8;
  specs.push_back(norm);
  on_ranks(2, [&](int rank, ProcessGroup& world) {
    Runtime rt(1, 0, rank);
    // Each TP rank is its own DP group of one.
    sim::LocalWorld own(1);
    sim::LocalProcessGroup dp(own, 0);
    DistributedDataParallel ddp(rt, specs, LayoutOptions{1, std::nullopt, false}, dp,
                                ModelParallelRank{2, rank, 1, 0});
    const Value sd = ddp.sharded_state_dict();
    const ShardedTensor& w = *sd.dict()->at("w").sharded_tensor();
    EXPECT_EQ(w.replica_id, (ReplicaId{0, 0, 0}));
    EXPECT_EQ(w.global_offset, (Shape{0, 3 * rank}));
    EXPECT_EQ(sd.dict()->at("norm").sharded_tensor()->replica_id, (ReplicaId{0, rank, 0}));
    save(sd, store, world);
  });
  auto pieces = read_checkpoint_pieces(store);
  ASSERT_TRUE(pieces.is_ok());
  int64_t norm_elements = 0, w_elements = 0;
  for (const SavedPiece& p : pieces.value())
    (p.key == "norm" ? norm_elements : w_elements) += p.numel;
  EXPECT_EQ(norm_elements, 8);
  EXPECT_EQ(w_elements, 24);
}

TEST(ModelParallel, ScenarioRulesNameTheField) {
  RevisionRegistry& registry = test::registry();
  const std::string head = R"({"seed": 1, "optimizer": {"kind": "fused_adam", "lr": 0.01,
      "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}, )";
  auto error = [&](const std::string& params, const std::string& phases) {
    auto s = sim::parse_scenario(head + "\"params\": " + params + ", \"phases\": " + phases + "}",
                                 "s.json", registry);
    return s.is_ok() ? std::string("ok") : s.status().message();
  };
  const std::string row = R"([{"name": "w", "numel": 24, "shape": [4, 6], "dtype": "bf16",
      "tp_split": "row"}, {"name": "n", "numel": 8, "dtype": "bf16", "layer": 1}])";
  EXPECT_EQ(error(row, R"([{"dp": 2, "tp": 2, "pp": 2, "revision": "upstream-head", "steps": 1}])"),
            "ok");
  EXPECT_NE(error(row, R"([{"dp": 1, "tp": 4, "revision": "upstream-head", "steps": 1}])")
                .find("field 'phases[0].tp': 4 does not divide dim 1 (6) of params[0]"),
            std::string::npos);
  EXPECT_NE(error(row, R"([{"dp": 1, "pp": 4, "revision": "upstream-head", "steps": 1}])")
                .find("field 'phases[0].pp': 4 stages cannot split the 2 layers"),
            std::string::npos);
  EXPECT_NE(error(row, R"([{"dp": 4096, "tp": 2, "revision": "upstream-head", "steps": 1}])")
                .find("field 'phases[0]': the world of tp 2 x pp 1 x dp 4096 = 8192 ranks exceeds"),
            std::string::npos);
  EXPECT_NE(error(R"([{"name": "w", "numel": 24, "dtype": "bf16", "tp_split": "row"}])",
                  R"([{"dp": 1, "revision": "upstream-head", "steps": 1}])")
                .find("field 'params[0].tp_split': row splits dim 1"),
            std::string::npos);
  EXPECT_NE(error(R"([{"name": "w", "numel": 24, "shape": [4, 5], "dtype": "bf16"}])",
                  R"([{"dp": 1, "revision": "upstream-head", "steps": 1}])")
                .find("field 'params[0].shape': [4,5] holds 20 elements, numel is 24"),
            std::string::npos);
  const std::string gap = R"([{"name": "w", "numel": 8, "dtype": "bf16"},
      {"name": "v", "numel": 8, "dtype": "bf16", "layer": 3}])";
  EXPECT_NE(error(gap, R"([{"dp": 1, "pp": 4, "revision": "upstream-head", "steps": 1}])")
                .find("field 'phases[0].pp': stage 1 (layers 1 to 1) holds no param"),
            std::string::npos);
  auto parsed = sim::parse_scenario(
      head + "\"params\": " + row +
          R"(, "phases": [{"dp": 2, "tp": 2, "pp": 2, "revision": "upstream-head", "steps": 1}]})",
      "s.json", registry);
  ASSERT_TRUE(parsed.is_ok());
  auto again =
      sim::parse_scenario(sim::scenario_to_json(parsed.value()).dump(), "s.json", registry);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(sim::scenario_to_json(again.value()), sim::scenario_to_json(parsed.value()));
  EXPECT_EQ(again.value().phases[0].tp, 2);
  EXPECT_EQ(again.value().params[0].tp_split, TpSplit::kRow);
  EXPECT_EQ(again.value().params[1].layer, 1);
}
