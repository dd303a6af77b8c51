// The float32 arrays of the replay plan and the trace (replay/PLAN_AND_TRACE.md): base64 (RFC
// 4648, with padding) of the little-endian IEEE-754 binary32 values, and their FNV-1a hash. The
// writers (report/trace_json) and the readers (properties/conformance) share this one codec.
//
// Invariants:
//   1. floats_of_base64(base64_f32(v)) == v, bit for bit (NaN payloads included).
//   2. The host is little-endian (checked: the format is defined on the bytes).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ckptsim::sim {

std::string base64_f32(std::span<const float> values);
// The inverse of base64_f32; nothing on text that is not base64 of whole float32 values.
std::optional<std::vector<float>> floats_of_base64(std::string_view text);
// FNV-1a 64 of the values' little-endian bytes, as 16 lowercase hex digits.
std::string hash_f32(std::span<const float> values);

}  // namespace ckptsim::sim
