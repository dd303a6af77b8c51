// GPU tests of the CUDA FusedAdam kernel (model/fused_adam_cuda.h) against the CPU reference
// fused_adam_update (model/adam_math.h): bit for bit, on cudaMalloc'd arenas holding the
// tensors as views at random float offsets with guard floats around them (tests/adam_cases.h),
// after every step. Every test skips, never fails, where no CUDA device can be used (label
// "gpu"; `ctest -L gpu`). No test measures or asserts time: throughput is the benchmark's
// job (bench/fused_adam_gpu_bench.cpp).
//
// Expected values come from the CPU reference, an independent implementation (Eigen array
// expressions, built with -ffp-contract=off) that tests/model/adam_math_test.cpp checks
// against hand values and a scalar re-derivation.
//
// Mutations and the tests that catch them. These tests need a GPU, so on the development
// machine the mutations were run against the CPU emulation of the same kernel body
// (tests/model/fused_adam_kernel_test.cpp, K1-K6) and the PTX check; here they are reasoned:
//   G1 the _rn intrinsics replaced by * and +, and --fmad=false dropped (nvcc then contracts
//      into FMAs) -> every bitwise test here; also the cpu ctest cuda_kernel_ptx_rounding
//      (run: it reports the fma.rn.f32)
//   G2 a chunk, head or tail boundary off by one -> SingleTensorsAtEveryAlignment,
//      RandomListsMatchCpuBitwiseOverSteps, SpecialValuesMatchCpu (a changed guard, or an
//      element updated twice or not at all)
//   G3 only the first launch of a list run (64 tensors) -> RandomListsMatchCpuBitwiseOverSteps
//      (its first iteration has 300 tensors), LargeListSmoke is one launch and would not
//   G4 host-side argument checks after the launch instead of before ->
//      BadArgumentsThrowAndLaunchNothing (the first tensor would have been updated)
// Not caught, by design: cuda_fused_adam(stream = nullptr) returning before the kernel ends;
// our downloads are cudaMemcpy on the legacy default stream, ordered after the kernel anyway.
#include "model/kernels/fused_adam_cuda.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <iostream>
#include <vector>

#include "model/errors.h"
#include "model/kernels/adam_math.h"
#include "tests/adam_cases.h"

namespace ckptsim::model {
namespace {

using namespace adam_cases;

class CudaFusedAdam : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (cuda_fused_adam_available()) {
      std::cout << "[ info ] device: " << cuda_device_description() << "\n";
    }
  }
  void SetUp() override {
    if (!cuda_fused_adam_available()) GTEST_SKIP() << cuda_unavailable_reason();
  }
};

// A case's four arenas on the device.
struct DeviceCase {
  std::array<CudaFloatBuffer, kRoles> arenas;
  std::vector<FusedAdamTensors> list;

  explicit DeviceCase(const Case& c) {
    std::array<float*, kRoles> base{};
    for (int role = 0; role < kRoles; ++role) {
      arenas[role] = CudaFloatBuffer(c.arenas.size());
      arenas[role].upload(c.arenas.span(role));
      base[role] = arenas[role].data();
    }
    list = tensor_list(c, base);
  }

  std::array<std::vector<float>, kRoles> download() const {
    std::array<std::vector<float>, kRoles> out;
    for (int role = 0; role < kRoles; ++role) {
      out[role].resize(static_cast<size_t>(arenas[role].size()));
      arenas[role].download(out[role]);
    }
    return out;
  }
};

// `steps` consecutive steps from `first_step`, on the GPU and the CPU, compared after each.
void run_and_compare(Case& c, const AdamHyper& h, int64_t first_step, int steps) {
  DeviceCase d(c);
  for (int k = 0; k < steps; ++k) {
    const int64_t step = first_step + k;
    SCOPED_TRACE(describe(h, step));
    cuda_fused_adam(d.list, h, step);
    cpu_reference(c, h, step);
    ASSERT_TRUE(same_arenas(c, d.download()));
  }
}

TEST_F(CudaFusedAdam, SingleTensorsAtEveryAlignment) {
  const uint64_t seed = base_seed() + 10;
  std::cout << "[ seed ] " << seed << "\n";
  Rng r(seed);
  // clang-format off
  const int64_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 1023, 1024, 1025, 2047, 2048, 2049,
                           4096 + 7, 65536 + 3, 65536 * 3 + 1, (1 << 20) + 5};
  // clang-format on
  for (int64_t n : sizes) {
    // Placements 0-3: all four arrays at offset 0..3 mod 4 floats (float4 path with a head of
    // 0, 3, 2, 1 elements); 4: offsets chosen independently (almost always the scalar path).
    for (int placement = 0; placement < 5; ++placement) {
      SCOPED_TRACE("numel " + std::to_string(n) + " placement " + std::to_string(placement));
      CaseShape shape;
      shape.equal_alignment = placement < 4 ? 1.0 : 0.0;
      shape.common_offset = placement < 4 ? placement : -1;
      Case c = layout_case(r, {n}, shape);
      run_and_compare(c, random_hyper(r), random_step(r), 1);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(CudaFusedAdam, RandomListsMatchCpuBitwiseOverSteps) {
  const uint64_t seed = base_seed() + 11;
  std::cout << "[ seed ] " << seed << "\n";
  Rng r(seed);
  for (int iteration = 0; iteration < 40; ++iteration) {
    SCOPED_TRACE("iteration " + std::to_string(iteration));
    CaseShape shape;
    shape.tensors_min = iteration == 0 ? 300 : 1;  // always one list past 4 launches of 64
    shape.tensors_max = iteration % 3 == 0 ? 300 : 20;
    shape.numel_max = iteration % 4 == 0 ? 200000 : 5000;
    Case c = random_case(r, shape);
    const AdamHyper h = random_hyper(r);
    const int64_t step = std::min<int64_t>(random_step(r), 9998);
    run_and_compare(c, h, step, static_cast<int>(r.between(1, 3)));
    if (HasFatalFailure()) return;
  }
}

TEST_F(CudaFusedAdam, SpecialValuesMatchCpu) {
  const uint64_t seed = base_seed() + 12;
  std::cout << "[ seed ] " << seed << "\n";
  Rng r(seed);
  for (int iteration = 0; iteration < 20; ++iteration) {
    CaseShape shape;
    shape.tensors_max = 16;
    shape.numel_max = 3000;
    shape.special_values = true;
    Case c = random_case(r, shape);
    run_and_compare(c, random_hyper(r), random_step(r), 2);
    if (HasFatalFailure()) return;
  }
}

TEST_F(CudaFusedAdam, StreamLaunchMatchesCpu) {
  const uint64_t seed = base_seed() + 13;
  std::cout << "[ seed ] " << seed << "\n";
  Rng r(seed);
  CaseShape shape;
  shape.tensors_min = 50;
  shape.tensors_max = 150;
  shape.numel_max = 100000;
  Case c = random_case(r, shape);
  const AdamHyper h = random_hyper(r);
  const int64_t step = random_step(r);
  DeviceCase d(c);
  CudaStream stream;
  cuda_fused_adam(d.list, h, step, stream.handle());
  stream.synchronize();
  cpu_reference(c, h, step);
  EXPECT_TRUE(same_arenas(c, d.download()));
}

// The benchmark's shape (64 tensors, ~16.8M elements), run for correctness only: two steps,
// every element compared. Its time is not looked at here.
TEST_F(CudaFusedAdam, LargeListSmoke) {
  const uint64_t seed = base_seed() + 14;
  std::cout << "[ seed ] " << seed << "\n";
  Rng r(seed);
  std::vector<int64_t> numels;
  for (int j = 0; j < 64; ++j) numels.push_back((int64_t{1} << 18) + r.between(-999, 999));
  Case c = layout_case(r, numels, CaseShape{});
  AdamHyper h;  // Megatron's usual: lr 1e-3 (AdamHyper default), β = (0.9, 0.95), wd 0.1
  h.beta2 = 0.95;
  h.weight_decay = 0.1;
  run_and_compare(c, h, 1000, 2);
}

TEST_F(CudaFusedAdam, EmptyTensorsAndListsAreNoOps) {
  Rng r(base_seed() + 15);
  Case c = layout_case(r, {33}, CaseShape{});
  DeviceCase d(c);
  std::vector<FusedAdamTensors> list = {FusedAdamTensors{}, d.list[0], FusedAdamTensors{}};
  const AdamHyper h = random_hyper(r);
  cuda_fused_adam({}, h, 1);
  cuda_fused_adam(list, h, 5);
  cpu_reference(c, h, 5);
  EXPECT_TRUE(same_arenas(c, d.download()));
}

// Errors visible on the host throw before anything is launched: the arenas stay as they were.
TEST_F(CudaFusedAdam, BadArgumentsThrowAndLaunchNothing) {
  Rng r(base_seed() + 16);
  Case c = layout_case(r, {100, 100}, CaseShape{});
  DeviceCase d(c);
  const AdamHyper h = random_hyper(r);
  std::vector<FusedAdamTensors> list = d.list;
  list[1].grad = nullptr;
  EXPECT_THROW(cuda_fused_adam(list, h, 3), InvariantViolation);
  EXPECT_THROW(cuda_fused_adam(d.list, h, 0), InvariantViolation);
  EXPECT_THROW(cuda_fused_adam(d.list, h, int64_t{1} << 32), InvariantViolation);
  EXPECT_TRUE(same_arenas(c, d.download()));  // untouched
}

}  // namespace
}  // namespace ckptsim::model
