// torch.distributed.checkpoint (DCP) as FileSystemWriter lays it out in a directory, read
// side: `.metadata`, a pickled torch.distributed.checkpoint.metadata.Metadata naming every
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

// Mirrors metadata.py Metadata.
struct DcpMetadata {
  std::optional<std::string> version;
  std::map<std::string, TensorStorageMetadata> tensors;  // state_dict_metadata's tensors
  std::set<std::string> bytes_items;                     // state_dict_metadata's bytes items
  std::vector<StorageDataEntry> storage_data;            // in the order of the pickle

  // The item saved for (fqn, offset), as torch's MetadataIndex equality finds it; nullptr
  // when there is none.
  const StorageInfo* find(const std::string& fqn,
                          const std::optional<std::vector<int64_t>>& offset) const;
};

// The classes a `.metadata` pickle may name.
const std::set<std::string>& dcp_metadata_globals();

// Parses the bytes of a `.metadata` file. Errors name `file` (for the message only).
Result<DcpMetadata> parse_dcp_metadata(std::span<const char> bytes, const std::string& file);

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

 private:
  Result<std::span<const char>> read_item(const std::string& fqn, const StorageInfo& info);
  Status place_chunk(const std::string& fqn, const ChunkStorageMetadata& chunk,
                     const at::Tensor& piece, at::Tensor& full, at::Tensor& covered,
                     const std::string& file);

  const Storage& storage_;
  std::string dir_;
  DcpMetadata metadata_;
  std::map<std::string, std::vector<char>> files_;  // data files read so far
};

}  // namespace ckptsim::model
