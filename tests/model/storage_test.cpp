// Tests of model/storage.h: one contract suite (StorageContract) run on every Storage —
// MemoryStorage, DirectoryStorage, and PrefixedStorage over each — plus the parts that only
// a real directory has (DirectoryStorage*) and the wrapper's own rules (PrefixedStorage*).
//
// Which deliberately broken variant (mutation) each test catches:
//   WriteThenReadReturnsTheSameBytes   storing bytes as a C string (cut at the first NUL);
//                                      dropping the empty file
//   OverwriteReplacesTheWholeFile      writing in place without truncation (a shorter
//                                      second write leaves the tail of the first)
//   WriteCreatesParentDirectories      write_file not creating parents (Directory: ENOENT);
//                                      MemoryStorage not recording implicit directories
//   ListNamesDirectChildrenSorted      listing descendants instead of children; unsorted or
//                                      duplicated names (a dir seen via two files)
//   RemoveAllRemovesOnlyTheSubtree     removing by raw string prefix ("a" also removes "ab")
//   RemoveAllKeepsTheEmptiedParent     MemoryStorage deriving directories from files only
//   RemoveAllOfRootEmptiesIt           remove_all("") deleting nothing / failing
//   RemoveAllOfAbsentIsOk              remove_all reporting not_found (not rm -rf)
//   MissingFileIsNotFoundNamingPath    mapping ENOENT to io_error; message without the path
//   MissingDirectoryIsNotFound         list() of an absent directory returning ok and empty
//   InvalidPathsAreRejected            validate_file_path accepting "..", ".", "", "/x",
//                                      "a//b", a trailing '/', NUL, the reserved tmp prefix,
//                                      or an over-long path (off-by-one at kPathLengthMax).
//                                      With the validator broken, DirectoryStorage's own
//                                      containment check throws before touching anything
//                                      outside its root (and the root is one level below a
//                                      directory the test owns, as a second guard).
//   FileWhereDirectoryIsNeededIsIoError  MemoryStorage silently writing "a/b" under file "a"
//   DirectoryWhereFileIsNeededIsIoError  reading or overwriting a directory as a file
//   FileSizeLimit                      '>=' instead of '>' against file_bytes_max
//   ConcurrentWritersFromEightThreads  MemoryStorage without its mutex (crashes or loses
//                                      files; reliably only under TSan), a shared
//                                      temporary name in DirectoryStorage
//   DirectoryStorageFilesAreOnDisk     DirectoryStorage writing anywhere but root/path
//   DirectoryStorageReplaceIsARename   writing the target in place (O_TRUNC) instead of a
//                                      temporary file renamed over it
//   DirectoryStorageReadersSeeWholeFiles  same, seen by a concurrent reader
//   DirectoryStorageHidesTemporaryFiles   list() showing a writer's temporary file
//   DirectoryStorageErrorsCarryStrerror   messages without strerror or the path
//   MemoryStorageBytesLimit            not accounting the replaced file's bytes
//   ReadFileSharedReadsWhatReadFileReads  read_file_shared of another file, or of a stale
//                                      version after an overwrite (PrefixedStorage: not
//                                      forwarding it, reading outside the prefix)
//   MemoryStorage.SharedReadsShareOneCopy  a copy per read (no sharing); an overwrite that
//                                      writes into the bytes readers hold instead of
//                                      replacing them
//   PrefixedStorage*                   dropping the prefix; validating only the joined path
//                                      (".." would climb out of the prefix)
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model/errors.h"
#include "model/faulty_storage.h"
#include "model/storage.h"

namespace ckptsim::model {
namespace {

namespace fs = std::filesystem;

std::vector<char> bytes_of(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

std::string read_str(const Storage& s, const std::string& path) {
  Result<std::vector<char>> r = s.read_file(path);
  EXPECT_TRUE(r.is_ok()) << path << ": " << r.status().to_string();
  if (!r.is_ok()) return "<error>";
  return std::string(r.value().begin(), r.value().end());
}

Status write_str(Storage& s, const std::string& path, const std::string& text) {
  const std::vector<char> b = bytes_of(text);
  return s.write_file(path, b);
}

std::vector<std::string> names(std::initializer_list<const char*> items) {
  return std::vector<std::string>(items.begin(), items.end());
}

// A fresh directory under the test temp dir, removed at the end. The storage root is a
// subdirectory of it, so that even a path escaping the root by one level (a broken
// validator under mutation testing) stays inside a directory this test owns.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::path(::testing::TempDir()) / "ckptsim-storage-XXXXXX").string();
    char* made = ::mkdtemp(tmpl.data());
    if (made == nullptr) {
      ADD_FAILURE() << "mkdtemp " << tmpl;
      return;
    }
    owned_ = made;
    path_ = owned_ / "root";
    fs::create_directory(path_);
  }
  ~TempDir() {
    std::error_code ec;
    if (!owned_.empty()) fs::remove_all(owned_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path owned_;
  fs::path path_ = "/nonexistent-ckptsim-storage-test";
};

struct MemoryFactory {
  static std::string name() { return "Memory"; }
  std::unique_ptr<Storage> make(StorageOptions options) {
    return std::make_unique<MemoryStorage>(options);
  }
};

struct DirectoryFactory {
  static std::string name() { return "Directory"; }
  std::unique_ptr<Storage> make(StorageOptions options) {
    return std::make_unique<DirectoryStorage>(dir.path(), options);
  }
  TempDir dir;
};

struct PrefixedMemoryFactory {
  static std::string name() { return "PrefixedMemory"; }
  std::unique_ptr<Storage> make(StorageOptions options) {
    base = std::make_unique<MemoryStorage>(options);
    return subdir(*base, "phase_0/ckpt");
  }
  std::unique_ptr<MemoryStorage> base;
};

struct PrefixedDirectoryFactory {
  static std::string name() { return "PrefixedDirectory"; }
  std::unique_ptr<Storage> make(StorageOptions options) {
    base = std::make_unique<DirectoryStorage>(dir.path(), options);
    return subdir(*base, "phase_1");
  }
  TempDir dir;
  std::unique_ptr<DirectoryStorage> base;
};

// A FaultyStorage without faults is its base (faulty_storage.h, invariant 1).
struct FaultyMemoryFactory {
  static std::string name() { return "FaultyMemory"; }
  std::unique_ptr<Storage> make(StorageOptions options) {
    base = std::make_unique<MemoryStorage>(options);
    return std::make_unique<FaultyStorage>(*base, std::vector<StorageFault>{});
  }
  std::unique_ptr<MemoryStorage> base;
};

template <typename Factory>
class StorageContract : public ::testing::Test {
 protected:
  Storage& store(StorageOptions options = {}) {
    storage_ = factory_.make(options);
    return *storage_;
  }

  Factory factory_;
  std::unique_ptr<Storage> storage_;
};

using StorageKinds = ::testing::Types<MemoryFactory, DirectoryFactory, PrefixedMemoryFactory,
                                      PrefixedDirectoryFactory, FaultyMemoryFactory>;
struct StorageKindNames {
  template <typename T>
  static std::string GetName(int) {
    return T::name();
  }
};
TYPED_TEST_SUITE(StorageContract, StorageKinds, StorageKindNames);

TYPED_TEST(StorageContract, WriteThenReadReturnsTheSameBytes) {
  Storage& s = this->store();
  const std::vector<char> binary = {'a', '\0', 'b', '\xff', '\0', '\n', 'z'};
  ASSERT_TRUE(s.write_file("bin", binary).is_ok());
  ASSERT_TRUE(s.write_file("empty", std::span<const char>()).is_ok());

  Result<std::vector<char>> got = s.read_file("bin");
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got.value(), binary);
  Result<std::vector<char>> empty = s.read_file("empty");
  ASSERT_TRUE(empty.is_ok()) << empty.status().to_string();
  EXPECT_TRUE(empty.value().empty());
}

TYPED_TEST(StorageContract, ReadFileSharedReadsWhatReadFileReads) {
  Storage& s = this->store();
  const std::vector<char> binary = {'a', '\0', 'b', '\xff'};
  ASSERT_TRUE(s.write_file("d/bin", binary).is_ok());
  ASSERT_TRUE(write_str(s, "d/other", "other").is_ok());
  auto shared = s.read_file_shared("d/bin");
  ASSERT_TRUE(shared.is_ok()) << shared.status().to_string();
  EXPECT_EQ(*shared.value(), binary);
  ASSERT_TRUE(write_str(s, "d/bin", "second").is_ok());
  auto again = s.read_file_shared("d/bin");
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(std::string(again.value()->begin(), again.value()->end()), "second");
  EXPECT_EQ(*shared.value(), binary) << "what a reader holds never changes";
  EXPECT_EQ(s.read_file_shared("d/none").status().code(), Status::Code::kNotFound);
  EXPECT_EQ(s.read_file_shared("../x").status().code(), Status::Code::kInvalidInput);
}

TYPED_TEST(StorageContract, OverwriteReplacesTheWholeFile) {
  Storage& s = this->store();
  ASSERT_TRUE(write_str(s, "f", "a long first version").is_ok());
  ASSERT_TRUE(write_str(s, "f", "short").is_ok());
  EXPECT_EQ(read_str(s, "f"), "short");
}

TYPED_TEST(StorageContract, WriteCreatesParentDirectories) {
  Storage& s = this->store();
  ASSERT_TRUE(write_str(s, "a/b/c/d.pt", "x").is_ok());
  EXPECT_TRUE(s.exists("a"));
  EXPECT_TRUE(s.exists("a/b"));
  EXPECT_TRUE(s.exists("a/b/c"));
  EXPECT_TRUE(s.exists("a/b/c/d.pt"));
  EXPECT_FALSE(s.exists("a/b/c/e.pt"));
  EXPECT_FALSE(s.exists("b"));
  Result<std::vector<std::string>> l = s.list("a/b");
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  EXPECT_EQ(l.value(), names({"c"}));
}

TYPED_TEST(StorageContract, ListNamesDirectChildrenSorted) {
  Storage& s = this->store();
  // Written out of order; "b" is reached through two files and one deeper directory.
  for (const char* p : {"c/d", "b/y/z", "a", "b/x", "b/w", "B"}) {
    ASSERT_TRUE(write_str(s, p, p).is_ok()) << p;
  }
  Result<std::vector<std::string>> root = s.list("");
  ASSERT_TRUE(root.is_ok()) << root.status().to_string();
  EXPECT_EQ(root.value(), names({"B", "a", "b", "c"}));  // bytewise: 'B' < 'a'
  Result<std::vector<std::string>> b = s.list("b");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b.value(), names({"w", "x", "y"}));
  Result<std::vector<std::string>> by = s.list("b/y");
  ASSERT_TRUE(by.is_ok());
  EXPECT_EQ(by.value(), names({"z"}));
}

TYPED_TEST(StorageContract, RemoveAllRemovesOnlyTheSubtree) {
  Storage& s = this->store();
  for (const char* p : {"a/b/c", "a/d", "ab", "ab2/x", "a.pt"})
    ASSERT_TRUE(write_str(s, p, p).is_ok());
  ASSERT_TRUE(s.remove_all("a").is_ok());
  EXPECT_FALSE(s.exists("a"));
  EXPECT_FALSE(s.exists("a/b/c"));
  EXPECT_FALSE(s.exists("a/d"));
  EXPECT_EQ(read_str(s, "ab"), "ab");
  EXPECT_EQ(read_str(s, "ab2/x"), "ab2/x");
  EXPECT_EQ(read_str(s, "a.pt"), "a.pt");
  Result<std::vector<std::string>> root = s.list("");
  ASSERT_TRUE(root.is_ok());
  EXPECT_EQ(root.value(), names({"a.pt", "ab", "ab2"}));
  // A file, too.
  ASSERT_TRUE(s.remove_all("ab").is_ok());
  EXPECT_FALSE(s.exists("ab"));
}

// Mutation caught: a memory rename that starts its scan at `from` itself (lower_bound(from))
// stops at "a" before "a-x" and moves nothing below "a/".
TYPED_TEST(StorageContract, RenameMovesTheWholeSubtreeAndOnlyIt) {
  Storage& s = this->store();
  for (const char* p : {"a/b/c", "a/d", "a-x", "ab/y"}) ASSERT_TRUE(write_str(s, p, p).is_ok());
  ASSERT_TRUE(s.rename("a", "n/m").is_ok());
  EXPECT_FALSE(s.exists("a"));
  EXPECT_EQ(read_str(s, "n/m/b/c"), "a/b/c");
  EXPECT_EQ(read_str(s, "n/m/d"), "a/d");
  EXPECT_EQ(read_str(s, "a-x"), "a-x");
  EXPECT_EQ(read_str(s, "ab/y"), "ab/y");
  Result<std::vector<std::string>> m = s.list("n/m");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m.value(), names({"b", "d"}));
  // A file, too; an absent source and an existing target are errors that move nothing.
  ASSERT_TRUE(s.rename("a-x", "z").is_ok());
  EXPECT_EQ(read_str(s, "z"), "a-x");
  EXPECT_EQ(s.rename("gone", "q").code(), Status::Code::kNotFound);
  EXPECT_EQ(s.rename("z", "ab").code(), Status::Code::kIoError);
  EXPECT_EQ(read_str(s, "z"), "a-x");
  EXPECT_EQ(read_str(s, "ab/y"), "ab/y");
}

TYPED_TEST(StorageContract, RemoveAllKeepsTheEmptiedParent) {
  Storage& s = this->store();
  ASSERT_TRUE(write_str(s, "a/b/c", "x").is_ok());
  ASSERT_TRUE(s.remove_all("a/b").is_ok());
  EXPECT_TRUE(s.exists("a"));
  EXPECT_FALSE(s.exists("a/b"));
  Result<std::vector<std::string>> l = s.list("a");
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  EXPECT_TRUE(l.value().empty());
}

TYPED_TEST(StorageContract, RemoveAllOfRootEmptiesIt) {
  Storage& s = this->store();
  ASSERT_TRUE(write_str(s, "x/y", "1").is_ok());
  ASSERT_TRUE(write_str(s, "z", "2").is_ok());
  ASSERT_TRUE(s.remove_all("").is_ok());
  EXPECT_FALSE(s.exists("x"));
  EXPECT_FALSE(s.exists("z"));
  EXPECT_TRUE(s.exists(""));
  Result<std::vector<std::string>> l = s.list("");
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  EXPECT_TRUE(l.value().empty());
}

TYPED_TEST(StorageContract, RemoveAllOfAbsentIsOk) {
  Storage& s = this->store();
  EXPECT_TRUE(s.remove_all("never/written").is_ok());
}

TYPED_TEST(StorageContract, MissingFileIsNotFoundNamingPath) {
  Storage& s = this->store();
  ASSERT_TRUE(write_str(s, "dir/other", "x").is_ok());
  Result<std::vector<char>> r = s.read_file("dir/common.pt");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
  EXPECT_NE(r.status().message().find("common.pt"), std::string::npos) << r.status().message();
  Result<std::vector<char>> r2 = s.read_file("nodir/common.pt");
  ASSERT_FALSE(r2.is_ok());
  EXPECT_EQ(r2.status().code(), Status::Code::kNotFound);
}

TYPED_TEST(StorageContract, MissingDirectoryIsNotFound) {
  Storage& s = this->store();
  ASSERT_TRUE(write_str(s, "a/f", "x").is_ok());
  Result<std::vector<std::string>> l = s.list("a/missing");
  ASSERT_FALSE(l.is_ok());
  EXPECT_EQ(l.status().code(), Status::Code::kNotFound);
  EXPECT_NE(l.status().message().find("missing"), std::string::npos) << l.status().message();
}

TYPED_TEST(StorageContract, InvalidPathsAreRejected) {
  Storage& s = this->store();
  ASSERT_TRUE(write_str(s, "ok/file", "x").is_ok());
  const std::string nul_path("a\0b", 3);
  const std::vector<std::string> bad = {"",
                                        "/abs",
                                        "..",
                                        "a/../b",
                                        "../x",
                                        ".",
                                        "./a",
                                        "a/./b",
                                        "a//b",
                                        "a/",
                                        "/",
                                        nul_path,
                                        std::string(kTmpPrefix) + "1",
                                        "ok/" + std::string(kTmpPrefix) + "x",
                                        std::string(kPathLengthMax + 1, 'p')};
  for (const std::string& p : bad) {
    SCOPED_TRACE("path '" + p + "'");
    const Status w = write_str(s, p, "x");
    EXPECT_EQ(w.code(), Status::Code::kInvalidInput) << w.to_string();
    const Result<std::vector<char>> r = s.read_file(p);
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidInput) << r.status().to_string();
    if (p.empty()) continue;  // "" is the root for exists, list and remove_all
    EXPECT_FALSE(s.exists(p));
    EXPECT_EQ(s.list(p).status().code(), Status::Code::kInvalidInput);
    EXPECT_EQ(s.remove_all(p).code(), Status::Code::kInvalidInput);
  }
  // The longest valid path is accepted (the limit is inclusive).
  const std::string longest = std::string(kPathLengthMax - 1 - 6, 'd') + "/" + "file.x";
  ASSERT_EQ(longest.size(), kPathLengthMax);
  EXPECT_TRUE(validate_file_path(longest).is_ok());
  EXPECT_EQ(validate_file_path(longest + "x").code(), Status::Code::kInvalidInput);
  // Dots inside a name are fine.
  EXPECT_TRUE(write_str(s, "ok/..hidden", "h").is_ok());
  EXPECT_TRUE(write_str(s, "ok/a..b", "h").is_ok());
  EXPECT_EQ(read_str(s, "ok/file"), "x");  // nothing above clobbered the valid file
}

TYPED_TEST(StorageContract, FileWhereDirectoryIsNeededIsIoError) {
  Storage& s = this->store();
  ASSERT_TRUE(write_str(s, "a", "file").is_ok());
  EXPECT_EQ(write_str(s, "a/b", "x").code(), Status::Code::kIoError);
  EXPECT_EQ(write_str(s, "a/b/c", "x").code(), Status::Code::kIoError);
  EXPECT_EQ(s.read_file("a/b").status().code(), Status::Code::kIoError);
  EXPECT_EQ(s.list("a").status().code(), Status::Code::kIoError);
  EXPECT_EQ(s.list("a/b").status().code(), Status::Code::kIoError);
  EXPECT_FALSE(s.exists("a/b"));
  EXPECT_EQ(read_str(s, "a"), "file");
}

TYPED_TEST(StorageContract, DirectoryWhereFileIsNeededIsIoError) {
  Storage& s = this->store();
  ASSERT_TRUE(write_str(s, "d/f", "x").is_ok());
  const Result<std::vector<char>> r = s.read_file("d");
  EXPECT_EQ(r.status().code(), Status::Code::kIoError) << r.status().to_string();
  EXPECT_EQ(write_str(s, "d", "y").code(), Status::Code::kIoError);
  EXPECT_EQ(read_str(s, "d/f"), "x");
}

TYPED_TEST(StorageContract, FileSizeLimit) {
  StorageOptions options;
  options.file_bytes_max = 16;
  Storage& s = this->store(options);
  EXPECT_TRUE(s.write_file("max", std::vector<char>(16, 'm')).is_ok());
  const Status over = s.write_file("over", std::vector<char>(17, 'o'));
  EXPECT_EQ(over.code(), Status::Code::kInvalidInput) << over.to_string();
  EXPECT_FALSE(s.exists("over"));
  EXPECT_EQ(read_str(s, "max"), std::string(16, 'm'));
}

TYPED_TEST(StorageContract, ConcurrentWritersFromEightThreads) {
  Storage& s = this->store();
  constexpr int kThreads = 8;
  constexpr int kFilesPerThread = 40;
  // Each rank writes its own directory and, racing the others, files in shared
  // directories that all of them create implicitly.
  auto content = [](int t, int i) {
    return std::string(static_cast<size_t>(1 + (t * 7 + i) % 97), static_cast<char>('a' + t)) +
           std::to_string(i);
  };
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kFilesPerThread; ++i) {
        const std::string own = "rank_" + std::to_string(t) + "/f" + std::to_string(i);
        const std::string shared = "shared/deep/" + std::to_string(i % 4) + "/r" +
                                   std::to_string(t) + "_" + std::to_string(i);
        if (!write_str(s, own, content(t, i)).is_ok()) ++failures;
        if (!write_str(s, shared, content(t, i)).is_ok()) ++failures;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (int t = 0; t < kThreads; ++t) {
    const Result<std::vector<std::string>> own = s.list("rank_" + std::to_string(t));
    ASSERT_TRUE(own.is_ok());
    EXPECT_EQ(own.value().size(), static_cast<size_t>(kFilesPerThread));
    for (int i = 0; i < kFilesPerThread; ++i) {
      EXPECT_EQ(read_str(s, "rank_" + std::to_string(t) + "/f" + std::to_string(i)), content(t, i));
      EXPECT_EQ(read_str(s, "shared/deep/" + std::to_string(i % 4) + "/r" + std::to_string(t) +
                                "_" + std::to_string(i)),
                content(t, i));
    }
  }
  size_t shared_files = 0;
  for (int d = 0; d < 4; ++d) {
    const Result<std::vector<std::string>> l = s.list("shared/deep/" + std::to_string(d));
    ASSERT_TRUE(l.is_ok());
    shared_files += l.value().size();
  }
  EXPECT_EQ(shared_files, static_cast<size_t>(kThreads * kFilesPerThread));
}

// ---------------------------------------------------------------------------------------
// DirectoryStorage only.

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(DirectoryStorage, FilesAreOnDisk) {
  TempDir dir;
  DirectoryStorage s(dir.path());
  EXPECT_EQ(s.describe(), "directory " + dir.path().string());
  ASSERT_TRUE(write_str(s, "phase_0/common.pt", "abc").is_ok());
  EXPECT_TRUE(fs::is_regular_file(dir.path() / "phase_0" / "common.pt"));
  EXPECT_EQ(slurp(dir.path() / "phase_0" / "common.pt"), "abc");
  // And what another program wrote there is visible through the storage.
  std::ofstream(dir.path() / "phase_0" / "metadata.json", std::ios::binary) << "{}";
  EXPECT_EQ(read_str(s, "phase_0/metadata.json"), "{}");
  const Result<std::vector<std::string>> l = s.list("phase_0");
  ASSERT_TRUE(l.is_ok());
  EXPECT_EQ(l.value(), names({"common.pt", "metadata.json"}));
}

TEST(DirectoryStorage, ReplaceIsARename) {
  // A hard link keeps the inode it was made on. A replace by rename leaves that inode (and
  // so the link) with the old bytes; rewriting the target in place would change both.
  TempDir dir;
  DirectoryStorage s(dir.path());
  ASSERT_TRUE(write_str(s, "ckpt/common.pt", "old bytes").is_ok());
  fs::create_hard_link(dir.path() / "ckpt" / "common.pt", dir.path() / "ckpt" / "link");
  ASSERT_TRUE(write_str(s, "ckpt/common.pt", "new").is_ok());
  EXPECT_EQ(read_str(s, "ckpt/common.pt"), "new");
  EXPECT_EQ(slurp(dir.path() / "ckpt" / "link"), "old bytes");
  // No temporary file is left behind.
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path() / "ckpt")) {
    ++entries;
    EXPECT_NE(e.path().filename().string().rfind(kTmpPrefix, 0), 0u) << e.path();
  }
  EXPECT_EQ(entries, 2u);
}

TEST(DirectoryStorage, ReadersSeeWholeFiles) {
  // A reader racing a writer that alternates two contents of different sizes must see one
  // of them whole. No timing is asserted: a non-atomic writer fails this with high
  // probability, an atomic one never.
  TempDir dir;
  DirectoryStorage s(dir.path());
  const std::string a(1 << 18, 'A');
  const std::string b(1 << 17, 'B');
  ASSERT_TRUE(write_str(s, "f", a).is_ok());
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 0; i < 200; ++i) EXPECT_TRUE(write_str(s, "f", i % 2 ? a : b).is_ok());
    done = true;  // always, so the reader loop ends even if a write failed
  });
  int reads = 0;
  int torn = 0;
  while (!done || reads < 10) {
    const Result<std::vector<char>> r = s.read_file("f");
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const std::string got(r.value().begin(), r.value().end());
    if (got != a && got != b) ++torn;
    ++reads;
  }
  writer.join();
  EXPECT_EQ(torn, 0) << "of " << reads << " reads";
}

TEST(DirectoryStorage, HidesTemporaryFiles) {
  TempDir dir;
  DirectoryStorage s(dir.path());
  ASSERT_TRUE(write_str(s, "d/real", "x").is_ok());
  std::ofstream(dir.path() / "d" / (std::string(kTmpPrefix) + "123-0")) << "partial";
  const Result<std::vector<std::string>> l = s.list("d");
  ASSERT_TRUE(l.is_ok());
  EXPECT_EQ(l.value(), names({"real"}));
}

TEST(DirectoryStorage, ErrorsCarryStrerror) {
  TempDir dir;
  DirectoryStorage s(dir.path());
  ASSERT_TRUE(write_str(s, "a", "file").is_ok());
  const Result<std::vector<char>> r = s.read_file("a/b");  // open(2) fails with ENOTDIR
  ASSERT_EQ(r.status().code(), Status::Code::kIoError);
  EXPECT_NE(r.status().message().find("Not a directory"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("'a/b'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(dir.path().string()), std::string::npos);
}

TEST(DirectoryStorage, AbsentRootIsCreatedByTheFirstWrite) {
  TempDir dir;
  DirectoryStorage s(dir.path() / "not" / "yet");
  EXPECT_FALSE(s.exists(""));
  EXPECT_EQ(s.list("").status().code(), Status::Code::kNotFound);
  ASSERT_TRUE(write_str(s, "f", "x").is_ok());
  EXPECT_TRUE(s.exists(""));
  EXPECT_EQ(slurp(dir.path() / "not" / "yet" / "f"), "x");
}

// ---------------------------------------------------------------------------------------
// MemoryStorage only.

TEST(MemoryStorage, DescribeAndRootAlwaysExists) {
  MemoryStorage s;
  EXPECT_EQ(s.describe(), "memory");
  EXPECT_TRUE(s.exists(""));
  const Result<std::vector<std::string>> l = s.list("");
  ASSERT_TRUE(l.is_ok());
  EXPECT_TRUE(l.value().empty());
}

TEST(MemoryStorage, BytesLimit) {
  StorageOptions options;
  options.memory_bytes_max = 10;
  MemoryStorage s(options);
  ASSERT_TRUE(write_str(s, "a", "123456").is_ok());
  ASSERT_TRUE(write_str(s, "b", "1234").is_ok());
  EXPECT_EQ(s.bytes_stored(), 10u);
  EXPECT_EQ(write_str(s, "c", "1").code(), Status::Code::kIoError);
  // Replacing a file frees its old bytes first: 6 -> 5 fits.
  EXPECT_TRUE(write_str(s, "a", "12345").is_ok());
  EXPECT_EQ(s.bytes_stored(), 9u);
  ASSERT_TRUE(s.remove_all("a").is_ok());
  EXPECT_EQ(s.bytes_stored(), 4u);
  EXPECT_TRUE(write_str(s, "c", "123456").is_ok());
}

// N ranks reading one file hold one copy (Storage invariant 8), and an overwrite replaces it.
TEST(MemoryStorage, SharedReadsShareOneCopy) {
  MemoryStorage base;
  std::unique_ptr<Storage> prefixed = subdir(base, "phase_0");
  ASSERT_TRUE(write_str(*prefixed, "metadata.json", "first").is_ok());
  auto a = prefixed->read_file_shared("metadata.json");
  auto b = base.read_file_shared("phase_0/metadata.json");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a.value(), b.value()) << "one copy, not one per reader";
  ASSERT_TRUE(write_str(*prefixed, "metadata.json", "2nd").is_ok());
  auto c = base.read_file_shared("phase_0/metadata.json");
  ASSERT_TRUE(c.is_ok());
  EXPECT_NE(c.value(), a.value());
  EXPECT_EQ(std::string(a.value()->begin(), a.value()->end()), "first");
  EXPECT_EQ(std::string(c.value()->begin(), c.value()->end()), "2nd");
  EXPECT_EQ(base.bytes_stored(), 3u);
}

// ---------------------------------------------------------------------------------------
// PrefixedStorage only.

TEST(PrefixedStorage, LivesUnderItsPrefixInTheBase) {
  MemoryStorage base;
  std::unique_ptr<Storage> p0 = subdir(base, "phase_0");
  std::unique_ptr<Storage> p1 = subdir(base, "phase_1");
  ASSERT_TRUE(write_str(*p0, "common.pt", "zero").is_ok());
  ASSERT_TRUE(write_str(*p1, "common.pt", "one").is_ok());
  EXPECT_EQ(read_str(base, "phase_0/common.pt"), "zero");
  EXPECT_EQ(read_str(base, "phase_1/common.pt"), "one");
  const Result<std::vector<std::string>> root = base.list("");
  ASSERT_TRUE(root.is_ok());
  EXPECT_EQ(root.value(), names({"phase_0", "phase_1"}));
  ASSERT_TRUE(p0->remove_all("").is_ok());
  EXPECT_TRUE(base.exists("phase_0"));
  EXPECT_FALSE(base.exists("phase_0/common.pt"));
  EXPECT_EQ(read_str(*p1, "common.pt"), "one");
  EXPECT_EQ(p0->describe(), "memory, under phase_0");
}

TEST(PrefixedStorage, ValidatesTheCallersPathNotTheJoinedOne) {
  MemoryStorage base;
  ASSERT_TRUE(write_str(base, "secret", "s").is_ok());
  std::unique_ptr<Storage> p = subdir(base, "phase_0/x");
  // The joined "phase_0/x/../../secret" is rejected by the base as well; the wrapper must
  // reject it itself so the message names the path as the caller wrote it.
  const Result<std::vector<char>> r = p->read_file("../../secret");
  ASSERT_EQ(r.status().code(), Status::Code::kInvalidInput);
  EXPECT_NE(r.status().message().find("'../../secret'"), std::string::npos) << r.status().message();
  EXPECT_EQ(p->write_file("/abs", bytes_of("x")).code(), Status::Code::kInvalidInput);
}

TEST(PrefixedStorage, InvalidPrefixIsAProgrammingError) {
  MemoryStorage base;
  EXPECT_THROW(subdir(base, "../up"), InvariantViolation);
  EXPECT_THROW(subdir(base, ""), InvariantViolation);
  EXPECT_THROW(subdir(base, "a/"), InvariantViolation);
}

}  // namespace
}  // namespace ckptsim::model
