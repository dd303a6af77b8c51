// Fuzzes model/py/pickle_tree.h read_pickle_tree() with raw pickle bytes: the `.metadata` of a
// torch.distributed.checkpoint and the data.pkl of every torch.save blob go through it first.
// Checked: a graph or a one-line Status (invariant 3); a graph is acyclic, at most
// kPickleTreeDepthMax containers deep, and every node it names exists (invariant 4).
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "fuzz/fuzz_targets.h"
#include "model/py/pickle_tree.h"

namespace ckptsim::fuzz {
namespace {

using model::PickleNode;
using model::PickleNodeId;
using model::PickleTree;

// The classes the two callers allow, a few of each (the fuzzer finds their names in the
// seeds; the reader's handling of a global does not depend on which one it is).
const model::PickleTreeOptions& options() {
  static const model::PickleTreeOptions o{std::set<std::string>{
      "torch._utils._rebuild_tensor_v2",
      "collections.OrderedDict",
      "torch.FloatStorage",
      "torch.BFloat16Storage",
      "torch.float32",
      "torch.bfloat16",
      "torch.optim.adamw.AdamW",
      "torch.Size",
      "torch.serialization._get_layout",
      "torch.distributed.checkpoint.metadata.Metadata",
      "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
      "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
      "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
      "torch.distributed.checkpoint.metadata.TensorProperties",
      "torch.distributed.checkpoint.metadata.MetadataIndex",
      "torch.distributed.checkpoint.metadata.StorageMeta",
      "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
      "torch.distributed.checkpoint.filesystem._StorageInfo",
  }};
  return o;
}

// Invariant 4, checked independently of the reader's own GraphCheck: depth-first from the
// root, each node's height computed once.
class Heights {
 public:
  explicit Heights(const PickleTree& tree) : tree_(tree), height_(tree.nodes.size(), kUnknown) {}

  size_t of(PickleNodeId id) {
    if (id >= tree_.nodes.size()) broken("a node id past the arena");
    if (height_[id] == kOnPath) broken("a graph with a cycle");
    if (height_[id] != kUnknown) return height_[id];
    height_[id] = kOnPath;
    const PickleNode& n = tree_.nodes[id];
    size_t h = 0;
    std::vector<PickleNodeId> children = n.items;
    if (n.state != PickleNode::kNoState) children.push_back(n.state);
    for (const PickleNodeId c : children) h = std::max(h, of(c) + 1);
    if (h > model::kPickleTreeDepthMax) broken("a graph deeper than kPickleTreeDepthMax");
    (void)tree_.describe(id);
    return height_[id] = h;
  }

 private:
  static constexpr size_t kUnknown = SIZE_MAX;
  static constexpr size_t kOnPath = SIZE_MAX - 1;
  const PickleTree& tree_;
  std::vector<size_t> height_;
};

}  // namespace

void fuzz_pickle_tree(std::span<const char> input) {
  Result<model::PickleTree> tree = model::read_pickle_tree(input, options());
  if (!tree.is_ok()) {
    check_error(tree.status(), "pickle");
    return;
  }
  Heights(tree.value()).of(tree.value().root);
}

}  // namespace ckptsim::fuzz

#ifndef CKPTSIM_FUZZ_IN_TESTS
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptsim::fuzz::fuzz_pickle_tree(ckptsim::fuzz::as_chars(data, size));
  return 0;
}
#endif
