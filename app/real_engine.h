// The real engine: the real Megatron-LM as the system under test of a search (`check --real`,
// `gate --real`). Every scenario the search draws, and every shrink candidate, is replayed on a
// real checkout by a pool of runner processes (`python -m replay serve`, replay/serve.py), and
// judged on its real trace by the properties' trace checks (properties/trace_checks.h). Where a
// checkout maps to a revision profile, the model runs the same scenario beside it and the strict
// judge (properties::conform) compares the two traces: a disagreement is a model divergence.
//
// A scenario's phases name revisions the runner maps to checkouts (RealSide): "baseline" and
// "candidate" for gate --real, "checkout" for check --real on one DIR, or a profile name that
// --megatron-root maps by its upstream commit. The placeholder names are registered as profiles
// that extend the profile the model runs the checkout as (or upstream-head, when none maps: then
// no model runs beside it, and the engine says so), so that a scenario stays a scenario.
//
// Invariants:
//   1. Never a hung search: a runner that does not answer within the scenario's timeout is
//      killed with every worker it started, restarted, and the scenario is "could not replay"
//      (its logs named); a worker that dies or hangs inside a run is the runner's to report
//      (WorkerCrash, ReplayTimeout), and is "could not replay" too. Either way the search goes
//      on: a scenario that could not be replayed is no finding of the real code.
//   2. A trace that says the replay went wrong (app/confirm.h replay_problem) is never read as
//      the real code's verdict.
//   3. The judges are thread-safe: up to `runners` scenarios replay at once (search --jobs).
//   4. Stopped (the stop flag: Ctrl-C, SIGTERM; or the search's time budget, stop_after), a
//      replay in flight ends at once and its runner is killed, so the search returns what it found
//      within the budget; such a replay is "abandoned" (counted apart), never a could-not-replay
//      finding: nothing went wrong with the real code or the runner.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "app/commands.h"
#include "app/process.h"
#include "model/revision.h"
#include "model/status.h"
#include "search/search.h"
#include "sim/scenario.h"

namespace ckptsim::app {

// One revision of a real search: the name the scenarios' phases carry, where its checkout is,
// and the profile the model runs beside it as.
struct RealSide {
  std::string revision;       // "baseline", "candidate", "checkout", or a profile name
  std::string dir;            // the checkout ("": --megatron-root finds it by the profile's commit)
  std::string model_profile;  // "": no model beside this side
  std::string model_reason;   // how model_profile was chosen, or why there is none
};

// The profile a checkout maps to: `explicit_profile` when given (--profile-of), else the bundled
// or loaded profile whose upstream commit is the checkout's (its CKPTSIM_UPSTREAM.json stamp, or
// `git rev-parse HEAD`). Sets side.model_profile ("" when none) and side.model_reason.
void map_checkout_to_profile(model::RevisionRegistry& registry, RealSide& side,
                             const std::string& explicit_profile);

// The commit of a checkout: its stamp's, else git's; "" when neither says.
std::string checkout_commit(const std::string& dir);

// Why --real cannot run here, or "": no checkout, a checkout without megatron/core, the runner's
// Python without torch, no CUDA device (checked by running the runner's Python once).
std::string real_preflight(const RealCodeOptions& code, const std::vector<RealSide>& sides);

struct RealEngineOptions {
  RealCodeOptions code;  // python, replay dir, --replay-arg, --megatron-root
  std::vector<RealSide> sides;
  int runners = 1;
  std::string work_dir;           // plans, traces, runner logs (created)
  double run_timeout_s = 300;     // the runner's --run-timeout (one run of a plan)
  double scenario_timeout_s = 0;  // per scenario; 0: runs x (run timeout + 60) + 300
  double start_timeout_s = 300;   // a runner's hello
  int prestart_dp = 2;            // workers each runner starts per checkout before the first job
  bool keep_all = false;          // keep every plan and trace (default: findings' only)
  const std::atomic<bool>* stop = nullptr;
  std::function<void(const std::string&)> progress;
};

// What one replay gave.
struct ReplayResult {
  bool replayed = false;   // a trace that stands for the real code's verdict
  std::string problem;     // why not ("" when replayed)
  bool abandoned = false;  // ended by a stop (invariant 4): no finding of any kind
  nlohmann::json trace;
  std::string plan_path;
  std::string trace_path;
  std::string log_path;  // the runner's log
  double seconds = 0;
  int64_t runs = 0;  // runs of the plan (reference and phases)
};

// A scenario the model and the real code disagree on (the first of its signature).
struct ModelDivergence {
  std::string signature;  // "model_divergence:<where>:<field>"
  std::string first;      // the first divergence, described
  std::string figures;    // report::conformance_fields
  sim::Scenario scenario;
  std::string real_trace;
  std::string model_trace;
  int64_t count = 0;  // scenarios with this signature
};

struct CouldNotReplay {
  std::string problem;
  sim::Scenario scenario;
  std::string plan;
  std::string log;
  int64_t count = 0;  // scenarios with this problem's first line
};

struct RealEngineStats {
  int64_t replays = 0;
  int64_t runs = 0;
  int64_t could_not_replay = 0;
  int64_t abandoned = 0;  // ended by the stop flag or the time budget (invariant 4)
  int64_t model_compared = 0;
  int64_t model_agreed = 0;
  double replay_seconds = 0;  // summed over replays (all runners)
};

// What the engine knows of a scenario it kept (a finding's): its plan, real trace, and the model
// beside it.
struct KeptReplay {
  std::string plan;
  std::string trace;
  std::string model;  // "agrees with the real code (...)", "diverges: ...", "not run: ..."
};

class RealEngine {
 public:
  // Registers the placeholder profiles of `sides` in `registry`, starts the runners and waits for
  // each one's hello. A Status when a runner cannot start (its log named).
  static Result<std::unique_ptr<RealEngine>> start(RealEngineOptions options,
                                                   model::RevisionRegistry& registry);
  ~RealEngine();

  // The sim::Revision of a side (its placeholder or profile), for the generator.
  const sim::Revision& revision(const std::string& side) const;

  // Replays one scenario (waits for a free runner). Thread-safe.
  ReplayResult replay(const sim::Scenario& s);

  // The search's time budget, counted from now (called as the search starts; 0: none): past it
  // the engine stops as the stop flag stops it (invariant 4), so that a budget bounds the replays
  // in flight too, not only what starts.
  void stop_after(double seconds);

  // check --real: the first failing property of the real trace (only `properties`, when given).
  search::Judge check_judge(std::vector<std::string> properties);
  // gate --real, the candidate and cross-revision searches: every failing property classed
  // against the same scenario replayed entirely on `baseline` (search::gate_class); the first
  // that counts as new, else the first (a pre-existing failure never hides a new one).
  search::Judge gate_judge(const std::string& baseline, std::vector<std::string> properties);
  // gate --real, the baseline search: the first property the baseline fails and the same
  // scenario run entirely on `candidate` keeps (GateClass::kFixed).
  search::Judge fixed_judge(const std::string& candidate, std::vector<std::string> properties);

  RealEngineStats stats() const;
  std::vector<ModelDivergence> divergences() const;
  std::vector<CouldNotReplay> could_not_replay() const;
  // The replay of `s` kept when it gave a finding (nullopt when none was kept).
  std::optional<KeptReplay> kept(const sim::Scenario& s) const;
  // The placeholder profiles it registered (name -> profile JSON): written next to the findings,
  // so that `ckptsim run --profile <out>/<name>.profile.json <found>.json` replays one on the
  // model.
  const std::map<std::string, nlohmann::json>& placeholders() const { return placeholders_; }
  // Whether the model runs beside every side.
  bool model_beside() const;
  const RealEngineOptions& options() const { return options_; }

 private:
  struct Runner;
  explicit RealEngine(RealEngineOptions options);
  Status start_runner(size_t index);
  bool stopped() const;
  // A free runner's index (waits for one), or nullopt with `problem` (stopped, none left).
  std::optional<size_t> acquire(std::string& problem);
  // Sends r's plan and waits for the answer; true when the runner must be restarted (it exited,
  // hung past `timeout`, or the search stopped). Sets r.problem when there is no trace.
  bool exchange(Runner& runner, int64_t id, double timeout, ReplayResult& r);
  // Restarts the runner if asked, gives it back, counts the replay.
  void release(size_t index, bool restart, const ReplayResult& r);
  // Reads the trace (or keeps the problem), and records a scenario that could not be replayed.
  void conclude(const sim::Scenario& s, ReplayResult& r);
  std::vector<std::string> runner_argv(size_t index) const;
  // One scenario replayed and judged: every property its real trace fails (only `properties`,
  // when given), in registry order, and the model beside it.
  struct Judged {
    ReplayResult replay;
    std::vector<search::Finding> failures;
    std::vector<std::string> runs;  // the run each failure was seen in ("phase1", ...)
    std::string model_text;
  };
  Judged judge_real(const sim::Scenario& s, const std::vector<std::string>& properties);
  // Keeps the replay when `f` is a finding (its plan and trace go next to it), else discards it;
  // returns `f`.
  std::optional<search::Finding> conclude_judged(const sim::Scenario& s, const Judged& j,
                                                 std::optional<search::Finding> f);
  void beside(const sim::Scenario& s, const ReplayResult& r, std::string& model_text);
  void keep(const sim::Scenario& s, const ReplayResult& r, const std::string& model_text);
  void discard(const ReplayResult& r) const;
  sim::Scenario on_side(const sim::Scenario& s, const std::string& side) const;

  RealEngineOptions options_;
  std::string replay_dir_;
  std::map<std::string, sim::Revision> revisions_;  // side -> its revision
  std::map<std::string, nlohmann::json> placeholders_;
  std::vector<std::unique_ptr<Runner>> runners_;
  mutable std::mutex mutex_;
  std::condition_variable free_;
  std::vector<size_t> idle_;
  int64_t next_id_ = 0;
  std::atomic<int64_t> deadline_ns_{0};  // steady_clock since epoch; 0: none
  RealEngineStats stats_;
  std::vector<ModelDivergence> divergences_;
  std::vector<CouldNotReplay> could_not_;
  std::map<std::string, KeptReplay> kept_;  // scenario JSON -> its replay
};

}  // namespace ckptsim::app
