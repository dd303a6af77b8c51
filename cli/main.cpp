// ckptsim command line. Thin by design: parse flags, call sim/ properties/ report/, print.
//
// Exit codes (every command): 0 all properties hold (or, with --expect, every scenario gave
// the verdicts its "expect" block names); 1 a property failed (or a verdict was not the
// expected one); 2 invalid input (a message names the file and the field); 3 an internal
// error of ckptsim itself (an invariant of ours broke: a bug to report, never a verdict).
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "model/faults.h"
#include "model/revision.h"
#include "properties/properties.h"
#include "report/run_report.h"
#include "search/search.h"
#include "sim/driver.h"
#include "sim/scenario.h"

namespace {

using namespace ckptsim;

constexpr int kExitOk = 0;
constexpr int kExitFail = 1;
constexpr int kExitInvalid = 2;
constexpr int kExitInternal = 3;

int invalid(const std::string& message) {
  std::cerr << "ckptsim: " << message << "\n";
  return kExitInvalid;
}

Result<model::RevisionRegistry> load_registry(const std::vector<std::string>& profile_files) {
  auto registry = model::RevisionRegistry::load_embedded();
  if (!registry.is_ok()) return registry.status();
  for (const auto& f : profile_files) {
    Status s = registry.value().add_file(f);
    if (!s.is_ok()) return s;
  }
  return registry;
}

std::string sanitize(const std::string& name) {
  std::string out;
  for (char c : name)
    out.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_');
  return out.empty() ? "scenario" : out;
}

struct RunFlags {
  std::vector<std::string> files;
  bool json = false;
  bool expect = false;
  bool memory = false;
  bool quiet = false;
  std::string report;
  std::string checkpoint_root = "ckptsim-checkpoints";
  std::string trace;
  std::vector<std::string> profiles;
  std::string device = "auto";
};

int cmd_run(const RunFlags& f) {
  auto registry = load_registry(f.profiles);
  if (!registry.is_ok()) return invalid(registry.status().message());
  std::vector<sim::Scenario> scenarios;
  for (const auto& file : f.files) {
    auto s = sim::load_scenario_file(file, registry.value());
    if (!s.is_ok()) return invalid(s.status().message());
    Status e = properties::validate_expect(s.value().expect, file);
    if (!e.is_ok()) return invalid(e.message());
    scenarios.push_back(std::move(s.value()));
  }
  std::vector<sim::RunResult> runs;
  runs.reserve(scenarios.size());
  std::vector<report::ScenarioReport> reports;
  bool all_ok = true;
  bool all_expected = true;
  std::ofstream trace_out;
  if (!f.trace.empty()) {
    trace_out.open(f.trace);
    if (!trace_out) return invalid(f.trace + ": cannot open the trace file for writing");
  }
  auto say = [&](const std::string& line) {
    if (!f.quiet && !f.json) std::cout << line << std::endl;
  };
  sim::DeviceChoice device = sim::DeviceChoice::kAuto;
  if (f.device == "cpu") {
    device = sim::DeviceChoice::kCpu;
  } else if (f.device == "cuda") {
    device = sim::DeviceChoice::kCuda;
  } else if (f.device != "auto") {
    return invalid("--device must be auto, cpu or cuda, got " + f.device);
  }
  for (const auto& s : scenarios) {
    sim::RunOptions options;
    options.device = device;
    if (!f.memory)
      options.checkpoint_dir =
          f.checkpoint_root + "/" + sanitize(s.name.empty() ? s.source : s.name);
    options.progress = [&](const std::string& line) { say("  " + line); };
    say(fmt::format(
        "seed={} revision={} scenario={}", s.seed,
        [&] {
          std::string r;
          for (const auto& p : s.phases) r += (r.empty() ? "" : ",") + p.revision;
          return r;
        }(),
        s.name.empty() ? s.source : s.name));
    auto run = sim::run_scenario(s, registry.value(), options);
    if (!run.is_ok()) return invalid(run.status().message());
    runs.push_back(std::move(run.value()));
    const sim::RunResult& r = runs.back();
    if (trace_out) {
      for (const auto& line : r.trace) trace_out << line << "\n";
    }
    report::ScenarioReport rep;
    rep.run = &r;
    rep.results = properties::check_all(r);
    rep.has_expectations = !s.expect.is_null();
    rep.expectation_mismatches = properties::expectation_mismatches(s.expect, rep.results);
    // --expect on a scenario with no expect block: it is expected to keep every property.
    if (f.expect && !rep.has_expectations && !properties::all_ok(rep.results))
      rep.expectation_mismatches.push_back(
          "no expect block, so every property must hold, and one failed");
    all_ok = all_ok && properties::all_ok(rep.results);
    all_expected = all_expected && rep.expectation_mismatches.empty();
    for (const auto& res : rep.results) {
      say(fmt::format("  {:<13} {} — {}", properties::verdict_name(res.verdict), res.name,
                      res.detail));
    }
    if (f.expect) {
      if (!rep.has_expectations && rep.expectation_mismatches.empty()) {
        say("  expect: no expect block; every property holds, as expected");
      } else if (rep.expectation_mismatches.empty()) {
        say("  expect: verdicts as expected");
      } else {
        for (const auto& m : rep.expectation_mismatches) say("  expect: UNEXPECTED " + m);
      }
    }
    say(fmt::format(
        "  checkpoints: {}; device state on {}; trace hash {:016x}", r.checkpoint_location,
        r.gpu_resident ? "the GPU (CUDA FusedAdam kernel)" : "the CPU (simulated 'cuda')",
        r.trace_hash));
    reports.push_back(std::move(rep));
  }
  if (!f.report.empty()) {
    std::vector<std::string> header = {
        "Generated by `ckptsim run" + std::string(f.expect ? " --expect" : "") + "` over:", ""};
    for (const auto& file : f.files) header.push_back("- `" + file + "`");
    std::ofstream out(f.report);
    if (!out) return invalid(f.report + ": cannot open the report for writing");
    out << report::render(reports, header);
    say("report: " + f.report);
  }
  if (f.json) {
    auto one = [&](const report::ScenarioReport& rep) {
      nlohmann::json j = properties::results_to_json(rep.results);
      const sim::RunResult& r = *rep.run;
      j["scenario"] = r.scenario.name.empty() ? r.scenario.source : r.scenario.name;
      j["file"] = r.scenario.source;
      j["seed"] = r.scenario.seed;
      j["revisions"] = nlohmann::json::array();
      for (const auto& p : r.scenario.phases) j["revisions"].push_back(p.revision);
      j["trace_hash"] = fmt::format("{:016x}", r.trace_hash);
      j["checkpoints"] = r.checkpoint_location;
      j["gpu_resident"] = r.gpu_resident;
      if (rep.has_expectations) j["as_expected"] = rep.expectation_mismatches.empty();
      return j;
    };
    nlohmann::json out;
    if (reports.size() == 1) {
      out = one(reports.front());
    } else {
      out = {{"ok", all_ok}, {"scenarios", nlohmann::json::array()}};
      for (const auto& rep : reports) out["scenarios"].push_back(one(rep));
    }
    std::cout << out.dump(2) << std::endl;
  }
  if (f.expect) return all_expected ? kExitOk : kExitFail;
  return all_ok ? kExitOk : kExitFail;
}

int cmd_revisions(bool json, const std::vector<std::string>& profiles) {
  auto registry = load_registry(profiles);
  if (!registry.is_ok()) return invalid(registry.status().message());
  nlohmann::json out = nlohmann::json::array();
  for (const auto& name : registry.value().names()) {
    auto p = registry.value().get(name);
    if (!p.is_ok()) return invalid(p.status().message());
    const auto& profile = p.value();
    nlohmann::json j{{"name", profile.name},
                     {"extends", profile.extends},
                     {"source", profile.source},
                     {"description", profile.description},
                     {"switches", nlohmann::json::object()}};
    for (const auto& info : model::revision_switch_infos()) {
      j["switches"][info.name] = model::switch_value_text(profile.switches, info.name);
    }
    out.push_back(j);
    if (!json) {
      std::cout << profile.name
                << (profile.extends.empty() ? "" : " (extends " + profile.extends + ")") << "\n  "
                << profile.description << "\n";
      for (const auto& s : profile.explicit_switches) {
        std::cout << "    " << s << " = " << model::switch_value_text(profile.switches, s) << "\n";
      }
    }
  }
  if (json) {
    std::cout << out.dump(2) << std::endl;
  } else {
    std::cout << "\nswitches (defaults are upstream #2874 behavior):\n";
    for (const auto& info : model::revision_switch_infos()) {
      std::cout << "  " << info.name << " (default "
                << model::switch_value_text(model::RevisionSwitches{}, info.name)
                << "): " << info.meaning << "\n";
    }
  }
  return kExitOk;
}

struct SearchFlags {
  uint64_t seed = 1;
  int64_t cases = 500;
  double time_budget = 0;
  std::string out_dir = "ckptsim-found";
  std::string junit;
  bool json = false;
  bool keep_going = true;
  bool quiet = false;
  std::vector<std::string> properties;
  std::vector<std::string> kinds;
  std::vector<std::string> faults;
  std::vector<std::string> profiles;
  int64_t dp_max = 32;
  int params_max = 6;
  int phases_max = 4;
  bool stateful = false;
  int jobs = 0;  // gate: searches at once (0: two where there are two cores)
};

Status fill_generator(const SearchFlags& f, model::RevisionRegistry& registry,
                      properties::GeneratorConfig& g) {
  g.dp_max = f.dp_max;
  g.params_max = f.params_max;
  g.phases_max = f.phases_max;
  g.stateful = f.stateful;
  if (g.dp_max < 1 || g.dp_max > sim::Scenario::kDpMax)
    return Status::invalid_input("--dp-max must be in [1, 512]");
  if (g.params_max < 1 || g.params_max > 64)
    return Status::invalid_input("--params-max must be in [1, 64]");
  if (g.phases_max < 1 || g.phases_max > 16)
    return Status::invalid_input("--phases-max must be in [1, 16]");
  if (!f.kinds.empty()) {
    g.kinds.clear();
    for (const auto& k : f.kinds) {
      if (k == "fused_adam") {
        g.kinds.push_back(model::OptimizerKind::kFusedAdam);
      } else if (k == "torch_adamw") {
        g.kinds.push_back(model::OptimizerKind::kTorchAdamW);
      } else if (k == "hybrid") {
        g.kinds.push_back(model::OptimizerKind::kHybrid);
      } else {
        return Status::invalid_input("--kind must be fused_adam, torch_adamw or hybrid, got " + k);
      }
    }
  }
  for (const auto& fault : f.faults) {
    if (!model::is_fault_site(fault))
      return Status::invalid_input("--fault: unknown fault site " + fault);
  }
  g.faults = f.faults;
  for (const auto& p : f.properties) {
    if (properties::find_property(p) == nullptr)
      return Status::invalid_input("--property: unknown property " + p);
  }
  (void)registry;
  if (f.cases < 0 || f.cases > properties::SearchOptions::kCasesMax) {
    return Status::invalid_input(fmt::format("--cases must be in [0, {}], got {}",
                                             properties::SearchOptions::kCasesMax, f.cases));
  }
  if (!(f.time_budget >= 0))
    return Status::invalid_input("--time-budget must be >= 0 seconds (0: no limit)");
  return Status::ok();
}

// A revision flag's value must name a known profile (or a profile file).
Status check_revision_flag(model::RevisionRegistry& registry, const std::string& flag,
                           const std::string& revision) {
  auto p = registry.get(revision);
  if (!p.is_ok()) return Status::invalid_input(flag + ": " + p.status().message());
  return Status::ok();
}

// The flags that decide what a search draws and judges, as a command line tail: the repeat
// line must run the same search.
std::string search_repeat_flags(const SearchFlags& f) {
  const SearchFlags defaults;
  std::string out = fmt::format(" --seed {} --cases {}", f.seed, f.cases);
  if (f.time_budget > 0) out += fmt::format(" --time-budget {}", f.time_budget);
  for (const auto& p : f.properties) out += " --property " + p;
  for (const auto& k : f.kinds) out += " --kind " + k;
  for (const auto& x : f.faults) out += " --fault " + x;
  for (const auto& x : f.profiles) out += " --profile " + x;
  if (f.dp_max != defaults.dp_max) out += fmt::format(" --dp-max {}", f.dp_max);
  if (f.params_max != defaults.params_max) out += fmt::format(" --params-max {}", f.params_max);
  if (f.phases_max != defaults.phases_max) out += fmt::format(" --phases-max {}", f.phases_max);
  if (f.stateful) out += " --stateful";
  return out;
}

// Output locations are checked before a search that may take minutes, not after it.
Status prepare_out_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir, ec))
    return Status::io_error(dir + ": cannot create the output directory" +
                            (ec ? ": " + ec.message() : ""));
  return Status::ok();
}

// Writes a found scenario and returns its path.
Result<std::string> write_found(const std::string& dir, const properties::Failure& failure,
                                uint64_t seed, const std::string& how,
                                const std::string& tag = "") {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::io_error(dir + ": cannot create: " + ec.message());
  const nlohmann::json j = properties::found_scenario_json(failure, seed, how, tag);
  const std::string path = dir + "/" + j["name"].get<std::string>() + ".json";
  std::ofstream out(path);
  if (!out) return Status::io_error(path + ": cannot write");
  out << j.dump(2) << "\n";
  return path;
}

struct Reported {
  properties::Failure failure;
  std::string file;
  std::string classification;  // gate: "new" / "pre-existing"; check: ""
};

nlohmann::json failure_json(const Reported& r) {
  int64_t dp_max = 0;
  for (const auto& p : r.failure.minimal.phases) dp_max = std::max(dp_max, p.dp);
  nlohmann::json j{{"property", r.failure.finding.property},
                   {"signature", r.failure.finding.signature},
                   {"detail", r.failure.finding.detail},
                   {"scenario_file", r.file},
                   {"case", r.failure.case_index},
                   {"shrink_steps", r.failure.shrink_steps},
                   {"params", r.failure.minimal.params.size()},
                   {"phases", r.failure.minimal.phases.size()},
                   {"dp_max", dp_max}};
  if (!r.classification.empty()) j["classification"] = r.classification;
  return j;
}

int cmd_check(const SearchFlags& f, const std::string& revision) {
  auto registry = load_registry(f.profiles);
  if (!registry.is_ok()) return invalid(registry.status().message());
  properties::SearchOptions options;
  options.generator.revisions = {revision};
  Status s = fill_generator(f, registry.value(), options.generator);
  if (s.is_ok()) s = check_revision_flag(registry.value(), "--revision", revision);
  if (s.is_ok()) s = prepare_out_dir(f.out_dir);
  if (!s.is_ok()) return invalid(s.message());
  std::ofstream junit_out;
  if (!f.junit.empty()) {
    junit_out.open(f.junit);
    if (!junit_out) return invalid(f.junit + ": cannot write the JUnit file");
  }
  options.seed = f.seed;
  options.cases = f.cases;
  options.time_budget_s = f.time_budget;
  options.keep_going = f.keep_going;
  const bool talk = !f.quiet && !f.json;
  options.progress = [&](const std::string& line) {
    if (talk) std::cerr << "check: " << line << std::endl;
  };
  if (talk) {
    std::cout << fmt::format("seed={} revision={} cases={} time_budget={}s{}", f.seed, revision,
                             f.cases, f.time_budget, f.keep_going ? " keep_going" : "")
              << std::endl;
  }
  const auto judge = properties::property_judge(registry.value(), f.properties);
  const properties::SearchResult result = properties::search(options, judge);
  std::vector<Reported> reported;
  const std::string repeat = fmt::format("ckptsim check --revision {}{}{}", revision,
                                         search_repeat_flags(f), f.keep_going ? "" : " --first");
  const std::string& how = repeat;
  for (const auto& failure : result.failures) {
    auto path = write_found(f.out_dir, failure, f.seed, how);
    if (!path.is_ok()) return invalid(path.status().message());
    reported.push_back({failure, path.value(), ""});
  }
  if (talk) {
    std::cout << fmt::format("{} cases ({} simulator runs){}: {} failure(s)", result.cases_run,
                             result.judge_runs,
                             result.stopped_by_time ? ", stopped by the time budget" : "",
                             reported.size())
              << std::endl;
    for (const auto& r : reported) {
      std::cout << fmt::format(
          "  FAIL {} [{}]\n    {}\n    minimal scenario: {} ({} params, {} phases)\n    replay: "
          "ckptsim run {}\n",
          r.failure.finding.property, r.failure.finding.signature, r.failure.finding.detail, r.file,
          r.failure.minimal.params.size(), r.failure.minimal.phases.size(), r.file);
    }
    std::cout << "  repeat the search: " << repeat << std::endl;
  }
  std::vector<properties::JunitCase> cases;
  for (const auto& p : properties::all_properties()) {
    properties::JunitCase c{"ckptsim.check." + revision, p.name, false, "", ""};
    for (const auto& r : reported) {
      if (r.failure.finding.property != p.name) continue;
      c.failed = true;
      c.message = r.failure.finding.detail;
      c.text += fmt::format("{}\nminimal scenario: {}\nreplay: ckptsim run {}\nrepeat: {}\n\n",
                            r.failure.finding.detail, r.file, r.file, repeat);
    }
    cases.push_back(c);
  }
  if (junit_out) junit_out << properties::junit_xml("ckptsim check " + revision, cases);
  if (f.json) {
    nlohmann::json j{{"ok", reported.empty()},
                     {"seed", f.seed},
                     {"revision", revision},
                     {"cases", result.cases_run},
                     {"simulator_runs", result.judge_runs},
                     {"stopped_by_time", result.stopped_by_time},
                     {"repeat", repeat},
                     {"failures", nlohmann::json::array()},
                     {"properties", nlohmann::json::array()}};
    for (const auto& r : reported) j["failures"].push_back(failure_json(r));
    for (const auto& c : cases)
      j["properties"].push_back({{"name", c.name}, {"ok", !c.failed}, {"detail", c.message}});
    std::cout << j.dump(2) << std::endl;
  }
  return reported.empty() ? kExitOk : kExitFail;
}

// The gate's judge: a failure of the candidate-involving scenario is "new" unless the same
// scenario with every phase on the baseline fails the same property too.
properties::Judge gate_judge(model::RevisionRegistry& registry, const std::string& baseline,
                             const std::vector<std::string>& only) {
  auto plain = properties::property_judge(registry, only);
  return [&registry, plain,
          baseline](const sim::Scenario& s) -> std::optional<properties::Finding> {
    auto finding = plain(s);
    if (!finding) return std::nullopt;
    sim::Scenario base = s;
    for (auto& p : base.phases) p.revision = baseline;
    auto run = sim::run_scenario(base, registry);
    CKPTSIM_CHECK(run.is_ok(), run.status().to_string());
    // Candidate code failing: pre-existing only when the all-baseline run fails the same way
    // (same property and cause). Baseline code failing on a checkpoint the candidate wrote:
    // pre-existing when the all-baseline run fails that property at all (the baseline's own
    // bug), else new — the baseline can no longer resume from the candidate's checkpoint.
    const auto* prop = properties::find_property(finding->property);
    const properties::PropertyResult base_result = prop->check(run.value());
    const bool base_fails = base_result.verdict == properties::Verdict::kFail;
    const bool same_cause =
        (base_result.signature.empty() ? base_result.name : base_result.signature) ==
        finding->signature;
    const bool in_baseline_code = finding->phase_revision == baseline;
    const bool pre_existing = base_fails && (same_cause || in_baseline_code);
    std::string cls = pre_existing ? "pre-existing:" : (in_baseline_code ? "new-compat:" : "new:");
    // The all-baseline run never got far enough to judge the property (it failed earlier, e.g.
    // at a load the candidate gets through): new or not cannot be told.
    if (base_result.verdict == properties::Verdict::kNotEvaluated) cls = "unresolved:";
    finding->signature = cls + finding->signature;
    return finding;
  };
}

int cmd_gate(const SearchFlags& f, const std::string& baseline, const std::string& candidate) {
  auto registry = load_registry(f.profiles);
  if (!registry.is_ok()) return invalid(registry.status().message());
  if (f.out_dir.empty()) return invalid("--out is required");
  properties::SearchOptions base_options;
  base_options.generator.revisions = {baseline, candidate};
  Status s = fill_generator(f, registry.value(), base_options.generator);
  if (s.is_ok()) s = check_revision_flag(registry.value(), "--baseline", baseline);
  if (s.is_ok()) s = check_revision_flag(registry.value(), "--candidate", candidate);
  if (s.is_ok()) s = prepare_out_dir(f.out_dir);
  if (!s.is_ok()) return invalid(s.message());
  base_options.seed = f.seed;
  base_options.cases = f.cases;
  // The two searches run at once where there are two cores (each gets the whole budget), else
  // one after the other (half each).
  const bool concurrent = f.jobs == 0 ? std::thread::hardware_concurrency() >= 2 : f.jobs == 2;
  base_options.time_budget_s =
      f.time_budget > 0 ? (concurrent ? f.time_budget : f.time_budget / 2) : 0;
  base_options.keep_going = true;
  const bool talk = !f.quiet && !f.json;
  if (talk) {
    std::cout << fmt::format("seed={} baseline={} candidate={} cases={} per search", f.seed,
                             baseline, candidate, f.cases)
              << std::endl;
  }
  const auto judge = gate_judge(registry.value(), baseline, f.properties);
  struct Part {
    std::string name;
    properties::SearchOptions options;
    properties::SearchResult result;
  };
  std::vector<Part> parts;
  // 1. The search on the candidate alone.
  parts.push_back({"candidate", base_options, {}});
  parts.back().options.generator.revisions = {candidate};
  // 2. Cross-revision loads: checkpoints saved by one, resumed by the other, both ways.
  parts.push_back({"cross-revision", base_options, {}});
  parts.back().options.generator.require_revision_change = true;
  parts.back().options.seed = model::mix_seed(f.seed, 2);
  std::mutex talk_mutex;
  for (auto& part : parts) {
    part.options.progress = [&](const std::string& line) {
      if (!talk) return;
      std::lock_guard lock(talk_mutex);
      std::cerr << "gate " << part.name << ": " << line << std::endl;
    };
  }
  if (concurrent) {
    std::vector<std::thread> threads;
    for (auto& part : parts) {
      threads.emplace_back(
          [&part, &judge] { part.result = properties::search(part.options, judge); });
    }
    for (auto& t : threads) t.join();
  } else {
    for (auto& part : parts) part.result = properties::search(part.options, judge);
  }
  const std::string repeat = fmt::format("ckptsim gate --baseline {} --candidate {} --out {}{}",
                                         baseline, candidate, f.out_dir, search_repeat_flags(f));
  std::vector<Reported> reported;
  for (auto& part : parts) {
    for (const auto& failure : part.result.failures) {
      const bool is_new = failure.finding.signature.rfind("new", 0) == 0;
      auto path = write_found(f.out_dir, failure, f.seed, fmt::format("{} ({})", repeat, part.name),
                              part.name);
      if (!path.is_ok()) return invalid(path.status().message());
      const bool compat = failure.finding.signature.rfind("new-compat:", 0) == 0;
      const bool unresolved = failure.finding.signature.rfind("unresolved:", 0) == 0;
      reported.push_back({failure, path.value(),
                          unresolved ? "unresolved"
                          : is_new   ? (compat ? "new (the baseline cannot resume from it)" : "new")
                                     : "pre-existing"});
    }
  }
  const bool introduced = std::any_of(reported.begin(), reported.end(), [](const Reported& r) {
    return r.classification.rfind("new", 0) == 0;
  });

  // Markdown report.
  std::string md = fmt::format("# ckptsim gate: {} → {}\n\n", baseline, candidate);
  md += fmt::format("Verdict: **{}**.\n\n",
                    introduced ? "the candidate introduces failures" : "no new failure found");
  md += fmt::format("Repeat: `{}`\n\n", repeat);
  md += fmt::format(
      "| search | cases | simulator runs | findings | seconds ({}) | of which shrinking |\n",
      concurrent ? "the two at once" : "one after the other");
  md += "|---|---|---|---|---|---|\n";
  for (const auto& part : parts) {
    md +=
        fmt::format("| {} | {}{} | {} | {} | {:.1f} | {:.1f} |\n", part.name, part.result.cases_run,
                    part.result.stopped_by_time ? " (time budget)" : "", part.result.judge_runs,
                    part.result.failures.size(), part.result.seconds, part.result.shrink_seconds);
  }
  md +=
      "\n| class | property | minimal scenario | params | phases | detail "
      "|\n|---|---|---|---|---|---|\n";
  for (const auto& r : reported) {
    const std::string detail = report::md_escape(r.failure.finding.detail);
    md += fmt::format(
        "| {} | {} | `{}` | {} | {} | {} |\n",
        r.classification.rfind("new", 0) == 0 ? "**" + r.classification + "**" : r.classification,
        r.failure.finding.property, r.file, r.failure.minimal.params.size(),
        r.failure.minimal.phases.size(), detail);
  }
  if (reported.empty()) md += "| — | — | — | — | — | no failure found |\n";
  md +=
      "\n\"new\": the candidate fails a property that the same scenario run entirely on the "
      "baseline keeps (or "
      "fails differently). \"new (the baseline cannot resume from it)\": a phase running the "
      "baseline fails on a "
      "checkpoint the candidate wrote, while the all-baseline run keeps the property. "
      "\"pre-existing\": the "
      "baseline fails it too. \"unresolved\": the all-baseline run stops before it can judge "
      "that property (e.g. its own load fails), so new or not cannot be told (not counted as "
      "new). Replay any finding with `ckptsim run <file>`.\n";
  std::error_code ec;
  std::filesystem::create_directories(f.out_dir, ec);
  {
    std::ofstream out(f.out_dir + "/gate-report.md");
    if (!out) return invalid(f.out_dir + "/gate-report.md: cannot write");
    out << md;
  }
  std::vector<properties::JunitCase> cases;
  for (const auto& r : reported) {
    cases.push_back({"ckptsim.gate." + r.classification.substr(0, r.classification.find(' ')),
                     r.failure.finding.property + " (" + r.file + ")",
                     r.classification.rfind("new", 0) == 0, r.failure.finding.detail,
                     fmt::format("{}\nreplay: ckptsim run {}\nrepeat: {}\n",
                                 r.failure.finding.detail, r.file, repeat)});
  }
  if (cases.empty()) cases.push_back({"ckptsim.gate", "no new failure", false, "", ""});
  {
    std::ofstream out(f.out_dir + "/junit.xml");
    if (!out) return invalid(f.out_dir + "/junit.xml: cannot write");
    out << properties::junit_xml(fmt::format("ckptsim gate {} -> {}", baseline, candidate), cases);
  }
  if (talk) {
    for (const auto& r : reported) {
      std::cout << fmt::format(
          "  {} {} [{}]\n    {}\n    minimal scenario: {} ({} params, {} phases)\n",
          r.classification.rfind("new", 0) == 0 ? "NEW" + r.classification.substr(3)
                                                : r.classification,
          r.failure.finding.property, r.failure.finding.signature, r.failure.finding.detail, r.file,
          r.failure.minimal.params.size(), r.failure.minimal.phases.size());
    }
    std::cout << "report: " << f.out_dir << "/gate-report.md, " << f.out_dir << "/junit.xml"
              << std::endl;
  }
  if (f.json) {
    nlohmann::json j{{"ok", !introduced},      {"baseline", baseline},
                     {"candidate", candidate}, {"seed", f.seed},
                     {"repeat", repeat},       {"findings", nlohmann::json::array()}};
    for (const auto& r : reported) j["findings"].push_back(failure_json(r));
    std::cout << j.dump(2) << std::endl;
  }
  return introduced ? kExitFail : kExitOk;
}

// CLI::NonNegativeNumber's message prints the largest double; this one says what is wrong.
const CLI::Validator kNotNegative(
    [](std::string& in) -> std::string {
      const size_t first = in.find_first_not_of(" \t");
      return first != std::string::npos && in[first] == '-' ? "must not be negative, got " + in
                                                            : std::string();
    },
    "NONNEGATIVE");

void add_search_flags(CLI::App* cmd, SearchFlags& f) {
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
  cmd->add_option("--dp-max", f.dp_max, "Largest DP size drawn (default 32)");
  cmd->add_option("--params-max", f.params_max, "Most params drawn (default 6)");
  cmd->add_option("--phases-max", f.phases_max, "Most phases drawn (default 4)");
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
  RunFlags run_flags;
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

  SearchFlags check_flags;
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

  SearchFlags gate_flags;
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
    return code == 0 ? kExitOk : kExitInvalid;
  }
  try {
    if (*run) return cmd_run(run_flags);
    if (*revisions) return cmd_revisions(rev_json, rev_profiles);
    if (*check) {
      check_flags.keep_going = !check_first;
      return cmd_check(check_flags, check_revision);
    }
    if (*gate) return cmd_gate(gate_flags, baseline, candidate);
  } catch (const std::exception& e) {
    std::cerr << "ckptsim: internal error (a bug in ckptsim, not a verdict on the scenario): "
              << e.what() << "\n";
    return kExitInternal;
  }
  return kExitInvalid;
}
