// dist_checkpointing save() and load() with upstream's order of operations (spec §9.3, §9.4).
// Mirrors megatron/core/dist_checkpointing/serialization.py save()/load(),
// state_dict_utils.py save_preprocess()/load_preprocess(), validation.py
// validate_sharding_integrity() and the torch_dist strategy's shape checks
// (strategies/torch.py _validate_global_shapes).
//
// The checkpoint (through model/storage.h, a directory or memory with the same bytes):
//   common.pt             rank 0's common state, torch::pickle_save (torch.load can read it)
//   metadata.json         every saved tensor piece and object, written by rank 0 at the end
//   shards/rank_<r>.bin   the tensor pieces rank r was main replica of: each piece's raw bytes
//                         after a 16-byte header naming it (a magic, then FNV-1a of its key,
//                         dtype and place; metadata.json's "piece_header_bytes")
//   objects/<unique_key>.pt  each ShardedObject, pickled by its main replica
//
// Invariants (each is a behavior a bug depends on):
//   1. save: LocalNonpersistentObjects are dropped; everything that is neither a ShardedBase
//      nor an LNO is common state; only global rank 0's common state is persisted (other
//      ranks' differing common state is reported as a warning, as upstream logs it).
//   2. save: a ShardedTensor or ShardedObject is written only by its main replica.
//   3. load: the result is checkpoint common ∪ local LNO values ∪ loaded sharded values,
//      merged in that order with dict_utils.merge (duplicate leaf / list length ValueErrors).
//   4. load: every ShardedTensor is read *in place* into the request's data tensor (its
//      identity is kept), resliced from whatever pieces the saving ranks wrote, so any DP
//      size can read any other's checkpoint; ShardedObjects come back as new objects.
//   5. load: a requested key absent from the checkpoint is upstream's KeyError, which torch's
//      checkpoint load reports wrapped in a CheckpointException (or, with allow_missing_keys,
//      is skipped); a global shape mismatch is upstream's CheckpointingException.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/megatron/dict_utils.h"
#include "model/process_group.h"
#include "model/py/runtime.h"
#include "model/py/value.h"
#include "model/storage.h"

namespace ckptsim::model {

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

struct SaveReport {
  // _validate_common_state_dict: differences of this rank's common state from rank 0's,
  // one line each ("only on rank 1: ('optimizer', ...)"). Upstream logs these as warnings.
  std::vector<std::string> common_state_differences;
  // Every piece in the checkpoint (all ranks), metadata order. Every rank learns the same list
  // from the same gathered entries, so where the process group shares them
  // (GatheredObjects) the ranks share this list too: immutable, never null after a save.
  std::shared_ptr<const std::vector<SavedPiece>> pieces;
  uint64_t pieces_fingerprint = 0;  // fingerprint(*pieces) when the save decoded them

  // Throws InvariantViolation when *pieces is no longer what the save decoded (a write through
  // a const_cast into a list that other ranks share).
  void check_pieces_unchanged() const;
};

// One range of a requested ShardedTensor that the load did not write: the request's tensor
// keeps there what it was built with.
struct UnwrittenRange {
  std::string key;            // the ShardedTensor's key
  int64_t global_offset = 0;  // first element, in the key's global (flat) coordinates
  int64_t numel = 0;
  bool missing_key = false;  // the checkpoint lacks the key (allow_missing_keys); else a gap
};

struct LoadReport {
  // Requested elements that no saved piece covered (left as they were, as DCP does).
  std::vector<std::string> uncovered;
  // The same, as ranges of this rank's request, in the order met.
  std::vector<UnwrittenRange> unwritten;
};

struct LoadOptions {
  MergeOptions merge;
  // Revision switch load_strips_common_param_state: drop 'param_state' subtrees found under
  // an 'optimizer' key of the checkpoint's common state before merging.
  bool strip_common_param_state = false;
  // Revision switch load_allows_missing_keys (RX allow_partial_load): a requested tensor the
  // checkpoint lacks is skipped (its data stays as it was) instead of raising.
  bool allow_missing_keys = false;
  // Revision switch common_state_as_sharded_object: the common state may also be read from
  // the 'common_state' ShardedObject (HEAD); without it only common.pt is read.
  bool reads_sharded_common_state = false;
  // Revision switch common_load_allows_class_globals (see load_common_state_dict).
  bool allows_class_globals = false;
  // Revision switch load_reads_rank_local, negated: torch.distributed.checkpoint's
  // load_state_dict() gathers every rank's read result ("read" step), and a CheckpointException
  // that any rank's reads raised is raised on every rank, naming the ranks that failed. false
  // (HEAD's no_dist=True): each rank raises its own only.
  bool gathers_read_errors = false;
  // Fault site load.skip_piece (model/faults.h): skip the first saved piece this rank's request
  // of every 'optimizer.' key overlaps (reported in LoadReport::uncovered like any gap).
  bool skip_optimizer_piece = false;
  // Fault site load.skip_damaged_pieces (model/faults.h): a piece whose file is missing or too
  // short is skipped (its elements keep what the request held, reported as a gap) instead of
  // failing the load, as a reader that tolerates a partial checkpoint would.
  bool skip_damaged_pieces = false;
};

struct SaveOptions {
  // Revision switch common_state_as_sharded_object: write the common state as the
  // 'common_state' ShardedObject (rank 0's, main replica) instead of common.pt.
  bool common_state_as_sharded_object = false;
};

// Mirrors serialization.py save(). Collective: every rank of `group` calls it with its own
// sharded state dict. The state dict is consumed (LNOs dropped as upstream does in place).
SaveReport save(const Value& sharded_state_dict, Storage& storage, ProcessGroup& group,
                const SaveOptions& options = {});

struct SavedObject {
  std::string unique_key;  // '<key>/shard_<offset>_<shape>'
  std::string file;        // objects/<unique_key>.pt, a pickle_codec blob of the object
};

// metadata.json as load() reads it: the pieces, each key's pieces in metadata order, and what
// is wrong with each piece against its own tensor ("" when nothing; its file is checked when
// read). Every rank of a job loads the same file, so equal bytes are parsed once per process
// and the ranks share the result: at DP 4096 a parse per rank was 4096 parses of a 5 MB file,
// all held at once across the load's collective.
//
// Invariants:
//   1. shared_load_index(storage) equals a fresh parse of the file's current bytes: the cache
//      is keyed by the whole content (compared byte for byte), never by path or by storage.
//   2. Immutable: reachable only as const; the fingerprint of its pieces, taken when parsed,
//      is checked by check_unchanged() and by check_shared_load_indexes_unchanged().
//   3. Bounded: the cache holds the latest index (so the simulator can check it after a phase),
//      each thread's last primed one (prime_load_index), and weak references to at most
//      kLoadIndexCacheEntriesMax others; an index nothing holds any more is freed.
struct LoadIndex {
  // The metadata.json it was parsed from (the cache's key): the storage's own shared bytes
  // where it shares them (Storage invariant 8), so that a read of the same file is a hit
  // without comparing 7 MB per rank.
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
inline constexpr size_t kLoadIndexCacheEntriesMax = 8;
// Reads metadata.json and returns its index, parsed now or shared from an earlier call on equal
// bytes. Status: what read_checkpoint_pieces would return (errors are not cached).
Result<std::shared_ptr<const LoadIndex>> shared_load_index(const Storage& storage);
// Puts the index of the metadata.json `storage` holds, built from the `pieces` it lists, into
// the cache, as a parse of it would (invariant 1 holds because the text carries every field of
// every piece); save() calls it after writing the file. One primed index per thread stays
// alive until that thread primes another (invariant 3: bounded by the threads).
// `written`: the bytes save() wrote, metadata_json(common_in_common_pt, pieces, object_keys).
// Nothing is primed unless
// the file holds exactly them: a write that landed short (a storage fault) left other bytes,
// whose index is whatever a parse of them gives (until 2026-12-05 the pieces' index was primed
// under the cut bytes, and a load of a checkpoint with half a metadata.json went through).
void prime_load_index(const Storage& storage, const std::vector<SavedPiece>& pieces,
                      const std::vector<std::string>& object_keys, bool common_in_common_pt,
                      const std::vector<char>& written);
// check_unchanged() on every index the cache still reaches (the simulator calls it after each
// phase, when the ranks that shared an index are done with it).
void check_shared_load_indexes_unchanged();

// Mirrors serialization.py load(). Collective: every rank of `group` calls it with its own
// request. In upstream's order: the common state, merge() with the request's LNOs (its errors
// are each rank's own), then determine_global_metadata's all_gather_object (validation.py; a
// rank whose peer already failed fails there), then the reads. Returns the loaded state dict.
Value load(const Value& sharded_state_dict, const Storage& storage, ProcessGroup& group,
           const LoadOptions& options, LoadReport* report = nullptr);

// Mirrors serialization.py load_common_state_dict() (which training's load calls first):
// common.pt, or with `reads_sharded_common_state` (HEAD) the 'common_state' ShardedObject when
// there is no common.pt. Before HEAD a missing common.pt raises what upstream raises there:
// load_common's FileNotFoundError handler calls .iterdir() on the str path (AttributeError).
// A common.pt that holds a class (a param group's cpu_optimizer_cls: the HDO's in a fully
// reshardable format) fails as torch.load(weights_only=True) fails on it (UnpicklingError),
// unless `allows_class_globals` (a fix: the load allowlists them). The 'common_state' object
// loads with its classes: torch.distributed.checkpoint unpickles it with weights_only=False.
Value load_common_state_dict(const Storage& storage, bool reads_sharded_common_state,
                             bool allows_class_globals = false);

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

// Everything metadata.json lists (for exporters, model/megatron/torch_dist_writer.h).
// "" when `file` (the piece's whole file) holds p's bytes in bounds and, where `headers` (the
// checkpoint's index says piece_headers), p's header right before them; else what is wrong.
// What the load, checkpoint_problem and the torch_dist export each check a piece with.
std::string piece_damage(const SavedPiece& p, const std::vector<char>& file, bool headers);

struct CheckpointIndex {
  std::vector<SavedPiece> pieces;
  std::vector<SavedObject> objects;  // in save order
  bool common_in_common_pt = false;  // else in the ShardedObject 'common_state/shard_0_1'
  bool piece_headers = false;        // "piece_header_bytes": each piece's bytes follow a header
};
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
// common state unreadable. Reads no tensor data (a check, for the simulator's judges).
std::string checkpoint_problem(const Storage& storage);

}  // namespace ckptsim::model
