// Fuzzes model/torch/distributed_checkpoint.h DcpReader end to end: a MemoryStorage holds the
// real `.metadata` of tests/fixtures/real-checkpoints/<kFixture> (fixed) and, as the data file
// kDataFile, the fuzz input; every key whose items all lie in that file is read
// (read_tensor; read_bytes, then load_torch_save of the bytes as Megatron's ShardedObjects
// are), each on its own, so one bad item does not hide the next.
// Checked: a tensor, bytes or a one-line Status naming the checkpoint directory (invariant 4);
// a tensor has the dtype and shape of its metadata and lies inside its storage.
//
// The `.metadata` is the same for every input, so it is parsed once: one storage and one
// opened reader live for the whole process, and each input gets a copy of that reader (its
// metadata, no data file read yet) after the input is written over the data file. Parsing the
// fixed `.metadata` again per input was half of each input's time and tested nothing new
// (dcp_metadata_fuzzer fuzzes that parser).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_targets.h"
#include "fuzz/libtorch_backtraces.h"
#include "fuzz/value_walk.h"
#include "model/storage.h"
#include "model/torch/distributed_checkpoint.h"
#include "model/torch/torch_save_format.h"

namespace ckptsim::fuzz {
namespace {

// DP 1, torch AdamW: its first data file holds tensor chunks and ShardedObject bytes items.
constexpr const char* kFixture = "nv-f4502eb1c9__torch-adamw-dp1/iter_0000003";
constexpr const char* kDir = "ckpt";
constexpr const char* kDataFile = "__0_0.distcp";

struct Fixed {
  std::string metadata;                  // the bytes of `.metadata`
  std::vector<std::string> tensors;      // keys whose every chunk lies in kDataFile
  std::vector<std::string> bytes_items;  // bytes keys whose item lies in kDataFile
};

const Fixed& fixed() {
  static const Fixed f = [] {
    Fixed out;
    const std::string path = std::string(CKPTSIM_SOURCE_DIR) + "/tests/fixtures/real-checkpoints/" +
                             kFixture + "/.metadata";
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    out.metadata = ss.str();
    Result<model::DcpMetadata> meta =
        model::parse_dcp_metadata({out.metadata.data(), out.metadata.size()}, path);
    if (!in || !meta.is_ok()) {
      std::fprintf(stderr, "dcp_reader_fuzzer: cannot read %s\n", path.c_str());
      std::abort();
    }
    for (const auto& [fqn, t] : meta.value().tensors) {
      bool here = true;
      for (const model::ChunkStorageMetadata& c : t.chunks) {
        here = here && meta.value().find(fqn, c.offsets)->relative_path == kDataFile;
      }
      if (here) out.tensors.push_back(fqn);
    }
    for (const std::string& fqn : meta.value().bytes_items) {
      if (meta.value().find(fqn, std::nullopt)->relative_path == kDataFile) {
        out.bytes_items.push_back(fqn);
      }
    }
    return out;
  }();
  return f;
}

void read_all(model::DcpReader& reader) {
  const model::DcpMetadata& meta = reader.metadata();
  for (const std::string& fqn : fixed().tensors) {
    Result<at::Tensor> t = reader.read_tensor(fqn);
    if (!t.is_ok()) {
      check_error(t.status(), kDir);
      continue;
    }
    const model::TensorStorageMetadata& want = meta.tensors.at(fqn);
    if (t.value().scalar_type() != want.dtype || t.value().sizes().vec() != want.size) {
      broken("a tensor of another dtype or shape than its metadata: " + fqn);
    }
    touch_tensor(t.value());
  }
  for (const std::string& fqn : fixed().bytes_items) {
    Result<std::vector<char>> bytes = reader.read_bytes(fqn);
    if (!bytes.is_ok()) {
      check_error(bytes.status(), kDir);
      continue;
    }
    Result<model::Value> obj = model::load_torch_save(bytes.value());
    if (!obj.is_ok()) {
      check_error(obj.status(), "torch.save");
      continue;
    }
    ValueWalk().walk(obj.value());
  }
}

// The process's storage (the fixed `.metadata`; the data file is each input) and a reader of
// it opened once. REQUIRES: one input at a time (libFuzzer runs inputs one after the other).
struct Opened {
  model::MemoryStorage storage;
  model::DcpReader reader{storage, kDir};
};

Opened& opened() {
  static Opened* const o = [] {
    auto* out = new Opened;  // never freed: lives as long as the process, like fixed()
    const std::string metadata = std::string(kDir) + "/.metadata";
    if (!out->storage.write_file(metadata, {fixed().metadata.data(), fixed().metadata.size()})
             .is_ok()) {
      broken("MemoryStorage refused a write");
    }
    if (Status s = out->reader.open(); !s.is_ok()) broken("the fixed .metadata: " + s.message());
    return out;
  }();
  return *o;
}

}  // namespace

void fuzz_dcp_reader(std::span<const char> input) {
  Opened& o = opened();
  if (!o.storage.write_file(std::string(kDir) + "/" + kDataFile, input).is_ok()) {
    broken("MemoryStorage refused a write");
  }
  model::DcpReader reader = o.reader;  // the parsed metadata; no data file read yet
  read_all(reader);
}

}  // namespace ckptsim::fuzz

#ifndef CKPTSIM_FUZZ_IN_TESTS
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  ckptsim::fuzz::skip_libtorch_backtraces();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptsim::fuzz::fuzz_dcp_reader(ckptsim::fuzz::as_chars(data, size));
  return 0;
}
#endif
