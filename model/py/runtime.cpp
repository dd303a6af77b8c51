#include "model/py/runtime.h"

#include <ATen/Context.h>
#include <ATen/ops/clone.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/kernels/fused_adam_cuda.h"
#include "model/py/host_tensor.h"

namespace ckptsim::model {

std::string device_name(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

uint64_t Rng::next_u64() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double Rng::next_unit() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

float Rng::next_normal() {
  const double u1 = 1.0 - next_unit();  // (0, 1]
  const double u2 = next_unit();
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

uint64_t mix_seed(uint64_t a, uint64_t b) {
  Rng r(a ^ (b * 0xd1b54a32d192ed03ULL));
  r.next_u64();
  return r.next_u64();
}

namespace {
constexpr uint64_t kGarbageStream = 1;
constexpr uint64_t kRandnStream = 2;
}  // namespace

bool real_cuda_available(std::string* why) {
  if (!at::hasCUDA()) {
    // A build without our CUDA kernel links no libtorch_cuda even where libtorch has one
    // (CMakeLists.txt: CKPTSIM_TORCH_LINK), so libtorch reports no CUDA there too.
    if (why != nullptr) {
      *why = "libtorch's CUDA is not loaded (a CPU libtorch, or a build without the CUDA kernel)";
    }
    return false;
  }
  if (!cuda_fused_adam_available()) {
    if (why != nullptr) *why = cuda_unavailable_reason();
    return false;
  }
  return true;
}

Runtime::Runtime(uint64_t root_seed, int64_t phase, int64_t rank, bool real_cuda)
    : rank_(rank),
      real_cuda_(real_cuda),
      garbage_(mix_seed(
          mix_seed(mix_seed(root_seed, static_cast<uint64_t>(phase)), static_cast<uint64_t>(rank)),
          kGarbageStream)),
      randn_(mix_seed(
          mix_seed(mix_seed(root_seed, static_cast<uint64_t>(phase)), static_cast<uint64_t>(rank)),
          kRandnStream)) {}

at::Tensor Runtime::on(at::Tensor t, Device d) {
  if (real_cuda_ && d == Device::kCuda) return t.to(at::kCUDA);
  place(t, d);
  return t;
}

Device Runtime::device_of(const at::Tensor& t) const {
  CKPTSIM_CHECK(t.defined(), "device_of an undefined tensor");
  if (real_cuda_) return t.is_cuda() ? Device::kCuda : Device::kCpu;
  auto it = devices_.find(t.storage().unsafeGetStorageImpl());
  return it == devices_.end() ? Device::kCpu : it->second.second;
}

void Runtime::place(const at::Tensor& t, Device d) {
  if (real_cuda_) return;
  const void* id = t.storage().unsafeGetStorageImpl();
  if (d == Device::kCpu) {
    devices_.erase(id);
    return;
  }
  devices_[id] = {t.storage(), d};
}

at::Tensor Runtime::to(const at::Tensor& t, at::ScalarType dtype, Device device) {
  CKPTSIM_CHECK(t.defined(), "Runtime::to on an undefined tensor");
  if (t.scalar_type() == dtype && device_of(t) == device) return t;
  if (real_cuda_) {
    return t.to(
        at::TensorOptions().dtype(dtype).device(device == Device::kCuda ? at::kCUDA : at::kCPU),
        /*non_blocking=*/false, /*copy=*/true);
  }
  // _to_copy: a new tensor of t's strides (contiguous ones here), then copy_.
  at::Tensor out;
  if (host::contiguous(t)) {
    out = host::empty(t.sizes(), dtype);
    host::copy_(out, t);
  } else {
    out = t.to(dtype, /*non_blocking=*/false, /*copy=*/true);
  }
  place(out, device);
  return out;
}

void Runtime::fill_garbage(at::Tensor& t) {
  // Uninitialized memory: arbitrary but reproducible bit patterns.
  auto* bytes = static_cast<unsigned char*>(t.data_ptr());
  const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = garbage_.next_u64();
    std::memcpy(bytes + i, &r, std::min<size_t>(8, n - i));
  }
}

at::Tensor Runtime::empty(at::IntArrayRef shape, at::ScalarType dtype, Device device) {
  at::Tensor t = host::empty(shape, dtype);
  fill_garbage(t);  // on the host, so that a GPU run holds the very same garbage
  return on(std::move(t), device);
}

at::Tensor Runtime::zeros(at::IntArrayRef shape, at::ScalarType dtype, Device device) {
  return on(host::zeros(shape, dtype), device);
}

at::Tensor Runtime::empty_like(const at::Tensor& t, at::ScalarType dtype) {
  return empty(t.sizes(), dtype, device_of(t));
}

at::Tensor Runtime::zeros_like(const at::Tensor& t) {
  return zeros(t.sizes(), t.scalar_type(), device_of(t));
}

at::Tensor Runtime::clone(const at::Tensor& t) {
  at::Tensor out = host::clone(t);
  if (!real_cuda_) place(out, device_of(t));
  return out;
}

at::Tensor Runtime::scalar_tensor(double value, at::ScalarType dtype, Device device) {
  return on(at::scalar_tensor(value, at::TensorOptions().dtype(dtype)), device);
}

at::Tensor Runtime::randn_like(const at::Tensor& t) {
  at::Tensor out = at::empty(t.sizes(), at::TensorOptions().dtype(at::kFloat));
  float* p = out.data_ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) p[i] = randn_.next_normal();
  if (t.scalar_type() != at::kFloat) out = out.to(t.scalar_type());
  return on(std::move(out), device_of(t));
}

bool Runtime::fault(const char* site) {
  if (std::find(faults_.begin(), faults_.end(), site) == faults_.end()) return false;
  for (auto& [name, count] : firings_) {
    if (name == site) {
      ++count;
      return true;
    }
  }
  firings_.emplace_back(site, 1);
  return true;
}

at::Tensor Runtime::grad(const at::Tensor& p) const {
  const at::Tensor* g = grads_.find(p);
  return g == nullptr ? at::Tensor() : *g;
}

void Runtime::set_grad(const at::Tensor& p, at::Tensor g) { grads_.set(p, std::move(g)); }

at::Tensor Runtime::decoupled_grad(const at::Tensor& p) const {
  const at::Tensor* g = decoupled_grads_.find(p);
  return g == nullptr ? at::Tensor() : *g;
}

void Runtime::set_decoupled_grad(const at::Tensor& p, at::Tensor g) {
  decoupled_grads_.set(p, std::move(g));
}

}  // namespace ckptsim::model
