// torch.distributed.checkpoint (DCP) as FileSystemWriter lays it out in a directory, read and
// write side: `.metadata`, a pickled torch.distributed.checkpoint.metadata.Metadata naming every
// saved key (a tensor with its chunks, or a bytes item) and where each item lies, and the
// `__<rank>_<n>.distcp` data files that hold the items back to back. Each tensor chunk is a
// torch.save blob of that chunk (model/torch/torch_save_format.h); each bytes item is the raw
// stream the saver gave (for Megatron, itself a torch.save blob).
// Mirrors torch/distributed/checkpoint/metadata.py (Metadata, TensorStorageMetadata,
// BytesStorageMetadata, ChunkStorageMetadata, TensorProperties, MetadataIndex) and
// filesystem.py (_StorageInfo, FileSystemReader.read_metadata / read_data).
//
// Accepted: Metadata.version "1.0.0" (what torch 2.11 writes) or no version (older torch
// with the same fields); pickle protocols 2 to 5; the classes of dcp_metadata_globals(); a
// _StorageInfo without transform descriptors (no compressed or transformed items).
//
// Invariants:
//   1. A key is a tensor or a bytes item, never both; a tensor's dtype and shape come from
//      its TensorProperties and size; every chunk lies inside the shape.
//   2. Every item of storage_data names a key of state_dict_metadata, a plain file name in
//      the checkpoint directory (no '/' and no control character, never "." or ".."), a
//      non-negative offset and length; on read, offset + length must lie inside that file.
//   3. read_tensor returns the full tensor: every chunk read, checked against its metadata
//      (dtype, shape) and copied to its offsets; the chunks must cover the tensor exactly
//      once (a gap or an overlap is an error).
//   4. Every error is a Status with one line naming the file (and the key where there is
//      one, quoted as Python's repr writes it, so a key with a newline stays on the line);
//      nothing here throws for bad bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "model/status.h"
#include "model/storage.h"

namespace ckptsim::model {

inline constexpr size_t kDcpKeysMax = size_t{1} << 20;           // keys of one checkpoint
inline constexpr size_t kDcpChunksMax = size_t{1} << 20;         // chunks of one tensor
inline constexpr int64_t kDcpTensorNumelMax = int64_t{1} << 31;  // elements of one tensor
inline constexpr size_t kDcpDimsMax = 16;                        // dimensions of one tensor
inline constexpr std::string_view kDcpMetadataFile = ".metadata";

// Mirrors metadata.py ChunkStorageMetadata.
struct ChunkStorageMetadata {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  bool operator==(const ChunkStorageMetadata&) const = default;
};

// Mirrors metadata.py TensorStorageMetadata (with TensorProperties reduced to the dtype: the
// other properties are deprecated upstream and checked to be the defaults).
struct TensorStorageMetadata {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> size;
  std::vector<ChunkStorageMetadata> chunks;
};

// Mirrors metadata.py MetadataIndex: offset is set for a tensor chunk, unset for bytes.
struct MetadataIndex {
  std::string fqn;
  std::optional<std::vector<int64_t>> offset;
  std::optional<int64_t> index;  // a hint only; torch's __eq__ ignores it
};

// Mirrors filesystem.py _StorageInfo.
struct StorageInfo {
  std::string relative_path;
  int64_t offset = 0;
  int64_t length = 0;
};

struct StorageDataEntry {
  MetadataIndex index;
  StorageInfo info;
};

// Mirrors metadata.py StorageMeta (its `modules` is always empty here; `load_id` is set by a
// reader, never saved).
struct DcpStorageMeta {
  std::optional<std::string> checkpoint_id;
  std::optional<std::string> save_id;
};

// Mirrors metadata.py Metadata.
struct DcpMetadata {
  std::optional<std::string> version;
  std::map<std::string, TensorStorageMetadata> tensors;  // state_dict_metadata's tensors
  std::set<std::string> bytes_items;                     // state_dict_metadata's bytes items
  std::vector<std::string> key_order;                    // state_dict_metadata's keys, in order
  std::vector<StorageDataEntry> storage_data;            // in the order of the pickle
  std::optional<DcpStorageMeta> storage_meta;

  // The item saved for (fqn, offset), as torch's MetadataIndex equality finds it; nullptr
  // when there is none.
  const StorageInfo* find(const std::string& fqn,
                          const std::optional<std::vector<int64_t>>& offset) const;
};

// The classes a `.metadata` pickle may name.
const std::set<std::string>& dcp_metadata_globals();

// Parses the bytes of a `.metadata` file. Errors name `file` (for the message only).
Result<DcpMetadata> parse_dcp_metadata(std::span<const char> bytes, const std::string& file);

// ---- write side ------------------------------------------------------------------------------
// Mirrors filesystem.py FileSystemWriter (one writer thread, no compression, no transforms)
// driven by Megatron's MCoreSavePlanner (strategies/torch.py: every rank writes its own items,
// bytes items included) and metadata.py's dataclasses as pickle.dump (protocol 4) writes them.
// Each rank writing items gets one data file `__<rank>_0.distcp`: its bytes items first, then
// its tensor chunks (filesystem.py _split_by_size_and_type puts bytes first), each chunk the
// torch.save of a tensor that owns exactly its elements (as filesystem.py clones a view
// before saving it). `.metadata` (what the coordinator writes after every rank) names every
// item. The state_dict_metadata keys come in the order the ranks first write them (rank 0
// first); a chunk's MetadataIndex.index is its position in its key's chunks (the hint
// create_default_global_save_plan sets), a bytes item's index is None.
//
// Write invariants (each violation an invalid_input Status naming the key, nothing written):
//   1. Every chunk of a key has the key's dtype and global size, as many dims, lies inside
//      it, and is written once per offset; no key is both a tensor and a bytes item; no
//      bytes key twice.
//   2. What is written parses back (parse_dcp_metadata) into the DcpMetadata returned.
//   3. Deterministic: the same items give the same bytes. storage_meta.save_id, a random
//      uuid4 in torch, is here a uuid4-shaped hash of the data files (nothing reads it on
//      load).
struct DcpChunkToWrite {
  std::string fqn;
  std::vector<int64_t> global_size;
  std::vector<int64_t> offsets;
  at::Tensor data;  // the chunk; its sizes are the chunk's
};

struct DcpBytesToWrite {
  std::string fqn;
  std::vector<char> bytes;
};

struct DcpRankToWrite {
  int64_t rank = 0;
  std::vector<DcpBytesToWrite> bytes_items;
  std::vector<DcpChunkToWrite> chunks;
};

struct DcpWriteOptions {
  // storage_meta.checkpoint_id: torch writes the directory it saved to; nothing reads it.
  std::string checkpoint_id;
};

// The `__<rank>_0.distcp` name of a rank's data file.
std::string dcp_data_file(int64_t rank);

// Writes `<dir>/__<rank>_0.distcp` for every rank with items, then `<dir>/.metadata`.
// REQUIRES: ranks in increasing rank order, each rank once.
Result<DcpMetadata> write_dcp_checkpoint(Storage& storage, const std::string& dir,
                                         const std::vector<DcpRankToWrite>& ranks,
                                         const DcpWriteOptions& options);

// The bytes of `.metadata` for `metadata` (pickle protocol 4, the classes of
// dcp_metadata_globals()). key_order, when set, orders state_dict_metadata and must name
// every key once. REQUIRES: metadata is well formed (as parse_dcp_metadata returns it);
// throws InvariantViolation otherwise.
std::vector<char> serialize_dcp_metadata(const DcpMetadata& metadata);

// Reads one checkpoint directory of `storage`: its `.metadata` first, then items on demand.
// Every data file is read at most once. Not thread-safe.
class DcpReader {
 public:
  // REQUIRES: storage outlives the reader.
  DcpReader(const Storage& storage, std::string dir);

  // Reads and parses `<dir>/.metadata`; not_found when it is absent.
  Status open();
  // REQUIRES: open() returned ok.
  const DcpMetadata& metadata() const { return metadata_; }

  // The full tensor of `fqn` from its chunks (invariant 3).
  Result<at::Tensor> read_tensor(const std::string& fqn);
  // The raw bytes of the bytes item `fqn`.
  Result<std::vector<char>> read_bytes(const std::string& fqn);
  // "dir/name", as messages print a file.
  std::string path(const std::string& name) const;
  // Tensor chunks saved in these data files (names as `.metadata` gives them) that do not read
  // (the file is missing or cut short) read as zeros: what a damaged checkpoint's inspection
  // infers its run from (model/megatron/checkpoint_damage.h). Bytes items are never filled.
  void read_lost_chunks_as_zeros(std::set<std::string> files) { zero_filled_ = std::move(files); }

 private:
  Result<std::span<const char>> read_item(const std::string& fqn, const StorageInfo& info);
  Status fits_its_items(const std::string& fqn, const TensorStorageMetadata& meta);
  Status place_chunk(const std::string& fqn, const ChunkStorageMetadata& chunk,
                     const at::Tensor& piece, at::Tensor& full, at::Tensor& covered,
                     const std::string& file);

  const Storage& storage_;
  std::string dir_;
  DcpMetadata metadata_;
  std::map<std::string, std::vector<char>> files_;  // data files read so far
  std::set<std::string> zero_filled_;
};

}  // namespace ckptsim::model
