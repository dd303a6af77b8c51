// `ckptsim inspect`: see app/commands.h.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "app/commands.h"
#include "model/megatron/optimizer_key.h"
#include "model/megatron/torch_dist_checkpoint.h"
#include "model/revision.h"
#include "model/storage.h"
#include "model/torch/distributed_checkpoint.h"
#include "properties/checkpoint_inspection.h"
#include "sim/checkpoint_scenario.h"
#include "sim/driver.h"

namespace ckptsim::app {

namespace {

using json = nlohmann::json;
using model::Value;

// Further steps each resume takes: two, so that a counter stuck at N+1 (the hybrid's GPU part
// after a resume, spec §10.4) shows as well as one that restarted.
constexpr int64_t kStepsAfterResume = 2;

std::string optimizer_text(const sim::Scenario& s, const model::TorchDistCheckpoint& c) {
  const model::OptimizerConfig& o = s.optimizer;
  std::string text = model::optimizer_kind_name(o.kind);
  if (o.kind == model::OptimizerKind::kHybrid) {
    text += fmt::format(" (HybridDeviceOptimizer), offload_fraction {}, TE {}", o.offload_fraction,
                        o.te_installed ? "installed" : "absent");
  }
  const Value* opt = c.sharded.dict()->find(model::format_object_key(0, "optimizer"));
  const Value* groups = opt && opt->is_dict() ? opt->dict()->find("param_groups") : nullptr;
  if (groups != nullptr && groups->is_list()) {
    text += fmt::format("; {} param group(s)", groups->list()->size());
    const Value& g0 = groups->list()->at(0);
    if (g0.is_dict()) {
      for (const char* k : {"cpu_optimizer_cls", "gpu_optimizer_cls"}) {
        if (const Value* v = g0.dict()->find(k)) text += fmt::format(", {} {}", k, v->repr());
      }
    }
  }
  const auto step = properties::saved_group_step(c);
  text += step ? fmt::format(", step {}", *step) : ", no step saved";
  return text;
}

std::vector<std::string> bucket_lines(const model::TorchDistCheckpoint& c) {
  std::vector<std::string> out;
  for (const auto& b : c.buckets) {
    std::string states;
    for (const auto& [name, t] : b.states) states += (states.empty() ? "" : ", ") + name;
    out.push_back(fmt::format("{}: {} elements ({})", model::format_bucket_prefix(b.key),
                              b.numel_unpadded, states));
  }
  return out;
}

struct Loaded {
  std::string iter_dir;
  model::DcpMetadata metadata;
};

// The tracker, the iteration directory and its `.metadata` (what the tiling check needs).
Result<Loaded> open_metadata(const model::Storage& storage) {
  auto iteration = model::read_checkpoint_tracker(storage, "");
  if (!iteration.is_ok()) return iteration.status();
  Loaded out;
  out.iter_dir = model::iteration_dir_name(iteration.value());
  model::DcpReader reader(storage, out.iter_dir);
  if (Status s = reader.open(); !s.is_ok()) return s;
  out.metadata = reader.metadata();
  return out;
}

json check_json(const properties::CheckpointCheck& k) {
  return json{{"name", k.name},
              {"outcome", properties::check_outcome_name(k.outcome)},
              {"detail", k.detail},
              {"lines", k.lines}};
}

json judgement_json(const properties::ResumeJudgement& j) {
  json out{{"revision", j.revision},
           {"dp", j.dp},
           {"correct", j.correct()},
           {"loaded", j.loaded},
           {"resumed_at", j.resumed_at},
           {"steps_used", j.steps_used},
           {"expected_first_t", j.expected_first_t},
           {"bias_correction_right", j.bias_correction_right},
           {"elements_compared", j.elements_compared},
           {"elements_equal", j.elements_equal},
           {"uncovered", j.uncovered}};
  out["errors"] = json::array();
  for (const auto& e : j.errors) {
    std::vector<std::string> path;
    for (const auto& k : e.merge_path) path.push_back(k.repr());
    out["errors"].push_back(json{{"rank", e.rank},
                                 {"stage", e.stage},
                                 {"type", e.py_type},
                                 {"message", e.message},
                                 {"site", e.site},
                                 {"merge_path", path}});
  }
  return out;
}

std::string judgement_text(const properties::ResumeJudgement& j) {
  std::string out = fmt::format("  {:<20} {}\n", j.revision,
                                j.correct() ? "resumes correctly" : "DOES NOT RESUME CORRECTLY");
  for (const auto& e : j.errors) {
    out += fmt::format("      {} {}\n", j.loaded ? "after the load:" : "fails:", e.summary());
    if (!e.merge_path.empty()) {
      std::vector<std::string> keys;
      for (const auto& k : e.merge_path) keys.push_back(k.repr());
      out += fmt::format("        at key path [{}]\n", fmt::join(keys, ", "));
    }
  }
  for (const auto& line : j.resumed_at) out += "      resumes at " + line + "\n";
  for (const auto& line : j.steps_used) out += "      " + line + "\n";
  if (j.loaded) {
    out += fmt::format(
        "      after the load: {} of {} elements of master, exp_avg and exp_avg_sq "
        "equal the checkpoint's\n",
        j.elements_equal, j.elements_compared);
  }
  for (const auto& u : j.uncovered) out += "      not written by the load: " + u + "\n";
  return out;
}

}  // namespace

Result<Inspection> inspect_checkpoint(const InspectCommand& c, std::ostream& progress) {
  const auto invalid = [&](const std::string& why) {
    return Status::invalid_input(c.dir + ": " + why);
  };
  std::error_code ec;
  if (!std::filesystem::is_directory(c.dir, ec)) return invalid("not a directory");
  model::DirectoryStorage storage(c.dir);
  auto opened = open_metadata(storage);
  if (!opened.is_ok()) return invalid(opened.status().to_string());
  Inspection r;
  const properties::CheckpointCheck tiling_unread =
      properties::check_shards_tile_buckets(opened.value().metadata, nullptr);
  auto read = model::read_torch_dist_checkpoint(storage, "");
  if (!read.is_ok()) {
    if (tiling_unread.outcome != properties::CheckOutcome::kFails) {
      return invalid(read.status().to_string());
    }
    r.checks.push_back(tiling_unread);
    r.unreadable = read.status().to_string();
    return r;
  }
  r.checkpoint = std::move(read.value());
  const model::TorchDistCheckpoint& ck = r.checkpoint;

  auto registry = model::RevisionRegistry::load_embedded();
  if (!registry.is_ok()) return invalid(registry.status().to_string());
  for (const auto& p : c.profiles) {
    if (Status s = registry.value().add_file(p); !s.is_ok()) return invalid(s.to_string());
  }
  std::vector<sim::Revision> revisions;
  for (const auto& name : c.revisions.empty() ? registry.value().names() : c.revisions) {
    auto rev = sim::resolve_revision(registry.value(), name);
    if (!rev.is_ok()) return invalid(rev.status().to_string());
    revisions.push_back(rev.value());
  }
  std::vector<std::pair<std::string, model::RevisionSwitches>> switches;
  for (const auto& rev : revisions) switches.emplace_back(rev.name, rev.profile->switches);

  r.checks = {properties::check_shards_tile_buckets(opened.value().metadata, &ck)};
  for (auto& k : properties::check_checkpoint(ck, switches)) r.checks.push_back(std::move(k));

  if (!c.scenario.empty()) {
    auto s = sim::load_scenario_file(c.scenario, registry.value());
    if (!s.is_ok()) return invalid(s.status().to_string());
    r.inferred.scenario = s.value();
    r.inferred.dp_at_save = ck.dp_size_at_save.value_or(std::max<int64_t>(ck.writer_ranks, 1));
    if (Status st = sim::check_scenario_fits(ck, r.inferred.scenario, r.inferred.dp_at_save);
        !st.is_ok()) {
      return invalid(st.to_string());
    }
  } else {
    auto s = sim::infer_scenario(ck, revisions.front());
    if (!s.is_ok()) return invalid("the model cannot resume it: " + s.status().to_string());
    r.inferred = s.value();
  }
  const sim::Scenario& scenario = r.inferred.scenario;
  r.dp = c.dp > 0 ? c.dp : r.inferred.dp_at_save;
  r.saved_step = properties::saved_group_step(ck).value_or(static_cast<double>(ck.iteration));

  model::MemoryStorage converted;
  if (Status s = model::write_checkpoint_contents(model::checkpoint_contents(ck), converted);
      !s.is_ok()) {
    return invalid("the model cannot hold it: " + s.to_string());
  }
  for (const auto& rev : revisions) {
    sim::PhaseSpec phase;
    phase.dp = r.dp;
    phase.steps = kStepsAfterResume;
    phase.save = false;
    phase.set_revision(rev);
    progress << fmt::format("inspect: resuming with {} at DP {}\n", rev.name, r.dp);
    const sim::PhaseRecord rec = sim::resume_from_checkpoint(scenario, phase, converted);
    r.judgements.push_back(properties::judge_resume(rec, scenario, ck, r.saved_step));
  }
  return r;
}

bool Inspection::ok() const {
  if (!unreadable.empty()) return false;
  for (const auto& k : checks) {
    if (k.outcome == properties::CheckOutcome::kFails) return false;
  }
  for (const auto& j : judgements) {
    if (!j.correct()) return false;
  }
  return true;
}

int inspect_command(const InspectCommand& c, std::ostream& out, std::ostream& err) {
  std::ostringstream quiet;
  auto inspected = inspect_checkpoint(c, c.json ? quiet : err);
  if (!inspected.is_ok()) {
    err << "ckptsim inspect: " << inspected.status().message() << "\n";
    return kExitInvalid;
  }
  const Inspection& r = inspected.value();
  if (!r.unreadable.empty()) {
    out << "checks\n  FAILS  " << r.checks.front().name << ": " << r.checks.front().detail << "\n";
    out << "the model cannot read it (" << r.unreadable << "), so no resume is simulated\n";
    return kExitFail;
  }
  const model::TorchDistCheckpoint& ck = r.checkpoint;
  const auto& checks = r.checks;
  const auto& judgements = r.judgements;
  const auto& inferred = r.inferred;
  const sim::Scenario& scenario = inferred.scenario;
  const int64_t dp = r.dp;
  const double saved_step = r.saved_step;
  const bool ok = r.ok();

  if (c.json) {
    json params = json::array();
    for (const auto& p : scenario.params) {
      params.push_back(json{{"name", p.name},
                            {"numel", p.numel},
                            {"dtype", p.dtype == model::DType::kBFloat16 ? "bf16" : "fp32"}});
    }
    json j{{"dir", c.dir},
           {"iter_dir", ck.iter_dir},
           {"iteration", ck.iteration},
           {"dp_size_at_save", ck.dp_size_at_save ? json(*ck.dp_size_at_save) : json(nullptr)},
           {"writer_ranks", ck.writer_ranks},
           {"sharding_type", ck.sharding_type},
           {"common_state",
            ck.common_from_sharded_object ? "ShardedObject common_state" : "common.pt"},
           {"optimizer", optimizer_text(scenario, ck)},
           {"params", params},
           {"buckets", bucket_lines(ck)},
           {"checks", json::array()},
           {"resume_dp", dp},
           {"resumes", json::array()},
           {"guesses", inferred.guesses},
           {"ok", ok}};
    for (const auto& k : checks) j["checks"].push_back(check_json(k));
    for (const auto& r : judgements) j["resumes"].push_back(judgement_json(r));
    out << j.dump(2) << "\n";
    return ok ? kExitOk : kExitFail;
  }

  out << fmt::format("checkpoint {}/{}\n", c.dir, ck.iter_dir);
  out << fmt::format(
      "  iteration {}, DP {} at save ({} ranks wrote data files), sharding {}, common "
      "state in {}\n",
      ck.iteration, ck.dp_size_at_save ? std::to_string(*ck.dp_size_at_save) : "unknown",
      ck.writer_ranks, ck.sharding_type,
      ck.common_from_sharded_object ? "the ShardedObject 'common_state'" : "common.pt");
  out << "  optimizer: " << optimizer_text(scenario, ck) << "\n";
  std::vector<std::string> params;
  for (const auto& p : scenario.params) {
    params.push_back(fmt::format("{} ({}, {})", p.name, p.numel,
                                 p.dtype == model::DType::kBFloat16 ? "bf16" : "fp32"));
  }
  out << "  params: " << fmt::format("{}", fmt::join(params, ", ")) << "\n";
  for (const auto& line : bucket_lines(ck)) out << "  bucket " << line << "\n";
  out << "checks\n";
  for (const auto& k : checks) {
    out << fmt::format("  {:<5}  {}: {}\n", properties::check_outcome_name(k.outcome), k.name,
                       k.detail);
    for (const auto& line : k.lines) out << "         " << line << "\n";
  }
  out << fmt::format(
      "resume from this checkpoint at DP {}, {} further steps (the model's simulation; "
      "right: t continues from the saved step {})\n",
      dp, kStepsAfterResume, saved_step);
  for (const auto& j : judgements) out << judgement_text(j);
  if (!inferred.guesses.empty()) {
    out << "what the model assumed (not in the checkpoint)\n";
    for (const auto& g : inferred.guesses) out << "  " << g << "\n";
  }
  size_t correct = 0;
  for (const auto& j : judgements) correct += j.correct() ? 1 : 0;
  size_t failed = 0;
  for (const auto& k : checks) failed += k.outcome == properties::CheckOutcome::kFails ? 1 : 0;
  out << fmt::format("inspect: {} of {} checks fail; {} of {} revisions resume it correctly\n",
                     failed, checks.size(), correct, judgements.size());
  return ok ? kExitOk : kExitFail;
}

Result<RealCheckpointsReport> real_checkpoints_report(const std::vector<std::string>& dirs,
                                                      std::ostream& out) {
  RealCheckpointsReport r;
  std::vector<std::string> rows;
  for (const auto& dir : dirs) {
    const std::string manifest = dir + "/fixtures.json";
    std::ifstream in(manifest);
    if (!in) return Status::invalid_input(manifest + ": cannot open");
    const json m = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!m.is_object() || !m.contains("fixtures") || !m["fixtures"].is_array()) {
      return Status::invalid_input(manifest + ": no 'fixtures' list");
    }
    for (const auto& f : m["fixtures"]) {
      const std::string name = f.value("dir", "");
      const std::string scenario_name = f.value("scenario", "");
      const int phase = f.value("phase", -1);
      std::ifstream sin(dir + "/runs/" + scenario_name + ".scenario.json");
      std::ifstream tin(dir + "/runs/" + scenario_name + ".trace.json");
      const json scenario = json::parse(sin, nullptr, false);
      const json trace = json::parse(tin, nullptr, false);
      if (name.empty() || phase < 0 || !scenario.is_object() || !trace.is_object()) {
        return Status::invalid_input(
            manifest + ": fixture '" + name +
            "': needs dir, phase and runs/<scenario>.{scenario,trace}.json");
      }
      const size_t next = static_cast<size_t>(phase) + 1;
      InspectCommand c;
      c.dir = dir + "/" + name;
      json resumed_run;
      if (next < scenario["phases"].size()) {
        c.revisions = {scenario["phases"][next]["revision"].get<std::string>()};
        c.dp = scenario["phases"][next]["dp"].get<int64_t>();
        for (const auto& run : trace["runs"]) {
          if (run.value("id", "") == "phase" + std::to_string(next)) resumed_run = run;
        }
      } else {
        c.revisions = {scenario["phases"][phase]["revision"].get<std::string>()};
      }
      std::ostringstream quiet;
      auto inspected = inspect_checkpoint(c, quiet);
      if (!inspected.is_ok()) return inspected.status();
      const Inspection& i = inspected.value();
      std::string failing;
      for (const auto& k : i.checks) {
        if (k.outcome == properties::CheckOutcome::kFails)
          failing += (failing.empty() ? "" : ", ") + k.name;
      }
      std::string real_text = "(no later phase resumed from it)";
      std::string model_text =
          i.judgements.empty() ? "" : properties::resume_outcome(i.judgements[0]).text();
      std::string verdict = "n/a";
      if (resumed_run.is_object() && !i.judgements.empty()) {
        const auto real = properties::resume_outcome(resumed_run);
        const auto model = properties::resume_outcome(i.judgements[0]);
        real_text = real.text();
        ++r.compared;
        if (real == model) {
          ++r.agreeing;
          verdict = "agree";
        } else {
          verdict = "**DISAGREE**";
        }
        out << fmt::format("{} {} (resumed by {} at DP {})",
                           real == model ? "agree   " : "DISAGREE", name, c.revisions[0], c.dp)
            << std::endl;
      }
      const auto& j = i.judgements.empty() ? properties::ResumeJudgement{} : i.judgements[0];
      rows.push_back(fmt::format("| `{}` | {} | {} at DP {} | {} | {} | {} of {} | {} |", name,
                                 failing.empty() ? "all hold" : failing, c.revisions[0], i.dp,
                                 real_text, model_text, j.elements_equal, j.elements_compared,
                                 verdict));
    }
  }
  r.markdown =
      "## Real checkpoints: the model resumes from the real code's files\n\n"
      "Generated by `ckptsim conform-campaign --real-checkpoints`: `ckptsim inspect` on every "
      "real checkpoint of `tests/fixtures/real-checkpoints/` (written by the real megatron.core), "
      "resumed by the revision and at the DP size of the phase that resumed from it in the real "
      "run, and what the real code did then (each rank's own error with its `merge()` key path, "
      "every Adam part's step counter after the load). Elements: master params and moments after "
      "the model's load that equal the checkpoint's, bit for bit.\n\n" +
      fmt::format("{} of {} real resumes: the model's resume from the same files agrees.\n\n",
                  r.agreeing, r.compared) +
      "| checkpoint | static checks failing | resumed by | the real code | the model | elements | "
      "|\n|---|---|---|---|---|---|---|\n";
  for (const auto& row : rows) r.markdown += row + "\n";
  return r;
}

}  // namespace ckptsim::app
