// A search on several cores, and a search split into shards (search/search.h, invariants 5 and
// 6). Mutations these tests were shown to catch: results committed in the order workers finish
// instead of case order, and a shrink moving to the first candidate to finish instead of the
// first in candidate order (SameFailuresForAnyNumberOfJobs); merge_shards keeping the last
// case index of a cause instead of the first (ShardsMergedAreTheWholeSearch); a task's
// exception rethrown at another index than its own (JudgedInOrder*).
#include "search/parallel.h"

#include <gtest/gtest.h>

#include "search/search.h"
#include "tests/testing.h"

using namespace ckptsim;

namespace {

search::SearchOptions upstream_2874(int64_t cases) {
  search::SearchOptions o;
  o.generator.revisions = test::revisions({"upstream-2874"});
  o.generator.dp_max = 8;
  o.seed = 1;
  o.cases = cases;
  o.keep_going = true;
  o.shrink_runs_max = 300;
  return o;
}

// Everything a search found that must not depend on jobs or shards: per failure its cause,
// case, detail, shrink counts and scenarios; the cases run and the coverage.
nlohmann::json found(const search::SearchResult& r, bool with_judge_runs) {
  nlohmann::json j{{"cases_run", r.cases_run},
                   {"coverage", r.coverage.json()},
                   {"failures", nlohmann::json::array()}};
  if (with_judge_runs) j["judge_runs"] = r.judge_runs;
  for (const auto& f : r.failures) {
    j["failures"].push_back({{"case", f.case_index},
                             {"property", f.finding.property},
                             {"signature", f.finding.signature},
                             {"detail", f.finding.detail},
                             {"shrink_steps", f.shrink_steps},
                             {"shrink_runs", f.shrink_runs},
                             {"original", sim::scenario_to_json(f.original)},
                             {"minimal", sim::scenario_to_json(f.minimal)}});
  }
  return j;
}

std::string causes(const search::SearchResult& r) {
  std::string out;
  for (const auto& f : r.failures) out += fmt::format("{}@{} ", f.finding.signature, f.case_index);
  return out;
}

}  // namespace

// Three workers on any machine (two cores here): cases finish out of order and shrink
// candidates race; the search must still commit and shrink exactly as one thread does. The
// judge first waits 0 to 18 ms, by a hash of the scenario, so that the finishing order is
// scrambled on any machine (what it finds does not depend on it).
TEST(SearchJobs, SameFailuresForAnyNumberOfJobs) {
  search::SearchOptions o = upstream_2874(120);
  const search::Judge plain = search::property_judge();
  const search::Judge judge = [&plain](const sim::Scenario& s) {
    const size_t hash = std::hash<std::string>{}(sim::scenario_to_json(s).dump());
    std::this_thread::sleep_for(std::chrono::milliseconds(3 * (hash % 7)));
    return plain(s);
  };
  o.jobs = 1;
  const search::SearchResult one = search::search(o, judge);
  ASSERT_GE(one.failures.size(), 2u) << "upstream-2874 has several causes: " << causes(one);
  EXPECT_EQ(one.discarded_runs, 0);
  o.jobs = 3;
  const search::SearchResult three = search::search(o, judge);
  EXPECT_EQ(causes(three), causes(one));
  EXPECT_EQ(found(three, true), found(one, true));
  EXPECT_GE(three.discarded_runs, 0);
}

// Shards 1..3 merged are the whole search: the same failures (the first case index of each
// cause), cases and coverage; each shard ran only its own cases.
TEST(SearchShards, ShardsMergedAreTheWholeSearch) {
  const auto judge = search::property_judge();
  search::SearchOptions o = upstream_2874(120);
  const search::SearchResult whole = search::search(o, judge);
  std::vector<search::SearchResult> shards;
  for (int64_t k = 1; k <= 3; ++k) {
    o.shard = {k, 3};
    o.jobs = static_cast<int>(k);  // and any number of jobs
    shards.push_back(search::search(o, judge));
    EXPECT_EQ(shards.back().cases_run, 40);
    for (const auto& f : shards.back().failures) EXPECT_EQ(f.case_index % 3, k - 1);
  }
  // A cause found by more than one shard: the merge must pick, not just collect.
  std::map<std::string, int> shards_finding;
  for (const auto& s : shards) {
    for (const auto& f : s.failures) ++shards_finding[f.finding.signature];
  }
  EXPECT_TRUE(std::any_of(shards_finding.begin(), shards_finding.end(),
                          [](const auto& e) { return e.second > 1; }));
  const search::SearchResult merged = search::merge_shards(shards, true);
  EXPECT_EQ(causes(merged), causes(whole));
  EXPECT_EQ(found(merged, false), found(whole, false));
}

TEST(SearchShards, WithoutKeepGoingTheMergeKeepsTheFirstFailure) {
  search::SearchResult a;
  search::SearchResult b;
  a.failures.resize(1);
  a.failures[0].case_index = 4;
  a.failures[0].finding.signature = "x";
  b.failures.resize(1);
  b.failures[0].case_index = 1;
  b.failures[0].finding.signature = "y";
  const auto merged = search::merge_shards({a, b}, false);
  ASSERT_EQ(merged.failures.size(), 1u);
  EXPECT_EQ(merged.failures[0].case_index, 1);
  EXPECT_EQ(search::merge_shards({a, b}, true).failures.size(), 2u);
}

// Results come back in index order whatever order the workers finish in, and what task i threw
// is rethrown when i is taken, not before.
TEST(JudgedInOrder, ResultsInIndexOrderAndErrorsAtTheirOwnIndex) {
  for (int workers : {0, 3}) {
    search::WorkPool pool(workers);
    std::atomic<int64_t> runs{0};
    search::JudgedInOrder judged(
        pool, 8, 4, false,
        [](int64_t i) {
          // Later tasks finish first.
          std::this_thread::sleep_for(std::chrono::milliseconds(8 - i));
          if (i == 5) throw std::runtime_error("task 5");
          search::Judged j;
          j.scenario.name = std::to_string(i);
          return j;
        },
        runs);
    for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(judged.take(i).scenario.name, std::to_string(i));
    EXPECT_THROW(judged.take(5), std::runtime_error) << workers << " workers";
    EXPECT_EQ(judged.take(6).scenario.name, "6");
    if (workers == 0) {
      EXPECT_EQ(runs.load(), 7) << "nothing is judged ahead on one thread";
    }
  }
}
