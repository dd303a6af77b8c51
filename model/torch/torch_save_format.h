// The bytes of one torch.save (the zip format of torch >= 1.6), read into a Value as
// `torch.load(f, map_location='cpu')` would build it, without running Python: the zip is
// opened with libtorch's own reader (caffe2::serialize::PyTorchStreamReader), its
// `<archive>/data.pkl` is read by model/py/pickle_tree.h and every tensor is rebuilt from its
// `<archive>/data/<key>` record. This is what every item of a torch.distributed.checkpoint
// data file holds (a tensor chunk, or a Megatron ShardedObject's list of objects), and
// Megatron's common.pt. Mirrors torch/serialization.py load() (_load, persistent_load) and
// torch/_utils.py _rebuild_tensor_v2(), for what torch.save writes: model/py/pickle_codec.h
// is the writer (and reads back what it wrote); this reader also takes what real Python
// pickles hold and libtorch's unpickler refuses: dtype globals (torch.bfloat16), tuple dict
// keys ((torch.bfloat16, torch.float32)), optimizer classes as values.
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

}  // namespace ckptsim::model
