// ProcessGroup: the slice of torch.distributed that the modeled code calls.
//
// model/ only sees this interface (the way Megatron only sees torch.distributed); sim/
// provides the in-process implementation (LocalWorld, one thread per rank), and a real c10d
// backend could implement it later. Modeled on c10d's Backend: every collective fails loudly
// unless the backend implements it, and every rank counts its collectives so that ranks
// whose collectives are out of step are detected instead of deadlocking.
//
// Invariants every implementation keeps:
//   1. Results do not depend on thread timing: reductions add contributions in rank order
//      0..N-1; gathers concatenate in rank order.
//   2. A collective either completes on every rank or throws on every rank that reaches it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace ckptsim::model {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;

  // Sum-reduce `input` (size()*output.size() floats on every rank) and give rank r the slice
  // [r*n, (r+1)*n) in `output`.
  virtual void reduce_scatter_sum(std::span<const float> input, std::span<float> output);
  // Every rank's `input` (equal lengths) concatenated in rank order into `output`.
  virtual void all_gather(std::span<const std::byte> input, std::span<std::byte> output);
  // Variable-size objects, every rank gets all, in rank order.
  virtual std::vector<std::vector<char>> all_gather_object(const std::vector<char>& bytes);
  virtual std::vector<char> broadcast_object(const std::vector<char>& bytes, int root);
  virtual void barrier();

  uint64_t sequence_number() const { return sequence_number_; }

 protected:
  [[noreturn]] void not_implemented(const char* op) const;
  uint64_t sequence_number_ = 0;
};

}  // namespace ckptsim::model
