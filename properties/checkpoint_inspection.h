// What `ckptsim inspect` judges about a real Megatron torch_dist checkpoint: the static checks
// on its files, and each revision's resume from it as the model simulates it
// (sim::resume_from_checkpoint).
//
// Static checks (each holds, fails, or is not applicable), each the checkpoint check of a
// registered property (properties/properties.h; the property in brackets):
//   shards_tile_buckets      [shards_tile_buckets] every dp_reshardable bucket state's chunks
//   (`.metadata`) tile
//                            [0, numel_unpadded) exactly once, and numel_unpadded is what
//                            per_bucket_numel_unpadded says (Megatron-LM #5898's class)
//   step_counters_agree      [step_counts_optimizer_steps] every param group holds one step; the
//   per-param steps the
//                            checkpoint holds (a raw 'step' in the common state) equal it; and
//                            it equals the iteration (fewer optimizer steps than iterations,
//                            with no grad scaler to skip any, means the counter restarted)
//   common_state_not_wrapped [no_duplicate_leaves] nothing in the common state is also in the load
//   request of a
//                            revision as a LocalNonpersistentObject: a raw 'step' in
//                            optimizer.param_state merges into a duplicate leaf there (#2874)
//   common_state_rank_independent   [common_state_rank_independent] the common state holds no
//   per-rank state: only rank 0's
//                            copy is saved, and every rank of a resume gets it (per-param
//                            optimizer state, or tensors of more than one element)
//
// Invariants: each check's detail names the key (path) and the figures it compared; a check
// never throws on a malformed value (it fails with what it found).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/megatron/torch_dist_checkpoint.h"
#include "model/revision.h"
#include "model/torch/distributed_checkpoint.h"
#include "sim/record.h"
#include "sim/scenario.h"

namespace ckptsim::properties {

enum class CheckOutcome { kHolds, kFails, kNotApplicable };
std::string check_outcome_name(CheckOutcome o);  // "holds", "FAILS", "n/a"

struct CheckpointCheck {
  std::string name;      // the check's own ("step_counters_agree")
  std::string property;  // the registry's property it judges ("step_counts_optimizer_steps")
  CheckOutcome outcome = CheckOutcome::kHolds;
  std::string detail;              // one line
  std::vector<std::string> lines;  // the evidence, one line each (at most a few)
};

// The step counter the checkpoint's param groups hold (nullopt: none, or they disagree).
std::optional<double> saved_group_step(const model::TorchDistCheckpoint& c);

// shards_tile_buckets from the metadata alone (so it can judge a checkpoint whose chunks do
// not tile, which the reader refuses); `checkpoint` (null when unreadable) adds the
// per_bucket_numel_unpadded comparison.
CheckpointCheck check_shards_tile_buckets(const model::DcpMetadata& metadata,
                                          const model::TorchDistCheckpoint* checkpoint);

// What a property's checkpoint check (Property::checkpoint_check) reads.
struct CheckpointInput {
  const model::DcpMetadata& metadata;
  const model::TorchDistCheckpoint* checkpoint;  // null where its files could not be read
  // The profiles whose load requests are compared with the common state
  // (common_state_not_wrapped names those that would fail).
  const std::vector<std::pair<std::string, model::RevisionSwitches>>& revisions;
};

// The registry's checkpoint checks (one per property that has one), each n/a without a readable
// checkpoint except shards_tile_buckets, which reads the metadata alone.
CheckpointCheck check_shards_tile_buckets_of(const CheckpointInput& in);
CheckpointCheck check_step_counters_agree(const CheckpointInput& in);
CheckpointCheck check_common_state_not_wrapped(const CheckpointInput& in);
CheckpointCheck check_common_state_rank_independent(const CheckpointInput& in);

// Every property's checkpoint check, in registry order (`property` set on each).
std::vector<CheckpointCheck> check_checkpoint(const CheckpointInput& in);

// One revision's resume from the checkpoint, as the model ran it.
struct ResumeJudgement {
  std::string revision;
  int64_t dp = 1;
  bool loaded = false;
  std::optional<sim::RankError> error;  // the first non-secondary error
  std::vector<sim::RankError> errors;   // every rank's own (non-secondary) error
  std::vector<std::string> resumed_at;  // "HDO cpu AdamW: 1 (w0[0:48], ...)" per part
  std::map<std::string, std::set<double>> counters_after_load;  // part -> its step counters
  std::vector<std::string> steps_used;  // "step 7: HDO cpu AdamW t=2" per further step
  int64_t expected_first_t = 0;         // the saved counter + 1
  bool bias_correction_right = false;   // every part used saved + k at the k-th step
  // The first further step where a part's t is not saved + k: "step 7: HDO cpu AdamW t=2
  // where t=4 is right"; empty when none is.
  std::string first_wrong_step;
  int64_t elements_compared = 0;       // master, exp_avg, exp_avg_sq after the load
  int64_t elements_equal = 0;          //   that equal the checkpoint's, bit for bit
  std::vector<std::string> uncovered;  // what the load left unwritten
  bool correct() const {
    return loaded && bias_correction_right && elements_equal == elements_compared &&
           uncovered.empty();
  }
};

// What a resume did, as both a real trace and the model's judgement give it: each rank's own
// error ("rank <r> <type> <file function> <key path>") and each Adam part's step counters after
// the load. Sites compare by file and function (a real trace's also has the path).
struct ResumeOutcome {
  std::set<std::string> errors;
  std::map<std::string, std::set<double>> after_load;
  bool operator==(const ResumeOutcome&) const = default;
  std::string text() const;  // "completed; HDO cpu AdamW 1" or "rank 0 ValueError ...; ..."
};
ResumeOutcome resume_outcome(const ResumeJudgement& j);
// From one run of a real trace (replay/PLAN_AND_TRACE.md): its non-secondary error events and its
// after_load parts.
ResumeOutcome resume_outcome(const nlohmann::json& run);

// `saved_step`: what the checkpoint's counter says (saved_group_step, else the iteration).
ResumeJudgement judge_resume(const sim::PhaseRecord& rec, const sim::Scenario& scenario,
                             const model::TorchDistCheckpoint& c, double saved_step);

}  // namespace ckptsim::properties
