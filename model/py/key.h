// Key: a dict key of a Python state dict, and KeyPath: the path of keys from a root.
//
// Upstream state dicts use four kinds of keys, and ckptsim needs all of them:
//   - str          'optimizer', 'param_state', 'step'
//   - int          gbuf_idx, bucket_idx inside lists-as-dicts, param indexes
//   - symbol       a Python object that is not a string but prints as a bare name, e.g. a
//                  torch dtype (torch.bfloat16); it never compares equal to a str
//   - tuple        (torch.bfloat16, torch.float32), the dtype key of gbuf_ranges
//
// Invariants:
//   1. repr() is Python's repr of the same key: 'step', 3, torch.bfloat16,
//      (torch.bfloat16, torch.float32); a 1-tuple prints as (x,).
//   2. Keys of different kinds never compare equal (Python: 1 != '1').
//   3. operator< is a total order (kind first), used only where upstream sorts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ckptsim::model {

class Key {
 public:
  enum class Kind { kInt, kStr, kSymbol, kTuple };

  Key(int64_t i) : kind_(Kind::kInt), int_(i) {}                 // NOLINT: implicit like Python
  Key(int i) : kind_(Kind::kInt), int_(i) {}                     // NOLINT
  Key(std::string s) : kind_(Kind::kStr), str_(std::move(s)) {}  // NOLINT
  Key(const char* s) : kind_(Kind::kStr), str_(s) {}             // NOLINT

  static Key symbol(std::string name);
  static Key tuple(std::vector<Key> items);

  Kind kind() const { return kind_; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_str() const { return kind_ == Kind::kStr; }
  bool is_tuple() const { return kind_ == Kind::kTuple; }
  int64_t as_int() const;                 // REQUIRES: is_int()
  const std::string& as_str() const;      // REQUIRES: is_str() or kind() == kSymbol
  const std::vector<Key>& items() const;  // REQUIRES: is_tuple()

  // Python repr (invariant 1). str() differs from repr() only for str keys (no quotes).
  std::string repr() const;
  std::string str() const;

  // Inline: dict lookups compare keys linearly, and most keys are ints or short strs.
  friend bool operator==(const Key& a, const Key& b) {
    if (a.kind_ != b.kind_) return false;
    if (a.kind_ == Kind::kInt) return a.int_ == b.int_;
    if (a.kind_ == Kind::kTuple) return *a.items_ == *b.items_;
    return a.str_ == b.str_;  // kStr, kSymbol
  }
  friend bool operator<(const Key& a, const Key& b);

  // A tuple's items are owned (copied with the key); everything else is held in place.
  Key(const Key& o) : kind_(o.kind_), int_(o.int_), str_(o.str_) {
    if (kind_ == Kind::kTuple) items_ = new std::vector<Key>(*o.items_);
  }
  Key(Key&& o) noexcept : kind_(o.kind_), int_(o.int_), str_(std::move(o.str_)) {
    o.kind_ = Kind::kInt;  // a moved-from tuple no longer owns its items
    o.int_ = 0;
  }
  Key& operator=(const Key& o) {
    if (this != &o) *this = Key(o);
    return *this;
  }
  Key& operator=(Key&& o) noexcept {
    if (this != &o) {
      release();
      kind_ = o.kind_;
      int_ = o.int_;
      str_ = std::move(o.str_);
      o.kind_ = Kind::kInt;
      o.int_ = 0;
    }
    return *this;
  }
  ~Key() { release(); }

 private:
  Key() = default;
  void release() {
    if (kind_ == Kind::kTuple) delete items_;
  }
  // 48 bytes: an int and a tuple's items share a word. Side by side with a vector it took 72,
  // and a dict item holds a Key, a path a vector of them.
  Kind kind_ = Kind::kInt;
  union {
    int64_t int_ = 0;                // kInt
    const std::vector<Key>* items_;  // kTuple: owned
  };
  std::string str_;  // kStr, kSymbol
};

using KeyPath = std::vector<Key>;

// Python repr of the path as a tuple: ('optimizer', 'param_state', 0, 'step').
std::string repr(const KeyPath& path);

// Python repr of a str: single quotes unless the text holds a single quote and no double;
// backslashes, the quote and control characters escaped (\n, \r, \t, \xNN), so that a name
// read from a file prints on one line.
std::string py_str_repr(const std::string& s);

// `s` with every ASCII control character (below 0x20, and 0x7f) written as Python writes it in
// a repr (\n, \r, \t, \xNN) and everything else as it is: for text from a file or another
// library quoted in a one-line message.
std::string escape_control_characters(std::string_view s);

}  // namespace ckptsim::model
