// The property search: generators that only make valid, replayable scenarios; shrinking to
// small cases; and, for every property, a mutation control — a deliberately broken model
// variant (a buggy revision or a fault site) that the SEARCH finds, not just a hand-written
// scenario. Mutations this file catches: a generator emitting an invalid scenario
// (GeneratedScenariosReplay), shrinking that accepts another cause (ShrinkKeepsTheSignature),
// a property that can never fail under search (MutationControls.*).
#include "search/search.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <rapidcheck/gtest.h>
#include <cctype>
#include <map>

#include "tests/testing.h"

using namespace ckptsim;

namespace {

search::SearchResult run_search(search::GeneratorConfig g, const std::vector<std::string>& only,
                                int64_t cases, uint64_t seed = 1) {
  search::SearchOptions o;
  o.generator = std::move(g);
  o.seed = seed;
  o.cases = cases;
  o.keep_going = false;
  o.shrink_runs_max = 400;
  return search::search(o, search::property_judge(only));
}

int64_t dp_max(const sim::Scenario& s) {
  int64_t m = 0;
  for (const auto& p : s.phases) m = std::max(m, p.dp);
  return m;
}

void ensure_profile(const std::string& name, const std::string& json) {
  if (!test::registry().get(name).is_ok()) {
    ASSERT_TRUE(test::registry().add(json, "search_test.cpp").is_ok());
  }
}

}  // namespace

RC_GTEST_PROP(Generators, GeneratedScenariosReplay, ()) {
  search::GeneratorConfig g;
  g.revisions = test::revisions({"upstream-2874", "fix-complete"});
  const sim::Scenario s = *search::gen_scenario(g);
  auto parsed =
      sim::parse_scenario(sim::scenario_to_json(s).dump(), "generated.json", test::registry());
  RC_ASSERT(parsed.is_ok());
  RC_ASSERT(sim::scenario_to_json(parsed.value()) == sim::scenario_to_json(s));
  RC_ASSERT(s.params.size() >= 1u && s.params.size() <= 6u);
  RC_ASSERT(s.phases.size() >= 1u && s.phases.size() <= 4u);
}

// Domain shrinks halve the distance still to go: a size that must stay at least `need` is
// found in O(log n) accepted shrinks (n - 1 alone took one step per element).
TEST(Generators, DomainShrinksConvergeInLogarithmicSteps) {
  sim::Scenario s = test::scenario_file("scenarios/bug2-step-reset-dp2-to-4.json");
  s.params.resize(1);
  s.params[0].numel = 4000;
  s.phases[0].dp = 31;
  s.bucket_size.reset();
  auto holds = [](const sim::Scenario& c) {
    return c.params.size() == 1 && c.params[0].numel >= 65 && c.phases[0].dp >= 3;
  };
  ASSERT_TRUE(holds(s));
  int steps = 0;
  for (bool progressed = true; progressed && steps < 1000;) {
    progressed = false;
    for (const auto& c : search::domain_shrinks(s)) {
      if (holds(c)) {
        s = c;
        ++steps;
        progressed = true;
        break;
      }
    }
  }
  EXPECT_EQ(s.params[0].numel, 65);
  EXPECT_EQ(s.phases[0].dp, 3);
  EXPECT_LE(steps, 40);  // log2(4000) + log2(31) accepted shrinks, and then some
}

RC_GTEST_PROP(Generators, PaddedBucketsDrawSmallDp, ()) {
  search::GeneratorConfig g;
  g.revisions = test::revisions({"upstream-2874"});
  g.stateful = *rc::gen::arbitrary<bool>();
  const sim::Scenario s = *search::gen_for(g);
  for (const auto& p : s.phases) {
    RC_ASSERT(p.dp <= (s.pad_buckets_for_high_nccl_busbw ? search::kPaddedDpMax : g.dp_max));
  }
}

RC_GTEST_PROP(Generators, DomainShrinksAreValidAndSmaller, ()) {
  search::GeneratorConfig g;
  g.revisions = test::revisions({"upstream-2874"});
  const sim::Scenario s = *search::gen_scenario(g);
  for (const auto& c : search::domain_shrinks(s)) {
    RC_ASSERT(sim::parse_scenario(sim::scenario_to_json(c).dump(), "shrunk.json", test::registry())
                  .is_ok());
    RC_ASSERT(c.params.size() <= s.params.size());
    RC_ASSERT(c.phases.size() <= s.phases.size());
    RC_ASSERT(c.total_steps() <= s.total_steps());
  }
}

// fix-complete's one known failure (revisions/fix-complete.json, "Not fixed"): a fully_reshardable
// save keeps the param groups in the common state, and a rank whose optimizer holds no state
// with a step (torch AdamW, or the HDO's CPU part, on a rank that owns no param element there)
// has no step in its groups where rank 0 has one.
static bool known_fix_complete_failure(const sim::Scenario& s,
                                       const properties::PropertyResult& r) {
  (void)s;
  if (r.name != "common_state_rank_independent") return false;
  // "only on rank 0: (...)" (no step there) or "values differ: (...)" (another count: the
  // HDO's step source on that rank is another sub-optimizer's); the load reads rank 0's, and
  // step_matches_uninterrupted, asserted here too, judges what the resume then does.
  for (const char* kind : {"only on rank 0: ", "values differ: "}) {
    if (r.detail.find(std::string(kind) + "('optimizer', 'optimizer', 'param_groups', ") !=
            std::string::npos &&
        r.detail.find(", 'step')") != std::string::npos) {
      return true;
    }
  }
  return false;
}

// Small fix-complete scenarios: every property must hold on them.
static search::GeneratorConfig small_fix_complete(bool stateful) {
  search::GeneratorConfig g;
  g.revisions = test::revisions({"fix-complete"});
  g.params_max = 3;
  g.phases_max = 3;
  g.dp_max = 8;
  g.stateful = stateful;
  return g;
}

RC_GTEST_PROP(PropertiesAsALibrary, FixCompleteKeepsEveryPropertyOnGeneratedScenarios, ()) {
  const search::GeneratorConfig g = small_fix_complete(false);
  const sim::Scenario s = *search::gen_scenario(g);
  const auto run = test::run(s);
  for (const auto& r : properties::check_all(run)) {
    if (known_fix_complete_failure(s, r)) continue;
    if (r.verdict == properties::Verdict::kFail) RC_FAIL(r.name + ": " + r.detail);
  }
}

// Every resumed shard's step counter against the command model: the step each phase resumes at
// (CycleModel::start_steps). Empty when they agree; else the first disagreement.
static std::string counters_against_model(const sim::RunResult& run) {
  const std::vector<int64_t> expected = search::expected_start_steps(run.scenario);
  for (const auto& ph : run.phases) {
    if (ph.index == 0 || !ph.after_load) continue;
    for (const auto& sh : ph.after_load->shards) {
      if (sh.counter && *sh.counter != static_cast<double>(expected[ph.index])) {
        return fmt::format("phase {} param {} rank {}: counter {} after load, model says {}",
                           ph.index, sh.param, sh.rank, *sh.counter, expected[ph.index]);
      }
    }
  }
  return "";
}

RC_GTEST_PROP(Generators, StatefulScenariosReplayAndResumeWhereTheModelSays, ()) {
  const search::GeneratorConfig g = small_fix_complete(true);
  const sim::Scenario s = *search::gen_scenario_stateful(g);
  RC_ASSERT(sim::parse_scenario(sim::scenario_to_json(s).dump(), "generated.json", test::registry())
                .is_ok());
  RC_ASSERT(s.phases.size() >= 1u && s.phases.size() <= 3u);
  const auto run = test::run(s);
  for (const auto& r : properties::check_all(run)) {
    if (known_fix_complete_failure(s, r)) continue;
    if (r.verdict == properties::Verdict::kFail) RC_FAIL(r.name + ": " + r.detail);
  }
  const std::string mismatch = counters_against_model(run);
  RC_ASSERT_FALSE(!mismatch.empty());
}

TEST(Generators, ModelCountersSeeTheStepReset) {
  // The control for the model check above: upstream-2874 resumes the offloaded AdamW at 1.
  const auto bad = test::run(test::scenario_file("scenarios/bug2-step-reset-dp2-to-4.json"));
  EXPECT_NE(counters_against_model(bad), "");
  const auto good = test::run(test::scenario_file("scenarios/bug2-fixed-dp2-to-4.json"));
  EXPECT_EQ(counters_against_model(good), "");
}

TEST(Generators, StatefulCrossRevisionScenariosChangeRevision) {
  search::GeneratorConfig g;
  g.revisions = test::revisions({"miles-main", "upstream-2874"});
  g.require_revision_change = true;
  g.stateful = true;
  const auto gen = search::gen_for(g);
  for (int seed = 0; seed < 50; ++seed) {
    const sim::Scenario s = gen(rc::Random(seed), 50).value();
    bool changed = false;
    for (size_t i = 1; i < s.phases.size(); ++i)
      changed |= s.phases[i].revision != s.phases[i - 1].revision;
    EXPECT_TRUE(changed) << sim::scenario_to_json(s).dump();
  }
}

TEST(Search, StatefulSearchFindsTheStepResetSmall) {
  search::GeneratorConfig g;
  g.revisions = test::revisions({"upstream-2874"});
  g.kinds = {model::OptimizerKind::kHybrid};
  g.stateful = true;
  const auto r = run_search(g, {"step_matches_uninterrupted"}, 300);
  ASSERT_EQ(r.failures.size(), 1u);
  const auto& m = r.failures.front().minimal;
  EXPECT_LE(m.params.size(), 2u);
  EXPECT_EQ(m.phases.size(), 2u);
  EXPECT_EQ(test::verdict(test::run(m), "step_matches_uninterrupted").verdict,
            properties::Verdict::kFail);
}

TEST(Search, FindsTheStepResetSmallAndReproducibly) {
  search::GeneratorConfig g;
  g.revisions = test::revisions({"upstream-2874"});
  g.kinds = {model::OptimizerKind::kHybrid};
  const auto a = run_search(g, {"step_matches_uninterrupted"}, 300);
  ASSERT_EQ(a.failures.size(), 1u);
  const auto& f = a.failures.front();
  EXPECT_EQ(f.finding.property, "step_matches_uninterrupted");
  EXPECT_LE(f.minimal.params.size(), 2u);
  EXPECT_LE(f.minimal.phases.size(), 2u);
  EXPECT_LE(dp_max(f.minimal), 2);
  // The minimal scenario replays to the same failure.
  const auto replay = test::run(f.minimal);
  EXPECT_EQ(test::verdict(replay, "step_matches_uninterrupted").verdict,
            properties::Verdict::kFail);
  // Same seed, same search.
  const auto b = run_search(g, {"step_matches_uninterrupted"}, 300);
  ASSERT_EQ(b.failures.size(), 1u);
  EXPECT_EQ(b.failures.front().case_index, f.case_index);
  EXPECT_EQ(sim::scenario_to_json(b.failures.front().minimal), sim::scenario_to_json(f.minimal));
}

// SearchOptions::shrink_if: a finding it refuses is kept as drawn (no shrink run spent, the
// reason on the failure); the same search finds the same cause at the same case either way.
TEST(Search, AFindingShrinkIfRefusesIsKeptAsDrawn) {
  search::GeneratorConfig g;
  g.revisions = test::revisions({"upstream-2874"});
  g.kinds = {model::OptimizerKind::kHybrid};
  search::SearchOptions o;
  o.generator = g;
  o.cases = 300;
  o.keep_going = false;
  o.shrink_runs_max = 400;
  const auto judge = search::property_judge({"step_matches_uninterrupted"});
  const auto shrunk = search::search(o, judge);
  o.shrink_if = [](const search::Finding& f) { return f.property != "step_matches_uninterrupted"; };
  o.not_shrunk_reason = "not shrunk: the test says so";
  const auto kept = search::search(o, judge);
  ASSERT_EQ(shrunk.failures.size(), 1u);
  ASSERT_EQ(kept.failures.size(), 1u);
  const auto& a = shrunk.failures.front();
  const auto& b = kept.failures.front();
  EXPECT_EQ(a.case_index, b.case_index);
  EXPECT_EQ(a.finding.signature, b.finding.signature);
  EXPECT_GT(a.shrink_runs, 0);
  EXPECT_TRUE(a.not_shrunk.empty());
  EXPECT_EQ(b.shrink_runs, 0);
  EXPECT_EQ(b.not_shrunk, "not shrunk: the test says so");
  EXPECT_EQ(sim::scenario_to_json(b.minimal), sim::scenario_to_json(b.original));
  EXPECT_NE(sim::scenario_to_json(a.minimal), sim::scenario_to_json(b.minimal));
  EXPECT_EQ(kept.judge_runs, kept.cases_run);
  const auto file = search::found_scenario_json(b, 1, "ckptsim check");
  EXPECT_NE(file["description"].get<std::string>().find("not shrunk: the test says so"),
            std::string::npos);
}

TEST(Search, ShrinkKeepsTheSignature) {
  search::GeneratorConfig g;
  g.revisions = test::revisions({"upstream-2874"});
  const auto r = run_search(g, {}, 200);
  ASSERT_FALSE(r.failures.empty());
  for (const auto& f : r.failures) {
    const auto replay = test::run(f.minimal);
    const auto res = test::verdict(replay, f.finding.property);
    EXPECT_EQ(res.signature, f.finding.signature) << f.finding.detail;
  }
}

TEST(Search, FindsTheDuplicateLeafAcrossRevisionsSmall) {
  search::GeneratorConfig g;
  g.revisions = test::revisions({"miles-main", "upstream-2874"});
  g.require_revision_change = true;
  g.kinds = {model::OptimizerKind::kHybrid};
  const auto r = run_search(g, {"no_duplicate_leaves"}, 300);
  ASSERT_EQ(r.failures.size(), 1u);
  const auto& m = r.failures.front().minimal;
  EXPECT_LE(m.params.size(), 2u);
  EXPECT_LE(m.phases.size(), 2u);
  EXPECT_LE(dp_max(m), 2);
  EXPECT_NE(r.failures.front().finding.detail.find("'step')"), std::string::npos)
      << r.failures.front().finding.detail;
}

// Long phases reach the counter bugs a short search cannot: a bf16 counter goes wrong at step
// 257, and the search shrinks it to exactly that, in one phase of one param.
TEST(Search, LongPhasesFindANarrowCounterAndShrinkToStep257) {
  search::GeneratorConfig g;
  g.revisions = test::revisions({"fix-complete"});
  g.faults = {"optimizer.step_counter_bf16"};
  g.long_steps_max = 4096;
  const auto r = run_search(g, {"step_counts_optimizer_steps"}, 300);
  ASSERT_EQ(r.failures.size(), 1u) << "never found in " << r.cases_run << " cases";
  const sim::Scenario& m = r.failures.front().minimal;
  EXPECT_EQ(m.total_steps(), 257);
  EXPECT_EQ(m.phases.size(), 1u);
  EXPECT_EQ(m.params.size(), 1u);
  // Without long phases the same search draws nothing past 96 steps, and finds nothing.
  g.long_steps_max = 0;
  EXPECT_TRUE(run_search(g, {"step_counts_optimizer_steps"}, 300).failures.empty());
}

// ---- Mutation controls: every property fails under search on a broken variant. ---------------

struct Control {
  std::string property;
  std::vector<std::string> revisions;
  std::vector<std::string> faults;
  std::vector<model::OptimizerKind> kinds;
  bool change = false;
  int64_t long_steps_max = 0;  // long phases drawn (the CLI's default), for counter bugs
  // The formats drawn (empty: all). A control whose property fix-complete fails in another
  // format (a known failure, below) draws dp_reshardable alone.
  std::vector<model::ShardingType> sharding_types = {};
  bool storage_faults = false;                       // `check --fault-space storage`
  std::vector<model::StateDType> state_dtypes = {};  // `check --state-dtype`
};

// How ctest and gtest name a control: "<property> on <revisions> [faults]" (gtest would print
// the struct's bytes).
void PrintTo(const Control& c, std::ostream* os) {
  *os << c.property << " on";
  for (const auto& r : c.revisions) *os << " " << r;
  for (const auto& f : c.faults) *os << " +" << f;
}

class MutationControls : public ::testing::TestWithParam<Control> {};

TEST_P(MutationControls, SearchFindsTheBrokenVariant) {
  ensure_profile("test-b9-aliased-steps",
                 R"({"name": "test-b9-aliased-steps", "extends": "fix-complete",
      "description": "fix-complete with B9 put back", "switches": {"pure_torch_load_clones_step": false}})");
  const Control& c = GetParam();
  search::GeneratorConfig g;
  g.revisions = test::revisions(c.revisions);
  g.faults = c.faults;
  g.require_revision_change = c.change;
  if (!c.kinds.empty()) g.kinds = c.kinds;
  g.long_steps_max = c.long_steps_max;
  g.sharding_types = c.sharding_types;
  g.storage_faults = c.storage_faults;
  g.state_dtypes = c.state_dtypes;
  const auto r = run_search(g, {c.property}, 300);
  ASSERT_EQ(r.failures.size(), 1u) << c.property << " never failed in " << r.cases_run << " cases";
  EXPECT_EQ(r.failures.front().finding.property, c.property);
  // The same search on the unbroken variant finds nothing for this property (fault-based controls).
  if (!c.faults.empty()) {
    g.faults.clear();
    EXPECT_TRUE(run_search(g, {c.property}, 100).failures.empty())
        << c.property << " fails without the fault";
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryProperty, MutationControls,
    ::testing::Values(
        Control{"no_duplicate_leaves",
                {"miles-main", "upstream-2874"},
                {},
                {model::OptimizerKind::kHybrid},
                true},
        Control{"resume_completes", {"upstream-pre-2874"}, {}, {model::OptimizerKind::kHybrid}},
        Control{
            "step_matches_uninterrupted", {"upstream-2874"}, {}, {model::OptimizerKind::kHybrid}},
        Control{"trajectory_matches_uninterrupted", {"fix-complete"}, {"load.perturb_exp_avg"}, {}},
        Control{"shards_tile_buckets", {"fix-complete"}, {"dp_reshardable.drop_end_padding"}, {}},
        Control{"common_state_rank_independent",
                {"fix-complete"},
                {"save.rank_dependent_common"},
                {},
                false,
                0,
                {model::ShardingType::kDpReshardable}},
        Control{"layout_invariants", {"fix-complete"}, {"layout.misalign_param_start"}, {}},
        Control{"round_trip_identity", {"fix-complete"}, {"load.perturb_exp_avg"}, {}},
        Control{"reshard_round_trip_bytes", {"fix-complete"}, {"load.perturb_exp_avg"}, {}},
        Control{"step_tensors_not_aliased",
                {"test-b9-aliased-steps"},
                {},
                {model::OptimizerKind::kTorchAdamW}},
        Control{"step_counts_optimizer_steps",
                {"fix-complete"},
                {"optimizer.step_counter_bf16"},
                {},
                false,
                4096},
        Control{"load_writes_every_element", {"fix-complete"}, {"load.skip_piece"}, {}},
        Control{"resume_after_crash_is_complete",
                {"fix-complete"},
                {"load.skip_damaged_pieces"},
                {},
                false,
                0,
                {},
                true},
        Control{"tracker_names_saved_state",
                {"fix-complete"},
                {"save.tracker_before_data"},
                {},
                false,
                0,
                {},
                true},
        Control{"hyperparams_follow_schedule",
                {"fix-complete"},
                {"scheduler.increment_per_iteration"},
                {}},
        // Drawn where a resume draws --no-load-optim (one in eight).
        Control{"first_step_continues_from_loaded_weights",
                {"fix-complete"},
                {"load.reload_skips_model_params"},
                {}},
        // Drawn where a resume draws --finetune (one of the other resumes in sixteen).
        Control{"iteration_follows_resume_mode",
                {"fix-complete"},
                {"load.finetune_keeps_iteration"},
                {}},
        // The async save's fault switches, drawn where --fault-space storage draws async saves.
        Control{"tracker_names_saved_state",
                {"fix-complete"},
                {"save.async_finalize_reads_live_iteration"},
                {},
                false,
                0,
                {},
                true},
        Control{"tracker_names_saved_state",
                {"fix-complete"},
                {"save.async_writer_reuses_cached_handles"},
                {},
                false,
                0,
                {model::ShardingType::kDpReshardable},
                true},
        // Drawn where --state-dtype draws a low-precision moment (issue 26).
        Control{"state_dtypes_survive_resume",
                {"fix-complete"},
                {"load.low_precision_moment_kept_fp32"},
                {model::OptimizerKind::kFusedAdam},
                false,
                0,
                {},
                false,
                {model::StateDType::kBFloat16, model::StateDType::kFloat16}}),
    [](const ::testing::TestParamInfo<Control>& info) {
      // The property, and the fault where one property has several controls.
      std::string name = info.param.property;
      if (!info.param.faults.empty() && info.param.faults.front().starts_with("save.async")) {
        name += "_";
        for (const char c : info.param.faults.front().substr(5)) name += std::isalnum(c) ? c : '_';
      }
      return name;
    });

TEST(MutationControls, CoverEveryProperty) {
  std::vector<std::string> covered = {"no_duplicate_leaves",
                                      "resume_completes",
                                      "step_matches_uninterrupted",
                                      "trajectory_matches_uninterrupted",
                                      "shards_tile_buckets",
                                      "common_state_rank_independent",
                                      "layout_invariants",
                                      "round_trip_identity",
                                      "reshard_round_trip_bytes",
                                      "step_tensors_not_aliased",
                                      "step_counts_optimizer_steps",
                                      "load_writes_every_element",
                                      "hyperparams_follow_schedule",
                                      "resume_after_crash_is_complete",
                                      "tracker_names_saved_state",
                                      "first_step_continues_from_loaded_weights",
                                      "iteration_follows_resume_mode",
                                      "state_dtypes_survive_resume"};
  for (const auto& p : properties::all_properties()) {
    EXPECT_NE(std::find(covered.begin(), covered.end(), p.name), covered.end())
        << p.name << " has no search control";
  }
}

// --state-dtype (issue 26): without it no case is precision-aware and the draws are those of a
// generator without it; with it most fused_adam cases are, with the named dtypes, and every case
// parses back. Mutations caught: drawing before the formats (the draws without it change), the
// draw ignoring the list (no fp16), never drawing precision_aware.
TEST(Generators, StateDtypesAreDrawnOnlyWhereAsked) {
  search::GeneratorConfig g;
  g.revisions = test::revisions({"upstream-head"});
  g.kinds = {model::OptimizerKind::kFusedAdam, model::OptimizerKind::kHybrid};
  search::GeneratorConfig with = g;
  with.state_dtypes = {model::StateDType::kFloat16};
  int precision_aware = 0, fp16 = 0, bf16 = 0;
  for (int seed = 0; seed < 200; ++seed) {
    const sim::Scenario plain = search::gen_for(g)(rc::Random(seed), 20).value();
    EXPECT_FALSE(plain.optimizer.precision_aware);
    EXPECT_EQ(plain.optimizer.exp_avg_dtype, model::StateDType::kFloat32);
    const sim::Scenario s = search::gen_for(with)(rc::Random(seed), 20).value();
    // Drawn last: everything else is what the generator without them drew.
    sim::Scenario same = s;
    same.optimizer = plain.optimizer;
    EXPECT_EQ(sim::scenario_to_json(same), sim::scenario_to_json(plain)) << seed;
    precision_aware += s.optimizer.te_precision_aware();
    for (auto d : {s.optimizer.exp_avg_dtype, s.optimizer.exp_avg_sq_dtype}) {
      fp16 += d == model::StateDType::kFloat16;
      bf16 += d == model::StateDType::kBFloat16;
    }
    const auto again =
        sim::parse_scenario(sim::scenario_to_json(s).dump(), "gen.json", test::registry());
    ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  }
  EXPECT_GT(precision_aware, 40);
  EXPECT_GT(fp16, 40);
  EXPECT_EQ(bf16, 0);
}

// --ep-max (issue 26): without it no param is an expert one; with it about half the cases of two
// params or more are MoE models (first param dense, EP 1, 2 or 4 dividing every phase's DP and
// every expert param's numel), everything before the draw is as without it, and every case
// parses back; the campaign's expert buckets hold a param element on every expert-DP rank.
// Mutations caught: drawing before the state dtypes (the draws without it change), an expert
// first param, EP not dividing a DP, the campaign fitting expert params inside the dense buffer (95
// unfit shards).
TEST(Generators, ExpertsAreDrawnOnlyWhereAsked) {
  for (const bool campaign : {false, true}) {
    search::GeneratorConfig g;
    g.revisions = test::revisions({"upstream-head"});
    g.campaign = campaign;
    if (campaign) g.dp_max = 8;
    search::GeneratorConfig with = g;
    with.ep_max = 4;
    std::map<int64_t, int> eps;
    int moe = 0, unfit = 0;
    for (int seed = 0; seed < 200; ++seed) {
      const sim::Scenario plain = search::gen_for(g)(rc::Random(seed), 20).value();
      for (const auto& p : plain.params) EXPECT_FALSE(p.expert);
      const sim::Scenario s = search::gen_for(with)(rc::Random(seed), 20).value();
      const bool experts =
          std::any_of(s.params.begin(), s.params.end(), [](const auto& p) { return p.expert; });
      if (!experts) {
        EXPECT_EQ(sim::scenario_to_json(s), sim::scenario_to_json(plain)) << seed;
        continue;
      }
      ++moe;
      const int64_t ep = s.phases.front().ep;
      ++eps[ep];
      EXPECT_FALSE(s.params.front().expert) << seed;
      ASSERT_EQ(s.params.size(), plain.params.size());
      EXPECT_EQ(s.optimizer.kind, plain.optimizer.kind) << seed;
      for (const auto& p : s.phases) {
        EXPECT_EQ(p.ep, ep);
        EXPECT_EQ(p.dp % ep, 0) << seed;
      }
      for (const auto& p : s.params) EXPECT_EQ(p.expert ? p.numel % ep : 0, 0) << seed;
      if (campaign && !s.pad_buckets_for_high_nccl_busbw) {
        // Each expert bucket of each phase: every expert-DP rank's shard holds an element.
        for (const model::DType dtype : {model::DType::kBFloat16, model::DType::kFloat32}) {
          std::vector<int64_t> numels;
          for (const auto& p : s.params) {
            if (p.expert && p.dtype == dtype) numels.push_back(p.numel);
          }
          if (numels.empty()) continue;
          for (const auto& phase : s.phases) {
            const int64_t edp = phase.dp / ep;
            const auto layout =
                model::build_buffer_layout(numels, model::LayoutOptions{edp, s.bucket_size, false});
            for (size_t b = 0; b < layout.buckets.size(); ++b) {
              for (int64_t r = 0; r < edp; ++r)
                unfit += model::build_bucket_shard(layout, b, r, edp).param_map.empty() ? 1 : 0;
            }
          }
        }
      }
      const auto again =
          sim::parse_scenario(sim::scenario_to_json(s).dump(), "gen.json", test::registry());
      ASSERT_TRUE(again.is_ok()) << again.status().to_string();
    }
    EXPECT_GT(moe, 40) << campaign;
    EXPECT_GT(eps[1], 5) << campaign;
    EXPECT_GT(eps[2], 5) << campaign;
    EXPECT_GT(eps[4], 3) << campaign;
    EXPECT_EQ(unfit, 0) << campaign;
  }
}

// Hybrid cases draw TE absent one time in five; --transformer-engine narrows it to one value.
TEST(Generators, HybridCasesDrawTePresenceAsConfigured) {
  for (const std::vector<bool>& allowed :
       {std::vector<bool>{true, false}, std::vector<bool>{false}, std::vector<bool>{true}}) {
    search::GeneratorConfig g;
    g.revisions = test::revisions({"upstream-head"});
    g.kinds = {model::OptimizerKind::kHybrid};
    g.te_installed = allowed;
    const auto gen = search::gen_for(g);
    int absent = 0;
    for (int seed = 0; seed < 200; ++seed)
      absent += gen(rc::Random(seed), 20).value().optimizer.te_installed ? 0 : 1;
    if (allowed.size() == 2) {
      EXPECT_GT(absent, 10);
      EXPECT_LT(absent, 90);
    } else {
      EXPECT_EQ(absent, allowed[0] ? 0 : 200);
    }
  }
}
