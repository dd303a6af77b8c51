#include "model/py/value.h"

#include <ATen/ops/clone.h>
#include <fmt/format.h>

#include <cmath>
#include <unordered_map>

#include "model/errors.h"
#include "model/megatron/mapping.h"

namespace ckptsim::model {

namespace {

template <typename T>
const T& get_or_throw(const auto& v, const char* what, const Value& self) {
  const T* p = std::get_if<T>(&v);
  CKPTSIM_CHECK(p != nullptr, std::string("Value is not ") + what + " but " + self.type_name());
  return *p;
}

// torch prints a float as "5." when integral and with 4 decimals otherwise.
std::string torch_float_text(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == std::floor(x) && std::fabs(x) < 1e8) return fmt::format("{:.0f}.", x);
  const double ax = std::fabs(x);
  if (ax >= 1e8 || ax < 1e-4) return fmt::format("{:.4e}", x);
  return fmt::format("{:.4f}", x);
}

std::string tensor_repr(const at::Tensor& t) {
  if (!t.defined()) return "None";
  std::string dtype_suffix;
  if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kLong) {
    dtype_suffix = ", dtype=" + torch_dtype_name(t.scalar_type());
  }
  auto elem = [&](int64_t i) -> std::string {
    const at::Tensor flat = t.reshape({-1});
    if (t.is_floating_point()) return torch_float_text(flat[i].item<double>());
    return std::to_string(flat[i].item<int64_t>());
  };
  if (t.dim() == 0) return "tensor(" + elem(0) + dtype_suffix + ")";
  if (t.dim() == 1) {
    const int64_t n = t.numel();
    std::string body;
    if (n <= 6) {
      for (int64_t i = 0; i < n; ++i) {
        if (i) body += ", ";
        body += elem(i);
      }
    } else {
      body = elem(0) + ", " + elem(1) + ", " + elem(2) + ",  ..., " + elem(n - 3) + ", " +
             elem(n - 2) + ", " + elem(n - 1);
    }
    return "tensor([" + body + "]" + dtype_suffix + ")";
  }
  std::string shape;
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (i) shape += ", ";
    shape += std::to_string(t.size(i));
  }
  return "tensor(<shape [" + shape + "]>" + dtype_suffix + ")";
}

}  // namespace

Value::Value(DictPtr d) : v_(std::move(d)) {
  CKPTSIM_CHECK(std::get<DictPtr>(v_) != nullptr, "Value from a null DictPtr");
}
Value::Value(ListPtr l) : v_(std::move(l)) {
  CKPTSIM_CHECK(std::get<ListPtr>(v_) != nullptr, "Value from a null ListPtr");
}
Value::Value(ShardedTensorPtr st) : v_(std::move(st)) {
  CKPTSIM_CHECK(std::get<ShardedTensorPtr>(v_) != nullptr, "Value from a null ShardedTensor");
}
Value::Value(ShardedObjectPtr so) : v_(std::move(so)) {
  CKPTSIM_CHECK(std::get<ShardedObjectPtr>(v_) != nullptr, "Value from a null ShardedObject");
}
Value::Value(NonpersistentPtr lno) : v_(std::move(lno)) {
  CKPTSIM_CHECK(std::get<NonpersistentPtr>(v_) != nullptr, "Value from a null LNO");
}

Value Value::tuple(std::vector<Value> items) {
  Value v;
  v.v_ = std::make_shared<const std::vector<Value>>(std::move(items));
  return v;
}

bool Value::as_bool() const { return get_or_throw<bool>(v_, "a bool", *this); }
int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  return get_or_throw<int64_t>(v_, "an int", *this);
}
double Value::as_float() const {
  if (is_int() || is_bool()) return static_cast<double>(as_int());
  return get_or_throw<double>(v_, "a float", *this);
}
const std::string& Value::as_str() const { return get_or_throw<std::string>(v_, "a str", *this); }
const Symbol& Value::as_symbol() const { return get_or_throw<Symbol>(v_, "a symbol", *this); }
const std::vector<Value>& Value::as_tuple() const {
  return *get_or_throw<TuplePtr>(v_, "a tuple", *this);
}
const at::Tensor& Value::tensor() const { return get_or_throw<at::Tensor>(v_, "a tensor", *this); }
const DictPtr& Value::dict() const { return get_or_throw<DictPtr>(v_, "a dict", *this); }
const ListPtr& Value::list() const { return get_or_throw<ListPtr>(v_, "a list", *this); }
const ShardedTensorPtr& Value::sharded_tensor() const {
  return get_or_throw<ShardedTensorPtr>(v_, "a ShardedTensor", *this);
}
const ShardedObjectPtr& Value::sharded_object() const {
  return get_or_throw<ShardedObjectPtr>(v_, "a ShardedObject", *this);
}
const NonpersistentPtr& Value::nonpersistent() const {
  return get_or_throw<NonpersistentPtr>(v_, "a LocalNonpersistentObject", *this);
}

bool Value::container_empty() const {
  if (is_dict()) return dict()->empty();
  if (is_list()) return list()->empty();
  CKPTSIM_CHECK(false, "container_empty on a " + type_name());
  return false;
}

bool Value::is(const Value& other) const {
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return as_bool() == other.as_bool();
    case Kind::kInt:
      return as_int() == other.as_int();
    case Kind::kFloat:
      return as_float() == other.as_float();
    case Kind::kStr:
      return as_str() == other.as_str();
    case Kind::kSymbol:
      return as_symbol().name == other.as_symbol().name;
    case Kind::kTuple:
      return std::get<TuplePtr>(v_) == std::get<TuplePtr>(other.v_);
    case Kind::kTensor:
      return tensor().unsafeGetTensorImpl() == other.tensor().unsafeGetTensorImpl();
    case Kind::kDict:
      return dict() == other.dict();
    case Kind::kList:
      return list() == other.list();
    case Kind::kShardedTensor:
      return sharded_tensor() == other.sharded_tensor();
    case Kind::kShardedObject:
      return sharded_object() == other.sharded_object();
    case Kind::kNonpersistent:
      return nonpersistent() == other.nonpersistent();
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kStr:
      return "str";
    case Kind::kSymbol:
      return "type";
    case Kind::kTuple:
      return "tuple";
    case Kind::kTensor:
      return "Tensor";
    case Kind::kDict:
      return "dict";
    case Kind::kList:
      return "list";
    case Kind::kShardedTensor:
      return "ShardedTensor";
    case Kind::kShardedObject:
      return "ShardedObject";
    case Kind::kNonpersistent:
      return "LocalNonpersistentObject";
  }
  return "?";
}

std::string Value::repr() const {
  switch (kind()) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return as_bool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(as_int());
    case Kind::kFloat: {
      // Python repr of a float: shortest round-trip text, with ".0" when integral.
      std::string s = fmt::format("{}", as_float());
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      return s;
    }
    case Kind::kStr:
      return py_str_repr(as_str());
    case Kind::kSymbol:
      return as_symbol().name;
    case Kind::kTuple: {
      const auto& items = as_tuple();
      std::string out = "(";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        out += items[i].repr();
      }
      return out + (items.size() == 1 ? ",)" : ")");
    }
    case Kind::kTensor:
      return tensor_repr(tensor());
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : *dict()) {
        {
          if (!first) out += ", ";
          out += k.repr() + ": " + v.repr();
        }
        first = false;
      }
      return out + "}";
    }
    case Kind::kList: {
      std::string out = "[";
      bool first = true;
      for (const auto& v : *list()) {
        {
          if (!first) out += ", ";
          out += v.repr();
        }
        first = false;
      }
      return out + "]";
    }
    case Kind::kShardedTensor:
      return sharded_tensor()->repr();
    case Kind::kShardedObject:
      return sharded_object()->repr();
    case Kind::kNonpersistent:
      return "LocalNonpersistentObject(obj=" + nonpersistent()->obj.repr() + ")";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------

DictPtr Dict::make(std::initializer_list<Item> items) {
  auto d = make();
  for (const auto& [k, v] : items) d->set(k, v);
  return d;
}

Value* Dict::find(const Key& k) {
  for (auto& item : items_) {
    if (item.first == k) return &item.second;
  }
  return nullptr;
}

const Value* Dict::find(const Key& k) const {
  for (const auto& item : items_) {
    if (item.first == k) return &item.second;
  }
  return nullptr;
}

const Value& Dict::at(const Key& k, const char* site) const {
  const Value* v = find(k);
  if (v == nullptr) throw PyKeyError(k.repr(), site);
  return *v;
}

Value& Dict::at(const Key& k, const char* site) {
  Value* v = find(k);
  if (v == nullptr) throw PyKeyError(k.repr(), site);
  return *v;
}

Value Dict::get(const Key& k, Value fallback) const {
  const Value* v = find(k);
  return v != nullptr ? *v : fallback;
}

void Dict::set(const Key& k, Value v) {
  if (Value* existing = find(k)) {
    *existing = std::move(v);
    return;
  }
  items_.emplace_back(k, std::move(v));
}

void Dict::set(Key&& k, Value v) {
  if (Value* existing = find(k)) {
    *existing = std::move(v);
    return;
  }
  items_.emplace_back(std::move(k), std::move(v));
}

Value Dict::pop(const Key& k, const char* site) {
  for (auto it = items_.begin(); it != items_.end(); ++it) {
    if (it->first == k) {
      Value v = std::move(it->second);
      items_.erase(it);
      return v;
    }
  }
  throw PyKeyError(k.repr(), site);
}

bool Dict::erase(const Key& k) {
  for (auto it = items_.begin(); it != items_.end(); ++it) {
    if (it->first == k) {
      items_.erase(it);
      return true;
    }
  }
  return false;
}

void Dict::setdefault(const Key& k, Value v) {
  if (!contains(k)) items_.emplace_back(k, std::move(v));
}

DictPtr Dict::copy() const {
  auto d = make();
  d->items_ = items_;
  return d;
}

std::vector<Key> Dict::keys() const {
  std::vector<Key> out;
  out.reserve(items_.size());
  for (const auto& item : items_) out.push_back(item.first);
  return out;
}

ListPtr List::make(std::vector<Value> items) {
  auto l = make();
  l->items_ = std::move(items);
  return l;
}

Value& List::at(size_t i) {
  if (i >= items_.size()) throw UpstreamError("IndexError", "list index out of range", "list[]");
  return items_[i];
}

const Value& List::at(size_t i) const {
  if (i >= items_.size()) throw UpstreamError("IndexError", "list index out of range", "list[]");
  return items_[i];
}

void List::insert(size_t i, Value v) {
  CKPTSIM_CHECK(i <= items_.size(), "List::insert past the end");
  items_.insert(items_.begin() + static_cast<std::ptrdiff_t>(i), std::move(v));
}

void List::truncate(size_t n) {
  if (n < items_.size()) items_.resize(n);
}

ListPtr List::copy() const { return make(items_); }

// ---------------------------------------------------------------------------------------------

namespace {

struct DeepCopier {
  // Lookup only (never iterated), so the address-keyed map cannot affect any order.
  std::unordered_map<const void*, Value> memo;  // lookup only

  Value copy(const Value& v) {
    switch (v.kind()) {
      case Value::Kind::kTensor: {
        const void* id = v.tensor().unsafeGetTensorImpl();
        if (auto it = memo.find(id); it != memo.end()) return it->second;
        Value out(v.tensor().defined() ? v.tensor().clone() : at::Tensor());
        memo.emplace(id, out);
        return out;
      }
      case Value::Kind::kDict: {
        const void* id = v.dict().get();
        if (auto it = memo.find(id); it != memo.end()) return it->second;
        auto d = Dict::make();
        Value out(d);
        memo.emplace(id, out);
        d->reserve(v.dict()->size());
        for (const auto& [k, item] : *v.dict()) d->set_new(k, copy(item));  // distinct keys
        return out;
      }
      case Value::Kind::kList: {
        const void* id = v.list().get();
        if (auto it = memo.find(id); it != memo.end()) return it->second;
        auto l = List::make();
        Value out(l);
        memo.emplace(id, out);
        for (const auto& item : *v.list()) l->append(copy(item));
        return out;
      }
      case Value::Kind::kTuple: {
        std::vector<Value> items;
        for (const auto& item : v.as_tuple()) items.push_back(copy(item));
        return Value::tuple(std::move(items));
      }
      case Value::Kind::kShardedTensor: {
        ShardedTensor st = *v.sharded_tensor();
        if (st.data.defined()) st.data = copy(Value(st.data)).tensor();
        return Value(std::make_shared<ShardedTensor>(std::move(st)));
      }
      case Value::Kind::kShardedObject: {
        ShardedObject so = *v.sharded_object();
        so.data = copy(so.data);
        return Value(std::make_shared<ShardedObject>(std::move(so)));
      }
      case Value::Kind::kNonpersistent:
        return Value(LocalNonpersistentObject::make(copy(v.nonpersistent()->obj)));
      default:
        return v;  // immutable scalars
    }
  }
};

}  // namespace

Value deepcopy(const Value& v) {
  DeepCopier copier;
  return copier.copy(v);
}

namespace {

// CPython's hash of an int: the value modulo the Mersenne prime 2**61 - 1, sign kept, -1 → -2.
int64_t py_int_hash(int64_t v) {
  constexpr uint64_t kModulus = (uint64_t{1} << 61) - 1;
  const uint64_t magnitude = v < 0 ? uint64_t{0} - static_cast<uint64_t>(v) : uint64_t(v);
  const auto h = static_cast<int64_t>(magnitude % kModulus);
  const int64_t signed_h = v < 0 ? -h : h;
  return signed_h == -1 ? -2 : signed_h;
}

// One slot of a set table: empty, or a value with its hash.
struct SetSlot {
  bool used = false;
  int64_t value = 0;
  int64_t hash = 0;
};

// The slot CPython's probe sequence reaches first that is empty, or holds `value` (if `value`
// is given): LINEAR_PROBES = 9 neighbours while they fit, then i = i*5 + 1 + perturb.
size_t set_probe(const std::vector<SetSlot>& table, int64_t hash, const int64_t* value) {
  constexpr size_t kLinearProbes = 9;
  constexpr unsigned kPerturbShift = 5;
  const size_t mask = table.size() - 1;
  auto perturb = static_cast<uint64_t>(hash);
  size_t i = static_cast<size_t>(hash) & mask;
  while (true) {
    const size_t probes = i + kLinearProbes <= mask ? kLinearProbes : 0;
    for (size_t j = 0; j <= probes; ++j) {
      const SetSlot& s = table[i + j];
      if (!s.used || (value != nullptr && s.hash == hash && s.value == *value)) return i + j;
    }
    perturb >>= kPerturbShift;
    i = (i * 5 + 1 + perturb) & mask;
  }
}

}  // namespace

std::vector<int64_t> py_list_of_int_set(const std::vector<int64_t>& values) {
  constexpr size_t kMinSize = 8;  // PySet_MINSIZE
  std::vector<SetSlot> table(kMinSize);
  size_t used = 0;
  for (int64_t v : values) {
    const int64_t hash = py_int_hash(v);
    SetSlot& slot = table[set_probe(table, hash, &v)];
    if (slot.used) continue;  // already there
    slot = SetSlot{true, v, hash};
    ++used;
    if (used * 5 < (table.size() - 1) * 3) continue;
    // set_table_resize(used * 4): the smallest power of two above it, entries re-inserted in
    // the old table's order.
    size_t size = kMinSize;
    while (size <= used * 4) size <<= 1;
    std::vector<SetSlot> grown(size);
    for (const SetSlot& s : table) {
      if (s.used) grown[set_probe(grown, s.hash, nullptr)] = s;
    }
    table = std::move(grown);
  }
  std::vector<int64_t> out;
  for (const SetSlot& s : table) {
    if (s.used) out.push_back(s.value);
  }
  return out;
}

bool py_equal(const Value& a, const Value& b) {
  // Python: 1 == 1.0 == True.
  auto numeric = [](const Value& v) { return v.is_int() || v.is_float() || v.is_bool(); };
  if (numeric(a) && numeric(b)) return a.as_float() == b.as_float();
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kStr:
      return a.as_str() == b.as_str();
    case Value::Kind::kSymbol:
      return a.as_symbol().name == b.as_symbol().name;
    case Value::Kind::kTuple: {
      const auto& x = a.as_tuple();
      const auto& y = b.as_tuple();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!py_equal(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kList: {
      if (a.list()->size() != b.list()->size()) return false;
      for (size_t i = 0; i < a.list()->size(); ++i) {
        if (!py_equal(a.list()->at(i), b.list()->at(i))) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict()->size() != b.dict()->size()) return false;
      for (const auto& [k, v] : *a.dict()) {
        const Value* other = b.dict()->find(k);
        if (other == nullptr || !py_equal(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kTensor:
      if (a.is(b)) return true;
      throw UpstreamError("RuntimeError",
                          "Boolean value of Tensor with more than one value is ambiguous",
                          "Tensor.__eq__");
    default:
      return a.is(b);
  }
}

}  // namespace ckptsim::model
