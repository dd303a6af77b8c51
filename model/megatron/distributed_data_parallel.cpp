#include "model/megatron/distributed_data_parallel.h"

#include <ATen/ops/empty.h>
#include <fmt/format.h>

#include <cstring>

#include "model/errors.h"
#include "model/faults.h"
#include "model/megatron/mapping.h"
#include "model/py/host_tensor.h"

namespace ckptsim::model {

Key ParamAndGradBuffer::dtype_key() const {
  return Key::tuple(
      {Key::symbol(torch_dtype_name(param_dtype)), Key::symbol(torch_dtype_name(grad_dtype))});
}

at::ScalarType scalar_type(DType d) { return d == DType::kBFloat16 ? at::kBFloat16 : at::kFloat; }

namespace {

void misalign_one_param(BufferLayout& layout) {
  for (BucketLayout& bucket : layout.buckets) {
    for (size_t local : bucket.params) {
      ParamIndex& pi = layout.param_index_map[local];
      int64_t next_start = bucket.offset + bucket.numel;
      for (size_t other : bucket.params) {
        const ParamIndex& o = layout.param_index_map[other];
        if (o.start >= pi.end) next_start = std::min(next_start, o.start);
      }
      if (pi.end < next_start) {
        ++pi.start;
        ++pi.end;
        return;
      }
    }
  }
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(Runtime& rt, const std::vector<ParamSpec>& specs,
                                                 const LayoutOptions& layout,
                                                 ProcessGroup& dp_group,
                                                 const ModelParallelRank& mp,
                                                 ProcessGroup* expert_dp_group)
    : rt_(rt), dp_group_(dp_group), mp_(mp), expert_dp_group_(expert_dp_group) {
  CKPTSIM_CHECK(mp.tp_size >= 1 && mp.pp_size >= 1 && num_layers(specs) % mp.pp_size == 0,
                fmt::format("pp {} does not divide the {} layers", mp.pp_size, num_layers(specs)));
  global_params_ = params_of_stage(specs, mp);
  for (const size_t g : global_params_) {
    const bool expert = specs[g].expert;
    const ParamSpec spec = expert ? expert_split_spec(specs[g]) : specs[g];
    const ModelParallelRank split = expert ? mp.expert_view() : mp;
    const int64_t axis = tp_axis(spec);
    CKPTSIM_CHECK(
        axis < static_cast<int64_t>(global_shape(spec).size()) &&
            (axis < 0 || global_shape(spec)[static_cast<size_t>(axis)] % split.tp_size == 0),
        fmt::format("param {}: {} {} does not split dim {}", spec.name, expert ? "ep" : "tp",
                    split.tp_size, axis));
    CKPTSIM_CHECK(!expert || expert_dp_group != nullptr,
                  "an expert param needs the expert-DP group");
    global_specs_.push_back(spec);
    specs_.push_back(local_param_spec(spec, split));
    expert_.push_back(expert);
  }
  CKPTSIM_CHECK(!specs_.empty(), "a model needs at least one param");
  CKPTSIM_CHECK(specs_.size() <= kModelParamsMax,
                fmt::format("more than {} params", kModelParamsMax));
  CKPTSIM_CHECK(layout.dp_size == dp_group.size(), "layout dp_size must equal the DP group size");
  // Buffers per (param_dtype, grad_dtype), in order of first appearance (invariant 1), dense and
  // expert apart; buffer_of_ indexes into the param's own set.
  buffer_of_.resize(specs_.size());
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    CKPTSIM_CHECK(s.numel >= 1, "param " + s.name + " must have numel >= 1");
    for (size_t j = 0; j < i; ++j)
      CKPTSIM_CHECK(specs_[j].name != s.name, "duplicate param name " + s.name);
    std::vector<ParamAndGradBuffer>& set = expert_[i] ? expert_buffers_ : buffers_;
    size_t b = 0;
    while (b < set.size() && set[b].param_dtype != scalar_type(s.dtype)) ++b;
    if (b == set.size()) {
      set.emplace_back();
      set.back().param_dtype = scalar_type(s.dtype);
      set.back().grad_dtype = at::kFloat;
    }
    buffer_of_[i] = {b, set[b].params.size()};
    set[b].params.push_back(i);
  }
  params_.resize(specs_.size());
  main_grads_.resize(specs_.size());
  LayoutOptions expert_layout = layout;
  if (expert_dp_group_ != nullptr) expert_layout.dp_size = expert_dp_group_->size();
  for (const bool expert : {false, true}) {
    for (auto& buffer : expert ? expert_buffers_ : buffers_)
      lay_out_buffer(buffer, expert ? expert_layout : layout);
  }
}

void DistributedDataParallel::lay_out_buffer(ParamAndGradBuffer& buffer,
                                             const LayoutOptions& layout) {
  {
    std::vector<int64_t> numels;
    for (size_t i : buffer.params) numels.push_back(specs_[i].numel);
    buffer.layout = build_buffer_layout(numels, stage_layout_options(layout, mp_.pp_rank));
    // Fault site layout.misalign_param_start: shift one param that has room after it by one.
    if (rt_.fault(fault::kMisalignParamStart)) misalign_one_param(buffer.layout);
    buffer.param_data = rt_.zeros({buffer.layout.numel}, buffer.param_dtype, Device::kCuda);
    buffer.grad_data = rt_.zeros({buffer.layout.numel}, buffer.grad_dtype, Device::kCuda);
    for (size_t k = 0; k < buffer.params.size(); ++k) {
      const ParamIndex& pi = buffer.layout.param_index_map[k];
      params_[buffer.params[k]] =
          host::view(host::narrow(buffer.param_data, pi.start, pi.end - pi.start),
                     specs_[buffer.params[k]].shape);
      main_grads_[buffer.params[k]] = host::narrow(buffer.grad_data, pi.start, pi.end - pi.start);
    }
  }
}

void DistributedDataParallel::zero_grad_buffer() {
  for (auto& buffer : buffers_) host::zero_(buffer.grad_data);
  for (auto& buffer : expert_buffers_) host::zero_(buffer.grad_data);
}

ProcessGroup& DistributedDataParallel::expert_dp_group() {
  CKPTSIM_CHECK(expert_dp_group_ != nullptr,
                "a model without expert params has no expert-DP group");
  return *expert_dp_group_;
}

void DistributedDataParallel::each_buffer(
    const std::function<void(ParamAndGradBuffer&, ProcessGroup&)>& fn) {
  for (auto& buffer : buffers_) fn(buffer, dp_group_);
  for (auto& buffer : expert_buffers_) fn(buffer, *expert_dp_group_);
}

void DistributedDataParallel::finish_grad_sync() {
  each_buffer([&](ParamAndGradBuffer& buffer, ProcessGroup& group) {
    const int64_t dp = group.size();
    const int64_t r = group.rank();
    for (const BucketLayout& bucket : buffer.layout.buckets) {
      const int64_t local = bucket.numel / dp;
      // The shard is a view of the bucket, as upstream: the collectives allow an output to
      // alias its rank's input (they sum into their own scratch first). The in-process
      // collectives move host memory, so a GPU bucket is staged through a host copy; a host
      // bucket is passed as it is (no tensor views: a view per bucket and step costs more than
      // the small buckets' sums).
      if (!buffer.grad_data.is_cuda()) {
        float* base = buffer.grad_data.data_ptr<float>() + bucket.offset;
        group.reduce_scatter_sum({base, static_cast<size_t>(bucket.numel)},
                                 {base + r * local, static_cast<size_t>(local)});
        continue;
      }
      const at::Tensor bucket_grad = buffer.grad_data.narrow(0, bucket.offset, bucket.numel);
      const at::Tensor input = bucket_grad.is_cuda() ? bucket_grad.to(at::kCPU) : bucket_grad;
      at::Tensor shard = buffer.grad_data.narrow(0, bucket.offset + r * local, local);
      at::Tensor host_shard =
          shard.is_cuda() ? at::empty({local}, at::TensorOptions().dtype(at::kFloat)) : shard;
      group.reduce_scatter_sum(
          {input.data_ptr<float>(), static_cast<size_t>(input.numel())},
          {host_shard.data_ptr<float>(), static_cast<size_t>(host_shard.numel())});
      if (shard.is_cuda()) shard.copy_(host_shard);
    }
  });
}

void DistributedDataParallel::start_param_sync() {
  each_buffer([&](ParamAndGradBuffer& buffer, ProcessGroup& group) {
    const int64_t dp = group.size();
    const int64_t r = group.rank();
    const size_t elem = buffer.param_data.element_size();
    for (const BucketLayout& bucket : buffer.layout.buckets) {
      const int64_t local = bucket.numel / dp;
      if (!buffer.param_data.is_cuda()) {
        auto* base = static_cast<std::byte*>(buffer.param_data.data_ptr()) +
                     static_cast<size_t>(bucket.offset) * elem;
        group.all_gather(
            {base + static_cast<size_t>(r * local) * elem, static_cast<size_t>(local) * elem},
            {base, static_cast<size_t>(bucket.numel) * elem});
        continue;
      }
      const at::Tensor shard_view = buffer.param_data.narrow(0, bucket.offset + r * local, local);
      const at::Tensor shard = shard_view.is_cuda() ? shard_view.to(at::kCPU) : shard_view;
      at::Tensor whole = buffer.param_data.narrow(0, bucket.offset, bucket.numel);
      at::Tensor host_whole =
          whole.is_cuda()
              ? at::empty({bucket.numel}, at::TensorOptions().dtype(whole.scalar_type()))
              : whole;
      group.all_gather(
          {static_cast<const std::byte*>(shard.data_ptr()), static_cast<size_t>(local) * elem},
          {static_cast<std::byte*>(host_whole.data_ptr()),
           static_cast<size_t>(bucket.numel) * elem});
      if (whole.is_cuda()) whole.copy_(host_whole);
    }
  });
}

Value DistributedDataParallel::sharded_state_dict() {
  auto sd = Dict::make();
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& global = global_specs_[i];
    ShardedTensor st;
    st.key = specs_[i].name;
    st.data = params_[i];
    st.dtype = scalar_type(specs_[i].dtype);
    st.local_shape = specs_[i].shape;
    st.global_shape = global_shape(global);
    st.global_offset = tp_global_offset(global, mp_of(i));
    Shape fragments;
    for (size_t d = 0; d < st.global_shape.size(); ++d)
      fragments.push_back(st.global_shape[d] / st.local_shape[d]);
    st.axis_fragmentations = std::move(fragments);
    const bool replicated = tp_axis(global) < 0;
    // An expert piece: GroupedMLP's (0, tp_rank = 0, expert-DP rank).
    st.replica_id = {0, replicated ? mp_.tp_rank : 0,
                     expert_[i] ? expert_dp_group_->rank() : dp_group_.rank()};
    sd->set(specs_[i].name, Value(ShardedTensor::make(std::move(st))));
  }
  return Value(sd);
}

}  // namespace ckptsim::model
