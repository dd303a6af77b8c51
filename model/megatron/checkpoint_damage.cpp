#include "model/megatron/checkpoint_damage.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "model/megatron/torch_dist_checkpoint.h"
#include "model/py/key.h"
#include "model/torch/torch_save_format.h"

namespace ckptsim::model {

namespace {

constexpr std::string_view kCommonObjectItem = "common_state/shard_0_1";

std::string join(const std::string& dir, std::string_view name) {
  return dir.empty() ? std::string(name) : dir + "/" + std::string(name);
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

DamagedFile damaged(std::string file, DamageKind kind) {
  DamagedFile d;
  d.file = std::move(file);
  d.kind = kind;
  return d;
}

// The newest iter_* directory at the root, "" when none.
std::string newest_iteration_dir(const Storage& storage) {
  auto names = storage.list("");
  if (!names.is_ok()) return "";
  std::string newest;
  for (const auto& n : names.value()) {
    if (n.starts_with("iter_") && n > newest) newest = n;
  }
  return newest;
}

// The file's bytes; nullopt when it is absent.
std::optional<std::vector<char>> read_if_there(const Storage& storage, const std::string& path) {
  if (!storage.exists(path)) return std::nullopt;
  auto bytes = storage.read_file(path);
  if (!bytes.is_ok()) return std::vector<char>{};
  return std::move(bytes.value());
}

void examine_tracker(const Storage& storage, DamageCensus& out) {
  const std::string tracker(kTrackerFile);
  const auto bytes = read_if_there(storage, tracker);
  if (!bytes) return;  // no tracker: locate() read the directory itself, or nothing is there
  auto iteration = read_checkpoint_tracker(storage, "");
  if (!iteration.is_ok()) {
    DamagedFile d = damaged(tracker, bytes->empty() ? DamageKind::kEmpty : DamageKind::kUnreadable);
    d.bytes = static_cast<int64_t>(bytes->size());
    d.detail = iteration.status().message();
    d.content.assign(bytes->begin(), bytes->end());
    out.files.push_back(std::move(d));
    out.iter_dir = newest_iteration_dir(storage);
    return;
  }
  out.iter_dir = iteration_dir_name(iteration.value());
  if (!storage.exists(out.iter_dir)) {
    DamagedFile d = damaged(tracker, DamageKind::kNamesAbsentIteration);
    d.bytes = static_cast<int64_t>(bytes->size());
    d.named_iteration = iteration.value();
    d.detail = fmt::format("names iteration {}, but {} is absent", iteration.value(), out.iter_dir);
    out.files.push_back(std::move(d));
    out.iter_dir = newest_iteration_dir(storage);
  }
}

// A file that must be there and be read whole by `read` (its error message, "" when it reads).
template <typename Read>
void examine_file(const Storage& storage, const std::string& path, bool required, Read read,
                  DamageCensus& out) {
  const auto bytes = read_if_there(storage, path);
  if (!bytes) {
    if (required) out.files.push_back(damaged(path, DamageKind::kMissing));
    return;
  }
  const std::string why = read(*bytes);
  if (why.empty()) return;
  DamagedFile d = damaged(path, bytes->empty() ? DamageKind::kEmpty : DamageKind::kUnreadable);
  d.bytes = static_cast<int64_t>(bytes->size());
  d.detail = why;
  out.files.push_back(std::move(d));
}

void examine_data_files(const Storage& storage, DamageCensus& out) {
  struct Needed {
    int64_t end = 0;
    std::vector<std::pair<std::string, int64_t>> items;  // fqn, end of its bytes
  };
  std::map<std::string, Needed> files;
  std::vector<std::string> order;
  for (const StorageDataEntry& e : out.metadata->storage_data) {
    auto [it, added] = files.try_emplace(e.info.relative_path);
    if (added) order.push_back(e.info.relative_path);
    const int64_t end = e.info.offset + e.info.length;
    it->second.end = std::max(it->second.end, end);
    it->second.items.emplace_back(e.index.fqn, end);
  }
  for (const std::string& name : order) {
    const Needed& n = files.at(name);
    const std::string path = join(out.iter_dir, name);
    const auto bytes = read_if_there(storage, path);
    const int64_t have = bytes ? static_cast<int64_t>(bytes->size()) : 0;
    if (bytes && have >= n.end) continue;
    DamagedFile d = damaged(path, !bytes      ? DamageKind::kMissing
                                  : have == 0 ? DamageKind::kEmpty
                                              : DamageKind::kCut);
    d.bytes = have;
    d.bytes_needed = n.end;
    std::set<std::string> seen;
    for (const auto& [fqn, end] : n.items) {
      if (end > have && seen.insert(fqn).second) d.items_lost.push_back(fqn);
    }
    out.files.push_back(std::move(d));
  }
}

}  // namespace

std::string damage_kind_name(DamageKind k) {
  switch (k) {
    case DamageKind::kMissing:
      return "missing";
    case DamageKind::kEmpty:
      return "empty";
    case DamageKind::kCut:
      return "cut short";
    case DamageKind::kUnreadable:
      return "unreadable";
    case DamageKind::kNamesAbsentIteration:
      return "names an absent iteration";
  }
  return "?";
}

std::string DamagedFile::text() const {
  std::string out = file + ": " + damage_kind_name(kind);
  if (kind == DamageKind::kCut) {
    out += fmt::format(", {} of {} bytes", bytes, bytes_needed);
  } else if (kind == DamageKind::kUnreadable) {
    out += fmt::format(", {} bytes", bytes);
  }
  if (!detail.empty()) out += " (" + detail + ")";
  if (!items_lost.empty()) {
    std::vector<std::string> shown;
    for (size_t i = 0; i < items_lost.size() && i < 3; ++i)
      shown.push_back(py_str_repr(items_lost[i]));
    out += fmt::format("; {} item(s) lost: {}{}", items_lost.size(), fmt::join(shown, ", "),
                       items_lost.size() > shown.size() ? ", ..." : "");
  }
  return out;
}

DamageCensus find_damage(const Storage& storage, const std::string& iter_dir) {
  DamageCensus out;
  out.iter_dir = iter_dir;
  if (iter_dir.empty()) examine_tracker(storage, out);
  if (out.iter_dir.empty()) return out;
  const std::string dir = out.iter_dir;
  examine_file(
      storage, join(dir, kMegatronMetadataFile), /*required=*/true,
      [&](const std::vector<char>&) {
        const Status s = check_megatron_metadata(storage, dir);
        return s.code() == Status::Code::kCorruption ? s.message() : std::string();
      },
      out);
  examine_file(
      storage, join(dir, kDcpMetadataFile), /*required=*/true,
      [&](const std::vector<char>& bytes) {
        auto meta = parse_dcp_metadata(bytes, join(dir, kDcpMetadataFile));
        if (!meta.is_ok()) return meta.status().message();
        out.metadata = std::move(meta.value());
        return std::string();
      },
      out);
  if (out.metadata) {
    out.common_state_object = out.metadata->bytes_items.contains(std::string(kCommonObjectItem));
    examine_data_files(storage, out);
  }
  // common.pt: required where the checkpoint keeps no 'common_state' object; without a readable
  // `.metadata` only a common.pt that is there is judged.
  examine_file(
      storage, join(dir, kCommonStateFile),
      /*required=*/out.metadata.has_value() && !out.common_state_object,
      [&](const std::vector<char>& bytes) {
        auto common = load_torch_save(bytes);
        return common.is_ok() ? std::string() : common.status().message();
      },
      out);
  return out;
}

std::set<std::string> lost_data_files(const DamageCensus& census) {
  std::set<std::string> out;
  for (const DamagedFile& d : census.files) {
    if (d.bytes_needed > 0) out.insert(base_name(d.file));
  }
  return out;
}

}  // namespace ckptsim::model
