// Storage: the one interface through which ckptsim reads and writes checkpoint files.
//
// Every checkpoint byte goes through a Storage (the role LevelDB's Env plays), so a test or
// the property search can swap a real directory for an in-memory store that holds the same
// bytes, and later for a fault-injecting one, without the model knowing.
//
// Paths are relative and '/'-separated: "phase_0/common.pt". A *file path* is one or more
// components joined by single '/'; no component is empty, ".", "..", contains NUL, or
// starts with kTmpPrefix; the whole path is at most kPathLengthMax bytes. A *directory
// path* is a file path or "" (the root of the storage).
//
// Invariants (every implementation; tests/model/storage_test.cpp runs one suite on all):
//   1. An invalid path is rejected by every method with Status::invalid_input naming it;
//      exists() answers false. Nothing outside the storage's root can be reached:
//      DirectoryStorage also checks every resolved path against its root (paired check).
//   2. After write_file(p, b) returns ok, read_file(p) returns exactly b (any bytes, NUL
//      included, empty allowed) until p is written again or removed.
//   3. A replace is atomic: a reader sees the old bytes or the new bytes, never a mix or a
//      truncated file (DirectoryStorage writes a temporary file in the target's directory
//      and renames it over the target).
//   4. write_file creates every missing parent directory. A directory exists until
//      remove_all removes it or an ancestor, even when it has become empty (as on a disk).
//      list(d) names the direct children of d, files and directories alike, each once,
//      sorted bytewise. The root "" of a MemoryStorage always exists; the root of a
//      DirectoryStorage, or the prefix of a PrefixedStorage, may not until the first write.
//   5. Errors: not_found when the file or directory is absent; io_error when a file stands
//      where a directory is needed or the reverse, when the OS refuses (the message has the
//      path and strerror), or when MemoryStorage is full; invalid_input for a bad path or a
//      write over file_bytes_max. Every message names the relative path.
//   6. Thread safety: every method may be called from several threads at once (ranks are
//      threads and save concurrently). Concurrent writes to distinct paths all land;
//      concurrent writes to one path leave one writer's bytes whole. remove_all racing
//      with writes beneath the removed directory is unspecified.
//   7. Durability after a machine crash is not promised (no fsync): the simulator models
//      visibility, not power loss.
//   8. read_file_shared(p) returns what read_file(p) returns, immutable. MemoryStorage hands
//      out the bytes it holds (a write replaces them, never changes them in place), so N ranks
//      reading one file share one copy, and two reads returning the same pointer read the
//      same bytes; the default copies.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/status.h"

namespace ckptsim::model {

inline constexpr size_t kFileBytesMax = size_t{1} << 30;    // one checkpoint file
inline constexpr size_t kPathLengthMax = 1024;              // bytes of a relative path
inline constexpr size_t kMemoryBytesMax = size_t{4} << 30;  // all files of a MemoryStorage
// Names starting with this are DirectoryStorage's temporary files: reserved, never listed.
inline constexpr std::string_view kTmpPrefix = ".ckptsim-tmp-";

struct StorageOptions {
  size_t file_bytes_max = kFileBytesMax;
  size_t memory_bytes_max = kMemoryBytesMax;  // MemoryStorage only; a disk has its own limit
};

// ok iff `path` is a valid file path (see the top of this file).
Status validate_file_path(std::string_view path);
// ok iff `dir` is "" or a valid file path.
Status validate_dir_path(std::string_view dir);

class Storage {
 public:
  virtual ~Storage();

  // REQUIRES: bytes.size() <= file_bytes_max (else invalid_input).
  virtual Status write_file(const std::string& path, std::span<const char> bytes) = 0;
  virtual Result<std::vector<char>> read_file(const std::string& path) const = 0;
  // Invariant 8.
  virtual Result<std::shared_ptr<const std::vector<char>>> read_file_shared(
      const std::string& path) const;
  // True for files and directories; "" (the root) exists if the root does.
  virtual bool exists(const std::string& path) const = 0;
  virtual Result<std::vector<std::string>> list(const std::string& dir) const = 0;
  // Removes a file or a directory with everything below it; absent is ok (rm -rf).
  // remove_all("") empties the root but keeps it.
  virtual Status remove_all(const std::string& dir) = 0;
  // Moves the file or directory `from` (with everything below it) to `to`, at once (rename(2)
  // on a disk: a reader sees it at one path or the other). not_found when `from` is absent;
  // io_error when `to` exists. Creates `to`'s missing parent directories.
  virtual Status rename(const std::string& from, const std::string& to) = 0;
  // "directory /tmp/x", "memory", "directory /tmp/x, under phase_0": for messages.
  virtual std::string describe() const = 0;
};

// Files under a directory of the real file system. Holds no state besides its root and
// options, so concurrent calls need no lock; the constructor does no I/O.
class DirectoryStorage final : public Storage {
 public:
  explicit DirectoryStorage(std::filesystem::path root, StorageOptions options = {});

  Status write_file(const std::string& path, std::span<const char> bytes) override;
  Result<std::vector<char>> read_file(const std::string& path) const override;
  bool exists(const std::string& path) const override;
  Result<std::vector<std::string>> list(const std::string& dir) const override;
  Status remove_all(const std::string& dir) override;
  Status rename(const std::string& from, const std::string& to) override;
  std::string describe() const override;

  const std::filesystem::path& root() const { return root_; }

 private:
  // root_/path, checked to lie inside root_ (throws InvariantViolation otherwise).
  std::filesystem::path resolve(const std::string& path) const;

  std::filesystem::path root_;
  StorageOptions options_;
};

// Files in memory, same behavior as DirectoryStorage (invariants 1-6). Directories are
// recorded explicitly so that an emptied directory still exists, as on a disk.
class MemoryStorage final : public Storage {
 public:
  explicit MemoryStorage(StorageOptions options = {});

  Status write_file(const std::string& path, std::span<const char> bytes) override;
  Result<std::vector<char>> read_file(const std::string& path) const override;
  Result<std::shared_ptr<const std::vector<char>>> read_file_shared(
      const std::string& path) const override;
  bool exists(const std::string& path) const override;
  Result<std::vector<std::string>> list(const std::string& dir) const override;
  Status remove_all(const std::string& dir) override;
  Status rename(const std::string& from, const std::string& to) override;
  std::string describe() const override;

  size_t bytes_stored() const;

 private:
  // REQUIRES: mu_ held. The nearest-to-root proper ancestor of `path` that is a file, or "".
  std::string file_ancestor_locked(const std::string& path) const;

  const StorageOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const std::vector<char>>> files_;  // guarded by mu_
  std::set<std::string> dirs_;  // guarded by mu_; never holds ""
  size_t bytes_stored_ = 0;     // guarded by mu_; sum of file sizes
};

// A view of `base` below the directory `prefix`: path p here is "<prefix>/p" in base, so
// the checkpoints of several phases can share one root ("phase_0/", "phase_1/"). Paths are
// validated here first, so messages name the caller's path. Thread safety is base's.
class PrefixedStorage final : public Storage {
 public:
  // REQUIRES: validate_file_path(prefix) is ok (a programming error otherwise: throws
  // InvariantViolation); base outlives this object.
  PrefixedStorage(Storage& base, std::string prefix);

  Status write_file(const std::string& path, std::span<const char> bytes) override;
  Result<std::vector<char>> read_file(const std::string& path) const override;
  Result<std::shared_ptr<const std::vector<char>>> read_file_shared(
      const std::string& path) const override;
  bool exists(const std::string& path) const override;
  Result<std::vector<std::string>> list(const std::string& dir) const override;
  Status remove_all(const std::string& dir) override;
  Status rename(const std::string& from, const std::string& to) override;
  std::string describe() const override;

 private:
  std::string full(const std::string& path) const;

  Storage& base_;
  std::string prefix_;
};

// Short-hand for a PrefixedStorage; same REQUIRES.
std::unique_ptr<Storage> subdir(Storage& base, std::string prefix);
// A read-only view of `base` below `prefix` (only const methods are reachable): same REQUIRES.
std::unique_ptr<const Storage> subdir(const Storage& base, std::string prefix);

}  // namespace ckptsim::model
