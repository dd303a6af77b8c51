// ckptsim's own checkpoint format: what save() (model/megatron/serialization.h) writes and
// load() reads. Not upstream's (torch_dist's .distcp files are model/megatron/torch_dist_*.h);
// the files carry the same state, in a layout of our own that is cheap to write and to check.
//
// The checkpoint (through model/storage.h, a directory or memory with the same bytes):
//   common.pt             rank 0's common state, torch::pickle_save (torch.load can read it)
//   common_globals.json   the classes the common state names, when it names any (the load
//                         refuses them as torch.load(weights_only=True) does)
//   metadata.json         every saved tensor piece and object, written by rank 0 at the end
//   shards/rank_<r>.bin   the tensor pieces rank r was main replica of: each piece's raw bytes
//                         after a 16-byte header naming it (a magic, then FNV-1a of its key,
//                         dtype and place; metadata.json's "piece_header_bytes")
//   objects/<unique_key>.pt  each ShardedObject, pickled by its main replica
//
// A piece is a run of a ShardedTensor's global tensor flattened row-major (flat_runs): the
// format stores pieces 1-D, where DCP stores the N-D box (the same elements).
//
// Invariants:
//   1. metadata.json's text holds every field of every piece, so an index built from the
//      pieces a save wrote equals a parse of the text (CheckpointCaches::prime_load_index).
//   2. Every read is bounds-checked against the piece's tensor and its file (piece_problem,
//      piece_damage): a damaged metadata.json is reported, never read past a buffer.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/megatron/mapping.h"
#include "model/py/value.h"
#include "model/storage.h"

namespace ckptsim::model {

class CheckpointCaches;

struct SavedPiece {
  std::string key;
  std::string dtype;  // torch dtype name
  int64_t global_numel = 0;
  int64_t global_offset = 0;
  int64_t numel = 0;
  int rank = 0;
  std::string file;
  int64_t byte_offset = 0;
  bool operator==(const SavedPiece&) const = default;
};

// FNV-1a over every field of every piece, in order.
uint64_t fingerprint(const std::vector<SavedPiece>& pieces);

struct SavedObject {
  std::string unique_key;  // '<key>/shard_<offset>_<shape>'
  std::string file;        // objects/<unique_key>.pt, a pickle_codec blob of the object
};

struct CheckpointIndex {
  std::vector<SavedPiece> pieces;
  std::vector<SavedObject> objects;  // in save order
  bool common_in_common_pt = false;  // else in the ShardedObject 'common_state/shard_0_1'
  bool piece_headers = false;        // "piece_header_bytes": each piece's bytes follow a header
};

// metadata.json as load() reads it: the pieces, each key's pieces in metadata order, and what
// is wrong with each piece against its own tensor ("" when nothing; its file is checked when
// read). The ranks of a run share it through CheckpointCaches (checkpoint_caches.h), so it is
// immutable once built: its pieces' fingerprint, taken then, is checked by check_unchanged().
struct LoadIndex {
  // The metadata.json it was built from (a cache's key): the storage's own shared bytes where
  // it shares them (Storage invariant 8), so that a read of the same file is a hit without
  // comparing 7 MB per rank.
  std::shared_ptr<const std::vector<char>> bytes;
  std::vector<SavedPiece> pieces;
  std::map<std::string, std::vector<const SavedPiece*>> by_key;  // into pieces
  std::vector<std::string> problems;                             // per piece
  uint64_t pieces_fingerprint = 0;
  bool piece_headers = false;  // every piece's bytes follow its header (metadata.json says so)
  std::vector<SavedObject> objects;  // in save order
  bool common_in_common_pt = false;  // else in the ShardedObject 'common_state/shard_0_1'

  void check_unchanged() const;
};

// What a checkpoint holds, whole: how a checkpoint written elsewhere (the real code's
// torch_dist format, model/megatron/torch_dist_checkpoint.h) enters the model's load.
struct CheckpointContents {
  std::map<std::string, at::Tensor> tensors;    // key -> the full tensor (1-D, or flattened)
  std::map<std::string, Value> objects;         // unique key ('<key>/shard_0_1') -> the object
  Value common;                                 // the common state dict
  bool common_state_as_sharded_object = false;  // HEAD: the object 'common_state/shard_0_1'
};

// Writes `contents` into `storage` in the model's own format, as if one rank (rank 0) had saved
// every tensor whole: load() then reads it at any DP size. Errors (a storage error, a tensor
// of a dtype the format has no name for) name the file or the key.
Status write_checkpoint_contents(const CheckpointContents& contents, Storage& storage);

// The text of metadata.json: {"common": "common.pt" or null, "format": "ckptsim-dist-v1",
// "objects": [{"file", "unique_key"}...], "piece_header_bytes": 16,
// "pieces": [{every field of SavedPiece}...]}, byte for
// byte what nlohmann::json's dump(1) gives for it (keys sorted, one space per level), written
// without building the JSON tree. Throws nlohmann's type_error on a string that is not UTF-8.
std::string metadata_json(bool common_in_common_pt, const std::vector<SavedPiece>& pieces,
                          const std::vector<std::string>& object_keys);

// The pieces listed in a checkpoint's metadata.json (for checkers). Status names the file.
Result<std::vector<SavedPiece>> read_checkpoint_pieces(const Storage& storage);

// "" when `file` (the piece's whole file) holds p's bytes in bounds and, where `headers` (the
// checkpoint's index says piece_headers), p's header right before them; else what is wrong.
// What the load, checkpoint_problem and the torch_dist export each check a piece with.
std::string piece_damage(const SavedPiece& p, const std::vector<char>& file, bool headers);

// Everything metadata.json lists (for exporters, model/megatron/torch_dist_writer.h).
Result<CheckpointIndex> read_checkpoint_index(const Storage& storage);
// The checkpoint's common state, from common.pt or the 'common_state' ShardedObject (for
// checkers and reports).
Result<Value> read_common_state(const Storage& storage);
// Every saved tensor whose key starts with `key_prefix`, assembled from its pieces as one
// global tensor of floats (NaN where no piece was saved). Every read is bounds-checked: a
// piece outside its tensor, bytes past the end of a file, an unknown dtype or pieces that
// disagree on the global size are a corruption Status naming the file and the key.
Result<std::map<std::string, std::vector<float>>> read_checkpoint_tensors(
    const Storage& storage, const std::vector<SavedPiece>& pieces, std::string_view key_prefix);
// What keeps the checkpoint in `storage` from being whole ("" when nothing): metadata.json
// unreadable, a piece's file missing or shorter than the piece, an object's file missing, the
// common state unreadable. Reads no tensor data (a check, for the simulator's judges). With
// `caches`, the index is the run's (a save primed it: no parse of a file just written).
std::string checkpoint_problem(const Storage& storage, CheckpointCaches* caches = nullptr);

// The format's parts that save(), load() and CheckpointCaches build on: file names, the piece
// layout, the entries the ranks gather at the end of a save.
namespace own_format {

inline constexpr const char* kCommonFile = "common.pt";
inline constexpr const char* kMetadataFile = "metadata.json";
inline constexpr const char* kFormat = "ckptsim-dist-v1";
// ShardedObject("common_state", None, (1,), (0,)).unique_key: HEAD's home of the common state.
inline constexpr const char* kCommonStateObjectKey = "common_state/shard_0_1";
// The classes the common state holds (a param group's cpu_optimizer_cls ...): torch.save
// pickles each as a GLOBAL, which torch.load(weights_only=True) refuses. The model's own
// common.pt keeps a symbol as its name, so the save lists them here for the load to refuse
// as torch does (absent when there are none).
inline constexpr const char* kCommonGlobalsFile = "common_globals.json";

std::string rank_file(int rank);                         // shards/rank_<r>.bin
std::string object_file(const std::string& unique_key);  // objects/<unique_key>.pt

// Appends p's header to `blob` and sets p.byte_offset to where its bytes begin, after it.
void append_piece_header(std::vector<char>& blob, SavedPiece& p);

// A ShardedTensor's elements as runs of its global tensor flattened row-major: each run is
// contiguous in the global tensor and in the local data, runs in the local data's order. A TP
// piece split on dim 0 is one run; one split on dim 1 is one run per row.
struct FlatRun {
  int64_t global_offset = 0;
  int64_t local_offset = 0;
  int64_t numel = 0;
};
std::vector<FlatRun> flat_runs(const ShardedTensor& st);
int64_t global_numel_of(const ShardedTensor& st);

// The dotted names of the classes in `common`, in pickling (depth-first, insertion) order.
std::vector<std::string> class_globals(const Value& common);

// The dtype a piece's name stands for; nullopt for a name the format has none for.
std::optional<at::ScalarType> dtype_from_name_checked(const std::string& name);

// What each rank sends rank 0 at the end of a save: its pieces and its sharded objects, as
// flat bytes (a JSON text per rank, parsed by every rank, cost more than the rest of a small
// save). Ranks of one world share a byte order, as c10d's object collectives assume too.
struct RankEntries {
  std::vector<SavedPiece> pieces;
  std::vector<std::pair<std::string, bool>> objects;  // unique_key, is main replica
};
std::vector<char> encode_entries(const RankEntries& e);

// The save's gathered entries, decoded once for every rank that shares them (GatheredObjects).
struct GatheredEntries {
  std::vector<SavedPiece> pieces;  // every rank's, in rank order
  uint64_t pieces_fingerprint = 0;
  std::map<std::string, int> main_replicas;  // unique_key -> main replicas
  std::vector<std::string> object_order;     // objects with a main replica, first-seen order
};
GatheredEntries decode_gathered(const std::vector<std::vector<char>>& all);

Result<CheckpointIndex> parse_checkpoint_index(const std::vector<char>& bytes);
// What a parse of metadata_json(common_in_common_pt, pieces, object_keys) gives.
CheckpointIndex written_index(const std::vector<SavedPiece>& pieces,
                              const std::vector<std::string>& object_keys,
                              bool common_in_common_pt);
// The load's index of `parsed`, the index of `bytes`.
std::shared_ptr<LoadIndex> make_load_index(std::shared_ptr<const std::vector<char>> bytes,
                                           CheckpointIndex parsed);

// What is wrong with a saved piece against its tensor and, when its size is given, its file
// ("" when nothing): a piece of a damaged metadata.json must be reported, never read past its
// buffer.
std::string piece_problem(const SavedPiece& p, std::optional<size_t> file_size);

// The common state's file (common.pt, else HEAD's 'common_state' object) and its bytes.
struct CommonStateBytes {
  std::string file;
  std::shared_ptr<const std::vector<char>> bytes;
};
Result<CommonStateBytes> read_common_state_bytes(const Storage& storage);

}  // namespace own_format

}  // namespace ckptsim::model
