#include "model/zip_layout.h"

namespace ckptsim::model::zip {

std::optional<uint64_t> read_le(std::span<const char> bytes, uint64_t off, size_t n) {
  if (n > 8 || off > bytes.size() || n > bytes.size() - off) return std::nullopt;
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[off + i]);
  return v;
}

std::optional<End> find_end(std::span<const char> bytes) {
  const size_t n = bytes.size();
  if (n < kEndRecordBytes) return std::nullopt;
  for (size_t at = n - kEndRecordBytes;; --at) {
    if (read_le(bytes, at, 4) == kEndRecordMagic) {
      End end{.at = at,
              .entries = *read_le(bytes, at + 10, 2),
              .cd_offset = *read_le(bytes, at + 16, 4),
              .plain_cd_offset = *read_le(bytes, at + 16, 4),
              .plain_cd_size = *read_le(bytes, at + 12, 4)};
      if (at >= 20 && read_le(bytes, at - 20, 4) == 0x07064b50u) {  // the zip64 locator
        const auto z = read_le(bytes, at - 12, 8);
        if (z && read_le(bytes, *z, 4) == 0x06064b50u && read_le(bytes, *z + 32, 8) &&
            read_le(bytes, *z + 48, 8)) {
          end.entries = *read_le(bytes, *z + 32, 8);
          end.cd_offset = *read_le(bytes, *z + 48, 8);
        }
      }
      return end;
    }
    if (at == 0 || n - at >= kEndRecordBytes + 0xffff) return std::nullopt;
  }
}

}  // namespace ckptsim::model::zip
