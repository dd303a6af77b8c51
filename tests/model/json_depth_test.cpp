// json_nests_deeper_than: counts the arrays and objects a JSON text opens inside each other,
// never the brackets inside strings (escaped quotes included). Mutations caught: brackets in
// strings counted (BracketsInStringsDoNotCount), an escaped quote ending a string
// (AnEscapedQuoteDoesNotEndAString), off by one at the limit (ExactlyAtTheLimitIsAccepted).
#include "model/json_depth.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/json_nesting.h"

namespace ckptsim::model {
namespace {

std::string nested(size_t depth) { return test::nested_arrays(depth); }

TEST(JsonDepth, ExactlyAtTheLimitIsAccepted) {
  EXPECT_FALSE(json_nests_deeper_than(nested(kJsonDepthMax)));
  EXPECT_TRUE(json_nests_deeper_than(nested(kJsonDepthMax + 1)));
  EXPECT_FALSE(json_nests_deeper_than(R"({"a": [1, {"b": []}]})", 4));
  EXPECT_TRUE(json_nests_deeper_than(R"({"a": [1, {"b": []}]})", 3));
}

TEST(JsonDepth, SiblingsDoNotAddUp) {
  std::string many;
  for (size_t i = 0; i < 10 * kJsonDepthMax; ++i) many += "[],";
  EXPECT_FALSE(json_nests_deeper_than("[" + many + "[]]"));
}

TEST(JsonDepth, BracketsInStringsDoNotCount) {
  EXPECT_FALSE(json_nests_deeper_than("[\"" + std::string(1000, '[') + "\"]", 1));
  EXPECT_FALSE(json_nests_deeper_than("{\"" + std::string(1000, '{') + "\": 1}", 1));
}

TEST(JsonDepth, AnEscapedQuoteDoesNotEndAString) {
  EXPECT_FALSE(json_nests_deeper_than(R"(["a\"[[[[", "\\"])", 1));
  EXPECT_TRUE(json_nests_deeper_than(R"(["\\", [[]]])", 2));
}

}  // namespace
}  // namespace ckptsim::model
