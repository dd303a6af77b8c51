// PickleTree on hand-written pickles: each opcode sequence below is what CPython's pickle writes
// (protocol 2/4), spelled out byte by byte, and each damaged one must be a Status, not a crash.
#include "model/py/pickle_tree.h"

#include <gtest/gtest.h>

#include <string>

namespace ckptsim::model {
namespace {

Result<PickleTree> read(const std::string& bytes, std::set<std::string> globals = {}) {
  return read_pickle_tree(std::span<const char>(bytes.data(), bytes.size()),
                          PickleTreeOptions{std::move(globals)});
}

// pickle.dumps({'a': [1, -2, 300]}, protocol=2)
// (string pieces split where a hex escape would swallow the next letter)
const std::string kDictOfList(
    "\x80\x02}q\x00X\x01\x00\x00\x00"
    "aq\x01]q\x02(K\x01J\xfe\xff\xff\xffM,\x01"
    "es.",
    30);

TEST(PickleTree, ReadsADictOfAList) {
  Result<PickleTree> t = read(kDictOfList);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  const PickleNode& root = t.value().at(t.value().root);
  ASSERT_EQ(root.kind, PickleNode::Kind::kDict);
  ASSERT_EQ(root.items.size(), 2u);
  EXPECT_EQ(t.value().at(root.items[0]).text, "a");
  const PickleNode& list = t.value().at(root.items[1]);
  ASSERT_EQ(list.kind, PickleNode::Kind::kList);
  ASSERT_EQ(list.items.size(), 3u);
  EXPECT_EQ(t.value().at(list.items[0]).integer, 1);
  EXPECT_EQ(t.value().at(list.items[1]).integer, -2);
  EXPECT_EQ(t.value().at(list.items[2]).integer, 300);
}

TEST(PickleTree, EveryTruncationIsAnError) {
  for (size_t n = 0; n < kDictOfList.size(); ++n) {
    Result<PickleTree> t = read(kDictOfList.substr(0, n));
    EXPECT_FALSE(t.is_ok()) << "prefix of " << n << " bytes read as a whole pickle";
  }
}

TEST(PickleTree, AnUnknownOpcodeIsNamed) {
  std::string bytes = kDictOfList;
  bytes[bytes.size() - 2] = '\xff';  // SETITEM -> 0xff
  Result<PickleTree> t = read(bytes);
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("unsupported pickle opcode 0xff"), std::string::npos)
      << t.status().message();
}

TEST(PickleTree, OnlyAllowedGlobalsAndTheyStayNames) {
  // pickle.dumps(torch.bfloat16, protocol=2) is "\x80\x02ctorch\nbfloat16\nq\x00."
  const std::string bytes(
      "\x80\x02"
      "ctorch\nbfloat16\nq\x00.",
      21);
  Result<PickleTree> refused = read(bytes);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("unknown pickle class 'torch.bfloat16'"),
            std::string::npos);
  Result<PickleTree> allowed = read(bytes, {"torch.bfloat16"});
  ASSERT_TRUE(allowed.is_ok()) << allowed.status().to_string();
  EXPECT_EQ(allowed.value().at(allowed.value().root).kind, PickleNode::Kind::kGlobal);
  EXPECT_EQ(allowed.value().at(allowed.value().root).text, "torch.bfloat16");
}

TEST(PickleTree, AListInsideItselfIsAnError) {
  // EMPTY_LIST, DUP, APPEND: l = []; l.append(l)
  Result<PickleTree> t = read(std::string("\x80\x02]2a.", 6));
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("contains itself"), std::string::npos);
}

TEST(PickleTree, NestingPastTheLimitIsAnError) {
  const auto nested = [](size_t depth) {
    std::string s("\x80\x02", 2);
    s += std::string(depth + 1, ']');
    s += std::string(depth, 'a');
    return s + ".";
  };
  EXPECT_TRUE(read(nested(kPickleTreeDepthMax)).is_ok());
  Result<PickleTree> t = read(nested(kPickleTreeDepthMax + 1));
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("kPickleTreeDepthMax"), std::string::npos);
}

TEST(PickleTree, AMemoMissAndTrailingBytesAreErrors) {
  EXPECT_FALSE(read(std::string("\x80\x02h\x05.", 5)).is_ok());  // BINGET 5, never put
  EXPECT_FALSE(read(kDictOfList + "N").is_ok());
}

// Found by fuzz/pickle_tree_fuzzer: a class name is the file's bytes, and the error quoted it
// verbatim, so a newline in it split the message (invariant 3 wants one line).
// pickle.dumps-style STACK_GLOBAL of the module 'a\nb' and the name 'c'.
TEST(PickleTree, FuzzUnknownClassWithANewlineStaysOneLine) {
  const std::string bytes(
      "\x80\x04\x8c\x03"
      "a\nb\x8c\x01"
      "c\x93.");
  Result<PickleTree> t = read(bytes);
  ASSERT_FALSE(t.is_ok());
  const std::string& m = t.status().message();
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_NE(m.find("unknown pickle class 'a\\nb.c'"), std::string::npos) << m;
}

}  // namespace
}  // namespace ckptsim::model
