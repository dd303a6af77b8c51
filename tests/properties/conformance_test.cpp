// Conformance of the model with a real trace (properties/conformance.h), on the model's own
// traces and on mutated copies of them: a changed step counter and a missing exception must come
// out as disagreements, the unchanged trace as agreement. Mutations of the comparison caught:
// counters not compared (AStepCounterChangedInTheRealTraceDisagrees), errors ignored
// (AMissingExceptionDisagrees), runs matched by position instead of id (ATraceOfAnotherScenario
// IsBadInput).
#include "properties/conformance.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "model/faults.h"
#include "properties/trace.h"
#include "report/trace_json.h"
#include "tests/testing.h"

using namespace ckptsim;

namespace {

nlohmann::json model_trace(const std::string& scenario) {
  return report::trace_json(test::run(test::scenario_file(scenario)));
}

// `name` a string_view: GCC 13's -Wdangling-reference takes a reference returned from a call
// with a temporary std::string argument for one into that temporary.
const properties::PropertyAgreement& agreement(const properties::Conformance& c,
                                               std::string_view name) {
  for (const auto& p : c.properties) {
    if (p.property == name) return p;
  }
  throw std::runtime_error("no property " + std::string(name));
}

}  // namespace

TEST(Conformance, ATraceAgreesWithItself) {
  const auto t = model_trace("scenarios/bug2-step-reset-dp2-to-4.json");
  auto c = properties::conform(t, t, "same.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(c.value().verdicts_agree());
  EXPECT_TRUE(c.value().counters_agree());
  EXPECT_TRUE(c.value().divergences.empty()) << c.value().divergences.front().describe();
  EXPECT_GT(c.value().counters_compared, 0);
  EXPECT_EQ(agreement(c.value(), "step_matches_uninterrupted").model.verdict,
            properties::Verdict::kFail);  // bug 2, judged from the trace
}

TEST(Conformance, AStepCounterChangedInTheRealTraceDisagrees) {
  const auto model = model_trace("scenarios/bug2-step-reset-dp2-to-4.json");
  nlohmann::json real = model;
  // The real code keeps the step: every counter after the load reads 5, every later t is 6, 7, 8.
  for (auto& e : real["runs"][2]["events"]) {
    for (auto& p : e["parts"]) {
      if (e["at"] == "after_load") p["step"] = 5.0;
      if (e["at"] == "after_step" || e["at"] == "at_save") {
        p["step"] = e["global_step"].get<double>();
        if (e["at"] == "after_step") p["step_used"] = e["global_step"].get<double>();
      }
    }
  }
  auto c = properties::conform(model, real, "real.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_FALSE(c.value().verdicts_agree());
  EXPECT_FALSE(c.value().counters_agree());
  const auto& step = agreement(c.value(), "step_matches_uninterrupted");
  EXPECT_EQ(step.model.verdict, properties::Verdict::kFail);
  EXPECT_EQ(step.real.verdict, properties::Verdict::kPass) << step.real.detail;
  ASSERT_FALSE(c.value().divergences.empty());
  const auto& d = c.value().divergences.front();
  EXPECT_EQ(d.run, "phase1");
  EXPECT_EQ(d.at, "after_load");
  EXPECT_EQ(d.model, "1");
  EXPECT_EQ(d.real, "5");
}

TEST(Conformance, AMissingExceptionDisagrees) {
  const auto model = model_trace("scenarios/bug1-duplicate-leaf-dp2-to-2.json");
  ASSERT_EQ(model["runs"][2]["status"], "failed");
  nlohmann::json real = model;
  nlohmann::json kept = nlohmann::json::array();
  for (const auto& e : real["runs"][2]["events"]) {
    if (e["at"] != "error") kept.push_back(e);
  }
  real["runs"][2]["events"] = kept;
  real["runs"][2]["status"] = "completed";
  auto c = properties::conform(model, real, "real.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_FALSE(agreement(c.value(), "no_duplicate_leaves").agree());
  EXPECT_FALSE(agreement(c.value(), "resume_completes").agree());
  bool error_divergence = false;
  for (const auto& d : c.value().divergences) error_divergence |= d.field == "first primary error";
  EXPECT_TRUE(error_divergence);
}

TEST(Conformance, ATraceOfAnotherScenarioIsBadInput) {
  const auto a = model_trace("scenarios/bug2-step-reset-dp2-to-4.json");
  const auto b = model_trace("scenarios/bug1-duplicate-leaf-dp2-to-2.json");
  EXPECT_FALSE(properties::conform(a, b, "other.json").is_ok());
  EXPECT_FALSE(properties::conform(a, nlohmann::json::object(), "empty.json").is_ok());
  nlohmann::json fewer = a;
  fewer["runs"].erase(2);
  EXPECT_FALSE(properties::conform(a, fewer, "fewer.json").is_ok());
}

// ---- the strict judge -----------------------------------------------------------------------
//
// Mutations of the judge each test catches (tried, each failed the test named):
//   a part on one side only not counted        -> APartOnOneSideOnlyDisagrees
//   step_aliases / step_used left uncompared   -> EveryCounterOfAPartIsCompared
//   every hash reported, none required         -> ARequiredHashThatDiffersDisagrees
//   taint not inherited through a checkpoint   -> AnUnclaimedKernelsStateStaysUnrequiredAfterALoad
//   kernels not inferred for old traces        -> ATraceWithoutKernelNamesGetsThemFromItsParts

namespace {

nlohmann::json& event(nlohmann::json& trace, const std::string& run, const std::string& at) {
  for (auto& r : trace["runs"]) {
    if (r["id"] != run) continue;
    for (auto& e : r["events"]) {
      if (e["at"] == at) return e;
    }
  }
  throw std::runtime_error("no event " + run + " " + at);
}

properties::Conformance conform_ok(const nlohmann::json& model, const nlohmann::json& real) {
  auto c = properties::conform(model, real, "real.json");
  if (!c.is_ok()) throw std::runtime_error(c.status().to_string());
  return c.value();
}

}  // namespace

TEST(Conformance, APartOnOneSideOnlyDisagrees) {
  const auto model = model_trace("scenarios/bug2-step-reset-dp2-to-4.json");
  ASSERT_TRUE(conform_ok(model, model).agrees());
  nlohmann::json real = model;
  auto& parts = event(real, "phase1", "after_step")["parts"];
  ASSERT_FALSE(parts.empty());
  const std::string label =
      parts[0]["part"].get<std::string>() + " " + parts[0]["param"].get<std::string>();
  parts.erase(parts.begin());
  const auto c = conform_ok(model, real);
  EXPECT_FALSE(c.agrees());
  EXPECT_TRUE(c.verdicts_agree());
  EXPECT_EQ(c.parts.compared - c.parts.equal, 1);
  ASSERT_FALSE(c.divergences.empty());
  EXPECT_EQ(c.divergences.front().run, "phase1");
  EXPECT_EQ(c.divergences.front().real, "absent");
  EXPECT_EQ(c.divergences.front().field.rfind(label, 0), 0u) << c.divergences.front().describe();

  // The other way: the real code has a part the model does not.
  nlohmann::json extra = model;
  auto& more = event(extra, "phase1", "after_step")["parts"];
  nlohmann::json p = more[0];
  p["range"] = {100000, 100001};
  more.push_back(p);
  const auto d = conform_ok(model, extra);
  EXPECT_FALSE(d.agrees());
  EXPECT_EQ(d.parts.compared - d.parts.equal, 1);
}

TEST(Conformance, AnEventOnOneSideOnlyDisagrees) {
  const auto model = model_trace("scenarios/bug2-step-reset-dp2-to-4.json");
  nlohmann::json real = model;
  auto& events = real["runs"][2]["events"];
  nlohmann::json e = events[0];
  e["global_step"] = 99;
  events.push_back(e);
  const auto c = conform_ok(model, real);
  EXPECT_FALSE(c.agrees());
  EXPECT_EQ(c.events.compared - c.events.equal, 1);
}

TEST(Conformance, EveryCounterOfAPartIsCompared) {
  const auto model = model_trace("scenarios/bug2-step-reset-dp2-to-4.json");
  nlohmann::json aliased = model;
  event(aliased, "phase1", "after_load")["parts"][0]["step_aliases"] = 1;
  const auto c = conform_ok(model, aliased);
  EXPECT_FALSE(c.agrees());
  EXPECT_FALSE(c.step_aliases.agree());

  nlohmann::json used = model;
  auto& part = event(used, "phase1", "after_step")["parts"][0];
  part["step_used"] = part["step_used"].get<double>() + 1;
  const auto d = conform_ok(model, used);
  EXPECT_FALSE(d.agrees());
  EXPECT_FALSE(d.counters_agree());
}

TEST(Conformance, ARequiredHashThatDiffersDisagrees) {
  // bug 2 is a hybrid with TE: the CPU part is torch's fused CPU AdamW, a claimed pair.
  const auto model = model_trace("scenarios/bug2-step-reset-dp2-to-4.json");
  nlohmann::json real = model;
  auto& e = event(real, "phase0", "after_step");
  const std::string param = e["parts"][0]["param"];
  ASSERT_EQ(e["parts"][0]["kernel"], "torch_fused_cpu");
  e["hashes"]["exp_avg"][param] = "0123456789abcdef";
  const auto c = conform_ok(model, real);
  EXPECT_TRUE(c.verdicts_agree());
  EXPECT_TRUE(c.counters_agree());
  EXPECT_FALSE(c.agrees());
  EXPECT_EQ(c.hashes_required.compared - c.hashes_required.equal, 1);
  ASSERT_FALSE(c.divergences.empty());
  EXPECT_EQ(c.divergences.front().field, "exp_avg " + param);
}

TEST(Conformance, AnUnclaimedKernelsStateStaysUnrequiredAfterALoad) {
  // The same FusedAdam run, once as if the real run had TE's own FusedAdam (a pair ckptsim does
  // not claim) and once with the stand-in (claimed): after the phase-0 steps the state is
  // reported, not required, in phase 0 and in phase 1, which loads it, only in the first.
  const auto model = model_trace("scenarios/fused-adam-upstream-dp2-to-4.json");
  ASSERT_TRUE(conform_ok(model, model).agrees());
  auto with_kernel = [&](const char* kernel) {
    nlohmann::json real = model;
    for (auto& r : real["runs"]) {
      for (auto& e : r["events"]) {
        if (e["at"] == "error") continue;
        for (auto& p : e["parts"]) p["kernel"] = kernel;
      }
    }
    auto& loaded = event(real, "phase1", "after_load");
    const std::string param = loaded["parts"][0]["param"];
    loaded["hashes"]["master"][param] = "0123456789abcdef";
    return conform_ok(model, real);
  };
  const auto te = with_kernel("te_fused_adam");
  EXPECT_TRUE(te.agrees()) << (te.divergences.empty() ? "" : te.divergences.front().describe());
  EXPECT_EQ(te.hash_divergences.size(), 1u);
  bool reported = false;
  for (const auto& h : te.hash_pairs) {
    if (h.real_kernel == "te_fused_adam") {
      EXPECT_FALSE(h.claimed) << h.reason;
      reported = reported || h.reported.compared > h.reported.equal;
    }
  }
  EXPECT_TRUE(reported);
  EXPECT_FALSE(with_kernel("standin_fused_adam").agrees());
}

TEST(Conformance, ATraceWithoutKernelNamesGetsThemFromItsParts) {
  const auto model = model_trace("scenarios/bug2-step-reset-dp2-to-4.json");
  nlohmann::json real = model;
  real["source"] = "real";
  for (auto& r : real["runs"]) {
    r["fused_adam_standin"] = true;
    r["te"] = "emulated";
    for (auto& e : r["events"]) {
      if (e["at"] == "error") continue;
      for (auto& p : e["parts"]) p.erase("kernel");
    }
  }
  const auto c = conform_ok(model, real);
  EXPECT_TRUE(c.agrees());
  EXPECT_EQ(c.hashes_required.compared, c.hashes_compared);
  // A FusedAdam part is the stand-in where the run injected it (claimed), TE's own where TE is
  // real (not claimed).
  EXPECT_TRUE(properties::claimed_kernel_pair("ckptsim_fused_adam", "standin_fused_adam"));
  EXPECT_FALSE(properties::claimed_kernel_pair("ckptsim_fused_adam", "te_fused_adam"));
  EXPECT_FALSE(properties::claimed_kernel_pair("torch_fused_cpu", "torch_foreach_cuda"));
}

TEST(Conformance, StateOnUninitializedMemoryIsNoVerdict) {
  const auto model0 = model_trace("scenarios/fused-adam-upstream-dp2-to-4.json");
  nlohmann::json model = model0;
  // Mark phase 1's loaded model param w0 as uninitialized in the model's trace, and let the
  // real run's differ there: the trajectory and round trip rest on it, so neither judges it.
  auto& e = event(model, "phase1", "after_load");
  e["uninitialized"] = {{"model_param", {"w0"}}};
  nlohmann::json real = model0;
  for (auto& r : real["runs"]) {
    if (r["id"] != "phase1") continue;
    for (auto& x : r["events"]) {
      if (x["at"] == "after_load") x["hashes"]["model_param"]["w0"] = "0123456789abcdef";
    }
  }
  const auto c = conform_ok(model, real);
  EXPECT_EQ(agreement(c, "round_trip_identity").real.verdict, properties::Verdict::kNotEvaluated)
      << agreement(c, "round_trip_identity").real.detail;
  EXPECT_EQ(agreement(c, "round_trip_identity").model.verdict, properties::Verdict::kNotEvaluated);
  EXPECT_TRUE(c.verdicts_agree());
}

// ---- the param groups' lr and weight decay (hyperparams_follow_schedule's trace check) --------
// Mutations caught: the trace check always passing or ignoring the spec
// (TheStaleWeightDecayOfPR7468IsJudgedFromTheTrace), groups not compared or compared only where
// both sides hold a group (AGroupsWeightDecayChangedInTheRealTraceDisagrees).

namespace {

const properties::TraceVerdict& trace_verdict(const std::vector<properties::TraceVerdict>& vs,
                                              std::string_view name) {
  for (const auto& v : vs) {
    if (v.property == name) return v;
  }
  throw std::runtime_error("no trace verdict " + std::string(name));
}

}  // namespace

TEST(TraceChecks, TheStaleWeightDecayOfPR7468IsJudgedFromTheTrace) {
  const auto run = test::run(test::scenario_file(
      "scenarios/scheduler-stale-weight-decay-after-resume-upstream-2874.json"));
  const auto t = report::trace_json(run);
  const auto on_run = properties::find_property("hyperparams_follow_schedule")->check(run);
  ASSERT_EQ(on_run.verdict, properties::Verdict::kFail);

  const auto vs = properties::judge_trace(t, &run.scenario);
  const auto& v = trace_verdict(vs, "hyperparams_follow_schedule");
  EXPECT_EQ(v.verdict, properties::Verdict::kFail);
  EXPECT_EQ(v.signature, on_run.signature);  // one cause, whichever engine saw it
  EXPECT_EQ(v.run, "phase1");
  EXPECT_NE(v.detail.find("global step 4: the param group with wd_mult 1 and lr_mult 1 used "
                          "weight_decay 0.2 (the schedule says 0.1, from "
                          "--use-checkpoint-opt_param-scheduler)"),
            std::string::npos)
      << v.detail;

  // Without the scenario the schedule in force is unknown: no verdict, not a pass.
  EXPECT_EQ(trace_verdict(properties::judge_trace(t), "hyperparams_follow_schedule").verdict,
            properties::Verdict::kNotEvaluated);
  // A trace without the groups (recorded before they existed) is no verdict either.
  nlohmann::json bare = t;
  for (auto& r : bare["runs"]) {
    for (auto& e : r["events"]) e.erase("groups");
  }
  EXPECT_EQ(
      trace_verdict(properties::judge_trace(bare, &run.scenario), "hyperparams_follow_schedule")
          .verdict,
      properties::Verdict::kNotEvaluated);
}

TEST(TraceChecks, AScheduleKeptThroughAResumePassesFromTheTrace) {
  const auto run = test::run(test::scenario_file("scenarios/bug2-step-reset-dp2-to-4.json"));
  // By value: trace_verdict returns a reference into judge_trace's temporary result.
  const auto v = trace_verdict(properties::judge_trace(report::trace_json(run), &run.scenario),
                               "hyperparams_follow_schedule");
  EXPECT_EQ(v.verdict, properties::Verdict::kPass) << v.detail;
}

TEST(Conformance, AGroupsWeightDecayChangedInTheRealTraceDisagrees) {
  nlohmann::json model = model_trace("scenarios/bug2-step-reset-dp2-to-4.json");
  ASSERT_TRUE(event(model, "phase1", "after_step").contains("groups"));
  const auto same = conform_ok(model, model);
  EXPECT_TRUE(same.agrees());
  EXPECT_GT(same.groups.compared, 0);

  nlohmann::json real = model;
  event(real, "phase1", "after_step")["groups"][0]["weight_decay"] = 0.25;
  const auto changed = conform_ok(model, real);
  EXPECT_FALSE(changed.groups.agree());
  EXPECT_FALSE(changed.agrees());
  ASSERT_FALSE(changed.divergences.empty());
  EXPECT_NE(changed.divergences.front().field.find("lr and weight_decay"), std::string::npos)
      << changed.divergences.front().describe();

  // A group the real rank holds and the model's does not.
  nlohmann::json extra = model;
  auto& groups = event(extra, "phase1", "after_step")["groups"];
  nlohmann::json g = groups[0];
  g["wd_mult"] = 0.0;
  groups.push_back(g);
  EXPECT_FALSE(conform_ok(model, extra).groups.agree());
}

// load_writes_every_element from the trace: miles-main's partial load of a FusedAdam checkpoint
// saved before its first step skips the moments' keys. The model's trace says which ranges each
// rank's load left unwritten (after_load `unwritten`), and the trace check fails with the run
// check's signature; a trace without the probe is no verdict.
TEST(TraceChecks, ALoadThatSkipsAKeyIsJudgedFromTheTrace) {
  const auto run =
      test::run(test::scenario_file("scenarios/fused-adam-save-before-first-step-miles-main.json"));
  auto t = report::trace_json(run);
  const auto on_run = properties::find_property("load_writes_every_element")->check(run);
  ASSERT_EQ(on_run.verdict, properties::Verdict::kFail);
  const auto verdicts = properties::judge_trace(t);
  const auto& v = trace_verdict(verdicts, "load_writes_every_element");
  EXPECT_EQ(v.verdict, properties::Verdict::kFail) << v.detail;
  EXPECT_EQ(v.signature, on_run.signature);
  EXPECT_EQ(v.signature, "load_writes_every_element:missing_key");
  EXPECT_NE(v.detail.find("(missing key)"), std::string::npos) << v.detail;
  const nlohmann::json loaded = event(t, "phase1", "after_load");
  ASSERT_TRUE(loaded.contains("unwritten"));
  EXPECT_FALSE(loaded["unwritten"].empty());

  nlohmann::json bare = t;
  for (auto& r : bare["runs"]) {
    for (auto& e : r["events"]) e.erase("unwritten");
  }
  EXPECT_EQ(trace_verdict(properties::judge_trace(bare), "load_writes_every_element").verdict,
            properties::Verdict::kNotEvaluated);
}

TEST(TraceChecks, ALoadThatWritesEverythingPassesFromTheTrace) {
  const auto run = test::run(test::scenario_file("scenarios/bug2-fixed-dp2-to-4.json"));
  auto t = report::trace_json(run);
  const auto verdicts = properties::judge_trace(t);
  const auto& v = trace_verdict(verdicts, "load_writes_every_element");
  EXPECT_EQ(v.verdict, properties::Verdict::kPass) << v.detail;
  EXPECT_EQ(event(t, "phase1", "after_load")["unwritten"], nlohmann::json::array());
}

// The strict judge compares what each rank's load left unwritten: a range on one side only is a
// divergence; a real trace recorded without the probe is compared on nothing of it (the model's
// ranges are dropped too, so that both verdicts rest on the same facts).
TEST(Conformance, ARangeTheRealLoadLeftUnwrittenDisagrees) {
  nlohmann::json model = model_trace("scenarios/bug2-fixed-dp2-to-4.json");
  const auto same = conform_ok(model, model);
  EXPECT_TRUE(same.agrees());
  EXPECT_GT(same.unwritten.compared, 0);

  nlohmann::json real = model;
  event(real, "phase1", "after_load")["unwritten"] = nlohmann::json::array(
      {{{"key", "optimizer.x.exp_avg"}, {"range", {0, 3}}, {"missing_key", false}}});
  const auto changed = conform_ok(model, real);
  EXPECT_FALSE(changed.unwritten.agree());
  EXPECT_FALSE(changed.agrees());
  EXPECT_FALSE(agreement(changed, "load_writes_every_element").agree());
  ASSERT_FALSE(changed.divergences.empty());
  bool named = false;
  for (const auto& d : changed.divergences)
    named = named || d.field == "unwritten optimizer.x.exp_avg[0:3]";
  EXPECT_TRUE(named) << changed.divergences.front().describe();

  nlohmann::json old = model;
  for (auto& r : old["runs"]) {
    for (auto& e : r["events"]) e.erase("unwritten");
  }
  const auto unprobed = conform_ok(model, old);
  EXPECT_TRUE(unprobed.agrees());
  EXPECT_EQ(unprobed.unwritten.compared, 0);
  EXPECT_EQ(agreement(unprobed, "load_writes_every_element").model.verdict,
            properties::Verdict::kNotEvaluated);
}

// One property, one meaning: on every bundled scenario, each trace check gives the model's own
// trace the verdict its run check gives the run (pass, fail or not_evaluated). A trace check that
// passes what the run check leaves open is how gate --real once called a failure "new": HEAD's
// all-baseline run never reached the steps it judged (hyperparams_follow_schedule, PR #2681's
// gate). (Caught: that trace check without its not-evaluated rule.)
TEST(TraceChecks, EveryTraceCheckAgreesWithItsRunCheckOnEveryBundledScenario) {
  // Where the two legitimately differ, and why.
  const std::set<std::string> coarser = {
      // a trace carries hashes, not values: bitwise only, no tolerance for moved elements
      "trajectory_matches_uninterrupted"};
  int compared = 0;
  for (const auto& entry : std::filesystem::directory_iterator(test::source_path("scenarios"))) {
    if (entry.path().extension() != ".json") continue;
    const auto run =
        test::run(test::scenario_file("scenarios/" + entry.path().filename().string()));
    const auto verdicts = properties::judge_trace(report::trace_json(run), &run.scenario);
    for (const auto& p : properties::all_properties()) {
      if (!p.trace_check || coarser.contains(p.name)) continue;
      const auto on_run = p.check(run);
      const auto& on_trace = trace_verdict(verdicts, p.name);
      // A trace holds no param group's max_lr/min_lr: the round trip of the groups themselves
      // is the run check's alone (HEAD's override block rewrites them: issue #7173).
      if (p.name == "round_trip_identity" && on_run.signature == "round_trip_identity:param_groups")
        continue;
      // A trace hashes each rank's shard: across a reshard no loaded shard is a saved one, so a
      // master or moment the load changed shows in the run check alone (the model params and
      // counters the trace check compares everywhere).
      if (p.name == "round_trip_identity" && on_run.verdict == properties::Verdict::kFail &&
          on_run.phase > 0 &&
          run.phases[static_cast<size_t>(on_run.phase)].spec.dp !=
              run.phases[static_cast<size_t>(on_run.phase) - 1].spec.dp &&
          on_trace.verdict == properties::Verdict::kPass) {
        continue;
      }
      ++compared;
      EXPECT_EQ(properties::verdict_name(on_trace.verdict),
                properties::verdict_name(on_run.verdict))
          << entry.path().filename() << " " << p.name << "\n  run:   " << on_run.detail
          << "\n  trace: " << on_trace.detail;
    }
  }
  EXPECT_GT(compared, 200);
}

// A gate compares the candidate's failure with the all-baseline run only where that run got as
// far: HEAD failing a native fp32 param at init hides its own later load KeyError, which PR
// #2872's candidate (fixing the init) then meets; gate --real called it "new" before this.
// (Caught: stopped_before always "".)
TEST(TraceChecks, ABaselineThatStoppedEarlierDidNotReachTheCandidatesFailure) {
  auto parse = [](const nlohmann::json& j) {
    auto t = properties::trace::parse(j, "t.json");
    if (!t.is_ok()) throw std::runtime_error(t.status().to_string());
    return t.value();
  };
  // The candidate: phase1 fails at its load (the duplicate leaf of bug 1).
  nlohmann::json candidate = model_trace("scenarios/bug1-duplicate-leaf-dp2-to-4.json");
  ASSERT_EQ(event(candidate, "phase1", "error")["stage"], "load");
  EXPECT_EQ(properties::trace::stopped_before(parse(candidate), parse(candidate), "phase1"), "");
  EXPECT_EQ(properties::trace::stopped_before(parse(candidate), parse(candidate), "phase0"), "");
  // A baseline whose phase1 raised at init never reached that load.
  nlohmann::json at_init = candidate;
  for (auto& r : at_init["runs"]) {
    if (r["id"] != "phase1") continue;
    for (auto& e : r["events"]) {
      if (e["at"] == "error") e["stage"] = "init";
    }
  }
  const std::string why =
      properties::trace::stopped_before(parse(at_init), parse(candidate), "phase1");
  EXPECT_NE(why.find("stopped at its init"), std::string::npos) << why;
  // ... nor did one that never ran it.
  nlohmann::json skipped = candidate;
  for (auto& r : skipped["runs"]) {
    if (r["id"] != "phase1") continue;
    r["status"] = "skipped";
    r["skipped_reason"] = "the checkpoint to resume from does not exist";
    r["events"] = nlohmann::json::array();
  }
  EXPECT_NE(properties::trace::stopped_before(parse(skipped), parse(candidate), "phase1"), "");
}

// A rank's model-param hash covers its own TP piece of its stage's params, so a run at another
// TP or PP size than the reference's is not compared state by state: the TP 2 x PP 2 -> TP 1 ->
// TP 4 x PP 2 reshard passes, saying that it left states out. phase0 runs at the reference's
// sizes and is compared: a changed hash there fails.
// (Caught: same_pieces dropped from the trajectory check, which then compares phase1's whole
// params with the reference's TP pieces and fails.)
TEST(TraceChecks, TheTrajectoryComparesOnlyRanksThatHoldTheReferencesPieces) {
  const auto run = test::run(
      test::scenario_file("scenarios/fully-reshardable-reshards-tp-pp-dp-upstream-head.json"));
  nlohmann::json t = report::trace_json(run);
  const auto verdicts = properties::judge_trace(t, &run.scenario);
  const auto& v = trace_verdict(verdicts, "trajectory_matches_uninterrupted");
  EXPECT_EQ(v.verdict, properties::Verdict::kPass) << v.detail;
  EXPECT_NE(v.detail.find("at another TP or PP size than the reference's not compared"),
            std::string::npos)
      << v.detail;
  for (auto& e : t["runs"][1]["events"]) {  // phase0, at the reference's TP 2 x PP 2
    if (e["at"] == "after_step" && e["global_step"] == 2 && e["rank"] == 1)
      e["hashes"]["model_param"]["layers.0.proj"] = "0000000000000000";
  }
  const auto changed_verdicts = properties::judge_trace(t, &run.scenario);
  const auto& changed = trace_verdict(changed_verdicts, "trajectory_matches_uninterrupted");
  EXPECT_EQ(changed.verdict, properties::Verdict::kFail) << changed.detail;
}

// A rank's shard hash covers every part of the param it holds (a row-split piece's shard is one
// part per row), so a saved and a loaded shard are compared only where all of those parts are
// in place on both sides. TP 2 x PP 2 at DP 2 resumed at DP 3: some of rank 0's row parts start
// where they did, the rest moved; the model's load is right and the round trip passes. (Caught:
// comparing a param's hash where one part of it is in place.)
TEST(TraceChecks, ARowSplitShardIsComparedOnlyWhereEveryRowPartIsInPlace) {
  std::ifstream in(
      test::source_path("scenarios/fully-reshardable-reshards-tp-pp-dp-upstream-head.json"));
  nlohmann::json sc = nlohmann::json::parse(in);
  sc["phases"][1]["tp"] = 2;
  sc["phases"][1]["pp"] = 2;
  sc["phases"].erase(2);
  const auto run = test::run(test::scenario_from_json(sc.dump()));
  const nlohmann::json t = report::trace_json(run);
  const auto verdicts = properties::judge_trace(t, &run.scenario);
  const auto& v = trace_verdict(verdicts, "round_trip_identity");
  EXPECT_EQ(v.verdict, properties::Verdict::kPass) << v.detail;
}

// The trace readers' limits (properties/trace.h invariant 1, found by fuzz/trace_fuzzer.cpp):
// what the checks index and count with is refused at parse(), with the file and the field.
// Mutations caught: the bounds of integer_in taken out (a float dp, a rank outside the run's
// world), the lower bound skipped for numbers read unsigned (dp 0, a range that ends before it
// begins: the first version did), the repeated-event and repeated-run refusals taken out.
namespace {

// As read from a file: through its text (a non-negative number parses as unsigned).
std::string parse_error(const nlohmann::json& t) {
  auto p = properties::trace::parse(nlohmann::json::parse(t.dump()), "bug.trace.json");
  return p.is_ok() ? "" : p.status().message();
}

}  // namespace

TEST(TraceParse, ANumberOutsideWhatAFieldHoldsIsAnErrorNamingTheField) {
  const auto model = model_trace("scenarios/bug2-step-reset-dp2-to-4.json");
  ASSERT_EQ(parse_error(model), "");
  nlohmann::json t = model;
  t["runs"][0]["dp"] = 1e300;
  EXPECT_EQ(parse_error(t),
            "bug.trace.json: not a readable trace: run 'reference' dp is not an integer");
  t = model;
  t["runs"][0]["events"][0]["rank"] = 2;  // the reference run is DP 2
  EXPECT_EQ(
      parse_error(t),
      "bug.trace.json: not a readable trace: run 'reference' event 0 rank is 2, outside [0, 1]");
  t = model;
  t["runs"][0]["dp"] = 0;  // read back unsigned: its lower bound still holds
  EXPECT_EQ(parse_error(t),
            "bug.trace.json: not a readable trace: run 'reference' dp is 0, outside [1, 1048576]");
  t = model;
  t["source"] = "elsewhere";  // the files its faults name are its source's
  EXPECT_EQ(parse_error(t),
            "bug.trace.json: not a readable trace: source is 'elsewhere', not 'model' or 'real'");
  for (const nlohmann::json& version :
       {nlohmann::json(4.44444e86), nlohmann::json(1.0), nlohmann::json("1"), nlohmann::json(2)}) {
    t = model;  // found by trace_fuzzer (libFuzzer, UBSan, 2026-12-05): 4.44444e+86 as an int
    t["version"] = version;
    EXPECT_EQ(parse_error(t), "bug.trace.json: not a ckptsim trace of version 1") << version;
  }
  t = model;
  t["runs"][0]["events"][0]["parts"][0]["range"] = {5, 4};
  EXPECT_NE(parse_error(t).find("event 0 part range[1] is 4, outside [5, "), std::string::npos)
      << parse_error(t);
}

TEST(TraceParse, TwoRecordsOfOneEventOrOneRunAreAnError) {
  const auto model = model_trace("scenarios/bug2-step-reset-dp2-to-4.json");
  nlohmann::json t = model;
  auto& events = t["runs"][0]["events"];
  events.push_back(events[0]);
  EXPECT_EQ(parse_error(t),
            "bug.trace.json: not a readable trace: run 'reference' has two init events of rank 0 "
            "at global step 0");
  t = model;
  auto& parts = t["runs"][0]["events"][0]["parts"];
  parts.push_back(parts[0]);  // found by trace_fuzzer (libFuzzer, 2026-12-05)
  EXPECT_NE(parse_error(t).find("run 'reference' has two parts "), std::string::npos)
      << parse_error(t);
  t = model;
  t["runs"].push_back(t["runs"][1]);
  EXPECT_EQ(parse_error(t), "bug.trace.json: not a readable trace: two runs 'phase0'");
}

// A trace's fired storage faults name its files as its own source writes them, whichever side
// of the comparison it is on: the model's trace agrees with itself after a crash. Mutation
// caught: fault keys named by the side ("model" / "real") instead of the trace's source.
TEST(Conformance, AModelTraceWithACrashAgreesWithItself) {
  const auto t = model_trace("scenarios/crash-tracker-before-data-fault.json");
  auto c = properties::conform(t, t, "same.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(c.value().divergences.empty()) << c.value().divergences.front().describe();
  EXPECT_TRUE(c.value().agrees());
}

// ---- state_dtypes (issue 26): the dtypes a precision-aware FusedAdam stores its states in ------
// Mutations caught: state_dtypes not compared, or compared only where both sides record them
// (AStateDtypeOnOneSideOrChangedDisagrees); the parser accepting any name
// (StateDtypesNameKnownStatesAndDtypes); the trace check ignoring the field
// (AMomentKeptFp32IsJudgedFromTheTrace).

TEST(Conformance, AStateDtypeOnOneSideOrChangedDisagrees) {
  const auto model =
      model_trace("scenarios/precision-aware-bf16-moments-dp2-to-4-upstream-head.json");
  const auto same = conform_ok(model, model);
  ASSERT_TRUE(same.agrees());
  EXPECT_GT(same.state_dtypes.compared, 0);
  nlohmann::json real = model;
  auto& parts = event(real, "phase1", "after_step")["parts"];
  ASSERT_TRUE(parts[0].contains("state_dtypes"));
  EXPECT_EQ(parts[0]["state_dtypes"]["exp_avg"], "bf16");
  parts[0]["state_dtypes"]["exp_avg"] = "fp32";
  const auto c = conform_ok(model, real);
  EXPECT_FALSE(c.agrees());
  EXPECT_EQ(c.state_dtypes.compared - c.state_dtypes.equal, 1);
  ASSERT_FALSE(c.divergences.empty());
  EXPECT_NE(c.divergences.front().describe().find("exp_avg fp32"), std::string::npos)
      << c.divergences.front().describe();
  nlohmann::json absent = model;
  event(absent, "phase1", "after_step")["parts"][0].erase("state_dtypes");
  const auto d = conform_ok(model, absent);
  EXPECT_FALSE(d.agrees());
  EXPECT_EQ(d.state_dtypes.compared - d.state_dtypes.equal, 1);
}

TEST(TraceParse, StateDtypesNameKnownStatesAndDtypes) {
  const auto model =
      model_trace("scenarios/precision-aware-bf16-moments-dp2-to-4-upstream-head.json");
  ASSERT_EQ(parse_error(model), "");
  nlohmann::json t = model;
  auto& part = event(t, "phase1", "after_step")["parts"][0];
  part["state_dtypes"]["step"] = "fp32";
  EXPECT_NE(parse_error(t).find("state_dtypes: unknown state \"step\""), std::string::npos)
      << parse_error(t);
  t = model;
  event(t, "phase1", "after_step")["parts"][0]["state_dtypes"]["exp_avg"] = "fp8";
  EXPECT_NE(parse_error(t).find("state_dtypes.exp_avg: must be one of fp32, bf16, fp16, int16, "
                                "got \"fp8\""),
            std::string::npos)
      << parse_error(t);
}

TEST(TraceChecks, AMomentKeptFp32IsJudgedFromTheTrace) {
  auto s =
      test::scenario_file("scenarios/precision-aware-bf16-moments-dp2-to-4-upstream-head.json");
  const auto clean = test::run(s);
  EXPECT_EQ(trace_verdict(properties::judge_trace(report::trace_json(clean), &s),
                          "state_dtypes_survive_resume")
                .verdict,
            properties::Verdict::kPass);
  s.faults.push_back(model::fault::kLowPrecisionMomentKeptFp32);
  const auto run = test::run(s);
  const auto on_run = properties::find_property("state_dtypes_survive_resume")->check(run);
  ASSERT_EQ(on_run.verdict, properties::Verdict::kFail);
  const auto verdicts = properties::judge_trace(report::trace_json(run), &s);
  const auto& v = trace_verdict(verdicts, "state_dtypes_survive_resume");
  EXPECT_EQ(v.verdict, properties::Verdict::kFail);
  EXPECT_EQ(v.signature, on_run.signature);
  EXPECT_NE(v.detail.find("(uninterrupted run: bf16)"), std::string::npos) << v.detail;
}

// The chain part that holds a shard (issue 26): a part of the other chain index, or without
// one, on the real side disagrees. Mutation caught: `chain` not compared.
TEST(Conformance, AChainIndexOnOneSideOrChangedDisagrees) {
  const auto model = model_trace("scenarios/moe-expert-part-dp2-to-4-upstream-head.json");
  ASSERT_TRUE(conform_ok(model, model).agrees());
  nlohmann::json real = model;
  auto& parts = event(real, "phase1", "after_step")["parts"];
  ASSERT_TRUE(parts[0].contains("chain"));
  parts[0]["chain"] = 1 - parts[0]["chain"].get<int>();
  const auto c = conform_ok(model, real);
  EXPECT_FALSE(c.agrees());
  ASSERT_FALSE(c.divergences.empty());
  EXPECT_NE(c.divergences.front().describe().find(" chain"), std::string::npos)
      << c.divergences.front().describe();
  nlohmann::json absent = model;
  event(absent, "phase1", "after_step")["parts"][0].erase("chain");
  EXPECT_FALSE(conform_ok(model, absent).agrees());
}
