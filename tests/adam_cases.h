// Random FusedAdam cases for the kernel tests: hyper-parameters, steps, and tensor lists laid
// out as views inside four "arenas" (one per array: param, grad, exp_avg, exp_avg_sq), at
// random float offsets, with guard floats between them. The same case runs on the CPU
// reference (fused_adam_update on spans of a host copy) and on the kernel under test (the
// GPU, or the kernel body emulated on the host); then the four arenas are compared whole, so
// a write outside a tensor shows up as a changed guard.
//
// Used by tests/model/fused_adam_kernel_test.cpp (cpu) and tests/gpu/*_test.cpp (gpu). No
// std::*_distribution (their output differs between standard libraries); every test prints
// its seed, and CKPTSIM_ADAM_TEST_SEED overrides the default.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/kernels/adam_math.h"
#include "model/kernels/fused_adam_cuda.h"

namespace ckptsim::model::adam_cases {

inline uint64_t base_seed() {
  const char* env = std::getenv("CKPTSIM_ADAM_TEST_SEED");
  return env != nullptr ? std::strtoull(env, nullptr, 10) : 20240607;
}

// splitmix64: small, fast, and identical everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double unit() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(unit()); }
  // Integer in [lo, hi].
  int64_t between(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  double log_uniform(double lo, double hi) {
    return std::exp(std::log(lo) + (std::log(hi) - std::log(lo)) * unit());
  }
  bool chance(double p) { return unit() < p; }

 private:
  uint64_t state_;
};

// Realistic values and edge values: β close to 1, β = 0, no weight decay, no bias
// correction, tiny and large ε.
inline AdamHyper random_hyper(Rng& r) {
  AdamHyper h;
  h.lr = r.log_uniform(1e-5, 1e-1);
  const double b1[] = {0.9, 0.8, 0.5, 0.0, 0.95};
  h.beta1 = r.chance(0.3) ? r.unit() * 0.99 : b1[r.between(0, 4)];
  const double b2[] = {0.999, 0.95, 0.9999, 0.98, 0.5};
  h.beta2 = r.chance(0.3) ? 0.9 + r.unit() * 0.0999 : b2[r.between(0, 4)];
  const double eps[] = {1e-8, 1e-6, 1e-12, 1e-3};
  h.eps = eps[r.between(0, 3)];
  const double wd[] = {0.0, 0.01, 0.1};
  h.weight_decay = r.chance(0.25) ? r.unit() : wd[r.between(0, 2)];
  h.bias_correction = !r.chance(0.15);
  return h;
}

// 1..10000, with the ends and small steps (where bias correction is largest) favoured.
inline int64_t random_step(Rng& r) {
  if (r.chance(0.15)) return 1;
  if (r.chance(0.1)) return 10000;
  return static_cast<int64_t>(std::lround(r.log_uniform(1.0, 10000.0)));
}

inline std::string describe(const AdamHyper& h, int64_t step) {
  std::ostringstream os;
  os.precision(17);
  os << "lr=" << h.lr << " beta1=" << h.beta1 << " beta2=" << h.beta2 << " eps=" << h.eps
     << " wd=" << h.weight_decay << " bias_correction=" << h.bias_correction << " step=" << step;
  return os.str();
}

enum Role { kParam = 0, kGrad = 1, kExpAvg = 2, kExpAvgSq = 3 };
inline constexpr int kRoles = 4;
inline constexpr const char* kRoleName[kRoles] = {"param", "grad", "exp_avg", "exp_avg_sq"};

// A signaling NaN with a payload nothing computes: a guard that still holds these bits was
// not written, and one that went through arithmetic comes back as a quiet NaN (other bits)
// on x86 and on the GPU alike. Only copied bytewise (vectors, cudaMemcpy), never computed.
inline float guard_value() { return std::bit_cast<float>(uint32_t{0x7fa5a5a5}); }

// Where tensor j's arrays sit in the arenas (float offsets from each arena's 16-byte-aligned
// start).
struct Placement {
  int64_t numel = 0;
  std::array<int64_t, kRoles> offset{};
};

// Four arenas of floats whose element 0 is 16-byte aligned, like cudaMalloc's (256-byte)
// allocations, so that a placement's alignment is the same on the host and on the device.
// std::allocator<float> gets its memory from operator new, which is 16-byte aligned on
// x86-64 (__STDCPP_DEFAULT_NEW_ALIGNMENT__); checked, not assumed.
class Arenas {
 public:
  explicit Arenas(int64_t size) : size_(size) {
    for (auto& s : storage_) {
      s.assign(static_cast<size_t>(size), guard_value());
      if (reinterpret_cast<uintptr_t>(s.data()) % 16 != 0) {
        throw std::runtime_error("adam_cases: an arena must not start off a 16-byte boundary");
      }
    }
  }
  int64_t size() const { return size_; }
  float* data(int role) { return storage_[role].data(); }
  const float* data(int role) const { return storage_[role].data(); }
  std::span<float> span(int role) { return storage_[role]; }
  std::span<const float> span(int role) const { return storage_[role]; }

 private:
  int64_t size_;
  std::array<std::vector<float>, kRoles> storage_;
};

struct Case {
  std::vector<Placement> tensors;
  Arenas arenas{0};
};

struct CaseShape {
  int64_t tensors_min = 1;
  int64_t tensors_max = 1;
  int64_t numel_min = 1;
  int64_t numel_max = 1;
  double equal_alignment = 0.7;  // chance that a tensor's four arrays share alignment (float4)
  int64_t common_offset = -1;    // 0..3: their shared offset mod 4 floats; -1: random
  bool special_values = false;   // sprinkle inf, NaN, denormals, signed zeros, huge values
};

inline float special_or(Rng& r, float usual, bool special) {
  if (!special || !r.chance(0.05)) return usual;
  const float values[] = {0.0f,
                          -0.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(),
                          -3 * std::numeric_limits<float>::denorm_min(),
                          1e-39f,
                          1e30f,
                          -1e30f,
                          std::numeric_limits<float>::max()};
  return values[r.between(0, 10)];
}

// Places the tensors one after another in each arena with 0..7 guard floats between them;
// fills every tensor element with a state that has seen some steps (v >= 0, m of either sign,
// p away from 0, gradients over several orders of magnitude) and leaves the rest as guards.
inline Case layout_case(Rng& r, const std::vector<int64_t>& numels, const CaseShape& shape) {
  Case c;
  std::array<int64_t, kRoles> cursor{};
  for (int64_t n : numels) {
    Placement pl;
    pl.numel = n;
    const bool equal = r.chance(shape.equal_alignment);
    const int64_t common = shape.common_offset >= 0 ? shape.common_offset : r.between(0, 3);
    for (int role = 0; role < kRoles; ++role) {
      cursor[role] += r.between(0, 7);
      if (equal) {
        while (cursor[role] % 4 != common) ++cursor[role];
      }
      pl.offset[role] = cursor[role];
      cursor[role] += n;
    }
    c.tensors.push_back(pl);
  }
  int64_t size = 0;
  for (int role = 0; role < kRoles; ++role) size = std::max(size, cursor[role] + 8);
  c.arenas = Arenas(size);
  for (const Placement& pl : c.tensors) {
    const float grad_scale = static_cast<float>(r.log_uniform(1e-4, 1e2));
    for (int64_t i = 0; i < pl.numel; ++i) {
      c.arenas.data(kParam)[pl.offset[kParam] + i] =
          special_or(r, r.uniform(-2.0f, 2.0f), shape.special_values);
      c.arenas.data(kGrad)[pl.offset[kGrad] + i] =
          special_or(r, grad_scale * r.uniform(-1.0f, 1.0f), shape.special_values);
      c.arenas.data(kExpAvg)[pl.offset[kExpAvg] + i] =
          special_or(r, r.uniform(-0.5f, 0.5f), shape.special_values);
      c.arenas.data(kExpAvgSq)[pl.offset[kExpAvgSq] + i] =
          special_or(r, r.chance(0.02) ? 0.0f : r.uniform(0.0f, 0.5f), shape.special_values);
    }
  }
  return c;
}

inline Case random_case(Rng& r, const CaseShape& shape) {
  const int64_t count = r.between(shape.tensors_min, shape.tensors_max);
  std::vector<int64_t> numels;
  for (int64_t j = 0; j < count; ++j) {
    numels.push_back(static_cast<int64_t>(std::llround(r.log_uniform(
        static_cast<double>(shape.numel_min), static_cast<double>(shape.numel_max) + 0.999))));
    numels.back() = std::clamp(numels.back(), shape.numel_min, shape.numel_max);
  }
  return layout_case(r, numels, shape);
}

// The tensor list over arenas whose element 0 is at the given base pointers.
inline std::vector<FusedAdamTensors> tensor_list(const Case& c,
                                                 const std::array<float*, kRoles>& base) {
  std::vector<FusedAdamTensors> list;
  for (const Placement& pl : c.tensors) {
    list.push_back({base[kParam] + pl.offset[kParam], base[kGrad] + pl.offset[kGrad],
                    base[kExpAvg] + pl.offset[kExpAvg], base[kExpAvgSq] + pl.offset[kExpAvgSq],
                    pl.numel});
  }
  return list;
}

// The CPU reference (model/adam_math.h) applied to every tensor of `c`, in place.
inline void cpu_reference(Case& c, const AdamHyper& h, int64_t step) {
  for (const Placement& pl : c.tensors) {
    const size_t n = static_cast<size_t>(pl.numel);
    fused_adam_update(std::span<float>(c.arenas.data(kParam) + pl.offset[kParam], n),
                      std::span<const float>(c.arenas.data(kGrad) + pl.offset[kGrad], n),
                      std::span<float>(c.arenas.data(kExpAvg) + pl.offset[kExpAvg], n),
                      std::span<float>(c.arenas.data(kExpAvgSq) + pl.offset[kExpAvgSq], n), h,
                      step);
  }
}

// Equal bits everywhere, except that inside a tensor two NaNs are equal whatever their
// payloads (x86 and CUDA make different NaNs; see model/fused_adam_cuda.h). Guards compare
// bit for bit. Reports the first difference with its place.
inline ::testing::AssertionResult same_arenas(const Case& expected,
                                              const std::array<std::vector<float>, kRoles>& got) {
  std::vector<int> inside(static_cast<size_t>(expected.arenas.size()), -1);
  for (int role = 0; role < kRoles; ++role) {
    std::fill(inside.begin(), inside.end(), -1);
    for (size_t j = 0; j < expected.tensors.size(); ++j) {
      const Placement& pl = expected.tensors[j];
      for (int64_t i = 0; i < pl.numel; ++i) {
        inside[static_cast<size_t>(pl.offset[role] + i)] = static_cast<int>(j);
      }
    }
    const float* want = expected.arenas.data(role);
    if (static_cast<int64_t>(got[role].size()) != expected.arenas.size()) {
      return ::testing::AssertionFailure() << kRoleName[role] << " arena size differs";
    }
    for (int64_t k = 0; k < expected.arenas.size(); ++k) {
      const float a = want[k];
      const float b = got[role][static_cast<size_t>(k)];
      const int j = inside[static_cast<size_t>(k)];
      const bool equal = std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) ||
                         (j >= 0 && std::isnan(a) && std::isnan(b));
      if (!equal) {
        std::ostringstream os;
        os.precision(9);
        os << kRoleName[role] << " arena position " << k;
        if (j >= 0) {
          os << " = tensor " << j << " (numel " << expected.tensors[j].numel << ", offset "
             << expected.tensors[j].offset[role] << ") element "
             << k - expected.tensors[j].offset[role];
        } else {
          os << " (a guard outside every tensor)";
        }
        os << ": expected " << a << " (0x" << std::hex << std::bit_cast<uint32_t>(a) << "), got "
           << std::dec << b << " (0x" << std::hex << std::bit_cast<uint32_t>(b) << ")" << std::dec;
        auto failure = ::testing::AssertionFailure() << os.str();
        return failure;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

inline std::array<std::vector<float>, kRoles> copy_arenas(const Arenas& a) {
  std::array<std::vector<float>, kRoles> out;
  for (int role = 0; role < kRoles; ++role) {
    out[role].assign(a.span(role).begin(), a.span(role).end());
  }
  return out;
}

}  // namespace ckptsim::model::adam_cases
