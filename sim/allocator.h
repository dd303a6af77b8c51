// How a simulating process asks glibc's malloc to keep memory it freed.
//
// A simulated case builds and drops every rank's buffers, state dicts and checkpoint bytes
// phase after phase. With glibc's defaults, frees at the top of the heap go back to the
// kernel (trim above 128 KiB, adapting) and blocks above the mmap threshold are mapped and
// unmapped one by one, so the next phase takes the same memory back page fault by page fault,
// zeroed by the kernel. Measured on `check --revision fix-complete --cases 200 --jobs 1` (the
// 2-core VM): about 360 page faults per case before.
#pragma once

namespace ckptsim::sim {

// The malloc this process runs on: "tcmalloc" where tcmalloc-minimal is loaded (CMake's
// CKPTSIM_TCMALLOC links it into the executables), else "glibc" (or "other").
const char* allocator_name();

// Raises glibc's trim threshold to 512 MiB and fixes its mmap threshold at 32 MiB (its
// largest). Call once, early in main(); a no-op where the C library is not glibc.
void keep_freed_memory();

}  // namespace ckptsim::sim
