#include "sim/float_codec.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>

#include "model/errors.h"
#include "model/fnv1a.h"

namespace ckptsim::sim {

namespace {

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64(const unsigned char* data, size_t n) {
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t b0 = data[i];
    const uint32_t b1 = i + 1 < n ? data[i + 1] : 0;
    const uint32_t b2 = i + 2 < n ? data[i + 2] : 0;
    const uint32_t v = (b0 << 16) | (b1 << 8) | b2;
    out.push_back(kBase64[(v >> 18) & 63]);
    out.push_back(kBase64[(v >> 12) & 63]);
    out.push_back(i + 1 < n ? kBase64[(v >> 6) & 63] : '=');
    out.push_back(i + 2 < n ? kBase64[v & 63] : '=');
  }
  return out;
}

void check_little_endian() {
  static_assert(sizeof(float) == 4);
  const uint32_t probe = 1;
  unsigned char first = 0;
  std::memcpy(&first, &probe, 1);
  CKPTSIM_CHECK(first == 1, "the trace format assumes a little-endian host");
}

// The little-endian bytes of the values (the host is little-endian: checked).
std::vector<unsigned char> f32_le(std::span<const float> values) {
  check_little_endian();
  std::vector<unsigned char> out(values.size() * 4);
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());  // memcpy(null, ...) is UB
  return out;
}

}  // namespace

std::string base64_f32(std::span<const float> values) {
  const auto bytes = f32_le(values);
  return base64(bytes.data(), bytes.size());
}

std::optional<std::vector<float>> floats_of_base64(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::vector<unsigned char> bytes;
  bytes.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      const char* at = c == '=' ? nullptr : std::strchr(kBase64, c);
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        ++pad;
      } else if (at == nullptr || c == '\0' || pad > 0) {
        return std::nullopt;
      }
      v = (v << 6) | (at != nullptr ? static_cast<uint32_t>(at - kBase64) : 0);
    }
    for (int k = 0; k < 3 - pad; ++k)
      bytes.push_back(static_cast<unsigned char>(v >> (16 - 8 * k)));
  }
  if (bytes.size() % 4 != 0) return std::nullopt;
  check_little_endian();
  std::vector<float> out(bytes.size() / 4);
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::string hash_f32(std::span<const float> values) {
  const auto bytes = f32_le(values);
  return fmt::format("{:016x}", model::fnv1a(bytes.data(), bytes.size()));
}

}  // namespace ckptsim::sim
