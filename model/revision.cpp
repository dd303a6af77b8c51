#include "model/revision.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <sstream>

#include "model/json_depth.h"

namespace ckptsim::model {

namespace {

using nlohmann::json;

struct SwitchDef {
  SwitchInfo info;
  // Sets the switch from JSON; returns an error text (empty when ok).
  std::function<std::string(RevisionSwitches&, const json&)> set;
  std::function<std::string(const RevisionSwitches&)> get;
};

SwitchDef bool_switch(std::string name, std::string meaning, bool RevisionSwitches::*field) {
  return SwitchDef{
      {std::move(name), std::move(meaning)},
      [field](RevisionSwitches& s, const json& v) -> std::string {
        if (!v.is_boolean()) return "must be true or false, got " + v.dump();
        s.*field = v.get<bool>();
        return "";
      },
      [field](const RevisionSwitches& s) { return std::string(s.*field ? "true" : "false"); }};
}

template <typename E>
SwitchDef enum_switch(std::string name, std::string meaning, E RevisionSwitches::*field,
                      std::vector<std::pair<std::string, E>> values) {
  return SwitchDef{{std::move(name), std::move(meaning)},
                   [field, values](RevisionSwitches& s, const json& v) -> std::string {
                     std::string allowed;
                     for (const auto& [text, e] : values) {
                       allowed += (allowed.empty() ? "" : ", ") + text;
                       if (v.is_string() && v.get<std::string>() == text) {
                         s.*field = e;
                         return "";
                       }
                     }
                     return "must be one of " + allowed + ", got " + v.dump();
                   },
                   [field, values](const RevisionSwitches& s) {
                     for (const auto& [text, e] : values) {
                       if (s.*field == e) return text;
                     }
                     return std::string("?");
                   }};
}

const std::vector<SwitchDef>& switch_defs() {
  static const std::vector<SwitchDef> defs = {
      enum_switch("sharded_step",
                  "sharded_param_state_dp_reshardable: 'step' is shape-asserted (PRE), wrapped "
                  "in a LocalNonpersistentObject (POST #2874) or left raw (RX-MILES)",
                  &RevisionSwitches::sharded_step,
                  std::vector<std::pair<std::string, ShardedStepMode>>{
                      {"shape_assert", ShardedStepMode::kShapeAssert},
                      {"nonpersistent", ShardedStepMode::kNonpersistent},
                      {"raw_leaf", ShardedStepMode::kRawLeaf}}),
      bool_switch("omit_step_when_loading", "Fix B: the load request's entries carry no 'step'",
                  &RevisionSwitches::omit_step_when_loading),
      bool_switch("allow_empty_bucket",
                  "B12 fix: a rank owning only padding in a bucket saves/loads that padding "
                  "instead of asserting 'empty bucket encountered'",
                  &RevisionSwitches::allow_empty_bucket),
      bool_switch("fully_reshardable_strips_bucket_padding",
                  "B7 fix (#5077): sharded_param_state_fully_reshardable slices the compact "
                  "world tensors at offsets less the earlier buckets' end padding",
                  &RevisionSwitches::fully_reshardable_strips_bucket_padding),
      bool_switch("flattened_range_refused",
                  "mapping.py refuses a ShardedTensor flattened_range (NVIDIA #2126); radixark "
                  "07220d28f warns instead (not modeled past the warning)",
                  &RevisionSwitches::flattened_range_refused),
      bool_switch("dp_reshardable_load_skips_step",
                  "Fix A: load_parameter_state_from_dp_reshardable drops 'step' before _set",
                  &RevisionSwitches::dp_reshardable_load_skips_step),
      bool_switch("dp_reshardable_load_syncs_hdo",
                  "B11: the dp_reshardable loader calls HDO._sync_hdo_state_to_sub_optimizers()",
                  &RevisionSwitches::dp_reshardable_load_syncs_hdo),
      bool_switch("common_load_allows_class_globals",
                  "the common state's load accepts the classes it holds (the HDO's param groups "
                  "in a fully reshardable format): radixark's weights_only=False; a fix of ours "
                  "in fix-complete; NVIDIA's load_common() torch.load(weights_only=True) of a "
                  "common.pt refuses them (HEAD's 'common_state' object loads them)",
                  &RevisionSwitches::common_load_allows_class_globals),
      bool_switch("dp_zero_load_syncs_hdo",
                  "a fix of ours: load_parameter_state_from_dp_zero calls "
                  "HDO._sync_hdo_state_to_sub_optimizers() as the model-space loaders do",
                  &RevisionSwitches::dp_zero_load_syncs_hdo),
      bool_switch("hdo_reload_refreshes_cpu_copies",
                  "the HDO's update_fp32_param_by_new_param() (a --no-load-optim resume's "
                  "reload_model_params()) also refreshes the CPU copies of offloaded params that "
                  "have no fp32 copy (fp32 params), as radixark's does since ae20f4132 (it copies "
                  "into every inner param); NVIDIA's refreshes the fp32 copies only",
                  &RevisionSwitches::hdo_reload_refreshes_cpu_copies),
      bool_switch(
          "dp_reshardable_load_no_grad",
          "PR #2681 / dev #5835: the dp_reshardable loader runs under torch.no_grad() (POST "
          "and HEAD: its copy_ into an fp32 shard view raises RuntimeError)",
          &RevisionSwitches::dp_reshardable_load_no_grad),
      bool_switch("fp32_shards_detached",
                  "RX 32dbe9f1c: fp32 shards are views of the detached param (upstream: of the "
                  "param, a non-leaf the HDO refuses: ValueError at init)",
                  &RevisionSwitches::fp32_shards_detached),
      bool_switch(
          "set_skips_step",
          "Fix A at the _set site: _set_main_param_and_optimizer_states neither assigns nor copies "
          "'step' (also right for torch AdamW's copy path)",
          &RevisionSwitches::set_skips_step),
      bool_switch("set_skips_non_tensors",
                  "_set_main_param_and_optimizer_states skips non-tensor values (HEAD; B13 fix)",
                  &RevisionSwitches::set_skips_non_tensors),
      bool_switch("get_drops_non_tensors",
                  "_get_main_param_and_optimizer_states drops non-tensor state values (HEAD)",
                  &RevisionSwitches::get_drops_non_tensors),
      bool_switch("group_identity_by_override_keys",
                  "HEAD d98e8a64dd: load_state_dict() pairs saved and live param groups by "
                  "(end_wd, max_lr, min_lr, optimizer, start_wd, wd_mult, lr_mult, "
                  "is_expert_parallel, is_decoupled_lr), a missing key as None (POST/RX: "
                  "wd_mult, lr_mult, is_expert_parallel, is_decoupled_lr): a resume with another "
                  "--lr or --min-lr raises KeyError",
                  &RevisionSwitches::group_identity_by_override_keys),
      enum_switch("hdo_step_source",
                  "state_dict(): HDO step read from the first non-empty CPU AdamW only "
                  "(upstream) or from any sub-optimizer (B6 fix)",
                  &RevisionSwitches::hdo_step_source,
                  std::vector<std::pair<std::string, HdoStepSource>>{
                      {"first_cpu_adamw", HdoStepSource::kFirstCpuAdamW},
                      {"any_sub_optimizer", HdoStepSource::kAnySubOptimizer}}),
      bool_switch("state_dict_drops_none_step",
                  "state_dict(): delete a param group's 'step' when it is None (RX-MILES)",
                  &RevisionSwitches::state_dict_drops_none_step),
      bool_switch("pure_torch_state_dict_allows_empty_state",
                  "pure-torch state_dict() saves no step on an empty optimizer state instead of "
                  "asserting, and load_state_dict() then starts every param at step 0",
                  &RevisionSwitches::pure_torch_state_dict_allows_empty_state),
      bool_switch("pure_torch_load_clones_step",
                  "B9 fix: pure-torch load_state_dict gives each param its own step tensor",
                  &RevisionSwitches::pure_torch_load_clones_step),
      bool_switch("group_index_map_installed_order",
                  "B8 fix (#5835): group_order indexes the installed [fp32..., bf16...] list",
                  &RevisionSwitches::group_index_map_installed_order),
      bool_switch(
          "init_empty_state_before_save",
          "fix (ours): sharded_state_dict() initializes missing optimizer state before saving "
          "(a save before the first step); not upstream behaviour: Megatron's init_state_fn runs "
          "only when loading and makes no step and no master_param",
          &RevisionSwitches::init_empty_state_before_save),
      bool_switch("hdo_group_sync_skips_step",
                  "B5 fix: HDO does not push its groups' 'step' into the sub-optimizers",
                  &RevisionSwitches::hdo_group_sync_skips_step),
      bool_switch("hdo_gpu_part_gets_decoupled_grad",
                  "fix (ours): HDO hands a GPU-resident fp32 param's .decoupled_grad to the GPU "
                  "FusedAdam as .grad (otherwise that param never trains)",
                  &RevisionSwitches::hdo_gpu_part_gets_decoupled_grad),
      bool_switch("hdo_moves_state_by_role",
                  "fix (ours): _move_new_state_to_right_device sends only the CPU optimizers' "
                  "state to the CPU (upstream: isinstance cpu_optimizer_cls, true for the GPU "
                  "part too without TE)",
                  &RevisionSwitches::hdo_moves_state_by_role),
      bool_switch("hdo_update_fp32_skips_native_fp32",
                  "B10 fix (#5929): _update_fp32_params_by_new_state skips fp32 params",
                  &RevisionSwitches::hdo_update_fp32_skips_native_fp32),
      bool_switch("te_absent_version_is_zero",
                  "HEAD d98e8a64dd: without TE, is_te_min_version() answers False (version "
                  "0.0.0); POST/RX raise TypeError on a version of None while the "
                  "precision-aware OptimizerConfig is built",
                  &RevisionSwitches::te_absent_version_is_zero),
      bool_switch(
          "load_allows_missing_keys",
          "RX 6c3fb8c1b allow_partial_load: a requested tensor the checkpoint lacks is "
          "skipped and keeps its contents (upstream: CheckpointException wrapping KeyError)",
          &RevisionSwitches::load_allows_missing_keys),
      bool_switch("merge_truncates_param_state_lists",
                  "RX-MILES 07220d28f merge(): a longer optimizer param_state list in x1 is "
                  "truncated instead of raising",
                  &RevisionSwitches::merge_truncates_param_state_lists),
      bool_switch("common_state_as_sharded_object",
                  "HEAD d98e8a64dd: save() stores the common state as ShardedObject "
                  "'common_state' (no common.pt); load_common_state_dict() reads either",
                  &RevisionSwitches::common_state_as_sharded_object),
      bool_switch("load_reads_rank_local",
                  "HEAD d98e8a64dd: the torch_dist load reads with checkpoint.load(no_dist=True): "
                  "a read that fails raises on its rank only (older: load_state_dict() gathers "
                  "every rank's read result and raises CheckpointException on every rank)",
                  &RevisionSwitches::load_reads_rank_local),
      bool_switch("save_replaces_directory_when_whole",
                  "a fix of ours: a save into an iteration directory that exists writes a fresh "
                  "directory and renames it over the old one once whole (upstream writes over "
                  "it in place, so a crash mid-save mixes two checkpoints under the tracker)",
                  &RevisionSwitches::save_replaces_directory_when_whole),
      bool_switch("scheduler_restores_wd_before_step",
                  "PR #7468: the scheduler's load_state_dict() restores the weight decay's values "
                  "before it steps (upstream: after; the first step after a resume uses the "
                  "config's weight decay under --use-checkpoint-opt_param-scheduler)",
                  &RevisionSwitches::scheduler_restores_wd_before_step),
      enum_switch("override_lr_bounds",
                  "what load_checkpoint() does to the param groups' max_lr/min_lr under "
                  "--override-opt_param-scheduler: checkpoint (POST/RX: keeps the checkpoint's, "
                  "#1138), arguments (HEAD: --lr/--min-lr for every group, #7173), "
                  "runtime_groups (fix: each group's bounds from the current config)",
                  &RevisionSwitches::override_lr_bounds,
                  std::vector<std::pair<std::string, OverrideLrBounds>>{
                      {"checkpoint", OverrideLrBounds::kCheckpoint},
                      {"arguments", OverrideLrBounds::kArguments},
                      {"runtime_groups", OverrideLrBounds::kRuntimeGroups}}),
      bool_switch("load_strips_common_param_state",
                  "load pre-pass: drop raw 'param_state' lists of an old checkpoint's common "
                  "state before merge",
                  &RevisionSwitches::load_strips_common_param_state),
  };
  return defs;
}

const SwitchDef* find_switch(const std::string& name) {
  for (const auto& d : switch_defs()) {
    if (d.info.name == name) return &d;
  }
  return nullptr;
}

Result<json> parse_json(const std::string& text, const std::string& source) {
  if (json_nests_deeper_than(text)) {
    return Status::invalid_input(
        fmt::format("{}: nested deeper than kJsonDepthMax={}", source, kJsonDepthMax));
  }
  try {
    json j = json::parse(text);
    if (!j.is_object())
      return Status::invalid_input(source + ": a revision profile must be a JSON object");
    return j;
  } catch (const json::exception& e) {
    return Status::invalid_input(source + ": not valid JSON: " + e.what());
  }
}

}  // namespace

const std::vector<SwitchInfo>& revision_switch_infos() {
  static const std::vector<SwitchInfo> infos = [] {
    std::vector<SwitchInfo> out;
    for (const auto& d : switch_defs()) out.push_back(d.info);
    return out;
  }();
  return infos;
}

std::string switch_value_text(const RevisionSwitches& s, const std::string& name) {
  const SwitchDef* d = find_switch(name);
  CKPTSIM_CHECK(d != nullptr, "unknown revision switch " + name);
  return d->get(s);
}

Result<RevisionRegistry> RevisionRegistry::load_embedded() {
  RevisionRegistry registry;
  for (const auto& p : embedded_revision_profiles()) {
    Status s = registry.add(p.json, p.path);
    if (!s.is_ok()) return s;
  }
  return registry;
}

Status RevisionRegistry::add(const std::string& json_text, const std::string& source) {
  const Status s = add_profile(json_text, source);
  return s.is_ok() ? s : s.on_one_line();
}

Status RevisionRegistry::add_profile(const std::string& json_text, const std::string& source) {
  auto parsed = parse_json(json_text, source);
  if (!parsed.is_ok()) return parsed.status();
  const json& j = parsed.value();
  static const std::vector<std::string> kFields = {"name", "extends", "description", "upstream",
                                                   "switches"};
  for (const auto& [k, v] : j.items()) {
    if (std::find(kFields.begin(), kFields.end(), k) == kFields.end()) {
      return Status::invalid_input(fmt::format(
          "{}: unknown field '{}' (expected name, extends, description, upstream, switches)",
          source, k));
    }
  }
  if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty()) {
    return Status::invalid_input(source + ": field 'name' must be a non-empty string");
  }
  const std::string name = j["name"].get<std::string>();
  if (raw_.count(name) != 0) {
    return Status::invalid_input(fmt::format("{}: profile '{}' is already defined by {}", source,
                                             name, raw_.at(name).second));
  }
  if (raw_.size() >= kProfilesMax) {
    return Status::invalid_input(
        fmt::format("{}: more than {} revision profiles", source, kProfilesMax));
  }
  if (j.contains("extends") && !j["extends"].is_string()) {
    return Status::invalid_input(source + ": field 'extends' must be a string");
  }
  if (j.contains("description") && !j["description"].is_string()) {
    return Status::invalid_input(source + ": field 'description' must be a string");
  }
  if (j.contains("upstream")) {
    const json& u = j["upstream"];
    auto hex = [](const std::string& c) {
      return c.size() >= 7 && c.size() <= 40 && std::all_of(c.begin(), c.end(), [](char x) {
               return (x >= '0' && x <= '9') || (x >= 'a' && x <= 'f');
             });
    };
    if (!u.is_object() || u.size() != 2 || !u.contains("repo") || !u["repo"].is_string() ||
        u["repo"].get<std::string>().find('/') == std::string::npos || !u.contains("commit") ||
        !u["commit"].is_string() || !hex(u["commit"].get<std::string>())) {
      return Status::invalid_input(
          source +
          ": field 'upstream' must be {\"repo\": \"owner/name\", \"commit\": 7 to 40 "
          "lowercase hex digits}, got " +
          u.dump());
    }
  }
  if (j.contains("switches")) {
    if (!j["switches"].is_object()) {
      return Status::invalid_input(source + ": field 'switches' must be an object");
    }
    RevisionSwitches probe;
    for (const auto& [k, v] : j["switches"].items()) {
      const SwitchDef* d = find_switch(k);
      if (d == nullptr) {
        std::string known;
        for (const auto& info : revision_switch_infos())
          known += (known.empty() ? "" : ", ") + info.name;
        return Status::invalid_input(
            fmt::format("{}: field 'switches.{}': unknown switch (known: {})", source, k, known));
      }
      std::string err = d->set(probe, v);
      if (!err.empty())
        return Status::invalid_input(fmt::format("{}: field 'switches.{}' {}", source, k, err));
    }
  }
  raw_[name] = {json_text, source};
  return Status::ok();
}

Status RevisionRegistry::add_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::not_found(path + ": cannot open revision profile");
  std::stringstream ss;
  ss << in.rdbuf();
  return add(ss.str(), path);
}

Result<RevisionProfile> RevisionRegistry::resolve(const std::string& name, int depth) const {
  if (depth > kExtendsDepthMax) {
    return Status::invalid_input(fmt::format(
        "revision '{}': 'extends' chain longer than {} (a cycle?)", name, kExtendsDepthMax));
  }
  auto it = raw_.find(name);
  if (it == raw_.end()) {
    std::string known;
    for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
    return Status::not_found(fmt::format("unknown revision '{}' (known: {})", name, known));
  }
  const json j = json::parse(it->second.first);
  RevisionProfile profile;
  if (j.contains("extends")) {
    auto base = resolve(j["extends"].get<std::string>(), depth + 1);
    if (!base.is_ok()) {
      return Status::invalid_input(it->second.second +
                                   ": field 'extends': " + base.status().message());
    }
    profile = base.value();
    profile.extends = j["extends"].get<std::string>();
  }
  profile.name = name;
  profile.source = it->second.second;
  profile.upstream.reset();
  if (j.contains("upstream")) {
    profile.upstream = UpstreamCommit{j["upstream"]["repo"].get<std::string>(),
                                      j["upstream"]["commit"].get<std::string>()};
  }
  profile.description = j.value("description", std::string());
  if (j.contains("switches")) {
    for (const auto& [k, v] : j["switches"].items()) {
      find_switch(k)->set(profile.switches, v);
      auto& ex = profile.explicit_switches;
      ex.erase(std::remove(ex.begin(), ex.end(), k), ex.end());
      ex.push_back(k);
    }
  }
  return profile;
}

Result<RevisionProfile> RevisionRegistry::get(const std::string& name_or_path) {
  Result<RevisionProfile> r = get_profile(name_or_path);
  if (!r.is_ok()) return r.status().on_one_line();
  return r;
}

Result<RevisionProfile> RevisionRegistry::get_profile(const std::string& name_or_path) {
  const std::string suffix = ".json";
  if (name_or_path.size() > suffix.size() &&
      name_or_path.compare(name_or_path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    std::ifstream in(name_or_path);
    if (!in) return Status::not_found(name_or_path + ": cannot open revision profile");
    std::stringstream ss;
    ss << in.rdbuf();
    auto parsed = parse_json(ss.str(), name_or_path);
    if (!parsed.is_ok()) return parsed.status();
    const std::string name = parsed.value().value("name", std::string());
    if (raw_.count(name) == 0 || raw_.at(name).second != name_or_path) {
      Status s = add_profile(ss.str(), name_or_path);
      if (!s.is_ok()) return s;
    }
    return resolve(name, 0);
  }
  return resolve(name_or_path, 0);
}

std::vector<std::string> RevisionRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [n, _] : raw_) out.push_back(n);
  return out;
}

}  // namespace ckptsim::model
