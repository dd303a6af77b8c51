// search::Coverage: what a search drew, counted per feature. The counts are checked against
// scenarios written by hand, and a search's table against its generator's options.
#include "search/coverage.h"

#include <gtest/gtest.h>

#include <optional>

#include "search/search.h"
#include "tests/testing.h"

using namespace ckptsim;

namespace {

sim::Scenario three_phases() {
  // w0 bf16 with wd_mult 0, w1 fp32: two groups, mixed dtypes; DP 2 -> 3 -> 3, 258, 0 and 2048
  // steps, the revision changes at the second resume.
  return test::scenario_from_json(R"({"seed": 1, "name": "c", "params": [
      {"name": "w0", "numel": 10, "dtype": "bf16", "wd_mult": 0.0},
      {"name": "w1", "numel": 20, "dtype": "fp32"}],
    "optimizer": {"kind": "hybrid", "offload_fraction": 0.5, "lr": 0.01, "betas": [0.9, 0.95],
                  "eps": 1e-8, "weight_decay": 0.1},
    "phases": [{"dp": 2, "revision": "fix-complete", "steps": 258},
               {"dp": 3, "revision": "fix-complete", "steps": 0},
               {"dp": 3, "revision": "upstream-2874", "steps": 2048}]})");
}

}  // namespace

TEST(Coverage, CountsWhatTheScenariosHold) {
  search::Coverage c;
  c.add(three_phases());
  EXPECT_EQ(c.cases(), 1);
  EXPECT_EQ(c.phases(), 3);
  EXPECT_EQ(c.count("cases: optimizer", "hybrid, offload between"), 1);
  EXPECT_EQ(c.count("cases: dtypes", "bf16 and fp32 mixed"), 1);
  EXPECT_EQ(c.count("cases: param groups", "wd_mult differs (0/1)"), 1);
  EXPECT_EQ(c.count("phases: steps", "250-270 (near 2^8)"), 1);
  EXPECT_EQ(c.count("phases: steps", "0"), 1);
  EXPECT_EQ(c.count("phases: steps", "2040-2060 (near 2^11)"), 1);
  EXPECT_EQ(c.count("cases: longest phase", "2040-2060 (near 2^11)"), 1);
  EXPECT_EQ(c.count("resumes: DP", "2 -> 3"), 1);
  EXPECT_EQ(c.count("resumes: reshard", "up, not dividing"), 1);
  EXPECT_EQ(c.count("resumes: reshard", "same DP"), 1);
  EXPECT_EQ(c.count("resumes: revision", "revision changes"), 1);
  EXPECT_EQ(c.count("phases: revision", "fix-complete"), 2);
  // Merging adds the counts; the text names every feature with its shares.
  search::Coverage twice;
  twice.merge(c);
  twice.merge(c);
  EXPECT_EQ(twice.count("phases: steps", "0"), 2);
  EXPECT_EQ(twice.phases(), 6);
  const std::string text = twice.text();
  EXPECT_NE(text.find("coverage: 2 cases, 6 phases drawn"), std::string::npos) << text;
  EXPECT_NE(text.find("resumes: reshard: same DP 50.0% (2), up, not dividing 50.0% (2)"),
            std::string::npos)
      << text;
}

TEST(Coverage, TheStepBandsMeetAtTheirEdges) {
  EXPECT_EQ(search::Coverage::steps_band(6), "2-6");
  EXPECT_EQ(search::Coverage::steps_band(7), "7-249");
  EXPECT_EQ(search::Coverage::steps_band(249), "7-249");
  EXPECT_EQ(search::Coverage::steps_band(250), "250-270 (near 2^8)");
  EXPECT_EQ(search::Coverage::steps_band(271), "271-2039");
  EXPECT_EQ(search::Coverage::steps_band(2060), "2040-2060 (near 2^11)");
  EXPECT_EQ(search::Coverage::steps_band(2061), ">2060");
}

// A search of the CLI's default size and options draws long phases in both bands; without
// them it draws none past steps_max. (A judge that finds nothing: only the drawing counts.)
TEST(Coverage, ADefaultSizeSearchDrawsLongPhases) {
  search::SearchOptions o;
  o.generator.revisions = test::revisions({"fix-complete"});
  o.generator.long_steps_max = 4096;
  const search::Judge nothing = [](const sim::Scenario&) {
    return std::optional<search::Finding>();
  };
  const search::SearchResult with = search::search(o, nothing);
  EXPECT_EQ(with.coverage.cases(), o.cases);
  EXPECT_GT(with.coverage.count("phases: steps", "250-270 (near 2^8)"), 0);
  EXPECT_GT(with.coverage.count("phases: steps", "2040-2060 (near 2^11)"), 0);
  EXPECT_GT(with.coverage.count("cases: param groups", "wd_mult differs (0/1)"), 0);
  o.generator.long_steps_max = 0;
  const search::SearchResult without = search::search(o, nothing);
  for (const auto& [band, n] : without.coverage.counts().at("phases: steps")) {
    EXPECT_TRUE(band == "0" || band == "1" || band == "2-6") << band << ": " << n;
  }
}

// --fault-space storage: every kind of fault at every kind of file is drawn; a search without
// it draws none (the feature is absent). Mutation caught: the faults not counted.
TEST(Coverage, TheStorageFaultSpaceDrawsEveryKindAtEveryFile) {
  search::SearchOptions o;
  o.generator.revisions = test::revisions({"fix-complete"});
  const search::Judge nothing = [](const sim::Scenario&) {
    return std::optional<search::Finding>();
  };
  EXPECT_EQ(search::search(o, nothing).coverage.counts().count("phases: storage fault"), 0u);
  o.generator.storage_faults = true;
  const search::SearchResult with = search::search(o, nothing);
  for (const char* kind : {"crash_before", "crash_after", "torn", "short", "disk_full"}) {
    for (const char* file : {"any", "shard", "object", "metadata", "tracker"}) {
      EXPECT_GT(with.coverage.count("phases: storage fault", fmt::format("{} at {}", kind, file)),
                0)
          << kind << " at " << file;
    }
  }
}

// At a revision that keeps the common state as a ShardedObject (HEAD), no fault is drawn at an
// `object` file: the real save writes none there (it is an item of rank 0's .distcp), so such a
// fault would fire in the model only. Every other file kind still is. Mutation caught: the
// revision's layout ignored (object faults drawn at HEAD, as before 2026-12-05).
TEST(Coverage, TheStorageFaultSpaceDrawsNoObjectFaultWhereTheRealSaveWritesNoObjectFile) {
  search::SearchOptions o;
  o.generator.revisions = test::revisions({"upstream-head"});
  o.generator.storage_faults = true;
  const search::Judge nothing = [](const sim::Scenario&) {
    return std::optional<search::Finding>();
  };
  const search::SearchResult head = search::search(o, nothing);
  for (const char* kind : {"crash_before", "crash_after", "torn", "short", "disk_full"}) {
    EXPECT_EQ(head.coverage.count("phases: storage fault", fmt::format("{} at object", kind)), 0)
        << kind;
    EXPECT_GT(head.coverage.count("phases: storage fault", fmt::format("{} at shard", kind)), 0)
        << kind;
  }
}

// The features a campaign on the real code is judged by: DP 1 throughout or not, the hybrid's
// fp32 params and offload, and per resume that changes its arguments, which ones (--lr, --min-lr,
// weight decay) and under which flag and revision. (Caught: a changed min_lr counted as lr; a
// resume's revision taken from the phase before it.)
TEST(Coverage, CountsTheArgumentsAResumeChangesAndWhere) {
  search::Coverage c;
  c.add(three_phases());
  EXPECT_EQ(c.count("cases: DP", "above 1 in a phase"), 1);
  EXPECT_EQ(c.count("cases: hybrid, fp32 params", "some, offload between"), 1);
  EXPECT_EQ(c.counts().count("resumes: arguments that change"), 0u);
  c.add(test::scenario_from_json(R"({"seed": 1, "name": "d", "params": [
      {"name": "w0", "numel": 10, "dtype": "bf16"}],
    "optimizer": {"kind": "fused_adam", "lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8,
                  "weight_decay": 0.1},
    "phases": [{"dp": 1, "revision": "miles-main", "steps": 1},
               {"dp": 1, "revision": "upstream-2874", "steps": 1, "schedule": {"min_lr": 0.001},
                "opt_param_scheduler": "override"},
               {"dp": 1, "revision": "upstream-2874", "steps": 1,
                "schedule": {"lr": 0.02, "min_lr": 0.001, "start_weight_decay": 0.2,
                             "end_weight_decay": 0.2},
                "opt_param_scheduler": "use_checkpoint"}]})"));
  EXPECT_EQ(c.count("cases: DP", "1 throughout"), 1);
  EXPECT_EQ(c.count("cases: hybrid, fp32 params", "none"), 0);
  EXPECT_EQ(c.count("resumes: arguments that change", "min_lr"), 1);
  EXPECT_EQ(c.count("resumes: arguments that change", "lr and weight decay"), 1);
  EXPECT_EQ(
      c.count("resumes: arguments change, by revision", "miles-main -> upstream-2874, override"),
      1);
  EXPECT_EQ(c.count("resumes: arguments change, by revision", "upstream-2874, use_checkpoint"), 1);
}

// `ckptsim merge` reads each shard's coverage back from its summary: every count survives, and
// a malformed table is an error naming the file, never counts made up. (Caught: from_json
// dropping the phase count.)
TEST(Coverage, FromJsonGivesBackEveryCount) {
  search::Coverage c;
  c.add(three_phases());
  c.add(three_phases());
  auto back = search::Coverage::from_json(c.json(), "s.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back.value().json(), c.json());
  EXPECT_EQ(back.value().phases(), 6);
  nlohmann::json bad = c.json();
  bad["counts"]["phases: DP"]["2"] = -1;
  auto refused = search::Coverage::from_json(bad, "s.json");
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("s.json: coverage: 'counts.phases: DP.2'"),
            std::string::npos)
      << refused.status().message();
  EXPECT_FALSE(search::Coverage::from_json(nlohmann::json::object(), "s.json").is_ok());
}
