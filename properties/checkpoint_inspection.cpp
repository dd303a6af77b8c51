#include "properties/checkpoint_inspection.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "model/megatron/optimizer_key.h"
#include "properties/properties.h"

namespace ckptsim::properties {

namespace {

using model::Value;

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string number_text(double v) {
  return v == std::floor(v) && std::abs(v) < 1e15 ? fmt::format("{}", static_cast<int64_t>(v))
                                                  : fmt::format("{}", v);
}

std::optional<double> as_step(const Value& v) {
  if (v.is_int() || v.is_float()) return v.as_float();
  if (v.is_tensor() && v.tensor().numel() == 1) return v.tensor().item<double>();
  return std::nullopt;
}

const model::List* groups_of(const model::TorchDistCheckpoint& c, int64_t part = 0) {
  const Value* opt = model::optimizer_state_object(c, part);
  const Value* groups = opt != nullptr ? opt->dict()->find("param_groups") : nullptr;
  return groups != nullptr && groups->is_list() ? groups->list().get() : nullptr;
}

// "" for a checkpoint of one optimizer part; "part <i>: " for each part of a chain.
std::string part_label(const model::TorchDistCheckpoint& c, int64_t part) {
  return model::chained_parts(c) > 1 ? fmt::format("part {} (chained_{}.): ", part, part) : "";
}

// Every leaf below `v`, with its path, that `pick` selects.
template <typename Pick>
void leaves(const Value& v, const std::string& path, Pick pick,
            std::vector<std::pair<std::string, const Value*>>& out) {
  if (v.is_dict()) {
    for (const auto& [k, child] : *v.dict()) leaves(child, path + "[" + k.repr() + "]", pick, out);
  } else if (v.is_list()) {
    for (size_t i = 0; i < v.list()->size(); ++i) {
      leaves(v.list()->at(i), fmt::format("{}[{}]", path, i), pick, out);
    }
  } else if (pick(path, v)) {
    out.emplace_back(path, &v);
  }
}

const Value* common_param_state(const model::TorchDistCheckpoint& c) {
  const Value* opt = c.common.dict()->find("optimizer");
  return opt != nullptr && opt->is_dict() ? opt->dict()->find("param_state") : nullptr;
}

// The raw per-param 'step' leaves of the common state (path, value).
std::vector<std::pair<std::string, const Value*>> raw_steps(const model::TorchDistCheckpoint& c) {
  std::vector<std::pair<std::string, const Value*>> out;
  const Value* ps = common_param_state(c);
  if (ps == nullptr) return out;
  leaves(
      *ps, "optimizer['param_state']",
      [](const std::string& path, const Value&) { return path.ends_with("['step']"); }, out);
  return out;
}

// What is wrong with a group step that all groups agree on: per-param steps of the common state
// that differ, and a step behind or past the iteration. `per_param` gets the counters found;
// `lines` what is only a possibility (steps the grad scaler may have skipped).
std::vector<std::string> step_problems(const model::TorchDistCheckpoint& c, double group_step,
                                       std::map<double, int>& per_param,
                                       std::vector<std::string>& lines) {
  for (const auto& [path, v] : raw_steps(c)) {
    const auto s = as_step(*v);
    if (!s) continue;  // a padding entry's step: a torch.empty vector, no counter
    ++per_param[*s];
  }
  std::vector<std::string> problems;
  for (const auto& [s, n] : per_param) {
    if (s != group_step) {
      problems.push_back(
          fmt::format("{} per-param step(s) in the common state say {} where the "
                      "param groups say {}",
                      n, number_text(s), number_text(group_step)));
    }
  }
  const bool has_scaler = c.sharded.dict()->contains(model::format_object_key(0, "grad_scaler"));
  const double iteration = static_cast<double>(c.iteration);
  if (group_step < iteration) {
    const std::string text = fmt::format(
        "the param groups say step {} at iteration {}: {} optimizer steps are missing from the "
        "counter, the signature of a counter that restarted at 1 on the resume from iteration {}",
        number_text(group_step), c.iteration, number_text(iteration - group_step),
        number_text(iteration - group_step + 1));
    if (has_scaler) {
      lines.push_back(text + " (or of steps the grad scaler skipped: it is in the checkpoint)");
    } else {
      problems.push_back(text);
    }
  } else if (group_step > iteration) {
    problems.push_back(fmt::format("the param groups say step {}, past iteration {}",
                                   number_text(group_step), c.iteration));
  }
  return problems;
}

// The one step the groups of `groups` hold, or why not (the check fails with it).
std::optional<double> groups_step(const model::TorchDistCheckpoint& c, const model::List& groups,
                                  const std::string& label, CheckpointCheck& out) {
  std::set<double> steps;
  size_t with_step = 0;
  for (const Value& g : groups) {
    const Value* s = g.is_dict() ? g.dict()->find("step") : nullptr;
    if (s == nullptr) continue;
    ++with_step;
    if (auto v = as_step(*s)) steps.insert(*v);
  }
  out.outcome = CheckOutcome::kFails;
  if (with_step == 0) {
    out.detail = fmt::format(
        "{}no param group holds a step, at iteration {}: nothing tells a resume how many steps "
        "were taken, so its bias correction restarts at t=1 (a hybrid optimizer with "
        "offload_fraction 0 saves none, spec §4)",
        label, c.iteration);
    return std::nullopt;
  }
  if (steps.size() != 1 || with_step != groups.size()) {
    std::vector<std::string> seen;
    for (double s : steps) seen.push_back(number_text(s));
    out.detail = fmt::format("{}{} of {} param groups hold a step, and they disagree: {}", label,
                             with_step, groups.size(), join(seen, ", "));
    return std::nullopt;
  }
  out.outcome = CheckOutcome::kHolds;
  return *steps.begin();
}

// Each part's groups' one step (a chain's parts: each on its own, then the parts against each
// other, as ChainedOptimizer._synchronize_steps asserts at the next load); nullopt when the
// check already failed (or is n/a).
std::optional<double> parts_step(const model::TorchDistCheckpoint& c, CheckpointCheck& out,
                                 size_t& group_count) {
  std::vector<std::pair<int64_t, double>> by_part;
  for (int64_t part = 0; part < model::chained_parts(c); ++part) {
    const model::List* groups = groups_of(c, part);
    if (groups == nullptr) {
      out.outcome = part == 0 ? CheckOutcome::kNotApplicable : CheckOutcome::kFails;
      out.detail = fmt::format(
          "{}no param groups (no distributed optimizer object, none in the common state)",
          part_label(c, part));
      return std::nullopt;
    }
    const auto step = groups_step(c, *groups, part_label(c, part), out);
    if (!step) return std::nullopt;
    group_count += groups->size();
    by_part.emplace_back(part, *step);
  }
  for (const auto& [part, step] : by_part) {
    if (step == by_part.front().second) continue;
    out.outcome = CheckOutcome::kFails;
    out.detail = fmt::format(
        "the chain's parts disagree: part 0 says step {}, part {} says step {} (the next load's "
        "_synchronize_steps asserts one step)",
        number_text(by_part.front().second), part, number_text(step));
    return std::nullopt;
  }
  return by_part.front().second;
}

CheckpointCheck check_steps(const model::TorchDistCheckpoint& c) {
  CheckpointCheck out{"step_counters_agree", "", CheckOutcome::kHolds, "", {}};
  size_t group_count = 0;
  const std::optional<double> step = parts_step(c, out, group_count);
  if (!step) return out;
  const double group_step = *step;
  std::map<double, int> per_param;
  const std::vector<std::string> problems = step_problems(c, group_step, per_param, out.lines);
  if (!problems.empty()) {
    out.outcome = CheckOutcome::kFails;
    out.detail = problems.front();
    for (size_t i = 1; i < problems.size(); ++i) out.lines.push_back(problems[i]);
    return out;
  }
  out.detail = fmt::format("{} param group(s){} say step {} at iteration {}", group_count,
                           model::chained_parts(c) > 1
                               ? fmt::format(" of the chain's {} parts", model::chained_parts(c))
                               : "",
                           number_text(group_step), c.iteration);
  if (!per_param.empty()) {
    int n = 0;
    for (const auto& [s, k] : per_param) n += k;
    out.detail += fmt::format("; {} per-param step(s) in the common state agree", n);
  }
  return out;
}

CheckpointCheck check_wrapped(
    const model::TorchDistCheckpoint& c,
    const std::vector<std::pair<std::string, model::RevisionSwitches>>& revisions) {
  CheckpointCheck out{"common_state_not_wrapped", "", CheckOutcome::kHolds, "", {}};
  const auto steps = raw_steps(c);
  if (steps.empty()) {
    out.detail = "no raw 'step' in the common state's optimizer.param_state";
    return out;
  }
  std::vector<std::string> wrapping;
  for (const auto& [name, sw] : revisions) {
    if (sw.sharded_step == model::ShardedStepMode::kNonpersistent && !sw.omit_step_when_loading) {
      wrapping.push_back(name);
    }
  }
  out.outcome = CheckOutcome::kFails;
  out.detail = fmt::format(
      "{} raw 'step' leaves in the common state's optimizer.param_state (first: {}); a load "
      "request that wraps 'step' in a LocalNonpersistentObject (#2874) merges them into a "
      "duplicate leaf{}",
      steps.size(), steps.front().first, wrapping.empty() ? "" : ": " + join(wrapping, ", "));
  return out;
}

CheckpointCheck check_rank_independent(const model::TorchDistCheckpoint& c) {
  CheckpointCheck out{"common_state_rank_independent", "", CheckOutcome::kHolds, "", {}};
  std::vector<std::pair<std::string, const Value*>> found;
  if (const Value* ps = common_param_state(c)) {
    leaves(
        *ps, "optimizer['param_state']", [](const std::string&, const Value&) { return true; },
        found);
  }
  std::vector<std::pair<std::string, const Value*>> tensors;
  leaves(
      c.common, "",
      [](const std::string& path, const Value& v) {
        return v.is_tensor() && v.tensor().numel() > 1 &&
               path.find("['param_state']") == std::string::npos;
      },
      tensors);
  if (found.empty() && tensors.empty()) {
    out.detail = "no per-rank optimizer state and no tensor of more than one element";
    return out;
  }
  out.outcome = CheckOutcome::kFails;
  if (!found.empty()) {
    out.detail = fmt::format(
        "the common state holds per-param optimizer state ({} leaves under "
        "optimizer['param_state']): only rank 0's copy is saved, and every rank of a resume is "
        "given it, matched by list position",
        found.size());
    size_t garbage = 0;
    for (const auto& [path, v] : found) {
      if (v->is_tensor() && v->tensor().dim() == 1 && path.ends_with("['step']")) ++garbage;
    }
    if (garbage > 0) {
      out.lines.push_back(fmt::format(
          "{} of them are padding entries' 'step', a torch.empty vector (uninitialized memory)",
          garbage));
    }
  } else {
    out.detail = fmt::format(
        "the common state holds {} tensor(s) of more than one element "
        "(first: {}); only rank 0's are saved",
        tensors.size(), tensors.front().first);
  }
  return out;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Every optimizer tensor of the checkpoint ("optimizer." keys, a chain's with their
// 'chained_<i>.': dp_reshardable buckets and model-space params alike), flattened to float.
std::map<std::string, std::vector<float>> optimizer_tensors(const model::TorchDistCheckpoint& c) {
  std::map<std::string, std::vector<float>> out;
  const model::Dict* d = c.sharded.is_dict() ? c.sharded.dict().get() : nullptr;
  if (d == nullptr) return out;
  for (const auto& [key, v] : *d) {
    // A chain's keys: 'chained_<i>.optimizer.'.
    if (!key.is_str() || !model::parse_chained_key(key.str()).rest.starts_with("optimizer.") ||
        !v.is_tensor()) {
      continue;
    }
    const at::Tensor t = v.tensor().to(at::kFloat).contiguous().reshape({-1});
    const float* data = t.data_ptr<float>();
    out.emplace(key.str(), std::vector<float>(data, data + t.numel()));
  }
  return out;
}

// The checkpoint's model param `name`, flattened to float (empty where it holds none).
std::vector<float> saved_param_values(const model::TorchDistCheckpoint& c,
                                      const std::string& name) {
  const Value* v = c.sharded.dict()->find(name);
  if (v == nullptr || !v->is_tensor()) return {};
  const at::Tensor t = v->tensor().to(at::kFloat).contiguous().reshape({-1});
  return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
}

// Under TE's precision-aware FusedAdam the saved 'param' of a bf16 param is its fp32
// master_param, or with remainders its int16 remainder, whose master is reassembled with the
// checkpoint's bf16 param; that of an fp32 param is a master_param TE never updates (the step
// updates the param itself), so it is no master and is not compared (NaN).
void precision_aware_masters(const sim::Scenario& s, const model::TorchDistCheckpoint& c,
                             std::vector<std::vector<float>>& masters) {
  const model::OptimizerConfig& o = s.optimizer;
  if (!o.te_precision_aware()) return;
  for (size_t q = 0; q < masters.size() && q < s.params.size(); ++q) {
    if (s.params[q].dtype != model::DType::kBFloat16) {
      std::fill(masters[q].begin(), masters[q].end(), std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    if (!o.store_param_remainders) continue;
    const std::vector<float> bf16 = saved_param_values(c, s.params[q].name);
    for (size_t e = 0; e < masters[q].size(); ++e) {
      if (std::isnan(masters[q][e])) continue;
      masters[q][e] = e < bf16.size() ? sim::master_from_remainder(bf16[e], masters[q][e])
                                      : std::numeric_limits<float>::quiet_NaN();
    }
  }
}

// The loaded master, exp_avg and exp_avg_sq against the checkpoint's, element by element of
// each param, in either format: the checkpoint's tensors are placed at their params by the
// resuming run's layouts (dp_reshardable buckets) or by name (model space). An element the
// checkpoint does not hold (NaN where no key covers it) is not compared; one it holds and the
// load left unwritten (NaN in after_load) counts as unequal.
void compare_tensors(const sim::PhaseRecord& rec, const sim::Scenario& s,
                     const model::TorchDistCheckpoint& c, ResumeJudgement& out) {
  if (!rec.after_load) return;
  const sim::GlobalState& st = *rec.after_load;
  auto saved = sim::saved_state_by_param(s, optimizer_tensors(c), rec);
  if (const auto masters = saved.find("param"); masters != saved.end())
    precision_aware_masters(s, c, masters->second);
  for (const auto& [state, loaded] :
       {std::pair{"param", &st.master}, {"exp_avg", &st.exp_avg}, {"exp_avg_sq", &st.exp_avg_sq}}) {
    const auto it = saved.find(state);
    if (it == saved.end()) continue;
    for (size_t i = 0; i < it->second.size(); ++i) {
      const std::vector<float>& want = it->second[i];
      for (size_t e = 0; e < want.size(); ++e) {
        if (std::isnan(want[e])) continue;
        ++out.elements_compared;
        if (i < loaded->size() && e < (*loaded)[i].size() && same_bits((*loaded)[i][e], want[e])) {
          ++out.elements_equal;
        }
      }
    }
  }
}

}  // namespace

std::string check_outcome_name(CheckOutcome o) {
  switch (o) {
    case CheckOutcome::kHolds:
      return "holds";
    case CheckOutcome::kFails:
      return "FAILS";
    case CheckOutcome::kNotApplicable:
      return "n/a";
  }
  return "?";
}

std::optional<double> saved_group_step(const model::TorchDistCheckpoint& c) {
  std::set<double> steps;
  for (int64_t part = 0; part < model::chained_parts(c); ++part) {
    const model::List* groups = groups_of(c, part);
    if (groups == nullptr) return std::nullopt;
    for (const Value& g : *groups) {
      const Value* s = g.is_dict() ? g.dict()->find("step") : nullptr;
      if (s == nullptr) continue;
      if (auto v = as_step(*s)) steps.insert(*v);
    }
  }
  return steps.size() == 1 ? std::optional<double>(*steps.begin()) : std::nullopt;
}

namespace {

// per_bucket_numel_unpadded[gbuf_idx][dtype][bucket_idx] of the bucket's DP group (its part's
// prefix before the object's key), or -1.
int64_t unpadded_numel(const model::TorchDistCheckpoint& c, const model::DpReshardableBucket& b) {
  const model::OptimizerBucketKey& k = b.key;
  const Value* unpadded = c.sharded.dict()->find(bucket_object_key(b, "per_bucket_numel_unpadded"));
  if (unpadded == nullptr || !unpadded->is_list() ||
      unpadded->list()->size() <= size_t(k.gbuf_idx) ||
      !unpadded->list()->at(k.gbuf_idx).is_dict()) {
    return -1;
  }
  int64_t want = -1;
  for (const auto& [dt, numels] : *unpadded->list()->at(k.gbuf_idx).dict()) {
    if (dt.repr() == k.dtype && numels.is_list() && numels.list()->size() > size_t(k.bucket_idx) &&
        numels.list()->at(k.bucket_idx).is_int()) {
      want = numels.list()->at(k.bucket_idx).as_int();
    }
  }
  return want;
}

// Whether the chunks of one bucket state tile [0, numel) once; what is wrong goes to `problems`.
void check_tiling(const std::string& fqn, const model::TensorStorageMetadata& meta, size_t& chunks,
                  std::vector<std::string>& problems) {
  const int64_t numel = meta.size[0];
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& ch : meta.chunks) {
    if (ch.offsets.size() != 1 || ch.sizes.size() != 1) continue;
    spans.emplace_back(ch.offsets[0], ch.offsets[0] + ch.sizes[0]);
    ++chunks;
  }
  std::sort(spans.begin(), spans.end());
  int64_t at = 0;
  for (const auto& [b, e] : spans) {
    if (b > at) problems.push_back(fmt::format("{}: no chunk covers [{}, {})", fqn, at, b));
    if (b < at)
      problems.push_back(fmt::format("{}: chunks overlap on [{}, {})", fqn, b, std::min(at, e)));
    at = std::max(at, e);
  }
  if (at < numel) problems.push_back(fmt::format("{}: no chunk covers [{}, {})", fqn, at, numel));
  if (at > numel)
    problems.push_back(fmt::format("{}: a chunk reaches {}, past {}", fqn, at, numel));
}

}  // namespace

CheckpointCheck check_shards_tile_buckets(const model::DcpMetadata& metadata,
                                          const model::TorchDistCheckpoint* checkpoint) {
  CheckpointCheck out{"shards_tile_buckets", "", CheckOutcome::kHolds, "", {}};
  size_t tensors = 0;
  size_t chunks = 0;
  std::map<int64_t, size_t> tensors_by_part;  // a chain's: 'chained_<i>.' -> its states
  std::vector<std::string> problems;
  for (const auto& [fqn, meta] : metadata.tensors) {
    // A bucket key, with its part's 'chained_<i>.' in a chain of several.
    const model::ChainedKey chained = model::parse_chained_key(fqn);
    const auto key = model::parse_bucket_key(chained.rest);
    if (!key) continue;
    ++tensors;
    if (chained.part) ++tensors_by_part[*chained.part];
    if (meta.size.size() != 1) {
      problems.push_back(
          fmt::format("{}: {}-dimensional, a bucket state is 1-D", fqn, meta.size.size()));
      continue;
    }
    check_tiling(fqn, meta, chunks, problems);
    if (checkpoint == nullptr) continue;
    model::DpReshardableBucket b;
    b.key = *key;
    b.key.state.clear();
    b.chained_part = chained.part;
    if (const int64_t want = unpadded_numel(*checkpoint, b); want != meta.size[0]) {
      problems.push_back(fmt::format("{}: {} elements where {} says {}", fqn, meta.size[0],
                                     bucket_object_key(b, "per_bucket_numel_unpadded"), want));
    }
  }
  if (tensors == 0) {
    out.outcome = CheckOutcome::kNotApplicable;
    out.detail = "no dp_reshardable bucket state in the checkpoint";
    return out;
  }
  if (!problems.empty()) {
    out.outcome = CheckOutcome::kFails;
    out.detail = problems.front();
    for (size_t i = 1; i < problems.size() && i < 6; ++i) out.lines.push_back(problems[i]);
    return out;
  }
  std::vector<std::string> parts;
  for (const auto& [part, n] : tensors_by_part)
    parts.push_back(fmt::format("chained_{}. {}", part, n));
  out.detail =
      fmt::format("{} bucket state tensors{}, {} chunks: each tiles [0, numel_unpadded) once",
                  tensors, parts.empty() ? "" : " (" + join(parts, ", ") + ")", chunks);
  return out;
}

namespace {

CheckpointCheck not_readable(const std::string& name) {
  return {name, "", CheckOutcome::kNotApplicable, "the checkpoint's files could not be read", {}};
}

}  // namespace

CheckpointCheck check_shards_tile_buckets_of(const CheckpointInput& in) {
  return check_shards_tile_buckets(in.metadata, in.checkpoint);
}

CheckpointCheck check_step_counters_agree(const CheckpointInput& in) {
  return in.checkpoint ? check_steps(*in.checkpoint) : not_readable("step_counters_agree");
}

CheckpointCheck check_common_state_not_wrapped(const CheckpointInput& in) {
  return in.checkpoint ? check_wrapped(*in.checkpoint, in.revisions)
                       : not_readable("common_state_not_wrapped");
}

CheckpointCheck check_common_state_rank_independent(const CheckpointInput& in) {
  return in.checkpoint ? check_rank_independent(*in.checkpoint)
                       : not_readable("common_state_rank_independent");
}

std::vector<CheckpointCheck> check_checkpoint(const CheckpointInput& in) {
  std::vector<CheckpointCheck> out;
  for (const auto& p : all_properties()) {
    if (!p.checkpoint_check) continue;
    out.push_back(p.checkpoint_check(in));
    out.back().property = p.name;
  }
  return out;
}

ResumeJudgement judge_resume(const sim::PhaseRecord& rec, const sim::Scenario& scenario,
                             const model::TorchDistCheckpoint& c, double saved_step) {
  ResumeJudgement out;
  out.revision = rec.spec.profile ? rec.spec.profile->name : rec.spec.revision;
  out.dp = rec.spec.dp;
  for (const auto& e : rec.errors) {
    if (e.secondary) continue;
    if (!out.error) out.error = e;
    out.errors.push_back(e);
  }
  if (!out.error && !rec.errors.empty()) out.error = rec.errors.front();
  out.loaded = rec.after_load.has_value() && !(out.error && out.error->stage == "load") &&
               !(out.error && out.error->stage == "init");
  out.uncovered = rec.load_uncovered;
  out.expected_first_t = static_cast<int64_t>(saved_step) + 1;
  if (rec.after_load) {
    std::map<std::string, std::map<double, std::vector<std::string>>> parts;
    for (const auto& sh : rec.after_load->shards) {
      if (!sh.counter) continue;
      out.counters_after_load[sim::part_name(sh.part)].insert(*sh.counter);
      parts[sim::part_name(sh.part)][*sh.counter].push_back(
          fmt::format("{}[{}:{}]", scenario.params[sh.param].name, sh.range.start, sh.range.end));
    }
    for (const auto& [part, by_counter] : parts) {
      for (const auto& [counter, where] : by_counter) {
        out.resumed_at.push_back(
            fmt::format("{}: {} ({})", part, number_text(counter), join(where, ", ")));
      }
    }
  }
  bool right = !rec.after_step.empty();
  for (size_t k = 0; k < rec.after_step.size(); ++k) {
    std::map<std::string, std::set<double>> used;
    const double want = saved_step + static_cast<double>(k) + 1;
    for (const auto& sh : rec.after_step[k].shards) {
      if (!sh.step_used) continue;
      used[sim::part_name(sh.part)].insert(*sh.step_used);
      if (*sh.step_used == want) continue;
      right = false;
      if (out.first_wrong_step.empty()) {
        out.first_wrong_step =
            fmt::format("step {}: {} t={} where t={} is right", rec.after_step[k].global_step,
                        sim::part_name(sh.part), number_text(*sh.step_used), number_text(want));
      }
    }
    std::vector<std::string> parts;
    for (const auto& [part, ts] : used) {
      std::vector<std::string> t;
      for (double v : ts) t.push_back(number_text(v));
      parts.push_back(part + " t=" + join(t, ","));
    }
    out.steps_used.push_back(fmt::format("step {}: {} (right: t={})", rec.after_step[k].global_step,
                                         join(parts, "; "), number_text(want)));
  }
  out.bias_correction_right = right && !out.error;
  compare_tensors(rec, scenario, c, out);
  return out;
}

namespace {

std::string error_line(int rank, const std::string& type, std::string site,
                       const std::vector<std::string>& path) {
  // A real site is "megatron/core/.../dict_utils.py merge()" or the file's name alone.
  const size_t space = site.find(' ');
  const size_t slash = site.rfind('/', space);
  if (slash != std::string::npos) site = site.substr(slash + 1);
  return fmt::format("rank {} {} [{}] ({})", rank, type, site, join(path, ", "));
}

}  // namespace

std::string ResumeOutcome::text() const {
  std::vector<std::string> items(errors.begin(), errors.end());
  for (const auto& [part, counters] : after_load) {
    std::vector<std::string> c;
    for (double v : counters) c.push_back(number_text(v));
    items.push_back(part + " resumes at " + join(c, ","));
  }
  return items.empty() ? "(nothing)" : join(items, "; ");
}

ResumeOutcome resume_outcome(const ResumeJudgement& j) {
  ResumeOutcome out;
  for (const auto& e : j.errors) {
    std::vector<std::string> path;
    for (const auto& k : e.merge_path) path.push_back(k.repr());
    out.errors.insert(error_line(e.rank, e.py_type, e.site, path));
  }
  out.after_load = j.counters_after_load;
  return out;
}

ResumeOutcome resume_outcome(const nlohmann::json& run) {
  ResumeOutcome out;
  for (const auto& e : run.value("events", nlohmann::json::array())) {
    if (e.value("at", "") == "error" && !e.value("secondary", false)) {
      std::vector<std::string> path;
      if (e.contains("merge_path") && e["merge_path"].is_array()) {
        for (const auto& k : e["merge_path"])
          path.push_back(k.is_string() ? k.get<std::string>() : k.dump());
      }
      out.errors.insert(
          error_line(e.value("rank", -1), e.value("py_type", ""), e.value("site", ""), path));
    }
    if (e.value("at", "") != "after_load") continue;
    for (const auto& p : e.value("parts", nlohmann::json::array())) {
      if (p.contains("step") && p["step"].is_number()) {
        out.after_load[p.value("part", "")].insert(p["step"].get<double>());
      }
    }
  }
  return out;
}

}  // namespace ckptsim::properties
