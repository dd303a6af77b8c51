// Tests of sim/object_exchange.h: all_gather_object_shared over a LocalWorld, one copy of the
// gathered objects for every rank. Expected values are LocalWorld's own all_gather_object of
// the same bytes in the same run (the copy per rank that the exchange replaces).
//
// Which deliberately broken variant each test catches:
//   EveryRankTakesOneInstanceInRankOrder  a copy per rank (not shared); deposits kept in
//                                       arrival order instead of by rank
//   DepositsInAnyOrderComeOutInRankOrder  the same, without threads: ranks deposit 2, 0, 1
//   RoundsDoNotMix                      rounds keyed by anything but the sequence number (a
//                                       later gather hands out an earlier one's bytes)
//   TakenRoundsAreForgotten             rounds never erased (memory grows with every save)
//   TakeBeforeEveryDepositIsAnError     assembling a round with a rank's bytes missing
//   FailedPeerFailsTheSharedGatherAsTheWorldDoes  the payload gather not made through the
//                                       world (a failed peer no longer fails the others, or
//                                       fails them with another message)
//   MismatchIsReportedAsForTheWorldsOwnGather  the same for a rank at another collective
//   SequenceNumbersFollowTheWorld       a forwarded collective that skips the count
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "model/errors.h"
#include "sim/local_world.h"
#include "sim/object_exchange.h"

using namespace ckptsim;
using namespace ckptsim::sim;

namespace {

// Rank r's payload in round k: r + k + 1 bytes, so lengths and contents both differ by rank.
std::vector<char> payload(int rank, int round) {
  return std::vector<char>(static_cast<size_t>(rank + round + 1),
                           static_cast<char>('a' + rank + 3 * round));
}

// Runs f on `n` ranks, each through a SharingProcessGroup over one exchange.
std::vector<RankOutcome> run_sharing(LocalWorld& world, ObjectExchange& exchange,
                                     const std::function<void(SharingProcessGroup&)>& f) {
  return world.run([&](ProcessGroup& pg) {
    SharingProcessGroup group(pg, exchange);
    f(group);
  });
}

void expect_all_ok(const std::vector<RankOutcome>& outcomes) {
  for (const auto& o : outcomes)
    EXPECT_TRUE(o.ok()) << "rank " << o.rank << ": " << o.error_message;
}

TEST(ObjectExchange, EveryRankTakesOneInstanceInRankOrder) {
  constexpr int kRanks = 5;
  constexpr int kRounds = 3;
  LocalWorld world(kRanks);
  ObjectExchange exchange(kRanks);
  std::vector<std::vector<std::shared_ptr<const model::GatheredObjects>>> shared(
      kRounds, std::vector<std::shared_ptr<const model::GatheredObjects>>(kRanks));
  std::vector<std::vector<std::vector<char>>> copied(kRounds);
  expect_all_ok(run_sharing(world, exchange, [&](SharingProcessGroup& pg) {
    const auto r = static_cast<size_t>(pg.rank());
    for (int k = 0; k < kRounds; ++k) {
      const auto round = static_cast<size_t>(k);
      shared[round][r] = pg.all_gather_object_shared(payload(pg.rank(), k));
      auto copy = pg.all_gather_object(payload(pg.rank(), k));
      if (r == 0) copied[round] = std::move(copy);
    }
  }));
  for (size_t k = 0; k < kRounds; ++k) {
    ASSERT_NE(shared[k][0], nullptr);
    EXPECT_EQ(shared[k][0]->objects(), copied[k]) << "round " << k;
    for (size_t r = 1; r < kRanks; ++r) {
      EXPECT_EQ(shared[k][r], shared[k][0]) << "rank " << r << " has its own copy of round " << k;
    }
  }
  EXPECT_EQ(exchange.open_rounds(), 0u);
}

TEST(ObjectExchange, DepositsInAnyOrderComeOutInRankOrder) {
  ObjectExchange exchange(3);
  for (const int rank : {2, 0, 1}) exchange.deposit(7, rank, payload(rank, 0));
  const auto taken = exchange.take(7, 1);
  EXPECT_EQ(taken->objects(),
            (std::vector<std::vector<char>>{payload(0, 0), payload(1, 0), payload(2, 0)}));
  EXPECT_EQ(exchange.take(7, 2), taken);
  EXPECT_EQ(exchange.take(7, 0), taken);
}

TEST(ObjectExchange, RoundsDoNotMix) {
  ObjectExchange exchange(2);
  exchange.deposit(3, 0, payload(0, 0));
  exchange.deposit(3, 1, payload(1, 0));
  exchange.deposit(5, 1, payload(1, 1));  // rank 1 is a round ahead
  const auto round3 = exchange.take(3, 1);
  exchange.deposit(5, 0, payload(0, 1));
  const auto round5 = exchange.take(5, 1);
  EXPECT_EQ(round3->objects(), (std::vector<std::vector<char>>{payload(0, 0), payload(1, 0)}));
  EXPECT_EQ(round5->objects(), (std::vector<std::vector<char>>{payload(0, 1), payload(1, 1)}));
  EXPECT_EQ(exchange.take(3, 0), round3);
  EXPECT_EQ(exchange.take(5, 0), round5);
}

TEST(ObjectExchange, TakenRoundsAreForgotten) {
  ObjectExchange exchange(2);
  for (uint64_t seq = 0; seq < 4; ++seq) {
    exchange.deposit(seq, 0, {});
    exchange.deposit(seq, 1, {});
    (void)exchange.take(seq, 0);
    EXPECT_EQ(exchange.open_rounds(), 1u);
    (void)exchange.take(seq, 1);
    EXPECT_EQ(exchange.open_rounds(), 0u);
  }
  EXPECT_THROW(exchange.take(0, 0), model::InvariantViolation) << "a forgotten round";
}

TEST(ObjectExchange, TakeBeforeEveryDepositIsAnError) {
  ObjectExchange exchange(3);
  exchange.deposit(0, 0, payload(0, 0));
  exchange.deposit(0, 2, payload(2, 0));
  EXPECT_THROW(exchange.take(0, 0), model::InvariantViolation);
  EXPECT_THROW(exchange.deposit(0, 2, payload(2, 0)), model::InvariantViolation);
  EXPECT_THROW(exchange.deposit(0, 3, payload(3, 0)), model::InvariantViolation);
}

// What each rank's function threw, in rank order ("" where it returned).
std::vector<std::string> errors_of(const std::vector<RankOutcome>& outcomes) {
  std::vector<std::string> out;
  for (const auto& o : outcomes) out.push_back(o.ok() ? "" : o.error_message);
  return out;
}

TEST(ObjectExchange, FailedPeerFailsTheSharedGatherAsTheWorldDoes) {
  auto body = [](ProcessGroup& pg, bool shared) {
    pg.barrier();
    if (pg.rank() == 2) throw std::runtime_error("rank 2 failed");
    if (shared) {
      (void)pg.all_gather_object_shared(payload(pg.rank(), 0));
    } else {
      (void)pg.all_gather_object(payload(pg.rank(), 0));
    }
  };
  LocalWorld plain_world(4);
  const auto plain = plain_world.run([&](ProcessGroup& pg) { body(pg, false); });
  LocalWorld world(4);
  ObjectExchange exchange(4);
  const auto sharing =
      run_sharing(world, exchange, [&](SharingProcessGroup& pg) { body(pg, true); });
  EXPECT_EQ(errors_of(sharing), errors_of(plain));
  EXPECT_NE(errors_of(sharing)[0].find("rank 2 aborted: rank 2 failed"), std::string::npos)
      << errors_of(sharing)[0];
  EXPECT_EQ(exchange.open_rounds(), 1u) << "the failed round stays until the exchange goes";
}

TEST(ObjectExchange, MismatchIsReportedAsForTheWorldsOwnGather) {
  auto body = [](ProcessGroup& pg, bool shared) {
    if (pg.rank() == 1) {
      pg.barrier();
    } else if (shared) {
      (void)pg.all_gather_object_shared(payload(pg.rank(), 0));
    } else {
      (void)pg.all_gather_object(payload(pg.rank(), 0));
    }
  };
  LocalWorld plain_world(3);
  const auto plain = plain_world.run([&](ProcessGroup& pg) { body(pg, false); });
  LocalWorld world(3);
  ObjectExchange exchange(3);
  const auto sharing =
      run_sharing(world, exchange, [&](SharingProcessGroup& pg) { body(pg, true); });
  EXPECT_EQ(errors_of(sharing), errors_of(plain));
  EXPECT_NE(errors_of(sharing)[1].find("collective mismatch"), std::string::npos);
}

TEST(ObjectExchange, SequenceNumbersFollowTheWorld) {
  LocalWorld world(2);
  ObjectExchange exchange(2);
  std::vector<uint64_t> counts(2);
  expect_all_ok(run_sharing(world, exchange, [&](SharingProcessGroup& pg) {
    std::vector<float> f(2), g(1);
    std::vector<std::byte> b(1), c(2);
    pg.barrier();
    pg.reduce_scatter_sum(f, g);
    pg.all_reduce_sum(g);
    pg.all_gather(b, c);
    (void)pg.all_gather_object({});
    (void)pg.all_gather_object_shared({'x'});
    (void)pg.broadcast_object({}, 1);
    (void)pg.all_gather_object_shared({'y'});
    counts[static_cast<size_t>(pg.rank())] = pg.sequence_number();
    EXPECT_EQ(pg.backend_name(), "local");
  }));
  EXPECT_EQ(counts, (std::vector<uint64_t>{8, 8}));
}

}  // namespace
