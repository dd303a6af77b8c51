// The check summary (ckptsim-summary.json) names when each finding was committed:
// scripts/jobs-scaling.sh reads the first one's `found_s` for its "first finding s" column.
// Mutations caught: the field left out of the summary (WritesWhenEachFailureWasFound); the
// field not read back, so `ckptsim merge` would write 0 (FoundTimeSurvivesAReadBack).
#include "report/search_report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/testing.h"

using namespace ckptsim;

namespace {

// A summary of `revision` with one failure of `property` at case `case_index`, found at
// `found_s`, its scenario in `file`; the failure as reported.
report::ReportedFailure one_failure(report::CheckSummary& s, const std::string& revision,
                                    const std::string& property, int64_t case_index, double found_s,
                                    const std::string& file) {
  s.revision = revision;
  search::Failure& f = s.result.failures.emplace_back();
  f.finding.property = property;
  f.finding.signature = property;
  f.case_index = case_index;
  f.found_s = found_s;
  report::ReportedFailure rep;
  rep.failure = &f;
  rep.file = file;
  return rep;
}

}  // namespace

TEST(CheckSummaryJson, WritesWhenEachFailureWasFound) {
  report::CheckSummary s;
  const report::ReportedFailure rep =
      one_failure(s, "fix-complete", "resume_completes", 14, 0.125, "/tmp/x/case-14.json");
  const nlohmann::json j = report::check_summary_json(s, {rep});
  ASSERT_EQ(j.at("failures").size(), 1u);
  EXPECT_EQ(j.at("failures")[0].at("case"), 14);
  EXPECT_DOUBLE_EQ(j.at("failures")[0].at("found_s").get<double>(), 0.125);
}

// What `ckptsim merge` reads back keeps each failure's found_s.
TEST(CheckSummaryJson, FoundTimeSurvivesAReadBack) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "ckptsim-search-report-test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(test::source_path("scenarios/bug2-step-reset-dp2-to-2.json"),
                             dir / "case-3.json");
  report::CheckSummary s;
  const report::ReportedFailure rep = one_failure(s, "upstream-2874", "step_matches_uninterrupted",
                                                  3, 2.5, (dir / "case-3.json").string());
  std::ofstream(dir / "ckptsim-summary.json") << report::check_summary_json(s, {rep}).dump(1);
  const auto back = report::read_check_summary(dir.string(), test::registry());
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  ASSERT_EQ(back.value().result.failures.size(), 1u);
  EXPECT_DOUBLE_EQ(back.value().result.failures[0].found_s, 2.5);
  std::filesystem::remove_all(dir);
}
