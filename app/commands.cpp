#include "app/commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/confirm.h"
#include "app/search_support.h"
#include "app/shard.h"
#include "model/faults.h"
#include "model/revision.h"
#include "properties/conformance.h"
#include "properties/expect.h"
#include "properties/properties.h"
#include "report/conformance_report.h"
#include "report/json.h"
#include "report/plot.h"
#include "report/run_report.h"
#include "report/search_report.h"
#include "report/trace_file.h"
#include "report/trace_json.h"
#include "search/gate.h"
#include "search/search.h"
#include "sim/driver.h"
#include "sim/scenario.h"

namespace ckptsim::app {

static_assert(kJobsMax == search::SearchOptions::kJobsMax);

// The helpers of the commands; those app/search_support.h declares are shared with
// app/real_commands.cpp.
namespace detail {

int invalid(std::ostream& err, const std::string& message) {
  err << "ckptsim: " << message << "\n";
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

// ---------------------------------------------------------------------------------------------
// plots

// `target` as a link from the Markdown file `report`.
std::string relative_link(const std::string& report, const std::string& target) {
  namespace fs = std::filesystem;
  const fs::path base = fs::absolute(report).parent_path().lexically_normal();
  return fs::absolute(target).lexically_normal().lexically_relative(base).generic_string();
}

// Draws one picture of a run (and a real trace of it); 0, or the exit code after the message.
int write_plot(const sim::RunResult& run, const nlohmann::json* real, const std::string& real_name,
               const std::vector<std::string>& notes, const report::PlotFiles& files,
               std::ostream& err) {
  const nlohmann::json model = report::trace_json(run, /*values=*/true);
  auto spec = report::plot_spec({&model, real, real_name, notes});
  if (!spec.is_ok()) return invalid(err, spec.status().message());
  auto drawn = report::render_plot(spec.value(), files);
  if (!drawn.is_ok()) return invalid(err, drawn.status().message());
  const report::GnuplotRun& g = drawn.value();
  if (g.outcome == report::GnuplotOutcome::kMissing)
    return invalid(err, std::string(report::kGnuplotMissing) + " (" + g.output + ")");
  if (g.outcome == report::GnuplotOutcome::kFailed) {
    err << "ckptsim: internal error: gnuplot failed on the script ckptsim wrote for " << files.png
        << ":\n"
        << g.output << std::endl;
    return kExitInternal;
  }
  if (!g.output.empty()) err << "gnuplot (" << files.png << "): " << g.output << std::flush;
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// run

// A scenario read from its file, with its expectation parsed.
struct LoadedScenario {
  sim::Scenario scenario;
  std::optional<properties::Expectation> expect;
};

Result<std::vector<LoadedScenario>> load_scenarios(const RunCommand& c,
                                                   model::RevisionRegistry& registry) {
  std::vector<LoadedScenario> out;
  for (const auto& file : c.files) {
    auto s = sim::load_scenario_file(file, registry);
    if (!s.is_ok()) return s.status();
    auto e = properties::parse_expectation(s.value().expect, file);
    if (!e.is_ok()) return e.status();
    out.push_back({std::move(s.value()), std::move(e.value())});
  }
  return out;
}

Result<sim::DeviceChoice> device_choice(const std::string& device) {
  if (device == "auto") return sim::DeviceChoice::kAuto;
  if (device == "cpu") return sim::DeviceChoice::kCpu;
  if (device == "cuda") return sim::DeviceChoice::kCuda;
  return Status::invalid_input("--device must be auto, cpu or cuda, got " + device);
}

// The verdicts of one run and, with an expect block (or --expect), how they compare.
report::ScenarioReport judge(const RunCommand& c, const LoadedScenario& s,
                             const sim::RunResult& run) {
  report::ScenarioReport rep;
  rep.run = &run;
  rep.results = properties::check_all(run);
  rep.has_expectations = s.expect.has_value();
  if (s.expect) rep.expectation_mismatches = expectation_mismatches(*s.expect, rep.results);
  // --expect on a scenario with no expect block: it is expected to keep every property.
  if (c.expect && !rep.has_expectations && !properties::all_ok(rep.results)) {
    rep.expectation_mismatches.push_back(
        "no expect block, so every property must hold, and one failed");
  }
  return rep;
}

void say_verdicts(const RunCommand& c, const report::ScenarioReport& rep, std::ostream& out) {
  for (const auto& res : rep.results) {
    out << fmt::format("  {:<13} {} — {}", properties::verdict_name(res.verdict), res.name,
                       res.detail)
        << std::endl;
  }
  if (c.expect) {
    if (!rep.has_expectations && rep.expectation_mismatches.empty()) {
      out << "  expect: no expect block; every property holds, as expected" << std::endl;
    } else if (rep.expectation_mismatches.empty()) {
      out << "  expect: verdicts as expected" << std::endl;
    } else {
      for (const auto& m : rep.expectation_mismatches)
        out << "  expect: UNEXPECTED " << m << std::endl;
    }
  }
  const sim::RunResult& r = *rep.run;
  out << fmt::format(
             "  checkpoints: {}; device state on {}; trace hash {:016x}", r.checkpoint_location,
             r.gpu_resident ? "the GPU (CUDA FusedAdam kernel)" : "the CPU (simulated 'cuda')",
             r.trace_hash)
      << std::endl;
}

// Where a scenario's file of `kind` goes: `path` itself for one scenario, else
// <path>/<scenario><suffix> (the directory is created).
Result<std::string> output_path(const std::string& path, size_t scenarios, const std::string& name,
                                const std::string& suffix) {
  if (scenarios == 1 && !std::filesystem::is_directory(path)) return path;
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return Status::io_error(path + ": cannot create the directory: " + ec.message());
  return path + "/" + sanitize(name) + suffix;
}

Status write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  if (!out) return Status::io_error(path + ": cannot write");
  out << j.dump() << "\n";
  return out ? Status::ok() : Status::io_error(path + ": cannot write");
}

Status write_run_outputs(const RunCommand& c, const std::vector<report::ScenarioReport>& reports,
                         std::ostream& out) {
  if (!c.trace_json.empty()) {
    for (const auto& rep : reports) {
      auto path = output_path(c.trace_json, reports.size(), rep.run->scenario.name, ".trace.json");
      if (!path.is_ok()) return path.status();
      if (Status s = write_json(path.value(), report::trace_json(*rep.run, c.trace_values));
          !s.is_ok())
        return s;
    }
  }
  if (!c.report.empty()) {
    std::vector<std::string> header = {
        "Generated by `ckptsim run" + std::string(c.expect ? " --expect" : "") + "` over:", ""};
    for (const auto& file : c.files) header.push_back("- `" + file + "`");
    std::ofstream file(c.report);
    if (!file) return Status::io_error(c.report + ": cannot open the report for writing");
    file << report::render(reports, header);
    if (!c.quiet && !c.json) out << "report: " << c.report << std::endl;
  }
  if (c.json) {
    nlohmann::json j;
    if (reports.size() == 1) {
      j = report::scenario_json(reports.front());
    } else {
      bool ok = true;
      for (const auto& rep : reports) ok = ok && properties::all_ok(rep.results);
      j = {{"ok", ok}, {"scenarios", nlohmann::json::array()}};
      for (const auto& rep : reports) j["scenarios"].push_back(report::scenario_json(rep));
    }
    out << j.dump(2) << std::endl;
  }
  return Status::ok();
}

// A picture of every scenario that fails a property; the report links it.
int write_run_plots(const RunCommand& c, std::vector<report::ScenarioReport>& reports,
                    std::ostream& out, std::ostream& err) {
  if (c.plots.empty()) return kExitOk;
  for (auto& rep : reports) {
    if (properties::all_ok(rep.results)) continue;
    const std::string png = c.plots + "/" + sanitize(rep.run->scenario.name) + ".png";
    if (int code = write_plot(*rep.run, nullptr, "", {}, {png}, err); code != kExitOk) return code;
    if (!c.report.empty()) rep.plot = relative_link(c.report, png);
    if (!c.quiet && !c.json) out << "plot: " << png << std::endl;
  }
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// check and gate

// The flags that decide what a search draws and judges, as a command line tail: the repeat
// line must run the same search.
std::string search_repeat_flags(const SearchCommand& c) {
  const SearchCommand defaults;
  std::string out = fmt::format(" --seed {} --cases {}", c.seed, c.cases);
  if (c.time_budget > 0) out += fmt::format(" --time-budget {}", c.time_budget);
  for (const auto& p : c.properties) out += " --property " + p;
  for (const auto& k : c.kinds) out += " --kind " + k;
  for (const auto& t : c.transformer_engine) out += " --transformer-engine " + t;
  for (const auto& t : c.sharding_types) out += " --sharding-type " + t;
  for (const auto& d : c.state_dtypes) out += " --state-dtype " + d;
  for (const auto& x : c.faults) out += " --fault " + x;
  for (const auto& x : c.profiles) out += " --profile " + x;
  if (c.dp_max != defaults.dp_max) out += fmt::format(" --dp-max {}", c.dp_max);
  if (c.tp_max != defaults.tp_max) out += fmt::format(" --tp-max {}", c.tp_max);
  if (c.pp_max != defaults.pp_max) out += fmt::format(" --pp-max {}", c.pp_max);
  if (c.ep_max != defaults.ep_max) out += fmt::format(" --ep-max {}", c.ep_max);
  if (c.params_max != defaults.params_max) out += fmt::format(" --params-max {}", c.params_max);
  if (c.phases_max != defaults.phases_max) out += fmt::format(" --phases-max {}", c.phases_max);
  if (c.steps_max != defaults.steps_max) out += fmt::format(" --steps-max {}", c.steps_max);
  if (c.long_steps_max != defaults.long_steps_max) {
    out += fmt::format(" --long-steps-max {}", c.long_steps_max);
  }
  if (c.stateful) out += " --stateful";
  if (c.fault_space != defaults.fault_space) out += " --fault-space " + c.fault_space;
  return out;
}

// --jobs: 0 is every core.
int all_jobs(int jobs) {
  if (jobs > 0) return jobs;
  const unsigned cores = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp<unsigned>(cores, 1, search::SearchOptions::kJobsMax));
}

// --kind and --state-dtype: the optimizer kinds and the precision-aware state dtypes (bf16,
// fp16) a search draws.
Status parse_optimizers(const SearchCommand& c, search::GeneratorConfig& g) {
  if (!c.kinds.empty()) {
    g.kinds.clear();
    for (const auto& k : c.kinds) {
      const auto kind = model::parse_optimizer_kind(k);
      if (!kind.has_value()) {
        return Status::invalid_input("--kind must be " + model::optimizer_kind_names() + ", got " +
                                     k);
      }
      g.kinds.push_back(*kind);
    }
  }
  for (const auto& d : c.state_dtypes) {
    const auto dtype = model::parse_state_dtype(d);
    if (!dtype.has_value() || *dtype == model::StateDType::kFloat32)
      return Status::invalid_input("--state-dtype must be bf16 or fp16, got " + d);
    g.state_dtypes.push_back(*dtype);
  }
  return Status::ok();
}

// The search options a command's flags give, revisions aside. Every flag's range is checked.
Result<search::SearchOptions> search_options(const SearchCommand& c) {
  search::SearchOptions o;
  search::GeneratorConfig& g = o.generator;
  g.dp_max = c.dp_max;
  g.tp_max = c.tp_max;
  g.pp_max = c.pp_max;
  g.ep_max = c.ep_max;
  g.params_max = c.params_max;
  g.phases_max = c.phases_max;
  g.steps_max = c.steps_max;
  g.long_steps_max = c.long_steps_max;
  g.stateful = c.stateful;
  g.faults = c.faults;
  if (c.fault_space != "none" && c.fault_space != "storage") {
    return Status::invalid_input("--fault-space must be none or storage, got " + c.fault_space);
  }
  g.storage_faults = c.fault_space == "storage";
  if (g.storage_faults && g.stateful) {
    return Status::invalid_input("--fault-space storage does not combine with --stateful");
  }
  if (Status s = parse_optimizers(c, g); !s.is_ok()) return s;
  if (!c.transformer_engine.empty()) {
    g.te_installed.clear();
    for (const auto& t : c.transformer_engine) {
      const auto installed = model::parse_te_presence(t);
      if (!installed.has_value())
        return Status::invalid_input("--transformer-engine must be installed or absent, got " + t);
      g.te_installed.push_back(*installed);
    }
  }
  for (const auto& t : c.sharding_types) {
    const auto type = model::parse_sharding_type(t);
    if (!type.has_value() || *type == model::ShardingType::kFullyShardedModelSpace) {
      return Status::invalid_input(
          "--sharding-type must be dp_reshardable, fully_reshardable or dp_zero_gather_scatter "
          "(no training loop saves fully_sharded_model_space), got " +
          t);
    }
    g.sharding_types.push_back(*type);
  }
  if (Status s = g.validate(); !s.is_ok()) return s;
  for (const auto& p : c.properties) {
    if (properties::find_property(p) == nullptr)
      return Status::invalid_input("--property: unknown property " + p);
  }
  if (c.cases < 0 || c.cases > search::SearchOptions::kCasesMax) {
    return Status::invalid_input(fmt::format("--cases must be in [0, {}], got {}",
                                             search::SearchOptions::kCasesMax, c.cases));
  }
  if (!(c.time_budget >= 0))
    return Status::invalid_input("--time-budget must be >= 0 seconds (0: no limit)");
  if (c.jobs < 0 || c.jobs > search::SearchOptions::kJobsMax) {
    return Status::invalid_input(fmt::format("--jobs must be in [0, {}] (0: every core), got {}",
                                             search::SearchOptions::kJobsMax, c.jobs));
  }
  o.seed = c.seed;
  o.cases = c.cases;
  o.time_budget_s = c.time_budget;
  o.keep_going = c.keep_going;
  o.jobs = all_jobs(c.jobs);
  if (c.schedule != "dear-first" && c.schedule != "in-order") {
    return Status::invalid_input(
        fmt::format("--schedule must be dear-first or in-order, got {}", c.schedule));
  }
  o.dear_first = c.schedule == "dear-first";
  o.record_case_times = !c.case_times.empty();
  return o;
}

// A revision flag's value must name a known profile (or a profile file).
Result<sim::Revision> revision_flag(model::RevisionRegistry& registry, const std::string& flag,
                                    const std::string& revision) {
  auto r = sim::resolve_revision(registry, revision);
  if (!r.is_ok()) return Status::invalid_input(flag + ": " + r.status().message());
  return r;
}

// Writes every failure's minimal scenario; the reported failures in order.
Result<std::vector<report::ReportedFailure>> write_failures(
    const SearchCommand& c, const std::vector<const search::Failure*>& failures,
    const std::vector<std::string>& hows, const std::vector<std::string>& tags) {
  std::vector<report::ReportedFailure> reported;
  for (size_t i = 0; i < failures.size(); ++i) {
    auto path = search::write_found(c.out_dir, *failures[i], c.seed, hows[i], tags[i]);
    if (!path.is_ok()) return path.status();
    reported.push_back({failures[i], path.value(), "", false, std::nullopt});
  }
  return reported;
}

Status write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) return Status::io_error(path + ": cannot write");
  out << text;
  return Status::ok();
}

// "    real code: <sentence>\n" when the finding was replayed on the real code, else "".
std::string real_code_line(const report::ReportedFailure& r) {
  return r.real_code ? "    real code: " + r.real_code->text + "\n" : "";
}

void say_gate_findings(const std::vector<report::ReportedFailure>& reported, std::ostream& out) {
  for (const auto& r : reported) {
    const search::Failure& f = *r.failure;
    out << fmt::format("  {} {} [{}]\n    {}\n    minimal scenario: {} ({} params, {} phases)\n{}",
                       r.counts_as_new ? "NEW" + r.classification.substr(3) : r.classification,
                       f.finding.property, f.finding.signature, f.finding.detail, r.file,
                       f.minimal.params.size(), f.minimal.phases.size(), real_code_line(r));
  }
}

void say_check_findings(const search::SearchResult& result,
                        const std::vector<report::ReportedFailure>& reported,
                        const std::string& repeat, std::ostream& out) {
  out << fmt::format("{} cases ({} simulator runs){}: {} failure(s)", result.cases_run,
                     result.judge_runs,
                     result.stopped_by_time ? ", stopped by the time budget" : "", reported.size())
      << std::endl;
  for (const auto& r : reported) {
    const search::Finding& f = r.failure->finding;
    out << fmt::format(
        "  FAIL {} [{}]\n    {}\n    minimal scenario: {} ({} params, {} phases)\n    replay: "
        "ckptsim run {}\n{}",
        f.property, f.signature, f.detail, r.file, r.failure->minimal.params.size(),
        r.failure->minimal.phases.size(), r.file, real_code_line(r));
  }
  out << "  repeat the search: " << repeat << std::endl;
}

// What is checked before a search starts: where its outputs go, and the --megatron options.
Status prepare_search_outputs(const SearchCommand& c, const model::RevisionRegistry& registry) {
  const RealSearchOptions defaults;
  const RealSearchOptions& r = c.real;
  if (!r.enabled && (!r.baseline_megatron.empty() || !r.candidate_megatron.empty() ||
                     !r.profile_of.empty() || r.no_model || r.run_timeout != defaults.run_timeout ||
                     r.scenario_timeout != defaults.scenario_timeout || !r.work_dir.empty() ||
                     r.keep_all || r.prestart_dp != defaults.prestart_dp ||
                     r.shrink_runs_max != defaults.shrink_runs_max || r.shrink_pre_existing)) {
    return Status::invalid_input(
        "--baseline-megatron, --candidate-megatron, --profile-of, --no-model, --run-timeout, "
        "--scenario-timeout, --prestart-dp, --shrink-runs-max, --shrink-pre-existing, --work-dir "
        "and --keep-all need --real");
  }
  if (c.real_code.enabled()) {
    if (Status s = validate_real_code(c.real_code, registry); !s.is_ok()) return s;
  } else if (!c.real_code.replay_args.empty() || !c.real_code.replay_dir.empty()) {
    return Status::invalid_input(
        "--replay-arg and --replay-dir need --megatron or --megatron-root (the checkout to replay "
        "on)");
  }
  if (Status s = search::prepare_out_dir(c.out_dir); !s.is_ok()) return s;
  if (!c.junit.empty()) {
    std::ofstream junit_out(c.junit);
    if (!junit_out) return Status::io_error(c.junit + ": cannot write the JUnit file");
  }
  return Status::ok();
}

Status write_check_junit(const SearchCommand& c, const std::string& revision,
                         const std::vector<report::ReportedFailure>& reported,
                         const std::string& repeat) {
  if (c.junit.empty()) return Status::ok();
  return write_text(c.junit,
                    report::junit_xml("ckptsim check " + revision,
                                      report::check_junit_cases(revision, reported, repeat)));
}

// gate-report.md and junit.xml in the gate's --out.
Status write_gate_files(const SearchCommand& c, const GateNames& n,
                        const search::GateResult& result,
                        const std::vector<report::ReportedFailure>& reported) {
  const std::string md = report::gate_markdown(n.baseline, n.candidate, n.repeat, result, reported);
  if (Status s = write_text(c.out_dir + "/gate-report.md", md); !s.is_ok()) return s;
  return write_text(c.out_dir + "/junit.xml",
                    report::junit_xml(fmt::format("ckptsim gate {} -> {}", n.baseline, n.candidate),
                                      report::gate_junit_cases(reported, n.repeat)));
}

// With --megatron: replays every minimal scenario written on the real code and sets each one's
// real_code (app/confirm.h). False when there was nothing to do.
bool confirm_found(const SearchCommand& c, model::RevisionRegistry& registry,
                   const std::string& command, std::vector<report::ReportedFailure>& reported,
                   std::ostream& err) {
  // With --real every finding is the real code's already (app/real_engine.h).
  if (c.real.enabled || !c.real_code.enabled() || reported.empty()) return false;
  const bool talk = !c.quiet && !c.json;
  ConfirmContext ctx{c.real_code, c.out_dir, &registry, [&](const std::string& line) {
                       if (talk) err << command << ": " << line << std::endl;
                     }};
  const std::string runner = confirm_on_real_code(ctx, reported);
  if (talk && !runner.empty()) err << command << ": the runner was: " << runner << std::endl;
  return true;
}

// <out>/ckptsim-summary.json, for `ckptsim merge`.
Status write_check_summary(const SearchCommand& c, const CheckNames& n,
                           const search::SearchResult& result,
                           const std::vector<report::ReportedFailure>& reported) {
  report::CheckSummary s{n.revision,   c.seed, n.whole, n.repeat, n.shard,
                         c.keep_going, n.jobs, result,  {}};
  return write_json(c.out_dir + "/" + report::kCheckSummaryFile,
                    report::check_summary_json(s, reported));
}

// The outputs of check and merge: the minimal scenarios, the JUnit file, the summary, and the
// console or JSON; the exit code.
int report_check(const SearchCommand& c, const CheckNames& n, const search::SearchResult& result,
                 model::RevisionRegistry& registry, std::ostream& out, std::ostream& err,
                 const Annotate& annotate) {
  std::vector<const search::Failure*> failures;
  for (const auto& f : result.failures) failures.push_back(&f);
  auto reported = write_failures(c, failures, std::vector<std::string>(failures.size(), n.whole),
                                 std::vector<std::string>(failures.size()));
  if (!reported.is_ok()) return invalid(err, reported.status().message());
  if (annotate) annotate(reported.value());
  // The JUnit file is written before the real code is asked (a runner that hangs loses nothing)
  // and again after, with its answers.
  if (Status s = write_check_junit(c, n.revision, reported.value(), n.repeat); !s.is_ok())
    return invalid(err, s.message());
  if (Status s = write_check_summary(c, n, result, reported.value()); !s.is_ok())
    return invalid(err, s.message());
  if (confirm_found(c, registry, "check", reported.value(), err)) {
    if (Status s = write_check_junit(c, n.revision, reported.value(), n.repeat); !s.is_ok())
      return invalid(err, s.message());
  }
  const bool talk = !c.quiet && !c.json;
  if (talk) say_check_findings(result, reported.value(), n.repeat, out);
  if (talk && c.coverage) out << result.coverage.text();
  if (c.json) {
    const auto cases = report::check_junit_cases(n.revision, reported.value(), n.repeat);
    nlohmann::json j =
        report::check_json(n.revision, c.seed, result, n.repeat, reported.value(), cases);
    if (c.coverage) j["coverage"] = result.coverage.json();
    out << j.dump(2) << std::endl;
  }
  return reported.value().empty() ? kExitOk : kExitFail;
}

// Each gate finding's minimal scenario written, with its class.
Result<std::vector<report::ReportedFailure>> write_gate_findings(const SearchCommand& c,
                                                                 const search::GateResult& result,
                                                                 const std::string& repeat) {
  std::vector<const search::Failure*> failures;
  std::vector<std::string> hows;
  std::vector<std::string> tags;
  const auto findings = result.findings();
  for (const auto& f : findings) {
    failures.push_back(f.failure);
    hows.push_back(fmt::format("{} ({})", repeat, f.part));
    tags.push_back(f.part);
  }
  auto reported = write_failures(c, failures, hows, tags);
  if (!reported.is_ok()) return reported.status();
  for (size_t i = 0; i < findings.size(); ++i) {
    reported.value()[i].classification = search::gate_class_name(findings[i].gate_class);
    reported.value()[i].counts_as_new = search::counts_as_new(findings[i].gate_class);
  }
  return reported;
}

}  // namespace detail

using namespace detail;  // NOLINT(google-build-using-namespace): this file's own helpers

int run_command(const RunCommand& c, std::ostream& out, std::ostream& err) {
  auto registry = load_registry(c.profiles);
  if (!registry.is_ok()) return invalid(err, registry.status().message());
  auto scenarios = load_scenarios(c, registry.value());
  if (!scenarios.is_ok()) return invalid(err, scenarios.status().message());
  auto device = device_choice(c.device);
  std::ofstream trace_out;
  if (!c.trace.empty()) {
    trace_out.open(c.trace);
    if (!trace_out) return invalid(err, c.trace + ": cannot open the trace file for writing");
  }
  if (!device.is_ok()) return invalid(err, device.status().message());
  sim::CheckpointFormat format = sim::CheckpointFormat::kCkptsim;
  if (c.checkpoint_format == "torch_dist") {
    format = sim::CheckpointFormat::kTorchDist;
    if (c.memory)
      return invalid(err, "--checkpoint-format torch_dist writes to disk: drop --memory");
  } else if (c.checkpoint_format != "ckptsim") {
    return invalid(
        err, "--checkpoint-format: 'ckptsim' or 'torch_dist', got '" + c.checkpoint_format + "'");
  }
  model::TorchDistExportOptions export_options;
  for (const std::string& rename : c.torch_dist_classes) {
    if (format != sim::CheckpointFormat::kTorchDist) {
      return invalid(err, "--torch-dist-class needs --checkpoint-format torch_dist");
    }
    Status parsed = model::parse_class_rename(rename, export_options.class_renames);
    if (!parsed.is_ok()) return invalid(err, "--torch-dist-class " + parsed.message());
  }
  const bool talk = !c.quiet && !c.json;
  std::vector<sim::RunResult> runs;
  runs.reserve(scenarios.value().size());
  std::vector<report::ScenarioReport> reports;
  for (const auto& s : scenarios.value()) {
    sim::RunOptions options;
    options.device = device.value();
    if (!c.memory) options.checkpoint_dir = c.checkpoint_root + "/" + sanitize(s.scenario.name);
    options.checkpoint_format = format;
    options.torch_dist = export_options;
    options.progress = [&](const std::string& line) {
      if (talk) out << "  " << line << std::endl;
    };
    std::string revisions;
    for (const auto& p : s.scenario.phases)
      revisions += (revisions.empty() ? "" : ",") + p.revision;
    if (talk) {
      out << fmt::format("seed={} revision={} scenario={}", s.scenario.seed, revisions,
                         s.scenario.name)
          << std::endl;
    }
    auto run = sim::run_scenario(s.scenario, options);
    if (!run.is_ok()) return invalid(err, run.status().message());
    runs.push_back(std::move(run.value()));
    if (trace_out) {
      for (const auto& line : runs.back().trace) trace_out << line << "\n";
    }
    reports.push_back(judge(c, s, runs.back()));
    if (talk) say_verdicts(c, reports.back(), out);
  }
  if (int code = write_run_plots(c, reports, out, err); code != kExitOk) return code;
  if (Status s = write_run_outputs(c, reports, out); !s.is_ok()) return invalid(err, s.message());
  bool all_ok = true;
  bool all_expected = true;
  for (const auto& rep : reports) {
    all_ok = all_ok && properties::all_ok(rep.results);
    all_expected = all_expected && rep.expectation_mismatches.empty();
  }
  if (c.expect) return all_expected ? kExitOk : kExitFail;
  return all_ok ? kExitOk : kExitFail;
}

int revisions_command(bool json, const std::vector<std::string>& profiles, std::ostream& out,
                      std::ostream& err) {
  auto registry = load_registry(profiles);
  if (!registry.is_ok()) return invalid(err, registry.status().message());
  nlohmann::json all = nlohmann::json::array();
  for (const auto& name : registry.value().names()) {
    auto p = registry.value().get(name);
    if (!p.is_ok()) return invalid(err, p.status().message());
    const auto& profile = p.value();
    nlohmann::json j{{"name", profile.name},     {"extends", profile.extends},
                     {"source", profile.source}, {"description", profile.description},
                     {"upstream", nullptr},      {"switches", nlohmann::json::object()}};
    if (profile.upstream) {
      j["upstream"] = {{"repo", profile.upstream->repo}, {"commit", profile.upstream->commit}};
    }
    for (const auto& info : model::revision_switch_infos()) {
      j["switches"][info.name] = model::switch_value_text(profile.switches, info.name);
    }
    all.push_back(j);
    if (json) continue;
    out << profile.name << (profile.extends.empty() ? "" : " (extends " + profile.extends + ")")
        << "\n  " << profile.description << "\n";
    if (profile.upstream)
      out << "  upstream: " << profile.upstream->repo << "@" << profile.upstream->commit << "\n";
    for (const auto& s : profile.explicit_switches)
      out << "    " << s << " = " << model::switch_value_text(profile.switches, s) << "\n";
  }
  if (json) {
    out << all.dump(2) << std::endl;
    return kExitOk;
  }
  out << "\nswitches (defaults are upstream #2874 behavior):\n";
  for (const auto& info : model::revision_switch_infos()) {
    out << "  " << info.name << " (default "
        << model::switch_value_text(model::RevisionSwitches{}, info.name) << "): " << info.meaning
        << "\n";
  }
  return kExitOk;
}

int check_command(const SearchCommand& c, const std::string& revision, std::ostream& out,
                  std::ostream& err) {
  if (c.real.enabled) return real_check_command(c, revision, out, err);
  auto registry = load_registry(c.profiles);
  if (!registry.is_ok()) return invalid(err, registry.status().message());
  auto options = search_options(c);
  if (!options.is_ok()) return invalid(err, options.status().message());
  auto resolved = revision_flag(registry.value(), "--revision", revision);
  if (!resolved.is_ok()) return invalid(err, resolved.status().message());
  auto shard = choose_shard(c.shard, [](const char* name) { return std::getenv(name); });
  if (!shard.is_ok()) return invalid(err, shard.status().message());
  if (Status s = prepare_search_outputs(c, registry.value()); !s.is_ok())
    return invalid(err, s.message());
  options.value().generator.revisions = {resolved.value()};
  options.value().shard = shard.value().shard;
  const bool talk = !c.quiet && !c.json;
  options.value().progress = [&](const std::string& line) {
    if (talk) err << "check: " << line << std::endl;
  };
  const search::Shard& part = shard.value().shard;
  const std::string shard_text =
      part.whole() ? "" : fmt::format(" --shard {}/{}", part.index, part.count);
  if (talk) {
    out << fmt::format("seed={} revision={} cases={} time_budget={}s{} jobs={}{}", c.seed, revision,
                       c.cases, c.time_budget, c.keep_going ? " keep_going" : "",
                       options.value().jobs,
                       part.whole() ? ""
                                    : fmt::format(" shard={}/{} (from {})", part.index, part.count,
                                                  shard.value().source))
        << std::endl;
  }
  const search::SearchResult result =
      search::search(options.value(), search::property_judge(c.properties));
  if (!c.case_times.empty()) {
    std::string csv =
        "case,size,element_steps,buffer_steps,rank_steps,rank_phases,rank_phase_params,"
        "predicted_cost,seconds\n";
    for (const search::CaseTime& t : result.case_times) {
      csv +=
          fmt::format("{},{},{:.0f},{:.0f},{:.0f},{:.0f},{:.0f},{:.0f},{:.6f}\n", t.case_index,
                      t.size, t.terms.element_steps, t.terms.buffer_steps, t.terms.rank_steps,
                      t.terms.rank_phases, t.terms.rank_phase_params, t.predicted_cost, t.seconds);
    }
    if (Status s = write_text(c.case_times, csv); !s.is_ok()) return invalid(err, s.message());
  }
  const std::string whole = fmt::format("ckptsim check --revision {}{}{}", revision,
                                        search_repeat_flags(c), c.keep_going ? "" : " --first");
  return report_check(c, {revision, whole, whole + shard_text, part, options.value().jobs}, result,
                      registry.value(), out, err);
}

namespace {

// The shards' summaries, checked to be every shard of one search.
Result<std::vector<report::CheckSummary>> read_shards(const MergeCommand& m,
                                                      model::RevisionRegistry& registry) {
  if (m.dirs.empty()) return Status::invalid_input("merge: name the --out directory of each shard");
  std::vector<report::CheckSummary> shards;
  std::map<int64_t, std::string> dir_of_index;
  for (const auto& dir : m.dirs) {
    auto s = report::read_check_summary(dir, registry);
    if (!s.is_ok()) return s.status();
    const report::CheckSummary& first = shards.empty() ? s.value() : shards.front();
    if (s.value().search != first.search || s.value().shard.count != first.shard.count) {
      return Status::invalid_input(
          fmt::format("{}: shard {}/{} of `{}`, but {} holds a shard of {} of `{}`: not one search",
                      dir, s.value().shard.index, s.value().shard.count, s.value().search,
                      m.dirs.front(), first.shard.count, first.search));
    }
    const auto [at, fresh] = dir_of_index.emplace(s.value().shard.index, dir);
    if (!fresh) {
      return Status::invalid_input(fmt::format("{} and {} both hold shard {}/{}", at->second, dir,
                                               s.value().shard.index, s.value().shard.count));
    }
    shards.push_back(std::move(s.value()));
  }
  const int64_t count = shards.front().shard.count;
  for (int64_t k = 1; k <= count; ++k) {
    if (!dir_of_index.contains(k)) {
      return Status::invalid_input(
          fmt::format("merge: shard {}/{} of `{}` is missing (give the --out of every shard)", k,
                      count, shards.front().search));
    }
  }
  return shards;
}

}  // namespace

namespace {

// A real search's shards (check --real --shard) keep each minimal scenario's real plan and trace
// beside it (<stem>.plan.json, <stem>.trace.json); the merged finding gets the copy of the shard
// that found it (the file names are the search's, the same in every shard and in the merge).
void copy_real_files_of_shards(const std::vector<std::string>& dirs,
                               std::vector<report::ReportedFailure>& reported) {
  namespace fs = std::filesystem;
  for (auto& r : reported) {
    const std::string stem =
        r.file.ends_with(".json") ? r.file.substr(0, r.file.size() - 5) : r.file;
    const std::string name = fs::path(stem).filename().string();
    for (const auto& dir : dirs) {
      const fs::path trace = fs::path(dir) / (name + ".trace.json");
      const fs::path plan = fs::path(dir) / (name + ".plan.json");
      std::error_code ec;
      if (!fs::exists(trace, ec)) continue;
      report::RealCodeVerdict v;
      v.outcome = report::RealCodeOutcome::kConfirmed;
      v.trace = stem + ".trace.json";
      fs::copy_file(trace, v.trace, fs::copy_options::overwrite_existing, ec);
      if (fs::exists(plan, ec)) {
        v.plan = stem + ".plan.json";
        fs::copy_file(plan, v.plan, fs::copy_options::overwrite_existing, ec);
      }
      v.text = "found on the real code by the shard in " + dir + " (trace " + v.trace + ")";
      r.real_code = v;
      break;
    }
  }
}

}  // namespace

// The placeholder profiles a real search wrote next to its findings (<side>.profile.json:
// app/real_engine.h), which its found scenarios name: loaded from the first shard that has each.
Result<std::vector<std::string>> shard_profiles(const std::vector<std::string>& dirs,
                                                model::RevisionRegistry& registry) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;  // read_shards says so
    std::vector<fs::path> here;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().filename().string().ends_with(".profile.json")) here.push_back(e.path());
    std::sort(here.begin(), here.end());
    for (const auto& f : here) {
      const std::string name = f.filename().string();
      if (registry.get(name.substr(0, name.size() - 13)).is_ok()) continue;
      if (Status st = registry.add_file(f.string()); !st.is_ok()) return st;
      files.push_back(f.string());
    }
  }
  return files;
}

int merge_command(const MergeCommand& m, std::ostream& out, std::ostream& err) {
  auto registry = load_registry(m.profiles);
  if (!registry.is_ok()) return invalid(err, registry.status().message());
  auto placeholders = shard_profiles(m.dirs, registry.value());
  if (!placeholders.is_ok()) return invalid(err, placeholders.status().message());
  auto shards = read_shards(m, registry.value());
  if (!shards.is_ok()) return invalid(err, shards.status().message());
  namespace fs = std::filesystem;
  for (const auto& dir : m.dirs) {
    std::error_code ec;
    if (fs::weakly_canonical(dir, ec) == fs::weakly_canonical(m.out_dir, ec))
      return invalid(err, "--out " + m.out_dir + ": must not be one of the shards' directories");
  }
  const report::CheckSummary& first = shards.value().front();
  SearchCommand c;
  c.seed = first.seed;
  c.out_dir = m.out_dir;
  c.junit = m.junit;
  c.json = m.json;
  c.quiet = m.quiet;
  c.coverage = m.coverage;
  c.keep_going = first.keep_going;
  if (Status s = prepare_search_outputs(c, registry.value()); !s.is_ok())
    return invalid(err, s.message());
  for (const auto& f : placeholders.value()) {
    std::error_code ec;
    fs::copy_file(f, fs::path(m.out_dir) / fs::path(f).filename(),
                  fs::copy_options::overwrite_existing, ec);
  }
  std::vector<search::SearchResult> parts;
  int jobs = 1;
  for (auto& s : shards.value()) {
    parts.push_back(std::move(s.result));
    jobs = std::max(jobs, s.jobs);
  }
  if (!c.quiet && !c.json) {
    out << fmt::format("merge: {} shards of `{}`", parts.size(), first.search) << std::endl;
  }
  const search::SearchResult merged = search::merge_shards(std::move(parts), first.keep_going);
  return report_check(c, {first.revision, first.search, first.search, search::Shard{}, jobs},
                      merged, registry.value(), out, err,
                      [&](std::vector<report::ReportedFailure>& reported) {
                        copy_real_files_of_shards(m.dirs, reported);
                      });
}

int replay_plan_command(const ReplayPlanCommand& c, std::ostream& out, std::ostream& err) {
  auto registry = load_registry(c.profiles);
  if (!registry.is_ok()) return invalid(err, registry.status().message());
  for (const auto& file : c.files) {
    auto s = sim::load_scenario_file(file, registry.value());
    if (!s.is_ok()) return invalid(err, s.status().message());
    auto path = output_path(c.out, c.files.size(), s.value().name, ".plan.json");
    if (!path.is_ok()) return invalid(err, path.status().message());
    if (Status st = write_json(path.value(), report::replay_plan_json(s.value())); !st.is_ok())
      return invalid(err, st.message());
    out << "plan: " << path.value() << " (" << file << ")" << std::endl;
  }
  return kExitOk;
}

namespace {

// A JSON file; a trace file may be gzip-compressed (report/trace_file.h).
Result<nlohmann::json> read_json(const std::string& path) { return report::read_trace_file(path); }

// A real trace recorded with the runner's --values: the model's trace then carries its values
// too, so that conform compares them element by element.
bool carries_values(const nlohmann::json& real) {
  const auto setup = real.find("setup");
  return setup != real.end() && setup->is_object() && setup->value("values", false);
}

void say_conformance(const ConformCommand& c, const properties::Conformance& r, std::ostream& out) {
  out << "property verdicts, model vs real (judged from each trace the same way):" << std::endl;
  for (const auto& p : r.properties) {
    out << fmt::format("  {:<9} {:<33} model {:<13} real {:<13} {}",
                       p.agree() ? "agree" : "DISAGREE", p.property,
                       properties::verdict_name(p.model.verdict),
                       properties::verdict_name(p.real.verdict),
                       p.agree() ? "" : "(real: " + p.real.detail + ")")
        << std::endl;
  }
  std::string skipped;
  for (const auto& n : r.not_compared) skipped += (skipped.empty() ? "" : ", ") + n;
  out << "  not compared (a trace does not hold what they judge): " << skipped << std::endl;
  out << "agree, field by field: " << report::conformance_fields(r) << std::endl;
  out << fmt::format("state hashes: {} of {} equal; by kernel pair (model / real):", r.hashes_equal,
                     r.hashes_compared)
      << std::endl;
  for (const auto& line : report::conformance_kernel_pairs(r)) out << "  " << line << std::endl;
  const size_t shown =
      std::min<size_t>(r.divergences.size(), static_cast<size_t>(c.divergences_shown));
  if (!r.divergences.empty())
    out << "first divergence: " << r.divergences.front().describe() << std::endl;
  for (size_t i = 1; i < shown; ++i) out << "  then: " << r.divergences[i].describe() << std::endl;
  if (r.divergences.size() > shown)
    out << fmt::format("  (+{} more divergences)", r.divergences.size() - shown) << std::endl;
  if (!r.hash_divergences.empty()) {
    out << fmt::format("first of {} state hash differences: {}", r.hash_divergences.size(),
                       r.hash_divergences.front().describe())
        << std::endl;
  }
}

nlohmann::json conformance_json(const properties::Conformance& r, bool ok) {
  nlohmann::json j{{"ok", ok},
                   {"verdicts_agree", r.verdicts_agree()},
                   {"counters", {{"compared", r.counters_compared}, {"equal", r.counters_equal}}},
                   {"hashes", {{"compared", r.hashes_compared}, {"equal", r.hashes_equal}}},
                   {"errors", {{"compared", r.errors_compared}, {"equal", r.errors_equal}}},
                   {"fields", report::conformance_fields_json(r)},
                   {"kernel_pairs", report::conformance_kernel_pairs_json(r)},
                   {"properties", nlohmann::json::array()},
                   {"not_compared", r.not_compared},
                   {"divergences", nlohmann::json::array()}};
  for (const auto& p : r.properties) {
    j["properties"].push_back({{"name", p.property},
                               {"agree", p.agree()},
                               {"model", properties::verdict_name(p.model.verdict)},
                               {"real", properties::verdict_name(p.real.verdict)},
                               {"model_detail", p.model.detail},
                               {"real_detail", p.real.detail}});
  }
  auto divergence = [](const properties::Divergence& d) {
    return nlohmann::json{{"run", d.run},     {"global_step", d.global_step},
                          {"rank", d.rank},   {"at", d.at},
                          {"field", d.field}, {"model", d.model},
                          {"real", d.real}};
  };
  for (const auto& d : r.divergences) j["divergences"].push_back(divergence(d));
  j["hash_divergences"] = nlohmann::json::array();
  for (const auto& d : r.hash_divergences) j["hash_divergences"].push_back(divergence(d));
  return j;
}

}  // namespace

int conform_command(const ConformCommand& c, std::ostream& out, std::ostream& err) {
  auto registry = load_registry(c.profiles);
  if (!registry.is_ok()) return invalid(err, registry.status().message());
  auto s = sim::load_scenario_file(c.scenario, registry.value());
  if (!s.is_ok()) return invalid(err, s.status().message());
  auto real = read_json(c.real_trace);
  if (!real.is_ok()) return invalid(err, real.status().message());
  auto run = sim::run_scenario(s.value());
  if (!run.is_ok()) return invalid(err, run.status().message());
  const nlohmann::json model = report::trace_json(run.value(), carries_values(real.value()));
  if (!c.model_trace.empty()) {
    if (Status st = write_json(c.model_trace, model); !st.is_ok())
      return invalid(err, st.message());
  }
  // The scenario goes with the traces, as conform-campaign's does: the judge needs it for a
  // phase whose optimizer starts afresh (--no-load-optim, --finetune) and for the schedule.
  auto r = properties::conform(model, real.value(), c.real_trace, &run.value().scenario);
  if (!r.is_ok()) return invalid(err, r.status().message());
  const bool ok = r.value().agrees();
  if (c.json) {
    out << conformance_json(r.value(), ok).dump(2) << std::endl;
  } else {
    out << fmt::format("conform {} against {}: {}", s.value().name, c.real_trace,
                       ok ? "the model agrees with the real code"
                          : "the model DISAGREES with the real code")
        << std::endl;
    say_conformance(c, r.value(), out);
  }
  return ok ? kExitOk : kExitFail;
}

namespace {

// The line a picture of a real trace carries under its title: the verdict of `conform`.
std::string conformance_note(const properties::Conformance& r) {
  if (r.agrees()) return "conform: the model agrees with the real code";
  std::string first = "conform: the model DISAGREES with the real code";
  if (!r.divergences.empty()) first += "; first: " + r.divergences.front().describe();
  return first;
}

}  // namespace

int plot_command(const PlotCommand& c, std::ostream& out, std::ostream& err) {
  auto registry = load_registry(c.profiles);
  if (!registry.is_ok()) return invalid(err, registry.status().message());
  auto s = sim::load_scenario_file(c.scenario, registry.value());
  if (!s.is_ok()) return invalid(err, s.status().message());
  if (c.out.empty() || !c.out.ends_with(".png"))
    return invalid(err, "-o: name the picture to write, a .png file, got '" + c.out + "'");
  std::optional<nlohmann::json> real;
  if (!c.real_trace.empty()) {
    auto r = read_json(c.real_trace);
    if (!r.is_ok()) return invalid(err, r.status().message());
    real = std::move(r.value());
  }
  auto run = sim::run_scenario(s.value());
  if (!run.is_ok()) return invalid(err, run.status().message());
  std::vector<std::string> notes;
  if (real) {
    auto r = properties::conform(report::trace_json(run.value()), *real, c.real_trace,
                                 &run.value().scenario);
    if (!r.is_ok()) return invalid(err, r.status().message());
    notes.push_back(conformance_note(r.value()));
  }
  const int code = write_plot(run.value(), real ? &*real : nullptr, c.real_trace, notes,
                              {c.out, c.keep_data, c.gnuplot}, err);
  if (code == kExitOk) out << "plot: " << c.out << std::endl;
  return code;
}

namespace {

// Trace files: the files given, and every *.trace.json of the directories given, sorted.
Result<std::vector<std::string>> trace_files(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) {
    std::error_code ec;
    if (!std::filesystem::is_directory(p, ec)) {
      out.push_back(p);
      continue;
    }
    std::vector<std::string> in_dir;
    for (const auto& e : std::filesystem::directory_iterator(p, ec)) {
      if (report::is_trace_file(e.path().string())) in_dir.push_back(e.path().string());
    }
    if (ec) return Status::io_error(p + ": cannot list: " + ec.message());
    std::sort(in_dir.begin(), in_dir.end());
    out.insert(out.end(), in_dir.begin(), in_dir.end());
  }
  return out;
}

// The real setup of a trace, in words.
std::string setup_text(const nlohmann::json& t) {
  const auto& s = t.at("setup");
  std::string out = s.value("backend", "?") + ", TE " + s.value("te", "?");
  if (s.value("fused_adam_standin", false)) out += ", FusedAdam stand-in";
  return out;
}

std::string real_errors_text(const nlohmann::json& t) {
  std::string out;
  for (const auto& run : t.at("runs")) {
    for (const auto& e : run.at("events")) {
      if (e.at("at") != "error" || e.value("secondary", false)) continue;
      out += (out.empty() ? "" : "; ") + run.at("id").get<std::string>() + " " +
             e.at("stage").get<std::string>() + ": " + e.at("py_type").get<std::string>();
      break;
    }
  }
  return out.empty() ? "none" : out;
}

}  // namespace

namespace {

// reports/conformance.md: the traces' table, the real checkpoints' section, the notes.
Status write_campaign_report(const ConformCampaignCommand& c,
                             const std::vector<report::ConformanceRow>& rows,
                             const std::string& checkpoints_markdown) {
  std::vector<std::string> header = {
      "Generated by `ckptsim conform-campaign` over " + std::to_string(rows.size()) +
      " real traces (each replayed by `python -m replay run` from the plan of "
      "`ckptsim replay-plan`; the files name the Megatron commit, the machine and the date)."};
  std::string md = report::conformance_markdown(rows, header);
  if (!checkpoints_markdown.empty()) md += "\n" + checkpoints_markdown;
  if (!c.notes.empty()) {
    std::ifstream in(c.notes);
    if (!in) return Status::invalid_input(c.notes + ": cannot open the notes");
    md += "\n" + std::string(std::istreambuf_iterator<char>(in), {});
  }
  return write_text(c.report, md);
}

}  // namespace

int conform_campaign_command(const ConformCampaignCommand& c, std::ostream& out,
                             std::ostream& err) {
  auto registry = load_registry(c.profiles);
  if (!registry.is_ok()) return invalid(err, registry.status().message());
  auto files = trace_files(c.traces);
  if (!files.is_ok()) return invalid(err, files.status().message());
  std::vector<report::ConformanceRow> rows;
  for (const auto& file : files.value()) {
    auto real = read_json(file);
    if (!real.is_ok()) return invalid(err, real.status().message());
    const std::string name = real.value().value("scenario", "");
    std::string scenario_file;
    for (const auto& dir : c.scenario_dirs) {
      if (std::filesystem::exists(dir + "/" + name + ".json"))
        scenario_file = dir + "/" + name + ".json";
      if (!scenario_file.empty()) break;
    }
    if (scenario_file.empty()) return invalid(err, file + ": no scenario '" + name + "' found");
    auto s = sim::load_scenario_file(scenario_file, registry.value());
    if (!s.is_ok()) return invalid(err, s.status().message());
    auto run = sim::run_scenario(s.value());
    if (!run.is_ok()) return invalid(err, run.status().message());
    auto r = properties::conform(report::trace_json(run.value(), carries_values(real.value())),
                                 real.value(), file, &run.value().scenario);
    if (!r.is_ok()) return invalid(err, r.status().message());
    out << fmt::format("{} {}", r.value().agrees() ? "agree   " : "DISAGREE", file) << std::endl;
    std::string plot;
    if (!c.plots.empty() && !r.value().agrees()) {
      const std::string stem = report::trace_stem(file);
      const std::string png = c.plots + "/" + sanitize(stem) + ".png";
      if (int code = write_plot(run.value(), &real.value(), file, {conformance_note(r.value())},
                                {png}, err);
          code != kExitOk)
        return code;
      out << "plot: " << png << std::endl;
      plot = c.report.empty() ? png : relative_link(c.report, png);
    }
    rows.push_back({std::filesystem::path(file).filename().string(), std::move(s.value()),
                    setup_text(real.value()), real_errors_text(real.value()), std::move(r.value()),
                    plot});
  }
  const auto agreeing =
      std::count_if(rows.begin(), rows.end(), [](const auto& r) { return r.result.agrees(); });
  out << fmt::format("{} of {} traces agree with the model", agreeing, rows.size()) << std::endl;
  RealCheckpointsReport checkpoints;
  if (!c.real_checkpoints.empty()) {
    auto r = real_checkpoints_report(c.real_checkpoints, out);
    if (!r.is_ok()) return invalid(err, r.status().message());
    checkpoints = std::move(r.value());
    out << fmt::format("{} of {} real resumes agree with the model's resume from the same files",
                       checkpoints.agreeing, checkpoints.compared)
        << std::endl;
  }
  if (!c.report.empty()) {
    if (Status st = write_campaign_report(c, rows, checkpoints.markdown); !st.is_ok())
      return invalid(err, st.message());
    out << "report: " << c.report << std::endl;
  }
  return agreeing == static_cast<int64_t>(rows.size()) &&
                 checkpoints.agreeing == checkpoints.compared
             ? kExitOk
             : kExitFail;
}

namespace {

// generate --size: "spread", "ramp" or a size in [0, size_max].
Status set_case_sizes(const std::string& sizes, search::SearchOptions& o) {
  if (sizes == "spread" || sizes == "ramp") {
    o.sizes = sizes == "spread" ? search::SizeSchedule::kSpread : search::SizeSchedule::kRamp;
    return Status::ok();
  }
  int n = -1;
  const char* end = sizes.data() + sizes.size();
  const auto [at, ec] = std::from_chars(sizes.data(), end, n);
  if (ec != std::errc() || at != end || n < 0 || n > o.size_max) {
    return Status::invalid_input(
        fmt::format("--size must be spread, ramp or a size in [0, {}], got {}", o.size_max, sizes));
  }
  o.sizes = search::SizeSchedule::kFixed;
  o.fixed_size = n;
  return Status::ok();
}

// The command line that draws these scenarios again (--out aside).
std::string generate_repeat_line(const SearchCommand& c, const std::vector<std::string>& revisions,
                                 bool cross) {
  std::string line = "ckptsim generate";
  if (c.campaign) line += " --campaign";
  for (const auto& r : revisions) line += " --revision " + r;
  if (cross) line += " --cross";
  if (c.sizes != SearchCommand().sizes) line += " --size " + c.sizes;
  return line + search_repeat_flags(c);
}

}  // namespace

void use_campaign_limits(SearchCommand& c, bool dp_max_given, bool params_max_given) {
  if (!dp_max_given) c.dp_max = search::kCampaignDpMax;
  if (!params_max_given) c.params_max = search::kCampaignParamsMax;
}

int generate_command(const SearchCommand& c, const std::vector<std::string>& revisions, bool cross,
                     std::ostream& out, std::ostream& err) {
  auto registry = load_registry(c.profiles);
  if (!registry.is_ok()) return invalid(err, registry.status().message());
  auto options = search_options(c);
  if (!options.is_ok()) return invalid(err, options.status().message());
  search::GeneratorConfig& g = options.value().generator;
  g.campaign = c.campaign;
  if (Status s = g.validate(); !s.is_ok()) return invalid(err, s.message());
  if (Status s = set_case_sizes(c.sizes, options.value()); !s.is_ok())
    return invalid(err, s.message());
  if (revisions.empty()) return invalid(err, "--revision: name at least one revision");
  std::string tag;
  for (const auto& r : revisions) {
    auto resolved = revision_flag(registry.value(), "--revision", r);
    if (!resolved.is_ok()) return invalid(err, resolved.status().message());
    g.revisions.push_back(resolved.value());
    tag += (tag.empty() ? "" : "-to-") + resolved.value().profile->name;
  }
  g.require_revision_change = cross;
  if (Status s = search::prepare_out_dir(c.out_dir); !s.is_ok()) return invalid(err, s.message());
  const auto scenarios = search::draw(options.value());
  const std::string repeat = generate_repeat_line(c, revisions, cross);
  search::Coverage coverage;
  for (size_t k = 0; k < scenarios.size(); ++k) {
    sim::Scenario s = scenarios[k];
    s.name = fmt::format("gen-{}-seed{}-case{}", tag, c.seed, k);
    s.description = fmt::format("Drawn by `{}` (case {}).", repeat, k);
    coverage.add(s);
    if (Status st = write_json(c.out_dir + "/" + s.name + ".json", sim::scenario_to_json(s));
        !st.is_ok())
      return invalid(err, st.message());
  }
  out << fmt::format("{} scenarios in {}", scenarios.size(), c.out_dir) << std::endl;
  if (c.coverage) out << coverage.text();
  return kExitOk;
}

int coverage_command(const CoverageCommand& c, std::ostream& out, std::ostream& err) {
  auto registry = load_registry(c.profiles);
  if (!registry.is_ok()) return invalid(err, registry.status().message());
  search::Coverage coverage;
  for (const auto& file : c.files) {
    auto s = sim::load_scenario_file(file, registry.value());
    if (!s.is_ok()) return invalid(err, s.status().message());
    coverage.add(s.value());
  }
  if (c.json) {
    out << coverage.json().dump(2) << std::endl;
  } else {
    out << coverage.text();
  }
  return kExitOk;
}

int gate_command(const SearchCommand& c, const std::string& baseline, const std::string& candidate,
                 std::ostream& out, std::ostream& err) {
  if (c.real.enabled) return real_gate_command(c, baseline, candidate, out, err);
  if (baseline.empty() || candidate.empty()) {
    return invalid(err,
                   "--baseline and --candidate are required (with --real, --baseline-megatron "
                   "and --candidate-megatron may stand for them)");
  }
  auto registry = load_registry(c.profiles);
  if (!registry.is_ok()) return invalid(err, registry.status().message());
  if (c.out_dir.empty()) return invalid(err, "--out is required");
  auto options = search_options(c);
  if (!options.is_ok()) return invalid(err, options.status().message());
  auto base = revision_flag(registry.value(), "--baseline", baseline);
  if (!base.is_ok()) return invalid(err, base.status().message());
  auto cand = revision_flag(registry.value(), "--candidate", candidate);
  if (!cand.is_ok()) return invalid(err, cand.status().message());
  if (Status s = prepare_search_outputs(c, registry.value()); !s.is_ok())
    return invalid(err, s.message());
  const bool talk = !c.quiet && !c.json;
  if (talk) {
    out << fmt::format("seed={} baseline={} candidate={} cases={} per search", c.seed, baseline,
                       candidate, c.cases)
        << std::endl;
  }
  search::GateOptions g;
  g.baseline = base.value();
  g.candidate = cand.value();
  g.search = options.value();
  g.properties = c.properties;
  // From 2 jobs on, the two searches run at once, each with half of them (rounded up).
  const int jobs = all_jobs(c.jobs);
  g.concurrent = jobs >= 2;
  g.search.jobs = g.concurrent ? (jobs + 1) / 2 : 1;
  g.progress = [&](const std::string& part, const std::string& line) {
    if (talk) err << "gate " << part << ": " << line << std::endl;
  };
  const search::GateResult result = search::gate(g);
  const std::string repeat = fmt::format("ckptsim gate --baseline {} --candidate {} --out {}{}",
                                         baseline, candidate, c.out_dir, search_repeat_flags(c));
  auto reported = write_gate_findings(c, result, repeat);
  if (!reported.is_ok()) return invalid(err, reported.status().message());
  const GateNames names{baseline, candidate, repeat};
  // Written before the real code is asked (a runner that hangs loses nothing), and again after.
  if (Status s = write_gate_files(c, names, result, reported.value()); !s.is_ok())
    return invalid(err, s.message());
  if (confirm_found(c, registry.value(), "gate", reported.value(), err)) {
    if (Status s = write_gate_files(c, names, result, reported.value()); !s.is_ok())
      return invalid(err, s.message());
  }
  if (talk) {
    say_gate_findings(reported.value(), out);
    out << "report: " << c.out_dir << "/gate-report.md, " << c.out_dir << "/junit.xml" << std::endl;
  }
  if (c.json) {
    out << report::gate_json(baseline, candidate, c.seed, repeat, result.introduced(),
                             reported.value())
               .dump(2)
        << std::endl;
  }
  return result.introduced() ? kExitFail : kExitOk;
}

}  // namespace ckptsim::app
