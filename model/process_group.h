// ProcessGroup: the slice of torch.distributed that the modeled code calls.
//
// model/ only sees this interface (the way Megatron only sees torch.distributed); sim/
// provides the in-process implementation (sim/local_world.h: LocalWorld, one fiber per
// rank), and a real c10d backend could implement it later. Modeled on c10d's Backend
// (torch/csrc/distributed/c10d/Backend.hpp): every collective of the base class throws
// CollectiveNotImplemented unless a backend overrides it, and every rank counts the
// collectives it issues (its sequence number) so that ranks whose collectives are out of
// step are caught, not mixed.
//
// Invariants every implementation keeps:
//   1. Results never depend on thread timing: sums add contributions in rank order
//      0..N-1, left to right, in fp32; gathers concatenate in rank order.
//   2. A collective either completes on every rank or throws on every rank that reaches it.
//   3. An output buffer may alias the same rank's input buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace ckptsim::model {

// The collectives, named as in the ProcessGroup methods (op_name gives the text).
enum class CollectiveOp {
  kReduceScatterSum,
  kAllReduceSum,
  kAllGather,
  kAllGatherObject,
  kBroadcastObject,
  kBarrier,
};
const char* op_name(CollectiveOp op);

// A backend does not implement a collective (the c10d base-class behavior). A bug in ckptsim.
class CollectiveNotImplemented : public std::logic_error {
 public:
  CollectiveNotImplemented(CollectiveOp op, const std::string& backend_name);
};

// Mirrors the role of c10d Backend (torch/csrc/distributed/c10d/Backend.hpp).
class ProcessGroup {
 public:
  virtual ~ProcessGroup();

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;

  // Sum-reduces `input` over ranks and gives rank r the slice [r*n, (r+1)*n), n = output.size().
  // REQUIRES: input.size() == size() * output.size(), the same on every rank.
  virtual void reduce_scatter_sum(std::span<const float> input, std::span<float> output);

  // Sum-reduces `data` over ranks, in place, on every rank.
  // REQUIRES: data.size() is the same on every rank.
  virtual void all_reduce_sum(std::span<float> data);

  // Concatenates every rank's `input` in rank order into `output`.
  // REQUIRES: input.size() is the same on every rank; output.size() == size() * input.size().
  virtual void all_gather(std::span<const std::byte> input, std::span<std::byte> output);

  // Every rank contributes bytes of any length; every rank gets all of them, in rank order.
  virtual std::vector<std::vector<char>> all_gather_object(const std::vector<char>& bytes);

  // Every rank gets `root`'s bytes; the bytes passed by other ranks are ignored.
  // REQUIRES: 0 <= root < size(), the same root on every rank.
  virtual std::vector<char> broadcast_object(const std::vector<char>& bytes, int root);

  virtual void barrier();

  // all_gather of trivially copyable elements (fp32, bf16 bit patterns, indices).
  template <typename T>
  requires std::is_trivially_copyable_v<T>
  void all_gather_values(std::span<const T> input, std::span<T> output) {
    all_gather(std::as_bytes(input), std::as_writable_bytes(output));
  }

  // Collectives issued so far by this rank, including ones that threw.
  uint64_t sequence_number() const { return sequence_number_; }

 protected:
  // Backends call this once at the start of each collective; returns the call's number.
  uint64_t next_sequence_number() { return sequence_number_++; }

 private:
  uint64_t sequence_number_ = 0;
};

}  // namespace ckptsim::model
