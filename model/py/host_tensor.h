// Host fast paths: the hot small-tensor operations of the modeled code, done on the host
// tensor's memory directly instead of through libtorch's dispatcher.
//
// Why it exists: the model's tensors are small (tens to thousands of elements), so a torch op
// on one costs far more in dispatch, TensorIterator set-up and autograd view bookkeeping than in
// the work itself (a profile of the search: a quarter of all time inside torch called for such
// ops). Each function here stands for one torch expression, named in its comment.
//
// Invariants:
//   1. Same bits: each function returns (or writes) exactly what its torch expression would,
//      NaN payloads and -0.0 included. It takes its fast path only for host tensors it fully
//      understands (dense, strided, contiguous, no conj/neg bit, a dtype it converts exactly)
//      and otherwise calls the torch expression itself, so errors, real-GPU tensors and unusual
//      layouts behave exactly as torch's.
//   2. A view stays a view: narrow()/view() return a tensor that shares the storage of its
//      base (writes through it reach the base), a new tensor object each call, as torch's do.
//      Their only difference from torch's views: no autograd view metadata (the model never
//      asks for ._base, ._version or grad_fn; no tensor requires grad).
//   3. Float -> bfloat16 here rounds to nearest even as c10::BFloat16 does; a NaN makes the
//      caller fall back to torch (torch's vectorized and scalar conversions disagree on
//      NaN's bits, so only torch itself gives torch's answer).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

namespace ckptsim::model::host {

// Whether `t` is a dense host tensor whose numel() elements lie contiguously from data_ptr().
bool contiguous(const at::Tensor& t);

// c10::BFloat16 -> float: exact (the bits shifted up; NaN payloads kept).
inline float bf16_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// float -> c10::BFloat16, round to nearest even; nullopt for a NaN (invariant 3).
inline std::optional<uint16_t> float_to_bf16(float f) {
  if (f != f) return std::nullopt;
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>((u + ((u >> 16) & 1U) + 0x7FFFU) >> 16);
}

// t.to(torch.float32).to('cpu').contiguous(), its elements.
std::vector<float> floats(const at::Tensor& t);
// t.item() as a Python float, for a one-element t. REQUIRES: t.numel() == 1.
double item(const at::Tensor& t);

// torch.empty(shape, dtype=dtype) on the host (its memory uninitialized, as torch's).
at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype);
// torch.zeros(shape, dtype=dtype) on the host.
at::Tensor zeros(at::IntArrayRef shape, at::ScalarType dtype);
// t.clone(memory_format=torch.contiguous_format).
at::Tensor clone(const at::Tensor& t);
// t.zero_().
void zero_(const at::Tensor& t);
// dst.copy_(src).
void copy_(const at::Tensor& dst, const at::Tensor& src);
// dst.copy_(torch.tensor(src)): float elements into a tensor of dst's dtype. REQUIRES:
// dst.numel() == src.size().
void copy_floats(const at::Tensor& dst, std::span<const float> src);
// Copies the bytes of one `dtype` tensor's elements into dst: dst.copy_(that tensor).
// REQUIRES: dst.numel() * elementSize(dtype) == bytes.size().
void copy_bytes(const at::Tensor& dst, at::ScalarType dtype, std::span<const std::byte> bytes);

// t.narrow(0, start, length): a view.
at::Tensor narrow(const at::Tensor& t, int64_t start, int64_t length);
// t.view(shape): a view (no -1 in shape; torch's own for anything else).
at::Tensor view(const at::Tensor& t, at::IntArrayRef shape);
// t.view(-1).
at::Tensor view_flat(const at::Tensor& t);
// t.reshape(shape): a view where torch's is one (no -1 in shape).
at::Tensor reshape(const at::Tensor& t, at::IntArrayRef shape);

}  // namespace ckptsim::model::host
