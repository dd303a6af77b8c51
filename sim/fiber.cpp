#include "sim/fiber.h"

#include <fmt/format.h>
#include <sys/mman.h>
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

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__x86_64__)
// The switch between two stacks, for the System V x86-64 ABI: pushes what a callee must
// preserve (rbp, rbx, r12-r15, then MXCSR and the x87 control word), stores the stack pointer
// in *from, takes `to` as the stack pointer and pops the same from there, and returns into the
// other context. swapcontext does this and also saves the signal mask with a system call
// (rt_sigprocmask), which was about 12 % of the search's time in a VM (perf: pvm_irq_enable
// under swapcontext); no signal mask is changed anywhere in ckptsim, so none is kept.
//   void ckptsim_fiber_switch(void** from /* rdi */, void* to /* rsi */);
// A new fiber's stack is laid out as if it had switched away just before
// ckptsim_fiber_start, with the fiber in r12 and its entry function in r13 (see
// initial_stack below); ckptsim_fiber_start calls entry(fiber) with an aligned stack.
asm(R"(
    .text
    .p2align 4
    .globl ckptsim_fiber_switch
    .hidden ckptsim_fiber_switch
    .type ckptsim_fiber_switch, @function
ckptsim_fiber_switch:
    .cfi_startproc
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    stmxcsr 8(%rsp)
    fnstcw (%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr 8(%rsp)
    fldcw (%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .cfi_endproc
    .size ckptsim_fiber_switch, .-ckptsim_fiber_switch

    .p2align 4
    .globl ckptsim_fiber_start
    .hidden ckptsim_fiber_start
    .type ckptsim_fiber_start, @function
ckptsim_fiber_start:
    .cfi_startproc
    .cfi_undefined rip
    movq %r12, %rdi
    callq *%r13
    ud2
    .cfi_endproc
    .size ckptsim_fiber_start, .-ckptsim_fiber_start
)");
extern "C" void ckptsim_fiber_switch(void** from, void* to);
extern "C" void ckptsim_fiber_start();
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
#if defined(__x86_64__)
  void* fiber_sp = nullptr;   // the fiber's saved stack pointer while it is suspended
  void* caller_sp = nullptr;  // the resumer's, while the fiber runs
#else
  ucontext_t fiber{};
  ucontext_t caller{};
#endif
  void* stack = nullptr;  // lowest usable byte; null once given back
  // ASan: the fake stacks saved across a switch, and the resumer's stack, learned on each entry.
  void* caller_fake_stack = nullptr;
  void* fiber_fake_stack = nullptr;
  const void* caller_bottom = nullptr;
  std::size_t caller_bytes = 0;
};

namespace {

#if defined(__x86_64__)
// The stack pointer a new fiber starts from: below the top of `stack`, the frame that
// ckptsim_fiber_switch pops (x87 control word and MXCSR at their power-on values, r15, r14,
// r13 = entry, r12 = fiber, rbx, rbp = 0: the end of the frame chain for debuggers), then
// ckptsim_fiber_start as the return address. ckptsim_fiber_start is entered with rsp 16-byte
// aligned, so its call leaves entry's frame aligned as the ABI requires.
void* initial_stack(void* stack, void (*entry)(Fiber*), Fiber* fiber) {
  auto top = reinterpret_cast<std::uintptr_t>(stack) + kFiberStackBytes;
  top &= ~std::uintptr_t{15};
  auto* slot = reinterpret_cast<std::uint64_t*>(top);
  // Padding: the ret into ckptsim_fiber_start leaves rsp = top - 16, a multiple of 16.
  *--slot = 0;
  *--slot = 0;
  *--slot = reinterpret_cast<std::uint64_t>(&ckptsim_fiber_start);
  *--slot = 0;                                       // rbp
  *--slot = 0;                                       // rbx
  *--slot = reinterpret_cast<std::uint64_t>(fiber);  // r12
  *--slot = reinterpret_cast<std::uint64_t>(entry);  // r13
  *--slot = 0;                                       // r14
  *--slot = 0;                                       // r15
  *--slot = std::uint64_t{0x1F80};                   // MXCSR (high half of the 16 bytes)
  *--slot = std::uint64_t{0x037F};                   // x87 control word
  return slot;
}
#endif

}  // namespace

Fiber::Fiber(std::function<void()> f) : f_(std::move(f)), context_(std::make_unique<Context>()) {}

Fiber::~Fiber() {
  // A suspended fiber cannot be destroyed safely (its frames would never unwind); a harness
  // bug, and a destructor must not throw, so it is a hard stop.
  if (started_ && !finished_) std::terminate();
  if (context_->stack != nullptr) stack_pool().give_back(context_->stack);
}

Fiber* Fiber::current() { return t_current; }

void Fiber::run(Fiber* self) {
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
#if defined(__x86_64__)
  ckptsim_fiber_switch(&c.fiber_sp, c.caller_sp);
#else
  setcontext(&c.caller);
#endif
  std::terminate();  // never resumed again
}

#if !defined(__x86_64__)
void Fiber::entry(unsigned int high, unsigned int low) {
  run(reinterpret_cast<Fiber*>((static_cast<std::uintptr_t>(high) << 32) |
                               static_cast<std::uintptr_t>(low)));
}
#endif

void Fiber::resume() {
  CKPTSIM_CHECK(!finished_, "resuming a finished fiber");
  CKPTSIM_CHECK(t_current != this, "a fiber resumed itself");
  Context& c = *context_;
  if (!started_) {
    c.stack = stack_pool().take();
#if defined(__x86_64__)
    c.fiber_sp = initial_stack(c.stack, &Fiber::run, this);
#else
    CKPTSIM_CHECK(getcontext(&c.fiber) == 0, "getcontext failed");
    c.fiber.uc_stack.ss_sp = c.stack;
    c.fiber.uc_stack.ss_size = kFiberStackBytes;
    c.fiber.uc_link = nullptr;
    const auto address = reinterpret_cast<std::uintptr_t>(this);
    makecontext(&c.fiber, reinterpret_cast<void (*)()>(&Fiber::entry), 2,
                static_cast<unsigned int>(address >> 32),
                static_cast<unsigned int>(address & 0xffffffffu));
#endif
    started_ = true;
  }
  Fiber* const outer = t_current;
  t_current = this;
  start_switch(&c.caller_fake_stack, c.stack, kFiberStackBytes);
#if defined(__x86_64__)
  ckptsim_fiber_switch(&c.caller_sp, c.fiber_sp);
#else
  swapcontext(&c.caller, &c.fiber);
#endif
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
#if defined(__x86_64__)
  ckptsim_fiber_switch(&c.fiber_sp, c.caller_sp);
#else
  swapcontext(&c.fiber, &c.caller);
#endif
  finish_switch(c.fiber_fake_stack, &c.caller_bottom, &c.caller_bytes);
}

}  // namespace ckptsim::sim
