// model/zip_layout.h on archives laid out by hand: where the end record is found, how far back
// it is looked for, and which central directory a zip64 locator gives. The readers that use it
// are tested on real files (PickleCodec.AnObjectCutShortIsAnErrorNotAReadPastItsBytes,
// TorchSave.ARecordSizeLargerThanTheArchiveIsAnErrorNotAnAllocation).
#include "model/zip_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace ckptsim::model::zip {
namespace {

void put_le(std::string& s, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// A plain end record: `entries` entries, a central directory of cd_size bytes at cd_offset, and
// a comment of comment_len bytes after it.
std::string end_record(uint64_t entries, uint64_t cd_size, uint64_t cd_offset, size_t comment_len) {
  std::string s;
  put_le(s, kEndRecordMagic, 4);
  put_le(s, 0, 4);  // disk numbers
  put_le(s, entries, 2);
  put_le(s, entries, 2);
  put_le(s, cd_size, 4);
  put_le(s, cd_offset, 4);
  put_le(s, comment_len, 2);
  return s + std::string(comment_len, 'c');
}

std::span<const char> span_of(const std::string& s) { return {s.data(), s.size()}; }

TEST(ZipLayout, ReadLeIsBoundedByTheBytes) {
  const std::string s = "\x01\x02\x03";
  EXPECT_EQ(read_le(span_of(s), 0, 3), std::optional<uint64_t>(0x030201));
  EXPECT_EQ(read_le(span_of(s), 1, 2), std::optional<uint64_t>(0x0302));
  EXPECT_EQ(read_le(span_of(s), 2, 2), std::nullopt);
  EXPECT_EQ(read_le(span_of(s), UINT64_MAX, 1), std::nullopt);
  EXPECT_EQ(read_le(span_of(s), 0, 9), std::nullopt);
}

TEST(ZipLayout, TheEndRecordIsFoundBehindACommentOfAtMost64KiB) {
  for (size_t comment : {size_t{0}, size_t{1}, size_t{0xffff}}) {
    const std::string s = std::string(100, 'x') + end_record(3, 40, 60, comment);
    const std::optional<End> end = find_end(span_of(s));
    ASSERT_TRUE(end.has_value()) << comment;
    EXPECT_EQ(end->at, 100u);
    EXPECT_EQ(end->entries, 3u);
    EXPECT_EQ(end->cd_offset, 60u);
    EXPECT_EQ(end->plain_cd_size, 40u);
    EXPECT_FALSE(end->defers_to_zip64());
  }
  // One byte more than a comment can hold: no end record where a zip reader looks.
  const std::string far = end_record(3, 40, 60, 0) + std::string(0x10000, 'c');
  EXPECT_EQ(find_end(span_of(far)), std::nullopt);
  EXPECT_EQ(find_end(span_of(end_record(0, 0, 0, 0).substr(0, 21))), std::nullopt);
}

TEST(ZipLayout, AZip64LocatorGivesTheCentralDirectoryWhereItPointsAtAZip64Record) {
  std::string s(8, 'x');  // the archive's entries
  const uint64_t zip64_at = s.size();
  put_le(s, 0x06064b50u, 4);   // the zip64 end record
  s += std::string(20, '\0');  // size, versions, disks
  put_le(s, 5, 8);             // entries on this disk (offset 24 from the record)
  put_le(s, 7, 8);             // entries in all (offset 32)
  put_le(s, 0, 8);             // central directory size (offset 40)
  put_le(s, 2, 8);             // central directory offset (offset 48)
  std::string locator;
  put_le(locator, 0x07064b50u, 4);
  put_le(locator, 0, 4);
  put_le(locator, zip64_at, 8);
  put_le(locator, 1, 4);
  const std::string whole = s + locator + end_record(0xffff, 0xffffffffu, 0xffffffffu, 0);
  const std::optional<End> end = find_end(span_of(whole));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->entries, 7u);
  EXPECT_EQ(end->cd_offset, 2u);
  EXPECT_TRUE(end->defers_to_zip64());
  // A locator that points at no zip64 record leaves the plain record's values.
  std::string broken = whole;
  broken[zip64_at] = 'X';
  const std::optional<End> plain = find_end(span_of(broken));
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->entries, 0xffffu);
  EXPECT_EQ(plain->cd_offset, 0xffffffffu);
}

}  // namespace
}  // namespace ckptsim::model::zip
