// Every bundled scenario (scenarios/*.json) gives exactly the verdicts of its "expect" block:
// the reproductions fail the properties they reproduce, the controls and fixes pass them.
// A test per file (parametrized, named after the file), so a regression names its scenario.
// The expectations were written from the spec (§12, §16, §17), not read off a run.
#include <gtest/gtest.h>

#include <filesystem>

#include "properties/expect.h"
#include "tests/testing.h"

namespace {

// scenarios/*.json (the curated reproductions) and scenarios/found/*.json (the regression
// corpus: minimal scenarios the search found and we keep), as paths below scenarios/.
std::vector<std::string> bundled() {
  std::vector<std::string> out;
  for (const char* dir : {"scenarios", "scenarios/found"}) {
    for (const auto& e : std::filesystem::directory_iterator(ckptsim::test::source_path(dir))) {
      if (e.path().extension() != ".json") continue;
      const std::string sub = std::string(dir) == "scenarios" ? "" : "found/";
      out.push_back(sub + e.path().filename().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

class BundledScenario : public ::testing::TestWithParam<std::string> {};

TEST_P(BundledScenario, GivesItsExpectedVerdicts) {
  const auto s = ckptsim::test::scenario_file("scenarios/" + GetParam());
  ASSERT_FALSE(s.expect.is_null()) << "every bundled scenario states its expected verdicts";
  const auto run = ckptsim::test::run(s);
  const auto results = ckptsim::properties::check_all(run);
  const auto expect = ckptsim::properties::parse_expectation(s.expect, GetParam());
  ASSERT_TRUE(expect.is_ok()) << expect.status().to_string();
  const auto mismatches = ckptsim::properties::expectation_mismatches(*expect.value(), results);
  for (const auto& m : mismatches) ADD_FAILURE() << GetParam() << ": " << m;
}

INSTANTIATE_TEST_SUITE_P(Scenarios, BundledScenario, ::testing::ValuesIn(bundled()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param.substr(0, info.param.size() - 5);
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

class FoundScenario : public ::testing::TestWithParam<std::string> {};

// fix-complete fixes everything the search found: each corpus scenario, every phase replayed
// under fix-complete, keeps every property.
TEST_P(FoundScenario, PassesUnderFixComplete) {
  auto s = ckptsim::test::scenario_file("scenarios/" + GetParam());
  const auto fix = ckptsim::test::revisions({"fix-complete"}).front();
  for (auto& p : s.phases) p.set_revision(fix);
  const auto run = ckptsim::test::run(s);
  for (const auto& r : ckptsim::properties::check_all(run))
    EXPECT_TRUE(r.ok()) << GetParam() << ": " << r.name << ": " << r.detail;
}

std::vector<std::string> found_only() {
  std::vector<std::string> out;
  for (const auto& f : bundled()) {
    if (f.rfind("found/", 0) == 0) out.push_back(f);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Corpus, FoundScenario, ::testing::ValuesIn(found_only()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param.substr(6, info.param.size() - 11);
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

TEST(BundledScenarios, CoverTheIssueList) {
  const auto files = bundled();
  auto has = [&](const std::string& f) {
    return std::find(files.begin(), files.end(), f) != files.end();
  };
  for (const char* row : {"A", "B", "C", "D", "E", "F", "G", "H", "I", "J"}) {
    EXPECT_TRUE(std::any_of(
        files.begin(), files.end(),
        [&](const std::string& f) { return f.rfind(std::string("spec17-") + row + "-", 0) == 0; }))
        << "spec §17 row " << row;
  }
  for (const char* f : {"bug1-duplicate-leaf-dp2-to-2.json", "bug1-duplicate-leaf-dp2-to-4.json",
                        "bug2-step-reset-dp2-to-2.json", "bug2-step-reset-dp2-to-4.json",
                        "fused-adam-upstream-dp2-to-4.json", "fused-adam-upstream-dp4-to-2.json"}) {
    EXPECT_TRUE(has(f)) << f;
  }
}

}  // namespace
