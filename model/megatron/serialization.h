// dist_checkpointing save() and load() with upstream's order of operations (spec §9.3, §9.4).
// Mirrors megatron/core/dist_checkpointing/serialization.py save()/load(),
// state_dict_utils.py save_preprocess()/load_preprocess(), validation.py
// validate_sharding_integrity() and the torch_dist strategy's shape checks
// (strategies/torch.py _validate_global_shapes).
//
// What the checkpoint's files are (ckptsim's own format, not upstream's) is
// model/megatron/ckptsim_format.h; what a run may reuse between the ranks' saves and loads is
// model/megatron/checkpoint_caches.h (SaveOptions::caches, LoadOptions::caches).
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

#include "model/megatron/checkpoint_caches.h"
#include "model/megatron/ckptsim_format.h"
#include "model/megatron/dict_utils.h"
#include "model/process_group.h"
#include "model/py/runtime.h"
#include "model/py/value.h"
#include "model/storage.h"

namespace ckptsim::model {

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
  // The run's caches (the metadata.json index); null: metadata.json is parsed at every load.
  CheckpointCaches* caches = nullptr;
};

struct SaveOptions {
  // Revision switch common_state_as_sharded_object: write the common state as the
  // 'common_state' ShardedObject (rank 0's, main replica) instead of common.pt.
  bool common_state_as_sharded_object = false;
  // The run's caches: the save primes the index of the metadata.json it writes and shares the
  // decoding of rank 0's common state between the ranks. Null: nothing is kept.
  CheckpointCaches* caches = nullptr;
};

// Mirrors serialization.py save(). Collective: every rank of `group` calls it with its own
// sharded state dict. The state dict is consumed (LNOs dropped as upstream does in place).
SaveReport save(const Value& sharded_state_dict, Storage& storage, ProcessGroup& group,
                const SaveOptions& options = {});

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

}  // namespace ckptsim::model
