// dist_checkpointing save/load (spec §9.3-9.4): LNOs dropped at save, common state from rank
// 0 only, ShardedTensors read in place (identity kept) and resliced for another DP size,
// missing keys and shape mismatches raise upstream's errors.
// Mutations caught: load allocating new tensors instead of filling the request's
// (LoadFillsRequestTensorsInPlace); LNOs persisted (LnosAreNotSaved); no reslicing
// (ReslicesPiecesForAnotherDpSize); shape check missing (GlobalShapeMismatchRaises).
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include <ATen/ops/add.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>

#include "model/errors.h"
#include "model/megatron/mapping.h"
#include "model/megatron/serialization.h"
#include "sim/local_world.h"

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
    Value sd = dict_value(
        {{"iteration", Value(7)},
         {"local", make_nonpersistent(Value(rank))},
         {"rank_field", Value(rank)},
         {"t", piece("t", at::arange(4, at::TensorOptions().dtype(at::kFloat)).add(4 * rank), 8,
                     4 * rank)}});
    const SaveReport report = save(sd, store, pg);
    EXPECT_EQ(report.common_state_differences.empty(), rank == 0)
        << "rank 1's rank_field differs from rank 0's";
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
    save(dict_value(
             {{"t", piece("t", at::arange(4, at::TensorOptions().dtype(at::kFloat)).add(4 * rank),
                          8, 4 * rank)}}),
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
    const Value loaded = load(request, store, pg, {});
    EXPECT_TRUE(loaded.dict()->at("t").tensor().is_same(buffer))
        << "read in place into the request's tensor";
    EXPECT_EQ(buffer[0].item<float>(), static_cast<float>(2 * rank));
    EXPECT_EQ(buffer[1].item<float>(), static_cast<float>(2 * rank + 1));
    EXPECT_TRUE(loaded.dict()->at("mine").tensor().is_same(local))
        << "LNO gives back the local object";
    EXPECT_FALSE(loaded.dict()->contains("plain"))
        << "request-side plain leaves come only from common state";
  });
}

TEST(Serialization, MissingKeyAndGlobalShapeMismatchRaise) {
  MemoryStorage store;
  on_ranks(1, [&](int, ProcessGroup& pg) {
    save(dict_value({{"t", piece("t", at::zeros({4}), 4, 0)}}), store, pg);
  });
  on_ranks(1, [&](int rank, ProcessGroup& pg) {
    Runtime rt(1, 0, rank);
    // torch's checkpoint load reports the planner's KeyError wrapped (seen on the real code).
    try {
      load(dict_value({{"u", piece("u", at::zeros({4}), 4, 0)}}), store, pg, {});
      ADD_FAILURE() << "a missing key must raise";
    } catch (const UpstreamError& e) {
      EXPECT_EQ(e.py_type(), "CheckpointException");
      EXPECT_NE(e.message().find("KeyError"), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("u from model not in state dict"), std::string::npos);
    }
    EXPECT_THROW(load(dict_value({{"t", piece("t", at::zeros({4}), 5, 0)}}), store, pg, {}),
                 CheckpointingException);
  });
}

// RX's allow_partial_load (LoadOptions::allow_missing_keys): a requested tensor the checkpoint
// lacks keeps its contents and is reported, instead of raising. Mutation caught: the option
// ignored (the load raises).
TEST(Serialization, AllowMissingKeysSkipsAndReports) {
  MemoryStorage store;
  on_ranks(1, [&](int, ProcessGroup& pg) {
    save(dict_value({{"t", piece("t", at::zeros({4}), 4, 0)}}), store, pg);
  });
  LoadOptions options;
  options.allow_missing_keys = true;
  on_ranks(1, [&](int, ProcessGroup& pg) {
    LoadReport report;
    const at::Tensor u = at::ones({4});
    const Value loaded =
        load(dict_value({{"u", piece("u", u, 4, 0)}}), store, pg, options, &report);
    EXPECT_TRUE(loaded.dict()->at("u").tensor().is_same(u));
    EXPECT_EQ(u.sum().item<float>(), 4.0F) << "a skipped tensor keeps what it held";
    ASSERT_EQ(report.uncovered.size(), 1u);
    EXPECT_EQ(report.uncovered.front(), "u: not in the checkpoint, skipped");
  });
}

TEST(Serialization, CommonLeafCollidingWithLnoRaisesDuplicateLeaf) {
  MemoryStorage store;
  on_ranks(1, [&](int, ProcessGroup& pg) {
    save(dict_value({{"opt", dict_value({{"step", Value(5)}})}}), store, pg);
  });
  on_ranks(1, [&](int rank, ProcessGroup& pg) {
    Runtime rt(1, 0, rank);
    try {
      load(dict_value({{"opt", dict_value({{"step", make_nonpersistent(Value(1))}})}}), store, pg,
           {});
      FAIL() << "expected the duplicate leaf";
    } catch (const MergeError& e) {
      EXPECT_EQ(repr(e.path()), "('opt', 'step')");
    }
  });
}

namespace {

Value object(const std::string& key, int64_t offset, int replica) {
  ShardedObject so;
  so.key = key;
  so.data = Value(offset);
  so.global_shape = {2};
  so.global_offset = {offset};
  so.replica_id = {replica};
  return Value(ShardedObject::make(std::move(so)));
}

}  // namespace

// The end-of-save exchange: every rank learns every piece (in rank order), rank 0 lists each
// sharded object once with its main replica, and two main replicas of one object raise.
// Mutations caught: a rank reporting only its own pieces; objects listed per replica.
TEST(Serialization, EveryRankLearnsAllPiecesAndObjectsAreListedOnce) {
  MemoryStorage store;
  on_ranks(3, [&](int rank, ProcessGroup& pg) {
    const Value sd = dict_value({{"t", piece("t", at::zeros({2}).add(rank), 6, 2 * rank)},
                                 {"o", object("o", rank % 2, rank / 2)}});
    const SaveReport report = save(sd, store, pg);
    ASSERT_EQ(report.pieces->size(), 3u);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ((*report.pieces)[static_cast<size_t>(r)].rank, r);
      EXPECT_EQ((*report.pieces)[static_cast<size_t>(r)].global_offset, 2 * r);
    }
  });
  ASSERT_TRUE(store.read_file("objects/o/shard_0_2.pt").is_ok());
  ASSERT_TRUE(store.read_file("objects/o/shard_1_2.pt").is_ok());
  auto meta = store.read_file("metadata.json");
  ASSERT_TRUE(meta.is_ok());
  const std::string text(meta.value().begin(), meta.value().end());
  size_t listed = 0;
  for (size_t at = text.find("\"objects/o/"); at != std::string::npos;
       at = text.find("\"objects/o/", at + 1))
    ++listed;
  EXPECT_EQ(listed, 2u) << "two objects (offsets 0 and 1), each listed once: " << text;

  MemoryStorage clash;
  EXPECT_THROW(on_ranks(2,
                        [&](int, ProcessGroup& pg) {
                          save(dict_value({{"o", object("o", 0, 0)}}), clash, pg);
                        }),
               CheckpointingException);
}

// Where the group shares what it gathers (sim::ObjectGathers::kShared), every rank's report holds
// one list of pieces, equal to the list each rank decodes from its own copy, and rank 0 writes the
// same metadata.json. Mutations caught: a shared gather or decode that reorders or drops a
// rank's entries; a decode per rank (the lists are then not one object).
TEST(Serialization, SharedGatherGivesEveryRankOneListEqualToTheCopies) {
  constexpr int kRanks = 4;
  auto save_on = [](Storage& store, ProcessGroup& pg) {
    const int rank = pg.rank();
    return save(dict_value({{"t", piece("t", at::zeros({2}).add(rank), 2 * kRanks, 2 * rank)},
                            {"o", object("o", 0, rank)}}),
                store, pg);
  };
  MemoryStorage copied_store;
  std::vector<SaveReport> copied(kRanks);
  sim::LocalWorld copying_world(kRanks, sim::Execution::kFibers,
                                sim::ObjectGathers::kCopiedPerRank);
  sim::rethrow_root_cause(copying_world.run([&](ProcessGroup& pg) {
    copied[static_cast<size_t>(pg.rank())] = save_on(copied_store, pg);
  }));
  MemoryStorage shared_store;
  std::vector<SaveReport> shared(kRanks);
  sim::LocalWorld world(kRanks, sim::Execution::kFibers, sim::ObjectGathers::kShared);
  sim::rethrow_root_cause(world.run([&](ProcessGroup& pg) {
    shared[static_cast<size_t>(pg.rank())] = save_on(shared_store, pg);
  }));
  for (int r = 0; r < kRanks; ++r) {
    const auto i = static_cast<size_t>(r);
    EXPECT_EQ(*shared[i].pieces, *copied[i].pieces) << "rank " << r;
    EXPECT_EQ(shared[i].pieces, shared[0].pieces) << "rank " << r << " decoded its own list";
    EXPECT_EQ(shared[i].pieces_fingerprint, fingerprint(*copied[i].pieces));
  }
  EXPECT_EQ(copied[0].pieces->size(), static_cast<size_t>(kRanks));
  EXPECT_NE(copied[1].pieces, copied[0].pieces) << "kCopiedPerRank gives each rank its own";
  EXPECT_EQ(shared_store.read_file("metadata.json").value(),
            copied_store.read_file("metadata.json").value());
}

// A write into the list every rank shares is caught by the check the simulator makes after a
// phase. Mutation caught: no fingerprint (the write would reach every rank's record silently).
TEST(Serialization, WriteIntoSharedSavedPiecesIsCaught) {
  MemoryStorage store;
  SaveReport report;
  on_ranks(1, [&](int, ProcessGroup& pg) {
    report = save(dict_value({{"t", piece("t", at::zeros({4}), 4, 0)}}), store, pg);
  });
  EXPECT_NO_THROW(report.check_pieces_unchanged());
  auto& pieces = const_cast<std::vector<SavedPiece>&>(*report.pieces);
  pieces[0].numel = 3;
  EXPECT_THROW(report.check_pieces_unchanged(), InvariantViolation);
  pieces[0].numel = 4;
  pieces[0].key = "u";
  EXPECT_THROW(report.check_pieces_unchanged(), InvariantViolation);
}

// A run's caches parse metadata.json once per distinct content and every rank shares the index
// (CheckpointCaches invariants 1 and 2). Mutations caught: a cache keyed by path or by storage (a
// rewritten metadata.json would load the old pieces); no cache (each read its own index);
// no fingerprint (a write into a shared index goes unseen).
TEST(Serialization, LoadIndexIsSharedForEqualBytesOnly) {
  MemoryStorage store;
  CheckpointCaches caches;
  on_ranks(2, [&](int rank, ProcessGroup& pg) {
    save(dict_value({{"t", piece("t", at::zeros({2}).add(rank), 4, 2 * rank)}}), store, pg,
         {.caches = &caches});
  });
  const auto first = caches.load_index(store);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_EQ(caches.load_index(store).value(), first.value()) << "the same file, one index";
  EXPECT_EQ(first.value()->pieces, read_checkpoint_pieces(store).value());
  EXPECT_EQ(first.value()->by_key.at("t").size(), 2u);
  EXPECT_EQ(first.value()->problems, (std::vector<std::string>{"", ""}));

  MemoryStorage elsewhere;  // equal bytes in another storage: equal index, shared
  ASSERT_TRUE(
      elsewhere.write_file("metadata.json", store.read_file("metadata.json").value()).is_ok());
  EXPECT_EQ(caches.load_index(elsewhere).value(), first.value());

  // Rewritten at the same path: a new index of the new pieces.
  on_ranks(1, [&](int, ProcessGroup& pg) {
    save(dict_value({{"t", piece("t", at::zeros({4}), 4, 0)}}), store, pg, {.caches = &caches});
  });
  const auto second = caches.load_index(store);
  ASSERT_TRUE(second.is_ok());
  EXPECT_NE(second.value(), first.value());
  EXPECT_EQ(second.value()->pieces, read_checkpoint_pieces(store).value());
  EXPECT_EQ(first.value()->pieces.size(), 2u) << "an index a rank holds never changes";

  EXPECT_NO_THROW(caches.check_load_indexes_unchanged());
  auto& shared = const_cast<LoadIndex&>(*second.value());
  const int64_t saved_offset = shared.pieces[0].byte_offset;
  shared.pieces[0].byte_offset = saved_offset + 8;
  EXPECT_THROW(caches.check_load_indexes_unchanged(), InvariantViolation);
  EXPECT_THROW(second.value()->check_unchanged(), InvariantViolation);
  shared.pieces[0].byte_offset = saved_offset;
  EXPECT_NO_THROW(caches.check_load_indexes_unchanged());

  MemoryStorage empty;
  EXPECT_EQ(caches.load_index(empty).status().code(), Status::Code::kNotFound);
}

namespace {

// metadata.json as save() wrote it before metadata_json: a nlohmann::json tree, dump(1).
std::string nlohmann_metadata(bool common_in_common_pt, const std::vector<SavedPiece>& pieces,
                              const std::vector<std::string>& object_keys) {
  using nlohmann::json;
  json meta{{"format", "ckptsim-dist-v1"},
            {"common", common_in_common_pt ? json("common.pt") : json(nullptr)},
            {"pieces", json::array()},
            {"objects", json::array()},
            {"piece_header_bytes", 16}};  // since the pieces' headers (fidelity audit N5)
  for (const auto& p : pieces) {
    meta["pieces"].push_back(json{{"key", p.key},
                                  {"dtype", p.dtype},
                                  {"global_numel", p.global_numel},
                                  {"global_offset", p.global_offset},
                                  {"numel", p.numel},
                                  {"rank", p.rank},
                                  {"file", p.file},
                                  {"byte_offset", p.byte_offset}});
  }
  for (const auto& k : object_keys)
    meta["objects"].push_back(json{{"unique_key", k}, {"file", "objects/" + k + ".pt"}});
  return meta.dump(1);
}

}  // namespace

// metadata_json writes, without a JSON tree, the bytes nlohmann's dump(1) wrote: keys sorted,
// the indents, empty arrays, null common, strings that need escapes (quotes, backslashes,
// control characters, UTF-8 beyond ASCII), negative and 64-bit integers; a string that is not
// UTF-8 throws as nlohmann does. Mutations caught: a member out of sorted order; the array
// items' indent off by one; strings written unescaped; "[]" for an empty array missing.
TEST(Serialization, MetadataTextIsWhatNlohmannDumpWrote) {
  SavedPiece a{"optimizer.state.exp_avg.w", "torch.float32", 12, 4, 8, 1, "shards/rank_1.bin", 32};
  SavedPiece b{"quote\"back\\slash\ttab\x01ctl caf\xc3\xa9",
               "torch.bfloat16",
               int64_t{1} << 40,
               -3,
               0,
               7,
               "shards/rank_7.bin",
               int64_t{1} << 33};
  const std::vector<std::vector<SavedPiece>> piece_lists = {{}, {a}, {a, b}};
  const std::vector<std::vector<std::string>> object_lists = {
      {}, {"common_state/shard_0_1"}, {"o/shard_0_2", "o/shard_1_2", "we\"ird"}};
  for (const bool common : {true, false}) {
    for (const auto& pieces : piece_lists) {
      for (const auto& objects : object_lists) {
        EXPECT_EQ(metadata_json(common, pieces, objects),
                  nlohmann_metadata(common, pieces, objects))
            << pieces.size() << " pieces, " << objects.size() << " objects";
      }
    }
  }
  SavedPiece bad = a;
  bad.key = "not \xff utf-8";
  EXPECT_THROW(nlohmann_metadata(true, {bad}, {}), nlohmann::json::type_error);
  EXPECT_THROW(metadata_json(true, {bad}, {}), nlohmann::json::type_error);
}

// save() primes its caches' load index with the index of the metadata.json it wrote: the load
// that follows is served an index equal to a fresh parse of the file (LoadIndex invariant 1),
// for every field of every piece. Mutations caught: priming with the pieces of one rank only,
// or with a piece's byte offset changed (the index then differs from the parse).
TEST(Serialization, SavePrimesTheLoadIndexWithWhatAParseGives) {
  MemoryStorage store;
  CheckpointCaches caches;
  on_ranks(3, [&](int rank, ProcessGroup& pg) {
    save(dict_value({{"t", piece("t", at::zeros({2}).add(rank), 6, 2 * rank)},
                     {"u", piece("u", at::zeros({rank + 1}), 6, rank * (rank + 1) / 2)},
                     {"o", object("o", rank % 2, rank / 2)}}),
         store, pg, {.caches = &caches});
  });
  const auto index = caches.load_index(store);
  ASSERT_TRUE(index.is_ok()) << index.status().to_string();
  const std::vector<SavedPiece> parsed = read_checkpoint_pieces(store).value();
  ASSERT_EQ(parsed.size(), 6u);
  EXPECT_EQ(index.value()->pieces, parsed);
  EXPECT_EQ(index.value()->pieces_fingerprint, fingerprint(parsed));
  EXPECT_EQ(index.value()->by_key.at("t").size(), 3u);
  EXPECT_EQ(index.value()->by_key.at("u").size(), 3u);
  EXPECT_EQ(index.value()->problems, std::vector<std::string>(6, ""));
  EXPECT_EQ(index.value()->bytes, store.read_file_shared("metadata.json").value())
      << "keyed by the storage's own bytes";
  // The rest of what metadata.json lists (checkpoint_problem reads it from the index).
  const CheckpointIndex full = read_checkpoint_index(store).value();
  EXPECT_EQ(index.value()->piece_headers, full.piece_headers);
  EXPECT_EQ(index.value()->common_in_common_pt, full.common_in_common_pt);
  ASSERT_EQ(index.value()->objects.size(), full.objects.size());
  ASSERT_EQ(full.objects.size(), 2u);
  for (size_t i = 0; i < full.objects.size(); ++i) {
    EXPECT_EQ(index.value()->objects[i].unique_key, full.objects[i].unique_key);
    EXPECT_EQ(index.value()->objects[i].file, full.objects[i].file);
  }
}

// A CheckpointCaches object belongs to one run (invariant 4): `check --jobs N` gives each case
// its own, so one object shares what it built between its own calls only. Mutations caught:
// the load index kept in a static shared by every object (b served a's index); no cache (a's
// second call parsed again); the decoding memo shared or absent (likewise).
TEST(CheckpointCaches, OneObjectSharesWithinItselfOnly) {
  MemoryStorage store;
  on_ranks(2, [&](int rank, ProcessGroup& pg) {
    save(dict_value({{"iteration", Value(4)}, {"t", piece("t", at::zeros({2}), 4, 2 * rank)}}),
         store, pg);
  });
  CheckpointCaches a;
  CheckpointCaches b;
  const auto from_a = a.load_index(store);
  ASSERT_TRUE(from_a.is_ok()) << from_a.status().to_string();
  EXPECT_EQ(a.load_index(store).value(), from_a.value()) << "one object, one index";
  const auto from_b = b.load_index(store);
  ASSERT_TRUE(from_b.is_ok());
  EXPECT_NE(from_b.value(), from_a.value()) << "another run's object shares nothing with a";
  EXPECT_EQ(from_b.value()->pieces, from_a.value()->pieces);

  const std::vector<char> common = store.read_file("common.pt").value();
  const auto decoded = a.decoded_common_state(common);
  EXPECT_EQ(a.decoded_common_state(common), decoded) << "one object, one decoding";
  const auto decoded_b = b.decoded_common_state(common);
  EXPECT_NE(decoded_b, decoded);
  EXPECT_EQ(decoded_b->dict()->at("iteration").as_int(), 4);
}

// Caches change the work, never the result: a save and a load with a run's caches give what
// they give with none (SaveOptions::caches, LoadOptions::caches null). Mutations caught: the
// uncached path decoding rank 0's common state as None (rank 0 reports differences); the
// uncached load index without its by_key (the load raises the missing key's KeyError).
TEST(CheckpointCaches, NullCachesSaveAndLoadWhatCachesDo) {
  struct Outcome {
    std::vector<std::vector<std::string>> differences;  // per rank
    std::vector<SavedPiece> pieces;
    std::vector<std::vector<float>> loaded;  // per rank
    std::vector<std::vector<std::string>> uncovered;
  };
  auto run = [](CheckpointCaches* caches) {
    MemoryStorage store;
    Outcome out;
    out.differences.resize(2);
    out.loaded.resize(3);
    out.uncovered.resize(3);
    on_ranks(2, [&](int rank, ProcessGroup& pg) {
      const SaveReport report = save(
          dict_value({{"iteration", Value(5)},
                      {"rank_field", Value(rank)},
                      {"t", piece("t", at::arange(3).to(at::kFloat).add(3 * rank), 6, 3 * rank)}}),
          store, pg, {.caches = caches});
      out.differences[static_cast<size_t>(rank)] = report.common_state_differences;
      if (rank == 0) out.pieces = *report.pieces;
    });
    on_ranks(3, [&](int rank, ProcessGroup& pg) {
      LoadOptions options;
      options.caches = caches;
      LoadReport report;
      const Value loaded = load(dict_value({{"t", piece("t", at::zeros({2}), 6, 2 * rank)}}), store,
                                pg, options, &report);
      const at::Tensor t = loaded.dict()->at("t").tensor();
      out.loaded[static_cast<size_t>(rank)] = {t.data_ptr<float>(), t.data_ptr<float>() + 2};
      EXPECT_EQ(loaded.dict()->at("iteration").as_int(), 5);
      out.uncovered[static_cast<size_t>(rank)] = report.uncovered;
    });
    return out;
  };
  CheckpointCaches caches;
  const Outcome with = run(&caches);
  const Outcome without = run(nullptr);
  EXPECT_EQ(without.differences, with.differences);
  EXPECT_TRUE(with.differences[0].empty());
  EXPECT_EQ(with.differences[1].size(), 1u) << "rank 1's rank_field differs from rank 0's";
  EXPECT_EQ(without.pieces, with.pieces);
  EXPECT_EQ(without.loaded, with.loaded);
  EXPECT_EQ(with.loaded[2], (std::vector<float>{4, 5}));
  EXPECT_EQ(without.uncovered, with.uncovered);
}

// read_checkpoint_tensors assembles each key's pieces into its global tensor and refuses, with a
// message naming the file and the key, every piece it cannot place: outside its tensor, past
// the end of its file. Mutations caught: the range check dropped (a piece past its tensor
// writes past the buffer: ReadCheckpointTensorsRefusesAPiecePastItsTensor, under ASan a crash),
// the file-size check dropped (RefusesBytesPastTheFile).
TEST(Serialization, ReadCheckpointTensorsAssemblesPiecesWithGapsAsNaN) {
  MemoryStorage store;
  const std::vector<float> bytes = {1, 2, 3, 4, 5};
  ASSERT_TRUE(
      store
          .write_file("f.bin", std::span<const char>(reinterpret_cast<const char*>(bytes.data()),
                                                     bytes.size() * sizeof(float)))
          .is_ok());
  // key k: [0, 2) from floats 0..1, [3, 5) from floats 2..3; element 2 saved by no one.
  const std::vector<SavedPiece> pieces = {
      {"p.k", "torch.float32", 5, 0, 2, 0, "f.bin", 0},
      {"p.k", "torch.float32", 5, 3, 2, 1, "f.bin", 8},
      {"other", "torch.float32", 1, 0, 1, 0, "f.bin", 16},
  };
  auto r = read_checkpoint_tensors(store, pieces, "p.");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r.value().size(), 1u);
  const std::vector<float>& k = r.value().at("p.k");
  ASSERT_EQ(k.size(), 5u);
  EXPECT_EQ(k[0], 1);
  EXPECT_EQ(k[1], 2);
  EXPECT_TRUE(std::isnan(k[2]));
  EXPECT_EQ(k[3], 3);
  EXPECT_EQ(k[4], 4);
}

TEST(Serialization, ReadCheckpointTensorsRefusesAPiecePastItsTensor) {
  MemoryStorage store;
  const std::vector<char> bytes(64, 0);
  ASSERT_TRUE(store.write_file("f.bin", bytes).is_ok());
  // 4 elements at offset 3 of a tensor of 5: one past the end.
  const std::vector<SavedPiece> past = {{"p.k", "torch.float32", 5, 3, 4, 0, "f.bin", 0}};
  auto r = read_checkpoint_tensors(store, past, "p.");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("f.bin: key p.k: piece [3, 7) outside the tensor's [0, 5)"),
            std::string::npos)
      << r.status().message();
}

TEST(Serialization, ReadCheckpointTensorsRefusesBytesPastTheFile) {
  MemoryStorage store;
  const std::vector<char> bytes(16, 0);  // 4 floats
  ASSERT_TRUE(store.write_file("f.bin", bytes).is_ok());
  const std::vector<SavedPiece> past = {{"p.k", "torch.float32", 8, 0, 4, 0, "f.bin", 4}};
  auto r = read_checkpoint_tensors(store, past, "p.");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("past the end of the file (16 bytes)"), std::string::npos)
      << r.status().message();
  // A forged global size is refused before it sizes the assembled tensor.
  const std::vector<SavedPiece> huge = {
      {"p.k", "torch.float32", int64_t{1} << 40, 0, 4, 0, "f.bin", 0}};
  r = read_checkpoint_tensors(store, huge, "p.");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("a tensor of 1099511627776 elements, over 2147483648"),
            std::string::npos)
      << r.status().message();
  const std::vector<SavedPiece> dtype = {{"p.k", "torch.complex64", 4, 0, 1, 0, "f.bin", 0}};
  EXPECT_FALSE(read_checkpoint_tensors(store, dtype, "p.").is_ok());
}

// A damaged metadata.json (a piece past its file, or past its tensor) fails the load on the
// rank that reads it, as torch's reader does, with the file and the key; it never reads past a
// buffer (issue 11: the harness once crashed here). Mutation caught: the check dropped (the
// read goes past the file's bytes: garbage, under ASan a crash).
TEST(Serialization, LoadOfADamagedPieceRaisesNamingFileAndKey) {
  for (const auto& [field, value, what] :
       std::vector<std::tuple<std::string, int64_t, std::string>>{
           // the file: the piece's 16-byte header, then its 16 bytes
           {"byte_offset", 24, "bytes [24, 40) past the end of the file (32 bytes)"},
           {"global_offset", 2, "piece [2, 6) outside the tensor's [0, 4)"},
           {"numel", -1, "piece [0, -1) outside the tensor's [0, 4)"}}) {
    MemoryStorage store;
    on_ranks(1, [&](int, ProcessGroup& pg) {
      save(dict_value({{"t", piece("t", at::zeros({4}), 4, 0)}}), store, pg);
    });
    auto meta = store.read_file("metadata.json");
    ASSERT_TRUE(meta.is_ok());
    nlohmann::json j = nlohmann::json::parse(meta.value().begin(), meta.value().end());
    j["pieces"][0][field] = value;
    const std::string text = j.dump();
    ASSERT_TRUE(store.write_file("metadata.json", {text.begin(), text.end()}).is_ok());
    on_ranks(1, [&](int rank, ProcessGroup& pg) {
      Runtime rt(1, 0, rank);
      try {
        load(dict_value({{"t", piece("t", at::zeros({4}), 4, 0)}}), store, pg, {});
        ADD_FAILURE() << field << ": a damaged piece loaded";
      } catch (const UpstreamError& e) {
        EXPECT_EQ(e.py_type(), "CheckpointException") << field;
        EXPECT_NE(e.message().find("key t: " + what), std::string::npos) << e.message();
      }
    });
  }
}

// HEAD keeps the common state in the checkpoint ('common_state' ShardedObject, no common.pt):
// HEAD reads it back; an older loader fails the way the real f4502eb1c9 code did on a HEAD
// checkpoint (campaign trace gen-upstream-2874-to-upstream-head-seed17-case10): AttributeError
// from load_common's FileNotFoundError handler. Mutations caught: the switch ignored at save
// (common.pt written, so the old loader succeeds), or at load (HEAD cannot read its own).
TEST(Serialization, HeadCommonStateAsShardedObjectOnlyHeadReads) {
  MemoryStorage store;
  SaveOptions head;
  head.common_state_as_sharded_object = true;
  on_ranks(2, [&](int rank, ProcessGroup& pg) {
    save(dict_value({{"iteration", Value(9)}, {"t", piece("t", at::zeros({2}), 4, 2 * rank)}}),
         store, pg, head);
  });
  EXPECT_FALSE(store.exists("common.pt"));
  EXPECT_EQ(load_common_state_dict(store, true).dict()->at("iteration").as_int(), 9);
  try {
    (void)load_common_state_dict(store, false);
    ADD_FAILURE() << "an older loader must fail on a HEAD checkpoint";
  } catch (const UpstreamError& e) {
    EXPECT_EQ(e.py_type(), "AttributeError");
    EXPECT_EQ(e.site(), "common.py load_common()");
  }
  on_ranks(2, [&](int rank, ProcessGroup& pg) {
    LoadOptions options;
    options.reads_sharded_common_state = true;
    const Value loaded =
        load(dict_value({{"t", piece("t", at::ones({2}), 4, 2 * rank)}}), store, pg, options);
    EXPECT_EQ(loaded.dict()->at("iteration").as_int(), 9);
  });
  // A checkpoint with common.pt is read by both.
  MemoryStorage old;
  on_ranks(1, [&](int, ProcessGroup& pg) { save(dict_value({{"iteration", Value(3)}}), old, pg); });
  EXPECT_EQ(load_common_state_dict(old, false).dict()->at("iteration").as_int(), 3);
  EXPECT_EQ(load_common_state_dict(old, true).dict()->at("iteration").as_int(), 3);
}

// Each piece's bytes follow a header naming it (fidelity audit N5): a metadata.json whose piece
// points at another piece's bytes (what a save killed while it overwrote a committed directory
// leaves: the new shard files under the old metadata.json) fails the load loudly, as the real
// DCP reader does when it unpickles an item at the old offset (tests/conformance/crash/
// crash-overwrites-committed-checkpoint-upstream-head__*). A checkpoint whose metadata.json
// declares no headers (written before them) reads its bytes as before. Mutations caught: the
// header check dropped (u loads t's values silently); the check made unconditional (the
// checkpoint without headers fails).
TEST(Serialization, APieceThatPointsAtAnotherPiecesBytesFailsTheLoadLoudly) {
  MemoryStorage store;
  on_ranks(1, [&](int, ProcessGroup& pg) {
    save(dict_value({{"t", piece("t", at::zeros({4}).add(1.0), 4, 0)},
                     {"u", piece("u", at::zeros({4}).add(2.0), 4, 0)}}),
         store, pg);
  });
  auto meta = store.read_file("metadata.json");
  ASSERT_TRUE(meta.is_ok());
  const nlohmann::json saved = nlohmann::json::parse(meta.value().begin(), meta.value().end());
  ASSERT_EQ(saved["piece_header_bytes"], 16);
  auto rewrite = [&](const nlohmann::json& j) {
    const std::string text = j.dump();
    ASSERT_TRUE(store.write_file("metadata.json", {text.begin(), text.end()}).is_ok());
  };
  auto load_u = [&]() -> std::string {  // "" when it loads, else the error
    std::string out;
    on_ranks(1, [&](int rank, ProcessGroup& pg) {
      Runtime rt(1, 0, rank);
      at::Tensor u = at::zeros({4});
      try {
        load(dict_value({{"u", piece("u", u, 4, 0)}}), store, pg, {});
        EXPECT_TRUE(u.equal(at::zeros({4}).add(2.0))) << u;
      } catch (const UpstreamError& e) {
        EXPECT_EQ(e.py_type(), "CheckpointException");
        out = e.message();
      }
    });
    return out;
  };
  nlohmann::json j = saved;
  ASSERT_EQ(j["pieces"][1]["key"], "u");
  j["pieces"][1]["byte_offset"] = j["pieces"][0]["byte_offset"];  // t's bytes
  rewrite(j);
  EXPECT_EQ(load_u(),
            "shards/rank_0.bin: key u: the bytes at offset 0 are not this piece (another "
            "save's bytes under this metadata.json)");
  // A checkpoint from before the headers: the pieces' bytes back to back, no member.
  auto shard = store.read_file("shards/rank_0.bin");
  ASSERT_TRUE(shard.is_ok());
  ASSERT_EQ(shard.value().size(), 64u);  // two 16-byte headers, two pieces of 16 bytes
  std::vector<char> bare(shard.value().begin() + 16, shard.value().begin() + 32);
  bare.insert(bare.end(), shard.value().begin() + 48, shard.value().end());
  ASSERT_TRUE(store.write_file("shards/rank_0.bin", bare).is_ok());
  j = saved;
  j.erase("piece_header_bytes");
  j["pieces"][0]["byte_offset"] = 0;
  j["pieces"][1]["byte_offset"] = 16;
  rewrite(j);
  EXPECT_EQ(load_u(), "");
}
