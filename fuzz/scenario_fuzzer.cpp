// Fuzzes sim/scenario.h parse_scenario() with the text of a scenario file (the bug-report
// format), against a copy of the embedded revision profiles per input (a phase may add a
// profile file to the registry). Checked: a scenario or a one-line Status that names the file
// (invariant 2); a scenario keeps the limits of invariant 3 and survives the round trip
// parse_scenario(scenario_to_json(s)).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz_targets.h"
#include "model/revision.h"
#include "sim/scenario.h"

namespace ckptsim::fuzz {
namespace {

constexpr const char* kSource = "fuzz-scenario.json";

const model::RevisionRegistry& embedded() {
  static const model::RevisionRegistry r = [] {
    Result<model::RevisionRegistry> loaded = model::RevisionRegistry::load_embedded();
    if (!loaded.is_ok()) broken("the embedded profiles: " + loaded.status().message());
    return loaded.value();
  }();
  return r;
}

void check_scenario(const sim::Scenario& s) {
  if (s.name.empty()) broken("a scenario without a name");
  if (s.params.empty() || s.params.size() > sim::Scenario::kParamsMax) broken("params count");
  if (s.phases.empty() || s.phases.size() > sim::Scenario::kPhasesMax) broken("phases count");
  if (s.total_numel() > sim::Scenario::kTotalNumelMax) broken("total numel");
  if (s.total_steps() > sim::Scenario::kStepsMax) broken("total steps");
  for (const sim::PhaseSpec& p : s.phases) {
    if (p.profile == nullptr) broken("a phase without its profile");
    if (p.dp < 1 || p.dp > sim::Scenario::kDpMax) broken("a phase's dp");
  }
  model::RevisionRegistry registry = embedded();
  Result<sim::Scenario> again =
      sim::parse_scenario(sim::scenario_to_json(s).dump(), kSource, registry);
  if (!again.is_ok()) broken("scenario_to_json does not parse back: " + again.status().message());
  if (sim::scenario_to_json(again.value()) != sim::scenario_to_json(s)) {
    broken("scenario_to_json does not round-trip");
  }
}

}  // namespace

void fuzz_scenario(std::span<const char> input) {
  model::RevisionRegistry registry = embedded();
  const std::string text(input.begin(), input.end());
  Result<sim::Scenario> s = sim::parse_scenario(text, kSource, registry);
  if (!s.is_ok()) {
    check_error(s.status(), kSource);
    return;
  }
  check_scenario(s.value());
}

}  // namespace ckptsim::fuzz

#ifndef CKPTSIM_FUZZ_IN_TESTS
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptsim::fuzz::fuzz_scenario(ckptsim::fuzz::as_chars(data, size));
  return 0;
}
#endif
