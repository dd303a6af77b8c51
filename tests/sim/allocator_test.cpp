// sim/allocator.h: the executables run on the allocator CMake linked them with.
#include "sim/allocator.h"

#include <gtest/gtest.h>

#include <string>

namespace ckptsim {
namespace {

// CMake defines CKPTSIM_LINKED_TCMALLOC where it links this binary with tcmalloc
// (ckptsim_use_allocator); the process must then run on it. Broken variant caught: the
// definition kept and the library left off the link (the binary then ran on glibc's malloc
// while the build said tcmalloc).
TEST(Allocator, TheLinkedOneIsInUse) {
#if defined(CKPTSIM_LINKED_TCMALLOC)
  EXPECT_EQ(std::string(sim::allocator_name()), "tcmalloc");
#else
  EXPECT_NE(std::string(sim::allocator_name()), "tcmalloc");
#endif
}

}  // namespace
}  // namespace ckptsim
