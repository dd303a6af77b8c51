#include "sim/fiber.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>
#include <vector>

#include "model/errors.h"

#if defined(__SANITIZE_ADDRESS__)
#define CKPTSIM_ASAN_FIBERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CKPTSIM_ASAN_FIBERS 1
#endif
#endif

#if defined(CKPTSIM_ASAN_FIBERS)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace ckptsim::sim {

namespace {

// ASan's view of a stack switch; no-ops in other builds.
void start_switch(void** fake_stack_save, const void* bottom, std::size_t size) {
#if defined(CKPTSIM_ASAN_FIBERS)
  __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
#else
  (void)fake_stack_save, (void)bottom, (void)size;
#endif
}

void finish_switch(void* fake_stack_save, const void** bottom_old, std::size_t* size_old) {
#if defined(CKPTSIM_ASAN_FIBERS)
  __sanitizer_finish_switch_fiber(fake_stack_save, bottom_old, size_old);
#else
  (void)fake_stack_save, (void)bottom_old, (void)size_old;
#endif
}

std::size_t page_bytes() {
  static const std::size_t bytes = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return bytes;
}

// Stacks of kFiberStackBytes with a guard page below each; at most kFiberStackPoolMax kept
// per thread (their touched pages stay mapped, so a reused stack takes no page faults).
class StackPool {
 public:
  StackPool() = default;
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;
  ~StackPool() {
    for (void* stack : free_) unmap(stack);
  }

  // The lowest usable byte of a fresh or reused stack.
  void* take() {
    if (!free_.empty()) {
      void* stack = free_.back();
      free_.pop_back();
#if defined(CKPTSIM_ASAN_FIBERS)
      // The frames of the fiber that last used it may still be poisoned.
      __asan_unpoison_memory_region(stack, kFiberStackBytes);
#endif
      return stack;
    }
    const std::size_t guard = page_bytes();
    void* base = mmap(nullptr, kFiberStackBytes + guard, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (base == MAP_FAILED) {
      throw std::runtime_error(fmt::format("cannot map a fiber stack of {} bytes: {}",
                                           kFiberStackBytes, std::strerror(errno)));
    }
    CKPTSIM_CHECK(
        mprotect(base, guard, PROT_NONE) == 0,
        fmt::format("cannot protect a fiber stack's guard page: {}", std::strerror(errno)));
    return static_cast<std::byte*>(base) + guard;
  }

  void give_back(void* stack) {
    if (free_.size() < kFiberStackPoolMax) {
      free_.push_back(stack);
    } else {
      unmap(stack);
    }
  }

 private:
  static void unmap(void* stack) {
    const std::size_t guard = page_bytes();
    munmap(static_cast<std::byte*>(stack) - guard, kFiberStackBytes + guard);
  }

  std::vector<void*> free_;
};

StackPool& stack_pool() {
  thread_local StackPool pool;
  return pool;
}

thread_local Fiber* t_current = nullptr;

}  // namespace

struct Fiber::Context {
  ucontext_t fiber{};
  ucontext_t caller{};
  void* stack = nullptr;  // lowest usable byte; null once given back
  // ASan: the fake stacks saved across a switch, and the resumer's stack, learned on each entry.
  void* caller_fake_stack = nullptr;
  void* fiber_fake_stack = nullptr;
  const void* caller_bottom = nullptr;
  std::size_t caller_bytes = 0;
};

Fiber::Fiber(std::function<void()> f) : f_(std::move(f)), context_(std::make_unique<Context>()) {}

Fiber::~Fiber() {
  // A suspended fiber cannot be destroyed safely (its frames would never unwind); a harness
  // bug, and a destructor must not throw, so it is a hard stop.
  if (started_ && !finished_) std::terminate();
  if (context_->stack != nullptr) stack_pool().give_back(context_->stack);
}

Fiber* Fiber::current() { return t_current; }

void Fiber::entry(unsigned int high, unsigned int low) {
  auto* self = reinterpret_cast<Fiber*>((static_cast<std::uintptr_t>(high) << 32) |
                                        static_cast<std::uintptr_t>(low));
  Context& c = *self->context_;
  finish_switch(nullptr, &c.caller_bottom, &c.caller_bytes);
  try {
    self->f_();
  } catch (...) {
    self->error_ = std::current_exception();
  }
  self->finished_ = true;
  // A null save: this stack is being left for good (ASan frees its fake frames).
  start_switch(nullptr, c.caller_bottom, c.caller_bytes);
  setcontext(&c.caller);
  std::terminate();  // setcontext returns only on failure
}

void Fiber::resume() {
  CKPTSIM_CHECK(!finished_, "resuming a finished fiber");
  CKPTSIM_CHECK(t_current != this, "a fiber resumed itself");
  Context& c = *context_;
  if (!started_) {
    c.stack = stack_pool().take();
    CKPTSIM_CHECK(getcontext(&c.fiber) == 0, "getcontext failed");
    c.fiber.uc_stack.ss_sp = c.stack;
    c.fiber.uc_stack.ss_size = kFiberStackBytes;
    c.fiber.uc_link = nullptr;
    const auto address = reinterpret_cast<std::uintptr_t>(this);
    makecontext(&c.fiber, reinterpret_cast<void (*)()>(&Fiber::entry), 2,
                static_cast<unsigned int>(address >> 32),
                static_cast<unsigned int>(address & 0xffffffffu));
    started_ = true;
  }
  Fiber* const outer = t_current;
  t_current = this;
  start_switch(&c.caller_fake_stack, c.stack, kFiberStackBytes);
  swapcontext(&c.caller, &c.fiber);
  finish_switch(c.caller_fake_stack, nullptr, nullptr);
  t_current = outer;
  if (finished_) {
    stack_pool().give_back(std::exchange(c.stack, nullptr));
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
}

void Fiber::suspend() {
  Fiber* const self = t_current;
  CKPTSIM_CHECK(self != nullptr, "Fiber::suspend called outside a fiber");
  Context& c = *self->context_;
  start_switch(&c.fiber_fake_stack, c.caller_bottom, c.caller_bytes);
  swapcontext(&c.fiber, &c.caller);
  finish_switch(c.fiber_fake_stack, &c.caller_bottom, &c.caller_bytes);
}

}  // namespace ckptsim::sim
