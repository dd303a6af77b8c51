// TE FusedAdam (ADAM_MODE_1, fp32 params, grads and moments) as a CUDA kernel: the GPU half
// of the simulator's optimizers (spec §13), and the device-memory helpers a caller needs to
// feed it. This header includes no CUDA header, so every translation unit that uses it
// compiles with the host compiler alone; the kernel lives in model/cuda/fused_adam_cuda.cu,
// and a build without nvcc links model/cuda/fused_adam_cuda_stub.cpp instead (then
// cuda_fused_adam_available() is false and everything else throws). Code that must know at
// compile time sees CKPTSIM_HAVE_CUDA=1 in CUDA builds (undefined otherwise).
//
// What cuda_fused_adam promises:
//   1. Bitwise equal to fused_adam_update() (model/adam_math.h) on the same inputs, for every
//      output that is not NaN: the host scalars come from the same te_adam_scalars(), the
//      per-element operations are the same IEEE single-precision ops in the same order, with
//      round-to-nearest intrinsics (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn)
//      that nvcc never fuses into FMAs, in a translation unit built with --fmad=false
//      -prec-div=true -prec-sqrt=true -ftz=false. Equality is what lets the simulator run a
//      GPU and a CPU trajectory and compare them bit for bit. Where an output is NaN the other
//      is NaN too, but the payload may differ: x86 produces its "default NaN" (sign bit set)
//      for an invalid operation and propagates an operand's payload, CUDA produces the
//      canonical NaN 0x7fffffff.
//   2. Not bitwise equal to TE's own kernel: nvcc builds transformer_engine with its default
//      --fmad=true, so TE's GPU results contract a·b + c into FMAs and can differ from both
//      of ours by an ulp or so per operation (adam_math.h, fused_adam_update).
//   3. Elementwise, so the result does not depend on how tensors are split into chunks,
//      launches or vector/scalar paths; element i of a tensor reads and writes only element i
//      of its four arrays, and nothing outside [0, numel) of each array is touched.
//   4. A multi-tensor apply: the whole list in ceil(tensors / 64) launches (64 tensors' worth
//      of pointers is what fits in the 4 KiB of kernel parameters every driver accepts).
//   5. Synchronous when `stream` is null: the update is complete on return. With a stream
//      (a cudaStream_t), the launches are queued on it and the call returns at once.
//   6. CUDA failures throw InvariantViolation naming the CUDA call and its error text. A
//      failure in a later launch leaves the tensors of earlier launches updated.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "model/kernels/adam_math.h"

namespace ckptsim::model {

// One tensor's fp32 storage on the current CUDA device. Views are fine: each pointer may sit
// at any float offset of its allocation, and the four need not share alignment (a tensor
// whose four pointers are equally aligned mod 16 bytes takes the float4 path, else the
// scalar path; the bits are the same).
struct FusedAdamTensors {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  int64_t numel = 0;
};

// True when this build has the kernel and a CUDA device can run it (at least one device
// is visible and the binary holds code it can load). Probed once per process.
bool cuda_fused_adam_available();

// Why cuda_fused_adam_available() is false, e.g. "built without CUDA (no nvcc at configure
// time)" or "no CUDA device: cudaErrorNoDevice: no CUDA-capable device is detected"; empty
// when it is true.
std::string cuda_unavailable_reason();

// TE FusedAdam with adam_w_mode=1 over every tensor of `list` (see the header comment).
// REQUIRES: cuda_fused_adam_available(); 1 <= step <= INT32_MAX; for each tensor numel >= 0
// and, when numel > 0, four non-null, 4-byte-aligned device pointers of the current device
// whose [0, numel) ranges do not overlap each other or any other tensor's. Violations that
// can be seen on the host throw InvariantViolation before anything is launched.
void cuda_fused_adam(std::span<const FusedAdamTensors> list, const AdamHyper& h, int64_t step,
                     void* stream = nullptr);

// "NVIDIA H200 (sm_90, 132 SMs, 60 MiB L2)" for the current device; a reason when none.
std::string cuda_device_description();

// Device memory of `size()` floats on the current device (cudaMalloc, so 256-byte aligned),
// owned; move-only. Copies are synchronous and go through the legacy default stream, so they
// are ordered after work queued on it and on every blocking stream (CudaStream's streams).
class CudaFloatBuffer {
 public:
  CudaFloatBuffer() = default;
  // REQUIRES: count >= 0. Throws InvariantViolation when the allocation fails (or without
  // CUDA).
  explicit CudaFloatBuffer(int64_t count);
  ~CudaFloatBuffer();
  CudaFloatBuffer(CudaFloatBuffer&& other) noexcept;
  CudaFloatBuffer& operator=(CudaFloatBuffer&& other) noexcept;
  CudaFloatBuffer(const CudaFloatBuffer&) = delete;
  CudaFloatBuffer& operator=(const CudaFloatBuffer&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  int64_t size() const { return size_; }

  // Copies `src` to elements [offset, offset + src.size()).
  // REQUIRES: 0 <= offset and offset + src.size() <= size().
  void upload(std::span<const float> src, int64_t offset = 0);
  // Copies elements [offset, offset + dst.size()) into `dst`.
  // REQUIRES: 0 <= offset and offset + dst.size() <= size().
  void download(std::span<float> dst, int64_t offset = 0) const;

 private:
  float* data_ = nullptr;
  int64_t size_ = 0;
};

// An owned CUDA stream (cudaStreamCreate: a blocking stream, ordered with the legacy default
// stream); handle() is the cudaStream_t to pass to cuda_fused_adam.
class CudaStream {
 public:
  CudaStream();  // throws InvariantViolation when the stream cannot be created
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  void* handle() const { return stream_; }
  // Waits for everything queued on the stream; throws InvariantViolation with the error of a
  // failed kernel.
  void synchronize() const;

 private:
  void* stream_ = nullptr;
};

}  // namespace ckptsim::model
