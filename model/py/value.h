// Value: a Python object as it appears in a Megatron state dict, with Python's reference
// semantics. This is the substrate the whole model runs on.
//
// What a Value can hold (Python type in brackets):
//   None, bool, int, float, str, Symbol (a named object such as torch.bfloat16 or an
//   optimizer class), Tuple (an immutable sequence), at::Tensor [torch.Tensor],
//   Dict [dict], List [list], ShardedTensor, ShardedObject, LocalNonpersistentObject
//   (the last three are defined in model/mapping.h).
//
// Invariants (the reasons this file exists):
//   1. Copying a Value copies a *reference*, as Python assignment does: two Values made
//      from the same Dict, List or tensor see each other's mutations. Dict::copy() and
//      deepcopy() are the only ways to get a new container.
//   2. Tensor identity is TensorImpl identity: `a = b` shares the object, `a.copy_(b)`
//      writes into a's storage and leaves a's identity alone, and a view (narrow) is a new
//      object over the same storage. This is what makes "assign a handle" and "copy in
//      place" differ exactly as they do upstream (spec §6, §11.2 T12).
//   3. Dict keeps insertion order; overwriting an existing key keeps its position; pop then
//      set moves the key to the end (Python 3.7+ dict).
//   4. Nothing here iterates over an unordered container, so every traversal order is a
//      function of the operations performed, never of addresses.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "model/py/key.h"

namespace ckptsim::model {

class Dict;
class List;
struct ShardedTensor;
struct ShardedObject;
struct LocalNonpersistentObject;
class Value;

using DictPtr = std::shared_ptr<Dict>;
using ListPtr = std::shared_ptr<List>;
using ShardedTensorPtr = std::shared_ptr<ShardedTensor>;
using ShardedObjectPtr = std::shared_ptr<ShardedObject>;
using NonpersistentPtr = std::shared_ptr<LocalNonpersistentObject>;
using TuplePtr = std::shared_ptr<const std::vector<Value>>;

// A Python object that prints as a bare name and is compared by name: a torch dtype
// (`torch.bfloat16`) or a class (`<class 'torch.optim.adamw.AdamW'>`).
struct Symbol {
  std::string name;
};

class Value {
 public:
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kStr,
    kSymbol,
    kTuple,
    kTensor,
    kDict,
    kList,
    kShardedTensor,
    kShardedObject,
    kNonpersistent,
  };

  Value() = default;                             // None
  Value(bool b) : v_(b) {}                       // NOLINT
  Value(int i) : v_(static_cast<int64_t>(i)) {}  // NOLINT
  Value(int64_t i) : v_(i) {}                    // NOLINT
  Value(double d) : v_(d) {}                     // NOLINT
  Value(std::string s) : v_(std::move(s)) {}     // NOLINT
  Value(const char* s) : v_(std::string(s)) {}   // NOLINT
  Value(Symbol s) : v_(std::move(s)) {}          // NOLINT
  Value(at::Tensor t) : v_(std::move(t)) {}      // NOLINT
  Value(DictPtr d);                              // NOLINT; REQUIRES: d != nullptr
  Value(ListPtr l);                              // NOLINT; REQUIRES: l != nullptr
  Value(ShardedTensorPtr st);                    // NOLINT
  Value(ShardedObjectPtr so);                    // NOLINT
  Value(NonpersistentPtr lno);                   // NOLINT

  static Value symbol(std::string name) { return Value(Symbol{std::move(name)}); }
  static Value tuple(std::vector<Value> items);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_str() const { return kind() == Kind::kStr; }
  bool is_tensor() const { return kind() == Kind::kTensor; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_tuple() const { return kind() == Kind::kTuple; }
  bool is_container() const { return is_dict() || is_list(); }  // isinstance(v, (dict, list))
  bool is_sharded_tensor() const { return kind() == Kind::kShardedTensor; }
  bool is_sharded_object() const { return kind() == Kind::kShardedObject; }
  bool is_sharded_base() const { return is_sharded_tensor() || is_sharded_object(); }
  bool is_nonpersistent() const { return kind() == Kind::kNonpersistent; }

  // Accessors; each REQUIRES the matching kind and throws InvariantViolation otherwise.
  bool as_bool() const;
  int64_t as_int() const;   // also accepts bool, as Python does
  double as_float() const;  // also accepts int and bool
  const std::string& as_str() const;
  const Symbol& as_symbol() const;
  const std::vector<Value>& as_tuple() const;
  const at::Tensor& tensor() const;
  const DictPtr& dict() const;
  const ListPtr& list() const;
  const ShardedTensorPtr& sharded_tensor() const;
  const ShardedObjectPtr& sharded_object() const;
  const NonpersistentPtr& nonpersistent() const;

  // Python truthiness of a container (`not v`); REQUIRES is_container().
  bool container_empty() const;

  // Python's `a is b`. Scalars (None, bool, int, float, str, symbol) compare by value, since
  // no upstream behavior we model depends on their identity.
  bool is(const Value& other) const;

  // Python type name as printed in messages: 'dict', 'list', 'Tensor', 'int', ...
  std::string type_name() const;

  // Python-style repr, used in upstream error messages. Tensors print as torch does for
  // 0-dim and short 1-dim tensors (tensor(5.), tensor([1., 2.])), otherwise with shape.
  std::string repr() const;

 private:
  std::variant<std::monostate, bool, int64_t, double, std::string, Symbol, TuplePtr, at::Tensor,
               DictPtr, ListPtr, ShardedTensorPtr, ShardedObjectPtr, NonpersistentPtr>
      v_;
};

// dict: insertion-ordered, Python semantics (invariant 3). Lookups are linear: state-dict
// dicts are small, and the ones that are not (torch's packed optimizer state) are walked
// in order anyway.
class Dict {
 public:
  using Item = std::pair<Key, Value>;

  static DictPtr make() { return std::make_shared<Dict>(); }
  static DictPtr make(std::initializer_list<Item> items);

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  bool contains(const Key& k) const { return find(k) != nullptr; }
  Value* find(const Key& k);
  const Value* find(const Key& k) const;
  // d[k]: throws PyKeyError (site names the caller's upstream location) when missing.
  const Value& at(const Key& k, const char* site = "dict lookup") const;
  Value& at(const Key& k, const char* site = "dict lookup");
  // d.get(k, default)
  Value get(const Key& k, Value fallback = Value()) const;
  void set(const Key& k, Value v);  // d[k] = v
  void set(Key&& k, Value v);       // d[k] = v, the key moved in where it is new
  // d[k] = v for a key the dict does not hold, without the linear search set() makes: for
  // building a dict from another dict's items (whose keys are distinct). REQUIRES: k is not
  // in the dict; a key that is would be held twice.
  void set_new(const Key& k, Value v) { items_.emplace_back(k, std::move(v)); }
  void reserve(size_t n) { items_.reserve(n); }
  Value pop(const Key& k, const char* site = "dict.pop");  // throws PyKeyError when missing
  bool erase(const Key& k);  // del d[k] if present; returns whether it was
  void setdefault(const Key& k, Value v);

  DictPtr copy() const;  // dict.copy(): new dict, same values
  std::vector<Key> keys() const;

  std::vector<Item>::iterator begin() { return items_.begin(); }
  std::vector<Item>::iterator end() { return items_.end(); }
  std::vector<Item>::const_iterator begin() const { return items_.begin(); }
  std::vector<Item>::const_iterator end() const { return items_.end(); }

 private:
  std::vector<Item> items_;
};

// list: Python semantics; out-of-range access throws UpstreamError("IndexError").
class List {
 public:
  static ListPtr make() { return std::make_shared<List>(); }
  static ListPtr make(std::vector<Value> items);

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  Value& at(size_t i);
  const Value& at(size_t i) const;
  void append(Value v) { items_.push_back(std::move(v)); }
  void insert(size_t i, Value v);  // list.insert(i, v); REQUIRES i <= size()
  void truncate(size_t n);         // del l[n:]
  ListPtr copy() const;

  std::vector<Value>::iterator begin() { return items_.begin(); }
  std::vector<Value>::iterator end() { return items_.end(); }
  std::vector<Value>::const_iterator begin() const { return items_.begin(); }
  std::vector<Value>::const_iterator end() const { return items_.end(); }

 private:
  std::vector<Value> items_;
};

// copy.deepcopy: new containers, new tensors (cloned), aliasing inside the copied structure
// preserved (an object reached twice is copied once), as Python's memo does.
Value deepcopy(const Value& v);

// Python `==` for the values we compare upstream (per_bucket_numel, param groups): scalars,
// symbols, tuples, lists and dicts (order-insensitive for dicts, as Python). Tensors are
// equal only if they are the same object; comparing two distinct tensors with `==` is
// ambiguous in Python and throws UpstreamError("RuntimeError") here too.
bool py_equal(const Value& a, const Value& b);

// `list(set(values))` for Python ints: the distinct values in the order CPython's set table
// holds them (int hash, linear probes then perturbation, resize at 3/5 full; setobject.c).
// Upstream prints such lists in assertion messages (ChainedOptimizer._synchronize_steps:
// "steps: [2, 3]" for steps inserted as 3 then 2).
std::vector<int64_t> py_list_of_int_set(const std::vector<int64_t>& values);

// Builders for readable literals in code and tests.
inline Value dict_value(std::initializer_list<Dict::Item> items) {
  return Value(Dict::make(items));
}
inline Value list_value(std::vector<Value> items) { return Value(List::make(std::move(items))); }

}  // namespace ckptsim::model
