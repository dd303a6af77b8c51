// One of the translation units that include libtorch's zip reader (caffe2/serialize); the
// other is model/py/pickle_codec.cpp.
#include "model/torch/torch_save_format.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <utility>

#include <fmt/format.h>

#include "model/errors.h"
#include "model/py/key.h"
#include "model/py/pickle_tree.h"
#include "model/py/pickle_writer.h"
#include "model/zip_layout.h"

namespace ckptsim::model {

namespace {

using Kind = PickleNode::Kind;

struct LoadError {
  std::string message;
};

[[noreturn]] void fail(std::string message) { throw LoadError{std::move(message)}; }

// The typed storages torch.save names in a persistent id (torch/storage.py _LegacyStorage).
const std::map<std::string, at::ScalarType>& storage_types() {
  static const std::map<std::string, at::ScalarType> types = {
      {"torch.FloatStorage", at::kFloat}, {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.HalfStorage", at::kHalf},   {"torch.DoubleStorage", at::kDouble},
      {"torch.LongStorage", at::kLong},   {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort}, {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},   {"torch.BoolStorage", at::kBool},
  };
  return types;
}

// The class of Megatron's saved args (state_dict['args']).
constexpr const char* kNamespaceClass = "argparse.Namespace";

const std::set<std::string>& optimizer_classes() {
  static const std::set<std::string> classes = {
      "torch.optim.adamw.AdamW",
      "torch.optim.adam.Adam",
      "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam",
      "apex.optimizers.fused_adam.FusedAdam",
      // The replay runner's stand-in with TE FusedAdam's semantics (replay/emulation.py).
      "replay.emulation.StandinFusedAdam",
  };
  return classes;
}

// A bounds-checked view of the blob: libtorch's MemoryReadAdapter copies whatever miniz asks
// for, so an offset in a corrupt central directory would read past the buffer.
class SpanReadAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit SpanReadAdapter(std::span<const char> bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    // miniz extracts an empty record into a null buffer (n = 0): memcpy's pointers must not be
    // null even for 0 bytes (UBSan's nonnull-attribute; dcp_reader_fuzzer, 2026-12-05).
    if (pos >= bytes_.size() || n == 0 || buf == nullptr) return 0;
    const size_t count = std::min<uint64_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, count);
    return count;
  }

 private:
  std::span<const char> bytes_;
};

// Turns the pickle graph of data.pkl into a Value, reading storages from the archive.
class TreeToValue {
 public:
  TreeToValue(const PickleTree& tree, caffe2::serialize::PyTorchStreamReader& archive)
      : tree_(tree), archive_(archive) {}

  Value convert(PickleNodeId id) {
    const PickleNode& n = tree_.at(id);
    switch (n.kind) {
      case Kind::kNone:
        return Value();
      case Kind::kBool:
        return Value(n.boolean);
      case Kind::kInt:
        return Value(n.integer);
      case Kind::kFloat:
        return Value(n.floating);
      case Kind::kStr:
        return Value(n.text);
      case Kind::kGlobal:
        return global_value(n.text);
      case Kind::kTuple:
      case Kind::kList:
      case Kind::kDict:
      case Kind::kObject:
        return memoized(id);
      case Kind::kBytes:
      case Kind::kPersistent:
        break;
    }
    fail("unexpected " + tree_.describe(id) + " in the object");
  }

 private:
  Value memoized(PickleNodeId id) {
    if (const auto it = memo_.find(id); it != memo_.end()) return it->second;
    Value v = build(id);
    memo_.emplace(id, v);
    return v;
  }

  Value build(PickleNodeId id) {
    const PickleNode& n = tree_.at(id);
    if (n.kind == Kind::kTuple) {
      std::vector<Value> items;
      for (const PickleNodeId item : n.items) items.push_back(convert(item));
      return Value::tuple(std::move(items));
    }
    if (n.kind == Kind::kList) {
      ListPtr list = List::make();
      for (const PickleNodeId item : n.items) list->append(convert(item));
      return Value(list);
    }
    if (n.kind == Kind::kDict) return build_dict(n);
    if (n.text == "torch._utils._rebuild_tensor_v2") return rebuild_tensor(n);
    if (n.text == kNamespaceClass) return namespace_value(n);
    fail("an object of class " + n.text + ", which a state dict does not hold");
  }

  // Megatron's state_dict['args']: argparse.Namespace() with its attributes as BUILD's state
  // dict. The model holds it as that dict (checkpointing.py's checks read it by name).
  Value namespace_value(const PickleNode& n) {
    if (!tree_.at(n.items.at(0)).items.empty()) fail("an argparse.Namespace with arguments");
    if (n.state == PickleNode::kNoState) return Value(Dict::make());
    if (tree_.at(n.state).kind != Kind::kDict) fail("an argparse.Namespace whose state is no dict");
    return convert(n.state);
  }

  Value build_dict(const PickleNode& n) {
    DictPtr dict = Dict::make();
    for (size_t i = 0; i + 1 < n.items.size(); i += 2) {
      const Key key = convert_key(n.items[i]);
      if (dict->contains(key)) fail("a dict with the key " + key.repr() + " twice");
      dict->set(key, convert(n.items[i + 1]));
    }
    return Value(dict);
  }

  Key convert_key(PickleNodeId id) const {
    const PickleNode& n = tree_.at(id);
    if (n.kind == Kind::kInt) return Key(n.integer);
    if (n.kind == Kind::kStr) return Key(n.text);
    if (n.kind == Kind::kGlobal && dtype_from_global(n.text)) return Key::symbol(n.text);
    if (n.kind == Kind::kTuple) {
      std::vector<Key> items;
      for (const PickleNodeId item : n.items) items.push_back(convert_key(item));
      return Key::tuple(std::move(items));
    }
    fail("a dict key that is " + tree_.describe(id));
  }

  static Value global_value(const std::string& name) {
    if (dtype_from_global(name)) return Value::symbol(name);
    if (optimizer_classes().contains(name)) return Value::symbol("<class '" + name + "'>");
    fail("the class " + name + " as a value");
  }

  Value rebuild_tensor(const PickleNode& call);
  at::Tensor storage(PickleNodeId persistent);
  std::vector<int64_t> int_tuple(PickleNodeId id, const char* what) const;

  const PickleTree& tree_;
  caffe2::serialize::PyTorchStreamReader& archive_;
  std::map<PickleNodeId, Value> memo_;
  std::map<std::string, at::Tensor> storages_;  // by record key: views share their storage
};

std::vector<int64_t> TreeToValue::int_tuple(PickleNodeId id, const char* what) const {
  const PickleNode& n = tree_.at(id);
  if (n.kind != Kind::kTuple)
    fail(fmt::format("a tensor whose {} is {}", what, tree_.describe(id)));
  if (n.items.size() > kTorchSaveDimsMax) {
    fail(fmt::format("a tensor of {} dimensions (kTorchSaveDimsMax={})", n.items.size(),
                     kTorchSaveDimsMax));
  }
  std::vector<int64_t> out;
  for (const PickleNodeId item : n.items) {
    if (tree_.at(item).kind != Kind::kInt || tree_.at(item).integer < 0) {
      fail(fmt::format("a tensor whose {} holds {}", what, tree_.describe(item)));
    }
    out.push_back(tree_.at(item).integer);
  }
  return out;
}

// The persistent id torch.save writes per storage:
// ('storage', <storage class>, '<key>', '<location>', <numel>).
at::Tensor TreeToValue::storage(PickleNodeId persistent) {
  const PickleNode& p = tree_.at(persistent);
  if (p.kind != Kind::kPersistent) fail("a tensor whose storage is " + tree_.describe(persistent));
  const PickleNode& pid = tree_.at(p.items.at(0));
  const auto is = [&](size_t i, Kind kind) { return tree_.at(pid.items[i]).kind == kind; };
  if (pid.kind != Kind::kTuple || pid.items.size() != 5 || !is(0, Kind::kStr) ||
      tree_.at(pid.items[0]).text != "storage" || !is(1, Kind::kGlobal) || !is(2, Kind::kStr) ||
      !is(3, Kind::kStr) || !is(4, Kind::kInt)) {
    fail("a tensor whose storage is not ('storage', class, key, location, numel)");
  }
  const std::string& cls = tree_.at(pid.items[1]).text;
  const std::string& key = tree_.at(pid.items[2]).text;
  const int64_t numel = tree_.at(pid.items[4]).integer;
  const auto type = storage_types().find(cls);
  if (type == storage_types().end()) fail("a storage of class " + cls);
  if (key.empty() || !std::all_of(key.begin(), key.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) != 0;
      })) {
    fail("a storage key " + py_str_repr(key));
  }
  if (const auto it = storages_.find(key); it != storages_.end()) return it->second;
  const std::string record = "data/" + key;
  if (!archive_.hasRecord(record)) fail("no record " + record + " for a tensor's storage");
  auto [data, size] = archive_.getRecord(record);
  const size_t element_bytes = c10::elementSize(type->second);
  if (numel < 0 || size % element_bytes != 0 || size / element_bytes != uint64_t(numel)) {
    fail(fmt::format("record {} of {} bytes for {} elements of {}", record, size, numel, cls));
  }
  at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(type->second));
  if (size > 0) std::memcpy(t.data_ptr(), data.get(), size);
  storages_.emplace(key, t);
  return t;
}

// Mirrors torch/_utils.py _rebuild_tensor_v2(storage, storage_offset, size, stride,
// requires_grad, backward_hooks[, metadata]); requires_grad and hooks are not kept.
Value TreeToValue::rebuild_tensor(const PickleNode& call) {
  const PickleNode& args = tree_.at(call.items.at(0));
  if (call.state != PickleNode::kNoState || args.items.size() < 6 || args.items.size() > 7 ||
      tree_.at(args.items[1]).kind != Kind::kInt) {
    fail("a _rebuild_tensor_v2 call with other arguments than torch.save writes");
  }
  const at::Tensor base = storage(args.items[0]);
  const int64_t offset = tree_.at(args.items[1]).integer;
  const std::vector<int64_t> size = int_tuple(args.items[2], "size");
  const std::vector<int64_t> stride = int_tuple(args.items[3], "stride");
  if (size.size() != stride.size()) fail("a tensor whose size and stride differ in length");
  // The last element the view reaches must lie inside its storage. No overflow: a stride
  // that matters is at most the storage's numel (< 2^31 in a file under kFileBytesMax), a
  // size below 2^63, and there are at most kTorchSaveDimsMax terms.
  __int128 last = offset;
  bool empty = false;
  for (size_t i = 0; i < size.size(); ++i) {
    empty = empty || size[i] == 0;
    if (size[i] > 1 && stride[i] > base.numel()) last = base.numel();  // past the end
    if (size[i] > 1 && stride[i] <= base.numel()) {
      last += static_cast<__int128>(size[i] - 1) * stride[i];
    }
  }
  if (offset < 0 || (!empty && last >= base.numel())) {
    fail(fmt::format("a tensor view (offset {}) past its storage of {} elements", offset,
                     base.numel()));
  }
  if (empty) return Value(at::empty(size, base.options()));
  return Value(base.as_strided(size, stride, offset));
}

// libtorch's reader allocates a record's size as the zip's central directory declares it before
// reading it (PyTorchStreamReader::getRecord, from its constructor on), so a forged size in a
// 2 KB file was a 4 GiB allocation (found by torch_save_fuzzer on the GPU machine). torch.save
// stores its records uncompressed: none can be larger than the archive. What is not a readable
// central directory is left to libtorch to refuse.
std::optional<std::string> record_size_problem(std::span<const char> bytes) {
  const auto at = [&](uint64_t off, size_t n) { return zip::read_le(bytes, off, n); };
  const size_t n = bytes.size();
  const std::optional<zip::End> end = zip::find_end(bytes);
  if (!end) return std::nullopt;
  uint64_t offset = end->cd_offset;
  for (uint64_t e = 0; e < end->entries && e <= kTorchSaveRecordsMax; ++e) {
    if (at(offset, 4) != zip::kCentralEntryMagic) return std::nullopt;
    uint64_t compressed = *at(offset + 20, 4);
    uint64_t size = *at(offset + 24, 4);
    const auto name_len = at(offset + 28, 2), extra_len = at(offset + 30, 2),
               comment_len = at(offset + 32, 2);
    if (!name_len || !extra_len || !comment_len) return std::nullopt;
    // Zip64 sizes: in the extra field 0x0001, uncompressed size first, where 0xffffffff says so.
    for (uint64_t x = offset + 46 + *name_len; x + 4 <= offset + 46 + *name_len + *extra_len;) {
      const uint64_t id = at(x, 2).value_or(0), len = at(x + 2, 2).value_or(0);
      if (id == 1) {
        uint64_t y = x + 4;
        if (size == 0xffffffffu) size = at(y, 8).value_or(size), y += 8;
        if (compressed == 0xffffffffu) compressed = at(y, 8).value_or(compressed);
      }
      x += 4 + len;
    }
    if (std::max(size, compressed) > n) {
      const std::string name(bytes.data() + std::min<uint64_t>(offset + 46, n),
                             std::min<uint64_t>(*name_len, n - std::min<uint64_t>(offset + 46, n)));
      return fmt::format("record {} declares {} bytes, more than the whole archive ({} bytes)",
                         py_str_repr(name), std::max(size, compressed), n);
    }
    offset += 46 + *name_len + *extra_len + *comment_len;
  }
  return std::nullopt;
}

}  // namespace

std::optional<at::ScalarType> dtype_from_global(const std::string& name) {
  static const std::map<std::string, at::ScalarType> dtypes = {
      {"torch.float32", at::kFloat}, {"torch.bfloat16", at::kBFloat16},
      {"torch.float16", at::kHalf},  {"torch.float64", at::kDouble},
      {"torch.int64", at::kLong},    {"torch.int32", at::kInt},
      {"torch.int16", at::kShort},   {"torch.int8", at::kChar},
      {"torch.uint8", at::kByte},    {"torch.bool", at::kBool},
  };
  const auto it = dtypes.find(name);
  if (it == dtypes.end()) return std::nullopt;
  return it->second;
}

const std::set<std::string>& torch_save_globals() {
  static const std::set<std::string> globals = [] {
    std::set<std::string> g = {"torch._utils._rebuild_tensor_v2", "collections.OrderedDict",
                               kNamespaceClass};
    for (const auto& [name, type] : storage_types()) g.insert(name);
    for (const char* d : {"float32", "bfloat16", "float16", "float64", "int64", "int32", "int16",
                          "int8", "uint8", "bool"}) {
      g.insert(std::string("torch.") + d);
    }
    g.insert(optimizer_classes().begin(), optimizer_classes().end());
    return g;
  }();
  return globals;
}

Result<Value> load_torch_save(std::span<const char> bytes) {
  if (auto problem = record_size_problem(bytes)) {
    return Status::corruption("torch.save blob holds " + *problem);
  }
  try {
    caffe2::serialize::PyTorchStreamReader archive(std::make_shared<SpanReadAdapter>(bytes));
    if (archive.getAllRecords().size() > kTorchSaveRecordsMax) {
      fail(fmt::format("more than kTorchSaveRecordsMax={} records", kTorchSaveRecordsMax));
    }
    if (!archive.hasRecord("data.pkl")) fail("no data.pkl record");
    auto [data, size] = archive.getRecord("data.pkl");
    const std::span<const char> pickle(static_cast<const char*>(data.get()), size);
    Result<PickleTree> tree = read_pickle_tree(pickle, PickleTreeOptions{torch_save_globals()});
    if (!tree.is_ok()) return Status::corruption("torch.save data.pkl: " + tree.status().message());
    return TreeToValue(tree.value(), archive).convert(tree.value().root);
  } catch (const LoadError& e) {
    return Status::corruption("torch.save blob holds " + e.message);
  } catch (const InvariantViolation&) {
    throw;  // our bug, not the bytes' (as pickle_codec.cpp unpickle_value)
  } catch (const c10::Error& e) {
    // libtorch's message quotes the archive's record names, and may add context lines.
    return Status::corruption("torch.save blob: libtorch cannot read the archive: " +
                              escape_control_characters(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return Status::corruption("torch.save blob: " + escape_control_characters(e.what()));
  }
}

}  // namespace ckptsim::model

// ---- write side ------------------------------------------------------------------------------

namespace ckptsim::model {

namespace {

struct SaveError {
  std::string message;
};

// The storage class torch.save names for a dtype (the inverse of storage_types()).
std::string storage_class(at::ScalarType dtype) {
  for (const auto& [name, type] : storage_types()) {
    if (type == dtype) return name;
  }
  throw SaveError{std::string("a tensor of dtype ") + c10::toString(dtype) +
                  ", which torch_save does not write"};
}

std::pair<std::string, std::string> split_global(const std::string& dotted) {
  const size_t dot = dotted.rfind('.');
  CKPTSIM_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < dotted.size(),
                "split_global: '" + dotted + "' is no module.name");
  return {dotted.substr(0, dot), dotted.substr(dot + 1)};
}

// Writes a Value as torch.save's pickler does (protocol 2).
class TorchSavePickler {
 public:
  explicit TorchSavePickler(const TorchSaveOptions& options) : options_(options) {}

  void value(const Value& v, KeyPath& path) {
    if (path.size() > kTorchSaveDepthMax) fail(path, "nesting deeper than kTorchSaveDepthMax");
    switch (v.kind()) {
      case Value::Kind::kNone:
        return w_.none();
      case Value::Kind::kBool:
        return w_.boolean(v.as_bool());
      case Value::Kind::kInt:
        return w_.integer(v.as_int());
      case Value::Kind::kFloat:
        return w_.floating(v.as_float());
      case Value::Kind::kStr:
        return w_.str(v.as_str());
      case Value::Kind::kSymbol:
        return symbol(v.as_symbol().name, path);
      case Value::Kind::kTuple:
        return tuple(v, path);
      case Value::Kind::kTensor:
        return tensor(v.tensor(), path);
      case Value::Kind::kDict:
        return dict(v, path);
      case Value::Kind::kList:
        return list(v, path);
      case Value::Kind::kShardedTensor:
      case Value::Kind::kShardedObject:
      case Value::Kind::kNonpersistent:
        break;
    }
    fail(path, "a " + v.type_name() + ", which save() extracts before anything is pickled");
  }

  std::vector<char> finish() { return w_.finish(); }
  const std::vector<std::pair<std::string, at::Tensor>>& storages() const { return storages_; }

 private:
  [[noreturn]] static void fail(const KeyPath& path, const std::string& what) {
    throw SaveError{"at " + repr(path) + ": " + what};
  }

  bool fetch(const void* identity) {
    const auto it = memo_.find(identity);
    if (it == memo_.end()) return false;
    w_.get(it->second);
    return true;
  }

  void symbol(const std::string& name, const KeyPath& path) {
    if (dtype_from_global(name)) {
      const auto [module, attr] = split_global(name);
      return w_.global(module, attr);
    }
    const std::optional<std::string> cls = class_global(name);
    if (!cls) fail(path, "the symbol " + name + ", which is neither a dtype nor a class");
    if (options_.weights_only) {
      fail(path, "the class " + *cls + ", which torch.load(weights_only=True) refuses");
    }
    const auto [module, attr] = split_global(*cls);
    w_.global(module, attr);
  }

  void key(const Key& k, const KeyPath& path) {
    switch (k.kind()) {
      case Key::Kind::kInt:
        return w_.integer(k.as_int());
      case Key::Kind::kStr:
        return w_.str(k.as_str());
      case Key::Kind::kSymbol:
        return symbol(k.as_str(), path);
      case Key::Kind::kTuple:
        if (k.items().size() > 3) w_.mark();
        for (const Key& item : k.items()) key(item, path);
        w_.tuple(k.items().size());
        return;
    }
  }

  void tuple(const Value& v, KeyPath& path) {
    const std::vector<Value>& items = v.as_tuple();
    if (!items.empty() && fetch(&items)) return;
    if (items.size() > 3) w_.mark();
    for (size_t i = 0; i < items.size(); ++i) {
      path.push_back(Key(static_cast<int64_t>(i)));
      value(items[i], path);
      path.pop_back();
    }
    const size_t memo = w_.tuple(items.size());
    if (!items.empty()) memo_[&items] = memo;
  }

  void list(const Value& v, KeyPath& path) {
    const List& l = *v.list();
    if (fetch(&l)) return;
    memo_[&l] = w_.empty_list();
    // pickle.py _batch_appends: batches of 1000, a batch of one as APPEND without a mark.
    for (size_t begin = 0; begin < l.size(); begin += kBatch) {
      const size_t n = std::min(kBatch, l.size() - begin);
      if (n > 1) w_.mark();
      for (size_t i = begin; i < begin + n; ++i) {
        path.push_back(Key(static_cast<int64_t>(i)));
        value(l.at(i), path);
        path.pop_back();
      }
      w_.appends(n);
    }
  }

  void dict(const Value& v, KeyPath& path) {
    const Dict& d = *v.dict();
    if (fetch(&d)) return;
    memo_[&d] = w_.empty_dict();
    std::vector<const Dict::Item*> items;
    for (const auto& item : d) items.push_back(&item);
    for (size_t begin = 0; begin < items.size(); begin += kBatch) {
      const size_t n = std::min(kBatch, items.size() - begin);
      if (n > 1) w_.mark();
      for (size_t i = begin; i < begin + n; ++i) {
        path.push_back(items[i]->first);
        key(items[i]->first, path);
        value(items[i]->second, path);
        path.pop_back();
      }
      w_.setitems(n);
    }
  }

  void int_tuple(c10::IntArrayRef values) {
    if (values.size() > 3) w_.mark();
    for (const int64_t x : values) w_.integer(x);
    w_.tuple(values.size());
  }

  void tensor(const at::Tensor& t, const KeyPath& path) {
    if (!t.defined()) return w_.none();
    if (fetch(t.unsafeGetTensorImpl())) return;
    if (t.dim() > static_cast<int64_t>(kTorchSaveDimsMax))
      fail(path, "a tensor over kTorchSaveDimsMax dims");
    const at::Storage& storage = t.storage();
    const size_t element_bytes = t.element_size();
    const int64_t storage_numel = static_cast<int64_t>(storage.nbytes() / element_bytes);
    std::string key;
    if (const auto it = storage_keys_.find(storage.unsafeGetStorageImpl());
        it != storage_keys_.end()) {
      key = it->second;
    } else {
      key = std::to_string(storage_keys_.size());
      storage_keys_.emplace(storage.unsafeGetStorageImpl(), key);
      // The whole storage, on the CPU, as bytes in the tensor's dtype.
      at::Tensor whole = at::empty({0}, t.options())
                             .set_(storage, 0, {storage_numel}, {1})
                             .to(at::kCPU)
                             .contiguous();
      storages_.emplace_back(key, whole);
    }
    w_.global("torch._utils", "_rebuild_tensor_v2");
    w_.mark();
    w_.mark();
    w_.str("storage");
    const auto [module, attr] = split_global(storage_class(t.scalar_type()));
    w_.global(module, attr);
    w_.str(key);
    w_.str("cpu");
    w_.integer(storage_numel);
    w_.tuple(5);
    w_.binpersid();
    w_.integer(t.storage_offset());
    int_tuple(t.sizes());
    int_tuple(t.strides());
    w_.boolean(false);  // requires_grad: state dicts hold detached tensors
    w_.global("collections", "OrderedDict");
    w_.tuple(0);
    w_.reduce();
    w_.memoize();
    w_.tuple(6);
    w_.reduce();
    memo_[t.unsafeGetTensorImpl()] = w_.memoize();
  }

  static constexpr size_t kBatch = 1000;  // pickle.py _BATCHSIZE

  const TorchSaveOptions& options_;
  PickleWriter w_{2};
  std::map<const void*, size_t> memo_;  // only looked up, never iterated
  std::map<const void*, std::string> storage_keys_;
  std::vector<std::pair<std::string, at::Tensor>> storages_;
};

}  // namespace

std::optional<std::string> class_global(const std::string& symbol) {
  constexpr std::string_view kOpen = "<class '";
  constexpr std::string_view kClose = "'>";
  if (!symbol.starts_with(kOpen) || !symbol.ends_with(kClose)) return std::nullopt;
  const std::string name =
      symbol.substr(kOpen.size(), symbol.size() - kOpen.size() - kClose.size());
  // A dotted path of identifiers with at least one dot.
  bool ok = name.find('.') != std::string::npos;
  bool at_start = true;
  for (const char c : name) {
    if (c == '.') {
      ok = ok && !at_start;
      at_start = true;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_' ||
               (!at_start && std::isdigit(static_cast<unsigned char>(c)))) {
      at_start = false;
    } else {
      ok = false;
    }
  }
  if (!ok || at_start) return std::nullopt;
  return name;
}

Result<std::vector<char>> torch_save(const Value& v, const TorchSaveOptions& options) {
  std::vector<char> pickle;
  std::vector<std::pair<std::string, at::Tensor>> storages;
  try {
    TorchSavePickler pickler(options);
    KeyPath path;
    pickler.value(v, path);
    pickle = pickler.finish();
    storages = pickler.storages();
  } catch (const SaveError& e) {
    return Status::invalid_input("torch_save: " + e.message);
  }
  std::vector<char> out;
  try {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
      const char* bytes = static_cast<const char*>(data);
      out.insert(out.end(), bytes, bytes + size);
      return size;
    });
    const auto record = [&](const std::string& name, std::string_view text) {
      writer.writeRecord(name, text.data(), text.size());
    };
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
    record(".format_version", "1");
    record(".storage_alignment", "64");
    record("byteorder", "little");
    for (const auto& [key, whole] : storages) {
      writer.writeRecord("data/" + key, whole.data_ptr(), whole.numel() * whole.element_size());
    }
    writer.writeEndOfFile();  // the "version" record
  } catch (const c10::Error& e) {
    CKPTSIM_CHECK(false, std::string("torch_save: libtorch's zip writer failed: ") +
                             e.what_without_backtrace());
  }
  return out;
}

}  // namespace ckptsim::model
