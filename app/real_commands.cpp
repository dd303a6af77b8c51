// check --real and gate --real: the search of app/commands.cpp with the real engine as its judge
// (app/real_engine.h). What differs from the model's search:
//   - before anything is drawn, real_preflight: no checkout, a checkout without megatron/core,
//     torch missing in the runner's Python, no CUDA device -> exit 2 with the reason;
//   - an estimate before it starts (scenarios, runs, the wall time at the speed the last real
//     search measured on this machine), and the engine's figures on every progress line;
//   - each minimal scenario gets its real plan and trace beside it (<name>.plan.json,
//     <name>.trace.json), and the model's verdict beside the real one;
//   - model divergences and scenarios that could not be replayed are written and reported apart
//     (real-report.md; for gate, gate-report.md leads with what the graft changes);
//   - Ctrl-C or SIGTERM stops the search, which then writes what it found so far.
#include <fmt/format.h>

#include <csignal>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <regex>

#include "app/commands.h"
#include "app/real_engine.h"
#include "app/search_support.h"
#include "app/shard.h"
#include "report/search_report.h"
#include "search/gate.h"
#include "sim/scenario.h"

namespace ckptsim::app {

namespace fs = std::filesystem;
using namespace detail;  // NOLINT(google-build-using-namespace): app/search_support.h

namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int /*signal*/) { g_stop.store(true); }

// SIGINT and SIGTERM set g_stop while it lives (the search then stops and writes what it found).
class StopSignals {
 public:
  StopSignals() {
    g_stop.store(false);
    old_int_ = std::signal(SIGINT, on_stop_signal);
    old_term_ = std::signal(SIGTERM, on_stop_signal);
  }
  ~StopSignals() {
    std::signal(SIGINT, old_int_);
    std::signal(SIGTERM, old_term_);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  void (*old_int_)(int) = SIG_DFL;
  void (*old_term_)(int) = SIG_DFL;
};

// --profile-of SIDE=PROFILE values, by side.
Result<std::map<std::string, std::string>> profiles_of(const RealSearchOptions& r) {
  std::map<std::string, std::string> out;
  for (const auto& v : r.profile_of) {
    const size_t eq = v.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == v.size())
      return Status::invalid_input("--profile-of " + v + ": expected SIDE=PROFILE");
    out[v.substr(0, eq)] = v.substr(eq + 1);
  }
  return out;
}

// Maps each side to the profile the model runs it as (or none), as the flags say.
Status map_sides(const SearchCommand& c, model::RevisionRegistry& registry,
                 std::vector<RealSide>& sides) {
  auto explicit_profiles = profiles_of(c.real);
  if (!explicit_profiles.is_ok()) return explicit_profiles.status();
  for (auto& side : sides) {
    if (c.real.no_model) {
      side.model_profile.clear();
      side.model_reason = "--no-model";
      continue;
    }
    if (!side.model_profile.empty()) continue;  // a profile that names its checkout's commit
    const auto it = explicit_profiles.value().find(side.revision);
    const std::string given = it == explicit_profiles.value().end() ? "" : it->second;
    if (!given.empty() && !registry.get(given).is_ok())
      return Status::invalid_input("--profile-of " + side.revision + "=" + given +
                                   ": unknown profile");
    map_checkout_to_profile(registry, side, given);
  }
  return Status::ok();
}

// check --real: one side. `--megatron DIR` -> "checkout"; `--megatron REVISION=DIR` -> that
// profile on DIR; `--megatron-root` alone -> the --revision profile, found by its commit.
Result<std::vector<RealSide>> check_sides(const SearchCommand& c, const std::string& revision,
                                          model::RevisionRegistry& registry) {
  const auto& m = c.real_code.megatron;
  if (m.size() > 1)
    return Status::invalid_input("check --real replays one checkout: give --megatron once");
  std::vector<RealSide> sides;
  if (m.empty()) {
    if (c.real_code.megatron_root.empty()) return sides;  // real_preflight says why
    if (!registry.get(revision).is_ok())
      return Status::invalid_input("--revision " + revision + ": unknown profile");
    sides.push_back({revision, "", revision, "the --revision profile"});
  } else if (std::error_code ec; fs::is_directory(m[0], ec)) {
    sides.push_back({"checkout", m[0], "", ""});
  } else if (const size_t eq = m[0].find('='); eq != std::string::npos) {
    const std::string rev = m[0].substr(0, eq);
    if (!registry.get(rev).is_ok())
      return Status::invalid_input("--megatron " + m[0] + ": unknown revision " + rev);
    sides.push_back({rev, m[0].substr(eq + 1), rev, "the revision --megatron names"});
  } else {
    return Status::invalid_input("--megatron " + m[0] + ": no such directory");
  }
  if (Status s = map_sides(c, registry, sides); !s.is_ok()) return s;
  return sides;
}

// gate --real: "baseline" and "candidate" on --baseline-megatron / --candidate-megatron, or the
// --baseline / --candidate profiles found in --megatron-root by their commits.
Result<std::vector<RealSide>> gate_sides(const SearchCommand& c, const std::string& baseline,
                                         const std::string& candidate,
                                         model::RevisionRegistry& registry) {
  std::vector<RealSide> sides;
  for (const auto& [name, dir, profile] :
       {std::tuple{std::string("baseline"), c.real.baseline_megatron, baseline},
        std::tuple{std::string("candidate"), c.real.candidate_megatron, candidate}}) {
    if (!dir.empty()) {
      sides.push_back({name, dir, "", ""});
      if (!profile.empty()) sides.back().model_profile = profile;
      continue;
    }
    if (profile.empty()) {
      return Status::invalid_input(fmt::format(
          "gate --real: give --{0}-megatron DIR (or --{0} PROFILE with --megatron-root)", name));
    }
    if (c.real_code.megatron_root.empty()) {
      return Status::invalid_input(fmt::format(
          "gate --real --{0} {1}: give --{0}-megatron DIR, or --megatron-root ROOT to find {1}'s "
          "commit in",
          name, profile));
    }
    if (!registry.get(profile).is_ok())
      return Status::invalid_input(fmt::format("--{} {}: unknown profile", name, profile));
    sides.push_back({profile, "", profile, "the --" + name + " profile"});
  }
  if (sides[0].revision == sides[1].revision)
    return Status::invalid_input("gate --real: the baseline and the candidate are the same");
  if (Status s = map_sides(c, registry, sides); !s.is_ok()) return s;
  return sides;
}

std::string speed_file() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path base = xdg != nullptr && *xdg != '\0' ? fs::path(xdg)
                        : home != nullptr              ? fs::path(home) / ".cache"
                                                       : fs::temp_directory_path();
  return (base / "ckptsim" / "real-speed.json").string();
}

// "estimate: ..." before a real search starts.
std::string estimate_line(const search::SearchOptions& o, int parts, int runners) {
  int64_t runs = 0;
  const auto drawn = search::draw(o);
  for (const auto& s : drawn) runs += 1 + static_cast<int64_t>(s.phases.size());
  runs *= parts;
  std::string line = fmt::format(
      "estimate: {} scenario(s), {} run(s) of the real code (reference and phases; a finding "
      "adds its classification and shrinking)",
      static_cast<int64_t>(drawn.size()) * parts, runs);
  std::ifstream in(speed_file());
  const nlohmann::json j = in ? nlohmann::json::parse(in, nullptr, false) : nlohmann::json();
  if (j.is_object() && j.value("runs_per_s", 0.0) > 0) {
    const double rate = j.value("runs_per_s", 0.0) * runners / std::max(1, j.value("runners", 1));
    line += fmt::format(
        ", about {:.0f} s at {:.2f} runs/s ({} runner(s); measured {} with {} runner(s): {}, "
        "scaled by the runners)",
        static_cast<double>(runs) / rate, rate, runners, j.value("when", "?"),
        j.value("runners", 1), speed_file());
  } else {
    line += "; no speed measured on this machine yet (" + speed_file() +
            "): the progress lines give it as the search goes";
  }
  return line;
}

void record_speed(const RealEngineStats& s, double seconds, int runners) {
  if (s.runs < 20 || seconds <= 0) return;
  std::error_code ec;
  fs::create_directories(fs::path(speed_file()).parent_path(), ec);
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d", std::gmtime(&now));
  (void)write_json(speed_file(), {{"runs_per_s", static_cast<double>(s.runs) / seconds},
                                  {"runners", runners},
                                  {"when", when}});
}

std::string stats_text(const RealEngine& e) {
  const RealEngineStats s = e.stats();
  std::string model = e.model_beside() ? fmt::format("model beside it: {}/{} agree", s.model_agreed,
                                                     s.model_compared)
                                       : std::string("no model beside it");
  return fmt::format(
      "real: {} replays ({} could not{}), {} runs, {:.1f} runs/s per runner; {}", s.replays,
      s.could_not_replay,
      s.abandoned > 0 ? fmt::format(", {} abandoned at the stop", s.abandoned) : "", s.runs,
      s.replay_seconds > 0 ? static_cast<double>(s.runs) / s.replay_seconds : 0.0, model);
}

std::string stem_of(const std::string& file) {
  return file.ends_with(".json") ? file.substr(0, file.size() - 5) : file;
}

void copy_or_note(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
}

// A plan or trace copied next to a found scenario file, with the scenario's name that file gives
// it (the search judged it as "generated"), so that `ckptsim conform <found> <trace>` pairs them.
void copy_renamed(const std::string& from, const std::string& to,
                  const std::string& scenario_file) {
  std::ifstream sin(scenario_file);
  const nlohmann::json scenario = nlohmann::json::parse(sin, nullptr, false);
  std::ifstream in(from);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !scenario.is_object() || !scenario.contains("name")) {
    copy_or_note(from, to);
    return;
  }
  if (j.contains("plan") || j.value("format", "") == "ckptsim-trace")
    j["scenario"] = scenario["name"];
  if (j.value("format", "") == "ckptsim-replay-plan") j["scenario"]["name"] = scenario["name"];
  (void)write_json(to, j);
}

// Each minimal scenario's real plan and trace beside it, and its real_code verdict.
void annotate_found(const RealEngine& engine, std::vector<report::ReportedFailure>& reported) {
  for (auto& r : reported) {
    const auto kept = engine.kept(r.failure->minimal);
    report::RealCodeVerdict v;
    v.outcome = report::RealCodeOutcome::kConfirmed;
    if (!kept) {
      v.text = "found on the real code (its trace was not kept)";
    } else {
      v.plan = stem_of(r.file) + ".plan.json";
      v.trace = stem_of(r.file) + ".trace.json";
      copy_renamed(kept->plan, v.plan, r.file);
      copy_renamed(kept->trace, v.trace, r.file);
      v.text = "found on the real code (trace " + v.trace + "); the model " + kept->model;
    }
    r.real_code = v;
  }
}

// The log files a problem text names ("(log /x/y.log)", "its log: /x/y.log").
std::vector<std::string> logs_named(const std::string& text) {
  std::vector<std::string> out;
  static const std::regex kLog(R"(log:? (/[^ ;)]+\.log))");
  for (std::sregex_iterator it(text.begin(), text.end(), kLog), end; it != end; ++it)
    out.push_back((*it)[1].str());
  return out;
}

// The divergences and the scenarios that could not be replayed, written to out_dir; the
// Markdown section that lists them.
std::string write_real_extras(const SearchCommand& c, const RealEngine& engine) {
  std::string md = "\n## The model beside the real code\n\n";
  const RealEngineStats st = engine.stats();
  if (!engine.model_beside()) {
    md += "Not run: ";
    for (const auto& s : engine.options().sides)
      md += fmt::format("{} ({}); ", s.revision, s.model_reason.empty() ? "-" : s.model_reason);
    md += "the real side ran alone.\n";
  } else {
    md += fmt::format(
        "{} of {} replayed scenarios agree under the strict judge (ckptsim "
        "conform).\n",
        st.model_agreed, st.model_compared);
  }
  const auto divergences = engine.divergences();
  int k = 0;
  for (const auto& d : divergences) {
    const std::string base = fmt::format("{}/model-divergence-{}", c.out_dir, ++k);
    (void)write_json(base + ".json", sim::scenario_to_json(d.scenario));
    copy_or_note(d.real_trace, base + ".trace.json");
    copy_or_note(d.model_trace, base + ".model.trace.json");
    md += fmt::format(
        "\n- **model divergence** `{}` ({} scenario(s)): {}. Scenario `{}.json`, "
        "real trace `{}.trace.json`, model trace `{}.model.trace.json` ({})\n",
        d.signature, d.count, d.first, base, base, base, d.figures);
  }
  md += fmt::format(
      "\n## Could not replay\n\n{} replay(s) of {} gave no trace that stands for "
      "the real code.\n",
      st.could_not_replay, st.replays);
  k = 0;
  for (const auto& n : engine.could_not_replay()) {
    const std::string base = fmt::format("{}/could-not-replay-{}", c.out_dir, ++k);
    (void)write_json(base + ".json", sim::scenario_to_json(n.scenario));
    std::string logs;
    int li = 0;
    std::vector<std::string> named = logs_named(n.problem);
    if (!n.log.empty()) named.push_back(n.log);
    for (const auto& log : named) {
      const std::string to = fmt::format("{}.log{}", base, ++li);
      copy_or_note(log, to);
      logs += (logs.empty() ? "" : ", ") + to;
    }
    md += fmt::format("\n- {} scenario(s): {}. Scenario `{}.json`; logs: {}\n", n.count, n.problem,
                      base, logs.empty() ? "none" : logs);
  }
  return md;
}

struct RealRun {
  std::unique_ptr<RealEngine> engine;
  search::SearchOptions options;
  int runners = 1;
};

// Checks, starts the engine, and sets the search options the real search runs with.
Result<RealRun> start_real(const SearchCommand& c, std::vector<RealSide> sides,
                           model::RevisionRegistry& registry, std::ostream& err) {
  if (std::string why = real_preflight(c.real_code, sides); !why.empty())
    return Status::invalid_input("--real: " + why);
  auto options = search_options(c);
  if (!options.is_ok()) return options.status();
  RealRun run;
  run.runners = c.jobs > 0 ? c.jobs : 2;
  RealEngineOptions eo;
  eo.code = c.real_code;
  eo.sides = std::move(sides);
  eo.runners = run.runners;
  eo.work_dir = c.real.work_dir.empty() ? c.out_dir + "/real-work" : c.real.work_dir;
  eo.run_timeout_s = c.real.run_timeout;
  eo.scenario_timeout_s = c.real.scenario_timeout;
  eo.prestart_dp = c.real.prestart_dp;
  eo.keep_all = c.real.keep_all;
  eo.stop = &g_stop;
  const bool talk = !c.quiet && !c.json;
  if (talk) {
    err << fmt::format("real: starting {} runner(s) (logs in {})", run.runners, eo.work_dir)
        << std::endl;
    for (const auto& s : eo.sides) {
      err << fmt::format("real: {} = {}; the model beside it: {}", s.revision,
                         s.dir.empty() ? "--megatron-root " + c.real_code.megatron_root : s.dir,
                         s.model_profile.empty() ? "none (" + s.model_reason + ")"
                                                 : s.model_profile + " (" + s.model_reason + ")")
          << std::endl;
    }
  }
  auto engine = RealEngine::start(std::move(eo), registry);
  if (!engine.is_ok()) return engine.status();
  run.engine = std::move(engine.value());
  for (const auto& [name, profile] : run.engine->placeholders())
    (void)write_json(c.out_dir + "/" + name + ".profile.json", profile);
  run.options = options.value();
  run.options.jobs = run.runners;
  run.options.shrink_runs_max = c.real.shrink_runs_max;
  run.options.stop = &g_stop;
  return run;
}

std::string real_flags(const SearchCommand& c) {
  std::string out = " --real";
  for (const auto& m : c.real_code.megatron) out += " --megatron " + m;
  if (!c.real_code.megatron_root.empty()) out += " --megatron-root " + c.real_code.megatron_root;
  if (!c.real.baseline_megatron.empty()) out += " --baseline-megatron " + c.real.baseline_megatron;
  if (!c.real.candidate_megatron.empty())
    out += " --candidate-megatron " + c.real.candidate_megatron;
  for (const auto& p : c.real.profile_of) out += " --profile-of " + p;
  if (c.real.no_model) out += " --no-model";
  if (c.real.shrink_pre_existing) out += " --shrink-pre-existing";
  for (const auto& a : c.real_code.replay_args) out += " --replay-arg=" + a;
  if (c.jobs > 0) out += fmt::format(" --jobs {}", c.jobs);
  return out;
}

// "found after 51 s of its search, shrunk by 171 s (2 steps, 10 replays)", or "... not shrunk:
// why".
std::string found_and_shrunk(const search::Failure& f) {
  if (!f.not_shrunk.empty())
    return fmt::format("found after {:.0f} s of its search, {}", f.found_s, f.not_shrunk);
  return fmt::format(
      "found after {:.0f} s of its search, shrunk by {:.0f} s ({} steps, {} replays)", f.found_s,
      f.shrunk_s, f.shrink_steps, f.shrink_runs);
}

std::string real_report_md(const std::string& title, const std::string& repeat,
                           const search::SearchResult& result, const RealEngine& engine,
                           const std::vector<report::ReportedFailure>& reported) {
  std::string md = "# " + title + "\n\n";
  md += fmt::format("Repeat: `{}`\n\n", repeat);
  md += fmt::format("{} cases, {} replays in all, {:.1f} s{}; {}.\n\n", result.cases_run,
                    result.judge_runs, result.seconds,
                    result.stopped_by_time ? " (stopped early: time budget or a signal)" : "",
                    stats_text(engine));
  md += fmt::format("## Failures of the real code: {}\n\n", reported.size());
  for (const auto& r : reported) {
    const search::Failure& f = *r.failure;
    md += fmt::format(
        "- **{}** `{}` (case {}, {}): {}\n  - {} scenario `{}` ({} params, {} phases)\n  - "
        "{}\n",
        f.finding.property, f.finding.signature, f.case_index, found_and_shrunk(f),
        f.finding.detail, f.not_shrunk.empty() ? "minimal" : "drawn", r.file,
        f.minimal.params.size(), f.minimal.phases.size(), r.real_code ? r.real_code->text : "");
  }
  return md;
}

}  // namespace

int real_check_command(const SearchCommand& c, const std::string& revision, std::ostream& out,
                       std::ostream& err) {
  auto registry = load_registry(c.profiles);
  if (!registry.is_ok()) return invalid(err, registry.status().message());
  auto sides = check_sides(c, revision, registry.value());
  if (!sides.is_ok()) return invalid(err, sides.status().message());
  auto shard = choose_shard(c.shard, [](const char* name) { return std::getenv(name); });
  if (!shard.is_ok()) return invalid(err, shard.status().message());
  if (Status s = search::prepare_out_dir(c.out_dir); !s.is_ok()) return invalid(err, s.message());
  StopSignals signals;
  auto real = start_real(c, sides.value(), registry.value(), err);
  if (!real.is_ok()) return invalid(err, real.status().message());
  RealEngine& engine = *real.value().engine;
  search::SearchOptions& o = real.value().options;
  const std::string side = sides.value().front().revision;
  o.generator.revisions = {engine.revision(side)};
  o.shard = shard.value().shard;
  const bool talk = !c.quiet && !c.json;
  if (talk) err << "check --real: " << estimate_line(o, 1, real.value().runners) << std::endl;
  o.progress = [&](const std::string& line) {
    if (talk) err << "check --real: " << line << " | " << stats_text(engine) << std::endl;
  };
  engine.stop_after(o.time_budget_s);
  const search::SearchResult result = search::search(o, engine.check_judge(c.properties));
  record_speed(engine.stats(), result.seconds, real.value().runners);
  const search::Shard& part = shard.value().shard;
  const std::string whole =
      fmt::format("ckptsim check --revision {}{}{}{}", revision, search_repeat_flags(c),
                  real_flags(c), c.keep_going ? "" : " --first");
  const std::string repeat =
      whole + (part.whole() ? "" : fmt::format(" --shard {}/{}", part.index, part.count));
  std::vector<report::ReportedFailure> seen;
  const int rc =
      report_check(c, {side, whole, repeat, part, real.value().runners}, result, registry.value(),
                   out, err, [&](std::vector<report::ReportedFailure>& reported) {
                     annotate_found(engine, reported);
                     seen = reported;
                   });
  const std::string md =
      real_report_md("ckptsim check --real: " + side, repeat, result, engine, seen) +
      write_real_extras(c, engine);
  if (Status s = write_text(c.out_dir + "/real-report.md", md); !s.is_ok())
    return invalid(err, s.message());
  if (talk) {
    err << "check --real: " << stats_text(engine) << "; report " << c.out_dir << "/real-report.md"
        << std::endl;
  }
  return rc;
}

namespace {

// gate-report.md for --real: what the graft changes first, then the gate's own report, then the
// model beside it and what could not be replayed.
std::string real_gate_md(const SearchCommand& c, const GateNames& n,
                         const search::GateResult& result, const RealEngine& engine,
                         const std::vector<report::ReportedFailure>& reported) {
  std::string md = fmt::format("# ckptsim gate --real: {} → {}\n\n", n.baseline, n.candidate);
  md += fmt::format(
      "Verdict: **{}** (judged on the real code; {}).\n\n",
      result.introduced() ? "the candidate introduces failures" : "no new failure found",
      stats_text(engine));
  md += "## What the graft changes\n\n";
  const std::vector<std::pair<std::string, bool>> order = {{"new", true},
                                                           {"fixed by the candidate", false},
                                                           {"pre-existing", false},
                                                           {"unresolved", false}};
  for (const auto& [cls, _] : order) {
    int count = 0;
    for (const auto& r : reported) {
      if (r.classification.rfind(cls, 0) != 0) continue;
      ++count;
      const search::Failure& f = *r.failure;
      md += fmt::format(
          "- **{}** {} `{}`: {}\n  - case {}, {}\n  - {} scenario `{}` ({} params, {} "
          "phases){}\n",
          r.classification, f.finding.property, f.finding.signature, f.finding.detail, f.case_index,
          found_and_shrunk(f), f.not_shrunk.empty() ? "minimal" : "drawn", r.file,
          f.minimal.params.size(), f.minimal.phases.size(),
          r.real_code ? "; " + r.real_code->text : "");
    }
    if (count == 0) md += fmt::format("- {}: none found\n", cls);
  }
  md += "\n" + report::gate_markdown(n.baseline, n.candidate, n.repeat, result, reported);
  return md + write_real_extras(c, engine);
}

// The console (or --json) of gate --real.
void say_real_gate(const SearchCommand& c, const GateNames& names, const search::GateResult& result,
                   const RealEngine& engine, const std::vector<report::ReportedFailure>& reported,
                   std::ostream& out) {
  if (!c.quiet && !c.json) {
    say_gate_findings(reported, out);
    out << stats_text(engine) << std::endl;
    out << "report: " << c.out_dir << "/gate-report.md, " << c.out_dir << "/junit.xml" << std::endl;
    out << "repeat: " << names.repeat << std::endl;
  }
  if (c.json) {
    out << report::gate_json(names.baseline, names.candidate, c.seed, names.repeat,
                             result.introduced(), reported)
               .dump(2)
        << std::endl;
  }
}

}  // namespace

int real_gate_command(const SearchCommand& c, const std::string& baseline,
                      const std::string& candidate, std::ostream& out, std::ostream& err) {
  auto registry = load_registry(c.profiles);
  if (!registry.is_ok()) return invalid(err, registry.status().message());
  if (c.out_dir.empty()) return invalid(err, "--out is required");
  auto sides = gate_sides(c, baseline, candidate, registry.value());
  if (!sides.is_ok()) return invalid(err, sides.status().message());
  if (Status s = search::prepare_out_dir(c.out_dir); !s.is_ok()) return invalid(err, s.message());
  StopSignals signals;
  auto real = start_real(c, sides.value(), registry.value(), err);
  if (!real.is_ok()) return invalid(err, real.status().message());
  RealEngine& engine = *real.value().engine;
  const std::string base = sides.value()[0].revision;
  const std::string cand = sides.value()[1].revision;
  search::GateOptions g;
  g.baseline = engine.revision(base);
  g.candidate = engine.revision(cand);
  g.search = real.value().options;
  g.search.generator.revisions = {g.baseline, g.candidate};  // the estimate draws with both
  g.properties = c.properties;
  g.concurrent = true;
  if (!c.real.shrink_pre_existing) {
    // A pre-existing cause is the baseline's: each shrink candidate would cost two replays
    // (the candidate's and the all-baseline one) that the graft's own findings need.
    g.search.shrink_if = [](const search::Finding& f) {
      return f.gate_class != search::GateClass::kPreExisting;
    };
    g.search.not_shrunk_reason =
        "not shrunk: pre-existing, the baseline's own (--shrink-pre-existing shrinks it)";
  }
  g.judge = engine.gate_judge(base, c.properties);
  g.fixed_judge = engine.fixed_judge(cand, c.properties);
  const bool talk = !c.quiet && !c.json;
  if (talk) err << "gate --real: " << estimate_line(g.search, 3, real.value().runners) << std::endl;
  g.progress = [&](const std::string& part, const std::string& line) {
    if (talk)
      err << "gate --real " << part << ": " << line << " | " << stats_text(engine) << std::endl;
  };
  // The three searches run at once, each with the whole budget (search/gate.h).
  engine.stop_after(g.search.time_budget_s);
  const search::GateResult result = search::gate(g);
  double seconds = 0;
  for (const auto& p : result.parts) seconds = std::max(seconds, p.result.seconds);
  record_speed(engine.stats(), seconds, real.value().runners);
  const std::string repeat = fmt::format("ckptsim gate{}{} --out {}{}{}",
                                         baseline.empty() ? "" : " --baseline " + baseline,
                                         candidate.empty() ? "" : " --candidate " + candidate,
                                         c.out_dir, search_repeat_flags(c), real_flags(c));
  auto reported = write_gate_findings(c, result, repeat);
  if (!reported.is_ok()) return invalid(err, reported.status().message());
  annotate_found(engine, reported.value());
  const GateNames names{base + " (" + sides.value()[0].dir + ")",
                        cand + " (" + sides.value()[1].dir + ")", repeat};
  if (Status s = write_gate_files(c, names, result, reported.value()); !s.is_ok())
    return invalid(err, s.message());
  if (Status s = write_text(c.out_dir + "/gate-report.md",
                            real_gate_md(c, names, result, engine, reported.value()));
      !s.is_ok())
    return invalid(err, s.message());
  say_real_gate(c, names, result, engine, reported.value(), out);
  return result.introduced() ? kExitFail : kExitOk;
}

}  // namespace ckptsim::app
