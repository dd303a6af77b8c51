// JSON texts nested deeper than any reader accepts, for the tests of the depth bound
// (model/json_depth.h).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ckptsim::test {

// before + `depth` '[' + `depth` ']' + after. Built by appending: GCC 13 at -O3 reports an
// impossible memcpy bound (-Warray-bounds, a false positive in std::string) for the same text
// written as a chain of operator+ on temporaries, which broke the GPU runner's build.
inline std::string nested_arrays(size_t depth, std::string_view before = "",
                                 std::string_view after = "") {
  std::string text(before);
  text.append(depth, '[');
  text.append(depth, ']');
  text.append(after);
  return text;
}

}  // namespace ckptsim::test
