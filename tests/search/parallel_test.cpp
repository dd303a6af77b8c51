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

// DearFirst (search/parallel.h, invariant 5): a task predicted to cost far more than the rest
// starts first, not in its turn, and results still come back in index order; the other workers
// keep the index order. The start order is the schedule's own (Judged::started_as), and four
// blockers hold the workers until the schedule holds all 40 predictions, so it does not hang on
// timing. (Recording the starts inside the tasks did: two workers that picked 0 and 1 could
// record them the other way round, and CI saw task 0 recorded third.) Mutation caught:
// pick_locked ignoring the predictions (task 37 then starts 38th).
TEST(JudgedInOrder, DearFirstStartsThePredictedDearestFirst) {
  search::WorkPool pool(4);
  std::atomic<const search::JudgedInOrder*> self{nullptr};
  for (int w = 0; w < pool.workers(); ++w) {
    pool.submit(
        [&self] {
          while (self.load() == nullptr || self.load()->predictions_published() < 40) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        },
        false);
  }
  std::atomic<int64_t> runs{0};
  search::JudgedInOrder judged(
      pool, 40, 64, false,
      [](int64_t i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(i == 37 ? 20 : 1));
        search::Judged j;
        j.scenario.name = std::to_string(i);
        return j;
      },
      runs, search::DearFirst{[](int64_t i) { return i == 37 ? 1000.0 : 1.0; }});
  self = &judged;
  std::vector<int64_t> started(40, -1);  // by start, the task
  for (int64_t i = 0; i < 40; ++i) {
    const search::Judged j = judged.take(i);
    EXPECT_EQ(j.scenario.name, std::to_string(i));
    ASSERT_GE(j.started_as, 0);
    ASSERT_LT(j.started_as, 40);
    started[static_cast<size_t>(j.started_as)] = i;
  }
  // 37 first (the one lane that may run out of order takes it), then 0, 1, ... in index order.
  std::vector<int64_t> expected{37};
  for (int64_t i = 0; i < 40; ++i) {
    if (i != 37) expected.push_back(i);
  }
  EXPECT_EQ(started, expected);
}

// The prediction grows with what a case runs: steps, ranks, elements, phases; TP and PP split
// the elements among more ranks; padded buckets cost. Mutations caught: the steps left out of
// the per-step terms; each rank's share of the elements not divided by TP x PP; the grad
// buffer taken as the params' numel (the padding left out).
TEST(PredictedCost, GrowsWithStepsRanksElementsAndPhases) {
  sim::Scenario s;
  s.params.push_back({});
  s.params[0].numel = 1000;
  s.phases.resize(2);
  s.phases[0].steps = 2;
  s.phases[1].steps = 2;
  const double base = search::predicted_cost(s);
  sim::Scenario longer = s;
  longer.phases[0].steps = 2000;
  sim::Scenario wider = s;
  wider.phases[1].dp = 8;
  sim::Scenario bigger = s;
  bigger.params[0].numel = 100'000;
  sim::Scenario more = s;
  more.phases.push_back(s.phases[1]);
  sim::Scenario padded = s;  // every bucket padded to 65,536 elements
  padded.pad_buckets_for_high_nccl_busbw = true;
  for (const auto* t : {&longer, &wider, &bigger, &more, &padded}) {
    EXPECT_GT(search::predicted_cost(*t), base);
  }
  // Two phases of 2 steps and the reference run's 4, at DP 1: 8 rank-steps over one bucket.
  EXPECT_EQ(search::cost_terms(padded).buffer_steps, 8 * 65536);
  // A long phase outweighs everything else a small case draws.
  EXPECT_GT(search::predicted_cost(longer), 50 * base);
  sim::Scenario split = s;
  split.phases[0].tp = 4;
  split.phases[1].tp = 4;
  EXPECT_EQ(search::cost_terms(split).element_steps, search::cost_terms(s).element_steps)
      << "TP x4 ranks, each a quarter of the elements";
}
