// Fuzzes model/megatron/torch_dist_checkpoint.h read_torch_dist_checkpoint() over a whole
// checkpoint directory: the fuzz input is split into files (fuzz/fuzz_support.h, packed
// files) written to a MemoryStorage, and the directory is read from its root, tracker first.
// Seeds: every directory of tests/fixtures/real-checkpoints, packed.
// Checked: a checkpoint or a one-line Status naming a file of the checkpoint (invariant 3);
// every tensor and object of a checkpoint lies inside its storage (fuzz/value_walk.h); its
// buckets' state tensors have numel_unpadded elements. Where it does not read, the damage
// census and the zero-filled read inspect does then (check_damage) keep the same promises.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_targets.h"
#include "fuzz/libtorch_backtraces.h"
#include "fuzz/value_walk.h"
#include "model/megatron/checkpoint_damage.h"
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

// What inspect does next with a checkpoint that does not read (model/megatron/
// checkpoint_damage.h): the census of its damage, each finding one line naming its file, and
// the read of the iteration directory with the lost tensor chunks as zeros.
void check_damage(const model::Storage& storage) {
  const model::DamageCensus census = model::find_damage(storage, "");
  for (const model::DamagedFile& d : census.files) {
    check_error(Status::corruption(d.text()), d.file);
    if (d.kind == model::DamageKind::kCut && d.bytes >= d.bytes_needed) {
      broken("a file cut short that holds every byte it needs: " + d.text());
    }
  }
  if (census.iter_dir.empty()) return;
  Result<model::TorchDistCheckpoint> z =
      model::read_torch_dist_directory(storage, census.iter_dir, model::lost_data_files(census));
  if (z.is_ok()) {
    check_checkpoint(z.value());
  } else {
    check_error(z.status(), "");
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
    check_damage(storage);
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
