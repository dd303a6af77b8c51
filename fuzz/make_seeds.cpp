// ckptsim_fuzz_seeds SOURCE_DIR OUT_DIR: writes the seed corpus of every fuzzer of fuzz/ into
// OUT_DIR/<fuzzer>/, from the repository's real files, one file per seed named by its bytes'
// FNV-1a hash (so a seed found twice is written once):
//   pickle_tree_fuzzer            every `.metadata`, and the data.pkl of every torch.save blob
//   dcp_metadata_fuzzer           every `.metadata`
//   torch_save_fuzzer             every common.pt, and every item of every `.distcp` file, cut
//                                 out at the offset and length its `.metadata` gives
//   dcp_reader_fuzzer             the data files of the checkpoint dcp_reader_fuzzer reads
//   torch_dist_checkpoint_fuzzer  every checkpoint directory, packed (fuzz/fuzz_support.h)
//   scenario_fuzzer               scenarios/**/*.json
//   revision_profile_fuzzer       revisions/*.json
// The real checkpoints are tests/fixtures/real-checkpoints/*/ (the folder `runs/` aside).
// Each OUT_DIR/<fuzzer>/ is emptied first. Exit 0, or 1 with the reason.
#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
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
namespace {

namespace fs = std::filesystem;

struct SeedError {
  std::string message;
};

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

class Corpora {
 public:
  explicit Corpora(fs::path out) : out_(std::move(out)) {}

  void add(const std::string& fuzzer, const std::string& bytes) {
    const fs::path dir = out_ / fuzzer;
    if (cleared_.insert(fuzzer).second) {
      fs::remove_all(dir);
      fs::create_directories(dir);
    }
    const std::string name = fmt::format("{:016x}", fnv1a(bytes));
    if (seeds_[fuzzer].insert(name).second) std::ofstream(dir / name, std::ios::binary) << bytes;
  }
  const std::map<std::string, std::set<std::string>>& seeds() const { return seeds_; }

 private:
  fs::path out_;
  std::set<std::string> cleared_;
  std::map<std::string, std::set<std::string>> seeds_;  // fuzzer -> seed file names
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
  for (const fs::directory_entry& fixture : fs::directory_iterator(root)) {
    if (!fixture.is_directory() || fixture.path().filename() == "runs") continue;
    std::vector<std::pair<std::string, std::string>> packed;
    for (const fs::directory_entry& f : fs::recursive_directory_iterator(fixture.path())) {
      if (!f.is_regular_file()) continue;
      packed.emplace_back(fs::relative(f.path(), fixture.path()).generic_string(), read(f.path()));
    }
    std::sort(packed.begin(), packed.end());
    c.add("torch_dist_checkpoint_fuzzer", pack_files(packed));
    for (const fs::directory_entry& iter : fs::directory_iterator(fixture.path())) {
      if (iter.is_directory()) add_iteration(c, iter.path(), fixture.path().filename().string());
    }
  }
}

void add_json(Corpora& c, const fs::path& source) {
  for (const fs::directory_entry& f : fs::recursive_directory_iterator(source / "scenarios")) {
    if (f.is_regular_file() && f.path().extension() == ".json") {
      c.add("scenario_fuzzer", read(f.path()));
    }
  }
  for (const fs::directory_entry& f : fs::directory_iterator(source / "revisions")) {
    if (f.is_regular_file() && f.path().extension() == ".json") {
      c.add("revision_profile_fuzzer", read(f.path()));
    }
  }
}

}  // namespace
}  // namespace ckptsim::fuzz

int main(int argc, char** argv) {
  using namespace ckptsim::fuzz;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s SOURCE_DIR OUT_DIR\n", argv[0]);
    return 1;
  }
  Corpora corpora{fs::path(argv[2])};
  try {
    add_checkpoints(corpora, argv[1]);
    add_json(corpora, argv[1]);
  } catch (const SeedError& e) {
    std::fprintf(stderr, "ckptsim_fuzz_seeds: %s\n", e.message.c_str());
    return 1;
  } catch (const fs::filesystem_error& e) {
    std::fprintf(stderr, "ckptsim_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  for (const auto& [fuzzer, names] : corpora.seeds()) {
    std::printf("%s: %zu seeds\n", fuzzer.c_str(), names.size());
  }
  return 0;
}
