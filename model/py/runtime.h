// Runtime: what one simulated rank's process provides to the modeled Python code — device
// placement, tensor attributes (.grad, .decoupled_grad), torch.empty's uninitialized memory and
// torch.randn.
//
// Why it exists: ckptsim runs the GPU-side code paths on machines without a GPU. A tensor
// that upstream would place on 'cuda' is a CPU at::Tensor here whose *simulated* device is
// recorded per storage; `to()` follows torch's rule that a move to another device (or
// dtype) makes a new object and a no-op move returns the same object, which is what decides
// object identity in HDO's load path (spec §10.2).
//
// Invariants:
//   1. Simulated device is a property of the storage: views inherit it. With real_cuda, the
//      'cuda' device is the GPU and at::Tensor's own device is the truth.
//   2. Nothing here reads a clock or random_device: empty() fills with garbage from the
//      rank's `garbage` stream and randn_like() draws from the `randn` stream; both streams
//      are derived from (root seed, phase, rank), separately, so that allocating more or less
//      garbage never changes the random gradients of HDO.dummy_step() (FoundationDB style).
//   3. One Runtime per rank; it is not shared between threads.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/py/tensor_map.h"

namespace ckptsim::model {

enum class Device { kCpu, kCuda };
std::string device_name(Device d);  // "cpu", "cuda"

// A counter-based stream (splitmix64). Deterministic, cheap, splittable by seed.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64();
  double next_unit();   // [0, 1)
  float next_normal();  // standard normal (Box-Muller), for torch.randn
 private:
  uint64_t state_;
};

// Mixes values into a 64-bit seed (used to derive per-rank, per-stream seeds).
uint64_t mix_seed(uint64_t a, uint64_t b);

// Whether this build and machine can keep 'cuda' state on a real GPU: libtorch with CUDA and
// a device that runs the ckptsim FusedAdam kernel. `why` (optional) says why not.
bool real_cuda_available(std::string* why = nullptr);

class Runtime {
 public:
  // real_cuda: tensors placed on 'cuda' live on the real GPU (REQUIRES real_cuda_available());
  // otherwise 'cuda' is a tag on CPU tensors.
  Runtime(uint64_t root_seed, int64_t phase, int64_t rank, bool real_cuda = false);
  bool real_cuda() const { return real_cuda_; }

  int64_t rank() const { return rank_; }

  // --- devices ---------------------------------------------------------------------------
  Device device_of(const at::Tensor& t) const;
  // Tensor.to(dtype, device): the same object when nothing changes, else a new tensor.
  at::Tensor to(const at::Tensor& t, at::ScalarType dtype, Device device);
  at::Tensor to(const at::Tensor& t, Device device) { return to(t, t.scalar_type(), device); }
  // torch.empty / zeros / clone on a device.
  at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype, Device device);
  at::Tensor zeros(at::IntArrayRef shape, at::ScalarType dtype, Device device);
  at::Tensor empty_like(const at::Tensor& t, at::ScalarType dtype);
  at::Tensor zeros_like(const at::Tensor& t);
  at::Tensor clone(const at::Tensor& t);                                        // same device
  at::Tensor scalar_tensor(double value, at::ScalarType dtype, Device device);  // torch.tensor(x)
  at::Tensor randn_like(const at::Tensor& t);

  // --- fault sites (model/faults.h) ----------------------------------------------------------
  void enable_faults(const std::vector<std::string>& names) { faults_ = names; }
  // True when `site` is enabled for this run; counts the firing.
  bool fault(const char* site);
  const std::vector<std::pair<std::string, int64_t>>& fault_firings() const { return firings_; }

  // --- tensor attributes -------------------------------------------------------------------
  // p.grad; an undefined tensor means None.
  at::Tensor grad(const at::Tensor& p) const;
  void set_grad(const at::Tensor& p, at::Tensor g);  // undefined g = `p.grad = None`
  // p.decoupled_grad, the attribute a precision-aware DistributedOptimizer writes instead of
  // .grad (distrib_optimizer.py _copy_model_grads_to_main_grads). A plain Python attribute: it
  // exists from its first assignment on (has_decoupled_grad = hasattr), and None is a value.
  bool has_decoupled_grad(const at::Tensor& p) const { return decoupled_grads_.contains(p); }
  at::Tensor decoupled_grad(const at::Tensor& p) const;
  void set_decoupled_grad(const at::Tensor& p, at::Tensor g);
  // getattr(p, "decoupled_grad", p.grad): what HybridDeviceOptimizer reads. Once the attribute
  // exists it wins, even when it is None.
  at::Tensor decoupled_grad_or_grad(const at::Tensor& p) const {
    return has_decoupled_grad(p) ? decoupled_grad(p) : grad(p);
  }

 private:
  void place(const at::Tensor& t, Device d);
  void fill_garbage(at::Tensor& t);

  at::Tensor on(at::Tensor t, Device d);  // real mode: move a fresh CPU tensor to d

  int64_t rank_;
  bool real_cuda_ = false;
  Rng garbage_;
  Rng randn_;
  // Storage identity -> simulated device; the c10::Storage keeps the key alive (lookup only).
  std::unordered_map<const void*, std::pair<c10::Storage, Device>> devices_;  // lookup only
  TensorMap<at::Tensor> grads_;
  TensorMap<at::Tensor> decoupled_grads_;
  std::vector<std::string> faults_;
  std::vector<std::pair<std::string, int64_t>> firings_;
};

}  // namespace ckptsim::model
