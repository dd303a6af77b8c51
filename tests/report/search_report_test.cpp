// The check summary (ckptsim-summary.json) names when each finding was committed:
// scripts/jobs-scaling.sh reads the first one's `found_s` for its "first finding s" column.
// Mutation caught: the field left out of the summary (WritesWhenEachFailureWasFound).
#include "report/search_report.h"

#include <gtest/gtest.h>

using namespace ckptsim;

TEST(CheckSummaryJson, WritesWhenEachFailureWasFound) {
  report::CheckSummary s;
  s.revision = "fix-complete";
  search::Failure& f = s.result.failures.emplace_back();
  f.finding.property = "resume_completes";
  f.finding.signature = "resume_completes";
  f.case_index = 14;
  f.found_s = 0.125;
  report::ReportedFailure rep;
  rep.failure = &f;
  rep.file = "/tmp/x/case-14.json";
  const nlohmann::json j = report::check_summary_json(s, {rep});
  ASSERT_EQ(j.at("failures").size(), 1u);
  EXPECT_EQ(j.at("failures")[0].at("case"), 14);
  EXPECT_DOUBLE_EQ(j.at("failures")[0].at("found_s").get<double>(), 0.125);
}
