// The DistributedOptimizer's checkpoint formats besides dp_reshardable (spec §7.1, §8):
// dp_zero_gather_scatter, fully_reshardable and fully_sharded_model_space, and the world tensors
// of get_parameter_state_dp_zero that the first two are built on.
// Mirrors megatron/core/optimizer/distrib_optimizer.py (HEAD d98e8a64dd: 1262-1411,
// 1659-1836, 1988-2069, 2106-2129, 2264-2417); revision differences are switches
// (fully_reshardable_strips_bucket_padding, B7).
//
// The model's process group has no gather or scatter: a gather to DP rank 0 is an all-gather
// whose result only rank 0 keeps, and a scatter from DP rank 0 is an all-gather in which the
// other ranks send zeros and every rank keeps its piece of rank 0's send. The values each rank
// ends with are upstream's; only the traffic differs.
#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <vector>

#include "model/errors.h"
#include "model/megatron/dict_utils.h"
#include "model/megatron/distrib_optimizer.h"
#include "model/megatron/mapping.h"
#include "model/megatron/optimizer_key.h"
#include "model/py/host_tensor.h"

namespace ckptsim::model {

namespace {

constexpr const char* kFile = "distrib_optimizer.py";
std::string site(const char* function) { return std::string(kFile) + " " + function; }

// The hard-coded keys of the world tensors: ("param",) + optimizer_state_keys for Adam.
constexpr const char* kWorldKeys[] = {"param", "exp_avg", "exp_avg_sq"};

// Python's t[a:b] on a 1-D tensor: the bounds clamped to [0, numel].
at::Tensor py_slice(const at::Tensor& t, int64_t a, int64_t b) {
  const int64_t n = t.size(0);
  a = std::clamp<int64_t>(a, 0, n);
  b = std::clamp<int64_t>(b, a, n);
  return host::narrow(t, a, b - a);
}

std::span<float> floats(const at::Tensor& t) {
  return {t.data_ptr<float>(), static_cast<size_t>(t.numel())};
}

}  // namespace

Value DistributedOptimizer::get_parameter_state_dp_zero(bool use_gloo_comm, bool empty_data,
                                                        bool return_on_all_ranks) {
  (void)use_gloo_comm;  // which group carries the gather; the values are the same
  static const std::string kSite = site("get_parameter_state_dp_zero()");
  const int64_t dp_size = dp_group_.size();
  const int64_t dp_rank = dp_group_.rank();
  const bool keeps = dp_rank == 0 || return_on_all_ranks;
  auto state = Dict::make({{"buckets_coalesced", Value(true)}});
  for (size_t gbuf_idx = 0; gbuf_idx < gbuf_ranges_.size(); ++gbuf_idx) {
    const ParamAndGradBuffer& buffer = ddp_.buffers(expert_)[gbuf_idx];
    auto world_tensors = Dict::make();
    if (keeps) {
      for (const char* key : kWorldKeys) {
        world_tensors->set(
            key, Value(rt_.zeros({buffer.layout.numel_unpadded}, at::kFloat, Device::kCpu)));
      }
      world_tensors->set("numel_unpadded", Value(buffer.layout.numel_unpadded));
    }
    int64_t offset_in_world_tensors = 0;
    for (size_t bucket_idx = 0; !empty_data && bucket_idx < gbuf_ranges_[gbuf_idx].size();
         ++bucket_idx) {
      const BucketLayout& bucket = buffer.layout.buckets[bucket_idx];
      if (bucket.numel % dp_size != 0)
        throw PyAssertionError("assert gbuf_world_numel % data_parallel_world_size == 0", kSite);
      const int64_t local_numel = bucket.numel / dp_size;
      // Each rank's contiguous shard of the bucket, for every key.
      std::vector<at::Tensor> local_shards;
      for (size_t k = 0; k < std::size(kWorldKeys); ++k)
        local_shards.push_back(rt_.zeros({local_numel}, at::kFloat, Device::kCpu));
      for (const auto& [local_index, rm] : gbuf_ranges_[gbuf_idx][bucket_idx].param_map) {
        const DictPtr tensors = get_main_param_and_optimizer_states(buffer.params.at(local_index));
        for (size_t k = 0; k < std::size(kWorldKeys); ++k) {
          const Value& v = tensors->at(kWorldKeys[k], kSite.c_str());
          try {
            py_copy_(local_shards[k].narrow(0, rm.gbuf_local.start, rm.gbuf_local.size()),
                     rt_.to(v.tensor(), Device::kCpu));
          } catch (const UpstreamError& e) {
            // torch's error, raised in this function's frame (B8's mixed-up shard sizes).
            throw UpstreamError(e.py_type(), e.message(), kSite);
          }
        }
      }
      for (size_t k = 0; k < std::size(kWorldKeys); ++k) {
        std::vector<float> gathered(static_cast<size_t>(local_numel * dp_size));
        dp_group_.all_gather_values<float>(floats(local_shards[k]), gathered);
        if (!keeps) continue;
        // The buffer's tensor drops the padding at each bucket's end.
        const at::Tensor world = world_tensors->at(kWorldKeys[k]).tensor();
        std::copy_n(gathered.begin(), bucket.numel_unpadded,
                    world.data_ptr<float>() + offset_in_world_tensors);
      }
      offset_in_world_tensors += bucket.numel_unpadded;
    }
    state->set(static_cast<int64_t>(gbuf_idx),
               dict_value({{buffer.dtype_key(), Value(world_tensors)}}));
  }
  return keeps ? Value(state) : Value();
}

Value DistributedOptimizer::sharded_param_state_dp_zero(bool is_loading) {
  Value data;
  if (!is_loading && distributed_optimizer_instance_id_ == 0) {
    data = get_parameter_state_dp_zero(/*use_gloo_comm=*/false, /*empty_data=*/false,
                                       /*return_on_all_ranks=*/false);
  }
  if (dp_group_.rank() != 0 || distributed_optimizer_instance_id_ != 0) {
    return make_nonpersistent(Value());  // DP ranks > 0 save nothing and load None
  }
  ShardedObject so;
  so.key = format_object_key(data_parallel_group_idx_, "param_state");
  so.data = data;
  so.global_shape = {1};
  so.global_offset = {0};
  so.replica_id = {0};
  return Value(ShardedObject::make(std::move(so)));
}

std::vector<ShardedTensorPtr> DistributedOptimizer::param_to_sharded_metadata(
    const Value& model_sharded_state_dict, const char* function) const {
  std::vector<ShardedTensorPtr> out(ddp_.num_params());
  for (const Value& v : nested_values(model_sharded_state_dict)) {
    if (!v.is_sharded_tensor()) continue;
    const ShardedTensorPtr& st = v.sharded_tensor();
    for (size_t p = 0; p < ddp_.num_params(); ++p) {
      if (st->data.defined() && st->data.is_same(ddp_.param(p))) out[p] = st;
    }
  }
  for (size_t p = 0; p < ddp_.num_params(); ++p) {
    if (out[p] == nullptr && ddp_.is_expert(p) == expert_) {
      throw UpstreamError("ValueError",
                          fmt::format("Model param {} not in model_sharded_state_dict. Hint: "
                                      "KEEP_VARS_HINT",
                                      ddp_.specs()[p].name),
                          site(function));
    }
  }
  return out;
}

Value DistributedOptimizer::sharded_param_state_fully_reshardable(
    const Value& model_sharded_state_dict, bool is_loading, bool mem_efficient) {
  static const std::string kSite = site("sharded_param_state_fully_reshardable()");
  const Value dp_zero = get_parameter_state_dp_zero(
      /*use_gloo_comm=*/mem_efficient, /*empty_data=*/is_loading,
      /*return_on_all_ranks=*/!mem_efficient || is_loading);
  const std::vector<ShardedTensorPtr> metadata = param_to_sharded_metadata(
      model_sharded_state_dict, "sharded_param_state_fully_reshardable()");
  if (dp_zero.is_none()) return Value();
  auto model_space_state = Dict::make();
  int64_t param_idx = 0;
  for (size_t gbuf_idx = 0; gbuf_idx < gbuf_ranges_.size(); ++gbuf_idx) {
    const ParamAndGradBuffer& buffer = ddp_.buffers(expert_)[gbuf_idx];
    const Dict& world_tensors =
        *dp_zero.dict()->at(static_cast<int64_t>(gbuf_idx)).dict()->at(buffer.dtype_key()).dict();
    // The end padding of the buckets before each bucket, which the world tensors lack.
    std::vector<int64_t> stripped_before = {0};
    for (size_t b = 0; b + 1 < buffer.layout.buckets.size(); ++b) {
      const BucketLayout& bucket = buffer.layout.buckets[b];
      stripped_before.push_back(stripped_before.back() + bucket.numel - bucket.numel_unpadded);
    }
    // param_index_map's order: the buffer's params in reverse model order.
    for (size_t i = buffer.params.size(); i-- > 0;) {
      const ParamIndex& index = buffer.layout.param_index_map[i];
      const ShardedTensor& meta = *metadata[buffer.params[i]];
      // Revision switch fully_reshardable_strips_bucket_padding (B7 fix).
      const int64_t adjustment = switches_.fully_reshardable_strips_bucket_padding
                                     ? stripped_before[static_cast<size_t>(index.bucket_id)]
                                     : 0;
      const int64_t start = index.start - adjustment;
      const int64_t end = index.end - adjustment;
      auto tensors = Dict::make();
      for (const char* state_key : kWorldKeys) {
        const at::Tensor world = world_tensors.at(state_key).tensor();
        if (switches_.fully_reshardable_strips_bucket_padding && end > world.numel()) {
          throw PyAssertionError(
              fmt::format("'{}' range [{}, {}) runs past the coalesced buffer ({} elements); "
                          "bucket-padding adjustment is wrong.",
                          meta.key, start, end, world.numel()),
              kSite);
        }
        at::Tensor slice = py_slice(world, start, end);
        const int64_t missing = (index.end - index.start) - slice.numel();
        if (!switches_.fully_reshardable_strips_bucket_padding && missing > 0) {
          // Before the B7 fix: a slice past the compact world tensor is zero-padded (upstream
          // logs "param range exceeds unpadded buffer ... padded with zeros").
          if (!(index.end > buffer.layout.numel_unpadded))
            throw PyAssertionError("assert param_world_end > buffer.numel_unpadded", kSite);
          at::Tensor padded = rt_.zeros({index.end - index.start}, at::kFloat, Device::kCpu);
          padded.narrow(0, 0, slice.numel()).copy_(slice);
          slice = padded;
        }
        if (slice.numel() != index.end - index.start) {
          throw PyAssertionError(fmt::format("({}, {})", slice.numel(), index.end - index.start),
                                 kSite);
        }
        ShardedTensor st = meta;  // dataclasses.replace: the model param's sharding
        st.key = format_model_space_key({state_key, meta.key});
        st.data = host::reshape(slice, meta.data.sizes());
        st.dtype = st.data.scalar_type();
        tensors->set(state_key, Value(ShardedTensor::make(std::move(st))));
      }
      model_space_state->set(param_idx++, Value(tensors));
    }
  }
  return Value(model_space_state);
}

Value DistributedOptimizer::sharded_param_state_fs_model_space(
    const Value& model_sharded_state_dict) {
  const std::vector<ShardedTensorPtr> metadata =
      param_to_sharded_metadata(model_sharded_state_dict, "sharded_param_state_fs_model_space()");
  auto state = Dict::make();
  int64_t param_idx = 0;
  for (size_t gbuf_idx = 0; gbuf_idx < gbuf_ranges_.size(); ++gbuf_idx) {
    const ParamAndGradBuffer& buffer = ddp_.buffers(expert_)[gbuf_idx];
    for (const BucketShard& shard : gbuf_ranges_[gbuf_idx]) {
      for (const auto& [local_index, rm] : shard.param_map) {
        const size_t p = buffer.params.at(local_index);
        DictPtr tensors = get_main_param_and_optimizer_states(p);
        tensors->set("fp32_param", tensors->pop("param"));
        const ShardedTensor& meta = *metadata[p];
        for (auto& [state_key, value] : *tensors) {
          if (state_key == Key("step")) continue;  // read from param_groups instead
          ShardedTensor st = meta;
          st.key = format_model_space_key({state_key.str(), meta.key});
          st.data = value.tensor();
          st.dtype = st.data.scalar_type();
          st.flattened_range = std::make_pair(rm.param.start, rm.param.end);
          st.replica_id = {meta.replica_id.at(0), meta.replica_id.at(1),
                           distributed_optimizer_instance_id_};
          // mapping.py refuses a flattened_range here (CheckpointingException).
          value = Value(ShardedTensor::make(std::move(st)));
        }
        state->set(param_idx++, Value(tensors));
      }
    }
  }
  return Value(state);
}

void DistributedOptimizer::load_parameter_state_from_dp_zero(const Value& state_dict) {
  static const std::string kSite = site("load_parameter_state_from_dp_zero()");
  const int64_t dp_size = dp_group_.size();
  const int64_t dp_rank = dp_group_.rank();
  for (size_t gbuf_idx = 0; gbuf_idx < gbuf_ranges_.size(); ++gbuf_idx) {
    const ParamAndGradBuffer& buffer = ddp_.buffers(expert_)[gbuf_idx];
    const Dict* world = nullptr;
    if (dp_rank == 0) {
      world = state_dict.dict()
                  ->at(static_cast<int64_t>(gbuf_idx), kSite.c_str())
                  .dict()
                  ->at(buffer.dtype_key(), kSite.c_str())
                  .dict()
                  .get();
      const Value& saved = world->at("numel_unpadded", kSite.c_str());
      if (!py_equal(saved, Value(buffer.layout.numel_unpadded))) {
        throw PyAssertionError(
            fmt::format("Number of unpadded elements must be same in current run ({}) and "
                        "checkpoint ({})",
                        buffer.layout.numel_unpadded, saved.repr()),
            kSite);
      }
    }
    // model param -> {key: its slice of the piece this rank received}, in first-seen order.
    std::vector<std::pair<size_t, DictPtr>> recv_tensors;
    for (const char* key : kWorldKeys) {
      int64_t offset_in_world_tensors = 0;
      for (size_t bucket_idx = 0; bucket_idx < gbuf_ranges_[gbuf_idx].size(); ++bucket_idx) {
        const BucketLayout& bucket = buffer.layout.buckets[bucket_idx];
        const int64_t local_numel = bucket.numel / dp_size;
        std::vector<float> send(static_cast<size_t>(bucket.numel), 0.0F);
        if (dp_rank == 0) {
          const at::Tensor t = world->at(key, kSite.c_str()).tensor();
          const int64_t start = offset_in_world_tensors;
          const int64_t end = start + bucket.numel_unpadded;
          if (!(0 <= start && start < end && end <= t.numel()))
            throw PyAssertionError("assert 0 <= start < end <= world_tensors.numel()", kSite);
          const at::Tensor piece = t.narrow(0, start, end - start).contiguous();
          std::copy_n(piece.data_ptr<float>(), piece.numel(), send.begin());  // end-padded
          offset_in_world_tensors = end;
        }
        std::vector<float> gathered(send.size() * static_cast<size_t>(dp_size));
        dp_group_.all_gather_values<float>(send, gathered);  // rank 0's send is the first
        at::Tensor recv = rt_.zeros({local_numel}, at::kFloat, Device::kCpu);
        std::copy_n(gathered.begin() + dp_rank * local_numel, local_numel, recv.data_ptr<float>());
        for (const auto& [local_index, rm] : gbuf_ranges_[gbuf_idx][bucket_idx].param_map) {
          const size_t p = buffer.params.at(local_index);
          auto it = std::find_if(recv_tensors.begin(), recv_tensors.end(),
                                 [&](const auto& e) { return e.first == p; });
          if (it == recv_tensors.end()) {
            recv_tensors.emplace_back(p, Dict::make());
            it = recv_tensors.end() - 1;
          }
          it->second->set(key, Value(recv.narrow(0, rm.gbuf_local.start, rm.gbuf_local.size())));
        }
      }
    }
    for (const auto& [p, tensors] : recv_tensors)
      set_main_param_and_optimizer_states(p, *tensors, /*no_grad=*/false);
  }
  // Revision switch dp_zero_load_syncs_hdo (a fix of ours).
  if (switches_.dp_zero_load_syncs_hdo) {
    if (HybridDeviceOptimizer* h = mutable_hdo()) h->sync_hdo_state_to_sub_optimizers();
  }
}

void DistributedOptimizer::load_parameter_state_from_fully_reshardable(const Value& state_dict) {
  static const std::string kSite = site("load_parameter_state_from_fully_reshardable()");
  int64_t param_idx = -1;
  for (size_t gbuf_idx = 0; gbuf_idx < gbuf_ranges_.size(); ++gbuf_idx) {
    const ParamAndGradBuffer& buffer = ddp_.buffers(expert_)[gbuf_idx];
    for (size_t i = buffer.params.size(); i-- > 0;) {
      ++param_idx;  // counted even for a param this rank skips
      const size_t p = buffer.params[i];
      if (!param_range_maps_[p].has_value()) continue;
      const Range& range = param_range_maps_[p]->param;
      auto src = Dict::make();
      for (const auto& [k, v] : *state_dict.dict()->at(param_idx, kSite.c_str()).dict()) {
        if (k == Key("step")) continue;  // torch Adam's step is handled separately
        const at::Tensor flat = py_slice(v.tensor().flatten(), range.start, range.end);
        if (flat.numel() != range.size())
          throw PyAssertionError(fmt::format("({}, {})", flat.numel(), range.repr()), kSite);
        src->set(k == Key("fp32_param") ? Key("param") : k, Value(flat));
      }
      set_main_param_and_optimizer_states(p, *src, /*no_grad=*/true);
    }
  }
  if (HybridDeviceOptimizer* h = mutable_hdo()) h->sync_hdo_state_to_sub_optimizers();
}

void DistributedOptimizer::load_parameter_state_from_fs_model_space(const Value& state_dict) {
  static const std::string kSite = site("load_parameter_state_from_fs_model_space()");
  int64_t param_idx = 0;
  for (size_t gbuf_idx = 0; gbuf_idx < gbuf_ranges_.size(); ++gbuf_idx) {
    const ParamAndGradBuffer& buffer = ddp_.buffers(expert_)[gbuf_idx];
    for (const BucketShard& shard : gbuf_ranges_[gbuf_idx]) {
      for (const auto& [local_index, rm] : shard.param_map) {
        auto src = Dict::make();
        for (const auto& [k, v] : *state_dict.dict()->at(param_idx, kSite.c_str()).dict()) {
          if (k == Key("step")) continue;
          src->set(k == Key("fp32_param") ? Key("param") : k, v);
        }
        set_main_param_and_optimizer_states(buffer.params.at(local_index), *src, /*no_grad=*/true);
        ++param_idx;
      }
    }
  }
  if (HybridDeviceOptimizer* h = mutable_hdo()) h->sync_hdo_state_to_sub_optimizers();
}

}  // namespace ckptsim::model
