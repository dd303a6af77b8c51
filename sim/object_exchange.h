// ObjectExchange: all_gather_object_shared for the ranks of one LocalWorld, with ONE copy of the
// gathered objects for all of them. LocalWorld's all_gather_object gives each rank its own copy
// of every rank's bytes, N^2 entries: at DP 4096 the save's metadata gather alone needs more
// memory than a workstation has. Until LocalWorld shares the result itself (then this file
// goes), each rank's group is wrapped in a SharingProcessGroup that gathers through here.
//
// How a round goes: every rank deposits its bytes under the collective's sequence number, then
// joins the world's own all_gather_object with an empty payload: the same op at the same
// sequence number, so the world still checks that the ranks agree and fails them exactly as
// before (invariants 2 and 3 of sim/local_world.h). When that returns, every rank has
// deposited; the first to collect assembles the GatheredObjects and every rank takes it.
//
// Invariants:
//   1. Every rank of a round takes the same instance, holding the deposits in rank order
//      (ProcessGroup invariant 1); what a rank deposits in one round never shows in another.
//   2. A round is forgotten once every rank has taken it. A round the world failed (a peer
//      left, a mismatch) is never taken and stays until the exchange is destroyed; a rank
//      leaves after a failed collective, so there is at most one such round per rank.
//   3. Thread-safe: ranks on threads deposit and take at once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/process_group.h"

namespace ckptsim::sim {

class ObjectExchange {
 public:
  // REQUIRES: world_size >= 1.
  explicit ObjectExchange(int world_size);
  ObjectExchange(const ObjectExchange&) = delete;
  ObjectExchange& operator=(const ObjectExchange&) = delete;

  // REQUIRES: 0 <= rank < world size; rank has not deposited in this round.
  void deposit(uint64_t sequence_number, int rank, std::vector<char> bytes);
  // REQUIRES: every rank has deposited in this round (the world's collective completed);
  // this rank has not taken it yet.
  std::shared_ptr<const model::GatheredObjects> take(uint64_t sequence_number, int rank);

  // Rounds not yet taken by every rank (for tests).
  size_t open_rounds() const;

 private:
  struct Round {
    std::vector<std::vector<char>> deposits;  // by rank
    std::vector<bool> deposited;              // by rank
    std::vector<bool> taken;                  // by rank
    int deposited_count = 0;
    int taken_count = 0;
    std::shared_ptr<const model::GatheredObjects> result;  // set by the first take
  };

  const int world_size_;
  mutable std::mutex mu_;
  std::map<uint64_t, Round> rounds_;  // by sequence number; guarded by mu_
};

// One rank's group that gathers objects through an ObjectExchange and forwards every other
// collective to the rank's own group. Its sequence number follows the inner group's.
class SharingProcessGroup final : public model::ProcessGroup {
 public:
  // REQUIRES: inner and exchange outlive this object; the exchange is the world's, shared by
  // every rank's SharingProcessGroup.
  SharingProcessGroup(model::ProcessGroup& inner, ObjectExchange& exchange);

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend_name() const override { return inner_.backend_name(); }

  void reduce_scatter_sum(std::span<const float> input, std::span<float> output) override;
  void all_reduce_sum(std::span<float> data) override;
  void all_gather(std::span<const std::byte> input, std::span<std::byte> output) override;
  std::vector<std::vector<char>> all_gather_object(const std::vector<char>& bytes) override;
  std::shared_ptr<const model::GatheredObjects> all_gather_object_shared(
      const std::vector<char>& bytes) override;
  std::vector<char> broadcast_object(const std::vector<char>& bytes, int root) override;
  void barrier() override;

 private:
  model::ProcessGroup& inner_;
  ObjectExchange& exchange_;
};

}  // namespace ckptsim::sim
