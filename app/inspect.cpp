// `ckptsim inspect`: see app/commands.h.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "app/commands.h"
#include "model/megatron/checkpoint_damage.h"
#include "model/megatron/optimizer_key.h"
#include "model/megatron/torch_dist_checkpoint.h"
#include "model/megatron/torch_dist_writer.h"
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

std::string to_upper(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

std::string optimizer_text(const sim::Scenario& s, const model::TorchDistCheckpoint& c) {
  const model::OptimizerConfig& o = s.optimizer;
  std::string text = model::optimizer_kind_name(o.kind);
  if (o.kind == model::OptimizerKind::kHybrid) {
    text += fmt::format(" (HybridDeviceOptimizer), offload_fraction {}, TE {}", o.offload_fraction,
                        o.te_installed ? "installed" : "absent");
  }
  if (o.te_precision_aware()) {
    text += fmt::format(
        " precision-aware (exp_avg {}, exp_avg_sq {}, {})",
        model::state_dtype_name(o.exp_avg_dtype), model::state_dtype_name(o.exp_avg_sq_dtype),
        o.store_param_remainders ? "bf16 masters as int16 remainders" : "fp32 masters");
  }
  const int64_t parts = model::chained_parts(c);
  if (parts > 1) text += fmt::format("; a ChainedOptimizer of {} parts", parts);
  for (int64_t part = 0; part < parts; ++part) {
    const Value* opt = model::optimizer_state_object(c, part);
    const Value* groups = opt != nullptr ? opt->dict()->find("param_groups") : nullptr;
    if (groups == nullptr || !groups->is_list() || groups->list()->empty()) continue;
    text += fmt::format("; {}{} param group(s)", parts > 1 ? fmt::format("part {}: ", part) : "",
                        groups->list()->size());
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
    out.push_back(
        fmt::format("{}: {} elements ({})", model::bucket_key_text(b), b.numel_unpadded, states));
  }
  return out;
}

struct Loaded {
  std::string iter_dir;
  model::DcpMetadata metadata;
};

// Where the checkpoint is: DIR holding the tracker, as --save leaves it (iter_dir "": the
// tracker names it), or the iteration directory itself, the one holding `.metadata` (as a bug
// report attaches it; the storage is rooted at its parent).
struct Source {
  std::string root;
  std::string iter_dir;
};

Source locate(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "a/b/" -> "a/b"
  std::error_code ec;
  if (!fs::exists(p / std::string(model::kTrackerFile), ec) && fs::exists(p / ".metadata", ec)) {
    const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
    return {parent.string(), p.filename().string()};
  }
  return {dir, ""};
}

// The iteration directory (the tracker's, unless the source names it) and its `.metadata`
// (what the tiling check needs).
Result<Loaded> open_metadata(const model::Storage& storage, const Source& source) {
  Loaded out;
  out.iter_dir = source.iter_dir;
  if (out.iter_dir.empty()) {
    auto iteration = model::read_checkpoint_tracker(storage, "");
    if (!iteration.is_ok()) return iteration.status();
    out.iter_dir = model::iteration_dir_name(iteration.value());
    if (!storage.exists(out.iter_dir)) {
      // A save that crashed after the tracker (or a tracker copied without its data): say
      // which iterations are there, each readable as DIR/iter_NNNNNNN.
      std::vector<std::string> present;
      if (auto names = storage.list(""); names.is_ok()) {
        for (const auto& n : names.value()) {
          if (n.starts_with("iter_")) present.push_back(n);
        }
      }
      return Status::not_found(
          fmt::format("{}: names iteration {}, but {} is absent{}", model::kTrackerFile,
                      iteration.value(), out.iter_dir,
                      present.empty() ? std::string(" (and no other iteration directory is there)")
                                      : fmt::format("; present: {} (inspect DIR/{} reads one)",
                                                    fmt::join(present, ", "), present.back())));
    }
  }
  model::DcpReader reader(storage, out.iter_dir);
  if (Status s = reader.open(); !s.is_ok()) return s;
  out.metadata = reader.metadata();
  return out;
}

json check_json(const properties::CheckpointCheck& k) {
  return json{{"name", k.name},
              {"property", k.property},
              {"outcome", properties::check_outcome_name(k.outcome)},
              {"detail", k.detail},
              {"lines", k.lines}};
}

json judgement_json(const properties::ResumeJudgement& j, const ResumeVerdict& v) {
  json out{{"revision", j.revision},
           {"class", resume_class_text(v.outcome)},
           {"cause", v.cause},
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

std::string judgement_text(const properties::ResumeJudgement& j, const ResumeVerdict& v) {
  std::string out = fmt::format("  {:<20} {}\n", j.revision,
                                v.outcome == ResumeClass::kResumesCorrectly
                                    ? resume_class_text(v.outcome)
                                    : to_upper(resume_class_text(v.outcome)));
  if (v.outcome == ResumeClass::kCannotRunConfiguration) {
    return out + "      " + v.cause + "\n";
  }
  for (const auto& e : j.errors) {
    out += fmt::format("      {} {}\n", j.loaded ? "after the load:" : "fails:", e.summary());
    if (!e.merge_path.empty()) {
      std::vector<std::string> keys;
      for (const auto& k : e.merge_path) keys.push_back(k.repr());
      out += fmt::format("        at key path [{}]\n", fmt::join(keys, ", "));
    }
  }
  if (v.outcome == ResumeClass::kResumeFails && !j.error) out += "      why: " + v.cause + "\n";
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

namespace {

Result<std::vector<sim::Revision>> resolve_revisions(const InspectCommand& c,
                                                     model::RevisionRegistry& registry) {
  for (const auto& p : c.profiles) {
    if (Status s = registry.add_file(p); !s.is_ok()) return s;
  }
  std::vector<sim::Revision> revisions;
  for (const auto& name : c.revisions.empty() ? registry.names() : c.revisions) {
    auto rev = sim::resolve_revision(registry, name);
    if (!rev.is_ok()) return rev.status();
    revisions.push_back(rev.value());
  }
  return revisions;
}

// A model-parallel size the checkpoint's args hold (Megatron's load_checkpoint() reads 1 when
// there are none).
int64_t saved_model_parallel_size(const model::TorchDistCheckpoint& ck, const char* name) {
  return model::saved_arg_int(ck, name).value_or(1);
}

// The run that saved the checkpoint: the user's scenario (checked to fit), or inferred.
Status choose_scenario(const InspectCommand& c, model::RevisionRegistry& registry,
                       const sim::Revision& first, Inspection& r) {
  const model::TorchDistCheckpoint& ck = r.checkpoint;
  if (c.scenario.empty()) {
    const sim::SaveParallelism at_save{
        saved_model_parallel_size(ck, "tensor_model_parallel_size"),
        saved_model_parallel_size(ck, "pipeline_model_parallel_size"),
        model::saved_arg_int(ck, "data_parallel_size")};
    auto s = sim::infer_scenario(ck, first, at_save);
    if (!s.is_ok())
      return Status::invalid_input("the model cannot resume it: " + s.status().to_string());
    r.inferred = s.value();
    return Status::ok();
  }
  auto s = sim::load_scenario_file(c.scenario, registry);
  if (!s.is_ok()) return s.status();
  r.inferred.scenario = s.value();
  // A fully reshardable checkpoint does not show its DP size (DP replicas write nothing): the
  // scenario's first phase says it.
  r.inferred.dp_at_save = ck.dp_size_at_save.value_or(ck.sharding_type == "fully_reshardable"
                                                          ? r.inferred.scenario.phases.front().dp
                                                          : std::max<int64_t>(ck.writer_ranks, 1));
  return sim::check_scenario_fits(ck, r.inferred.scenario, r.inferred.dp_at_save);
}

// Megatron's save_checkpoint() stores the iteration in the common state; a script's plain
// dist_checkpointing.save does not.
bool has_training_loop_state(const model::TorchDistCheckpoint& ck) {
  return ck.common.is_dict() && ck.common.dict()->contains("iteration");
}

// The first error that is a rank's own (not a peer's abort), if any.
const sim::RankError* first_own_error(const std::vector<sim::RankError>& errors) {
  for (const auto& e : errors) {
    if (!e.secondary) return &e;
  }
  return errors.empty() ? nullptr : &errors.front();
}

// Why a resume that did not resume correctly went wrong, one line.
std::string resume_cause(const properties::ResumeJudgement& j) {
  if (j.error) return j.error->summary();
  if (!j.bias_correction_right) {
    return j.first_wrong_step.empty() ? "no step was taken after the load"
                                      : "the step count does not continue: " + j.first_wrong_step;
  }
  if (j.elements_equal != j.elements_compared) {
    return fmt::format(
        "{} of {} loaded elements of master, exp_avg and exp_avg_sq differ from "
        "the checkpoint's",
        j.elements_compared - j.elements_equal, j.elements_compared);
  }
  if (!j.uncovered.empty()) return "the load left unwritten: " + j.uncovered.front();
  return "not loaded";
}

// A fresh start (no checkpoint) of `phase`'s configuration: its first own error, if any.
std::optional<sim::RankError> fresh_start_error(const sim::Scenario& inferred,
                                                const sim::PhaseSpec& phase) {
  sim::Scenario fresh = inferred;
  fresh.phases = {phase};
  fresh.phases[0].save = false;
  auto run = sim::run_scenario(fresh);
  if (!run.is_ok() || run.value().phases.empty()) return std::nullopt;
  const sim::RankError* e = first_own_error(run.value().phases[0].errors);
  return e != nullptr ? std::optional<sim::RankError>(*e) : std::nullopt;
}

// The revision's class: a resume that fails the way a fresh start of the same configuration
// fails (the same exception type at the same site, at the same stage or before the load) is the
// configuration's failure, not the checkpoint's; the model's own invariant failing is a resume
// it cannot simulate.
ResumeVerdict classify(const properties::ResumeJudgement& j, const sim::Scenario& inferred,
                       const sim::PhaseSpec& phase) {
  ResumeVerdict v{j.revision, ResumeClass::kResumesCorrectly, ""};
  if (j.correct()) return v;
  v.cause = resume_cause(j);
  if (j.error && j.error->py_type == "InvariantViolation") {
    v.outcome = ResumeClass::kCannotSimulate;
    return v;
  }
  v.outcome = ResumeClass::kResumeFails;
  if (!j.error) return v;
  if (const auto fresh = fresh_start_error(inferred, phase);
      fresh && fresh->py_type == j.error->py_type && fresh->site == j.error->site) {
    v.outcome = ResumeClass::kCannotRunConfiguration;
    v.cause = "a fresh start fails alike: " + fresh->summary();
  }
  return v;
}

// Each revision's resume from `checkpoint` (the model's own format) at r.dp, judged against
// `judged_against` (what the checkpoint holds).
void resume_revisions(const std::vector<sim::Revision>& revisions, const model::Storage& checkpoint,
                      const sim::RunOptions& options,
                      const model::TorchDistCheckpoint& judged_against, std::ostream& progress,
                      Inspection& r) {
  for (const auto& rev : revisions) {
    sim::PhaseSpec phase;
    phase.dp = r.dp;
    phase.tp = r.tp;
    phase.pp = r.pp;
    phase.ep = r.inferred.scenario.phases.front().ep;  // the same in every phase
    phase.steps = kStepsAfterResume;
    phase.save = false;
    phase.set_revision(rev);
    progress << fmt::format(
        "inspect: resuming with {} at {}DP {}\n", rev.name,
        r.tp != 1 || r.pp != 1 ? fmt::format("TP {} x PP {} x ", r.tp, r.pp) : "", r.dp);
    const sim::PhaseRecord rec =
        sim::resume_from_checkpoint(r.inferred.scenario, phase, checkpoint, options);
    r.judgements.push_back(
        properties::judge_resume(rec, r.inferred.scenario, judged_against, r.saved_step));
    r.verdicts.push_back(classify(r.judgements.back(), r.inferred.scenario, phase));
  }
}

// Each revision's resume from the checkpoint, at r.dp; a checkpoint the model cannot hold is a
// resume it cannot simulate.
void resume_each(const std::vector<sim::Revision>& revisions, std::ostream& progress,
                 Inspection& r) {
  model::MemoryStorage converted;
  if (Status s =
          model::write_checkpoint_contents(model::checkpoint_contents(r.checkpoint), converted);
      !s.is_ok()) {
    r.cannot_simulate = "the model cannot hold it: " + s.to_string();
    return;
  }
  sim::RunOptions options;
  options.load_as_script = !has_training_loop_state(r.checkpoint);
  resume_revisions(revisions, converted, options, r.checkpoint, progress, r);
}

// Sizes of the simulated resume: the command's, else the checkpoint's at save.
void choose_resume_sizes(const InspectCommand& c, Inspection& r) {
  r.dp = c.dp > 0 ? c.dp : r.inferred.dp_at_save;
  r.tp = c.tp > 0 ? c.tp : saved_model_parallel_size(r.checkpoint, "tensor_model_parallel_size");
  r.pp = c.pp > 0 ? c.pp : saved_model_parallel_size(r.checkpoint, "pipeline_model_parallel_size");
}

// A fresh directory under the system's temporary one, removed with all below it at the end.
struct TempDir {
  std::filesystem::path path;  // empty when none could be made (`why` says so)
  std::string why;
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "ckptsim-inspect-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      why = pattern + ": cannot create a folder for the model's save: " + std::strerror(errno);
      return;
    }
    path = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

// The run that saved a damaged checkpoint: the user's scenario (not checked against the files:
// what was lost is zeros), else inferred from what of it reads (its lost tensor chunks as
// zeros). "" when there is one, else why not.
std::string damaged_scenario(const InspectCommand& c, const model::Storage& storage,
                             const model::DamageCensus& census, model::RevisionRegistry& registry,
                             const sim::Revision& first, Inspection& r) {
  auto read =
      census.iter_dir.empty()
          ? Result<model::TorchDistCheckpoint>(Status::not_found("no iteration directory is there"))
          : model::read_torch_dist_directory(storage, census.iter_dir,
                                             model::lost_data_files(census));
  if (read.is_ok()) r.checkpoint = std::move(read.value());
  if (!c.scenario.empty()) {
    auto s = sim::load_scenario_file(c.scenario, registry);
    if (!s.is_ok()) return s.status().message();
    r.inferred.scenario = s.value();
    r.inferred.dp_at_save = r.inferred.scenario.phases.front().dp;
    r.inferred.guesses.push_back(
        read.is_ok() ? std::string("the files are damaged, so --scenario is not checked against "
                                   "them")
                     : "the checkpoint does not read (" + read.status().message() +
                           "), so --scenario is not checked against it");
    return "";
  }
  if (!read.is_ok()) {
    return "what is left does not say the run (" + read.status().message() +
           "); --scenario FILE gives the scenario that saved it";
  }
  if (Status s = choose_scenario(c, registry, first, r); !s.is_ok()) return s.message();
  return "";
}

// The model's own save of the scenario's first phase into `dir`, by the first revision that
// runs it, with the common state kept as the damaged checkpoint keeps it. Returns the iteration
// directory it wrote; sets r.damage_saved_by.
Result<std::string> model_save(const std::vector<sim::Revision>& revisions,
                               std::optional<bool> common_state_object, const std::string& dir,
                               Inspection& r) {
  std::string first_error;
  for (const auto& rev : revisions) {
    sim::Scenario save = r.inferred.scenario;
    save.phases = {save.phases.front()};
    sim::PhaseSpec& phase = save.phases.front();
    auto profile = std::make_shared<model::RevisionProfile>(*rev.profile);
    if (common_state_object)
      profile->switches.common_state_as_sharded_object = *common_state_object;
    phase.revision = rev.name;
    phase.profile = profile;
    phase.save = true;
    phase.storage_faults.clear();
    sim::RunOptions options;
    options.checkpoint_dir = dir;
    auto run = sim::run_scenario(save, options);
    if (!run.is_ok()) return run.status();
    const sim::RankError* e = first_own_error(run.value().phases.front().errors);
    const std::string saved = sim::saved_directory(run.value(), 0);
    if (e == nullptr && !saved.empty()) {
      r.damage_saved_by = rev.name;
      return saved;
    }
    if (first_error.empty())
      first_error = e != nullptr ? rev.name + ": " + e->summary() : rev.name + ": saved nothing";
  }
  return Status::invalid_input("the model's save of this configuration fails at every revision (" +
                               first_error + ")");
}

// A checkpoint that a crashed or interrupted save left damaged: each revision resumes from the
// model's own save of the same configuration with the same damage.
void resume_damaged(const InspectCommand& c, const Source& source, const model::Storage& storage,
                    const model::DamageCensus& census, const std::vector<sim::Revision>& revisions,
                    model::RevisionRegistry& registry, std::ostream& progress, Inspection& r) {
  r.cannot_simulate = damaged_scenario(c, storage, census, registry, revisions.front(), r);
  if (!r.cannot_simulate.empty()) return;
  choose_resume_sizes(c, r);
  const std::optional<bool> common_state_object =
      census.metadata ? std::optional<bool>(census.common_state_object) : std::nullopt;
  TempDir tmp;
  if (tmp.path.empty()) {
    r.cannot_simulate = tmp.why;
    return;
  }
  auto saved = model_save(revisions, common_state_object, tmp.path.string(), r);
  if (!saved.is_ok()) {
    r.cannot_simulate = saved.status().message();
    return;
  }
  model::DirectoryStorage model_root(tmp.path.string());
  // What the undamaged save holds, for judging a resume that loads.
  model::MemoryStorage exported;
  auto ex = model::export_torch_dist_checkpoint(
      *model::subdir(static_cast<const model::Storage&>(model_root), saved.value()), exported,
      "saved");
  auto whole = ex.is_ok() ? model::read_torch_dist_checkpoint(exported, "saved")
                          : Result<model::TorchDistCheckpoint>(ex.status());
  if (!whole.is_ok()) {
    r.cannot_simulate = "the model's own save does not read back: " + whole.status().message();
    return;
  }
  r.saved_step = properties::saved_group_step(whole.value())
                     .value_or(static_cast<double>(whole.value().iteration));
  progress << fmt::format(
      "inspect: the model's save of this configuration (by {}) takes the same "
      "damage\n",
      r.damage_saved_by);
  const model::ModelDamage damage =
      model::apply_damage(census, model_root, saved.value(), whole.value().iteration);
  r.model_damage = damage.applied;
  if (!damage.unmapped.empty()) {
    r.cannot_simulate = fmt::format("{}", fmt::join(damage.unmapped, "; "));
    return;
  }
  sim::RunOptions options;
  options.load_latest = source.iter_dir.empty();
  options.load_as_script = r.checkpoint.common.is_dict() && !has_training_loop_state(r.checkpoint);
  auto iter_view = model::subdir(static_cast<const model::Storage&>(model_root), saved.value());
  resume_revisions(revisions, options.load_latest ? model_root : *iter_view, options, whole.value(),
                   progress, r);
  // The model's errors name its temporary directory and its own files: say whose those are, and
  // which of the user's files a damaged one stands for.
  const auto scrub = [&](sim::RankError& e) {
    const auto replace_all = [&](const std::string& from, const std::string& to) {
      for (size_t at = e.message.find(from); at != std::string::npos;
           at = e.message.find(from, at + to.size())) {
        e.message.replace(at, from.size(), to);
      }
    };
    replace_all(tmp.path.string(), "the model's save");
    for (const auto& [model_file, real_file] : damage.stands_for)
      replace_all(model_file, model_file + " [standing for " + real_file + "]");
  };
  for (auto& j : r.judgements) {
    for (auto& e : j.errors) scrub(e);
    if (j.error) scrub(*j.error);
  }
}

// The damaged-checkpoint inspection, where `census` found damage.
Inspection inspect_damaged(const InspectCommand& c, const Source& source,
                           const model::Storage& storage, model::DamageCensus census,
                           const std::vector<sim::Revision>& revisions,
                           model::RevisionRegistry& registry, std::ostream& progress) {
  Inspection r;
  r.path = (std::filesystem::path(source.root) / census.iter_dir).string();
  r.damage = census.files;
  if (census.metadata) {
    std::vector<std::pair<std::string, model::RevisionSwitches>> switches;
    for (const auto& rev : revisions) switches.emplace_back(rev.name, rev.profile->switches);
    r.checks = properties::check_checkpoint({*census.metadata, nullptr, switches});
  }
  resume_damaged(c, source, storage, census, revisions, registry, progress, r);
  if (!r.cannot_simulate.empty()) {
    r.judgements.clear();
    r.verdicts.clear();
    for (const auto& rev : revisions)
      r.verdicts.push_back({rev.name, ResumeClass::kCannotSimulate, r.cannot_simulate});
  }
  return r;
}

}  // namespace

Result<Inspection> inspect_checkpoint(const InspectCommand& c, std::ostream& progress) {
  const auto invalid = [&](const Status& why) {
    return Status::invalid_input(c.dir + ": " + why.to_string());
  };
  std::error_code ec;
  if (!std::filesystem::is_directory(c.dir, ec))
    return Status::invalid_input(c.dir + ": not a directory");
  const Source source = locate(c.dir);
  model::DirectoryStorage storage(source.root);
  auto registry = model::RevisionRegistry::load_embedded();
  if (!registry.is_ok()) return invalid(registry.status());
  auto revisions = resolve_revisions(c, registry.value());
  if (!revisions.is_ok()) return invalid(revisions.status());
  // A checkpoint that does not read: damage a save left (each revision then resumes from the
  // model's own save, damaged alike), else the reader's error.
  const auto damaged_or = [&](const Status& why) -> Result<Inspection> {
    model::DamageCensus census = model::find_damage(storage, source.iter_dir);
    if (census.empty()) return invalid(why);
    return inspect_damaged(c, source, storage, std::move(census), revisions.value(),
                           registry.value(), progress);
  };
  auto opened = open_metadata(storage, source);
  if (!opened.is_ok()) return damaged_or(opened.status());
  Inspection r;
  r.path = (std::filesystem::path(source.root) / opened.value().iter_dir).string();
  std::vector<std::pair<std::string, model::RevisionSwitches>> switches;
  for (const auto& rev : revisions.value()) switches.emplace_back(rev.name, rev.profile->switches);
  auto read = source.iter_dir.empty() ? model::read_torch_dist_checkpoint(storage, "")
                                      : model::read_torch_dist_directory(storage, source.iter_dir);
  if (!read.is_ok()) {
    // Files the reader refuses: the checks that read the metadata alone still judge them (chunks
    // that do not tile are one reason the reader refuses), the others are n/a.
    r.checks = properties::check_checkpoint({opened.value().metadata, nullptr, switches});
    const bool judged = std::any_of(r.checks.begin(), r.checks.end(), [](const auto& k) {
      return k.outcome == properties::CheckOutcome::kFails;
    });
    if (!judged) return damaged_or(read.status());
    r.unreadable = read.status().to_string();
    return r;
  }
  r.checkpoint = std::move(read.value());
  r.checks = properties::check_checkpoint({opened.value().metadata, &r.checkpoint, switches});
  if (Status s = choose_scenario(c, registry.value(), revisions.value().front(), r); !s.is_ok()) {
    // A scenario of the user's that does not fit is their error; one the model cannot infer
    // leaves the checks standing and every resume not simulated.
    if (!c.scenario.empty()) return invalid(s);
    r.cannot_simulate = s.message();
    for (const auto& rev : revisions.value())
      r.verdicts.push_back({rev.name, ResumeClass::kCannotSimulate, r.cannot_simulate});
    return r;
  }
  choose_resume_sizes(c, r);
  r.saved_step = properties::saved_group_step(r.checkpoint)
                     .value_or(static_cast<double>(r.checkpoint.iteration));
  if (!has_training_loop_state(r.checkpoint)) {
    r.inferred.guesses.push_back(
        "no training-loop state (no 'iteration' in the common state): each resume loads as a "
        "script of its own does, dist_checkpointing.load then the model's and the optimizer's "
        "load_state_dict (no iteration, scheduler or RNG; the steps count from 1)");
  }
  resume_each(revisions.value(), progress, r);
  if (!r.cannot_simulate.empty()) {
    for (const auto& rev : revisions.value())
      r.verdicts.push_back({rev.name, ResumeClass::kCannotSimulate, r.cannot_simulate});
  }
  return r;
}

std::string resume_class_text(ResumeClass c) {
  switch (c) {
    case ResumeClass::kResumesCorrectly:
      return "resumes correctly";
    case ResumeClass::kResumeFails:
      return "the resume from this checkpoint fails";
    case ResumeClass::kCannotRunConfiguration:
      return "this revision cannot run this configuration";
    case ResumeClass::kCannotSimulate:
      return "cannot simulate";
  }
  return "?";
}

std::string Inspection::answer() const {
  std::map<ResumeClass, std::vector<std::string>> by;
  for (const auto& v : verdicts) by[v.outcome].push_back(v.revision);
  const auto names = [&](ResumeClass c) { return fmt::format("{}", fmt::join(by[c], ", ")); };
  std::vector<std::string> parts;
  const size_t correct = by[ResumeClass::kResumesCorrectly].size();
  parts.push_back(correct == 0
                      ? fmt::format("none of {} revision(s) resumes it correctly", verdicts.size())
                      : fmt::format("{} of {} revision(s) resume it correctly: {}", correct,
                                    verdicts.size(), names(ResumeClass::kResumesCorrectly)));
  if (!by[ResumeClass::kResumeFails].empty()) {
    parts.push_back(
        fmt::format("the resume from it fails at {}", names(ResumeClass::kResumeFails)));
  }
  if (!by[ResumeClass::kCannotRunConfiguration].empty()) {
    parts.push_back(fmt::format("{} cannot run this configuration (a fresh start fails alike)",
                                names(ResumeClass::kCannotRunConfiguration)));
  }
  if (!by[ResumeClass::kCannotSimulate].empty()) {
    parts.push_back(fmt::format("the model cannot simulate {}{}",
                                by[ResumeClass::kCannotSimulate].size() == verdicts.size()
                                    ? "any resume"
                                    : names(ResumeClass::kCannotSimulate),
                                cannot_simulate.empty() ? "" : " (" + cannot_simulate + ")"));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

bool Inspection::ok() const {
  if (!unreadable.empty() || !damage.empty()) return false;
  for (const auto& k : checks) {
    if (k.outcome == properties::CheckOutcome::kFails) return false;
  }
  for (const auto& v : verdicts) {
    if (v.outcome != ResumeClass::kResumesCorrectly) return false;
  }
  return true;
}

namespace {

std::string dtype_text(model::DType d) { return d == model::DType::kBFloat16 ? "bf16" : "fp32"; }

json inspection_json(const InspectCommand& c, const Inspection& r) {
  const model::TorchDistCheckpoint& ck = r.checkpoint;
  json params = json::array();
  for (const auto& p : r.inferred.scenario.params) {
    params.push_back(json{{"name", p.name},
                          {"numel", p.numel},
                          {"dtype", dtype_text(p.dtype)},
                          {"shape", p.shape.empty() ? std::vector<int64_t>{p.numel} : p.shape},
                          {"tp_split", model::tp_split_name(p.tp_split)},
                          {"expert", p.expert}});
  }
  json j{
      {"dir", c.dir},
      {"path", r.path},
      {"answer", r.answer()},
      {"iter_dir", ck.iter_dir},
      {"iteration", ck.iteration},
      {"iteration_from", ck.iteration_from},
      {"dp_size_at_save", ck.dp_size_at_save ? json(*ck.dp_size_at_save) : json(nullptr)},
      {"writer_ranks", ck.writer_ranks},
      {"sharding_type", ck.sharding_type},
      {"common_state", ck.common_from_sharded_object ? "ShardedObject common_state" : "common.pt"},
      {"optimizer", r.inferred.scenario.params.empty()
                        ? json(nullptr)
                        : json(optimizer_text(r.inferred.scenario, ck))},
      {"params", params},
      {"buckets", bucket_lines(ck)},
      {"checks", json::array()},
      {"ep", r.inferred.scenario.phases.empty() ? 1 : r.inferred.scenario.phases.front().ep},
      {"resume_dp", r.dp},
      {"resume_tp", r.tp},
      {"resume_pp", r.pp},
      {"resumes", json::array()},
      {"cannot_simulate", r.cannot_simulate},
      {"verdicts", json::array()},
      {"guesses", r.inferred.guesses},
      {"damage", json::array()},
      {"model_damage", r.model_damage},
      {"damage_saved_by", r.damage_saved_by},
      {"ok", r.ok()}};
  for (const auto& d : r.damage) {
    j["damage"].push_back(json{{"file", d.file},
                               {"kind", model::damage_kind_name(d.kind)},
                               {"bytes", d.bytes},
                               {"bytes_needed", d.bytes_needed},
                               {"detail", d.detail},
                               {"items_lost", d.items_lost}});
  }
  for (const auto& k : r.checks) j["checks"].push_back(check_json(k));
  for (size_t i = 0; i < r.judgements.size(); ++i)
    j["resumes"].push_back(judgement_json(r.judgements[i], r.verdicts[i]));
  for (const auto& v : r.verdicts) {
    j["verdicts"].push_back(json{
        {"revision", v.revision}, {"class", resume_class_text(v.outcome)}, {"cause", v.cause}});
  }
  return j;
}

void print_contents(const InspectCommand& c, const Inspection& r, std::ostream& out) {
  const model::TorchDistCheckpoint& ck = r.checkpoint;
  out << fmt::format("checkpoint {}\n", r.path);
  const int64_t tp = saved_model_parallel_size(ck, "tensor_model_parallel_size");
  const int64_t pp = saved_model_parallel_size(ck, "pipeline_model_parallel_size");
  out << fmt::format(
      "  iteration {}, {}DP {} at save ({} ranks wrote data files), sharding {}, common "
      "state in {}\n",
      ck.iteration_from.empty() || ck.iteration_from == "the tracker"
          ? (ck.iteration_from.empty() ? "unknown (neither a tracker, the directory's name nor "
                                         "the common state says it)"
                                       : std::to_string(ck.iteration))
          : fmt::format("{} (from {})", ck.iteration, ck.iteration_from),
      tp != 1 || pp != 1 ? fmt::format("TP {} x PP {} x ", tp, pp) : "",
      ck.dp_size_at_save ? std::to_string(*ck.dp_size_at_save)
                         : fmt::format("{} (assumed)", r.inferred.dp_at_save),
      ck.writer_ranks, ck.sharding_type,
      ck.common_from_sharded_object ? "the ShardedObject 'common_state'" : "common.pt");
  if (r.inferred.scenario.params.empty()) {
    out << "  params and optimizer: not inferred (" << r.cannot_simulate << ")\n";
    for (const auto& line : bucket_lines(ck)) out << "  bucket " << line << "\n";
    return;
  }
  out << "  optimizer: " << optimizer_text(r.inferred.scenario, ck) << "\n";
  std::vector<std::string> params;
  for (const auto& p : r.inferred.scenario.params) {
    params.push_back(fmt::format(
        "{} ({}, {}{}{})", p.name, p.numel, dtype_text(p.dtype),
        p.tp_split == model::TpSplit::kReplicated ? "" : ", " + model::tp_split_name(p.tp_split),
        p.expert ? fmt::format(", expert: EP {} on dim 0", r.inferred.scenario.phases.front().ep)
                 : ""));
  }
  out << "  params: " << fmt::format("{}", fmt::join(params, ", ")) << "\n";
  for (const auto& line : bucket_lines(ck)) out << "  bucket " << line << "\n";
}

// A damaged checkpoint: the answer, what is damaged, and what the model's save got alike.
void print_damage(const Inspection& r, std::ostream& out) {
  out << "answer: " << r.answer() << "\n";
  out << fmt::format("checkpoint {}: {} damaged file(s)\n", r.path, r.damage.size());
  for (const auto& d : r.damage) out << "  " << d.text() << "\n";
  if (!r.model_damage.empty()) {
    out << fmt::format(
        "the same damage on the model's own save of this configuration (saved by {}), which "
        "each revision resumes from\n",
        r.damage_saved_by);
    for (const auto& line : r.model_damage) out << "  " << line << "\n";
  }
}

void print_verdicts(const Inspection& r, std::ostream& out) {
  out << "checks\n";
  for (const auto& k : r.checks) {
    out << fmt::format("  {:<5}  {} ({}): {}\n", properties::check_outcome_name(k.outcome), k.name,
                       k.property, k.detail);
    for (const auto& line : k.lines) out << "         " << line << "\n";
  }
  if (r.judgements.empty()) {
    out << "resume from this checkpoint\n";
  } else {
    out << fmt::format(
        "resume from this checkpoint at {}DP {}, {} further steps (the model's simulation; "
        "right: t continues from the saved step {})\n",
        r.tp != 1 || r.pp != 1 ? fmt::format("TP {} x PP {} x ", r.tp, r.pp) : "", r.dp,
        kStepsAfterResume, r.saved_step);
  }
  for (size_t i = 0; i < r.judgements.size(); ++i)
    out << judgement_text(r.judgements[i], r.verdicts[i]);
  if (!r.cannot_simulate.empty()) out << "  not simulated: " << r.cannot_simulate << "\n";
  if (!r.inferred.guesses.empty()) {
    out << "what the model assumed (not in the checkpoint)\n";
    for (const auto& g : r.inferred.guesses) out << "  " << g << "\n";
  }
  size_t correct = 0;
  for (const auto& v : r.verdicts) correct += v.outcome == ResumeClass::kResumesCorrectly ? 1 : 0;
  size_t failed = 0;
  for (const auto& k : r.checks) failed += k.outcome == properties::CheckOutcome::kFails ? 1 : 0;
  out << fmt::format("inspect: {}{} of {} checks fail; {} of {} revisions resume it correctly\n",
                     r.damage.empty() ? "" : fmt::format("{} damaged file(s); ", r.damage.size()),
                     failed, r.checks.size(), correct, r.verdicts.size());
}

}  // namespace

int inspect_command(const InspectCommand& c, std::ostream& out, std::ostream& err) {
  std::ostringstream quiet;
  auto inspected = inspect_checkpoint(c, c.json ? quiet : err);
  if (!inspected.is_ok()) {
    err << "ckptsim inspect: " << inspected.status().message() << "\n";
    return kExitInvalid;
  }
  const Inspection& r = inspected.value();
  if (!r.damage.empty()) {
    if (c.json) {
      out << inspection_json(c, r).dump(2) << "\n";
    } else {
      print_damage(r, out);
      print_verdicts(r, out);
    }
    return kExitFail;
  }
  if (!r.unreadable.empty()) {
    out << "checks\n  FAILS  " << r.checks.front().name << ": " << r.checks.front().detail << "\n";
    out << "the model cannot read it (" << r.unreadable << "), so no resume is simulated\n";
    return kExitFail;
  }
  if (c.json) {
    out << inspection_json(c, r).dump(2) << "\n";
  } else {
    out << "answer: " << r.answer() << "\n";
    print_contents(c, r, out);
    print_verdicts(r, out);
  }
  return r.ok() ? kExitOk : kExitFail;
}

namespace {

// One fixture of a fixtures.json: its table row; r.compared/agreeing count its comparison.
Result<std::string> fixture_row(const std::string& dir, const std::string& manifest, const json& f,
                                RealCheckpointsReport& r, std::ostream& out) {
  const std::string name = f.value("dir", "");
  const std::string scenario_name = f.value("scenario", "");
  const int phase = f.value("phase", -1);
  std::ifstream sin(dir + "/runs/" + scenario_name + ".scenario.json");
  std::ifstream tin(dir + "/runs/" + scenario_name + ".trace.json");
  const json scenario = json::parse(sin, nullptr, false);
  const json trace = json::parse(tin, nullptr, false);
  if (name.empty() || phase < 0 || !scenario.is_object() || !trace.is_object() ||
      static_cast<size_t>(phase) >= scenario.value("phases", json::array()).size()) {
    return Status::invalid_input(manifest + ": fixture '" + name +
                                 "': needs dir, phase and runs/<scenario>.{scenario,trace}.json");
  }
  const size_t next = static_cast<size_t>(phase) + 1;
  const bool resumed = next < scenario["phases"].size();
  const json& by = scenario["phases"][resumed ? next : static_cast<size_t>(phase)];
  InspectCommand c;
  c.dir = dir + "/" + name;
  c.revisions = {by["revision"].get<std::string>()};
  if (resumed) {
    c.dp = by["dp"].get<int64_t>();
    c.tp = by.value("tp", int64_t{1});
    c.pp = by.value("pp", int64_t{1});
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
  const properties::ResumeJudgement j =
      i.judgements.empty() ? properties::ResumeJudgement{} : i.judgements[0];
  const properties::ResumeOutcome model = properties::resume_outcome(j);
  const std::string sizes =
      (i.tp != 1 || i.pp != 1 ? fmt::format("TP {} x PP {} x ", i.tp, i.pp) : "") +
      fmt::format("DP {}", i.dp);
  std::string real_text = "(no later phase resumed from it)";
  std::string verdict = "n/a";
  for (const auto& run : resumed ? trace["runs"] : json::array()) {
    if (run.value("id", "") != "phase" + std::to_string(next)) continue;
    const properties::ResumeOutcome real = properties::resume_outcome(run);
    real_text = real.text();
    ++r.compared;
    r.agreeing += real == model ? 1 : 0;
    verdict = real == model ? "agree" : "**DISAGREE**";
    out << fmt::format("{} {} (resumed by {} at {})", real == model ? "agree   " : "DISAGREE", name,
                       c.revisions[0], sizes)
        << std::endl;
  }
  return fmt::format("| `{}` | {} | {} at {} | {} | {} | {} of {} | {} |", name,
                     failing.empty() ? "all hold" : failing, c.revisions[0], sizes, real_text,
                     model.text(), j.elements_equal, j.elements_compared, verdict);
}

}  // namespace

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
      auto row = fixture_row(dir, manifest, f, r, out);
      if (!row.is_ok()) return row.status();
      rows.push_back(row.value());
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
