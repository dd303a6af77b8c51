// `ckptsim inspect` on the real checkpoints of tests/fixtures/real-checkpoints. Every expected
// value comes from the scenario that produced a checkpoint and the REAL run's trace of it
// (runs/): when a later phase of that run resumed from the checkpoint, the real code's outcome
// of that resume (its errors with their key paths, every Adam part's step counter after the
// load) is what the model's simulated resume from the same files must give.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "app/commands.h"
#include "model/megatron/torch_dist_writer.h"
#include "model/storage.h"
#include "properties/checkpoint_inspection.h"
#include "properties/properties.h"
#include "tests/app/inspect_testing.h"
#include "tests/testing.h"

namespace {

namespace fs = std::filesystem;
using namespace ckptsim;
using json = nlohmann::json;

const std::string kFixtures = std::string(CKPTSIM_SOURCE_DIR) + "/tests/fixtures/real-checkpoints";

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

using test::Inspected;

Inspected inspect(const app::InspectCommand& c) { return test::inspect_json(c); }

Inspected inspect(const std::string& dir, const std::vector<std::string>& revisions, int64_t dp) {
  app::InspectCommand c;
  c.dir = dir;
  c.revisions = revisions;
  c.dp = dp;
  return inspect(c);
}

// A fixture whose checkpoint a later phase of the same real run resumed from.
struct Resumed {
  std::string dir;
  std::string scenario;
  int saved_by;  // the phase that saved it; phase saved_by + 1 resumed
};

void PrintTo(const Resumed& r, std::ostream* os) { *os << r.dir; }

const std::vector<Resumed>& resumed() {
  static const std::vector<Resumed> all = {
      {"nv-f4502eb1c9__hybrid-offload1-dp2-before-resume", "fx-upstream-2874-hybrid-resumed-dp2",
       0},
      {"rx-2e64d788b6__hybrid-offload1-dp1-raw-step-in-common", "fx-miles-main-hybrid-raw-step-dp1",
       0},
      {"rx-2e64d788b6__hybrid-offload1-dp1-raw-step-loaded-by-2874",
       "fx-miles-main-raw-step-dp1-loaded-by-2874", 0},
      {"rx-2e64d788b6__hybrid-offload1-dp2-raw-step-loaded-by-2874",
       "fx-miles-main-raw-step-dp2-loaded-by-2874", 0},
      {"nv-f4502eb1c9__fused-adam-dp1-bf16-and-fp32-buffers", "fx-upstream-2874-fused-adam-dp1", 0},
      {"nv-f4502eb1c9__torch-adamw-dp1", "fx-upstream-2874-torch-adamw-dp1", 0},
      {"nv-f4502eb1c9__torch-adamw-dp2", "fx-upstream-2874-torch-adamw-dp2", 0},
      {"nv-f4502eb1c9__hybrid-offload-half-dp2", "fx-upstream-2874-hybrid-half-dp2", 0},
      {"nv-d98e8a64dd__fused-adam-dp2-common-state-object", "fx-upstream-head-fused-adam-dp2", 0},
      {"nv-d98e8a64dd__hybrid-offload1-fr-tp2-dp1", "fx-upstream-head-fr-tp2-hybrid", 0},
  };
  return all;
}

// What the real run did when it resumed: each rank's own error (type, site, key path) and the
// step counters per Adam part after the load.
struct RealResume {
  std::string revision;
  int64_t dp = 0;
  int64_t tp = 1;
  std::set<std::string> errors;                        // "rank type site path"
  std::map<std::string, std::set<double>> after_load;  // part -> counters
};

RealResume real_resume(const Resumed& r) {
  const json scenario = read_json(kFixtures + "/runs/" + r.scenario + ".scenario.json");
  const json trace = read_json(kFixtures + "/runs/" + r.scenario + ".trace.json");
  RealResume out;
  out.revision = scenario["phases"][r.saved_by + 1]["revision"];
  out.dp = scenario["phases"][r.saved_by + 1]["dp"];
  out.tp = scenario["phases"][r.saved_by + 1].value("tp", 1);
  for (const auto& run : trace["runs"]) {
    if (run["id"] != "phase" + std::to_string(r.saved_by + 1)) continue;
    for (const auto& e : run["events"]) {
      if (e["at"] == "error" && !e["secondary"].get<bool>()) {
        std::string path;
        for (const auto& k : e["merge_path"].is_array() ? e["merge_path"] : json::array()) {
          path += k.get<std::string>() + "/";
        }
        // The real site has the file's path; the model's names the file.
        std::string site = e["site"];
        out.errors.insert(fmt::format("{} {} {} {}", e["rank"].get<int>(),
                                      e["py_type"].get<std::string>(),
                                      site.substr(site.rfind('/') + 1), path));
      }
      if (e["at"] != "after_load") continue;
      for (const auto& p : e["parts"]) out.after_load[p["part"]].insert(p["step"].get<double>());
    }
  }
  return out;
}

RealResume model_resume(const json& judgement) {
  RealResume out;
  out.revision = judgement["revision"];
  out.dp = judgement["dp"];
  for (const auto& e : judgement["errors"]) {
    std::string path;
    for (const auto& k : e["merge_path"]) path += k.get<std::string>() + "/";
    std::string site = e["site"];
    out.errors.insert(fmt::format("{} {} {} {}", e["rank"].get<int>(), e["type"].get<std::string>(),
                                  site.substr(site.rfind('/') + 1), path));
  }
  for (const auto& line : judgement["resumed_at"]) {
    // "HDO cpu AdamW: 3 (w0[0:96], ...)"
    const std::string s = line;
    const size_t colon = s.find(": ");
    out.after_load[s.substr(0, colon)].insert(std::stod(s.substr(colon + 2)));
  }
  return out;
}

int64_t scenario_numel(const json& scenario) {
  int64_t n = 0;
  for (const auto& p : scenario["params"]) n += p["numel"].get<int64_t>();
  return n;
}

class ModelResumesRealCheckpoint : public ::testing::TestWithParam<Resumed> {};

// The model resumes from the very files the real code resumed from, and does what it did.
TEST_P(ModelResumesRealCheckpoint, AsTheRealCodeDidFromTheSameFiles) {
  const RealResume real = real_resume(GetParam());
  app::InspectCommand c;
  c.dir = kFixtures + "/" + GetParam().dir;
  c.revisions = {real.revision};
  c.dp = real.dp;
  c.tp = real.tp;
  const Inspected r = inspect(c);
  ASSERT_NE(r.code, app::kExitInvalid) << r.err;
  // The params inspect read from the checkpoint are the run's: names, dtypes, shapes and (from
  // the chunks of a checkpoint saved at TP > 1) TP splits.
  const json scenario = read_json(kFixtures + "/runs/" + GetParam().scenario + ".scenario.json");
  std::map<std::string, json> inferred;
  for (const auto& p : r.out["params"]) inferred[p["name"]] = p;
  ASSERT_EQ(inferred.size(), scenario["params"].size());
  for (const auto& p : scenario["params"]) {
    const json& mine = inferred[p["name"].get<std::string>()];
    EXPECT_EQ(mine["dtype"], p["dtype"]) << p;
    EXPECT_EQ(mine["shape"], p.value("shape", json::array({p["numel"]}))) << p;
    if (scenario["phases"][GetParam().saved_by].value("tp", 1) > 1) {
      EXPECT_EQ(mine["tp_split"], p.value("tp_split", "replicated")) << p;
    }
  }
  ASSERT_EQ(r.out["resumes"].size(), 1u);
  const json& judgement = r.out["resumes"][0];
  const RealResume model = model_resume(judgement);
  EXPECT_EQ(model.errors, real.errors);
  EXPECT_EQ(model.after_load, real.after_load);
  if (judgement["loaded"].get<bool>()) {
    // Each param's master, exp_avg and exp_avg_sq, whole.
    EXPECT_EQ(judgement["elements_compared"], 3 * scenario_numel(scenario));
    EXPECT_EQ(judgement["elements_equal"], judgement["elements_compared"]);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelResumesRealCheckpoint, ::testing::ValuesIn(resumed()),
                         [](const ::testing::TestParamInfo<Resumed>& info) {
                           std::string name = info.param.dir;
                           for (char& ch : name) ch = std::isalnum(ch) ? ch : '_';
                           return name;
                         });

const json* check_named(const json& out, const std::string& name) {
  for (const auto& c : out["checks"]) {
    if (c["name"] == name) return &c;
  }
  return nullptr;
}

const json* resume_of(const json& out, const std::string& revision) {
  for (const auto& j : out["resumes"]) {
    if (j["revision"] == revision) return &j;
  }
  return nullptr;
}

// Acceptance: the upstream-2874 checkpoint saved after a resume holds the reset steps (group
// step 1 + the steps since, where the iteration counts them all), and inspect says which
// revisions resume it correctly: those that keep the saved step.
TEST(Inspect, ReportsTheResetStepsOfTheUpstream2874Fixture) {
  const json scenario =
      read_json(kFixtures + "/runs/fx-upstream-2874-hybrid-resumed-dp2.scenario.json");
  const int64_t iteration =
      scenario["phases"][0]["steps"].get<int64_t>() + scenario["phases"][1]["steps"].get<int64_t>();
  const double counter = 1.0 + scenario["phases"][1]["steps"].get<double>();  // reset to 1, then on
  const Inspected r = inspect(kFixtures + "/nv-f4502eb1c9__hybrid-offload1-dp2-resumed-steps-reset",
                              {"upstream-2874", "fix-complete"}, 0);
  EXPECT_EQ(r.code, app::kExitFail) << r.err;
  EXPECT_EQ(r.out["iteration"], iteration);
  const json* steps = check_named(r.out, "step_counters_agree");
  ASSERT_NE(steps, nullptr);
  EXPECT_EQ((*steps)["outcome"], "FAILS");
  EXPECT_EQ((*steps)["property"], "step_counts_optimizer_steps");
  // inspect's checks are the registry's checkpoint checks, one per property that has one, in
  // registry order (a property's one home: properties/properties.cpp).
  std::vector<std::pair<std::string, std::string>> registered;
  for (const auto& p : properties::all_properties()) {
    if (p.checkpoint_check) registered.emplace_back(p.checkpoint_check_name, p.name);
  }
  std::vector<std::pair<std::string, std::string>> reported;
  for (const auto& k : r.out["checks"]) reported.emplace_back(k["name"], k["property"]);
  EXPECT_EQ(reported, registered);
  EXPECT_EQ(registered.size(), 4u);
  EXPECT_NE((*steps)["detail"].get<std::string>().find(
                fmt::format("step {} at iteration {}", counter, iteration)),
            std::string::npos)
      << (*steps)["detail"];
  const json* broken = resume_of(r.out, "upstream-2874");
  const json* fixed = resume_of(r.out, "fix-complete");
  ASSERT_TRUE(broken && fixed);
  EXPECT_FALSE((*broken)["correct"].get<bool>());
  EXPECT_TRUE((*fixed)["correct"].get<bool>()) << fixed->dump(1);
  EXPECT_EQ((*fixed)["expected_first_t"], counter + 1);
  // upstream-2874 resets the counter to 1 at the load again: its first step uses t = 2.
  EXPECT_EQ((*broken)["class"], "the resume from this checkpoint fails");
  EXPECT_NE((*broken)["cause"].get<std::string>().find(
                fmt::format("t=2 where t={} is right", counter + 1)),
            std::string::npos)
      << (*broken)["cause"];
}

// Acceptance: on the miles-main fixture inspect predicts upstream-2874's duplicate-leaf error at
// the key path the real code raised it at, when it resumed from these files.
TEST(Inspect, PredictsTheDuplicateLeafAtTheRealKeyPath) {
  const Resumed& f = resumed()[2];
  const RealResume real = real_resume(f);
  ASSERT_EQ(real.revision, "upstream-2874");
  ASSERT_FALSE(real.errors.empty()) << "the real run raised nothing";
  const Inspected r = inspect(kFixtures + "/" + f.dir, {}, real.dp);
  EXPECT_EQ(r.code, app::kExitFail);
  const json* j = resume_of(r.out, "upstream-2874");
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(model_resume(*j).errors, real.errors);
  const json* wrapped = check_named(r.out, "common_state_not_wrapped");
  ASSERT_NE(wrapped, nullptr);
  EXPECT_EQ((*wrapped)["outcome"], "FAILS");
  EXPECT_EQ((*wrapped)["property"], "no_duplicate_leaves");
  EXPECT_NE((*wrapped)["detail"].get<std::string>().find("upstream-2874"), std::string::npos);
}

// Exit 0 when every check holds and the revision resumes correctly: upstream head's own
// FusedAdam checkpoint, resumed by the real head without an error and with step 3 (runs/).
TEST(Inspect, ExitsZeroWhenEveryCheckHoldsAndTheRevisionResumes) {
  const Resumed& f = resumed()[8];
  const RealResume real = real_resume(f);
  ASSERT_TRUE(real.errors.empty());
  const Inspected r = inspect(kFixtures + "/" + f.dir, {real.revision}, real.dp);
  EXPECT_EQ(r.code, app::kExitOk) << r.out.dump(1);
  for (const auto& c : r.out["checks"]) EXPECT_NE(c["outcome"], "FAILS") << c.dump();
}

// A fully reshardable checkpoint the real code wrote at TP 2 x DP 1 (upstream-head, the HDO),
// which phase 1 of the same real run resumed at TP 1 x DP 2: with the scenario (its TP splits
// are not inferred), inspect takes the sizes at save from the checkpoint's args and resumes
// where the real run did, with the real run's errors (none) and step counters after the load.
TEST(Inspect, ResumesARealFullyReshardableTp2CheckpointAtAnotherTpAsTheRealCodeDid) {
  const Resumed f{"nv-d98e8a64dd__hybrid-offload1-fr-tp2-dp1", "fx-upstream-head-fr-tp2-hybrid", 0};
  const RealResume real = real_resume(f);
  ASSERT_TRUE(real.errors.empty());
  ASSERT_FALSE(real.after_load.empty());
  const std::string scenario_file = kFixtures + "/runs/" + f.scenario + ".scenario.json";
  const json scenario = read_json(scenario_file);
  app::InspectCommand c;
  c.dir = kFixtures + "/" + f.dir;
  c.revisions = {real.revision};
  c.scenario = scenario_file;
  auto run = [&](int64_t tp, int64_t dp) {
    c.tp = tp;
    c.dp = dp;
    return inspect(c);
  };
  // Default: the sizes at save (the args say TP 2; DP from the scenario).
  const Inspected at_save = run(0, 0);
  ASSERT_EQ(at_save.code, app::kExitOk) << at_save.err << at_save.out.dump(1);
  EXPECT_EQ(at_save.out["sharding_type"], "fully_reshardable");
  EXPECT_EQ(at_save.out["resume_tp"], scenario["phases"][0]["tp"]);
  EXPECT_EQ(at_save.out["resume_dp"], scenario["phases"][0]["dp"]);
  // The param groups are common state in this format: the step check reads them there.
  const int64_t saved_at = scenario["phases"][0]["steps"].get<int64_t>();
  const json* steps = check_named(at_save.out, "step_counters_agree");
  ASSERT_NE(steps, nullptr);
  EXPECT_EQ((*steps)["outcome"], "holds") << steps->dump();
  EXPECT_NE((*steps)["detail"].get<std::string>().find(
                fmt::format("say step {} at iteration {}", saved_at, saved_at)),
            std::string::npos)
      << steps->dump();
  // Where the real run resumed.
  const Inspected r = run(scenario["phases"][1].value("tp", 1), real.dp);
  ASSERT_EQ(r.code, app::kExitOk) << r.err << r.out.dump(1);
  EXPECT_EQ(r.out["resume_tp"], 1);
  ASSERT_EQ(r.out["resumes"].size(), 1u);
  const RealResume model = model_resume(r.out["resumes"][0]);
  EXPECT_EQ(model.errors, real.errors);
  EXPECT_EQ(model.after_load, real.after_load);
  // Every element of every param's master, exp_avg and exp_avg_sq that the model loaded equals
  // the checkpoint's, read by name from its model-space tensors.
  const json& judgement = r.out["resumes"][0];
  EXPECT_EQ(judgement["elements_compared"], 3 * scenario_numel(scenario));
  EXPECT_EQ(judgement["elements_equal"], judgement["elements_compared"]);
  EXPECT_EQ(judgement["correct"], true);
}

// A dp_reshardable checkpoint (saved at TP 1) resumed at TP 2: refused as Megatron's
// load_checkpoint() refuses a (TP, PP) change for that format, on every rank.
TEST(Inspect, RefusesADpReshardableResumeAtAnotherTp) {
  app::InspectCommand c;
  c.dir = kFixtures + "/nv-d98e8a64dd__fused-adam-dp2-common-state-object";
  c.revisions = {"upstream-head"};
  c.tp = 2;
  c.dp = 1;
  const Inspected r = inspect(c);
  EXPECT_EQ(r.code, app::kExitFail) << r.err;
  const json& j = r.out;
  ASSERT_EQ(j["resumes"].size(), 1u);
  const json& errors = j["resumes"][0]["errors"];
  ASSERT_EQ(errors.size(), 2u) << j.dump(1);
  for (const auto& e : errors) {
    EXPECT_EQ(e["type"], "RuntimeError");
    EXPECT_NE(e["message"].get<std::string>().find("(TP, PP) mismatch after resume ((2, 1) vs "
                                                   "(1, 1) from checkpoint)"),
              std::string::npos)
        << e.dump();
  }
}

// The directory a bug report attaches (the one holding `.metadata`) reads as the root does: the
// iteration from its name, the same checks and the same outcome per revision.
TEST(Inspect, ReadsTheIterationDirectoryItselfAsItsRoot) {
  const std::string root = kFixtures + "/nv-f4502eb1c9__hybrid-offload1-dp2-resumed-steps-reset";
  const Inspected whole = inspect(root, {"upstream-2874", "fix-complete"}, 0);
  const Inspected iter = inspect(root + "/iter_0000006/", {"upstream-2874", "fix-complete"}, 0);
  ASSERT_NE(iter.code, app::kExitInvalid) << iter.err;
  EXPECT_EQ(iter.code, whole.code);
  EXPECT_EQ(whole.out["iteration_from"], "the tracker");
  EXPECT_EQ(iter.out["iteration_from"], "the directory's name");
  EXPECT_EQ(iter.out["iteration"], 6);
  EXPECT_EQ(iter.out["checks"], whole.out["checks"]);
  EXPECT_EQ(iter.out["verdicts"], whole.out["verdicts"]);
  EXPECT_EQ(iter.out["answer"], whole.out["answer"]);
}

// A torch_dist checkpoint the simulator writes for `scenario_json` (one phase), in a fresh
// directory: the root holding the tracker.
fs::path model_checkpoint(const std::string& name, const std::string& scenario_json) {
  const fs::path dir = fs::temp_directory_path() / ("ckptsim-inspect-" + name);
  fs::remove_all(dir);
  sim::RunOptions options;
  options.checkpoint_dir = dir.string();
  options.checkpoint_format = sim::CheckpointFormat::kTorchDist;
  test::run(test::scenario_from_json(scenario_json, name), options);
  return dir / "phase_0";
}

const json* verdict_of(const json& out, const std::string& revision) {
  for (const auto& v : out["verdicts"]) {
    if (v["revision"] == revision) return &v;
  }
  return nullptr;
}

// Without TE, upstream-2874 cannot even build the HDO's config (TypeError in
// is_te_min_version(), POST's utils.py): a fresh start fails the same way, so inspect says the
// revision cannot run this configuration, not that the checkpoint does not resume; upstream
// head, which answers False there, gets to the load.
TEST(Inspect, TellsARevisionThatCannotRunTheConfigurationFromAFailingResume) {
  const fs::path dir = model_checkpoint("no-te", R"({"seed": 1,
    "params": [{"name": "w0", "numel": 96, "dtype": "bf16"}, {"name": "w1", "numel": 40, "dtype": "bf16"}],
    "optimizer": {"kind": "hybrid", "lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8,
                  "weight_decay": 0.1, "offload_fraction": 1.0, "transformer_engine": "absent"},
    "phases": [{"dp": 1, "revision": "upstream-head", "steps": 3}]})");
  const Inspected r = inspect(dir.string(), {"upstream-2874", "upstream-head"}, 0);
  ASSERT_EQ(r.code, app::kExitFail) << r.err;
  const json* post = verdict_of(r.out, "upstream-2874");
  const json* head = verdict_of(r.out, "upstream-head");
  ASSERT_TRUE(post != nullptr && head != nullptr) << r.out.dump(1);
  EXPECT_EQ((*post)["class"], "this revision cannot run this configuration");
  EXPECT_NE((*post)["cause"].get<std::string>().find("is_te_min_version"), std::string::npos);
  EXPECT_NE((*head)["class"], "this revision cannot run this configuration");
  EXPECT_NE(r.out["answer"].get<std::string>().find("upstream-2874 cannot run this configuration"),
            std::string::npos)
      << r.out["answer"];
  fs::remove_all(dir.parent_path());
}

// Param groups that Megatron's default rule does not give (w0 without weight decay): the model
// cannot infer the run, so every revision is 'cannot simulate', with the reason, and the static
// checks still stand (exit 1, not 2: the checkpoint is readable).
TEST(Inspect, SaysItCannotSimulateWhatItCannotInferAndStillChecks) {
  const fs::path dir = model_checkpoint("groups", R"({"seed": 1,
    "params": [{"name": "w0", "numel": 96, "dtype": "bf16", "wd_mult": 0.0},
               {"name": "w1", "numel": 40, "dtype": "bf16"}],
    "optimizer": {"kind": "fused_adam", "lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8,
                  "weight_decay": 0.1},
    "phases": [{"dp": 1, "revision": "upstream-head", "steps": 3}]})");
  const Inspected r = inspect(dir.string(), {"upstream-head"}, 0);
  ASSERT_EQ(r.code, app::kExitFail) << r.err;
  EXPECT_EQ(r.out["checks"].size(), 4u);
  ASSERT_EQ(r.out["verdicts"].size(), 1u);
  EXPECT_EQ(r.out["verdicts"][0]["class"], "cannot simulate");
  EXPECT_NE(r.out["cannot_simulate"].get<std::string>().find("--scenario"), std::string::npos)
      << r.out["cannot_simulate"];
  fs::remove_all(dir.parent_path());
}

// A checkpoint a script of its own wrote with a plain dist_checkpointing.save (no 'iteration',
// 'args' or scheduler in the common state, no tracker; the issue-25 report attached its
// iter_0000003 directory): it reads, and each revision resumes it as the script would load it,
// dist_checkpointing.load then load_state_dict, instead of failing on the training loop's
// missing keys. The saved state is the uninterrupted run's after 3 steps: upstream-head's
// FusedAdam resumes it with t = 4, 5 and every element equal.
TEST(Inspect, ResumesACheckpointWithoutTrainingLoopStateAsAScriptLoadsIt) {
  const fs::path dir = fs::temp_directory_path() / "ckptsim-inspect-script-save";
  fs::remove_all(dir);
  const sim::Scenario s = test::scenario_from_json(R"({"seed": 1,
    "params": [{"name": "w0", "numel": 96, "dtype": "bf16"}, {"name": "w1", "numel": 40, "dtype": "bf16"}],
    "optimizer": {"kind": "fused_adam", "lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8,
                  "weight_decay": 0.1},
    "phases": [{"dp": 2, "revision": "upstream-head", "steps": 3}]})",
                                                   "script-save");
  sim::RunOptions options;
  options.checkpoint_dir = (dir / "own").string();
  const auto run = test::run(s, options);
  model::DirectoryStorage own(dir / "own" / sim::saved_directory(run, 0));
  model::DirectoryStorage out(dir / "script");
  model::TorchDistExportOptions plain;
  plain.without_training_loop_state = true;
  ASSERT_TRUE(model::export_torch_dist_checkpoint(own, out, "", plain).is_ok());
  ASSERT_FALSE(fs::exists(dir / "script" / "latest_checkpointed_iteration.txt"));
  app::InspectCommand c;
  c.dir = (dir / "script" / "iter_0000003").string();
  c.revisions = {"upstream-head"};
  const Inspected r = inspect(c);
  ASSERT_NE(r.code, app::kExitInvalid) << r.err;
  EXPECT_EQ(r.out["iteration"], 3);
  EXPECT_EQ(r.out["iteration_from"], "the directory's name");
  ASSERT_EQ(r.out["resumes"].size(), 1u);
  const json& j = r.out["resumes"][0];
  EXPECT_EQ(j["class"], "resumes correctly") << j.dump(1);
  EXPECT_EQ(j["errors"].size(), 0u) << j.dump(1);
  EXPECT_EQ(j["elements_compared"], 3 * (96 + 40));
  EXPECT_EQ(j["elements_equal"], j["elements_compared"]);
  EXPECT_EQ(j["bias_correction_right"], true);
  ASSERT_EQ(j["steps_used"].size(), 2u);
  EXPECT_NE(j["steps_used"][0].get<std::string>().find("t=4 (right: t=4)"), std::string::npos)
      << j["steps_used"];
  fs::remove_all(dir);
}

TEST(Inspect, ExitsTwoOnADirectoryThatIsNoCheckpoint) {
  const fs::path dir = fs::temp_directory_path() / "ckptsim-inspect-empty";
  fs::remove_all(dir);
  fs::create_directories(dir);
  Inspected r = inspect(dir.string(), {}, 0);
  EXPECT_EQ(r.code, app::kExitInvalid);
  EXPECT_NE(r.err.find("latest_checkpointed_iteration.txt"), std::string::npos) << r.err;
  // A tracker naming an iteration whose directory is not there (a tracker written before its
  // data): damage, exit 1, with nothing there to infer the run from.
  std::ofstream(dir / "latest_checkpointed_iteration.txt") << "7";
  r = inspect(dir.string(), {"upstream-head"}, 0);
  EXPECT_EQ(r.code, app::kExitFail) << r.err;
  ASSERT_EQ(r.out["damage"].size(), 1u) << r.out.dump(1);
  EXPECT_NE(r.out["damage"][0]["detail"].get<std::string>().find("iter_0000007"), std::string::npos)
      << r.out.dump(1);
  EXPECT_EQ(r.out["verdicts"][0]["class"], "cannot simulate") << r.out.dump(1);
  fs::remove_all(dir);
}

// shards_tile_buckets judges the chunks from `.metadata` alone: a gap and an overlap each fail.
TEST(CheckpointInspection, ShardsTileBucketsFindsAGapAndAnOverlap) {
  model::DcpMetadata meta;
  const std::string key =
      "optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.bfloat16, "
      "torch.float32).bucket_idx_0.exp_avg";
  meta.tensors[key] = {at::kFloat, {10}, {{{0}, {4}}, {{4}, {6}}}};
  EXPECT_EQ(properties::check_shards_tile_buckets(meta, nullptr).outcome,
            properties::CheckOutcome::kHolds);
  meta.tensors[key].chunks = {{{0}, {4}}, {{5}, {5}}};
  const auto gap = properties::check_shards_tile_buckets(meta, nullptr);
  EXPECT_EQ(gap.outcome, properties::CheckOutcome::kFails);
  EXPECT_NE(gap.detail.find("[4, 5)"), std::string::npos) << gap.detail;
  meta.tensors[key].chunks = {{{0}, {6}}, {{4}, {6}}};
  const auto overlap = properties::check_shards_tile_buckets(meta, nullptr);
  EXPECT_EQ(overlap.outcome, properties::CheckOutcome::kFails);
  EXPECT_NE(overlap.detail.find("overlap on [4, 6)"), std::string::npos) << overlap.detail;
}

}  // namespace
