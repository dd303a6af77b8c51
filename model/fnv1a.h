// FNV-1a (64-bit) over bytes: the one hash behind the trace hashes (sim/record.h), the model's
// piece headers (model/megatron/serialization.cpp) and the fingerprints that check shared,
// immutable data was not written (model/process_group.h, model/megatron/serialization.h). Not for
// anything adversarial.
#pragma once

#include <cstddef>
#include <cstdint>

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

}  // namespace ckptsim::model
