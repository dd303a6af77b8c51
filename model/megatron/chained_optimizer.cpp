#include "model/megatron/chained_optimizer.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/errors.h"
#include "model/faults.h"

namespace ckptsim::model {

namespace {

// Sites as the runner names them: file and function (co_name), no class.
constexpr const char* kSite = "optimizer.py";

// dist_checkpointing/utils.py add_prefix_for_sharding(): every ShardedBase key of the tree gets
// `prefix` in front, in place.
void add_prefix_for_sharding(const Value& tree, const std::string& prefix) {
  if (tree.is_sharded_tensor()) {
    tree.sharded_tensor()->key = prefix + tree.sharded_tensor()->key;
  } else if (tree.is_sharded_object()) {
    tree.sharded_object()->key = prefix + tree.sharded_object()->key;
  } else if (tree.is_dict()) {
    for (const auto& [k, v] : *tree.dict()) add_prefix_for_sharding(v, prefix);
  } else if (tree.is_list()) {
    for (const Value& v : *tree.list()) add_prefix_for_sharding(v, prefix);
  }
}

}  // namespace

ChainedOptimizer::ChainedOptimizer(std::vector<std::unique_ptr<DistributedOptimizer>> parts)
    : parts_(std::move(parts)) {
  CKPTSIM_CHECK(!parts_.empty(), "a ChainedOptimizer of no part");
}

List& ChainedOptimizer::param_groups() {
  if (parts_.size() == 1) return parts_[0]->param_groups();
  param_groups_.truncate(0);
  for (auto& p : parts_) {
    for (const Value& g : p->param_groups()) param_groups_.append(g);
  }
  return param_groups_;
}

void ChainedOptimizer::step() {
  for (auto& p : parts_) p->step();
}

Value ChainedOptimizer::state_dict() {
  if (parts_.size() == 1) return parts_[0]->state_dict();
  auto out = List::make();
  for (auto& p : parts_) out->append(p->state_dict());
  return Value(out);
}

bool ChainedOptimizer::should_add_prefix(const std::optional<CheckpointFormat>& metadata) {
  if (!metadata.has_value()) return true;  // {}: no chained_optim_avoid_prefix
  return !fully_reshardable_format(metadata->sharding_type) ||
         !metadata->chained_optim_avoid_prefix;
}

Value ChainedOptimizer::sharded_state_dict(const Value& model_sharded_state_dict, bool is_loading,
                                           const std::optional<CheckpointFormat>& metadata) {
  if (parts_.size() == 1)
    return parts_[0]->sharded_state_dict(model_sharded_state_dict, is_loading, metadata);
  synchronize_steps();
  // Fault site save.chained_prefix_dropped: the parts' keys keep no 'chained_<i>.' prefix.
  const bool prefix =
      should_add_prefix(metadata) && !parts_[0]->runtime().fault(fault::kChainedPrefixDropped);
  auto out = Dict::make();
  for (size_t i = 0; i < parts_.size(); ++i) {
    Value sd = parts_[i]->sharded_state_dict(model_sharded_state_dict, is_loading, metadata);
    if (prefix) add_prefix_for_sharding(sd, fmt::format("chained_{}.", i));
    out->set(static_cast<int64_t>(i), sd);
  }
  return Value(out);
}

void ChainedOptimizer::load_state_dict(const Value& state_dict) {
  if (parts_.size() == 1) {
    parts_[0]->load_state_dict(state_dict);
    return;
  }
  std::vector<Value> entries;
  if (state_dict.is_list()) {
    for (const Value& v : *state_dict.list()) entries.push_back(v);
  } else if (state_dict.is_dict()) {
    // dist_checkpointing's result {0: sd_0, 1: sd_1}, sorted by key.
    std::vector<std::pair<int64_t, Value>> sorted;
    for (const auto& [k, v] : *state_dict.dict()) {
      if (!k.is_int())
        throw UpstreamError("TypeError", "'<' not supported between instances of keys",
                            std::string(kSite) + " load_state_dict()");
      sorted.emplace_back(k.as_int(), v);
    }
    std::sort(sorted.begin(), sorted.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [k, v] : sorted) entries.push_back(v);
  }
  if (entries.size() != parts_.size()) {
    throw UpstreamError("RuntimeError",
                        fmt::format("Expected {} entries in state dict, but got {}.", parts_.size(),
                                    entries.size()),
                        std::string(kSite) + " load_state_dict()");
  }
  for (size_t i = 0; i < parts_.size(); ++i) {
    // Fault site load.expert_part_not_loaded: the expert part keeps the state it was built with.
    if (i > 0 && parts_[0]->runtime().fault(fault::kExpertPartNotLoaded)) continue;
    parts_[i]->load_state_dict(entries[i]);
  }
  // Fault site load.expert_step_from_dense: the expert part's groups take the dense part's step.
  if (parts_[0]->runtime().fault(fault::kExpertStepFromDense)) {
    const Value* dense = nullptr;
    for (const Value& g : *parts_[0]->optimizer().param_groups) {
      if (dense == nullptr && !group_params(*g.dict()).empty()) dense = g.dict()->find("step");
    }
    for (size_t i = 1; i < parts_.size() && dense != nullptr; ++i) {
      for (const Value& g : *parts_[i]->optimizer().param_groups) {
        if (g.dict()->find("step") != nullptr) g.dict()->set("step", *dense);
      }
    }
  }
  synchronize_steps();
}

void ChainedOptimizer::reload_model_params() {
  for (auto& p : parts_) p->reload_model_params();
}

const Value* saved_param_state_sharding_type(const Value* optimizer) {
  if (optimizer == nullptr || !optimizer->is_dict()) return nullptr;
  const Dict& d = *optimizer->dict();
  if (const Value* own = d.find("param_state_sharding_type"); own != nullptr) return own;
  const Value* first = d.find(int64_t{0});
  if (first == nullptr || !first->is_dict()) return nullptr;
  return first->dict()->find("param_state_sharding_type");
}

// _synchronize_steps(): the step of every group with params and a 'step', one value, written
// back into those groups.
void ChainedOptimizer::synchronize_steps() {
  std::vector<Value> steps;
  std::vector<Dict*> groups;
  for (auto& p : parts_) {
    for (const Value& g : *p->optimizer().param_groups) {
      Dict& group = *g.dict();
      if (group_params(group).empty()) continue;
      const Value* step = group.find("step");
      if (step == nullptr) continue;
      groups.push_back(&group);
      if (std::none_of(steps.begin(), steps.end(),
                       [&](const Value& s) { return py_equal(s, *step); }))
        steps.push_back(*step);
    }
  }
  if (steps.size() > 1) {
    std::string list;
    if (std::all_of(steps.begin(), steps.end(), [](const Value& s) { return s.is_int(); })) {
      // list(set(steps)): the set's order, not the order of the groups.
      std::vector<int64_t> ints;
      for (const Value& s : steps) ints.push_back(s.as_int());
      for (int64_t s : py_list_of_int_set(ints))
        list += (list.empty() ? "" : ", ") + std::to_string(s);
    } else {  // not ints (no modeled path): the order the groups gave
      for (const Value& s : steps) list += (list.empty() ? "" : ", ") + s.repr();
    }
    throw PyAssertionError(fmt::format("steps: [{}]", list),
                           std::string(kSite) + " _synchronize_steps()");
  }
  if (steps.empty()) return;
  for (Dict* g : groups) g->set("step", steps[0]);
}

}  // namespace ckptsim::model
