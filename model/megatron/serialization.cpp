#include "model/megatron/serialization.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>

#include "model/errors.h"
#include "model/fnv1a.h"
#include "model/megatron/mapping.h"
#include "model/py/host_tensor.h"
#include "model/py/pickle_codec.h"

namespace ckptsim::model {

namespace {

using nlohmann::json;

constexpr const char* kCommonFile = "common.pt";
constexpr const char* kMetadataFile = "metadata.json";
constexpr const char* kFormat = "ckptsim-dist-v1";

std::string rank_file(int rank) { return fmt::format("shards/rank_{}.bin", rank); }

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

// Appends p's header to `blob` and sets p.byte_offset to where its bytes begin, after it.
void append_piece_header(std::vector<char>& blob, SavedPiece& p) {
  blob.insert(blob.end(), std::begin(kPieceMagic), std::end(kPieceMagic));
  const uint64_t tag = piece_tag(p);
  for (int i = 0; i < 8; ++i) blob.push_back(static_cast<char>((tag >> (8 * i)) & 0xff));
  p.byte_offset = static_cast<int64_t>(blob.size());
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

// A ShardedTensor's elements as runs of its global tensor flattened row-major (the model's own
// format stores pieces 1-D; DCP stores the N-D box, the same elements): each run is contiguous
// in the global tensor and in the local data, runs in the local data's order. A TP piece split
// on dim 0 is one run; one split on dim 1 is one run per row.
struct FlatRun {
  int64_t global_offset = 0;
  int64_t local_offset = 0;
  int64_t numel = 0;
};
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
std::string object_file(const std::string& unique_key) { return "objects/" + unique_key + ".pt"; }
// ShardedObject("common_state", None, (1,), (0,)).unique_key: HEAD's home of the common state.
constexpr const char* kCommonStateObjectKey = "common_state/shard_0_1";
// The classes the common state holds (a param group's cpu_optimizer_cls ...): torch.save
// pickles each as a GLOBAL, which torch.load(weights_only=True) refuses. The model's own
// common.pt keeps a symbol as its name, so the save lists them here for the load to refuse
// as torch does (absent when there are none).
constexpr const char* kCommonGlobalsFile = "common_globals.json";

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

}  // namespace

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

namespace {

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

// What each rank sends rank 0 at the end of a save: its pieces and its sharded objects, as
// flat bytes (a JSON text per rank, parsed by every rank, cost more than the rest of a small
// save). Ranks of one world share a byte order, as c10d's object collectives assume too.
struct RankEntries {
  std::vector<SavedPiece> pieces;
  std::vector<std::pair<std::string, bool>> objects;  // unique_key, is main replica
};

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

// The save's gathered entries, decoded once for every rank that shares them (GatheredObjects).
struct GatheredEntries {
  std::vector<SavedPiece> pieces;  // every rank's, in rank order
  uint64_t pieces_fingerprint = 0;
  std::map<std::string, int> main_replicas;  // unique_key -> main replicas
  std::vector<std::string> object_order;     // objects with a main replica, first-seen order
};

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

void throw_if_error(const Status& s) {
  if (!s.is_ok()) throw CheckpointingException(s.to_string(), "serialization.py (storage)");
}

// A failed write of the save, raised as the real save raises it (seen with ENOSPC on the H200,
// reports/crash-replay-2026-12-05.md): torch.distributed.checkpoint's writers collect a rank's
// .distcp write error and its finalize raises it as CheckpointException; the coordinator's
// .metadata write raises the OSError itself (filesystem_async.py finish()); common.pt's is
// save_common()'s OSError.
enum class SaveWrite { kDistcp, kMetadata, kCommonPt };
void throw_if_write_failed(const Status& s, SaveWrite what) {
  if (s.is_ok()) return;
  switch (what) {
    case SaveWrite::kDistcp:
      throw UpstreamError("CheckpointException", s.to_string(),
                          "state_dict_saver.py save_state_dict_async_finalize()");
    case SaveWrite::kMetadata:
      throw UpstreamError("OSError", s.to_string(), "filesystem_async.py finish()");
    case SaveWrite::kCommonPt:
      throw UpstreamError("OSError", s.to_string(), "common.py save_common()");
  }
}

std::optional<at::ScalarType> dtype_from_name_checked(const std::string& name) {
  for (at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble, at::kShort, at::kInt,
                           at::kLong, at::kBool, at::kByte}) {
    if (torch_dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

at::ScalarType dtype_from_name(const std::string& name) {
  if (auto t = dtype_from_name_checked(name)) return *t;
  throw CheckpointingException("unknown dtype " + name + " in " + kMetadataFile,
                               "serialization.py load()");
}

// validation.py _validate_common_state_dict's diff(): paths only on one side and mismatches.
void diff_values(const Value& a, const Value& b, KeyPath& path, std::vector<std::string>& out) {
  if (a.is_dict() && b.is_dict()) {
    for (const auto& [k, v] : *a.dict()) {
      path.push_back(k);
      if (const Value* w = b.dict()->find(k)) {
        diff_values(v, *w, path, out);
      } else {
        out.push_back("only on rank 0: " + repr(path));
      }
      path.pop_back();
    }
    for (const auto& [k, v] : *b.dict()) {
      if (!a.dict()->contains(k)) {
        path.push_back(k);
        // (a None here carries no state: what fully_reshardable's mem_efficient save returns
        // for the param state on every DP rank but 0, where rank 0 saved it sharded)
        out.push_back((v.is_none() ? "missing on rank 0 (None here): " : "missing on rank 0: ") +
                      repr(path));
        path.pop_back();
      }
    }
    return;
  }
  if (a.is_list() && b.is_list()) {
    const size_t n = std::min(a.list()->size(), b.list()->size());
    if (a.list()->size() != b.list()->size()) {
      out.push_back(fmt::format("list length {} on rank 0 vs {} here: {}", a.list()->size(),
                                b.list()->size(), repr(path)));
    }
    for (size_t i = 0; i < n; ++i) {
      path.emplace_back(static_cast<int64_t>(i));
      diff_values(a.list()->at(i), b.list()->at(i), path, out);
      path.pop_back();
    }
    return;
  }
  bool equal = false;
  auto scalar_text = [](const Value& v) {
    // A symbol comes back from a pickle as its name string.
    return v.kind() == Value::Kind::kSymbol ? py_str_repr(v.as_symbol().name) : v.repr();
  };
  if ((a.kind() == Value::Kind::kSymbol) != (b.kind() == Value::Kind::kSymbol)) {
    equal = !a.is_container() && !b.is_container() && !a.is_tensor() && !b.is_tensor() &&
            scalar_text(a) == scalar_text(b);
  } else if (a.is_tensor() && b.is_tensor()) {
    const at::Tensor& x = a.tensor();
    const at::Tensor& y = b.tensor();
    equal = x.scalar_type() == y.scalar_type() && x.sizes() == y.sizes() &&
            std::memcmp(x.to(at::kCPU).contiguous().data_ptr(),
                        y.to(at::kCPU).contiguous().data_ptr(), x.numel() * x.element_size()) == 0;
  } else if (!a.is_tensor() && !b.is_tensor() && !a.is_container() && !b.is_container()) {
    equal = py_equal(a, b);
  }
  if (!equal) out.push_back("values differ: " + repr(path));
}

// Strips 'param_state' subtrees below any 'optimizer' key (LoadOptions.strip_common_param_state).
void strip_param_state(Value& v, bool under_optimizer) {
  if (v.is_dict()) {
    if (under_optimizer) v.dict()->erase("param_state");
    for (auto& [k, child] : *v.dict())
      strip_param_state(child, under_optimizer || k == Key("optimizer"));
  } else if (v.is_list()) {
    for (auto& child : *v.list()) strip_param_state(child, under_optimizer);
  }
}

}  // namespace

SaveReport save(const Value& sharded_state_dict, Storage& storage, ProcessGroup& group,
                const SaveOptions& options) {
  SaveReport report;
  const int rank = group.rank();
  // save_preprocess: (factories: none modeled) drop LNOs, split sharded part and common.
  auto [nonpersistent, persistent] = extract_nonpersistent(sharded_state_dict);
  (void)nonpersistent;
  auto [sharded_part, common] = extract_sharded_base(persistent);

  // validate_sharding_integrity(common): rank 0's common state against every rank's.
  const std::vector<char> common_bytes = rank == 0 ? pickle_value(common) : std::vector<char>{};
  const std::vector<char> rank0_common = group.broadcast_object(common_bytes, 0);
  {
    // Every rank decodes the same bytes and only reads what they decode to: the ranks of a
    // world that run on this thread share the last decoding (a pure function of the bytes,
    // compared whole).
    thread_local std::pair<std::vector<char>, Value> last_decoded;
    if (last_decoded.first.empty() || last_decoded.first != rank0_common) {
      auto decoded = unpickle_value(rank0_common);
      CKPTSIM_CHECK(decoded.is_ok(), "rank 0 common state does not decode");
      last_decoded = {rank0_common, decoded.value()};
    }
    KeyPath path;
    diff_values(last_decoded.second, common, path, report.common_state_differences);
  }

  // Sharded objects: main replicas unique per unique_key (checked on rank 0 after gathering).
  // save(): common_strategy.save_common() writes common.pt before the sharded strategy writes
  // anything (an ENOSPC or a crash there leaves no .distcp: seen on the H200,
  // reports/crash-replay-2026-12-05.md).
  if (!options.common_state_as_sharded_object && rank == 0)
    throw_if_write_failed(storage.write_file(kCommonFile, common_bytes), SaveWrite::kCommonPt);
  RankEntries mine;
  std::vector<char> blob;
  for (const auto& [path, leaf] : nested_items(sharded_part)) {
    if (leaf.is_sharded_object()) {
      const ShardedObject& so = *leaf.sharded_object();
      const bool main = is_main_replica(so.replica_id);
      mine.objects.emplace_back(so.unique_key(), main);
      if (main)
        throw_if_error(storage.write_file(object_file(so.unique_key()), pickle_value(so.data)));
      continue;
    }
    CKPTSIM_CHECK(leaf.is_sharded_tensor(), "sharded part holds a non-ShardedBase leaf");
    const ShardedTensor& st = *leaf.sharded_tensor();
    if (!is_main_replica(st.replica_id)) continue;
    const at::Tensor data = st.data.to(at::kCPU).contiguous();
    const auto* bytes = static_cast<const char*>(data.data_ptr());
    const int64_t elem = data.element_size();
    for (const FlatRun& run : flat_runs(st)) {
      SavedPiece p;
      p.key = st.key;
      p.dtype = torch_dtype_name(data.scalar_type());
      p.global_numel = global_numel_of(st);
      p.global_offset = run.global_offset;
      p.numel = run.numel;
      p.rank = rank;
      p.file = rank_file(rank);
      append_piece_header(blob, p);
      blob.insert(blob.end(), bytes + run.local_offset * elem,
                  bytes + (run.local_offset + run.numel) * elem);
      mine.pieces.push_back(std::move(p));
    }
  }
  if (options.common_state_as_sharded_object) {
    // HEAD: sharded_state_dict['common_state'] = ShardedObject(...) on every rank, rank 0's
    // the main replica.
    mine.objects.emplace_back(kCommonStateObjectKey, rank == 0);
    if (rank == 0)  // an item of rank 0's .distcp in the real save
      throw_if_write_failed(storage.write_file(object_file(kCommonStateObjectKey), common_bytes),
                            SaveWrite::kDistcp);
  }
  if (rank == 0) {
    if (const auto globals = class_globals(common); !globals.empty()) {
      const std::string text = nlohmann::json(globals).dump();
      throw_if_error(storage.write_file(kCommonGlobalsFile, {text.begin(), text.end()}));
    }
  }
  if (!mine.pieces.empty())
    throw_if_write_failed(storage.write_file(rank_file(rank), blob), SaveWrite::kDistcp);

  // Gather every rank's pieces and objects; rank 0 validates and writes the metadata. Every
  // rank decodes the same entries: once, shared, where the group shares what it gathered.
  const std::shared_ptr<const GatheredEntries> entries =
      group.all_gather_object_shared(encode_entries(mine))
          ->derived<GatheredEntries>(decode_gathered);
  report.pieces = std::shared_ptr<const std::vector<SavedPiece>>(entries, &entries->pieces);
  report.pieces_fingerprint = entries->pieces_fingerprint;
  for (const auto& [k, count] : entries->main_replicas) {
    if (count > 1) {
      throw CheckpointingException(
          fmt::format("Invalid access pattern for ShardedObject {}: {} main replicas", k, count),
          "validation.py validate_sharding_integrity()");
    }
  }
  if (rank == 0) {
    const std::vector<char> metadata = to_bytes(metadata_json(
        !options.common_state_as_sharded_object, *report.pieces, entries->object_order));
    throw_if_write_failed(storage.write_file(kMetadataFile, metadata), SaveWrite::kMetadata);
    // The next load of these bytes finds their index parsed (it equals a parse: the text
    // holds every field of every piece).
    prime_load_index(storage, *report.pieces, entries->object_order,
                     !options.common_state_as_sharded_object, metadata);
  }
  group.barrier();
  return report;
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

namespace {

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

}  // namespace

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

namespace {

// The common state's file (common.pt, else HEAD's 'common_state' object) and its bytes.
struct CommonStateBytes {
  std::string file;
  std::shared_ptr<const std::vector<char>> bytes;
};
Result<CommonStateBytes> read_common_state_bytes(const Storage& storage) {
  std::string file = storage.exists(kCommonFile) ? kCommonFile : object_file(kCommonStateObjectKey);
  auto bytes = storage.read_file_shared(file);
  if (!bytes.is_ok()) return bytes.status();
  return CommonStateBytes{std::move(file), std::move(bytes.value())};
}

}  // namespace

Result<Value> read_common_state(const Storage& storage) {
  auto read = read_common_state_bytes(storage);
  if (!read.is_ok()) return read.status();
  return unpickle_value(*read.value().bytes);
}

Value load_common_state_dict(const Storage& storage, bool reads_sharded_common_state,
                             bool allows_class_globals) {
  constexpr const char* kSite = "common.py load_common()";
  if (!storage.exists(kCommonFile) &&
      (!reads_sharded_common_state || !storage.exists(object_file(kCommonStateObjectKey)))) {
    if (!reads_sharded_common_state)
      throw UpstreamError("AttributeError", "'str' object has no attribute 'iterdir'", kSite);
    throw PyKeyError(py_str_repr(std::string(kCommonStateObjectKey)) + " not in checkpoint",
                     "serialization.py load_common_state_dict()");
  }
  // common.pt goes through load_common()'s torch.load (weights_only=True, torch >= 2.6's
  // default), which refuses the first class the pickle names. HEAD's 'common_state' object does
  // not: torch.distributed.checkpoint's DefaultLoadPlanner.load_bytes already unpickles it with
  // weights_only=False, so load_common_state_dict's own torch.load(weights_only=True) branch
  // (for a BytesIO still unread) never runs. The H200 showed it: every fully reshardable resume
  // of the HDO at upstream-head loaded (TP/PP campaign 2026-12-04, 8 scenarios).
  if (!allows_class_globals && storage.exists(kCommonFile) && storage.exists(kCommonGlobalsFile)) {
    const auto bytes = storage.read_file(kCommonGlobalsFile);
    std::string first = "?";
    if (bytes.is_ok()) {
      const auto j = nlohmann::json::parse(bytes.value().begin(), bytes.value().end(), nullptr,
                                           /*allow_exceptions=*/false);
      if (j.is_array() && !j.empty() && j[0].is_string()) first = j[0].get<std::string>();
    }
    throw UpstreamError(
        "UnpicklingError",
        fmt::format("Weights only load failed. WeightsUnpickler error: Unsupported global: GLOBAL "
                    "{} was not an allowed global by default.",
                    first),
        kSite);
  }
  // An empty common.pt (a write cut short before its first whole page): torch.load's unpickler
  // finds no input, and load_common() lets its EOFError through (seen on the H200,
  // reports/crash-replay-2026-12-05.md).
  auto read = read_common_state_bytes(storage);
  if (read.is_ok() && read.value().file == kCommonFile && read.value().bytes->empty())
    throw UpstreamError("EOFError", "Ran out of input", kSite);
  auto common = read.is_ok() ? unpickle_value(*read.value().bytes) : Result<Value>(read.status());
  if (!common.is_ok()) throw CheckpointingException(common.status().to_string(), kSite);
  return common.value();
}

namespace {

// What is wrong with a saved piece against its tensor and, when its size is given, its file
// ("" when nothing): a piece of a damaged metadata.json must be reported, never read past its
// buffer.
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

// The process's LoadIndex cache (invariants 1-3 of LoadIndex in serialization.h).
class LoadIndexCache {
 public:
  // The file is read under the cache's lock, so that ranks waiting for it do not each hold a
  // copy of the bytes (at DP 2048 that was 1536 copies of a 2.5 MB file). It is parsed outside
  // the lock: the searches of `check --jobs N` load their own checkpoints on N threads at once,
  // and a parse under the lock made them wait for each other.
  Result<std::shared_ptr<const LoadIndex>> get(const Storage& storage) {
    std::shared_ptr<const std::vector<char>> bytes;
    {
      std::lock_guard lock(mu_);
      auto read = storage.read_file_shared(kMetadataFile);
      if (!read.is_ok()) return read.status();
      bytes = std::move(read.value());
      if (auto index = find_locked(bytes)) return index;
    }
    auto parsed = parse_checkpoint_index(*bytes);
    if (!parsed.is_ok()) return parsed.status();
    return insert(make_index(std::move(bytes), std::move(parsed.value())));
  }

  // The index of the metadata.json just written into `storage`, from the pieces it lists
  // (what a parse of it gives: the text holds every field of every piece), kept alive for this
  // thread's next load. A storage that cannot read the file back, or whose file does not hold
  // the bytes written (a short write: the index of the pieces would pass for the cut bytes'),
  // is left alone.
  void prime(const Storage& storage, CheckpointIndex written_index,
             const std::vector<char>& written) {
    std::shared_ptr<const std::vector<char>> bytes;
    {
      std::lock_guard lock(mu_);
      auto read = storage.read_file_shared(kMetadataFile);
      if (!read.is_ok() || *read.value() != written) return;
      bytes = std::move(read.value());
      if (find_locked(bytes) != nullptr) return;
    }
    // One per thread (a search's case saves and loads on its own thread): bounded by the
    // number of threads, and another thread's prime does not drop it before its load.
    thread_local std::shared_ptr<const LoadIndex> primed_here;
    primed_here = insert(make_index(std::move(bytes), std::move(written_index)));
  }

  void check_unchanged() const {
    std::lock_guard lock(mu_);
    for (const auto& weak : entries_) {
      if (const auto index = weak.lock()) index->check_unchanged();
    }
  }

 private:
  // The cached index of these bytes (same buffer or equal content), or null.
  std::shared_ptr<const LoadIndex> find_locked(
      const std::shared_ptr<const std::vector<char>>& bytes) {
    std::erase_if(entries_, [](const auto& e) { return e.expired(); });
    for (const auto& weak : entries_) {
      std::shared_ptr<const LoadIndex> index = weak.lock();
      if (index != nullptr && (index->bytes == bytes || *index->bytes == *bytes)) return index;
    }
    return nullptr;
  }

  static std::shared_ptr<LoadIndex> make_index(std::shared_ptr<const std::vector<char>> bytes,
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

  std::shared_ptr<const LoadIndex> insert(std::shared_ptr<const LoadIndex> index) {
    std::lock_guard lock(mu_);
    // Another thread may have parsed equal bytes meanwhile: every caller shares its index.
    if (auto earlier = find_locked(index->bytes)) return earlier;
    if (entries_.size() >= kLoadIndexCacheEntriesMax) entries_.erase(entries_.begin());
    entries_.push_back(index);
    latest_ = index;
    return index;
  }

  mutable std::mutex mu_;
  std::vector<std::weak_ptr<const LoadIndex>> entries_;  // oldest first
  std::shared_ptr<const LoadIndex> latest_;
};

LoadIndexCache& load_index_cache() {
  static LoadIndexCache cache;
  return cache;
}

}  // namespace

uint64_t fingerprint(const std::vector<SavedPiece>& pieces) {
  uint64_t h = kFnv1aOffset;
  auto mix = [&h](const void* data, size_t n) { h = fnv1a(data, n, h); };
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

void SaveReport::check_pieces_unchanged() const {
  CKPTSIM_CHECK(pieces != nullptr, "a save report without pieces");
  CKPTSIM_CHECK(fingerprint(*pieces) == pieces_fingerprint,
                fmt::format("the {} saved pieces every rank shares were written after the save "
                            "decoded them",
                            pieces->size()));
}

void LoadIndex::check_unchanged() const {
  CKPTSIM_CHECK(fingerprint(pieces) == pieces_fingerprint,
                fmt::format("the {} pieces of a shared metadata.json index were written after "
                            "it was parsed",
                            pieces.size()));
}

Result<std::shared_ptr<const LoadIndex>> shared_load_index(const Storage& storage) {
  return load_index_cache().get(storage);
}

void check_shared_load_indexes_unchanged() { load_index_cache().check_unchanged(); }

void prime_load_index(const Storage& storage, const std::vector<SavedPiece>& pieces,
                      const std::vector<std::string>& object_keys, bool common_in_common_pt,
                      const std::vector<char>& written) {
  // What a parse of metadata_json(common_in_common_pt, pieces, object_keys) gives.
  CheckpointIndex index{pieces, {}, common_in_common_pt, /*piece_headers=*/true};
  for (const std::string& key : object_keys) index.objects.push_back({key, object_file(key)});
  load_index_cache().prime(storage, std::move(index), written);
}

namespace {

// torch.distributed.checkpoint's load_state_dict(), its "read" step (_DistWrapper.all_gather):
// every rank runs its reads, the results are gathered, and when any rank's raised, every rank
// raises one CheckpointException naming the ranks that failed, with the first one's error (as
// "CheckpointException ranks:dict_keys([0, 1])" and each rank's traceback upstream). Only the
// errors the model's reads raise as CheckpointException are gathered; the others leave the
// rank at once (their peers see it abort).
void read_gathering_errors(ProcessGroup& group, const std::function<void()>& read) {
  std::string failure;
  try {
    read();
  } catch (const UpstreamError& e) {
    if (e.py_type() != "CheckpointException") throw;
    failure = e.message().empty() ? std::string("CheckpointException") : e.message();
  }
  const std::vector<std::vector<char>> results =
      group.all_gather_object(std::vector<char>(failure.begin(), failure.end()));
  std::string ranks;
  const std::vector<char>* first = nullptr;
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].empty()) continue;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    if (first == nullptr) first = &results[r];
  }
  if (first == nullptr) return;
  throw UpstreamError("CheckpointException",
                      fmt::format("CheckpointException ranks:dict_keys([{}]): {}", ranks,
                                  std::string(first->begin(), first->end())),
                      "torch.py load()");
}

}  // namespace

Value load(const Value& sharded_state_dict, const Storage& storage, ProcessGroup& group,
           const LoadOptions& options, LoadReport* report) {
  auto index_r = shared_load_index(storage);
  if (!index_r.is_ok()) {
    // A .metadata that is there but does not read (cut short): torch.distributed.checkpoint's
    // load finds no metadata and raises CheckpointException, at HEAD first from the read of the
    // 'common_state' object, before it from the model's load (both seen on the H200,
    // reports/crash-replay-2026-12-05.md). No .metadata: no distributed checkpoint.
    if (storage.exists(kMetadataFile)) {
      throw UpstreamError("CheckpointException",
                          "AssertionError: metadata is None (" + index_r.status().to_string() + ")",
                          options.reads_sharded_common_state
                              ? "serialization.py load_common_state_dict()"
                              : "torch.py load()");
    }
    throw CheckpointingException(index_r.status().to_string(),
                                 "serialization.py verify_checkpoint_and_load_strategy()");
  }
  const std::shared_ptr<const LoadIndex> index = std::move(index_r.value());
  const std::map<std::string, std::vector<const SavedPiece*>>& by_key = index->by_key;

  Value common = load_common_state_dict(storage, options.reads_sharded_common_state,
                                        options.allows_class_globals);
  if (options.strip_common_param_state) strip_param_state(common, false);

  // load_preprocess: structural copy, LNOs extracted and unwrapped (same objects).
  Value sd = extract_matching_values(sharded_state_dict, [](const Value&) { return true; }).first;
  auto [nonpersistent, rest] = extract_nonpersistent(sd);
  dict_list_map_inplace([](const Value& v) { return v.nonpersistent()->unwrap(); }, nonpersistent);
  merge(common, nonpersistent, options.merge);
  Value sharded = extract_sharded_base(rest).first;
  // validation.py determine_global_metadata: all_gather_object of every rank's metadata.
  (void)group.all_gather_object_shared({});

  // torch_dist load: every ShardedTensor in place, every ShardedObject anew.
  std::map<std::string, std::vector<char>> files;
  auto file_bytes = [&](const std::string& f) -> const std::vector<char>& {
    auto it = files.find(f);
    if (it == files.end()) {
      auto r = storage.read_file(f);
      throw_if_error(r.is_ok() ? Status::ok() : r.status());
      it = files.emplace(f, std::move(r.value())).first;
    }
    return it->second;
  };
  // A damaged metadata.json: torch's reader fails the load on that rank, wrapped as a missing
  // key is. Every piece of a key is checked against its tensor; the pieces this rank reads,
  // against their files too (no other file is read).
  auto fail_if = [](const SavedPiece& p, const std::string& problem) {
    if (!problem.empty()) {
      throw UpstreamError("CheckpointException",
                          fmt::format("{}: key {}: {}", p.file, p.key, problem), "torch.py load()");
    }
  };
  // Reads the key's elements [want_begin, want_end) (global, flattened) into `dst` from the
  // pieces that cover them, and reports what none covered. `skipped`: fault site
  // load.skip_piece has skipped its piece of this key (false: skip the first one met).
  auto read_run = [&](const std::string& key, int64_t want_begin, int64_t want_end,
                      at::Tensor dst_run, const std::vector<const SavedPiece*>& pieces,
                      bool& skipped) {
    std::vector<std::pair<int64_t, int64_t>> covered;
    for (const SavedPiece* p : pieces) {
      const int64_t begin = std::max(want_begin, p->global_offset);
      const int64_t end = std::min(want_end, p->global_offset + p->numel);
      if (begin >= end) continue;
      if (!skipped) {  // fault site load.skip_piece: the first piece this rank needs
        skipped = true;
        continue;
      }
      // What stands where the piece should be: "" when it reads whole.
      auto damage = [&](const std::vector<char>& file) {
        return piece_damage(*p, file, index->piece_headers);
      };
      if (options.skip_damaged_pieces &&
          (!storage.exists(p->file) || !damage(file_bytes(p->file)).empty())) {
        continue;  // fault site load.skip_damaged_pieces
      }
      const std::vector<char>& bytes = file_bytes(p->file);
      fail_if(*p, damage(bytes));
      const at::ScalarType dtype = dtype_from_name(p->dtype);
      const size_t elem = c10::elementSize(dtype);
      const size_t at_byte = static_cast<size_t>(p->byte_offset) +
                             static_cast<size_t>(begin - p->global_offset) * elem;
      host::copy_bytes(host::narrow(dst_run, begin - want_begin, end - begin), dtype,
                       std::as_bytes(std::span(bytes.data() + at_byte,
                                               static_cast<size_t>(end - begin) * elem)));
      covered.emplace_back(begin, end);
    }
    std::sort(covered.begin(), covered.end());
    int64_t cursor = want_begin;
    auto gap = [&](int64_t b, int64_t e) {
      if (report == nullptr) return;
      report->uncovered.push_back(fmt::format("{}[{}:{}]", key, b, e));
      report->unwritten.push_back({key, b, e - b, /*missing_key=*/false});
    };
    for (const auto& [b, e] : covered) {
      if (b > cursor) gap(cursor, b);
      cursor = std::max(cursor, e);
    }
    if (cursor < want_end) gap(cursor, want_end);
  };
  const auto read_every_leaf = [&] {
    dict_list_map_inplace(
        [&](const Value& leaf) -> Value {
          if (leaf.is_sharded_object()) {
            const ShardedObject& so = *leaf.sharded_object();
            if (!storage.exists(object_file(so.unique_key()))) {
              throw PyKeyError(py_str_repr(so.unique_key()) + " not in checkpoint",
                               "torch.py load()");
            }
            auto obj = unpickle_value(file_bytes(object_file(so.unique_key())));
            if (!obj.is_ok())
              throw CheckpointingException(obj.status().to_string(), "torch.py load()");
            return obj.value();
          }
          CKPTSIM_CHECK(leaf.is_sharded_tensor(),
                        "request holds a non-ShardedBase leaf after extraction");
          const ShardedTensor& st = *leaf.sharded_tensor();
          auto it = by_key.find(st.key);
          if (it == by_key.end()) {
            // LoadOptions::allow_missing_keys (RX allow_partial_load): logged, skipped; the
            // request's tensor keeps what it held.
            if (options.allow_missing_keys) {
              if (report != nullptr) {
                report->uncovered.push_back(st.key + ": not in the checkpoint, skipped");
                for (const FlatRun& run : flat_runs(st)) {
                  report->unwritten.push_back(
                      {st.key, run.global_offset, run.numel, /*missing_key=*/true});
                }
              }
              return Value(st.data);
            }
            std::string keys;
            size_t shown = 0;
            for (const auto& [k, _] : by_key) {
              if (shown++ == 4) {
                keys += ", ...";
                break;
              }
              keys += (keys.empty() ? "" : ", ") + py_str_repr(k);
            }
            // torch.distributed.checkpoint's planner raises the KeyError on the reading rank and
            // the load reports it wrapped in a CheckpointException (seen on the real code).
            throw UpstreamError(
                "CheckpointException",
                "KeyError: " +
                    py_str_repr(st.key + " from model not in state dict: [" + keys + "]"),
                "torch.py load()");
          }
          const int64_t saved_global = it->second.front()->global_numel;
          if (saved_global != global_numel_of(st)) {
            throw CheckpointingException(
                fmt::format(
                    "Global shape mismatch for loaded ({}) and expected ({}) tensor for key {}",
                    shape_repr({saved_global}), shape_repr(st.global_shape), st.key),
                "torch.py _validate_global_shapes()");
          }
          for (const SavedPiece* p : it->second) {
            fail_if(*p, index->problems[static_cast<size_t>(p - index->pieces.data())]);
          }
          bool skipped =
              !options.skip_optimizer_piece || !std::string_view(st.key).starts_with("optimizer.");
          const at::Tensor flat = host::view_flat(st.data);
          for (const FlatRun& run : flat_runs(st)) {
            read_run(st.key, run.global_offset, run.global_offset + run.numel,
                     host::narrow(flat, run.local_offset, run.numel), it->second, skipped);
          }
          return Value(st.data);
        },
        sharded);
  };
  if (options.gathers_read_errors) {
    read_gathering_errors(group, read_every_leaf);
  } else {
    read_every_leaf();
  }
  merge(common, sharded, options.merge);
  return common;
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

std::string checkpoint_problem(const Storage& storage) {
  // The load's own index of these bytes (a save primed it): no parse of a file just written.
  auto index = shared_load_index(storage);
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
