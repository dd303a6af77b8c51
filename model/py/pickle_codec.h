// pickle codec: a Value tree <-> the bytes of a torch.save file (torch's zip format with a
// protocol-2 pickle inside), so that what ckptsim writes as `common.pt` can be opened by
// Python's `torch.load(path, weights_only=True)` and what it reads back went through real
// pickle bytes. pickle_codec.cpp is the one translation unit that includes torch's JIT
// serialization headers (model/torch/torch_save_format.cpp includes only the zip reader).
// Real Python pickles that libtorch's unpickler refuses (dtype globals, tuple dict keys,
// optimizer classes, torch.distributed.checkpoint's `.metadata`) are read by
// model/py/pickle_tree.h and model/torch/torch_save_format.h instead, and written, for the
// torch_dist exchange format, by model/py/pickle_writer.h (torch_save(), the DCP writer).
//
// Mapping (encode; decode is the inverse except where marked LOSSY):
//   None, bool, int, float, str   -> the pickle scalars
//   Symbol value                  -> its name as a str                  LOSSY: decodes as str
//   Tuple                         -> tuple
//   List                          -> list
//   Dict                          -> dict, in insertion order
//   at::Tensor                    -> tensor: dtype (bf16 included), shape (a 0-dim tensor
//                                    stays 0-dim), strides and values kept
//   undefined at::Tensor          -> None                               LOSSY: decodes as None
//   dict key int, str             -> the same int or str
//   dict key symbol               -> its name (repr) as a str           LOSSY: decodes as str
//   dict key tuple                -> its Python repr as a str, e.g. "(torch.bfloat16,
//                                    torch.float32)"; decoded back into a tuple key
//
// Why tuple keys become strings: torch's C++ dict cannot hash a tuple ("Can't hash IValues
// with tag 'Tuple'"), and a symbol such as torch.bfloat16 is no IValue at all.
// AMBIGUITY: on decode, a str key that is exactly the repr of a tuple of ints, strs,
// symbols (dotted identifiers such as torch.float32) and such tuples becomes that tuple
// key, so a *genuine* str key spelled like one, e.g. "(1, 2)" or "()", comes back as a
// tuple. Megatron state dicts have no such str keys.
//
// Invariants:
//   1. Python-loadable: the pickle names only globals that torch.load(weights_only=True)
//      allows (torch._utils._rebuild_tensor_v2, torch.*Storage, collections.OrderedDict);
//      in particular no torch.jit._pickle.restore_type_tag, which torch::pickle_save emits
//      and weights_only rejects.
//   2. Round trip: unpickle_value(pickle_value(v)) equals v under the mapping above.
//   3. Aliasing survives, as with torch.save: a Dict, List, tuple or tensor reached twice
//      in v is one object in the result; tensor views keep sharing storage.
//   4. ShardedTensor, ShardedObject and LocalNonpersistentObject never reach the codec
//      (save extracts them first): encoding one throws InvariantViolation, as does a cycle,
//      a tree deeper than kPickleDepthMax, or a tuple key whose repr would not decode back
//      to the same key (a symbol named "a, b").
//   5. Decoding never throws for bad bytes: anything we never write (a float or tensor
//      dict key, an object, a device, torch's own exceptions on corrupt or truncated
//      bytes) becomes Status::corruption naming what was found and where.
//      NOT detected: a changed byte inside a record. libtorch 1.13's zip reader does not
//      verify the CRC-32 (measured: a flipped tensor byte decodes as another value, a
//      flipped str byte as another str), so a fault injector that flips bits must not
//      expect Status::corruption unless the flip breaks the pickle's structure.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "model/py/value.h"
#include "model/status.h"

namespace ckptsim::model {

// Nesting of containers and tuples; state dicts are about 8 deep.
inline constexpr size_t kPickleDepthMax = 64;

// REQUIRES: v holds no ShardedTensor, ShardedObject or LocalNonpersistentObject, no cycle,
// no nesting deeper than kPickleDepthMax (throws InvariantViolation otherwise).
std::vector<char> pickle_value(const Value& v);

Result<Value> unpickle_value(std::span<const char> bytes);

// The key a decoded str key stands for: a tuple key when `text` is exactly the repr of
// one (see AMBIGUITY above), else the str key `text`. Exposed for tests.
Key decode_dict_key(const std::string& text);

}  // namespace ckptsim::model
