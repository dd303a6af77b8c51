#include "model/py/host_tensor.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <functional>

#include "model/errors.h"

namespace ckptsim::model::host {

namespace {

// The dtypes whose fast paths are plain bytes (zeros, clone, same-dtype copies).
bool plain(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
    case at::kBFloat16:
    case at::kHalf:
    case at::kDouble:
    case at::kLong:
    case at::kInt:
      return true;
    default:
      return false;
  }
}

// A dense, strided host tensor torch would read as it is: no conj/neg bit, no ZeroTensor.
bool plain_host(const at::Tensor& t) {
  return t.defined() && t.layout() == at::kStrided && t.device().is_cpu() && t.has_storage() &&
         !t.is_conj() && !t.is_neg() && !t._is_zerotensor() && plain(t.scalar_type());
}

size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// Converts n elements between host buffers that do not overlap: bf16 -> float exactly, float ->
// bf16 rounding to nearest even. False (dst partly written) when torch must do it: another
// pair of dtypes, or a NaN (invariant 3).
bool convert(void* dst, at::ScalarType dst_dtype, const void* src, at::ScalarType src_dtype,
             size_t n) {
  if (dst_dtype == at::kFloat && src_dtype == at::kBFloat16) {
    auto* d = static_cast<float*>(dst);
    const auto* s = static_cast<const uint16_t*>(src);
    for (size_t i = 0; i < n; ++i) d[i] = bf16_to_float(s[i]);
    return true;
  }
  if (dst_dtype == at::kBFloat16 && src_dtype == at::kFloat) {
    auto* d = static_cast<uint16_t*>(dst);
    const auto* s = static_cast<const float*>(src);
    for (size_t i = 0; i < n; ++i) {
      const std::optional<uint16_t> b = float_to_bf16(s[i]);
      if (!b) return false;
      d[i] = *b;
    }
    return true;
  }
  return false;
}

// A view of `base`'s storage, as at::native's alias_with_sizes_and_strides / as_strided make it.
at::Tensor make_view(const at::Tensor& base, at::IntArrayRef sizes, at::IntArrayRef strides,
                     int64_t storage_offset) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(base.storage()), base.key_set(), base.dtype());
  impl->set_sizes_and_strides(sizes, strides, storage_offset);
  return at::Tensor(std::move(impl));
}

}  // namespace

bool contiguous(const at::Tensor& t) {
  if (!plain_host(t)) return false;
  const at::IntArrayRef sizes = t.sizes();
  const at::IntArrayRef strides = t.strides();
  int64_t expected = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (strides[d] != expected) return false;
    expected *= std::max<int64_t>(sizes[d], 1);
  }
  return true;
}

std::vector<float> floats(const at::Tensor& t) {
  if (contiguous(t)) {
    const auto n = static_cast<size_t>(t.numel());
    if (t.scalar_type() == at::kFloat) {
      const auto* p = static_cast<const float*>(t.data_ptr());
      return {p, p + n};
    }
    std::vector<float> out(n);
    if (n == 0 || convert(out.data(), at::kFloat, t.data_ptr(), t.scalar_type(), n)) return out;
  }
  const at::Tensor f = t.to(at::kFloat).to(at::kCPU).contiguous();
  return {f.data_ptr<float>(), f.data_ptr<float>() + f.numel()};
}

double item(const at::Tensor& t) {
  if (plain_host(t) && t.numel() == 1) {
    const void* p = t.data_ptr();
    switch (t.scalar_type()) {
      case at::kFloat:
        return static_cast<double>(*static_cast<const float*>(p));
      case at::kDouble:
        return *static_cast<const double*>(p);
      case at::kBFloat16:
        return static_cast<double>(bf16_to_float(*static_cast<const uint16_t*>(p)));
      case at::kLong:
        return static_cast<double>(*static_cast<const int64_t*>(p));
      case at::kInt:
        return static_cast<double>(*static_cast<const int32_t*>(p));
      default:
        break;
    }
  }
  return t.reshape({}).item<double>();
}

at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype) {
  if (!plain(dtype)) return at::empty(shape, at::TensorOptions().dtype(dtype));
  return at::Tensor(at::detail::empty_cpu(shape, dtype));
}

at::Tensor zeros(at::IntArrayRef shape, at::ScalarType dtype) {
  at::Tensor t = empty(shape, dtype);
  zero_(t);  // every plain dtype's zero is all zero bits
  return t;
}

at::Tensor clone(const at::Tensor& t) {
  if (!contiguous(t)) return t.clone(at::MemoryFormat::Contiguous);
  at::Tensor out = empty(t.sizes(), t.scalar_type());
  if (const size_t n = nbytes(t); n > 0) std::memcpy(out.data_ptr(), t.data_ptr(), n);
  return out;
}

void zero_(const at::Tensor& t) {
  if (!contiguous(t)) {
    t.zero_();
    return;
  }
  if (const size_t n = nbytes(t); n > 0) std::memset(t.data_ptr(), 0, n);
}

void copy_(const at::Tensor& dst, const at::Tensor& src) {
  if (contiguous(dst) && contiguous(src) && dst.sizes() == src.sizes()) {
    const size_t n = static_cast<size_t>(dst.numel());
    if (n == 0) return;
    const auto* d = static_cast<const std::byte*>(dst.data_ptr());
    const auto* s = static_cast<const std::byte*>(src.data_ptr());
    const bool disjoint = d + nbytes(dst) <= s || s + nbytes(src) <= d;
    if (dst.scalar_type() == src.scalar_type()) {
      // The same elements (torch copies each onto itself), or none shared (torch rejects a
      // partial overlap: its own path raises that).
      if (d == s) return;
      if (disjoint) {
        std::memcpy(dst.data_ptr(), src.data_ptr(), nbytes(dst));
        return;
      }
    } else if (disjoint &&
               convert(dst.data_ptr(), dst.scalar_type(), src.data_ptr(), src.scalar_type(), n)) {
      return;
    }
  }
  at::Tensor d = dst;
  d.copy_(src);
}

void copy_bytes(const at::Tensor& dst, at::ScalarType dtype, std::span<const std::byte> bytes) {
  CKPTSIM_CHECK(bytes.size() == static_cast<size_t>(dst.numel()) * c10::elementSize(dtype),
                "copy_bytes: the bytes are not dst's numel elements");
  if (contiguous(dst) && dst.scalar_type() == dtype) {
    if (!bytes.empty()) std::memcpy(dst.data_ptr(), bytes.data(), bytes.size());
    return;
  }
  at::Tensor src = empty({static_cast<int64_t>(bytes.size() / c10::elementSize(dtype))}, dtype);
  if (!bytes.empty()) std::memcpy(src.data_ptr(), bytes.data(), bytes.size());
  copy_(dst, src);
}

at::Tensor narrow(const at::Tensor& t, int64_t start, int64_t length) {
  if (!plain_host(t) || t.dim() == 0 || start < 0 || length < 0 || start > t.size(0) - length)
    return t.narrow(0, start, length);  // torch's own, and its errors
  c10::SmallVector<int64_t, 5> sizes(t.sizes().begin(), t.sizes().end());
  sizes[0] = length;
  return make_view(t, sizes, t.strides(), t.storage_offset() + start * t.stride(0));
}

namespace {

// The view torch's view(shape) and reshape(shape) give of a contiguous `t` (computeStride on one
// chunk: contiguous strides), or nullopt where this does not know torch's answer.
std::optional<at::Tensor> contiguous_view(const at::Tensor& t, at::IntArrayRef shape) {
  int64_t numel = 1;
  for (const int64_t s : shape) numel *= s;
  const bool simple = std::all_of(shape.begin(), shape.end(), [](int64_t s) { return s >= 1; });
  if (!simple || t.dim() == 0 || t.numel() == 0 || numel != t.numel() || !contiguous(t))
    return std::nullopt;
  c10::SmallVector<int64_t, 5> strides(shape.size());
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= shape[d];
  }
  return make_view(t, shape, strides, t.storage_offset());
}

}  // namespace

at::Tensor view(const at::Tensor& t, at::IntArrayRef shape) {
  if (std::optional<at::Tensor> v = contiguous_view(t, shape)) return *std::move(v);
  return t.view(shape);  // torch's own, and its errors
}

at::Tensor view_flat(const at::Tensor& t) {
  if (t.dim() >= 1) {  // (a 0-dim tensor's view(-1) has shape [1])
    if (std::optional<at::Tensor> v = contiguous_view(t, {t.numel()})) return *std::move(v);
  }
  return t.view(-1);
}

at::Tensor reshape(const at::Tensor& t, at::IntArrayRef shape) {
  if (std::optional<at::Tensor> v = contiguous_view(t, shape)) return *std::move(v);
  return t.reshape(shape);
}

}  // namespace ckptsim::model::host
