// The CLI contract: exit 0 when every property holds, 1 when one fails, 2 on invalid input with
// a message naming the file and field; --json prints one object with "ok" and "properties".
// Runs the built binary (CKPTSIM_BINARY).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "properties/properties.h"
#include "tests/testing.h"

namespace {

struct Output {
  int exit_code = -1;
  std::string text;
};

// `env`: variables for the command, "NAME=value ..." (run through env(1)).
Output ckptsim_cli(const std::string& args, const std::string& env = "") {
  const std::string cmd =
      (env.empty() ? "" : "env " + env + " ") + std::string(CKPTSIM_BINARY) + " " + args + " 2>&1";
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

// --checkpoint-format torch_dist writes each phase in Megatron's layout (and only that);
// wrong combinations are exit 2 naming the flag.
TEST(Cli, CheckpointFormatTorchDistWritesTheTrainingLoopsLayout) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("ckptsim-cli-td-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::string fixture = ckptsim::test::source_path(
      "tests/fixtures/real-checkpoints/runs/fx-upstream-head-fused-adam-dp2.scenario.json");
  const auto out = ckptsim_cli("run --quiet --checkpoint-format torch_dist --checkpoint-dir " +
                               dir.string() + " " + fixture);
  EXPECT_EQ(out.exit_code, 0) << out.text;
  const auto phase = dir / "fx-upstream-head-fused-adam-dp2" / "phase_0";
  EXPECT_TRUE(std::filesystem::exists(phase / "latest_checkpointed_iteration.txt"));
  EXPECT_TRUE(std::filesystem::exists(phase / "iter_0000003" / ".metadata"));
  EXPECT_TRUE(std::filesystem::exists(phase / "iter_0000003" / "__1_0.distcp"));
  EXPECT_FALSE(std::filesystem::exists(phase / "metadata.json")) << "not the own format";
  std::filesystem::remove_all(dir);
  auto bad = ckptsim_cli("run --memory --checkpoint-format torch_dist " + fixture);
  EXPECT_EQ(bad.exit_code, 2) << bad.text;
  EXPECT_NE(bad.text.find("--memory"), std::string::npos) << bad.text;
  bad = ckptsim_cli("run --memory --checkpoint-format pickle " + fixture);
  EXPECT_EQ(bad.exit_code, 2) << bad.text;
  bad = ckptsim_cli("run --memory --torch-dist-class a.B=c.D " + fixture);
  EXPECT_EQ(bad.exit_code, 2) << bad.text;
  EXPECT_NE(bad.text.find("--torch-dist-class"), std::string::npos) << bad.text;
  bad = ckptsim_cli("run --checkpoint-format torch_dist --torch-dist-class nodot=c.D " + fixture);
  EXPECT_EQ(bad.exit_code, 2) << bad.text;
  EXPECT_NE(bad.text.find("module.Class=module.Class"), std::string::npos) << bad.text;
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

// The listings come from the registry (a property's one home): `ckptsim properties` names every
// property in registry order with what judges it, and every search command's --help names them.
TEST(Cli, PropertiesListsTheRegistryAndHelpNamesEveryProperty) {
  const auto out = ckptsim_cli("properties --json");
  ASSERT_EQ(out.exit_code, 0) << out.text;
  const auto j = nlohmann::json::parse(out.text);
  const auto& registry = ckptsim::properties::all_properties();
  ASSERT_EQ(j.size(), registry.size());
  for (size_t i = 0; i < registry.size(); ++i) {
    EXPECT_EQ(j[i]["name"], registry[i].name);
    EXPECT_EQ(j[i]["trace"], static_cast<bool>(registry[i].trace_check)) << registry[i].name;
    EXPECT_EQ(j[i]["checkpoint"].is_string(), static_cast<bool>(registry[i].checkpoint_check))
        << registry[i].name;
  }
  const auto text = ckptsim_cli("properties");
  EXPECT_NE(text.text.find("load_writes_every_element\n"), std::string::npos) << text.text;
  EXPECT_NE(text.text.find("judged on: run, trace, checkpoint (inspect's step_counters_agree)"),
            std::string::npos)
      << text.text;
  for (const char* command : {"check", "gate"}) {
    const auto help = ckptsim_cli(std::string(command) + " --help");
    for (const auto& p : registry)
      EXPECT_NE(help.text.find(p.name), std::string::npos) << command << " --help: " << p.name;
  }
}

namespace {

// `ckptsim gate --json` into a fresh directory; the findings without their file paths.
struct GateOutput {
  Output out;
  nlohmann::json findings;    // without scenario_file, to compare runs
  nlohmann::json with_files;  // as printed
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
  g.with_files = j["findings"];
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
  // "new" claims the all-baseline run judged the property and kept it (or failed it for
  // another cause): replayed with every phase on the baseline, its verdict is never
  // not_evaluated (that is "unresolved").
  int replayed = 0;
  for (const auto& f : one.with_files) {
    if (f["classification"] != "new") continue;
    auto s = nlohmann::json::parse(std::ifstream(f["scenario_file"].get<std::string>()));
    for (auto& phase : s["phases"]) phase["revision"] = "miles-main";
    s.erase("expect");
    const auto file =
        std::filesystem::path(::testing::TempDir()) / "ckptsim-gate-baseline-replay.json";
    std::ofstream(file) << s.dump();
    const auto out = ckptsim_cli("run --json --memory " + file.string());
    const auto j = nlohmann::json::parse(out.text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << out.text;
    for (const auto& p : j["properties"]) {
      if (p["name"] == f["property"]) {
        EXPECT_NE(p["verdict"], "not_evaluated") << f.dump() << "\n" << p.dump();
      }
    }
    ++replayed;
  }
  EXPECT_GT(replayed, 0);
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

// Bad search options and output locations exit 2 at once, naming the flag, never after a
// search or with a crash (gate --cases -1 once aborted on an internal check).
TEST(Cli, BadSearchOptionsExitTwoNamingTheFlag) {
  struct Case {
    std::string args;
    std::string says;
  };
  const std::string out =
      (std::filesystem::path(::testing::TempDir()) / "ckptsim-bad-opts").string();
  for (const Case& c : std::vector<Case>{
           {"gate --baseline miles-main --candidate upstream-2874 --out " + out + " --cases -1",
            "--cases must be in [0, "},
           {"gate --baseline miles-main --candidate upstream-2874 --out " + out +
                " --cases -1 --jobs 1",
            "--cases must be in"},
           {"check --cases -1 --out " + out, "--cases must be in"},
           {"check --seed -1 --out " + out, "--seed: must not be negative"},
           {"check --time-budget -1 --out " + out, "--time-budget: must not be negative"},
           {"check --revision nope --out " + out, "--revision: unknown revision 'nope'"},
           {"check --steps-max 0 --out " + out, "--steps-max must be in [1, 256], got 0"},
           {"check --long-steps-max 270 --out " + out,
            "--long-steps-max must be 0 (no long phases) or in [271, 10000], got 270"},
           {"gate --baseline nope --candidate upstream-2874 --out " + out,
            "--baseline: unknown revision"},
           {"gate --baseline miles-main --candidate nope --out " + out,
            "--candidate: unknown revision"},
           {"check --out /proc/ckptsim-no/such --cases 100000",
            "cannot create the output directory"},
           {"check --junit /proc/ckptsim-no/j.xml --cases 100000 --out " + out,
            "cannot write the JUnit file"},
           {"check --jobs 257 --out " + out, "--jobs"},
           {"check --shard 3/2 --out " + out,
            "--shard: must be K/N with 1 <= K <= N <= 100000, got '3/2'"},
           {"check --schedule fastest --out " + out, "--schedule: fastest not in"},
           {"check --cases 2 --case-times /proc/ckptsim-no/t.csv --out " + out,
            "/proc/ckptsim-no/t.csv"},
       }) {
    const auto o = ckptsim_cli(c.args);
    EXPECT_EQ(o.exit_code, 2) << c.args << "\n" << o.text;
    EXPECT_NE(o.text.find(c.says), std::string::npos) << c.args << "\n" << o.text;
  }
}

// --case-times: one row per committed case, in case order, with its prediction and judge time;
// the same findings under either --schedule. Mutation caught: the search not asked to keep the
// case times (the CSV then has its header and no rows).
TEST(Cli, CaseTimesListEveryCommittedCaseInOrder) {
  const auto dir = std::filesystem::path(::testing::TempDir());
  std::string found[2];
  for (int k = 0; k < 2; ++k) {
    const std::string csv = (dir / fmt::format("ckptsim-case-times-{}.csv", k)).string();
    const auto o = ckptsim_cli(fmt::format(
        "check --revision fix-complete --cases 30 --jobs 3 --first --json --quiet --schedule {} "
        "--case-times {} --out {}",
        k == 0 ? "dear-first" : "in-order", csv, (dir / "ckptsim-case-times").string()));
    const auto j = nlohmann::json::parse(o.text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << o.text;
    found[k] = j["failures"].dump();
    std::ifstream in(csv);
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line,
              "case,size,element_steps,buffer_steps,rank_steps,rank_phases,rank_phase_params,"
              "predicted_cost,seconds");
    int64_t rows = 0;
    while (std::getline(in, line)) {
      EXPECT_EQ(line.substr(0, line.find(',')), std::to_string(rows)) << line;
      ++rows;
    }
    EXPECT_EQ(rows, j["cases"].get<int64_t>());
    EXPECT_GT(rows, 1);
    EXPECT_LT(rows, 30) << "--first stops at the first finding";
  }
  EXPECT_EQ(found[0], found[1]);
}

// The printed repeat line runs the same search: every option that changes what is drawn or
// judged is in it.
TEST(Cli, RepeatLineRunsTheSameSearch) {
  const auto dir = std::filesystem::path(::testing::TempDir());
  auto search = [&](const std::string& args, const std::string& tag) {
    const auto o =
        ckptsim_cli(args + " --json --quiet --out " + (dir / ("ckptsim-repeat-" + tag)).string());
    const auto j = nlohmann::json::parse(o.text, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << o.text;
    return j;
  };
  const auto first = search(
      "check --revision upstream-2874 --cases 40 --kind torch_adamw --stateful --dp-max 4", "a");
  const std::string repeat = first["repeat"];
  ASSERT_EQ(repeat.rfind("ckptsim ", 0), 0u) << repeat;
  for (const char* flag :
       {"--kind torch_adamw", "--stateful", "--dp-max 4", "--cases 40", "--seed 1"})
    EXPECT_NE(repeat.find(flag), std::string::npos) << flag << " missing from " << repeat;
  const auto again = search(repeat.substr(std::string("ckptsim ").size()), "b");
  auto causes = [](const nlohmann::json& j) {
    std::vector<std::string> out;
    for (const auto& f : j["failures"])
      out.push_back(f["signature"].get<std::string>() + "@" + std::to_string(f["case"].get<int>()));
    return out;
  };
  EXPECT_EQ(causes(first), causes(again));
  EXPECT_FALSE(causes(first).empty())
      << "torch AdamW under upstream-2874 has known failures (B9 asserts)";
}

namespace {

std::filesystem::path scratch(const std::string& tag) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / ("ckptsim-cli-" + tag);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// bug2-step-reset-dp2-to-4 with `expect` replaced (or removed when `expect` is empty).
std::string bug2_with_expect(const std::string& expect) {
  auto j = nlohmann::json::parse(std::ifstream(scenario("bug2-step-reset-dp2-to-4.json")));
  j.erase("expect");
  j.erase("name");
  if (!expect.empty()) j["expect"] = nlohmann::json::parse(expect);
  return j.dump();
}

}  // namespace

TEST(Cli, ExpectBlocksAreValidatedAndMissingOnesMeanEveryPropertyHolds) {
  const auto dir = scratch("expect");
  std::ofstream(dir / "bogus.json") << bug2_with_expect(R"({"properties": {"bogus": false}})");
  auto o = ckptsim_cli("run --memory --expect " + (dir / "bogus.json").string());
  EXPECT_EQ(o.exit_code, 2) << o.text;
  EXPECT_NE(o.text.find("bogus.json: field 'expect.properties.bogus': unknown property"),
            std::string::npos)
      << o.text;
  std::ofstream(dir / "badtype.json") << bug2_with_expect(R"({"ok": "no"})");
  o = ckptsim_cli("run --memory --expect " + (dir / "badtype.json").string());
  EXPECT_EQ(o.exit_code, 2) << o.text;
  EXPECT_NE(o.text.find("field 'expect.ok'"), std::string::npos) << o.text;
  // No expect block: --expect wants every property to hold.
  std::ofstream(dir / "none.json") << bug2_with_expect("");
  EXPECT_EQ(ckptsim_cli("run --memory --expect --quiet " + (dir / "none.json").string()).exit_code,
            1);
  EXPECT_EQ(
      ckptsim_cli("run --memory --expect --quiet " + scenario("fused-adam-upstream-dp2-to-4.json"))
          .exit_code,
      0);
  o = ckptsim_cli("run --memory " + dir.string());
  EXPECT_EQ(o.exit_code, 2) << o.text;
  EXPECT_NE(o.text.find("is a directory"), std::string::npos) << o.text;
}

// An unnamed scenario is named after its file, so the trace hash does not depend on how the
// path is spelled; a profile file named in a phase is found next to the scenario file.
TEST(Cli, UnnamedScenarioHashIgnoresPathSpellingAndProfilesSitBesideIt) {
  const auto dir = scratch("unnamed");
  std::ofstream(dir / "my-graft.json")
      << R"({"name": "my-graft", "extends": "fix-recommended", "description": "a graft under review"})";
  auto j = nlohmann::json::parse(bug2_with_expect(""));
  for (auto& phase : j["phases"]) phase["revision"] = "my-graft.json";
  std::ofstream(dir / "report.json") << j.dump();
  auto hash = [&](const std::string& path) {
    const auto o = ckptsim_cli("run --json --memory " + path);
    const auto r = nlohmann::json::parse(o.text, nullptr, false);
    EXPECT_FALSE(r.is_discarded()) << o.text;
    EXPECT_EQ(o.exit_code, 0) << o.text;
    return r.is_discarded() ? std::string() : r["trace_hash"].get<std::string>();
  };
  const std::string a = hash((dir / "report.json").string());
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, hash((dir / "." / "report.json").string()));
  EXPECT_EQ(a, hash((dir / ".." / dir.filename() / "report.json").string()));
}

// conform against a real trace recorded on the H200: the model agrees (exit 0); the model with
// bug 2 fixed by a profile (a mutation: the step kept on resume) disagrees with the real code,
// which resets it (exit 1), and says where; a file that is no trace is bad input (exit 2).
TEST(Cli, ConformAgreesDisagreesOrRefuses) {
  const std::string real = ckptsim::test::source_path(
      "tests/conformance/bug2-step-reset-dp2-to-4__nv-f4502eb1c9__h200x1-te-emulated__2026-11-30"
      ".trace.json");
  const auto agree =
      ckptsim_cli("conform " + scenario("bug2-step-reset-dp2-to-4.json") + " " + real);
  EXPECT_EQ(agree.exit_code, 0) << agree.text;
  EXPECT_NE(agree.text.find("step counters 146/146"), std::string::npos) << agree.text;
  EXPECT_NE(agree.text.find("parts "), std::string::npos) << agree.text;

  const auto dir = std::filesystem::path(::testing::TempDir()) / "ckptsim-conform-mutated";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "keeps-step.json")
      << R"({"name": "upstream-2874-keeps-step", "extends": "upstream-2874",
            "switches": {"set_skips_step": true}})";
  auto s = nlohmann::json::parse(std::ifstream(scenario("bug2-step-reset-dp2-to-4.json")));
  for (auto& p : s["phases"]) p["revision"] = "keeps-step.json";
  s.erase("expect");
  std::ofstream(dir / "bug2.json") << s.dump();
  const auto mutated = ckptsim_cli("conform " + (dir / "bug2.json").string() + " " + real);
  EXPECT_EQ(mutated.exit_code, 1) << mutated.text;
  EXPECT_NE(mutated.text.find("DISAGREE  step_matches_uninterrupted"), std::string::npos)
      << mutated.text;
  EXPECT_NE(mutated.text.find("first divergence: phase1 after_load global step 5"),
            std::string::npos)
      << mutated.text;

  const auto bad = ckptsim_cli("conform " + scenario("bug2-step-reset-dp2-to-4.json") + " " +
                               scenario("bug2-step-reset-dp2-to-4.json"));
  EXPECT_EQ(bad.exit_code, 2) << bad.text;
}

namespace {

std::string file_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << p;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A `--json` output with what may differ between a search and its merged shards removed: the
// scenario files' directories and the simulator runs (two shards may both shrink a cause).
nlohmann::json comparable(const Output& o) {
  auto j = nlohmann::json::parse(o.text, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << o.text;
  if (j.is_discarded()) return j;
  j.erase("simulator_runs");
  for (auto& f : j["failures"]) {
    f["scenario_file"] = std::filesystem::path(f["scenario_file"].get<std::string>()).filename();
  }
  return j;
}

}  // namespace

// Issue 11 item 6: shards 1/2 and 2/2 of upstream-2874, seed 1, merged, are the unsharded check
// (run with 2 jobs): the same causes at the same case indices, the same minimal scenario files
// byte for byte, the same JUnit file, cases and coverage. Shard 2 takes its shard from
// CKPTSIM_SHARD. (Caught: merge keeping a cause's last case index instead of its first.)
TEST(Cli, ShardsMergedAreTheUnshardedCheck) {
  const auto dir = scratch("shards");
  const std::string common =
      "check --revision upstream-2874 --seed 1 --json --quiet --coverage";  // 500 cases
  auto run = [&](const std::string& tag, const std::string& flags, const std::string& env) {
    const auto o = ckptsim_cli(common + " " + flags + " --out " + (dir / tag).string() +
                                   " --junit " + (dir / (tag + ".xml")).string(),
                               env);
    EXPECT_EQ(o.exit_code, 1) << o.text;
    return o;
  };
  const Output whole = run("whole", "--jobs 2", "");
  run("s1", "--shard 1/2 --jobs 1", "CKPTSIM_SHARD=2/2");  // the flag wins
  run("s2", "", "CKPTSIM_SHARD=2/2 RANK=0 WORLD_SIZE=3");  // CKPTSIM_SHARD wins
  const Output merged = ckptsim_cli(
      "merge --json --quiet --coverage " + (dir / "s1").string() + " " + (dir / "s2").string() +
      " --out " + (dir / "merged").string() + " --junit " + (dir / "merged.xml").string());
  ASSERT_EQ(merged.exit_code, 1) << merged.text;
  const nlohmann::json a = comparable(whole);
  const nlohmann::json b = comparable(merged);
  std::string causes;
  for (const auto& f : a["failures"])
    causes += f["signature"].get<std::string>() + "@" + std::to_string(f["case"].get<int>()) + " ";
  ASSERT_GE(a["failures"].size(), 2u) << causes;
  EXPECT_EQ(a, b) << "unsharded: " << causes;
  for (const auto& f : a["failures"]) {
    const std::string name = f["scenario_file"];
    EXPECT_EQ(file_text(dir / "merged" / name), file_text(dir / "whole" / name)) << name;
  }
  // The JUnit file names each minimal scenario's path: the same but for the folder.
  std::string junit = file_text(dir / "merged.xml");
  const std::string from = (dir / "merged").string();
  for (size_t at = junit.find(from); at != std::string::npos; at = junit.find(from, at))
    junit.replace(at, from.size(), (dir / "whole").string());
  EXPECT_EQ(junit, file_text(dir / "whole.xml"));
  // Each shard found some of the causes; between them a cause found twice is kept once.
  const auto s1 = nlohmann::json::parse(file_text(dir / "s1" / "ckptsim-summary.json"));
  const auto s2 = nlohmann::json::parse(file_text(dir / "s2" / "ckptsim-summary.json"));
  EXPECT_EQ(s1["shard"]["index"], 1);
  EXPECT_EQ(s2["shard"]["index"], 2);
  EXPECT_EQ(s1["cases_run"].get<int>() + s2["cases_run"].get<int>(), 500);
}

// merge takes every shard of one search, or refuses at once, naming what is wrong; a check
// prints its jobs and shard, and its progress line says them too.
TEST(Cli, MergeRefusesAnIncompleteOrMixedSetOfShards) {
  const auto dir = scratch("merge-refuses");
  const std::string check = "check --revision fix-complete --cases 4 --jobs 2 --out ";
  const Output a = ckptsim_cli(check + (dir / "a").string() + " --shard 1/2");
  ASSERT_EQ(a.exit_code, 0) << a.text;
  EXPECT_NE(a.text.find("jobs=2 shard=1/2 (from --shard)"), std::string::npos) << a.text;
  EXPECT_NE(a.text.find("2 / 2 cases, 0 failure(s), "), std::string::npos) << a.text;
  EXPECT_NE(a.text.find("jobs 2 (shard 1/2)"), std::string::npos) << a.text;
  ASSERT_EQ(ckptsim_cli(check + (dir / "b").string() + " --seed 2 --shard 2/2").exit_code, 0);
  const std::string merge = "merge --out " + (dir / "m").string() + " ";
  struct Case {
    std::string dirs;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {(dir / "a").string(),
            "shard 2/2 of `ckptsim check --revision fix-complete --seed 1 "
            "--cases 4` is missing"},
           {(dir / "a").string() + " " + (dir / "b").string(), "not one search"},
           {(dir / "a").string() + " " + (dir / "a").string(), "both hold shard 1/2"},
           {(dir / "nothing").string(), "ckptsim-summary.json: cannot open"},
       }) {
    const Output o = ckptsim_cli(merge + c.dirs);
    EXPECT_EQ(o.exit_code, 2) << c.dirs << "\n" << o.text;
    EXPECT_NE(o.text.find(c.says), std::string::npos) << c.dirs << "\n" << o.text;
  }
  const Output bad_env = ckptsim_cli(check + (dir / "c").string(), "SLURM_PROCID=2 SLURM_NTASKS=2");
  EXPECT_EQ(bad_env.exit_code, 2) << bad_env.text;
  EXPECT_NE(bad_env.text.find("SLURM_PROCID: must be a whole number in [0, 2)"), std::string::npos)
      << bad_env.text;
}

namespace {

// The scenario files `generate` wrote into `dir`, in case order.
std::vector<nlohmann::json> generated(const std::string& dir, int64_t cases) {
  std::vector<nlohmann::json> out;
  for (int64_t k = 0; k < cases; ++k) {
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.ends_with("-case" + std::to_string(k) + ".json")) {
        std::ifstream in(e.path());
        out.push_back(nlohmann::json::parse(in));
      }
    }
  }
  return out;
}

double dp1_share(const std::vector<nlohmann::json>& scenarios) {
  double phases = 0, dp1 = 0;
  for (const auto& s : scenarios) {
    for (const auto& p : s["phases"]) {
      ++phases;
      dp1 += p["dp"] == 1 ? 1 : 0;
    }
  }
  return dp1 / phases;
}

std::string fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  return dir.string();
}

}  // namespace

// `generate --cases 12` spreads its cases over the sizes (check's ramp gave 12 cases DP 1 in 20
// of 24 phases at this seed), prints the coverage, and each file's description is the command
// that writes it again. (Caught: generate left at the ramp; the repeat line missing --size.)
TEST(Cli, GenerateSpreadsTwelveCasesAndEachFileSaysHowToRepeatIt) {
  const std::string dir = fresh_dir("ckptsim-generate-spread");
  const auto o =
      ckptsim_cli("generate --revision upstream-2874 --cases 12 --coverage --out " + dir);
  ASSERT_EQ(o.exit_code, 0) << o.text;
  EXPECT_NE(o.text.find("coverage: 12 cases"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("  resumes: reshard: "), std::string::npos) << o.text;
  const auto spread = generated(dir, 12);
  ASSERT_EQ(spread.size(), 12u);
  EXPECT_LT(dp1_share(spread), 0.5);
  const std::string description = spread[3]["description"];
  EXPECT_EQ(description,
            "Drawn by `ckptsim generate --revision upstream-2874 --seed 1 --cases 12` (case 3).");
  const std::string ramp_dir = fresh_dir("ckptsim-generate-ramp");
  ASSERT_EQ(
      ckptsim_cli("generate --revision upstream-2874 --cases 12 --size ramp --out " + ramp_dir)
          .exit_code,
      0);
  const auto ramp = generated(ramp_dir, 12);
  EXPECT_GT(dp1_share(ramp), 0.7);
  // The ramp's repeat line names its --size, and repeats it.
  const std::string repeat = ramp[0]["description"];
  const std::string args =
      repeat.substr(repeat.find("generate"), repeat.find("` (case") - repeat.find("generate"));
  EXPECT_NE(args.find(" --size ramp"), std::string::npos) << args;
  const std::string again = fresh_dir("ckptsim-generate-again");
  ASSERT_EQ(ckptsim_cli(args + " --out " + again).exit_code, 0);
  EXPECT_EQ(generated(again, 12), ramp);
}

// --campaign takes DP up to 8 and 3 params unless --dp-max / --params-max say otherwise, and
// its repeat line says so. (Caught: the limits applied over an explicit --dp-max.)
TEST(Cli, GenerateCampaignTakesItsLimitsUnlessGiven) {
  auto largest = [](const std::vector<nlohmann::json>& scenarios, const char* what) {
    int64_t m = 0;
    for (const auto& s : scenarios) {
      if (std::string(what) == "dp") {
        for (const auto& p : s["phases"]) m = std::max<int64_t>(m, p["dp"]);
      } else {
        m = std::max<int64_t>(m, static_cast<int64_t>(s["params"].size()));
      }
    }
    return m;
  };
  const std::string dir = fresh_dir("ckptsim-generate-campaign");
  ASSERT_EQ(
      ckptsim_cli("generate --campaign --revision upstream-head --cases 40 --seed 30 --out " + dir)
          .exit_code,
      0);
  const auto campaign = generated(dir, 40);
  EXPECT_EQ(largest(campaign, "dp"), 8);
  EXPECT_EQ(largest(campaign, "params"), 3);
  EXPECT_NE(campaign[0]["description"].get<std::string>().find(
                "`ckptsim generate --campaign --revision upstream-head --seed 30 --cases 40 "
                "--dp-max 8 --params-max 3`"),
            std::string::npos)
      << campaign[0]["description"];
  const std::string narrow = fresh_dir("ckptsim-generate-campaign-dp4");
  ASSERT_EQ(ckptsim_cli("generate --campaign --revision upstream-head --cases 40 --seed 30 "
                        "--dp-max 4 --params-max 2 --out " +
                        narrow)
                .exit_code,
            0);
  const auto narrowed = generated(narrow, 40);
  EXPECT_EQ(largest(narrowed, "dp"), 4);
  EXPECT_EQ(largest(narrowed, "params"), 2);
}

TEST(Cli, GenerateRefusesBadSizesAndStatefulCampaigns) {
  const std::string out = fresh_dir("ckptsim-generate-bad");
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--size 101", "--size must be spread, ramp or a size in [0, 100], got 101"},
           {"--size big", "--size must be spread, ramp or a size in [0, 100], got big"},
           {"--size -1", "got -1"},
           {"--campaign --stateful", "--campaign draws its own phases: it takes no --stateful"},
       }) {
    const auto o =
        ckptsim_cli("generate --revision upstream-head --cases 2 " + args + " --out " + out);
    EXPECT_EQ(o.exit_code, 2) << args << "\n" << o.text;
    EXPECT_NE(o.text.find(says), std::string::npos) << args << "\n" << o.text;
  }
}
