// Divergence N1 of the fidelity audit (2026-12-02): upstream HEAD d98e8a64dd identifies a param
// group at load by param_group_identifier_keys = (end_wd, max_lr, min_lr, optimizer, start_wd,
// wd_mult, lr_mult, is_expert_parallel, is_decoupled_lr) (optimizer.py:136-149; a missing key
// counts as None, distrib_optimizer.py:941-953), and _get_param_groups writes --lr and --min-lr
// into every group (__init__.py:399-400). So a resume with another --lr or --min-lr raises
// KeyError at distrib_optimizer.py:970 under any scheduler flag (the optimizer loads before the
// scheduler), and HEAD's own --override-opt_param-scheduler block, which writes --lr into every
// group, makes the next restart of a job with a group of its own bounds fail the same way.
// The broken variant is the profile without the switch group_identity_by_override_keys (the
// model before this test: POST's four keys at every revision), which loads all of these.
#include <gtest/gtest.h>

#include "tests/testing.h"

using namespace ckptsim;

namespace {

// upstream-head with POST's identifier keys: the model before N1 was modeled.
const std::string& post_keys_profile() {
  static const std::string name = [] {
    const std::string n = "test-n1-head-post-identifier-keys";
    auto& reg = test::registry();
    if (!reg.get(n).is_ok()) {
      const auto s = reg.add(R"({"name": ")" + n + R"(", "extends": "upstream-head",
                             "switches": {"group_identity_by_override_keys": false}})",
                             "n1_head_group_identity_test.cpp");
      if (!s.is_ok()) throw std::runtime_error(s.to_string());
    }
    return n;
  }();
  return name;
}

// One bf16 param (and one with lr_mult 0.5 when `own_bounds`), fused_adam, DP 2 -> 2: phase 0
// trains 2 steps at lr 0.01, each later phase 1 step, started with `phases` (the JSON text of
// each later phase's extra fields).
std::string scenario_json(const std::string& revision, const std::vector<std::string>& phases,
                          bool own_bounds = false) {
  std::string json = R"({"seed": 3, "name": "n1", "params": [{"name": "w0", "numel": 300,
      "dtype": "bf16"})";
  if (own_bounds) json += R"(, {"name": "head", "numel": 200, "dtype": "bf16", "lr_mult": 0.5})";
  json += R"(], "optimizer": {"kind": "fused_adam", "lr": 0.01, "betas": [0.9, 0.95],
      "eps": 1e-8, "weight_decay": 0.1}, "phases": [{"dp": 2, "revision": ")" +
          revision + R"(", "steps": 2})";
  for (const auto& extra : phases) {
    json += R"(, {"dp": 2, "revision": ")" + revision + R"(", "steps": 1)" + extra + "}";
  }
  return json + "]}";
}

const sim::RankError* load_error(const sim::RunResult& run, size_t phase) {
  for (const auto& e : run.phases.at(phase).errors) {
    if (!e.secondary) return &e;
  }
  return nullptr;
}

}  // namespace

TEST(N1HeadGroupIdentity, ANewLrFailsTheLoadWithUpstreamsKeyErrorUnderEverySchedulerFlag) {
  for (const char* flag : {"override", "use_checkpoint", "neither"}) {
    const std::string phase =
        std::string(R"(, "schedule": {"lr": 0.005}, "opt_param_scheduler": ")") + flag + "\"";
    const auto run = test::run(test::scenario_from_json(scenario_json("upstream-head", {phase})));
    const sim::RankError* e = load_error(run, 1);
    ASSERT_NE(e, nullptr) << flag << ": the HEAD load completed";
    EXPECT_EQ(e->stage, "load") << flag;
    EXPECT_EQ(e->py_type, "KeyError") << flag;
    // str(KeyError(tuple)): the live group's identity, in param_group_identifier_keys order.
    EXPECT_EQ(e->message, "(None, 0.005, 0.0, None, None, 1.0, 1.0, False, False)") << flag;
    EXPECT_EQ(e->site, "distrib_optimizer.py load_state_dict()") << flag;

    // POST's keys load the optimizer; under neither flag the scheduler's own check then
    // refuses the new lr (its AssertionError, which the real HEAD never reaches).
    const auto broken =
        test::run(test::scenario_from_json(scenario_json(post_keys_profile(), {phase})));
    const sim::RankError* b = load_error(broken, 1);
    if (std::string(flag) == "neither") {
      ASSERT_NE(b, nullptr);
      EXPECT_EQ(b->py_type, "AssertionError") << b->summary();
      EXPECT_EQ(b->site, "optimizer_param_scheduler.py _check_and_set()") << b->summary();
    } else {
      EXPECT_TRUE(broken.phases.at(1).completed) << flag << ": " << (b ? b->summary() : "");
    }
  }
}

TEST(N1HeadGroupIdentity, ANewMinLrFailsTheLoadToo) {
  const auto run = test::run(test::scenario_from_json(scenario_json(
      "upstream-head", {R"(, "schedule": {"min_lr": 0.001}, "opt_param_scheduler": "override")"})));
  const sim::RankError* e = load_error(run, 1);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->py_type, "KeyError");
  EXPECT_EQ(e->message, "(None, 0.01, 0.001, None, None, 1.0, 1.0, False, False)");
  const auto broken = test::run(test::scenario_from_json(
      scenario_json(post_keys_profile(),
                    {R"(, "schedule": {"min_lr": 0.001}, "opt_param_scheduler": "override")"})));
  EXPECT_TRUE(broken.phases.at(1).completed);
}

TEST(N1HeadGroupIdentity, UnchangedArgumentsLoad) {
  const auto run = test::run(test::scenario_from_json(
      scenario_json("upstream-head", {"", R"(, "opt_param_scheduler": "use_checkpoint")"}, true)));
  EXPECT_TRUE(run.phases.at(1).completed);
  EXPECT_TRUE(run.phases.at(2).completed);
}

// The second effect: the override resume completes (no argument changed), but its block gives
// head --lr as max_lr (0.01, not 0.005), which the next checkpoint saves; the restart after it,
// with the same arguments, builds head's group with 0.005 and finds no saved group of it.
TEST(N1HeadGroupIdentity, AnOverrideResumeSavesGroupBoundsTheNextRestartCannotLoad) {
  for (const char* flag : {"neither", "override"}) {
    const std::string third = std::string(R"(, "opt_param_scheduler": ")") + flag + "\"";
    const auto run = test::run(test::scenario_from_json(
        scenario_json("upstream-head", {R"(, "opt_param_scheduler": "override")", third}, true)));
    EXPECT_TRUE(run.phases.at(1).completed) << flag;
    const sim::RankError* e = load_error(run, 2);
    ASSERT_NE(e, nullptr) << flag << ": the restart after the override resume loaded";
    EXPECT_EQ(e->py_type, "KeyError") << flag;
    EXPECT_EQ(e->message, "(None, 0.005, 0.0, None, None, 1.0, 0.5, False, False)") << flag;
    EXPECT_EQ(e->site, "distrib_optimizer.py load_state_dict()") << flag;

    const auto broken = test::run(test::scenario_from_json(scenario_json(
        post_keys_profile(), {R"(, "opt_param_scheduler": "override")", third}, true)));
    EXPECT_TRUE(broken.phases.at(2).completed) << flag;
  }
}

TEST(N1HeadGroupIdentity, TheBundledScenarioFailsTheLoad) {
  const auto run = test::run(test::scenario_file("scenarios/n1-head-lr-change-keyerror.json"));
  const auto r = test::verdict(run, "resume_completes");
  EXPECT_EQ(r.verdict, properties::Verdict::kFail);
  EXPECT_NE(r.detail.find("KeyError: (None, 0.005, 0.0, None, None, 1.0, 1.0, False, False) "
                          "[distrib_optimizer.py load_state_dict()]"),
            std::string::npos)
      << r.detail;
}
