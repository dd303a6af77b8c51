// model/fused_adam_cuda.h in a build without CUDA (no nvcc at configure time, or
// -DCKPTSIM_CUDA=OFF): nothing is available, and everything that would touch a device throws.
#include <string>

#include "model/errors.h"
#include "model/kernels/fused_adam_cuda.h"

namespace ckptsim::model {
namespace {

constexpr const char* kReason =
    "built without CUDA (no nvcc at configure time, or CKPTSIM_CUDA=OFF)";

[[noreturn]] void unavailable(const char* what) {
  throw InvariantViolation(std::string(what) + ": must not be called in a build without CUDA (" +
                           kReason + ")");
}

}  // namespace

bool cuda_fused_adam_available() { return false; }

std::string cuda_unavailable_reason() { return kReason; }

void cuda_fused_adam(std::span<const FusedAdamTensors> /*list*/, const AdamHyper& h, int64_t step,
                     void* /*stream*/) {
  te_adam_scalars(h, step);  // the same argument errors as the CUDA build, first
  unavailable("cuda_fused_adam");
}

std::string cuda_device_description() { return kReason; }

CudaFloatBuffer::CudaFloatBuffer(int64_t count) {
  if (count > 0) unavailable("CudaFloatBuffer");
}

CudaFloatBuffer::~CudaFloatBuffer() = default;

CudaFloatBuffer::CudaFloatBuffer(CudaFloatBuffer&& other) noexcept
    : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

CudaFloatBuffer& CudaFloatBuffer::operator=(CudaFloatBuffer&& other) noexcept {
  data_ = other.data_;
  size_ = other.size_;
  other.data_ = nullptr;
  other.size_ = 0;
  return *this;
}

void CudaFloatBuffer::upload(std::span<const float> src, int64_t /*offset*/) {
  if (!src.empty()) unavailable("CudaFloatBuffer::upload");
}

void CudaFloatBuffer::download(std::span<float> dst, int64_t /*offset*/) const {
  if (!dst.empty()) unavailable("CudaFloatBuffer::download");
}

CudaStream::CudaStream() { unavailable("CudaStream"); }

CudaStream::~CudaStream() = default;

void CudaStream::synchronize() const { unavailable("CudaStream::synchronize"); }

}  // namespace ckptsim::model
