// Fiber: a function that runs on its own stack, on the thread that resumes it, and gives the
// thread back only where it says so (Fiber::suspend). LocalWorld runs a world's ranks as fibers
// on one OS thread, so a collective is a switch of a few hundred nanoseconds instead of a futex
// wake-up and a trip through the kernel's scheduler, and a world of 4096 ranks is not 4096
// threads.
//
// On x86-64 a switch is our own few instructions (fiber.cpp: the callee-saved registers, MXCSR
// and the x87 control word, and the stack pointer; no system call); elsewhere POSIX ucontext
// (makecontext/swapcontext, which also saves the signal mask with a system call). Either way
// AddressSanitizer is told of every switch (__sanitizer_start_switch_fiber), so ASan builds see
// no false stack errors.
//
// Invariants:
//   1. A fiber runs only inside resume(), on the resuming thread; resume() returns when the
//      fiber suspends or its function returns. Nothing runs concurrently with it.
//   2. Exactly one stack per fiber, kFiberStackBytes (plus a PROT_NONE guard page below it, so
//      an overflow faults instead of writing into a neighbour), reused through a per-thread
//      pool of at most kFiberStackPoolMax stacks.
//   3. An exception escaping the function is caught on the fiber's stack and rethrown by the
//      resume() that ran it; the fiber is then finished.
//
// Per-thread state that C++ keeps for exceptions being handled (std::current_exception inside
// a catch block) is shared by the fibers of one thread: a fiber must not suspend inside a catch
// block. LocalWorld's ranks suspend only inside collectives, which the model never calls from a
// handler.
//
// Threading: a Fiber belongs to the thread that first resumes it.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>

namespace ckptsim::sim {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr std::size_t kFiberStackBytes = std::size_t{8} << 20;  // ASan frames are larger
#else
inline constexpr std::size_t kFiberStackBytes = std::size_t{1} << 20;
#endif
inline constexpr std::size_t kFiberStackPoolMax = 64;

class Fiber {
 public:
  explicit Fiber(std::function<void()> f);
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;
  // REQUIRES: finished() or never resumed (a suspended fiber's frames would never unwind).
  ~Fiber();

  // Runs the fiber until it suspends or returns; rethrows what its function threw.
  // REQUIRES: !finished(); not called from inside this fiber.
  void resume();

  // Gives the thread back to the resume() that runs the calling fiber.
  // REQUIRES: called from inside a fiber.
  static void suspend();

  // The fiber running on this thread, or nullptr outside any fiber.
  static Fiber* current();

  bool started() const { return started_; }
  bool finished() const { return finished_; }

 private:
  struct Context;
  static void run(Fiber* self);  // the fiber's outermost frame
#if !defined(__x86_64__)
  static void entry(unsigned int high, unsigned int low);  // ucontext's way into run()
#endif

  std::function<void()> f_;
  std::unique_ptr<Context> context_;
  std::exception_ptr error_;
  bool started_ = false;
  bool finished_ = false;
};

}  // namespace ckptsim::sim
