// Host half of the CUDA FusedAdam kernel: how a tensor list becomes launches (see
// fused_adam_kernel.h for the layout). Built with the host compiler in every build, with or
// without CUDA, so the CPU tests can check the plan.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "model/errors.h"
#include "model/kernels/cuda/fused_adam_kernel.h"

namespace ckptsim::model::cuda_detail {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

uintptr_t address(const float* p) { return reinterpret_cast<uintptr_t>(p); }

// The message is built only for a tensor that fails: at 64 tensors per call, building it for
// every tensor was most of the plan's host time (2.3 us of a call of 1 Mi elements).
void check_tensor(const FusedAdamTensors& t, size_t index) {
  const auto where = [index] { return "cuda_fused_adam: tensor " + std::to_string(index) + ": "; };
  CKPTSIM_CHECK(t.numel >= 0,
                where() + "numel must not be negative (got " + std::to_string(t.numel) + ")");
  if (t.numel == 0) return;
  CKPTSIM_CHECK(
      t.param != nullptr && t.grad != nullptr && t.exp_avg != nullptr && t.exp_avg_sq != nullptr,
      where() + "a pointer must not be null when numel > 0");
  const bool floats_aligned =
      address(t.param) % alignof(float) == 0 && address(t.grad) % alignof(float) == 0 &&
      address(t.exp_avg) % alignof(float) == 0 && address(t.exp_avg_sq) % alignof(float) == 0;
  CKPTSIM_CHECK(floats_aligned, where() + "a pointer must not be misaligned for float");
}

// 0..3 scalar elements before the first 16-byte boundary when all four arrays reach it
// together; kScalarPath when they do not (then no float4 access can serve all four).
int32_t head_of(const FusedAdamTensors& t) {
  const uintptr_t mis = address(t.param) % 16;
  if (address(t.grad) % 16 != mis || address(t.exp_avg) % 16 != mis ||
      address(t.exp_avg_sq) % 16 != mis) {
    return kScalarPath;
  }
  const int64_t head = static_cast<int64_t>((16 - mis) % 16) / 4;
  return static_cast<int32_t>(std::min(head, t.numel));
}

int64_t chunks_of(const TensorSlot& s, int64_t chunk_elems) {
  if (s.head == kScalarPath) return ceil_div(s.numel, chunk_elems);
  const int64_t vecs = (s.numel - s.head) / 4;
  return std::max<int64_t>(1, ceil_div(vecs, chunk_elems / 4));
}

// Chunks of about total / (resident blocks × target) elements, so that every resident block
// gets several chunks (a small last-wave imbalance) and each thread several float4s per
// chunk; in whole multiples of 4·threads (every thread has a vector in a full chunk) unless
// the cap is below that.
int64_t chunk_elems_for(int64_t total_elems, const PlanLimits& limits) {
  int64_t granule = int64_t{4} * limits.threads_per_block;
  if (limits.chunk_elems_max < granule) granule = 4;
  const int64_t cap = limits.chunk_elems_max / granule * granule;
  const int64_t want =
      ceil_div(total_elems, limits.resident_blocks * limits.chunks_per_block_target);
  return std::clamp(ceil_div(want, granule) * granule, granule, cap);
}

}  // namespace

void check_vec4_aligned(const float* ptr) {
  CKPTSIM_CHECK(address(ptr) % 16 == 0,
                "fused_adam kernel: a float4 access must not be misaligned (address % 16 = " +
                    std::to_string(address(ptr) % 16) + ")");
}

std::vector<Launch> plan_fused_adam(std::span<const FusedAdamTensors> list,
                                    const TeAdamScalars& scalars, const PlanLimits& limits) {
  CKPTSIM_CHECK(limits.resident_blocks >= 1 && limits.threads_per_block >= 1 &&
                    limits.chunk_elems_max >= 4 && limits.chunks_per_block_target >= 1 &&
                    limits.tensors_per_launch_max >= 1 &&
                    limits.tensors_per_launch_max <= kTensorsPerLaunchMax,
                "plan_fused_adam: limits must not be out of range");
  // Every tensor is checked before any launch is planned, so a bad entry launches nothing.
  for (size_t i = 0; i < list.size(); ++i) check_tensor(list[i], i);

  std::vector<Launch> launches;
  size_t next = 0;
  while (next < list.size()) {
    std::vector<const FusedAdamTensors*> members;
    int64_t total_elems = 0;
    while (next < list.size() &&
           members.size() < static_cast<size_t>(limits.tensors_per_launch_max)) {
      if (list[next].numel > 0) {
        members.push_back(&list[next]);
        total_elems += list[next].numel;
      }
      ++next;
    }
    if (members.empty()) break;

    Launch launch{};
    LaunchArgs& a = launch.args;
    a.scalars = scalars;
    a.chunk_elems = chunk_elems_for(total_elems, limits);
    a.tensor_count = static_cast<int32_t>(members.size());
    int64_t chunk_end = 0;
    for (size_t j = 0; j < members.size(); ++j) {
      const FusedAdamTensors& t = *members[j];
      TensorSlot& s = a.slot[j];
      s.param = t.param;
      s.grad = t.grad;
      s.exp_avg = t.exp_avg;
      s.exp_avg_sq = t.exp_avg_sq;
      s.numel = t.numel;
      s.head = head_of(t);
      const int64_t begin = chunk_end;
      chunk_end += chunks_of(s, a.chunk_elems);
      CKPTSIM_CHECK(chunk_end <= INT32_MAX,
                    "plan_fused_adam: a launch must not have more than 2^31 - 1 chunks");
      s.chunk_end = static_cast<int32_t>(chunk_end);
      if (chunk_end <= kChunkTableMax) {
        for (int64_t c = begin; c < chunk_end; ++c) a.chunk_slot[c] = static_cast<uint8_t>(j);
      }
    }
    a.chunk_count = chunk_end;
    launch.grid_blocks = std::min(limits.resident_blocks, a.chunk_count);
    launches.push_back(launch);
  }
  return launches;
}

}  // namespace ckptsim::model::cuda_detail
