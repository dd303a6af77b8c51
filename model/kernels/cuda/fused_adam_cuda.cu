// CUDA build of model/fused_adam_cuda.h: the FusedAdam kernel, its launcher and the device
// memory helpers. The kernel body is model/cuda/fused_adam_kernel.h (shared with the CPU
// tests).
//
// Rounding (the reason for this file's compile flags, set in CMakeLists.txt):
//   --fmad=false -prec-div=true -prec-sqrt=true -ftz=false
// make every float multiply, add, divide and square root in this translation unit a separate,
// correctly rounded IEEE operation with denormals kept, which is what the CPU reference
// fused_adam_update (built with -ffp-contract=off) does. The element math also spells each
// operation with a _rn intrinsic, which nvcc never contracts, so the bits do not hang on the
// flags alone. Bitwise equality with the CPU reference is what lets the simulator compare a
// GPU run with a CPU run bit for bit. TE's real kernel is built with nvcc's default
// --fmad=true and uses FMAs, so neither our kernel nor our CPU reference is bitwise equal to
// TE itself (adam_math.h says so at fused_adam_update).
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "model/errors.h"
#include "model/kernels/cuda/fused_adam_kernel.h"
#include "model/kernels/fused_adam_cuda.h"

namespace ckptsim::model {
namespace cuda_detail {
namespace {

constexpr int32_t kThreadsPerBlock = 512;
constexpr int kDevicesMax = 64;

// One launch of a plan. __grid_constant__ keeps the 4 KiB argument block in the constant
// bank: run_block indexes its slots at run time, which would otherwise copy it to local
// memory.
__global__ void __launch_bounds__(kThreadsPerBlock)
    fused_adam_kernel(const __grid_constant__ LaunchArgs args) {
  run_block(args, blockIdx.x, gridDim.x, static_cast<int32_t>(threadIdx.x),
            static_cast<int32_t>(blockDim.x));
}

std::string error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw InvariantViolation(std::string("CUDA error in ") + what + ": " + error_text(e));
  }
}

struct Availability {
  bool available = false;
  std::string reason;
};

Availability probe() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return {false, "no CUDA device: " + error_text(e)};
  if (count == 0) return {false, "no CUDA device: cudaGetDeviceCount found 0 devices"};
  // Can the current device load our code (sm_90 machine code or PTX it can JIT)?
  cudaFuncAttributes attributes{};
  const cudaError_t f = cudaFuncGetAttributes(&attributes, fused_adam_kernel);
  if (f != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it so it does not surface in a later call
    return {false, "CUDA device cannot run the FusedAdam kernel: " + error_text(f)};
  }
  return {true, ""};
}

const Availability& availability() {
  static const Availability a = probe();
  return a;
}

// SMs × resident blocks per SM of the current device, looked up once per device.
int64_t resident_blocks() {
  static std::array<std::atomic<int64_t>, kDevicesMax> cache{};
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  CKPTSIM_CHECK(device >= 0 && device < kDevicesMax,
                "cuda_fused_adam: device index must not exceed " + std::to_string(kDevicesMax));
  const int64_t cached = cache[device].load(std::memory_order_relaxed);
  if (cached > 0) return cached;
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute(MultiProcessorCount)");
  int per_sm = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fused_adam_kernel, kThreadsPerBlock,
                                                      0),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  CKPTSIM_CHECK(sms >= 1 && per_sm >= 1,
                "cuda_fused_adam: the device must not report 0 SMs or 0 resident blocks");
  const int64_t blocks = int64_t{sms} * per_sm;
  cache[device].store(blocks, std::memory_order_relaxed);
  return blocks;
}

}  // namespace
}  // namespace cuda_detail

bool cuda_fused_adam_available() { return cuda_detail::availability().available; }

std::string cuda_unavailable_reason() { return cuda_detail::availability().reason; }

void cuda_fused_adam(std::span<const FusedAdamTensors> list, const AdamHyper& h, int64_t step,
                     void* stream) {
  using namespace cuda_detail;
  const TeAdamScalars scalars = te_adam_scalars(h, step);
  CKPTSIM_CHECK(cuda_fused_adam_available(),
                "cuda_fused_adam: must not be called without a usable CUDA device (" +
                    cuda_unavailable_reason() + ")");
  PlanLimits limits;
  limits.resident_blocks = resident_blocks();
  limits.threads_per_block = kThreadsPerBlock;
  const std::vector<Launch> launches = plan_fused_adam(list, scalars, limits);

  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  for (const Launch& launch : launches) {
    fused_adam_kernel<<<static_cast<unsigned>(launch.grid_blocks), kThreadsPerBlock, 0, s>>>(
        launch.args);
    check(cudaGetLastError(), "fused_adam_kernel launch");
  }
  if (stream == nullptr) check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
}

std::string cuda_device_description() {
  if (!cuda_fused_adam_available()) return cuda_unavailable_reason();
  int device = 0;
  cuda_detail::check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_detail::check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) + " SMs, " +
         std::to_string(prop.l2CacheSize >> 20) + " MiB L2)";
}

// ---- CudaFloatBuffer -----------------------------------------------------------------------

CudaFloatBuffer::CudaFloatBuffer(int64_t count) {
  CKPTSIM_CHECK(count >= 0, "CudaFloatBuffer: count must not be negative");
  if (count == 0) return;
  void* p = nullptr;
  cuda_detail::check(cudaMalloc(&p, static_cast<size_t>(count) * sizeof(float)), "cudaMalloc");
  data_ = static_cast<float*>(p);
  size_ = count;
}

CudaFloatBuffer::~CudaFloatBuffer() {
  // A destructor cannot throw; a failing cudaFree means the context is already broken and
  // the next checked call reports it.
  if (data_ != nullptr) cudaFree(data_);
}

CudaFloatBuffer::CudaFloatBuffer(CudaFloatBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

CudaFloatBuffer& CudaFloatBuffer::operator=(CudaFloatBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void CudaFloatBuffer::upload(std::span<const float> src, int64_t offset) {
  CKPTSIM_CHECK(offset >= 0 && offset + static_cast<int64_t>(src.size()) <= size_,
                "CudaFloatBuffer::upload: the range must not leave the buffer");
  if (src.empty()) return;
  cuda_detail::check(
      cudaMemcpy(data_ + offset, src.data(), src.size_bytes(), cudaMemcpyHostToDevice),
      "cudaMemcpy(HostToDevice)");
}

void CudaFloatBuffer::download(std::span<float> dst, int64_t offset) const {
  CKPTSIM_CHECK(offset >= 0 && offset + static_cast<int64_t>(dst.size()) <= size_,
                "CudaFloatBuffer::download: the range must not leave the buffer");
  if (dst.empty()) return;
  cuda_detail::check(
      cudaMemcpy(dst.data(), data_ + offset, dst.size_bytes(), cudaMemcpyDeviceToHost),
      "cudaMemcpy(DeviceToHost)");
}

// ---- CudaStream ----------------------------------------------------------------------------

CudaStream::CudaStream() {
  cudaStream_t s = nullptr;
  cuda_detail::check(cudaStreamCreate(&s), "cudaStreamCreate");
  stream_ = s;
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void CudaStream::synchronize() const {
  cuda_detail::check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
                     "cudaStreamSynchronize");
}

}  // namespace ckptsim::model
