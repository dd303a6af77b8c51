// A code revision of the modeled upstream files, as data: a named set of behavior switches.
//
// Each switch is one place where upstream revisions differ (spec §12, §16, §18), read at
// exactly that one place in model/ — never `if (revision == "...")`. A profile is a JSON
// file (revisions/*.json, embedded into the binary at build time; a user gating a new graft
// writes a new file and passes its path):
//
//   {"name": "fix-recommended",
//    "extends": "pr69-graft",                  // optional: start from another profile
//    "description": "...",
//    "switches": {"omit_step_when_loading": true, "dp_reshardable_load_skips_step": true}}
//
// Invariants:
//   1. Every switch has a default equal to upstream POST (f4502eb1c9, PR #2874) behavior, so
//      a profile lists only how it differs from POST (or from the profile it extends).
//   2. An unknown switch name, a wrong JSON type or an unknown enum value is a Status error
//      naming the file and the field; `extends` cycles and chains longer than
//      kExtendsDepthMax are errors.
//   3. Profile names are unique across the embedded set and the files a user adds.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/status.h"

namespace ckptsim::model {

// What sharded_param_state_dp_reshardable does with an entry's 'step' (the 0-dim tensor of
// a torch AdamW param state) in its wrapping loop (distrib_optimizer.py 1649-1686).
enum class ShardedStepMode {
  kShapeAssert,    // PRE: no special case; `assert shape == (e - s,)` fails on the 0-dim step
  kNonpersistent,  // POST #2874: wrapped in LocalNonpersistentObject
  kRawLeaf,        // RX-MILES 6c3fb8c1b: `continue`, the raw tensor stays → common state
};

// Which sub-optimizers DistributedOptimizer.state_dict() reads the step from for HDO.
enum class HdoStepSource {
  kFirstCpuAdamW,    // upstream: first non-empty CPU AdamW only (B6: offload 0 saves none)
  kAnySubOptimizer,  // fix: fall back to the GPU FusedAdam group step
};

// What load_checkpoint() does to the param groups' max_lr/min_lr under
// --override-opt_param-scheduler, after the scheduler's load (training/checkpointing.py).
enum class OverrideLrBounds {
  kCheckpoint,     // POST, RX: nothing; the groups keep the checkpoint's bounds, so a new --lr
                   // never reaches them (Megatron-LM issue #1138)
  kArguments,      // HEAD d98e8a64dd: every group gets --lr/--min-lr, losing a group's own
                   // bounds (issue #7173)
  kRuntimeGroups,  // fix: every group gets the bounds the current config gives it
};

struct RevisionSwitches {
  // --- distrib_optimizer.py sharded_param_state_dp_reshardable -----------------------------
  ShardedStepMode sharded_step = ShardedStepMode::kNonpersistent;
  // Fix B (spec §12): leave 'step' out of the entries when is_loading (kept when saving).
  bool omit_step_when_loading = false;
  // B12 fix: a rank that owns no param element of a bucket saves/loads one padding entry (its
  // in-range padding, or a zero-length piece) instead of asserting 'empty bucket encountered',
  // so that no rank's bucket list is ever empty (an empty list would be compacted away).
  bool allow_empty_bucket = false;

  // --- distrib_optimizer.py sharded_param_state_fully_reshardable ------------------------------
  // B7 fix (NVIDIA #5077, 32a03b77c5): the world tensors of get_parameter_state_dp_zero have
  // every bucket's end padding stripped, and the slice of a param in bucket b is moved back by
  // the padding of the buckets before it. Without it, a param of bucket >= 1 is sliced at its
  // padded buffer offset: the wrong elements, or a slice too short (AssertionError).
  bool fully_reshardable_strips_bucket_padding = false;
  // mapping.py ShardedTensor.validate_metadata_integrity: a flattened_range is refused
  // (CheckpointingException, NVIDIA #2126), so fully_sharded_model_space fails while its
  // request is built. radixark 07220d28f logs a warning instead and goes on; what its save or
  // load then does is not modeled (a scenario that saves in that format there is refused).
  bool flattened_range_refused = true;

  // --- distrib_optimizer.py load_parameter_state_from_dp_reshardable --------------------------
  // Fix A (spec §12): drop 'step' before _set_main_param_and_optimizer_states, as the
  // fs_model_space loader does.
  bool dp_reshardable_load_skips_step = false;
  // B11: call HDO._sync_hdo_state_to_sub_optimizers() after the dp_reshardable load.
  bool dp_reshardable_load_syncs_hdo = false;
  // A fix of ours: load_parameter_state_from_dp_zero() syncs the HDO's sub-optimizers as the
  // model-space loaders do (upstream, at every modeled revision, does not: the scattered
  // tensors _set assigns into HDO.state never reach the sub-optimizers' fp32 params).
  bool dp_zero_load_syncs_hdo = false;
  // The HDO's update_fp32_param_by_new_param() (reload_model_params(), which a --no-load-optim
  // or --finetune resume calls) also refreshes the CPU copy of every offloaded param that has
  // no fp32 copy (an fp32 param: param_to_fp32_param leaves it out). radixark's does since
  // ae20f4132 (2026-06-08; miles-main): it copies each param into its entry of
  // param_to_inner_param, the fp32 copies and the CPU copies alike. NVIDIA's (every modeled
  // revision) refreshes param_to_fp32_param only, where an offloaded fp32 param is refused at
  // init anyway. Without it such a CPU copy keeps the weights the job was built with, which the
  // first step updates and copies back. (Until 2026-12-05 the model took this for a fix of ours
  // and miles-main for a revision without it; the real code said otherwise:
  // reports/crash-replay-2026-12-05.md.)
  bool hdo_reload_refreshes_cpu_copies = false;
  // The load of the common state accepts the classes it holds: radixark's load_common() reads
  // common.pt with torch.load(weights_only=False); in fix-complete a fix of ours (allowlisting
  // them). Without it (NVIDIA's revisions, on torch >= 2.6) load_common()'s
  // torch.load(weights_only=True) of a common.pt refuses them: a fully reshardable checkpoint
  // of the HDO written by a revision before HEAD, whose param groups (common state in that
  // format) hold its sub-optimizer classes, does not load. HEAD's 'common_state' object loads
  // them anyway (torch.distributed.checkpoint unpickles it with weights_only=False).
  bool common_load_allows_class_globals = false;
  // Upstream PR #2681 / dev #5835: the loader runs under torch.no_grad(), so its copy_ into an
  // fp32 shard (a view of a param that requires grad) is allowed. POST and HEAD have no
  // no_grad there (f4502eb1c9:1772, d98e8a64dd:2071): the copy raises RuntimeError.
  bool dp_reshardable_load_no_grad = false;

  // --- distrib_optimizer.py _build_model_and_main_param_groups ---------------------------------
  // RX 32dbe9f1c: an fp32 shard is model_param.detach().view(-1)[a:b]. Upstream's is a view of
  // the param itself (f4502eb1c9:421, d98e8a64dd:467): a non-leaf that requires grad, which an
  // HDO rebuilt over the shard groups refuses ("can't optimize a non-leaf Tensor") and a copy_
  // outside no_grad refuses too (see dp_reshardable_load_no_grad).
  bool fp32_shards_detached = false;

  // --- distrib_optimizer.py _get/_set_main_param_and_optimizer_states -------------------------
  // Fix A at the `_set` site: 'step' is neither assigned (HDO) nor copied (the copy path). Unlike
  // dropping it in the loader, this also works for torch AdamW, whose live state has a 'step'
  // that the copy loop would otherwise look up in the incoming tensors (KeyError 'step').
  bool set_skips_step = false;
  // POST and RX-MILES assign every value (B13: 'padding': False leaks into HDO.state);
  // HEAD/RX-0819 skip non-tensors.
  bool set_skips_non_tensors = false;
  // HEAD:1097-1110: _get drops non-tensor state values.
  bool get_drops_non_tensors = false;

  // --- distrib_optimizer.py state_dict / load_state_dict ---------------------------------------
  // HEAD d98e8a64dd (optimizer.py param_group_identifier_keys, distrib_optimizer.py
  // make_needed_groups): load_state_dict() pairs a saved param group with a live one by
  // (end_wd, max_lr, min_lr, optimizer, start_wd, wd_mult, lr_mult, is_expert_parallel,
  // is_decoupled_lr), a missing key counting as None. POST and RX use (wd_mult, lr_mult,
  // is_expert_parallel, is_decoupled_lr) and raise ValueError for a missing one. Since
  // _get_param_groups writes --lr and --min-lr into every group as max_lr/min_lr, a resume with
  // another --lr or --min-lr raises KeyError at HEAD (distrib_optimizer.py:970), under any
  // scheduler flag: the optimizer loads before the scheduler.
  bool group_identity_by_override_keys = false;
  HdoStepSource hdo_step_source = HdoStepSource::kFirstCpuAdamW;
  // RX-MILES 714-715: delete a param group's 'step' when it is None.
  bool state_dict_drops_none_step = false;
  // Pure-torch (no TE/apex) state_dict(): upstream asserts exactly one distinct step, which
  // fails on a fresh optimizer (empty state) at load time; the fix saves no step then, and
  // load_state_dict() gives every param a fresh step 0 when no group carries one.
  bool pure_torch_state_dict_allows_empty_state = false;
  // B9 fix: the pure-torch load gives every param its own step tensor instead of one shared.
  bool pure_torch_load_clones_step = false;
  // B8 fix (upstream dev #5835): model_param_group_index_map records the position in the
  // installed group list [fp32..., bf16...] instead of the gbuf iteration order.
  bool group_index_map_installed_order = false;
  // Fix (ours, not upstream behaviour) for saving before the first step: sharded_state_dict()
  // (when saving) first gives every param without optimizer state an initial state (exp_avg and
  // exp_avg_sq zeros; torch AdamW a step 0; HDO master_param = the inner param). Upstream has no
  // such code: its init_state_fn (optimizer/__init__.py:391-399) runs only when loading, and only
  // in the non-distributed optimizers (optimizer.py:790-791, 807-808, 1018-1019), and writes zero
  // moments but no 'step' and, outside the precision-aware branch, no 'master_param'. Without the
  // switch an HDO save raises KeyError 'master_param' and a FusedAdam save writes no moments,
  // which the next load then requests (KeyError ... not in state dict).
  bool init_empty_state_before_save = false;

  // --- hybrid_optimizer.py --------------------------------------------------------------------
  // B5 fix: _sync_hdo_param_groups_to_sub_optimizers does not push 'step' into sub-groups.
  bool hdo_group_sync_skips_step = false;
  // Fix (ours) for a param that stops training: with precision-aware grads, an fp32 param the
  // HDO keeps on the GPU part has its gradient only in .decoupled_grad, which the GPU FusedAdam
  // (no use_decoupled_grad) never reads. With this switch _set_sub_optimizer_grads hands it over
  // as .grad, as it already does for the fp32 clones of bf16 params. Found when a reshard moved
  // an fp32 shard from the CPU part to the GPU part (fix-complete failed
  // trajectory_matches_uninterrupted).
  bool hdo_gpu_part_gets_decoupled_grad = false;
  // Fix (ours): _move_new_state_to_right_device sends a sub-optimizer's state to the CPU when
  // it is one of the HDO's CPU optimizers. Upstream asks isinstance(opt, cpu_optimizer_cls),
  // which without TE (both parts torch AdamW) also sends the GPU part's state to the CPU, and
  // the GPU part's next step fails ("exp_avgs is on cpu").
  bool hdo_moves_state_by_role = false;
  // B10 fix (HEAD #5929, RX): _update_fp32_params_by_new_state skips params that are fp32
  // already instead of raising KeyError.
  bool hdo_update_fp32_skips_native_fp32 = false;

  // --- optimizer_config.py / utils.py --------------------------------------------------------
  // HEAD d98e8a64dd: without TE, get_te_version() is 0.0.0, so the precision-aware
  // OptimizerConfig's is_te_min_version() checks answer False. POST (and RX) compare a version
  // of None: TypeError "'>=' not supported between instances of 'NoneType' and 'Version'"
  // (utils.py:369) while the config is built, so --optimizer-cpu-offload without TE fails at
  // init on every rank.
  bool te_absent_version_is_zero = false;

  // --- dict_utils.py merge / serialization.py load ---------------------------------------------
  // RX-MILES 07220d28f merge() patch.
  bool merge_truncates_param_state_lists = false;
  // RX 6c3fb8c1b: dist_checkpointing.load(..., allow_partial_load=True): a requested tensor the
  // checkpoint lacks is skipped ("... will skip") and keeps its contents; upstream raises.
  bool load_allows_missing_keys = false;
  // HEAD (d98e8a64dd serialization.py save/load_common_state_dict): the common state is saved
  // as one ShardedObject 'common_state' inside the checkpoint, with no common.pt; its loader
  // reads either. Older loaders read common.pt only, and fail on HEAD's checkpoints.
  bool common_state_as_sharded_object = false;
  // HEAD (d98e8a64dd strategies/torch.py:896 TorchDistLoadShardedStrategy.load()):
  // checkpoint.load(..., no_dist=True): each rank plans and reads on its own, and a read that
  // fails raises on that rank only. Older revisions (f4502eb1c9, dceb1fb7ce :799; radixark :805)
  // call checkpoint.load_state_dict(), whose _DistWrapper.all_gather("read") gathers every
  // rank's read result and raises one CheckpointException on every rank when any failed.
  bool load_reads_rank_local = false;
  // A fix of ours (issue 25): a save into an iteration directory that already exists (upstream
  // writes over it in place, "Overwriting old incomplete / corrupted checkpoint"; the exit save
  // of a job resumed at train_iters, training.py:2056, writes the very checkpoint it loaded)
  // goes to a fresh directory that replaces the old one only once whole, so a crash mid-save
  // leaves the committed checkpoint as it was.
  bool save_replaces_directory_when_whole = false;
  // --- optimizer_param_scheduler.py / training/checkpointing.py -------------------------------
  // PR #7468: load_state_dict() restores the weight decay's values before its step(num_steps)
  // (upstream steps first: the first step after a resume uses the config's weight decay).
  bool scheduler_restores_wd_before_step = false;
  OverrideLrBounds override_lr_bounds = OverrideLrBounds::kCheckpoint;

  // Loader pre-pass for old RX-MILES checkpoints (spec §12 last paragraph): drop the raw
  // 'param_state' step lists from the loaded common state before merge.
  bool load_strips_common_param_state = false;
};

// The real code a profile stands for: a commit of a Megatron-LM repository. The replay runner
// checks it out; profiles of proposed fixes name none.
struct UpstreamCommit {
  std::string repo;    // "NVIDIA/Megatron-LM", "radixark/Megatron-LM"
  std::string commit;  // 7 to 40 lowercase hex digits
};

struct RevisionProfile {
  std::string name;
  std::string description;
  std::string extends;  // empty: POST defaults
  std::string source;   // file the profile came from ("revisions/x.json" or a user path)
  // {"repo", "commit"}: this profile's own (never inherited through `extends`: a profile that
  // extends another stands for other code).
  std::optional<UpstreamCommit> upstream;
  RevisionSwitches switches;
  // The switches this profile (or its ancestors) set explicitly, in file order, for reports.
  std::vector<std::string> explicit_switches;
};

// Names and one-line meanings of every switch, in declaration order (for `ckptsim revisions`
// and for error messages that list the valid names).
struct SwitchInfo {
  std::string name;
  std::string meaning;
};
const std::vector<SwitchInfo>& revision_switch_infos();
// The value of a switch as text ("true", "nonpersistent", ...). REQUIRES a known name.
std::string switch_value_text(const RevisionSwitches& s, const std::string& name);

struct EmbeddedProfile {
  const char* path;
  const char* json;
};
// Generated at build time from revisions/*.json (cmake/embed_revisions.cmake).
const std::vector<EmbeddedProfile>& embedded_revision_profiles();

class RevisionRegistry {
 public:
  static constexpr int kExtendsDepthMax = 8;
  static constexpr size_t kProfilesMax = 256;

  // The embedded profiles. Fails only if an embedded file is invalid (a build-time mistake).
  static Result<RevisionRegistry> load_embedded();

  // Adds a profile from JSON text; `source` names it in errors (each on one line:
  // Status::on_one_line, as get()'s).
  Status add(const std::string& json_text, const std::string& source);
  // Adds a profile file from disk.
  Status add_file(const std::string& path);

  // A profile by name, or — if `name_or_path` ends in ".json" — loads that file first.
  Result<RevisionProfile> get(const std::string& name_or_path);
  std::vector<std::string> names() const;  // sorted

 private:
  Status add_profile(const std::string& json_text, const std::string& source);
  Result<RevisionProfile> get_profile(const std::string& name_or_path);
  Result<RevisionProfile> resolve(const std::string& name, int depth) const;
  // Raw parsed files by name: the JSON text and its source.
  std::map<std::string, std::pair<std::string, std::string>> raw_;
};

}  // namespace ckptsim::model
