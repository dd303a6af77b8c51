// How deeply a JSON text nests, read before nlohmann parses it. nlohmann's parser itself is
// iterative, but copying a value, dump() and comparisons recurse once per level, so a file
// nested a million arrays deep would overflow the stack wherever a value is copied or quoted
// in an error. Every reader of a user's JSON file (scenarios, revision profiles, a Megatron
// checkpoint's metadata.json) refuses a text nested deeper than kJsonDepthMax first.
#pragma once

#include <cstddef>
#include <string_view>

namespace ckptsim::model {

// Arrays and objects inside each other; the deepest file we read nests 4 (a scenario's
// expect.properties), so this leaves room without letting recursion near the stack's end.
inline constexpr size_t kJsonDepthMax = 64;

// True when `text`, read as JSON (brackets inside strings do not count), opens more than
// `depth_max` arrays and objects inside each other. Any text is accepted: this says nothing
// about whether it is valid JSON.
bool json_nests_deeper_than(std::string_view text, size_t depth_max = kJsonDepthMax);

}  // namespace ckptsim::model
