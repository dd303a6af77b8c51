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
//   EachContextKeepsItsRoundingMode  the switch not saving MXCSR and the x87 control word
//                                   [tried on x86-64: stmxcsr/ldmxcsr and fnstcw/fldcw taken
//                                   out of ckptsim_fiber_switch: caught].
//   CalleeSavedRegistersSurviveASwitch  one callee-saved register not restored by the switch
//                                   (its slot popped into rax) [tried on x86-64: r14, this
//                                   test fails; rbx, the suite stops at the first test].
//   AnExceptionComesBackThroughResume also caught a new fiber's first frame 8 bytes off the
//                                   ABI's 16-byte alignment (the unwinder crashed).
#include <gtest/gtest.h>

#include <cfenv>

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

// A rounding mode set in one context stays in that context: the fiber's own across its
// suspension, the resumer's across the fiber's run.
TEST(Fiber, EachContextKeepsItsRoundingMode) {
  const int saved = std::fegetround();
  ASSERT_EQ(std::fesetround(FE_UPWARD), 0);
  int in_fiber_first = -1;
  int in_fiber_after = -1;
  Fiber f([&] {
    in_fiber_first = std::fegetround();
    std::fesetround(FE_DOWNWARD);
    Fiber::suspend();
    in_fiber_after = std::fegetround();
  });
  f.resume();
  const int resumer_between = std::fegetround();
  f.resume();
  const int resumer_after = std::fegetround();
  std::fesetround(saved);
  EXPECT_EQ(in_fiber_first, FE_TONEAREST) << "a new fiber starts at the default rounding";
  EXPECT_EQ(resumer_between, FE_UPWARD);
  EXPECT_EQ(in_fiber_after, FE_DOWNWARD);
  EXPECT_EQ(resumer_after, FE_UPWARD);
}

#if defined(__x86_64__)
// Values held in callee-saved registers (bound with explicit register variables) across a
// suspension, while another fiber writes other values into the same registers and suspends.
TEST(Fiber, CalleeSavedRegistersSurviveASwitch) {
  long seen[5] = {0, 0, 0, 0, 0};
  Fiber holder([&] {
    register long rbx asm("rbx") = 101;
    register long r12 asm("r12") = 112;
    register long r13 asm("r13") = 113;
    register long r14 asm("r14") = 114;
    register long r15 asm("r15") = 115;
    asm volatile("" : "+r"(rbx), "+r"(r12), "+r"(r13), "+r"(r14), "+r"(r15));
    Fiber::suspend();
    asm volatile("" : "+r"(rbx), "+r"(r12), "+r"(r13), "+r"(r14), "+r"(r15));
    seen[0] = rbx, seen[1] = r12, seen[2] = r13, seen[3] = r14, seen[4] = r15;
  });
  Fiber clobber([] {
    asm volatile(
        "mov $7, %%rbx\n\tmov $7, %%r12\n\tmov $7, %%r13\n\tmov $7, %%r14\n\t"
        "mov $7, %%r15" ::
            : "rbx", "r12", "r13", "r14", "r15");
    Fiber::suspend();
  });
  holder.resume();
  clobber.resume();
  holder.resume();
  clobber.resume();
  EXPECT_EQ(seen[0], 101);
  EXPECT_EQ(seen[1], 112);
  EXPECT_EQ(seen[2], 113);
  EXPECT_EQ(seen[3], 114);
  EXPECT_EQ(seen[4], 115);
}
#endif

}  // namespace
}  // namespace ckptsim::sim
