// What the fuzzers of fuzz/ share: the checks that turn a broken promise of a reader into a
// crash libFuzzer records, and the packed-files format that lets one fuzz input hold a whole
// checkpoint directory.
//
// The promises checked here (model/py/pickle_tree.h invariant 3, torch_save_format.h
// invariant 1, distributed_checkpoint.h invariant 4, torch_dist_checkpoint.h invariant 3): a
// reader returns a value or a Status, and the Status's message is one non-empty line that names
// the file. An exception that leaves a reader is a crash by itself (libFuzzer reports the
// uncaught exception's abort). fuzz/value_walk.h checks the values.
//
// Packed files (pack_files / split_files): records of
//   <u8 name length> <name> <u32 little-endian data length> <data>
// back to back. A record cut short by the end of the input keeps what is there: a name without
// its length ends the list, a data length past the end takes the bytes that are left. So every
// input splits into some files, and a mutation of one byte changes one file.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/status.h"

namespace ckptsim::fuzz {

struct BrokenPromise : std::logic_error {
  using std::logic_error::logic_error;
};

[[noreturn]] inline void broken(const std::string& what) {
#ifdef CKPTSIM_FUZZ_IN_TESTS
  throw BrokenPromise("broken promise: " + what);
#else
  std::fprintf(stderr, "ckptsim fuzz: broken promise: %s\n", what.c_str());
  std::abort();
#endif
}

inline std::span<const char> as_chars(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A reader's error: one non-empty line that contains `names` (a file, or a directory prefix).
inline void check_error(const Status& status, std::string_view names) {
  const std::string& m = status.message();
  if (status.is_ok()) broken("an ok Status where an error was expected");
  if (m.empty()) broken("an error without a message");
  if (m.find_first_of("\n\r") != std::string::npos) {
    broken("a message of more than one line: " + m);
  }
  if (m.find(names) == std::string::npos) {
    broken("a message that does not name '" + std::string(names) + "': " + m);
  }
}

inline void append_le(std::string& out, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// REQUIRES: every name is under 256 bytes and every file under 4 GiB.
inline std::string pack_files(const std::vector<std::pair<std::string, std::string>>& files) {
  std::string out;
  for (const auto& [name, data] : files) {
    append_le(out, name.size(), 1);
    out += name;
    append_le(out, data.size(), 4);
    out += data;
  }
  return out;
}

inline std::vector<std::pair<std::string, std::string_view>> split_files(std::span<const char> in) {
  std::vector<std::pair<std::string, std::string_view>> files;
  size_t pos = 0;
  while (pos < in.size()) {
    const size_t name_size = static_cast<unsigned char>(in[pos++]);
    if (in.size() - pos < name_size + 4) break;
    std::string name(in.data() + pos, name_size);
    pos += name_size;
    size_t data_size = 0;
    for (size_t i = 0; i < 4; ++i) {
      data_size |= size_t{static_cast<unsigned char>(in[pos++])} << (8 * i);
    }
    data_size = std::min(data_size, in.size() - pos);
    files.emplace_back(std::move(name), std::string_view(in.data() + pos, data_size));
    pos += data_size;
  }
  return files;
}

}  // namespace ckptsim::fuzz
