#include "model/megatron/checkpointing.h"

#include <fmt/format.h>

#include <charconv>

#include "model/errors.h"
#include "model/faults.h"
#include "model/megatron/torch_dist_checkpoint.h"

namespace ckptsim::model {

Value generate_state_dict(DistributedDataParallel& ddp, ChainedOptimizer* opt,
                          const OptimizerParamScheduler* scheduler, int64_t iteration,
                          bool is_loading, const std::optional<CheckpointFormat>& format,
                          Runtime& rt) {
  auto sd = Dict::make({{"checkpoint_version", Value(3.0)}, {"iteration", Value(iteration)}});
  const Value model_sd = ddp.sharded_state_dict();
  sd->set("model", model_sd);
  if (opt != nullptr) sd->set("optimizer", opt->sharded_state_dict(model_sd, is_loading, format));
  if (scheduler != nullptr) sd->set("opt_param_scheduler", scheduler->state_dict());
  // state_dict['args'] (a Namespace upstream): the sizes load_checkpoint() compares. Saved only
  // where they are not (1, 1): a checkpoint without them reads as (1, 1) upstream too.
  const ModelParallelRank& mp = ddp.mp();
  if (!is_loading && (mp.tp_size != 1 || mp.pp_size != 1)) {
    sd->set("args", dict_value({{"tensor_model_parallel_size", Value(mp.tp_size)},
                                {"pipeline_model_parallel_size", Value(mp.pp_size)}}));
  }
  // Fault site save.rank_dependent_common: a common leaf that differs per rank.
  if (!is_loading && rt.fault(fault::kRankDependentCommon)) {
    sd->set("ckptsim_rank", Value(rt.rank()));
  }
  return Value(sd);
}

Value content_metadata(const CheckpointFormat& format) {
  auto md = Dict::make(
      {{"distrib_optim_sharding_type", Value(sharding_type_name(format.sharding_type))}});
  if (format.sharding_type == ShardingType::kFullyReshardable)
    md->set("distrib_optim_fully_reshardable_mem_efficient", Value(format.mem_efficient));
  md->set("singleton_local_shards", Value(false));
  md->set("chained_optim_avoid_prefix", Value(true));
  return Value(md);
}

LoadedFormat checkpoint_format(const Value& common_state) {
  const Value* md =
      common_state.is_dict() ? common_state.dict()->find("content_metadata") : nullptr;
  if (md == nullptr || md->is_none()) {
    return {CheckpointFormat{ShardingType::kDpZeroGatherScatter, false, false},
            sharding_type_name(ShardingType::kDpZeroGatherScatter)};
  }
  const Value* type = md->is_dict() ? md->dict()->find("distrib_optim_sharding_type") : nullptr;
  const std::string name = type != nullptr && type->is_str() ? type->as_str() : "";
  LoadedFormat out{std::nullopt, name};
  if (const auto t = parse_sharding_type(name)) {
    const Value* mem = md->dict()->find("distrib_optim_fully_reshardable_mem_efficient");
    const Value* avoid = md->dict()->find("chained_optim_avoid_prefix");
    out.format = CheckpointFormat{*t, mem != nullptr && mem->is_bool() && mem->as_bool(),
                                  avoid != nullptr && avoid->is_bool() && avoid->as_bool()};
  }
  return out;
}

namespace {

// Each group's (max_lr, min_lr) as the current config built it, in group order.
std::vector<std::pair<Value, Value>> lr_bounds(ChainedOptimizer& opt) {
  std::vector<std::pair<Value, Value>> out;
  for (const Value& g : opt.param_groups()) {
    const Dict& group = *g.dict();
    out.emplace_back(group.get("max_lr", Value()), group.get("min_lr", Value()));
  }
  return out;
}

// checkpointing.py load_checkpoint(), the scheduler's part: its load, then (HEAD, and the
// fix) the groups' bounds under --override-opt_param-scheduler.
void load_scheduler(ChainedOptimizer& opt, OptimizerParamScheduler& scheduler, const Dict& loaded,
                    const RevisionSwitches& switches,
                    const std::vector<std::pair<Value, Value>>& runtime_bounds) {
  // args.consumed_train_samples, from the checkpoint's args: the training loop adds the global
  // batch size at every iteration (the model saves no args; the iteration and the batch size
  // give the same count).
  const int64_t consumed_train_samples =
      loaded.at("iteration").as_int() * scheduler.samples_per_iteration();
  const Value* saved = loaded.find("opt_param_scheduler");
  if (saved == nullptr) return;
  scheduler.load_state_dict(*saved);
  if (scheduler.resume() != SchedulerResume::kOverride) return;
  switch (switches.override_lr_bounds) {
    case OverrideLrBounds::kCheckpoint:
      break;
    case OverrideLrBounds::kArguments:
      scheduler.reapply_lr_bounds(consumed_train_samples);
      break;
    case OverrideLrBounds::kRuntimeGroups: {
      List& groups = opt.param_groups();
      CKPTSIM_CHECK(groups.size() == runtime_bounds.size(), "param group count changed at load");
      for (size_t g = 0; g < groups.size(); ++g) {
        groups.at(g).dict()->set("max_lr", runtime_bounds[g].first);
        groups.at(g).dict()->set("min_lr", runtime_bounds[g].second);
      }
      scheduler.step(0);
      break;
    }
  }
}

// load_checkpoint()'s check of the checkpoint's (TP, PP) against the run's: only the model-space
// formats (checkpoint_fully_reshardable_formats) may load at another TP or PP.
void check_tp_pp(const ModelParallelRank& run, const Value& common, const LoadedFormat& format) {
  const Value* args = common.is_dict() ? common.dict()->find("args") : nullptr;
  auto size_of = [&](const char* name) -> int64_t {
    const Value* v = args != nullptr && args->is_dict() ? args->dict()->find(name) : nullptr;
    return v != nullptr && v->is_int() ? v->as_int() : 1;  // "using 1 as default"
  };
  const int64_t tp = size_of("tensor_model_parallel_size");
  const int64_t pp = size_of("pipeline_model_parallel_size");
  if (tp == run.tp_size && pp == run.pp_size) return;
  if (fully_reshardable_format(format.format->sharding_type)) return;
  throw UpstreamError(
      "RuntimeError",
      fmt::format("(TP, PP) mismatch after resume (({}, {}) vs ({}, {}) from checkpoint): not "
                  "supported for DistributedOptimizer with sharding type {}. Please use "
                  "`--ckpt-fully-parallel-save` flag during checkpoint saving.",
                  run.tp_size, run.pp_size, tp, pp, format.sharding_type),
      "checkpointing.py load_checkpoint()");
}

// dist_checkpointing.load(request), then model.load_state_dict() and
// optimizer.load_state_dict(): what load_checkpoint() and a script's load share.
// A request without 'optimizer' (--no-load-optim) loads no optimizer state: the main params
// are reloaded from the model params instead.
Value load_model_and_optimizer(const Value& request, DistributedDataParallel& ddp,
                               ChainedOptimizer& opt, const Storage& storage, ProcessGroup& group,
                               const RevisionSwitches& switches, Runtime& rt, LoadReport* report,
                               CheckpointCaches* caches) {
  LoadOptions options;
  options.caches = caches;
  options.reads_sharded_common_state = switches.common_state_as_sharded_object;
  options.allows_class_globals = switches.common_load_allows_class_globals;
  options.gathers_read_errors = !switches.load_reads_rank_local;
  options.merge.truncate_optimizer_param_state_lists = switches.merge_truncates_param_state_lists;
  options.strip_common_param_state = switches.load_strips_common_param_state;
  options.allow_missing_keys = switches.load_allows_missing_keys;
  options.skip_optimizer_piece = rt.rank() == 0 && rt.fault(fault::kSkipLoadPiece);
  options.skip_damaged_pieces = rt.fault(fault::kSkipDamagedPieces);
  Value loaded = load(request, storage, group, options, report);
  // model.load_state_dict(): the params were read in place; copy for fidelity.
  const Dict& model_sd = *loaded.dict()->at("model").dict();
  for (size_t i = 0; i < ddp.num_params(); ++i)
    py_copy_(ddp.param(i), model_sd.at(ddp.specs()[i].name).tensor());
  if (request.dict()->find("optimizer") != nullptr) {
    opt.load_state_dict(loaded.dict()->at("optimizer"));
  } else {
    opt.reload_model_params();
  }
  return loaded;
}

}  // namespace

int64_t load_distributed_checkpoint(DistributedDataParallel& ddp, ChainedOptimizer& opt,
                                    const Storage& storage, ProcessGroup& group,
                                    const RevisionSwitches& switches, Runtime& rt,
                                    LoadReport* report, CheckpointCaches* caches) {
  const Value common = load_common_state_dict(storage, switches.common_state_as_sharded_object,
                                              switches.common_load_allows_class_globals);
  LoadedFormat format = checkpoint_format(common);
  const Dict* c = common.is_dict() ? common.dict().get() : nullptr;
  if (c != nullptr && c->find("content_metadata") == nullptr) {
    // The script passes the metadata its save had: the optimizer's own record of it.
    const Value* type = saved_param_state_sharding_type(c->find("optimizer"));
    if (type != nullptr && type->is_str()) {
      const auto t = parse_sharding_type(type->as_str());
      format = {
          t ? std::optional<CheckpointFormat>(CheckpointFormat{*t, false, false}) : std::nullopt,
          type->as_str()};
    }
  }
  if (!format.format.has_value()) {
    throw UpstreamError("NotImplementedError", "Unknown sharding_type: " + format.sharding_type,
                        "distrib_optimizer.py sharded_state_dict()");
  }
  const Value model_sd = ddp.sharded_state_dict();
  const Value request = dict_value(
      {{"model", model_sd},
       {"optimizer", opt.sharded_state_dict(model_sd, /*is_loading=*/true, format.format)}});
  const Value loaded =
      load_model_and_optimizer(request, ddp, opt, storage, group, switches, rt, report, caches);
  const Value* it = loaded.dict()->find("iteration");
  return it != nullptr && it->is_int() ? it->as_int() : 0;
}

Resumed load_checkpoint(DistributedDataParallel& ddp, ChainedOptimizer& opt,
                        OptimizerParamScheduler* scheduler, const Storage& storage,
                        ProcessGroup& group, const RevisionSwitches& switches, Runtime& rt,
                        LoadReport* report, const ResumeArgs& args, CheckpointCaches* caches) {
  const Value common = load_common_state_dict(storage, switches.common_state_as_sharded_object,
                                              switches.common_load_allows_class_globals);
  const LoadedFormat format = checkpoint_format(common);
  // gen_sd_optim and gen_sd_opt_param_scheduler are None under --no-load-optim and --finetune;
  // the format's checks belong to the optimizer's load.
  const bool load_optim = args.loads_optimizer();
  if (load_optim && !format.format.has_value()) {
    // The optimizer's dispatch raises for a sharding type it does not know.
    throw UpstreamError("NotImplementedError", "Unknown sharding_type: " + format.sharding_type,
                        "distrib_optimizer.py sharded_state_dict()");
  }
  if (load_optim) check_tp_pp(ddp.mp(), common, format);
  const Value request =
      generate_state_dict(ddp, load_optim ? &opt : nullptr, load_optim ? scheduler : nullptr,
                          /*iteration=*/0, /*is_loading=*/true, format.format, rt);
  const auto runtime_bounds = lr_bounds(opt);
  const Value loaded =
      load_model_and_optimizer(request, ddp, opt, storage, group, switches, rt, report, caches);
  if (scheduler != nullptr && load_optim) {
    load_scheduler(opt, *scheduler, *loaded.dict(), switches, runtime_bounds);
  }
  const int64_t iteration = loaded.dict()->at("iteration").as_int();
  const bool reset = args.finetune && !rt.fault(fault::kFinetuneKeepsIteration);
  return {reset ? 0 : iteration, iteration};
}

SaveReport save_checkpoint(DistributedDataParallel& ddp, ChainedOptimizer& opt,
                           const OptimizerParamScheduler* scheduler, int64_t iteration,
                           Storage& storage, ProcessGroup& group, const RevisionSwitches& switches,
                           const CheckpointFormat& format, Runtime& rt, CheckpointCaches* caches) {
  const Value sd =
      generate_state_dict(ddp, &opt, scheduler, iteration, /*is_loading=*/false, format, rt);
  // dist_checkpointing.save(content_metadata=...) puts it into the common state.
  sd.dict()->set("content_metadata", content_metadata(format));
  SaveOptions options;
  options.common_state_as_sharded_object = switches.common_state_as_sharded_object;
  options.caches = caches;
  return save(sd, storage, group, options);
}

std::optional<int64_t> parse_tracker(const std::vector<char>& bytes) {
  std::string text(bytes.begin(), bytes.end());
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && space(text.back())) text.pop_back();
  while (!text.empty() && space(text.front())) text.erase(0, 1);
  int64_t iteration = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), iteration);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return iteration;
}

namespace {

void throw_if_error(const Status& s, const char* where) {
  if (!s.is_ok())
    throw UpstreamError("OSError", s.to_string(), std::string("checkpointing.py ") + where);
}

void write_tracker(Storage& root, int64_t iteration) {
  const std::string text = std::to_string(iteration);
  const Status s = root.write_file(std::string(kTrackerFile), {text.data(), text.size()});
  if (!s.is_ok()) {
    throw UpstreamError("OSError", s.to_string(), "checkpointing.py save_checkpoint() (tracker)");
  }
}

}  // namespace

std::optional<int64_t> tracker_iteration(const Storage& root) {
  const auto bytes = root.read_file(std::string(kTrackerFile));
  if (!bytes.is_ok()) return std::nullopt;
  return parse_tracker(bytes.value());
}

SaveReport save_checkpoint_to_root(DistributedDataParallel& ddp, ChainedOptimizer& opt,
                                   const OptimizerParamScheduler* scheduler, int64_t iteration,
                                   Storage& root, ProcessGroup& group,
                                   const RevisionSwitches& switches, const CheckpointFormat& format,
                                   Runtime& rt, CheckpointCaches* caches) {
  const bool rank0 = group.rank() == 0;
  if (rank0 && rt.fault(fault::kTrackerBeforeData)) write_tracker(root, iteration);
  const std::string name = iteration_dir_name(iteration);
  // save_replaces_directory_when_whole. Every rank decides before the save's first collective
  // (its broadcast), and rank 0 clears what a crashed save left before any rank writes.
  const bool replace = switches.save_replaces_directory_when_whole && root.exists(name);
  const std::string target = replace ? name + ".saving" : name;
  if (replace && rank0) throw_if_error(root.remove_all(target), "save_checkpoint()");
  const auto dir = subdir(root, target);
  SaveReport report =
      save_checkpoint(ddp, opt, scheduler, iteration, *dir, group, switches, format, rt, caches);
  group.barrier();  // "Wait so everyone is done (necessary)"
  if (replace && rank0) {
    const std::string old = name + ".replaced";
    throw_if_error(root.remove_all(old), "save_checkpoint()");
    throw_if_error(root.rename(name, old), "save_checkpoint()");
    throw_if_error(root.rename(target, name), "save_checkpoint()");
    throw_if_error(root.remove_all(old), "save_checkpoint()");
  }
  if (rank0) write_tracker(root, iteration);
  group.barrier();
  return report;
}

std::optional<Resumed> load_latest_checkpoint(DistributedDataParallel& ddp, ChainedOptimizer& opt,
                                              OptimizerParamScheduler* scheduler,
                                              const Storage& root, ProcessGroup& group,
                                              const RevisionSwitches& switches, Runtime& rt,
                                              LoadReport* report, const ResumeArgs& args,
                                              CheckpointCaches* caches) {
  const std::string tracker(kTrackerFile);
  const auto bytes = root.read_file(tracker);
  if (!bytes.is_ok()) {
    if (bytes.status().code() == Status::Code::kNotFound) return std::nullopt;
    throw UpstreamError("OSError", bytes.status().to_string(), "checkpointing.py read_metadata()");
  }
  const std::optional<int64_t> iteration = parse_tracker(bytes.value());
  if (!iteration.has_value()) {
    throw UpstreamError("SystemExit",
                        "ERROR: Invalid metadata file " + tracker + ". Exiting ('" +
                            std::string(bytes.value().begin(), bytes.value().end()) + "')",
                        "checkpointing.py read_metadata()");
  }
  if (*iteration < 0) {  // assert iteration > -1 or release
    throw UpstreamError("AssertionError", "error parsing metadata file " + tracker,
                        "checkpointing.py read_metadata()");
  }
  const std::string dir = iteration_dir_name(*iteration);
  if (!root.exists(dir)) {
    throw UpstreamError("FileNotFoundError", "[Errno 2] No such file or directory: '" + dir + "'",
                        "checkpointing.py _get_checkpoint_format()");
  }
  const auto storage = subdir(root, dir);
  return load_checkpoint(ddp, opt, scheduler, *storage, group, switches, rt, report, args, caches);
}

void train_step(DistributedDataParallel& ddp, ChainedOptimizer& opt,
                OptimizerParamScheduler& scheduler, int64_t samples_per_iteration, Runtime& rt,
                const std::function<void(size_t, at::Tensor&)>& backward) {
  ddp.zero_grad_buffer();
  for (size_t i = 0; i < ddp.num_params(); ++i) {
    at::Tensor g = ddp.main_grad(i);
    backward(i, g);
  }
  ddp.finish_grad_sync();
  opt.step();
  ddp.start_param_sync();
  // Fault site scheduler.increment_per_iteration: stepped by one iteration, not its samples.
  scheduler.step(rt.fault(fault::kSchedulerPerIteration) ? 1 : samples_per_iteration);
}

}  // namespace ckptsim::model
