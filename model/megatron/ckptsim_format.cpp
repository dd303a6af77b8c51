#include "model/megatron/ckptsim_format.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include "model/errors.h"
#include "model/fnv1a.h"
#include "model/megatron/checkpoint_caches.h"
#include "model/megatron/dict_utils.h"
#include "model/py/host_tensor.h"
#include "model/py/pickle_codec.h"

namespace ckptsim::model {

namespace own_format {

namespace {

using nlohmann::json;

// Every piece's bytes in a shard file follow a header of its own (metadata.json's
// "piece_header_bytes"; a checkpoint without that member has none): the magic, then FNV-1a over
// the piece's key, dtype and place. DCP's items are framed too (each tensor item a torch.save
// archive), and a reader that meets another save's bytes at a piece's offset fails loudly
// (seen on the real code: UnpicklingError inside the load's CheckpointException); the header is
// how the model's reader sees the same (fidelity audit N5).
constexpr char kPieceMagic[8] = {'c', 'k', 'p', 't', 'p', 'i', 'e', 'c'};
constexpr size_t kPieceHeaderBytes = 16;

uint64_t piece_tag(const SavedPiece& p) {
  uint64_t h = fnv1a(p.key.c_str(), p.key.size() + 1);  // with the terminating zeros
  h = fnv1a(p.dtype.c_str(), p.dtype.size() + 1, h);
  for (const int64_t v : {p.global_numel, p.global_offset, p.numel}) {
    std::array<unsigned char, 8> le{};
    for (size_t i = 0; i < le.size(); ++i) le[i] = (static_cast<uint64_t>(v) >> (8 * i)) & 0xff;
    h = fnv1a(le.data(), le.size(), h);
  }
  return h;
}

// "" when p's header stands right before its bytes in `file`, else what stands there.
// REQUIRES: piece_problem(p, file.size()) is "".
std::string header_problem(const SavedPiece& p, const std::vector<char>& file) {
  if (p.byte_offset < static_cast<int64_t>(kPieceHeaderBytes)) {
    return fmt::format("no room for the piece's header before byte {}", p.byte_offset);
  }
  const char* at = file.data() + p.byte_offset - kPieceHeaderBytes;
  uint64_t tag = 0;
  for (int i = 0; i < 8; ++i) tag |= uint64_t{static_cast<unsigned char>(at[8 + i])} << (8 * i);
  if (!std::equal(std::begin(kPieceMagic), std::end(kPieceMagic), at) || tag != piece_tag(p)) {
    return fmt::format(
        "the bytes at offset {} are not this piece (another save's bytes under this "
        "metadata.json)",
        p.byte_offset - static_cast<int64_t>(kPieceHeaderBytes));
  }
  return "";
}

// A JSON string as nlohmann::json's dump() writes it: printable ASCII without '"' or '\' as it is,
// anything else through nlohmann itself (its escapes, and its type_error on invalid UTF-8).
void append_json_string(std::string& out, const std::string& s) {
  const bool plain = std::all_of(
      s.begin(), s.end(), [](char c) { return c >= 0x20 && c <= 0x7e && c != '"' && c != '\\'; });
  if (!plain) {
    out += json(s).dump();
    return;
  }
  out += '"';
  out += s;
  out += '"';
}

// One object of metadata.json's arrays, at indent `level` (dump(1): one space per level),
// its members given in nlohmann's (sorted) key order.
template <typename WriteMembers>
void append_json_object(std::string& out, int level, WriteMembers&& members) {
  const std::string inner(static_cast<size_t>(level) + 1, ' ');
  out += "{\n";
  bool first = true;
  auto member = [&](const char* name) {
    if (!first) out += ",\n";
    first = false;
    out += inner;
    out += '"';
    out += name;
    out += "\": ";
  };
  members(member);
  out += '\n';
  out.append(static_cast<size_t>(level), ' ');
  out += '}';
}

Result<SavedPiece> piece_from_json(const json& j) {
  try {
    SavedPiece p;
    p.key = j.at("key").get<std::string>();
    p.dtype = j.at("dtype").get<std::string>();
    p.global_numel = j.at("global_numel").get<int64_t>();
    p.global_offset = j.at("global_offset").get<int64_t>();
    p.numel = j.at("numel").get<int64_t>();
    p.rank = j.at("rank").get<int>();
    p.file = j.at("file").get<std::string>();
    p.byte_offset = j.at("byte_offset").get<int64_t>();
    return p;
  } catch (const json::exception& e) {
    return Status::corruption(std::string(kMetadataFile) + ": bad piece entry: " + e.what());
  }
}

std::vector<char> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }

class EntryWriter {
 public:
  void i64(int64_t v) { put(&v, sizeof v); }
  void str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    put(s.data(), s.size());
  }
  std::vector<char> take() { return std::move(out_); }

 private:
  void put(const void* p, size_t n) {
    const auto* c = static_cast<const char*>(p);
    out_.insert(out_.end(), c, c + n);
  }
  std::vector<char> out_;
};

class EntryReader {
 public:
  explicit EntryReader(const std::vector<char>& in) : in_(in) {}
  int64_t i64() {
    int64_t v = 0;
    get(&v, sizeof v);
    return v;
  }
  std::string str() {
    const int64_t n = i64();
    CKPTSIM_CHECK(n >= 0 && static_cast<size_t>(n) <= in_.size() - pos_,
                  "save entries: bad string length");
    std::string s(in_.data() + pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }

 private:
  void get(void* p, size_t n) {
    CKPTSIM_CHECK(n <= in_.size() - pos_, "save entries: truncated");
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
  }
  const std::vector<char>& in_;
  size_t pos_ = 0;
};

RankEntries decode_entries(const std::vector<char>& bytes) {
  EntryReader r(bytes);
  RankEntries e;
  e.pieces.resize(static_cast<size_t>(r.i64()));
  for (auto& p : e.pieces) {
    p.key = r.str();
    p.dtype = r.str();
    p.global_numel = r.i64();
    p.global_offset = r.i64();
    p.numel = r.i64();
    p.rank = static_cast<int>(r.i64());
    p.file = r.str();
    p.byte_offset = r.i64();
  }
  e.objects.resize(static_cast<size_t>(r.i64()));
  for (auto& [k, main] : e.objects) {
    k = r.str();
    main = r.i64() != 0;
  }
  return e;
}

}  // namespace

std::string rank_file(int rank) { return fmt::format("shards/rank_{}.bin", rank); }
std::string object_file(const std::string& unique_key) { return "objects/" + unique_key + ".pt"; }

// Appends p's header to `blob` and sets p.byte_offset to where its bytes begin, after it.
void append_piece_header(std::vector<char>& blob, SavedPiece& p) {
  blob.insert(blob.end(), std::begin(kPieceMagic), std::end(kPieceMagic));
  const uint64_t tag = piece_tag(p);
  for (int i = 0; i < 8; ++i) blob.push_back(static_cast<char>((tag >> (8 * i)) & 0xff));
  p.byte_offset = static_cast<int64_t>(blob.size());
}

std::vector<FlatRun> flat_runs(const ShardedTensor& st) {
  const Shape& local = st.local_shape;
  const Shape& global = st.global_shape;
  CKPTSIM_CHECK(st.prepend_axis_num == 0 && !local.empty() && local.size() == global.size() &&
                    st.global_offset.size() == global.size(),
                "ShardedTensor " + st.key + ": only tensors without prepended axes are modeled");
  const size_t n = local.size();
  std::vector<int64_t> stride(n, 1);  // of the global tensor
  for (size_t d = n - 1; d-- > 0;) stride[d] = stride[d + 1] * global[d + 1];
  // The dims after `k` are whole: a run is dim k's local extent times theirs.
  size_t k = n - 1;
  while (k > 0 && local[k] == global[k]) --k;
  int64_t run = 1;
  for (size_t d = k; d < n; ++d) run *= local[d];
  int64_t outer = 1;
  for (size_t d = 0; d < k; ++d) outer *= local[d];
  std::vector<FlatRun> runs;
  runs.reserve(static_cast<size_t>(outer));
  for (int64_t i = 0; i < outer; ++i) {
    int64_t rest = i;
    int64_t offset = st.global_offset[k] * stride[k];
    for (size_t d = k; d-- > 0;) {
      offset += (rest % local[d] + st.global_offset[d]) * stride[d];
      rest /= local[d];
    }
    runs.push_back({offset, i * run, run});
  }
  return runs;
}

int64_t global_numel_of(const ShardedTensor& st) {
  int64_t numel = 1;
  for (const int64_t d : st.global_shape) numel *= d;
  return numel;
}

// The dotted names of the classes in `common`, in pickling (depth-first, insertion) order.
std::vector<std::string> class_globals(const Value& common) {
  std::vector<std::string> out;
  for (const Value& v : nested_values(common)) {
    if (v.kind() != Value::Kind::kSymbol) continue;
    const std::string& name = v.as_symbol().name;  // "<class 'torch.optim.adamw.AdamW'>"
    constexpr std::string_view kClass = "<class '";
    if (!name.starts_with(kClass) || !name.ends_with("'>")) continue;
    const std::string dotted = name.substr(kClass.size(), name.size() - kClass.size() - 2);
    if (std::find(out.begin(), out.end(), dotted) == out.end()) out.push_back(dotted);
  }
  return out;
}

std::optional<at::ScalarType> dtype_from_name_checked(const std::string& name) {
  for (at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble, at::kShort, at::kInt,
                           at::kLong, at::kBool, at::kByte}) {
    if (torch_dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

std::vector<char> encode_entries(const RankEntries& e) {
  EntryWriter w;
  w.i64(static_cast<int64_t>(e.pieces.size()));
  for (const auto& p : e.pieces) {
    w.str(p.key);
    w.str(p.dtype);
    w.i64(p.global_numel);
    w.i64(p.global_offset);
    w.i64(p.numel);
    w.i64(p.rank);
    w.str(p.file);
    w.i64(p.byte_offset);
  }
  w.i64(static_cast<int64_t>(e.objects.size()));
  for (const auto& [k, main] : e.objects) {
    w.str(k);
    w.i64(main ? 1 : 0);
  }
  return w.take();
}

GatheredEntries decode_gathered(const std::vector<std::vector<char>>& all) {
  GatheredEntries out;
  for (const auto& bytes : all) {
    RankEntries theirs = decode_entries(bytes);
    for (auto& p : theirs.pieces) out.pieces.push_back(std::move(p));
    for (const auto& [k, main] : theirs.objects) {
      if (main && out.main_replicas[k]++ == 0) out.object_order.push_back(k);
    }
  }
  out.pieces_fingerprint = fingerprint(out.pieces);
  return out;
}

Result<CheckpointIndex> parse_checkpoint_index(const std::vector<char>& bytes) {
  json meta;
  try {
    meta = json::parse(bytes.begin(), bytes.end());
  } catch (const json::exception& e) {
    return Status::corruption(std::string(kMetadataFile) + ": " + e.what());
  }
  if (!meta.is_object() || meta.value("format", "") != kFormat) {
    return Status::corruption(std::string(kMetadataFile) + ": not a " + kFormat + " checkpoint");
  }
  CheckpointIndex out;
  for (const auto& p : meta["pieces"]) {
    auto piece = piece_from_json(p);
    if (!piece.is_ok()) return piece.status();
    out.pieces.push_back(std::move(piece.value()));
  }
  try {
    for (const auto& o : meta.value("objects", json::array())) {
      out.objects.push_back(
          SavedObject{o.at("unique_key").get<std::string>(), o.at("file").get<std::string>()});
    }
    out.common_in_common_pt = meta.contains("common") && meta["common"].is_string();
    if (const auto h = meta.find("piece_header_bytes"); h != meta.end()) {
      if (!h->is_number_unsigned() || h->get<uint64_t>() != kPieceHeaderBytes) {
        return Status::corruption(fmt::format("{}: piece_header_bytes is {}, not {}", kMetadataFile,
                                              h->dump(), kPieceHeaderBytes));
      }
      out.piece_headers = true;
    }
  } catch (const json::exception& e) {
    return Status::corruption(std::string(kMetadataFile) + ": bad object entry: " + e.what());
  }
  return out;
}

CheckpointIndex written_index(const std::vector<SavedPiece>& pieces,
                              const std::vector<std::string>& object_keys,
                              bool common_in_common_pt) {
  CheckpointIndex index{pieces, {}, common_in_common_pt, /*piece_headers=*/true};
  for (const std::string& key : object_keys) index.objects.push_back({key, object_file(key)});
  return index;
}

std::shared_ptr<LoadIndex> make_load_index(std::shared_ptr<const std::vector<char>> bytes,
                                           CheckpointIndex parsed) {
  auto index = std::make_shared<LoadIndex>();
  index->bytes = std::move(bytes);
  index->piece_headers = parsed.piece_headers;
  index->pieces = std::move(parsed.pieces);
  index->objects = std::move(parsed.objects);
  index->common_in_common_pt = parsed.common_in_common_pt;
  for (const auto& p : index->pieces) {
    index->by_key[p.key].push_back(&p);
    index->problems.push_back(piece_problem(p, std::nullopt));
  }
  index->pieces_fingerprint = fingerprint(index->pieces);
  return index;
}

std::string piece_problem(const SavedPiece& p, std::optional<size_t> file_size) {
  // The largest tensor a saved piece may claim (2^31 elements; the model's own are far
  // smaller): a forged global size must not size a buffer.
  constexpr int64_t kGlobalNumelMax = int64_t{1} << 31;
  if (p.global_numel > kGlobalNumelMax) {
    return fmt::format("a tensor of {} elements, over {}", p.global_numel, kGlobalNumelMax);
  }
  if (p.global_numel < 0 || p.numel < 0 || p.global_offset < 0 || p.byte_offset < 0 ||
      p.global_offset > p.global_numel || p.numel > p.global_numel - p.global_offset) {
    return fmt::format("piece [{}, {}) outside the tensor's [0, {})", p.global_offset,
                       p.global_offset + p.numel, p.global_numel);
  }
  const auto dtype = dtype_from_name_checked(p.dtype);
  if (!dtype.has_value()) return "unknown dtype " + p.dtype;
  if (!file_size.has_value()) return "";
  const size_t size = static_cast<size_t>(p.numel) * c10::elementSize(*dtype);
  if (static_cast<size_t>(p.byte_offset) > *file_size ||
      size > *file_size - static_cast<size_t>(p.byte_offset)) {
    return fmt::format("bytes [{}, {}) past the end of the file ({} bytes)", p.byte_offset,
                       static_cast<size_t>(p.byte_offset) + size, *file_size);
  }
  return "";
}

Result<CommonStateBytes> read_common_state_bytes(const Storage& storage) {
  std::string file = storage.exists(kCommonFile) ? kCommonFile : object_file(kCommonStateObjectKey);
  auto bytes = storage.read_file_shared(file);
  if (!bytes.is_ok()) return bytes.status();
  return CommonStateBytes{std::move(file), std::move(bytes.value())};
}

}  // namespace own_format

using namespace own_format;

std::string metadata_json(bool common_in_common_pt, const std::vector<SavedPiece>& pieces,
                          const std::vector<std::string>& object_keys) {
  // The text nlohmann::json's dump(1) gives for {"format", "common", "pieces", "objects"}: keys
  // sorted (its object is a std::map), one space of indent per level, "[]" when empty.
  std::string out;
  out.reserve(64 + pieces.size() * 200 + object_keys.size() * 100);
  auto array = [&out](size_t n, auto&& item) {
    if (n == 0) {
      out += "[]";
      return;
    }
    out += "[\n";
    for (size_t i = 0; i < n; ++i) {
      if (i > 0) out += ",\n";
      out += "  ";
      item(i);
    }
    out += "\n ]";
  };
  auto integer = [&out](int64_t v) { fmt::format_to(std::back_inserter(out), "{}", v); };
  append_json_object(out, 0, [&](auto&& member) {
    member("common");
    if (common_in_common_pt) {
      append_json_string(out, kCommonFile);
    } else {
      out += "null";
    }
    member("format");
    append_json_string(out, kFormat);
    member("objects");
    array(object_keys.size(), [&](size_t i) {
      append_json_object(out, 2, [&](auto&& m) {
        m("file");
        append_json_string(out, object_file(object_keys[i]));
        m("unique_key");
        append_json_string(out, object_keys[i]);
      });
    });
    member("piece_header_bytes");
    integer(static_cast<int64_t>(kPieceHeaderBytes));
    member("pieces");
    array(pieces.size(), [&](size_t i) {
      const SavedPiece& p = pieces[i];
      append_json_object(out, 2, [&](auto&& m) {
        m("byte_offset");
        integer(p.byte_offset);
        m("dtype");
        append_json_string(out, p.dtype);
        m("file");
        append_json_string(out, p.file);
        m("global_numel");
        integer(p.global_numel);
        m("global_offset");
        integer(p.global_offset);
        m("key");
        append_json_string(out, p.key);
        m("numel");
        integer(p.numel);
        m("rank");
        integer(p.rank);
      });
    });
  });
  return out;
}

uint64_t fingerprint(const std::vector<SavedPiece>& pieces) {
  uint64_t h = kFnv1aOffset;
  auto mix = [&h](const void* data, size_t n) { h = word_hash(data, n, h); };
  auto mix_string = [&](const std::string& s) {
    const uint64_t size = s.size();
    mix(&size, sizeof size);
    mix(s.data(), s.size());
  };
  for (const auto& p : pieces) {
    mix_string(p.key);
    mix_string(p.dtype);
    mix_string(p.file);
    for (const int64_t v :
         {p.global_numel, p.global_offset, p.numel, int64_t{p.rank}, p.byte_offset}) {
      mix(&v, sizeof v);
    }
  }
  return h;
}

void LoadIndex::check_unchanged() const {
  CKPTSIM_CHECK(fingerprint(pieces) == pieces_fingerprint,
                fmt::format("the {} pieces of a shared metadata.json index were written after "
                            "it was parsed",
                            pieces.size()));
}

Status write_checkpoint_contents(const CheckpointContents& contents, Storage& storage) {
  std::vector<SavedPiece> pieces;
  std::vector<std::string> object_keys;
  std::vector<char> blob;
  for (const auto& [key, tensor] : contents.tensors) {
    const at::Tensor data = tensor.to(at::kCPU).contiguous().flatten();
    if (!dtype_from_name_checked(torch_dtype_name(data.scalar_type()))) {
      return Status::invalid_input(fmt::format("key '{}': dtype {} is not in the model's format",
                                               key, torch_dtype_name(data.scalar_type())));
    }
    SavedPiece p;
    p.key = key;
    p.dtype = torch_dtype_name(data.scalar_type());
    p.global_numel = data.numel();
    p.numel = data.numel();
    p.file = rank_file(0);
    append_piece_header(blob, p);
    const auto* bytes = static_cast<const char*>(data.data_ptr());
    blob.insert(blob.end(), bytes, bytes + data.numel() * data.element_size());
    pieces.push_back(std::move(p));
  }
  std::map<std::string, Value> objects = contents.objects;
  if (contents.common_state_as_sharded_object) objects[kCommonStateObjectKey] = contents.common;
  for (const auto& [unique_key, object] : objects) {
    if (Status s = validate_file_path(object_file(unique_key)); !s.is_ok()) {
      return Status::invalid_input("ShardedObject '" + unique_key + "': " + s.message());
    }
    if (Status s = storage.write_file(object_file(unique_key), pickle_value(object)); !s.is_ok())
      return s;
    object_keys.push_back(unique_key);
  }
  if (!contents.common_state_as_sharded_object) {
    if (Status s = storage.write_file(kCommonFile, pickle_value(contents.common)); !s.is_ok())
      return s;
  }
  if (!blob.empty()) {
    if (Status s = storage.write_file(rank_file(0), blob); !s.is_ok()) return s;
  }
  return storage.write_file(
      kMetadataFile,
      to_bytes(metadata_json(!contents.common_state_as_sharded_object, pieces, object_keys)));
}

Result<CheckpointIndex> read_checkpoint_index(const Storage& storage) {
  auto bytes = storage.read_file(kMetadataFile);
  if (!bytes.is_ok()) return bytes.status();
  return parse_checkpoint_index(bytes.value());
}

Result<std::vector<SavedPiece>> read_checkpoint_pieces(const Storage& storage) {
  Result<CheckpointIndex> index = read_checkpoint_index(storage);
  if (!index.is_ok()) return index.status();
  return std::move(index.value().pieces);
}

Result<Value> read_common_state(const Storage& storage) {
  auto read = read_common_state_bytes(storage);
  if (!read.is_ok()) return read.status();
  return unpickle_value(*read.value().bytes);
}

Result<std::map<std::string, std::vector<float>>> read_checkpoint_tensors(
    const Storage& storage, const std::vector<SavedPiece>& pieces, std::string_view key_prefix) {
  std::map<std::string, std::vector<float>> out;
  std::map<std::string, std::vector<char>> files;
  for (const auto& p : pieces) {
    if (!std::string_view(p.key).starts_with(key_prefix)) continue;
    auto error = [&](const std::string& what) {
      return Status::corruption(fmt::format("{}: key {}: {}", p.file, p.key, what));
    };
    // Against its tensor before the global size sizes a buffer; against its file below.
    if (std::string problem = piece_problem(p, std::nullopt); !problem.empty()) {
      return error(problem);
    }
    auto& values = out[p.key];
    if (values.empty()) {
      values.assign(static_cast<size_t>(p.global_numel), std::numeric_limits<float>::quiet_NaN());
    } else if (values.size() != static_cast<size_t>(p.global_numel)) {
      return error(fmt::format("global numel {} differs from another piece's {}", p.global_numel,
                               values.size()));
    }
    auto it = files.find(p.file);
    if (it == files.end()) {
      auto bytes = storage.read_file(p.file);
      if (!bytes.is_ok()) return bytes.status();
      it = files.emplace(p.file, std::move(bytes.value())).first;
    }
    if (std::string problem = piece_problem(p, it->second.size()); !problem.empty()) {
      return error(problem);
    }
    const at::ScalarType dtype = *dtype_from_name_checked(p.dtype);
    const auto size = static_cast<size_t>(p.numel) * c10::elementSize(dtype);
    if (size == 0) continue;  // an empty piece: an empty tensor's data_ptr() is null
    at::Tensor src = at::empty({p.numel}, at::TensorOptions().dtype(dtype));
    std::memcpy(src.data_ptr(), it->second.data() + p.byte_offset, size);
    const std::vector<float> f = host::floats(src);
    std::copy(f.begin(), f.end(), values.begin() + static_cast<std::ptrdiff_t>(p.global_offset));
  }
  return out;
}

std::string piece_damage(const SavedPiece& p, const std::vector<char>& file, bool headers) {
  if (std::string problem = piece_problem(p, file.size()); !problem.empty()) return problem;
  return headers ? header_problem(p, file) : "";
}

std::string checkpoint_problem(const Storage& storage, CheckpointCaches* caches) {
  auto index = load_index(storage, caches);
  if (!index.is_ok()) return index.status().to_string();
  std::map<std::string, std::shared_ptr<const std::vector<char>>> files;
  for (const auto& p : index.value()->pieces) {
    auto it = files.find(p.file);
    if (it == files.end()) {
      auto bytes = storage.read_file_shared(p.file);
      if (!bytes.is_ok()) return bytes.status().to_string();
      it = files.emplace(p.file, std::move(bytes.value())).first;
    }
    // Out of bounds, or another save's bytes where the piece should be (a directory overwritten
    // in place by a save that died): the load fails on them, so the checkpoint is not whole.
    const std::string problem = piece_damage(p, *it->second, index.value()->piece_headers);
    if (!problem.empty()) return fmt::format("{}: key {}: {}", p.file, p.key, problem);
  }
  for (const auto& o : index.value()->objects) {
    if (!storage.exists(o.file)) return o.file + ": missing";
  }
  auto common = read_common_state(storage);
  return common.is_ok() ? "" : common.status().to_string();
}

}  // namespace ckptsim::model
