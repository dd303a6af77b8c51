// ckptsim command line: binds flags to the options of app/commands.h and calls one command.
// Exit codes are app/commands.h's: 0 ok, 1 a property failed, 2 invalid input, 3 an internal
// error of ckptsim itself.
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "app/commands.h"

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
  cmd->add_option("--property", f.properties, "Only these properties count");
  cmd->add_option("--kind", f.kinds, "Only these optimizer kinds: fused_adam, torch_adamw, hybrid");
  cmd->add_option("--fault", f.faults, "Enable a fault site in every case (mutation control)");
  cmd->add_option("--profile", f.profiles, "Extra revision profile JSON files");
  cmd->add_option("--dp-max", f.dp_max, "Largest DP size drawn")->capture_default_str();
  cmd->add_option("--params-max", f.params_max, "Most params drawn")->capture_default_str();
  cmd->add_option("--phases-max", f.phases_max, "Most phases drawn")->capture_default_str();
  cmd->add_flag("--quiet", f.quiet, "Print nothing but errors (and --json output)");
  cmd->add_flag("--stateful", f.stateful,
                "Draw the save/resume cycles as a RapidCheck command sequence (Train(k), "
                "SaveResume(dp, revision))");
}

}  // namespace

int main(int argc, char** argv) {
  // Ranks are threads; tensor ops are tiny. One intra-op thread keeps runs reproducible and fast.
  at::set_num_threads(1);
  CLI::App app{
      "ckptsim: simulate Megatron-LM distributed-optimizer checkpoint save/resume and check it"};
  app.require_subcommand(1);
  app::RunCommand run_flags;
  auto* run = app.add_subcommand("run", "Run scenario files and check every property");
  run->add_option("scenarios", run_flags.files, "Scenario JSON files")->required();
  run->add_flag("--json", run_flags.json, "Print one JSON object with ok and properties");
  run->add_flag("--expect", run_flags.expect,
                "Exit 0 when every scenario gives the verdicts of its \"expect\" block (bundled "
                "reproductions)");
  run->add_option("--report", run_flags.report, "Write a Markdown report to this file");
  run->add_option(
      "--checkpoint-dir", run_flags.checkpoint_root,
      "Directory for checkpoints, one folder per scenario (default: ckptsim-checkpoints)");
  run->add_flag("--memory", run_flags.memory, "Keep checkpoints in memory instead of on disk");
  run->add_option("--trace", run_flags.trace, "Write the trace (one line per event) to this file");
  run->add_option("--profile", run_flags.profiles, "Extra revision profile JSON files");
  run->add_flag("--quiet", run_flags.quiet, "Print nothing but errors (and --json output)");
  run->add_option(
      "--device", run_flags.device,
      "Where 'cuda' state lives: auto (the GPU when one can hold it), cpu (simulated), cuda");

  bool rev_json = false;
  std::vector<std::string> rev_profiles;
  auto* revisions =
      app.add_subcommand("revisions", "List the revision profiles and their switches");
  revisions->add_flag("--json", rev_json, "Print JSON");
  revisions->add_option("--profile", rev_profiles, "Extra revision profile JSON files");

  app::SearchCommand check_flags;
  std::string check_revision = "upstream-2874";
  auto* check = app.add_subcommand(
      "check", "Search generated scenarios for a property failure and shrink it");
  check->add_option("--revision", check_revision,
                    "Revision profile every phase runs (default upstream-2874)");
  check->add_option("--junit", check_flags.junit, "Write JUnit XML to this file");
  check->add_option("--out", check_flags.out_dir,
                    "Directory for the minimal scenarios found (default ckptsim-found)");
  bool check_first = false;
  check->add_flag(
      "--first", check_first,
      "Stop at the first failure (default: keep searching, one minimal case per cause)");
  add_search_flags(check, check_flags);

  app::SearchCommand gate_flags;
  gate_flags.cases = 300;
  gate_flags.out_dir.clear();
  std::string baseline;
  std::string candidate;
  auto* gate = app.add_subcommand(
      "gate", "Judge a candidate revision against a baseline (new failures exit 1)");
  gate->add_option("--baseline", baseline, "The revision in use today")->required();
  gate->add_option("--candidate", candidate, "The revision under review")->required();
  gate->add_option("--out", gate_flags.out_dir,
                   "Directory for the report, JUnit XML and minimal scenarios")
      ->required();
  add_search_flags(gate, gate_flags);
  gate->add_option("--jobs", gate_flags.jobs,
                   "Run the two searches at once (2) or one after the other (1); default: 2 where "
                   "there are two cores. The findings are the same either way")
      ->check(CLI::Range(0, 2));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? app::kExitOk : app::kExitInvalid;
  }
  try {
    if (*run) return app::run_command(run_flags, std::cout, std::cerr);
    if (*revisions) return app::revisions_command(rev_json, rev_profiles, std::cout, std::cerr);
    if (*check) {
      check_flags.keep_going = !check_first;
      return app::check_command(check_flags, check_revision, std::cout, std::cerr);
    }
    if (*gate) return app::gate_command(gate_flags, baseline, candidate, std::cout, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "ckptsim: internal error (a bug in ckptsim, not a verdict on the scenario): "
              << e.what() << "\n";
    return app::kExitInternal;
  }
  return app::kExitInvalid;
}
