// ckptsim command line: binds flags to the options of app/commands.h and calls one command.
// Exit codes are app/commands.h's: 0 ok, 1 a property failed, 2 invalid input, 3 an internal
// error of ckptsim itself.
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "app/commands.h"
#include "properties/properties.h"
#include "sim/allocator.h"

namespace {

using namespace ckptsim;

// CLI::NonNegativeNumber's message prints the largest double; this one says what is wrong.
const CLI::Validator kNotNegative(
    [](std::string& in) -> std::string {
      const size_t first = in.find_first_not_of(" \t");
      return first != std::string::npos && in[first] == '-' ? "must not be negative, got " + in
                                                            : std::string();
    },
    "NONNEGATIVE");

void add_search_flags(CLI::App* cmd, app::SearchCommand& f) {
  cmd->add_option("--seed", f.seed, "Root seed of the search")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--cases", f.cases, "Number of generated cases (per search for gate)")
      ->capture_default_str();
  cmd->add_option("--time-budget", f.time_budget, "Stop after this many seconds (0: no limit)")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_flag("--json", f.json, "Print one JSON object");
  cmd->add_option("--property", f.properties,
                  "Only these properties count (`ckptsim properties` lists them): " +
                      properties::property_names());
  cmd->add_option("--kind", f.kinds, "Only these optimizer kinds: fused_adam, torch_adamw, hybrid");
  cmd->add_option("--transformer-engine", f.transformer_engine,
                  "Hybrid cases only with TE installed, or absent (default: both, 4 to 1)");
  cmd->add_option("--sharding-type", f.sharding_types,
                  "Only these checkpoint formats: dp_reshardable, fully_reshardable (a third "
                  "mem_efficient), dp_zero_gather_scatter (default: all three, 6:3:1)");
  cmd->add_option("--state-dtype", f.state_dtypes,
                  "Draw precision-aware optimizers whose exp_avg / exp_avg_sq may be this dtype "
                  "(bf16, fp16; repeatable): fused_adam cases with --use-precision-aware-optimizer "
                  "and TE's master weights, hybrid cases with the dtypes its HDO ignores");
  cmd->add_option("--fault", f.faults, "Enable a fault site in every case (mutation control)");
  cmd->add_option("--profile", f.profiles, "Extra revision profile JSON files");
  cmd->add_option("--dp-max", f.dp_max, "Largest DP size drawn")->capture_default_str();
  cmd->add_option("--tp-max", f.tp_max,
                  "Largest TP size drawn, of 1, 2, 4 (above 1: params get shapes and TP splits)")
      ->capture_default_str();
  cmd->add_option("--pp-max", f.pp_max,
                  "Largest PP size drawn, of 1, 2, 4 (above 1: params get layers)")
      ->capture_default_str();
  cmd->add_option("--ep-max", f.ep_max,
                  "Largest expert-parallel size drawn, of 1, 2, 4 (above 1: MoE models in one "
                  "case of two, expert params in a ChainedOptimizer's expert part; not with "
                  "--stateful)")
      ->capture_default_str();
  cmd->add_option("--params-max", f.params_max, "Most params drawn")->capture_default_str();
  cmd->add_option("--phases-max", f.phases_max, "Most phases drawn")->capture_default_str();
  cmd->add_option("--steps-max", f.steps_max, "Most steps of a phase that is not long")
      ->capture_default_str();
  cmd->add_option("--long-steps-max", f.long_steps_max,
                  "Most steps of a long phase (about one phase in 70; most near 2^8 and 2^11); 0: "
                  "no long phases")
      ->capture_default_str();
  cmd->add_flag("--quiet", f.quiet, "Print nothing but errors (and --json output)");
  cmd->add_flag("--coverage", f.coverage,
                "Print what the search drew (optimizer kinds, DP sizes and reshards, steps per "
                "phase, revisions, dtypes, param groups, layout), as counts and shares");
  cmd->add_option("--fault-space", f.fault_space,
                  "storage: every case's save meets storage faults (a crash before or after a "
                  "file, a torn or short file, a full disk, at a shard, object, metadata.json or "
                  "the tracker) and the next job resumes from what the tracker names; none: no "
                  "storage faults")
      ->capture_default_str();
  cmd->add_flag("--stateful", f.stateful,
                "Draw the save/resume cycles as a RapidCheck command sequence (Train(k), "
                "SaveResume(dp, revision))");
}

// check and gate: confirm each minimal scenario found on the real Megatron-LM (app/confirm.h).
void add_real_code_flags(CLI::App* cmd, app::RealCodeOptions& f) {
  cmd->add_option("--megatron", f.megatron,
                  "Replay each minimal scenario found on this Megatron-LM checkout (DIR: every "
                  "revision; REVISION=DIR: one profile; repeatable) and report whether the real "
                  "code confirms it. Runs ${CKPTSIM_PYTHON:-python3} -m replay run");
  cmd->add_option("--megatron-root", f.megatron_root,
                  "Like --megatron: the checkouts of replay/fetch-megatron.sh, matched to each "
                  "profile's upstream commit");
  cmd->add_option("--replay-arg", f.replay_args,
                  "One more option for the replay runner, verbatim (repeatable; write it with '=': "
                  "--replay-arg=--emulate-te)")
      ->allow_extra_args(false);
  cmd->add_option("--replay-dir", f.replay_dir,
                  "The folder holding replay/ (default: $CKPTSIM_REPLAY_DIR, else the checkout "
                  "ckptsim was built in)");
}

// check and gate: the real Megatron-LM as the system under test (app/real_engine.h).
void add_real_search_flags(CLI::App* cmd, app::RealSearchOptions& f, bool gate) {
  cmd->add_flag("--real", f.enabled,
                "Replay every scenario drawn, and every shrink candidate, on the real Megatron-LM "
                "(needs a CUDA GPU and torch in the runner's Python) and judge the real traces; "
                "the model runs beside it where a checkout maps to a profile. --jobs counts "
                "runner processes");
  if (gate) {
    cmd->add_option("--baseline-megatron", f.baseline_megatron,
                    "--real: the baseline's checkout (then --baseline may be left out)");
    cmd->add_option("--candidate-megatron", f.candidate_megatron,
                    "--real: the candidate's checkout (then --candidate may be left out)");
    cmd->add_flag("--shrink-pre-existing", f.shrink_pre_existing,
                  "--real: shrink pre-existing findings too (by default they are kept as drawn: "
                  "their cause is the baseline's, and each shrink candidate costs two replays)");
  }
  cmd->add_option("--profile-of", f.profile_of,
                  "--real: SIDE=PROFILE, run the model beside SIDE (baseline, candidate, checkout) "
                  "as PROFILE (default: the profile whose upstream commit is the checkout's)");
  cmd->add_flag("--no-model", f.no_model, "--real: do not run the model beside the real code");
  cmd->add_option("--run-timeout", f.run_timeout,
                  "--real: seconds one run of a scenario may take (a hung worker is killed)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--scenario-timeout", f.scenario_timeout,
                  "--real: seconds one scenario may take before its runner is killed (0: from its "
                  "runs)")
      ->check(kNotNegative);
  cmd->add_option("--prestart-dp", f.prestart_dp,
                  "--real: worker processes each runner starts per checkout before the first "
                  "scenario")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_option("--shrink-runs-max", f.shrink_runs_max,
                  "--real: replays spent shrinking one finding")
      ->check(CLI::Range(int64_t{0}, int64_t{100000}))
      ->capture_default_str();
  cmd->add_option(
      "--work-dir", f.work_dir,
      "--real: where plans, traces and the runners' logs go (default: <out>/real-work)");
  cmd->add_flag("--keep-all", f.keep_all,
                "--real: keep every plan and trace, not the findings' only");
}

// What the command line asked for: one subcommand and its options.
struct Flags {
  app::RunCommand run;
  bool revisions_json = false;
  bool properties_json = false;
  std::vector<std::string> revisions_profiles;
  app::SearchCommand check;
  std::string check_revision = "upstream-2874";
  bool check_first = false;
  app::SearchCommand gate;
  std::string baseline;
  std::string candidate;
  app::ReplayPlanCommand plan;
  app::ConformCommand conform;
  app::ConformCampaignCommand campaign;
  app::SearchCommand generate;
  std::vector<std::string> generate_revisions;
  bool generate_cross = false;
  app::PlotCommand plot;
  app::InspectCommand inspect;
  app::MergeCommand merge;
  app::CoverageCommand coverage;
};

CLI::App* add_inspect(CLI::App& app, app::InspectCommand& f) {
  auto* i = app.add_subcommand(
      "inspect",
      "Diagnose a real Megatron torch_dist checkpoint: what it holds, static checks, and each "
      "revision's resume from it as the model simulates it, classed as resumes correctly, the "
      "resume fails, the revision cannot run this configuration, or cannot simulate; a damaged "
      "checkpoint (a file cut short, empty or missing) names each damaged file and classes each "
      "revision's resume from the model's own save damaged alike (exit 1: a file is damaged, a "
      "check fails or a revision does not resume it correctly)");
  i->add_option("dir", f.dir,
                "Checkpoint directory: the one holding latest_checkpointed_iteration.txt, or the "
                "iteration directory itself (the one holding .metadata)")
      ->required();
  i->add_option("--revision", f.revisions,
                "Revisions to resume it with (default: every bundled profile)");
  i->add_option("--dp", f.dp, "DP size of the simulated resume (default: the DP size at save)")
      ->check(CLI::PositiveNumber);
  i->add_option("--tp", f.tp,
                "TP size of the simulated resume (default: the TP size at save, from its args)")
      ->check(CLI::PositiveNumber);
  i->add_option("--pp", f.pp,
                "PP size of the simulated resume (default: the PP size at save, from its args)")
      ->check(CLI::PositiveNumber);
  i->add_option("--scenario", f.scenario,
                "The scenario that saved it (params, optimizer, bucket size), instead of inferring "
                "them from the checkpoint (needed for a fully_reshardable checkpoint: its TP "
                "splits and layers are not inferred; and for a damaged one whose lost files or "
                "values are what says them)");
  i->add_flag("--json", f.json, "Print one JSON object");
  i->add_option("--profile", f.profiles, "Extra revision profile JSON files");
  return i;
}

CLI::App* add_plot(CLI::App& app, app::PlotCommand& f) {
  auto* p = app.add_subcommand(
      "plot",
      "Draw a PNG: every Adam part's step counter and the largest divergence from the "
      "uninterrupted run against the global step (model, uninterrupted, real); needs gnuplot");
  p->add_option("scenario", f.scenario, "Scenario JSON file")->required();
  p->add_option("-o,--out", f.out, "The PNG to write")->required();
  p->add_option("--real", f.real_trace, "A real trace of the scenario (python -m replay run)");
  p->add_flag("--keep-data", f.keep_data,
              "Also write the data file and the gnuplot script next to the PNG (.dat, .gp)");
  p->add_option("--gnuplot", f.gnuplot, "The gnuplot program")->capture_default_str();
  p->add_option("--profile", f.profiles, "Extra revision profile JSON files");
  return p;
}

CLI::App* add_generate(CLI::App& app, Flags& f) {
  f.generate.out_dir = "ckptsim-generated";
  auto* g = app.add_subcommand(
      "generate", "Write the scenarios a search draws as files (for a campaign on the real code)");
  g->add_option("--revision", f.generate_revisions, "Revisions the phases draw from")->required();
  g->add_flag("--cross", f.generate_cross,
              "With several revisions: at least one phase changes revision");
  g->add_option("--out", f.generate.out_dir, "Directory for the scenario files")
      ->capture_default_str();
  g->add_option("--size", f.generate.sizes,
                "RapidCheck size of each case: spread (evenly over 0-100 at any --cases), ramp "
                "(check's: case k at k % 101, small first) or N in [0, 100] for every case")
      ->capture_default_str();
  g->add_flag("--campaign", f.generate.campaign,
              "Draw from the campaign profile (for a replay on the real code): DP 1-8 with "
              "non-dividing reshards, DP 1 throughout rarely, new --lr/--min-lr/weight decay on "
              "resumes under either scheduler flag, hybrid offload between 0 and 1 with fp32 "
              "params, one phase near 2^8 steps in about one scenario of 14; --dp-max 8 and "
              "--params-max 3 unless given");
  add_search_flags(g, f.generate);
  g->parse_complete_callback([g, &f] {
    if (f.generate.campaign) {
      app::use_campaign_limits(f.generate, g->count("--dp-max") > 0, g->count("--params-max") > 0);
    }
  });
  return g;
}

CLI::App* add_coverage(CLI::App& app, app::CoverageCommand& f) {
  auto* c = app.add_subcommand(
      "coverage",
      "Print what scenario files hold, counted as check --coverage counts a search's draws");
  c->add_option("scenarios", f.files, "Scenario JSON files")->required();
  c->add_flag("--json", f.json, "Print the counts as one JSON object");
  c->add_option("--profile", f.profiles, "Extra revision profile JSON files");
  return c;
}

CLI::App* add_conform_campaign(CLI::App& app, app::ConformCampaignCommand& f) {
  auto* c = app.add_subcommand("conform-campaign",
                               "Conform every real trace with the model's run of its scenario; "
                               "write reports/conformance.md");
  c->add_option("traces", f.traces, "Trace files, or directories of *.trace.json")->required();
  c->add_option("--scenarios", f.scenario_dirs, "Where to find each trace's scenario by name")
      ->capture_default_str();
  c->add_option("--report", f.report, "Write the Markdown report here");
  c->add_option("--notes", f.notes, "Append this hand-written Markdown to the report");
  c->add_option("--plots", f.plots,
                "Draw a PNG of every disagreement into this directory and link it from the report");
  c->add_option("--real-checkpoints", f.real_checkpoints,
                "Directories of real checkpoints with a fixtures.json: inspect each, compare the "
                "model's resume from it with the real code's, and add the table to the report");
  c->add_option("--profile", f.profiles, "Extra revision profile JSON files");
  return c;
}

CLI::App* add_replay_plan(CLI::App& app, app::ReplayPlanCommand& f) {
  auto* plan = app.add_subcommand(
      "replay-plan",
      "Write the plan the replay runner replays on real Megatron-LM (python -m replay run)");
  plan->add_option("scenarios", f.files, "Scenario JSON files")->required();
  plan->add_option("-o,--out", f.out, "Plan file (a directory with several scenarios)")->required();
  plan->add_option("--profile", f.profiles, "Extra revision profile JSON files");
  return plan;
}

CLI::App* add_conform(CLI::App& app, app::ConformCommand& f) {
  auto* conform = app.add_subcommand(
      "conform",
      "Compare the model's run of a scenario with a real trace of it (exit 1: they "
      "disagree)");
  conform->add_option("scenario", f.scenario, "Scenario JSON file")->required();
  conform->add_option("real_trace", f.real_trace, "Trace written by python -m replay run")
      ->required();
  conform->add_option("--model-trace", f.model_trace, "Also write the model's trace here");
  conform->add_option("--profile", f.profiles, "Extra revision profile JSON files");
  conform->add_flag("--json", f.json, "Print one JSON object");
  conform->add_option("--divergences", f.divergences_shown, "How many divergences to print")
      ->capture_default_str();
  return conform;
}

CLI::App* add_run(CLI::App& app, app::RunCommand& f) {
  auto* run = app.add_subcommand("run", "Run scenario files and check every property");
  run->add_option("scenarios", f.files, "Scenario JSON files")->required();
  run->add_flag("--json", f.json, "Print one JSON object with ok and properties");
  run->add_flag("--expect", f.expect,
                "Exit 0 when every scenario gives the verdicts of its \"expect\" block (bundled "
                "reproductions)");
  run->add_option("--report", f.report, "Write a Markdown report to this file");
  run->add_option("--checkpoint-dir", f.checkpoint_root,
                  "Directory for checkpoints, one folder per scenario")
      ->capture_default_str();
  run->add_flag("--memory", f.memory, "Keep checkpoints in memory instead of on disk");
  run->add_option("--checkpoint-format", f.checkpoint_format,
                  "Format of the checkpoints on disk: ckptsim (the model's own, what it loads) or "
                  "torch_dist (Megatron's, phase_<i>/{latest_checkpointed_iteration.txt,iter_*/}"
                  ", for real Megatron to load; the simulator's own stay in memory)")
      ->check(CLI::IsMember({"ckptsim", "torch_dist"}))
      ->capture_default_str();
  run->add_option("--torch-dist-class", f.torch_dist_classes,
                  "With --checkpoint-format torch_dist: write class From as To (From=To), e.g. "
                  "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam="
                  "replay.emulation.StandinFusedAdam for a replay with --fused-adam-standin");
  run->add_option("--trace", f.trace, "Write the trace (one line per event) to this file");
  run->add_option("--profile", f.profiles, "Extra revision profile JSON files");
  run->add_flag("--quiet", f.quiet, "Print nothing but errors (and --json output)");
  run->add_option(
      "--device", f.device,
      "Where 'cuda' state lives: auto (the GPU when one can hold it), cpu (simulated), cuda");
  run->add_option("--trace-json", f.trace_json,
                  "Write the model's trace in the replay runner's format (replay/PLAN_AND_TRACE.md)"
                  " to this file (a directory with several scenarios)");
  run->add_flag("--trace-values", f.trace_values,
                "With --trace-json: every hashed array also as base64 float32");
  run->add_option("--plots", f.plots,
                  "Draw a PNG (ckptsim plot) of every scenario that fails a property into this "
                  "directory and link it from the report");
  return run;
}

CLI::App* add_revisions(CLI::App& app, Flags& f) {
  auto* revisions =
      app.add_subcommand("revisions", "List the revision profiles and their switches");
  revisions->add_flag("--json", f.revisions_json, "Print JSON");
  revisions->add_option("--profile", f.revisions_profiles, "Extra revision profile JSON files");
  return revisions;
}

CLI::App* add_properties(CLI::App& app, Flags& f) {
  auto* properties = app.add_subcommand(
      "properties", "List the properties: what must hold, what judges each, and its canary");
  properties->add_flag("--json", f.properties_json, "Print JSON");
  return properties;
}

CLI::App* add_check(CLI::App& app, Flags& f) {
  auto* check = app.add_subcommand(
      "check", "Search generated scenarios for a property failure and shrink it");
  check->add_option("--revision", f.check_revision, "Revision profile every phase runs")
      ->capture_default_str();
  check->add_option("--junit", f.check.junit, "Write JUnit XML to this file");
  check->add_option("--out", f.check.out_dir, "Directory for the minimal scenarios found")
      ->capture_default_str();
  check->add_flag(
      "--first", f.check_first,
      "Stop at the first failure (default: keep searching, one minimal case per cause)");
  add_search_flags(check, f.check);
  check
      ->add_option("--jobs", f.check.jobs,
                   "Threads judging cases (default 0: every core). The same failures, case "
                   "indices, minimal scenarios and coverage for any number")
      ->check(CLI::Range(0, app::kJobsMax))
      ->capture_default_str();
  check
      ->add_option("--schedule", f.check.schedule,
                   "Which cases the --jobs workers start first: dear-first (cases whose drawn "
                   "shape predicts a long run start early on at most half of the workers; the "
                   "others keep the case order) or in-order. The same findings either way")
      ->check(CLI::IsMember({"dear-first", "in-order"}))
      ->capture_default_str();
  check->add_option("--case-times", f.check.case_times,
                    "Write a CSV of every case's predicted cost and judge seconds to this file");
  check->add_option("--shard", f.check.shard,
                    "Run shard K of N (K/N, 1-based: case k belongs to shard (k mod N) + 1); "
                    "without it: $CKPTSIM_SHARD, else $SLURM_PROCID/$SLURM_NTASKS, else "
                    "$RANK/$WORLD_SIZE (torchrun), else the whole search. `ckptsim merge` "
                    "combines the shards' --out directories");
  add_real_code_flags(check, f.check.real_code);
  add_real_search_flags(check, f.check.real, false);
  return check;
}

CLI::App* add_merge(CLI::App& app, app::MergeCommand& f) {
  auto* merge = app.add_subcommand(
      "merge",
      "Combine the --out directories of every shard of one check (--shard K/N): one minimal "
      "scenario per cause, the one of the smallest case index, as the unsharded check finds it");
  merge->add_option("dirs", f.dirs, "The shards' --out directories")->required();
  merge->add_option("--out", f.out_dir, "Directory for the merged minimal scenarios and summary")
      ->capture_default_str();
  merge->add_option("--junit", f.junit, "Write the merged JUnit XML to this file");
  merge->add_flag("--json", f.json, "Print one JSON object, as check --json does");
  merge->add_flag("--quiet", f.quiet, "Print nothing but errors (and --json output)");
  merge->add_flag("--coverage", f.coverage, "Print what the shards drew, together");
  merge->add_option("--profile", f.profiles, "Extra revision profile JSON files");
  return merge;
}

CLI::App* add_gate(CLI::App& app, Flags& f) {
  f.gate.cases = 300;
  f.gate.out_dir.clear();
  auto* gate = app.add_subcommand(
      "gate", "Judge a candidate revision against a baseline (new failures exit 1)");
  gate->add_option("--baseline", f.baseline,
                   "The revision in use today (with --real and --baseline-megatron: optional)");
  gate->add_option("--candidate", f.candidate,
                   "The revision under review (with --real and --candidate-megatron: optional)");
  gate->add_option("--out", f.gate.out_dir,
                   "Directory for the report, JUnit XML and minimal scenarios")
      ->required();
  add_search_flags(gate, f.gate);
  gate->add_option("--jobs", f.gate.jobs,
                   "Threads in all (default 0: every core): from 2 on, the two searches run at "
                   "once, each with half of them; 1: one after the other. The findings are the "
                   "same either way")
      ->check(CLI::Range(0, app::kJobsMax))
      ->capture_default_str();
  add_real_code_flags(gate, f.gate.real_code);
  add_real_search_flags(gate, f.gate.real, true);
  return gate;
}

}  // namespace

int main(int argc, char** argv) {
  // Tensor ops are tiny: one intra-op thread keeps runs reproducible and fast.
  at::set_num_threads(1);
  sim::keep_freed_memory();
  CLI::App app{
      "ckptsim: simulate Megatron-LM distributed-optimizer checkpoint save/resume and check it"};
  app.require_subcommand(1);
  Flags f;
  CLI::App* run = add_run(app, f.run);
  CLI::App* revisions = add_revisions(app, f);
  CLI::App* properties = add_properties(app, f);
  CLI::App* check = add_check(app, f);
  CLI::App* gate = add_gate(app, f);
  CLI::App* plan = add_replay_plan(app, f.plan);
  CLI::App* conform = add_conform(app, f.conform);
  CLI::App* campaign = add_conform_campaign(app, f.campaign);
  CLI::App* generate = add_generate(app, f);
  CLI::App* plot = add_plot(app, f.plot);
  CLI::App* inspect = add_inspect(app, f.inspect);
  CLI::App* merge = add_merge(app, f.merge);
  CLI::App* coverage = add_coverage(app, f.coverage);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? app::kExitOk : app::kExitInvalid;
  }
  try {
    if (*run) return app::run_command(f.run, std::cout, std::cerr);
    if (*revisions)
      return app::revisions_command(f.revisions_json, f.revisions_profiles, std::cout, std::cerr);
    if (*properties) return app::properties_command(f.properties_json, std::cout);
    if (*check) {
      f.check.keep_going = !f.check_first;
      return app::check_command(f.check, f.check_revision, std::cout, std::cerr);
    }
    if (*gate) return app::gate_command(f.gate, f.baseline, f.candidate, std::cout, std::cerr);
    if (*plan) return app::replay_plan_command(f.plan, std::cout, std::cerr);
    if (*conform) return app::conform_command(f.conform, std::cout, std::cerr);
    if (*campaign) return app::conform_campaign_command(f.campaign, std::cout, std::cerr);
    if (*plot) return app::plot_command(f.plot, std::cout, std::cerr);
    if (*inspect) return app::inspect_command(f.inspect, std::cout, std::cerr);
    if (*merge) return app::merge_command(f.merge, std::cout, std::cerr);
    if (*coverage) return app::coverage_command(f.coverage, std::cout, std::cerr);
    if (*generate) {
      return app::generate_command(f.generate, f.generate_revisions, f.generate_cross, std::cout,
                                   std::cerr);
    }
  } catch (const std::exception& e) {
    std::cerr << "ckptsim: internal error (a bug in ckptsim, not a verdict on the scenario): "
              << e.what() << "\n";
    return app::kExitInternal;
  }
  return app::kExitInvalid;
}
