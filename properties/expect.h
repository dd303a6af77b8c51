// A scenario's expected verdicts (its "expect" block), typed: parsed and validated once, when
// the scenario is read, then compared with the verdicts of each run.
//
//   "expect": {"ok": bool,
//              "properties": {property: true | false | "pass" | "fail" | "not_evaluated"},
//              "detail_contains": {property: text}}
//
// Invariants:
//   1. Every property named is a known one, every value of the right type; an error names the
//      file and the field ("bug.json: field 'expect.properties.x': unknown property ...").
//   2. true means "pass" and false "fail", as the file format has always read them.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/status.h"
#include "properties/properties.h"

namespace ckptsim::properties {

struct Expectation {
  std::optional<bool> ok;                                            // all properties pass
  std::vector<std::pair<std::string, Verdict>> verdicts;             // property, verdict
  std::vector<std::pair<std::string, std::string>> detail_contains;  // property, text
};

// The block as a scenario holds it (sim::Scenario::expect): null gives nullopt. The block's own
// fields were already checked by the scenario parser (only ok, properties, detail_contains).
Result<std::optional<Expectation>> parse_expectation(const nlohmann::json& block,
                                                     const std::string& source);

// Empty when the verdicts are the expected ones; otherwise one line per disagreement, in the
// order ok, verdicts, detail_contains.
std::vector<std::string> expectation_mismatches(const Expectation& expect,
                                                const std::vector<PropertyResult>& results);

}  // namespace ckptsim::properties
