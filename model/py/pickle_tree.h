// PickleTree: the object graph of a Python pickle, read without running any Python: what
// `pickle.load` would build, with every class reference left as a name. It is the sibling of
// model/py/pickle_codec.h for pickles that libtorch's own unpickler refuses: the
// `.metadata` of torch.distributed.checkpoint (dataclasses of
// torch.distributed.checkpoint.metadata) and the torch.save blobs of Megatron's
// ShardedObjects (dtype globals as dict keys, optimizer classes as values). Interpreting the
// graph (which class means what) is the caller's job: model/torch/torch_save_format.h for
// torch.save blobs, model/torch/distributed_checkpoint.h for `.metadata`.
// Mirrors CPython Lib/pickle.py _Unpickler (the opcodes of protocols 2 to 5 that pickle
// writes for dicts, lists, tuples, scalars, str, bytes, globals and objects).
//
// Invariants:
//   1. Nothing is executed: a GLOBAL is a node naming "module.qualname"; REDUCE, NEWOBJ and
//      BUILD make or complete an kObject node (class name, args, state). The one exception is
//      collections.OrderedDict() with no arguments, which becomes a kDict (it is a dict).
//   2. Only the globals named in `allowed_globals` may appear; any other is the error
//      "unknown pickle class 'module.name'", so a caller states what it accepts.
//   3. Every malformed input is a Status (corruption), never a crash or an exception: an
//      unknown or unsupported opcode (by name and byte offset), a truncated stream, a stack
//      underflow, a memo miss, a limit exceeded (the k*Max constants below), a second BUILD
//      of one object, a SETITEM on a non-dict. Its message is one line: a class name read
//      from the input is quoted as Python's repr writes it.
//   4. The graph returned is acyclic and at most kPickleTreeDepthMax containers deep (checked
//      once the stream has been read: a list appended to itself, say, is an error), so a
//      caller may walk it recursively. Nodes live in one arena (`nodes`) and refer to each
//      other by index, so no destructor recurses.
//   5. Shared references survive: an object memoized once and fetched twice is one node.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "model/status.h"

namespace ckptsim::model {

inline constexpr size_t kPickleTreeBytesMax = size_t{64} << 20;  // one pickle stream
inline constexpr size_t kPickleTreeNodesMax = size_t{1} << 22;   // nodes of one graph
inline constexpr size_t kPickleTreeStackMax = size_t{1} << 20;   // stack + mark entries
inline constexpr size_t kPickleTreeMemoMax = size_t{1} << 22;    // memo slots
inline constexpr size_t kPickleTreeDepthMax = 64;                // containers in containers
inline constexpr size_t kPickleIntBytesMax = 8;                  // LONG1/LONG4 payloads

using PickleNodeId = uint32_t;

struct PickleNode {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kStr,
    kBytes,
    kTuple,
    kList,
    kDict,
    kGlobal,      // text: "module.qualname"
    kObject,      // text: class name; items[0]: args tuple; state (or kNoState)
    kPersistent,  // items[0]: the persistent id (BINPERSID)
  };
  static constexpr PickleNodeId kNoState = UINT32_MAX;

  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double floating = 0.0;
  std::string text;                 // kStr, kBytes (raw bytes), kGlobal, kObject
  std::vector<PickleNodeId> items;  // kTuple, kList; kDict: key, value, key, value, ...
  PickleNodeId state = kNoState;    // kObject: what BUILD set
};

struct PickleTree {
  std::vector<PickleNode> nodes;
  PickleNodeId root = 0;

  const PickleNode& at(PickleNodeId id) const { return nodes.at(id); }
  // "dict", "torch.Size object", ... for messages.
  std::string describe(PickleNodeId id) const;
};

struct PickleTreeOptions {
  std::set<std::string> allowed_globals;  // "module.qualname"
};

// REQUIRES: nothing of `bytes` (every malformed input is a Status, invariant 3).
Result<PickleTree> read_pickle_tree(std::span<const char> bytes, const PickleTreeOptions& options);

}  // namespace ckptsim::model
