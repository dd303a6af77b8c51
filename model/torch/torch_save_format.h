// The bytes of one torch.save (the zip format of torch >= 1.6), read into a Value as
// `torch.load(f, map_location='cpu')` would build it, without running Python: the zip is
// opened with libtorch's own reader (caffe2::serialize::PyTorchStreamReader), its
// `<archive>/data.pkl` is read by model/py/pickle_tree.h and every tensor is rebuilt from its
// `<archive>/data/<key>` record. This is what every item of a torch.distributed.checkpoint
// data file holds (a tensor chunk, or a Megatron ShardedObject's list of objects), and
// Megatron's common.pt. Mirrors torch/serialization.py load() (_load, persistent_load) and
// torch/_utils.py _rebuild_tensor_v2(), for what torch.save writes. It takes what real Python
// pickles hold and libtorch's unpickler refuses: dtype globals (torch.bfloat16), tuple dict
// keys ((torch.bfloat16, torch.float32)), optimizer classes as values. torch_save() below is
// the matching writer (the torch_dist exchange format); model/py/pickle_codec.h stays the
// model's own format's codec.
//
// Accepted: zip archives whose `version` record libtorch 1.13 accepts (torch 2.11 writes 3),
// pickle protocols 2 to 5, the globals of torch_save_globals() below.
//
// Mapping (pickle -> Value):
//   None, bool, int, float, str, tuple, list -> the same; dict, OrderedDict -> Dict
//   dict keys: int, str, a dtype (Key::symbol "torch.bfloat16"), tuples of these
//   a dtype global                 -> Value::symbol("torch.bfloat16")
//   an optimizer class global      -> Value::symbol("<class 'torch.optim.adamw.AdamW'>")
//   _rebuild_tensor_v2(storage...) -> a CPU at::Tensor with the saved dtype, size, stride
//                                     and offset; tensors of one storage share it
//
// Invariants:
//   1. Every malformed input is a Status naming what is wrong (never a crash, never a
//      partial result): an archive libtorch cannot open, a missing record, a storage record
//      whose size is not numel * element size, a view that reaches past its storage, an
//      unknown class, a dict key of another type, more than kTorchSaveRecordsMax records.
//      Its message is one line: names from the blob, and libtorch's own messages, have
//      their control characters escaped.
//   2. Aliasing survives as in pickle_codec.h: an object reached twice is one Value.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "model/py/value.h"
#include "model/status.h"

namespace ckptsim::model {

inline constexpr size_t kTorchSaveRecordsMax = size_t{1} << 16;  // zip entries of one blob
inline constexpr size_t kTorchSaveDimsMax = 16;                  // dimensions of one tensor

// The globals a torch.save blob may name: the tensor machinery, dtypes, the typed storages
// and the optimizer classes Megatron keeps in its param groups (cpu_optimizer_cls, ...).
const std::set<std::string>& torch_save_globals();

// The dtype a global such as "torch.bfloat16" names; nullopt for any other name.
std::optional<at::ScalarType> dtype_from_global(const std::string& name);

// REQUIRES: nothing of `bytes`; errors are Status::corruption.
Result<Value> load_torch_save(std::span<const char> bytes);

// ---- write side: torch_save() ------------------------------------------------------------
// Mirrors torch/serialization.py save() (_save: pickle protocol 2, the zip format, records
// data.pkl, .format_version, .storage_alignment, byteorder, data/<key> per storage, version;
// not the random .data/serialization_id) and torch/_tensor.py __reduce_ex__: a tensor is
// _rebuild_tensor_v2(persistent id ('storage', torch.<T>Storage, '<key>', 'cpu', numel),
// storage_offset, size, stride, False, OrderedDict()), its whole storage in data/<key>
// (storages numbered in first-use order, shared by views). Written with
// model/py/pickle_writer.h, so unlike model/py/pickle_codec.h it keeps what real Python
// pickles: tuple dict keys as tuples, dtype symbols as the globals torch.bfloat16 ...,
// class symbols ("<class 'torch.optim.adamw.AdamW'>") as the class global.
//
// Invariants:
//   1. load_torch_save(torch_save(v)) is v (the mapping of the read side above, inverted):
//      aliasing kept (a Dict, List, tuple or tensor reached twice is one object), an
//      undefined tensor written as None (read back as None).
//   2. With `weights_only` (the default) only the globals that torch.load(weights_only=True)
//      allows are written (tensors, storages, dtypes, OrderedDict); a class symbol is then an
//      invalid_input Status. Without it, class symbols are written too: what Megatron's
//      ShardedObjects hold (param groups' cpu_optimizer_cls ...), which DCP reads with
//      torch.load(weights_only=False) (default_planner.py load_bytes).
//   3. ShardedTensor, ShardedObject, LocalNonpersistentObject, a symbol that names neither a
//      dtype nor a class, or a tree deeper than kTorchSaveDepthMax is an invalid_input Status
//      naming the key path.
inline constexpr size_t kTorchSaveDepthMax = 64;  // containers in containers

struct TorchSaveOptions {
  bool weights_only = true;
};

Result<std::vector<char>> torch_save(const Value& v, const TorchSaveOptions& options = {});

// A class symbol's global, "torch.optim.adamw.AdamW" for "<class 'torch.optim.adamw.AdamW'>";
// nullopt when `symbol` is not a class symbol.
std::optional<std::string> class_global(const std::string& symbol);

}  // namespace ckptsim::model
