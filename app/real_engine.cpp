#include "app/real_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "app/confirm.h"
#include "model/errors.h"
#include "properties/conformance.h"
#include "properties/trace.h"
#include "report/conformance_report.h"
#include "report/trace_file.h"
#include "report/trace_json.h"
#include "search/gate.h"
#include "sim/driver.h"

namespace ckptsim::app {

namespace fs = std::filesystem;
using nlohmann::json;

struct RealEngine::Runner {
  std::unique_ptr<Child> child;
  std::string log;
  bool alive = false;
};

namespace {

// The problem of a replay a stop ended (RealEngine invariant 4).
constexpr const char* kAbandoned = "abandoned: the search stopped (a signal or its time budget)";

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

std::string python_of(const RealCodeOptions& code) {
  return code.python.empty() ? env_or("CKPTSIM_PYTHON", "python3") : code.python;
}

// The workers' interpreter: the runner's --python where --replay-arg gives one, else the
// runner's own.
std::string worker_python_of(const RealCodeOptions& code) {
  for (size_t i = 0; i < code.replay_args.size(); ++i) {
    const std::string& a = code.replay_args[i];
    if (a.rfind("--python=", 0) == 0) return a.substr(9);
    if (a == "--python" && i + 1 < code.replay_args.size()) return code.replay_args[i + 1];
  }
  return python_of(code);
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) return Status::io_error(path + ": cannot write");
  out << text;
  return out.good() ? Status::ok() : Status::io_error(path + ": cannot write");
}

// "HDO cpu AdamW w1[0:416] step" -> "HDO cpu AdamW step"; "master w0" -> "hash master".
std::string divergence_field_class(const std::string& field) {
  std::istringstream in(field);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  static const std::vector<std::string> kHashKinds = {"master", "exp_avg", "exp_avg_sq",
                                                      "model_param"};
  if (!words.empty() &&
      std::find(kHashKinds.begin(), kHashKinds.end(), words[0]) != kHashKinds.end())
    return "hash " + words[0];
  std::string out;
  for (const auto& w : words) {
    if (w.find('[') != std::string::npos) continue;
    out += (out.empty() ? "" : " ") + w;
  }
  return out;
}

std::string divergence_signature(const properties::Conformance& c) {
  if (!c.divergences.empty()) {
    const properties::Divergence& d = c.divergences.front();
    return "model_divergence:" + (d.at.empty() ? "" : d.at + ":") + divergence_field_class(d.field);
  }
  for (const auto& p : c.properties) {
    if (!p.agree()) return "model_divergence:verdict:" + p.property;
  }
  return "model_divergence:other";
}

bool wanted(const std::vector<std::string>& only, const std::string& property) {
  return only.empty() || std::find(only.begin(), only.end(), property) != only.end();
}

// The revision of the phase a trace verdict names ("phase2" -> phase 2's), "" for the reference.
std::string revision_of_run(const sim::Scenario& s, const std::string& run) {
  if (run.rfind("phase", 0) != 0) return "";
  const size_t index = static_cast<size_t>(std::atoll(run.c_str() + 5));
  return index < s.phases.size() ? s.phases[index].revision : "";
}

std::string scenario_key(const sim::Scenario& s) { return sim::scenario_to_json(s).dump(); }

}  // namespace

std::string checkout_commit(const std::string& dir) {
  std::ifstream stamp(fs::path(dir) / "CKPTSIM_UPSTREAM.json");
  if (stamp) {
    json j = json::parse(stamp, nullptr, false);
    if (j.is_object() && j.contains("commit") && j["commit"].is_string())
      return j["commit"].get<std::string>();
  }
  // git's answer only where the checkout is a work tree's top: a folder inside another repository
  // (a patched copy under ckptsim's own .megatron/) would otherwise get that repository's commit.
  std::string top;
  auto t = run_process(
      {{"git", "-C", dir, "rev-parse", "--show-toplevel"}, {}, [&](const std::string& l) {
         if (top.empty()) top = l;
       }});
  std::error_code ec;
  if (!t.is_ok() || !t.value().ok() ||
      fs::weakly_canonical(top, ec) != fs::weakly_canonical(dir, ec))
    return "";
  std::string out;
  auto e = run_process({{"git", "-C", dir, "rev-parse", "HEAD"}, {}, [&](const std::string& l) {
                          if (out.empty()) out = l;
                        }});
  if (!e.is_ok() || !e.value().ok()) return "";
  return out.find_first_not_of("0123456789abcdef") == std::string::npos && out.size() >= 7 ? out
                                                                                           : "";
}

void map_checkout_to_profile(model::RevisionRegistry& registry, RealSide& side,
                             const std::string& explicit_profile) {
  if (!explicit_profile.empty()) {
    side.model_profile = explicit_profile;
    side.model_reason = "--profile-of " + side.revision + "=" + explicit_profile;
    return;
  }
  const std::string commit = side.dir.empty() ? "" : checkout_commit(side.dir);
  if (commit.empty()) {
    side.model_reason =
        "the checkout names no commit (no CKPTSIM_UPSTREAM.json, not a git "
        "checkout), so no profile maps to it";
    return;
  }
  for (const auto& name : registry.names()) {
    auto p = registry.get(name);
    if (!p.is_ok() || !p.value().upstream) continue;
    const std::string& c = p.value().upstream->commit;
    const size_t n = std::min(c.size(), commit.size());
    if (n >= 7 && c.compare(0, n, commit, 0, n) == 0) {
      side.model_profile = name;
      side.model_reason =
          fmt::format("its commit {} is {}'s upstream commit", commit.substr(0, 10), name);
      return;
    }
  }
  side.model_reason = fmt::format(
      "no profile names its commit {} (give --profile-of {}=PROFILE to run the model beside it)",
      commit.substr(0, 10), side.revision);
}

std::string real_preflight(const RealCodeOptions& code, const std::vector<RealSide>& sides) {
  std::error_code ec;
  bool any = !code.megatron_root.empty();
  for (const auto& s : sides) {
    if (s.dir.empty()) continue;
    any = true;
    if (!fs::is_directory(s.dir, ec))
      return s.revision + " checkout " + s.dir + ": no such directory";
    if (!fs::is_directory(fs::path(s.dir) / "megatron" / "core", ec))
      return s.revision + " checkout " + s.dir + ": it holds no megatron/core";
  }
  if (!any) return "no checkout: name one with --megatron DIR (or --megatron-root ROOT)";
  if (!code.megatron_root.empty() && !fs::is_directory(code.megatron_root, ec))
    return "--megatron-root " + code.megatron_root + ": no such directory";
  const std::string python = worker_python_of(code);
  const char* script =
      "import json\n"
      "try:\n"
      "    import torch\n"
      "except Exception as e:\n"
      "    print(json.dumps({'error': '%s: %s' % (type(e).__name__, e)}))\n"
      "else:\n"
      "    print(json.dumps({'torch': torch.__version__, 'gpus': torch.cuda.device_count()}))\n";
  std::string last;
  auto e = run_process({{python, "-c", script}, {}, [&](const std::string& l) {
                          if (!l.empty() && l[0] == '{') last = l;
                        }});
  if (!e.is_ok()) return "the runner's Python: " + e.status().message();
  const json j = json::parse(last, nullptr, false);
  if (!j.is_object())
    return fmt::format("the runner's Python ({}) did not answer ({})", python,
                       e.value().describe());
  if (j.contains("error"))
    return fmt::format("torch is missing in the runner's Python ({}): {}", python,
                       j["error"].get<std::string>());
  if (j.value("gpus", 0) < 1)
    return fmt::format("no CUDA device is visible to the runner's Python ({}, torch {})", python,
                       j.value("torch", "?"));
  return "";
}

RealEngine::RealEngine(RealEngineOptions options) : options_(std::move(options)) {}

RealEngine::~RealEngine() {
  for (auto& r : runners_) {
    if (r && r->child && r->alive) {
      r->child->send_line(R"({"cmd": "exit"})");
      std::string line;
      r->child->read_line(5, line);
      r->child->kill();
    }
  }
}

Result<std::unique_ptr<RealEngine>> RealEngine::start(RealEngineOptions options,
                                                      model::RevisionRegistry& registry) {
  CKPTSIM_CHECK(options.runners >= 1, "a real engine without runners");
  auto dir = find_replay_dir(options.code.replay_dir);
  if (!dir.is_ok()) return dir.status();
  std::error_code ec;
  fs::create_directories(fs::path(options.work_dir) / "scenarios", ec);
  if (ec) return Status::io_error(options.work_dir + ": cannot create: " + ec.message());
  std::unique_ptr<RealEngine> e(new RealEngine(std::move(options)));
  e->replay_dir_ = dir.value();
  for (const auto& side : e->options_.sides) {
    if (!registry.get(side.revision).is_ok()) {
      const json profile = {
          {"name", side.revision},
          {"extends", side.model_profile.empty() ? "upstream-head" : side.model_profile},
          {"description", "the real checkout " +
                              (side.dir.empty() ? "(--megatron-root)" : side.dir) +
                              " (a placeholder of the real engine)"}};
      if (Status s = registry.add(profile.dump(), "the real engine"); !s.is_ok()) return s;
      e->placeholders_[side.revision] = profile;
    }
    auto r = sim::resolve_revision(registry, side.revision);
    if (!r.is_ok()) return r.status();
    e->revisions_[side.revision] = r.value();
  }
  for (size_t i = 0; i < static_cast<size_t>(e->options_.runners); ++i) {
    e->runners_.push_back(std::make_unique<Runner>());
    if (Status s = e->start_runner(i); !s.is_ok()) return s;
    e->idle_.push_back(i);
  }
  return e;
}

std::vector<std::string> RealEngine::runner_argv(size_t index) const {
  const RealEngineOptions& o = options_;
  std::vector<std::string> argv = {
      python_of(o.code), "-m",
      "replay",          "serve",
      "--work-dir",      (fs::path(o.work_dir) / fmt::format("runner-{}", index)).string(),
      "--device-offset", std::to_string(index),
      "--run-timeout",   fmt::format("{}", o.run_timeout_s),
      "--prestart-dp",   std::to_string(o.prestart_dp)};
  for (const auto& s : o.sides) {
    if (!s.dir.empty()) argv.insert(argv.end(), {"--megatron", s.revision + "=" + s.dir});
  }
  if (!o.code.megatron_root.empty())
    argv.insert(argv.end(), {"--megatron-root", o.code.megatron_root});
  argv.insert(argv.end(), o.code.replay_args.begin(), o.code.replay_args.end());
  return argv;
}

Status RealEngine::start_runner(size_t index) {
  Runner& r = *runners_[index];
  if (r.child) r.child->kill();
  r.alive = false;
  r.log = (fs::path(options_.work_dir) / fmt::format("runner-{}.log", index)).string();
  const char* pp = std::getenv("PYTHONPATH");
  auto child = Child::start(
      runner_argv(index),
      {"PYTHONPATH=" + replay_dir_ + (pp != nullptr ? ":" + std::string(pp) : "")}, r.log);
  if (!child.is_ok()) return child.status();
  r.child = std::move(child.value());
  std::string line;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.start_timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    const double left =
        std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    const Child::Read got = r.child->read_line(std::min(left, 0.5), line);
    if (got == Child::Read::kEof) {
      return Status::io_error(fmt::format("runner {} exited before it said hello ({}; its log: {})",
                                          index, r.child->describe_exit(), r.log));
    }
    if (got == Child::Read::kTimeout) {
      if (options_.stop != nullptr && options_.stop->load()) return Status::io_error("stopped");
      continue;
    }
    const json hello = json::parse(line, nullptr, false);
    if (!hello.is_object() || hello.value("type", "") != "hello") continue;
    if (!hello.value("ok", false)) {
      return Status::invalid_input(fmt::format("runner {}: {} (its log: {})", index,
                                               hello.value("error", "no reason given"), r.log));
    }
    r.alive = true;
    return Status::ok();
  }
  r.child->kill();
  return Status::io_error(fmt::format("runner {} did not say hello within {:.0f} s (its log: {})",
                                      index, options_.start_timeout_s, r.log));
}

const sim::Revision& RealEngine::revision(const std::string& side) const {
  auto it = revisions_.find(side);
  CKPTSIM_CHECK(it != revisions_.end(), "no side " + side);
  return it->second;
}

sim::Scenario RealEngine::on_side(const sim::Scenario& s, const std::string& side) const {
  sim::Scenario out = s;
  for (auto& p : out.phases) p.set_revision(revision(side));
  return out;
}

bool RealEngine::model_beside() const {
  return std::all_of(options_.sides.begin(), options_.sides.end(),
                     [](const RealSide& s) { return !s.model_profile.empty(); });
}

bool RealEngine::stopped() const {
  if (options_.stop != nullptr && options_.stop->load()) return true;
  const int64_t deadline = deadline_ns_.load();
  return deadline != 0 && std::chrono::steady_clock::now().time_since_epoch().count() >= deadline;
}

void RealEngine::stop_after(double seconds) {
  if (seconds <= 0) {
    deadline_ns_.store(0);
    return;
  }
  const auto at = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(seconds));
  deadline_ns_.store(at.time_since_epoch().count());
}

std::optional<size_t> RealEngine::acquire(std::string& problem) {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (stopped()) {
      problem = kAbandoned;
      return std::nullopt;
    }
    const bool any_alive =
        std::any_of(runners_.begin(), runners_.end(), [](const auto& x) { return x->alive; });
    if (!any_alive && idle_.empty()) {
      problem = "no runner is left (each failed to restart; see the runner logs)";
      return std::nullopt;
    }
    if (!idle_.empty()) break;
    free_.wait_for(lock, std::chrono::milliseconds(200));
  }
  const size_t index = idle_.back();
  idle_.pop_back();
  return index;
}

bool RealEngine::exchange(Runner& runner, int64_t id, double timeout, ReplayResult& r) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  if (!runner.alive) {
    r.problem = "the runner is down";
    return true;
  }
  if (!runner.child->send_line(
          json{{"id", id}, {"plan", r.plan_path}, {"out", r.trace_path}}.dump())) {
    r.problem = fmt::format("the runner's stdin is closed ({}; its log: {})",
                            runner.child->describe_exit(), runner.log);
    return true;
  }
  for (;;) {
    std::string line;
    const Child::Read got = runner.child->read_line(0.5, line);
    if (got == Child::Read::kEof) {
      r.problem = fmt::format("the runner exited ({}; its log: {})", runner.child->describe_exit(),
                              runner.log);
      return true;
    }
    if (got == Child::Read::kTimeout) {
      if (stopped()) {
        r.problem = kAbandoned;
        return true;
      }
      if (seconds() > timeout) {
        r.problem = fmt::format(
            "the runner did not answer within {:.0f} s: killed with its workers (its log: {})",
            timeout, runner.log);
        return true;
      }
      continue;
    }
    const json msg = json::parse(line, nullptr, false);
    if (!msg.is_object() || msg.value("id", int64_t{-1}) != id) continue;
    if (msg.value("type", "") != "done")
      r.problem = "the runner could not replay it: " + first_line(msg.value("message", "?"));
    return false;
  }
}

void RealEngine::release(size_t index, bool restart, const ReplayResult& r) {
  Runner& runner = *runners_[index];
  if (restart) {
    runner.child->kill();
    runner.alive = false;
    if (!stopped() && start_runner(index).is_ok()) runner.alive = true;
  }
  {
    std::lock_guard lock(mutex_);
    if (runner.alive) idle_.push_back(index);
    ++stats_.replays;
    stats_.runs += r.runs;
    stats_.replay_seconds += r.seconds;
  }
  free_.notify_one();
}

void RealEngine::conclude(const sim::Scenario& s, ReplayResult& r) {
  if (r.problem.empty()) {
    auto t = report::read_trace_file(r.trace_path);
    if (!t.is_ok()) {
      r.problem = t.status().message();
    } else if (std::string why = replay_problem(t.value()); !why.empty()) {
      r.problem = why + fmt::format(" (the runner's log: {})", r.log_path);
      r.trace = std::move(t.value());
    } else {
      r.trace = std::move(t.value());
      r.replayed = true;
    }
  }
  if (r.replayed) return;
  std::lock_guard lock(mutex_);
  if (r.problem == kAbandoned) {
    // Counted where a runner had it (log_path is set once one is acquired); a replay refused
    // before it started is no replay at all.
    r.abandoned = true;
    if (!r.log_path.empty()) ++stats_.abandoned;
    return;
  }
  ++stats_.could_not_replay;
  const std::string key = first_line(r.problem).substr(0, 80);
  auto it = std::find_if(could_not_.begin(), could_not_.end(),
                         [&](const CouldNotReplay& c) { return c.problem.substr(0, 80) == key; });
  if (it == could_not_.end()) {
    could_not_.push_back({r.problem, s, r.plan_path, r.log_path, 1});
  } else {
    ++it->count;
  }
}

ReplayResult RealEngine::replay(const sim::Scenario& s) {
  ReplayResult r;
  int64_t id = 0;
  {
    std::lock_guard lock(mutex_);
    id = next_id_++;
  }
  const fs::path dir = fs::path(options_.work_dir) / "scenarios";
  r.plan_path = (dir / fmt::format("s{}.plan.json", id)).string();
  r.trace_path = (dir / fmt::format("s{}.trace.json", id)).string();
  const json plan = report::replay_plan_json(s);
  r.runs = static_cast<int64_t>(plan["runs"].size());
  if (Status w = write_file(r.plan_path, plan.dump() + "\n"); !w.is_ok()) {
    r.problem = w.message();
    conclude(s, r);
    return r;
  }
  const double timeout = options_.scenario_timeout_s > 0
                             ? options_.scenario_timeout_s
                             : static_cast<double>(r.runs) * (options_.run_timeout_s + 60) + 300;
  const std::optional<size_t> index = acquire(r.problem);
  if (!index) {
    conclude(s, r);
    return r;
  }
  r.log_path = runners_[*index]->log;
  const auto t0 = std::chrono::steady_clock::now();
  const bool restart = exchange(*runners_[*index], id, timeout, r);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  release(*index, restart, r);
  conclude(s, r);
  return r;
}

void RealEngine::beside(const sim::Scenario& s, const ReplayResult& r, std::string& model_text) {
  if (!model_beside()) {
    std::string why;
    for (const auto& side : options_.sides) {
      if (side.model_profile.empty())
        why += (why.empty() ? "" : "; ") + side.revision + ": " + side.model_reason;
    }
    model_text = "not run beside it (" + why + ")";
    return;
  }
  auto run = sim::run_scenario(s);
  if (!run.is_ok()) {
    model_text = "the model could not run it: " + run.status().message();
    return;
  }
  const json model_trace = report::trace_json(run.value());
  auto c = properties::conform(model_trace, r.trace, r.trace_path, &s);
  if (!c.is_ok()) {
    model_text = "not compared: " + c.status().message();
    return;
  }
  std::lock_guard lock(mutex_);
  ++stats_.model_compared;
  if (c.value().agrees()) {
    ++stats_.model_agreed;
    model_text = "agrees with the real code (" + report::conformance_fields(c.value()) + ")";
    return;
  }
  const std::string signature = divergence_signature(c.value());
  model_text = "DIVERGES from the real code: " + first_disagreement(c.value());
  auto it = std::find_if(divergences_.begin(), divergences_.end(),
                         [&](const ModelDivergence& d) { return d.signature == signature; });
  if (it != divergences_.end()) {
    ++it->count;
    return;
  }
  const std::string model_path =
      r.trace_path.substr(0, r.trace_path.size() - std::string(".trace.json").size()) +
      ".model.trace.json";
  (void)write_file(model_path, model_trace.dump(1) + "\n");
  divergences_.push_back({signature, first_disagreement(c.value()),
                          report::conformance_fields(c.value()), s, r.trace_path, model_path, 1});
}

void RealEngine::keep(const sim::Scenario& s, const ReplayResult& r,
                      const std::string& model_text) {
  std::lock_guard lock(mutex_);
  kept_[scenario_key(s)] = {r.plan_path, r.trace_path, model_text};
}

void RealEngine::discard(const ReplayResult& r) const {
  if (options_.keep_all) return;
  {
    std::lock_guard lock(mutex_);
    for (const auto& d : divergences_) {
      if (d.real_trace == r.trace_path) return;  // a divergence's evidence
    }
    for (const auto& c : could_not_) {
      if (c.plan == r.plan_path) return;
    }
  }
  std::error_code ec;
  fs::remove(r.plan_path, ec);
  fs::remove(r.trace_path, ec);
}

RealEngine::Judged RealEngine::judge_real(const sim::Scenario& s,
                                          const std::vector<std::string>& properties) {
  Judged out;
  out.replay = replay(s);
  if (!out.replay.replayed) return out;
  beside(s, out.replay, out.model_text);
  for (const auto& v : properties::judge_trace(out.replay.trace, &s)) {
    if (v.verdict != properties::Verdict::kFail || !wanted(properties, v.property)) continue;
    out.runs.push_back(v.run);
    out.failures.push_back(search::Finding{v.property,
                                           v.signature.empty() ? v.property : v.signature, v.detail,
                                           revision_of_run(s, v.run), std::nullopt});
  }
  return out;
}

std::optional<search::Finding> RealEngine::conclude_judged(const sim::Scenario& s, const Judged& j,
                                                           std::optional<search::Finding> f) {
  if (f) {
    keep(s, j.replay, j.model_text);
  } else if (j.replay.replayed) {
    discard(j.replay);
  }
  return f;
}

search::Judge RealEngine::check_judge(std::vector<std::string> properties) {
  return [this, properties](const sim::Scenario& s) -> std::optional<search::Finding> {
    const Judged j = judge_real(s, properties);
    return conclude_judged(s, j,
                           j.failures.empty() ? std::nullopt : std::optional(j.failures.front()));
  };
}

search::Judge RealEngine::gate_judge(const std::string& baseline,
                                     std::vector<std::string> properties) {
  return [this, baseline, properties](const sim::Scenario& s) -> std::optional<search::Finding> {
    Judged j = judge_real(s, properties);
    if (j.failures.empty()) return conclude_judged(s, j, std::nullopt);
    const sim::Scenario on_baseline = on_side(s, baseline);
    const ReplayResult base = replay(on_baseline);
    const auto base_verdicts = base.replayed ? properties::judge_trace(base.trace, &on_baseline)
                                             : std::vector<properties::TraceVerdict>{};
    auto base_trace = base.replayed ? properties::trace::parse(base.trace, base.trace_path)
                                    : Result<properties::trace::Trace>(Status::not_found(""));
    auto cand_trace = properties::trace::parse(j.replay.trace, j.replay.trace_path);
    discard(base);
    // Each failing property classed against the all-baseline run; a new one wins over one the
    // baseline shares, so that a pre-existing failure never hides a new one in the same scenario.
    for (size_t i = 0; i < j.failures.size(); ++i) {
      search::Finding& f = j.failures[i];
      properties::PropertyResult all_baseline{f.property, properties::Verdict::kNotEvaluated,
                                              base.problem, "", -1};
      for (const auto& v : base_verdicts) {
        if (v.property != f.property) continue;
        all_baseline.verdict = v.verdict;
        all_baseline.detail = v.detail;
        all_baseline.signature = v.signature;
      }
      // A baseline that stopped before the candidate's failure point judged nothing there.
      if (base_trace.is_ok() && cand_trace.is_ok() &&
          all_baseline.verdict != properties::Verdict::kNotEvaluated &&
          f.signature != all_baseline.signature) {
        std::string why =
            properties::trace::stopped_before(base_trace.value(), cand_trace.value(), j.runs[i]);
        if (!why.empty()) {
          all_baseline.verdict = properties::Verdict::kNotEvaluated;
          all_baseline.detail = why;
        }
      }
      f.gate_class = search::gate_class(f, all_baseline, baseline);
    }
    return conclude_judged(s, j, search::gate_pick(j.failures));
  };
}

search::Judge RealEngine::fixed_judge(const std::string& candidate,
                                      std::vector<std::string> properties) {
  return [this, candidate, properties](const sim::Scenario& s) -> std::optional<search::Finding> {
    Judged j = judge_real(s, properties);
    if (j.failures.empty()) return conclude_judged(s, j, std::nullopt);
    const sim::Scenario on_candidate = on_side(s, candidate);
    const ReplayResult cand = replay(on_candidate);
    const auto cand_verdicts = cand.replayed ? properties::judge_trace(cand.trace, &on_candidate)
                                             : std::vector<properties::TraceVerdict>{};
    discard(cand);
    auto base_trace = properties::trace::parse(j.replay.trace, j.replay.trace_path);
    auto cand_trace = cand.replayed ? properties::trace::parse(cand.trace, cand.trace_path)
                                    : Result<properties::trace::Trace>(Status::not_found(""));
    // The first property the baseline fails and the candidate keeps, having reached the point
    // where the baseline failed (a candidate that stops earlier keeps nothing there).
    for (size_t i = 0; i < j.failures.size(); ++i) {
      search::Finding& f = j.failures[i];
      if (base_trace.is_ok() && cand_trace.is_ok() &&
          !properties::trace::stopped_before(cand_trace.value(), base_trace.value(), j.runs[i])
               .empty())
        continue;
      for (const auto& v : cand_verdicts) {
        if (v.property != f.property || v.verdict != properties::Verdict::kPass) continue;
        f.gate_class = search::GateClass::kFixed;
        return conclude_judged(s, j, f);
      }
    }
    return conclude_judged(s, j, std::nullopt);
  };
}

RealEngineStats RealEngine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::vector<ModelDivergence> RealEngine::divergences() const {
  std::lock_guard lock(mutex_);
  return divergences_;
}

std::vector<CouldNotReplay> RealEngine::could_not_replay() const {
  std::lock_guard lock(mutex_);
  return could_not_;
}

std::optional<KeptReplay> RealEngine::kept(const sim::Scenario& s) const {
  std::lock_guard lock(mutex_);
  auto it = kept_.find(scenario_key(s));
  if (it == kept_.end()) return std::nullopt;
  return it->second;
}

}  // namespace ckptsim::app
