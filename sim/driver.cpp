#include "sim/driver.h"

#include <fmt/format.h>

#include <deque>
#include <limits>
#include <map>
#include <memory>

#include <ATen/ops/empty.h>

#include "model/faulty_storage.h"
#include "model/megatron/async_save.h"
#include "model/megatron/checkpointing.h"
#include "model/megatron/optimizer_key.h"
#include "model/megatron/optimizer_param_scheduler.h"
#include "model/megatron/torch_dist_checkpoint.h"
#include "model/py/host_tensor.h"
#include "sim/gradients.h"
#include "sim/local_world.h"

namespace ckptsim::sim {

namespace {

// The Runtime phase id of the reference run: it selects the reference run's random streams,
// apart from every checkpointed phase's (phase ids 0 .. kPhasesMax - 1).
constexpr int64_t kReferencePhaseId = 1'000'000;
static_assert(kReferencePhaseId >= static_cast<int64_t>(Scenario::kPhasesMax));

struct PhaseJob {
  const Scenario* scenario = nullptr;
  int64_t phase_id = 0;
  int64_t dp = 1;
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t ep = 1;  // expert_model_parallel_size
  int64_t steps = 0;
  const model::RevisionSwitches* switches = nullptr;
  // The training loop's --load directory (model::load_latest_checkpoint: the tracker, then its
  // iter_NNNNNNN/), or a checkpoint directory itself (load_from: one saved elsewhere); both
  // null: a fresh start.
  const model::Storage* load_root = nullptr;
  const model::Storage* load_from = nullptr;
  // Load as a script does (model::load_distributed_checkpoint), not as the training loop.
  bool load_as_script = false;
  // The training loop's --save directory (model::save_checkpoint_to_root); null: no save.
  model::Storage* save_root = nullptr;
  // The run's caches, lent to every rank's save and load (null: none).
  model::CheckpointCaches* caches = nullptr;
  // Where the job saves into save_root (PhaseSpec): every save_interval-th iteration (0: none),
  // at its end (exit_save), synchronously or as async saves finalized after async_write_steps.
  int64_t save_interval = 0;
  bool exit_save = true;
  bool async_save = false;
  int64_t async_write_steps = 0;
  model::CheckpointFormat format;  // what the save writes (Scenario::format_of)
  bool real_cuda = false;
  bool share_gathered_objects = true;  // RunOptions::share_gathered_objects
  bool trace_steps = true;             // RunOptions::trace_steps
  // initial_params(*scenario), shared read-only by every rank.
  const std::vector<at::Tensor>* initial_params = nullptr;
  model::OptimizerConfig optimizer;  // the phase's (its lr and min_lr: the schedule's)
  model::ScheduleConfig schedule;    // the arguments the phase's job starts with
  model::SchedulerResume resume = model::SchedulerResume::kNeither;
  // The reference run only: at global step `first` (after `first - 1` steps), the schedule of
  // a later phase takes over, as intended_schedules() says it should.
  std::vector<std::pair<int64_t, model::ScheduleConfig>> schedule_changes;
  // The reference run only: before global step `first`, the optimizer and the scheduler start
  // afresh from the weights the run holds, with the schedule then in force (where a
  // --no-load-optim phase resumes: the fresh-start contract).
  std::vector<int64_t> optimizer_restarts;
  // --no-load-optim and --finetune (PhaseSpec).
  model::ResumeArgs resume_args;
  // The iteration origin (iteration_origins) of the phase whose save the job loads: the global
  // step of the checkpoint's iteration 0.
  int64_t loaded_origin = 0;

  // The optimizer and schedule arguments `phase` starts its job with.
  void set_arguments(const Scenario& s, const PhaseSpec& phase) {
    schedule = phase.schedule.value_or(s.schedule);
    optimizer = s.optimizer;
    optimizer.adam.lr = schedule.lr;
    optimizer.min_lr = schedule.min_lr;
    resume = phase.opt_param_scheduler;
  }
};

// A job of `spec`'s world, revision and arguments, as phase `phase_id` (no load, no save yet).
PhaseJob phase_job(const Scenario& scenario, const RunOptions& options,
                   const std::vector<at::Tensor>& init, const PhaseSpec& spec, int64_t phase_id,
                   bool real_cuda) {
  PhaseJob job;
  job.scenario = &scenario;
  job.initial_params = &init;
  job.phase_id = phase_id;
  job.dp = spec.dp;
  job.tp = spec.tp;
  job.ep = spec.ep;
  job.pp = spec.pp;
  job.steps = spec.steps;
  job.switches = &spec.profile->switches;
  job.real_cuda = real_cuda;
  job.share_gathered_objects = options.share_gathered_objects;
  job.trace_steps = options.trace_steps;
  job.set_arguments(scenario, spec);
  job.save_interval = spec.save_interval;
  job.exit_save = spec.save;
  job.async_save = spec.async_save;
  job.async_write_steps = spec.async_write_steps;
  job.resume_args = {.no_load_optim = spec.no_load_optim, .finetune = spec.finetune};
  return job;
}

// The whole model's state after each step of a world's job, gathered (gather_given_states) once
// every rank has captured that step, so that no rank keeps the state of each of its steps until
// the job ends (each a copy of the whole model's params: with them, the 400-case search of
// reports/search-speed.md peaked at 504 MB, without them at 347 MB, in a DP 6 case of 2,050
// steps). A world's ranks are fibers of the calling thread (run_world), so add() needs no lock.
// It gathers what gathering every rank's steps after the job did: step k where every rank
// captured it (a rank that failed captured fewer: the gathered steps are a prefix), in order,
// from the same states; the first gather that raises (gather_state's invariant checks) stops it,
// and take() raises that again where the gather after the job would have.
class StepGather {
 public:
  StepGather(const Scenario& s, size_t ranks) : scenario_(s), ranks_(ranks) {}

  // Rank `rank`'s state after step `k` (0-based) of the job.
  void add(size_t k, size_t rank, RankState state) {
    CKPTSIM_CHECK(k >= first_pending_ && rank < ranks_, "a step state came twice or late");
    const size_t slot = k - first_pending_;
    if (pending_.size() <= slot) pending_.resize(slot + 1);
    Pending& p = pending_[slot];
    if (p.states.empty()) p.states.resize(ranks_);
    CKPTSIM_CHECK(!p.states[rank].has_value(), "a rank captured one step twice");
    p.states[rank] = std::move(state);
    ++p.count;
    while (!pending_.empty() && pending_.front().count == ranks_) {
      if (!error_) {
        std::vector<RankState*> states;
        for (auto& r : pending_.front().states) states.push_back(&*r);
        try {
          gathered_.push_back(gather_given_states(scenario_, 0, states));
        } catch (...) {
          error_ = std::current_exception();
        }
      }
      pending_.pop_front();
      ++first_pending_;
    }
  }

  // The gathered steps, step k (0-based) at global step start_step + k + 1. Called once.
  std::vector<GlobalState> take(int64_t start_step) {
    CKPTSIM_CHECK(!taken_, "the gathered steps were taken twice");
    taken_ = true;
    if (error_) std::rethrow_exception(error_);
    for (size_t k = 0; k < gathered_.size(); ++k)
      gathered_[k].global_step = start_step + static_cast<int64_t>(k) + 1;
    return std::move(gathered_);
  }

 private:
  struct Pending {
    std::vector<std::optional<RankState>> states;  // by rank
    size_t count = 0;
  };
  const Scenario& scenario_;
  size_t ranks_;
  std::deque<Pending> pending_;  // steps first_pending_, first_pending_ + 1, ...
  size_t first_pending_ = 0;
  std::vector<GlobalState> gathered_;
  std::exception_ptr error_;
  bool taken_ = false;
};

// What one rank recorded in one phase.
struct RankRecord {
  std::vector<std::string> trace;
  std::optional<RankError> error;
  int64_t start_step = 0;        // the global step it resumed at
  int64_t iteration_origin = 0;  // global steps before its training loop's iteration 0
  RankState initial;             // before any load or step
  std::optional<RankState> after_load;
  size_t steps = 0;              // the steps it took (their states went to `gather`)
  StepGather* gather = nullptr;  // the world's (run_world)
  std::optional<model::SaveReport> save;
  RankState at_save;  // right after the (last) save (when it completed)
  // Right after each earlier save of the job, with its iteration (the file's).
  std::vector<std::pair<int64_t, RankState>> earlier_saves;
  // The reference run: right after each optimizer restart, with the steps done before it.
  std::vector<std::pair<int64_t, RankState>> restarts;
  bool started_fresh = false;   // the load found no tracker
  bool save_started = false;    // it reached its save
  int64_t save_iteration = -1;  // its last save's iteration, the file's (-1: none started)
  // Rank 0: the iterations of the saves whose tracker write it went on to, in order.
  std::vector<int64_t> tracker_saves;
  model::LoadReport load;
  // What the load left holding torch.empty contents (sim/probe.h).
  std::vector<UninitializedSlice> uninitialized;
  std::vector<std::pair<std::string, int64_t>> firings;
  std::vector<BufferInfo> buffers;
  std::vector<model::BufferLayout> layouts;
  std::vector<BufferInfo> expert_buffers;  // an MoE model's (issue 26)
  std::vector<model::BufferLayout> expert_layouts;
  model::ModelParallelRank mp;
};

// Every model param's initial values (fp32, on the CPU): the same on every rank of every world,
// so drawn once per run and only read by the ranks (at DP 4096, drawing them on each rank was
// a tenth of the run).
std::vector<at::Tensor> initial_params(const Scenario& s) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < s.params.size(); ++i) {
    at::Tensor src = at::empty({s.params[i].numel}, at::TensorOptions().dtype(at::kFloat));
    float* init = src.data_ptr<float>();
    for (int64_t e = 0; e < s.params[i].numel; ++e) init[e] = initial_param_value(s.seed, i, e);
    out.push_back(std::move(src));
  }
  return out;
}

// Each of the rank's params starts as its piece of the whole param's initial values.
void set_initial_params(model::DistributedDataParallel& ddp, const std::vector<at::Tensor>& init) {
  for (size_t i = 0; i < ddp.num_params(); ++i) {
    const at::Tensor p = model::host::view_flat(ddp.param(i));
    const at::Tensor& whole = init[ddp.global_param(i)];
    int64_t local = 0;
    for (const auto& [global_begin, length] :
         model::tp_element_runs(ddp.global_spec(i), ddp.mp_of(i))) {
      model::host::copy_(model::host::narrow(p, local, length),
                         model::host::narrow(whole, global_begin, length));
      local += length;
    }
  }
}

void describe_buffers(const model::DistributedDataParallel& ddp, RankRecord& out) {
  out.mp = ddp.mp();
  for (const bool expert : {false, true}) {
    for (const auto& buffer : ddp.buffers(expert)) {
      (expert ? out.expert_layouts : out.layouts).push_back(buffer.layout);
      BufferInfo info;
      info.dtype_key = buffer.dtype_key().repr();
      for (const auto& b : buffer.layout.buckets) info.numel_unpadded.push_back(b.numel_unpadded);
      for (const size_t local : buffer.params) info.params.push_back(ddp.global_param(local));
      (expert ? out.expert_buffers : out.buffers).push_back(std::move(info));
    }
  }
}

// This DP rank's local gradient of the rank's model param `i` at `global_step` (its TP piece of
// the whole param's), scaled by 1/samples_per_step (a power of two, so every DP grouping still
// sums exactly), into `grad`.
void local_scaled_gradient(const Scenario& s, int64_t global_step,
                           const model::DistributedDataParallel& ddp, size_t i, int dp_rank,
                           int64_t dp, at::Tensor& grad) {
  at::Tensor host =
      grad.is_cuda() ? at::empty({grad.numel()}, at::TensorOptions().dtype(at::kFloat)) : grad;
  std::span<float> span{host.data_ptr<float>(), static_cast<size_t>(host.numel())};
  int64_t local = 0;
  const int64_t ep = ddp.is_expert(i) ? ddp.mp().ep_size : 0;
  for (const auto& [global_begin, length] :
       model::tp_element_runs(ddp.global_spec(i), ddp.mp_of(i))) {
    const std::span<float> out =
        span.subspan(static_cast<size_t>(local), static_cast<size_t>(length));
    const GradientSpec g{s.seed, s.samples_per_step};
    const auto param = static_cast<int64_t>(ddp.global_param(i));
    if (ep > 0) {
      expert_local_gradient(g, global_step, param, global_begin, dp_rank, dp, ep, out);
    } else {
      local_gradient(g, global_step, param, global_begin, dp_rank, dp, out);
    }
    local += length;
  }
  const float scale = 1.0F / static_cast<float>(s.samples_per_step);
  for (float& x : span) x *= scale;
  if (grad.is_cuda()) grad.copy_(host);
}

RankError rank_error(const std::exception& e, int rank, const std::string& stage) {
  RankError err;
  err.rank = rank;
  err.stage = stage;
  if (const auto* upstream = dynamic_cast<const model::UpstreamError*>(&e)) {
    err.py_type = upstream->py_type();
    err.message = upstream->message();
    err.site = upstream->site();
    if (const auto* merge = dynamic_cast<const model::MergeError*>(&e)) {
      err.merge_kind = merge->kind();
      err.merge_path = merge->path();
    }
  } else if (dynamic_cast<const PeerAborted*>(&e) != nullptr) {
    err.py_type = "PeerAborted";
    err.message = e.what();
    err.secondary = true;
  } else {
    // An InvariantViolation (a ckptsim bug) or a torch error outside the modeled sites.
    err.py_type = model::exception_py_type(e);
    err.message = model::exception_text(e);
  }
  return err;
}

// The lr and weight decay every param group holds: what the next step uses.
std::vector<GroupHyper> group_hypers(model::ChainedOptimizer& opt) {
  std::vector<GroupHyper> out;
  for (const model::Value& g : opt.param_groups()) {
    const model::Dict& group = *g.dict();
    out.push_back({group.get("wd_mult", model::Value(1.0)).as_float(),
                   group.get("lr_mult", model::Value(1.0)).as_float(), group.at("lr").as_float(),
                   group.at("weight_decay").as_float()});
  }
  return out;
}

// The reference run at a phase boundary: the intended schedule from there on, with each
// group's bounds from it (max_lr and min_lr times the group's lr_mult, as a job started with
// those arguments builds them), stepped to where the run is.
void change_schedule(const PhaseJob& job, model::ChainedOptimizer& opt,
                     std::optional<model::OptimizerParamScheduler>& scheduler,
                     const model::ScheduleConfig& schedule, int64_t steps_counted) {
  for (model::Value& g : opt.param_groups()) {
    model::Dict& group = *g.dict();
    const double lr_mult = group.get("lr_mult", model::Value(1.0)).as_float();
    group.set("max_lr", model::Value(schedule.lr * lr_mult));
    group.set("min_lr", model::Value(schedule.min_lr * lr_mult));
  }
  scheduler.emplace(opt, schedule, job.scenario->samples_per_step, job.resume, *job.switches);
  scheduler->step(steps_counted * job.scenario->samples_per_step);
}

// The reference run where a --no-load-optim phase resumes: a new optimizer over the weights
// the run holds (the job's arguments with `schedule`'s lr), and a new scheduler of `schedule`
// that has counted nothing, as a job started from these weights builds them.
void restart_optimizer(const PhaseJob& job, model::Runtime& rt, model::DistributedDataParallel& ddp,
                       model::ProcessGroup& pg, std::unique_ptr<model::ChainedOptimizer>& optimizer,
                       std::optional<model::OptimizerParamScheduler>& scheduler,
                       const model::ScheduleConfig& schedule) {
  model::OptimizerConfig config = job.optimizer;
  config.adam.lr = schedule.lr;
  config.min_lr = schedule.min_lr;
  scheduler.reset();
  optimizer.reset();
  optimizer = model::get_megatron_optimizer(rt, ddp, config, *job.switches, &pg);
  scheduler.emplace(*optimizer, schedule, job.scenario->samples_per_step, job.resume,
                    *job.switches);
}

// The job's saves on one rank (PhaseJob's save fields), as train() makes them: at the end of
// every save_interval-th iteration and at the job's end (unless the interval just saved that
// iteration), each synchronous or scheduled; scheduled ones are finalized in FIFO order at the
// top of the first iteration `async_write_steps` iterations after theirs
// (maybe_finalize_async_save(blocking=False)), and every one left at the end (blocking).
// RankRecord::save and at_save are the last save's; an error is recorded at stage "save".
class JobSaves {
 public:
  JobSaves(const PhaseJob& job, model::DistributedDataParallel& ddp, model::ChainedOptimizer& opt,
           std::optional<model::OptimizerParamScheduler>& scheduler, model::ProcessGroup& pg,
           model::Runtime& rt, RankRecord& out, std::string& stage)
      : job_(job),
        ddp_(ddp),
        opt_(opt),
        scheduler_(scheduler),
        pg_(pg),
        rt_(rt),
        out_(out),
        stage_(stage) {}

  void before_step(int64_t iteration) { finalize(iteration, false); }
  void after_step(int64_t iteration) {
    if (job_.save_interval > 0 && iteration % job_.save_interval == 0) save(iteration);
  }
  void at_exit(int64_t iteration) {
    if (job_.exit_save && last_saved_ != iteration) save(iteration);
    finalize(iteration, true);
  }

 private:
  void save(int64_t iteration) {
    if (last_saved_ >= 0) out_.earlier_saves.emplace_back(last_saved_, std::move(out_.at_save));
    out_.save.reset();  // until this save returns, the job's last save did not complete
    stage_ = "save";
    out_.save_started = true;
    out_.save_iteration = iteration;
    const int rank = pg_.rank();
    if (job_.async_save) {
      pending_.emplace_back();
      out_.save = model::schedule_async_save(ddp_, opt_, &*scheduler_, iteration, *job_.save_root,
                                             pg_, *job_.switches, job_.format, rt_, cache_,
                                             pending_.back(), job_.caches);
    } else {
      if (rank == 0) out_.tracker_saves.push_back(iteration);
      out_.save =
          model::save_checkpoint_to_root(ddp_, opt_, &*scheduler_, iteration, *job_.save_root, pg_,
                                         *job_.switches, job_.format, rt_, job_.caches);
    }
    out_.at_save = capture(opt_, ddp_, job_.scenario->params, rank, true);
    out_.trace.push_back(fmt::format("save phase={} rank={} iteration={} pieces={}{}",
                                     job_.phase_id, rank, iteration, out_.save->pieces->size(),
                                     job_.async_save ? " scheduled" : ""));
    last_saved_ = iteration;
    stage_ = "train";
  }
  void finalize(int64_t iteration, bool blocking) {
    while (!pending_.empty() &&
           (blocking || iteration - pending_.front().iteration >= job_.async_write_steps)) {
      stage_ = "save";
      const model::AsyncSaveRequest& request = pending_.front();
      if (pg_.rank() == 0) out_.tracker_saves.push_back(request.iteration);
      try {
        model::finalize_async_save(request, *job_.save_root, pg_, iteration, rt_);
      } catch (...) {
        out_.save.reset();  // the last save's files were not all written
        throw;
      }
      out_.trace.push_back(fmt::format("finalize phase={} rank={} iteration={} at={}",
                                       job_.phase_id, pg_.rank(), request.iteration, iteration));
      pending_.pop_front();
      stage_ = "train";
    }
  }

  const PhaseJob& job_;
  model::DistributedDataParallel& ddp_;
  model::ChainedOptimizer& opt_;
  std::optional<model::OptimizerParamScheduler>& scheduler_;
  model::ProcessGroup& pg_;
  model::Runtime& rt_;
  RankRecord& out_;
  std::string& stage_;
  std::deque<model::AsyncSaveRequest> pending_;
  model::AsyncWriterCache cache_;
  int64_t last_saved_ = -1;
};

// The phase's training steps on one rank; returns the iteration reached (the training loop's:
// global step out.iteration_origin + iteration). `saves` (null: none) makes the saves the loop
// makes between its steps.
int64_t train(const PhaseJob& job, model::Runtime& rt, model::DistributedDataParallel& ddp,
              model::ProcessGroup& pg, std::unique_ptr<model::ChainedOptimizer>& optimizer,
              std::optional<model::OptimizerParamScheduler>& scheduler, int64_t iteration,
              RankRecord& out, JobSaves* saves) {
  const Scenario& s = *job.scenario;
  const int rank = rt.rank();
  const int dp_rank = ddp.dp_group().rank();
  int64_t origin = 0;  // the reference run's last optimizer restart
  // The reference run's restarts before `global_step` (the one after the last step too: a
  // --no-load-optim phase of no steps at the end is compared with what it would start from).
  const auto restart = [&](int64_t global_step) {
    for (const int64_t first : job.optimizer_restarts) {
      if (first != global_step) continue;
      const auto it = std::find_if(job.schedule_changes.rbegin(), job.schedule_changes.rend(),
                                   [&](const auto& c) { return c.first <= global_step; });
      restart_optimizer(job, rt, ddp, pg, optimizer, scheduler,
                        it != job.schedule_changes.rend() ? it->second : job.schedule);
      origin = global_step - 1;
      out.restarts.emplace_back(origin, capture(*optimizer, ddp, s.params, rank, false));
      if (job.trace_steps) {
        out.trace.push_back(
            fmt::format("restart phase={} global={} rank={}", job.phase_id, global_step, rank));
      }
    }
  };
  for (int64_t k = 0; k < job.steps; ++k) {
    if (saves != nullptr) saves->before_step(iteration);
    const int64_t global_step = out.iteration_origin + iteration + 1;
    for (const auto& [first, schedule] : job.schedule_changes) {
      if (first == global_step)
        change_schedule(job, *optimizer, scheduler, schedule, global_step - 1 - origin);
    }
    restart(global_step);
    model::ChainedOptimizer& opt = *optimizer;
    std::vector<GroupHyper> hypers = group_hypers(opt);
    model::train_step(ddp, opt, *scheduler, s.samples_per_step, rt,
                      [&](size_t i, at::Tensor& grad) {
                        local_scaled_gradient(s, global_step, ddp, i, dp_rank, job.dp, grad);
                      });
    ++iteration;
    std::vector<StepUse> uses = step_uses(opt);
    globalize_uses(ddp, uses);
    // Param groups only where a checker reads them: the state a phase ends (and saves) in.
    const bool last = k + 1 == job.steps && job.phase_id != kReferencePhaseId;
    RankState state = capture(opt, ddp, s.params, rank, last);
    state.uses = std::move(uses);
    state.hypers = std::move(hypers);
    if (job.trace_steps) {
      out.trace.push_back(fmt::format("step phase={} global={} rank={} state={:016x}", job.phase_id,
                                      global_step, rank, rank_state_hash(state, rank)));
    }
    ++out.steps;
    out.gather->add(static_cast<size_t>(k), static_cast<size_t>(rank), std::move(state));
    if (saves != nullptr) saves->after_step(iteration);
  }
  restart(out.iteration_origin + iteration + 1);
  return iteration;
}

// One rank of the job: `pg` the world (the checkpoint's save and load), `dp_pg` its DP group (its
// model's buffers and optimizer), `mp` its place in TP x PP.
void rank_main(const PhaseJob& job, model::ProcessGroup& pg, model::ProcessGroup& dp_pg,
               model::ProcessGroup* expert_pg, const model::ModelParallelRank& mp,
               RankRecord& out) {
  const Scenario& s = *job.scenario;
  const int rank = pg.rank();
  model::Runtime rt(s.seed, job.phase_id, rank, job.real_cuda);
  rt.enable_faults(s.faults);
  std::string stage = "init";
  try {
    const model::LayoutOptions layout{job.dp, s.bucket_size, s.pad_buckets_for_high_nccl_busbw};
    model::DistributedDataParallel ddp(rt, s.params, layout, dp_pg, mp, expert_pg);
    set_initial_params(ddp, *job.initial_params);
    describe_buffers(ddp, out);
    std::unique_ptr<model::ChainedOptimizer> optimizer =
        model::get_megatron_optimizer(rt, ddp, job.optimizer, *job.switches, &pg);
    model::ChainedOptimizer& opt = *optimizer;  // replaced only in the reference run's train
    std::optional<model::OptimizerParamScheduler> scheduler;
    scheduler.emplace(opt, job.schedule, s.samples_per_step, job.resume, *job.switches);
    out.initial = capture(opt, ddp, s.params, rank, job.phase_id == 0);

    int64_t iteration = 0;
    if (job.load_from != nullptr || job.load_root != nullptr) {
      stage = "load";
      std::optional<model::Resumed> loaded;
      if (job.load_root != nullptr) {
        loaded =
            model::load_latest_checkpoint(ddp, opt, &*scheduler, *job.load_root, pg, *job.switches,
                                          rt, &out.load, job.resume_args, job.caches);
      } else if (job.load_as_script) {
        const int64_t it = model::load_distributed_checkpoint(
            ddp, opt, *job.load_from, pg, *job.switches, rt, &out.load, job.caches);
        loaded = model::Resumed{it, it};
      } else {
        loaded = model::load_checkpoint(ddp, opt, &*scheduler, *job.load_from, pg, *job.switches,
                                        rt, &out.load, job.resume_args, job.caches);
      }
      if (loaded.has_value()) {
        iteration = loaded->iteration;
        // The checkpoint's iteration counts from its saver's origin; the loop's from here.
        out.iteration_origin = job.loaded_origin + loaded->checkpoint_iteration - iteration;
        out.uninitialized = uninitialized_after_load(opt, ddp, out.load);
        out.after_load = capture(opt, ddp, s.params, rank, true);
        const std::string from =
            loaded->checkpoint_iteration == iteration
                ? std::string()
                : fmt::format(" checkpoint_iteration={}", loaded->checkpoint_iteration);
        out.trace.push_back(fmt::format("load phase={} rank={} iteration={}{} state={:016x}",
                                        job.phase_id, rank, iteration, from,
                                        rank_state_hash(*out.after_load, rank)));
      } else {
        out.started_fresh = true;
        out.trace.push_back(fmt::format("load phase={} rank={} no tracker: starting from random",
                                        job.phase_id, rank));
      }
    }
    out.start_step = out.iteration_origin + iteration;
    stage = "train";
    std::optional<JobSaves> saves;
    if (job.save_root != nullptr) saves.emplace(job, ddp, opt, scheduler, pg, rt, out, stage);
    iteration =
        train(job, rt, ddp, pg, optimizer, scheduler, iteration, out, saves ? &*saves : nullptr);
    if (saves) saves->at_exit(iteration);
    out.firings = rt.fault_firings();
  } catch (const std::exception& e) {
    out.error = rank_error(e, rank, stage);
    if (dynamic_cast<const model::UpstreamError*>(&e) != nullptr) out.firings = rt.fault_firings();
    throw;
  }
}

// The job's world of tp x pp x dp ranks, numbered as parallel_state's default order
// tp-cp-ep-dp-pp: rank = tp_rank + tp * (dp_rank + dp * pp_rank). Each (TP, PP) rank's DP ranks
// form a DP group; at TP = PP = 1 that is the world itself.
// The states after each step go to `steps`.
std::vector<RankRecord> run_world(const PhaseJob& job, StepGather& steps) {
  const int64_t world_size = job.tp * job.pp * job.dp;
  std::vector<RankRecord> outs(static_cast<size_t>(world_size));
  for (RankRecord& o : outs) o.gather = &steps;
  LocalWorld world(
      static_cast<int>(world_size), Execution::kFibers,
      job.share_gathered_objects ? ObjectGathers::kShared : ObjectGathers::kCopiedPerRank);
  std::vector<int> dp_groups;  // by data_parallel_group_idx
  if (job.tp * job.pp > 1) {
    for (int64_t pp_rank = 0; pp_rank < job.pp; ++pp_rank) {
      for (int64_t tp_rank = 0; tp_rank < job.tp; ++tp_rank) {
        std::vector<int> members;
        for (int64_t d = 0; d < job.dp; ++d)
          members.push_back(static_cast<int>(tp_rank + job.tp * (d + job.dp * pp_rank)));
        dp_groups.push_back(world.new_group(std::move(members)));
      }
    }
  }
  // The expert-DP groups (TP = PP = 1; parallel_state's tp-cp-ep-dp-pp order): EP rank e's
  // group is {e, e + ep, e + 2 ep, ...}. At EP 1 the world itself.
  std::vector<int> expert_groups;  // by EP rank
  const bool experts = std::any_of(job.scenario->params.begin(), job.scenario->params.end(),
                                   [](const model::ParamSpec& p) { return p.expert; });
  if (experts && job.ep > 1) {
    for (int64_t e = 0; e < job.ep; ++e) {
      std::vector<int> members;
      for (int64_t d = e; d < job.dp; d += job.ep) members.push_back(static_cast<int>(d));
      expert_groups.push_back(world.new_group(std::move(members)));
    }
  }
  world.run([&](model::ProcessGroup& pg) {
    const int64_t r = pg.rank();
    const auto mp = model::ModelParallelRank::of(r, job.tp, job.pp, job.dp, job.ep);
    std::unique_ptr<LocalProcessGroup> dp_pg;
    if (!dp_groups.empty()) {
      dp_pg = world.group(dp_groups[static_cast<size_t>(mp.data_parallel_group_idx())],
                          static_cast<int>(r));
    }
    std::unique_ptr<LocalProcessGroup> expert_pg;
    if (!expert_groups.empty())
      expert_pg = world.group(expert_groups[static_cast<size_t>(mp.ep_rank)], static_cast<int>(r));
    model::ProcessGroup* expert_group = !experts ? nullptr : expert_pg ? expert_pg.get() : &pg;
    rank_main(job, pg, dp_pg ? *dp_pg : pg, expert_group, mp, outs[static_cast<size_t>(r)]);
  });
  for (RankRecord& o : outs) o.gather = nullptr;
  return outs;
}

// Every rank's state at one point, picked from its record (null where it has none).
template <typename Pick>
std::vector<const RankState*> states_of(const std::vector<RankRecord>& outs, Pick pick) {
  std::vector<const RankState*> out;
  for (const auto& o : outs) out.push_back(pick(o));
  return out;
}

void collect_errors(const std::vector<RankRecord>& outs, std::vector<RankError>& errors) {
  for (const auto& o : outs) {
    if (o.error.has_value()) errors.push_back(*o.error);
  }
}

std::string options_line(const Scenario& s) {
  std::string line = fmt::format(
      "options optimizer={} params={} total_numel={} bucket_size={} pad_65536={} "
      "samples_per_step={} phases=",
      model::optimizer_kind_name(s.optimizer.kind), s.params.size(), s.total_numel(),
      s.bucket_size ? std::to_string(*s.bucket_size) : "None", s.pad_buckets_for_high_nccl_busbw,
      s.samples_per_step);
  for (const auto& p : s.phases) {
    line += p.tp * p.pp == 1
                ? fmt::format("[dp={} steps={}]", p.dp, p.steps)
                : fmt::format("[tp={} pp={} dp={} steps={}]", p.tp, p.pp, p.dp, p.steps);
  }
  if (!s.faults.empty()) {
    line += " faults=";
    for (const auto& f : s.faults) line += f + ";";
  }
  return line;
}

// Checkpoint storage: memory by default, or a directory with one folder per phase.
Result<std::unique_ptr<model::Storage>> open_storage(const RunOptions& options,
                                                     std::string& location) {
  if (options.checkpoint_dir.empty()) {
    location = "memory";
    return std::unique_ptr<model::Storage>(std::make_unique<model::MemoryStorage>());
  }
  std::error_code ec;
  std::filesystem::create_directories(options.checkpoint_dir, ec);
  if (ec) {
    return Status::io_error(options.checkpoint_dir +
                            ": cannot create checkpoint directory: " + ec.message());
  }
  location = options.checkpoint_dir;
  return std::unique_ptr<model::Storage>(
      std::make_unique<model::DirectoryStorage>(options.checkpoint_dir));
}

// 1. The uninterrupted reference run: every step of every phase at phases[0]'s DP and revision.
void run_reference(const Scenario& scenario, const RunOptions& options,
                   const std::vector<at::Tensor>& init, RunResult& result) {
  PhaseJob job = phase_job(scenario, options, init, scenario.phases.front(), kReferencePhaseId,
                           result.gpu_resident);
  job.steps = scenario.total_steps();
  const std::vector<model::ScheduleConfig> intended = intended_schedules(scenario);
  int64_t first = 1;
  for (size_t i = 0; i < scenario.phases.size(); ++i) {
    if (i > 0 && intended[i] != intended[i - 1])
      job.schedule_changes.emplace_back(first, intended[i]);
    if (scenario.phases[i].fresh_optimizer()) job.optimizer_restarts.push_back(first);
    first += scenario.phases[i].steps;
  }
  StepGather steps(scenario, static_cast<size_t>(job.tp * job.pp * job.dp));
  const auto outs = run_world(job, steps);
  collect_errors(outs, result.reference_errors);
  result.reference_initial =
      gather_state(scenario, 0, states_of(outs, [](const RankRecord& o) { return &o.initial; }));
  if (result.reference_errors.empty()) {
    result.reference = steps.take(0);
    CKPTSIM_CHECK(result.reference.size() == static_cast<size_t>(job.steps),
                  "the reference run's ranks took other than its steps without an error");
  }
  const size_t restarts = result.reference_errors.empty() ? outs.front().restarts.size() : 0;
  for (size_t k = 0; k < restarts; ++k) {
    const int64_t at = outs.front().restarts[k].first;
    result.reference_restarts[at] = gather_state(
        scenario, at,
        states_of(outs, [k](const RankRecord& o) { return &o.restarts.at(k).second; }));
  }
  for (const auto& e : result.reference_errors)
    result.trace.push_back("reference error " + e.summary());
  result.trace.push_back(
      fmt::format("reference dp={} steps={} final={:016x}", job.dp, job.steps,
                  result.reference.empty() ? 0 : result.reference.back().hash()));
}

// Paired assertions on what every rank of a phase must agree on (TigerBeetle's "positive and
// negative space"): one start step, one buffer layout, one list of saved pieces.
void check_ranks_agree(const std::vector<RankRecord>& outs) {
  const RankRecord* first = nullptr;
  std::map<int64_t, const RankRecord*> first_of_group;  // by data_parallel_group_idx
  for (const auto& o : outs) {
    if (o.error.has_value()) continue;
    const auto [group, fresh] = first_of_group.emplace(o.mp.data_parallel_group_idx(), &o);
    CKPTSIM_CHECK(fresh || o.buffers == group->second->buffers,
                  "ranks of one DP group built different buffers");
    if (first == nullptr) {
      first = &o;
      continue;
    }
    CKPTSIM_CHECK(o.start_step == first->start_step, "ranks resumed at different steps");
    CKPTSIM_CHECK(o.steps == first->steps, "ranks took different steps");
    CKPTSIM_CHECK(o.save.has_value() == first->save.has_value(), "ranks disagree on the save");
    if (o.save.has_value()) {
      // Ranks that share one list agree; lists of their own are compared element by element.
      CKPTSIM_CHECK(
          o.save->pieces == first->save->pieces || *o.save->pieces == *first->save->pieces,
          "ranks learned different checkpoint pieces");
    }
  }
}

// Nothing the ranks shared (model/process_group.h GatheredObjects, the LoadIndexes of the run's
// model/megatron/checkpoint_caches.h) was written while they shared it: each shared list
// checked once.
void check_shared_unchanged(const std::vector<RankRecord>& outs,
                            const model::CheckpointCaches* caches) {
  const std::vector<model::SavedPiece>* checked = nullptr;
  for (const auto& o : outs) {
    if (!o.save.has_value() || o.save->pieces.get() == checked) continue;
    o.save->check_pieces_unchanged();
    checked = o.save->pieces.get();
  }
  if (caches != nullptr) caches->check_load_indexes_unchanged();
}

// The phase's record from what its ranks recorded.
void gather_phase(const Scenario& scenario, const std::vector<RankRecord>& outs, StepGather& steps,
                  const model::Storage& store, PhaseRecord& rec) {
  const size_t i = rec.index;
  // The keys of a chain of several parts are 'chained_<part>.'-prefixed where the format asks.
  const bool chained = std::any_of(rec.groups.begin(), rec.groups.end(),
                                   [](const GroupLayout& g) { return g.part == 1; });
  // A resume_from_checkpoint record (index 1 of a scenario of one phase, `inspect`) is no phase
  // of the scenario: the checkpoint it loaded is in the scenario's format.
  const bool prefixed =
      chained && model::ChainedOptimizer::should_add_prefix(
                     i < scenario.phases.size() ? scenario.format_of(i) : scenario.format);
  for (GroupLayout& g : rec.groups)
    g.key_prefix = prefixed ? fmt::format("chained_{}.", g.part) : "";
  if (i == 0 && !outs.front().layouts.empty()) {
    rec.initial =
        gather_state(scenario, 0, states_of(outs, [](const RankRecord& o) { return &o.initial; }));
  }
  // After the load: every rank's, or (trace only) those that loaded when others raised.
  const auto loaded = [](const RankRecord& o) { return o.after_load.has_value(); };
  if (i > 0 && std::any_of(outs.begin(), outs.end(), loaded)) {
    GlobalState st =
        gather_state(scenario, rec.start_step, states_of(outs, [](const RankRecord& o) {
                       return o.after_load ? &*o.after_load : nullptr;
                     }));
    (std::all_of(outs.begin(), outs.end(), loaded) ? rec.after_load : rec.after_load_partial) =
        std::move(st);
  }
  rec.after_step = steps.take(rec.start_step);
  if (std::all_of(outs.begin(), outs.end(),
                  [](const RankRecord& o) { return o.save.has_value(); })) {
    rec.saved_pieces = *outs.front().save->pieces;
    for (const auto& o : outs) rec.common_differences.push_back(o.save->common_state_differences);
    // A piece the reader refuses (outside its tensor, past its file) is the checkpoint's
    // fault, not ours: shards_tile_buckets reports it.
    // Every optimizer tensor, in one read: the bucket keys ("optimizer.distributed.") and the
    // model-space ones ("optimizer.state.").
    auto values = model::read_checkpoint_tensors(store, rec.saved_pieces, "optimizer.");
    if (values.is_ok()) {
      rec.checkpoint_values = std::move(values.value());
    } else {
      rec.checkpoint_read_error = values.status().message();
    }
    rec.saved_state = saved_state_by_param(scenario, rec);
    const int64_t at = rec.save_iteration >= 0
                           ? rec.iteration_origin + rec.save_iteration
                           : rec.start_step + static_cast<int64_t>(rec.after_step.size());
    rec.at_save =
        gather_state(scenario, at, states_of(outs, [](const RankRecord& o) { return &o.at_save; }));
  }
  // The job's earlier saves, whether or not its last one completed.
  size_t earlier = std::numeric_limits<size_t>::max();
  for (const auto& o : outs) earlier = std::min(earlier, o.earlier_saves.size());
  for (size_t k = 0; k < earlier; ++k) {
    rec.earlier_saves.push_back(gather_state(
        scenario, rec.iteration_origin + outs.front().earlier_saves[k].first,
        states_of(outs, [k](const RankRecord& o) { return &o.earlier_saves[k].second; })));
  }
}

void record_outcome(const std::vector<RankRecord>& outs, PhaseRecord& rec) {
  rec.ran = true;
  collect_errors(outs, rec.errors);
  rec.completed = rec.errors.empty();
  // Where the phase resumed: a rank that loaded says (rank 0 may have failed its load before it
  // learned the iteration, while the others loaded: a cut .distcp that only rank 0 reads).
  const auto loaded = std::find_if(outs.begin(), outs.end(),
                                   [](const RankRecord& o) { return o.after_load.has_value(); });
  const RankRecord& resumed = loaded != outs.end() ? *loaded : outs.front();
  rec.start_step = resumed.start_step;
  rec.iteration_origin = resumed.iteration_origin;
  rec.buffers = outs.front().buffers;
  rec.layouts = outs.front().layouts;
  // Each DP group's, from its first rank (world order puts DP rank 0 of every (TP, PP) rank
  // before any DP rank 1 of the same PP stage).
  for (const auto& o : outs) {
    const auto g = static_cast<size_t>(o.mp.data_parallel_group_idx());
    if (rec.groups.size() <= g) rec.groups.resize(g + 1);
    if (rec.groups[g].buffers.empty() && !o.buffers.empty()) {
      rec.groups[g] = GroupLayout{o.mp, o.buffers, o.layouts, 0, 0, ""};
      rec.groups[g].dp_group_idx = static_cast<int64_t>(g);
    }
  }
  // An MoE model's expert-DP groups (the chain's part 1), each from its first rank.
  for (const auto& o : outs) {
    if (o.expert_buffers.empty()) continue;
    const bool seen = std::any_of(rec.groups.begin(), rec.groups.end(), [&](const GroupLayout& g) {
      return g.part == 1 && g.dp_group_idx == o.mp.ep_rank;
    });
    if (seen) continue;
    GroupLayout g{o.mp.expert_view(), o.expert_buffers, o.expert_layouts, 1, o.mp.ep_rank, ""};
    g.part = 1;
    g.dp_group_idx = o.mp.ep_rank;
    rec.groups.push_back(std::move(g));
  }
  for (const auto& o : outs) {
    for (const auto& f : o.firings) {
      auto it = std::find_if(rec.fault_firings.begin(), rec.fault_firings.end(),
                             [&](const auto& x) { return x.first == f.first; });
      if (it == rec.fault_firings.end()) {
        rec.fault_firings.push_back(f);
      } else {
        it->second += f.second;
      }
    }
    for (const auto& u : o.load.uncovered) rec.load_uncovered.push_back(u);
    rec.load_unwritten.push_back(o.load.unwritten);
  }
}

std::string phase_status(const PhaseRecord& rec) {
  if (rec.completed) {
    return fmt::format("ok, {} steps, saved {} pieces", rec.spec.steps, rec.saved_pieces.size());
  }
  for (const auto& e : rec.errors) {
    if (!e.secondary) return "failed: " + e.summary();
  }
  return "failed: " + rec.errors.front().summary();
}

// The phase whose save wrote the iteration `rec` loaded: the last earlier one that saved it
// (a phase of no steps saves again the iteration it loaded). nullopt: it loaded none, or a
// checkpoint saved elsewhere (resume_from_checkpoint).
std::optional<size_t> loaded_phase(const RunResult& result, const PhaseRecord& rec) {
  if (!rec.after_load.has_value()) return std::nullopt;
  for (size_t j = std::min(rec.index, result.phases.size()); j-- > 0;) {
    const PhaseRecord& saver = result.phases[j];
    if (saver.saved_global_step() == rec.start_step ||
        saver.saved_at(rec.start_step - saver.iteration_origin) != nullptr)
      return j;
  }
  return std::nullopt;
}

// 2. One phase: a fresh world of spec.dp ranks that loads what the tracker in `root` names (or
// the checkpoint `root` is, for resume_from_checkpoint) and saves into `root`.
void run_phase(const Scenario& scenario, const RunOptions& options, const PhaseJob& job,
               const model::Storage& root, RunResult& result, PhaseRecord& rec) {
  StepGather steps(scenario, static_cast<size_t>(job.tp * job.pp * job.dp));
  const auto outs = run_world(job, steps);
  check_ranks_agree(outs);
  check_shared_unchanged(outs, job.caches);
  record_outcome(outs, rec);
  rec.layout_options = {rec.spec.dp, scenario.bucket_size,
                        scenario.pad_buckets_for_high_nccl_busbw};
  for (const auto& o : outs) {
    for (const auto& line : o.trace) result.trace.push_back(line);
  }
  rec.started_fresh = outs.front().started_fresh;
  // The iteration its save wrote, where the save started and no rank failed before it.
  const bool saved =
      std::any_of(outs.begin(), outs.end(), [](const RankRecord& o) { return o.save_started; }) &&
      std::none_of(outs.begin(), outs.end(), [](const RankRecord& o) {
        return o.error.has_value() && !o.error->secondary && o.error->stage != "save";
      });
  if (job.save_root != nullptr && saved) {
    for (const auto& o : outs) rec.save_iteration = std::max(rec.save_iteration, o.save_iteration);
  }
  rec.tracker_saves = outs.front().tracker_saves;
  const auto saved_dir = model::subdir(
      root, model::iteration_dir_name(rec.save_iteration >= 0 ? rec.save_iteration : 0));
  gather_phase(scenario, outs, steps, *saved_dir, rec);
  rec.loaded_phase = loaded_phase(result, rec);
  // The checkpoint this phase loaded: the save that wrote it.
  const PhaseRecord* from = rec.loaded_phase ? &result.phases[*rec.loaded_phase] : nullptr;
  const GlobalState* checkpoint = nullptr;
  if (from != nullptr && from->saved_global_step() != rec.start_step) {
    checkpoint = from->saved_at(rec.start_step - from->iteration_origin);  // an earlier save
  } else if (from != nullptr && from->at_save.has_value()) {
    checkpoint = &*from->at_save;
  }
  std::vector<std::vector<UninitializedSlice>> slices;
  for (const auto& o : outs) slices.push_back(o.uninitialized);
  mark_uninitialized(scenario, checkpoint, slices, rec);
  for (const auto& e : rec.errors) {
    if (!e.secondary) result.trace.push_back("error " + e.summary());
  }
  for (const auto& [site, count] : rec.fault_firings) {
    result.trace.push_back(fmt::format("fault phase={} site={} fired={}", rec.index, site, count));
  }
  if (options.progress) {
    const std::string sizes =
        rec.spec.tp * rec.spec.pp == 1
            ? fmt::format("dp={}", rec.spec.dp)
            : fmt::format("tp={} pp={} dp={}", rec.spec.tp, rec.spec.pp, rec.spec.dp);
    options.progress(fmt::format("phase {} ({}, {}): {}", rec.index, sizes, rec.spec.profile->name,
                                 phase_status(rec)));
  }
}

// Torn and short writes land whole pages (model::FaultyStorage): a small file lands empty.
constexpr size_t kPageBytes = 4096;

// What a check reads of the checkpoint directory `root` (PhaseRecord::OnDisk).
PhaseRecord::OnDisk observe_checkpoint_directory(const model::Storage& root,
                                                 model::CheckpointCaches* caches) {
  PhaseRecord::OnDisk d;
  const auto bytes = root.read_file(std::string(model::kTrackerFile));
  if (!bytes.is_ok()) return d;
  d.tracker = std::string(bytes.value().begin(), bytes.value().end());
  d.named = model::parse_tracker(bytes.value());
  if (!d.named.has_value()) return d;
  const std::string dir = model::iteration_dir_name(*d.named);
  if (!root.exists(dir)) {
    d.problem = dir + ": no such directory";
    return d;
  }
  const auto files = model::subdir(root, dir);
  d.problem = model::checkpoint_problem(*files, caches);
  if (!d.problem.empty()) return d;
  const auto common = model::read_common_state(*files);
  const model::Value* it = common.is_ok() && common.value().is_dict()
                               ? common.value().dict()->find("iteration")
                               : nullptr;
  if (it != nullptr && it->is_int()) d.files_iteration = it->as_int();
  return d;
}

// Removes what an earlier run saved in the checkpoint directory (its iter_* directories and its
// tracker), nothing else.
Status clear_checkpoints(model::Storage& root) {
  auto names = root.list("");
  if (!names.is_ok())
    return names.status().code() == Status::Code::kNotFound ? Status::ok() : names.status();
  for (const auto& name : names.value()) {
    if (name.starts_with("iter_") || name == model::kTrackerFile) {
      if (Status s = root.remove_all(name); !s.is_ok()) return s;
    }
  }
  return Status::ok();
}

// The job after `prev` runs: `prev` completed and saved, or its save met a storage fault (the
// job stopped or raised there; the next job resumes from what the tracker names).
bool resumes_after(const PhaseRecord& prev) {
  if (prev.completed) return prev.spec.saves();
  if (!prev.ran || prev.storage_faults_fired.empty()) return false;
  return std::all_of(prev.errors.begin(), prev.errors.end(),
                     [](const RankError& e) { return e.secondary || e.stage == "save"; });
}

// What the driver knows of the checkpoint directory across phases, the judges' ground truth
// (PhaseRecord::committed_before, after_storage_fault, on_disk): the newest save whose tracker
// write landed whole, and whether a storage fault has fired.
class CheckpointHistory {
 public:
  void before_phase(PhaseRecord& rec) const {
    rec.committed_before = committed_;
    rec.after_storage_fault = fault_fired_;
  }
  void after_phase(const model::FaultyStorage& save_root, const model::Storage& root,
                   model::CheckpointCaches* caches, PhaseRecord& rec,
                   std::vector<std::string>& trace) {
    rec.storage_faults_fired = save_root.fired();
    rec.crashed = save_root.crashed();
    for (const auto& f : rec.storage_faults_fired) {
      trace.push_back(fmt::format("storage fault phase={} {}", rec.index, f));
      rec.short_write = rec.short_write || f.starts_with("short");
    }
    fault_fired_ = fault_fired_ || !rec.storage_faults_fired.empty();
    if (rec.save_iteration < 0) return;
    // The k-th tracker write that reached the disk is the k-th save rank 0 wrote it for (after
    // a failed write nothing lands, the job ends).
    const std::string tracker(model::kTrackerFile);
    const auto landed = static_cast<size_t>(save_root.writes_landed(tracker));
    if (landed > 0 && landed <= rec.tracker_saves.size() && save_root.landed_whole(tracker))
      committed_ = {{rec.tracker_saves[landed - 1], rec.index}};
    rec.on_disk = observe_checkpoint_directory(root, caches);
  }

 private:
  std::optional<std::pair<int64_t, size_t>> committed_;
  bool fault_fired_ = false;
};

// Where phases save: `root` (memory, or options.checkpoint_dir), and with --checkpoint-format
// torch_dist `export_root` (the directory, which then gets the exports while the simulator's own
// checkpoints stay in memory).
Status open_roots(const RunOptions& options, RunResult& result,
                  std::unique_ptr<model::Storage>& root,
                  std::unique_ptr<model::Storage>& export_root) {
  const bool export_torch_dist =
      options.checkpoint_format == CheckpointFormat::kTorchDist && !options.checkpoint_dir.empty();
  if (export_torch_dist) {
    auto dir = open_storage(options, result.checkpoint_location);
    if (!dir.is_ok()) return dir.status();
    export_root = std::move(dir.value());
  }
  std::string own_location;
  RunOptions own_options = options;
  if (export_torch_dist) own_options.checkpoint_dir.clear();
  auto own =
      open_storage(own_options, export_torch_dist ? own_location : result.checkpoint_location);
  if (!own.is_ok()) return own.status();
  root = std::move(own.value());
  return Status::ok();
}

// Trace line 1: `seed=<s> revision=<r0>,<r1>,... scenario=<name>`.
std::string seed_line(const Scenario& scenario) {
  std::string revisions;
  for (const auto& p : scenario.phases) {
    CKPTSIM_CHECK(p.profile != nullptr, "a phase without a resolved revision: " + p.revision);
    revisions += (revisions.empty() ? "" : ",") + p.profile->name;
  }
  return fmt::format("seed={} revision={} scenario={}", scenario.seed, revisions, scenario.name);
}

// --checkpoint-format torch_dist: phase i's save (in the simulator's own format) exported to
// <checkpoint_dir>/<prefix>/ as Megatron's torch_dist.
Status export_phase(const RunOptions& options, const model::Storage& saved,
                    model::Storage& export_root, const std::string& prefix, size_t i) {
  if (Status cleared = export_root.remove_all(prefix); !cleared.is_ok()) return cleared;
  auto target = model::subdir(export_root, prefix);
  model::TorchDistExportOptions export_options = options.torch_dist;
  if (export_options.checkpoint_root.empty()) {
    export_options.checkpoint_root = options.checkpoint_dir + "/" + prefix;
  }
  auto exported = model::export_torch_dist_checkpoint(saved, *target, "", export_options);
  if (!exported.is_ok()) {
    return Status::io_error(fmt::format("{}/{}: torch_dist export of phase {} failed: {}",
                                        options.checkpoint_dir, prefix, i,
                                        exported.status().to_string()));
  }
  return Status::ok();
}

}  // namespace

namespace {

// The trace lines that open phase `i`: a reshard, the phase, and its format where it is not the
// default (so that the traces of dp_reshardable runs stay as they were).
void trace_phase_start(const Scenario& scenario, size_t i, std::vector<std::string>& trace) {
  const PhaseSpec& spec = scenario.phases[i];
  if (i > 0 && scenario.phases[i - 1].dp != spec.dp) {
    trace.push_back(fmt::format("reshard dp {}->{}", scenario.phases[i - 1].dp, spec.dp));
  }
  if (i > 0 && (scenario.phases[i - 1].tp != spec.tp || scenario.phases[i - 1].pp != spec.pp)) {
    trace.push_back(fmt::format("reshard tp {}->{} pp {}->{}", scenario.phases[i - 1].tp, spec.tp,
                                scenario.phases[i - 1].pp, spec.pp));
  }
  trace.push_back(fmt::format("phase={} dp={} revision={} steps={}", i, spec.dp, spec.profile->name,
                              spec.steps));
  if (const model::CheckpointFormat f = scenario.format_of(i); !(f == model::CheckpointFormat{})) {
    trace.push_back(fmt::format("phase={} saves {}{}", i,
                                model::sharding_type_name(f.sharding_type),
                                f.mem_efficient ? " mem_efficient" : ""));
  }
}

}  // namespace

Result<RunResult> run_scenario(const Scenario& scenario, const RunOptions& options) {
  RunResult result;
  result.scenario = scenario;
  result.trace.push_back(seed_line(scenario));
  std::string why_not;
  const bool have_gpu = model::real_cuda_available(&why_not);
  if (options.device == DeviceChoice::kCuda && !have_gpu) {
    return Status::invalid_input("--device cuda: no GPU can hold the state here (" + why_not + ")");
  }
  result.gpu_resident =
      options.device == DeviceChoice::kCuda || (options.device == DeviceChoice::kAuto && have_gpu);
  result.trace.push_back(options_line(scenario));
  std::unique_ptr<model::Storage> root;
  std::unique_ptr<model::Storage> export_root;  // set with --checkpoint-format torch_dist
  if (Status st = open_roots(options, result, root, export_root); !st.is_ok()) return st;
  const bool export_torch_dist = export_root != nullptr;

  const std::vector<at::Tensor> init = initial_params(scenario);
  run_reference(scenario, options, init, result);

  // One checkpoint directory for every phase, as a job's --save and --load: iter_NNNNNNN/ and
  // the tracker. The search's checkpoints stay in memory (root), so clearing it is cheap.
  if (Status cleared = clear_checkpoints(*root); !cleared.is_ok()) return cleared;
  CheckpointHistory history;
  model::CheckpointCaches caches;  // this run's alone (`check --jobs N` runs cases side by side)
  for (size_t i = 0; i < scenario.phases.size(); ++i) {
    const PhaseSpec& spec = scenario.phases[i];
    PhaseRecord rec;
    rec.index = i;
    rec.spec = spec;
    if (i > 0 && !resumes_after(result.phases.back())) {
      result.trace.push_back(fmt::format("phase={} not run: phase {} did not complete", i, i - 1));
      result.phases.push_back(std::move(rec));
      continue;
    }
    trace_phase_start(scenario, i, result.trace);
    std::vector<model::StorageFault> faults;
    for (const auto& f : spec.storage_faults) faults.push_back(f.fault(spec.world()));
    model::FaultyStorage save_root(*root, std::move(faults), kPageBytes);
    PhaseJob job =
        phase_job(scenario, options, init, spec, static_cast<int64_t>(i), result.gpu_resident);
    job.load_root = i > 0 ? root.get() : nullptr;
    if (i > 0) job.loaded_origin = result.phases[i - 1].iteration_origin;
    job.save_root = spec.saves() ? &save_root : nullptr;
    job.format = scenario.format_of(i);
    job.caches = &caches;
    history.before_phase(rec);
    run_phase(scenario, options, job, *root, result, rec);
    history.after_phase(save_root, *root, &caches, rec, result.trace);
    const std::string saved_dir = model::iteration_dir_name(rec.save_iteration);
    const bool exported = export_torch_dist && rec.save_iteration >= 0 &&
                          rec.storage_faults_fired.empty() &&
                          root->exists(saved_dir + "/metadata.json");
    result.phases.push_back(std::move(rec));
    if (exported) {
      const auto saved = model::subdir(*root, saved_dir);
      if (Status st = export_phase(options, *saved, *export_root, fmt::format("phase_{}", i), i);
          !st.is_ok())
        return st;
    }
  }
  uint64_t h = fnv1a(nullptr, 0);
  for (const auto& line : result.trace) h = fnv1a(line.data(), line.size(), h);
  result.trace_hash = h;
  result.trace.push_back(fmt::format("trace_hash={:016x}", h));
  return result;
}

std::string saved_directory(const RunResult& run, size_t i) {
  if (i >= run.phases.size() || run.phases[i].save_iteration < 0) return "";
  return model::iteration_dir_name(run.phases[i].save_iteration);
}

PhaseRecord resume_from_checkpoint(const Scenario& scenario, const PhaseSpec& phase,
                                   const model::Storage& checkpoint, const RunOptions& options) {
  CKPTSIM_CHECK(phase.profile != nullptr,
                "a resume without a resolved revision: " + phase.revision);
  std::string why_not;
  const bool have_gpu =
      options.device != DeviceChoice::kCpu && model::real_cuda_available(&why_not);
  PhaseRecord rec;
  rec.index = 1;
  rec.spec = phase;
  rec.spec.save = false;
  const std::vector<at::Tensor> init = initial_params(scenario);
  PhaseJob job = phase_job(scenario, options, init, phase, /*phase_id=*/1,
                           have_gpu && options.device != DeviceChoice::kCpu);
  (options.load_latest ? job.load_root : job.load_from) = &checkpoint;
  job.load_as_script = options.load_as_script;
  model::CheckpointCaches caches;
  job.caches = &caches;
  RunResult unused;
  run_phase(scenario, options, job, checkpoint, unused, rec);
  return rec;
}

}  // namespace ckptsim::sim
