// CPU reference kernels of the Adam variants that the modeled optimizers run (spec §13, §3.2):
// TE FusedAdam in decoupled-weight-decay mode (the inner optimizer of DistOpt and the GPU part
// of HybridDeviceOptimizer) and torch.optim.AdamW's three implementations (the pure-torch
// fallback on CUDA, the CPU part of HDO, the HDO's GPU part without TE). All update fp32 master
// params and fp32 moments in place.
//
// What the kernels promise (the simulator compares checkpoints and trajectories bitwise, so
// these are about rounding, not only about the formula):
//   1. Deterministic: the same inputs give the same bits on every run and build. Every
//      operation is an IEEE single-precision op (or an explicit std::fma) in a fixed order; no
//      contraction by our compiler (the library is built with -ffp-contract=off) and no
//      approximate sqrt (see adam_math.cpp).
//   2. Elementwise: element i of the outputs depends only on element i of the inputs and on
//      the scalars, so updating a span in pieces gives the same bits as updating it whole
//      (DP sharding splits params at arbitrary offsets). One exception, upstream's own: torch's
//      fused CPU AdamW rounds the last numel % 8 elements of a tensor differently
//      (torch_fused_cpu_scalar_tail).
//   3. `step` is used only through the bias corrections 1-β1^t and 1-β2^t; it is the counter
//      value *after* the optimizer's increment (t >= 1). The caller owns the counter: where it
//      lives (a group int for TE, a per-param fp32 tensor for torch) is the point of ckptsim.
//   4. The per-element operation order, and the precision of each host-side scalar, follow
//      the upstream source named on each function. Each function's comment lists where our
//      rounding differs from what runs upstream (GPU or vectorized CPU FMA).
//   5. Exact arithmetic agreement (spec I16): for the same (β, ε, lr, wd, t) both kernels
//      compute p·(1−lr·wd) − lr·m̂/(√v̂+ε); in floating point they differ by rounding and, for
//      β2 close to 1, by the float rounding of β (see fused_adam_update).
#pragma once

#include <cstdint>
#include <span>

namespace ckptsim::model {

// Python-side hyper-parameters of one param group (Python floats are doubles). Each kernel
// converts them the way its upstream binding does.
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;  // TE only; torch AdamW always corrects
};

// The host-side scalars of one TE FusedAdam step (ADAM_MODE_1), each in the precision that
// transformer_engine/common/multi_tensor/adam.cu multi_tensor_adam_cuda() gives it. The one
// place they are computed: fused_adam_update (CPU) and cuda_fused_adam (model/fused_adam_cuda.h)
// both take them from te_adam_scalars, so the two kernels cannot round a scalar differently
// and stay bitwise equal (the CUDA kernel's tests compare them bit for bit).
struct TeAdamScalars {
  float lr = 0.0f;
  float beta1 = 0.0f;
  float beta2 = 0.0f;
  float eps = 0.0f;
  float weight_decay = 0.0f;
  float bias_correction1 = 1.0f;  // 1 - float(β1)^t, or 1 without bias correction
  float bias_correction2 = 1.0f;  // 1 - float(β2)^t, or 1 without bias correction
  float one_minus_beta1 = 0.0f;   // 1 - float(β1), a float subtraction as in the kernel
  float one_minus_beta2 = 0.0f;   // 1 - float(β2)
};

// Host: lr, β1, β2, ε, wd are rounded to float (the pybind signature takes float) and t to a
// C int; bc = 1 − std::pow(float β, int t) is evaluated in double (C++ promotes pow(float,
// int) to double) and rounded to float. So β2 = 0.999 enters the bias correction as
// 0.99900001287…, not 0.999.
// REQUIRES: 1 <= step <= INT32_MAX (pybind11 rejects a larger Python int for a C int
// parameter); throws InvariantViolation otherwise.
TeAdamScalars te_adam_scalars(const AdamHyper& h, int64_t step);

// Mirrors transformer_engine/common/multi_tensor/adam.cu multi_tensor_adam_cuda() (host) and
// adam_update() / AdamFunctor (kernel) with mode ADAM_MODE_1, as called from
// transformer_engine/pytorch/optimizers/fused_adam.py FusedAdam.step() with fp32 params,
// grads and moments and no master weights.
//
// Host side: te_adam_scalars(h, step).
// Kernel, all float: m = β1·m + (1−β1)·g; v = β2·v + ((1−β2)·g)·g; (1−β) is itself a float
// subtraction; update = (m/bc1)/(sqrt(v/bc2) + ε) + wd·p; p = p − lr·update.
// Differs upstream: nvcc contracts the a·b + c forms into FMAs by default (--fmad=true), so
// GPU results may differ from ours by an ulp or so per operation; we model the uncontracted
// order. Our own CUDA kernel (model/fused_adam_cuda.h) computes exactly this order and is
// bitwise equal to this function.
// REQUIRES: all four spans have the same length; 1 <= step <= INT32_MAX (pybind11 rejects a
// larger Python int for a C int parameter).
void fused_adam_update(std::span<float> param, std::span<const float> grad,
                       std::span<float> exp_avg, std::span<float> exp_avg_sq, const AdamHyper& h,
                       int64_t step);

// The implementations of torch.optim.AdamW that Megatron's optimizers run. torch/optim/adam.py
// picks one per step(): `fused=True` runs _fused_adamw on the params' device; otherwise, with
// `foreach` left at None, _multi_tensor_adam where every param is a CUDA tensor (Megatron's
// distributed optimizer without TE: fp32 main params on the GPU), else _single_tensor_adam. Each
// rounds differently; each function below computes exactly what its kernel computes, element for
// element (tests/model/kernels/torch_adamw_kernels_ test.cpp replays what torch 2.11 computed on an
// H200 host: replay/kernel_probe.py), with every contraction upstream's compiler makes written as
// std::fma.
enum class TorchAdamWKernel {
  kForeachCuda,  // _multi_tensor_adam: torch._foreach_* ops on CUDA (DistOpt's inner AdamW)
  kFusedCpu,     // _fused_adamw on CPU: aten/src/ATen/native/cpu/FusedAdamKernel.cpp (HDO CPU part)
  kFusedCuda,    // _fused_adamw on CUDA: aten/src/ATen/native/cuda/fused_adam*.cu (HDO GPU part
                 // without TE)
  // _single_tensor_adam (CPU params without `fused`, or foreach=False): no Megatron path runs
  // it, and it is not pinned against torch; ckptsim computes kForeachCuda's arithmetic for it,
  // and traces name it apart, so that no comparison takes it for torch's.
  kSingleTensorCpu,
  kSingleTensorCuda,
};
// "torch_foreach_cuda", "torch_fused_cpu", "torch_fused_cuda", "torch_single_tensor_cpu",
// "torch_single_tensor_cuda": the names traces carry.
const char* kernel_name(TorchAdamWKernel kernel);

// One torch AdamW step over one param tensor (its fp32 param, grad and moments), after the
// optimizer has advanced the param's fp32 step tensor to `step`.
//
// Host side (Python and C++ doubles): bc1 = 1 − β1^t, bc2 = 1 − β2^t (pow of the double β),
// step_size = lr/bc1. Then, per kernel (f(x): x rounded to float where it meets float data):
//
// kForeachCuda (torch/optim/adam.py _multi_tensor_adam; nvcc contracts a·b + c into an FMA):
//   if wd != 0: p = p·f(1 − lr·wd)                         _foreach_mul_
//   m = lerp(m, g, w), w = f(1−β1): |w| < 0.5 ? fma(w, g−m, m) : fma(−(g−m), 1−w, g)
//   v = fma(f(1−β2), g·g, v·f(β2))                          _foreach_mul_ + _foreach_addcmul_
//   d = sqrt(v)/f(bc2^0.5) + f(ε)                           _foreach_sqrt/div_/add_
//   p = fma(f(−step_size), m/d, p)                          _foreach_addcdiv_
// kFusedCpu (FusedAdamKernel.cpp adam_math, float, ADAMW; bc2_sqrt = std::sqrt(bc2)):
//   if wd != 0: p = p·f(1 − lr·wd)
//   m = fmadd(w − (|w| < 0.5 ? 0 : 1), g − m, |w| < 0.5 ? m : g)   vec::fmadd
//   v = v·f(β2) + (f(1−β2)·g)·g, which GCC contracts into fma(f(1−β2)·g, g, v·f(β2)) in the
//       16- and 8-wide vector loops, but into fma(v, f(β2), (f(1−β2)·g)·g) in the scalar
//       loop, which runs over the last numel % 8 elements of each tensor (the vector loop
//       takes whole 16-float vectors of each 64-byte-aligned task; GCC vectorizes the
//       tail loop 8 wide; AVX2 and AVX512 builds round alike)
//   d = sqrt(v)/f(bc2_sqrt) + f(ε);  p = p + (f(−step_size)·m)/d
// kFusedCuda (fused_adam_utils.cuh adam_math as torch 2.11 runs it: lr, β, wd, ε as float):
//   if wd != 0: p = fma(−(lr·wd), p, p)
//   m = fma(β1, m, f((1 − β1)·g))  (1−β1 and the product in double)
//   v = fma(β2, v, f((1 − β2)·g·g))
//   bc1 = 1 − powf(β1, t), bc2_sqrt = sqrtf(1 − powf(β2, t)), all float
//   d = sqrt(v)/bc2_sqrt + ε;  p = p − ((lr/bc1)·m)/d
//   Left: the GPU's powf (libdevice __nv_powf, built on the approximate reciprocal
//   rcp.approx) is not correctly rounded; ours is. Where the two differ (seen at β2 = 0.95,
//   t = 6) the step size, and so p, differs in the last bits. m and v are exact.
// REQUIRES: all four spans have the same length, and are the whole tensor the kernel updates
// (kFusedCpu rounds its last numel % 8 elements differently). `step` is the float value of the
// param's step tensor; any value is accepted as torch accepts it (a garbage step restored from
// a padding entry gives an inf/NaN update upstream too); an fp32 counter stops growing at 2^24.
void torch_adamw_update(TorchAdamWKernel kernel, std::span<float> param,
                        std::span<const float> grad, std::span<float> exp_avg,
                        std::span<float> exp_avg_sq, const AdamHyper& h, float step);

// Whether element `index` of a tensor of `numel` elements goes through kFusedCpu's scalar loop
// (its last numel % 8 elements), whose v rounds differently from the vector loops'.
bool torch_fused_cpu_scalar_tail(int64_t index, int64_t numel);

// Distance between two floats in units in the last place: the number of representable floats
// strictly between them, plus one (0 when equal; +0 and -0 are equal). INT64_MAX if either is
// NaN. Adjacent across zero: the smallest positive and negative subnormals are 2 apart.
int64_t ulp_distance(float a, float b);

}  // namespace ckptsim::model
