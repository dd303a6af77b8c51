// model::find_damage on copies of real checkpoints (tests/fixtures/real-checkpoints): whole ones
// give no finding; each damage gives one finding, of its file and kind. The items a cut data
// file lost are judged against `.metadata` as parse_dcp_metadata reads it, not against the
// census's own reading.
#include "model/megatron/checkpoint_damage.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "model/megatron/torch_dist_checkpoint.h"

namespace {

namespace fs = std::filesystem;
using namespace ckptsim;
using model::DamageKind;

const fs::path kFixtures = fs::path(CKPTSIM_SOURCE_DIR) / "tests/fixtures/real-checkpoints";
const std::string k2874 = "nv-f4502eb1c9__torch-adamw-dp2";
const std::string kHead = "nv-d98e8a64dd__fused-adam-dp2-common-state-object";
const std::string kIter = "iter_0000003";

// A writable copy of a fixture, removed at the end.
struct Copy {
  fs::path root;
  explicit Copy(const std::string& fixture) {
    root = fs::temp_directory_path() / ("ckptsim-damage-census-" + fixture);
    fs::remove_all(root);
    fs::copy(kFixtures / fixture, root, fs::copy_options::recursive);
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
    }
  }
  ~Copy() { fs::remove_all(root); }
  model::DamageCensus census(const std::string& iter_dir = "") const {
    const model::DirectoryStorage storage(root.string());
    return model::find_damage(storage, iter_dir);
  }
};

TEST(CheckpointDamage, WholeRealCheckpointsHaveNone) {
  int examined = 0;
  for (const auto& e : fs::directory_iterator(kFixtures)) {
    if (!fs::exists(e.path() / "latest_checkpointed_iteration.txt")) continue;
    const model::DirectoryStorage storage(e.path().string());
    const model::DamageCensus c = model::find_damage(storage, "");
    EXPECT_TRUE(c.empty()) << e.path() << ": " << c.files.front().text();
    EXPECT_TRUE(c.metadata.has_value()) << e.path();
    ++examined;
  }
  EXPECT_GE(examined, 8);
}

TEST(CheckpointDamage, ADataFileCutShortLosesTheItemsPastTheCut) {
  Copy copy(k2874);
  const fs::path file = copy.root / kIter / "__0_0.distcp";
  const auto whole = static_cast<int64_t>(fs::file_size(file));
  const int64_t cut = whole / 2;
  fs::resize_file(file, static_cast<uintmax_t>(cut));
  const model::DamageCensus c = copy.census();
  ASSERT_EQ(c.files.size(), 1u);
  const model::DamagedFile& d = c.files[0];
  EXPECT_EQ(d.file, kIter + "/__0_0.distcp");
  EXPECT_EQ(d.kind, DamageKind::kCut);
  EXPECT_EQ(d.bytes, cut);
  EXPECT_EQ(d.bytes_needed, whole);  // torch writes the items one after another, nothing after
  // Independently: every item of the file that ends past the cut, by the parsed `.metadata`.
  std::ifstream in(copy.root / kIter / ".metadata", std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  auto meta = model::parse_dcp_metadata(bytes, ".metadata");
  ASSERT_TRUE(meta.is_ok()) << meta.status().to_string();
  std::set<std::string> lost;
  for (const auto& e : meta.value().storage_data) {
    if (e.info.relative_path == "__0_0.distcp" && e.info.offset + e.info.length > cut)
      lost.insert(e.index.fqn);
  }
  ASSERT_FALSE(lost.empty());
  EXPECT_EQ(std::set<std::string>(d.items_lost.begin(), d.items_lost.end()), lost);
  EXPECT_EQ(model::lost_data_files(c), std::set<std::string>{"__0_0.distcp"});
}

TEST(CheckpointDamage, EachKindIsOneFindingOfItsFile) {
  struct Case {
    std::string fixture;
    std::function<void(const fs::path&)> apply;
    std::string file;
    DamageKind kind;
  };
  const std::vector<Case> cases = {
      {k2874, [](const fs::path& r) { fs::remove(r / kIter / "__1_1.distcp"); },
       kIter + "/__1_1.distcp", DamageKind::kMissing},
      {k2874, [](const fs::path& r) { fs::resize_file(r / kIter / "__1_0.distcp", 0); },
       kIter + "/__1_0.distcp", DamageKind::kEmpty},
      {k2874, [](const fs::path& r) { fs::resize_file(r / kIter / ".metadata", 100); },
       kIter + "/.metadata", DamageKind::kUnreadable},
      {k2874, [](const fs::path& r) { fs::remove(r / kIter / ".metadata"); }, kIter + "/.metadata",
       DamageKind::kMissing},
      {k2874, [](const fs::path& r) { fs::resize_file(r / kIter / "common.pt", 0); },
       kIter + "/common.pt", DamageKind::kEmpty},
      {k2874, [](const fs::path& r) { fs::remove(r / kIter / "common.pt"); }, kIter + "/common.pt",
       DamageKind::kMissing},
      {k2874, [](const fs::path& r) { std::ofstream(r / kIter / "metadata.json") << "{\"a\""; },
       kIter + "/metadata.json", DamageKind::kUnreadable},
      {k2874,
       [](const fs::path& r) { std::ofstream(r / "latest_checkpointed_iteration.txt") << "3x"; },
       "latest_checkpointed_iteration.txt", DamageKind::kUnreadable},
      {kHead,
       [](const fs::path& r) { std::ofstream(r / "latest_checkpointed_iteration.txt") << "12"; },
       "latest_checkpointed_iteration.txt", DamageKind::kNamesAbsentIteration},
  };
  for (const Case& k : cases) {
    Copy copy(k.fixture);
    k.apply(copy.root);
    const model::DamageCensus c = copy.census();
    ASSERT_EQ(c.files.size(), 1u) << k.file;
    EXPECT_EQ(c.files[0].file, k.file);
    EXPECT_EQ(c.files[0].kind, k.kind) << k.file << ": " << c.files[0].text();
    // The rest is examined in the one iteration directory there.
    EXPECT_EQ(c.iter_dir, kIter) << k.file;
  }
}

TEST(CheckpointDamage, TheTrackersBytesAndTheIterationItNamesAreKept) {
  Copy copy(k2874);
  std::ofstream(copy.root / "latest_checkpointed_iteration.txt") << "release";
  model::DamageCensus c = copy.census();
  ASSERT_EQ(c.files.size(), 1u);
  EXPECT_EQ(c.files[0].content, "release");
  std::ofstream(copy.root / "latest_checkpointed_iteration.txt") << "9";
  c = copy.census();
  ASSERT_EQ(c.files.size(), 1u);
  EXPECT_EQ(c.files[0].named_iteration, 9);
}

// HEAD keeps the common state as an item of rank 0's .distcp: no common.pt is expected there,
// and none is missing; pointed at the iteration directory, no tracker is examined.
TEST(CheckpointDamage, ACheckpointWithTheCommonStateObjectNeedsNoCommonPt) {
  Copy copy(kHead);
  std::ofstream(copy.root / "latest_checkpointed_iteration.txt") << "";
  const model::DamageCensus c = copy.census(kIter);
  EXPECT_TRUE(c.empty()) << c.files.front().text();
  EXPECT_TRUE(c.common_state_object);
}

}  // namespace
