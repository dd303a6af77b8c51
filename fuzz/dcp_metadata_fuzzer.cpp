// Fuzzes model/torch/distributed_checkpoint.h parse_dcp_metadata() with the bytes of a
// torch.distributed.checkpoint `.metadata` pickle. Checked: metadata or a one-line Status that
// names the file (invariant 4); parsed metadata keeps invariants 1 and 2 (every chunk inside
// its tensor, every storage item of a known key, in a plain file name, at a non-negative
// offset and length; every chunk and bytes key has its item).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_targets.h"
#include "model/torch/distributed_checkpoint.h"

namespace ckptsim::fuzz {
namespace {

void check_metadata(const model::DcpMetadata& m) {
  for (const auto& [fqn, t] : m.tensors) {
    if (m.bytes_items.contains(fqn)) broken("a key both a tensor and a bytes item: " + fqn);
    if (t.size.size() > model::kDcpDimsMax) broken("a tensor over kDcpDimsMax dims");
    for (const model::ChunkStorageMetadata& c : t.chunks) {
      if (c.offsets.size() != t.size.size() || c.sizes.size() != t.size.size()) {
        broken("a chunk of another rank than its tensor: " + fqn);
      }
      for (size_t d = 0; d < t.size.size(); ++d) {
        if (c.offsets[d] < 0 || c.sizes[d] < 0 || c.offsets[d] + c.sizes[d] > t.size[d]) {
          broken("a chunk outside its tensor: " + fqn);
        }
      }
      if (m.find(fqn, c.offsets) == nullptr) broken("a chunk without its item: " + fqn);
    }
  }
  for (const std::string& fqn : m.bytes_items) {
    if (m.find(fqn, std::nullopt) == nullptr) broken("a bytes key without its item: " + fqn);
  }
  for (const model::StorageDataEntry& e : m.storage_data) {
    const std::string& p = e.info.relative_path;
    if (p.empty() || p == "." || p == ".." || p.find('/') != std::string::npos) {
      broken("an item in '" + p + "', not a plain file name");
    }
    if (e.info.offset < 0 || e.info.length < 0) broken("an item at a negative offset or length");
    if (!m.tensors.contains(e.index.fqn) && !m.bytes_items.contains(e.index.fqn)) {
      broken("an item of an unknown key: " + e.index.fqn);
    }
  }
}

}  // namespace

void fuzz_dcp_metadata(std::span<const char> input) {
  const std::string file = "iter_0000001/.metadata";
  Result<model::DcpMetadata> meta = model::parse_dcp_metadata(input, file);
  if (!meta.is_ok()) {
    check_error(meta.status(), file);
    return;
  }
  check_metadata(meta.value());
}

}  // namespace ckptsim::fuzz

#ifndef CKPTSIM_FUZZ_IN_TESTS
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptsim::fuzz::fuzz_dcp_metadata(ckptsim::fuzz::as_chars(data, size));
  return 0;
}
#endif
