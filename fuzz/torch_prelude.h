// The precompiled header of the fuzz build's libtorch units (fuzz/fuzzers.cmake): cmake/pch.h,
// with <ATen/core/ivalue.h> first. Why: libtorch 1.13's headers are not valid C++20 under
// clang with libstdc++ 12. <ATen/core/List.h> (reached from <ATen/ops/*.h>) moves a
// std::vector<c10::IValue> in an inline constructor while c10::IValue is still incomplete, and
// since C++20 made std::vector's destructor constexpr, clang instantiates it there and fails
// (GCC, which builds everything else, defers it). Included first, ivalue.h completes IValue
// before List.h's inline code, and the same headers compile.
#pragma once

#include <ATen/core/ivalue.h>

#include "../cmake/pch.h"
