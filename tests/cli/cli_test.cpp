// The CLI contract: exit 0 when every property holds, 1 when one fails, 2 on invalid input with
// a message naming the file and field; --json prints one object with "ok" and "properties".
// Runs the built binary (CKPTSIM_BINARY).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/testing.h"

namespace {

struct Output {
  int exit_code = -1;
  std::string text;
};

Output ckptsim_cli(const std::string& args) {
  const std::string cmd = std::string(CKPTSIM_BINARY) + " " + args + " 2>&1";
  Output out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return out;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), pipe) != nullptr) out.text += buf.data();
  const int status = pclose(pipe);
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

std::string scenario(const std::string& name) {
  return ckptsim::test::source_path("scenarios/" + name);
}

}  // namespace

TEST(Cli, PassingScenarioExitsZero) {
  const auto out = ckptsim_cli("run --memory " + scenario("fused-adam-upstream-dp2-to-4.json"));
  EXPECT_EQ(out.exit_code, 0) << out.text;
  EXPECT_EQ(out.text.rfind("seed=1 revision=upstream-2874,upstream-2874", 0), 0u) << out.text;
}

TEST(Cli, FailingPropertyExitsOneAndJsonNamesIt) {
  const auto out = ckptsim_cli("run --memory --json " + scenario("bug2-step-reset-dp2-to-4.json"));
  EXPECT_EQ(out.exit_code, 1) << out.text;
  const auto j = nlohmann::json::parse(out.text);
  EXPECT_FALSE(j.at("ok").get<bool>());
  bool seen = false;
  for (const auto& p : j.at("properties")) {
    ASSERT_TRUE(p.contains("name") && p.contains("ok") && p.contains("detail"));
    if (p["name"] == "step_matches_uninterrupted") {
      seen = true;
      EXPECT_FALSE(p["ok"].get<bool>());
      EXPECT_NE(p["detail"].get<std::string>().find("expected 5"), std::string::npos);
    }
  }
  EXPECT_TRUE(seen);
}

TEST(Cli, ExpectModeExitsZeroWhenVerdictsAreTheExpectedFailures) {
  const auto out =
      ckptsim_cli("run --memory --expect --quiet " + scenario("bug2-step-reset-dp2-to-4.json"));
  EXPECT_EQ(out.exit_code, 0) << out.text;
}

TEST(Cli, InvalidInputExitsTwoNamingFileAndField) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("ckptsim-cli-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto bad = dir / "bad.json";
  std::ofstream(bad)
      << R"({"seed": 1, "params": [{"name": "w", "numel": 0, "dtype": "bf16"}], "optimizer": {}, "phases": []})";
  const auto out = ckptsim_cli("run --memory " + bad.string());
  EXPECT_EQ(out.exit_code, 2) << out.text;
  EXPECT_NE(out.text.find("bad.json: field 'params[0].numel'"), std::string::npos) << out.text;
  EXPECT_EQ(ckptsim_cli("run --memory " + (dir / "missing.json").string()).exit_code, 2);
  EXPECT_EQ(ckptsim_cli("run").exit_code, 2);
  std::filesystem::remove_all(dir);
}

TEST(Cli, RevisionsListsEveryProfileWithSwitches) {
  const auto out = ckptsim_cli("revisions --json");
  ASSERT_EQ(out.exit_code, 0) << out.text;
  const auto j = nlohmann::json::parse(out.text);
  std::vector<std::string> names;
  for (const auto& p : j) names.push_back(p["name"]);
  for (const char* n : {"upstream-pre-2874", "upstream-2874", "miles-main", "fix-skip-step",
                        "fix-drop-on-load", "fix-recommended"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  EXPECT_EQ(j[0]["switches"].size(), ckptsim::model::revision_switch_infos().size());
}

namespace {

// `ckptsim gate --json` into a fresh directory; the findings without their file paths.
struct GateOutput {
  Output out;
  nlohmann::json findings;
};

GateOutput gate(const std::string& baseline, const std::string& candidate, const std::string& extra,
                const std::string& tag) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / ("ckptsim-gate-" + tag);
  std::filesystem::remove_all(dir);
  GateOutput g;
  g.out = ckptsim_cli("gate --json --quiet --baseline " + baseline + " --candidate " + candidate +
                      " --out " + dir.string() + " " + extra);
  const auto j = nlohmann::json::parse(g.out.text, nullptr, false);
  if (j.is_discarded() || !j.contains("findings")) return g;
  g.findings = j["findings"];
  for (auto& f : g.findings) f.erase("scenario_file");
  EXPECT_TRUE(std::filesystem::exists(dir / "gate-report.md"));
  EXPECT_TRUE(std::filesystem::exists(dir / "junit.xml"));
  return g;
}

}  // namespace

// The reviewer's duplicate leaf through the gate: new, minimal, exit 1; and the two searches
// give the same findings whether they run one after the other or at once (the search locks
// RapidCheck's process-wide generation state; a missing lock shows up here as different or
// crashed findings).
TEST(Cli, GateCallsTheDuplicateLeafNewTheSameSequentialOrConcurrent) {
  const std::string flags = "--kind hybrid --cases 150 --dp-max 4";
  const auto one = gate("miles-main", "upstream-2874", flags + " --jobs 1", "j1");
  const auto two = gate("miles-main", "upstream-2874", flags + " --jobs 2", "j2");
  ASSERT_EQ(one.out.exit_code, 1) << one.out.text;
  ASSERT_EQ(two.out.exit_code, 1) << two.out.text;
  EXPECT_EQ(one.findings, two.findings);
  bool dup = false;
  for (const auto& f : one.findings) {
    if (f["property"] == "no_duplicate_leaves" && f["classification"] == "new") {
      dup = true;
      EXPECT_LE(f["params"].get<int>(), 2);
      EXPECT_LE(f["phases"].get<int>(), 2);
      EXPECT_LE(f["dp_max"].get<int>(), 2);
      EXPECT_NE(f["detail"].get<std::string>().find("'param_state'"), std::string::npos)
          << f["detail"];
    }
  }
  EXPECT_TRUE(dup) << one.findings.dump(1);
}

// The control: a revision gated against itself introduces nothing, so the gate exits 0 even
// though the search finds failures (they are all pre-existing).
TEST(Cli, GateOfARevisionAgainstItselfFindsNothingNew) {
  const auto g =
      gate("upstream-2874", "upstream-2874", "--kind hybrid --cases 60 --dp-max 4", "self");
  EXPECT_EQ(g.out.exit_code, 0) << g.out.text;
  ASSERT_FALSE(g.findings.empty()) << g.out.text;
  for (const auto& f : g.findings) EXPECT_EQ(f["classification"], "pre-existing") << f.dump();
}
