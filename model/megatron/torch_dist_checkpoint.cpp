#include "model/megatron/torch_dist_checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "model/json_depth.h"
#include "model/megatron/chained_optimizer.h"
#include "model/py/key.h"
#include "model/torch/distributed_checkpoint.h"
#include "model/torch/torch_save_format.h"

namespace ckptsim::model {

namespace {

// A bound on the parts read from 'chained_<i>.' keys (Megatron chains a few: dense, expert).
constexpr int64_t kChainedPartsMax = 64;

std::string join(const std::string& dir, std::string_view name) {
  return dir.empty() ? std::string(name) : dir + "/" + std::string(name);
}

// "<key>/shard_<offset>_<shape>" -> "<key>" for the (0,)/(1,) shard Megatron's optimizer and
// common state use; any other unique key stays as it is.
std::string object_key(const std::string& unique_key) {
  constexpr std::string_view kSingleShard = "/shard_0_1";
  if (unique_key.ends_with(kSingleShard)) {
    return unique_key.substr(0, unique_key.size() - kSingleShard.size());
  }
  return unique_key;
}

Status read_sharded(DcpReader& reader, TorchDistCheckpoint& out) {
  DictPtr sharded = Dict::make();
  for (const auto& [fqn, meta] : reader.metadata().tensors) {
    Result<at::Tensor> t = reader.read_tensor(fqn);
    if (!t.is_ok()) return t.status();
    sharded->set(fqn, Value(t.value()));
  }
  for (const std::string& fqn : reader.metadata().bytes_items) {
    Result<std::vector<char>> bytes = reader.read_bytes(fqn);
    if (!bytes.is_ok()) return bytes.status();
    const StorageInfo* info = reader.metadata().find(fqn, std::nullopt);
    const std::string where = reader.path(info->relative_path) + ": key " + py_str_repr(fqn);
    Result<Value> obj = load_torch_save(bytes.value());
    if (!obj.is_ok()) return Status::corruption(where + ": " + obj.status().message());
    // strategies/torch.py saves torch.save([sh_obj.data for sh_obj in sh_objs]).
    if (!obj.value().is_list() || obj.value().list()->size() != 1) {
      return Status::corruption(where + ": a ShardedObject item that is not a list of one object");
    }
    const std::string key = object_key(fqn);
    if (sharded->contains(key)) {
      return Status::corruption(where + ": key " + py_str_repr(key) + " twice");
    }
    sharded->set(key, obj.value().list()->at(0));
    out.object_unique_keys.emplace(key, fqn);
  }
  out.sharded = Value(sharded);
  return Status::ok();
}

Status read_common(const Storage& storage, const std::string& iter_dir, TorchDistCheckpoint& out) {
  const std::string file = join(iter_dir, kCommonStateFile);
  if (storage.exists(file)) {
    Result<std::vector<char>> bytes = storage.read_file(file);
    if (!bytes.is_ok()) return bytes.status();
    Result<Value> common = load_torch_save(bytes.value());
    if (!common.is_ok()) return Status::corruption(file + ": " + common.status().message());
    out.common = common.value();
  } else {
    const Value* obj = out.sharded.dict()->find(std::string(kCommonStateObjectKey));
    if (obj == nullptr) {
      return Status::not_found(file + ": absent, and no ShardedObject 'common_state' either");
    }
    out.common = *obj;
    out.common_from_sharded_object = true;
  }
  if (!out.common.is_dict()) return Status::corruption(file + ": the common state is no dict");
  return Status::ok();
}

// Invariant 2 and the sharding type.
Status check_common(const std::string& iter_dir, TorchDistCheckpoint& out) {
  const std::string where =
      join(iter_dir, out.common_from_sharded_object ? "common_state" : kCommonStateFile);
  const Dict& common = *out.common.dict();
  if (const Value* it = common.find("iteration"); it != nullptr) {
    if (!it->is_int() || it->as_int() != out.iteration) {
      return Status::corruption(fmt::format("{}: key 'iteration' is {} where {} says {}", where,
                                            it->repr(), out.iteration_from, out.iteration));
    }
  }
  const auto str_at = [&](const char* outer, const char* inner) -> std::string {
    const Value* o = common.find(outer);
    const Value* v = o != nullptr && o->is_dict() ? o->dict()->find(inner) : nullptr;
    return v != nullptr && v->is_str() ? v->as_str() : "";
  };
  const std::string content = str_at("content_metadata", "distrib_optim_sharding_type");
  const Value* saved = saved_param_state_sharding_type(common.find("optimizer"));
  const std::string param_state = saved != nullptr && saved->is_str() ? saved->as_str() : "";
  if (!content.empty() && !param_state.empty() && content != param_state) {
    return Status::corruption(
        where + ": key 'content_metadata.distrib_optim_sharding_type' is " + py_str_repr(content) +
        " but 'optimizer.param_state_sharding_type' is " + py_str_repr(param_state));
  }
  out.sharding_type = content.empty() ? param_state : content;
  return Status::ok();
}

void collect_buckets(TorchDistCheckpoint& out) {
  std::map<std::string, DpReshardableBucket> buckets;
  for (const auto& [key, value] : *out.sharded.dict()) {
    if (!key.is_str() || !value.is_tensor()) continue;
    const ChainedKey chained = parse_chained_key(key.as_str());
    std::optional<OptimizerBucketKey> k = parse_bucket_key(chained.rest);
    if (!k) continue;
    const std::string state = k->state;
    k->state.clear();
    DpReshardableBucket& b = buckets[(chained.part ? format_chained_prefix(*chained.part) : "") +
                                     format_bucket_prefix(*k)];
    b.key = *k;
    b.chained_part = chained.part;
    b.numel_unpadded = value.tensor().numel();
    b.states.emplace(state, value.tensor());
  }
  for (auto& [prefix, bucket] : buckets) out.buckets.push_back(std::move(bucket));
}

// per_bucket_numel[gbuf_idx][dtype][bucket_idx], the DP-padded bucket sizes; -1 if absent.
int64_t padded_bucket_numel(const TorchDistCheckpoint& out, const DpReshardableBucket& b) {
  const OptimizerBucketKey& k = b.key;
  const Value* per_bucket = out.sharded.dict()->find(bucket_object_key(b, "per_bucket_numel"));
  if (per_bucket == nullptr || !per_bucket->is_list() ||
      per_bucket->list()->size() <= size_t(k.gbuf_idx)) {
    return -1;
  }
  const Value& by_dtype = per_bucket->list()->at(k.gbuf_idx);
  if (!by_dtype.is_dict()) return -1;
  for (const auto& [dtype, numels] : *by_dtype.dict()) {
    if (dtype.repr() != k.dtype || !numels.is_list() ||
        numels.list()->size() <= size_t(k.bucket_idx) ||
        !numels.list()->at(k.bucket_idx).is_int()) {
      continue;
    }
    return numels.list()->at(k.bucket_idx).as_int();
  }
  return -1;
}

// Invariant 4 (see dp_size_at_save in the header).
void derive_dp_size(const DcpMetadata& meta, TorchDistCheckpoint& out) {
  std::set<int64_t> ranks;
  for (const StorageDataEntry& e : meta.storage_data) {
    const std::optional<int64_t> r = writer_rank(e.info.relative_path);
    if (!r) return;
    ranks.insert(*r);
  }
  out.writer_ranks = static_cast<int64_t>(ranks.size());
  const int64_t world = out.writer_ranks;
  if (world == 0 || *ranks.rbegin() != world - 1 || out.buckets.empty()) return;
  for (const DpReshardableBucket& b : out.buckets) {
    // A chain's later parts (an MoE model's expert part) shard over their own, smaller DP
    // groups (expert-DP); part 0 is the dense part, on the DP group of every rank.
    if (b.chained_part.value_or(0) != 0) continue;
    const int64_t padded = padded_bucket_numel(out, b);
    if (padded < b.numel_unpadded || padded % world != 0) return;
    const int64_t local = padded / world;
    for (const auto& [state, tensor] : b.states) {
      const std::string fqn = bucket_key_text(b) + "." + state;
      for (const StorageDataEntry& e : meta.storage_data) {
        if (e.index.fqn != fqn || !e.index.offset || e.index.offset->size() != 1) {
          continue;
        }
        const int64_t rank = *writer_rank(e.info.relative_path);
        const int64_t begin = (*e.index.offset)[0];
        if (begin < rank * local || begin >= (rank + 1) * local) return;
      }
    }
  }
  out.dp_size_at_save = world;
}

}  // namespace

std::string iteration_dir_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

Result<int64_t> read_checkpoint_tracker(const Storage& storage, const std::string& dir) {
  const std::string file = join(dir, kTrackerFile);
  Result<std::vector<char>> bytes = storage.read_file(file);
  if (!bytes.is_ok()) {
    if (bytes.status().code() != Status::Code::kNotFound) return bytes.status();
    return Status::not_found(file +
                             ": no tracker file, so this is no Megatron checkpoint "
                             "directory");
  }
  if (bytes.value().size() > kTrackerBytesMax) {
    return Status::corruption(fmt::format("{}: {} bytes, over kTrackerBytesMax={}", file,
                                          bytes.value().size(), kTrackerBytesMax));
  }
  std::string text(bytes.value().begin(), bytes.value().end());
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.erase(0, 1);
  if (text == "release") {
    return Status::invalid_input(file + ": a 'release' checkpoint; only iterations are read");
  }
  int64_t iteration = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), iteration);
  if (ec != std::errc() || end != text.data() + text.size() || iteration < 0 ||
      iteration > kIterationMax) {
    return Status::corruption(file + ": " + py_str_repr(text) + " is not an iteration");
  }
  return iteration;
}

namespace {

// "iter_0000007" -> 7; nullopt for any other name.
std::optional<int64_t> iteration_of_name(const std::string& iter_dir) {
  const size_t slash = iter_dir.rfind('/');
  const std::string name = slash == std::string::npos ? iter_dir : iter_dir.substr(slash + 1);
  constexpr std::string_view kPrefix = "iter_";
  if (!name.starts_with(kPrefix) || name.size() != kPrefix.size() + 7) return std::nullopt;
  int64_t iteration = -1;
  const char* begin = name.data() + kPrefix.size();
  const auto [end, ec] = std::from_chars(begin, name.data() + name.size(), iteration);
  if (ec != std::errc() || end != name.data() + name.size() || iteration < 0) return std::nullopt;
  return iteration;
}

// `iteration`: what the tracker or the directory's name said (checked against the common
// state's); nullopt: the common state's, if any.
Result<TorchDistCheckpoint> read_iteration(const Storage& storage, const std::string& iter_dir,
                                           std::optional<int64_t> iteration, const char* from,
                                           const std::set<std::string>& zero_filled = {}) {
  if (!storage.exists(iter_dir)) {
    return Status::not_found(iter_dir + ": the iteration directory is absent");
  }
  if (Status s = check_megatron_metadata(storage, iter_dir); !s.is_ok()) return s;
  DcpReader reader(storage, iter_dir);
  if (Status s = reader.open(); !s.is_ok()) return s;
  reader.read_lost_chunks_as_zeros(zero_filled);
  TorchDistCheckpoint out;
  out.iter_dir = iter_dir;
  if (Status s = read_sharded(reader, out); !s.is_ok()) return s;
  if (Status s = read_common(storage, iter_dir, out); !s.is_ok()) return s;
  if (iteration) {
    out.iteration = *iteration;
    out.iteration_from = from;
  } else if (const Value* it = out.common.dict()->find("iteration");
             it != nullptr && it->is_int()) {
    out.iteration = it->as_int();
    out.iteration_from = "the common state";
  }
  if (Status s = check_common(iter_dir, out); !s.is_ok()) return s;
  collect_buckets(out);
  derive_dp_size(reader.metadata(), out);
  for (const auto& [fqn, meta] : reader.metadata().tensors)
    out.tensor_chunks.emplace(fqn, meta.chunks);
  return out;
}

}  // namespace

Status check_megatron_metadata(const Storage& storage, const std::string& iter_dir) {
  const std::string file = join(iter_dir, "metadata.json");
  Result<std::vector<char>> bytes = storage.read_file(file);
  if (!bytes.is_ok()) {
    return Status(bytes.status().code() == Status::Code::kNotFound
                      ? Status::not_found(file + ": absent, so this is no dist_checkpointing "
                                                 "checkpoint")
                      : bytes.status());
  }
  if (bytes.value().size() > kMegatronMetadataJsonBytesMax) {
    return Status::corruption(file + ": over kMegatronMetadataJsonBytesMax bytes");
  }
  if (json_nests_deeper_than({bytes.value().data(), bytes.value().size()})) {
    return Status::corruption(
        fmt::format("{}: nested deeper than kJsonDepthMax={}", file, kJsonDepthMax));
  }
  const nlohmann::json j = nlohmann::json::parse(bytes.value().begin(), bytes.value().end(),
                                                 nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::corruption(file + ": not a JSON object");
  const auto field_is = [&](const char* name, const nlohmann::json& want) {
    return j.contains(name) && j[name] == want;
  };
  if (!field_is("sharded_backend", "torch_dist") || !field_is("sharded_backend_version", 1)) {
    return Status::invalid_input(file +
                                 ": field 'sharded_backend': only torch_dist version 1 "
                                 "is read, got " +
                                 j.value("sharded_backend", nlohmann::json()).dump());
  }
  // HEAD (d98e8a64dd) dropped the common backend fields along with common.pt.
  if (j.contains("common_backend") &&
      (!field_is("common_backend", "torch") || !field_is("common_backend_version", 1))) {
    return Status::invalid_input(file + ": field 'common_backend': only torch version 1 is read");
  }
  return Status::ok();
}

std::optional<int64_t> writer_rank(const std::string& file) {
  if (!file.starts_with("__") || !file.ends_with(".distcp")) return std::nullopt;
  int64_t rank = -1;
  const char* begin = file.data() + 2;
  const auto [end, ec] = std::from_chars(begin, file.data() + file.size(), rank);
  if (ec != std::errc() || end == begin || *end != '_' || rank < 0) return std::nullopt;
  return rank;
}

std::string bucket_key_text(const DpReshardableBucket& bucket) {
  return (bucket.chained_part ? format_chained_prefix(*bucket.chained_part) : "") +
         format_bucket_prefix(bucket.key);
}

std::string bucket_object_key(const DpReshardableBucket& bucket, std::string_view name) {
  return (bucket.chained_part ? format_chained_prefix(*bucket.chained_part) : "") +
         format_object_key(bucket.key.dp_group_idx, name);
}

const Value* optimizer_state_object(const TorchDistCheckpoint& checkpoint, int64_t part) {
  const std::string prefix = chained_parts(checkpoint) > 1 ? format_chained_prefix(part) : "";
  const Value* opt =
      checkpoint.sharded.is_dict()
          ? checkpoint.sharded.dict()->find(prefix + format_object_key(0, "optimizer"))
          : nullptr;
  if (opt == nullptr && checkpoint.common.is_dict()) {
    // fully_reshardable keeps it unwrapped in the common state; a chain of several parts as
    // {0: sd_0, 1: sd_1, ...} (int keys).
    const Value* outer = checkpoint.common.dict()->find("optimizer");
    if (outer != nullptr && outer->is_dict() && !outer->dict()->contains("optimizer")) {
      outer = outer->dict()->find(part);
    } else if (part != 0) {
      outer = nullptr;
    }
    opt = outer != nullptr && outer->is_dict() ? outer->dict()->find("optimizer") : nullptr;
  }
  return opt != nullptr && opt->is_dict() ? opt : nullptr;
}

int64_t chained_parts(const TorchDistCheckpoint& checkpoint) {
  int64_t parts = 1;
  if (!checkpoint.sharded.is_dict()) return parts;
  for (const auto& [key, value] : *checkpoint.sharded.dict()) {
    if (!key.is_str()) continue;
    const ChainedKey k = parse_chained_key(key.as_str());
    if (k.part && *k.part < kChainedPartsMax) parts = std::max(parts, *k.part + 1);
  }
  return parts;
}

std::optional<int64_t> saved_arg_int(const TorchDistCheckpoint& checkpoint, const char* name) {
  const Value* args =
      checkpoint.common.is_dict() ? checkpoint.common.dict()->find("args") : nullptr;
  const Value* v = args != nullptr && args->is_dict() ? args->dict()->find(name) : nullptr;
  return v != nullptr && v->is_int() ? std::optional<int64_t>(v->as_int()) : std::nullopt;
}

Result<TorchDistCheckpoint> read_torch_dist_iteration(const Storage& storage,
                                                      const std::string& iter_dir,
                                                      int64_t iteration) {
  return read_iteration(storage, iter_dir, iteration, "the tracker");
}

Result<TorchDistCheckpoint> read_torch_dist_directory(const Storage& storage,
                                                      const std::string& iter_dir,
                                                      const std::set<std::string>& zero_filled) {
  return read_iteration(storage, iter_dir, iteration_of_name(iter_dir), "the directory's name",
                        zero_filled);
}

Result<TorchDistCheckpoint> read_torch_dist_checkpoint(const Storage& storage,
                                                       const std::string& dir) {
  Result<int64_t> iteration = read_checkpoint_tracker(storage, dir);
  if (!iteration.is_ok()) return iteration.status();
  return read_torch_dist_iteration(storage, join(dir, iteration_dir_name(iteration.value())),
                                   iteration.value());
}

CheckpointContents checkpoint_contents(const TorchDistCheckpoint& checkpoint) {
  CheckpointContents out;
  out.common = checkpoint.common;
  out.common_state_as_sharded_object = checkpoint.common_from_sharded_object;
  for (const auto& [key, value] : *checkpoint.sharded.dict()) {
    const std::string k = key.as_str();
    const auto object = checkpoint.object_unique_keys.find(k);
    if (object == checkpoint.object_unique_keys.end()) {
      out.tensors.emplace(k, value.tensor());
    } else if (!(checkpoint.common_from_sharded_object && k == kCommonStateObjectKey)) {
      out.objects.emplace(object->second, value);
    }
  }
  return out;
}

}  // namespace ckptsim::model
