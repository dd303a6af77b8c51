// A real Megatron-LM checkpoint in the `torch_dist` format, read side (the write side, from
// the model's own checkpoints, is model/megatron/torch_dist_writer.h): what
// megatron/training/checkpointing.py save_checkpoint() leaves on disk with
// `--ckpt-format torch_dist`, read into the model's Values without Python.
//
//   <dir>/latest_checkpointed_iteration.txt   the tracker: the last saved iteration
//   <dir>/iter_NNNNNNN/metadata.json          dist_checkpointing's own (backend and version)
//   <dir>/iter_NNNNNNN/.metadata, *.distcp    torch.distributed.checkpoint
//                                             (model/torch/distributed_checkpoint.h)
//   <dir>/iter_NNNNNNN/common.pt              the common state, a torch.save of a dict; at
//                                             upstream HEAD (d98e8a64dd) absent, the common
//                                             state being the ShardedObject 'common_state'
//
// Mirrors megatron/training/checkpointing.py read_metadata() and get_checkpoint_name(),
// megatron/core/dist_checkpointing/core.py (metadata.json), serialization.py
// load_common_state_dict() and strategies/torch.py (a ShardedObject is saved as the
// torch.save of the list of its local shards' data, under its unique key
// '<key>/shard_<offset>_<shape>').
//
// Accepted: metadata.json with sharded_backend 'torch_dist' version 1 and common_backend
// 'torch' version 1 (f4502eb1c9, miles-main) or no common_backend (HEAD d98e8a64dd); the
// `.metadata` and torch.save versions model/torch/ accepts; an integer tracker ('release' is
// refused).
//
// Invariants:
//   1. `sharded` holds every key of the checkpoint: each ShardedTensor key with its full
//      tensor (its chunks tiling it exactly once), each ShardedObject under its key (its
//      unique key without '/shard_0_1' when its global shape is (1,); else the unique key)
//      with its object. `common` is the common state dict, from common.pt when present, else
//      from 'common_state' (which then also stays in `sharded`).
//   2. The iteration is the tracker's, and the common state's 'iteration' must agree.
//   3. Every malformed input is a Status with a one-line message naming the file and, where
//      there is one, the key: a missing tracker, iter dir, `.metadata` or common state, an
//      unreadable item, a chunk of another shape than its metadata, chunks that do not tile.
//      Names and text from the files are quoted as Python's repr writes them.
//   4. dp_size_at_save is set only when the files prove it (see there); else nullopt.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "model/megatron/optimizer_key.h"
#include "model/megatron/serialization.h"
#include "model/py/value.h"
#include "model/status.h"
#include "model/storage.h"
#include "model/torch/distributed_checkpoint.h"

namespace ckptsim::model {

inline constexpr std::string_view kTrackerFile = "latest_checkpointed_iteration.txt";
inline constexpr std::string_view kCommonStateFile = "common.pt";
inline constexpr std::string_view kCommonStateObjectKey = "common_state";
inline constexpr size_t kTrackerBytesMax = 64;                    // the tracker file
inline constexpr size_t kMegatronMetadataJsonBytesMax = 1 << 16;  // metadata.json
inline constexpr int64_t kIterationMax = 9'999'999'999;           // iter_%07d, any width

// One bucket of the dp_reshardable optimizer state: every state tensor of
// optimizer.distributed.dp_group_idx_G.gbuf_idx_g.dtype_D.bucket_idx_b, each of
// numel_unpadded elements (params and the padding between them, not the DP padding).
struct DpReshardableBucket {
  OptimizerBucketKey key;  // state empty
  // The ChainedOptimizer part whose 'chained_<i>.' prefixes the keys (nullopt: no prefix).
  std::optional<int64_t> chained_part;
  int64_t numel_unpadded = 0;
  std::map<std::string, at::Tensor> states;  // "param", "exp_avg", "exp_avg_sq", ...
};

// The bucket's key as the checkpoint spells it (its part's prefix, then format_bucket_prefix).
std::string bucket_key_text(const DpReshardableBucket& bucket);
// The key of its DP group's ShardedObject `name` (per_bucket_numel, ...), with the prefix.
std::string bucket_object_key(const DpReshardableBucket& bucket, std::string_view name);

struct TorchDistCheckpoint {
  int64_t iteration = 0;
  // Where `iteration` comes from: "the tracker", "the directory's name" (iter_NNNNNNN), "the
  // common state" ('iteration'), or "" when nothing says it (then iteration is 0).
  std::string iteration_from;
  std::string iter_dir;                     // relative to the storage, e.g. "phase1/iter_0000006"
  bool common_from_sharded_object = false;  // upstream HEAD: no common.pt
  Value common;                             // the common state dict
  Value sharded;                            // Dict: key -> full tensor or object (invariant 1)
  // Each ShardedObject of `sharded` (by its key there) -> its unique key in the checkpoint
  // ('<key>/shard_<offset>_<shape>'); tensors are not in it.
  std::map<std::string, std::string> object_unique_keys;
  std::vector<DpReshardableBucket> buckets;  // in key order
  // content_metadata['distrib_optim_sharding_type'] of the common state (else
  // optimizer.param_state_sharding_type); empty when neither is there.
  std::string sharding_type;
  // The ranks that wrote a data file (`__<rank>_<n>.distcp` named by `.metadata`).
  int64_t writer_ranks = 0;
  // DP size at save: writer_ranks, when the files prove it: ranks 0..W-1 all wrote, and
  // every bucket's per_bucket_numel (its DP-padded size) is a multiple of W with each chunk
  // saved by rank r inside [r, r + 1) * per_bucket_numel / W, as
  // sharded_param_state_dp_reshardable places it. (dp_reshardable asserts that no rank's
  // bucket is empty, so every DP rank writes.) With TP = PP = 1, as here, world = DP.
  std::optional<int64_t> dp_size_at_save;
  // Each tensor's chunks as `.metadata` lists them (which offsets and sizes some rank saved):
  // a model param saved at TP > 1 shows its split here.
  std::map<std::string, std::vector<ChunkStorageMetadata>> tensor_chunks;
};

// The distributed optimizer's state_dict() (a dict with 'param_groups'), where its format keeps
// it: the ShardedObject 'optimizer.distributed.dp_group_idx_0.optimizer' (dp_reshardable and the
// other bucket formats), else the common state's ['optimizer']['optimizer'] (fully_reshardable
// keeps it unwrapped); nullptr when neither holds a dict.
// `part`: that part's ('chained_<part>.optimizer.distributed.dp_group_idx_0.optimizer') in a
// chained checkpoint (chained_parts() > 1); part 0 is also an unprefixed checkpoint's.
const Value* optimizer_state_object(const TorchDistCheckpoint& checkpoint, int64_t part = 0);

// How many ChainedOptimizer parts prefix their keys (1 + the largest 'chained_<i>.' of a key);
// 1 where no key has the prefix.
int64_t chained_parts(const TorchDistCheckpoint& checkpoint);

// An integer the common state's 'args' (Megatron's saved arguments) holds; nullopt when there
// are no args or no such integer.
std::optional<int64_t> saved_arg_int(const TorchDistCheckpoint& checkpoint, const char* name);

// Mirrors dist_checkpointing/core.py check_is_distributed_checkpoint / maybe_load_config:
// `<iter_dir>/metadata.json` names the backends; only torch_dist + torch, version 1 are read.
// not_found when it is absent, corruption when it is no JSON object (or too large or deep),
// invalid_input for another backend; each names the file.
Status check_megatron_metadata(const Storage& storage, const std::string& iter_dir);

// The rank R of a FileSystemWriter data file "__R_N.distcp"; nullopt for another name.
std::optional<int64_t> writer_rank(const std::string& file);

// Mirrors checkpointing.py read_metadata(): the iteration in `<dir>/<kTrackerFile>`.
Result<int64_t> read_checkpoint_tracker(const Storage& storage, const std::string& dir);

// Mirrors checkpointing.py get_checkpoint_name(): "iter_%07d".
std::string iteration_dir_name(int64_t iteration);

// Reads the checkpoint that `<dir>/<kTrackerFile>` points to ("" is the storage's root).
Result<TorchDistCheckpoint> read_torch_dist_checkpoint(const Storage& storage,
                                                       const std::string& dir);

// Reads one iteration directory; `iteration` is what the tracker said (checked against the
// common state's).
Result<TorchDistCheckpoint> read_torch_dist_iteration(const Storage& storage,
                                                      const std::string& iter_dir,
                                                      int64_t iteration);

// Reads the directory `iter_dir` itself, without a tracker: the directory that holds `.metadata`
// (what a bug report attaches, or what a plain dist_checkpointing.save wrote). The iteration is
// the one its name says (iter_NNNNNNN, checked against the common state's), else the common
// state's 'iteration', else unknown (iteration_from "").
// `zero_filled`: data files (as `.metadata` names them) whose tensor chunks that do not read
// are zeros (DcpReader::read_lost_chunks_as_zeros; a damaged checkpoint's inspection).
Result<TorchDistCheckpoint> read_torch_dist_directory(
    const Storage& storage, const std::string& iter_dir,
    const std::set<std::string>& zero_filled = {});

// What the checkpoint holds, for the model's own format (write_checkpoint_contents): every
// tensor, every ShardedObject under its unique key, and the common state where it was found.
CheckpointContents checkpoint_contents(const TorchDistCheckpoint& checkpoint);

}  // namespace ckptsim::model
