#include "model/megatron/checkpointing.h"

#include "model/faults.h"

namespace ckptsim::model {

Value generate_state_dict(DistributedDataParallel& ddp, DistributedOptimizer& opt,
                          int64_t iteration, bool is_loading, const std::string& sharding_type,
                          Runtime& rt) {
  auto sd = Dict::make({{"checkpoint_version", Value(3.0)}, {"iteration", Value(iteration)}});
  const Value model_sd = ddp.sharded_state_dict();
  sd->set("model", model_sd);
  sd->set("optimizer", opt.sharded_state_dict(model_sd, is_loading, sharding_type));
  // Fault site save.rank_dependent_common: a common leaf that differs per rank.
  if (!is_loading && rt.fault(fault::kRankDependentCommon)) {
    sd->set("ckptsim_rank", Value(rt.rank()));
  }
  return Value(sd);
}

int64_t load_checkpoint(DistributedDataParallel& ddp, DistributedOptimizer& opt,
                        const Storage& storage, ProcessGroup& group,
                        const RevisionSwitches& switches, const std::string& sharding_type,
                        Runtime& rt, LoadReport* report) {
  (void)load_common_state_dict(storage, switches.common_state_as_sharded_object);
  const Value request =
      generate_state_dict(ddp, opt, /*iteration=*/0, /*is_loading=*/true, sharding_type, rt);
  LoadOptions options;
  options.reads_sharded_common_state = switches.common_state_as_sharded_object;
  options.merge.truncate_optimizer_param_state_lists = switches.merge_truncates_param_state_lists;
  options.strip_common_param_state = switches.load_strips_common_param_state;
  options.allow_missing_keys = switches.load_allows_missing_keys;
  options.skip_optimizer_piece = rt.rank() == 0 && rt.fault(fault::kSkipLoadPiece);
  const Value loaded = load(request, storage, group, options, report);
  // model.load_state_dict(): the params were read in place; copy for fidelity.
  const Dict& model_sd = *loaded.dict()->at("model").dict();
  for (size_t i = 0; i < ddp.num_params(); ++i)
    py_copy_(ddp.param(i), model_sd.at(ddp.specs()[i].name).tensor());
  opt.load_state_dict(loaded.dict()->at("optimizer"));
  return loaded.dict()->at("iteration").as_int();
}

SaveReport save_checkpoint(DistributedDataParallel& ddp, DistributedOptimizer& opt,
                           int64_t iteration, Storage& storage, ProcessGroup& group,
                           const RevisionSwitches& switches, const std::string& sharding_type,
                           Runtime& rt) {
  const Value sd =
      generate_state_dict(ddp, opt, iteration, /*is_loading=*/false, sharding_type, rt);
  SaveOptions options;
  options.common_state_as_sharded_object = switches.common_state_as_sharded_object;
  return save(sd, storage, group, options);
}

void train_step(DistributedDataParallel& ddp, DistributedOptimizer& opt, double lr,
                double weight_decay, const std::function<void(size_t, at::Tensor&)>& backward) {
  ddp.zero_grad_buffer();
  for (size_t i = 0; i < ddp.num_params(); ++i) {
    at::Tensor g = ddp.main_grad(i);
    backward(i, g);
  }
  ddp.finish_grad_sync();
  opt.apply_schedule(lr, weight_decay);
  opt.step();
  ddp.start_param_sync();
}

}  // namespace ckptsim::model
