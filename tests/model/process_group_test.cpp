// GatheredObjects (model/process_group.h): the immutable result of all_gather_object_shared
// that ranks of one process share, and the value they derive from it once.
//
// Which deliberately broken variant each test catches:
//   DerivedIsComputedOnceAndShared      derived() computing per call (every rank decodes the
//                                       save's entries again: the N^2 time and memory back)
//   DerivedOfAnotherInstanceIsItsOwn    a memo keyed by anything but the instance (a second
//                                       save would get the first save's pieces)
//   ComputeThatThrowsCachesNothing      caching a half-built value, or a null, after a throw
//   DerivedAsAnotherTypeIsAnError       static_pointer_cast to whatever type is asked
//   WriteThroughConstCastIsCaught       no fingerprint check: a rank writing into the shared
//                                       bytes changes every other rank's input silently
//   DefaultSharedGatherWrapsTheCopy     a default that drops the bytes or reorders ranks
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "model/errors.h"
#include "model/process_group.h"

using namespace ckptsim::model;

namespace {

std::vector<std::vector<char>> three_ranks() { return {{'a'}, {}, {'b', 'c'}}; }

size_t total_size(const std::vector<std::vector<char>>& objects) {
  size_t n = 0;
  for (const auto& o : objects) n += o.size();
  return n;
}

TEST(GatheredObjects, DerivedIsComputedOnceAndShared) {
  const GatheredObjects gathered(three_ranks());
  std::atomic<int> computed = 0;
  auto compute = [&](const std::vector<std::vector<char>>& objects) {
    ++computed;
    return total_size(objects);
  };
  std::vector<std::shared_ptr<const size_t>> got(8);
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < got.size(); ++r) {
    ranks.emplace_back([&, r] { got[r] = gathered.derived<size_t>(compute); });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(computed.load(), 1);
  for (const auto& g : got) {
    EXPECT_EQ(g, got.front()) << "every rank holds the same value, not a copy";
    EXPECT_EQ(*g, 3u);
  }
}

TEST(GatheredObjects, DerivedOfAnotherInstanceIsItsOwn) {
  const GatheredObjects first(three_ranks());
  const GatheredObjects second({{'x', 'y', 'z', 'w'}});
  EXPECT_EQ(*first.derived<size_t>(total_size), 3u);
  EXPECT_EQ(*second.derived<size_t>(total_size), 4u);
}

TEST(GatheredObjects, ComputeThatThrowsCachesNothing) {
  const GatheredObjects gathered(three_ranks());
  int calls = 0;
  auto flaky = [&](const std::vector<std::vector<char>>& objects) -> size_t {
    if (++calls == 1) throw std::runtime_error("bad entries");
    return total_size(objects);
  };
  EXPECT_THROW(gathered.derived<size_t>(flaky), std::runtime_error);
  EXPECT_EQ(*gathered.derived<size_t>(flaky), 3u);
  EXPECT_EQ(calls, 2);
}

TEST(GatheredObjects, DerivedAsAnotherTypeIsAnError) {
  const GatheredObjects gathered(three_ranks());
  (void)gathered.derived<size_t>(total_size);
  EXPECT_THROW(gathered.derived<int>([](const auto&) { return 1; }), InvariantViolation);
}

TEST(GatheredObjects, WriteThroughConstCastIsCaught) {
  const GatheredObjects gathered(three_ranks());
  EXPECT_NO_THROW(gathered.check_unchanged());
  // The broken rank: it writes into the bytes every other rank shares.
  auto& bytes = const_cast<std::vector<std::vector<char>>&>(gathered.objects());
  bytes[2][0] = 'B';
  EXPECT_THROW(gathered.check_unchanged(), InvariantViolation);
  EXPECT_THROW(gathered.derived<size_t>(total_size), InvariantViolation)
      << "nothing is derived from bytes that changed after the gather";
  bytes[2][0] = 'b';
  EXPECT_NO_THROW(gathered.check_unchanged());
}

class FixedBackend : public ProcessGroup {
 public:
  int rank() const override { return 1; }
  int size() const override { return 3; }
  std::string backend_name() const override { return "fixed"; }
  std::vector<std::vector<char>> all_gather_object(const std::vector<char>& bytes) override {
    return {{'a'}, bytes, {'c'}};
  }
};

TEST(GatheredObjects, DefaultSharedGatherWrapsTheCopy) {
  FixedBackend pg;
  const auto shared = pg.all_gather_object_shared({'m', 'e'});
  ASSERT_NE(shared, nullptr);
  EXPECT_EQ(shared->objects(), (std::vector<std::vector<char>>{{'a'}, {'m', 'e'}, {'c'}}));
}

}  // namespace
