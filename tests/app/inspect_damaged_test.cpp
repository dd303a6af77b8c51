// `ckptsim inspect` on damaged copies of real checkpoints (tests/fixtures/real-checkpoints): each
// kind of damage a crashed or interrupted save leaves (a data file cut short, emptied or missing;
// `.metadata` cut, emptied or missing; metadata.json missing; common.pt cut or emptied; a
// tracker left empty or naming an iteration whose directory is absent) is a finding naming the
// damaged file, exit 1, and a class for every revision. None crashes the tool.
//
// Where the real code was seen to meet the same damage (the crash replays on the H200,
// tests/conformance/crash/), each rank's own error (type and site) of the model's resume must be
// the real one. The expected file names come from the damage applied, the expected errors from
// those recorded traces, not from the code under test.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "app/commands.h"

namespace {

namespace fs = std::filesystem;
using namespace ckptsim;

const fs::path kFixtures = fs::path(CKPTSIM_SOURCE_DIR) / "tests/fixtures/real-checkpoints";
// Saved at upstream-2874 (nv-f4502eb1c9): common.pt, torch AdamW, DP 2, iteration 3.
const std::string k2874 = "nv-f4502eb1c9__torch-adamw-dp2";
const std::string k2874Scenario = "fx-upstream-2874-torch-adamw-dp2";
// Saved at upstream-head (nv-d98e8a64dd): the common state is an item of rank 0's .distcp.
const std::string kHead = "nv-d98e8a64dd__fused-adam-dp2-common-state-object";
const std::string kHeadScenario = "fx-upstream-head-fused-adam-dp2";
const std::string kIter = "iter_0000003";

void cut_to(const fs::path& f, uintmax_t bytes) { fs::resize_file(f, bytes); }
void write_text(const fs::path& f, const std::string& text) { std::ofstream(f) << text; }

struct Damage {
  std::string name;
  std::string fixture;
  std::string scenario;  // runs/<scenario>.scenario.json; "" lets inspect infer the run
  std::function<void(const fs::path& root)> apply;
  std::string named;                                           // what the output must name
  app::ResumeClass expected = app::ResumeClass::kResumeFails;  // at every revision
  // The real code's resume from the same damage: the revision, and every rank's own error
  // "<rank> <type> [<site>]" as the recorded trace gives them; none where nothing was replayed.
  std::string real_revision;
  std::set<std::string> real_errors;
  std::string real_trace;  // which one (for the failure message)
};

void PrintTo(const Damage& d, std::ostream* os) { *os << d.name; }

std::string at(const std::string& file) { return kIter + "/" + file; }

// A damage not replayed on the real code.
Damage unreplayed(std::string name, std::string fixture, std::string scenario,
                  std::function<void(const fs::path& root)> apply, std::string named,
                  app::ResumeClass expected = app::ResumeClass::kResumeFails) {
  return Damage{std::move(name),
                std::move(fixture),
                std::move(scenario),
                std::move(apply),
                std::move(named),
                expected,
                "",
                {},
                ""};
}

const std::vector<Damage>& damages() {
  static const std::vector<Damage> all = {
      // A cut past the model weights (which both ranks read): 12000 of 24695 bytes loses rank
      // 0's optimizer shard only, as the real short write did (only rank 0's load failed). At
      // HEAD only rank 0's own load fails (torch.py load(): checkpoint.load(no_dist=True)).
      {"data file cut short at HEAD",
       kHead,
       kHeadScenario,
       [](const fs::path& r) { cut_to(r / kIter / "__0_0.distcp", 12000); },
       at("__0_0.distcp"),
       app::ResumeClass::kResumeFails,
       "upstream-head",
       {"0 CheckpointException [torch.py load()]"},
       "crash-replay-short-shard-upstream-head__nv-d98e8a64dd"},
      // A small file cut in whole pages lands empty: the real short and torn .metadata, tracker
      // and common.pt were empty files.
      {"empty .metadata at HEAD",
       kHead,
       kHeadScenario,
       [](const fs::path& r) { cut_to(r / kIter / ".metadata", 0); },
       at(".metadata"),
       app::ResumeClass::kResumeFails,
       "upstream-head",
       {"0 CheckpointException [serialization.py load_common_state_dict()]",
        "1 CheckpointException [serialization.py load_common_state_dict()]"},
       "crash-replay-short-metadata-upstream-head__nv-d98e8a64dd"},
      {"empty tracker at HEAD",
       kHead,
       "",
       [](const fs::path& r) { write_text(r / "latest_checkpointed_iteration.txt", ""); },
       "latest_checkpointed_iteration.txt",
       app::ResumeClass::kResumeFails,
       "upstream-head",
       {"0 SystemExit [checkpointing.py read_metadata()]",
        "1 SystemExit [checkpointing.py read_metadata()]"},
       "crash-replay-torn-tracker-upstream-head__nv-d98e8a64dd"},
      {"empty common.pt at upstream-2874",
       k2874,
       k2874Scenario,
       [](const fs::path& r) { cut_to(r / kIter / "common.pt", 0); },
       at("common.pt"),
       app::ResumeClass::kResumeFails,
       "upstream-2874",
       {"0 EOFError [common.py load_common()]", "1 EOFError [common.py load_common()]"},
       "crash-replay-short-object-upstream-2874__nv-f4502eb1c9"},
      // Not replayed on the real code: a class for every revision, and the file named.
      unreplayed(
          "data file cut in half", k2874, "",
          [](const fs::path& r) { cut_to(r / kIter / "__1_0.distcp", 1705); }, at("__1_0.distcp")),
      unreplayed(
          "empty data file (disk full)", k2874, k2874Scenario,
          [](const fs::path& r) { cut_to(r / kIter / "__0_0.distcp", 0); }, at("__0_0.distcp")),
      unreplayed(
          "missing data file", kHead, kHeadScenario,
          [](const fs::path& r) { fs::remove(r / kIter / "__1_0.distcp"); }, at("__1_0.distcp")),
      unreplayed(
          "missing .metadata (crash before the coordinator's finalize)", k2874, k2874Scenario,
          [](const fs::path& r) { fs::remove(r / kIter / ".metadata"); }, at(".metadata")),
      unreplayed(
          "torn .metadata", k2874, k2874Scenario,
          [](const fs::path& r) { cut_to(r / kIter / ".metadata", 2062); }, at(".metadata")),
      unreplayed(
          "torn common.pt", k2874, k2874Scenario,
          [](const fs::path& r) { cut_to(r / kIter / "common.pt", 755); }, at("common.pt")),
      // The model's format has no metadata.json of dist_checkpointing's: not simulated.
      unreplayed(
          "missing metadata.json (crash between .metadata and metadata.json)", k2874, "",
          [](const fs::path& r) { fs::remove(r / kIter / "metadata.json"); }, at("metadata.json"),
          app::ResumeClass::kCannotSimulate),
      unreplayed(
          "tracker written before its data", k2874, "",
          [](const fs::path& r) { write_text(r / "latest_checkpointed_iteration.txt", "9\n"); },
          "names iteration 9, but iter_0000009 is absent"),
  };
  return all;
}

class InspectDamaged : public ::testing::TestWithParam<Damage> {
 protected:
  void SetUp() override {
    std::string slug = GetParam().name;
    for (char& ch : slug) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '-';
    dir_ = fs::temp_directory_path() / ("ckptsim-damaged-" + slug);
    fs::remove_all(dir_);
    fs::copy(kFixtures / GetParam().fixture, dir_, fs::copy_options::recursive);
    for (const auto& e : fs::recursive_directory_iterator(dir_)) {
      fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
    }
    GetParam().apply(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  app::InspectCommand command(std::vector<std::string> revisions) const {
    app::InspectCommand c;
    c.dir = dir_.string();
    c.revisions = std::move(revisions);
    if (!GetParam().scenario.empty()) {
      c.scenario = (kFixtures / "runs" / (GetParam().scenario + ".scenario.json")).string();
    }
    return c;
  }

  fs::path dir_;
};

TEST_P(InspectDamaged, NamesTheDamagedFileAndClassesEveryRevision) {
  const std::vector<std::string> revisions = {"upstream-2874", "upstream-head", "fix-complete"};
  std::ostringstream out;
  std::ostringstream err;
  const int code = app::inspect_command(command(revisions), out, err);
  EXPECT_EQ(code, app::kExitFail) << out.str() << err.str();
  EXPECT_NE(out.str().find(GetParam().named), std::string::npos) << out.str();
  std::ostringstream progress;
  auto r = app::inspect_checkpoint(command(revisions), progress);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r.value().damage.size(), 1u) << out.str();
  ASSERT_EQ(r.value().verdicts.size(), revisions.size());
  for (size_t i = 0; i < revisions.size(); ++i) {
    EXPECT_EQ(r.value().verdicts[i].revision, revisions[i]);
    EXPECT_EQ(r.value().verdicts[i].outcome, GetParam().expected)
        << revisions[i] << ": " << r.value().verdicts[i].cause << "\n"
        << out.str();
  }
}

TEST_P(InspectDamaged, EachRanksErrorIsWhatTheRealCodeRaisedThere) {
  if (GetParam().real_revision.empty()) GTEST_SKIP() << "not replayed on the real code";
  std::ostringstream progress;
  auto r = app::inspect_checkpoint(command({GetParam().real_revision}), progress);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r.value().judgements.size(), 1u) << r.value().cannot_simulate;
  std::set<std::string> model;
  for (const auto& e : r.value().judgements[0].errors) {
    model.insert(std::to_string(e.rank) + " " + e.py_type + " [" + e.site + "]");
    // The model's message names its own file and the user's that it stands for.
    if (GetParam().named.ends_with(".distcp")) {
      EXPECT_NE(e.message.find("[standing for " + GetParam().named + "]"), std::string::npos)
          << e.message;
    }
  }
  EXPECT_EQ(model, GetParam().real_errors) << "the real code: " << GetParam().real_trace;
}

INSTANTIATE_TEST_SUITE_P(Kinds, InspectDamaged, ::testing::ValuesIn(damages()),
                         [](const ::testing::TestParamInfo<Damage>& info) {
                           std::string name;
                           for (char ch : info.param.name) {
                             if (ch == '(') break;
                             if (std::isalnum(static_cast<unsigned char>(ch))) name += ch;
                           }
                           return name;
                         });

}  // namespace
