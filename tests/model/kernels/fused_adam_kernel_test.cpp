// Tests of the CUDA FusedAdam kernel's host-testable parts (model/cuda/fused_adam_kernel.h,
// fused_adam_plan.cpp) and of te_adam_scalars, on the CPU: the kernel body is run on the host,
// block by block and thread by thread, over the same launches the GPU would get, and compared
// bit for bit with the CPU reference fused_adam_update (an independent implementation: Eigen
// array expressions). The GPU itself is tested in tests/gpu/.
//
// Expected values: the CPU reference (bitwise), hand-derived plans (PlanOfOneTensorByHand) and
// exact binary fractions for the scalars (TeAdamScalars.ByHand).
//
// Mutations tried (applied one at a time to a copy of the sources, then discarded) and the
// tests that failed; every one of them was caught:
//   K1 run_chunk: the scalar tail starts one element early (head + 4·vecs - 1)
//      -> ManyTensorsSplitIntoLaunches, EmulatedKernelMatchesCpuBitwise (a guard before a
//         tensor changed), EmulatedKernelAtEveryAlignmentAndSize, EmulatedKernelOnSpecialValues
//   K2 plan: head computed as mis/4 instead of (16 - mis) % 16 / 4
//      -> PlanOfOneTensorByHand, ManyTensorsSplitIntoLaunches and the three emulation tests
//         (the host load4 throws "a float4 access must not be misaligned")
//   K3 te_adam_element: (m/bc1)/denom computed as m/(bc1·denom)
//      -> EmulatedKernelMatchesCpuBitwise, EmulatedKernelAtEveryAlignmentAndSize,
//         EmulatedKernelOnSpecialValues
//   K4 run_block: the tensor cursor test `c >= chunk_end` written `c > chunk_end`
//      -> ManyTensorsSplitIntoLaunches, EmulatedKernelMatchesCpuBitwise,
//         EmulatedKernelOnSpecialValues (that slot-by-slot walk is gone; K9-K11 test what
//         replaced it)
//   K5 plan: a vector-path tensor of numel 1..3 gets 0 chunks (no max(1, ...))
//      -> PlanOfOneTensorByHand, ManyTensorsSplitIntoLaunches, and the three emulation tests
//   K6 te_adam_scalars: 1 - β2 taken in double and rounded (float(1 - β2)) instead of the
//      float subtraction 1 - float(β2)
//      -> TeAdamScalars.ByHand, AdamMath.FusedAdamHandStep1And2,
//         AdamMath.FusedAdamMatchesScalarReferenceBitwise
//   K7 slot_of_chunk: `c < chunk_end` written `c <= chunk_end` (a block starts in the slot
//      before its chunk's) -> SlotOfChunkIsTheSlotThatHoldsIt
//   K8 slot_of_chunk: hi starts at tensor_count - 2 (the last slot never found)
//      -> SlotOfChunkIsTheSlotThatHoldsIt
//   K9 plan: chunk_slot filled with the next slot's index (j + 1) ->
//   SlotOfChunkIsTheSlotThatHoldsIt,
//      BothSlotLookupsMatchCpu (table path), EmulatedKernelMatchesCpuBitwise
//   K10 slot_from: after a failed probe, the next search starts two slots on (lo = probe + 2)
//      -> SlotOfChunkIsTheSlotThatHoldsIt, EmulatedKernelMatchesCpuBitwise
//   K11 run_block: the table taken also where chunk_count > kChunkTableMax (its entries past
//      the table are not written) -> BothSlotLookupsMatchCpu
#include "model/kernels/cuda/fused_adam_kernel.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <iostream>
#include <vector>

#include "model/errors.h"
#include "model/kernels/adam_math.h"
#include "model/kernels/fused_adam_cuda.h"
#include "tests/adam_cases.h"

namespace ckptsim::model {
namespace {

using namespace adam_cases;
using cuda_detail::Launch;
using cuda_detail::PlanLimits;

// Runs every launch of the plan on the host: each block's grid-stride loop, each thread in
// turn (threads never communicate, so the order does not matter).
void emulate(std::span<const FusedAdamTensors> list, const AdamHyper& h, int64_t step,
             const PlanLimits& limits) {
  const std::vector<Launch> launches =
      cuda_detail::plan_fused_adam(list, te_adam_scalars(h, step), limits);
  for (const Launch& launch : launches) {
    ASSERT_GE(launch.grid_blocks, 1);
    ASSERT_LE(launch.grid_blocks, limits.resident_blocks);
    for (int64_t b = 0; b < launch.grid_blocks; ++b) {
      for (int32_t t = 0; t < limits.threads_per_block; ++t) {
        cuda_detail::run_block(launch.args, b, launch.grid_blocks, t, limits.threads_per_block);
      }
    }
  }
}

// Small blocks and chunks, so that small tensors cross many chunk and launch boundaries.
PlanLimits random_limits(Rng& r) {
  PlanLimits limits;
  limits.resident_blocks = r.between(1, 7);
  limits.threads_per_block = static_cast<int32_t>(r.between(1, 9));
  limits.chunk_elems_max = r.between(4, 200);
  limits.tensors_per_launch_max = static_cast<int32_t>(r.between(1, 64));
  limits.chunks_per_block_target = r.between(1, 8);
  return limits;
}

std::string describe_limits(const PlanLimits& l) {
  return "resident_blocks=" + std::to_string(l.resident_blocks) +
         " threads=" + std::to_string(l.threads_per_block) +
         " chunk_elems_max=" + std::to_string(l.chunk_elems_max) +
         " tensors_per_launch_max=" + std::to_string(l.tensors_per_launch_max) +
         " chunks_per_block_target=" + std::to_string(l.chunks_per_block_target);
}

// Runs `c` through the emulated kernel and the CPU reference and compares the arenas.
void check_case(Case& c, const AdamHyper& h, int64_t step, const PlanLimits& limits) {
  SCOPED_TRACE(describe(h, step) + " " + describe_limits(limits));
  Case got = c;
  std::array<float*, kRoles> base{};
  for (int role = 0; role < kRoles; ++role) base[role] = got.arenas.data(role);
  const std::vector<FusedAdamTensors> list = tensor_list(got, base);
  emulate(list, h, step, limits);
  cpu_reference(c, h, step);
  ASSERT_TRUE(same_arenas(c, copy_arenas(got.arenas)));
}

// ---- te_adam_scalars ------------------------------------------------------------------------

// β = 0.5 and 0.75 and their powers are exact in float and double, so the bias corrections
// are exact too: 1 - 0.5^3 = 0.875, 1 - 0.75^2 = 0.4375.
TEST(TeAdamScalars, ByHand) {
  AdamHyper h;
  h.lr = 0.1;
  h.beta1 = 0.5;
  h.beta2 = 0.75;
  h.eps = 1e-8;
  h.weight_decay = 0.01;
  TeAdamScalars s = te_adam_scalars(h, 3);
  EXPECT_EQ(s.lr, 0.1f);
  EXPECT_EQ(s.beta1, 0.5f);
  EXPECT_EQ(s.beta2, 0.75f);
  EXPECT_EQ(s.eps, 1e-8f);
  EXPECT_EQ(s.weight_decay, 0.01f);
  EXPECT_EQ(s.bias_correction1, 0.875f);
  EXPECT_EQ(s.bias_correction2, 1.0f - 0.421875f);  // 0.75^3
  EXPECT_EQ(s.one_minus_beta1, 0.5f);
  EXPECT_EQ(s.one_minus_beta2, 0.25f);
  EXPECT_EQ(te_adam_scalars(h, 2).bias_correction2, 0.4375f);

  // β2 = 0.999 enters as float: at t = 1 the bias correction is 1 - 0.99900001287..., which
  // is exactly the float subtraction 1 - 0.999f (both operands within a factor 2).
  h.beta2 = 0.999;
  s = te_adam_scalars(h, 1);
  EXPECT_EQ(s.bias_correction2, 1.0f - 0.999f);
  EXPECT_NE(double{s.bias_correction2}, 1.0 - 0.999);
  // And 1 - β2 is the float subtraction, not 1 - 0.999 rounded (0.001f).
  EXPECT_EQ(s.one_minus_beta2, 1.0f - 0.999f);
  EXPECT_NE(s.one_minus_beta2, static_cast<float>(1.0 - 0.999));

  h.bias_correction = false;
  s = te_adam_scalars(h, 7);
  EXPECT_EQ(s.bias_correction1, 1.0f);
  EXPECT_EQ(s.bias_correction2, 1.0f);
}

TEST(TeAdamScalars, StepOutsideACIntThrows) {
  AdamHyper h;
  EXPECT_THROW(te_adam_scalars(h, 0), InvariantViolation);
  EXPECT_THROW(te_adam_scalars(h, int64_t{1} << 31), InvariantViolation);
  EXPECT_NO_THROW(te_adam_scalars(h, (int64_t{1} << 31) - 1));
}

// ---- the plan, by hand ----------------------------------------------------------------------

// One tensor of 4103 elements whose four arrays all start 1 float past a 16-byte boundary,
// with 4 threads, 3 resident blocks, chunks of at most 64 elements:
//   head = 3 (elements 0..2 reach the boundary), body 4100 = 1025 float4s, tail 0;
//   wanted chunk = ceil(4103 / (3 blocks · 16 chunks each)) = 86 -> multiple of 4·4 = 96
//   -> capped at 64;
//   chunks = ceil(1025 / 16) = 65; grid = min(3, 65) = 3.
TEST(FusedAdamPlan, PlanOfOneTensorByHand) {
  alignas(16) static float arena[4][4200];
  FusedAdamTensors t{arena[0] + 1, arena[1] + 1, arena[2] + 1, arena[3] + 1, 4103};
  PlanLimits limits;
  limits.resident_blocks = 3;
  limits.threads_per_block = 4;
  limits.chunk_elems_max = 64;
  const auto launches = cuda_detail::plan_fused_adam({&t, 1}, TeAdamScalars{}, limits);
  ASSERT_EQ(launches.size(), 1u);
  const auto& a = launches[0].args;
  EXPECT_EQ(a.tensor_count, 1);
  EXPECT_EQ(a.slot[0].head, 3);
  EXPECT_EQ(a.chunk_elems, 64);
  EXPECT_EQ(a.chunk_count, 65);
  EXPECT_EQ(a.slot[0].chunk_end, 65);
  EXPECT_EQ(launches[0].grid_blocks, 3);

  // Offsets 2 and 3 past the boundary need 2 and 1 head elements; a 2-element tensor at
  // offset 1 is all head (min(3, 2)) and still gets one chunk.
  t = {arena[0] + 2, arena[1] + 2, arena[2] + 2, arena[3] + 2, 10};
  EXPECT_EQ(cuda_detail::plan_fused_adam({&t, 1}, TeAdamScalars{}, limits)[0].args.slot[0].head, 2);
  t = {arena[0] + 7, arena[1] + 3, arena[2] + 11, arena[3] + 3, 10};
  EXPECT_EQ(cuda_detail::plan_fused_adam({&t, 1}, TeAdamScalars{}, limits)[0].args.slot[0].head, 1);
  t = {arena[0] + 1, arena[1] + 1, arena[2] + 1, arena[3] + 1, 2};
  auto small = cuda_detail::plan_fused_adam({&t, 1}, TeAdamScalars{}, limits);
  EXPECT_EQ(small[0].args.slot[0].head, 2);
  EXPECT_EQ(small[0].args.chunk_count, 1);
  // Arrays at different offsets mod 4 floats cannot share a float4: the scalar path. Wanted
  // chunk ceil(130 / 48) = 3 -> 16 (one float4 per thread); ceil(130 / 16) = 9 chunks.
  t = {arena[0] + 1, arena[1] + 2, arena[2] + 1, arena[3] + 1, 130};
  auto scalar = cuda_detail::plan_fused_adam({&t, 1}, TeAdamScalars{}, limits);
  EXPECT_EQ(scalar[0].args.slot[0].head, cuda_detail::kScalarPath);
  EXPECT_EQ(scalar[0].args.chunk_elems, 16);
  EXPECT_EQ(scalar[0].args.chunk_count, 9);
}

// 300 tensors (and empty ones, which take no slot) with the default 64 per launch:
// ceil(300 / 64) = 5 launches.
TEST(FusedAdamPlan, ManyTensorsSplitIntoLaunches) {
  Rng r(base_seed());
  std::cout << "[ seed ] " << base_seed() << "\n";
  std::vector<int64_t> numels;
  for (int j = 0; j < 300; ++j) numels.push_back(r.between(1, 40));
  Case c = layout_case(r, numels, CaseShape{});
  std::array<float*, kRoles> base{};
  for (int role = 0; role < kRoles; ++role) base[role] = c.arenas.data(role);
  std::vector<FusedAdamTensors> list = tensor_list(c, base);
  list.insert(list.begin() + 17, FusedAdamTensors{});  // numel 0, null pointers
  list.push_back(FusedAdamTensors{});
  PlanLimits limits;
  limits.resident_blocks = 5;
  limits.threads_per_block = 8;
  const auto launches = cuda_detail::plan_fused_adam(list, TeAdamScalars{}, limits);
  ASSERT_EQ(launches.size(), 5u);
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(launches[k].args.tensor_count, 64);
  EXPECT_EQ(launches[4].args.tensor_count, 300 - 4 * 64);
  EXPECT_EQ(launches[0].args.slot[17].numel, numels[17]);  // the empty entry took no slot

  const AdamHyper h = random_hyper(r);
  const int64_t step = random_step(r);
  check_case(c, h, step, limits);
}

// Every way the kernel finds a chunk's slot names the slot whose chunk range holds the chunk:
// the binary search (slot_of_chunk), the forward probes from any earlier chunk's slot
// (slot_from) and, where the launch has at most kChunkTableMax chunks, chunk_slot. Launches of
// one tensor and of 64 (1..40 elements: under the table's size; 100..140: over it).
TEST(FusedAdamPlan, SlotOfChunkIsTheSlotThatHoldsIt) {
  Rng r(base_seed());
  struct Shape {
    int tensors;
    int64_t numel_min, numel_max;
  };
  for (const Shape shape : {Shape{1, 1, 40}, Shape{64, 1, 40}, Shape{64, 100, 140}}) {
    std::vector<int64_t> numels;
    for (int j = 0; j < shape.tensors; ++j) {
      numels.push_back(r.between(shape.numel_min, shape.numel_max));
    }
    Case c = layout_case(r, numels, CaseShape{});
    std::array<float*, kRoles> base{};
    for (int role = 0; role < kRoles; ++role) base[role] = c.arenas.data(role);
    const std::vector<FusedAdamTensors> list = tensor_list(c, base);
    PlanLimits limits;
    limits.resident_blocks = 1000;
    limits.threads_per_block = 1;
    limits.chunk_elems_max = 4;
    const auto launches = cuda_detail::plan_fused_adam(list, TeAdamScalars{}, limits);
    ASSERT_EQ(launches.size(), 1u);
    const auto& a = launches[0].args;
    ASSERT_EQ(a.tensor_count, shape.tensors);
    const bool table = a.chunk_count <= cuda_detail::kChunkTableMax;
    EXPECT_EQ(table, shape.numel_max <= 40) << a.chunk_count << " chunks";
    int32_t holder = 0;
    for (int64_t chunk = 0; chunk < a.chunk_count; ++chunk) {
      while (chunk >= a.slot[holder].chunk_end) ++holder;
      ASSERT_EQ(cuda_detail::slot_of_chunk(a, chunk), holder) << "chunk " << chunk;
      if (table) {
        ASSERT_EQ(a.chunk_slot[chunk], holder) << "chunk " << chunk;
      }
      for (int32_t from = 0; from <= holder; ++from) {
        if (from > 0 && chunk < a.slot[from - 1].chunk_end) continue;  // not an earlier slot
        ASSERT_EQ(cuda_detail::slot_from(a, from, chunk), holder)
            << "chunk " << chunk << " from slot " << from;
      }
    }
  }
}

// The emulated kernel over one launch whose chunks the table covers and one with more chunks
// than it holds (the probes), a grid of 7 blocks: each element updated once, as the CPU does.
TEST(FusedAdamKernel, BothSlotLookupsMatchCpu) {
  Rng r(base_seed() + 3);
  for (const int64_t numel_max : {int64_t{40}, int64_t{140}}) {
    std::vector<int64_t> numels;
    for (int j = 0; j < 64; ++j) numels.push_back(r.between(numel_max - 39, numel_max));
    Case c = layout_case(r, numels, CaseShape{});
    PlanLimits limits;
    limits.resident_blocks = 7;
    limits.threads_per_block = 1;
    limits.chunk_elems_max = 4;
    limits.chunks_per_block_target = 1000;
    std::array<float*, kRoles> base{};
    for (int role = 0; role < kRoles; ++role) base[role] = c.arenas.data(role);
    const auto launches =
        cuda_detail::plan_fused_adam(tensor_list(c, base), TeAdamScalars{}, limits);
    ASSERT_EQ(launches.size(), 1u);
    EXPECT_EQ(launches[0].args.chunk_count <= cuda_detail::kChunkTableMax, numel_max == 40);
    check_case(c, random_hyper(r), random_step(r), limits);
  }
}

TEST(FusedAdamPlan, BadTensorsThrowBeforeAnyLaunch) {
  alignas(16) static float a[4][16];
  const TeAdamScalars s{};
  const PlanLimits limits;
  std::vector<FusedAdamTensors> list = {{a[0], a[1], a[2], a[3], 16},
                                        {a[0], nullptr, a[2], a[3], 4}};
  EXPECT_THROW(cuda_detail::plan_fused_adam(list, s, limits), InvariantViolation);
  list[1] = {a[0], a[1], a[2], a[3], -1};
  EXPECT_THROW(cuda_detail::plan_fused_adam(list, s, limits), InvariantViolation);
  float* odd = reinterpret_cast<float*>(reinterpret_cast<char*>(a[0]) + 2);
  list[1] = {odd, a[1], a[2], a[3], 2};
  EXPECT_THROW(cuda_detail::plan_fused_adam(list, s, limits), InvariantViolation);
  list[1] = {nullptr, nullptr, nullptr, nullptr, 0};  // empty: fine
  EXPECT_EQ(cuda_detail::plan_fused_adam(list, s, limits).size(), 1u);
  EXPECT_TRUE(cuda_detail::plan_fused_adam({}, s, limits).empty());
}

// ---- the kernel body, emulated --------------------------------------------------------------

TEST(FusedAdamKernel, EmulatedKernelMatchesCpuBitwise) {
  const uint64_t seed = base_seed() + 1;
  std::cout << "[ seed ] " << seed << "\n";
  Rng r(seed);
  for (int iteration = 0; iteration < 60; ++iteration) {
    SCOPED_TRACE("iteration " + std::to_string(iteration));
    CaseShape shape;
    shape.tensors_max = r.chance(0.2) ? 150 : 12;
    shape.numel_max = r.chance(0.3) ? 3000 : 70;
    Case c = random_case(r, shape);
    const AdamHyper h = random_hyper(r);
    const int64_t step = random_step(r);
    check_case(c, h, step, random_limits(r));
    if (HasFatalFailure()) return;
  }
}

// Every size 1..40 and a few around powers of two, at each common misalignment and with
// mixed alignments, with threads and chunks that make the tail and head meet chunk edges.
TEST(FusedAdamKernel, EmulatedKernelAtEveryAlignmentAndSize) {
  const uint64_t seed = base_seed() + 2;
  std::cout << "[ seed ] " << seed << "\n";
  Rng r(seed);
  std::vector<int64_t> sizes;
  for (int64_t n = 1; n <= 40; ++n) sizes.push_back(n);
  for (int64_t n : {63, 64, 65, 127, 128, 129, 1023, 1024, 1025, 4096 + 7}) sizes.push_back(n);
  for (int64_t n : sizes) {
    for (int placement = 0; placement < 5; ++placement) {
      CaseShape shape;
      shape.equal_alignment = placement < 4 ? 1.0 : 0.0;
      shape.common_offset = placement < 4 ? placement : -1;
      Case c = layout_case(r, {n}, shape);
      const AdamHyper h = random_hyper(r);
      const int64_t step = random_step(r);
      PlanLimits limits;
      limits.resident_blocks = r.between(1, 3);
      limits.threads_per_block = static_cast<int32_t>(r.between(1, 5));
      limits.chunk_elems_max = r.between(4, 24);
      SCOPED_TRACE("numel " + std::to_string(n) + " placement " + std::to_string(placement));
      check_case(c, h, step, limits);
      if (HasFatalFailure()) return;
    }
  }
}

// inf, NaN, denormals, signed zeros and huge values: bitwise where not NaN, NaN where the
// reference is NaN.
TEST(FusedAdamKernel, EmulatedKernelOnSpecialValues) {
  const uint64_t seed = base_seed() + 3;
  std::cout << "[ seed ] " << seed << "\n";
  Rng r(seed);
  for (int iteration = 0; iteration < 20; ++iteration) {
    CaseShape shape;
    shape.tensors_max = 8;
    shape.numel_max = 500;
    shape.special_values = true;
    Case c = random_case(r, shape);
    check_case(c, random_hyper(r), random_step(r), random_limits(r));
    if (HasFatalFailure()) return;
  }
}

// The stub and the CUDA build agree on the contract: available exactly when there is no
// reason not to be.
TEST(FusedAdamCuda, AvailabilityAndReasonAgree) {
  const bool available = cuda_fused_adam_available();
  const std::string reason = cuda_unavailable_reason();
  EXPECT_EQ(available, reason.empty()) << reason;
  std::cout << "[ info ] CUDA FusedAdam: "
            << (available ? cuda_device_description() : "unavailable: " + reason) << "\n";
}

}  // namespace
}  // namespace ckptsim::model
