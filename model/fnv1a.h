// FNV-1a (64-bit) over bytes: the hash behind the trace hashes (sim/record.h) and the model's
// piece headers (model/megatron/serialization.cpp); and word_hash, its word-at-a-time cousin, for
// the fingerprints that check shared, immutable data was not written (model/process_group.h,
// model/megatron/ckptsim_format.h). Not for anything adversarial.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ckptsim::model {

inline constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ULL;

// Continues the hash `h` over n bytes at data (REQUIRES: data != nullptr when n > 0).
inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnv1aOffset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Continues `h` over n bytes at data, 8 bytes a step ((h ^ word) * prime, little-endian words),
// the last n % 8 bytes as fnv1a does. For in-memory change checks only: its values are never
// written to a file or a trace, so it may change. Each step is a bijection of h for a fixed word
// and of the word for a fixed h, so changing any one word (or any one byte of the tail) always
// changes the result. REQUIRES: data != nullptr when n > 0.
inline uint64_t word_hash(const void* data, size_t n, uint64_t h = kFnv1aOffset) {
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ULL;
  }
  return fnv1a(p + i, n - i, h);
}

}  // namespace ckptsim::model
