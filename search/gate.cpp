#include "search/gate.h"

#include <mutex>
#include <thread>

#include "model/errors.h"
#include "model/py/runtime.h"
#include "sim/driver.h"

namespace ckptsim::search {

std::string gate_class_name(GateClass c) {
  switch (c) {
    case GateClass::kNew:
      return "new";
    case GateClass::kNewCompat:
      return "new (the baseline cannot resume from it)";
    case GateClass::kPreExisting:
      return "pre-existing";
    case GateClass::kUnresolved:
      return "unresolved";
    case GateClass::kFixed:
      return "fixed by the candidate";
  }
  return "?";
}

bool counts_as_new(GateClass c) { return c == GateClass::kNew || c == GateClass::kNewCompat; }

GateClass gate_class(const Finding& finding, const properties::PropertyResult& all_baseline,
                     const std::string& baseline) {
  // The all-baseline run never got far enough to judge the property (it failed earlier, e.g.
  // at a load the candidate gets through): new or not cannot be told.
  if (all_baseline.verdict == properties::Verdict::kNotEvaluated) return GateClass::kUnresolved;
  const bool base_fails = all_baseline.verdict == properties::Verdict::kFail;
  const bool same_cause =
      (all_baseline.signature.empty() ? all_baseline.name : all_baseline.signature) ==
      finding.signature;
  // Candidate code failing: pre-existing only when the all-baseline run fails the same way.
  // Baseline code failing on a checkpoint the candidate wrote: pre-existing when the
  // all-baseline run fails that property at all (the baseline's own bug), else new — the
  // baseline can no longer resume from the candidate's checkpoint.
  const bool in_baseline_code = finding.phase_revision == baseline;
  if (base_fails && (same_cause || in_baseline_code)) return GateClass::kPreExisting;
  return in_baseline_code ? GateClass::kNewCompat : GateClass::kNew;
}

std::optional<Finding> gate_pick(const std::vector<Finding>& classed) {
  for (const Finding& f : classed) {
    CKPTSIM_CHECK(f.gate_class.has_value(), "gate_pick: a finding without a class");
    if (counts_as_new(*f.gate_class)) return f;
  }
  if (classed.empty()) return std::nullopt;
  return classed.front();
}

Judge gate_judge(const sim::Revision& baseline, std::vector<std::string> properties) {
  return [properties, baseline](const sim::Scenario& s) -> std::optional<Finding> {
    const sim::RunResult candidate = run_to_judge(s);
    int phase = -1;
    std::optional<Finding> finding = first_failure(s, candidate, properties, &phase);
    if (!finding) return std::nullopt;
    sim::Scenario base = s;
    for (auto& p : base.phases) p.set_revision(baseline);
    auto run = sim::run_scenario(base);
    CKPTSIM_CHECK(run.is_ok(), run.status().to_string());
    const properties::Property* property = properties::find_property(finding->property);
    CKPTSIM_CHECK(property != nullptr, "a finding of an unknown property " + finding->property);
    properties::PropertyResult all_baseline = property->check(run.value());
    // A baseline that stopped before the candidate's failure point judged nothing there.
    if (all_baseline.verdict != properties::Verdict::kNotEvaluated &&
        all_baseline.signature != finding->signature) {
      std::string why = properties::stopped_before(run.value(), candidate, phase);
      if (!why.empty()) {
        all_baseline.verdict = properties::Verdict::kNotEvaluated;
        all_baseline.detail = std::move(why);
      }
    }
    finding->gate_class = gate_class(*finding, all_baseline, baseline.name);
    return finding;
  };
}

std::vector<GateFinding> GateResult::findings() const {
  std::vector<GateFinding> out;
  for (const auto& part : parts) {
    for (const auto& f : part.result.failures) {
      CKPTSIM_CHECK(f.finding.gate_class.has_value(), "a gate finding without a class");
      out.push_back({&f, part.name, *f.finding.gate_class});
    }
  }
  return out;
}

bool GateResult::introduced() const {
  for (const auto& f : findings()) {
    if (counts_as_new(f.gate_class)) return true;
  }
  return false;
}

GateResult gate(const GateOptions& options) {
  GateResult result;
  result.concurrent = options.concurrent;
  SearchOptions base = options.search;
  base.generator.revisions = {options.baseline, options.candidate};
  base.keep_going = true;
  // 1. The search on the candidate alone. 2. Cross-revision loads, both ways.
  std::vector<std::pair<std::string, SearchOptions>> searches = {{"candidate", base},
                                                                 {"cross-revision", base}};
  searches[0].second.generator.revisions = {options.candidate};
  searches[1].second.generator.require_revision_change = true;
  searches[1].second.seed = model::mix_seed(options.search.seed, 2);
  // 3. With a fixed judge: the baseline alone, for what the candidate fixes.
  if (options.fixed_judge) {
    searches.emplace_back("baseline", base);
    searches[2].second.generator.revisions = {options.baseline};
    searches[2].second.seed = model::mix_seed(options.search.seed, 3);
  }
  // The searches at once each get the whole budget; one after the other, a share each.
  if (!options.concurrent) {
    for (auto& [name, o] : searches)
      o.time_budget_s = options.search.time_budget_s / static_cast<double>(searches.size());
  }
  std::mutex progress_mutex;
  for (auto& [name, search_options] : searches) {
    search_options.progress = [&options, &progress_mutex, part = name](const std::string& line) {
      if (!options.progress) return;
      std::lock_guard lock(progress_mutex);
      options.progress(part, line);
    };
  }
  const Judge judge =
      options.judge ? options.judge : gate_judge(options.baseline, options.properties);
  result.parts.resize(searches.size());
  auto run = [&](size_t i) {
    const Judge& j = searches[i].first == "baseline" ? options.fixed_judge : judge;
    result.parts[i] = {searches[i].first, search(searches[i].second, j)};
  };
  if (options.concurrent) {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < searches.size(); ++i) threads.emplace_back(run, i);
    for (auto& t : threads) t.join();
  } else {
    for (size_t i = 0; i < searches.size(); ++i) run(i);
  }
  return result;
}

}  // namespace ckptsim::search
