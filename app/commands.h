// The ckptsim commands as library calls: each takes its options, writes what the user reads
// to `out` (and errors and progress lines to `err`), and returns the exit code. cli/main.cpp
// only binds flags to these options; tests call the commands directly.
//
// With --megatron, check and gate also replay each minimal scenario they write on the real
// Megatron-LM and report per scenario whether it is confirmed there (app/confirm.h); that never
// changes their exit code.
//
// Exit codes (every command): 0 all properties hold (with --expect: every scenario gave the
// verdicts its "expect" block names; check: no failure found; gate: no new failure); 1 a
// property failed (or a verdict was not the expected one, or the gate found a new failure);
// 2 invalid input (a message names the file and the field); 3 an internal error of ckptsim
// itself (an invariant of ours broke: a bug to report, never a verdict) — main() maps an
// escaping exception to 3.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "model/megatron/checkpoint_damage.h"
#include "model/status.h"
#include "properties/checkpoint_inspection.h"
#include "sim/checkpoint_scenario.h"

namespace ckptsim::app {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFail = 1;
inline constexpr int kExitInvalid = 2;
inline constexpr int kExitInternal = 3;

// The most --jobs (search::SearchOptions::kJobsMax).
inline constexpr int kJobsMax = 256;

struct RunCommand {
  std::vector<std::string> files;
  bool json = false;
  bool expect = false;
  bool memory = false;
  bool quiet = false;
  std::string report;
  std::string checkpoint_root = "ckptsim-checkpoints";
  // "ckptsim" (the model's own format) or "torch_dist" (Megatron's, for real Megatron to
  // load: sim::CheckpointFormat); torch_dist_classes: "From=To" class renames of the export.
  std::string checkpoint_format = "ckptsim";
  std::vector<std::string> torch_dist_classes;
  std::string trace;
  std::vector<std::string> profiles;
  std::string device = "auto";
  // The model's trace in the replay runner's format (report/trace_json.h): a file for one
  // scenario, a directory (<scenario>.trace.json inside) for several. With trace_values, every
  // hashed array also as base64 floats.
  std::string trace_json;
  bool trace_values = false;
  // A picture (`ckptsim plot`) of every scenario that fails a property, <plots>/<scenario>.png,
  // linked from the report.
  std::string plots;
};

// `ckptsim plot`: a PNG of a scenario's run (report/plot.h): every Adam part's step counter and
// the largest divergence from the uninterrupted run against the global step, for the model, its
// uninterrupted run and, with `real_trace`, the real code. Exit 2 when gnuplot is missing.
struct PlotCommand {
  std::string scenario;
  std::string real_trace;  // optional
  std::string out;         // the PNG
  std::vector<std::string> profiles;
  bool keep_data = false;  // also write the data file and the gnuplot script next to it
  std::string gnuplot = "gnuplot";
};

// `ckptsim replay-plan`: the plans the replay runner replays on real Megatron-LM.
struct ReplayPlanCommand {
  std::vector<std::string> files;
  std::string out;  // a file for one scenario, a directory (<scenario>.plan.json) for several
  std::vector<std::string> profiles;
};

// `ckptsim conform`: the model's run of a scenario against a real trace of it.
struct ConformCommand {
  std::string scenario;
  std::string real_trace;
  std::string model_trace;  // optional: also write the model's trace here
  std::vector<std::string> profiles;
  bool json = false;
  int divergences_shown = 10;
};

// `ckptsim conform-campaign`: every real trace against the model's run of its scenario (found by
// name in `scenario_dirs`), and reports/conformance.md.
struct ConformCampaignCommand {
  std::vector<std::string> traces;  // files, or directories of *.trace.json
  std::vector<std::string> scenario_dirs = {"scenarios", "scenarios/found", "scenarios/campaign",
                                            "scenarios/campaign2"};
  std::string report;  // Markdown; empty: none
  std::string notes;   // hand-written Markdown appended to the report (causes, resolutions)
  std::vector<std::string> profiles;
  // A picture of every trace that disagrees, <plots>/<trace file without .trace.json>.png,
  // linked from the report.
  std::string plots;
  // Directories of real checkpoints with a fixtures.json (real_checkpoints_report).
  std::vector<std::string> real_checkpoints;
};

// --megatron on check and gate: confirm every minimal scenario found on a real Megatron-LM
// checkout (app/confirm.h says how).
struct RealCodeOptions {
  std::vector<std::string> megatron;     // DIR or REVISION=DIR (the runner's --megatron)
  std::string megatron_root;             // the runner's --megatron-root
  std::vector<std::string> replay_args;  // more runner options, passed through verbatim
  std::string replay_dir;  // the folder holding replay/ ("": $CKPTSIM_REPLAY_DIR, else found)
  std::string python;      // the interpreter ("": $CKPTSIM_PYTHON, else python3)
  bool enabled() const { return !megatron.empty() || !megatron_root.empty(); }
};

// --real on check and gate: the real Megatron-LM as the system under test (app/real_engine.h).
// The checkouts are real_code's --megatron / --megatron-root (check) or the two below (gate).
struct RealSearchOptions {
  bool enabled = false;
  std::string baseline_megatron;        // gate: the baseline's checkout
  std::string candidate_megatron;       // gate: the candidate's
  std::vector<std::string> profile_of;  // SIDE=PROFILE: the model runs SIDE as PROFILE
  bool no_model = false;                // never run the model beside the real code
  double run_timeout = 300;             // seconds, one run of a plan (the runner's --run-timeout)
  double scenario_timeout = 0;          // seconds, one scenario (0: from its runs)
  int prestart_dp = 2;                  // workers each runner starts per checkout at once
  int64_t shrink_runs_max = 200;        // replays spent shrinking one finding
  bool shrink_pre_existing = false;     // gate: shrink pre-existing findings too
  std::string work_dir;                 // "": <out>/real-work
  bool keep_all = false;                // keep every plan and trace
};

// The options of a search (check, gate). Defaults are the CLI's.
struct SearchCommand {
  uint64_t seed = 1;
  int64_t cases = 500;
  double time_budget = 0;
  std::string out_dir = "ckptsim-found";
  std::string junit;  // check only
  bool json = false;
  bool keep_going = true;  // check: false with --first
  bool quiet = false;
  std::vector<std::string> properties;
  std::vector<std::string> kinds;
  std::vector<std::string> transformer_engine;  // "installed", "absent" (hybrid cases)
  std::vector<std::string> sharding_types;      // the checkpoint formats drawn (default: all)
  std::vector<std::string> state_dtypes;  // precision-aware state dtypes drawn (default: none)
  std::vector<std::string> faults;
  std::vector<std::string> profiles;
  int64_t dp_max = 32;
  int64_t tp_max = 1;  // search::GeneratorConfig::tp_max, pp_max (1: no TP, no PP)
  int64_t pp_max = 1;
  int64_t ep_max = 1;  // search::GeneratorConfig::ep_max (1: no expert params)
  int params_max = 6;
  int phases_max = 4;
  int64_t steps_max = 6;          // search::GeneratorConfig::steps_max
  int64_t long_steps_max = 4096;  // search::GeneratorConfig::long_steps_max (0: none)
  bool stateful = false;
  // "storage": every case draws storage faults (search::GeneratorConfig::storage_faults);
  // "none" (the default): none.
  std::string fault_space = "none";
  bool coverage = false;  // print what the search drew (search::Coverage)
  // Threads (0: every core, std::thread::hardware_concurrency). check: threads judging cases;
  // gate: in all, the two searches at once (each with half) from 2 on. Never changes what a
  // search finds (search/search.h, invariant 5).
  int jobs = 0;
  std::string shard;  // check: "K/N" ("": from the environment, app/shard.h)
  // check: "dear-first" (search::SearchOptions::dear_first) or "in-order". Never changes what a
  // search finds.
  std::string schedule = "dear-first";
  // check: a CSV of every committed case's predicted cost and judge seconds ("": none).
  std::string case_times;
  RealCodeOptions real_code;
  RealSearchOptions real;
  // generate only. The RapidCheck size of each case (search::SizeSchedule): "spread" (evenly
  // over [0, 100] at any --cases), "ramp" (check's: case k at k % 101) or a size N in [0, 100]
  // for every case. `campaign`: draw from the campaign profile (search/generators.h).
  std::string sizes = "spread";
  bool campaign = false;
};

int run_command(const RunCommand& c, std::ostream& out, std::ostream& err);
// Lists the registry's properties (name, what must hold, what judges it, its canary).
int properties_command(bool json, std::ostream& out);

int revisions_command(bool json, const std::vector<std::string>& profiles, std::ostream& out,
                      std::ostream& err);
int check_command(const SearchCommand& c, const std::string& revision, std::ostream& out,
                  std::ostream& err);
// check --real and gate --real (app/real_commands.cpp): the real Megatron-LM as the system under
// test (app/real_engine.h). check_command and gate_command call them when c.real.enabled.
int real_check_command(const SearchCommand& c, const std::string& revision, std::ostream& out,
                       std::ostream& err);
int real_gate_command(const SearchCommand& c, const std::string& baseline,
                      const std::string& candidate, std::ostream& out, std::ostream& err);
// `ckptsim merge`: the summaries (report::kCheckSummaryFile) and minimal scenarios of the
// shards of one check, as that check's outputs: one minimal scenario per cause, the one of the
// smallest case index (search::merge_shards), written to out_dir with the merged summary (and
// JUnit with `junit`); printed as check prints them. Exit 0 no failure, 1 failures, 2 when the
// directories are not every shard of one search.
struct MergeCommand {
  std::vector<std::string> dirs;
  std::string out_dir = "ckptsim-merged";
  std::string junit;
  bool json = false;
  bool quiet = false;
  bool coverage = false;
  std::vector<std::string> profiles;
};
int merge_command(const MergeCommand& c, std::ostream& out, std::ostream& err);

int replay_plan_command(const ReplayPlanCommand& c, std::ostream& out, std::ostream& err);
// Exit 0 when every verdict a trace can judge, every step counter and every run's first error
// (type, site, merge() key path) agree, 1 when not, 2 on a bad scenario or trace.
int conform_command(const ConformCommand& c, std::ostream& out, std::ostream& err);
int plot_command(const PlotCommand& c, std::ostream& out, std::ostream& err);
// Exit 0 when every trace agrees, 1 when one does not, 2 on bad input.
int conform_campaign_command(const ConformCampaignCommand& c, std::ostream& out, std::ostream& err);
// `ckptsim generate`: scenarios drawn by the search's generators, written to c.out_dir as files
// (a campaign on the real code replays them): the search's profile, or with c.campaign the
// campaign's; each case at the size c.sizes says (not check's ramp, unless asked), so that a few
// cases are drawn as many are. `revisions`: every phase draws from these; with two or more,
// `cross` asks for at least one change of revision between phases. With c.coverage, prints what
// the scenarios hold (search::Coverage). Each file's description is the command that repeats it.
int generate_command(const SearchCommand& c, const std::vector<std::string>& revisions, bool cross,
                     std::ostream& out, std::ostream& err);
// `ckptsim coverage`: what scenario files hold, counted as `check --coverage` counts a search's
// draws (search::Coverage; with `json`, its JSON): for a campaign's files, what the campaign
// covers. Exit 0, or 2 when a file does not parse (the message names it).
struct CoverageCommand {
  std::vector<std::string> files;
  bool json = false;
  std::vector<std::string> profiles;
};
int coverage_command(const CoverageCommand& c, std::ostream& out, std::ostream& err);
// generate --campaign: the campaign profile's --dp-max and --params-max
// (search::kCampaignDpMax, kCampaignParamsMax), for those of the two the user did not give.
void use_campaign_limits(SearchCommand& c, bool dp_max_given, bool params_max_given);
// `ckptsim inspect`: a real Megatron torch_dist checkpoint (model/megatron/torch_dist_checkpoint.h,
// the directory holding latest_checkpointed_iteration.txt): what it holds, the static checks of
// properties/checkpoint_inspection.h, and each revision's resume from it as the model simulates
// it (sim/checkpoint_scenario.h infers the run that saved it, unless `scenario` names it).
// Exit 0 when every check holds and every revision resumes correctly, 1 when not, 2 when the
// directory is not a checkpoint it can read (or the model cannot hold it).
struct InspectCommand {
  std::string dir;
  std::vector<std::string> revisions;  // empty: every bundled profile (and --profile ones)
  int64_t dp = 0;                      // 0: the DP size at save
  int64_t tp = 0;                      // 0: the TP size at save (its args; else 1)
  int64_t pp = 0;                      // 0: the PP size at save (its args; else 1)
  bool json = false;
  std::string scenario;  // the scenario that saved it, instead of inferring one
  std::vector<std::string> profiles;
};
int inspect_command(const InspectCommand& c, std::ostream& out, std::ostream& err);

// Each revision's outcome, as a user must tell them apart.
enum class ResumeClass {
  kResumesCorrectly,        // loaded, t continues from the saved step, every loaded element is
                            // the checkpoint's, nothing left unwritten
  kResumeFails,             // the resume from this checkpoint fails or goes wrong (the cause)
  kCannotRunConfiguration,  // a fresh start of this configuration at this revision fails the
                            // same way (type and site), so no checkpoint is to blame
  kCannotSimulate,          // the model cannot run this resume (what is missing)
};
std::string resume_class_text(ResumeClass c);  // "resumes correctly", ...
struct ResumeVerdict {
  std::string revision;
  ResumeClass outcome = ResumeClass::kCannotSimulate;
  std::string cause;  // empty for kResumesCorrectly
};

// What inspect found, before it is printed (conform-campaign --real-checkpoints uses it too).
struct Inspection {
  std::string path;  // the iteration directory read
  model::TorchDistCheckpoint checkpoint;
  std::string unreadable;  // why the model cannot read it (then only the tiling check is set)
  // What a crashed or interrupted save left damaged (model/megatron/checkpoint_damage.h): then
  // each revision resumes from the model's own save of the same configuration with the same
  // damage (`model_damage`: what was done to it), and `checkpoint` is what reads of the rest.
  std::vector<model::DamagedFile> damage;
  std::vector<std::string> model_damage;
  std::string damage_saved_by;  // the revision whose model save took the damage
  std::vector<properties::CheckpointCheck> checks;
  sim::InferredScenario inferred;
  int64_t dp = 1;
  int64_t tp = 1;  // of the simulated resume
  int64_t pp = 1;
  double saved_step = 0;
  std::vector<properties::ResumeJudgement> judgements;  // one per simulated revision
  std::string cannot_simulate;          // why no revision's resume is simulated ("" when they are)
  std::vector<ResumeVerdict> verdicts;  // one per revision, in order
  bool ok() const;                      // every check holds and every revision resumes correctly
  // "upstream-head, fix-complete resume it correctly; 7 fail to resume it (...)".
  std::string answer() const;
};
// Status: the directory is not a checkpoint it can read, or the model cannot hold it.
// `progress` gets one line per revision resumed.
Result<Inspection> inspect_checkpoint(const InspectCommand& c, std::ostream& progress);

// conform-campaign --real-checkpoints: every real checkpoint of each directory's fixtures.json
// (dir, scenario, phase; runs/<scenario>.{scenario,trace}.json beside it) inspected, and each
// that a later phase of its real run resumed from compared with that real resume
// (properties::ResumeOutcome). One line per comparison to `out`.
struct RealCheckpointsReport {
  int64_t compared = 0;
  int64_t agreeing = 0;
  std::string markdown;  // a section of reports/conformance.md
};
Result<RealCheckpointsReport> real_checkpoints_report(const std::vector<std::string>& dirs,
                                                      std::ostream& out);

int gate_command(const SearchCommand& c, const std::string& baseline, const std::string& candidate,
                 std::ostream& out, std::ostream& err);

}  // namespace ckptsim::app
