// check/gate --megatron (app/confirm.h): every minimal scenario found is replayed by ONE runner
// process and its trace conformed; each is reported confirmed, not confirmed or could not
// replay, and nothing changes the exit code or loses what the search wrote. The runner is
// tests/app/fake_replay_python (CKPTSIM_PYTHON): it writes the model's own trace (agrees), a
// trace with a step counter changed (disagrees), or fails.
#include "app/confirm.h"

#include <gtest/gtest.h>

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

// One search with a fake runner in a fresh directory.
struct Confirmed {
  int exit_code = -1;
  std::string out;
  std::string err;
  fs::path dir;
  std::vector<nlohmann::json> invocations;  // what the fake runner was given, one per process
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

fs::path fresh_dir(const std::string& tag) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("ckptsim-confirm-" + tag);
  fs::remove_all(dir);
  fs::create_directories(dir / "megatron");
  return dir;
}

// upstream-2874's step reset (torch AdamW parts restart at step 1 after a resume): a small
// search finds it in a few cases.
app::SearchCommand search_flags(const fs::path& dir) {
  app::SearchCommand c;
  c.cases = 30;
  c.kinds = {"hybrid"};
  c.dp_max = 4;
  c.long_steps_max = 0;  // short cases: the runner is faked, the search is not under test
  c.properties = {"step_matches_uninterrupted"};
  c.out_dir = (dir / "found").string();
  c.real_code.megatron = {(dir / "megatron").string()};
  c.real_code.replay_args = {"--emulate-te"};
  return c;
}

std::vector<nlohmann::json> invocations(const fs::path& log) {
  std::vector<nlohmann::json> out;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

template <typename Command>
Confirmed with_fake_runner(const std::string& mode, const fs::path& dir, Command command) {
  const ScopedEnv python("CKPTSIM_PYTHON", test::source_path("tests/app/fake_replay_python"));
  const ScopedEnv binary("CKPTSIM_FAKE_BINARY", CKPTSIM_BINARY);
  const ScopedEnv fake_mode("FAKE_RUNNER", mode);
  const ScopedEnv log("FAKE_RUNNER_LOG", (dir / "runner-calls.jsonl").string());
  std::ostringstream out;
  std::ostringstream err;
  Confirmed r;
  r.exit_code = command(out, err);
  r.out = out.str();
  r.err = err.str();
  r.dir = dir;
  r.invocations = invocations(dir / "runner-calls.jsonl");
  return r;
}

Confirmed check_with(const std::string& mode, const std::string& tag, bool json) {
  const fs::path dir = fresh_dir(tag);
  app::SearchCommand c = search_flags(dir);
  c.json = json;
  c.junit = (dir / "junit.xml").string();
  return with_fake_runner(mode, dir, [&](std::ostream& out, std::ostream& err) {
    return app::check_command(c, "upstream-2874", out, err);
  });
}

// The minimal scenarios the search wrote (not the plans or traces beside them).
std::vector<fs::path> found_scenarios(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir / "found")) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("found-") && !name.ends_with(".plan.json") &&
        !name.ends_with(".trace.json"))
      out.push_back(e.path());
  }
  return out;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

// The fake runner writes the model's own trace: every finding is confirmed, in the console,
// the JUnit file, from one runner process given every plan and the pass-through options.
TEST(CheckMegatron, ConfirmsEachFindingWhenTheRealTraceAgrees) {
  const Confirmed r = check_with("agree", "agree", false);
  ASSERT_EQ(r.exit_code, app::kExitFail) << r.out << r.err;
  const auto found = found_scenarios(r.dir);
  ASSERT_FALSE(found.empty()) << r.out;
  EXPECT_EQ(count(r.out,
                  "real code: confirmed on the real code (step_matches_uninterrupted "
                  "fails there too"),
            found.size())
      << r.out << r.err;
  ASSERT_EQ(r.invocations.size(), 1u) << "one runner process for every plan";
  const std::vector<std::string> argv = r.invocations[0]["argv"];
  size_t plans = 0;
  for (const auto& f : found) {
    const std::string plan = (f.parent_path() / f.stem()).string() + ".plan.json";
    EXPECT_TRUE(fs::exists(plan)) << plan;
    plans += std::count(argv.begin(), argv.end(), plan);
    EXPECT_TRUE(fs::exists((f.parent_path() / f.stem()).string() + ".trace.json"));
  }
  EXPECT_EQ(plans, found.size());
  const auto has = [&](const std::vector<std::string>& seq) {
    return std::search(argv.begin(), argv.end(), seq.begin(), seq.end()) != argv.end();
  };
  EXPECT_TRUE(has({"--megatron", (r.dir / "megatron").string()}));
  EXPECT_TRUE(has({"--out-dir", (r.dir / "found").string()}));
  EXPECT_TRUE(has({"--emulate-te"}));
  const std::string junit = read_file(r.dir / "junit.xml");
  EXPECT_NE(junit.find("<system-out>"), std::string::npos) << junit;
  EXPECT_EQ(count(junit, "real code: confirmed on the real code"), 2 * found.size()) << junit;
  EXPECT_NE(read_file(r.dir / "found" / "replay.log").find("fake runner:"), std::string::npos);
}

// The fake runner changes a resumed step counter: the real code disagrees, and the JSON says
// where.
TEST(CheckMegatron, NotConfirmedWhenTheRealTraceDisagrees) {
  const Confirmed r = check_with("mutate-step", "mutate", true);
  ASSERT_EQ(r.exit_code, app::kExitFail) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_FALSE(j["failures"].empty()) << r.out;
  for (const auto& f : j["failures"]) {
    ASSERT_TRUE(f.contains("real_code")) << f.dump();
    EXPECT_EQ(f["real_code"]["outcome"], "not_confirmed") << f.dump();
    const std::string text = f["real_code"]["text"];
    EXPECT_EQ(text.rfind("not confirmed: the real code disagrees (first divergence: ", 0), 0u)
        << text;
    EXPECT_NE(text.find("step"), std::string::npos) << text;
    EXPECT_TRUE(fs::exists(f["real_code"]["trace"].get<std::string>()));
  }
  EXPECT_EQ(r.invocations.size(), 1u);
}

// The runner fails: each finding "could not replay", the exit code and the minimal scenarios
// are the search's own.
TEST(CheckMegatron, CouldNotReplayKeepsTheSearchResults) {
  const Confirmed r = check_with("fail", "fail", true);
  ASSERT_EQ(r.exit_code, app::kExitFail) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_FALSE(j["failures"].empty()) << r.out;
  EXPECT_EQ(j["failures"].size(), found_scenarios(r.dir).size());
  for (const auto& f : j["failures"]) {
    ASSERT_TRUE(f.contains("real_code")) << f.dump();
    EXPECT_EQ(f["real_code"]["outcome"], "could_not_replay") << f.dump();
    EXPECT_NE(f["real_code"]["text"].get<std::string>().find("the runner failed (exit status 3"),
              std::string::npos)
        << f.dump();
    // The minimal scenario is intact: it replays to the same failure.
    app::RunCommand run;
    run.files = {f["scenario_file"].get<std::string>()};
    run.memory = true;
    run.json = true;
    std::ostringstream out, err;
    EXPECT_EQ(app::run_command(run, out, err), app::kExitFail) << out.str() << err.str();
  }
  EXPECT_NE(read_file(r.dir / "junit.xml").find("could not replay"), std::string::npos);
}

// The gate carries the verdicts into gate-report.md (a "real code" column) and its JUnit.
TEST(GateMegatron, GateReportSaysWhatTheRealCodeSaid) {
  const fs::path dir = fresh_dir("gate");
  app::SearchCommand c = search_flags(dir);
  c.cases = 20;
  c.properties.clear();
  c.quiet = true;
  const Confirmed r = with_fake_runner("agree", dir, [&](std::ostream& out, std::ostream& err) {
    return app::gate_command(c, "miles-main", "upstream-2874", out, err);
  });
  ASSERT_EQ(r.exit_code, app::kExitFail) << r.out << r.err;
  const std::string md = read_file(dir / "found" / "gate-report.md");
  EXPECT_NE(md.find("| detail | real code |"), std::string::npos) << md;
  EXPECT_NE(md.find("confirmed on the real code"), std::string::npos) << md;
  EXPECT_NE(read_file(dir / "found" / "junit.xml").find("<system-out>real code: "),
            std::string::npos);
  EXPECT_EQ(r.invocations.size(), 1u);
}

// Checked before the search: a --megatron that names no directory, an unknown revision; a
// runner option without a checkout to replay on.
TEST(CheckMegatron, BadMegatronFlagsAreInvalidInputBeforeTheSearch) {
  const fs::path dir = fresh_dir("flags");
  for (const auto& [flag, message] : std::vector<std::pair<std::string, std::string>>{
           {(dir / "nope").string(), "no such directory"},
           {"no-such-rev=" + (dir / "megatron").string(), "unknown revision no-such-rev"},
           {"upstream-2874=" + (dir / "nope").string(), "no such directory"}}) {
    app::SearchCommand c = search_flags(dir);
    c.real_code.megatron = {flag};
    std::ostringstream out, err;
    EXPECT_EQ(app::check_command(c, "upstream-2874", out, err), app::kExitInvalid) << flag;
    EXPECT_NE(err.str().find(message), std::string::npos) << err.str();
    EXPECT_EQ(out.str(), "") << "the search must not start";
  }
  app::SearchCommand c = search_flags(dir);
  c.real_code.megatron.clear();
  std::ostringstream out, err;
  EXPECT_EQ(app::check_command(c, "upstream-2874", out, err), app::kExitInvalid);
  EXPECT_NE(err.str().find("--replay-arg and --replay-dir need --megatron"), std::string::npos)
      << err.str();
}

// A trace whose runs the runner skipped (no GPU here) is not the real code's verdict.
TEST(CheckMegatron, ASkippedRunIsAReplayProblemNotAVerdict) {
  const nlohmann::json trace = {
      {"runs",
       {{{"id", "reference"},
         {"status", "skipped"},
         {"skipped_reason", "no CUDA device is visible to the workers"}}}}};
  EXPECT_EQ(app::replay_problem(trace),
            "the runner skipped run reference: no CUDA device is visible to the workers");
  const nlohmann::json crash = {{"runs",
                                 {{{"id", "phase1"},
                                   {"status", "failed"},
                                   {"events",
                                    {{{"rank", 1},
                                      {"at", "error"},
                                      {"py_type", "WorkerCrash"},
                                      {"message", "signal 9"}}}}}}}};
  EXPECT_EQ(app::replay_problem(crash), "run phase1 rank 1: WorkerCrash: signal 9");
  const nlohmann::json megatron_error = {
      {"runs",
       {{{"id", "phase1"},
         {"status", "failed"},
         {"events", {{{"rank", 0}, {"at", "error"}, {"py_type", "ValueError"}}}}}}}};
  EXPECT_EQ(app::replay_problem(megatron_error), "");
  // As on the H200 with 4 gates of 3 runners at once (2026-12-02): the device's limit.
  const nlohmann::json oom = {
      {"runs",
       {{{"id", "reference"},
         {"status", "failed"},
         {"events",
          {{{"rank", 1},
            {"at", "error"},
            {"py_type", "AcceleratorError"},
            {"message", "CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation'"}}}}}}}};
  EXPECT_EQ(app::replay_problem(oom),
            "run reference rank 1: AcceleratorError: CUDA error: out of memory");
}

// The command line binds every --megatron flag: the runner gets them, and --replay-arg values
// that start with dashes, verbatim.
TEST(CheckMegatron, CommandLineFlagsReachTheRunner) {
  const fs::path dir = fresh_dir("cli");
  const std::string cmd =
      "CKPTSIM_PYTHON=" + test::source_path("tests/app/fake_replay_python") +
      " CKPTSIM_FAKE_BINARY=" + CKPTSIM_BINARY +
      " FAKE_RUNNER_LOG=" + (dir / "runner-calls.jsonl").string() + " " + CKPTSIM_BINARY +
      " check --revision upstream-2874 --cases 12 --kind hybrid --dp-max 4 --quiet --out " +
      (dir / "found").string() + " --megatron upstream-2874=" + (dir / "megatron").string() +
      " --megatron-root " + dir.string() +
      " --replay-arg=--emulate-te --replay-arg=--backend=gloo" + " --replay-dir " +
      test::source_path("") + " > " + (dir / "out.txt").string() + " 2>&1";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << cmd;
  EXPECT_EQ(WEXITSTATUS(status), app::kExitFail) << read_file(dir / "out.txt");
  const auto calls = invocations(dir / "runner-calls.jsonl");
  ASSERT_EQ(calls.size(), 1u) << read_file(dir / "out.txt");
  const std::vector<std::string> argv = calls[0]["argv"];
  const std::vector<std::string> tail = {
      "--megatron",      "upstream-2874=" + (dir / "megatron").string(),
      "--megatron-root", dir.string(),
      "--emulate-te",    "--backend=gloo"};
  ASSERT_GE(argv.size(), tail.size());
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), argv.end() - tail.size())) << calls[0].dump();
  EXPECT_EQ(calls[0]["pythonpath"].get<std::string>().rfind(
                fs::path(test::source_path("")).lexically_normal().string(), 0),
            0u);
}
