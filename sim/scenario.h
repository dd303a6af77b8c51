// Scenario: what one simulated run does — the model, the optimizer, and the phases, each of
// which (after the first) resumes from the checkpoint the previous phase saved at its end.
//
// Scenario files are a user interface: bug reports are written in them. The JSON fields
// (required ones marked *):
//   * seed                  integer >= 0; draws gradients, initial params, garbage, randn
//     name, description     strings (free text, shown in reports)
//   * params                [{name*, numel*, dtype* ("bf16"|"fp32"), wd_mult, lr_mult,
//                            shape ([rows] or [rows, cols], product numel; default [numel]),
//                            tp_split ("replicated", the default | "column": dim 0 |
//                            "row": dim 1), layer (integer >= 0, default 0: pipeline stage s
//                            of pp holds layers [s L/pp, (s+1) L/pp) of L = max layer + 1),
//                            expert (bool, default false: an MoE expert param, allreduce=False:
//                            the chained optimizer's expert part, split over EP on dim 0; not
//                            every param, and only at tp = pp = 1)}]
//   * optimizer             {kind* ("fused_adam"|"torch_adamw"|"hybrid"), lr*, betas*, eps*,
//                            weight_decay*, offload_fraction (hybrid: required),
//                            overlap_cpu_optimizer_d2h_h2d (hybrid; default false),
//                            transformer_engine (hybrid: "installed", the default | "absent"),
//                            precision_aware (fused_adam: --use-precision-aware-optimizer,
//                            default false; hybrid: always, may be given as true),
//                            exp_avg_dtype, exp_avg_sq_dtype ("fp32", the default | "bf16" |
//                            "fp16"; other than fp32 only where precision-aware; the HDO
//                            ignores them, as upstream), main_params_dtype ("fp32" only),
//                            store_param_remainders (precision-aware; default true: TE >= 2.1)}
//     bucket_size           null (one bucket, the default) or integer >= 1
//     pad_buckets_for_high_nccl_busbw   bool, default false
//     sharding_type         the distributed optimizer's checkpoint format every phase saves in
//                            (the training loop's metadata): "dp_reshardable" (the default),
//                            "fully_reshardable" (--dist-ckpt-optim-fully-reshardable),
//                            "dp_zero_gather_scatter", "fully_sharded_model_space" (refused by
//                            mapping.py at every modeled revision). A resume loads the format
//                            its checkpoint's content_metadata names, whatever its own is.
//     fully_reshardable_mem_efficient  bool, default false; only with fully_reshardable
//                            (--distrib-optim-fully-reshardable-mem-efficient)
//     samples_per_step      global batch size, integer in [1, kSamplesPerStepMax], default 8
//     schedule              the lr/weight-decay schedule, Megatron's arguments in iterations:
//                            {min_lr, lr_warmup_init, lr_warmup_iters, lr_decay_iters,
//                            lr_decay_style ("constant"|"linear"|"cosine"|
//                            "inverse-square-root"), start_weight_decay, end_weight_decay,
//                            weight_decay_incr_style ("constant"|"linear"|"cosine"),
//                            train_iters}; all optional (default: constant at optimizer.lr and
//                            optimizer.weight_decay; the lr is optimizer.lr)
//   * phases                [{dp*, tp, pp (default 1; tp divides every split dim, pp the
//                            layers, each stage holds a param, tp x pp x dp <= 4096), ep
//                            (expert_model_parallel_size, default 1: the same in every phase,
//                            dividing dp and every expert param's dim 0), revision*, steps*, save
//                            (default true), sharding_type and fully_reshardable_mem_efficient
//                            (this phase's saves; default the scenario's), schedule (the same
//                            fields and "lr": the arguments this phase's job is started with, each
//                            defaulting to the scenario's), opt_param_scheduler
//                            ("override"|"use_checkpoint"|"neither", the default: Megatron's
//                            --override-opt_param-scheduler / --use-checkpoint-opt_param-
//                            scheduler)}]
//                           no_load_optim: bool, default false (--no-load-optim: the resume
//                            loads the model params only; the optimizer and scheduler start
//                            afresh from them; not in the first phase, nor with storage_faults)
//                           finetune: bool, default false (--finetune: the resume loads what
//                            --no-load-optim does and the job continues from iteration 0: its
//                            saves and tracker count from there; same limits)
//                           storage_faults: [{kind* ("crash_before"|"crash_after"|"torn"|
//                            "short"|"disk_full"), file ("shard"|"object"|"metadata"|"tracker"|
//                            "any", the default), nth (0-based, default 0; a shard's: rank
//                            nth mod world's file in save nth / world)}]: this phase's save
//                            fails there (model/faulty_storage.h; at most kStorageFaultsMax);
//                            the next phase resumes from what the tracker names
//     faults                [fault site names] — deliberately broken model variants, for
//                            testing the checkers (see model/faults.h)
//     expect                {"ok": bool, "properties": {name: bool | verdict name},
//                            "detail_contains": {name: text}} — the verdicts a bundled
//                            scenario must give (checked by properties/expect.h)
//
// Invariants:
//   1. Unknown fields are errors (a typo in a bug report must not be silently ignored).
//   2. Every error is a Status naming the file and the field path ("phases[1].dp") with the
//      expected and the observed value.
//   3. Every count has a `_max`; exceeding it is an error, never a slow run.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "model/faulty_storage.h"
#include "model/revision.h"
#include "model/status.h"
#include "sim/local_world.h"

namespace ckptsim::sim {

// A revision as a phase names it, resolved once: the name (or profile path) as written, and
// the profile it resolved to.
struct Revision {
  std::string name;
  std::shared_ptr<const model::RevisionProfile> profile;
};
// Resolves a profile name, or a profile file path ending in ".json".
Result<Revision> resolve_revision(model::RevisionRegistry& registry, const std::string& name);

// The files of a save (the model's own format, in the training loop's layout: iter_NNNNNNN/ and
// the tracker) that a storage fault counts.
enum class SaveFile { kAny, kShard, kObject, kMetadata, kTracker };
std::string save_file_name(SaveFile f);  // "any", "shard", "object", "metadata", "tracker"
std::optional<SaveFile> parse_save_file(std::string_view name);
// What the files of that kind end in (model::StorageFault::path_suffix): a rank's shards/*.bin,
// an object or the common state (*.pt), metadata.json, latest_checkpointed_iteration.txt.
std::string save_file_suffix(SaveFile f);

// A storage fault in one phase's save: it fires at the `nth` write of a `file` (every rank's
// writes counted in the order they happen), except for shards: nth = k is the (k / world)-th
// write of rank (k mod world)'s shard file, as if the ranks wrote in rank order save after save
// (what the replay runner's target_rank maps onto a real rank's .distcp), whatever order the
// ranks' fibers reach their writes in.
struct StorageFaultSpec {
  model::StorageFaultKind kind = model::StorageFaultKind::kCrashBefore;
  SaveFile file = SaveFile::kAny;
  int64_t nth = 0;
  // The fault as the job of `world` ranks's storage counts it.
  model::StorageFault fault(int64_t world) const;
  bool operator==(const StorageFaultSpec&) const = default;
};

struct PhaseSpec {
  int64_t dp = 1;
  // Tensor- and pipeline-parallel sizes: the job has tp x pp x dp ranks.
  int64_t tp = 1;
  int64_t pp = 1;
  // expert_model_parallel_size (issue 26): the same in every phase; divides dp.
  int64_t ep = 1;
  std::string revision;                                   // as written (name or profile path)
  std::shared_ptr<const model::RevisionProfile> profile;  // what it resolved to (never null)
  int64_t steps = 0;
  bool save = true;
  // The schedule arguments this phase's job starts with (none: the scenario's), and how its
  // resume treats the checkpoint's scheduler values.
  std::optional<model::ScheduleConfig> schedule;
  model::SchedulerResume opt_param_scheduler = model::SchedulerResume::kNeither;
  // The format this phase saves in, where the phase names one (else the scenario's).
  std::optional<model::ShardingType> sharding_type;
  std::optional<bool> mem_efficient;
  // Where this phase's save fails (none: it does not).
  std::vector<StorageFaultSpec> storage_faults;
  // The training loop's --save-interval (0: none): the job also saves at every iteration that
  // is a multiple of it, as train() does; its exit save (`save`) is skipped where the interval
  // just saved that iteration. A phase whose last save is an interval save leaves the next one
  // resuming from it.
  int64_t save_interval = 0;
  // --async-save (model/megatron/async_save.h): the saves are scheduled and finalized later,
  // at the top of the first iteration after `async_write_steps` further steps (a slow disk:
  // the worker's writes take that long), or at the end of the job.
  bool async_save = false;
  int64_t async_write_steps = 0;
  // --no-load-optim: the resume loads the model params only (model::ResumeArgs); the optimizer
  // and its scheduler start afresh from the loaded weights, at the checkpoint's iteration. The
  // uninterrupted reference run starts its optimizer and scheduler afresh there too (the
  // fresh-start contract), and first_step_continues_from_loaded_weights judges the phase.
  bool no_load_optim = false;
  // --finetune: the resume loads what --no-load-optim's does (the optimizer and scheduler start
  // afresh from the loaded weights) and the training loop continues from iteration 0, so the
  // job's saves and its tracker name the iterations since the resume; the global step (the
  // gradients, the reference run) goes on. The next phase resumes from those iterations.
  bool finetune = false;

  // Whether the resume starts the optimizer and its scheduler afresh (--no-load-optim or
  // --finetune): the fresh-start contract judges the phase.
  bool fresh_optimizer() const { return no_load_optim || finetune; }
  // The flag that does it, as reports name it ("" where the optimizer is loaded).
  std::string fresh_start_flag() const {
    return finetune ? "--finetune" : no_load_optim ? "--no-load-optim" : "";
  }
  // The job's ranks: tp x pp x dp.
  int64_t world() const { return tp * pp * dp; }
  // Whether the job saves at all (at its end or at an interval).
  bool saves() const { return save || save_interval > 0; }

  void set_revision(const Revision& r) {
    revision = r.name;
    profile = r.profile;
  }
};

struct Scenario {
  static constexpr size_t kParamsMax = 256;
  static constexpr int64_t kParamNumelMax = 1 << 20;
  static constexpr int64_t kTotalNumelMax = 1 << 22;
  static constexpr size_t kPhasesMax = 64;
  static constexpr size_t kStorageFaultsMax = 4;  // a phase's
  static constexpr int64_t kStorageFaultNthMax = 4096;
  // Production DP sizes (512-4096) are in range: the smaller of the model's limit on one DP
  // group and the world's on simulated ranks, so a scenario the world cannot run is rejected
  // when it is parsed, not when its phase starts.
  static constexpr int64_t kDpMax = std::min<int64_t>(model::kDpSizeMax, kWorldSizeMax);
  static constexpr int64_t kStepsMax = 10000;
  static constexpr int64_t kTpMax = 64;
  static constexpr int64_t kPpMax = 64;
  static constexpr int64_t kLayersMax = 256;
  static constexpr int64_t kSamplesPerStepMax = 4096;
  // Bound on total numel x total steps, so the recorded per-step states stay small.
  static constexpr int64_t kStateElementsMax = int64_t{1} << 24;

  std::string name;  // never empty once parsed: a file's stem when the file names none
  std::string description;
  std::string source;  // the file it came from
  uint64_t seed = 0;
  std::vector<model::ParamSpec> params;
  model::OptimizerConfig optimizer;
  // The first phase's schedule arguments (its lr is optimizer.adam.lr).
  model::ScheduleConfig schedule;
  std::optional<int64_t> bucket_size;
  bool pad_buckets_for_high_nccl_busbw = false;
  model::CheckpointFormat format;  // what every phase saves in, unless it names its own
  int64_t samples_per_step = 8;
  std::vector<PhaseSpec> phases;
  std::vector<std::string> faults;
  // The raw "expect" block (null when absent), forwarded as written: properties/expect.h
  // parses and validates it (expectations are a checker's concept, not the simulator's).
  nlohmann::json expect;

  int64_t total_steps() const;
  bool has_storage_faults() const;
  int64_t total_numel() const;
  // The schedule arguments phase `phase` is started with.
  const model::ScheduleConfig& schedule_of(size_t phase) const;
  // The format phase `phase` saves in: its own sharding type (with its mem_efficient, default
  // false) or the scenario's.
  model::CheckpointFormat format_of(size_t phase) const;
};

// The schedule each phase should train under, as Megatron documents its flags: the first
// phase's arguments; after a resume with --override-opt_param-scheduler the phase's own
// arguments; with --use-checkpoint-opt_param-scheduler the schedule in force before (the
// checkpoint's), except lr_warmup_init, which the checkpoint does not hold; with neither the
// phase's arguments (which must equal the checkpoint's, or the load fails). What the
// uninterrupted reference run follows, and what hyperparams_follow_schedule checks.
// (A --no-load-optim phase loads no scheduler: its own arguments, counted from its resume.)
std::vector<model::ScheduleConfig> intended_schedules(const Scenario& s);
// Per phase: the global steps taken before its optimizer and scheduler began counting: 0, or
// where the latest --no-load-optim phase up to it resumed (phases resume where the previous
// one ended; --no-load-optim is refused with storage faults). Adam's step counter after global
// step g of that phase is g minus it, and so is the scheduler's count of iterations.
std::vector<int64_t> optimizer_origins(const Scenario& s);
// Per phase: the global steps taken before its training loop's iteration 0: 0, or where the
// latest --finetune phase up to it resumed. The iteration a save of that phase names at global
// step g is g minus it (the reference: what the files, the tracker and --save-interval count).
std::vector<int64_t> iteration_origins(const Scenario& s);

// What makes a scenario's TP x PP x DP worlds impossible for its params, as (field path, what):
// a shape that does not hold numel, a row split of a 1-D param, a TP size that does not divide a
// split dim, a PP size that does not divide the layers or leaves a stage without a param, a
// world above kWorldSizeMax ranks. nullopt: none (parse_scenario gives the first as its error).
std::optional<std::pair<std::string, std::string>> model_parallel_problem(const Scenario& s);

// Parses and validates. `registry` resolves phase revisions (a name or a profile path); a
// relative profile path is looked up beside the scenario file first (a bug report ships the two
// together), then in the current directory, and the phase keeps the path that was found.
Result<Scenario> parse_scenario(const std::string& json_text, const std::string& source,
                                model::RevisionRegistry& registry);
Result<Scenario> load_scenario_file(const std::string& path, model::RevisionRegistry& registry);

// The scenario as JSON in the file format (parse_scenario(to_json(s)) == s).
nlohmann::json scenario_to_json(const Scenario& s);

}  // namespace ckptsim::sim
