// Collectives for N simulated ranks that live in ONE process, each rank a fiber on the calling
// thread (sim/fiber.h) or, on request, an OS thread of its own, so that the model code reads
// like upstream Python: a collective is a plain blocking call.
//
// ProcessGroup is the interface, modeled on PyTorch c10d Backend.hpp: every collective of the
// base class throws CollectiveNotImplemented ("<op> is not implemented by backend <name>")
// unless a backend overrides it, and every rank counts the collectives it issues (its
// sequence number) so that ranks whose collectives are out of step are caught, not mixed.
//
// LocalWorld owns the rendezvous state shared by N ranks; LocalProcessGroup is one rank's
// view of it. A collective is a rendezvous: each rank posts a description of its call
// (sequence number, op, checked byte size, root) and blocks; the last rank to arrive checks
// that all descriptions agree, performs the whole collective for every rank (serially, under
// the world's mutex: simulated buckets are small), and wakes the others. Nobody reads a
// peer's buffers after that peer has returned, because every peer is blocked until the work
// is done.
//
// Invariants:
//   1. Results never depend on thread timing. Sums are evaluated left to right in rank
//      order, ((in_0 + in_1) + in_2) + ..., in fp32; gathers are concatenated in rank order.
//   2. No collective hangs, and how a failure is reported does not depend on timing. A rank
//      leaves the world when its function returns or throws (LocalWorld::depart; run() does
//      it). A rendezvous resolves once every rank has either posted to it or left. If any rank
//      has left, no data moves and every posted rank throws: PeerAborted naming the
//      lowest-numbered rank that left with an error (or that error's own origin, if it was
//      itself a PeerAborted), else CollectiveMismatch naming the lowest rank that returned
//      normally. A rank's path up to a collective depends only on earlier collectives (given
//      no state shared between ranks outside the world), so which ranks leave and which post
//      is fixed by the inputs, and so are these outcomes.
//      LocalWorld::abort is the one timing-dependent exit, meant for a harness that stops a
//      world from outside: every rank blocked in, or later entering, a collective throws
//      PeerAborted at once.
//   3. Ranks never silently mix different collectives. If the ranks meeting at a rendezvous
//      disagree on (sequence number, op, checked byte size, root), every one of them throws
//      CollectiveMismatch naming the first disagreeing rank's call and rank 0's call, and no
//      output buffer is written.
//   4. Output buffers may alias the input buffer of the same rank (Megatron reduce-scatters
//      a bucket into a view of itself and all-gathers a shard view into its bucket), or any
//      other buffer: every rank gets what the inputs held when the collective began. Where every
//      rank's output lies in place (that shard of its own bucket) or no two buffers overlap, a
//      reduce-scatter or all-gather writes the outputs straight from the inputs; otherwise it
//      computes into world-owned scratch before writing any output.
//   5. World size is in [1, kWorldSizeMax]; a collective's per-rank payload is at most
//      kCollectiveBytesMax.
//   6. Execution::kFibers runs the ranks in a fixed order: rank 0 until it blocks, then every
//      other runnable rank in rank order, round after round; a rank blocked in a collective
//      becomes runnable once the collective resolves. Results are the same under kThreads
//      (invariant 1); only kFibers makes the interleaving itself repeatable.
//   7. Under ObjectGathers::kShared (the default) every rank that calls
//      all_gather_object_shared in one rendezvous gets the same GatheredObjects instance
//      (ProcessGroup invariant 4): one copy of every rank's bytes, not one per rank (at DP 4096
//      the save's metadata gather would be 4096 x 4096 entries). It is one rendezvous of op
//      all_gather_object, so it meets a peer's all_gather_object and fails exactly as that does.
//      kCopiedPerRank gives each rank its own instance (for tests that show sharing changes
//      nothing).
//   8. Subgroups (new_group) rendezvous on their own: a collective of group g resolves once
//      every rank of g has posted to it or left the world, whatever the ranks outside g do;
//      invariants 1-4 and 7 hold within each group, and ranks are the group's ("rank 0" of a
//      group is its first world rank). A rank may be blocked in one group's collective while
//      other groups' collectives resolve; under kFibers a resolved rendezvous's ranks run next,
//      in ascending world rank (invariant 6, per group).
//
// Threading: under kThreads a LocalWorld is shared by its ranks' threads; under kFibers every
// rank runs on the thread that called run(). abort() may come from any thread. A
// LocalProcessGroup is used by its rank only. The LocalWorld must outlive every
// LocalProcessGroup on it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "model/process_group.h"

namespace ckptsim::sim {

// The interface lives in model/ (the model sees only it, as Megatron sees torch.distributed).
using model::CollectiveNotImplemented;
using model::CollectiveOp;
using model::op_name;
using model::ProcessGroup;

inline constexpr int kWorldSizeMax = 4096;
// Per rank, per collective. The simulator moves buckets of a few thousand elements; a payload
// this large is a bug in a scenario generator, not a workload.
inline constexpr std::size_t kCollectiveBytesMax = std::size_t{1} << 30;

// Another rank aborted the world; this rank's collective cannot complete.
class PeerAborted : public std::runtime_error {
 public:
  PeerAborted(int aborting_rank, std::string reason, int observing_rank, CollectiveOp op,
              uint64_t sequence_number);
  int aborting_rank() const { return aborting_rank_; }
  const std::string& reason() const { return reason_; }

 private:
  int aborting_rank_;
  std::string reason_;
};

// Ranks met at a rendezvous with different calls, or a rank called a collective that a peer,
// having already returned, can never join.
class CollectiveMismatch : public std::runtime_error {
 public:
  explicit CollectiveMismatch(const std::string& message) : std::runtime_error(message) {}
};

// How one rank's function ended in LocalWorld::run.
struct RankOutcome {
  int rank = 0;
  std::exception_ptr error;   // null when the function returned normally
  std::string error_message;  // what() of the exception, or a note for a non-std exception

  bool ok() const { return error == nullptr; }
};

struct AbortInfo {
  int rank = 0;
  std::string reason;
};

class LocalProcessGroup;

// How LocalWorld::run runs the ranks.
enum class Execution {
  kFibers,   // every rank a fiber on the calling thread, switched at collectives (invariant 6)
  kThreads,  // one OS thread per rank, rank 0 on the calling thread
};

// What all_gather_object_shared hands the ranks of one rendezvous (invariant 7).
enum class ObjectGathers {
  kShared,        // one GatheredObjects for all of them
  kCopiedPerRank  // one each, as a separate process per rank would have
};

class LocalWorld {
 public:
  // REQUIRES: 1 <= world_size <= kWorldSizeMax, else throws std::invalid_argument.
  explicit LocalWorld(int world_size, Execution execution = Execution::kFibers,
                      ObjectGathers gathers = ObjectGathers::kShared);
  LocalWorld(const LocalWorld&) = delete;
  LocalWorld& operator=(const LocalWorld&) = delete;

  int size() const { return world_size_; }

  // Runs f on every rank (as the world's Execution says), each with its own
  // LocalProcessGroup, and departs each rank when its f returns or throws (with the
  // exception's message as the error), so peers throw instead of hanging (invariant 2).
  // Returns when every rank has departed (joining every thread under kThreads).
  // Returns one outcome per rank, in rank order (outcomes[r].rank == r).
  // REQUIRES: called at most once per world.
  std::vector<RankOutcome> run(const std::function<void(ProcessGroup&)>& f);

  // Aborts the world at once on behalf of `rank` (the first abort wins) and wakes every
  // blocked rank. Timing-dependent by nature (invariant 2): for harnesses, not model code.
  // REQUIRES: 0 <= rank < size(). Callable from any thread.
  void abort(int rank, std::string reason);

  // `rank` will issue no more collectives: its function returned (error == nullopt) or threw.
  // REQUIRES: 0 <= rank < size(); rank has not departed; rank is not inside a collective.
  void depart(int rank, std::optional<std::string> error = std::nullopt);

  // Mirrors torch.distributed.new_group(ranks): a group of some of the world's ranks with
  // collectives of its own (invariant 8). Returns its id, for group(). Group 0 is the world.
  // REQUIRES: before run(); `ranks` non-empty, ascending, each in [0, size()).
  int new_group(std::vector<int> ranks);
  // Rank `world_rank`'s handle on group `group_id`: its rank() is its index in the group's
  // ranks. REQUIRES: the group exists and holds world_rank; called by that rank's own function.
  std::unique_ptr<LocalProcessGroup> group(int group_id, int world_rank);
  int group_count() const;

  // The explicit abort, if any (not departures with an error).
  std::optional<AbortInfo> abort_info() const;
  // Ranks that have departed (returned or thrown).
  int departed_count() const;
  // Ranks currently blocked in a collective, waiting for peers (for tests that must reach a
  // state where peers are blocked before failing a rank).
  int blocked_count() const;
  Execution execution() const { return execution_; }

 private:
  friend class LocalProcessGroup;

  // One rank's side of a rendezvous. Pointers refer to the caller's buffers, which stay
  // valid because the caller is blocked until the rendezvous ends.
  struct Call {
    CollectiveOp op = CollectiveOp::kBarrier;
    uint64_t sequence_number = 0;
    std::size_t checked_bytes = 0;  // compared across ranks; 0 where sizes may differ
    int root = -1;                  // broadcast only
    std::span<const std::byte> input;
    std::span<std::byte> output;
    const std::vector<char>* object_input = nullptr;
    std::vector<std::vector<char>>* objects_output = nullptr;                // all_gather_object
    std::shared_ptr<const model::GatheredObjects>* shared_output = nullptr;  // ..._shared
    std::vector<char>* object_output = nullptr;                              // broadcast_object
  };

  struct Departure {
    bool with_error = false;
    bool secondary = false;  // the error was a PeerAborted: origin_rank/reason are its origin
    int origin_rank = 0;
    std::string reason;
    uint64_t collectives_posted = 0;
  };

  // How the latest resolved rendezvous ended, for every rank posted to it.
  struct Resolution {
    enum class Kind { kOk, kMismatch, kPeerFailed, kPeerReturned };
    Kind kind = Kind::kOk;
    std::string mismatch;      // kMismatch
    int rank = 0;              // kPeerFailed: origin of the error; kPeerReturned: that rank
    std::string reason;        // kPeerFailed
    uint64_t collectives = 0;  // kPeerReturned: collectives that rank had posted
  };

  // One group's rendezvous state. Group 0 is the world.
  struct Group {
    std::vector<int> members;                // world ranks, ascending
    std::vector<std::optional<Call>> calls;  // indexed by group rank; set while posted
    int posted_count = 0;
    uint64_t generation = 0;  // rendezvous resolved so far
    Resolution resolution;    // of the latest resolved rendezvous
  };

  // Posts `call` for group rank `rank` of group `g` and returns when the collective is
  // complete for it. Throws PeerAborted or CollectiveMismatch (invariants 2, 3).
  void rendezvous(int g, int rank, const Call& call);

  // run()'s two ways of running `body` (which never throws) on every rank.
  void run_threads(const std::function<void(int)>& body);
  void run_fibers(const std::function<void(int)>& body);

  // REQUIRES (all *_locked): mu_ held.
  void depart_locked(int rank, Departure departure);
  // Resolves group g's pending rendezvous if every member has posted or departed (inv. 2).
  void resolve_if_complete_locked(Group& g);
  Resolution resolution_from_departures_locked(const Group& g) const;
  void throw_resolution_locked(const Group& g, int rank, const Call& call) const;
  std::string find_mismatch_locked(const Group& g) const;
  void execute_locked(Group& g);
  std::string describe_locked(const Group& g, int rank) const;

  const int world_size_;
  const Execution execution_;
  const ObjectGathers gathers_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Group> groups_;
  std::vector<std::vector<int>> groups_of_rank_;  // world rank -> ids of the groups it is in
  // World rank -> (group, generation) of the rendezvous it is blocked in (kFibers).
  std::vector<std::pair<int, uint64_t>> waiting_;
  std::vector<std::optional<Departure>> departures_;  // indexed by world rank
  std::vector<uint64_t> posted_by_rank_;              // collectives each world rank has posted
  int departed_count_ = 0;
  int blocked_count_ = 0;
  std::optional<AbortInfo> abort_;
  std::vector<float> scratch_floats_;
  std::vector<std::byte> scratch_bytes_;
  bool ran_ = false;
};

// One rank's handle on a LocalWorld.
class LocalProcessGroup final : public ProcessGroup {
 public:
  // The world group. REQUIRES: 0 <= rank < world.size(); world outlives this object.
  LocalProcessGroup(LocalWorld& world, int rank);
  // Group `group_id` (LocalWorld::group). REQUIRES: rank is the group rank of world_rank.
  LocalProcessGroup(LocalWorld& world, int group_id, int rank, int size, int world_rank);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // This rank in the world (its rank() where the group is the world).
  int world_rank() const { return world_rank_; }
  std::string backend_name() const override { return "local"; }

  void reduce_scatter_sum(std::span<const float> input, std::span<float> output) override;
  void all_reduce_sum(std::span<float> data) override;
  void all_gather(std::span<const std::byte> input, std::span<std::byte> output) override;
  std::vector<std::vector<char>> all_gather_object(const std::vector<char>& bytes) override;
  std::shared_ptr<const model::GatheredObjects> all_gather_object_shared(
      const std::vector<char>& bytes) override;
  std::vector<char> broadcast_object(const std::vector<char>& bytes, int root) override;
  void barrier() override;

 private:
  LocalWorld& world_;
  int group_ = 0;
  int rank_;
  int size_;
  int world_rank_;
};

// Rethrows the exception that explains a failed run: the first (in rank order) that is not
// a PeerAborted, else the first one. Returns normally when every rank succeeded.
void rethrow_root_cause(const std::vector<RankOutcome>& outcomes);

}  // namespace ckptsim::sim
