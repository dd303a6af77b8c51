// The model side of one DP rank: Megatron's DistributedDataParallel wrapper with its
// contiguous param and grad buffers, as the distributed optimizer sees it.
// Mirrors megatron/core/distributed/distributed_data_parallel.py (buffer grouping) and
// param_and_grad_buffer.py (_ParamAndGradBuffer: buffers, buckets, reduce-scatter of grads,
// all-gather of params with the distributed optimizer).
//
// Invariants:
//   1. Params are grouped into one buffer per (param_dtype, grad_dtype), buffers in order of
//      first appearance in model order; grads are fp32 (bf16 training accumulates and reduces
//      grads in fp32), so the buffer keys are (torch.bfloat16, torch.float32) and
//      (torch.float32, torch.float32).
//   2. params[i] is a view of its buffer's param_data at param_index_map[i], in the param's
//      (local) shape; main_grads[i] a 1-D view of grad_data there. Both buffers live on the
//      simulated 'cuda' device and start zeroed.
//   3. After finish_grad_sync() the rank's shard [r*L, (r+1)*L) of every bucket of grad_data
//      holds the sum of every rank's contribution, added in rank order; the rest of grad_data
//      is left as this rank's local contribution (as reduce_scatter into a shard view does).
//   4. After start_param_sync() every rank's param_data is the concatenation of every rank's
//      shard of every bucket.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/megatron/param_and_grad_buffer.h"
#include "model/process_group.h"
#include "model/py/runtime.h"
#include "model/py/value.h"

namespace ckptsim::model {

// The torch dtype of a param dtype.
at::ScalarType scalar_type(DType d);

// Mirrors param_and_grad_buffer.py _ParamAndGradBuffer (the parts the optimizer uses).
struct ParamAndGradBuffer {
  at::ScalarType param_dtype = at::kBFloat16;
  at::ScalarType grad_dtype = at::kFloat;
  std::vector<size_t> params;  // model param indices, model order
  BufferLayout layout;         // param_index_map indexed like `params`
  at::Tensor param_data;
  at::Tensor grad_data;

  // The (param_dtype, grad_dtype) key as upstream prints and keys it: a tuple of dtypes.
  Key dtype_key() const;
};

class DistributedDataParallel {
 public:
  static constexpr size_t kModelParamsMax = 4096;

  // `specs` are the whole model's params; this rank's model holds those of its pipeline stage
  // (params_of_stage), each its TP piece (local_param_spec): param i of this object is
  // specs[global_param(i)] as rank `mp` holds it.
  // REQUIRES: the stage's params non-empty, names unique, numel >= 1, dtype bf16 or fp32, every
  // split dim divisible by mp.tp_size, mp.pp_size dividing num_layers(specs).
  // Expert params (ParamSpec::expert) go to the expert buffers on `expert_dp_group`, each its
  // EP piece (mp.expert_view() of expert_split_spec); REQUIRES the group where any param is an
  // expert one (its size the expert-DP size: the layout's dp_size over mp.ep_size).
  DistributedDataParallel(Runtime& rt, const std::vector<ParamSpec>& specs,
                          const LayoutOptions& layout, ProcessGroup& dp_group,
                          const ModelParallelRank& mp = {},
                          ProcessGroup* expert_dp_group = nullptr);

  // This rank's params, as it holds them (TP pieces; names are the whole model's).
  const std::vector<ParamSpec>& specs() const { return specs_; }
  // The index of param i in the whole model's params.
  size_t global_param(size_t i) const { return global_params_.at(i); }
  // This rank's params' whole-model specs (TP splits, global shapes).
  const ParamSpec& global_spec(size_t i) const { return global_specs_.at(i); }
  const ModelParallelRank& mp() const { return mp_; }
  // How param i is split: mp(), or for an expert param its EP view (global_spec(i) is then the
  // param's expert_split_spec).
  ModelParallelRank mp_of(size_t i) const { return is_expert(i) ? mp_.expert_view() : mp_; }
  bool is_expert(size_t i) const { return expert_.at(i); }
  bool has_experts() const { return !expert_buffers_.empty(); }
  // The dense buffers (upstream `buffers`), and the expert ones (`expert_parallel_buffers`).
  std::vector<ParamAndGradBuffer>& buffers(bool expert = false) {
    return expert ? expert_buffers_ : buffers_;
  }
  const std::vector<ParamAndGradBuffer>& buffers(bool expert = false) const {
    return expert ? expert_buffers_ : buffers_;
  }
  const at::Tensor& param(size_t i) const { return params_.at(i); }
  const at::Tensor& main_grad(size_t i) const { return main_grads_.at(i); }
  size_t num_params() const { return params_.size(); }
  // (buffer index, index of the param inside that buffer) of model param i.
  std::pair<size_t, size_t> buffer_of(size_t i) const { return buffer_of_.at(i); }
  ProcessGroup& dp_group() { return dp_group_; }
  // The expert-DP group (REQUIRES has_experts()), or the group of a buffer set.
  ProcessGroup& expert_dp_group();
  ProcessGroup& group_of(bool expert) { return expert ? expert_dp_group() : dp_group_; }

  void zero_grad_buffer();
  // Reduce-scatter every bucket's grads (sum in rank order) into this rank's shard.
  void finish_grad_sync();
  // All-gather every bucket's param shards.
  void start_param_sync();

  // {name: ShardedTensor(key=name, data=param, the TP piece's local shape, global shape and
  // offset)}: every DP rank holds the whole piece. A TP-split param's replica_id is
  // (0, 0, dp_rank) (make_tp_sharded_tensor_for_checkpoint), a replicated one's
  // (0, tp_rank, dp_rank) (make_sharded_tensor_for_checkpoint): DP rank 0 (and TP rank 0 of a
  // replicated param) is the main replica that writes it.
  Value sharded_state_dict();

 private:
  // `fn` over every buffer with the group it syncs over: the dense ones, then the expert ones.
  void each_buffer(const std::function<void(ParamAndGradBuffer&, ProcessGroup&)>& fn);
  // A buffer's layout, data and the views of its params into them.
  void lay_out_buffer(ParamAndGradBuffer& buffer, const LayoutOptions& layout);
  Runtime& rt_;
  ProcessGroup& dp_group_;
  ModelParallelRank mp_;
  std::vector<ParamSpec> specs_;
  std::vector<ParamSpec> global_specs_;
  std::vector<size_t> global_params_;
  std::vector<ParamAndGradBuffer> buffers_;
  std::vector<ParamAndGradBuffer> expert_buffers_;
  ProcessGroup* expert_dp_group_ = nullptr;
  std::vector<bool> expert_;  // per local param
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> main_grads_;
  std::vector<std::pair<size_t, size_t>> buffer_of_;
};

}  // namespace ckptsim::model
