// What a search drew, as Hypothesis's statistics show it: per feature of the drawn scenarios
// (optimizer kind, DP sizes and reshards, DP 1 throughout, steps per phase, revisions, dtypes,
// the storage faults of a phase's save (`--fault-space storage`),
// the hybrid's fp32 params, param-group hyper-parameters, layout, the scheduler arguments a
// resume changes and under which flag and revision), how many cases, phases or resumes had
// each value. `check --coverage` and `generate --coverage` print it, so that a user sees what
// a green search or a campaign covered, and what it never drew.
//
// Only the cases as first drawn count (never the shrink candidates). Invariant: the counts
// are a pure function of the drawn scenarios (the same search prints the same table).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/scenario.h"

namespace ckptsim::search {

class Coverage {
 public:
  // Counts one drawn case.
  void add(const sim::Scenario& s);
  // Adds another search's counts (the shards of one search, or a gate's two searches).
  void merge(const Coverage& other);

  int64_t cases() const { return cases_; }
  int64_t phases() const { return phases_; }
  // feature -> value -> count; every feature says in its name whether it counts cases or
  // phases.
  const std::map<std::string, std::map<std::string, int64_t>>& counts() const { return counts_; }
  int64_t count(const std::string& feature, const std::string& value) const;

  // One block of lines: "  <feature>: <value> <pct>% (<n>), ..." in count order.
  std::string text() const;
  nlohmann::json json() const;
  // The counts json() wrote (`ckptsim merge` reads each shard's); `source` names the file in
  // the error. from_json(c.json()) counts what c counts.
  static Result<Coverage> from_json(const nlohmann::json& j, const std::string& source);

  // The step bands a phase falls in: "0", "1", "2-6", "7-249", "250-270 (near 2^8)",
  // "271-2039", "2040-2060 (near 2^11)", ">2060".
  static std::string steps_band(int64_t steps);

 private:
  void bump(const std::string& feature, const std::string& value) { ++counts_[feature][value]; }

  int64_t cases_ = 0;
  int64_t phases_ = 0;
  std::map<std::string, std::map<std::string, int64_t>> counts_;
};

}  // namespace ckptsim::search
