// The one translation unit that includes torch's serialization headers (heavy, and they
// drag in the JIT); everything else sees only model/pickle_codec.h.
#include "model/py/pickle_codec.h"

#include <ATen/core/ivalue.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include <unordered_map>

#include "model/errors.h"
#include "model/zip_layout.h"

namespace ckptsim::model {

namespace {

// ---------------------------------------------------------------------------------------
// Tuple-key text: the inverse of Key::repr() for tuples of ints, strs, symbols and tuples.

class KeyReprParser {
 public:
  explicit KeyReprParser(std::string_view text) : text_(text) {}

  // The tuple key spelled by the whole text, if it is one.
  std::optional<Key> parse_whole_tuple() {
    std::optional<Key> k = parse_tuple(0);
    if (!k || pos_ != text_.size()) return std::nullopt;
    return k;
  }

 private:
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }
  bool eat(char c) {
    if (peek() != c || at_end()) return false;
    ++pos_;
    return true;
  }

  std::optional<Key> parse_tuple(size_t depth) {
    if (depth >= kPickleDepthMax || !eat('(')) return std::nullopt;
    std::vector<Key> items;
    if (eat(')')) return Key::tuple(std::move(items));
    while (true) {
      std::optional<Key> item = parse_item(depth);
      if (!item) return std::nullopt;
      items.push_back(std::move(*item));
      if (eat(')')) break;
      if (!eat(',')) return std::nullopt;
      if (eat(')')) break;  // "(x,)": the 1-tuple spelling
      if (!eat(' ')) return std::nullopt;
    }
    return Key::tuple(std::move(items));
  }

  std::optional<Key> parse_item(size_t depth) {
    const char c = peek();
    if (c == '(') return parse_tuple(depth + 1);
    if (c == '\'' || c == '"') return parse_str();
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) return parse_int();
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') return parse_symbol();
    return std::nullopt;
  }

  // Inverse of py_str_repr (model/key.cpp): quote, backslash escapes of the quote, of
  // backslash, and "\n".
  std::optional<Key> parse_str() {
    const char quote = text_[pos_++];
    std::string out;
    while (!at_end()) {
      const char c = text_[pos_++];
      if (c == quote) return Key(std::move(out));
      if (c == '\\') {
        if (at_end()) return std::nullopt;
        const char e = text_[pos_++];
        out.push_back(e == 'n' ? '\n' : e);
        continue;
      }
      out.push_back(c);
    }
    return std::nullopt;
  }

  std::optional<Key> parse_int() {
    const size_t start = pos_;
    eat('-');
    while (std::isdigit(static_cast<unsigned char>(peek()))) ++pos_;
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(text_.data() + start, text_.data() + pos_, value);
    if (ec != std::errc() || end != text_.data() + pos_) return std::nullopt;
    return Key(value);
  }

  // A dotted identifier: torch.bfloat16, torch.float32.
  std::optional<Key> parse_symbol() {
    const size_t start = pos_;
    while (!at_end() &&
           (std::isalnum(static_cast<unsigned char>(peek())) || peek() == '_' || peek() == '.')) {
      ++pos_;
    }
    return Key::symbol(std::string(text_.substr(start, pos_ - start)));
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// ---------------------------------------------------------------------------------------
// Encoding: Value -> IValue. Containers are memoized by identity so that an object reached
// twice becomes one IValue, which the pickler then writes once and references (invariant 3).

class Encoder {
 public:
  c10::IValue encode(const Value& v) {
    KeyPath path;
    return encode_at(v, path);
  }

 private:
  std::unordered_map<const void*, at::Tensor> host_copies_;  // lookup only
  c10::IValue encode_at(const Value& v, KeyPath& path) {
    CKPTSIM_CHECK(path.size() <= kPickleDepthMax,
                  fmt::format("pickle_value: nesting deeper than kPickleDepthMax={} at {}",
                              kPickleDepthMax, repr(path)));
    switch (v.kind()) {
      case Value::Kind::kNone:
        return c10::IValue();
      case Value::Kind::kBool:
        return c10::IValue(v.as_bool());
      case Value::Kind::kInt:
        return c10::IValue(v.as_int());
      case Value::Kind::kFloat:
        return c10::IValue(v.as_float());
      case Value::Kind::kStr:
        return c10::IValue(v.as_str());
      case Value::Kind::kSymbol:
        return c10::IValue(v.as_symbol().name);
      case Value::Kind::kTensor: {
        if (!v.tensor().defined()) return c10::IValue();
        if (!v.tensor().is_cuda()) return c10::IValue(v.tensor());
        // A GPU-resident tensor is written as its CPU copy, as a checkpoint read with
        // map_location='cpu' gives it back; one copy per object keeps aliasing.
        const void* id = v.tensor().unsafeGetTensorImpl();
        auto it = host_copies_.find(id);
        if (it == host_copies_.end()) it = host_copies_.emplace(id, v.tensor().cpu()).first;
        return c10::IValue(it->second);
      }
      case Value::Kind::kTuple:
        return memoized(&v.as_tuple(), path, [&] {
          std::vector<c10::IValue> items;
          for (size_t i = 0; i < v.as_tuple().size(); ++i) {
            path.push_back(Key(static_cast<int64_t>(i)));
            items.push_back(encode_at(v.as_tuple()[i], path));
            path.pop_back();
          }
          return c10::IValue(c10::ivalue::Tuple::create(std::move(items)));
        });
      case Value::Kind::kList:
        return memoized(v.list().get(), path, [&] {
          c10::impl::GenericList list(c10::AnyType::get());
          list.reserve(v.list()->size());
          for (size_t i = 0; i < v.list()->size(); ++i) {
            path.push_back(Key(static_cast<int64_t>(i)));
            list.push_back(encode_at(v.list()->at(i), path));
            path.pop_back();
          }
          return c10::IValue(std::move(list));
        });
      case Value::Kind::kDict:
        return memoized(v.dict().get(), path, [&] {
          c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
          for (const auto& [key, item] : *v.dict()) {
            path.push_back(key);
            c10::IValue encoded_item = encode_at(item, path);
            const bool inserted =
                dict.insert(encode_key(key, path), std::move(encoded_item)).second;
            CKPTSIM_CHECK(inserted, fmt::format("pickle_value: two keys of the dict at {} encode "
                                                "to the same pickled key {}",
                                                repr(KeyPath(path.begin(), path.end() - 1)),
                                                py_str_repr(key.repr())));
            path.pop_back();
          }
          return c10::IValue(std::move(dict));
        });
      case Value::Kind::kShardedTensor:
      case Value::Kind::kShardedObject:
      case Value::Kind::kNonpersistent:
        CKPTSIM_CHECK(false, fmt::format("pickle_value: a {} at {} reached the codec; save must "
                                         "extract sharded and non-persistent leaves first",
                                         v.type_name(), repr(path)));
    }
    CKPTSIM_CHECK(false, "pickle_value: unknown Value kind");
    return c10::IValue();
  }

  template <typename Build>
  c10::IValue memoized(const void* identity, const KeyPath& path, Build build) {
    if (const auto it = memo_.find(identity); it != memo_.end()) return it->second;
    CKPTSIM_CHECK(in_progress_.insert(identity).second,
                  "pickle_value: a cycle through the object at " + repr(path));
    c10::IValue built = build();
    in_progress_.erase(identity);
    memo_.emplace(identity, built);
    return built;
  }

  static c10::IValue encode_key(const Key& key, const KeyPath& path) {
    switch (key.kind()) {
      case Key::Kind::kInt:
        return c10::IValue(key.as_int());
      case Key::Kind::kStr:
        return c10::IValue(key.as_str());
      case Key::Kind::kSymbol:
        return c10::IValue(key.repr());
      case Key::Kind::kTuple: {
        std::string text = key.repr();
        // Paired with the decoder: a tuple key is written only if it will come back.
        CKPTSIM_CHECK(decode_dict_key(text) == key,
                      fmt::format("pickle_value: tuple key {} at {} cannot be written as a str "
                                  "that decodes back to it",
                                  text, repr(path)));
        return c10::IValue(std::move(text));
      }
    }
    CKPTSIM_CHECK(false, "pickle_value: unknown Key kind");
    return c10::IValue();
  }

  // Only lookups: never iterated, so ordering by address cannot leak into the output.
  std::map<const void*, c10::IValue> memo_;
  std::set<const void*> in_progress_;
};

// ---------------------------------------------------------------------------------------
// Decoding: IValue -> Value.

struct DecodeError {
  std::string message;
};

class Decoder {
 public:
  Value decode(const c10::IValue& iv) {
    KeyPath path;
    return decode_at(iv, path);
  }

 private:
  Value decode_at(const c10::IValue& iv, KeyPath& path) {
    if (path.size() > kPickleDepthMax) {
      fail(fmt::format("nesting deeper than kPickleDepthMax={}", kPickleDepthMax), path);
    }
    if (iv.isNone()) return Value();
    if (iv.isBool()) return Value(iv.toBool());
    if (iv.isInt()) return Value(iv.toInt());
    if (iv.isDouble()) return Value(iv.toDouble());
    if (iv.isString()) return Value(iv.toStringRef());
    if (iv.isTensor()) return Value(iv.toTensor());
    if (iv.isTuple()) {
      return memoized(iv, path, [&] {
        const auto& elements = iv.toTupleRef().elements();
        std::vector<Value> items;
        items.reserve(elements.size());
        for (size_t i = 0; i < elements.size(); ++i) {
          path.push_back(Key(static_cast<int64_t>(i)));
          items.push_back(decode_at(elements[i], path));
          path.pop_back();
        }
        return Value::tuple(std::move(items));
      });
    }
    if (iv.isList()) {  // any element type: a file from torch::pickle_save has typed lists
      return memoized(iv, path, [&] {
        ListPtr list = List::make();
        const c10::ArrayRef<c10::IValue> elements = iv.toListRef();
        for (size_t i = 0; i < elements.size(); ++i) {
          path.push_back(Key(static_cast<int64_t>(i)));
          list->append(decode_at(elements[i], path));
          path.pop_back();
        }
        return Value(list);
      });
    }
    if (iv.isGenericDict()) {
      return memoized(iv, path, [&] {
        DictPtr dict = Dict::make();
        for (const auto& entry : iv.toGenericDict()) {
          const Key key = decode_key(entry.key(), path);
          CKPTSIM_CHECK(!dict->contains(key),
                        "unpickle_value: duplicate key " + key.repr() + " at " + repr(path));
          path.push_back(key);
          dict->set(key, decode_at(entry.value(), path));
          path.pop_back();
        }
        return Value(dict);
      });
    }
    fail("an unexpected " + iv.tagKind(), path);
  }

  [[noreturn]] static void fail(const std::string& what, const KeyPath& path) {
    throw DecodeError{fmt::format("{} at {}", what, repr(path))};
  }

  static Key decode_key(const c10::IValue& k, const KeyPath& path) {
    if (k.isInt()) return Key(k.toInt());
    if (k.isString()) return decode_dict_key(k.toStringRef());
    fail("a dict key of type " + k.tagKind(), path);
  }

  template <typename Build>
  Value memoized(const c10::IValue& iv, const KeyPath& path, Build build) {
    const void* identity = iv.internalToPointer();
    if (const auto it = memo_.find(identity); it != memo_.end()) return it->second;
    if (!in_progress_.insert(identity).second) fail("a cycle", path);
    Value built = build();
    in_progress_.erase(identity);
    memo_.emplace(identity, built);
    return built;
  }

  // Only lookups: never iterated.
  std::map<const void*, Value> memo_;
  std::set<const void*> in_progress_;
};

}  // namespace

Key decode_dict_key(const std::string& text) {
  std::optional<Key> tuple = KeyReprParser(text).parse_whole_tuple();
  // Only the exact text Key::repr() writes counts: "(1,2)" or "(01,)" stay strs.
  if (tuple && tuple->repr() == text) return *tuple;
  return Key(text);
}

std::vector<char> pickle_value(const Value& v) {
  const c10::IValue root = Encoder().encode(v);

  std::vector<char> pickle_bytes;
  std::vector<char> out;
  try {
    // tag_aggregates=false: no torch.jit._pickle.restore_type_tag around lists and dicts,
    // which torch.load(weights_only=True) refuses (invariant 1). That is the one
    // difference from torch::pickle_save, which we otherwise follow.
    torch::jit::Pickler pickler(
        [&](const char* data, size_t size) {
          pickle_bytes.insert(pickle_bytes.end(), data, data + size);
        },
        /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
        /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
    pickler.protocol();
    pickler.pushIValue(root);
    pickler.stop();

    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
      const char* bytes = static_cast<const char*>(data);
      out.insert(out.end(), bytes, bytes + size);
      return size;
    });
    // "data.pkl" plus "data/<key>" per storage, as torch.save lays out its archive.
    torch::jit::writeArchiveAndTensors("data", pickle_bytes.data(), pickle_bytes.size(),
                                       pickler.tensorData(), writer);
    writer.writeEndOfFile();
  } catch (const c10::Error& e) {
    CKPTSIM_CHECK(
        false, std::string("pickle_value: torch refused to pickle: ") + e.what_without_backtrace());
  }
  return out;
}

namespace {

// A copy of a decoded value that shares nothing with it and keeps the aliasing the decoder
// made (invariant 3): a dict, list, tuple or tensor reached twice is one new object, and
// tensors over one storage are views of one new storage (same dtype, sizes, strides, offset).
class FreshCopy {
 public:
  Value copy(const Value& v) {
    switch (v.kind()) {
      case Value::Kind::kTensor:
        return once(v.tensor().unsafeGetTensorImpl(), [&] { return Value(tensor(v.tensor())); });
      case Value::Kind::kTuple:
        return once(&v.as_tuple(), [&] {
          std::vector<Value> items;
          items.reserve(v.as_tuple().size());
          for (const Value& item : v.as_tuple()) items.push_back(copy(item));
          return Value::tuple(std::move(items));
        });
      case Value::Kind::kList:
        return once(v.list().get(), [&] {
          ListPtr list = List::make();
          for (const Value& item : *v.list()) list->append(copy(item));
          return Value(list);
        });
      case Value::Kind::kDict:
        return once(v.dict().get(), [&] {
          DictPtr dict = Dict::make();
          dict->reserve(v.dict()->size());
          for (const auto& [k, item] : *v.dict()) dict->set_new(k, copy(item));  // distinct
          return Value(dict);
        });
      default:
        return v;  // the decoder's scalars: None, bool, int, float, str
    }
  }

 private:
  // A container reached again is the same new object; none contains itself (the decoder
  // refuses cycles), so the memo entry is written after the copy.
  template <typename Build>
  Value once(const void* identity, Build build) {
    if (const auto it = memo_.find(identity); it != memo_.end()) return it->second;
    Value built = build();
    memo_.emplace(identity, built);
    return built;
  }

  at::Tensor tensor(const at::Tensor& t) {
    const c10::StorageImpl* id = t.storage().unsafeGetStorageImpl();
    auto it = storages_.find(id);
    if (it == storages_.end()) {
      const auto elements = static_cast<int64_t>(t.storage().nbytes() / t.element_size());
      at::Tensor fresh = at::empty({elements}, t.options());
      if (t.storage().nbytes() > 0)
        std::memcpy(fresh.data_ptr(), t.storage().data(), t.storage().nbytes());
      it = storages_.emplace(id, fresh.storage()).first;
    }
    return at::empty({0}, t.options()).set_(it->second, t.storage_offset(), t.sizes(), t.strides());
  }

  std::unordered_map<const void*, Value> memo_;             // lookup only
  std::unordered_map<const void*, c10::Storage> storages_;  // lookup only
};

// The last few decoded files of this thread, by their bytes: the ranks of a world (fibers on
// one thread) read the same common.pt and the same replicated object files, and each rank
// gets its own FreshCopy of one decode instead of running torch's zip reader and unpickler
// again. Each entry keeps the whole bytes it stands for, so a changed file decodes anew.
class DecodedFiles {
 public:
  static constexpr size_t kEntriesMax = 8;

  const Value* find(std::span<const char> bytes) const {
    for (const auto& [held, value] : entries_) {
      if (held.size() == bytes.size() && std::equal(held.begin(), held.end(), bytes.begin()))
        return &value;
    }
    return nullptr;
  }

  void insert(std::span<const char> bytes, Value value) {
    std::pair<std::vector<char>, Value> entry{std::vector<char>(bytes.begin(), bytes.end()),
                                              std::move(value)};
    if (entries_.size() < kEntriesMax) {
      entries_.push_back(std::move(entry));
    } else {
      entries_[next_] = std::move(entry);
      next_ = (next_ + 1) % kEntriesMax;
    }
  }

 private:
  std::vector<std::pair<std::vector<char>, Value>> entries_;
  size_t next_ = 0;
};

// "" when `bytes` end as a whole zip archive does: an end-of-central-directory record within its
// last 64 KiB + 22 bytes whose central directory lies before it; else why not. A file cut short
// (a torn or short write) fails it. libtorch 1.13's zip reader, handed such bytes, read 4096
// bytes outside them (ASan, scripts/sanitize.sh, 2026-12-05): it never sees them now.
std::string zip_end_problem(std::span<const char> bytes) {
  if (bytes.size() < zip::kEndRecordBytes) return "shorter than a zip archive's end record";
  const std::optional<zip::End> end = zip::find_end(bytes);
  if (!end) return "no zip end record (a file cut short?)";
  // The zip64 record holds the central directory's place then; libtorch reads that one.
  if (end->defers_to_zip64() || end->plain_cd_offset + end->plain_cd_size <= end->at) return "";
  return fmt::format("its central directory [{}, {}) runs past its end record at {}",
                     end->plain_cd_offset, end->plain_cd_offset + end->plain_cd_size, end->at);
}

Result<Value> decode_bytes(std::span<const char> bytes) {
  if (std::string problem = zip_end_problem(bytes); !problem.empty())
    return Status::corruption("not a whole torch pickle archive: " + problem);
  try {
    const c10::IValue root = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
    return Decoder().decode(root);
  } catch (const DecodeError& e) {
    return Status::corruption("pickle holds " + e.message);
  } catch (const InvariantViolation&) {
    throw;  // our bug, not the bytes'
  } catch (const c10::Error& e) {
    return Status::corruption(std::string("torch could not unpickle: ") +
                              e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Status::corruption(std::string("torch could not unpickle: ") + e.what());
  }
}

}  // namespace

Result<Value> unpickle_value(std::span<const char> bytes) {
  thread_local DecodedFiles decoded;
  if (const Value* hit = decoded.find(bytes)) return FreshCopy().copy(*hit);
  Result<Value> r = decode_bytes(bytes);
  if (!r.is_ok()) return r;  // not kept: a damaged file is rare and decodes to a Status again
  decoded.insert(bytes, r.value());
  return FreshCopy().copy(r.value());
}

}  // namespace ckptsim::model
