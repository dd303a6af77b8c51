#include "report/trace_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "model/revision.h"
#include "sim/gradients.h"

namespace ckptsim::report {

namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// plan

json switches_json(const model::RevisionSwitches& switches) {
  json out = json::object();
  for (const auto& info : model::revision_switch_infos()) {
    const std::string v = model::switch_value_text(switches, info.name);
    out[info.name] = v == "true" ? json(true) : v == "false" ? json(false) : json(v);
  }
  return out;
}

// Every DP rank's local gradient at global steps first + 1 .. first + steps, one entry per step.
json plan_grads(const sim::Scenario& s, int64_t dp, int64_t first, int64_t steps) {
  json grads = json::array();
  const sim::GradientSpec spec{s.seed, s.samples_per_step};
  const float scale = 1.0F / static_cast<float>(s.samples_per_step);
  std::vector<float> local(static_cast<size_t>(s.total_numel()));
  for (int64_t k = 0; k < steps; ++k) {
    json ranks = json::array();
    for (int64_t rank = 0; rank < dp; ++rank) {
      size_t at = 0;
      for (size_t p = 0; p < s.params.size(); ++p) {
        const auto n = static_cast<size_t>(s.params[p].numel);
        std::span<float> out(local.data() + at, n);
        // An expert param's: its EP group's tokens (sim/gradients.h expert_local_gradient; EP is
        // the same in every phase).
        if (s.params[p].expert) {
          sim::expert_local_gradient(spec, first + k + 1, static_cast<int64_t>(p), 0, rank, dp,
                                     s.phases.front().ep, out);
        } else {
          sim::local_gradient(spec, first + k + 1, static_cast<int64_t>(p), 0, rank, dp, out);
        }
        for (float& x : out) x *= scale;  // as the simulator does: a power of two, exact
        at += n;
      }
      ranks.push_back(base64_f32(local));
    }
    grads.push_back(std::move(ranks));
  }
  return grads;
}

// One run of the plan: its identity and every rank's local gradient at every step.
json plan_run(const sim::Scenario& s, const std::string& id, int64_t dp,
              const model::RevisionProfile& profile, int64_t start_step, int64_t steps) {
  return {{"id", id},
          {"dp", dp},
          {"revision", profile.name},
          {"start_step", start_step},
          {"steps", steps},
          {"grads", plan_grads(s, dp, start_step, steps)}};
}

// ---------------------------------------------------------------------------------------------
// trace

std::string part_of(const sim::ShardRecord& s) { return sim::part_name(s.part); }

std::span<const float> slice(const std::vector<float>& v, const model::Range& r) {
  return std::span<const float>(v).subspan(static_cast<size_t>(r.start),
                                           static_cast<size_t>(r.size()));
}

// The event's hashes that rest on uninitialized memory (sim::Uninitialized): per kind, the
// params whose hashed values hold a marked element (this rank's shard `range`; the whole param
// for model_param), in model order. Empty (the field is left out) when none does.
json uninitialized_json(const sim::RunResult& run, const sim::GlobalState& st,
                        const std::vector<const sim::ShardRecord*>& shards) {
  const sim::Uninitialized& u = st.uninitialized;
  json out = json::object();
  if (!u.any()) return out;
  auto add = [&](const char* kind, size_t p) {
    json& names = out[kind];
    const std::string& name = run.scenario.params[p].name;
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  };
  const std::vector<std::pair<const char*, const sim::Uninitialized::Field*>> fields = {
      {"master", &u.master}, {"exp_avg", &u.exp_avg}, {"exp_avg_sq", &u.exp_avg_sq}};
  for (const auto& [kind, field] : fields) {
    for (const auto* s : shards) {
      if (sim::Uninitialized::any_in(*field, s->param, s->range.start, s->range.end))
        add(kind, s->param);
    }
  }
  for (size_t p = 0; p < st.param.size(); ++p) {
    if (sim::Uninitialized::any_in(u.param, p, 0, static_cast<int64_t>(st.param[p].size())))
      add("model_param", p);
  }
  return out;
}

// A shard a rank holds: its record, and the replica's own values where a TP replica's differ
// from the main copy (GlobalState::Replica), else null (the main copy's values at its range).
struct HeldShard {
  const sim::ShardRecord* record;
  const std::array<std::vector<float>, 3>* own;
};

// The parts of one rank's shards, and their states' hashes (and values) into `hashes` (`vals`).
// A row-split TP piece's shard is one record per row: its values are hashed as the rank holds
// them, the rows concatenated in order.
json shard_states(const sim::RunResult& run, const sim::GlobalState& st,
                  const std::vector<HeldShard>& held, bool stepped, bool values, json& hashes,
                  json& vals) {
  json parts = json::array();
  std::map<std::string, std::map<std::string, std::vector<float>>> joined;  // kind -> param
  std::map<std::string, std::map<std::string, bool>> present;
  for (const auto& [s, own] : held) {
    const std::string& name = run.scenario.params[s->param].name;
    parts.push_back({{"part", part_of(*s)},
                     {"kernel", sim::kernel_name(s->kernel)},
                     {"param", name},
                     {"range", {s->range.start, s->range.end}},
                     {"step", s->counter ? json(*s->counter) : json(nullptr)},
                     {"step_used", stepped && s->step_used ? json(*s->step_used) : json(nullptr)},
                     {"step_aliases", s->step_aliases}});
    if (s->chain) parts.back()["chain"] = *s->chain;
    if (!s->state_dtypes.empty()) {
      json dtypes = json::object();
      for (const auto& [state, dtype] : s->state_dtypes) dtypes[state] = dtype;
      parts.back()["state_dtypes"] = std::move(dtypes);
    }
    const bool moments = st.moments_present[s->param][static_cast<size_t>(s->range.start)] != 0;
    auto put = [&](const char* kind, const std::vector<float>& v, size_t field, bool has) {
      const auto part = own != nullptr ? std::span<const float>((*own)[field]) : slice(v, s->range);
      std::vector<float>& all = joined[kind][name];
      all.insert(all.end(), part.begin(), part.end());
      present[kind].try_emplace(name, has);
    };
    put("master", st.master[s->param], 0, true);
    put("exp_avg", st.exp_avg[s->param], 1, moments);
    put("exp_avg_sq", st.exp_avg_sq[s->param], 2, moments);
  }
  for (const auto& [kind, by_param] : joined) {
    for (const auto& [name, v] : by_param) {
      const bool has = present[kind][name];
      hashes[kind][name] = has ? json(hash_f32(v)) : json(nullptr);
      if (values) vals[kind][name] = has ? json(base64_f32(v)) : json(nullptr);
    }
  }
  return parts;
}

// The model params as rank `rank` of a job of `spec`'s sizes holds them, by name: every param
// whole where TP = PP = 1, except an expert param, which is the rank's EP piece (its EP rank's
// rows: expert_split_spec seen from expert_view()); else its pipeline stage's params, each its
// TP piece (the elements in the order the piece holds them), as the real runner hashes what its
// module holds (replay/PLAN_AND_TRACE.md `model_param`).
std::vector<std::pair<std::string, std::vector<float>>> held_params(const sim::RunResult& run,
                                                                    const sim::PhaseSpec& spec,
                                                                    const sim::GlobalState& st,
                                                                    int rank) {
  const auto& params = st.params_of(rank);
  const auto& specs = run.scenario.params;
  std::vector<std::pair<std::string, std::vector<float>>> out;
  if (spec.tp == 1 && spec.pp == 1) {
    const auto mp = model::ModelParallelRank::of(rank, 1, 1, spec.dp, spec.ep).expert_view();
    for (size_t p = 0; p < params.size(); ++p) {
      if (!specs[p].expert) {
        out.emplace_back(specs[p].name, params[p]);
        continue;
      }
      std::vector<float> piece;
      for (const auto& [begin, length] :
           model::tp_element_runs(model::expert_split_spec(specs[p]), mp))
        piece.insert(piece.end(), params[p].begin() + begin, params[p].begin() + begin + length);
      out.emplace_back(specs[p].name, std::move(piece));
    }
    return out;
  }
  const auto mp = model::ModelParallelRank::of(rank, spec.tp, spec.pp, spec.dp);
  for (const size_t p : model::params_of_stage(specs, mp)) {
    std::vector<float> piece;
    for (const auto& [begin, length] : model::tp_element_runs(specs[p], mp))
      piece.insert(piece.end(), params[p].begin() + begin, params[p].begin() + begin + length);
    out.emplace_back(specs[p].name, std::move(piece));
  }
  return out;
}

// One rank's state at one point, from the gathered state.
json state_event(const sim::RunResult& run, const sim::PhaseSpec& spec, const sim::GlobalState& st,
                 int rank, const char* at, bool values) {
  std::vector<const sim::ShardRecord*> shards;
  std::vector<HeldShard> held;
  for (const auto& s : st.shards) {
    if (s.rank == rank) held.push_back({&s, nullptr});
  }
  for (const auto& r : st.replicas) {  // a TP rank > 0's copies of replicated params
    if (r.record.rank == rank) held.push_back({&r.record, r.own ? &*r.own : nullptr});
  }
  std::stable_sort(held.begin(), held.end(), [](const HeldShard& a, const HeldShard& b) {
    return a.record->param < b.record->param;
  });
  for (const HeldShard& h : held) shards.push_back(h.record);
  json hashes{{"master", json::object()},
              {"exp_avg", json::object()},
              {"exp_avg_sq", json::object()},
              {"model_param", json::object()}};
  json vals = hashes;
  const bool stepped = std::string(at) == "after_step";
  json parts = shard_states(run, st, held, stepped, values, hashes, vals);
  for (const auto& [name, v] : held_params(run, spec, st, rank)) {
    hashes["model_param"][name] = hash_f32(v);
    if (values) vals["model_param"][name] = base64_f32(v);
  }
  json ev{{"rank", rank},
          {"at", at},
          {"global_step", st.global_step},
          {"parts", parts},
          {"hashes", hashes}};
  if (values) ev["values"] = vals;
  if (json u = uninitialized_json(run, st, shards); !u.empty()) ev["uninitialized"] = u;
  const std::vector<sim::GroupHyper>& hypers = st.hypers_of(rank);
  if (stepped && !hypers.empty()) {
    // The lr and weight decay every param group of the rank held when this step ran.
    json groups = json::array();
    for (const sim::GroupHyper& h : hypers) {
      groups.push_back({{"wd_mult", h.wd_mult},
                        {"lr_mult", h.lr_mult},
                        {"lr", h.lr},
                        {"weight_decay", h.weight_decay}});
    }
    ev["groups"] = groups;
  }
  return ev;
}

json error_event(const sim::RankError& e, int64_t global_step) {
  json path = nullptr;
  json kind = nullptr;
  if (e.merge_kind.has_value()) {
    path = json::array();
    for (const auto& k : e.merge_path) path.push_back(k.repr());
    kind = *e.merge_kind == model::MergeError::Kind::kDuplicateLeaf ? "duplicate_leaf"
                                                                    : "list_length_mismatch";
  }
  return {{"rank", e.rank},           {"at", "error"},
          {"stage", e.stage},         {"py_type", e.py_type},
          {"message", e.message},     {"site", e.site},
          {"merge_path", path},       {"merge_kind", kind},
          {"secondary", e.secondary}, {"global_step", global_step}};
}

// Whether a rank that raised `e` still reached the state point `at` (at global step `step`):
// its sequence ends with the error, as the runner records it. An error at init or at the load
// comes before the run's first state, one at save after its last step; one in training after
// the steps it completed.
bool reached(const sim::RankError* e, const std::string& at, int64_t step, int64_t error_step) {
  if (e == nullptr) return true;
  if (e->stage == "init" || e->stage == "load") return false;
  if (e->stage == "save") return at != "at_save";
  return at != "at_save" && (at != "after_step" || step <= error_step);
}

// A run's events in trace order: each rank's states point by point, up to its error, then the
// errors.
json run_events(const sim::RunResult& run, const sim::PhaseSpec& spec,
                const std::vector<std::pair<const char*, const sim::GlobalState*>>& points,
                const std::vector<sim::RankError>& errors, int64_t last_step, bool values) {
  json events = json::array();
  for (const auto& [at, st] : points) {
    for (int rank = 0; rank < spec.world(); ++rank) {
      const sim::RankError* e = nullptr;
      for (const auto& x : errors) {
        if (x.rank == rank && e == nullptr) e = &x;
      }
      if (!reached(e, at, st->global_step, last_step)) continue;
      events.push_back(state_event(run, spec, *st, rank, at, values));
    }
  }
  std::vector<sim::RankError> sorted = errors;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.rank < b.rank; });
  for (const auto& e : sorted) events.push_back(error_event(e, last_step));
  return events;
}

// A run's TP and PP sizes, where they are not 1 (traces of DP-only runs keep their fields).
void put_model_parallel(const sim::PhaseSpec& spec, json& run) {
  if (spec.tp != 1) run["tp"] = spec.tp;
  if (spec.pp != 1) run["pp"] = spec.pp;
}

json reference_run(const sim::RunResult& run, bool values) {
  const sim::Scenario& s = run.scenario;
  std::vector<std::pair<const char*, const sim::GlobalState*>> points = {
      {"init", &run.reference_initial}};
  for (const auto& st : run.reference) points.emplace_back("after_step", &st);
  const int64_t last = run.reference.empty() ? 0 : run.reference.back().global_step;
  json out = {
      {"id", "reference"},
      {"dp", s.phases.front().dp},
      {"revision", s.phases.front().profile->name},
      {"start_step", 0},
      {"steps", s.total_steps()},
      {"load", false},
      {"save", false},
      {"status", run.reference_errors.empty() ? "completed" : "failed"},
      {"events", run_events(run, s.phases.front(), points, run.reference_errors, last, values)}};
  put_model_parallel(s.phases.front(), out);
  return out;
}

// One rank's after_load `unwritten`: its load's unwritten ranges, sorted by key and range.
json unwritten_json(const std::vector<model::UnwrittenRange>& ranges) {
  std::vector<const model::UnwrittenRange*> sorted;
  for (const auto& u : ranges) sorted.push_back(&u);
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) {
    return std::tie(a->key, a->global_offset, a->numel) <
           std::tie(b->key, b->global_offset, b->numel);
  });
  json out = json::array();
  for (const auto* u : sorted) {
    out.push_back({{"key", u->key},
                   {"range", {u->global_offset, u->global_offset + u->numel}},
                   {"missing_key", u->missing_key}});
  }
  return out;
}

json phase_run(const sim::RunResult& run, const sim::PhaseRecord& p, bool values) {
  json out{{"id", fmt::format("phase{}", p.index)},
           {"phase", p.index},
           {"dp", p.spec.dp},
           {"revision", p.spec.profile->name},
           {"start_step", p.start_step},
           {"steps", p.spec.steps},
           {"load", p.index > 0 && !p.started_fresh},
           {"save", p.spec.save}};
  // The phase whose save it loaded (after a crash, not always the one before it).
  if (p.index > 0 && !p.started_fresh) {
    out["load_from"] = fmt::format("phase{}", p.loaded_phase.value_or(p.index - 1));
  }
  if (!p.storage_faults_fired.empty()) out["storage_faults"] = p.storage_faults_fired;
  if (p.crashed) out["crashed"] = true;
  put_model_parallel(p.spec, out);
  if (!p.ran) {
    out["status"] = "skipped";
    out["skipped_reason"] = "the checkpoint to resume from does not exist";
    out["events"] = json::array();
    return out;
  }
  std::vector<std::pair<const char*, const sim::GlobalState*>> points;
  if (p.index == 0 && p.initial) points.emplace_back("init", &*p.initial);
  if (p.after_load) points.emplace_back("after_load", &*p.after_load);
  if (p.after_load_partial) points.emplace_back("after_load", &*p.after_load_partial);
  for (const auto& st : p.after_step) points.emplace_back("after_step", &st);
  if (p.at_save) points.emplace_back("at_save", &*p.at_save);
  const sim::GlobalState* last = p.final_state();
  out["status"] = p.errors.empty() ? "completed" : "failed";
  out["events"] =
      run_events(run, p.spec, points, p.errors, last ? last->global_step : p.start_step, values);
  for (json& ev : out["events"]) {
    const auto rank = ev["rank"].get<size_t>();
    if (ev["at"] == "after_load" && rank < p.load_unwritten.size())
      ev["unwritten"] = unwritten_json(p.load_unwritten[rank]);
  }
  return out;
}

}  // namespace

json replay_plan_json(const sim::Scenario& s) {
  json scenario = sim::scenario_to_json(s);
  scenario.erase("expect");
  scenario["name"] = s.name;
  json revisions = json::object();
  for (size_t i = 0; i < s.phases.size(); ++i) {
    const model::RevisionProfile& profile = *s.phases[i].profile;
    scenario["phases"][i]["revision"] = profile.name;
    json up = nullptr;
    if (profile.upstream)
      up = {{"repo", profile.upstream->repo}, {"commit", profile.upstream->commit}};
    revisions[profile.name] = {{"upstream", up},
                               {"switches", switches_json(profile.switches)},
                               {"description", profile.description}};
  }
  json initial = json::object();
  for (size_t p = 0; p < s.params.size(); ++p) {
    std::vector<float> v(static_cast<size_t>(s.params[p].numel));
    for (size_t e = 0; e < v.size(); ++e)
      v[e] = sim::initial_param_value(s.seed, p, static_cast<int64_t>(e));
    initial[s.params[p].name] = base64_f32(v);
  }
  json runs = json::array();
  json reference =
      plan_run(s, "reference", s.phases.front().dp, *s.phases.front().profile, 0, s.total_steps());
  reference["load"] = false;
  reference["save"] = false;
  put_model_parallel(s.phases.front(), reference);
  runs.push_back(std::move(reference));
  int64_t start = 0;
  for (size_t i = 0; i < s.phases.size(); ++i) {
    const sim::PhaseSpec& ph = s.phases[i];
    json run = plan_run(s, fmt::format("phase{}", i), ph.dp, *ph.profile, start, ph.steps);
    run["phase"] = i;
    run["load"] = i > 0;
    run["save"] = ph.save;
    put_model_parallel(ph, run);
    // After a storage fault a phase may resume from an earlier iteration or start from random:
    // its gradients at every global step before its planned start too.
    if (s.has_storage_faults() && start > 0) run["grads_before"] = plan_grads(s, ph.dp, 0, start);
    runs.push_back(std::move(run));
    start += ph.steps;
  }
  return {{"format", "ckptsim-replay-plan"},
          {"version", 1},
          {"generator", {{"tool", "ckptsim replay-plan"}, {"synthetic", false}}},
          {"scenario", scenario},
          {"revisions", revisions},
          {"initial_params", initial},
          {"runs", runs}};
}

json trace_json(const sim::RunResult& run, bool values) {
  json runs = json::array();
  runs.push_back(reference_run(run, values));
  for (const auto& p : run.phases) runs.push_back(phase_run(run, p, values));
  return {{"format", "ckptsim-trace"},
          {"version", 1},
          {"source", "model"},
          {"megatron", nullptr},
          {"setup",
           {{"backend", "in-process"},
            {"gpus", run.gpu_resident ? 1 : 0},
            {"coalescing_workaround", false},
            {"te", "modeled"},
            // Whether the modeled environment has TE, as a real trace says of its machine; a real
            // run must match it: Megatron takes other branches without TE (and torch_adamw is
            // its optimizer only without TE).
            {"transformer_engine",
             run.scenario.optimizer.te_installed &&
                 run.scenario.optimizer.kind != model::OptimizerKind::kTorchAdamW},
            {"fused_adam_standin", false},
            {"torch", "libtorch (the model's tensor library)"},
            {"hash", "fnv1a64-f32le"},
            {"adaptations", json::array()}}},
          {"scenario", run.scenario.name},
          {"tool", {{"name", "ckptsim"}, {"trace_hash", fmt::format("{:016x}", run.trace_hash)}}},
          {"runs", runs}};
}

}  // namespace ckptsim::report
