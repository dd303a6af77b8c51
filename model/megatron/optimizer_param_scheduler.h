// OptimizerParamScheduler: the learning-rate and weight-decay schedule of a Megatron run, which
// writes every param group's lr and weight_decay, steps after each optimizer step, and is saved
// and restored with the checkpoint. Mirrors megatron/core/optimizer_param_scheduler.py (POST
// f4502eb1c9; the same at HEAD d98e8a64dd and RX-MILES 2e64d788b) and the scheduler's part of
// megatron/training/checkpointing.py load_checkpoint().
//
// Invariants:
//   1. A group's lr comes from the group's own max_lr and min_lr (get_lr reads
//      param_group.get('max_lr', self.max_lr)); lr_mult is never read. weight_decay is
//      get_wd() times the group's wd_mult.
//   2. num_steps counts samples: the training loop steps it by the global batch size, and the
//      iteration counts of the config are multiplied by it (get_optimizer_param_scheduler).
//   3. load_state_dict() takes each saved value through _check_and_set (override: the
//      config's; use-checkpoint: the checkpoint's; neither: they must be equal, else
//      AssertionError), then step(saved num_steps) from the num_steps it had (0 after
//      construction) — before the weight decay's values are restored, unless the revision
//      has the fix (scheduler_restores_wd_before_step).
//   4. Every upstream assertion raises PyAssertionError at the same point.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/megatron/chained_optimizer.h"
#include "model/py/value.h"
#include "model/revision.h"

namespace ckptsim::model {

class OptimizerParamScheduler {
 public:
  // Mirrors __init__, which ends with step(0): the groups get the schedule's first values.
  // `samples_per_iteration`: the global batch size. REQUIRES: >= 1.
  // `switches`: scheduler_restores_wd_before_step (read by load_state_dict).
  OptimizerParamScheduler(ChainedOptimizer& optimizer, const ScheduleConfig& config,
                          int64_t samples_per_iteration, SchedulerResume resume,
                          const RevisionSwitches& switches);

  // Mirrors step(increment): num_steps += increment, then every group's lr and weight_decay.
  void step(int64_t increment);
  // Mirrors state_dict(): max_lr, lr_warmup_steps, num_steps, lr_decay_style, lr_decay_steps,
  // min_lr, start_wd, end_wd, wd_incr_style, wd_incr_steps.
  Value state_dict() const;
  // Mirrors load_state_dict() (invariant 3). A missing key is the KeyError upstream raises.
  void load_state_dict(const Value& state_dict);
  // HEAD checkpointing.py load_checkpoint() under --override-opt_param-scheduler, after the
  // scheduler's load (d98e8a64dd:3017-3041): every group's max_lr and min_lr := the arguments'
  // lr and min_lr (not times lr_mult: a group's own bounds are lost, Megatron-LM issue #7173),
  // num_steps := `consumed_train_samples` where they differ (they differ only when the
  // scheduler was not stepped by the global batch size: the fault site
  // scheduler.increment_per_iteration), then step(0).
  void reapply_lr_bounds(int64_t consumed_train_samples);

  int64_t num_steps() const { return num_steps_; }
  int64_t samples_per_iteration() const { return samples_per_iteration_; }
  SchedulerResume resume() const { return resume_; }
  double get_lr(const Dict& param_group) const;
  double get_wd(const Dict& param_group) const;

 private:
  // _check_and_set: which of the config's value and the checkpoint's the scheduler keeps.
  Value check_and_set(const Value& cls_value, const Value& sd_value, const char* name) const;

  // The load's weight-decay part (after the step upstream, before it with the fix).
  void load_wd(const Dict& sd);

  ChainedOptimizer& optimizer_;
  SchedulerResume resume_;
  bool restores_wd_before_step_;
  double init_lr_;
  double max_lr_;
  double min_lr_;
  int64_t lr_warmup_steps_;
  int64_t lr_decay_steps_;
  std::string lr_decay_style_;
  double start_wd_;
  double end_wd_;
  int64_t wd_incr_steps_;
  std::string wd_incr_style_;
  int64_t samples_per_iteration_;
  int64_t num_steps_ = 0;
};

}  // namespace ckptsim::model
