// The evidence of the step family: every resumed shard's step counter and bias-correction
// step next to the uninterrupted run's. step_matches_uninterrupted judges these rows, and the
// reports print them (report/run_report.h), so the comparison is made in one place.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "sim/record.h"

namespace ckptsim::properties {

struct StepComparison {
  enum class Moment {
    kAfterLoad,  // right after the load: the counter the next update advances from
    kTraining,   // after a step: the t the kernel used in it
  };
  size_t phase = 0;
  int64_t global_step = 0;
  Moment moment = Moment::kAfterLoad;
  sim::ShardRecord shard;          // the resumed run's shard
  std::optional<double> observed;  // its counter (after the load) or t used (training)
  // The uninterrupted run's value for the shard holding the same first element: none when
  // that shard has none, or when the uninterrupted run has no state at this step.
  std::optional<double> expected;
  bool reference_known = false;  // the uninterrupted run reached this global step
};

// One phase's comparisons, after the load then after each step, in shard order. Empty unless
// the phase resumed (ran, index > 0, and its load completed).
std::vector<StepComparison> step_comparisons(const sim::RunResult& run,
                                             const sim::PhaseRecord& phase);

}  // namespace ckptsim::properties
