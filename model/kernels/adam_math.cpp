// Both kernels are Eigen array expressions over the caller's buffers. Three rules keep the
// rounding order exactly the one documented in adam_math.h:
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

void torch_adamw_update(std::span<float> param, std::span<const float> grad,
                        std::span<float> exp_avg, std::span<float> exp_avg_sq, const AdamHyper& h,
                        float step) {
  check_lengths(param, grad, exp_avg, exp_avg_sq, "torch_adamw_update");
  // Any step value is accepted, as torch accepts it: a restored step tensor can hold garbage
  // (B3: a padding entry's torch.empty step), and the resulting inf/NaN update is the
  // observable upstream outcome, not a ckptsim bug.
  CKPTSIM_CHECK(h.bias_correction,
                "torch_adamw_update: torch AdamW has no bias_correction switch; it must not be "
                "called with bias_correction=false");

  // Host, in double: step is read from the fp32 step tensor (item<float>) into a double.
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
  const double step_size = h.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  const double exp_avg_grad_coefficient = 1.0 - h.beta1;
  const double exp_avg_sq_grad_coefficient = 1.0 - h.beta2;

  // Each double scalar becomes a float where it meets float data.
  const float decay_factor = static_cast<float>(1.0 - h.lr * h.weight_decay);
  const float lerp_weight = static_cast<float>(exp_avg_grad_coefficient);
  const float beta2 = static_cast<float>(h.beta2);
  const float sq_coefficient = static_cast<float>(exp_avg_sq_grad_coefficient);
  const float bc2_sqrt = static_cast<float>(bias_correction2_sqrt);
  const float eps = static_cast<float>(h.eps);
  const float step_size_f = static_cast<float>(step_size);

  const Eigen::Index n = as_index(param.size());
  ArrayMap p(param.data(), n);
  ConstArrayMap g(grad.data(), n);
  ArrayMap m(exp_avg.data(), n);
  ArrayMap v(exp_avg_sq.data(), n);

  if (h.weight_decay != 0.0) p = p * decay_factor;
  // torch's lerp picks the formula that is exact at the nearer end point.
  if (std::abs(lerp_weight) < 0.5f) {
    m = m + lerp_weight * (g - m);
  } else {
    m = g - (g - m) * (1.0f - lerp_weight);
  }
  v = v * beta2;
  v = v + (sq_coefficient * g) * g;
  const Eigen::ArrayXf denom = v.unaryExpr(ExactSqrt{}) / bc2_sqrt + eps;
  p = p - (step_size_f * m) / denom;
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
