#include "sim/local_world.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>
#include <utility>

#include "model/errors.h"
#include "sim/fiber.h"

namespace ckptsim::sim {

PeerAborted::PeerAborted(int aborting_rank, std::string reason, int observing_rank, CollectiveOp op,
                         uint64_t sequence_number)
    : std::runtime_error(fmt::format("rank {} in {} (sequence number {}): rank {} aborted: {}",
                                     observing_rank, op_name(op), sequence_number, aborting_rank,
                                     reason)),
      aborting_rank_(aborting_rank),
      reason_(std::move(reason)) {}

// ---------------------------------------------------------------------------------------
// ProcessGroup: the c10d base-class behavior, every collective fails loudly.

// ---------------------------------------------------------------------------------------
// LocalWorld

LocalWorld::LocalWorld(int world_size, Execution execution, ObjectGathers gathers)
    : world_size_(world_size), execution_(execution), gathers_(gathers) {
  if (world_size < 1 || world_size > kWorldSizeMax) {
    throw std::invalid_argument(
        fmt::format("world size {} is outside [1, kWorldSizeMax={}]", world_size, kWorldSizeMax));
  }
  departures_.resize(static_cast<std::size_t>(world_size));
  posted_by_rank_.resize(static_cast<std::size_t>(world_size));
  waiting_.resize(static_cast<std::size_t>(world_size));
  groups_of_rank_.resize(static_cast<std::size_t>(world_size));
  std::vector<int> everyone(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) everyone[static_cast<std::size_t>(r)] = r;
  new_group(std::move(everyone));
}

int LocalWorld::new_group(std::vector<int> ranks) {
  std::lock_guard lock(mu_);
  CKPTSIM_CHECK(!ran_, "LocalWorld::new_group after run()");
  CKPTSIM_CHECK(!ranks.empty(), "LocalWorld::new_group with no ranks");
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    CKPTSIM_CHECK(ranks[i] >= 0 && ranks[i] < world_size_ && (i == 0 || ranks[i - 1] < ranks[i]),
                  fmt::format("LocalWorld::new_group: rank {} out of order or outside world of "
                              "size {}",
                              ranks[i], world_size_));
  }
  const int id = static_cast<int>(groups_.size());
  for (const int r : ranks) groups_of_rank_[static_cast<std::size_t>(r)].push_back(id);
  Group g;
  g.calls.resize(ranks.size());
  g.members = std::move(ranks);
  groups_.push_back(std::move(g));
  return id;
}

int LocalWorld::group_count() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(groups_.size());
}

std::unique_ptr<LocalProcessGroup> LocalWorld::group(int group_id, int world_rank) {
  std::lock_guard lock(mu_);
  CKPTSIM_CHECK(group_id >= 0 && group_id < static_cast<int>(groups_.size()),
                fmt::format("no group {} in this world", group_id));
  const std::vector<int>& members = groups_[static_cast<std::size_t>(group_id)].members;
  const auto it = std::lower_bound(members.begin(), members.end(), world_rank);
  CKPTSIM_CHECK(it != members.end() && *it == world_rank,
                fmt::format("rank {} is not in group {}", world_rank, group_id));
  return std::make_unique<LocalProcessGroup>(*this, group_id,
                                             static_cast<int>(it - members.begin()),
                                             static_cast<int>(members.size()), world_rank);
}

void LocalWorld::abort(int rank, std::string reason) {
  CKPTSIM_CHECK(rank >= 0 && rank < world_size_,
                fmt::format("abort by rank {} outside world of size {}", rank, world_size_));
  std::lock_guard lock(mu_);
  if (!abort_) abort_ = AbortInfo{rank, std::move(reason)};
  cv_.notify_all();
}

void LocalWorld::depart(int rank, std::optional<std::string> error) {
  CKPTSIM_CHECK(rank >= 0 && rank < world_size_,
                fmt::format("depart by rank {} outside world of size {}", rank, world_size_));
  Departure departure;
  if (error) {
    departure.with_error = true;
    departure.origin_rank = rank;
    departure.reason = std::move(*error);
  }
  std::lock_guard lock(mu_);
  depart_locked(rank, std::move(departure));
}

void LocalWorld::depart_locked(int rank, Departure departure) {
  const auto r = static_cast<std::size_t>(rank);
  CKPTSIM_CHECK(!departures_[r].has_value(), fmt::format("rank {} departed twice", rank));
  departure.collectives_posted = posted_by_rank_[r];
  departures_[r] = std::move(departure);
  ++departed_count_;
  for (const int id : groups_of_rank_[r]) {
    Group& g = groups_[static_cast<std::size_t>(id)];
    const auto it = std::lower_bound(g.members.begin(), g.members.end(), rank);
    CKPTSIM_CHECK(!g.calls[static_cast<std::size_t>(it - g.members.begin())].has_value(),
                  fmt::format("rank {} departed while posted to a collective", rank));
    resolve_if_complete_locked(g);
  }
}

std::optional<AbortInfo> LocalWorld::abort_info() const {
  std::lock_guard lock(mu_);
  return abort_;
}

int LocalWorld::departed_count() const {
  std::lock_guard lock(mu_);
  return departed_count_;
}

int LocalWorld::blocked_count() const {
  std::lock_guard lock(mu_);
  return blocked_count_;
}

std::string LocalWorld::describe_locked(const Group& g, int rank) const {
  const Call& c = *g.calls[static_cast<std::size_t>(rank)];
  std::string text = fmt::format("rank {} called {} (sequence number {}, {} bytes", rank,
                                 op_name(c.op), c.sequence_number, c.checked_bytes);
  if (c.op == CollectiveOp::kBroadcastObject) text += fmt::format(", root {}", c.root);
  return text + ")";
}

LocalWorld::Resolution LocalWorld::resolution_from_departures_locked(const Group& g) const {
  // Lowest member that left with its own error, else with a propagated one, else normally.
  std::optional<int> primary, secondary, returned;
  for (auto it = g.members.rbegin(); it != g.members.rend(); ++it) {
    const int r = *it;
    const std::optional<Departure>& d = departures_[static_cast<std::size_t>(r)];
    if (!d) continue;
    if (!d->with_error) {
      returned = r;
    } else if (d->secondary) {
      secondary = r;
    } else {
      primary = r;
    }
  }
  Resolution resolution;
  if (primary || secondary) {
    const Departure& d = *departures_[static_cast<std::size_t>(primary ? *primary : *secondary)];
    resolution.kind = Resolution::Kind::kPeerFailed;
    resolution.rank = d.origin_rank;
    resolution.reason = d.reason;
  } else {
    CKPTSIM_CHECK(returned.has_value(), "resolving departures with no departed rank");
    resolution.kind = Resolution::Kind::kPeerReturned;
    resolution.rank = *returned;
    resolution.collectives = departures_[static_cast<std::size_t>(*returned)]->collectives_posted;
  }
  return resolution;
}

void LocalWorld::resolve_if_complete_locked(Group& g) {
  // After an explicit abort nothing resolves: every posted rank throws PeerAborted.
  if (abort_ || g.posted_count == 0) return;
  int departed = 0;
  for (const int r : g.members) departed += departures_[static_cast<std::size_t>(r)] ? 1 : 0;
  if (g.posted_count + departed < static_cast<int>(g.members.size())) return;
  if (departed > 0) {
    g.resolution = resolution_from_departures_locked(g);
  } else {
    g.resolution = Resolution{};
    g.resolution.mismatch = find_mismatch_locked(g);
    if (!g.resolution.mismatch.empty()) {
      g.resolution.kind = Resolution::Kind::kMismatch;
    } else {
      try {
        execute_locked(g);
      } catch (const std::exception& e) {
        // Only allocation can fail here; fail every posted rank rather than strand them.
        g.resolution.kind = Resolution::Kind::kPeerFailed;
        g.resolution.reason = fmt::format("collective failed inside the world: {}", e.what());
      }
    }
  }
  for (auto& c : g.calls) c.reset();
  g.posted_count = 0;
  ++g.generation;
  cv_.notify_all();
}

void LocalWorld::throw_resolution_locked(const Group& g, int rank, const Call& call) const {
  const Resolution& resolution_ = g.resolution;
  switch (resolution_.kind) {
    case Resolution::Kind::kOk:
      return;
    case Resolution::Kind::kMismatch:
      throw CollectiveMismatch(fmt::format("{} (seen by rank {})", resolution_.mismatch, rank));
    case Resolution::Kind::kPeerFailed:
      throw PeerAborted(resolution_.rank, resolution_.reason, rank, call.op, call.sequence_number);
    case Resolution::Kind::kPeerReturned:
      throw CollectiveMismatch(fmt::format(
          "collective mismatch: rank {} called {} (sequence number {}) but rank {} returned "
          "from its function after {} collectives and will never join",
          rank, op_name(call.op), call.sequence_number, resolution_.rank, resolution_.collectives));
  }
}

std::string LocalWorld::find_mismatch_locked(const Group& g) const {
  const Call& first = *g.calls[0];
  for (std::size_t r = 1; r < g.calls.size(); ++r) {
    const Call& c = *g.calls[r];
    if (c.op != first.op || c.sequence_number != first.sequence_number ||
        c.checked_bytes != first.checked_bytes || c.root != first.root) {
      return fmt::format("collective mismatch at rendezvous {}: {} but {}", g.generation,
                         describe_locked(g, 0), describe_locked(g, static_cast<int>(r)));
    }
  }
  return {};
}

namespace {

using Inputs = std::vector<std::span<const std::byte>>;
using Outputs = std::vector<std::span<std::byte>>;

// Whether no two of `spans` share a byte (empty spans share nothing).
bool pairwise_disjoint(std::vector<std::span<const std::byte>> spans) {
  std::erase_if(spans, [](const auto& s) { return s.empty(); });
  std::sort(spans.begin(), spans.end(),
            [](const auto& x, const auto& y) { return x.data() < y.data(); });
  for (std::size_t i = 1; i < spans.size(); ++i) {
    if (spans[i - 1].data() + spans[i - 1].size() > spans[i].data()) return false;
  }
  return true;
}

// Whether a collective may write every rank's output straight from the inputs, with no scratch
// (invariant 4): every rank's output lies in place (`in_place(r)`) within its own buffer
// (`buffers`), and those buffers are disjoint; or no output or input overlaps another.
bool writes_straight(const Inputs& in, const Outputs& out,
                     const std::function<bool(std::size_t)>& in_place, const Inputs& buffers) {
  bool all_in_place = true;
  for (std::size_t r = 0; r < in.size() && all_in_place; ++r) all_in_place = in_place(r);
  if (all_in_place) return pairwise_disjoint(buffers);
  Inputs spans = in;
  spans.insert(spans.end(), out.begin(), out.end());
  return pairwise_disjoint(std::move(spans));
}

// Megatron reduce-scatters a bucket into its own shard: rank r's output is segment r of its
// input. Then each segment is summed straight into its rank's output, in blocks, each element
// ((in_0 + in_1) + in_2) + ... (invariant 1): an output element is read as an input before it
// is written, and no other sum reads it. False (nothing written) where the buffers forbid it.
bool reduce_scatter_straight(const Inputs& in, const Outputs& out) {
  const std::size_t out_bytes = out[0].size();
  const std::size_t out_n = out_bytes / sizeof(float);
  if (!writes_straight(
          in, out, [&](std::size_t r) { return out[r].data() == in[r].data() + r * out_bytes; },
          in)) {
    return false;
  }
  auto floats = [&](std::size_t r) { return reinterpret_cast<const float*>(in[r].data()); };
  constexpr std::size_t kBlock = 2048;
  std::array<float, kBlock> sum{};
  for (std::size_t r = 0; r < in.size(); ++r) {
    auto* dst = reinterpret_cast<float*>(out[r].data());
    for (std::size_t begin = 0; begin < out_n; begin += kBlock) {
      const std::size_t len = std::min(kBlock, out_n - begin);
      const std::size_t at = r * out_n + begin;
      std::copy_n(floats(0) + at, len, sum.begin());
      for (std::size_t q = 1; q < in.size(); ++q) {
        const float* src = floats(q) + at;
        for (std::size_t i = 0; i < len; ++i) sum[i] += src[i];
      }
      std::copy_n(sum.begin(), len, dst + begin);
    }
  }
  return true;
}

// Megatron all-gathers each rank's shard view into its own bucket: rank r's input is segment r
// of its output. Then every other segment is copied straight in (a rank's own is in place
// already); no copy writes a byte another rank's input holds. False (nothing written) where the
// buffers forbid it.
bool all_gather_straight(const Inputs& in, const Outputs& out) {
  const std::size_t n = in[0].size();
  Inputs buffers(out.begin(), out.end());
  if (!writes_straight(
          in, out, [&](std::size_t r) { return in[r].data() == out[r].data() + r * n; }, buffers)) {
    return false;
  }
  for (std::size_t r = 0; r < in.size(); ++r) {
    for (std::size_t q = 0; q < in.size(); ++q) {
      std::byte* dst = out[r].data() + q * n;
      if (dst != in[q].data()) std::memcpy(dst, in[q].data(), n);
    }
  }
  return true;
}

// Every posted call's input and output, in rank order.
template <typename Calls>
std::pair<Inputs, Outputs> buffers_of(const Calls& calls) {
  std::pair<Inputs, Outputs> io;
  for (const auto& c : calls) {
    io.first.push_back(c->input);
    io.second.push_back(c->output);
  }
  return io;
}

}  // namespace

void LocalWorld::execute_locked(Group& g) {
  const std::size_t n_ranks = g.members.size();
  auto call = [&](std::size_t r) -> const Call& { return *g.calls[r]; };
  auto floats_in = [&](std::size_t r) {
    return reinterpret_cast<const float*>(call(r).input.data());
  };
  const auto buffers = [&] { return buffers_of(g.calls); };
  switch (call(0).op) {
    case CollectiveOp::kReduceScatterSum:
      if (const auto [in, out] = buffers(); reduce_scatter_straight(in, out)) return;
      [[fallthrough]];
    case CollectiveOp::kAllReduceSum: {
      // Sum everything into scratch first (invariant 4), rank by rank so that each element
      // is ((in_0 + in_1) + in_2) + ... (invariant 1).
      const std::size_t total = call(0).input.size() / sizeof(float);
      scratch_floats_.assign(floats_in(0), floats_in(0) + total);
      for (std::size_t r = 1; r < n_ranks; ++r) {
        const float* in = floats_in(r);
        for (std::size_t i = 0; i < total; ++i) scratch_floats_[i] += in[i];
      }
      const bool scatter = call(0).op == CollectiveOp::kReduceScatterSum;
      const std::size_t out_bytes = call(0).output.size();
      for (std::size_t r = 0; r < n_ranks; ++r) {
        const float* src = scratch_floats_.data() + (scatter ? r * (out_bytes / sizeof(float)) : 0);
        if (out_bytes > 0) std::memcpy(call(r).output.data(), src, out_bytes);
      }
      return;
    }
    case CollectiveOp::kAllGather: {
      const std::size_t n = call(0).input.size();
      if (n == 0) return;
      if (const auto [in, out] = buffers(); all_gather_straight(in, out)) return;
      scratch_bytes_.resize(n * n_ranks);
      for (std::size_t r = 0; r < n_ranks; ++r) {
        std::memcpy(scratch_bytes_.data() + r * n, call(r).input.data(), n);
      }
      for (std::size_t r = 0; r < n_ranks; ++r) {
        std::memcpy(call(r).output.data(), scratch_bytes_.data(), n * n_ranks);
      }
      return;
    }
    case CollectiveOp::kAllGatherObject: {
      // A rank asks for a copy (objects_output) or for the shared instance (shared_output);
      // both are this one op (invariant 7).
      std::vector<std::vector<char>> gathered;
      gathered.reserve(n_ranks);
      for (std::size_t r = 0; r < n_ranks; ++r) gathered.push_back(*call(r).object_input);
      for (std::size_t r = 0; r < n_ranks; ++r) {
        if (call(r).objects_output != nullptr) *call(r).objects_output = gathered;
      }
      std::shared_ptr<const model::GatheredObjects> shared;
      for (std::size_t r = 0; r < n_ranks; ++r) {
        if (call(r).shared_output == nullptr) continue;
        if (shared == nullptr || gathers_ == ObjectGathers::kCopiedPerRank) {
          shared = std::make_shared<const model::GatheredObjects>(
              gathers_ == ObjectGathers::kShared ? std::move(gathered) : gathered);
        }
        *call(r).shared_output = shared;
      }
      return;
    }
    case CollectiveOp::kBroadcastObject: {
      const std::vector<char> value = *call(static_cast<std::size_t>(call(0).root)).object_input;
      for (std::size_t r = 0; r < n_ranks; ++r) *call(r).object_output = value;
      return;
    }
    case CollectiveOp::kBarrier:
      return;
  }
  CKPTSIM_CHECK(false, "rendezvous with an unknown collective op");
}

void LocalWorld::rendezvous(int group_id, int rank, const Call& call) {
  std::unique_lock lock(mu_);
  if (abort_) {
    throw PeerAborted(abort_->rank, abort_->reason, rank, call.op, call.sequence_number);
  }
  Group& g = groups_[static_cast<std::size_t>(group_id)];
  const auto r = static_cast<std::size_t>(rank);
  const auto world_rank = static_cast<std::size_t>(g.members[r]);
  CKPTSIM_CHECK(!departures_[world_rank].has_value(),
                fmt::format("rank {} called {} after it departed", rank, op_name(call.op)));
  CKPTSIM_CHECK(
      !g.calls[r].has_value(),
      fmt::format("rank {} posted twice to one rendezvous: two threads share a rank", rank));
  g.calls[r] = call;
  ++g.posted_count;
  ++posted_by_rank_[world_rank];
  const uint64_t generation = g.generation;
  resolve_if_complete_locked(g);
  if (g.generation == generation) {
    ++blocked_count_;
    if (execution_ == Execution::kThreads) {
      cv_.wait(lock, [&] { return g.generation != generation || abort_.has_value(); });
    } else {
      // run_fibers resumes this rank once the rendezvous resolved or the world was aborted.
      waiting_[world_rank] = {group_id, generation};
      lock.unlock();
      Fiber::suspend();
      lock.lock();
      CKPTSIM_CHECK(g.generation != generation || abort_.has_value(),
                    fmt::format("rank {} resumed in an unresolved rendezvous", rank));
    }
    --blocked_count_;
    if (g.generation == generation) {
      // Explicit abort: this rendezvous will never resolve; withdraw to keep the state whole.
      g.calls[r].reset();
      --g.posted_count;
      throw PeerAborted(abort_->rank, abort_->reason, rank, call.op, call.sequence_number);
    }
  }
  // The resolution cannot change before every member, this one included, posted again or left.
  throw_resolution_locked(g, rank, call);
}

std::vector<RankOutcome> LocalWorld::run(const std::function<void(ProcessGroup&)>& f) {
  {
    std::lock_guard lock(mu_);
    CKPTSIM_CHECK(!ran_, "LocalWorld::run called twice on one world");
    ran_ = true;
  }
  std::vector<RankOutcome> outcomes(static_cast<std::size_t>(world_size_));
  for (int rank = 0; rank < world_size_; ++rank) {
    outcomes[static_cast<std::size_t>(rank)].rank = rank;
  }
  auto body = [&](int rank) noexcept {
    RankOutcome& outcome = outcomes[static_cast<std::size_t>(rank)];
    Departure departure;
    try {
      LocalProcessGroup pg(*this, rank);
      f(pg);
    } catch (const PeerAborted& e) {
      outcome.error = std::current_exception();
      outcome.error_message = e.what();
      departure = Departure{true, true, e.aborting_rank(), e.reason(), 0};
    } catch (const std::exception& e) {
      outcome.error = std::current_exception();
      outcome.error_message = model::exception_text(e);
      departure = Departure{true, false, rank, outcome.error_message, 0};
    } catch (...) {
      outcome.error = std::current_exception();
      outcome.error_message = "exception not derived from std::exception";
      departure = Departure{true, false, rank, outcome.error_message, 0};
    }
    std::lock_guard lock(mu_);
    depart_locked(rank, std::move(departure));
  };

  if (execution_ == Execution::kThreads) {
    run_threads(body);
  } else {
    run_fibers(body);
  }
  return outcomes;
}

void LocalWorld::run_threads(const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size_ - 1));
  try {
    for (int rank = 1; rank < world_size_; ++rank) threads.emplace_back(body, rank);
  } catch (const std::exception& e) {
    // Started ranks may be blocked in a collective; wake them before joining.
    abort(static_cast<int>(threads.size()) + 1,
          fmt::format("could not start the thread of this rank: {}", e.what()));
    for (auto& t : threads) t.join();
    throw;
  }
  body(0);
  for (auto& t : threads) t.join();
}

void LocalWorld::run_fibers(const std::function<void(int)>& body) {
  std::vector<std::unique_ptr<Fiber>> fibers;
  fibers.reserve(static_cast<std::size_t>(world_size_));
  for (int rank = 0; rank < world_size_; ++rank) {
    fibers.push_back(std::make_unique<Fiber>([&body, rank] { body(rank); }));
  }
  std::deque<int> runnable;
  for (int rank = 0; rank < world_size_; ++rank) runnable.push_back(rank);
  std::vector<int> blocked;  // suspended in a pending rendezvous, in the order they blocked
  std::exception_ptr start_error;
  while (!runnable.empty()) {
    const int rank = runnable.front();
    runnable.pop_front();
    Fiber& fiber = *fibers[static_cast<std::size_t>(rank)];
    try {
      fiber.resume();
    } catch (const std::exception& e) {
      // body catches everything, so only the fiber machinery throws, before the rank ran (no
      // stack could be mapped). As in run_threads: abort, let the others end, rethrow.
      if (!start_error) start_error = std::current_exception();
      abort(rank, fmt::format("could not start the fiber of this rank: {}", e.what()));
    }
    {
      // The ranks blocked before this one whose rendezvous resolved while it ran (only one
      // can have: this rank took part in it) run next, in rank order.
      std::lock_guard lock(mu_);
      const auto resolved = [&](int b) {
        const auto& [group_id, generation] = waiting_[static_cast<std::size_t>(b)];
        return abort_.has_value() ||
               groups_[static_cast<std::size_t>(group_id)].generation != generation;
      };
      const auto first = std::stable_partition(blocked.begin(), blocked.end(),
                                               [&](int b) { return !resolved(b); });
      std::vector<int> ready(first, blocked.end());
      blocked.erase(first, blocked.end());
      std::sort(ready.begin(), ready.end());
      runnable.insert(runnable.end(), ready.begin(), ready.end());
    }
    // A fiber that did not finish is suspended in the next rendezvous.
    if (fiber.started() && !fiber.finished()) blocked.push_back(rank);
  }
  // Every rank posted to a rendezvous resolves it or leaves (invariant 2), so a blocked rank
  // is always freed by the last one to arrive: none can be left here.
  CKPTSIM_CHECK(blocked.empty(),
                fmt::format("{} ranks blocked with no rank left to free them", blocked.size()));
  if (start_error) std::rethrow_exception(start_error);
}

// ---------------------------------------------------------------------------------------
// LocalProcessGroup

namespace {

void check_payload(std::size_t bytes, CollectiveOp op) {
  CKPTSIM_CHECK(bytes <= kCollectiveBytesMax,
                fmt::format("{} payload of {} bytes exceeds kCollectiveBytesMax={}", op_name(op),
                            bytes, kCollectiveBytesMax));
}

}  // namespace

LocalProcessGroup::LocalProcessGroup(LocalWorld& world, int rank)
    : world_(world), rank_(rank), size_(world.size()), world_rank_(rank) {
  CKPTSIM_CHECK(rank >= 0 && rank < world.size(),
                fmt::format("rank {} outside world of size {}", rank, world.size()));
}

LocalProcessGroup::LocalProcessGroup(LocalWorld& world, int group_id, int rank, int size,
                                     int world_rank)
    : world_(world), group_(group_id), rank_(rank), size_(size), world_rank_(world_rank) {}

void LocalProcessGroup::reduce_scatter_sum(std::span<const float> input, std::span<float> output) {
  LocalWorld::Call call;
  call.op = CollectiveOp::kReduceScatterSum;
  call.sequence_number = next_sequence_number();
  CKPTSIM_CHECK(input.size() == output.size() * static_cast<std::size_t>(size()),
                fmt::format("reduce_scatter_sum on rank {}: input of {} elements is not world "
                            "size {} times output of {}",
                            rank_, input.size(), size(), output.size()));
  check_payload(input.size_bytes(), call.op);
  call.checked_bytes = input.size_bytes();
  call.input = std::as_bytes(input);
  call.output = std::as_writable_bytes(output);
  world_.rendezvous(group_, rank_, call);
}

void LocalProcessGroup::all_reduce_sum(std::span<float> data) {
  LocalWorld::Call call;
  call.op = CollectiveOp::kAllReduceSum;
  call.sequence_number = next_sequence_number();
  check_payload(data.size_bytes(), call.op);
  call.checked_bytes = data.size_bytes();
  call.input = std::as_bytes(data);
  call.output = std::as_writable_bytes(data);
  world_.rendezvous(group_, rank_, call);
}

void LocalProcessGroup::all_gather(std::span<const std::byte> input, std::span<std::byte> output) {
  LocalWorld::Call call;
  call.op = CollectiveOp::kAllGather;
  call.sequence_number = next_sequence_number();
  CKPTSIM_CHECK(output.size() == input.size() * static_cast<std::size_t>(size()),
                fmt::format("all_gather on rank {}: output of {} bytes is not world size {} "
                            "times input of {}",
                            rank_, output.size(), size(), input.size()));
  check_payload(input.size(), call.op);
  call.checked_bytes = input.size();
  call.input = input;
  call.output = output;
  world_.rendezvous(group_, rank_, call);
}

std::vector<std::vector<char>> LocalProcessGroup::all_gather_object(
    const std::vector<char>& bytes) {
  LocalWorld::Call call;
  call.op = CollectiveOp::kAllGatherObject;
  call.sequence_number = next_sequence_number();
  check_payload(bytes.size(), call.op);
  std::vector<std::vector<char>> gathered;
  call.object_input = &bytes;
  call.objects_output = &gathered;
  world_.rendezvous(group_, rank_, call);
  return gathered;
}

std::shared_ptr<const model::GatheredObjects> LocalProcessGroup::all_gather_object_shared(
    const std::vector<char>& bytes) {
  LocalWorld::Call call;
  call.op = CollectiveOp::kAllGatherObject;
  call.sequence_number = next_sequence_number();
  check_payload(bytes.size(), call.op);
  std::shared_ptr<const model::GatheredObjects> gathered;
  call.object_input = &bytes;
  call.shared_output = &gathered;
  world_.rendezvous(group_, rank_, call);
  return gathered;
}

std::vector<char> LocalProcessGroup::broadcast_object(const std::vector<char>& bytes, int root) {
  LocalWorld::Call call;
  call.op = CollectiveOp::kBroadcastObject;
  call.sequence_number = next_sequence_number();
  CKPTSIM_CHECK(root >= 0 && root < size(),
                fmt::format("broadcast_object on rank {}: root {} outside world of size {}", rank_,
                            root, size()));
  if (root == rank_) check_payload(bytes.size(), call.op);
  std::vector<char> received;
  call.root = root;
  call.object_input = &bytes;
  call.object_output = &received;
  world_.rendezvous(group_, rank_, call);
  return received;
}

void LocalProcessGroup::barrier() {
  LocalWorld::Call call;
  call.op = CollectiveOp::kBarrier;
  call.sequence_number = next_sequence_number();
  world_.rendezvous(group_, rank_, call);
}

void rethrow_root_cause(const std::vector<RankOutcome>& outcomes) {
  const RankOutcome* first_failure = nullptr;
  for (const RankOutcome& outcome : outcomes) {
    if (outcome.ok()) continue;
    if (first_failure == nullptr) first_failure = &outcome;
    try {
      std::rethrow_exception(outcome.error);
    } catch (const PeerAborted&) {
      continue;
    } catch (...) {
      throw;
    }
  }
  if (first_failure != nullptr) std::rethrow_exception(first_failure->error);
}

}  // namespace ckptsim::sim
