#include "report/search_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "report/run_report.h"

namespace ckptsim::report {

const char* real_code_outcome_name(RealCodeOutcome outcome) {
  switch (outcome) {
    case RealCodeOutcome::kConfirmed:
      return "confirmed";
    case RealCodeOutcome::kNotConfirmed:
      return "not_confirmed";
    case RealCodeOutcome::kNotJudgeable:
      return "not_judgeable";
    case RealCodeOutcome::kCouldNotReplay:
      return "could_not_replay";
  }
  return "?";
}

namespace {

// "real code: <sentence>" for a finding confirmed (or not) on the real code; "" without --megatron.
std::string real_code_line(const ReportedFailure& r) {
  return r.real_code ? "real code: " + r.real_code->text + "\n" : "";
}

}  // namespace

std::vector<JunitCase> check_junit_cases(const std::string& revision,
                                         const std::vector<ReportedFailure>& reported,
                                         const std::string& repeat) {
  std::vector<JunitCase> cases;
  for (const auto& p : properties::all_properties()) {
    JunitCase c{"ckptsim.check." + revision, p.name, false, "", "", ""};
    for (const auto& r : reported) {
      const search::Finding& f = r.failure->finding;
      if (f.property != p.name) continue;
      c.failed = true;
      c.message = f.detail;
      c.text += fmt::format("{}\nminimal scenario: {}\nreplay: ckptsim run {}\n{}repeat: {}\n\n",
                            f.detail, r.file, r.file, real_code_line(r), repeat);
      if (r.real_code) c.system_out += r.file + ": " + real_code_line(r);
    }
    cases.push_back(c);
  }
  return cases;
}

std::vector<JunitCase> gate_junit_cases(const std::vector<ReportedFailure>& reported,
                                        const std::string& repeat) {
  std::vector<JunitCase> cases;
  for (const auto& r : reported) {
    const search::Finding& f = r.failure->finding;
    cases.push_back({"ckptsim.gate." + r.classification.substr(0, r.classification.find(' ')),
                     f.property + " (" + r.file + ")", r.counts_as_new, f.detail,
                     fmt::format("{}\nreplay: ckptsim run {}\n{}repeat: {}\n", f.detail, r.file,
                                 real_code_line(r), repeat),
                     real_code_line(r)});
  }
  if (cases.empty()) cases.push_back({"ckptsim.gate", "no new failure", false, "", "", ""});
  return cases;
}

namespace {

// The findings, one row each; with a "real code" column when they were replayed on it.
std::string gate_findings_table(const std::vector<ReportedFailure>& reported) {
  const bool real = std::any_of(reported.begin(), reported.end(),
                                [](const ReportedFailure& r) { return r.real_code.has_value(); });
  std::string md = "\n| class | property | minimal scenario | params | phases | detail |";
  md += real ? " real code |\n|---|---|---|---|---|---|---|\n" : "\n|---|---|---|---|---|---|\n";
  for (const auto& r : reported) {
    const search::Failure& f = *r.failure;
    md += fmt::format("| {} | {} | `{}` | {} | {} | {} |",
                      r.counts_as_new ? "**" + r.classification + "**" : r.classification,
                      f.finding.property, r.file, f.minimal.params.size(), f.minimal.phases.size(),
                      md_escape(f.finding.detail));
    if (real) md += " " + (r.real_code ? md_escape(r.real_code->text) : "—") + " |";
    md += "\n";
  }
  if (reported.empty()) md += "| — | — | — | — | — | no failure found |\n";
  if (real) {
    md +=
        "\n\"real code\": each minimal scenario replayed on the real Megatron-LM (`python -m "
        "replay run`, its plan and trace next to the scenario) and its trace conformed with the "
        "model's. \"confirmed\": the real run fails the property too, and every verdict, step "
        "counter and first error a trace holds agrees.\n";
  }
  return md;
}

}  // namespace

std::string gate_markdown(const std::string& baseline, const std::string& candidate,
                          const std::string& repeat, const search::GateResult& result,
                          const std::vector<ReportedFailure>& reported) {
  std::string md = fmt::format("# ckptsim gate: {} → {}\n\n", baseline, candidate);
  md +=
      fmt::format("Verdict: **{}**.\n\n", result.introduced() ? "the candidate introduces failures"
                                                              : "no new failure found");
  md += fmt::format("Repeat: `{}`\n\n", repeat);
  md += fmt::format(
      "| search | cases | simulator runs | findings | seconds ({}) | of which shrinking |\n",
      result.concurrent ? "the searches at once" : "one after the other");
  md += "|---|---|---|---|---|---|\n";
  for (const auto& part : result.parts) {
    const search::SearchResult& s = part.result;
    md += fmt::format("| {} | {}{} | {} | {} | {:.1f} | {:.1f} |\n", part.name, s.cases_run,
                      s.stopped_by_time ? " (time budget)" : "", s.judge_runs, s.failures.size(),
                      s.seconds, s.shrink_seconds);
  }
  md += gate_findings_table(reported);
  md +=
      "\n\"new\": the candidate fails a property that the same scenario run entirely on the "
      "baseline keeps (or fails differently). \"new (the baseline cannot resume from it)\": a "
      "phase running the baseline fails on a checkpoint the candidate wrote, while the "
      "all-baseline run keeps the property. \"pre-existing\": the baseline fails it too. "
      "\"unresolved\": the all-baseline run stops before it can judge that property (e.g. its "
      "own load fails), so new or not cannot be told (not counted as new). Replay any finding "
      "with `ckptsim run <file>`.\n";
  return md;
}

nlohmann::json failure_json(const ReportedFailure& r) {
  const search::Failure& f = *r.failure;
  int64_t dp_max = 0;
  for (const auto& p : f.minimal.phases) dp_max = std::max(dp_max, p.dp);
  nlohmann::json j{{"property", f.finding.property},
                   {"signature", f.finding.signature},
                   {"detail", f.finding.detail},
                   {"scenario_file", r.file},
                   {"case", f.case_index},
                   {"shrink_steps", f.shrink_steps},
                   {"params", f.minimal.params.size()},
                   {"phases", f.minimal.phases.size()},
                   {"dp_max", dp_max}};
  if (!r.classification.empty()) j["classification"] = r.classification;
  if (!f.not_shrunk.empty()) j["not_shrunk"] = f.not_shrunk;
  if (r.real_code) {
    j["real_code"] = {{"outcome", real_code_outcome_name(r.real_code->outcome)},
                      {"text", r.real_code->text},
                      {"plan", r.real_code->plan},
                      {"trace", r.real_code->trace}};
  }
  return j;
}

nlohmann::json check_json(const std::string& revision, uint64_t seed,
                          const search::SearchResult& result, const std::string& repeat,
                          const std::vector<ReportedFailure>& reported,
                          const std::vector<JunitCase>& cases) {
  nlohmann::json j{{"ok", reported.empty()},
                   {"seed", seed},
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
  return j;
}

nlohmann::json gate_json(const std::string& baseline, const std::string& candidate, uint64_t seed,
                         const std::string& repeat, bool introduced,
                         const std::vector<ReportedFailure>& reported) {
  nlohmann::json j{{"ok", !introduced},      {"baseline", baseline},
                   {"candidate", candidate}, {"seed", seed},
                   {"repeat", repeat},       {"findings", nlohmann::json::array()}};
  for (const auto& r : reported) j["findings"].push_back(failure_json(r));
  return j;
}

nlohmann::json check_summary_json(const CheckSummary& s,
                                  const std::vector<ReportedFailure>& reported) {
  const search::SearchResult& r = s.result;
  nlohmann::json j{{"format", "ckptsim-check-summary"},
                   {"version", 1},
                   {"revision", s.revision},
                   {"seed", s.seed},
                   {"search", s.search},
                   {"repeat", s.repeat},
                   {"shard", {{"index", s.shard.index}, {"count", s.shard.count}}},
                   {"keep_going", s.keep_going},
                   {"jobs", s.jobs},
                   {"cases_run", r.cases_run},
                   {"simulator_runs", r.judge_runs},
                   {"discarded_runs", r.discarded_runs},
                   {"stopped_by_time", r.stopped_by_time},
                   {"seconds", r.seconds},
                   {"shrink_seconds", r.shrink_seconds},
                   {"coverage", r.coverage.json()},
                   {"failures", nlohmann::json::array()}};
  for (const ReportedFailure& rep : reported) {
    const search::Failure& f = *rep.failure;
    j["failures"].push_back({{"property", f.finding.property},
                             {"signature", f.finding.signature},
                             {"detail", f.finding.detail},
                             {"phase_revision", f.finding.phase_revision},
                             {"case", f.case_index},
                             {"shrink_steps", f.shrink_steps},
                             {"shrink_runs", f.shrink_runs},
                             {"found_s", f.found_s},
                             {"file", std::filesystem::path(rep.file).filename().string()}});
    if (!f.not_shrunk.empty()) j["failures"].back()["not_shrunk"] = f.not_shrunk;
  }
  return j;
}

namespace {

// A field of the summary, or an exception naming it (caught by read_check_summary).
struct SummaryError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class T>
T summary_field(const nlohmann::json& j, const std::string& key, const std::string& where) {
  if (!j.is_object() || !j.contains(key))
    throw SummaryError("field '" + where + key + "' is missing");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw SummaryError("field '" + where + key + "' has the wrong type");
  }
}

search::Failure summary_failure(const nlohmann::json& j, const std::string& where) {
  search::Failure f;
  f.finding.property = summary_field<std::string>(j, "property", where);
  f.finding.signature = summary_field<std::string>(j, "signature", where);
  f.finding.detail = summary_field<std::string>(j, "detail", where);
  f.finding.phase_revision = summary_field<std::string>(j, "phase_revision", where);
  f.case_index = summary_field<int64_t>(j, "case", where);
  f.shrink_steps = summary_field<int64_t>(j, "shrink_steps", where);
  f.shrink_runs = summary_field<int64_t>(j, "shrink_runs", where);
  if (j.contains("not_shrunk")) f.not_shrunk = summary_field<std::string>(j, "not_shrunk", where);
  // Summaries written before 2026-12-05 have no found_s.
  if (j.contains("found_s")) f.found_s = summary_field<double>(j, "found_s", where);
  return f;
}

void read_summary_fields(const nlohmann::json& j, CheckSummary& s) {
  if (summary_field<std::string>(j, "format", "") != "ckptsim-check-summary" ||
      summary_field<int>(j, "version", "") != 1)
    throw SummaryError("not a ckptsim check summary of version 1");
  s.revision = summary_field<std::string>(j, "revision", "");
  s.seed = summary_field<uint64_t>(j, "seed", "");
  s.search = summary_field<std::string>(j, "search", "");
  s.repeat = summary_field<std::string>(j, "repeat", "");
  const auto shard = summary_field<nlohmann::json>(j, "shard", "");
  s.shard = {summary_field<int64_t>(shard, "index", "shard."),
             summary_field<int64_t>(shard, "count", "shard.")};
  if (s.shard.count < 1 || s.shard.index < 1 || s.shard.index > s.shard.count)
    throw SummaryError("field 'shard' must have 1 <= index <= count");
  s.keep_going = summary_field<bool>(j, "keep_going", "");
  s.jobs = summary_field<int>(j, "jobs", "");
  s.result.cases_run = summary_field<int64_t>(j, "cases_run", "");
  s.result.judge_runs = summary_field<int64_t>(j, "simulator_runs", "");
  s.result.discarded_runs = summary_field<int64_t>(j, "discarded_runs", "");
  s.result.stopped_by_time = summary_field<bool>(j, "stopped_by_time", "");
  s.result.seconds = summary_field<double>(j, "seconds", "");
  s.result.shrink_seconds = summary_field<double>(j, "shrink_seconds", "");
}

}  // namespace

Result<CheckSummary> read_check_summary(const std::string& dir, model::RevisionRegistry& registry) {
  const std::string path = dir + "/" + kCheckSummaryFile;
  std::ifstream in(path);
  if (!in) return Status::not_found(path + ": cannot open (is it the --out of a ckptsim check?)");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) return Status::invalid_input(path + ": not valid JSON");
  CheckSummary s;
  try {
    read_summary_fields(j, s);
    const auto failures = summary_field<nlohmann::json>(j, "failures", "");
    if (!failures.is_array()) throw SummaryError("field 'failures' must be an array");
    for (size_t i = 0; i < failures.size(); ++i) {
      const std::string where = fmt::format("failures[{}].", i);
      search::Failure f = summary_failure(failures[i], where);
      const auto file = summary_field<std::string>(failures[i], "file", where);
      auto minimal = sim::load_scenario_file(dir + "/" + file, registry);
      if (!minimal.is_ok()) return minimal.status();
      f.minimal = std::move(minimal.value());
      s.result.failures.push_back(std::move(f));
      s.files.push_back(file);
    }
  } catch (const SummaryError& e) {
    return Status::invalid_input(path + ": " + e.what());
  }
  auto coverage = search::Coverage::from_json(j.value("coverage", nlohmann::json()), path);
  if (!coverage.is_ok()) return coverage.status();
  s.result.coverage = std::move(coverage.value());
  return s;
}

}  // namespace ckptsim::report
