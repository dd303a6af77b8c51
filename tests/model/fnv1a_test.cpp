// model/fnv1a.h: FNV-1a (the trace hashes' function, pinned to published values) and word_hash
// (the fingerprints' function: every changed byte must change it).
//
// Which deliberately broken variant each test catches:
//   Fnv1aIsThePublishedFunction   a changed prime or offset (every trace hash moves)
//   WordHashSeesEveryByte         the top 4 bytes of every word left out
//                                 (`h ^ (w & 0xffffffff)`) [tried: caught]; the tail dropped
//                                 (`return h;`) [tried: caught]; a word read as 4 bytes
//                                 (`std::memcpy(&w, p + i, 4)`) [tried: caught]
//   WordHashContinues             a hash that ignores the `h` it is given (a fingerprint of
//                                 several buffers would see only the last) [tried: caught]
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/fnv1a.h"

using namespace ckptsim::model;

namespace {

TEST(Fnv1a, Fnv1aIsThePublishedFunction) {
  // The FNV-1a 64-bit test vectors of the reference implementation (Fowler, Noll, Vo).
  EXPECT_EQ(fnv1a(nullptr, 0), 0xcbf29ce484222325ULL);
  EXPECT_EQ(fnv1a("a", 1), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(fnv1a("foobar", 6), 0x85944171f73967e8ULL);
}

TEST(Fnv1a, WordHashSeesEveryByte) {
  for (size_t n = 0; n <= 41; ++n) {
    std::vector<unsigned char> bytes(n);
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<unsigned char>(i * 37 + 11);
    const uint64_t base = word_hash(bytes.data(), n);
    EXPECT_EQ(word_hash(bytes.data(), n), base) << "n " << n;
    for (size_t i = 0; i < n; ++i) {
      for (const unsigned char flip : {0x01, 0x80, 0xff}) {
        bytes[i] ^= flip;
        EXPECT_NE(word_hash(bytes.data(), n), base) << "n " << n << ", byte " << i;
        bytes[i] ^= flip;
      }
    }
  }
}

TEST(Fnv1a, WordHashContinues) {
  const std::string a = "the first buffer", b = "and the second";
  const uint64_t both = word_hash(b.data(), b.size(), word_hash(a.data(), a.size()));
  const std::string a2 = "the first buffeR";
  EXPECT_NE(word_hash(b.data(), b.size(), word_hash(a2.data(), a2.size())), both);
  EXPECT_NE(word_hash(b.data(), b.size(), 1), word_hash(b.data(), b.size(), 2));
}

}  // namespace
