// The simulator: runs a Scenario's phases on N in-process ranks next to an uninterrupted
// reference run, and records what a checker needs to judge the resume.
//
// A run, in order (TigerBeetle style, the seed and every derived option are printed first):
//   1. trace line `seed=<s> revision=<r0>,<r1>,... scenario=<name>`;
//   2. the reference run: phases[0].dp ranks, phases[0].revision, every step of every phase
//      without a checkpoint; its state is recorded after every global step;
//   3. each phase: a fresh world of tp x pp x dp ranks (parallel_state's order tp-cp-ep-dp-pp;
//      each (TP, PP) rank's DP ranks a subgroup that its buffers and optimizer use, the world
//      the checkpoint's save and load; a new Runtime per rank, new model (the rank's stage's
//      params, each its TP piece) and optimizer — a restarted job); phases after the first load the
//      checkpoint that the previous phase saved; then `steps` training steps; then a save.
//      An upstream error on any rank aborts the phase (other ranks see PeerAborted) and no
//      later phase runs — a crashed job does not resume.
//
// Determinism (checked by a test, not assumed): gradients are exact sums on a dyadic grid
// (sim/gradients.h), collectives reduce in rank order, every random draw comes from a
// stream of the root seed; so a rerun gives the same trace hash, and a resume at another DP
// size reproduces the reference bit for bit wherever the same kernel updates an element.
#pragma once

#include <functional>
#include <string>

#include "model/megatron/torch_dist_writer.h"
#include "model/status.h"
#include "model/storage.h"
#include "sim/record.h"
#include "sim/scenario.h"

namespace ckptsim::sim {

enum class DeviceChoice { kAuto, kCpu, kCuda };

// How a phase's checkpoint is written to the checkpoint directory.
//   kCkptsim   the model's own format (model/megatron/serialization.h), what the simulator
//              saves and loads, in the training loop's layout: one directory for every phase
//              (a job's --save and --load alike), iter_NNNNNNN/{metadata.json, shards/,
//              objects/, common.pt} per saved iteration and latest_checkpointed_iteration.txt
//              (model::save_checkpoint_to_root); saved_directory() names a phase's.
//   kTorchDist Megatron's torch_dist format in the training loop's layout
//              (model/megatron/torch_dist_writer.h), for real Megatron to load:
//              phase_<i>/{latest_checkpointed_iteration.txt, iter_NNNNNNN/}. The simulator
//              still saves and loads its own format, in memory; each completed save is
//              exported right after the phase. The trace is the same in both formats.
enum class CheckpointFormat { kCkptsim, kTorchDist };

struct RunOptions {
  // Where 'cuda' state lives: kCpu simulates the device (CPU tensors, CPU kernels); kCuda keeps
  // it on the real GPU (CUDA FusedAdam kernel); kAuto picks kCuda when real_cuda_available().
  DeviceChoice device = DeviceChoice::kCpu;
  // Empty: an in-memory store. Otherwise a directory: the own format's checkpoints (kCkptsim;
  // a run first removes the iter_* directories and the tracker an earlier run left there) or
  // the exports (kTorchDist: <dir>/phase_<i>/).
  std::string checkpoint_dir;
  // Only with a checkpoint_dir.
  CheckpointFormat checkpoint_format = CheckpointFormat::kCkptsim;
  model::TorchDistExportOptions torch_dist;  // kTorchDist only
  // Called with a one-line status after each phase (progress on long runs); may be empty.
  std::function<void(const std::string&)> progress;
  // The ranks of a world share one copy of what they gather (ObjectGathers::kShared in
  // sim/local_world.h), as they must at production DP sizes. false: each rank gets its own
  // copy; the same run, for tests that show the sharing changes nothing.
  bool share_gathered_objects = true;
  // Every rank's state hash after every step, one trace line each ("step phase=... state=...").
  // false leaves those lines out (and so gives another trace_hash): for a judge that reads only
  // the recorded states, not the trace; at 2^11 steps the hashing was about 6% of a search.
  bool trace_steps = true;
  // resume_from_checkpoint only: load as a script of its own does (dist_checkpointing.load,
  // then the model's and the optimizer's load_state_dict; model::load_distributed_checkpoint),
  // for a checkpoint that holds no training-loop state.
  bool load_as_script = false;
  // resume_from_checkpoint only: `checkpoint` is the training loop's --load directory (its
  // tracker names the iteration directory, model::load_latest_checkpoint), not the iteration
  // directory itself.
  bool load_latest = false;
};

// Runs the scenario, whose phases carry their resolved revision profiles. Fails (Status) only
// on what a user can cause: an unusable checkpoint directory, --device cuda without a GPU.
// Upstream errors inside the run are outcomes in the result.
// REQUIRES: every phase's profile is set (parse_scenario and the generators set it).
Result<RunResult> run_scenario(const Scenario& scenario, const RunOptions& options = {});

// Where phase `i` of `run` saved, in the checkpoint directory: "iter_NNNNNNN" ("" when it
// saved nothing). A phase of no steps saves into the directory it loaded.
std::string saved_directory(const RunResult& run, size_t i);

// One resume from a checkpoint saved elsewhere (the real code's, through
// model/megatron/torch_dist_checkpoint.h): a fresh world of phase.dp ranks of phase.profile
// loads `checkpoint` (the model's own format), takes phase.steps steps and saves nothing. The
// record is the one run_scenario keeps for a phase after the first (index 1): its errors, the
// state after the load and after each step, the elements the load did not cover. No reference
// run: the checkpoint is the reference. options.checkpoint_dir is not used; with
// options.load_latest `checkpoint` is a --load directory (tracker and iter_NNNNNNN/).
// REQUIRES: phase.profile is set; scenario.params and optimizer describe what saved it.
PhaseRecord resume_from_checkpoint(const Scenario& scenario, const PhaseSpec& phase,
                                   const model::Storage& checkpoint,
                                   const RunOptions& options = {});

}  // namespace ckptsim::sim
