// The leaf types of a *sharded* state dict: what each rank hands to dist_checkpointing.
// Mirrors megatron/core/dist_checkpointing/mapping.py (POST line numbers in spec §18).
//
//   ShardedTensor            a piece of a global tensor: this rank's `data` covers
//                            [global_offset, global_offset + local_shape) of a tensor of
//                            `global_shape` saved under `key`.
//   ShardedObject            an opaque object saved under `unique_key` by its main replica.
//   LocalNonpersistentObject never saved; on load, replaced by the *same* local object.
//
// Invariants (checked on construction, as __post_init__ does; violations throw
// CheckpointingException or AssertionError with upstream's messages):
//   1. data (if present) has dtype `dtype` and shape `local_shape`;
//   2. len(global_shape) == len(global_offset) == len(local_shape) + prepend_axis_num;
//   3. with a regular grid (axis_fragmentations set), every non-zero global offset is a
//      multiple of the matching local dimension;
//   4. flattened_range is never set: at POST any non-None flattened_range raises.
// ShardedTensor and ShardedObject are shared by reference like any Python object; the
// tensor in `data` keeps its identity (loads write into it in place).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/py/value.h"

namespace ckptsim::model {

using Shape = std::vector<int64_t>;
// replica_id: an int or a tuple of ints upstream; an int is stored as a 1-element vector.
using ReplicaId = std::vector<int64_t>;

// Mirrors mapping.py is_main_replica(): every component is 0.
bool is_main_replica(const ReplicaId& replica_id);

// Python-style tuple text of a shape or offset: (3,), (1, 2).
std::string shape_repr(const Shape& s);

// Mirrors mapping.py ShardedTensor (a dataclass).
struct ShardedTensor {
  std::string key;
  at::Tensor data;  // undefined = None (metadata-only)
  at::ScalarType dtype = at::kFloat;
  Shape local_shape;
  Shape global_shape;
  Shape global_offset;
  std::optional<Shape> axis_fragmentations;  // nullopt: irregular grid (dp_reshardable)
  ReplicaId replica_id{0};
  int64_t prepend_axis_num = 0;
  bool allow_shape_mismatch = false;
  std::optional<std::pair<int64_t, int64_t>> flattened_range;

  // Validates invariants 1-4 (mapping.py ShardedTensor.__post_init__ /
  // validate_metadata_integrity).
  static ShardedTensorPtr make(ShardedTensor fields);

  bool has_regular_grid() const { return axis_fragmentations.has_value(); }
  int64_t local_numel() const;
  std::string repr() const;
};

// Mirrors mapping.py ShardedObject.
struct ShardedObject {
  std::string key;
  Value data;
  Shape global_shape;
  Shape global_offset;
  ReplicaId replica_id{0};

  static ShardedObjectPtr make(ShardedObject fields);
  // f'{key}/shard_{".".join(offset)}_{".".join(shape)}'
  std::string unique_key() const;
  std::string repr() const;
};

// Mirrors mapping.py LocalNonpersistentObject.
struct LocalNonpersistentObject {
  Value obj;
  static NonpersistentPtr make(Value obj);
  // Returns the wrapped object itself, never a copy (spec §1 LNO).
  const Value& unwrap() const { return obj; }
};

// Short-hands that build the Value directly.
Value make_nonpersistent(Value obj);

// Torch dtype names as Python prints them ("torch.bfloat16").
std::string torch_dtype_name(at::ScalarType dtype);

}  // namespace ckptsim::model
