// Tests of sim/fiber.h. Expected orders and values are written here from the header's
// contract.
//
// Mutations each test catches (deliberately broken variants of fiber.cpp):
//   SuspendReturnsToResume          suspend() going back to another resumer's context (the
//                                   events come out of order, or the process stops).
//   AnExceptionComesBackThroughResume  the exception swallowed on the fiber's stack (resume()
//                                   returns normally) [tried: caught].
//   CurrentNamesTheRunningFiber     Fiber::current() not restored after a switch back [tried:
//                                   the suite stops at the first resume, "terminate called
//                                   without an active exception"].
//   ManyFibersAtOnce                stacks shared between live fibers (their locals collide).
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/fiber.h"

namespace ckptsim::sim {
namespace {

TEST(Fiber, SuspendReturnsToResume) {
  std::vector<std::string> events;
  Fiber a([&] {
    events.push_back("a1");
    Fiber::suspend();
    events.push_back("a2");
  });
  Fiber b([&] {
    events.push_back("b1");
    Fiber::suspend();
    events.push_back("b2");
  });
  a.resume();
  b.resume();
  events.push_back("main");
  b.resume();
  a.resume();
  EXPECT_TRUE(a.finished());
  EXPECT_TRUE(b.finished());
  EXPECT_EQ(events, (std::vector<std::string>{"a1", "b1", "main", "b2", "a2"}));
}

TEST(Fiber, AnExceptionComesBackThroughResume) {
  Fiber f([] {
    Fiber::suspend();
    throw std::out_of_range("from the fiber");
  });
  f.resume();
  EXPECT_FALSE(f.finished());
  try {
    f.resume();
    ADD_FAILURE() << "resume() returned normally";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "from the fiber");
  }
  EXPECT_TRUE(f.finished());
}

TEST(Fiber, CurrentNamesTheRunningFiber) {
  EXPECT_EQ(Fiber::current(), nullptr);
  Fiber* seen = nullptr;
  Fiber f([&] {
    seen = Fiber::current();
    Fiber::suspend();
    seen = Fiber::current();
  });
  f.resume();
  EXPECT_EQ(seen, &f);
  EXPECT_EQ(Fiber::current(), nullptr);
  seen = nullptr;
  f.resume();
  EXPECT_EQ(seen, &f);
  EXPECT_EQ(Fiber::current(), nullptr);
}

// More live fibers than the stack pool keeps, each with locals that must survive its
// suspension untouched by the others.
TEST(Fiber, ManyFibersAtOnce) {
  constexpr int kFibers = static_cast<int>(kFiberStackPoolMax) * 3;
  constexpr int kLocals = 64;
  std::vector<int> sums(kFibers, -1);
  std::vector<const int*> addresses(kFibers, nullptr);
  std::vector<std::unique_ptr<Fiber>> fibers;
  for (int i = 0; i < kFibers; ++i) {
    fibers.push_back(std::make_unique<Fiber>([&sums, &addresses, i] {
      int local[kLocals];
      for (int k = 0; k < kLocals; ++k) local[k] = i + k;
      addresses[static_cast<size_t>(i)] = local;  // escapes: the array stays in memory
      Fiber::suspend();
      int sum = 0;
      for (int k = 0; k < kLocals; ++k) sum += local[k];
      sums[static_cast<size_t>(i)] = sum;
    }));
  }
  for (auto& f : fibers) f->resume();
  const std::set<const int*> distinct(addresses.begin(), addresses.end());
  EXPECT_EQ(distinct.size(), addresses.size()) << "two live fibers share a stack";
  for (auto& f : fibers) f->resume();
  for (int i = 0; i < kFibers; ++i) {
    ASSERT_EQ(sums[static_cast<size_t>(i)], kLocals * i + kLocals * (kLocals - 1) / 2)
        << "fiber " << i;
  }
}

}  // namespace
}  // namespace ckptsim::sim
