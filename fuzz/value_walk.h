// The second half of the fuzzers' checks (fuzz/fuzz_support.h has the first): a Value that a
// reader returned holds only tensors whose every element lies inside their storage, and is no
// deeper than kValueDepthMax. Apart from fuzz_support.h because it needs libtorch, which the
// pickle fuzzer does without.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <set>

#include "fuzz/fuzz_support.h"
#include "model/py/value.h"

namespace ckptsim::fuzz {

inline constexpr size_t kValueDepthMax = 256;  // a Value walk: deeper is a broken promise

// Reads the first and the last byte a tensor view reaches, from instrumented code, after
// checking that both lie inside the storage: a view past its storage is a broken promise, and
// AddressSanitizer sees the reads where the check itself would be wrong.
inline void touch_tensor(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return;
  const int64_t element = static_cast<int64_t>(t.element_size());
  __int128 last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) < 0) broken("a tensor with a negative stride");
    last += static_cast<__int128>(t.size(d) - 1) * t.stride(d);
  }
  const __int128 last_byte = (last + 1) * element - 1;
  if (last_byte >= static_cast<__int128>(t.storage().nbytes())) {
    broken("a tensor view past its storage");
  }
  const auto* base = static_cast<const volatile char*>(t.storage().data());
  const char first = base[t.storage_offset() * element];
  const char end = base[static_cast<int64_t>(last_byte)];
  (void)first;
  (void)end;
}

// Walks a Value once per container (a DAG may share them), touching every tensor.
class ValueWalk {
 public:
  void walk(const model::Value& v, size_t depth = 0) {
    if (depth > kValueDepthMax) broken("a Value nested deeper than kValueDepthMax");
    switch (v.kind()) {
      case model::Value::Kind::kTensor:
        return touch_tensor(v.tensor());
      case model::Value::Kind::kTuple:
        if (!seen_.insert(&v.as_tuple()).second) return;
        for (const model::Value& item : v.as_tuple()) walk(item, depth + 1);
        return;
      case model::Value::Kind::kList:
        if (!seen_.insert(v.list().get()).second) return;
        for (const model::Value& item : *v.list()) walk(item, depth + 1);
        return;
      case model::Value::Kind::kDict:
        if (!seen_.insert(v.dict().get()).second) return;
        for (const auto& [key, item] : *v.dict()) {
          (void)key.repr();
          walk(item, depth + 1);
        }
        return;
      default:
        (void)v.repr();
        return;
    }
  }

 private:
  std::set<const void*> seen_;
};

}  // namespace ckptsim::fuzz
