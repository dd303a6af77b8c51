#include "model/megatron/serialization.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>

#include "model/errors.h"
#include "model/megatron/mapping.h"
#include "model/py/host_tensor.h"
#include "model/py/pickle_codec.h"

namespace ckptsim::model {

using namespace own_format;

namespace {

void throw_if_error(const Status& s) {
  if (!s.is_ok()) throw CheckpointingException(s.to_string(), "serialization.py (storage)");
}

// A failed write of the save, raised as the real save raises it (seen with ENOSPC on the H200,
// reports/crash-replay-2026-12-05.md): torch.distributed.checkpoint's writers collect a rank's
// .distcp write error and its finalize raises it as CheckpointException; the coordinator's
// .metadata write raises the OSError itself (filesystem_async.py finish()); common.pt's is
// save_common()'s OSError.
enum class SaveWrite { kDistcp, kMetadata, kCommonPt };
void throw_if_write_failed(const Status& s, SaveWrite what) {
  if (s.is_ok()) return;
  switch (what) {
    case SaveWrite::kDistcp:
      throw UpstreamError("CheckpointException", s.to_string(),
                          "state_dict_saver.py save_state_dict_async_finalize()");
    case SaveWrite::kMetadata:
      throw UpstreamError("OSError", s.to_string(), "filesystem_async.py finish()");
    case SaveWrite::kCommonPt:
      throw UpstreamError("OSError", s.to_string(), "common.py save_common()");
  }
}

at::ScalarType dtype_from_name(const std::string& name) {
  if (auto t = dtype_from_name_checked(name)) return *t;
  throw CheckpointingException(std::string("unknown dtype ") + name + " in " + kMetadataFile,
                               "serialization.py load()");
}

// validation.py _validate_common_state_dict's diff(): paths only on one side and mismatches.
void diff_values(const Value& a, const Value& b, KeyPath& path, std::vector<std::string>& out) {
  if (a.is_dict() && b.is_dict()) {
    for (const auto& [k, v] : *a.dict()) {
      path.push_back(k);
      if (const Value* w = b.dict()->find(k)) {
        diff_values(v, *w, path, out);
      } else {
        out.push_back("only on rank 0: " + repr(path));
      }
      path.pop_back();
    }
    for (const auto& [k, v] : *b.dict()) {
      if (!a.dict()->contains(k)) {
        path.push_back(k);
        // (a None here carries no state: what fully_reshardable's mem_efficient save returns
        // for the param state on every DP rank but 0, where rank 0 saved it sharded)
        out.push_back((v.is_none() ? "missing on rank 0 (None here): " : "missing on rank 0: ") +
                      repr(path));
        path.pop_back();
      }
    }
    return;
  }
  if (a.is_list() && b.is_list()) {
    const size_t n = std::min(a.list()->size(), b.list()->size());
    if (a.list()->size() != b.list()->size()) {
      out.push_back(fmt::format("list length {} on rank 0 vs {} here: {}", a.list()->size(),
                                b.list()->size(), repr(path)));
    }
    for (size_t i = 0; i < n; ++i) {
      path.emplace_back(static_cast<int64_t>(i));
      diff_values(a.list()->at(i), b.list()->at(i), path, out);
      path.pop_back();
    }
    return;
  }
  bool equal = false;
  auto scalar_text = [](const Value& v) {
    // A symbol comes back from a pickle as its name string.
    return v.kind() == Value::Kind::kSymbol ? py_str_repr(v.as_symbol().name) : v.repr();
  };
  if ((a.kind() == Value::Kind::kSymbol) != (b.kind() == Value::Kind::kSymbol)) {
    equal = !a.is_container() && !b.is_container() && !a.is_tensor() && !b.is_tensor() &&
            scalar_text(a) == scalar_text(b);
  } else if (a.is_tensor() && b.is_tensor()) {
    const at::Tensor& x = a.tensor();
    const at::Tensor& y = b.tensor();
    equal = x.scalar_type() == y.scalar_type() && x.sizes() == y.sizes() &&
            std::memcmp(x.to(at::kCPU).contiguous().data_ptr(),
                        y.to(at::kCPU).contiguous().data_ptr(), x.numel() * x.element_size()) == 0;
  } else if (!a.is_tensor() && !b.is_tensor() && !a.is_container() && !b.is_container()) {
    equal = py_equal(a, b);
  }
  if (!equal) out.push_back("values differ: " + repr(path));
}

// Strips 'param_state' subtrees below any 'optimizer' key (LoadOptions.strip_common_param_state).
void strip_param_state(Value& v, bool under_optimizer) {
  if (v.is_dict()) {
    if (under_optimizer) v.dict()->erase("param_state");
    for (auto& [k, child] : *v.dict())
      strip_param_state(child, under_optimizer || k == Key("optimizer"));
  } else if (v.is_list()) {
    for (auto& child : *v.list()) strip_param_state(child, under_optimizer);
  }
}

}  // namespace

SaveReport save(const Value& sharded_state_dict, Storage& storage, ProcessGroup& group,
                const SaveOptions& options) {
  SaveReport report;
  const int rank = group.rank();
  // save_preprocess: (factories: none modeled) drop LNOs, split sharded part and common.
  auto [nonpersistent, persistent] = extract_nonpersistent(sharded_state_dict);
  (void)nonpersistent;
  auto [sharded_part, common] = extract_sharded_base(persistent);

  // validate_sharding_integrity(common): rank 0's common state against every rank's.
  const std::vector<char> common_bytes = rank == 0 ? pickle_value(common) : std::vector<char>{};
  const std::vector<char> rank0_common = group.broadcast_object(common_bytes, 0);
  {
    // Every rank decodes the same bytes and only reads what they decode to: the ranks of a run
    // share one decoding where the run lends its caches.
    const std::shared_ptr<const Value> rank0_decoded =
        decoded_common_state(rank0_common, options.caches);
    KeyPath path;
    diff_values(*rank0_decoded, common, path, report.common_state_differences);
  }

  // Sharded objects: main replicas unique per unique_key (checked on rank 0 after gathering).
  // save(): common_strategy.save_common() writes common.pt before the sharded strategy writes
  // anything (an ENOSPC or a crash there leaves no .distcp: seen on the H200,
  // reports/crash-replay-2026-12-05.md).
  if (!options.common_state_as_sharded_object && rank == 0)
    throw_if_write_failed(storage.write_file(kCommonFile, common_bytes), SaveWrite::kCommonPt);
  RankEntries mine;
  std::vector<char> blob;
  for (const auto& [path, leaf] : nested_items(sharded_part)) {
    if (leaf.is_sharded_object()) {
      const ShardedObject& so = *leaf.sharded_object();
      const bool main = is_main_replica(so.replica_id);
      mine.objects.emplace_back(so.unique_key(), main);
      if (main)
        throw_if_error(storage.write_file(object_file(so.unique_key()), pickle_value(so.data)));
      continue;
    }
    CKPTSIM_CHECK(leaf.is_sharded_tensor(), "sharded part holds a non-ShardedBase leaf");
    const ShardedTensor& st = *leaf.sharded_tensor();
    if (!is_main_replica(st.replica_id)) continue;
    const at::Tensor data = st.data.to(at::kCPU).contiguous();
    const auto* bytes = static_cast<const char*>(data.data_ptr());
    const int64_t elem = data.element_size();
    for (const FlatRun& run : flat_runs(st)) {
      SavedPiece p;
      p.key = st.key;
      p.dtype = torch_dtype_name(data.scalar_type());
      p.global_numel = global_numel_of(st);
      p.global_offset = run.global_offset;
      p.numel = run.numel;
      p.rank = rank;
      p.file = rank_file(rank);
      append_piece_header(blob, p);
      blob.insert(blob.end(), bytes + run.local_offset * elem,
                  bytes + (run.local_offset + run.numel) * elem);
      mine.pieces.push_back(std::move(p));
    }
  }
  if (options.common_state_as_sharded_object) {
    // HEAD: sharded_state_dict['common_state'] = ShardedObject(...) on every rank, rank 0's
    // the main replica.
    mine.objects.emplace_back(kCommonStateObjectKey, rank == 0);
    if (rank == 0)  // an item of rank 0's .distcp in the real save
      throw_if_write_failed(storage.write_file(object_file(kCommonStateObjectKey), common_bytes),
                            SaveWrite::kDistcp);
  }
  if (rank == 0) {
    if (const auto globals = class_globals(common); !globals.empty()) {
      const std::string text = nlohmann::json(globals).dump();
      throw_if_error(storage.write_file(kCommonGlobalsFile, {text.begin(), text.end()}));
    }
  }
  if (!mine.pieces.empty())
    throw_if_write_failed(storage.write_file(rank_file(rank), blob), SaveWrite::kDistcp);

  // Gather every rank's pieces and objects; rank 0 validates and writes the metadata. Every
  // rank decodes the same entries: once, shared, where the group shares what it gathered.
  const std::shared_ptr<const GatheredEntries> entries =
      group.all_gather_object_shared(encode_entries(mine))
          ->derived<GatheredEntries>(decode_gathered);
  report.pieces = std::shared_ptr<const std::vector<SavedPiece>>(entries, &entries->pieces);
  report.pieces_fingerprint = entries->pieces_fingerprint;
  for (const auto& [k, count] : entries->main_replicas) {
    if (count > 1) {
      throw CheckpointingException(
          fmt::format("Invalid access pattern for ShardedObject {}: {} main replicas", k, count),
          "validation.py validate_sharding_integrity()");
    }
  }
  if (rank == 0) {
    const std::string text = metadata_json(!options.common_state_as_sharded_object, *report.pieces,
                                           entries->object_order);
    const std::vector<char> metadata(text.begin(), text.end());
    throw_if_write_failed(storage.write_file(kMetadataFile, metadata), SaveWrite::kMetadata);
    // The next load of these bytes finds their index built (it equals a parse: the text
    // holds every field of every piece).
    if (options.caches != nullptr) {
      options.caches->prime_load_index(storage, *report.pieces, entries->object_order,
                                       !options.common_state_as_sharded_object, metadata);
    }
  }
  group.barrier();
  return report;
}

Value load_common_state_dict(const Storage& storage, bool reads_sharded_common_state,
                             bool allows_class_globals) {
  constexpr const char* kSite = "common.py load_common()";
  if (!storage.exists(kCommonFile) &&
      (!reads_sharded_common_state || !storage.exists(object_file(kCommonStateObjectKey)))) {
    if (!reads_sharded_common_state)
      throw UpstreamError("AttributeError", "'str' object has no attribute 'iterdir'", kSite);
    throw PyKeyError(py_str_repr(std::string(kCommonStateObjectKey)) + " not in checkpoint",
                     "serialization.py load_common_state_dict()");
  }
  // common.pt goes through load_common()'s torch.load (weights_only=True, torch >= 2.6's
  // default), which refuses the first class the pickle names. HEAD's 'common_state' object does
  // not: torch.distributed.checkpoint's DefaultLoadPlanner.load_bytes already unpickles it with
  // weights_only=False, so load_common_state_dict's own torch.load(weights_only=True) branch
  // (for a BytesIO still unread) never runs. The H200 showed it: every fully reshardable resume
  // of the HDO at upstream-head loaded (TP/PP campaign 2026-12-04, 8 scenarios).
  if (!allows_class_globals && storage.exists(kCommonFile) && storage.exists(kCommonGlobalsFile)) {
    const auto bytes = storage.read_file(kCommonGlobalsFile);
    std::string first = "?";
    if (bytes.is_ok()) {
      const auto j = nlohmann::json::parse(bytes.value().begin(), bytes.value().end(), nullptr,
                                           /*allow_exceptions=*/false);
      if (j.is_array() && !j.empty() && j[0].is_string()) first = j[0].get<std::string>();
    }
    throw UpstreamError(
        "UnpicklingError",
        fmt::format("Weights only load failed. WeightsUnpickler error: Unsupported global: GLOBAL "
                    "{} was not an allowed global by default.",
                    first),
        kSite);
  }
  // An empty common.pt (a write cut short before its first whole page): torch.load's unpickler
  // finds no input, and load_common() lets its EOFError through (seen on the H200,
  // reports/crash-replay-2026-12-05.md).
  auto read = read_common_state_bytes(storage);
  if (read.is_ok() && read.value().file == kCommonFile && read.value().bytes->empty())
    throw UpstreamError("EOFError", "Ran out of input", kSite);
  auto common = read.is_ok() ? unpickle_value(*read.value().bytes) : Result<Value>(read.status());
  if (!common.is_ok()) throw CheckpointingException(common.status().to_string(), kSite);
  return common.value();
}

void SaveReport::check_pieces_unchanged() const {
  CKPTSIM_CHECK(pieces != nullptr, "a save report without pieces");
  CKPTSIM_CHECK(fingerprint(*pieces) == pieces_fingerprint,
                fmt::format("the {} saved pieces every rank shares were written after the save "
                            "decoded them",
                            pieces->size()));
}

namespace {

// torch.distributed.checkpoint's load_state_dict(), its "read" step (_DistWrapper.all_gather):
// every rank runs its reads, the results are gathered, and when any rank's raised, every rank
// raises one CheckpointException naming the ranks that failed, with the first one's error (as
// "CheckpointException ranks:dict_keys([0, 1])" and each rank's traceback upstream). Only the
// errors the model's reads raise as CheckpointException are gathered; the others leave the
// rank at once (their peers see it abort).
void read_gathering_errors(ProcessGroup& group, const std::function<void()>& read) {
  std::string failure;
  try {
    read();
  } catch (const UpstreamError& e) {
    if (e.py_type() != "CheckpointException") throw;
    failure = e.message().empty() ? std::string("CheckpointException") : e.message();
  }
  const std::vector<std::vector<char>> results =
      group.all_gather_object(std::vector<char>(failure.begin(), failure.end()));
  std::string ranks;
  const std::vector<char>* first = nullptr;
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].empty()) continue;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    if (first == nullptr) first = &results[r];
  }
  if (first == nullptr) return;
  throw UpstreamError("CheckpointException",
                      fmt::format("CheckpointException ranks:dict_keys([{}]): {}", ranks,
                                  std::string(first->begin(), first->end())),
                      "torch.py load()");
}

}  // namespace

Value load(const Value& sharded_state_dict, const Storage& storage, ProcessGroup& group,
           const LoadOptions& options, LoadReport* report) {
  auto index_r = load_index(storage, options.caches);
  if (!index_r.is_ok()) {
    // A .metadata that is there but does not read (cut short): torch.distributed.checkpoint's
    // load finds no metadata and raises CheckpointException, at HEAD first from the read of the
    // 'common_state' object, before it from the model's load (both seen on the H200,
    // reports/crash-replay-2026-12-05.md). No .metadata: no distributed checkpoint.
    if (storage.exists(kMetadataFile)) {
      throw UpstreamError("CheckpointException",
                          "AssertionError: metadata is None (" + index_r.status().to_string() + ")",
                          options.reads_sharded_common_state
                              ? "serialization.py load_common_state_dict()"
                              : "torch.py load()");
    }
    throw CheckpointingException(index_r.status().to_string(),
                                 "serialization.py verify_checkpoint_and_load_strategy()");
  }
  const std::shared_ptr<const LoadIndex> index = std::move(index_r.value());
  const std::map<std::string, std::vector<const SavedPiece*>>& by_key = index->by_key;

  Value common = load_common_state_dict(storage, options.reads_sharded_common_state,
                                        options.allows_class_globals);
  if (options.strip_common_param_state) strip_param_state(common, false);

  // load_preprocess: structural copy, LNOs extracted and unwrapped (same objects).
  Value sd = extract_matching_values(sharded_state_dict, [](const Value&) { return true; }).first;
  auto [nonpersistent, rest] = extract_nonpersistent(sd);
  dict_list_map_inplace([](const Value& v) { return v.nonpersistent()->unwrap(); }, nonpersistent);
  merge(common, nonpersistent, options.merge);
  Value sharded = extract_sharded_base(rest).first;
  // validation.py determine_global_metadata: all_gather_object of every rank's metadata.
  (void)group.all_gather_object_shared({});

  // torch_dist load: every ShardedTensor in place, every ShardedObject anew.
  std::map<std::string, std::vector<char>> files;
  auto file_bytes = [&](const std::string& f) -> const std::vector<char>& {
    auto it = files.find(f);
    if (it == files.end()) {
      auto r = storage.read_file(f);
      throw_if_error(r.is_ok() ? Status::ok() : r.status());
      it = files.emplace(f, std::move(r.value())).first;
    }
    return it->second;
  };
  // A damaged metadata.json: torch's reader fails the load on that rank, wrapped as a missing
  // key is. Every piece of a key is checked against its tensor; the pieces this rank reads,
  // against their files too (no other file is read).
  auto fail_if = [](const SavedPiece& p, const std::string& problem) {
    if (!problem.empty()) {
      throw UpstreamError("CheckpointException",
                          fmt::format("{}: key {}: {}", p.file, p.key, problem), "torch.py load()");
    }
  };
  // Reads the key's elements [want_begin, want_end) (global, flattened) into `dst` from the
  // pieces that cover them, and reports what none covered. `skipped`: fault site
  // load.skip_piece has skipped its piece of this key (false: skip the first one met).
  auto read_run = [&](const std::string& key, int64_t want_begin, int64_t want_end,
                      at::Tensor dst_run, const std::vector<const SavedPiece*>& pieces,
                      bool& skipped) {
    std::vector<std::pair<int64_t, int64_t>> covered;
    for (const SavedPiece* p : pieces) {
      const int64_t begin = std::max(want_begin, p->global_offset);
      const int64_t end = std::min(want_end, p->global_offset + p->numel);
      if (begin >= end) continue;
      if (!skipped) {  // fault site load.skip_piece: the first piece this rank needs
        skipped = true;
        continue;
      }
      // What stands where the piece should be: "" when it reads whole.
      auto damage = [&](const std::vector<char>& file) {
        return piece_damage(*p, file, index->piece_headers);
      };
      if (options.skip_damaged_pieces &&
          (!storage.exists(p->file) || !damage(file_bytes(p->file)).empty())) {
        continue;  // fault site load.skip_damaged_pieces
      }
      const std::vector<char>& bytes = file_bytes(p->file);
      fail_if(*p, damage(bytes));
      const at::ScalarType dtype = dtype_from_name(p->dtype);
      const size_t elem = c10::elementSize(dtype);
      const size_t at_byte = static_cast<size_t>(p->byte_offset) +
                             static_cast<size_t>(begin - p->global_offset) * elem;
      host::copy_bytes(host::narrow(dst_run, begin - want_begin, end - begin), dtype,
                       std::as_bytes(std::span(bytes.data() + at_byte,
                                               static_cast<size_t>(end - begin) * elem)));
      covered.emplace_back(begin, end);
    }
    std::sort(covered.begin(), covered.end());
    int64_t cursor = want_begin;
    auto gap = [&](int64_t b, int64_t e) {
      if (report == nullptr) return;
      report->uncovered.push_back(fmt::format("{}[{}:{}]", key, b, e));
      report->unwritten.push_back({key, b, e - b, /*missing_key=*/false});
    };
    for (const auto& [b, e] : covered) {
      if (b > cursor) gap(cursor, b);
      cursor = std::max(cursor, e);
    }
    if (cursor < want_end) gap(cursor, want_end);
  };
  const auto read_every_leaf = [&] {
    dict_list_map_inplace(
        [&](const Value& leaf) -> Value {
          if (leaf.is_sharded_object()) {
            const ShardedObject& so = *leaf.sharded_object();
            if (!storage.exists(object_file(so.unique_key()))) {
              throw PyKeyError(py_str_repr(so.unique_key()) + " not in checkpoint",
                               "torch.py load()");
            }
            auto obj = unpickle_value(file_bytes(object_file(so.unique_key())));
            if (!obj.is_ok())
              throw CheckpointingException(obj.status().to_string(), "torch.py load()");
            return obj.value();
          }
          CKPTSIM_CHECK(leaf.is_sharded_tensor(),
                        "request holds a non-ShardedBase leaf after extraction");
          const ShardedTensor& st = *leaf.sharded_tensor();
          auto it = by_key.find(st.key);
          if (it == by_key.end()) {
            // LoadOptions::allow_missing_keys (RX allow_partial_load): logged, skipped; the
            // request's tensor keeps what it held.
            if (options.allow_missing_keys) {
              if (report != nullptr) {
                report->uncovered.push_back(st.key + ": not in the checkpoint, skipped");
                for (const FlatRun& run : flat_runs(st)) {
                  report->unwritten.push_back(
                      {st.key, run.global_offset, run.numel, /*missing_key=*/true});
                }
              }
              return Value(st.data);
            }
            std::string keys;
            size_t shown = 0;
            for (const auto& [k, _] : by_key) {
              if (shown++ == 4) {
                keys += ", ...";
                break;
              }
              keys += (keys.empty() ? "" : ", ") + py_str_repr(k);
            }
            // torch.distributed.checkpoint's planner raises the KeyError on the reading rank and
            // the load reports it wrapped in a CheckpointException (seen on the real code).
            throw UpstreamError(
                "CheckpointException",
                "KeyError: " +
                    py_str_repr(st.key + " from model not in state dict: [" + keys + "]"),
                "torch.py load()");
          }
          const int64_t saved_global = it->second.front()->global_numel;
          if (saved_global != global_numel_of(st)) {
            throw CheckpointingException(
                fmt::format(
                    "Global shape mismatch for loaded ({}) and expected ({}) tensor for key {}",
                    shape_repr({saved_global}), shape_repr(st.global_shape), st.key),
                "torch.py _validate_global_shapes()");
          }
          for (const SavedPiece* p : it->second) {
            fail_if(*p, index->problems[static_cast<size_t>(p - index->pieces.data())]);
          }
          bool skipped =
              !options.skip_optimizer_piece || !std::string_view(st.key).starts_with("optimizer.");
          const at::Tensor flat = host::view_flat(st.data);
          for (const FlatRun& run : flat_runs(st)) {
            read_run(st.key, run.global_offset, run.global_offset + run.numel,
                     host::narrow(flat, run.local_offset, run.numel), it->second, skipped);
          }
          return Value(st.data);
        },
        sharded);
  };
  if (options.gathers_read_errors) {
    read_gathering_errors(group, read_every_leaf);
  } else {
    read_every_leaf();
  }
  merge(common, sharded, options.merge);
  return common;
}

}  // namespace ckptsim::model
