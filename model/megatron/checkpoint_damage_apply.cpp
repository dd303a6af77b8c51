// model/megatron/checkpoint_damage.h: apply_damage, the damage of a real checkpoint on the
// model's own save (apart from the census, so that the fuzzed readers need no serialization).
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "model/megatron/checkpoint_damage.h"
#include "model/megatron/serialization.h"
#include "model/megatron/torch_dist_checkpoint.h"
#include "model/py/key.h"

namespace ckptsim::model {

namespace {

// Where an object item maps onto the model's object file: what the real load raises for a lost
// item inside a .distcp was never replayed against the model's file of its own.
constexpr std::string_view kObjectCaveat =
    " [a ShardedObject: the real save keeps it inside the .distcp, the model in a file of its "
    "own; this mapping is not confirmed on the real code]";

std::string join(const std::string& dir, std::string_view name) {
  return dir.empty() ? std::string(name) : dir + "/" + std::string(name);
}

std::string base_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// `path` below its iteration directory (what the model's messages name).
std::string below_iteration(const std::string& path) {
  const size_t slash = path.find('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Cuts `path` of `storage` to `keep` bytes.
Status cut_file(Storage& storage, const std::string& path, int64_t keep) {
  auto bytes = storage.read_file(path);
  if (!bytes.is_ok()) return bytes.status();
  std::vector<char>& b = bytes.value();
  b.resize(static_cast<size_t>(std::clamp<int64_t>(keep, 0, static_cast<int64_t>(b.size()))));
  return storage.write_file(path, b);
}

int64_t file_size(const Storage& storage, const std::string& path) {
  auto bytes = storage.read_file(path);
  return bytes.is_ok() ? static_cast<int64_t>(bytes.value().size()) : -1;
}

// The model's counterpart of a whole file (metadata.json for .metadata, common.pt, an object):
// removed, emptied, or cut to half its bytes (at least 1).
void damage_whole_file(const DamagedFile& d, Storage& model, const std::string& path,
                       ModelDamage& out) {
  const int64_t size = file_size(model, path);
  if (size < 0) {
    out.unmapped.push_back(
        fmt::format("{}: the model's save has no {} to damage alike", d.file, py_str_repr(path)));
    return;
  }
  Status s;
  std::string what;
  if (d.kind == DamageKind::kMissing) {
    s = model.remove_all(path);
    what = path + " removed";
  } else {
    const int64_t keep = d.kind == DamageKind::kEmpty ? 0 : std::max<int64_t>(1, size / 2);
    s = cut_file(model, path, keep);
    what = d.kind == DamageKind::kEmpty
               ? path + " emptied"
               : fmt::format("{} cut to {} of {} bytes (half: the whole size of {} is not known)",
                             path, keep, size, base_name(d.file));
  }
  if (!s.is_ok()) {
    out.unmapped.push_back(d.file + ": " + s.to_string());
    return;
  }
  out.applied.push_back(fmt::format("{} ({})", what, d.file));
  out.stands_for[below_iteration(path)] = d.file;
}

void damage_data_file(const DamageCensus& census, const DamagedFile& d, Storage& model,
                      const std::string& miter, ModelDamage& out) {
  const auto rank = writer_rank(base_name(d.file));
  const std::string rank_file =
      rank ? join(miter, fmt::format("shards/rank_{}.bin", *rank)) : std::string();
  if (!rank || !model.exists(rank_file)) {
    out.unmapped.push_back(fmt::format("{}: the model's save wrote no shard file of {}", d.file,
                                       rank ? fmt::format("rank {}", *rank) : "its rank"));
    return;
  }
  std::vector<std::string> tensors;
  for (const auto& fqn : d.items_lost) {
    if (census.metadata->bytes_items.contains(fqn)) {
      // An object item: its own file in the model's format.
      DamagedFile whole = d;
      whole.kind = d.kind == DamageKind::kCut ? DamageKind::kUnreadable : d.kind;
      damage_whole_file(whole, model, join(miter, "objects/" + fqn + ".pt"), out);
      if (!out.applied.empty() && out.applied.back().ends_with("(" + d.file + ")")) {
        out.applied.back() += kObjectCaveat;
      }
    } else {
      tensors.push_back(fqn);
    }
  }
  if (tensors.empty()) return;
  if (d.kind != DamageKind::kCut) {
    const Status s = d.kind == DamageKind::kMissing ? model.remove_all(rank_file)
                                                    : cut_file(model, rank_file, 0);
    if (!s.is_ok()) {
      out.unmapped.push_back(d.file + ": " + s.to_string());
      return;
    }
    out.applied.push_back(fmt::format(
        "{} {} ({})", rank_file, d.kind == DamageKind::kMissing ? "removed" : "emptied", d.file));
    out.stands_for[below_iteration(rank_file)] = d.file;
    return;
  }
  auto model_view = subdir(static_cast<const Storage&>(model), miter);
  auto pieces = read_checkpoint_pieces(*model_view);
  if (!pieces.is_ok()) {
    out.unmapped.push_back(d.file + ": " + pieces.status().to_string());
    return;
  }
  const std::set<std::string> lost(tensors.begin(), tensors.end());
  std::optional<int64_t> cut;
  for (const SavedPiece& p : pieces.value()) {
    if (p.rank == *rank && lost.contains(p.key) && join(miter, p.file) == rank_file) {
      cut = std::min(cut.value_or(p.byte_offset), p.byte_offset);
    }
  }
  if (!cut) {
    out.unmapped.push_back(fmt::format("{}: rank {}'s pieces in the model's save hold none of {}",
                                       d.file, *rank, py_str_repr(tensors.front())));
    return;
  }
  const int64_t size = file_size(model, rank_file);
  if (Status s = cut_file(model, rank_file, *cut); !s.is_ok()) {
    out.unmapped.push_back(d.file + ": " + s.to_string());
    return;
  }
  out.applied.push_back(
      fmt::format("{} cut to {} of {} bytes, where its first piece of a lost tensor begins ({})",
                  rank_file, *cut, size, d.file));
  out.stands_for[below_iteration(rank_file)] = d.file;
}

void damage_tracker(const DamagedFile& d, Storage& model, int64_t model_iteration,
                    ModelDamage& out) {
  const std::string tracker(kTrackerFile);
  std::string text = d.content;
  if (d.kind == DamageKind::kNamesAbsentIteration) {
    const int64_t named =
        d.named_iteration == model_iteration ? model_iteration + 1 : d.named_iteration;
    text = std::to_string(named);
  }
  if (Status s = model.write_file(tracker, std::span<const char>(text.data(), text.size()));
      !s.is_ok()) {
    out.unmapped.push_back(d.file + ": " + s.to_string());
    return;
  }
  out.applied.push_back(
      d.kind == DamageKind::kNamesAbsentIteration
          ? fmt::format("{} names iteration {}, which the model's save did not write ({})", tracker,
                        text, d.file)
          : fmt::format("{} holds the same {} bytes ({})", tracker, text.size(), d.file));
}

}  // namespace

ModelDamage apply_damage(const DamageCensus& census, Storage& model_root,
                         const std::string& model_iter_dir, int64_t model_iteration) {
  ModelDamage out;
  for (const DamagedFile& d : census.files) {
    const std::string name = base_name(d.file);
    if (d.file == kTrackerFile) {
      damage_tracker(d, model_root, model_iteration, out);
    } else if (name == kMegatronMetadataFile) {
      out.unmapped.push_back(
          d.file +
          ": the model's format has no counterpart of dist_checkpointing's metadata.json "
          "(its backend marker)");
    } else if (name == kDcpMetadataFile) {
      damage_whole_file(d, model_root, join(model_iter_dir, "metadata.json"), out);
    } else if (name == kCommonStateFile) {
      damage_whole_file(d, model_root, join(model_iter_dir, std::string(kCommonStateFile)), out);
    } else if (writer_rank(name) && census.metadata) {
      damage_data_file(census, d, model_root, model_iter_dir, out);
    } else {
      out.unmapped.push_back(d.file + ": no counterpart in the model's format");
    }
  }
  return out;
}

}  // namespace ckptsim::model
