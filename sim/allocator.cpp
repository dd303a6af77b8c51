#include "sim/allocator.h"

#include <dlfcn.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ckptsim::sim {

const char* allocator_name() {
  // tcmalloc exports its entry points under tc_ names as well as malloc's.
  if (dlsym(RTLD_DEFAULT, "tc_malloc") != nullptr) return "tcmalloc";
#if defined(__GLIBC__)
  return "glibc";
#else
  return "other";
#endif
}

void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
#endif
}

}  // namespace ckptsim::sim
