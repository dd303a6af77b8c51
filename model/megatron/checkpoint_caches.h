// CheckpointCaches: what the save and the load of one run may reuse instead of computing again
// (LevelDB's Options::block_cache style): one object per run, owned by whoever runs the world
// (sim/driver.cpp makes one per scenario run), lent to save() and load() through
// SaveOptions::caches and LoadOptions::caches. A null pointer there means no caching: every load
// parses metadata.json, every save decodes rank 0's common state. What comes back is the same
// either way; only the work and the sharing differ.
//
// What it holds:
//   - the LoadIndex of a metadata.json (model/megatron/serialization.h): every rank of a job
//     loads the same file, so equal bytes are parsed once per run and the ranks share the
//     result (at DP 4096 a parse per rank was 4096 parses of a 5 MB file, all held at once
//     across the load's collective);
//   - the decoding of rank 0's common state that save() compares every rank's with: every rank
//     decodes the same broadcast bytes and only reads what they decode to.
//
// Invariants:
//   1. load_index(storage) equals a fresh parse of the file's current bytes: the cache is keyed
//      by the whole content (compared byte for byte), never by path or by storage.
//      decoded_common_state(bytes) equals a fresh decoding of `bytes`, compared whole.
//   2. Immutable results: an index or a decoding is reachable only as const; an index's pieces
//      are fingerprinted when parsed and checked by check_load_indexes_unchanged().
//   3. Bounded: the object holds the latest index (so the simulator can check it after a
//      phase), the latest primed one (prime_load_index), weak references to at most
//      kLoadIndexCacheEntriesMax others, and one decoding; an index nothing holds any more is
//      freed, and everything goes with the object at the end of its run.
//   4. Not shared between runs: `check --jobs N` runs its cases on N threads, each with its own
//      object. Within a run the ranks of a world may still call it from several threads
//      (Execution::kThreads), so every member takes the object's lock.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/megatron/ckptsim_format.h"
#include "model/py/value.h"
#include "model/storage.h"

namespace ckptsim::model {

inline constexpr size_t kLoadIndexCacheEntriesMax = 8;

class CheckpointCaches {
 public:
  CheckpointCaches() = default;
  CheckpointCaches(const CheckpointCaches&) = delete;
  CheckpointCaches& operator=(const CheckpointCaches&) = delete;

  // Reads metadata.json and returns its index, parsed now or shared from an earlier call on
  // equal bytes. Status: what read_checkpoint_pieces would return (errors are not cached).
  Result<std::shared_ptr<const LoadIndex>> load_index(const Storage& storage);

  // Puts the index of the metadata.json `storage` holds, built from the `pieces` it lists, into
  // the cache, as a parse of it would (invariant 1 holds because the text carries every field
  // of every piece); save() calls it after writing the file. The latest primed index stays
  // alive until the next prime. `written`: the bytes save() wrote, metadata_json(
  // common_in_common_pt, pieces, object_keys). Nothing is primed unless the file holds exactly
  // them: a write that landed short (a storage fault) left other bytes, whose index is whatever
  // a parse of them gives.
  void prime_load_index(const Storage& storage, const std::vector<SavedPiece>& pieces,
                        const std::vector<std::string>& object_keys, bool common_in_common_pt,
                        const std::vector<char>& written);

  // check_unchanged() on every index the object still reaches (the simulator calls it after
  // each phase, when the ranks that shared an index are done with it).
  void check_load_indexes_unchanged() const;

  // Rank 0's common state decoded from the pickle `bytes` save() broadcast; shared with the
  // last call on equal bytes. Throws InvariantViolation when they do not decode.
  std::shared_ptr<const Value> decoded_common_state(const std::vector<char>& bytes);

 private:
  std::shared_ptr<const LoadIndex> find_locked(
      const std::shared_ptr<const std::vector<char>>& bytes);
  std::shared_ptr<const LoadIndex> insert(std::shared_ptr<const LoadIndex> index);

  mutable std::mutex mu_;
  std::vector<std::weak_ptr<const LoadIndex>> entries_;  // oldest first
  std::shared_ptr<const LoadIndex> latest_;
  std::shared_ptr<const LoadIndex> primed_;
  std::vector<char> decoded_bytes_;  // the key of decoded_ (meaningless while it is null)
  std::shared_ptr<const Value> decoded_;
};

// `caches`->load_index(storage), or with no caches a parse of the file now.
Result<std::shared_ptr<const LoadIndex>> load_index(const Storage& storage,
                                                    CheckpointCaches* caches);
// `caches`->decoded_common_state(bytes), or with no caches a decoding now.
std::shared_ptr<const Value> decoded_common_state(const std::vector<char>& bytes,
                                                  CheckpointCaches* caches);

}  // namespace ckptsim::model
