#include "model/torch/distributed_checkpoint.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "model/errors.h"
#include "model/py/key.h"
#include "model/py/pickle_tree.h"
#include "model/py/pickle_writer.h"
#include "model/py/value.h"
#include "model/torch/torch_save_format.h"

namespace ckptsim::model {

namespace {

using Kind = PickleNode::Kind;

const std::string kMetadataCls = "torch.distributed.checkpoint.metadata.Metadata";
const std::string kTensorCls = "torch.distributed.checkpoint.metadata.TensorStorageMetadata";
const std::string kBytesCls = "torch.distributed.checkpoint.metadata.BytesStorageMetadata";
const std::string kChunkCls = "torch.distributed.checkpoint.metadata.ChunkStorageMetadata";
const std::string kPropertiesCls = "torch.distributed.checkpoint.metadata.TensorProperties";
const std::string kIndexCls = "torch.distributed.checkpoint.metadata.MetadataIndex";
const std::string kStorageMetaCls = "torch.distributed.checkpoint.metadata.StorageMeta";
const std::string kMemFormatCls = "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING";
const std::string kStorageInfoCls = "torch.distributed.checkpoint.filesystem._StorageInfo";
const std::string kSizeCls = "torch.Size";
const std::string kLayoutCls = "torch.serialization._get_layout";

struct MetadataError {
  std::string message;
};

[[noreturn]] void fail(std::string message) { throw MetadataError{std::move(message)}; }

// "key 'name'": a key read from the file, quoted so that the message stays one line.
std::string key_name(const std::string& key) { return "key " + py_str_repr(key); }

std::string tuple_repr(const std::vector<int64_t>& v) {
  std::string out = "(";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + (v.size() == 1 ? ",)" : ")");
}

// Reads the dataclasses of metadata.py out of the pickle graph.
class MetadataParser {
 public:
  explicit MetadataParser(const PickleTree& tree) : t_(tree) {}

  DcpMetadata parse() {
    auto f =
        fields(t_.root, kMetadataCls,
               {"state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"});
    DcpMetadata out;
    if (f.contains("version") && t_.at(f["version"]).kind != Kind::kNone) {
      out.version = str(f["version"], "Metadata.version");
      if (*out.version != "1.0.0") {
        fail("Metadata.version " + py_str_repr(*out.version) + " is not 1.0.0");
      }
    }
    if (!f.contains("state_dict_metadata")) fail("Metadata without state_dict_metadata");
    if (!f.contains("storage_data")) fail("Metadata without storage_data");
    if (f.contains("storage_meta") && t_.at(f["storage_meta"]).kind != Kind::kNone) {
      auto sm = fields(f["storage_meta"], kStorageMetaCls,
                       {"checkpoint_id", "save_id", "load_id", "modules"});
      DcpStorageMeta meta;
      if (sm.contains("checkpoint_id") && t_.at(sm["checkpoint_id"]).kind == Kind::kStr) {
        meta.checkpoint_id = t_.at(sm["checkpoint_id"]).text;
      }
      if (sm.contains("save_id") && t_.at(sm["save_id"]).kind == Kind::kStr) {
        meta.save_id = t_.at(sm["save_id"]).text;
      }
      out.storage_meta = meta;
    }
    parse_state_dict_metadata(f["state_dict_metadata"], out);
    parse_storage_data(f["storage_data"], out);
    return out;
  }

 private:
  // A dataclass object: NEWOBJ(cls, ()) then BUILD with a dict of str field names.
  std::map<std::string, PickleNodeId> fields(PickleNodeId id, const std::string& cls,
                                             const std::set<std::string>& allowed) const {
    const PickleNode& n = object(id, cls);
    std::map<std::string, PickleNodeId> out;
    if (n.state == PickleNode::kNoState) return out;
    const PickleNode& state = t_.at(n.state);
    if (state.kind != Kind::kDict) fail(cls + " whose state is " + t_.describe(n.state));
    for (size_t i = 0; i + 1 < state.items.size(); i += 2) {
      const std::string name = str(state.items[i], cls + " field name");
      if (!allowed.contains(name)) fail(cls + " with an unknown field " + py_str_repr(name));
      if (!out.emplace(name, state.items[i + 1]).second) {
        fail(cls + " field " + py_str_repr(name) + " twice");
      }
    }
    return out;
  }

  const PickleNode& object(PickleNodeId id, const std::string& cls) const {
    const PickleNode& n = t_.at(id);
    if (n.kind != Kind::kObject || n.text != cls)
      fail("expected " + cls + ", found " + t_.describe(id));
    return n;
  }

  std::string str(PickleNodeId id, const std::string& what) const {
    if (t_.at(id).kind != Kind::kStr) fail(what + " is " + t_.describe(id) + ", not a str");
    return t_.at(id).text;
  }

  int64_t integer(PickleNodeId id, const std::string& what) const {
    if (t_.at(id).kind != Kind::kInt) fail(what + " is " + t_.describe(id) + ", not an int");
    if (t_.at(id).integer < 0) fail(what + " is negative");
    return t_.at(id).integer;
  }

  // torch.Size((d0, d1, ...)): REDUCE of the class with one tuple of ints.
  std::vector<int64_t> torch_size(PickleNodeId id, const std::string& what) const {
    const PickleNode& n = object(id, kSizeCls);
    const PickleNode& args = t_.at(n.items.at(0));
    if (n.state != PickleNode::kNoState || args.items.size() != 1 ||
        t_.at(args.items[0]).kind != Kind::kTuple) {
      fail(what + " is not torch.Size(tuple)");
    }
    const std::vector<PickleNodeId>& dims = t_.at(args.items[0]).items;
    if (dims.size() > kDcpDimsMax)
      fail(fmt::format("{} has over kDcpDimsMax={} dims", what, kDcpDimsMax));
    std::vector<int64_t> out;
    for (const PickleNodeId d : dims) out.push_back(integer(d, what));
    return out;
  }

  at::ScalarType properties_dtype(PickleNodeId id, const std::string& key) const;
  TensorStorageMetadata tensor_metadata(PickleNodeId id, const std::string& key) const;
  void parse_state_dict_metadata(PickleNodeId id, DcpMetadata& out) const;
  void parse_storage_data(PickleNodeId id, DcpMetadata& out) const;
  MetadataIndex metadata_index(PickleNodeId id) const;
  StorageInfo storage_info(PickleNodeId id, const std::string& key) const;

  const PickleTree& t_;
};

// TensorProperties pickles its state as the tuple (dtype, layout, requires_grad,
// memory_format, pin_memory) (its __getstate__); only the dtype still means anything.
at::ScalarType MetadataParser::properties_dtype(PickleNodeId id, const std::string& key) const {
  const PickleNode& n = object(id, kPropertiesCls);
  const std::string what = key_name(key) + ": TensorProperties";
  if (n.state == PickleNode::kNoState || t_.at(n.state).kind != Kind::kTuple ||
      t_.at(n.state).items.size() != 5) {
    fail(what + " whose state is not (dtype, layout, requires_grad, memory_format, pin_memory)");
  }
  const std::vector<PickleNodeId>& s = t_.at(n.state).items;
  const PickleNode& dtype = t_.at(s[0]);
  if (dtype.kind != Kind::kGlobal || !dtype_from_global(dtype.text)) {
    fail(what + " with dtype " + t_.describe(s[0]));
  }
  const PickleNode& layout = object(s[1], kLayoutCls);
  const PickleNode& layout_args = t_.at(layout.items.at(0));
  if (layout_args.items.size() != 1 || t_.at(layout_args.items[0]).text != "torch.strided") {
    fail(what + " with a layout other than torch.strided");
  }
  object(s[3], kMemFormatCls);
  return *dtype_from_global(dtype.text);
}

TensorStorageMetadata MetadataParser::tensor_metadata(PickleNodeId id,
                                                      const std::string& key) const {
  auto f = fields(id, kTensorCls, {"properties", "size", "chunks"});
  if (f.size() != 3) fail(key_name(key) + ": TensorStorageMetadata without all its fields");
  TensorStorageMetadata out;
  out.dtype = properties_dtype(f["properties"], key);
  out.size = torch_size(f["size"], key_name(key) + ": size");
  __int128 numel = 1;
  for (const int64_t d : out.size) numel = std::min<__int128>(numel * d, kDcpTensorNumelMax + 1);
  if (numel > kDcpTensorNumelMax) fail(key_name(key) + ": over kDcpTensorNumelMax elements");
  const PickleNode& chunks = t_.at(f["chunks"]);
  if (chunks.kind != Kind::kList) fail(key_name(key) + ": chunks is not a list");
  if (chunks.items.size() > kDcpChunksMax) fail(key_name(key) + ": over kDcpChunksMax chunks");
  for (const PickleNodeId c : chunks.items) {
    auto cf = fields(c, kChunkCls, {"offsets", "sizes"});
    if (cf.size() != 2) fail(key_name(key) + ": a chunk without offsets and sizes");
    ChunkStorageMetadata chunk{torch_size(cf["offsets"], key_name(key) + ": chunk offsets"),
                               torch_size(cf["sizes"], key_name(key) + ": chunk sizes")};
    bool inside = chunk.offsets.size() == out.size.size() && chunk.sizes.size() == out.size.size();
    for (size_t d = 0; inside && d < out.size.size(); ++d) {
      inside = chunk.offsets[d] <= out.size[d] && chunk.sizes[d] <= out.size[d] - chunk.offsets[d];
    }
    if (!inside) {
      fail(fmt::format("{}: chunk at {} of size {} outside the tensor's {}", key_name(key),
                       tuple_repr(chunk.offsets), tuple_repr(chunk.sizes), tuple_repr(out.size)));
    }
    out.chunks.push_back(std::move(chunk));
  }
  return out;
}

void MetadataParser::parse_state_dict_metadata(PickleNodeId id, DcpMetadata& out) const {
  const PickleNode& d = t_.at(id);
  if (d.kind != Kind::kDict) fail("state_dict_metadata is " + t_.describe(id));
  if (d.items.size() / 2 > kDcpKeysMax) fail("state_dict_metadata has over kDcpKeysMax keys");
  for (size_t i = 0; i + 1 < d.items.size(); i += 2) {
    const std::string key = str(d.items[i], "a state_dict_metadata key");
    if (out.tensors.contains(key) || out.bytes_items.contains(key)) fail(key_name(key) + " twice");
    out.key_order.push_back(key);
    const PickleNode& v = t_.at(d.items[i + 1]);
    if (v.kind == Kind::kObject && v.text == kBytesCls) {
      fields(d.items[i + 1], kBytesCls, {});
      out.bytes_items.insert(key);
    } else {
      out.tensors.emplace(key, tensor_metadata(d.items[i + 1], key));
    }
  }
}

MetadataIndex MetadataParser::metadata_index(PickleNodeId id) const {
  auto f = fields(id, kIndexCls, {"fqn", "offset", "index"});
  if (!f.contains("fqn")) fail("a MetadataIndex without fqn");
  MetadataIndex out{str(f["fqn"], "MetadataIndex.fqn"), std::nullopt, std::nullopt};
  const std::string what = key_name(out.fqn) + ": MetadataIndex";
  if (f.contains("offset") && t_.at(f["offset"]).kind != Kind::kNone) {
    out.offset = torch_size(f["offset"], what + ".offset");
  }
  if (f.contains("index") && t_.at(f["index"]).kind != Kind::kNone) {
    out.index = integer(f["index"], what + ".index");
  }
  return out;
}

StorageInfo MetadataParser::storage_info(PickleNodeId id, const std::string& key) const {
  auto f =
      fields(id, kStorageInfoCls, {"relative_path", "offset", "length", "transform_descriptors"});
  const std::string what = key_name(key) + ": _StorageInfo";
  if (!f.contains("relative_path") || !f.contains("offset") || !f.contains("length")) {
    fail(what + " without relative_path, offset and length");
  }
  if (f.contains("transform_descriptors")) {
    const PickleNode& td = t_.at(f["transform_descriptors"]);
    if (td.kind != Kind::kNone &&
        !((td.kind == Kind::kList || td.kind == Kind::kTuple) && td.items.empty())) {
      fail(what + " with transform descriptors (transformed items are not supported)");
    }
  }
  StorageInfo out{str(f["relative_path"], what + ".relative_path"),
                  integer(f["offset"], what + ".offset"), integer(f["length"], what + ".length")};
  const std::string& p = out.relative_path;
  const bool control = std::any_of(p.begin(), p.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) == 0x7f;
  });
  if (p.empty() || p == "." || p == ".." || p.find('/') != std::string::npos || control) {
    fail(what + " names the file " + py_str_repr(p) + ", not a file of the checkpoint directory");
  }
  return out;
}

void MetadataParser::parse_storage_data(PickleNodeId id, DcpMetadata& out) const {
  const PickleNode& d = t_.at(id);
  if (d.kind != Kind::kDict) fail("storage_data is " + t_.describe(id));
  for (size_t i = 0; i + 1 < d.items.size(); i += 2) {
    StorageDataEntry e{metadata_index(d.items[i]), {}};
    e.info = storage_info(d.items[i + 1], e.index.fqn);
    const std::string& fqn = e.index.fqn;
    const auto tensor = out.tensors.find(fqn);
    if (tensor == out.tensors.end() && !out.bytes_items.contains(fqn)) {
      fail("storage_data names " + key_name(fqn) + ", which state_dict_metadata lacks");
    }
    const bool chunk_known =
        tensor != out.tensors.end() && e.index.offset &&
        std::any_of(tensor->second.chunks.begin(), tensor->second.chunks.end(),
                    [&](const ChunkStorageMetadata& c) { return c.offsets == *e.index.offset; });
    if (tensor != out.tensors.end() ? !chunk_known : e.index.offset.has_value()) {
      fail("storage_data item of " + key_name(fqn) + " at no chunk of its metadata");
    }
    if (out.find(fqn, e.index.offset) != nullptr)
      fail(key_name(fqn) + " saved twice at one offset");
    out.storage_data.push_back(std::move(e));
  }
  for (const auto& [fqn, meta] : out.tensors) {
    for (const ChunkStorageMetadata& c : meta.chunks) {
      if (out.find(fqn, c.offsets) == nullptr) {
        fail(key_name(fqn) + ": chunk at " + tuple_repr(c.offsets) + " has no storage_data item");
      }
    }
  }
  for (const std::string& fqn : out.bytes_items) {
    if (out.find(fqn, std::nullopt) == nullptr) fail(key_name(fqn) + " has no storage_data item");
  }
}

}  // namespace

const StorageInfo* DcpMetadata::find(const std::string& fqn,
                                     const std::optional<std::vector<int64_t>>& offset) const {
  for (const StorageDataEntry& e : storage_data) {
    if (e.index.fqn == fqn && e.index.offset == offset) return &e.info;
  }
  return nullptr;
}

const std::set<std::string>& dcp_metadata_globals() {
  static const std::set<std::string> globals = [] {
    std::set<std::string> g = {kMetadataCls,    kTensorCls, kBytesCls,       kChunkCls,
                               kPropertiesCls,  kIndexCls,  kStorageMetaCls, kMemFormatCls,
                               kStorageInfoCls, kSizeCls,   kLayoutCls};
    for (const std::string& name : torch_save_globals()) {
      if (dtype_from_global(name)) g.insert(name);
    }
    return g;
  }();
  return globals;
}

Result<DcpMetadata> parse_dcp_metadata(std::span<const char> bytes, const std::string& file) {
  Result<PickleTree> tree = read_pickle_tree(bytes, PickleTreeOptions{dcp_metadata_globals()});
  if (!tree.is_ok()) return Status::corruption(file + ": " + tree.status().message());
  try {
    return MetadataParser(tree.value()).parse();
  } catch (const MetadataError& e) {
    return Status::corruption(file + ": " + e.message);
  } catch (const std::out_of_range& e) {
    return Status::corruption(file + ": an object without the arguments its class takes");
  }
}

DcpReader::DcpReader(const Storage& storage, std::string dir)
    : storage_(storage), dir_(std::move(dir)) {}

std::string DcpReader::path(const std::string& name) const {
  return dir_.empty() ? name : dir_ + "/" + name;
}

Status DcpReader::open() {
  const std::string file = path(std::string(kDcpMetadataFile));
  Result<std::vector<char>> bytes = storage_.read_file(file);
  if (!bytes.is_ok()) {
    if (bytes.status().code() == Status::Code::kNotFound) {
      return Status::not_found(file + ": no .metadata, so this is no torch_dist checkpoint");
    }
    return bytes.status();
  }
  Result<DcpMetadata> parsed = parse_dcp_metadata(bytes.value(), file);
  if (!parsed.is_ok()) return parsed.status();
  metadata_ = std::move(parsed.value());
  return Status::ok();
}

Result<std::span<const char>> DcpReader::read_item(const std::string& fqn,
                                                   const StorageInfo& info) {
  const std::string file = path(info.relative_path);
  auto it = files_.find(file);
  if (it == files_.end()) {
    Result<std::vector<char>> bytes = storage_.read_file(file);
    if (!bytes.is_ok()) {
      return Status::corruption(fmt::format("{}: {}: cannot read its data file: {}", file,
                                            key_name(fqn), bytes.status().to_string()));
    }
    it = files_.emplace(file, std::move(bytes.value())).first;
  }
  const std::vector<char>& bytes = it->second;
  if (uint64_t(info.offset) > bytes.size() || uint64_t(info.length) > bytes.size() - info.offset) {
    return Status::corruption(
        fmt::format("{}: {}: item at offset {} of length {} past the end of the file ({} bytes)",
                    file, key_name(fqn), info.offset, info.length, bytes.size()));
  }
  return std::span<const char>(bytes).subspan(info.offset, info.length);
}

Status DcpReader::place_chunk(const std::string& fqn, const ChunkStorageMetadata& chunk,
                              const at::Tensor& piece, at::Tensor& full, at::Tensor& covered,
                              const std::string& file) {
  const std::string where =
      fmt::format("{}: {} chunk at {}", file, key_name(fqn), tuple_repr(chunk.offsets));
  if (piece.scalar_type() != full.scalar_type()) {
    return Status::corruption(fmt::format("{}: holds a tensor of {} where .metadata says {}", where,
                                          c10::toString(piece.scalar_type()),
                                          c10::toString(full.scalar_type())));
  }
  if (piece.sizes().vec() != chunk.sizes) {
    return Status::corruption(fmt::format("{}: holds a tensor of shape {} where .metadata says {}",
                                          where, tuple_repr(piece.sizes().vec()),
                                          tuple_repr(chunk.sizes)));
  }
  at::Tensor target = full;
  at::Tensor mask = covered;
  for (size_t d = 0; d < chunk.sizes.size(); ++d) {
    const auto dim = static_cast<int64_t>(d);
    target = target.narrow(dim, chunk.offsets[d], chunk.sizes[d]);
    mask = mask.narrow(dim, chunk.offsets[d], chunk.sizes[d]);
  }
  if (mask.any().item<bool>()) {
    return Status::corruption(where + ": overlaps another chunk of the key");
  }
  target.copy_(piece);
  mask.fill_(true);
  return Status::ok();
}

// Nothing is allocated for more than the data files hold: a chunk's item is a torch.save blob
// of at least its elements' bytes, so a tensor whose size needs more bytes than its items hold
// together is damaged (and a forged size would otherwise allocate gigabytes). The items are
// bounds-checked against their files first (read_item).
Status DcpReader::fits_its_items(const std::string& fqn, const TensorStorageMetadata& meta) {
  int64_t items = 0;
  for (const ChunkStorageMetadata& chunk : meta.chunks) {
    const StorageInfo* info = metadata_.find(fqn, chunk.offsets);
    Result<std::span<const char>> bytes = read_item(fqn, *info);
    if (!bytes.is_ok() && zero_filled_.contains(info->relative_path)) {
      // A lost chunk read as zeros counts its own elements (parse bounded them).
      int64_t chunk_numel = 1;
      for (const int64_t d : chunk.sizes) chunk_numel *= d;
      items += chunk_numel * static_cast<int64_t>(c10::elementSize(meta.dtype));
      continue;
    }
    if (!bytes.is_ok()) return bytes.status();
    items += static_cast<int64_t>(bytes.value().size());  // each within a file held in memory
  }
  int64_t numel = 1;  // parse bounded it by kDcpTensorNumelMax
  for (const int64_t d : meta.size) numel *= d;
  const int64_t needed = numel * static_cast<int64_t>(c10::elementSize(meta.dtype));
  if (needed <= items) return Status::ok();
  return Status::corruption(fmt::format("{}: {}: its size {} needs {} bytes, its chunks hold {}",
                                        path(std::string(kDcpMetadataFile)), key_name(fqn),
                                        tuple_repr(meta.size), needed, items));
}

Result<at::Tensor> DcpReader::read_tensor(const std::string& fqn) {
  const auto meta = metadata_.tensors.find(fqn);
  if (meta == metadata_.tensors.end()) {
    return Status::not_found(path(std::string(kDcpMetadataFile)) + ": no tensor " + key_name(fqn));
  }
  Status fits = fits_its_items(fqn, meta->second);
  if (!fits.is_ok()) return fits;
  at::Tensor full = at::empty(meta->second.size, at::TensorOptions().dtype(meta->second.dtype));
  at::Tensor covered = at::zeros(meta->second.size, at::TensorOptions().dtype(at::kBool));
  for (const ChunkStorageMetadata& chunk : meta->second.chunks) {
    const StorageInfo* info = metadata_.find(fqn, chunk.offsets);  // parse checked it exists
    Result<std::span<const char>> bytes = read_item(fqn, *info);
    const std::string file = path(info->relative_path);
    Result<Value> piece = bytes.is_ok() ? load_torch_save(bytes.value()) : bytes.status();
    if (!piece.is_ok() && zero_filled_.contains(info->relative_path)) {
      piece = Value(at::zeros(chunk.sizes, at::TensorOptions().dtype(meta->second.dtype)));
    }
    if (!bytes.is_ok() && !piece.is_ok()) return bytes.status();
    if (!piece.is_ok() || !piece.value().is_tensor()) {
      return Status::corruption(
          fmt::format("{}: {} chunk at {}: {}", file, key_name(fqn), tuple_repr(chunk.offsets),
                      piece.is_ok() ? "holds a " + piece.value().type_name() + ", not a tensor"
                                    : piece.status().message()));
    }
    Status placed = place_chunk(fqn, chunk, piece.value().tensor(), full, covered, file);
    if (!placed.is_ok()) return placed;
  }
  const int64_t missing = covered.numel() - covered.sum().item<int64_t>();
  if (missing != 0) {
    return Status::corruption(fmt::format("{}: {}: its chunks leave {} of {} elements uncovered",
                                          path(std::string(kDcpMetadataFile)), key_name(fqn),
                                          missing, covered.numel()));
  }
  return full;
}

Result<std::vector<char>> DcpReader::read_bytes(const std::string& fqn) {
  const StorageInfo* info =
      metadata_.bytes_items.contains(fqn) ? metadata_.find(fqn, std::nullopt) : nullptr;
  if (info == nullptr) {
    return Status::not_found(path(std::string(kDcpMetadataFile)) + ": no bytes " + key_name(fqn));
  }
  Result<std::span<const char>> bytes = read_item(fqn, *info);
  if (!bytes.is_ok()) return bytes.status();
  return std::vector<char>(bytes.value().begin(), bytes.value().end());
}

}  // namespace ckptsim::model

// ---- write side ------------------------------------------------------------------------------

namespace ckptsim::model {

namespace {

std::pair<std::string, std::string> split_dotted(const std::string& dotted) {
  const size_t dot = dotted.rfind('.');
  CKPTSIM_CHECK(dot != std::string::npos, "'" + dotted + "' is no module.name");
  return {dotted.substr(0, dot), dotted.substr(dot + 1)};
}

// Writes metadata.py's dataclasses as pickle.dump(metadata) does (protocol 4): a dataclass is
// NEWOBJ(cls, ()) then BUILD with the dict of the fields it set, TensorProperties BUILDs the
// tuple of its __getstate__, torch.Size and the enum are REDUCEs.
class MetadataPickler {
 public:
  std::vector<char> pickle(const DcpMetadata& m) {
    object_begin(kMetadataCls);
    dict_begin(5);
    w_.str("state_dict_metadata");
    state_dict_metadata(m);
    w_.str("planner_data");
    w_.none();
    w_.str("storage_data");
    storage_data(m);
    w_.str("storage_meta");
    storage_meta(m.storage_meta.value_or(DcpStorageMeta{}));
    w_.str("version");
    if (m.version) {
      w_.str(*m.version);
    } else {
      w_.none();
    }
    dict_end(5);
    w_.build();
    return w_.finish();
  }

 private:
  void global(const std::string& dotted) {
    const auto [module, name] = split_dotted(dotted);
    w_.global(module, name);
  }

  void object_begin(const std::string& cls) {
    global(cls);
    w_.tuple(0);
    w_.newobj();
    w_.memoize();
  }

  // A dict of `n` items: its items go between dict_begin and dict_end (batches of 1000, as
  // pickle.py _batch_setitems; callers here write at most a handful except the two big ones,
  // which batch themselves through batched()).
  void dict_begin(size_t n) {
    w_.empty_dict();
    if (n > 1) w_.mark();
  }
  void dict_end(size_t n) { w_.setitems(n); }

  // Writes items [0, n) of a dict or list through `each`, batched as pickle.py batches them.
  template <typename F>
  void batched(size_t n, bool is_dict, F each) {
    constexpr size_t kBatch = 1000;
    for (size_t begin = 0; begin < n; begin += kBatch) {
      const size_t count = std::min(kBatch, n - begin);
      if (count > 1) w_.mark();
      for (size_t i = begin; i < begin + count; ++i) each(i);
      if (is_dict) {
        w_.setitems(count);
      } else {
        w_.appends(count);
      }
    }
  }

  void torch_size(const std::vector<int64_t>& dims) {
    global(kSizeCls);
    if (dims.size() > 3) w_.mark();
    for (const int64_t d : dims) w_.integer(d);
    w_.tuple(dims.size());
    w_.tuple(1);
    w_.reduce();
    w_.memoize();
  }

  void properties(at::ScalarType dtype) {
    object_begin(kPropertiesCls);
    w_.mark();
    const std::string name = "torch." + dtype_global_name(dtype);
    global(name);
    // torch.strided and the contiguous-format member are one object each in Python: the
    // pickler writes them once and fetches them afterwards.
    if (layout_memo_) {
      w_.get(*layout_memo_);
    } else {
      global(kLayoutCls);
      w_.str("torch.strided");
      w_.tuple(1);
      w_.reduce();
      layout_memo_ = w_.memoize();
    }
    w_.boolean(false);  // requires_grad
    if (memory_format_memo_) {
      w_.get(*memory_format_memo_);
    } else {
      global(kMemFormatCls);
      w_.integer(0);  // TORCH_CONTIGUOUS_FORMAT
      w_.tuple(1);
      w_.reduce();
      memory_format_memo_ = w_.memoize();
    }
    w_.boolean(false);  // pin_memory
    w_.tuple(5);
    w_.build();
  }

  void tensor_metadata(const TensorStorageMetadata& t) {
    object_begin(kTensorCls);
    dict_begin(3);
    w_.str("properties");
    properties(t.dtype);
    w_.str("size");
    torch_size(t.size);
    w_.str("chunks");
    w_.empty_list();
    batched(t.chunks.size(), false, [&](size_t i) {
      object_begin(kChunkCls);
      dict_begin(2);
      w_.str("offsets");
      torch_size(t.chunks[i].offsets);
      w_.str("sizes");
      torch_size(t.chunks[i].sizes);
      dict_end(2);
      w_.build();
    });
    dict_end(3);
    w_.build();
  }

  void state_dict_metadata(const DcpMetadata& m) {
    std::vector<std::string> keys = m.key_order;
    if (keys.empty()) {
      for (const auto& [fqn, t] : m.tensors) keys.push_back(fqn);
      keys.insert(keys.end(), m.bytes_items.begin(), m.bytes_items.end());
    }
    CKPTSIM_CHECK(keys.size() == m.tensors.size() + m.bytes_items.size() &&
                      std::set<std::string>(keys.begin(), keys.end()).size() == keys.size(),
                  "serialize_dcp_metadata: key_order does not name every key once");
    w_.empty_dict();
    batched(keys.size(), true, [&](size_t i) {
      w_.str(keys[i]);
      if (const auto t = m.tensors.find(keys[i]); t != m.tensors.end()) {
        tensor_metadata(t->second);
      } else {
        CKPTSIM_CHECK(m.bytes_items.contains(keys[i]), "key_order names an unknown key");
        object_begin(kBytesCls);  // no fields: no BUILD
      }
    });
  }

  void storage_data(const DcpMetadata& m) {
    w_.empty_dict();
    batched(m.storage_data.size(), true, [&](size_t i) {
      const StorageDataEntry& e = m.storage_data[i];
      // MetadataIndex.__init__ sets fqn, then index, then offset only when there is one.
      object_begin(kIndexCls);
      const size_t fields = e.index.offset ? 3 : 2;
      dict_begin(fields);
      w_.str("fqn");
      w_.str(e.index.fqn);
      w_.str("index");
      if (e.index.index) {
        w_.integer(*e.index.index);
      } else {
        w_.none();
      }
      if (e.index.offset) {
        w_.str("offset");
        torch_size(*e.index.offset);
      }
      dict_end(fields);
      w_.build();
      object_begin(kStorageInfoCls);
      dict_begin(3);
      w_.str("relative_path");
      w_.str(e.info.relative_path);
      w_.str("offset");
      w_.integer(e.info.offset);
      w_.str("length");
      w_.integer(e.info.length);
      dict_end(3);
      w_.build();
    });
  }

  void storage_meta(const DcpStorageMeta& s) {
    object_begin(kStorageMetaCls);
    dict_begin(4);
    w_.str("checkpoint_id");
    if (s.checkpoint_id) {
      w_.str(*s.checkpoint_id);
    } else {
      w_.none();
    }
    w_.str("save_id");
    if (s.save_id) {
      w_.str(*s.save_id);
    } else {
      w_.none();
    }
    w_.str("load_id");
    w_.none();
    w_.str("modules");
    w_.empty_list();
    dict_end(4);
    w_.build();
  }

  static std::string dtype_global_name(at::ScalarType dtype) {
    for (const char* d : {"float32", "bfloat16", "float16", "float64", "int64", "int32", "int16",
                          "int8", "uint8", "bool"}) {
      const std::string name = std::string("torch.") + d;
      if (dtype_from_global(name) == dtype) return d;
    }
    CKPTSIM_CHECK(false, std::string("serialize_dcp_metadata: no torch global for dtype ") +
                             c10::toString(dtype));
  }

  PickleWriter w_{4};
  std::optional<size_t> layout_memo_;
  std::optional<size_t> memory_format_memo_;
};

uint64_t fnv1a64(std::span<const char> bytes, uint64_t h) {
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

// A uuid4-shaped id from the data files' bytes (invariant 3).
std::string content_uuid(const std::vector<std::vector<char>>& files) {
  uint64_t a = 0xcbf29ce484222325ULL;
  uint64_t b = 0x84222325cbf29ce4ULL;
  for (const auto& f : files) {
    a = fnv1a64(f, a);
    b = fnv1a64(f, b ^ a);
  }
  const std::string hex = fmt::format("{:016x}{:016x}", a, b);
  // xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx (version 4, variant 10xx)
  const char variant = "89ab"[std::stoi(hex.substr(16, 1), nullptr, 16) & 3];
  return hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-4" + hex.substr(13, 3) + "-" + variant +
         hex.substr(17, 3) + "-" + hex.substr(20, 12);
}

}  // namespace

std::string dcp_data_file(int64_t rank) { return fmt::format("__{}_0.distcp", rank); }

std::vector<char> serialize_dcp_metadata(const DcpMetadata& metadata) {
  return MetadataPickler().pickle(metadata);
}

namespace {

// The chunk checked (data, inside its tensor) and its key's TensorStorageMetadata made or checked
// to agree (dtype, global size); the chunk itself is not yet added.
Status add_chunk_metadata(const DcpChunkToWrite& chunk, const std::string& where,
                          DcpMetadata& meta) {
  if (!chunk.data.defined()) return Status::invalid_input(where + ": no data");
  const std::vector<int64_t> sizes = chunk.data.sizes().vec();
  const size_t dims = chunk.global_size.size();
  bool inside =
      dims > 0 && dims <= kDcpDimsMax && sizes.size() == dims && chunk.offsets.size() == dims;
  for (size_t d = 0; inside && d < dims; ++d) {
    inside = chunk.offsets[d] >= 0 && sizes[d] >= 0 && chunk.offsets[d] <= chunk.global_size[d] &&
             sizes[d] <= chunk.global_size[d] - chunk.offsets[d];
  }
  if (!inside) {
    return Status::invalid_input(fmt::format("{}: of size {} outside the tensor's {}", where,
                                             tuple_repr(sizes), tuple_repr(chunk.global_size)));
  }
  auto [it, fresh] = meta.tensors.try_emplace(chunk.fqn);
  TensorStorageMetadata& t = it->second;
  if (fresh) {
    t.dtype = chunk.data.scalar_type();
    t.size = chunk.global_size;
  } else if (t.dtype != chunk.data.scalar_type() || t.size != chunk.global_size) {
    return Status::invalid_input(
        fmt::format("{}: dtype {} and size {} where an earlier chunk has {} and {}", where,
                    c10::toString(chunk.data.scalar_type()), tuple_repr(chunk.global_size),
                    c10::toString(t.dtype), tuple_repr(t.size)));
  }
  return Status::ok();
}

}  // namespace

Result<DcpMetadata> write_dcp_checkpoint(Storage& storage, const std::string& dir,
                                         const std::vector<DcpRankToWrite>& ranks,
                                         const DcpWriteOptions& options) {
  const auto path = [&](const std::string& name) { return dir.empty() ? name : dir + "/" + name; };
  DcpMetadata meta;
  meta.version = "1.0.0";
  std::vector<std::pair<std::string, std::vector<char>>> files;
  const auto note_key = [&](const std::string& fqn) {
    if (std::find(meta.key_order.begin(), meta.key_order.end(), fqn) == meta.key_order.end()) {
      meta.key_order.push_back(fqn);
    }
  };
  for (size_t r = 0; r < ranks.size(); ++r) {
    const DcpRankToWrite& rank = ranks[r];
    CKPTSIM_CHECK(rank.rank >= 0 && (r == 0 || rank.rank > ranks[r - 1].rank),
                  "write_dcp_checkpoint: ranks not in increasing order");
    if (rank.bytes_items.empty() && rank.chunks.empty()) continue;
    const std::string file = dcp_data_file(rank.rank);
    std::vector<char> data;
    const auto add = [&](MetadataIndex index, std::span<const char> bytes) {
      meta.storage_data.push_back(
          {std::move(index), StorageInfo{file, static_cast<int64_t>(data.size()),
                                         static_cast<int64_t>(bytes.size())}});
      data.insert(data.end(), bytes.begin(), bytes.end());
    };
    for (const DcpBytesToWrite& item : rank.bytes_items) {
      if (meta.tensors.contains(item.fqn) || !meta.bytes_items.insert(item.fqn).second) {
        return Status::invalid_input("write_dcp_checkpoint: key '" + item.fqn +
                                     "' written twice, or as bytes and as a tensor");
      }
      note_key(item.fqn);
      add(MetadataIndex{item.fqn, std::nullopt, std::nullopt}, item.bytes);
    }
    for (const DcpChunkToWrite& chunk : rank.chunks) {
      const std::string where = fmt::format("write_dcp_checkpoint: key '{}' chunk at {} (rank {})",
                                            chunk.fqn, tuple_repr(chunk.offsets), rank.rank);
      if (meta.bytes_items.contains(chunk.fqn)) {
        return Status::invalid_input(where + ": the key is also a bytes item");
      }
      if (Status st = add_chunk_metadata(chunk, where, meta); !st.is_ok()) return st;
      TensorStorageMetadata& t = meta.tensors.at(chunk.fqn);
      const std::vector<int64_t> sizes = chunk.data.sizes().vec();
      if (meta.find(chunk.fqn, chunk.offsets) != nullptr) {
        return Status::invalid_input(where + ": written twice");
      }
      note_key(chunk.fqn);
      t.chunks.push_back(ChunkStorageMetadata{chunk.offsets, sizes});
      // filesystem.py saves a tensor that owns exactly its elements.
      const at::Tensor own = chunk.data.to(at::kCPU).clone(at::MemoryFormat::Contiguous);
      Result<std::vector<char>> blob = torch_save(Value(own));
      if (!blob.is_ok()) return Status::invalid_input(where + ": " + blob.status().message());
      add(MetadataIndex{chunk.fqn, chunk.offsets, static_cast<int64_t>(t.chunks.size() - 1)},
          blob.value());
    }
    files.emplace_back(file, std::move(data));
  }
  std::vector<std::vector<char>> contents;
  for (const auto& [file, data] : files) contents.push_back(data);
  meta.storage_meta = DcpStorageMeta{options.checkpoint_id, content_uuid(contents)};
  for (const auto& [file, data] : files) {
    if (Status s = storage.write_file(path(file), data); !s.is_ok()) return s;
  }
  const std::vector<char> bytes = serialize_dcp_metadata(meta);
  if (Status s = storage.write_file(path(std::string(kDcpMetadataFile)), bytes); !s.is_ok()) {
    return s;
  }
  return meta;
}

}  // namespace ckptsim::model
