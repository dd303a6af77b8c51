// Fuzzes model/megatron/torch_dist_checkpoint.h read_torch_dist_checkpoint() over a whole
// checkpoint directory: the fuzz input is split into files (fuzz/fuzz_support.h, packed
// files) written to a MemoryStorage, and the directory is read from its root, tracker first.
// Seeds: every directory of tests/fixtures/real-checkpoints, packed.
// Checked: a checkpoint or a one-line Status naming a file of the checkpoint (invariant 3);
// every tensor and object of a checkpoint lies inside its storage (fuzz/value_walk.h); its
// buckets' state tensors have numel_unpadded elements.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_targets.h"
#include "fuzz/libtorch_backtraces.h"
#include "fuzz/value_walk.h"
#include "model/megatron/torch_dist_checkpoint.h"
#include "model/storage.h"

namespace ckptsim::fuzz {
namespace {

// Where an error must point: the tracker, or something under an iteration directory.
bool names_a_file(const std::string& message) {
  return message.find(model::kTrackerFile) != std::string::npos ||
         message.find("iter_") != std::string::npos;
}

void check_checkpoint(const model::TorchDistCheckpoint& c) {
  ValueWalk walk;
  walk.walk(c.common);
  walk.walk(c.sharded);
  for (const model::DpReshardableBucket& b : c.buckets) {
    for (const auto& [state, t] : b.states) {
      if (t.numel() != b.numel_unpadded) broken("a bucket state of another size: " + state);
      touch_tensor(t);
    }
  }
}

}  // namespace

void fuzz_torch_dist_checkpoint(std::span<const char> input) {
  model::MemoryStorage storage;
  for (const auto& [name, bytes] : split_files(input)) {
    (void)storage.write_file(name, {bytes.data(), bytes.size()});  // a bad name: not written
  }
  Result<model::TorchDistCheckpoint> c = model::read_torch_dist_checkpoint(storage, "");
  if (!c.is_ok()) {
    check_error(c.status(), "");
    if (!names_a_file(c.status().message())) {
      broken("a message that names no file: " + c.status().message());
    }
    return;
  }
  check_checkpoint(c.value());
}

}  // namespace ckptsim::fuzz

#ifndef CKPTSIM_FUZZ_IN_TESTS
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  ckptsim::fuzz::skip_libtorch_backtraces();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptsim::fuzz::fuzz_torch_dist_checkpoint(ckptsim::fuzz::as_chars(data, size));
  return 0;
}
#endif
