// What the property families share: the failure builder, the labels every detail uses, and
// the comparisons of recorded values. Internal to properties/ (the families include it; no
// layer above does).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "properties/properties.h"

namespace ckptsim::properties {

// A passing result of property `name`, with its detail filled in later.
PropertyResult pass(const std::string& name);
// `r` failed at `phase` (-1: the reference run or none) for `signature` (the cause the search
// keeps one minimal case per), as `detail` says.
PropertyResult fail(PropertyResult r, int phase, std::string signature, std::string detail);
// The verdict of a property whose run never reached what it judges; `why` names the phase.
PropertyResult mark_not_evaluated(PropertyResult r, const std::string& why);

// "phase 1 (dp=4, upstream-2874)".
std::string phase_label(const sim::PhaseRecord& p);
std::string param_name(const sim::RunResult& run, size_t p);
// "HDO cpu AdamW on w1[0:416] (rank 0)".
std::string shard_label(const sim::RunResult& run, const sim::ShardRecord& s);
// A number as a detail prints it: "none" for NaN, integers without a fraction.
std::string num(double x);
// The step counter a shard will advance from; none (no step yet) counts as 0, as a fresh Adam
// starts from 0.
double counter_value(const std::optional<double>& c);
// An error message with its numbers blanked and cut short, so that two failures of one cause
// at different sizes share a signature and two causes at one site do not.
std::string message_shape(const std::string& m);
// The first error that is not another rank's failure seen through a collective, else the first.
const sim::RankError* first_primary(const std::vector<sim::RankError>& errors);

bool bitwise_equal(float a, float b);
// One unit in the last place at `x`'s magnitude in `dtype` (bf16: 8 significant bits, fp32: 24).
double ulp_of(double x, model::DType dtype);
// Within kTrajectoryRtol/kTrajectoryAtol, or one bf16 ulp (plus atol) for bf16 values, plus
// `drift` (>= 0): what the steps since the element moved between kernel kinds allow
// (kTrajectoryRtolPerStep; trajectory.cpp adds it up).
bool within_tolerance(float observed, float expected, bool bf16, double drift);

// The four arrays two states are compared on, moments normalized (absent state = zeros).
class ComparedFields {
 public:
  struct Field {
    const char* name;
    const std::vector<std::vector<float>>* a;
    const std::vector<std::vector<float>>* b;
  };
  ComparedFields(const sim::GlobalState& a, const sim::GlobalState& b);
  ComparedFields(const ComparedFields&) = delete;  // fields_ points into this object
  ComparedFields& operator=(const ComparedFields&) = delete;
  const std::array<Field, 4>& fields() const { return fields_; }

 private:
  // The moments with absent state zeroed, where some is absent (else the fields point at the
  // states' own).
  std::vector<std::vector<float>> a_m_, a_v_, b_m_, b_v_;
  std::array<Field, 4> fields_;
};

// The properties, by family (one file each).
PropertyResult no_duplicate_leaves(const sim::RunResult& run);               // resume.cpp
PropertyResult resume_completes(const sim::RunResult& run);                  // resume.cpp
PropertyResult step_matches_uninterrupted(const sim::RunResult& run);        // step.cpp
PropertyResult step_counts_optimizer_steps(const sim::RunResult& run);       // step.cpp
PropertyResult step_tensors_not_aliased(const sim::RunResult& run);          // step.cpp
PropertyResult trajectory_matches_uninterrupted(const sim::RunResult& run);  // trajectory.cpp
PropertyResult round_trip_identity(const sim::RunResult& run);               // trajectory.cpp
PropertyResult shards_tile_buckets(const sim::RunResult& run);               // checkpoint.cpp
PropertyResult common_state_rank_independent(const sim::RunResult& run);     // checkpoint.cpp
PropertyResult reshard_round_trip_bytes(const sim::RunResult& run);          // checkpoint.cpp
PropertyResult load_writes_every_element(const sim::RunResult& run);         // checkpoint.cpp
PropertyResult layout_invariants(const sim::RunResult& run);                 // layout.cpp
PropertyResult hyperparams_follow_schedule(const sim::RunResult& run);       // schedule.cpp
PropertyResult resume_after_crash_is_complete(const sim::RunResult& run);    // crash.cpp
PropertyResult tracker_names_saved_state(const sim::RunResult& run);         // crash.cpp
PropertyResult state_dtypes_survive_resume(const sim::RunResult& run);       // state_dtypes.cpp
PropertyResult first_step_continues_from_loaded_weights(const sim::RunResult& run);  // resume.cpp
PropertyResult iteration_follows_resume_mode(const sim::RunResult& run);             // resume.cpp

// Whether `e` of phase `p` is what a storage fault made: a save that met one, or a load after
// one. resume_after_crash_is_complete judges those; the other properties do not count them.
bool storage_fault_error(const sim::PhaseRecord& p, const sim::RankError& e);  // crash.cpp

}  // namespace ckptsim::properties
