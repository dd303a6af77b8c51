// Tests of sim/local_world.h: LocalWorld / LocalProcessGroup collectives.
//
// Expected values come from a sequential computation written here from the header's
// contract (rank-order left-to-right fp32 sums, rank-order concatenation), never from the
// code under test. Scheduling is shaken by per-rank yields and sleeps; nothing asserts on
// time. A hang is caught by a guard that ends the test binary after kHangGuard with a
// message naming the test (a deadlock is a failure, not a slow pass).
//
// Mutations each test catches (deliberately broken variants of process_group.cpp):
//   ReduceScatterSum / AllReduceSum   sum in arrival order instead of rank order [tried:
//                                     caught at world sizes 3, 5, 8; sizes 1 and 2 cannot see
//                                     it, fp32 addition of two terms commutes]; wrong slice
//                                     given to a rank.
//   AllGather / AllGatherObject       concatenation in arrival order; missing rank.
//   AllGatherObjectShared             a shared instance per rank instead of one [tried];
//                                     a rendezvous mixing shared and copying ranks refused.
//   CopiedPerRankGivesEachRankItsOwnInstance  kCopiedPerRank ignored (one instance).
//   SharedGatherFailsAsAllGatherObjectDoes    the shared gather posted as another op, or
//                                     completing past a failed peer.
//   BroadcastObject                   root ignored (rank 0's bytes broadcast).
//   AliasedOutputs                    accumulating straight into the outputs instead of
//                                     scratch (Megatron's in-place bucket views) [tried: caught,
//                                     also by AllReduceSum, which is in place by nature].
//   FailedRankWakesBlockedRanks       a failing rank's departure does not resolve the pending
//                                     rendezvous / wake waiters [tried: caught, the hang guard
//                                     fired]; PeerAborted names the wrong rank.
//   FailureSeenOnEntry                a rank entering after a peer failed waits forever.
//   FailureNamesLowestFailingRank     first failure wins (timing-dependent report) instead of
//                                     the lowest failing rank [tried: caught].
//   ExternalAbortWakesBlockedRanks    abort() does not notify waiters (hang guard fires); a
//                                     departure after an abort still resolving the rendezvous
//                                     (peers report CollectiveMismatch, not the abort) [found
//                                     during development: this test caught it].
//   ExternalAbortFailsEveryRank       a collective completing in an aborted world (neither the
//                                     entry check nor the resolve guard looks at the abort).
//   MismatchedOps                     a barrier meeting an all_gather not reported (or the
//                                     message not naming both calls).
//   MismatchedOpsOfEqualSize          ops not compared: all_reduce_sum and all_gather of
//                                     the same size silently mixed [tried: caught].
//   MismatchedSizes                   byte sizes not compared [tried: caught]; outputs written
//                                     before the check.
//   MismatchedSequenceNumbers         sequence numbers not compared.
//   MismatchedBroadcastRoots          roots not compared.
//   RankReturnedEarly                 departure not tracked: the peer waits forever.
//   LocalPreconditionAbortsPeers      size precondition not checked (reads past a buffer).
//   WorldSizeLimits                   limit not enforced.
//   BaseClassFailsLoudly              a default collective that silently does nothing.
//   SequenceNumbersCountCollectives   a collective that does not take a sequence number.
//   RethrowRootCause                  PeerAborted reported instead of the original error.
//   RanksRunOnTheCallingThread        kFibers falling back to a thread per rank [not tried:
//                                     kThreads runs ranks 1.. on other threads by design].
//   InterleavingIsFixed               freed ranks resumed in the order they blocked, or the
//                                     completing rank suspended after a collective.
//   LargestWorldReduces               a limit below kWorldSizeMax in the fiber scheduler (a
//                                     fixed-size run queue), a stack pool that runs dry [not
//                                     tried].
//   Subgroups.*                       a group's rendezvous waiting for every world rank (hangs),
//                                     ranks of other groups woken (fibers resumed in an
//                                     unresolved rendezvous), a failure not reaching the
//                                     failed rank's group; see the tests.
//   AbortFromAnotherThread            run_fibers not looking at the abort between fibers
//                                     [tried: caught, the test binary stops: "terminate called
//                                     without an active exception", fibers left suspended].
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model/errors.h"
#include "sim/local_world.h"

namespace ckptsim::sim {
namespace {

constexpr uint64_t kSeed = 0x70726f6367726f75ULL;
constexpr int kReps = 40;
constexpr auto kHangGuard = std::chrono::seconds(120);

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t seed_of(int rep, int rank) { return mix(mix(kSeed, uint64_t(rep)), uint64_t(rank)); }

// Runs world.run(f) on a helper thread; if it does not return within kHangGuard, the
// collectives deadlocked: report and end the process (the hung threads cannot be joined).
std::vector<RankOutcome> run_guarded(LocalWorld& world,
                                     const std::function<void(ProcessGroup&)>& f) {
  auto done = std::async(std::launch::async, [&] { return world.run(f); });
  if (done.wait_for(kHangGuard) != std::future_status::ready) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr, "HANG in %s.%s: collectives did not return\n", info->test_suite_name(),
                 info->name());
    std::fflush(stderr);
    std::_Exit(3);
  }
  return done.get();
}

// Shakes the arrival order: none, random yields, reverse rank order, random sleeps.
void perturb(std::mt19937_64& rng, int rep, int rank, int world_size) {
  switch (rep % 4) {
    case 0:
      return;
    case 1:
      for (uint64_t i = rng() % 64; i > 0; --i) std::this_thread::yield();
      return;
    case 2:
      std::this_thread::sleep_for(std::chrono::microseconds(150 * (world_size - 1 - rank)));
      return;
    default:
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
      return;
  }
}

// Floats spread over 48 binades, so that the order of fp32 additions changes the result.
std::vector<float> float_input(int rep, int rank, std::size_t n) {
  std::mt19937_64 rng(seed_of(rep, rank));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-24, 24);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(unit(rng), exponent(rng));
  return v;
}

std::vector<char> object_input(int rep, int rank) {
  std::mt19937_64 rng(seed_of(rep, rank) ^ 0x0b1ec7);
  std::vector<char> v(static_cast<std::size_t>((3 * rank + rep) % 6));  // includes empty
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b;
  for (float x : v) b.push_back(std::bit_cast<uint32_t>(x));
  return b;
}

// Rank-order, left-to-right fp32 sum of every rank's input (header invariant 1).
std::vector<float> sequential_sum(int rep, int world_size, std::size_t total) {
  std::vector<float> sum = float_input(rep, 0, total);
  for (int r = 1; r < world_size; ++r) {
    const std::vector<float> in = float_input(rep, r, total);
    for (std::size_t i = 0; i < total; ++i) sum[i] = sum[i] + in[i];
  }
  return sum;
}

void expect_all_ok(const std::vector<RankOutcome>& outcomes) {
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    EXPECT_EQ(outcomes[r].rank, static_cast<int>(r));
    EXPECT_TRUE(outcomes[r].ok()) << "rank " << r << ": " << outcomes[r].error_message;
  }
}

template <typename E>
bool holds(const RankOutcome& outcome) {
  if (outcome.ok()) return false;
  try {
    std::rethrow_exception(outcome.error);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

std::size_t elements_per_rank(int rep) { return 1 + static_cast<std::size_t>(rep % 7); }

// Every collective test runs under both executions (header invariant 6: same results).
class CollectivesTest : public ::testing::TestWithParam<std::tuple<int, Execution>> {
 protected:
  int world_size() const { return std::get<0>(GetParam()); }
  std::size_t n_ranks() const { return static_cast<std::size_t>(world_size()); }
  Execution execution() const { return std::get<1>(GetParam()); }
};

TEST_P(CollectivesTest, ReduceScatterSum) {
  SCOPED_TRACE("seed=" + std::to_string(kSeed));
  LocalWorld world(world_size(), execution());
  std::vector<std::vector<std::vector<float>>> got(n_ranks());
  expect_all_ok(run_guarded(world, [&](ProcessGroup& pg) {
    std::mt19937_64 rng(seed_of(-1, pg.rank()));
    for (int rep = 0; rep < kReps; ++rep) {
      const std::size_t n = elements_per_rank(rep);
      const std::vector<float> input = float_input(rep, pg.rank(), n * n_ranks());
      std::vector<float> output(n);
      perturb(rng, rep, pg.rank(), pg.size());
      pg.reduce_scatter_sum(input, output);
      got[static_cast<std::size_t>(pg.rank())].push_back(output);
    }
  }));
  for (int rep = 0; rep < kReps; ++rep) {
    const std::size_t n = elements_per_rank(rep);
    const std::vector<float> sum = sequential_sum(rep, world_size(), n * n_ranks());
    for (std::size_t r = 0; r < n_ranks(); ++r) {
      const std::vector<float> want(sum.begin() + long(r * n), sum.begin() + long((r + 1) * n));
      ASSERT_EQ(bits(got[r][std::size_t(rep)]), bits(want)) << "rep " << rep << " rank " << r;
    }
  }
}

TEST_P(CollectivesTest, AllReduceSum) {
  SCOPED_TRACE("seed=" + std::to_string(kSeed));
  LocalWorld world(world_size(), execution());
  std::vector<std::vector<std::vector<float>>> got(n_ranks());
  expect_all_ok(run_guarded(world, [&](ProcessGroup& pg) {
    std::mt19937_64 rng(seed_of(-2, pg.rank()));
    for (int rep = 0; rep < kReps; ++rep) {
      std::vector<float> data = float_input(rep, pg.rank(), elements_per_rank(rep));
      perturb(rng, rep, pg.rank(), pg.size());
      pg.all_reduce_sum(data);
      got[static_cast<std::size_t>(pg.rank())].push_back(data);
    }
  }));
  for (int rep = 0; rep < kReps; ++rep) {
    const std::vector<float> want = sequential_sum(rep, world_size(), elements_per_rank(rep));
    for (std::size_t r = 0; r < n_ranks(); ++r) {
      ASSERT_EQ(bits(got[r][std::size_t(rep)]), bits(want)) << "rep " << rep << " rank " << r;
    }
  }
}

TEST_P(CollectivesTest, AllGather) {
  SCOPED_TRACE("seed=" + std::to_string(kSeed));
  LocalWorld world(world_size(), execution());
  std::vector<std::vector<std::vector<float>>> got(n_ranks());
  expect_all_ok(run_guarded(world, [&](ProcessGroup& pg) {
    std::mt19937_64 rng(seed_of(-3, pg.rank()));
    for (int rep = 0; rep < kReps; ++rep) {
      const std::size_t n = elements_per_rank(rep);
      const std::vector<float> input = float_input(rep, pg.rank(), n);
      std::vector<float> output(n * n_ranks());
      perturb(rng, rep, pg.rank(), pg.size());
      pg.all_gather_values<float>(input, output);
      got[static_cast<std::size_t>(pg.rank())].push_back(output);
    }
  }));
  for (int rep = 0; rep < kReps; ++rep) {
    std::vector<float> want;
    for (int r = 0; r < world_size(); ++r) {
      const std::vector<float> in = float_input(rep, r, elements_per_rank(rep));
      want.insert(want.end(), in.begin(), in.end());
    }
    for (std::size_t r = 0; r < n_ranks(); ++r) {
      ASSERT_EQ(bits(got[r][std::size_t(rep)]), bits(want)) << "rep " << rep << " rank " << r;
    }
  }
}

TEST_P(CollectivesTest, AllGatherObject) {
  SCOPED_TRACE("seed=" + std::to_string(kSeed));
  LocalWorld world(world_size(), execution());
  std::vector<std::vector<std::vector<std::vector<char>>>> got(n_ranks());
  expect_all_ok(run_guarded(world, [&](ProcessGroup& pg) {
    std::mt19937_64 rng(seed_of(-4, pg.rank()));
    for (int rep = 0; rep < kReps; ++rep) {
      perturb(rng, rep, pg.rank(), pg.size());
      got[static_cast<std::size_t>(pg.rank())].push_back(
          pg.all_gather_object(object_input(rep, pg.rank())));
    }
  }));
  for (int rep = 0; rep < kReps; ++rep) {
    std::vector<std::vector<char>> want;
    for (int r = 0; r < world_size(); ++r) want.push_back(object_input(rep, r));
    for (std::size_t r = 0; r < n_ranks(); ++r) {
      ASSERT_EQ(got[r][std::size_t(rep)], want) << "rep " << rep << " rank " << r;
    }
  }
}

// all_gather_object_shared (invariant 7): in each rep half the ranks ask for the shared
// instance and half for a copy, in one rendezvous; everyone gets every rank's bytes in rank
// order, and the ranks that asked for the shared instance hold the same one.
TEST_P(CollectivesTest, AllGatherObjectShared) {
  SCOPED_TRACE("seed=" + std::to_string(kSeed));
  LocalWorld world(world_size(), execution());
  std::vector<std::vector<std::vector<std::vector<char>>>> got(n_ranks());
  std::vector<std::vector<std::shared_ptr<const model::GatheredObjects>>> instances(
      n_ranks(), std::vector<std::shared_ptr<const model::GatheredObjects>>(kReps));
  expect_all_ok(run_guarded(world, [&](ProcessGroup& pg) {
    std::mt19937_64 rng(seed_of(-7, pg.rank()));
    const auto r = static_cast<std::size_t>(pg.rank());
    for (int rep = 0; rep < kReps; ++rep) {
      perturb(rng, rep, pg.rank(), pg.size());
      if ((pg.rank() + rep) % 2 == 0) {
        auto shared = pg.all_gather_object_shared(object_input(rep, pg.rank()));
        got[r].push_back(shared->objects());
        instances[r][static_cast<std::size_t>(rep)] = std::move(shared);
      } else {
        got[r].push_back(pg.all_gather_object(object_input(rep, pg.rank())));
      }
    }
  }));
  for (int rep = 0; rep < kReps; ++rep) {
    const auto k = static_cast<std::size_t>(rep);
    std::vector<std::vector<char>> want;
    for (int r = 0; r < world_size(); ++r) want.push_back(object_input(rep, r));
    const model::GatheredObjects* first = nullptr;
    for (std::size_t r = 0; r < n_ranks(); ++r) {
      ASSERT_EQ(got[r][k], want) << "rep " << rep << " rank " << r;
      const auto& instance = instances[r][k];
      if (instance == nullptr) continue;
      if (first == nullptr) first = instance.get();
      EXPECT_EQ(instance.get(), first) << "rep " << rep << ": rank " << r << " has its own copy";
    }
  }
}

TEST_P(CollectivesTest, BroadcastObject) {
  SCOPED_TRACE("seed=" + std::to_string(kSeed));
  LocalWorld world(world_size(), execution());
  std::vector<std::vector<std::vector<char>>> got(n_ranks());
  expect_all_ok(run_guarded(world, [&](ProcessGroup& pg) {
    std::mt19937_64 rng(seed_of(-5, pg.rank()));
    for (int rep = 0; rep < kReps; ++rep) {
      perturb(rng, rep, pg.rank(), pg.size());
      got[static_cast<std::size_t>(pg.rank())].push_back(
          pg.broadcast_object(object_input(rep, pg.rank()), rep % pg.size()));
    }
  }));
  for (int rep = 0; rep < kReps; ++rep) {
    const std::vector<char> want = object_input(rep, rep % world_size());
    for (std::size_t r = 0; r < n_ranks(); ++r) {
      ASSERT_EQ(got[r][std::size_t(rep)], want) << "rep " << rep << " rank " << r;
    }
  }
}

// Megatron reduce-scatters a bucket into this rank's view of the same bucket and
// all-gathers a shard view into its bucket: outputs alias the same rank's inputs.
TEST_P(CollectivesTest, AliasedOutputs) {
  SCOPED_TRACE("seed=" + std::to_string(kSeed));
  constexpr std::size_t kN = 5;
  LocalWorld world(world_size(), execution());
  std::vector<std::vector<float>> reduced(n_ranks()), gathered(n_ranks());
  expect_all_ok(run_guarded(world, [&](ProcessGroup& pg) {
    const std::size_t r = static_cast<std::size_t>(pg.rank());
    std::vector<float> bucket = float_input(7, pg.rank(), kN * n_ranks());
    std::span<float> shard = std::span<float>(bucket).subspan(r * kN, kN);
    pg.reduce_scatter_sum(bucket, shard);
    reduced[r].assign(shard.begin(), shard.end());
    pg.all_gather_values<float>(shard, bucket);
    gathered[r] = bucket;
  }));
  const std::vector<float> sum = sequential_sum(7, world_size(), kN * n_ranks());
  for (std::size_t r = 0; r < n_ranks(); ++r) {
    const std::vector<float> want(sum.begin() + long(r * kN), sum.begin() + long((r + 1) * kN));
    EXPECT_EQ(bits(reduced[r]), bits(want)) << "rank " << r;
    EXPECT_EQ(bits(gathered[r]), bits(sum)) << "rank " << r;
  }
}

// Ranks of one process can pass buffers no two processes could: a rank's output overlapping a
// peer's input. Every rank still gets what the inputs held before the collective (invariant 4):
// such calls go through scratch, the others are written straight into place. Mutation caught:
// writing straight whatever the buffers (rank 0's output then clobbers rank 1's input before it
// is read: 1 + ... read as 11 + ...).
TEST(Collectives, AnOutputOverlappingAPeersInputGetsTheInputsAsTheyWere) {
  for (const Execution execution : {Execution::kFibers, Execution::kThreads}) {
    LocalWorld world(2, execution);
    std::vector<float> shared = {1, 2, 3, 4};  // rank 1's input; rank 0 writes into it
    std::vector<float> reduced1(2), gathered0(4), gathered1(4);
    std::vector<float> reduced0;
    expect_all_ok(run_guarded(world, [&](ProcessGroup& pg) {
      if (pg.rank() == 0) {
        const std::vector<float> in = {10, 20, 30, 40};
        pg.reduce_scatter_sum(in, std::span<float>(shared).subspan(2, 2));
        reduced0.assign(shared.begin() + 2, shared.end());
        shared = {1, 2, 3, 4};
        pg.barrier();
        const std::vector<float> mine = {5, 6};
        pg.all_gather_values<float>(mine, shared);
        gathered0 = shared;
      } else {
        pg.reduce_scatter_sum(shared, reduced1);
        pg.barrier();
        pg.all_gather_values<float>(std::span<const float>(shared).subspan(0, 2), gathered1);
      }
    }));
    EXPECT_EQ(reduced0, (std::vector<float>{11, 22}));
    EXPECT_EQ(reduced1, (std::vector<float>{33, 44}));
    EXPECT_EQ(gathered0, (std::vector<float>{5, 6, 1, 2}));
    EXPECT_EQ(gathered1, (std::vector<float>{5, 6, 1, 2}));
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5, 8),
                                            ::testing::Values(Execution::kFibers,
                                                              Execution::kThreads)));

// ---------------------------------------------------------------------------------------
// Abort

TEST(ProcessGroupAbort, FailedRankWakesBlockedRanks) {
  constexpr int kWorld = 4;
  constexpr int kFailer = 2;
  LocalWorld world(kWorld, Execution::kThreads);  // a rank polls while its peers block
  const auto outcomes = run_guarded(world, [&](ProcessGroup& pg) {
    if (pg.rank() != kFailer) {
      pg.barrier();
      return;
    }
    // Wait (test-side polling) until every peer is blocked inside the barrier.
    while (world.blocked_count() < kWorld - 1) std::this_thread::yield();
    throw std::runtime_error("boom from rank 2");
  });
  ASSERT_EQ(outcomes.size(), std::size_t(kWorld));
  for (const RankOutcome& o : outcomes) {
    if (o.rank == kFailer) {
      EXPECT_EQ(o.error_message, "boom from rank 2");
      EXPECT_FALSE(holds<PeerAborted>(o));
      continue;
    }
    ASSERT_TRUE(holds<PeerAborted>(o)) << "rank " << o.rank << ": " << o.error_message;
    try {
      std::rethrow_exception(o.error);
    } catch (const PeerAborted& e) {
      EXPECT_EQ(e.aborting_rank(), kFailer);
      EXPECT_EQ(e.reason(), "boom from rank 2");
      EXPECT_NE(std::string(e.what()).find("barrier"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(world.abort_info().has_value());
  EXPECT_EQ(world.departed_count(), kWorld);
  EXPECT_EQ(world.blocked_count(), 0);
}

TEST(ProcessGroupAbort, FailureSeenOnEntry) {
  LocalWorld world(3, Execution::kThreads);  // rank 0 polls until rank 1 has left
  const auto outcomes = run_guarded(world, [&](ProcessGroup& pg) {
    if (pg.rank() == 1) throw std::runtime_error("early failure");
    while (world.departed_count() == 0) std::this_thread::yield();
    std::vector<std::byte> in(4), out(12);
    pg.all_gather(in, out);
  });
  EXPECT_TRUE(holds<PeerAborted>(outcomes[0])) << outcomes[0].error_message;
  EXPECT_EQ(outcomes[1].error_message, "early failure");
  EXPECT_TRUE(holds<PeerAborted>(outcomes[2])) << outcomes[2].error_message;
}

// Ranks 1 and 3 fail at the same point with different errors, in varying order; the others
// must always name rank 1 (the lowest failing rank), and the failing ranks keep their own
// errors: the reported outcome never depends on timing.
TEST(ProcessGroupAbort, FailureNamesLowestFailingRank) {
  for (int rep = 0; rep < kReps; ++rep) {
    LocalWorld world(5);
    const auto outcomes = run_guarded(world, [&](ProcessGroup& pg) {
      std::mt19937_64 rng(seed_of(rep, pg.rank()));
      pg.barrier();
      // Alternate which failing rank is likely to fail first.
      if (pg.rank() == (rep % 2 == 0 ? 1 : 3)) perturb(rng, 2, 0, 4);
      perturb(rng, rep, pg.rank(), pg.size());
      if (pg.rank() == 1 || pg.rank() == 3) {
        throw std::runtime_error("failure of rank " + std::to_string(pg.rank()));
      }
      pg.barrier();
    });
    for (const RankOutcome& o : outcomes) {
      if (o.rank == 1 || o.rank == 3) {
        ASSERT_EQ(o.error_message, "failure of rank " + std::to_string(o.rank)) << "rep " << rep;
        continue;
      }
      ASSERT_TRUE(holds<PeerAborted>(o)) << "rep " << rep << ": " << o.error_message;
      try {
        std::rethrow_exception(o.error);
      } catch (const PeerAborted& e) {
        ASSERT_EQ(e.aborting_rank(), 1) << "rep " << rep << ": " << e.what();
      }
    }
    EXPECT_THROW(
        {
          try {
            rethrow_root_cause(outcomes);
          } catch (const std::runtime_error& e) {
            EXPECT_STREQ(e.what(), "failure of rank 1");
            throw;
          }
        },
        std::runtime_error);
  }
}

// A harness stops a world from outside while ranks are blocked.
TEST(ProcessGroupAbort, ExternalAbortWakesBlockedRanks) {
  constexpr int kWorld = 3;
  LocalWorld world(kWorld, Execution::kThreads);  // rank 0 polls while its peers block
  const auto outcomes = run_guarded(world, [&](ProcessGroup& pg) {
    if (pg.rank() == 0) {
      while (world.blocked_count() < kWorld - 1) std::this_thread::yield();
      world.abort(0, "stopped by the harness");
      return;
    }
    pg.barrier();
  });
  EXPECT_TRUE(outcomes[0].ok()) << outcomes[0].error_message;
  for (int r : {1, 2}) {
    ASSERT_TRUE(holds<PeerAborted>(outcomes[std::size_t(r)]))
        << outcomes[std::size_t(r)].error_message;
    EXPECT_NE(outcomes[std::size_t(r)].error_message.find("stopped by the harness"),
              std::string::npos);
  }
}

TEST(ProcessGroupAbort, ExternalAbortFailsEveryRank) {
  LocalWorld world(3);
  world.abort(0, "stopped by the harness");
  const auto outcomes = run_guarded(world, [](ProcessGroup& pg) { pg.barrier(); });
  for (const RankOutcome& o : outcomes) {
    EXPECT_TRUE(holds<PeerAborted>(o)) << "rank " << o.rank << ": " << o.error_message;
  }
}

TEST(ProcessGroupAbort, RethrowRootCause) {
  LocalWorld world(3);
  const auto outcomes = run_guarded(world, [](ProcessGroup& pg) {
    if (pg.rank() == 2) throw std::out_of_range("the real problem");
    pg.barrier();
  });
  EXPECT_TRUE(holds<PeerAborted>(outcomes[0]));
  EXPECT_THROW(rethrow_root_cause(outcomes), std::out_of_range);

  LocalWorld ok_world(2);
  const auto ok = run_guarded(ok_world, [](ProcessGroup& pg) { pg.barrier(); });
  EXPECT_NO_THROW(rethrow_root_cause(ok));
}

// ---------------------------------------------------------------------------------------
// Fibers (header invariant 6)

TEST(FiberWorld, RanksRunOnTheCallingThread) {
  LocalWorld world(4);
  std::vector<std::thread::id> ids(4);
  expect_all_ok(run_guarded(world, [&](ProcessGroup& pg) {
    pg.barrier();
    ids[static_cast<std::size_t>(pg.rank())] = std::this_thread::get_id();
    pg.barrier();
  }));
  for (std::size_t r = 1; r < ids.size(); ++r) EXPECT_EQ(ids[r], ids[0]) << "rank " << r;
}

// The rank that completes a collective runs on; the ranks it freed follow in rank order (in
// the second barrier they blocked as 2, 0: rank order puts 0 first).
TEST(FiberWorld, InterleavingIsFixed) {
  for (int rep = 0; rep < 3; ++rep) {
    LocalWorld world(3);
    std::vector<std::string> events;
    expect_all_ok(run_guarded(world, [&](ProcessGroup& pg) {
      const std::string r = std::to_string(pg.rank());
      events.push_back(r + " b1");
      pg.barrier();
      events.push_back(r + " b2");
      pg.barrier();
      events.push_back(r + " end");
    }));
    EXPECT_EQ(events, (std::vector<std::string>{"0 b1", "1 b1", "2 b1", "2 b2", "0 b2", "1 b2",
                                                "1 end", "0 end", "2 end"}))
        << "rep " << rep;
  }
}

// The largest world: kWorldSizeMax fibers, all blocked at once in every collective.
TEST(FiberWorld, LargestWorldReduces) {
  LocalWorld world(kWorldSizeMax);
  std::vector<float> sums(static_cast<std::size_t>(kWorldSizeMax));
  std::vector<std::vector<char>> firsts(static_cast<std::size_t>(kWorldSizeMax));
  expect_all_ok(run_guarded(world, [&](ProcessGroup& pg) {
    std::vector<float> one{1.0f};
    pg.all_reduce_sum(one);
    sums[static_cast<std::size_t>(pg.rank())] = one[0];
    const auto gathered = pg.all_gather_object({static_cast<char>(pg.rank() % 7)});
    firsts[static_cast<std::size_t>(pg.rank())] = gathered.back();
  }));
  for (std::size_t r = 0; r < sums.size(); ++r) {
    ASSERT_EQ(sums[r], static_cast<float>(kWorldSizeMax)) << "rank " << r;
    ASSERT_EQ(firsts[r], std::vector<char>{static_cast<char>((kWorldSizeMax - 1) % 7)});
  }
}

// abort() from another thread frees fibers already blocked: ranks 0 and 1 wait in a barrier
// while rank 2 runs; the harness aborts; rank 2 returns, and the scheduler must resume 0 and 1.
TEST(FiberWorld, AbortFromAnotherThread) {
  LocalWorld world(3);
  std::promise<void> aborted;
  std::thread harness([&] {
    while (world.blocked_count() < 2) std::this_thread::yield();
    world.abort(1, "stopped by the harness");
    aborted.set_value();
  });
  const auto outcomes = run_guarded(world, [&](ProcessGroup& pg) {
    if (pg.rank() == 2) {
      aborted.get_future().wait();
      return;
    }
    pg.barrier();
  });
  harness.join();
  EXPECT_TRUE(outcomes[2].ok()) << outcomes[2].error_message;
  for (int r : {0, 1}) {
    const RankOutcome& o = outcomes[static_cast<std::size_t>(r)];
    ASSERT_TRUE(holds<PeerAborted>(o)) << "rank " << r << ": " << o.error_message;
    EXPECT_NE(o.error_message.find("stopped by the harness"), std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------
// Out-of-step detection

// Every rank of `outcomes` failed with CollectiveMismatch whose message contains `parts`.
void expect_mismatch_everywhere(const std::vector<RankOutcome>& outcomes,
                                const std::vector<std::string>& parts) {
  for (const RankOutcome& o : outcomes) {
    ASSERT_TRUE(holds<CollectiveMismatch>(o)) << "rank " << o.rank << ": " << o.error_message;
    for (const std::string& part : parts) {
      EXPECT_NE(o.error_message.find(part), std::string::npos)
          << "rank " << o.rank << " message lacks '" << part << "': " << o.error_message;
    }
  }
}

// kCopiedPerRank: each rank its own instance, with the same contents.
TEST(ProcessGroupObjects, CopiedPerRankGivesEachRankItsOwnInstance) {
  constexpr int kWorld = 3;
  LocalWorld world(kWorld, Execution::kFibers, ObjectGathers::kCopiedPerRank);
  std::vector<std::shared_ptr<const model::GatheredObjects>> got(kWorld);
  expect_all_ok(run_guarded(world, [&](ProcessGroup& pg) {
    got[static_cast<std::size_t>(pg.rank())] =
        pg.all_gather_object_shared(object_input(0, pg.rank()));
  }));
  for (std::size_t r = 1; r < got.size(); ++r) {
    EXPECT_NE(got[r].get(), got[0].get()) << "rank " << r;
    EXPECT_EQ(got[r]->objects(), got[0]->objects()) << "rank " << r;
  }
}

// A shared gather is the one op all_gather_object: it fails on a failed peer and on a peer at
// another collective exactly as that op does (invariants 2, 3, 7).
TEST(ProcessGroupObjects, SharedGatherFailsAsAllGatherObjectDoes) {
  auto errors = [](bool shared, bool peer_throws) {
    LocalWorld world(3);
    const auto outcomes = run_guarded(world, [&](ProcessGroup& pg) {
      if (pg.rank() == 1) {
        if (peer_throws) throw std::runtime_error("rank 1 failed");
        pg.barrier();
      } else if (shared) {
        (void)pg.all_gather_object_shared(object_input(0, pg.rank()));
      } else {
        (void)pg.all_gather_object(object_input(0, pg.rank()));
      }
    });
    std::vector<std::string> out;
    for (const auto& o : outcomes) out.push_back(o.ok() ? "" : o.error_message);
    return out;
  };
  for (const bool peer_throws : {true, false}) {
    SCOPED_TRACE(peer_throws ? "a peer throws" : "a peer at a barrier");
    const auto shared = errors(true, peer_throws);
    EXPECT_EQ(shared, errors(false, peer_throws));
    EXPECT_NE(shared[0].find(peer_throws ? "rank 1 failed" : "collective mismatch"),
              std::string::npos)
        << shared[0];
    EXPECT_NE(shared[0].find("all_gather_object"), std::string::npos) << shared[0];
  }
}

TEST(ProcessGroupMismatch, MismatchedOps) {
  LocalWorld world(2);
  const auto outcomes = run_guarded(world, [](ProcessGroup& pg) {
    if (pg.rank() == 0) {
      pg.barrier();
    } else {
      std::vector<std::byte> in(8), out(16);
      pg.all_gather(in, out);
    }
  });
  expect_mismatch_everywhere(outcomes, {"rank 0 called barrier (sequence number 0",
                                        "rank 1 called all_gather (sequence number 0"});
}

// Same byte size on both sides: only the op tells them apart.
TEST(ProcessGroupMismatch, MismatchedOpsOfEqualSize) {
  LocalWorld world(2);
  const auto outcomes = run_guarded(world, [](ProcessGroup& pg) {
    if (pg.rank() == 0) {
      std::vector<float> data(2);
      pg.all_reduce_sum(data);
    } else {
      std::vector<std::byte> in(8), out(16);
      pg.all_gather(in, out);
    }
  });
  expect_mismatch_everywhere(outcomes, {"rank 0 called all_reduce_sum (sequence number 0, 8 bytes",
                                        "rank 1 called all_gather (sequence number 0, 8 bytes"});
}

TEST(ProcessGroupMismatch, MismatchedOpsInLargerWorld) {
  LocalWorld world(3);
  const auto outcomes = run_guarded(world, [](ProcessGroup& pg) {
    pg.barrier();
    if (pg.rank() < 2) {
      pg.barrier();
    } else {
      pg.all_gather_object({'x'});
    }
  });
  expect_mismatch_everywhere(outcomes, {"rank 0 called barrier (sequence number 1",
                                        "rank 2 called all_gather_object (sequence number 1"});
}

TEST(ProcessGroupMismatch, MismatchedSizes) {
  LocalWorld world(3);
  std::vector<std::vector<std::byte>> outputs(3);
  const auto outcomes = run_guarded(world, [&](ProcessGroup& pg) {
    const std::size_t n = pg.rank() == 1 ? 8 : 4;
    std::vector<std::byte> in(n, std::byte{0x5a});
    std::vector<std::byte>& out = outputs[static_cast<std::size_t>(pg.rank())];
    out.assign(3 * n, std::byte{0});
    pg.all_gather(in, out);
  });
  expect_mismatch_everywhere(outcomes, {"rank 0 called all_gather (sequence number 0, 4 bytes",
                                        "rank 1 called all_gather (sequence number 0, 8 bytes"});
  for (const auto& out : outputs) {
    for (std::byte b : out)
      ASSERT_EQ(b, std::byte{0}) << "an output was written despite the mismatch";
  }
}

TEST(ProcessGroupMismatch, MismatchedSequenceNumbers) {
  LocalWorld world(2);
  const auto outcomes = run_guarded(world, [&](ProcessGroup& pg) {
    pg.barrier();
    if (pg.rank() == 0) {
      pg.barrier();
    } else {
      LocalProcessGroup fresh(world, 1);  // restarts at sequence number 0
      fresh.barrier();
    }
  });
  expect_mismatch_everywhere(outcomes, {"rank 0 called barrier (sequence number 1",
                                        "rank 1 called barrier (sequence number 0"});
}

TEST(ProcessGroupMismatch, MismatchedBroadcastRoots) {
  LocalWorld world(2);
  const auto outcomes =
      run_guarded(world, [](ProcessGroup& pg) { pg.broadcast_object({'a'}, pg.rank()); });
  expect_mismatch_everywhere(outcomes, {"root 0", "root 1"});
}

TEST(ProcessGroupMismatch, RankReturnedEarly) {
  LocalWorld world(3);
  const auto outcomes = run_guarded(world, [](ProcessGroup& pg) {
    pg.barrier();
    if (pg.rank() == 0) return;
    pg.barrier();
  });
  EXPECT_TRUE(outcomes[0].ok()) << outcomes[0].error_message;
  for (int r : {1, 2}) {
    ASSERT_TRUE(holds<CollectiveMismatch>(outcomes[std::size_t(r)]))
        << outcomes[std::size_t(r)].error_message;
    EXPECT_NE(outcomes[std::size_t(r)].error_message.find("rank 0 returned"), std::string::npos)
        << outcomes[std::size_t(r)].error_message;
  }
}

// ---------------------------------------------------------------------------------------
// Limits, preconditions, base class

TEST(ProcessGroupLimits, WorldSizeLimits) {
  EXPECT_THROW(LocalWorld{kWorldSizeMax + 1}, std::invalid_argument);
  EXPECT_THROW(LocalWorld{0}, std::invalid_argument);
  EXPECT_THROW(LocalWorld{-3}, std::invalid_argument);
  EXPECT_NO_THROW(LocalWorld{kWorldSizeMax});
  EXPECT_THROW(LocalWorld{2}.abort(2, "no such rank"), model::InvariantViolation);
}

TEST(ProcessGroupLimits, LocalPreconditionAbortsPeers) {
  LocalWorld world(2);
  const auto outcomes = run_guarded(world, [](ProcessGroup& pg) {
    std::vector<float> input(pg.rank() == 0 ? 3 : 4);  // rank 0 breaks input == 2 * output
    std::vector<float> output(2);
    pg.reduce_scatter_sum(input, output);
  });
  EXPECT_TRUE(holds<model::InvariantViolation>(outcomes[0])) << outcomes[0].error_message;
  EXPECT_TRUE(holds<PeerAborted>(outcomes[1])) << outcomes[1].error_message;
}

TEST(ProcessGroupLimits, RunTwiceIsAnError) {
  LocalWorld world(1);
  expect_all_ok(world.run([](ProcessGroup& pg) { pg.barrier(); }));
  EXPECT_THROW(world.run([](ProcessGroup&) {}), model::InvariantViolation);
}

class StubBackend : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend_name() const override { return "stub"; }
};

TEST(ProcessGroupBase, BaseClassFailsLoudly) {
  StubBackend pg;
  std::vector<float> f(1);
  std::vector<std::byte> b(1);
  auto message_of = [](const std::function<void()>& call) -> std::string {
    try {
      call();
    } catch (const CollectiveNotImplemented& e) {
      return e.what();
    }
    return "no exception";
  };
  EXPECT_EQ(message_of([&] { pg.reduce_scatter_sum(f, f); }),
            "reduce_scatter_sum is not implemented by backend stub");
  EXPECT_EQ(message_of([&] { pg.all_reduce_sum(f); }),
            "all_reduce_sum is not implemented by backend stub");
  EXPECT_EQ(message_of([&] { pg.all_gather(b, b); }),
            "all_gather is not implemented by backend stub");
  EXPECT_EQ(message_of([&] { pg.all_gather_object({}); }),
            "all_gather_object is not implemented by backend stub");
  EXPECT_EQ(message_of([&] { pg.broadcast_object({}, 0); }),
            "broadcast_object is not implemented by backend stub");
  EXPECT_EQ(message_of([&] { pg.barrier(); }), "barrier is not implemented by backend stub");
}

TEST(ProcessGroupBase, SequenceNumbersCountCollectives) {
  LocalWorld world(3);
  std::vector<uint64_t> counts(3);
  expect_all_ok(run_guarded(world, [&](ProcessGroup& pg) {
    EXPECT_EQ(pg.sequence_number(), 0u);
    std::vector<float> f(3), g(1);
    std::vector<std::byte> b(1), c(3);
    pg.barrier();
    pg.reduce_scatter_sum(f, g);
    pg.all_reduce_sum(g);
    pg.all_gather(b, c);
    pg.all_gather_object({});
    (void)pg.all_gather_object_shared({});
    pg.broadcast_object({}, 2);
    counts[static_cast<std::size_t>(pg.rank())] = pg.sequence_number();
    EXPECT_EQ(pg.backend_name(), "local");
    EXPECT_EQ(pg.size(), 3);
  }));
  EXPECT_EQ(counts, (std::vector<uint64_t>{7, 7, 7}));
}

// ---------------------------------------------------------------------------------------
// Subgroups (header invariant 8): a TP x PP x DP job's DP groups reduce on their own, each a
// different number of times, while the world's collectives still meet every rank.

// World 6 as 2 groups of 3 (ranks {0, 2, 4} and {1, 3, 5}, the DP groups of TP 2): group a
// all-reduces once, group b three times, then the world gathers every rank's group sums.
// Expected: each group's rank-order sum of its own members' inputs, computed here.
TEST(Subgroups, GroupsReduceApartAndMeetInTheWorld) {
  for (const Execution execution : {Execution::kFibers, Execution::kThreads}) {
    LocalWorld world(6, execution);
    const int a = world.new_group({0, 2, 4});
    const int b = world.new_group({1, 3, 5});
    std::vector<std::vector<float>> last(6);
    const auto outcomes = run_guarded(world, [&](ProcessGroup& pg) {
      const int r = pg.rank();
      std::unique_ptr<LocalProcessGroup> dp = world.group(r % 2 == 0 ? a : b, r);
      EXPECT_EQ(dp->size(), 3);
      EXPECT_EQ(dp->rank(), r / 2);
      EXPECT_EQ(dp->world_rank(), r);
      std::vector<float> v = float_input(7, r, 5);
      for (int k = 0; k < (r % 2 == 0 ? 1 : 3); ++k) dp->all_reduce_sum(v);
      const auto gathered = pg.all_gather_object({static_cast<char>(r)});
      EXPECT_EQ(gathered.size(), 6U);
      last[static_cast<size_t>(r)] = v;
    });
    expect_all_ok(outcomes);
    for (int r = 0; r < 6; ++r) {
      // The group's members in rank order; group b sums three times (its sums are summed again).
      std::vector<float> want = float_input(7, r % 2, 5);
      for (int m = r % 2 + 2; m < 6; m += 2) {
        const std::vector<float> in = float_input(7, m, 5);
        for (size_t i = 0; i < 5; ++i) want[i] = want[i] + in[i];
      }
      for (int k = 1; k < (r % 2 == 0 ? 1 : 3); ++k) {
        const std::vector<float> once = want;
        for (int m = 1; m < 3; ++m) {
          for (size_t i = 0; i < 5; ++i) want[i] = want[i] + once[i];
        }
      }
      EXPECT_EQ(bits(last[static_cast<size_t>(r)]), bits(want)) << "rank " << r;
    }
  }
}

// A member of one group fails: its group's peers see PeerAborted naming it (by world rank),
// the other group completes its collective, and the world's next collective fails everyone.
TEST(Subgroups, FailureStaysInItsGroupUntilTheWorldMeets) {
  LocalWorld world(4, Execution::kFibers);
  const int a = world.new_group({0, 1});
  const int b = world.new_group({2, 3});
  std::vector<int> reduced(4, 0);
  const auto outcomes = run_guarded(world, [&](ProcessGroup& pg) {
    const int r = pg.rank();
    std::unique_ptr<LocalProcessGroup> dp = world.group(r < 2 ? a : b, r);
    if (r == 1) throw std::runtime_error("boom from rank 1");
    std::vector<float> v(2, 1.0F);
    dp->all_reduce_sum(v);
    reduced[static_cast<size_t>(r)] = 1;
    pg.barrier();
  });
  EXPECT_EQ(reduced, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(outcomes[1].error_message, "boom from rank 1");
  for (const int r : {0, 2, 3}) {
    ASSERT_TRUE(holds<PeerAborted>(outcomes[static_cast<size_t>(r)])) << r;
    EXPECT_NE(outcomes[static_cast<size_t>(r)].error_message.find("rank 1 aborted"),
              std::string::npos)
        << outcomes[static_cast<size_t>(r)].error_message;
  }
}

TEST(Subgroups, RanksOutsideTheGroupAreRefused) {
  LocalWorld world(3);
  const int g = world.new_group({0, 2});
  EXPECT_THROW(world.group(g, 1), model::InvariantViolation);
  EXPECT_THROW(world.new_group({2, 1}), model::InvariantViolation);
  EXPECT_THROW(world.new_group({0, 3}), model::InvariantViolation);
  EXPECT_EQ(world.group_count(), 2);
}

}  // namespace
}  // namespace ckptsim::sim
