// dict_utils: merge / extract_matching_values / nested_values with upstream's semantics
// (spec §9.2). Expected values are written by hand from upstream's Python.
// Mutations these tests catch (tried, see commit message): merge comparing values before
// raising (EqualLeavesStillRaise); merge copying x2's subtree (MergeSharesSubtrees);
// truncate patch applied when x1 is shorter (TruncatePatchOnlyWhenX1Longer); list compaction
// keeping positions (ExtractCompactsLists).
#include <gtest/gtest.h>

#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>

#include "model/errors.h"
#include "model/megatron/dict_utils.h"
#include "model/megatron/mapping.h"

using namespace ckptsim::model;

namespace {

Value leaf_dict(const char* k, Value v) { return dict_value({{k, std::move(v)}}); }

}  // namespace

TEST(DictUtilsMerge, DisjointKeysInsertX2Subtrees) {
  Value x1 = dict_value({{"a", Value(1)}});
  Value x2 = dict_value({{"b", leaf_dict("c", Value(2))}});
  merge(x1, x2);
  ASSERT_EQ(x1.dict()->size(), 2u);
  EXPECT_EQ(x1.dict()->at("b").dict()->at("c").as_int(), 2);
}

TEST(DictUtilsMerge, MergeSharesSubtrees) {
  // Python: x1[k] = x2[k] — the same dict object, not a copy.
  Value sub = leaf_dict("c", Value(2));
  Value x1 = Value(Dict::make());
  merge(x1, dict_value({{"b", sub}}));
  sub.dict()->set("d", Value(3));
  EXPECT_TRUE(x1.dict()->at("b").is(sub));
  EXPECT_EQ(x1.dict()->at("b").dict()->at("d").as_int(), 3);
}

TEST(DictUtilsMerge, EqualLeavesStillRaise) {
  Value x1 = dict_value({{"optimizer", leaf_dict("step", Value(5))}});
  Value x2 = dict_value({{"optimizer", leaf_dict("step", Value(5))}});
  try {
    merge(x1, x2);
    FAIL() << "merge accepted a duplicate leaf";
  } catch (const MergeError& e) {
    EXPECT_EQ(e.kind(), MergeError::Kind::kDuplicateLeaf);
    EXPECT_EQ(repr(e.path()), "('optimizer', 'step')");
    EXPECT_EQ(e.py_type(), "ValueError");
    EXPECT_EQ(e.message(),
              "Duplicate non-dict and non-list values encountered: `5` and `5` (at level "
              "('optimizer', 'step'))");
  }
}

TEST(DictUtilsMerge, DuplicateTensorLeafNamesTheStepPath) {
  // Bug 1's shape: common has a raw step where the request has the LNO's local step.
  const Key dtype = Key::tuple({Key::symbol("torch.bfloat16"), Key::symbol("torch.float32")});
  auto entry = [&](Value step) {
    auto bucket = List::make({dict_value({{"step", std::move(step)}})});
    auto buckets = List::make({Value(bucket)});
    return dict_value(
        {{"optimizer", dict_value({{"param_state",
                                    dict_value({{0, dict_value({{dtype, Value(buckets)}})}})}})}});
  };
  Value common = entry(Value(at::scalar_tensor(5.0)));
  Value request = entry(Value(at::scalar_tensor(1.0)));
  try {
    merge(common, request);
    FAIL() << "expected a duplicate leaf";
  } catch (const MergeError& e) {
    EXPECT_EQ(repr(e.path()),
              "('optimizer', 'param_state', 0, (torch.bfloat16, torch.float32), 0, 0, 'step')");
    EXPECT_NE(e.message().find("`tensor(5.)` and `tensor(1.)`"), std::string::npos) << e.message();
  }
}

TEST(DictUtilsMerge, ListLengthMismatchRaises) {
  Value x1 = dict_value({{"l", list_value({Value(1), Value(2)})}});
  Value x2 = dict_value({{"l", list_value({Value(Dict::make())})}});
  try {
    merge(x1, x2);
    FAIL() << "merge accepted lists of different lengths";
  } catch (const MergeError& e) {
    EXPECT_EQ(e.kind(), MergeError::Kind::kListLengthMismatch);
    EXPECT_EQ(
        e.message(),
        "Cannot merge two lists with different lengths (2 and 1, encountered at level ('l',))");
  }
}

TEST(DictUtilsMerge, LeafAgainstContainerAndDictAgainstListRaise) {
  Value a = dict_value({{"k", Value(1)}});
  EXPECT_THROW(merge(a, dict_value({{"k", Value(Dict::make())}})), MergeError);
  Value b = dict_value({{"k", Value(Dict::make())}});
  EXPECT_THROW(merge(b, dict_value({{"k", Value(List::make())}})), MergeError);
}

TEST(DictUtilsMerge, ListsMergeByPosition) {
  Value x1 = dict_value({{"l", list_value({leaf_dict("a", Value(1)), leaf_dict("a", Value(2))})}});
  Value x2 = dict_value({{"l", list_value({leaf_dict("b", Value(3)), leaf_dict("b", Value(4))})}});
  merge(x1, x2);
  EXPECT_EQ(x1.dict()->at("l").list()->at(1).dict()->at("b").as_int(), 4);
  EXPECT_EQ(x1.dict()->at("l").list()->at(1).dict()->at("a").as_int(), 2);
}

TEST(DictUtilsMerge, TruncatePatchOnlyWhenX1Longer) {
  MergeOptions rx;
  rx.truncate_optimizer_param_state_lists = true;
  auto tree = [](std::vector<Value> items) {
    return dict_value({{"optimizer", dict_value({{"param_state", list_value(std::move(items))}})}});
  };
  // x1 longer on an optimizer/param_state path: truncated to x2's length.
  Value x1 = tree({leaf_dict("a", Value(1)), leaf_dict("a", Value(2)), leaf_dict("a", Value(3))});
  merge(x1, tree({leaf_dict("b", Value(1))}), rx);
  EXPECT_EQ(x1.dict()->at("optimizer").dict()->at("param_state").list()->size(), 1u);
  // x1 shorter: still raises.
  Value y1 = tree({leaf_dict("a", Value(1))});
  EXPECT_THROW(merge(y1, tree({leaf_dict("b", Value(1)), leaf_dict("b", Value(2))}), rx),
               MergeError);
  // Without the patch: raises.
  Value z1 = tree({leaf_dict("a", Value(1)), leaf_dict("a", Value(2))});
  EXPECT_THROW(merge(z1, tree({leaf_dict("b", Value(1))})), MergeError);
  // With the patch but not under 'optimizer' ... 'param_state': raises.
  Value w1 = dict_value({{"param_state", list_value({Value(Dict::make()), Value(Dict::make())})}});
  EXPECT_THROW(merge(w1, dict_value({{"param_state", list_value({Value(Dict::make())})}}), rx),
               MergeError);
}

TEST(DictUtilsExtract, ExtractCompactsLists) {
  auto is_int = [](const Value& v) { return v.is_int(); };
  // [1, 'a', 2] -> matching [1, 2] (positions 0 and 2 become 0 and 1).
  Value x = dict_value({{"l", list_value({Value(1), Value("a"), Value(2)})}});
  auto [m, n] = extract_matching_values(x, is_int);
  const auto& ml = *m.dict()->at("l").list();
  ASSERT_EQ(ml.size(), 2u);
  EXPECT_EQ(ml.at(1).as_int(), 2);
  EXPECT_EQ(n.dict()->at("l").list()->at(0).as_str(), "a");
  // As dicts: positions kept as int keys.
  auto [md, nd] = extract_matching_values(x, is_int, /*return_lists_as_dicts=*/true);
  EXPECT_TRUE(md.dict()->at("l").dict()->contains(2));
  EXPECT_FALSE(md.dict()->at("l").dict()->contains(1));
  EXPECT_TRUE(nd.dict()->at("l").dict()->contains(1));
}

TEST(DictUtilsExtract, NonEmptyContainersWithoutMatchesAreDroppedFromLists) {
  auto is_int = [](const Value& v) { return v.is_int(); };
  // [{'a': 'x'}, {'a': 1}] -> matching [{'a': 1}] (the first dict has no int: compacted away).
  Value x = dict_value({{"l", list_value({leaf_dict("a", Value("x")), leaf_dict("a", Value(1))})}});
  auto [m, n] = extract_matching_values(x, is_int);
  ASSERT_EQ(m.dict()->at("l").list()->size(), 1u);
  EXPECT_EQ(m.dict()->at("l").list()->at(0).dict()->at("a").as_int(), 1);
  ASSERT_EQ(n.dict()->at("l").list()->size(), 1u);
}

TEST(DictUtilsExtract, EmptyContainers) {
  auto never = [](const Value&) { return false; };
  auto always = [](const Value&) { return true; };
  // Dict parent: an empty container stays on the non-matching side, never on the matching one.
  Value x = dict_value({{"e", Value(Dict::make())}, {"k", Value(1)}});
  auto [m1, n1] = extract_matching_values(x, always);
  EXPECT_FALSE(m1.dict()->contains("e"));
  EXPECT_TRUE(n1.dict()->contains("e"));
  // List parent: an empty container goes to the side the predicate picks.
  Value y = dict_value({{"l", list_value({Value(List::make())})}});
  auto [m2, n2] = extract_matching_values(y, always);
  EXPECT_EQ(m2.dict()->at("l").list()->size(), 1u);
  auto [m3, n3] = extract_matching_values(y, never);
  EXPECT_EQ(n3.dict()->at("l").list()->size(), 1u);
  EXPECT_FALSE(m3.dict()->contains("l"));
}

TEST(DictUtilsExtract, TopLevelLeafIsAValueError) {
  try {
    extract_matching_values(Value(3), [](const Value&) { return true; });
    FAIL();
  } catch (const UpstreamError& e) {
    EXPECT_EQ(e.py_type(), "ValueError");
  }
}

TEST(DictUtilsExtract, NonpersistentUnwrapKeepsIdentity) {
  at::Tensor t = at::zeros({2});
  Value x = dict_value({{"step", make_nonpersistent(Value(t))}, {"v", Value(1)}});
  auto [lno, rest] = extract_nonpersistent(x);
  Value lnos = lno;
  dict_list_map_inplace([](const Value& v) { return v.nonpersistent()->unwrap(); }, lnos);
  EXPECT_TRUE(lnos.dict()->at("step").tensor().is_same(t));
  EXPECT_FALSE(rest.dict()->contains("step"));
}

TEST(DictUtilsNested, DepthFirstInInsertionOrder) {
  Value x = dict_value({{"b", list_value({Value(1), leaf_dict("z", Value(2))})}, {"a", Value(3)}});
  auto items = nested_items(x);
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(repr(items[0].first), "('b', 0)");
  EXPECT_EQ(repr(items[1].first), "('b', 1, 'z')");
  EXPECT_EQ(repr(items[2].first), "('a',)");
  EXPECT_EQ(nested_values(x).at(2).as_int(), 3);
}
