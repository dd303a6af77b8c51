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
//   4. What all_gather_object_shared returns is immutable: a backend whose ranks share one
//      process may hand every rank the same GatheredObjects instead of a copy each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <typeinfo>
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

// Every rank's all_gather_object bytes, in rank order, as one immutable object. At DP 4096 a
// copy per rank is 4096 x 4096 entries (the save's metadata gather alone would need tens of
// GB), so a backend whose ranks share one process gives them all the same instance, and a value
// every rank derives from it the same way (the save's decoded pieces) is computed once.
//
// Invariants:
//   1. Immutable: objects() is const, and a fingerprint taken at construction is checked
//      before derived() computes and by check_unchanged(); a write through a const_cast, which
//      every other rank would see, throws InvariantViolation instead.
//   2. derived<T>(compute) returns compute(objects()) from the first call; every later call on
//      this instance returns that same value. One derived value (of one type) per instance. A
//      compute that throws caches nothing: the next caller computes (and throws) again.
//   3. Thread-safe: ranks on threads may call derived() at once; one computes, others wait.
class GatheredObjects {
 public:
  explicit GatheredObjects(std::vector<std::vector<char>> objects);
  GatheredObjects(const GatheredObjects&) = delete;
  GatheredObjects& operator=(const GatheredObjects&) = delete;

  const std::vector<std::vector<char>>& objects() const { return objects_; }

  // REQUIRES: compute is a pure function of objects(); every caller on this instance asks for
  // the same T.
  template <typename T, typename Compute>
  std::shared_ptr<const T> derived(Compute&& compute) const {
    std::lock_guard lock(mu_);
    if (derived_ == nullptr) {
      check_unchanged();
      derived_ = std::make_shared<const T>(compute(objects_));
      derived_type_ = &typeid(T);
    }
    check_derived_type(typeid(T));
    return std::static_pointer_cast<const T>(derived_);
  }

  // Throws InvariantViolation when the bytes differ from what they were when gathered.
  void check_unchanged() const;

 private:
  void check_derived_type(const std::type_info& asked) const;

  const std::vector<std::vector<char>> objects_;
  const uint64_t fingerprint_;
  mutable std::mutex mu_;
  mutable std::shared_ptr<const void> derived_;  // guarded by mu_
  mutable const std::type_info* derived_type_ = nullptr;
};

// FNV-1a over each object's size and bytes, in rank order.
uint64_t fingerprint(const std::vector<std::vector<char>>& objects);

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

  // all_gather_object, one collective of the same op, with the result immutable (invariant
  // 4) so that ranks may share it. The default wraps all_gather_object's copy.
  virtual std::shared_ptr<const GatheredObjects> all_gather_object_shared(
      const std::vector<char>& bytes);

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
