// Property-based search over generated scenarios, with shrinking to a minimal replayable
// scenario. The engine behind `ckptsim check` and `ckptsim gate`.
//
// A search, in order:
//   for case k = 0, 1, ...: draw a scenario from the generator with rc::Random(mix(seed, k))
//   at size case_size(options, k) (by default k % (size_max + 1): small cases first, as
//   RapidCheck does); judge it (run the simulator, check the properties); on a finding, shrink
//   in two stages, each moving to the first candidate that still gives a finding with the SAME
//   signature, until none does (or the shrink budget runs out): (1) the generator's own
//   RapidCheck shrinks; (2) domain shrinks (domain_shrinks()), which also merge adjacent
//   phases — a bug that needs N steps before a resume is otherwise stuck at N phases of one
//   step each, since shrinking never adds steps.
//
// Invariants:
//   1. Reproducible: (seed, case index) determines the case, and a found scenario replays
//      with `ckptsim run` to the same verdict (its JSON is written through the scenario
//      parser's own format, and re-parsed before it is reported).
//   2. Shrinking never drifts to another bug: a candidate counts only if it fails with the
//      same cause (Finding::same_cause) as the case it shrinks.
//   3. Every loop is bounded: cases_max, shrink_runs_max and an optional wall-clock budget
//      (the only clock in the search; it decides when to stop, never what a case is).
//   4. Searches may run concurrently on several threads (the gate runs two at once): RapidCheck
//      keeps its generation context in process-wide stacks, so every call into a generator or
//      a shrink sequence takes one process-wide lock; the judge runs outside it.
//   5. The same for any number of jobs: with jobs = N, N workers judge cases ahead (at most
//      kCasesAhead past the oldest one not yet committed: search/parallel.h) and shrink
//      candidates (N at once), but results are committed strictly in case order — coverage
//      added, a finding shrunk only if its cause is new at that point — and a shrink moves to
//      the FIRST candidate in candidate order that keeps the cause, whichever finished first.
//      So causes, case indices, minimal scenarios, shrink counts, judge_runs and coverage are
//      those of jobs = 1; only discarded_runs (work judged ahead and not used) and the seconds
//      differ.
//      A time budget makes every search depend on speed, and then on jobs too.
//   6. Shards partition a search: case k belongs to shard (k mod N) + 1 of N and is drawn and
//      judged as in the whole search. merge_shards() keeps, per cause, the failure of the
//      smallest case index, so shards 1..N merged give the whole search's failures, coverage
//      and cases (without --first and without a time budget; judge_runs may differ, since two
//      shards may each shrink a cause).
#pragma once

#include <atomic>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "properties/properties.h"
#include "search/coverage.h"
#include "search/generators.h"

namespace ckptsim::search {

// How a gate classes a finding (search/gate.h says how it is decided).
enum class GateClass {
  kNew,          // the same scenario run entirely on the baseline keeps the property (or fails
                 // it for another cause)
  kNewCompat,    // a baseline phase fails on a checkpoint the candidate wrote, while the
                 // all-baseline run keeps the property: the baseline cannot resume from it
  kPreExisting,  // the baseline fails it too
  kUnresolved,   // the all-baseline run never reached the property: new or not cannot be told
  kFixed,        // (the gate's "baseline" part) the baseline fails it, and the same scenario run
                 // entirely on the candidate keeps it: the candidate fixes it
};

// What a judge reports about one scenario: the first finding, or nothing.
struct Finding {
  std::string property;
  std::string signature;
  std::string detail;
  std::string phase_revision;           // the revision of the phase where it was seen ("" if none)
  std::optional<GateClass> gate_class;  // set by the gate's judge

  // Two findings have the same cause when property signature and gate class agree: the search
  // keeps one minimal scenario per cause and shrinks only toward the same cause.
  bool same_cause(const Finding& other) const {
    return signature == other.signature && gate_class == other.gate_class;
  }
};

using Judge = std::function<std::optional<Finding>(const sim::Scenario&)>;

// One part of a search spread over machines (invariant 6): shard `index` of `count`, 1-based.
struct Shard {
  static constexpr int64_t kCountMax = 100'000;
  int64_t index = 1;
  int64_t count = 1;
  bool holds(int64_t case_index) const { return case_index % count == index - 1; }
  bool whole() const { return count == 1; }
};

// The RapidCheck size of each case. Generators scale their ranges by it (gen::inRange at size
// 0 gives its lower bound: DP 1, one element), so the schedule decides what a few cases cover.
enum class SizeSchedule {
  kRamp,    // case k at size k % (size_max + 1): small cases first, as RapidCheck does (check,
            // gate); the first dozen cases are all nearly size 0
  kSpread,  // spread evenly over [0, size_max] at any number of cases (generate): a Weyl
            // sequence of the golden ratio, started at a point the seed draws, so that every
            // prefix of the cases is as even as a prefix can be and case k does not depend on
            // how many cases are drawn
  kFixed,   // every case at fixed_size (generate --size N)
};

struct SearchOptions {
  static constexpr int64_t kCasesMax = 10'000'000;
  static constexpr int64_t kShrinkRunsMax = 100'000;
  static constexpr int kJobsMax = 256;
  // With jobs > 1, cases judged ahead of the oldest one not yet committed. Case costs are
  // heavy-tailed (a long phase at a large DP takes seconds to minutes, a typical case tens of
  // milliseconds): a window of a few cases per job leaves the workers idle behind one long case.
  // What waits to be committed is small (the drawn scenario, its shrinkable, the finding).
  static constexpr int64_t kCasesAhead = 4096;

  GeneratorConfig generator;
  uint64_t seed = 1;
  int64_t cases = 500;
  double time_budget_s = 0;  // 0: none
  int size_max = 100;        // the largest RapidCheck size (rc::kNominalSize)
  SizeSchedule sizes = SizeSchedule::kRamp;
  int fixed_size = 0;              // with SizeSchedule::kFixed; REQUIRES: in [0, size_max]
  int64_t shrink_runs_max = 2000;  // judge runs spent shrinking one finding
  bool keep_going = true;          // go on after a finding, keep one per signature
  int jobs = 1;                    // threads judging cases (1: the caller's thread alone)
  Shard shard;                     // the cases this search runs (invariant 6)
  // Called every few cases and after each finding, for a progress line.
  std::function<void(const std::string&)> progress;
  // When it reads true (a signal handler sets it: Ctrl-C, a CI timeout's SIGTERM), the search
  // stops as a time budget stops it, and returns what it found so far (stopped_by_time).
  const std::atomic<bool>* stop = nullptr;
  // Which findings are shrunk (empty: all). A finding it refuses is kept as first drawn, with
  // Failure::not_shrunk saying why: gate --real keeps a pre-existing finding unshrunk, since each
  // shrink candidate costs two real replays and its cause is the baseline's, not the graft's.
  // It decides what is spent, never what is found: the causes and case indices stay the same.
  std::function<bool(const Finding&)> shrink_if;
  std::string not_shrunk_reason = "not shrunk";  // Failure::not_shrunk when shrink_if refuses
  // With jobs > 1: workers start the cases predicted dearest (predicted_cost) early, while at
  // least half of them keep the case order (search/parallel.h, DearFirst). False: case order.
  // Either way the search finds the same (invariant 5); only its timings differ.
  bool dear_first = true;
  // Keep each committed case's predicted cost and judge time (SearchResult::case_times).
  bool record_case_times = false;
};

// What predicted_cost weighs, summed over every phase's job and the reference run.
struct CostTerms {
  double element_steps = 0;      // ranks x steps x each rank's share of the params' elements
  double buffer_steps = 0;       // ranks x steps x each rank's share of the grad buffer (padded)
  double rank_steps = 0;         // ranks x steps
  double rank_phases = 0;        // ranks x jobs (each builds, saves, loads)
  double rank_phase_params = 0;  // ranks x jobs x params
};
CostTerms cost_terms(const sim::Scenario& s);

// One committed case's predicted cost and what judging it took (SearchOptions::record_case_times).
struct CaseTime {
  int64_t case_index = 0;
  int size = 0;
  CostTerms terms;
  double predicted_cost = 0;
  double seconds = 0;
};

struct Failure {
  Finding finding;         // on the minimal scenario
  sim::Scenario original;  // as first drawn
  sim::Scenario minimal;
  int64_t case_index = 0;
  int64_t shrink_steps = 0;  // accepted shrinks
  int64_t shrink_runs = 0;   // judge runs spent shrinking
  std::string not_shrunk;  // why the search kept it as drawn (SearchOptions::shrink_if); "" if not
  // The search's clock (seconds since it started) when the case was committed as a finding, and
  // when its shrinking ended: the time to find it and to shrink it (a report's figures; they
  // decide nothing).
  double found_s = 0;
  double shrunk_s = 0;
};

struct SearchResult {
  int64_t cases_run = 0;
  int64_t judge_runs = 0;      // cases run + shrink candidates judged, as jobs = 1 counts them
  int64_t discarded_runs = 0;  // jobs > 1: runs judged ahead whose result was not used
  bool stopped_by_time = false;
  double seconds = 0;                // wall clock, the whole search
  double shrink_seconds = 0;         // of which shrinking
  std::vector<Failure> failures;     // one per cause, in the order found
  Coverage coverage;                 // what the cases drew (never the shrink candidates)
  std::vector<CaseTime> case_times;  // with SearchOptions::record_case_times, in case order
};

// What judging `s` costs, predicted from its shape: a weighted sum of its CostTerms, in units
// of one element's step on one rank. A relative figure (the scheduler compares cases with it),
// not seconds; its fit to measured judge times is in reports/search-speed.md.
double predicted_cost(const sim::Scenario& s);
// The same, of terms already counted.
double predicted_cost(const CostTerms& terms);

// Smaller neighbours of a scenario, most aggressive first: fewer phases (a phase's steps merged
// into its neighbour), fewer params, DP toward 1, fewer elements, fewer steps, and simpler
// options (one bucket, no 65536 padding, offload 0 or 1, bf16, seed 0). Every candidate is a
// valid scenario.
std::vector<sim::Scenario> domain_shrinks(const sim::Scenario& s);

// The default judge: runs the scenario (memory store) and reports the first failing property
// in property order, restricted to `properties` when non-empty.
Judge property_judge(std::vector<std::string> properties = {});
// What property_judge does, in two parts: the run it judges (no step trace: no property reads
// it), and the first failing property of a run in registry order (only `only`, when given), with
// the phase it was seen in (-1: the reference run) in `phase` when asked.
sim::RunResult run_to_judge(const sim::Scenario& s);
std::optional<Finding> first_failure(const sim::Scenario& s, const sim::RunResult& run,
                                     const std::vector<std::string>& only, int* phase = nullptr);

SearchResult search(const SearchOptions& options, const Judge& judge);

// The shards of one search as one result (invariant 6): counts and coverage summed, failures
// sorted by case index with one per cause, the one of the smallest case index (only the first
// failure without keep_going), stopped_by_time if any shard was; seconds the longest shard's.
SearchResult merge_shards(std::vector<SearchResult> shards, bool keep_going);

// A found scenario as a replayable file: named, described, with the search's seed and case.
// `tag` (optional) names the search part, e.g. "cross-revision".
nlohmann::json found_scenario_json(const Failure& f, uint64_t seed, const std::string& how,
                                   const std::string& tag = "");

// The RapidCheck size case `case_index` is drawn at, as options.sizes says.
int case_size(const SearchOptions& options, int64_t case_index);

// The scenarios a search with these options draws, case by case, without judging them (for a
// campaign on the real code: `ckptsim generate`). Case k is the search's case k.
std::vector<sim::Scenario> draw(const SearchOptions& options);

// Creates `dir` (and its parents) if needed: output locations are checked before a search that
// may take minutes, not after it.
Status prepare_out_dir(const std::string& dir);
// Writes found_scenario_json into `dir` as <name>.json and returns its path.
Result<std::string> write_found(const std::string& dir, const Failure& failure, uint64_t seed,
                                const std::string& how, const std::string& tag = "");

}  // namespace ckptsim::search
