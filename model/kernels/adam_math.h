// CPU reference kernels of the two Adam variants that the modeled optimizers run (spec §13,
// §3.2): TE FusedAdam in decoupled-weight-decay mode (the inner optimizer of DistOpt and the
// GPU part of HybridDeviceOptimizer) and torch.optim.AdamW (the CPU part of HDO, and the
// pure-torch fallback). Both update fp32 master params and fp32 moments in place.
//
// What the kernels promise (the simulator compares checkpoints and trajectories bitwise, so
// these are about rounding, not only about the formula):
//   1. Deterministic: the same inputs give the same bits on every run and build. Every
//      operation is an IEEE single-precision op in a fixed order; no FMA contraction (the
//      library is built with -ffp-contract=off) and no approximate sqrt (see adam_math.cpp).
//   2. Elementwise: element i of the outputs depends only on element i of the inputs and on
//      the scalars, so updating a span in pieces gives the same bits as updating it whole
//      (DP sharding splits params at arbitrary offsets).
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

// Mirrors aten/src/ATen/native/cpu/FusedAdamKernel.cpp adam_fused_step_impl() and the float
// adam_math() with ADAM_MODE::ADAMW: what torch.optim.AdamW(fused=True) runs on CPU (the
// HDO CPU optimizer), once per param, after torch/optim/adam.py _fused_adamw has done
// `step += 1` on the param's fp32 step tensor.
//
// Host side, all double: t = float(step); bc1 = 1 − β1^t; bc2 = 1 − β2^t (std::pow on the
// *double* β); step_size = lr/bc1; bc2_sqrt = sqrt(bc2). Kernel, float, with each double
// scalar rounded to float where it meets a float:
//   if wd != 0: p = p·float(1 − lr·wd)
//   m = lerp(m, g, w) with w = float(1−β1): |w| < 0.5 ? m + w·(g−m) : g − (g−m)·(1−w)
//   v = v·float(β2);  v = v + (float(1−β2)·g)·g
//   denom = sqrt(v)/float(bc2_sqrt) + float(ε)
//   p = p − (float(step_size)·m)/denom
// This is the kernel's scalar (tail) loop. Its vector loop uses vec::fmadd for the lerp,
// which is a real FMA on AVX2/AVX-512 builds, so torch's bits can differ from ours by an ulp
// of m there. torch/optim/adam.py _single_tensor_adam (foreach=False, fused=False) runs the
// same math as separate tensor ops (mul_, lerp_, mul_+addcmul_, sqrt/div/add_, addcdiv_);
// the differences: it computes bc2_sqrt as bc2**0.5 (pow, not sqrt), and its ops are
// vectorized with the same FMA caveat. The libtorch 1.13 C++ AdamW differs more: it updates
// m as m·β1 + (1−β1)·g (mul_ then add_ with alpha), not with lerp.
// REQUIRES: all four spans have the same length. `step` is the float value of the param's step
// tensor; any value is accepted as torch accepts it (a garbage step restored from a padding
// entry gives an inf/NaN update upstream too); an fp32 counter stops growing at 2^24.
void torch_adamw_update(std::span<float> param, std::span<const float> grad,
                        std::span<float> exp_avg, std::span<float> exp_avg_sq, const AdamHyper& h,
                        float step);

// Distance between two floats in units in the last place: the number of representable floats
// strictly between them, plus one (0 when equal; +0 and -0 are equal). INT64_MAX if either is
// NaN. Adjacent across zero: the smallest positive and negative subnormals are 2 apart.
int64_t ulp_distance(float a, float b);

}  // namespace ckptsim::model
