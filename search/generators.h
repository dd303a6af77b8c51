// RapidCheck generators over the scenario space: what breaks real checkpoint code, not the
// easy middle. Each generator mixes realistic values with edge cases (weightedOneOf) and
// shrinks toward fewer params, smaller sizes, fewer phases, smaller DP and fewer steps.
//
// What a generated scenario covers (issue: property-based search):
//   params     1..max_params; numel tiny (1..64), at multiples of 64 and 128 (and ±1), medium,
//              large; bf16 and fp32 (both in one param group too); wd_mult 1, 0 or 0.5 and
//              lr_mult 1, 0.5 or 2 (several groups, with their own lr bounds; a group can be
//              empty on a rank)
//   schedule   constant lr and weight decay mostly; else warmup, then linear, cosine or
//              inverse-square-root decay, and a weight decay that rises (Megatron's
//              OptimizerParamScheduler, stepped after each optimizer step)
//   layout     one bucket or many (bucket_size from 64 up to the total), with and without the
//              65536 padding option
//   optimizer  FusedAdam, torch AdamW, hybrid with offload 0, 1 and between (and the
//              one-AdamW-per-param variant)
//   format     the checkpoint's sharding type: dp_reshardable mostly, fully_reshardable (also
//              mem_efficient), dp_zero_gather_scatter; a resume may save in another one
//   phases     1..max_phases; DP sizes that do not divide each other (3 -> 5, 16 -> 24), DP 1,
//              DP large enough that a rank owns only padding; steps 0, 1, a few (up to
//              steps_max) or, rarely, long (near 2^8, near 2^11, up to long_steps_max; 0 after a
//              resume = a back-to-back save); revisions drawn per phase from the config (old
//              checkpoint, new code when several are given); a resume now and then restarts
//              the job with another lr or weight decay, under --override-opt_param-scheduler or
//              --use-checkpoint-opt_param-scheduler (not in the stateful generator)
//
// The campaign profile (GeneratorConfig::campaign, `ckptsim generate --campaign`) draws for a
// replay on the real code instead, where the search's draws put their weight elsewhere: every
// DP size in [1, dp_max] (8 on one GPU), a resume's DP by its reshard class (same DP, dividing
// or not dividing the previous one: kCampaignReshardWeights), so that a third of the resumes
// or more reshard to a DP that neither divides nor is divided by the last and DP 1 throughout
// is rare; two or more phases mostly; new --lr, --min-lr or weight decay at one resume in four,
// under either scheduler flag; the hybrid's offload strictly between 0 and 1 in three of five,
// fp32 params in one of three; and in one scenario of kCampaignLongPhaseOneIn, one phase of
// about 2^8 steps (kLongBand8; none with long_steps_max 0). Its draws of DP, reshard class,
// arguments and long phase ignore the case's size, so a few cases cover what many do. Its
// layouts fit every phase's DP (each rank's shard of each bucket holds a param element, where
// upstream asserts 'empty bucket encountered' otherwise) unless buckets are padded to 65536:
// the param closing a bucket takes the nearest numel that fits, up to kCampaignFitNumelMax.
// With --tp-max or --pp-max the campaign keeps every phase's world (TP x PP x DP) within
// --dp-max ranks (one GPU runs them all), and refits after the TP/PP draw: while a (TP, PP)
// rank's bucket leaves a DP rank's shard empty, that buffer's params double their rows (up to
// kCampaignFitNumelMax elements).
//
// Invariants:
//   1. Every generated scenario passes sim::parse_scenario's validation (a test checks that
//      scenario_to_json round-trips through it), so a found case replays with `ckptsim run`.
//   2. Generation is a pure function of (rc::Random, size): the same seed gives the same case.
#pragma once

#include <rapidcheck.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "sim/scenario.h"

namespace ckptsim::search {

struct GeneratorConfig {
  // The ranges a user may set (check/gate --params-max, --phases-max, --dp-max).
  static constexpr int kParamsMaxLimit = 64;
  static constexpr int kPhasesMaxLimit = 16;
  static constexpr int64_t kStepsMaxLimit = 256;
  static constexpr int64_t kLongStepsMaxLimit = 10000;  // sim::Scenario::kStepsMax

  // Phase revisions are drawn from these (one entry: every phase uses it), resolved once by
  // the caller (sim::resolve_revision). REQUIRES: at least one.
  std::vector<sim::Revision> revisions;
  // With two or more revisions: at least one phase differs from the previous phase's revision
  // (a checkpoint saved by one revision, resumed by another).
  bool require_revision_change = false;
  std::vector<model::OptimizerKind> kinds = {model::OptimizerKind::kFusedAdam,
                                             model::OptimizerKind::kTorchAdamW,
                                             model::OptimizerKind::kHybrid};
  // Whether TE is installed, for hybrid cases: drawn from these (installed 4 : absent 1 when
  // both; shrinks toward installed). REQUIRES: at least one.
  std::vector<bool> te_installed = {true, false};
  // The sharding types drawn (--sharding-type; empty: dp_reshardable 6 : fully_reshardable 3 :
  // dp_zero_gather_scatter 1); fully_reshardable is mem_efficient in one of three.
  std::vector<model::ShardingType> sharding_types;
  std::vector<std::string> faults;  // copied into every scenario (mutation controls)
  // The precision-aware optimizer's state dtypes (--state-dtype; issue 26). Empty: none drawn,
  // and the draws are those of a generator without them. Otherwise every fused_adam case is
  // precision-aware in three of four and every hybrid case takes the dtypes too (which its HDO
  // ignores, as upstream's does): exp_avg_dtype and exp_avg_sq_dtype each drawn from these and
  // fp32, store_param_remainders off in one of five. Drawn last; shrinks toward fp32 states, no
  // precision-aware optimizer and remainders on (upstream's default).
  std::vector<model::StateDType> state_dtypes;
  int params_max = 6;
  int phases_max = 4;
  int64_t dp_max = 32;
  // TP and PP sizes drawn in {1, 2, 4} up to these (--tp-max, --pp-max; 1: none, and the draws
  // are those of a generator without them). With either above 1 every param gets a 2-D shape
  // (dims multiples of 4), a TP split and a layer, and a world of TP x PP x DP ranks keeps DP at
  // most kModelParallelWorldMax / (TP x PP).
  int64_t tp_max = 1;
  int64_t pp_max = 1;
  // MoE expert params (--ep-max; issue 26; 1: none, and the draws are those of a generator
  // without them). Above 1, a case of two params or more at TP = PP = 1 is an MoE model in one
  // of two: the first param stays dense, each other one is an expert param with odds 1 in 2
  // (one at least), its numel a multiple of the EP size; the EP size, the same in every phase,
  // is drawn from 1, 2, 4 up to ep_max where it divides every phase's DP (EP 1: the expert
  // part on the expert-DP group of every rank). Drawn last; shrinks toward a dense model and
  // EP 1. The campaign then refits the expert buffers' buckets at the expert-DP sizes.
  int64_t ep_max = 1;
  // Steps of a phase: 0, 1 or up to steps_max (--steps-max) mostly; one phase in about
  // 1 + 70 / kLongPhaseWeight is long (--long-steps-max; 0: none): next to 2^8 (kLongBand8)
  // most often, next to 2^11 (kLongBand11) less, anything up to long_steps_max now and then.
  // The library draws no long phases unless asked (the tests' searches stay short); the CLI's
  // check and gate draw them by default (app::SearchCommand::long_steps_max, 4096).
  int64_t steps_max = 6;
  int64_t long_steps_max = 0;
  // Draw storage faults (`check --fault-space storage`; issue 25): every scenario has two
  // phases or more and one storage fault in the save of a phase that another resumes after
  // (sim::StorageFaultSpec: crash_before, crash_after, torn, short or disk_full, at the nth
  // write of a shard, object, metadata.json, the tracker or any file; nth 0 mostly), and now
  // and then a second one in another phase. No resume changes its lr or weight decay, since a
  // resume after a crash starts at an earlier iteration than the phase boundary. Shrinks toward
  // nth 0 and fewer faults.
  bool storage_faults = false;
  // Draw the phases as a RapidCheck stateful command sequence (gen_scenario_stateful).
  bool stateful = false;
  // Draw from the campaign profile (above) instead of the search's. REQUIRES: !stateful.
  bool campaign = false;

  // The limits above, each error naming the flag that sets it ("--dp-max must be in [1, 4096],
  // got 0"); unknown fault sites too.
  Status validate() const;
};

inline constexpr int64_t kModelParallelMax = 4;
inline constexpr int64_t kModelParallelWorldMax = 64;

// Long phases: the bands next to the step counts where a narrow counter goes wrong (bf16
// counts integers exactly up to 2^8, fp16 up to 2^11), and how often one is drawn (out of 70
// for the short choices).
inline constexpr std::pair<int64_t, int64_t> kLongBand8 = {250, 270};
inline constexpr std::pair<int64_t, int64_t> kLongBand11 = {2040, 2060};
inline constexpr uint32_t kLongPhaseWeight = 1;

// The campaign profile: the relative weights of a resume's reshard classes (same DP, dividing,
// not dividing), one scenario in kCampaignLongPhaseOneIn with a long phase, and the limits
// `generate --campaign` takes unless --dp-max and --params-max say otherwise (a real replay
// runs DP > 1 on gloo on one GPU; small params keep it fast).
inline constexpr std::tuple<uint32_t, uint32_t, uint32_t> kCampaignReshardWeights = {2, 3, 5};
inline constexpr uint32_t kCampaignLongPhaseOneIn = 14;
inline constexpr int64_t kCampaignDpMax = 8;
inline constexpr int kCampaignParamsMax = 3;
// The largest numel the campaign's layout fit gives a param (generators.cpp fit_layout).
inline constexpr int64_t kCampaignFitNumelMax = 8192;

// The search's profile, or the campaign's with config.campaign.
rc::Gen<sim::Scenario> gen_scenario(const GeneratorConfig& config);

// With the 65536 padding option a bucket is padded to a multiple of lcm(dp, 128, 65536)
// elements, and every simulated rank holds whole buckets: at DP 31 that is 2M elements a
// bucket on each of 31 ranks, one case costing as much as a hundred others. A padded bucket
// at a large DP is only larger, not different (at DP 3 already every rank owns mostly
// padding, and non-powers of two already change the lcm), so padded cases draw DP up to
// kPaddedDpMax; unpadded ones up to config.dp_max.
inline constexpr int64_t kPaddedDpMax = 8;
int64_t phase_dp_max(const GeneratorConfig& config, const sim::Scenario& s);

// The save/resume cycles as a stateful command sequence, so that RapidCheck shrinks the
// sequence itself (drops commands, then shrinks their arguments). Commands:
//   Train(k)                  k more steps in the current phase;
//   SaveResume(dp, revision)  save, then resume in a new job at `dp` with `revision`
//                             (precondition: fewer than phases_max phases so far).
// CycleModel is the model of the expected state: the phase in progress and the global step
// each phase must resume at; `expected_start_steps` replays a scenario's commands through it.
struct CycleModel {
  int64_t dp = 1;
  sim::Revision revision;
  int64_t steps_in_phase = 0;
  int64_t total_steps = 0;
  std::vector<int64_t> start_steps = {0};  // global step each phase starts at
  // From the generator config.
  std::vector<sim::Revision> revisions;
  int phases_max = 4;
  int64_t dp_max = 32;
  int64_t steps_max = 6;
  int64_t long_steps_max = 0;
};
rc::Gen<sim::Scenario> gen_scenario_stateful(const GeneratorConfig& config);
// What the model predicts each phase of `s` resumes at (the sum of the earlier phases' steps).
std::vector<int64_t> expected_start_steps(const sim::Scenario& s);

// gen_scenario or gen_scenario_stateful, as the config says.
rc::Gen<sim::Scenario> gen_for(const GeneratorConfig& config);

}  // namespace ckptsim::search
