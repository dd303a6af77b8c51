// The gate: the verdict a reviewer needs on a graft. A search on the candidate alone and a
// search over cross-revision loads (checkpoints saved by one revision and resumed by the
// other, both ways); each finding is classed against the same scenario run entirely on the
// baseline (GateClass in search/search.h).
//
// The classification (gate_class(), pure and unit-tested):
//   - the all-baseline run never judged the property (not_evaluated)     -> unresolved;
//   - it fails the property, with the same cause or the finding is in a baseline phase
//                                                                         -> pre-existing;
//   - else, a finding in a baseline phase (on the candidate's checkpoint) -> new-compat;
//   - else                                                                -> new.
// The class is decided inside the judge, so shrinking keeps it (Finding::same_cause).
//
// Invariants:
//   1. The findings do not depend on whether the two searches run at once or one after the
//      other (a test runs both ways), nor on each one's jobs (search.h, invariant 5); with a
//      time budget, each search gets the whole budget when they run at once and an equal share of
//      it otherwise.
//   2. The cross-revision search draws from its own seed stream (mix_seed(seed, 2)).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "search/search.h"

namespace ckptsim::search {

// "new", "new (the baseline cannot resume from it)", "pre-existing", "unresolved", "fixed by the
// candidate".
std::string gate_class_name(GateClass c);
// New and new-compat count against the candidate; pre-existing and unresolved do not.
bool counts_as_new(GateClass c);

// The class of `finding` (seen in a run involving the candidate), given what the property
// concluded on the same scenario run entirely on `baseline`.
GateClass gate_class(const Finding& finding, const properties::PropertyResult& all_baseline,
                     const std::string& baseline);

// Of several classed findings of one scenario (in property order), the one a gate reports: the
// first that counts as new, else the first; nullopt for none. A failure the baseline shares thus
// never hides a new one in the same scenario (gate --real judges every failing property).
std::optional<Finding> gate_pick(const std::vector<Finding>& classed);

// A judge that runs the property judge and classes each finding against the all-baseline run.
Judge gate_judge(const sim::Revision& baseline, std::vector<std::string> properties);

struct GateOptions {
  sim::Revision baseline;
  sim::Revision candidate;
  // seed, cases, time budget (0: none), generator limits, kinds, faults; the revisions are
  // set per search.
  SearchOptions search;
  std::vector<std::string> properties;  // only these count (empty: all)
  bool concurrent = true;               // the two searches at once (each with search.jobs)
  // The judges of the candidate and cross-revision searches (empty: gate_judge over the model,
  // classing each finding against the all-baseline run), and, when set, the judge of a third
  // search on the baseline alone ("baseline") that reports what the candidate fixes (GateClass
  // kFixed). The real engine (app/real_engine.h) sets all of them.
  Judge judge;
  Judge fixed_judge;
  // One progress line of one search ("candidate", "cross-revision", "baseline"); may be empty.
  std::function<void(const std::string& part, const std::string& line)> progress;
};

struct GatePart {
  std::string name;  // "candidate", "cross-revision", "baseline"
  SearchResult result;
};

struct GateFinding {
  const Failure* failure = nullptr;  // into GateResult::parts
  std::string part;
  GateClass gate_class = GateClass::kNew;
};

struct GateResult {
  std::vector<GatePart> parts;
  bool concurrent = false;
  // Every finding of every part, in part order.
  std::vector<GateFinding> findings() const;
  // Whether the candidate introduces a failure (a finding that counts as new).
  bool introduced() const;
};

GateResult gate(const GateOptions& options);

}  // namespace ckptsim::search
