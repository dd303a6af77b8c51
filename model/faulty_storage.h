// FaultyStorage: a Storage that fails where a fault plan says, in the style of FoundationDB's
// BUGGIFY, so that the model's save protocol can be crashed at any of its writes (issue 25).
//
// The writes that reach it are numbered per fault, in the order they arrive, counting only the
// files a fault's `path_suffix` matches; a fault fires at its `nth` matching write. What a
// fault does there:
//   crash_before  the process stops before the write: nothing of it lands, and this and every
//                 later write fail (io_error "crashed ...") as a dead process writes nothing;
//   crash_after   the write lands, then the process stops (every later write fails);
//   torn          the first half of the bytes land, then the process stops (a torn file);
//   short         half of the bytes land and the write reports success (a disk that lost the
//                 tail, an unsynced file after a power loss): the process goes on;
//                 with `page_bytes` > 1 what lands of a torn or short write is whole pages: half
//                 the bytes rounded down to a multiple of it (a small file, one write() of less
//                 than two pages, lands empty: open('w') truncated it, and a crash does not split
//                 one small write, nor does a power loss keep part of one page);
//   disk_full     ENOSPC: the write fails (io_error naming the path; nothing lands) and later
//                 writes go on.
// Reads, exists, list, remove_all and rename (until a crash) pass through to the base (a crash
// stops writes only: what the next process reads is what landed).
//
// Invariants:
//   1. Without faults it is the base: every Storage invariant of storage.h holds (the contract
//      suite of tests/model/storage_test.cpp runs on it).
//   2. Deterministic: the same plan and the same sequence of writes give the same files, the
//      same statuses and the same record.
//   3. Each fault fires at most once; `fired()` lists those that did, in order, and `landed()`
//      every write that reached the base (torn and short ones marked), in order.
//   4. Thread safety: the base's; the counting and the record are under one lock, so writes
//      from several rank threads are numbered in the order they take it.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/storage.h"

namespace ckptsim::model {

enum class StorageFaultKind { kCrashBefore, kCrashAfter, kTorn, kShort, kDiskFull };

// "crash_before", "crash_after", "torn", "short", "disk_full".
std::string storage_fault_kind_name(StorageFaultKind k);
std::optional<StorageFaultKind> parse_storage_fault_kind(std::string_view name);

struct StorageFault {
  StorageFaultKind kind = StorageFaultKind::kCrashBefore;
  std::string path_suffix;  // the files it counts: paths ending in it ("" counts every file)
  int64_t nth = 0;          // fires at the nth (0-based) write it counts
  // "torn at the 2nd write of '*.distcp'", for messages and reports.
  std::string text() const;
};

class FaultyStorage final : public Storage {
 public:
  // REQUIRES: base outlives this object.
  FaultyStorage(Storage& base, std::vector<StorageFault> faults, size_t page_bytes = 1);

  Status write_file(const std::string& path, std::span<const char> bytes) override;
  Result<std::vector<char>> read_file(const std::string& path) const override;
  Result<std::shared_ptr<const std::vector<char>>> read_file_shared(
      const std::string& path) const override;
  bool exists(const std::string& path) const override;
  Result<std::vector<std::string>> list(const std::string& dir) const override;
  Status remove_all(const std::string& dir) override;
  // A crashed process renames nothing (io_error); otherwise the base's rename, counted by no
  // fault.
  Status rename(const std::string& from, const std::string& to) override;
  std::string describe() const override;

  bool crashed() const;
  std::vector<std::string> fired() const;   // "torn at ...: iter_0000003/__1_0.distcp" each
  std::vector<std::string> landed() const;  // "path (n bytes)", "path (torn: n of m bytes)"
  // Whether the last write of `path` that reached the base landed whole.
  bool landed_whole(const std::string& path) const;
  // How many writes of `path` reached the base (whole or not).
  int64_t writes_landed(const std::string& path) const;

 private:
  Storage& base_;
  const std::vector<StorageFault> faults_;
  const size_t page_bytes_;
  mutable std::mutex mu_;
  std::vector<int64_t> seen_;  // guarded by mu_: writes each fault has counted
  std::vector<bool> done_;     // guarded by mu_
  bool crashed_ = false;       // guarded by mu_
  std::vector<std::string> fired_;
  std::vector<std::string> landed_;
  // REQUIRES: mu_ held. Records a write of `path` that reached the base.
  void land(const std::string& path, std::string text, bool whole);
  std::map<std::string, int64_t> landed_count_;  // guarded by mu_
  std::map<std::string, bool> whole_;  // guarded by mu_: path -> its last landed write was whole
};

}  // namespace ckptsim::model
