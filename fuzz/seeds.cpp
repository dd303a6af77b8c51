// The seed corpora of fuzz/seeds.h, read from the repository's real files.
#include "fuzz/seeds.h"

#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "fuzz/fuzz_support.h"
#include "model/torch/distributed_checkpoint.h"

namespace ckptsim::fuzz {

namespace fs = std::filesystem;

namespace {

// The entries of `dir` (recursively when asked), sorted by path, so that the seeds come in
// the same order on every machine.
std::vector<fs::path> sorted_entries(const fs::path& dir, bool recursive = false) {
  std::vector<fs::path> out;
  if (recursive) {
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) out.push_back(e);
  } else {
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) out.push_back(e);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw SeedError{"cannot read " + p.string()};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint64_t fnv1a(const std::string& bytes) {
  uint64_t h = 14695981039346656037ull;
  for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// Seeds by fuzzer, each once (by its bytes).
class Corpora {
 public:
  void add(const std::string& fuzzer, const std::string& bytes) {
    if (seen_[fuzzer].insert(bytes).second) seeds_[fuzzer].push_back(bytes);
  }
  SeedCorpora take() && { return std::move(seeds_); }

 private:
  std::map<std::string, std::set<std::string>> seen_;
  SeedCorpora seeds_;
};

// The data.pkl of a torch.save blob, read with libtorch's zip reader; "" when there is none.
std::string data_pkl(const std::string& blob) {
  try {
    std::istringstream in(blob);
    caffe2::serialize::PyTorchStreamReader archive(&in);
    if (!archive.hasRecord("data.pkl")) return "";
    auto [data, size] = archive.getRecord("data.pkl");
    return std::string(static_cast<const char*>(data.get()), size);
  } catch (const std::exception&) {
    return "";
  }
}

void add_blob(Corpora& c, const std::string& blob) {
  c.add("torch_save_fuzzer", blob);
  if (const std::string pkl = data_pkl(blob); !pkl.empty()) c.add("pickle_tree_fuzzer", pkl);
}

// One iteration directory of a real checkpoint.
void add_iteration(Corpora& c, const fs::path& iter, const std::string& fixture) {
  const std::string metadata = read(iter / ".metadata");
  c.add("dcp_metadata_fuzzer", metadata);
  c.add("pickle_tree_fuzzer", metadata);
  Result<model::DcpMetadata> meta =
      model::parse_dcp_metadata({metadata.data(), metadata.size()}, (iter / ".metadata").string());
  if (!meta.is_ok()) throw SeedError{meta.status().message()};
  std::map<std::string, std::string> files;
  for (const model::StorageDataEntry& e : meta.value().storage_data) {
    auto it = files.find(e.info.relative_path);
    if (it == files.end()) {
      it = files.emplace(e.info.relative_path, read(iter / e.info.relative_path)).first;
    }
    if (uint64_t(e.info.offset + e.info.length) > it->second.size()) {
      throw SeedError{fmt::format("{}: an item past the end", e.info.relative_path)};
    }
    add_blob(c, it->second.substr(e.info.offset, e.info.length));
  }
  if (fs::exists(iter / "common.pt")) add_blob(c, read(iter / "common.pt"));
  if (fixture == "nv-f4502eb1c9__torch-adamw-dp1") {  // dcp_reader_fuzzer's checkpoint
    c.add("dcp_reader_fuzzer", files.at("__0_0.distcp"));
  }
}

void add_checkpoints(Corpora& c, const fs::path& source) {
  const fs::path root = source / "tests/fixtures/real-checkpoints";
  for (const fs::path& fixture : sorted_entries(root)) {
    if (!fs::is_directory(fixture) || fixture.filename() == "runs") continue;
    std::vector<std::pair<std::string, std::string>> packed;
    for (const fs::path& f : sorted_entries(fixture, true)) {
      if (fs::is_regular_file(f)) {
        packed.emplace_back(fs::relative(f, fixture).generic_string(), read(f));
      }
    }
    c.add("torch_dist_checkpoint_fuzzer", pack_files(packed));
    for (const fs::path& iter : sorted_entries(fixture)) {
      if (fs::is_directory(iter)) add_iteration(c, iter, fixture.filename().string());
    }
  }
}

void add_json(Corpora& c, const fs::path& source) {
  for (const fs::path& f : sorted_entries(source / "scenarios", true)) {
    if (fs::is_regular_file(f) && f.extension() == ".json") c.add("scenario_fuzzer", read(f));
  }
  for (const fs::path& f : sorted_entries(source / "revisions")) {
    if (fs::is_regular_file(f) && f.extension() == ".json") {
      c.add("revision_profile_fuzzer", read(f));
    }
  }
}

// Trace files: the model's (tests/fixtures/model-traces/) and the real runner's (the recorded
// runs of the real fixtures and of the crash replays), each under 64 KiB: larger ones add
// nothing a mutation of a smaller one does not reach, and slow every input down.
void add_traces(Corpora& c, const fs::path& source) {
  constexpr uintmax_t kMaxBytes = 64 * 1024;
  for (const char* dir : {"tests/fixtures/model-traces", "tests/fixtures/real-checkpoints/runs",
                          "tests/conformance/crash"}) {
    for (const fs::path& f : sorted_entries(source / dir)) {
      if (fs::is_regular_file(f) && f.string().ends_with(".trace.json") &&
          fs::file_size(f) <= kMaxBytes) {
        c.add("trace_fuzzer", read(f));
      }
    }
  }
}

}  // namespace

SeedCorpora seed_corpora(const fs::path& source) {
  Corpora c;
  add_checkpoints(c, source);
  add_json(c, source);
  add_traces(c, source);
  return std::move(c).take();
}

std::string seed_name(const std::string& bytes) { return fmt::format("{:016x}", fnv1a(bytes)); }

}  // namespace ckptsim::fuzz
