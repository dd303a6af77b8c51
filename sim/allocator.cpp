#include "sim/allocator.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ckptsim::sim {

void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
#endif
}

}  // namespace ckptsim::sim
