// Scenario: what one simulated run does — the model, the optimizer, and the phases, each of
// which (after the first) resumes from the checkpoint the previous phase saved at its end.
//
// Scenario files are a user interface: bug reports are written in them. The JSON fields
// (required ones marked *):
//   * seed                  integer >= 0; draws gradients, initial params, garbage, randn
//     name, description     strings (free text, shown in reports)
//   * params                [{name*, numel*, dtype* ("bf16"|"fp32"), wd_mult, lr_mult}]
//   * optimizer             {kind* ("fused_adam"|"torch_adamw"|"hybrid"), lr*, betas*, eps*,
//                            weight_decay*, offload_fraction (hybrid: required),
//                            overlap_cpu_optimizer_d2h_h2d (hybrid; default false)}
//     bucket_size           null (one bucket, the default) or integer >= 1
//     pad_buckets_for_high_nccl_busbw   bool, default false
//     sharding_type         "dp_reshardable" (the only modeled format; the default)
//     samples_per_step      global batch size, integer in [1, kSamplesPerStepMax], default 8
//   * phases                [{dp*, revision*, steps*, save (default true)}]
//     faults                [fault site names] — deliberately broken model variants, for
//                            testing the checkers (see model/faults.h)
//     expect                {"ok": bool, "properties": {name: bool}, "detail_contains":
//                            {name: text}} — the verdicts a bundled scenario must give
//
// Invariants:
//   1. Unknown fields are errors (a typo in a bug report must not be silently ignored).
//   2. Every error is a Status naming the file and the field path ("phases[1].dp") with the
//      expected and the observed value.
//   3. Every count has a `_max`; exceeding it is an error, never a slow run.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "model/megatron/distrib_optimizer.h"
#include "model/megatron/distributed_data_parallel.h"
#include "model/revision.h"
#include "model/status.h"

namespace ckptsim::sim {

struct PhaseSpec {
  int64_t dp = 1;
  std::string revision;
  int64_t steps = 0;
  bool save = true;
};

struct Scenario {
  static constexpr size_t kParamsMax = 256;
  static constexpr int64_t kNumelMax = 1 << 20;
  static constexpr int64_t kTotalNumelMax = 1 << 22;
  static constexpr size_t kPhasesMax = 64;
  static constexpr int64_t kDpMax = 512;
  static constexpr int64_t kStepsMax = 10000;
  static constexpr int64_t kSamplesPerStepMax = 4096;
  // Bound on total numel x total steps, so the recorded per-step states stay small.
  static constexpr int64_t kStateElementsMax = int64_t{1} << 24;

  std::string name;
  std::string description;
  std::string source;  // the file it came from
  uint64_t seed = 0;
  std::vector<model::ParamSpec> params;
  model::OptimizerConfig optimizer;
  std::optional<int64_t> bucket_size;
  bool pad_buckets_for_high_nccl_busbw = false;
  std::string sharding_type = "dp_reshardable";
  int64_t samples_per_step = 8;
  std::vector<PhaseSpec> phases;
  std::vector<std::string> faults;
  nlohmann::json expect;  // null when absent

  int64_t total_steps() const;
  int64_t total_numel() const;
};

// Parses and validates. `registry` resolves phase revisions (a name or a profile path).
Result<Scenario> parse_scenario(const std::string& json_text, const std::string& source,
                                model::RevisionRegistry& registry);
Result<Scenario> load_scenario_file(const std::string& path, model::RevisionRegistry& registry);

// The scenario as JSON in the file format (parse_scenario(to_json(s)) == s).
nlohmann::json scenario_to_json(const Scenario& s);

}  // namespace ckptsim::sim
