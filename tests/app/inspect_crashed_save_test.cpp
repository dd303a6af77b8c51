// `inspect` on what a save leaves when it fails at each of its writes (issue 25): iteration 2 is
// saved whole, then the save of iteration 3 into the same root goes through a FaultyStorage
// that fires one fault kind at one write (every kind at every write of that save). The save's
// writes come in the exporter's order: the ranks' .distcp files, .metadata, metadata.json, the
// tracker last (model/megatron/torch_dist_writer.h). What inspect must say follows from the
// fault alone:
//   - the save stopped before its tracker write (a crash, a torn file or a full disk before it):
//     the tracker still names iteration 2, which reads whole: not exit 2, iteration 2;
//   - crash_after at the tracker: iteration 3 is complete: not exit 2, iteration 3;
//   - a torn tracker, or a short write anywhere (reported as a success, so the tracker names
//     iteration 3): exit 1 naming the damaged file, and no revision resumes it correctly.
// It never crashes the tool.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/commands.h"
#include "model/faulty_storage.h"
#include "model/megatron/torch_dist_writer.h"
#include "model/storage.h"
#include "tests/app/inspect_testing.h"
#include "tests/testing.h"

namespace {

namespace fs = std::filesystem;
using namespace ckptsim;
using model::StorageFaultKind;

// The simulator's own checkpoint after `steps` steps of one small DP 2 run.
fs::path own_checkpoint(const fs::path& dir, int steps) {
  const sim::Scenario s = test::scenario_from_json(
      R"({"seed": 4,
    "params": [{"name": "w0", "numel": 96, "dtype": "bf16"}, {"name": "w1", "numel": 40, "dtype": "bf16"}],
    "optimizer": {"kind": "fused_adam", "lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8,
                  "weight_decay": 0.1},
    "phases": [{"dp": 2, "revision": "upstream-head", "steps": )" +
          std::to_string(steps) + "}]}",
      "crashed-save");
  sim::RunOptions options;
  options.checkpoint_dir = (dir / ("own" + std::to_string(steps))).string();
  const auto run = test::run(s, options);
  return dir / ("own" + std::to_string(steps)) / sim::saved_directory(run, 0);
}

test::Inspected inspect(const fs::path& root) {
  app::InspectCommand c;
  c.dir = root.string();
  c.revisions = {"upstream-head"};
  return test::inspect_json(c);
}

TEST(InspectCrashedSave, EveryFaultAtEveryWriteLeavesTheLastCompleteCheckpointOrANamedFile) {
  const fs::path dir = fs::temp_directory_path() / "ckptsim-crashed-save";
  fs::remove_all(dir);
  const model::DirectoryStorage own2(own_checkpoint(dir, 2));
  const model::DirectoryStorage own3(own_checkpoint(dir, 3));
  // The writes of iteration 3's save, in order.
  std::vector<std::string> writes;
  {
    model::MemoryStorage scratch;
    model::FaultyStorage counting(scratch, {});
    ASSERT_TRUE(model::export_torch_dist_checkpoint(own3, counting, "").is_ok());
    for (const auto& w : counting.landed()) writes.push_back(w.substr(0, w.find(' ')));
  }
  ASSERT_EQ(writes.back(), "latest_checkpointed_iteration.txt");
  const size_t tracker = writes.size() - 1;
  int cases = 0;
  for (auto kind :
       {StorageFaultKind::kCrashBefore, StorageFaultKind::kCrashAfter, StorageFaultKind::kTorn,
        StorageFaultKind::kShort, StorageFaultKind::kDiskFull}) {
    for (size_t k = 0; k < writes.size(); ++k) {
      const std::string what = model::storage_fault_kind_name(kind) + " at " + writes[k];
      const fs::path root = dir / "root";
      fs::remove_all(root);
      model::DirectoryStorage disk(root);
      ASSERT_TRUE(model::export_torch_dist_checkpoint(own2, disk, "").is_ok());
      model::FaultyStorage faulty(disk, {{kind, "", static_cast<int64_t>(k)}});
      (void)model::export_torch_dist_checkpoint(own3, faulty, "");
      const test::Inspected r = inspect(root);
      ++cases;
      const bool named_damage =
          kind == StorageFaultKind::kShort || (kind == StorageFaultKind::kTorn && k == tracker);
      if (named_damage) {
        EXPECT_EQ(r.code, app::kExitFail) << what << "\n" << r.err;
        ASSERT_EQ(r.out["damage"].size(), 1u) << what << "\n" << r.out.dump(1);
        EXPECT_EQ(r.out["damage"][0]["file"], writes[k]) << what;
        EXPECT_NE(r.out["verdicts"][0]["class"], "resumes correctly") << what;
        continue;
      }
      ASSERT_NE(r.code, app::kExitInvalid) << what << "\n" << r.err;
      const int64_t want = kind == StorageFaultKind::kCrashAfter && k == tracker ? 3 : 2;
      EXPECT_EQ(r.out["iteration"], want) << what;
      EXPECT_EQ(r.out["resumes"][0]["class"], "resumes correctly") << what << r.out.dump(1);
    }
  }
  EXPECT_EQ(cases, 5 * static_cast<int>(writes.size()));
  fs::remove_all(dir);
}

}  // namespace
