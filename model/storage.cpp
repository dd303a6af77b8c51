#include "model/storage.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "model/errors.h"

namespace ckptsim::model {

namespace fs = std::filesystem;

namespace {

std::string path_text(std::string_view path) { return "'" + std::string(path) + "'"; }

std::string errno_text(int err) { return std::strerror(err); }

Status os_error(std::string_view what, std::string_view path, const Storage& storage, int err) {
  return Status::io_error(
      fmt::format("{} {} in {}: {}", what, path_text(path), storage.describe(), errno_text(err)));
}

// Component-wise prefix test: "a" is an ancestor of "a/b", not of "ab".
bool is_under(const std::string& candidate, const std::string& dir) {
  if (dir.empty()) return true;
  return candidate.size() > dir.size() && candidate.compare(0, dir.size(), dir) == 0 &&
         candidate[dir.size()] == '/';
}

// The direct child name of `dir` on the way to `descendant`. REQUIRES: is_under(descendant, dir).
std::string child_name(const std::string& descendant, const std::string& dir) {
  const size_t start = dir.empty() ? 0 : dir.size() + 1;
  const size_t slash = descendant.find('/', start);
  return descendant.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
}

// Every proper ancestor directory of a file path, root excluded, nearest-to-root first.
std::vector<std::string> ancestors(const std::string& path) {
  std::vector<std::string> out;
  for (size_t slash = path.find('/'); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    out.push_back(path.substr(0, slash));
  }
  return out;
}

// Makes temporary file names unique across threads and across DirectoryStorage objects
// that share a directory; the pid separates processes.
std::atomic<uint64_t> g_tmp_counter{0};

Status write_all(int fd, std::span<const char> bytes, const std::string& path,
                 const Storage& storage) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return os_error("write", path, storage, errno);
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

}  // namespace

Status validate_file_path(std::string_view path) {
  if (path.empty()) return Status::invalid_input("empty path");
  if (path.size() > kPathLengthMax) {
    return Status::invalid_input(fmt::format("path of {} bytes exceeds kPathLengthMax={}: {}",
                                             path.size(), kPathLengthMax,
                                             path_text(path.substr(0, 64)) + "..."));
  }
  if (path.find('\0') != std::string_view::npos) {
    return Status::invalid_input("path contains a NUL byte: " + path_text(path));
  }
  if (path.front() == '/') return Status::invalid_input("absolute path: " + path_text(path));
  size_t start = 0;
  while (true) {
    const size_t slash = path.find('/', start);
    const std::string_view part = path.substr(
        start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (part.empty()) return Status::invalid_input("empty path component in " + path_text(path));
    if (part == "." || part == "..") {
      return Status::invalid_input(fmt::format("path component '{}' in {}", part, path_text(path)));
    }
    if (part.substr(0, kTmpPrefix.size()) == kTmpPrefix) {
      return Status::invalid_input(
          fmt::format("path component '{}' in {} uses the reserved prefix '{}'", part,
                      path_text(path), kTmpPrefix));
    }
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return Status::ok();
}

Status validate_dir_path(std::string_view dir) {
  return dir.empty() ? Status::ok() : validate_file_path(dir);
}

Storage::~Storage() = default;

Result<std::shared_ptr<const std::vector<char>>> Storage::read_file_shared(
    const std::string& path) const {
  auto bytes = read_file(path);
  if (!bytes.is_ok()) return bytes.status();
  return std::make_shared<const std::vector<char>>(std::move(bytes.value()));
}

// ---------------------------------------------------------------------------------------
// DirectoryStorage

DirectoryStorage::DirectoryStorage(fs::path root, StorageOptions options)
    : root_(std::move(root)), options_(options) {}

std::string DirectoryStorage::describe() const { return "directory " + root_.string(); }

fs::path DirectoryStorage::resolve(const std::string& path) const {
  // Paired with validate_*_path: whatever the validator lets through, nothing outside the
  // root is ever touched (remove_all of an escaped path would delete someone else's files).
  const fs::path joined = (path.empty() ? root_ : root_ / path).lexically_normal();
  const fs::path rel = joined.lexically_relative(root_.lexically_normal());
  const std::string first = rel.empty() ? ".." : rel.begin()->string();
  CKPTSIM_CHECK(first != ".." && (path.empty() || first != "."),
                "DirectoryStorage: path '" + path + "' resolves to " + joined.string() +
                    ", outside the root " + root_.string());
  return joined;
}

Status DirectoryStorage::write_file(const std::string& path, std::span<const char> bytes) {
  if (Status s = validate_file_path(path); !s.is_ok()) return s;
  if (bytes.size() > options_.file_bytes_max) {
    return Status::invalid_input(fmt::format("write of {} bytes to {} exceeds file_bytes_max={}",
                                             bytes.size(), path_text(path),
                                             options_.file_bytes_max));
  }
  const fs::path target = resolve(path);
  const fs::path parent = target.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) {
    return Status::io_error(fmt::format("create the directories of {} in {}: {}", path_text(path),
                                        describe(), ec.message()));
  }
  // Same directory as the target, so the rename cannot cross file systems (invariant 3).
  const fs::path tmp =
      parent / fmt::format("{}{}-{}", kTmpPrefix, ::getpid(), g_tmp_counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return os_error("create a temporary file for", path, *this, errno);
  Status s = write_all(fd, bytes, path, *this);
  if (::close(fd) != 0 && s.is_ok()) s = os_error("close", path, *this, errno);
  if (s.is_ok() && ::rename(tmp.c_str(), target.c_str()) != 0) {
    s = os_error("rename a temporary file onto", path, *this, errno);
  }
  if (!s.is_ok()) ::unlink(tmp.c_str());
  return s;
}

Result<std::vector<char>> DirectoryStorage::read_file(const std::string& path) const {
  if (Status s = validate_file_path(path); !s.is_ok()) return s;
  const fs::path target = resolve(path);
  const int fd = ::open(target.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return Status::not_found(fmt::format("no file {} in {}", path_text(path), describe()));
    }
    return os_error("open", path, *this, err);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return os_error("stat", path, *this, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::io_error(
        fmt::format("{} in {} is not a regular file (a directory?)", path_text(path), describe()));
  }
  // The size may change between fstat and read (another writer renames over it: we keep
  // reading the old inode), so read to EOF, bounded by file_bytes_max + 1.
  std::vector<char> out;
  out.reserve(std::min(static_cast<size_t>(st.st_size), options_.file_bytes_max));
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return os_error("read", path, *this, err);
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
    if (out.size() > options_.file_bytes_max) {
      ::close(fd);
      return Status::io_error(fmt::format("{} in {} is larger than file_bytes_max={}",
                                          path_text(path), describe(), options_.file_bytes_max));
    }
  }
  ::close(fd);
  return out;
}

bool DirectoryStorage::exists(const std::string& path) const {
  if (!validate_dir_path(path).is_ok()) return false;
  std::error_code ec;
  return fs::exists(resolve(path), ec) && !ec;
}

Result<std::vector<std::string>> DirectoryStorage::list(const std::string& dir) const {
  if (Status s = validate_dir_path(dir); !s.is_ok()) return s;
  const fs::path target = resolve(dir);
  struct stat st {};
  if (::stat(target.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return Status::not_found(fmt::format("no directory {} in {}", path_text(dir), describe()));
    }
    return os_error("stat", dir, *this, err);
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::io_error(fmt::format("{} in {} is not a directory", path_text(dir), describe()));
  }
  std::error_code ec;
  std::vector<std::string> names;
  for (fs::directory_iterator it(target, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    // A writer's temporary file is not a child yet (kTmpPrefix names are reserved).
    if (name.compare(0, kTmpPrefix.size(), kTmpPrefix) == 0) continue;
    names.push_back(std::move(name));
  }
  if (ec) {
    return Status::io_error(
        fmt::format("list {} in {}: {}", path_text(dir), describe(), ec.message()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

Status DirectoryStorage::remove_all(const std::string& dir) {
  if (Status s = validate_dir_path(dir); !s.is_ok()) return s;
  std::error_code ec;
  if (!dir.empty()) {
    fs::remove_all(resolve(dir), ec);
  } else if (fs::exists(root_, ec) && !ec) {
    for (fs::directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec)) {
      fs::remove_all(it->path(), ec);
      if (ec) break;
    }
  }
  if (ec) {
    return Status::io_error(
        fmt::format("remove {} in {}: {}", path_text(dir), describe(), ec.message()));
  }
  return Status::ok();
}

Status DirectoryStorage::rename(const std::string& from, const std::string& to) {
  if (Status s = validate_file_path(from); !s.is_ok()) return s;
  if (Status s = validate_file_path(to); !s.is_ok()) return s;
  std::error_code ec;
  const fs::path a = resolve(from);
  const fs::path b = resolve(to);
  if (!fs::exists(a, ec)) {
    return Status::not_found(
        fmt::format("rename {} in {}: no such file or directory", path_text(from), describe()));
  }
  if (fs::exists(b, ec)) {
    return Status::io_error(fmt::format("rename {} to {} in {}: the target exists", path_text(from),
                                        path_text(to), describe()));
  }
  fs::create_directories(b.parent_path(), ec);
  if (!ec) fs::rename(a, b, ec);
  if (ec) {
    return Status::io_error(fmt::format("rename {} to {} in {}: {}", path_text(from), path_text(to),
                                        describe(), ec.message()));
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------
// MemoryStorage

MemoryStorage::MemoryStorage(StorageOptions options) : options_(options) {}

std::string MemoryStorage::describe() const { return "memory"; }

size_t MemoryStorage::bytes_stored() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_stored_;
}

std::string MemoryStorage::file_ancestor_locked(const std::string& path) const {
  for (const std::string& a : ancestors(path)) {
    if (files_.count(a) != 0) return a;
  }
  return "";
}

Status MemoryStorage::write_file(const std::string& path, std::span<const char> bytes) {
  if (Status s = validate_file_path(path); !s.is_ok()) return s;
  if (bytes.size() > options_.file_bytes_max) {
    return Status::invalid_input(fmt::format("write of {} bytes to {} exceeds file_bytes_max={}",
                                             bytes.size(), path_text(path),
                                             options_.file_bytes_max));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (std::string a = file_ancestor_locked(path); !a.empty()) {
    return Status::io_error(fmt::format("write {} in memory: {} is a file, not a directory",
                                        path_text(path), path_text(a)));
  }
  if (dirs_.count(path) != 0) {
    return Status::io_error(fmt::format("write {} in memory: it is a directory", path_text(path)));
  }
  const auto old = files_.find(path);
  const size_t old_bytes = old == files_.end() ? 0 : old->second->size();
  if (bytes_stored_ - old_bytes + bytes.size() > options_.memory_bytes_max) {
    return Status::io_error(fmt::format("write {} in memory: memory_bytes_max={} reached",
                                        path_text(path), options_.memory_bytes_max));
  }
  for (std::string& a : ancestors(path)) dirs_.insert(std::move(a));
  files_[path] = std::make_shared<const std::vector<char>>(bytes.begin(), bytes.end());
  bytes_stored_ = bytes_stored_ - old_bytes + bytes.size();
  return Status::ok();
}

Result<std::vector<char>> MemoryStorage::read_file(const std::string& path) const {
  auto shared = read_file_shared(path);
  if (!shared.is_ok()) return shared.status();
  return *shared.value();
}

Result<std::shared_ptr<const std::vector<char>>> MemoryStorage::read_file_shared(
    const std::string& path) const {
  if (Status s = validate_file_path(path); !s.is_ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (const auto it = files_.find(path); it != files_.end()) return it->second;
  if (dirs_.count(path) != 0) {
    return Status::io_error(
        fmt::format("{} in memory is not a regular file (a directory)", path_text(path)));
  }
  if (std::string a = file_ancestor_locked(path); !a.empty()) {
    return Status::io_error(fmt::format("read {} in memory: {} is a file, not a directory",
                                        path_text(path), path_text(a)));
  }
  return Status::not_found(fmt::format("no file {} in memory", path_text(path)));
}

bool MemoryStorage::exists(const std::string& path) const {
  if (!validate_dir_path(path).is_ok()) return false;
  if (path.empty()) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return files_.count(path) != 0 || dirs_.count(path) != 0;
}

Result<std::vector<std::string>> MemoryStorage::list(const std::string& dir) const {
  if (Status s = validate_dir_path(dir); !s.is_ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (!dir.empty() && dirs_.count(dir) == 0) {
    if (files_.count(dir) != 0) {
      return Status::io_error(fmt::format("{} in memory is not a directory", path_text(dir)));
    }
    if (std::string a = file_ancestor_locked(dir); !a.empty()) {
      return Status::io_error(fmt::format("list {} in memory: {} is a file, not a directory",
                                          path_text(dir), path_text(a)));
    }
    return Status::not_found(fmt::format("no directory {} in memory", path_text(dir)));
  }
  // Both containers are ordered, so the walk is deterministic; a child seen twice (a
  // directory recorded in dirs_ and reached again through its files) is kept once.
  std::set<std::string> names;
  const std::string from = dir.empty() ? "" : dir + "/";
  for (auto it = files_.lower_bound(from); it != files_.end() && is_under(it->first, dir); ++it) {
    names.insert(child_name(it->first, dir));
  }
  for (auto it = dirs_.lower_bound(from); it != dirs_.end() && is_under(*it, dir); ++it) {
    names.insert(child_name(*it, dir));
  }
  return std::vector<std::string>(names.begin(), names.end());
}

Status MemoryStorage::remove_all(const std::string& dir) {
  if (Status s = validate_dir_path(dir); !s.is_ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (std::string a = file_ancestor_locked(dir); !dir.empty() && !a.empty()) {
    return Status::io_error(fmt::format("remove {} in memory: {} is a file, not a directory",
                                        path_text(dir), path_text(a)));
  }
  const std::string from = dir.empty() ? "" : dir + "/";
  for (auto it = files_.lower_bound(from); it != files_.end() && is_under(it->first, dir);) {
    bytes_stored_ -= it->second->size();
    it = files_.erase(it);
  }
  for (auto it = dirs_.lower_bound(from); it != dirs_.end() && is_under(*it, dir);) {
    it = dirs_.erase(it);
  }
  if (!dir.empty()) {
    if (const auto it = files_.find(dir); it != files_.end()) {
      bytes_stored_ -= it->second->size();
      files_.erase(it);
    }
    dirs_.erase(dir);
  }
  return Status::ok();
}

Status MemoryStorage::rename(const std::string& from, const std::string& to) {
  if (Status s = validate_file_path(from); !s.is_ok()) return s;
  if (Status s = validate_file_path(to); !s.is_ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (files_.count(from) == 0 && dirs_.count(from) == 0) {
    return Status::not_found(
        fmt::format("rename {} in memory: no such file or directory", path_text(from)));
  }
  if (files_.count(to) != 0 || dirs_.count(to) != 0 || is_under(to, from)) {
    return Status::io_error(
        fmt::format("rename {} to {} in memory: the target exists or lies "
                    "below the source",
                    path_text(from), path_text(to)));
  }
  if (std::string a = file_ancestor_locked(to); !a.empty()) {
    return Status::io_error(fmt::format("rename to {} in memory: {} is a file, not a directory",
                                        path_text(to), path_text(a)));
  }
  const auto moved = [&](const std::string& path) { return to + path.substr(from.size()); };
  std::vector<std::pair<std::string, std::shared_ptr<const std::vector<char>>>> files;
  for (auto it = files_.lower_bound(from + "/"); it != files_.end() && is_under(it->first, from);) {
    files.emplace_back(moved(it->first), std::move(it->second));
    it = files_.erase(it);
  }
  if (const auto it = files_.find(from); it != files_.end()) {
    files.emplace_back(to, std::move(it->second));
    files_.erase(it);
  }
  std::vector<std::string> dirs;
  for (auto it = dirs_.lower_bound(from + "/"); it != dirs_.end() && is_under(*it, from);) {
    dirs.push_back(moved(*it));
    it = dirs_.erase(it);
  }
  if (dirs_.erase(from) != 0) dirs.push_back(to);
  for (std::string& a : ancestors(to)) dirs_.insert(std::move(a));
  for (auto& d : dirs) dirs_.insert(std::move(d));
  for (auto& [path, bytes] : files) files_[path] = std::move(bytes);
  return Status::ok();
}

// ---------------------------------------------------------------------------------------
// PrefixedStorage

PrefixedStorage::PrefixedStorage(Storage& base, std::string prefix)
    : base_(base), prefix_(std::move(prefix)) {
  const Status s = validate_file_path(prefix_);
  CKPTSIM_CHECK(s.is_ok(), "PrefixedStorage with an invalid prefix: " + s.to_string());
}

std::string PrefixedStorage::full(const std::string& path) const {
  return path.empty() ? prefix_ : prefix_ + "/" + path;  // "" is the prefix directory itself
}

std::string PrefixedStorage::describe() const { return base_.describe() + ", under " + prefix_; }

Status PrefixedStorage::write_file(const std::string& path, std::span<const char> bytes) {
  if (Status s = validate_file_path(path); !s.is_ok()) return s;
  return base_.write_file(full(path), bytes);
}

Result<std::vector<char>> PrefixedStorage::read_file(const std::string& path) const {
  if (Status s = validate_file_path(path); !s.is_ok()) return s;
  return base_.read_file(full(path));
}

Result<std::shared_ptr<const std::vector<char>>> PrefixedStorage::read_file_shared(
    const std::string& path) const {
  if (Status s = validate_file_path(path); !s.is_ok()) return s;
  return base_.read_file_shared(full(path));
}

bool PrefixedStorage::exists(const std::string& path) const {
  return validate_dir_path(path).is_ok() && base_.exists(full(path));
}

Result<std::vector<std::string>> PrefixedStorage::list(const std::string& dir) const {
  if (Status s = validate_dir_path(dir); !s.is_ok()) return s;
  return base_.list(full(dir));
}

Status PrefixedStorage::remove_all(const std::string& dir) {
  if (Status s = validate_dir_path(dir); !s.is_ok()) return s;
  if (!dir.empty()) return base_.remove_all(full(dir));
  // "" empties the prefix directory but keeps it, as remove_all("") keeps a root.
  Result<std::vector<std::string>> children = base_.list(prefix_);
  if (!children.is_ok()) {
    return children.status().code() == Status::Code::kNotFound ? Status::ok() : children.status();
  }
  for (const std::string& name : children.value()) {
    if (Status s = base_.remove_all(full(name)); !s.is_ok()) return s;
  }
  return Status::ok();
}

Status PrefixedStorage::rename(const std::string& from, const std::string& to) {
  if (Status s = validate_file_path(from); !s.is_ok()) return s;
  if (Status s = validate_file_path(to); !s.is_ok()) return s;
  return base_.rename(full(from), full(to));
}

std::unique_ptr<Storage> subdir(Storage& base, std::string prefix) {
  return std::make_unique<PrefixedStorage>(base, std::move(prefix));
}

std::unique_ptr<const Storage> subdir(const Storage& base, std::string prefix) {
  // PrefixedStorage holds a mutable reference; the const result reaches only its const methods,
  // which call only the base's const methods.
  return std::make_unique<const PrefixedStorage>(const_cast<Storage&>(base), std::move(prefix));
}

}  // namespace ckptsim::model
