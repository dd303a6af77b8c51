// Benchmark of the CUDA FusedAdam kernel (model/fused_adam_cuda.h) against the two numbers
// that say how good it is, each measured in the same benchmark case so that one run's JSON
// gives every ratio (scripts/gpu-bench-report.py turns it into reports/gpu-fused-adam.md):
//   * the device's own copy bandwidth: cudaMemcpyAsync device-to-device of 14 bytes per
//     element, which reads 14 and writes 14, the same 28 bytes per element the kernel moves
//     (reads p, g, m, v; writes p, m, v). kernel_over_copy = kernel_GBps / copy_GBps is the
//     fraction of the achievable bandwidth the kernel reaches (the floor: no Adam kernel can
//     beat a copy of its bytes);
//   * PyTorch's CUDA fused AdamW, at::_fused_adamw_ on the same shapes and values, when this
//     build's libtorch has it (kernel_over_torch = kernel_GBps / torch_GBps; > 1 is faster).
// Cases: 2^20, 2^24, 2^26, 2^28 elements, as one tensor and as 64 tensors. Each timed
// iteration is one cuda_fused_adam call on a stream, between two CUDA events. Inputs are
// random (never zeros), and when one state is smaller than 3× the L2 cache, iterations
// rotate over several copies so that the timing is of device memory, not of the cache.
// Counters (per case): elements, tensors, bytes_moved, kernel_us (median), kernel_GBps,
// copy_us, copy_GBps, kernel_over_copy, torch_us, torch_GBps, kernel_over_torch (0 when torch
// has no CUDA fused AdamW). The context holds the GPU and library versions.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/kernels/adam_math.h"
#include "model/kernels/fused_adam_cuda.h"

#if defined(CKPTSIM_WITH_TORCH) && defined(CKPTSIM_TORCH_HAS_CUDA)
#if CKPTSIM_TORCH_HAS_CUDA && __has_include(<ATen/ops/_fused_adamw.h>)
#define CKPTSIM_TORCH_FUSED_ADAMW 1
#endif
#endif

#if defined(CKPTSIM_TORCH_FUSED_ADAMW)
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/empty.h>
#include <torch/version.h>
#endif

namespace {

using ckptsim::model::AdamHyper;
using ckptsim::model::CudaFloatBuffer;
using ckptsim::model::FusedAdamTensors;

constexpr int64_t kBytesPerElement = 28;  // read p, g, m, v; write p, m, v
constexpr int kSetsMax = 32;
constexpr int kRepsCopy = 30;
constexpr int kRepsTorch = 30;
constexpr int kWarmup = 3;
constexpr int64_t kTile = int64_t{1} << 20;  // random values, repeated over larger buffers

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(e) +
                             ": " + cudaGetErrorString(e));
  }
}

struct DeviceInfo {
  std::string name;
  int sms = 0;
  int64_t l2_bytes = 0;
};

DeviceInfo device_info() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return {prop.name, prop.multiProcessorCount, prop.l2CacheSize};
}

class Stream {
 public:
  Stream() { check(cudaStreamCreate(&s_), "cudaStreamCreate"); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// Milliseconds of device time between two events recorded on `stream` around `work`.
class EventTimer {
 public:
  EventTimer() {
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  template <class Work>
  double time_ms(cudaStream_t stream, Work&& work) {
    check(cudaEventRecord(start_, stream), "cudaEventRecord");
    work();
    check(cudaEventRecord(stop_, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Random tiles (splitmix64), one per role: p in [-2, 2], g in [-0.01, 0.01], m in
// [-1e-3, 1e-3], v in [1e-8, 1e-4]: a state that has seen some steps.
std::array<std::vector<float>, 4> random_tiles() {
  uint64_t state = 12345;
  auto next = [&state]() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return static_cast<float>((z ^ (z >> 31)) >> 40) * 0x1p-24f;  // [0, 1)
  };
  const float lo[4] = {-2.0f, -0.01f, -1e-3f, 1e-8f};
  const float hi[4] = {2.0f, 0.01f, 1e-3f, 1e-4f};
  std::array<std::vector<float>, 4> tiles;
  for (int role = 0; role < 4; ++role) {
    tiles[role].resize(static_cast<size_t>(kTile));
    for (float& x : tiles[role]) x = lo[role] + (hi[role] - lo[role]) * next();
  }
  return tiles;
}

const std::array<std::vector<float>, 4>& tiles() {
  static const std::array<std::vector<float>, 4> t = random_tiles();
  return t;
}

// Fills `count` floats at `dst` (device) with the role's tile, repeated.
void fill(float* dst, int64_t count, int role) {
  const std::vector<float>& tile = tiles()[role];
  const int64_t first = std::min(count, kTile);
  check(cudaMemcpy(dst, tile.data(), static_cast<size_t>(first) * sizeof(float),
                   cudaMemcpyHostToDevice),
        "cudaMemcpy(HostToDevice)");
  for (int64_t done = first; done < count;) {
    const int64_t n = std::min(done, count - done);  // doubling copies of what is there
    check(cudaMemcpy(dst + done, dst, static_cast<size_t>(n) * sizeof(float),
                     cudaMemcpyDeviceToDevice),
          "cudaMemcpy(DeviceToDevice)");
    done += n;
  }
}

// One Adam state of `elements` split into `tensors` equal contiguous views (the last takes
// the remainder).
struct StateSet {
  std::array<CudaFloatBuffer, 4> arrays;
  std::vector<FusedAdamTensors> list;

  StateSet(int64_t elements, int64_t tensors) {
    for (int role = 0; role < 4; ++role) {
      arrays[role] = CudaFloatBuffer(elements);
      fill(arrays[role].data(), elements, role);
    }
    const int64_t each = elements / tensors;
    for (int64_t j = 0; j < tensors; ++j) {
      const int64_t begin = j * each;
      const int64_t n = j == tensors - 1 ? elements - begin : each;
      list.push_back({arrays[0].data() + begin, arrays[1].data() + begin, arrays[2].data() + begin,
                      arrays[3].data() + begin, n});
    }
  }
};

int sets_for(int64_t bytes_per_set, int64_t l2_bytes) {
  const int64_t want = (3 * l2_bytes + bytes_per_set - 1) / bytes_per_set;
  return static_cast<int>(std::clamp<int64_t>(want, 1, kSetsMax));
}

AdamHyper bench_hyper() {
  AdamHyper h;  // lr 1e-3
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.eps = 1e-8;
  h.weight_decay = 0.1;
  return h;
}
constexpr int64_t kStep = 1000;

// Median device time of a device-to-device copy of `bytes`, rotating over buffer pairs.
double copy_median_ms(int64_t bytes, int64_t l2_bytes, cudaStream_t stream) {
  const int pairs = sets_for(2 * bytes, l2_bytes);
  const int64_t floats = (bytes + 3) / 4;
  std::vector<CudaFloatBuffer> src, dst;
  for (int k = 0; k < pairs; ++k) {
    src.emplace_back(floats);
    dst.emplace_back(floats);
    fill(src.back().data(), floats, 0);
  }
  EventTimer timer;
  std::vector<double> ms;
  for (int rep = 0; rep < kWarmup + kRepsCopy; ++rep) {
    const int k = rep % pairs;
    const double t = timer.time_ms(stream, [&] {
      check(cudaMemcpyAsync(dst[k].data(), src[k].data(), static_cast<size_t>(bytes),
                            cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync(DeviceToDevice)");
    });
    if (rep >= kWarmup) ms.push_back(t);
  }
  return median(ms);
}

#if defined(CKPTSIM_TORCH_FUSED_ADAMW)
// torch's fused AdamW on copies of our sets' values; 0 when libtorch sees no CUDA device.
double torch_median_ms(const std::vector<StateSet>& sets) {
  if (!at::hasCUDA()) return 0.0;
  const auto options = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  struct TorchSet {
    std::vector<at::Tensor> p, g, m, v, steps;
  };
  std::vector<TorchSet> torch_sets;
  for (const StateSet& s : sets) {
    TorchSet t;
    for (const FusedAdamTensors& x : s.list) {
      std::array<std::vector<at::Tensor>*, 4> lists = {&t.p, &t.g, &t.m, &t.v};
      const float* sources[4] = {x.param, x.grad, x.exp_avg, x.exp_avg_sq};
      for (int role = 0; role < 4; ++role) {
        at::Tensor dev = at::empty({x.numel}, options);
        check(cudaMemcpy(dev.data_ptr<float>(), sources[role],
                         static_cast<size_t>(x.numel) * sizeof(float), cudaMemcpyDeviceToDevice),
              "cudaMemcpy(DeviceToDevice)");
        lists[role]->push_back(dev);
      }
      at::Tensor step = at::empty({}, at::TensorOptions().dtype(at::kFloat));
      *step.data_ptr<float>() = static_cast<float>(kStep);
      at::Tensor step_dev = at::empty({}, options);
      step_dev.copy_(step);
      t.steps.push_back(step_dev);
    }
    torch_sets.push_back(std::move(t));
  }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const AdamHyper h = bench_hyper();
  EventTimer timer;
  std::vector<double> ms;
  for (int rep = 0; rep < kWarmup + kRepsTorch; ++rep) {
    TorchSet& t = torch_sets[static_cast<size_t>(rep) % torch_sets.size()];
    // torch launches on its current stream, the legacy default stream unless a caller set
    // another, so the events go there.
    const double elapsed = timer.time_ms(nullptr, [&] {
      at::_fused_adamw_(t.p, t.g, t.m, t.v, {}, t.steps, h.lr, h.beta1, h.beta2, h.weight_decay,
                        h.eps, /*amsgrad=*/false, /*maximize=*/false);
    });
    if (rep >= kWarmup) ms.push_back(elapsed);
  }
  return median(ms);
}
#endif

void BM_FusedAdam(benchmark::State& state) {
  const int64_t elements = state.range(0);
  const int64_t tensors = state.range(1);
  const DeviceInfo info = device_info();
  const int sets_count = sets_for(16 * elements, info.l2_bytes);
  std::vector<StateSet> sets;
  for (int k = 0; k < sets_count; ++k) sets.emplace_back(elements, tensors);
  const AdamHyper h = bench_hyper();
  Stream stream;
  EventTimer timer;
  for (int k = 0; k < kWarmup; ++k) {
    ckptsim::model::cuda_fused_adam(sets[static_cast<size_t>(k) % sets.size()].list, h, kStep,
                                    stream.get());
  }
  check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");

  std::vector<double> kernel_ms;
  size_t k = 0;
  for (auto _ : state) {
    const StateSet& s = sets[k++ % sets.size()];
    const double ms = timer.time_ms(
        stream.get(), [&] { ckptsim::model::cuda_fused_adam(s.list, h, kStep, stream.get()); });
    state.SetIterationTime(ms * 1e-3);
    kernel_ms.push_back(ms);
  }

  const double bytes = static_cast<double>(kBytesPerElement * elements);
  const double kernel = median(kernel_ms);
  const double copy = copy_median_ms(kBytesPerElement / 2 * elements, info.l2_bytes, stream.get());
  double torch = 0.0;
#if defined(CKPTSIM_TORCH_FUSED_ADAMW)
  torch = torch_median_ms(sets);
#endif
  auto gbps = [bytes](double ms) { return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0.0; };
  state.counters["elements"] = static_cast<double>(elements);
  state.counters["tensors"] = static_cast<double>(tensors);
  state.counters["bytes_moved"] = bytes;
  state.counters["rotating_sets"] = sets_count;
  state.counters["kernel_us"] = kernel * 1e3;
  state.counters["kernel_GBps"] = gbps(kernel);
  state.counters["copy_us"] = copy * 1e3;
  state.counters["copy_GBps"] = gbps(copy);
  state.counters["kernel_over_copy"] = gbps(kernel) / gbps(copy);
  state.counters["torch_us"] = torch * 1e3;
  state.counters["torch_GBps"] = gbps(torch);
  state.counters["kernel_over_torch"] = torch > 0 ? gbps(kernel) / gbps(torch) : 0.0;
}

void register_benchmarks() {
  for (int64_t log2 : {20, 24, 26, 28}) {
    const int64_t elements = int64_t{1} << log2;
    for (int64_t tensors : {1, 64}) {
      // A fixed iteration count: the case's setup (gigabytes of state) runs once, not once
      // per round of Google Benchmark's iteration search. About 50 × 2^28 elements' worth.
      const int64_t iterations = std::max<int64_t>(50, 50 * ((int64_t{1} << 28) / elements));
      benchmark::RegisterBenchmark("BM_FusedAdam", BM_FusedAdam)
          ->Args({elements, tensors})
          ->ArgNames({"elements", "tensors"})
          ->Iterations(iterations)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!ckptsim::model::cuda_fused_adam_available()) {
    std::fprintf(stderr, "ckptsim_gpu_bench: no usable CUDA device: %s\n",
                 ckptsim::model::cuda_unavailable_reason().c_str());
    return 2;
  }
  const DeviceInfo info = device_info();
  int runtime = 0, driver = 0;
  check(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  benchmark::AddCustomContext("gpu_name", info.name);
  benchmark::AddCustomContext("gpu", ckptsim::model::cuda_device_description());
  benchmark::AddCustomContext("gpu_sms", std::to_string(info.sms));
  benchmark::AddCustomContext("gpu_l2_bytes", std::to_string(info.l2_bytes));
  benchmark::AddCustomContext("cuda_runtime", std::to_string(runtime));
  benchmark::AddCustomContext("cuda_driver", std::to_string(driver));
#if defined(CKPTSIM_TORCH_FUSED_ADAMW)
  benchmark::AddCustomContext("torch_version", TORCH_VERSION);
  benchmark::AddCustomContext("torch_fused_adamw",
                              at::hasCUDA() ? "yes" : "no: libtorch sees no CUDA device");
#else
  benchmark::AddCustomContext("torch_fused_adamw",
                              "no: this build's libtorch has no CUDA at::_fused_adamw_");
#endif
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
