// Where a zip archive's end record and central directory lie, read without trusting the bytes:
// what the model's two libtorch entries check before libtorch's own reader sees an archive
// (model/py/pickle_codec.cpp: the archive must end whole; model/torch/torch_save_format.cpp: no
// record may declare more bytes than the archive holds). libtorch's reader (miniz) trusts what
// the end record says and reads or allocates by it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace ckptsim::model::zip {

inline constexpr size_t kEndRecordBytes = 22;
inline constexpr uint32_t kEndRecordMagic = 0x06054b50u;
inline constexpr uint32_t kCentralEntryMagic = 0x02014b50u;

// The little-endian unsigned integer of n (<= 8) bytes at off; nullopt where it runs past the
// bytes.
std::optional<uint64_t> read_le(std::span<const char> bytes, uint64_t off, size_t n);

struct End {
  size_t at = 0;           // the end record's offset
  uint64_t entries = 0;    // central directory entries (the zip64 record's where it has one)
  uint64_t cd_offset = 0;  // where the central directory starts (likewise)
  uint64_t plain_cd_offset = 0, plain_cd_size = 0;  // as the plain end record says them
  // The plain record's offset or size is 0xffffffff: the zip64 record holds the real values.
  bool defers_to_zip64() const {
    return plain_cd_offset == 0xffffffffu || plain_cd_size == 0xffffffffu;
  }
};

// The last end record among the last 22 + 65,535 bytes (the record, behind a comment of at most
// 64 KiB), nullopt when there is none. A zip64 locator that points at a zip64 end record gives
// `entries` and `cd_offset` from it; a broken one leaves the plain record's values (as a reader
// that falls back to them takes them).
std::optional<End> find_end(std::span<const char> bytes);

}  // namespace ckptsim::model::zip
