#include "model/megatron/torch_dist_writer.h"

#include <ATen/ops/empty.h>

#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "model/errors.h"
#include "model/megatron/chained_optimizer.h"
#include "model/megatron/serialization.h"
#include "model/megatron/torch_dist_checkpoint.h"
#include "model/py/pickle_codec.h"
#include "model/torch/distributed_checkpoint.h"
#include "model/torch/torch_save_format.h"

namespace ckptsim::model {

namespace {

constexpr std::string_view kCommonStateUniqueKey = "common_state/shard_0_1";

std::string join(const std::string& dir, std::string_view name) {
  return dir.empty() ? std::string(name) : dir + "/" + std::string(name);
}

// Undoes what the own format's codec loses (see the header): a str "<class 'M.C'>" becomes
// the class symbol again, renamed where the options say. Dicts and lists are changed in place
// (aliasing kept); a tuple holding such a str is rebuilt.
class SymbolRestorer {
 public:
  explicit SymbolRestorer(const std::map<std::string, std::string>& renames) : renames_(renames) {}

  Value restore(const Value& v, size_t depth = 0) {
    CKPTSIM_CHECK(depth <= kTorchSaveDepthMax, "SymbolRestorer: nesting over kTorchSaveDepthMax");
    if (v.is_str() || v.kind() == Value::Kind::kSymbol) {
      const std::string& text = v.is_str() ? v.as_str() : v.as_symbol().name;
      const std::optional<std::string> cls = class_global(text);
      if (!cls) return v;
      const auto renamed = renames_.find(*cls);
      return Value::symbol("<class '" + (renamed == renames_.end() ? *cls : renamed->second) +
                           "'>");
    }
    if (v.is_dict()) {
      if (!seen_.insert(v.dict().get()).second) return v;
      for (auto& [k, child] : *v.dict()) child = restore(child, depth + 1);
      return v;
    }
    if (v.is_list()) {
      if (!seen_.insert(v.list().get()).second) return v;
      for (auto& child : *v.list()) child = restore(child, depth + 1);
      return v;
    }
    if (v.is_tuple()) {
      std::vector<Value> items;
      bool changed = false;
      for (const Value& item : v.as_tuple()) {
        items.push_back(restore(item, depth + 1));
        changed = changed || !items.back().is(item);
      }
      return changed ? Value::tuple(std::move(items)) : v;
    }
    return v;
  }

 private:
  const std::map<std::string, std::string>& renames_;
  std::set<const void*> seen_;  // only looked up
};

// checkpointing.py _build_sharded_state_dict_metadata, what save_checkpoint passes as
// content_metadata for the distributed optimizer (see the header).
void add_content_metadata(Value& common) {
  Dict& d = *common.dict();
  if (d.contains("content_metadata")) return;
  const Value* type = saved_param_state_sharding_type(d.find("optimizer"));
  if (type == nullptr || !type->is_str()) return;
  d.set("content_metadata", dict_value({{"distrib_optim_sharding_type", *type},
                                        {"singleton_local_shards", Value(false)},
                                        {"chained_optim_avoid_prefix", Value(true)}}));
}

Result<Value> read_object(const Storage& source, const std::string& file,
                          SymbolRestorer& restorer) {
  Result<std::vector<char>> bytes = source.read_file(file);
  if (!bytes.is_ok()) return bytes.status();
  Result<Value> v = unpickle_value(bytes.value());
  if (!v.is_ok()) return Status::corruption(file + ": " + v.status().message());
  return restorer.restore(v.value());
}

// strategies/torch.py _mcore_to_torch_sharded_object: torch.save([sh_obj.data]).
Result<std::vector<char>> sharded_object_bytes(const Value& data, bool weights_only,
                                               const std::string& key) {
  Result<std::vector<char>> blob =
      torch_save(list_value({data}), TorchSaveOptions{.weights_only = weights_only});
  if (!blob.is_ok())
    return Status::invalid_input("object '" + key + "': " + blob.status().message());
  return blob;
}

// Every piece of the source as a chunk of its rank.
Status collect_chunks(const Storage& source, const std::vector<SavedPiece>& pieces,
                      bool piece_headers, std::vector<DcpRankToWrite>& ranks) {
  std::map<std::string, std::vector<char>> files;
  for (const SavedPiece& p : pieces) {
    const std::string where =
        fmt::format("{}: key '{}' piece at {}", p.file, p.key, p.global_offset);
    const std::optional<at::ScalarType> dtype = dtype_from_global(p.dtype);
    if (!dtype) return Status::corruption(where + ": unknown dtype " + p.dtype);
    if (p.rank < 0 || p.numel < 0 || p.global_offset < 0 ||
        p.global_offset > p.global_numel - p.numel) {
      return Status::corruption(fmt::format("{}: rank {}, {} elements outside the tensor's {}",
                                            where, p.rank, p.numel, p.global_numel));
    }
    auto it = files.find(p.file);
    if (it == files.end()) {
      Result<std::vector<char>> bytes = source.read_file(p.file);
      if (!bytes.is_ok()) return bytes.status();
      it = files.emplace(p.file, std::move(bytes.value())).first;
    }
    const size_t n = static_cast<size_t>(p.numel) * c10::elementSize(*dtype);
    // Out of bounds, or another save's bytes where the piece should be: exported, they would
    // pass for its values.
    if (std::string problem = piece_damage(p, it->second, piece_headers); !problem.empty())
      return Status::corruption(where + ": " + problem);
    at::Tensor t = at::empty({p.numel}, at::TensorOptions().dtype(*dtype));
    if (n > 0) std::memcpy(t.data_ptr(), it->second.data() + p.byte_offset, n);
    while (ranks.size() <= size_t(p.rank)) {
      ranks.push_back(DcpRankToWrite{static_cast<int64_t>(ranks.size()), {}, {}});
    }
    ranks[p.rank].chunks.push_back(DcpChunkToWrite{p.key, {p.global_numel}, {p.global_offset}, t});
  }
  if (ranks.empty()) ranks.push_back(DcpRankToWrite{0, {}, {}});
  return Status::ok();
}

// core.py save_config: json.dumps of the CheckpointingConfig fields that are set.
std::string megatron_metadata_json(bool common_pt) {
  std::string out = R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1)";
  if (common_pt) out += R"(, "common_backend": "torch", "common_backend_version": 1)";
  return out + "}";
}

Status write_text(Storage& target, const std::string& path, const std::string& text) {
  return target.write_file(path, std::span<const char>(text.data(), text.size()));
}

}  // namespace

Status parse_class_rename(const std::string& text, std::map<std::string, std::string>& renames) {
  const size_t eq = text.find('=');
  const auto is_class = [](const std::string& name) {
    return class_global("<class '" + name + "'>").has_value();
  };
  if (eq == std::string::npos || !is_class(text.substr(0, eq)) || !is_class(text.substr(eq + 1))) {
    return Status::invalid_input("'" + text +
                                 "': expected module.Class=module.Class, e.g. "
                                 "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam="
                                 "replay.emulation.StandinFusedAdam");
  }
  renames[text.substr(0, eq)] = text.substr(eq + 1);
  return Status::ok();
}

namespace {

// The common state as exported (classes restored, content_metadata added) and its iteration.
Result<Value> exported_common(const Storage& source, const CheckpointIndex& index,
                              SymbolRestorer& restorer, int64_t& iteration) {
  Result<Value> common_read = read_common_state(source);
  if (!common_read.is_ok()) return common_read.status();
  Value common = restorer.restore(common_read.value());
  const std::string where = index.common_in_common_pt ? "common.pt" : "the common_state object";
  if (!common.is_dict()) return Status::corruption(where + ": the common state is no dict");
  const Value* it_value = common.dict()->find("iteration");
  if (it_value == nullptr || !it_value->is_int() || it_value->as_int() < 0 ||
      it_value->as_int() > kIterationMax) {
    return Status::corruption(where + ": no iteration (an int) in the common state");
  }
  iteration = it_value->as_int();
  add_content_metadata(common);
  return common;
}

// Every ShardedObject as rank 0's bytes item (the common state's too, where it is one).
Status add_objects(const Storage& source, const CheckpointIndex& index, SymbolRestorer& restorer,
                   const Value& common, std::vector<DcpRankToWrite>& ranks) {
  for (const SavedObject& o : index.objects) {
    if (o.unique_key == kCommonStateUniqueKey) continue;  // below, with content_metadata
    Result<Value> data = read_object(source, o.file, restorer);
    if (!data.is_ok()) return data.status();
    Result<std::vector<char>> bytes =
        sharded_object_bytes(data.value(), /*weights_only=*/false, o.unique_key);
    if (!bytes.is_ok()) return bytes.status();
    ranks[0].bytes_items.push_back(DcpBytesToWrite{o.unique_key, std::move(bytes.value())});
  }
  if (!index.common_in_common_pt) {
    Result<std::vector<char>> bytes =
        // HEAD's load_common_state_dict: torch.distributed.checkpoint unpickles the object
        // with weights_only=False, so classes (the HDO's param groups) load.
        sharded_object_bytes(common, /*weights_only=*/false, std::string(kCommonStateUniqueKey));
    if (!bytes.is_ok()) return bytes.status();
    ranks[0].bytes_items.push_back(
        DcpBytesToWrite{std::string(kCommonStateUniqueKey), std::move(bytes.value())});
  }
  return Status::ok();
}

}  // namespace

Result<TorchDistExportReport> export_torch_dist_checkpoint(const Storage& source, Storage& target,
                                                           const std::string& dir,
                                                           const TorchDistExportOptions& options) {
  Result<CheckpointIndex> index = read_checkpoint_index(source);
  if (!index.is_ok()) return index.status();
  SymbolRestorer restorer(options.class_renames);
  TorchDistExportReport report;
  Result<Value> common = exported_common(source, index.value(), restorer, report.iteration);
  if (!common.is_ok()) return common.status();
  if (options.without_training_loop_state) {
    for (const char* k : {"iteration", "checkpoint_version", "args", "opt_param_scheduler"})
      common.value().dict()->erase(k);
  }
  report.iter_dir = join(dir, iteration_dir_name(report.iteration));
  report.common_pt = index.value().common_in_common_pt;

  std::vector<DcpRankToWrite> ranks;
  if (Status s = collect_chunks(source, index.value().pieces, index.value().piece_headers, ranks);
      !s.is_ok())
    return s;
  if (Status s = add_objects(source, index.value(), restorer, common.value(), ranks); !s.is_ok())
    return s;

  DcpWriteOptions dcp;
  dcp.checkpoint_id = options.checkpoint_root.empty()
                          ? report.iter_dir
                          : join(options.checkpoint_root, iteration_dir_name(report.iteration));
  Result<DcpMetadata> written = write_dcp_checkpoint(target, report.iter_dir, ranks, dcp);
  if (!written.is_ok()) return written.status();
  for (const DcpRankToWrite& r : ranks) {
    if (!r.chunks.empty() || !r.bytes_items.empty()) ++report.writer_ranks;
    report.chunks += static_cast<int64_t>(r.chunks.size());
  }
  report.tensors = static_cast<int64_t>(written.value().tensors.size());
  report.objects = static_cast<int64_t>(written.value().bytes_items.size());

  if (report.common_pt) {
    Result<std::vector<char>> bytes = torch_save(common.value());
    if (!bytes.is_ok()) return Status::invalid_input("common.pt: " + bytes.status().message());
    if (Status s = target.write_file(join(report.iter_dir, kCommonStateFile), bytes.value());
        !s.is_ok()) {
      return s;
    }
  }
  if (Status s = write_text(target, join(report.iter_dir, "metadata.json"),
                            megatron_metadata_json(report.common_pt));
      !s.is_ok()) {
    return s;
  }
  if (options.without_training_loop_state) return report;
  if (Status s = write_text(target, join(dir, kTrackerFile), std::to_string(report.iteration));
      !s.is_ok()) {
    return s;
  }
  return report;
}

}  // namespace ckptsim::model
