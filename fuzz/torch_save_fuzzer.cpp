// Fuzzes model/torch/torch_save_format.h load_torch_save() with the bytes of one torch.save
// blob (a zip archive): what common.pt holds, and every item of a `.distcp` data file.
// Checked: a Value or a one-line Status (invariant 1); a Value's tensors lie inside their
// storages (fuzz/value_walk.h).
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_targets.h"
#include "fuzz/libtorch_backtraces.h"
#include "fuzz/value_walk.h"
#include "model/torch/torch_save_format.h"

namespace ckptsim::fuzz {

void fuzz_torch_save(std::span<const char> input) {
  Result<model::Value> value = model::load_torch_save(input);
  if (!value.is_ok()) {
    check_error(value.status(), "torch.save");
    return;
  }
  ValueWalk().walk(value.value());
}

}  // namespace ckptsim::fuzz

#ifndef CKPTSIM_FUZZ_IN_TESTS
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  ckptsim::fuzz::skip_libtorch_backtraces();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptsim::fuzz::fuzz_torch_save(ckptsim::fuzz::as_chars(data, size));
  return 0;
}
#endif
