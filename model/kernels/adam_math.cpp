// TE's kernel is an Eigen array expression over the caller's buffers; torch's are plain loops
// with explicit std::fma where upstream's compilers contract. Three rules keep the rounding
// order exactly the one documented in adam_math.h:
//   * Every expression is written with the upstream operand grouping; Eigen evaluates
//     coefficient-wise expressions with one IEEE op per node (pmul/padd/psub/pdiv are exact),
//     and this file is compiled with -ffp-contract=off, so nothing is fused into an FMA.
//   * sqrt goes through std::sqrt (correctly rounded), never ArrayBase::sqrt(): Eigen 3.4.0
//     with its default EIGEN_FAST_MATH=1 implements the SSE/AVX float packet sqrt as rsqrt
//     plus one Newton step, which is off by an ulp or two and flushes denormals. A functor
//     without a packet op makes Eigen fall back to scalar evaluation for that expression.
//   * Host-side scalars are converted double->float at the place upstream converts them.
#include "model/kernels/adam_math.h"

#include <Eigen/Core>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "model/errors.h"

namespace ckptsim::model {
namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;

// Correctly rounded sqrt; deliberately has no packetOp (see the file comment).
struct ExactSqrt {
  float operator()(float x) const { return std::sqrt(x); }
};

void check_lengths(std::span<float> param, std::span<const float> grad, std::span<float> exp_avg,
                   std::span<float> exp_avg_sq, const char* who) {
  CKPTSIM_CHECK(grad.size() == param.size() && exp_avg.size() == param.size() &&
                    exp_avg_sq.size() == param.size(),
                std::string(who) +
                    ": param, grad, exp_avg and exp_avg_sq must not differ in "
                    "length (got " +
                    std::to_string(param.size()) + ", " + std::to_string(grad.size()) + ", " +
                    std::to_string(exp_avg.size()) + ", " + std::to_string(exp_avg_sq.size()) +
                    ")");
}

Eigen::Index as_index(size_t n) { return static_cast<Eigen::Index>(n); }

}  // namespace

TeAdamScalars te_adam_scalars(const AdamHyper& h, int64_t step) {
  CKPTSIM_CHECK(
      step >= 1 && step <= std::numeric_limits<int32_t>::max(),
      "te_adam_scalars: step must not be < 1 or exceed a C int (got " + std::to_string(step) + ")");
  TeAdamScalars s;
  // The binding's parameter types: float scalars, int step.
  s.lr = static_cast<float>(h.lr);
  s.beta1 = static_cast<float>(h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.eps = static_cast<float>(h.eps);
  s.weight_decay = static_cast<float>(h.weight_decay);
  const int step_int = static_cast<int>(step);

  // Host: pow(float, int) is promoted to pow(double, double); the difference is rounded to
  // float when stored into the float bias-correction variables.
  if (h.bias_correction) {
    s.bias_correction1 = static_cast<float>(
        1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(step_int)));
    s.bias_correction2 = static_cast<float>(
        1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(step_int)));
  }
  // In the kernel `1 - beta` is an int-to-float conversion and a float subtraction.
  s.one_minus_beta1 = 1.0f - s.beta1;
  s.one_minus_beta2 = 1.0f - s.beta2;
  return s;
}

void fused_adam_update(std::span<float> param, std::span<const float> grad,
                       std::span<float> exp_avg, std::span<float> exp_avg_sq, const AdamHyper& h,
                       int64_t step) {
  check_lengths(param, grad, exp_avg, exp_avg_sq, "fused_adam_update");
  const TeAdamScalars s = te_adam_scalars(h, step);
  const float lr = s.lr;
  const float beta1 = s.beta1;
  const float beta2 = s.beta2;
  const float eps = s.eps;
  const float decay = s.weight_decay;
  const float bias_correction1 = s.bias_correction1;
  const float bias_correction2 = s.bias_correction2;
  const float one_minus_beta1 = s.one_minus_beta1;
  const float one_minus_beta2 = s.one_minus_beta2;

  const Eigen::Index n = as_index(param.size());
  ArrayMap p(param.data(), n);
  ConstArrayMap g(grad.data(), n);
  ArrayMap m(exp_avg.data(), n);
  ArrayMap v(exp_avg_sq.data(), n);

  m = beta1 * m + one_minus_beta1 * g;
  v = beta2 * v + (one_minus_beta2 * g) * g;
  const Eigen::ArrayXf denom = (v / bias_correction2).unaryExpr(ExactSqrt{}) + eps;
  // wd·p is added even when wd == 0, as the kernel does (it matters only for inf/NaN params).
  p = p - lr * ((m / bias_correction1) / denom + decay * p);
}

const char* kernel_name(TorchAdamWKernel kernel) {
  switch (kernel) {
    case TorchAdamWKernel::kForeachCuda:
      return "torch_foreach_cuda";
    case TorchAdamWKernel::kFusedCpu:
      return "torch_fused_cpu";
    case TorchAdamWKernel::kFusedCuda:
      return "torch_fused_cuda";
    case TorchAdamWKernel::kSingleTensorCpu:
      return "torch_single_tensor_cpu";
    case TorchAdamWKernel::kSingleTensorCuda:
      return "torch_single_tensor_cuda";
  }
  return "?";
}

bool torch_fused_cpu_scalar_tail(int64_t index, int64_t numel) {
  return index >= numel - numel % 8;
}

namespace {

// torch's host-side scalars of one step (Python floats and ATen's doubles).
struct TorchHost {
  double bias_correction1 = 1;
  double bias_correction2 = 1;
  double step_size = 0;  // lr / bc1
};

TorchHost torch_host(const AdamHyper& h, float step) {
  // The step is read from the fp32 step tensor into a double (item(), or .item<float>()).
  const double t = static_cast<double>(step);
  TorchHost s;
  s.bias_correction1 = 1.0 - std::pow(h.beta1, t);
  s.bias_correction2 = 1.0 - std::pow(h.beta2, t);
  s.step_size = h.lr / s.bias_correction1;
  return s;
}

void foreach_cuda(std::span<float> p, std::span<const float> g, std::span<float> m,
                  std::span<float> v, const AdamHyper& h, float step) {
  const TorchHost s = torch_host(h, step);
  const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  const float w = static_cast<float>(1.0 - h.beta1);
  const bool small_weight = std::abs(w) < 0.5f;
  const float beta2 = static_cast<float>(h.beta2);
  const float c2 = static_cast<float>(1.0 - h.beta2);
  // bias_correction2 ** 0.5 in Python: pow, not sqrt.
  const float bc2_sqrt = static_cast<float>(std::pow(s.bias_correction2, 0.5));
  const float eps = static_cast<float>(h.eps);
  const float neg_step_size = static_cast<float>(-s.step_size);
  for (size_t i = 0; i < p.size(); ++i) {
    if (h.weight_decay != 0.0) p[i] = p[i] * decay;
    const float gm = g[i] - m[i];
    m[i] = small_weight ? std::fma(w, gm, m[i]) : std::fma(-gm, 1.0f - w, g[i]);
    v[i] = std::fma(c2, g[i] * g[i], v[i] * beta2);
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] = std::fma(neg_step_size, m[i] / denom, p[i]);
  }
}

void fused_cpu(std::span<float> p, std::span<const float> g, std::span<float> m, std::span<float> v,
               const AdamHyper& h, float step) {
  const TorchHost s = torch_host(h, step);
  const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  const float w = static_cast<float>(1.0 - h.beta1);
  const bool small_weight = std::abs(w) < 0.5f;
  const float coeff = small_weight ? w : w - 1.0f;
  const float beta2 = static_cast<float>(h.beta2);
  const float c2 = static_cast<float>(1.0 - h.beta2);
  const float bc2_sqrt = static_cast<float>(std::sqrt(s.bias_correction2));
  const float eps = static_cast<float>(h.eps);
  const float neg_step_size = static_cast<float>(-s.step_size);
  const auto n = static_cast<int64_t>(p.size());
  for (int64_t j = 0; j < n; ++j) {
    const auto i = static_cast<size_t>(j);
    if (h.weight_decay != 0.0) p[i] = p[i] * decay;
    m[i] = std::fma(coeff, g[i] - m[i], small_weight ? m[i] : g[i]);
    const float cg = c2 * g[i];
    v[i] = torch_fused_cpu_scalar_tail(j, n) ? std::fma(v[i], beta2, cg * g[i])
                                             : std::fma(cg, g[i], v[i] * beta2);
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] + (neg_step_size * m[i]) / denom;
  }
}

void fused_cuda(std::span<float> p, std::span<const float> g, std::span<float> m,
                std::span<float> v, const AdamHyper& h, float step) {
  const float lr = static_cast<float>(h.lr);
  const float wd = static_cast<float>(h.weight_decay);
  const float beta1 = static_cast<float>(h.beta1);
  const float beta2 = static_cast<float>(h.beta2);
  const float eps = static_cast<float>(h.eps);
  const double c1 = 1.0 - static_cast<double>(beta1);
  const double c2 = 1.0 - static_cast<double>(beta2);
  const float bias_correction1 = 1.0f - std::pow(beta1, step);
  const float bc2_sqrt = std::sqrt(1.0f - std::pow(beta2, step));
  const float step_size = lr / bias_correction1;
  const float lr_wd = lr * wd;
  for (size_t i = 0; i < p.size(); ++i) {
    const double gd = g[i];
    if (wd != 0.0f) p[i] = std::fma(-lr_wd, p[i], p[i]);
    m[i] = std::fma(beta1, m[i], static_cast<float>(c1 * gd));
    v[i] = std::fma(beta2, v[i], static_cast<float>(c2 * gd * gd));
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] - (step_size * m[i]) / denom;
  }
}

}  // namespace

void torch_adamw_update(TorchAdamWKernel kernel, std::span<float> param,
                        std::span<const float> grad, std::span<float> exp_avg,
                        std::span<float> exp_avg_sq, const AdamHyper& h, float step) {
  check_lengths(param, grad, exp_avg, exp_avg_sq, "torch_adamw_update");
  // Any step value is accepted, as torch accepts it: a restored step tensor can hold garbage
  // (B3: a padding entry's torch.empty step), and the resulting inf/NaN update is the
  // observable upstream outcome, not a ckptsim bug.
  CKPTSIM_CHECK(h.bias_correction,
                "torch_adamw_update: torch AdamW has no bias_correction switch; it must not be "
                "called with bias_correction=false");
  switch (kernel) {
    case TorchAdamWKernel::kForeachCuda:
    case TorchAdamWKernel::kSingleTensorCpu:
    case TorchAdamWKernel::kSingleTensorCuda:
      foreach_cuda(param, grad, exp_avg, exp_avg_sq, h, step);
      return;
    case TorchAdamWKernel::kFusedCpu:
      fused_cpu(param, grad, exp_avg, exp_avg_sq, h, step);
      return;
    case TorchAdamWKernel::kFusedCuda:
      fused_cuda(param, grad, exp_avg, exp_avg_sq, h, step);
      return;
  }
}

int64_t ulp_distance(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<int64_t>::max();
  // Map the sign-magnitude bit pattern onto a monotone integer line with -0 and +0 both at 0.
  auto ordered = [](float x) -> int64_t {
    const int32_t bits = std::bit_cast<int32_t>(x);
    return bits >= 0 ? int64_t{bits} : int64_t{std::numeric_limits<int32_t>::min()} - bits;
  };
  const int64_t d = ordered(a) - ordered(b);
  return d >= 0 ? d : -d;
}

}  // namespace ckptsim::model
