// Confirming found scenarios on the real code: `check` and `gate` with --megatron (or
// --megatron-root) replay every minimal scenario they wrote on a real Megatron-LM checkout and
// say, per scenario, whether the real code fails it too.
//
// After the search, in order:
//   1. each minimal scenario's replay plan is written next to it (<out>/<name>.plan.json, the
//      file `ckptsim replay-plan` writes), and a trace left there by an earlier run is removed;
//   2. ONE runner process replays them all (importing megatron costs 8-13 s a process):
//        ${CKPTSIM_PYTHON:-python3} -m replay run --plan P1 --plan P2 ... --out-dir <out>
//            [--megatron ARG]... [--megatron-root ROOT] [REPLAY-ARG]...
//      with PYTHONPATH starting at the folder that holds replay/ (find_replay_dir) and the
//      working directory left as it is, so that relative --megatron paths mean what they mean
//      to the user. Its output goes to <out>/replay.log (and, line by line, to the progress sink);
//   3. each trace (<out>/<name>.trace.json) is conformed in-process with the model's run of the
//      same scenario file (properties::conform), and the outcome decided (real_code_verdict).
//
// Invariants:
//   1. Nothing here changes an exit code: a search that found failures still exits 1.
//   2. A runner that is missing, fails or hangs up loses nothing the search wrote: the minimal
//      scenarios are written before the runner starts, and each scenario without a usable trace
//      is reported "could not replay: <reason>".
//   3. A trace that says the replay itself went wrong (a skipped run, a worker crash, a timeout,
//      a runner bug, a checkout that does not import) is never read as the real code's verdict:
//      "could not replay".
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "app/commands.h"
#include "model/revision.h"
#include "model/status.h"
#include "properties/conformance.h"
#include "report/search_report.h"

namespace ckptsim::app {

// Checks, before a search that may take minutes, what can be checked without the runner: each
// --megatron value is an existing DIR or REVISION=DIR with a known revision and an existing DIR,
// --megatron-root exists, and the runner's folder is found. A Status naming the flag otherwise.
Status validate_real_code(const RealCodeOptions& o, const model::RevisionRegistry& registry);

// The folder whose replay/__main__.py is the runner, first found of: `flag` (--replay-dir), the
// environment variable CKPTSIM_REPLAY_DIR (each must hold it when given), the executable's
// folder and the two above it (build/ckptsim in a checkout), the source tree ckptsim was built
// from.
Result<std::string> find_replay_dir(const std::string& flag);

// The outcome of one minimal scenario that failed `property`, from its conformance:
//   confirmed       everything conform() compares agrees (the strict judge: what `ckptsim
//                   conform` exits 0 on) and the real trace fails `property`;
//   not confirmed   conform() finds a disagreement (the text gives the first divergence and
//                   the property's verdict on the real code);
//   not judgeable   everything agrees, but a trace cannot judge `property`, or judges it kept
//                   on both traces (the model's failure needs what a trace does not hold).
report::RealCodeVerdict real_code_verdict(const properties::Conformance& c,
                                          const std::string& property);

// The first thing the real code does differently: the first event-level divergence, else the
// first verdict that differs ("no divergence listed" when they agree).
std::string first_disagreement(const properties::Conformance& c);

// Why a real trace cannot stand for the real code's verdict, or "" when it can: a skipped run
// (no checkout for a revision, no CUDA device, a kind that needs TE, ...; not a run skipped
// because the run it resumes from left no checkpoint, which the model records alike), or a primary
// error that the runner made up (WorkerCrash, ReplayTimeout, ReplayRunnerError) or that an import
// raised (ImportError, ModuleNotFoundError: the model has no import step to compare it with).
std::string replay_problem(const nlohmann::json& real_trace);

struct ConfirmContext {
  RealCodeOptions options;
  std::string out_dir;  // where the minimal scenarios are; plans, traces and replay.log go too
  model::RevisionRegistry* registry = nullptr;
  std::function<void(const std::string&)> progress;  // runner output and what happens
};

// Sets `real_code` of every reported failure (steps 1-3 above). Returns the runner's command
// line as a user could type it ("" when nothing was replayed).
std::string confirm_on_real_code(const ConfirmContext& ctx,
                                 std::vector<report::ReportedFailure>& reported);

}  // namespace ckptsim::app
