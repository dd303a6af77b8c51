#include "model/megatron/mapping.h"

#include <fmt/format.h>

#include "model/errors.h"

namespace ckptsim::model {

bool is_main_replica(const ReplicaId& replica_id) {
  for (int64_t r : replica_id) {
    if (r != 0) return false;
  }
  return true;
}

std::string shape_repr(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + (s.size() == 1 ? ",)" : ")");
}

std::string torch_dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "torch.float32";
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kHalf:
      return "torch.float16";
    case at::kDouble:
      return "torch.float64";
    case at::kShort:
      return "torch.int16";
    case at::kInt:
      return "torch.int32";
    case at::kLong:
      return "torch.int64";
    case at::kBool:
      return "torch.bool";
    case at::kByte:
      return "torch.uint8";
    default:
      return std::string("torch.") + c10::toString(dtype);
  }
}

int64_t ShardedTensor::local_numel() const {
  int64_t n = 1;
  for (int64_t d : local_shape) n *= d;
  return n;
}

ShardedTensorPtr ShardedTensor::make(ShardedTensor f) {
  static constexpr const char* kSite = "mapping.py ShardedTensor.__post_init__";
  if (f.data.defined()) {
    if (f.data.scalar_type() != f.dtype) {
      throw CheckpointingException(
          fmt::format("Data dtype should match `dtype` attribute for {}", f.repr()), kSite);
    }
    Shape data_shape(f.data.sizes().begin(), f.data.sizes().end());
    if (!f.flattened_range.has_value() && data_shape != f.local_shape) {
      throw CheckpointingException(
          fmt::format("Data shape should match `local_shape` attribute for {}", f.repr()), kSite);
    }
  }
  if (f.global_shape.size() != f.global_offset.size()) {
    throw CheckpointingException(
        fmt::format("Global offset dimensions should be equal to global shape dimensions for {}",
                    f.repr()),
        kSite);
  }
  if (static_cast<int64_t>(f.local_shape.size()) + f.prepend_axis_num !=
      static_cast<int64_t>(f.global_shape.size())) {
    throw CheckpointingException(
        fmt::format("Local shape together with `prepend_axis_num` dimensions should be equal to "
                    "global shape dimensions for {}",
                    f.repr()),
        kSite);
  }
  if (f.axis_fragmentations.has_value()) {
    for (size_t i = 0; i < f.local_shape.size(); ++i) {
      const size_t g = i + static_cast<size_t>(f.prepend_axis_num);
      const int64_t off = f.global_offset[g];
      if (f.local_shape[i] != 0 && off % f.local_shape[i] != 0) {
        throw CheckpointingException(
            fmt::format("Global offset ({}) must be divisible by local shape ({}) for {}.", off,
                        f.local_shape[i], f.repr()),
            kSite);
      }
    }
  }
  if (f.flattened_range.has_value()) {
    // POST mapping.py:133-134 (since #2126), the last check: flattened_range is refused, which
    // is what the fully_sharded_model_space format meets.
    throw CheckpointingException("ShardedTensor.flattened_range is not supported.", kSite);
  }
  return std::make_shared<ShardedTensor>(std::move(f));
}

std::string ShardedTensor::repr() const {
  return fmt::format(
      "ShardedTensor(key='{}', dtype={}, local_shape={}, global_shape={}, "
      "global_offset={}, replica_id={})",
      key, torch_dtype_name(dtype), shape_repr(local_shape), shape_repr(global_shape),
      shape_repr(global_offset), shape_repr(replica_id));
}

ShardedObjectPtr ShardedObject::make(ShardedObject f) {
  return std::make_shared<ShardedObject>(std::move(f));
}

std::string ShardedObject::unique_key() const {
  auto join = [](const Shape& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (i) out += ".";
      out += std::to_string(s[i]);
    }
    return out;
  };
  return key + "/shard_" + join(global_offset) + "_" + join(global_shape);
}

std::string ShardedObject::repr() const {
  return fmt::format("ShardedObject(key='{}', global_shape={}, global_offset={}, replica_id={})",
                     key, shape_repr(global_shape), shape_repr(global_offset),
                     shape_repr(replica_id));
}

NonpersistentPtr LocalNonpersistentObject::make(Value obj) {
  auto p = std::make_shared<LocalNonpersistentObject>();
  p->obj = std::move(obj);
  return p;
}

Value make_nonpersistent(Value obj) {
  return Value(LocalNonpersistentObject::make(std::move(obj)));
}

}  // namespace ckptsim::model
