#include "app/confirm.h"

#include "report/conformance_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "app/process.h"
#include "report/trace_json.h"
#include "sim/driver.h"
#include "sim/scenario.h"

namespace ckptsim::app {

namespace fs = std::filesystem;

namespace {

bool holds_runner(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "replay" / "__main__.py", ec);
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

// Where the runner is looked for when neither --replay-dir nor CKPTSIM_REPLAY_DIR names it.
std::vector<fs::path> default_replay_dirs() {
  std::vector<fs::path> out;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path dir = exe.parent_path();
    for (int up = 0; up < 3 && !dir.empty(); ++up, dir = dir.parent_path()) {
      out.push_back(dir);
      if (dir == dir.parent_path()) break;
    }
  }
#ifdef CKPTSIM_REPLAY_SOURCE_DIR
  out.emplace_back(CKPTSIM_REPLAY_SOURCE_DIR);
#endif
  return out;
}

// One --megatron value: an existing DIR, or REVISION=DIR with a known revision and an existing
// DIR (the runner's own reading: a value that is a directory is never split at '=').
Status validate_megatron_arg(const std::string& v, const std::vector<std::string>& revisions) {
  std::error_code ec;
  if (fs::is_directory(v, ec)) return Status::ok();
  const size_t eq = v.find('=');
  if (eq == std::string::npos)
    return Status::invalid_input("--megatron " + v + ": no such directory");
  const std::string rev = v.substr(0, eq);
  const std::string dir = v.substr(eq + 1);
  if (rev.empty() || dir.empty())
    return Status::invalid_input("--megatron " + v + ": expected DIR or REVISION=DIR");
  if (std::find(revisions.begin(), revisions.end(), rev) == revisions.end())
    return Status::invalid_input("--megatron " + v + ": unknown revision " + rev);
  if (!fs::is_directory(dir, ec))
    return Status::invalid_input("--megatron " + v + ": no such directory " + dir);
  return Status::ok();
}

Result<nlohmann::json> read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::not_found(path + ": cannot open");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) return Status::invalid_input(path + ": not valid JSON");
  return j;
}

const properties::PropertyAgreement* find_agreement(const properties::Conformance& c,
                                                    const std::string& property) {
  for (const auto& p : c.properties) {
    if (p.property == property) return &p;
  }
  return nullptr;
}

// An error the runner made up, or an import failure: about the replay, never about Megatron's
// checkpointing (the model has no import step, so it can never agree or disagree with one).
bool is_replay_error(const nlohmann::json& e) {
  static const std::vector<std::string> kTypes = {
      "WorkerCrash", "ReplayTimeout", "ReplayRunnerError", "ImportError", "ModuleNotFoundError"};
  if (!e.is_object() || e.value("at", "") != "error" || e.value("secondary", false)) return false;
  const std::string type = e.value("py_type", "");
  if (std::find(kTypes.begin(), kTypes.end(), type) != kTypes.end()) return true;
  // The GPU ran out of memory (too many runners' workers on one device): the machine's
  // limit, not Megatron's checkpointing (the model has no device memory to run out of).
  const std::string message = e.value("message", "");
  return type == "OutOfMemoryError" ||
         message.find("CUDA error: out of memory") != std::string::npos ||
         message.find("CUDA out of memory") != std::string::npos;
}

// The skip of a run whose source run left no checkpoint: the runner's reason
// (replay/coordinator.py) and the model's (report/trace_json.cpp).
bool resumes_nothing(const std::string& reason) {
  return reason.find("no checkpoint to resume from") != std::string::npos ||
         reason.find("the checkpoint to resume from does not exist") != std::string::npos;
}

}  // namespace

std::string first_disagreement(const properties::Conformance& c) {
  if (!c.divergences.empty()) return c.divergences.front().describe();
  for (const auto& p : c.properties) {
    if (!p.agree()) {
      return fmt::format("{}: model {}, real {}", p.property,
                         properties::verdict_name(p.model.verdict),
                         properties::verdict_name(p.real.verdict));
    }
  }
  return "no divergence listed";
}

Status validate_real_code(const RealCodeOptions& o, const model::RevisionRegistry& registry) {
  const std::vector<std::string> revisions = registry.names();
  for (const auto& v : o.megatron) {
    if (Status s = validate_megatron_arg(v, revisions); !s.is_ok()) return s;
  }
  std::error_code ec;
  if (!o.megatron_root.empty() && !fs::is_directory(o.megatron_root, ec))
    return Status::invalid_input("--megatron-root " + o.megatron_root + ": no such directory");
  auto dir = find_replay_dir(o.replay_dir);
  return dir.is_ok() ? Status::ok() : dir.status();
}

Result<std::string> find_replay_dir(const std::string& flag) {
  for (const auto& [given, name] :
       {std::pair{flag, std::string("--replay-dir")},
        std::pair{env_or("CKPTSIM_REPLAY_DIR", ""), std::string("CKPTSIM_REPLAY_DIR")}}) {
    if (given.empty()) continue;
    if (!holds_runner(given))
      return Status::invalid_input(name + " " + given + ": no replay/__main__.py there");
    return fs::absolute(given).lexically_normal().string();
  }
  std::string looked;
  for (const auto& dir : default_replay_dirs()) {
    if (holds_runner(dir)) return fs::absolute(dir).lexically_normal().string();
    looked += (looked.empty() ? "" : ", ") + dir.string();
  }
  return Status::not_found(
      "the replay runner (replay/__main__.py) is not in " + looked +
      ": name the folder that holds replay/ with --replay-dir or CKPTSIM_REPLAY_DIR");
}

std::string replay_problem(const nlohmann::json& real_trace) {
  const auto runs = real_trace.find("runs");
  if (runs == real_trace.end() || !runs->is_array()) return "";
  for (const auto& run : *runs) {
    if (!run.is_object()) continue;
    const std::string id = run.value("id", "?");
    // A run skipped because the run it resumes from left no checkpoint (it failed, or saved
    // nothing) is an outcome the model records alike; any other skip is about the replay.
    const std::string reason = run.value("skipped_reason", "no reason given");
    if (run.value("status", "") == "skipped" && !resumes_nothing(reason))
      return "the runner skipped run " + id + ": " + reason;
    const auto events = run.find("events");
    if (events == run.end() || !events->is_array()) continue;
    for (const auto& e : *events) {
      if (!is_replay_error(e)) continue;
      std::string message = e.value("message", "");
      message = message.substr(0, message.find('\n'));
      return fmt::format("run {} rank {}: {}: {}", id, e.value("rank", -1), e.value("py_type", ""),
                         message);
    }
  }
  return "";
}

report::RealCodeVerdict real_code_verdict(const properties::Conformance& c,
                                          const std::string& property) {
  report::RealCodeVerdict v;
  const properties::PropertyAgreement* p = find_agreement(c, property);
  const std::string real_verdict = p == nullptr
                                       ? std::string("cannot be judged from a trace")
                                       : std::string(properties::verdict_name(p->real.verdict));
  const std::string figures = "agree: " + report::conformance_fields(c);
  if (!c.agrees()) {
    v.outcome = report::RealCodeOutcome::kNotConfirmed;
    v.text =
        fmt::format("not confirmed: the real code disagrees ({}; {}; {} on the real code: {})",
                    (c.divergences.empty() ? "" : "first divergence: ") + first_disagreement(c),
                    figures, property, real_verdict);
  } else if (p == nullptr) {
    v.outcome = report::RealCodeOutcome::kNotJudgeable;
    v.text = fmt::format(
        "not judged on the real code: a trace cannot judge {} (the real run agrees with the model "
        "in every field the strict judge compares: {})",
        property, figures);
  } else if (p->real.verdict != properties::Verdict::kFail) {
    v.outcome = report::RealCodeOutcome::kNotJudgeable;
    v.text = fmt::format(
        "not judged on the real code: {} judged from either trace is {} (the model's failure "
        "needs what a trace does not hold; the traces agree: {})",
        property, real_verdict, figures);
  } else {
    v.outcome = report::RealCodeOutcome::kConfirmed;
    v.text = fmt::format("confirmed on the real code ({} fails there too: {}; {})", property,
                         p->real.detail, figures);
  }
  return v;
}

namespace {

// A reported failure on its way through the confirmation.
struct Pending {
  report::ReportedFailure* reported = nullptr;
  std::string plan;
  std::string trace;
};

std::string stem_of(const std::string& scenario_file) {
  const std::string suffix = ".json";
  return scenario_file.ends_with(suffix)
             ? scenario_file.substr(0, scenario_file.size() - suffix.size())
             : scenario_file;
}

report::RealCodeVerdict could_not_replay(const std::string& reason, const Pending& p) {
  return {report::RealCodeOutcome::kCouldNotReplay, "could not replay: " + reason, p.plan, ""};
}

// Step 1: the plan next to each minimal scenario; a stale trace removed. Scenarios whose plan
// cannot be written are decided here ("could not replay").
std::vector<Pending> write_plans(const ConfirmContext& ctx,
                                 std::vector<report::ReportedFailure>& reported) {
  std::vector<Pending> out;
  for (auto& r : reported) {
    Pending p{&r, stem_of(r.file) + ".plan.json",
              ctx.out_dir + "/" + fs::path(stem_of(r.file)).filename().string() + ".trace.json"};
    std::error_code ec;
    fs::remove(p.trace, ec);
    auto s = sim::load_scenario_file(r.file, *ctx.registry);
    std::ofstream plan_out(p.plan);
    if (s.is_ok() && plan_out) plan_out << report::replay_plan_json(s.value()).dump() << "\n";
    if (!s.is_ok() || !plan_out) {
      r.real_code = could_not_replay(
          "cannot write the plan " + p.plan + (s.is_ok() ? "" : ": " + s.status().message()), p);
      continue;
    }
    out.push_back(p);
  }
  return out;
}

std::vector<std::string> runner_argv(const ConfirmContext& ctx, const std::vector<Pending>& todo) {
  const RealCodeOptions& o = ctx.options;
  std::vector<std::string> argv = {
      o.python.empty() ? env_or("CKPTSIM_PYTHON", "python3") : o.python, "-m", "replay", "run"};
  for (const auto& p : todo) argv.insert(argv.end(), {"--plan", p.plan});
  argv.insert(argv.end(), {"--out-dir", ctx.out_dir});
  for (const auto& m : o.megatron) argv.insert(argv.end(), {"--megatron", m});
  if (!o.megatron_root.empty()) argv.insert(argv.end(), {"--megatron-root", o.megatron_root});
  argv.insert(argv.end(), o.replay_args.begin(), o.replay_args.end());
  return argv;
}

std::string shell_words(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) {
    const bool plain = !w.empty() && w.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLM"
                                         "NOPQRSTUVWXYZ0123456789-_./=:,+@") == std::string::npos;
    out += (out.empty() ? "" : " ") + (plain ? w : "'" + w + "'");
  }
  return out;
}

// Step 3 for one scenario: its trace, conformed with the model's run of the same file.
report::RealCodeVerdict judge_trace_of(const ConfirmContext& ctx, const Pending& p,
                                       const std::string& runner_failure) {
  std::error_code ec;
  if (!fs::exists(p.trace, ec)) {
    return could_not_replay(
        runner_failure.empty() ? "the runner wrote no trace " + p.trace : runner_failure, p);
  }
  auto real = read_trace(p.trace);
  if (!real.is_ok()) return could_not_replay(real.status().message(), p);
  if (std::string why = replay_problem(real.value()); !why.empty())
    return {report::RealCodeOutcome::kCouldNotReplay, "could not replay: " + why, p.plan, p.trace};
  auto s = sim::load_scenario_file(p.reported->file, *ctx.registry);
  if (!s.is_ok()) return could_not_replay(s.status().message(), p);
  auto run = sim::run_scenario(s.value());
  if (!run.is_ok()) return could_not_replay(run.status().message(), p);
  auto c = properties::conform(report::trace_json(run.value()), real.value(), p.trace,
                               &run.value().scenario);
  if (!c.is_ok()) return could_not_replay(c.status().message(), p);
  report::RealCodeVerdict v = real_code_verdict(c.value(), p.reported->failure->finding.property);
  v.plan = p.plan;
  v.trace = p.trace;
  return v;
}

}  // namespace

std::string confirm_on_real_code(const ConfirmContext& ctx,
                                 std::vector<report::ReportedFailure>& reported) {
  const std::vector<Pending> todo = write_plans(ctx, reported);
  if (todo.empty()) return "";
  auto dir = find_replay_dir(ctx.options.replay_dir);
  const std::vector<std::string> argv = runner_argv(ctx, todo);
  const std::string pythonpath =
      (dir.is_ok() ? dir.value() : "") +
      (std::getenv("PYTHONPATH") != nullptr ? ":" + std::string(std::getenv("PYTHONPATH")) : "");
  const std::string command = "PYTHONPATH=" + shell_words({pythonpath}) + " " + shell_words(argv);
  const std::string log_path = ctx.out_dir + "/replay.log";
  std::string runner_failure;
  if (!dir.is_ok()) {
    runner_failure = dir.status().message();
  } else {
    std::ofstream log(log_path);
    log << "$ " << command << "\n";
    if (ctx.progress) {
      ctx.progress(fmt::format("replaying {} minimal scenario(s) on the real code (log: {})",
                               todo.size(), log_path));
    }
    std::string last_line;
    auto exit = run_process({argv, {"PYTHONPATH=" + pythonpath}, [&](const std::string& line) {
                               log << line << "\n" << std::flush;
                               if (line.find_first_not_of(" \t") != std::string::npos)
                                 last_line = line;
                               if (ctx.progress) ctx.progress("replay: " + line);
                             }});
    if (!exit.is_ok()) {
      runner_failure = exit.status().message();
    } else if (!exit.value().ok()) {
      runner_failure =
          fmt::format("the runner failed ({}{}; its output is in {})", exit.value().describe(),
                      last_line.empty() ? "" : ": " + last_line, log_path);
    }
  }
  for (const auto& p : todo) p.reported->real_code = judge_trace_of(ctx, p, runner_failure);
  return command;
}

}  // namespace ckptsim::app
