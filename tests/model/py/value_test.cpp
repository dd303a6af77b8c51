// The Value tree's Python semantics (model/tree.h invariants 1-3) and Key reprs.
// Mutations caught: Dict::copy deep-copying (DictCopyIsShallow), Dict::set moving an existing
// key to the end (OverwriteKeepsPosition), deepcopy not preserving aliasing
// (DeepcopyPreservesAliasing), Value::is comparing tensor values (TensorIdentity), Key's copy
// sharing a tuple's items, move-assignment keeping the target's kind, self-move-assignment
// clearing the key (KeyCopiesAndMovesKeepTheirValue).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>

#include "model/errors.h"
#include "model/megatron/mapping.h"
#include "model/py/value.h"

using namespace ckptsim::model;

TEST(Tree, ValuesShareContainersByReference) {
  auto d = Dict::make();
  Value a(d);
  Value b = a;  // Python: b = a
  b.dict()->set("k", Value(1));
  EXPECT_EQ(a.dict()->at("k").as_int(), 1);
  EXPECT_TRUE(a.is(b));
}

TEST(Tree, DictCopyIsShallow) {
  auto inner = Dict::make();
  auto d = Dict::make({{"inner", Value(inner)}});
  DictPtr c = d->copy();
  c->set("x", Value(2));
  EXPECT_FALSE(d->contains("x"));
  EXPECT_TRUE(c->at("inner").is(d->at("inner")));
}

TEST(Tree, OverwriteKeepsPositionPopMovesToEnd) {
  auto d = Dict::make({{"a", Value(1)}, {"b", Value(2)}, {"c", Value(3)}});
  d->set("a", Value(10));
  EXPECT_EQ(d->keys().front(), Key("a"));
  // tensors["param"] = tensors.pop("master_param") puts 'param' last.
  d->set("param", d->pop("b"));
  const auto keys = d->keys();
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(keys[2], Key("param"));
  EXPECT_EQ(keys[1], Key("c"));
  EXPECT_THROW(d->pop("missing"), PyKeyError);
}

TEST(Tree, TensorIdentityAssignVersusCopy) {
  at::Tensor live = at::zeros({3});
  at::Tensor loaded = at::ones({3});
  Value slot(live);
  // Copy in place: same object, new values.
  at::Tensor s = slot.tensor();
  s.copy_(loaded);
  EXPECT_TRUE(slot.tensor().is_same(live));
  EXPECT_EQ(live.sum().item<float>(), 3.0F);
  // Assignment: the slot now holds the other object.
  slot = Value(loaded);
  EXPECT_FALSE(slot.is(Value(live)));
  EXPECT_TRUE(slot.is(Value(loaded)));
  // A view is a different object over the same storage.
  Value view(live.narrow(0, 0, 2));
  EXPECT_FALSE(view.is(Value(live)));
}

TEST(Tree, DeepcopyPreservesAliasingAndClonesTensors) {
  at::Tensor t = at::zeros({2});
  auto shared = Dict::make({{"t", Value(t)}});
  Value root = dict_value({{"a", Value(shared)}, {"b", Value(shared)}});
  Value c = deepcopy(root);
  EXPECT_TRUE(c.dict()->at("a").is(c.dict()->at("b")));
  EXPECT_FALSE(c.dict()->at("a").is(root.dict()->at("a")));
  EXPECT_FALSE(c.dict()->at("a").dict()->at("t").tensor().is_same(t));
}

TEST(Tree, KeyReprsArePython) {
  EXPECT_EQ(Key("step").repr(), "'step'");
  EXPECT_EQ(Key(3).repr(), "3");
  EXPECT_EQ(Key::tuple({Key::symbol("torch.bfloat16"), Key::symbol("torch.float32")}).repr(),
            "(torch.bfloat16, torch.float32)");
  EXPECT_EQ(Key::tuple({Key("a")}).repr(), "('a',)");
  EXPECT_FALSE(Key(1) == Key("1"));
  EXPECT_EQ(Value(5.0).repr(), "5.0");
  EXPECT_EQ(Value(at::scalar_tensor(5.0)).repr(), "tensor(5.)");
  EXPECT_EQ(Value::tuple({Value(0.9), Value(0.95)}).repr(), "(0.9, 0.95)");
}

// Key keeps an int and a tuple's owned items in one word and copies and moves by hand: every
// kind must survive copy and move construction and assignment into a key of any other kind.
TEST(Tree, KeyCopiesAndMovesKeepTheirValue) {
  const Key dtype_pair =
      Key::tuple({Key::symbol("torch.bfloat16"), Key::tuple({Key(2), Key("x")})});
  const std::vector<Key> kinds = {Key(7), Key("exp_avg"), Key::symbol("torch.float32"), dtype_pair,
                                  Key(std::string(40, 's'))};  // a str too long for SSO
  for (const Key& a : kinds) {
    Key copy(a);
    EXPECT_EQ(copy, a);
    EXPECT_EQ(copy.repr(), a.repr());
    Key moved(std::move(copy));
    EXPECT_EQ(moved, a);
    for (const Key& b : kinds) {
      Key target(b);
      target = a;  // copy-assign over every kind
      EXPECT_EQ(target, a) << b.repr() << " = " << a.repr();
      EXPECT_EQ(target.kind(), a.kind());
      Key source(a);
      Key other(b);
      other = std::move(source);  // move-assign over every kind
      EXPECT_EQ(other, a) << b.repr() << " = move " << a.repr();
      other = b;  // and back, out of a key that was moved into
      EXPECT_EQ(other, b);
    }
    Key self(a);
    const Key& alias = self;
    self = alias;  // self-assignment keeps the value
    EXPECT_EQ(self, a);
    Key& same = self;
    self = std::move(same);  // and so does self-move-assignment
    EXPECT_EQ(self, a);
  }
  // A copied tuple is a new tuple of equal items: the copy outlives the original. The decoy's
  // items take the memory the original's gave back (the allocators reuse a freed block of the
  // same size first), so a copy that shared them would print the decoy.
  auto original = std::make_unique<Key>(dtype_pair);
  const Key survivor(*original);
  original.reset();
  const Key decoy = Key::tuple({Key(99), Key(98)});
  EXPECT_EQ(decoy.repr(), "(99, 98)");
  EXPECT_EQ(survivor.repr(), "(torch.bfloat16, (2, 'x'))");
  EXPECT_EQ(survivor.items().at(1).items().at(1).as_str(), "x");
  EXPECT_TRUE(Key::tuple({Key(1)}) < Key::tuple({Key(2)}));
  EXPECT_FALSE(Key::tuple({Key(1)}) == Key::tuple({Key("1")}));
}

TEST(Tree, PyEqualFollowsPython) {
  EXPECT_TRUE(py_equal(Value(1), Value(1.0)));
  EXPECT_TRUE(py_equal(Value(true), Value(1)));
  EXPECT_FALSE(py_equal(Value("1"), Value(1)));
  EXPECT_TRUE(py_equal(dict_value({{"a", Value(1)}, {"b", Value(2)}}),
                       dict_value({{"b", Value(2)}, {"a", Value(1)}})));
  EXPECT_FALSE(py_equal(list_value({Value(1)}), list_value({Value(1), Value(2)})));
  EXPECT_THROW(py_equal(Value(at::zeros({2})), Value(at::zeros({2}))), UpstreamError);
}

TEST(Mapping, ShardedTensorValidatesLikePostInit) {
  ShardedTensor ok;
  ok.key = "k";
  ok.data = at::zeros({4});
  ok.local_shape = {4};
  ok.global_shape = {10};
  ok.global_offset = {6};
  EXPECT_NO_THROW(ShardedTensor::make(ok));
  ShardedTensor bad_shape = ok;
  bad_shape.local_shape = {5};
  EXPECT_THROW(ShardedTensor::make(bad_shape), CheckpointingException);
  ShardedTensor flattened = ok;
  flattened.flattened_range = std::make_pair(int64_t{0}, int64_t{2});
  EXPECT_THROW(ShardedTensor::make(flattened), CheckpointingException);
  ShardedTensor regular = ok;
  regular.axis_fragmentations = Shape{3};
  EXPECT_THROW(ShardedTensor::make(regular), CheckpointingException);  // 6 % 4 != 0
  ShardedObject so;
  so.key = "optimizer.distributed.dp_group_idx_0.optimizer";
  so.global_shape = {1};
  so.global_offset = {0};
  EXPECT_EQ(so.unique_key(), "optimizer.distributed.dp_group_idx_0.optimizer/shard_0_1");
  EXPECT_TRUE(is_main_replica({0, 0, 0}));
  EXPECT_FALSE(is_main_replica({0, 0, 1}));
}

// list(set(ints)) in CPython's table order. The expected lists are what CPython 3.11 printed
// for `list(set(xs))` (python3 -c), and [2250, 1300] is the order in Megatron-LM #2016's
// "steps: [2250, 1300]". Mutations caught: first-seen order ([3, 2]); no linear probes
// (the multiples of 8); no resize at 3/5 full (the 30 down to 1); hash without the modulus
// 2**61 - 1 or without -1 → -2 (the large and negative ones).
TEST(Tree, ListOfIntSetFollowsCPythonsTableOrder) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(py_list_of_int_set({3, 2}), (V{2, 3}));
  EXPECT_EQ(py_list_of_int_set({2250, 1300}), (V{2250, 1300}));
  EXPECT_EQ(py_list_of_int_set({10, 3, 10}), (V{10, 3}));
  EXPECT_EQ(py_list_of_int_set({8, 0, 16, 24, 32, 40}), (V{0, 32, 8, 40, 16, 24}));
  EXPECT_EQ(py_list_of_int_set({-1, -2, 7, -9}), (V{-9, 7, -1, -2}));
  constexpr int64_t kBig = int64_t{1} << 61;
  EXPECT_EQ(py_list_of_int_set({100, 37, 5, 64, 1000, 3, 21, 8, 13, kBig + 5, kBig - 1}),
            (V{64, kBig - 1, 3, 100, 5, 37, kBig + 5, 1000, 8, 13, 21}));
  EXPECT_EQ(py_list_of_int_set({6, kBig + 5}), (V{6, kBig + 5}));
  EXPECT_EQ(py_list_of_int_set({7, kBig + 6, -(kBig + 6)}), (V{-(kBig + 6), kBig + 6, 7}));
  V down;
  V up;
  for (int64_t i = 30; i > 0; --i) down.push_back(i);
  for (int64_t i = 1; i <= 30; ++i) up.push_back(i);
  EXPECT_EQ(py_list_of_int_set(down), up);
}
