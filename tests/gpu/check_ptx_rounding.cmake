# ctest `cuda_kernel_ptx_rounding` (label cpu: needs nvcc at build time, no GPU): the PTX of
# the FusedAdam kernel, built with the library's rounding flags, must do float arithmetic the
# way the CPU reference does (model/kernels/cuda/fused_adam_cuda.cu says why), so:
#   * no fused multiply-add on floats (fma.*.f32 / mad.*.f32): each a·b + c is two roundings
#     on the CPU;
#   * division and square root correctly rounded (div.rn.f32, sqrt.rn.f32), never the
#     approximate or "full-range" forms;
#   * no flush-to-zero (.ftz): the CPU keeps denormals.
# The kernel has two independent defences, the _rn intrinsics and --fmad=false; either one
# keeps the PTX free of fma. Mutation run: the intrinsics replaced by * and + AND nvcc's
# default --fmad=true -> this check fails ("fma.rn.f32 ..."; "mul.rn.f32 not found"); the
# same replacement with --fmad=false still passes, as it should. Also caught by construction:
# -ftz=true or --use_fast_math (".ftz." appears).
cmake_minimum_required(VERSION 3.25)
if(NOT EXISTS "${PTX}")
  message(FATAL_ERROR "PTX file '${PTX}' is missing: build the ckptsim_kernel_ptx target")
endif()
file(READ "${PTX}" ptx)

if(NOT ptx MATCHES "\\.entry[ \t]+[A-Za-z0-9_]*fused_adam_kernel")
  message(FATAL_ERROR "${PTX}: no fused_adam_kernel entry point")
endif()

set(failures "")
foreach(forbidden
    "fma\\.[a-z.]*f32" "mad\\.[a-z.]*f32" "div\\.approx" "div\\.full" "sqrt\\.approx"
    "rcp\\.approx" "rsqrt" "\\.ftz\\.")
  string(REGEX MATCH "[^\n]*${forbidden}[^\n]*" hit "${ptx}")
  if(hit)
    string(STRIP "${hit}" hit)
    string(REPLACE ";" "" hit "${hit}")  # PTX statements end in ';', a CMake list separator
    list(APPEND failures "forbidden '${forbidden}': ${hit}")
  endif()
endforeach()
foreach(required "div\\.rn\\.f32" "sqrt\\.rn\\.f32" "mul\\.rn\\.f32" "add\\.rn\\.f32"
                 "sub\\.rn\\.f32" "ld\\.global[a-z.]*\\.v4\\.f32" "st\\.global[a-z.]*\\.v4\\.f32")
  if(NOT ptx MATCHES "${required}")
    list(APPEND failures "required '${required}' not found")
  endif()
endforeach()

if(failures)
  list(JOIN failures "\n  " text)
  message(FATAL_ERROR "${PTX}: the kernel must not round differently from the CPU:\n  ${text}")
endif()
message(STATUS "PTX rounding check passed: ${PTX}")
