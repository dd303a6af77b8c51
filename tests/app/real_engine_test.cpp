// check --real and gate --real (app/real_engine.h, app/real_commands.cpp) against stand-in
// runners, torch-free: tests/app/fake_serve_python speaks the serve protocol and replays each
// plan on the model (so the "real code" is a profile the test picks), and can hang, die or
// disagree; the last test runs the real replay/serve.py with tests/replay/fake_python as the
// workers' interpreter, whose worker process is killed during a run.
#include "app/real_engine.h"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/commands.h"
#include "tests/testing.h"

namespace {

namespace fs = std::filesystem;
using namespace ckptsim;
using test::ScopedEnv;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

fs::path fresh_dir(const std::string& tag) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("ckptsim-real-" + tag);
  fs::remove_all(dir);
  for (const char* side : {"a", "b"}) fs::create_directories(dir / side / "megatron" / "core");
  return dir;
}

// A small search on hybrid cases, the stand-in runner as the runner's Python.
app::SearchCommand real_flags(const fs::path& dir) {
  app::SearchCommand c;
  c.cases = 8;
  c.kinds = {"hybrid"};
  c.transformer_engine = {"installed"};
  c.dp_max = 2;
  c.params_max = 2;
  c.phases_max = 2;
  c.steps_max = 2;
  c.long_steps_max = 0;
  c.jobs = 2;
  c.quiet = true;
  c.out_dir = (dir / "found").string();
  c.real.enabled = true;
  c.real.prestart_dp = 0;
  c.real.shrink_runs_max = 20;
  c.real_code.python = test::source_path("tests/app/fake_serve_python");
  c.real_code.megatron = {(dir / "a").string()};
  return c;
}

struct Ran {
  int exit_code = -1;
  std::string out;
  std::string err;
  std::string report;  // real-report.md or gate-report.md
};

Ran check(const app::SearchCommand& c) {
  const ScopedEnv binary("CKPTSIM_FAKE_BINARY", CKPTSIM_BINARY);
  std::ostringstream out;
  std::ostringstream err;
  Ran r;
  r.exit_code = app::check_command(c, "upstream-2874", out, err);
  r.out = out.str();
  r.err = err.str();
  r.report = read_file(fs::path(c.out_dir) / "real-report.md");
  return r;
}

std::vector<fs::path> files_ending(const fs::path& dir, const std::string& suffix,
                                   const std::string& prefix = "") {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(suffix) && name.starts_with(prefix)) out.push_back(e.path());
  }
  return out;
}

}  // namespace

// The "real code" is upstream-2874 (its step restarts after a resume): the real search finds it
// on the real traces alone, shrinks it, writes the minimal scenario with its real plan and
// trace beside it, and the model beside it (upstream-2874 too) agrees on every scenario.
TEST(RealCheck, FindsAndShrinksTheRealCodesFailureWithTheModelBesideIt) {
  const fs::path dir = fresh_dir("finds");
  app::SearchCommand c = real_flags(dir);
  c.properties = {"step_matches_uninterrupted"};
  c.real.profile_of = {"checkout=upstream-2874"};
  const Ran r = check(c);
  ASSERT_EQ(r.exit_code, 1) << r.err << r.report;
  // One trace and one plan beside each minimal scenario (one per cause).
  const auto traces = files_ending(dir / "found", ".trace.json", "found-");
  ASSERT_GE(traces.size(), 1u) << r.report;
  EXPECT_EQ(files_ending(dir / "found", ".plan.json", "found-").size(), traces.size());
  EXPECT_EQ(files_ending(dir / "found", ".json", "found-").size(), 3 * traces.size());
  EXPECT_NE(r.report.find("step_matches_uninterrupted"), std::string::npos) << r.report;
  EXPECT_NE(r.report.find("the model agrees with the real code"), std::string::npos) << r.report;
  EXPECT_EQ(r.report.find("model divergence"), std::string::npos) << r.report;
  EXPECT_NE(r.report.find("\n0 replay(s) of"), std::string::npos)
      << "every scenario replayed (a phase after one that saves nothing is no replay problem)";
  // Shrunk: the minimal scenario resumes once.
  const auto found = files_ending(dir / "found", ".json", "found-");
  for (const auto& f : found) {
    if (f.string().ends_with(".trace.json") || f.string().ends_with(".plan.json")) continue;
    const auto j = nlohmann::json::parse(read_file(f));
    EXPECT_EQ(j["phases"].size(), 2u) << f;
    // ... and replays on the model with the profile the real engine wrote next to it.
    const std::string cmd = std::string(CKPTSIM_BINARY) + " run --memory --quiet --profile " +
                            (dir / "found" / "checkout.profile.json").string() + " " + f.string() +
                            " > /dev/null 2>&1";
    EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 1) << cmd;
    // The real trace beside it names the found scenario: conform pairs them (and agrees).
    const std::string stem = f.string().substr(0, f.string().size() - 5);
    const std::string conform = std::string(CKPTSIM_BINARY) + " conform --profile " +
                                (dir / "found" / "checkout.profile.json").string() + " " +
                                f.string() + " " + stem + ".trace.json > /dev/null 2>&1";
    EXPECT_EQ(WEXITSTATUS(std::system(conform.c_str())), 0) << conform;
  }
  // The trace beside it is the real one (source real) and fails the property there.
  const auto t = nlohmann::json::parse(read_file(traces[0]));
  EXPECT_EQ(t["source"], "real");
}

// The same real code judged with a model that runs fix-complete beside it: every scenario with a
// resume disagrees, and each cause is reported once, with its scenario and both traces.
TEST(RealCheck, AModelThatComputesOtherwiseIsAModelDivergence) {
  const fs::path dir = fresh_dir("diverges");
  app::SearchCommand c = real_flags(dir);
  c.properties = {"step_matches_uninterrupted"};
  const ScopedEnv mode("FAKE_SERVE", "mutate-step");
  c.real.profile_of = {"checkout=fix-complete"};
  const Ran r = check(c);
  EXPECT_NE(r.report.find("**model divergence**"), std::string::npos) << r.report;
  EXPECT_FALSE(files_ending(dir / "found", ".json", "model-divergence-1").empty());
  EXPECT_FALSE(files_ending(dir / "found", ".model.trace.json", "model-divergence-1").empty());
}

// A runner that never answers is killed at the scenario's timeout and restarted; the scenario
// is "could not replay" and the search goes on to its last case.
TEST(RealCheck, AHungRunnerIsCouldNotReplayAtItsTimeoutAndTheSearchGoesOn) {
  const fs::path dir = fresh_dir("hang");
  app::SearchCommand c = real_flags(dir);
  c.cases = 4;
  c.jobs = 1;
  c.json = true;
  c.real.scenario_timeout = 10;  // a replay of the stand-in takes < 1 s, a few under load
  c.real.profile_of = {"checkout=fix-complete"};
  const ScopedEnv mode("FAKE_SERVE", "hang-once");
  const ScopedEnv state("FAKE_SERVE_STATE", (dir / "hung-once").string());
  const Ran r = check(c);
  EXPECT_EQ(r.exit_code, 0) << r.err << r.report;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["cases"], 4);
  EXPECT_NE(r.report.find("1 replay(s) of 4 gave no trace"), std::string::npos) << r.report;
  EXPECT_NE(r.report.find("did not answer within 10 s"), std::string::npos) << r.report;
  EXPECT_FALSE(files_ending(dir / "found", ".json", "could-not-replay-1").empty());
  EXPECT_FALSE(files_ending(dir / "found", ".log1", "could-not-replay-1").empty())
      << "the runner's log goes next to the finding";
}

// A runner that dies is restarted for the next scenario.
TEST(RealCheck, ADeadRunnerIsRestarted) {
  const fs::path dir = fresh_dir("die");
  app::SearchCommand c = real_flags(dir);
  c.cases = 4;
  c.jobs = 1;
  c.json = true;
  c.real.profile_of = {"checkout=fix-complete"};
  const ScopedEnv mode("FAKE_SERVE", "die-once");
  const ScopedEnv state("FAKE_SERVE_STATE", (dir / "died-once").string());
  const Ran r = check(c);
  EXPECT_EQ(r.exit_code, 0) << r.err << r.report;
  EXPECT_NE(r.report.find("1 replay(s) of 4 gave no trace"), std::string::npos) << r.report;
  EXPECT_NE(r.report.find("the runner exited"), std::string::npos) << r.report;
}

// Without what it needs, --real exits 2 before it draws anything, and says why.
TEST(RealCheck, ExitsTwoAndSaysWhyWithoutACheckoutTorchOrAGpu) {
  const fs::path dir = fresh_dir("preflight");
  struct Case {
    const char* what;
    std::function<void(app::SearchCommand&)> set;
    const char* torch;
    const char* gpus;
  };
  const std::vector<Case> cases = {
      {"no checkout", [](app::SearchCommand& c) { c.real_code.megatron.clear(); }, "", "1"},
      {"holds no megatron/core",
       [&](app::SearchCommand& c) { c.real_code.megatron = {dir.string()}; }, "", "1"},
      {"torch is missing", [](app::SearchCommand&) {}, "missing", "1"},
      {"no CUDA device", [](app::SearchCommand&) {}, "", "0"},
  };
  for (const auto& k : cases) {
    app::SearchCommand c = real_flags(dir);
    k.set(c);
    const ScopedEnv torch("FAKE_TORCH", k.torch);
    const ScopedEnv gpus("FAKE_GPUS", k.gpus);
    const Ran r = check(c);
    EXPECT_EQ(r.exit_code, 2) << k.what;
    EXPECT_NE(r.err.find(k.what), std::string::npos) << k.what << ": " << r.err;
    EXPECT_TRUE(files_ending(dir / "found", ".json", "found-").empty()) << k.what;
  }
}

namespace {

// A few cases, at a seed that draws a resume the two profiles handle differently early (found by
// trying seeds 1-6; with another seed the search may need more cases, not less care).
Ran gate(const fs::path& dir, const std::string& baseline_profile,
         const std::string& candidate_profile, uint64_t seed) {
  app::SearchCommand c = real_flags(dir);
  c.cases = 6;
  c.seed = seed;
  c.properties = {"step_matches_uninterrupted"};
  c.real_code.megatron.clear();
  c.real.baseline_megatron = (dir / "a").string();
  c.real.candidate_megatron = (dir / "b").string();
  c.real.profile_of = {"baseline=" + baseline_profile, "candidate=" + candidate_profile};
  const ScopedEnv binary("CKPTSIM_FAKE_BINARY", CKPTSIM_BINARY);
  std::ostringstream out;
  std::ostringstream err;
  Ran r;
  r.exit_code = app::gate_command(c, "", "", out, err);
  r.out = out.str();
  r.err = err.str();
  r.report = read_file(dir / "found" / "gate-report.md");
  return r;
}

}  // namespace

// Two checkouts and no profile of the graft: a candidate whose step restarts after a resume is
// a new failure (exit 1); the other way round the candidate fixes it (exit 0).
TEST(RealGate, ClassesEachRealFindingNewOrFixedByTheCandidate) {
  const Ran broken = gate(fresh_dir("gate-new"), "fix-complete", "upstream-2874", 2);
  EXPECT_EQ(broken.exit_code, 1) << broken.err << broken.report;
  EXPECT_NE(broken.report.find("## What the graft changes"), std::string::npos);
  EXPECT_NE(broken.report.find("- **new** step_matches_uninterrupted"), std::string::npos)
      << broken.report;
  EXPECT_EQ(broken.report.find("- **fixed by the candidate**"), std::string::npos) << broken.report;
  const Ran fixing = gate(fresh_dir("gate-fixed"), "upstream-2874", "fix-complete", 3);
  EXPECT_EQ(fixing.exit_code, 0) << fixing.err << fixing.report;
  EXPECT_NE(fixing.report.find("- **fixed by the candidate** step_matches_uninterrupted"),
            std::string::npos)
      << fixing.report;
  EXPECT_EQ(fixing.report.find("- **new**"), std::string::npos) << fixing.report;
}

// The real serve (replay/serve.py) with stand-in workers (tests/replay/fake_worker.py): a worker
// process killed during a run is reported by the runner as WorkerCrash, the scenario is "could
// not replay", and the search goes on to its last case with a new worker.
TEST(RealCheck, AWorkerKilledDuringARunIsCouldNotReplayAndTheSearchGoesOn) {
  const fs::path dir = fresh_dir("worker-killed");
  app::SearchCommand c = real_flags(dir);
  c.cases = 4;
  c.jobs = 1;
  c.json = true;
  c.real_code.python = "python3";
  c.real_code.replay_args = {"--python", test::source_path("tests/replay/fake_python"),
                             "--emulate-te"};
  c.real.no_model = true;
  const ScopedEnv fake("FAKE_REPLAY",
                       nlohmann::json{{"crash_once", (dir / "crashed").string()}}.dump());
  // real_preflight asks the workers' Python (fake_python) for torch and a GPU.
  const Ran r = check(c);
  ASSERT_NE(r.exit_code, 2) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["cases"], 4);
  EXPECT_TRUE(fs::exists(dir / "crashed"));
  EXPECT_NE(r.report.find("WorkerCrash"), std::string::npos) << r.report;
  EXPECT_NE(r.report.find("1 replay(s) of"), std::string::npos) << r.report;
  EXPECT_NE(r.report.find("no model beside it"), std::string::npos) << r.report;
}
