// What the simulator records of a run: per rank, the state it captured at each point (a
// RankState); over all ranks, the whole model's state at each global step (a GlobalState); per
// phase, its outcome (a PhaseRecord); and the run with its reference run (a RunResult). The
// checkers of properties/ read only these records, never the model.
//
// Invariants (checked when a state is gathered, not assumed):
//   1. Every element of every param is held by at most one rank's shard.
//   2. A GlobalState's arrays are full length per param; NaN marks an element no rank
//      reported (a state tensor of the wrong size, an upstream mix-up such as B8).
//   3. Hashes are FNV-1a over the exact bits, so two runs hash equal iff they recorded the same
//      values (the trace hash of a rerun is compared by a test).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/errors.h"
#include "model/megatron/distributed_data_parallel.h"
#include "model/megatron/optimizer_key.h"
#include "model/megatron/serialization.h"
#include "sim/probe.h"
#include "sim/scenario.h"

namespace ckptsim::sim {

// One param group's hyper-parameters as a step used them (the values the scheduler left in
// the group before the step), with the group's multipliers.
struct GroupHyper {
  double wd_mult = 1.0;
  double lr_mult = 1.0;
  double lr = 0.0;
  double weight_decay = 0.0;
  bool operator==(const GroupHyper&) const = default;
};

// What one rank captured at one point of a phase.
struct RankState {
  std::vector<ShardSnapshot> shards;
  std::vector<StepUse> uses;               // after a step: the t each part used
  std::vector<GroupHyper> hypers;          // after a step: each group's lr and weight decay
  std::vector<std::vector<float>> params;  // every model param, full length, as this rank holds it
  // Where the rank holds a TP piece or a pipeline stage: 1 where it holds the element of
  // `params` (elsewhere NaN). Empty: it holds every element of every param.
  std::vector<std::vector<uint8_t>> params_held;
  std::string groups;  // rank 0 only, where asked: the saved param groups
};

// Captures this rank's state, in the whole model's params (`specs`, the scenario's): a TP piece's
// shards and model params are placed where the piece sits in the whole param.
// `with_groups`: also rank 0's param groups as a checkpoint holds them (state_dict() after a
// pickle round trip, or what state_dict() raised).
RankState capture(model::ChainedOptimizer& opt, const model::DistributedDataParallel& ddp,
                  const std::vector<model::ParamSpec>& specs, int rank, bool with_groups);
// `uses` (model params as `ddp` numbers them) in the whole model's params.
void globalize_uses(const model::DistributedDataParallel& ddp, std::vector<StepUse>& uses);
// The trace's hash of one rank's state: its shards (master, moments, counter), and on rank 0
// its model params. The other ranks' params are left out, as they were when only rank 0
// captured them, so that the trace hashes of the bundled scenarios did not move when every
// rank began to (a rank's own shard of an fp32 param is in its master; the whole of each
// rank's params is in the JSON trace, GlobalState::params_of).
uint64_t rank_state_hash(const RankState& state, int rank);

// An error one rank met in one stage of a phase.
struct RankError {
  int rank = 0;
  std::string stage;    // "init", "load", "train", "save"
  std::string py_type;  // upstream exception class, or "PeerAborted" / "InvariantViolation"
  std::string message;
  std::string site;        // upstream file and function
  bool secondary = false;  // this rank only stopped because another rank failed
  std::optional<model::MergeError::Kind> merge_kind;
  model::KeyPath merge_path;

  std::string summary() const;  // "rank 1 load: ValueError: ... [dict_utils.py merge()]"
};

// One shard of one model param on one rank at one point of a run.
struct ShardRecord {
  size_t param = 0;
  model::Range range;  // sub-range of the flattened param
  int rank = 0;
  OptimizerPart part = OptimizerPart::kFusedAdam;
  Kernel kernel = Kernel::kFusedAdam;
  std::optional<double> counter;    // step counter the next update advances from
  std::optional<double> step_used;  // t the kernel used in the step just taken
  int step_aliases = 0;             // other shards on the rank sharing this step tensor object
  // Where the elements sat in the tensor the kernel updated (ShardSnapshot::kernel_offset).
  int64_t kernel_offset = 0;
  int64_t kernel_numel = -1;
  // ShardSnapshot::state_dtypes (empty but for TE's precision-aware FusedAdam).
  std::vector<std::pair<std::string, std::string>> state_dtypes;
  std::optional<int> chain;  // ShardSnapshot::chain

  // The rounding class (sim/probe.h) of element `element` of the param.
  int rounding_class(int64_t element) const {
    return sim::rounding_class(kernel, element - range.start + kernel_offset,
                               kernel_numel < 0 ? range.end - range.start : kernel_numel);
  }
};

// Which values of a state rest on uninitialized memory (the fidelity audit of 2026-12-02, the
// residual of partial loading): a load left them as torch.empty made them (RX allow_partial_load
// skipped their key, or no saved piece covered them; sim/probe.h uninitialized_after_load), or
// they were computed from such values since (Adam's update is elementwise: a moment carries its
// mark on, and marks the master it updates; the master marks its model param), or saved and
// loaded back. The real code holds whatever the CUDA caching allocator handed back there, the
// model seeded host garbage: a verdict that rests on those values is not the real code's.
// Per model param and element, 1 = rests on uninitialized memory; every vector empty when no
// value does (the usual case, which costs nothing).
struct Uninitialized {
  using Field = std::vector<std::vector<uint8_t>>;  // per param, per element
  Field master;
  Field exp_avg;
  Field exp_avg_sq;
  Field param;  // the model param
  // What first left such memory, for details: "the load of phase 1 (dp=1, miles-main) skipped
  // optimizer key ... (torch.empty contents)".
  std::string origin;

  bool any() const { return !master.empty(); }
  // Element `e` of param `p` in `field` (one of the four vectors above): false when none is.
  static bool marked(const Field& field, size_t p, int64_t e) {
    return p < field.size() && static_cast<size_t>(e) < field[p].size() &&
           field[p][static_cast<size_t>(e)] != 0;
  }
  // Whether any element of [begin, end) of param `p` in `field` is marked.
  static bool any_in(const Field& field, size_t p, int64_t begin, int64_t end);
};

// The whole model's optimizer and param state, gathered over every rank, at one global step
// (after a step, a load or a save, or before anything).
struct GlobalState {
  int64_t global_step = 0;
  // Per model param, full length; NaN where no rank reported the element.
  std::vector<std::vector<float>> master;
  std::vector<std::vector<float>> exp_avg;
  std::vector<std::vector<float>> exp_avg_sq;
  std::vector<std::vector<float>> param;  // rank 0's model (bf16/fp32) params, full length
  // The ranks whose model params are not bitwise rank 0's, with theirs. After a step the
  // all-gather makes every rank's equal; after a load each rank has written only its own shard
  // of an fp32 param (the shard is a view of it), so the ranks can differ there.
  std::map<int, std::vector<std::vector<float>>> param_on_rank;
  // The model params as rank `rank` holds them.
  const std::vector<std::vector<float>>& params_of(int rank) const;
  // Per element: does optimizer state (exp_avg/exp_avg_sq) exist yet? Adam creates it lazily,
  // as zeros, so an element without state is equivalent to one whose moments are zero.
  std::vector<std::vector<uint8_t>> moments_present;
  std::vector<ShardRecord> shards;
  // Rank 0's DistributedOptimizer.state_dict() param groups after a pickle round trip (what a
  // checkpoint would hold), as text; or what state_dict() raised.
  std::string param_groups;
  // After a step: rank 0's param groups' lr and weight decay that the step used (not hashed).
  std::vector<GroupHyper> hypers;
  // The ranks whose groups differ from rank 0's (a pipeline stage holds its own params' groups),
  // with theirs (not hashed).
  std::map<int, std::vector<GroupHyper>> hypers_on_rank;
  // The groups rank `rank` stepped with.
  const std::vector<GroupHyper>& hypers_of(int rank) const;
  // The values that rest on uninitialized memory (not hashed; mark_uninitialized sets it).
  Uninitialized uninitialized;
  // Where a TP rank > 0's copy of a replicated param (its optimizer shard) differs from TP rank
  // 0's, one line each (not hashed; empty without TP).
  std::vector<std::string> replica_differences;
  // The shards of TP ranks > 0's copies of replicated params (not in `shards`, which tile each
  // param once; not hashed): the trace shows them on their ranks, as the real runner does. Each
  // holds the main copy's values (master, exp_avg, exp_avg_sq at its range) unless `own` has the
  // replica's own, where they differ from the main copy (replica_differences).
  struct Replica {
    ShardRecord record;
    std::optional<std::array<std::vector<float>, 3>> own;
  };
  std::vector<Replica> replicas;

  // FNV-1a over global_step, master, exp_avg, exp_avg_sq and param (in that order, every NaN as
  // one quiet NaN: fnv1a_floats) and every shard's counter and step_used (-1 for none); not over
  // param_groups.
  uint64_t hash() const;
  // The shard that holds element `element` of model param `param`, or null.
  const ShardRecord* shard_at(size_t param, int64_t element) const;
};

struct BufferInfo {
  std::string dtype_key;                // "(torch.bfloat16, torch.float32)"
  std::vector<int64_t> numel_unpadded;  // per bucket
  std::vector<size_t> params;           // the model params it holds (the scenario's), model order
  bool operator==(const BufferInfo&) const = default;
};

// One (TP, PP) rank's DP group's buffers (every DP rank of it builds the same), or, for an MoE
// model, one EP rank's expert-DP group's expert buffers (issue 26: the chain's part 1).
struct GroupLayout {
  model::ModelParallelRank mp;  // an expert group's: the EP view (mp.expert_view())
  std::vector<BufferInfo> buffers;
  std::vector<model::BufferLayout> layouts;
  int part = 0;              // the part of the chained optimizer (0 dense, 1 expert)
  int64_t dp_group_idx = 0;  // `dp_group_idx_<g>` of its keys (an expert group's: its EP rank)
  std::string key_prefix;    // what its saved keys begin with: 'chained_<part>.' or ""
  // Whether `key` (an optimizer key of a save) is this group's: its prefix, then a bucket key of
  // its dp_group_idx; the bucket key when it is.
  std::optional<model::OptimizerBucketKey> bucket_key(const std::string& key) const;
};

struct PhaseRecord {
  size_t index = 0;
  PhaseSpec spec;
  bool ran = false;
  bool completed = false;  // load, every step and the save finished on every rank
  int64_t start_step = 0;  // global steps done before this phase
  // Global steps before its training loop's iteration 0 (sim::iteration_origins, as the run
  // went: the loaded checkpoint's global step minus the iteration the load continued from).
  // The iterations below (save_iteration, tracker_saves, saved_at, on_disk) are the loop's, the
  // ones in the files; GlobalState::global_step is the global step.
  int64_t iteration_origin = 0;
  std::vector<RankError> errors;  // first error of each failing rank
  std::optional<GlobalState> after_load;
  // The ranks that loaded when others raised in their load (a null rank elsewhere): what the
  // trace's after_load events show (the real runner records each rank's as its load returns).
  // The properties read only `after_load`, a load every rank finished.
  std::optional<GlobalState> after_load_partial;
  std::vector<GlobalState> after_step;
  std::vector<model::SavedPiece> saved_pieces;               // when the save completed
  std::vector<std::vector<std::string>> common_differences;  // per rank, vs rank 0
  std::vector<std::string> load_uncovered;
  // Per rank (rank order; empty where the phase loaded nothing): the requested ranges its load
  // left unwritten, as the load met them (what the trace's after_load `unwritten` shows).
  std::vector<std::vector<model::UnwrittenRange>> load_unwritten;
  std::vector<BufferInfo> buffers;
  model::LayoutOptions layout_options;
  std::vector<model::BufferLayout> layouts;  // rank 0's DDP buffers, in gbuf order
  // Every DP group's, by data_parallel_group_idx (pp_rank * tp + tp_rank); groups[0] is rank 0's
  // (buffers, layouts above). Its buffers' elements are the TP piece's (groups[g].mp). Then, for
  // an MoE model, every expert-DP group's (part 1, by EP rank).
  std::vector<GroupLayout> groups;
  std::optional<GlobalState> initial;  // before any load or step (a fresh job)
  // Right after the save (a save may initialize state, e.g. init_empty_state_before_save):
  // what the checkpoint holds, as the optimizer sees it.
  std::optional<GlobalState> at_save;
  // The job's earlier saves (PhaseSpec::save_interval), each its state right after that save
  // (global_step: iteration_origin + the iteration it saved), in order; at_save is the last
  // save's.
  std::vector<GlobalState> earlier_saves;
  // The state right after the save of `iteration` (at_save or an earlier save); null: none (a
  // save that did not return).
  const GlobalState* saved_at(int64_t iteration) const;
  // The saved checkpoint, assembled: optimizer key -> global tensor as floats (NaN where no
  // piece was saved). Empty when the save did not complete.
  std::map<std::string, std::vector<float>> checkpoint_values;
  // The same checkpoint by model param, whatever its format: state key ("param", "exp_avg",
  // "exp_avg_sq") -> per model param, full length (NaN where no piece was saved). A bucket key's
  // padding is not in it. Empty when the save did not complete or wrote no tensor pieces
  // (dp_zero_gather_scatter's state is one object).
  std::map<std::string, std::vector<std::vector<float>>> saved_state;
  // Why the saved pieces could not be read back (then checkpoint_values is empty); "" when
  // they could.
  std::string checkpoint_read_error;
  std::vector<std::pair<std::string, int64_t>> fault_firings;

  // Storage faults (issue 25; PhaseSpec::storage_faults): what this phase's save met
  // (model::FaultyStorage::fired(), in order; empty: none fired), whether the job stopped
  // there (a crash, not an error of the code), and whether a short write fired (the disk lost
  // data it had reported written).
  std::vector<std::string> storage_faults_fired;
  bool crashed = false;
  bool short_write = false;
  // The training loop's checkpoint directory around this phase, as the driver saw it (the
  // judges' ground truth, not the code under test's):
  //   committed_before   the newest save whose tracker write landed whole before this phase
  //                      started: its iteration and phase (nullopt: none);
  //   loaded_phase       the phase whose save wrote the iteration this phase loaded (nullopt:
  //                      it loaded none);
  //   started_fresh      the load found no tracker and started from random;
  //   after_storage_fault  a storage fault fired in an earlier phase's save.
  std::optional<std::pair<int64_t, size_t>> committed_before;
  std::optional<size_t> loaded_phase;
  bool started_fresh = false;
  bool after_storage_fault = false;
  // The iteration this phase's (last) save wrote (-1: it saved none).
  int64_t save_iteration = -1;
  // The global step of that save (-1: none).
  int64_t saved_global_step() const {
    return save_iteration < 0 ? -1 : iteration_origin + save_iteration;
  }
  // Rank 0's: the iteration of each save whose tracker write it went on to, in order (the
  // driver's record of which save the tracker on disk came from).
  std::vector<int64_t> tracker_saves;
  // After this phase's save (or its attempt): what the tracker said and what the iteration
  // directory it names holds. tracker: its text (nullopt: no tracker); named: the iteration it
  // names (nullopt: none); problem: what keeps that directory from being a whole checkpoint
  // ("" when nothing; model::checkpoint_problem); files_iteration: its common state's
  // 'iteration'.
  struct OnDisk {
    std::optional<std::string> tracker;
    std::optional<int64_t> named;
    std::string problem;
    std::optional<int64_t> files_iteration;
  };
  std::optional<OnDisk> on_disk;

  // The state this phase ended in (and saved): after its last step, else after its load, else
  // its initial state.
  const GlobalState* final_state() const;
};

struct RunResult {
  Scenario scenario;
  GlobalState reference_initial;
  std::vector<GlobalState> reference;  // reference[k] = after global step k+1
  // Right after each of its optimizer restarts (where a --no-load-optim phase resumes), by the
  // global steps done before it.
  std::map<int64_t, GlobalState> reference_restarts;
  std::vector<RankError> reference_errors;
  std::vector<PhaseRecord> phases;
  std::vector<std::string> trace;
  uint64_t trace_hash = 0;
  std::string checkpoint_location;  // "memory" or the directory
  bool gpu_resident = false;        // 'cuda' state lived on a real GPU

  const GlobalState* reference_at(int64_t global_step) const;  // nullptr when out of range
  // What phase `p`'s state right after its load is compared with: the reference run at its
  // start step; right after the restart there where p's optimizer began at its start step (a
  // --no-load-optim phase, or a resume of what such a phase saved without a step).
  const GlobalState* reference_after_load(const PhaseRecord& p) const;
  // The phase whose save `p` loaded (PhaseRecord::loaded_phase); nullptr when none.
  const PhaseRecord* loaded_from(const PhaseRecord& p) const {
    return p.loaded_phase.has_value() && *p.loaded_phase < phases.size() ? &phases[*p.loaded_phase]
                                                                         : nullptr;
  }
  // The state the save that `p` loaded held right after it; nullptr when none.
  const GlobalState* loaded_state(const PhaseRecord& p) const {
    const PhaseRecord* from = loaded_from(p);
    return from != nullptr ? from->saved_at(p.start_step - from->iteration_origin) : nullptr;
  }
};

// Gathers the ranks' captures (rank order; null for a rank that captured nothing) into the
// whole model's state. Param groups come from rank 0's capture; param values from rank 0's, and
// each other rank's where they differ (param_on_rank).
GlobalState gather_state(const Scenario& s, int64_t global_step,
                         const std::vector<const RankState*>& ranks);
// The same from states the caller gives up: the first rank's model params are moved, not copied,
// where no rank holds pieces of them (each state is left valid, its contents unspecified).
GlobalState gather_given_states(const Scenario& s, int64_t global_step,
                                const std::vector<RankState*>& ranks);

// Marks in `phase`'s states (after_load, every after_step, at_save) the values that rest on
// uninitialized memory (Uninitialized): what `checkpoint` (the state the phase loaded was saved
// in: the previous phase's at_save; null for none) marked, the slices each rank's load left as
// torch.empty (`slices`, one list per rank), and what the phase's steps computed from them.
// Leaves every state unmarked when neither marks anything.
void mark_uninitialized(const Scenario& s, const GlobalState* checkpoint,
                        const std::vector<std::vector<UninitializedSlice>>& slices,
                        PhaseRecord& phase);

// PhaseRecord::saved_state from `phase`'s checkpoint_values, buffers and layouts: each bucket
// key's param regions (dp_reshardable) and each model-space key (optimizer.state.<state>.<name>)
// placed at their params. A key that fits no param of the scenario is left out.
std::map<std::string, std::vector<std::vector<float>>> saved_state_by_param(
    const Scenario& s, const PhaseRecord& phase);
// The same for `values` (optimizer key -> the tensor's elements, as checkpoint_values holds
// them), placed by `phase`'s buffers, layouts and groups: `inspect` reads a real checkpoint's
// tensors this way, placed by the resuming run's layouts.
std::map<std::string, std::vector<std::vector<float>>> saved_state_by_param(
    const Scenario& s, const std::map<std::string, std::vector<float>>& values,
    const PhaseRecord& phase);

// The fp32 master TE keeps as a bf16 param (given as its float value) and an int16 remainder
// (given as a float holding an integer): adam.cu's reassembly, the high half the bf16 bits less
// one where the remainder is negative.
float master_from_remainder(float bf16_value, float remainder);

// FNV-1a, used for state and trace hashes.
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ULL);
// fnv1a over the floats' bytes, every NaN as the one quiet NaN 0x7fc00000: a NaN's sign and
// payload are the hardware's (x86 makes 0xffc00000, CUDA 0x7fffffff from the same inputs), not
// the model's, so a GPU-resident run and a CPU run that hold NaNs in the same places hash alike.
// Every other value hashes exactly as fnv1a of its bytes.
uint64_t fnv1a_floats(std::span<const float> values, uint64_t h);

}  // namespace ckptsim::sim
