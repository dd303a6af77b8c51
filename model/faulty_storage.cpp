#include "model/faulty_storage.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace ckptsim::model {

std::string storage_fault_kind_name(StorageFaultKind k) {
  switch (k) {
    case StorageFaultKind::kCrashBefore:
      return "crash_before";
    case StorageFaultKind::kCrashAfter:
      return "crash_after";
    case StorageFaultKind::kTorn:
      return "torn";
    case StorageFaultKind::kShort:
      return "short";
    case StorageFaultKind::kDiskFull:
      return "disk_full";
  }
  return "?";
}

std::optional<StorageFaultKind> parse_storage_fault_kind(std::string_view name) {
  for (auto k : {StorageFaultKind::kCrashBefore, StorageFaultKind::kCrashAfter,
                 StorageFaultKind::kTorn, StorageFaultKind::kShort, StorageFaultKind::kDiskFull}) {
    if (storage_fault_kind_name(k) == name) return k;
  }
  return std::nullopt;
}

std::string StorageFault::text() const {
  return fmt::format("{} at write {} of {}", storage_fault_kind_name(kind), nth,
                     path_suffix.empty() ? "any file" : "'*" + path_suffix + "'");
}

FaultyStorage::FaultyStorage(Storage& base, std::vector<StorageFault> faults, size_t page_bytes)
    : base_(base),
      faults_(std::move(faults)),
      page_bytes_(std::max<size_t>(page_bytes, 1)),
      seen_(faults_.size(), 0),
      done_(faults_.size(), false) {}

Status FaultyStorage::write_file(const std::string& path, std::span<const char> bytes) {
  // An invalid path is the base's error to give, and counts toward no fault.
  if (!validate_file_path(path).is_ok()) return base_.write_file(path, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (crashed_) {
    return Status::io_error(path + ": not written: the process crashed before (" + fired_.back() +
                            ")");
  }
  // The first fault that fires at this write decides it; every fault counts it.
  std::optional<size_t> firing;
  for (size_t i = 0; i < faults_.size(); ++i) {
    if (done_[i] || !path.ends_with(faults_[i].path_suffix)) continue;
    if (seen_[i]++ == faults_[i].nth && !firing) {
      firing = i;
      done_[i] = true;
    }
  }
  if (!firing) {
    Status s = base_.write_file(path, bytes);
    if (s.is_ok()) land(path, fmt::format("{} ({} bytes)", path, bytes.size()), true);
    return s;
  }
  const StorageFault& f = faults_[*firing];
  fired_.push_back(f.text() + ": " + path);
  const auto half = bytes.first(bytes.size() / 2 / page_bytes_ * page_bytes_);
  switch (f.kind) {
    case StorageFaultKind::kCrashBefore:
      crashed_ = true;
      return Status::io_error(path + ": not written: the process crashed (" + fired_.back() + ")");
    case StorageFaultKind::kCrashAfter: {
      Status s = base_.write_file(path, bytes);
      if (s.is_ok()) land(path, fmt::format("{} ({} bytes)", path, bytes.size()), true);
      crashed_ = true;
      return s.is_ok() ? Status::io_error(path + ": written, then the process crashed (" +
                                          fired_.back() + ")")
                       : s;
    }
    case StorageFaultKind::kTorn:
    case StorageFaultKind::kShort: {
      Status s = base_.write_file(path, half);
      if (s.is_ok()) {
        land(path,
             fmt::format("{} ({}: {} of {} bytes)", path, storage_fault_kind_name(f.kind),
                         half.size(), bytes.size()),
             half.size() == bytes.size());
      }
      if (f.kind == StorageFaultKind::kShort) return s;
      crashed_ = true;
      return Status::io_error(path + ": torn, then the process crashed (" + fired_.back() + ")");
    }
    case StorageFaultKind::kDiskFull:
      return Status::io_error(path + ": No space left on device (" + fired_.back() + ")");
  }
  return Status::io_error(path + ": unknown fault");
}

void FaultyStorage::land(const std::string& path, std::string text, bool whole) {
  landed_.push_back(std::move(text));
  whole_[path] = whole;
  ++landed_count_[path];
}

int64_t FaultyStorage::writes_landed(const std::string& path) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = landed_count_.find(path);
  return it == landed_count_.end() ? 0 : it->second;
}

Result<std::vector<char>> FaultyStorage::read_file(const std::string& path) const {
  return base_.read_file(path);
}

Result<std::shared_ptr<const std::vector<char>>> FaultyStorage::read_file_shared(
    const std::string& path) const {
  return base_.read_file_shared(path);
}

bool FaultyStorage::exists(const std::string& path) const { return base_.exists(path); }

Result<std::vector<std::string>> FaultyStorage::list(const std::string& dir) const {
  return base_.list(dir);
}

Status FaultyStorage::remove_all(const std::string& dir) { return base_.remove_all(dir); }

Status FaultyStorage::rename(const std::string& from, const std::string& to) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (crashed_) {
      return Status::io_error(from + ": not renamed: the process crashed before (" + fired_.back() +
                              ")");
    }
  }
  return base_.rename(from, to);
}

std::string FaultyStorage::describe() const { return base_.describe() + ", with faults"; }

bool FaultyStorage::crashed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return crashed_;
}

std::vector<std::string> FaultyStorage::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

bool FaultyStorage::landed_whole(const std::string& path) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = whole_.find(path);
  return it != whole_.end() && it->second;
}

std::vector<std::string> FaultyStorage::landed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return landed_;
}

}  // namespace ckptsim::model
