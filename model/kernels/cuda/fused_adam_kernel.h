// The inside of the CUDA FusedAdam kernel (model/fused_adam_cuda.h), written once for two
// compilers: nvcc compiles it into the kernel (fused_adam_cuda.cu), and the host compiler
// compiles the same functions so that tests can run the kernel's index arithmetic and
// element math on the CPU (tests/model/fused_adam_kernel_test.cpp), where a broken chunk
// boundary or a reordered operation shows up without a GPU. No CUDA header is included; under
// nvcc the functions become __host__ __device__.
//
// How a list of tensors becomes launches (plan_fused_adam, on the host):
//   * Tensors with numel 0 are dropped; the rest are taken in order, up to
//     kTensorsPerLaunchMax per launch (their pointers travel in the kernel's parameters).
//   * Each tensor whose four pointers share their address mod 16 bytes takes the vector path:
//     `head` = 0..3 scalar elements up to the first 16-byte boundary, then float4 vectors,
//     then a scalar tail of (numel - head) % 4 elements. Otherwise head = kScalarPath and every
//     element is a scalar access (still coalesced).
//   * A tensor is cut into chunks of `chunk_elems` elements (a multiple of 4·threads): on the
//     vector path chunk k holds vectors [k·chunk_elems/4, (k+1)·chunk_elems/4) of the body;
//     chunk 0 also does the head and the last chunk also does the tail, so a tensor of 1..3
//     elements still has one chunk. On the scalar path chunk k holds elements
//     [k·chunk_elems, (k+1)·chunk_elems).
//   * Chunks are numbered across the launch's tensors in order; slot[t].chunk_end is the
//     running total (exclusive end of tensor t's chunk numbers).
//   * The grid is at most one wave of resident blocks; block b does chunks b, b + grid, ...
//     (a grid-stride loop), and its threads stride through each chunk.
//   * A chunk's slot: where a launch has at most kChunkTableMax chunks (1 Mi elements at the
//     H200's chunk size), chunk_slot[c] names it, one load. Otherwise a block finds its first
//     chunk's slot by a binary search over the chunk ends and each later one by probing 1, 2,
//     4, ... slots ahead of the last (slot_from). The parameters live in the constant bank, and
//     each probe there is a dependent load that often misses its cache: walking slot by slot
//     (the kernel before) left 1 Mi elements in 64 tensors at 0.72 of the copy bandwidth, against
//     0.91 for one tensor (H100; 0.86 with the table).
// Invariants the plan guarantees (checked by the tests): every element of every tensor is
// updated exactly once per call; every float4 access is 16-byte aligned; no access leaves
// [0, numel) of its array.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/kernels/adam_math.h"
#include "model/kernels/fused_adam_cuda.h"

#if defined(__CUDACC__)
#define CKPTSIM_HD __host__ __device__ __forceinline__
#else
#define CKPTSIM_HD inline
#endif

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace ckptsim::model::cuda_detail {

inline constexpr int32_t kTensorsPerLaunchMax = 64;
// Chunks that LaunchArgs::chunk_slot covers: what the 4 KiB of parameters leave.
inline constexpr int32_t kChunkTableMax = 928;
inline constexpr int32_t kScalarPath = -1;
// Kernel parameters every CUDA driver and GPU accepts (larger needs CUDA 12.1 and Volta+).
inline constexpr size_t kKernelParamBytesMax = 4096;

struct TensorSlot {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t numel;      // >= 1
  int32_t chunk_end;  // exclusive end of this tensor's chunk numbers within the launch
  int32_t head;       // 0..3 scalar elements before the first float4, or kScalarPath
};

struct LaunchArgs {
  TeAdamScalars scalars;
  int64_t chunk_elems;  // a multiple of 4
  int64_t chunk_count;  // slot[tensor_count - 1].chunk_end
  int32_t tensor_count;
  TensorSlot slot[kTensorsPerLaunchMax];
  // chunk_slot[c] is the slot of chunk c, for every chunk, when chunk_count <= kChunkTableMax
  // (unused otherwise).
  uint8_t chunk_slot[kChunkTableMax];
};
static_assert(sizeof(LaunchArgs) <= kKernelParamBytesMax,
              "LaunchArgs is passed by value as the kernel's parameter");

struct PlanLimits {
  int64_t resident_blocks = 1;  // blocks the device runs at once (SMs × blocks per SM)
  int32_t threads_per_block = 1;
  int64_t chunk_elems_max = 65536;
  int32_t tensors_per_launch_max = kTensorsPerLaunchMax;
  // Chunks each resident block should get, so that the last wave's imbalance stays small.
  int64_t chunks_per_block_target = 16;
};

struct Launch {
  LaunchArgs args;
  int64_t grid_blocks;  // 1 <= grid_blocks <= min(limits.resident_blocks, args.chunk_count)
};

// The launches for `list` (empty when every tensor is empty).
// REQUIRES: the REQUIRES of cuda_fused_adam on `list` (those visible on the host are checked
// and throw InvariantViolation); limits.resident_blocks >= 1; 1 <= threads_per_block;
// chunk_elems_max >= 4; 1 <= tensors_per_launch_max <= kTensorsPerLaunchMax.
std::vector<Launch> plan_fused_adam(std::span<const FusedAdamTensors> list,
                                    const TeAdamScalars& scalars, const PlanLimits& limits);

// ---- arithmetic ----------------------------------------------------------------------------
// One IEEE single-precision operation each, rounded to nearest. On the device the _rn
// intrinsics are never contracted into FMAs, whatever the compiler flags; on the host the
// code that includes this header is built with -ffp-contract=off.

CKPTSIM_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

CKPTSIM_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

CKPTSIM_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

CKPTSIM_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

CKPTSIM_HD float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// One element of TE's adam_update (ADAM_MODE_1), in the order of fused_adam_update:
//   m = β1·m + (1−β1)·g;  v = β2·v + ((1−β2)·g)·g
//   p = p − lr·((m/bc1)/(sqrt(v/bc2) + ε) + wd·p)
CKPTSIM_HD void te_adam_element(float& p, float g, float& m, float& v, const TeAdamScalars& s) {
  m = add_rn(mul_rn(s.beta1, m), mul_rn(s.one_minus_beta1, g));
  v = add_rn(mul_rn(s.beta2, v), mul_rn(mul_rn(s.one_minus_beta2, g), g));
  const float denom = add_rn(sqrt_rn(div_rn(v, s.bias_correction2)), s.eps);
  const float update =
      add_rn(div_rn(div_rn(m, s.bias_correction1), denom), mul_rn(s.weight_decay, p));
  p = sub_rn(p, mul_rn(s.lr, update));
}

// ---- memory --------------------------------------------------------------------------------

struct Vec4 {
  float x, y, z, w;
};

#if !defined(__CUDA_ARCH__)
// Throws InvariantViolation unless ptr is 16-byte aligned (host emulation only).
void check_vec4_aligned(const float* ptr);
#endif

// A 16-byte load/store on the device (ld/st.global.v4.f32). On the host the alignment is
// checked, so the CPU tests catch a plan that would issue a misaligned vector access (a
// misaligned float4 access on the GPU is an error, not a slow access).
CKPTSIM_HD Vec4 load4(const float* ptr) {
#if defined(__CUDA_ARCH__)
  const float4 r = *reinterpret_cast<const float4*>(ptr);
  return {r.x, r.y, r.z, r.w};
#else
  check_vec4_aligned(ptr);
  return {ptr[0], ptr[1], ptr[2], ptr[3]};
#endif
}

CKPTSIM_HD void store4(float* ptr, const Vec4& v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<float4*>(ptr) = make_float4(v.x, v.y, v.z, v.w);
#else
  check_vec4_aligned(ptr);
  ptr[0] = v.x;
  ptr[1] = v.y;
  ptr[2] = v.z;
  ptr[3] = v.w;
#endif
}

// ---- the kernel body -----------------------------------------------------------------------

CKPTSIM_HD void scalar_element(const TensorSlot& t, int64_t e, const TeAdamScalars& s) {
  float p = t.param[e];
  float m = t.exp_avg[e];
  float v = t.exp_avg_sq[e];
  te_adam_element(p, t.grad[e], m, v, s);
  t.param[e] = p;
  t.exp_avg[e] = m;
  t.exp_avg_sq[e] = v;
}

// Chunk `k` of `chunks` of tensor `t`, as thread `thread` of `threads`.
CKPTSIM_HD void run_chunk(const TensorSlot& t, const TeAdamScalars& s, int64_t chunk_elems,
                          int64_t k, int64_t chunks, int32_t thread, int32_t threads) {
  const int64_t n = t.numel;
  if (t.head == kScalarPath) {
    const int64_t begin = k * chunk_elems;
    const int64_t end = begin + chunk_elems < n ? begin + chunk_elems : n;
    for (int64_t e = begin + thread; e < end; e += threads) scalar_element(t, e, s);
    return;
  }
  const int64_t head = t.head;
  const int64_t vecs = (n - head) / 4;
  const int64_t chunk_vecs = chunk_elems / 4;
  const int64_t vec_begin = k * chunk_vecs;
  const int64_t vec_end = vec_begin + chunk_vecs < vecs ? vec_begin + chunk_vecs : vecs;
  float* const p = t.param + head;
  const float* const g = t.grad + head;
  float* const m = t.exp_avg + head;
  float* const v = t.exp_avg_sq + head;
  for (int64_t i = vec_begin + thread; i < vec_end; i += threads) {
    // All four loads are issued before the first use.
    Vec4 pv = load4(p + 4 * i);
    const Vec4 gv = load4(g + 4 * i);
    Vec4 mv = load4(m + 4 * i);
    Vec4 vv = load4(v + 4 * i);
    te_adam_element(pv.x, gv.x, mv.x, vv.x, s);
    te_adam_element(pv.y, gv.y, mv.y, vv.y, s);
    te_adam_element(pv.z, gv.z, mv.z, vv.z, s);
    te_adam_element(pv.w, gv.w, mv.w, vv.w, s);
    store4(p + 4 * i, pv);
    store4(m + 4 * i, mv);
    store4(v + 4 * i, vv);
  }
  if (k == 0) {
    for (int64_t e = thread; e < head; e += threads) scalar_element(t, e, s);
  }
  if (k == chunks - 1) {
    for (int64_t e = head + 4 * vecs + thread; e < n; e += threads) scalar_element(t, e, s);
  }
}

// The first slot in [lo, hi] whose chunk_end is above c (a binary search; the chunk ends
// increase). REQUIRES: c < slot[hi].chunk_end; lo == 0 or slot[lo - 1].chunk_end <= c.
CKPTSIM_HD int32_t slot_between(const LaunchArgs& a, int64_t c, int32_t lo, int32_t hi) {
  while (lo < hi) {
    const int32_t mid = (lo + hi) / 2;
    if (c < a.slot[mid].chunk_end) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// The slot whose chunks hold chunk `c`. REQUIRES: 0 <= c < a.chunk_count.
CKPTSIM_HD int32_t slot_of_chunk(const LaunchArgs& a, int64_t c) {
  return slot_between(a, c, 0, a.tensor_count - 1);
}

// The slot holding chunk c, searching from slot t, the slot of an earlier chunk: probes 1, 2,
// 4, ... slots ahead, then a binary search between the last two probes.
// REQUIRES: slot[t - 1].chunk_end <= c < a.chunk_count (or t == 0).
CKPTSIM_HD int32_t slot_from(const LaunchArgs& a, int32_t t, int64_t c) {
  if (c < a.slot[t].chunk_end) return t;
  int32_t lo = t + 1;               // c >= slot[lo - 1].chunk_end
  int32_t hi = a.tensor_count - 1;  // c < slot[hi].chunk_end
  int32_t step = 1;
  while (lo < hi) {
    const int32_t probe = lo + step - 1 < hi ? lo + step - 1 : hi;
    if (c < a.slot[probe].chunk_end) {
      hi = probe;
      break;
    }
    lo = probe + 1;
    step *= 2;
  }
  return slot_between(a, c, lo, hi);
}

// Everything block `block` of a grid of `grid` blocks does, as thread `thread` of `threads`.
// Threads never communicate, so the host can run them one after another.
CKPTSIM_HD void run_block(const LaunchArgs& a, int64_t block, int64_t grid, int32_t thread,
                          int32_t threads) {
  const bool table = a.chunk_count <= kChunkTableMax;
  int32_t t = table || block >= a.chunk_count ? 0 : slot_of_chunk(a, block);
  for (int64_t c = block; c < a.chunk_count; c += grid) {
    // c only grows, so slot_from only moves forward
    t = table ? static_cast<int32_t>(a.chunk_slot[c]) : slot_from(a, t, c);
    const int64_t first = t == 0 ? 0 : a.slot[t - 1].chunk_end;
    run_chunk(a.slot[t], a.scalars, a.chunk_elems, c - first, a.slot[t].chunk_end - first, thread,
              threads);
  }
}

}  // namespace ckptsim::model::cuda_detail
