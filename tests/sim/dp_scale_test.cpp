// Production DP sizes (issue 11 item 7): the ranks of a world share one copy of what they
// gather and of the checkpoint index they load (sim/local_world.h ObjectGathers,
// model/process_group.h GatheredObjects, model/megatron/checkpoint_caches.h LoadIndex), and that
// sharing changes nothing.
//
// Which deliberately broken variant each test catches:
//   SharingChangesNothing/*      any sharing that changes what a rank learns: a shared gather
//                                that reorders or drops a rank's entries, hands out another
//                                round's, or fails a collective differently (the trace, the
//                                saved pieces, the checkpoint and every verdict are compared
//                                with the run where each rank has its own copy)
//   Dp512To384PassesEveryProperty  a production-size reshard that stops tiling, loses state or
//                                breaks the step counters (its 15 properties)
//   DpScaleLarge.Dp4096To3072PassesEveryProperty  the same at DP 4096 -> 3072; ctest label
//                                "scale", not "cpu" (about 10 s on a 2-core machine), and
//                                skipped where the world cannot hold 4096 ranks
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "tests/testing.h"

using namespace ckptsim;

namespace {

void expect_same_run(const sim::RunResult& shared, const sim::RunResult& copied) {
  EXPECT_EQ(shared.trace, copied.trace);
  EXPECT_EQ(shared.trace_hash, copied.trace_hash);
  ASSERT_EQ(shared.phases.size(), copied.phases.size());
  for (size_t i = 0; i < shared.phases.size(); ++i) {
    const sim::PhaseRecord& a = shared.phases[i];
    const sim::PhaseRecord& b = copied.phases[i];
    EXPECT_EQ(a.saved_pieces, b.saved_pieces) << "phase " << i;
    EXPECT_EQ(a.load_uncovered, b.load_uncovered) << "phase " << i;
    EXPECT_EQ(a.common_differences, b.common_differences) << "phase " << i;
    EXPECT_EQ(a.checkpoint_read_error, b.checkpoint_read_error) << "phase " << i;
    ASSERT_EQ(a.checkpoint_values.size(), b.checkpoint_values.size()) << "phase " << i;
    for (const auto& [key, values] : a.checkpoint_values) {
      const auto& other = b.checkpoint_values.at(key);
      ASSERT_EQ(values.size(), other.size()) << key;
      EXPECT_EQ(std::memcmp(values.data(), other.data(), values.size() * sizeof(float)), 0)
          << "phase " << i << " " << key << ": not bit for bit";
    }
    ASSERT_EQ(a.errors.size(), b.errors.size()) << "phase " << i;
    for (size_t e = 0; e < a.errors.size(); ++e) {
      EXPECT_EQ(a.errors[e].summary(), b.errors[e].summary()) << "phase " << i;
    }
  }
  const auto verdicts_shared = properties::check_all(shared);
  const auto verdicts_copied = properties::check_all(copied);
  ASSERT_EQ(verdicts_shared.size(), verdicts_copied.size());
  for (size_t p = 0; p < verdicts_shared.size(); ++p) {
    EXPECT_EQ(verdicts_shared[p].verdict, verdicts_copied[p].verdict) << verdicts_shared[p].name;
    EXPECT_EQ(verdicts_shared[p].detail, verdicts_copied[p].detail) << verdicts_shared[p].name;
  }
}

class SharingChangesNothing : public ::testing::TestWithParam<std::string> {};

// A run that completes, one that fails at the load (duplicate leaf), one whose save asserts on
// one rank (an error inside the gathering save), HEAD's common state as a sharded object, the
// hybrid optimizer, and a reshard at DP 64.
INSTANTIATE_TEST_SUITE_P(
    Bundled, SharingChangesNothing,
    ::testing::Values("scenarios/bug2-fixed-dp2-to-4.json",
                      "scenarios/bug1-duplicate-leaf-dp2-to-4.json",
                      "scenarios/empty-bucket-dp8.json",
                      "scenarios/scheduler-override-drops-group-bounds-upstream-head.json",
                      "scenarios/spec17-G-raw-raw-offload-half.json", "dp64-to-48"),
    [](const auto& info) {
      std::string name = info.param.substr(info.param.find_last_of('/') + 1);
      for (char& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

TEST_P(SharingChangesNothing, TraceCheckpointAndVerdictsEqualTheCopiedRun) {
  sim::Scenario s;
  if (GetParam() == "dp64-to-48") {
    s = test::scenario_file("scenarios/scale/dp512-to-384.json");
    s.phases[0].dp = 64;
    s.phases[1].dp = 48;
  } else {
    s = test::scenario_file(GetParam());
  }
  sim::RunOptions copied_options;
  copied_options.share_gathered_objects = false;
  expect_same_run(test::run(s), test::run(s, copied_options));
}

void expect_every_property_passes(const std::string& file) {
  const auto s = test::scenario_file(file);
  const auto run = test::run(s);
  ASSERT_EQ(run.phases.size(), 2u);
  for (const auto& phase : run.phases) EXPECT_TRUE(phase.completed) << phase.index;
  for (const auto& phase : run.phases) {
    std::set<int> savers;
    for (const auto& p : phase.saved_pieces) savers.insert(p.rank);
    EXPECT_EQ(static_cast<int64_t>(savers.size()), phase.spec.dp) << "phase " << phase.index;
  }
  for (const auto& r : properties::check_all(run)) {
    EXPECT_TRUE(r.ok()) << r.name << ": " << r.detail;
  }
}

TEST(DpScale, Dp512To384PassesEveryProperty) {
  expect_every_property_passes("scenarios/scale/dp512-to-384.json");
}

TEST(DpScaleLarge, Dp4096To3072PassesEveryProperty) {
  if (sim::Scenario::kDpMax < 4096) {
    GTEST_SKIP() << "the world holds at most " << sim::Scenario::kDpMax << " ranks";
  }
  expect_every_property_passes("scenarios/scale/dp4096-to-3072.json");
}

}  // namespace
