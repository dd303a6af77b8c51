#include "sim/record.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>

#include "model/fnv1a.h"
#include "model/megatron/mapping.h"
#include "model/megatron/optimizer_key.h"
#include "model/py/host_tensor.h"
#include "model/py/pickle_codec.h"

namespace ckptsim::sim {

namespace {

using model::Value;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> tensor_floats(const at::Tensor& t) { return model::host::floats(t); }

// Whether two ranks' model params are the same bits (NaN payloads included).
bool bitwise_equal(const std::vector<std::vector<float>>& a,
                   const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() ||
        std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

// Appends the Python repr of a value as a checkpoint would give it back: pickling writes a symbol
// (a class object) as its name string, so symbols print as strings here.
void append_checkpoint_repr(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kSymbol:
      out += model::py_str_repr(v.as_symbol().name);
      return;
    case Value::Kind::kDict: {
      out += '{';
      bool first = true;
      for (const auto& [k, item] : *v.dict()) {
        if (!first) out += ", ";
        first = false;
        out += k.repr();
        out += ": ";
        append_checkpoint_repr(out, item);
      }
      out += '}';
      return;
    }
    case Value::Kind::kList: {
      out += '[';
      bool first = true;
      for (const auto& item : *v.list()) {
        if (!first) out += ", ";
        first = false;
        append_checkpoint_repr(out, item);
      }
      out += ']';
      return;
    }
    default:
      out += v.repr();
  }
}

// Rank 0's state_dict() param groups as a checkpoint would hold them (each part's, in order).
std::string groups_text(model::ChainedOptimizer& opt) {
  std::string out;
  for (size_t i = 0; i < opt.size(); ++i) {
    try {
      if (i > 0) out += "; ";
      append_checkpoint_repr(
          out, opt.part(i).state_dict().dict()->at("optimizer").dict()->at("param_groups"));
    } catch (const model::UpstreamError& e) {
      return std::string("<state_dict() raised ") + e.what() + ">";
    }
  }
  return out;
}

GlobalState empty_state(const Scenario& s, int64_t global_step) {
  GlobalState st;
  st.global_step = global_step;
  for (const auto& p : s.params) {
    const auto n = static_cast<size_t>(p.numel);
    st.master.emplace_back(n, kNaN);
    st.exp_avg.emplace_back(n, kNaN);
    st.exp_avg_sq.emplace_back(n, kNaN);
    st.moments_present.emplace_back(n, 0);
  }
  return st;
}

// Writes one rank's shard into the whole-model arrays.
void put_shard(GlobalState& st, const ShardSnapshot& shard) {
  const auto begin = static_cast<std::ptrdiff_t>(shard.param_range.start);
  const auto size = static_cast<size_t>(shard.param_range.size());
  auto put = [&](std::vector<float>& dst, const std::vector<float>& src) {
    // A state tensor of the wrong size (an upstream mix-up such as B8) leaves the elements
    // unreported (NaN), which the trajectory check reports as missing state.
    if (src.size() != size) return;
    std::copy(src.begin(), src.end(), dst.begin() + begin);
  };
  put(st.master[shard.model_param], shard.master);
  put(st.exp_avg[shard.model_param], shard.exp_avg);
  put(st.exp_avg_sq[shard.model_param], shard.exp_avg_sq);
  if (shard.exp_avg.size() == size) {
    std::fill_n(st.moments_present[shard.model_param].begin() + begin, size, uint8_t{1});
  }
}

}  // namespace

namespace {

// A shard of a TP piece as snapshots of the whole param: one per run of the piece it overlaps.
void globalize_shard(const model::DistributedDataParallel& ddp, ShardSnapshot shard,
                     std::vector<ShardSnapshot>& out) {
  const size_t local = shard.model_param;
  const model::ParamSpec& spec = ddp.global_spec(local);
  const model::Range range = shard.param_range;
  // The state vectors are sliced per run, not copied whole into every piece.
  const std::vector<float> master = std::move(shard.master);
  const std::vector<float> exp_avg = std::move(shard.exp_avg);
  const std::vector<float> exp_avg_sq = std::move(shard.exp_avg_sq);
  shard.master.clear();
  shard.exp_avg.clear();
  shard.exp_avg_sq.clear();
  auto part = [&](const std::vector<float>& v, int64_t from, int64_t n) {
    // A state of the wrong size stays as it is (gather_state leaves it unreported).
    if (static_cast<int64_t>(v.size()) != range.size()) return v;
    return std::vector<float>(v.begin() + from, v.begin() + from + n);
  };
  int64_t local_begin = 0;
  for (const auto& [global_begin, length] : model::tp_element_runs(spec, ddp.mp_of(local))) {
    const int64_t lo = std::max(local_begin, range.start);
    const int64_t hi = std::min(local_begin + length, range.end);
    if (lo < hi) {
      ShardSnapshot piece = shard;
      piece.model_param = ddp.global_param(local);
      piece.param_range = {global_begin + (lo - local_begin), global_begin + (hi - local_begin)};
      piece.master = part(master, lo - range.start, hi - lo);
      piece.exp_avg = part(exp_avg, lo - range.start, hi - lo);
      piece.exp_avg_sq = part(exp_avg_sq, lo - range.start, hi - lo);
      piece.kernel_offset = lo - range.start;
      piece.kernel_numel = range.size();
      piece.replica = model::tp_axis(spec) < 0 && ddp.mp_of(local).tp_rank > 0;
      out.push_back(std::move(piece));
    }
    local_begin += length;
  }
}

}  // namespace

RankState capture(model::ChainedOptimizer& opt, const model::DistributedDataParallel& ddp,
                  const std::vector<model::ParamSpec>& specs, int rank, bool with_groups) {
  RankState out;
  if (rank == 0 && with_groups) out.groups = groups_text(opt);
  if (ddp.mp() == model::ModelParallelRank{}) {
    out.shards = snapshot(opt);
    for (size_t i = 0; i < ddp.num_params(); ++i) out.params.push_back(tensor_floats(ddp.param(i)));
    return out;
  }
  for (ShardSnapshot& shard : snapshot(opt)) globalize_shard(ddp, std::move(shard), out.shards);
  for (const model::ParamSpec& p : specs) {
    out.params.emplace_back(static_cast<size_t>(p.numel), kNaN);
    out.params_held.emplace_back(static_cast<size_t>(p.numel), uint8_t{0});
  }
  for (size_t i = 0; i < ddp.num_params(); ++i) {
    const std::vector<float> values = tensor_floats(ddp.param(i));
    const size_t g = ddp.global_param(i);
    int64_t local = 0;
    for (const auto& [global_begin, length] :
         model::tp_element_runs(ddp.global_spec(i), ddp.mp_of(i))) {
      std::copy_n(values.begin() + local, length, out.params[g].begin() + global_begin);
      std::fill_n(out.params_held[g].begin() + global_begin, length, uint8_t{1});
      local += length;
    }
  }
  return out;
}

void globalize_uses(const model::DistributedDataParallel& ddp, std::vector<StepUse>& uses) {
  if (ddp.mp() == model::ModelParallelRank{}) return;
  for (StepUse& u : uses) u.model_param = ddp.global_param(u.model_param);
}

uint64_t rank_state_hash(const RankState& state, int rank) {
  uint64_t h = fnv1a(nullptr, 0);
  for (const auto& s : state.shards) {
    h = fnv1a(&s.model_param, sizeof s.model_param, h);
    h = fnv1a_floats(s.master, h);
    h = fnv1a_floats(s.exp_avg, h);
    h = fnv1a_floats(s.exp_avg_sq, h);
    const double step = s.step.value_or(-1.0);
    h = fnv1a(&step, sizeof step, h);
  }
  if (rank == 0) {
    for (const auto& p : state.params) h = fnv1a_floats(p, h);
  }
  return h;
}

namespace {

// The model params of ranks that each hold part of them (TP pieces, pipeline stages): every
// element from the lowest rank that holds it; a rank whose own elements differ from those gets
// its view in param_on_rank (the whole model with its elements in place).
void gather_params_of_pieces(const std::vector<const RankState*>& ranks, GlobalState& st) {
  const RankState* first = nullptr;
  for (const RankState* r : ranks) {
    if (r != nullptr && first == nullptr) first = r;
  }
  st.param.clear();
  std::vector<std::vector<uint8_t>> filled;
  for (const auto& p : first->params) {
    st.param.emplace_back(p.size(), kNaN);
    filled.emplace_back(p.size(), uint8_t{0});
  }
  for (const RankState* r : ranks) {
    if (r == nullptr) continue;
    for (size_t p = 0; p < r->params.size(); ++p) {
      for (size_t e = 0; e < r->params[p].size(); ++e) {
        if (r->params_held[p][e] == 0 || filled[p][e] != 0) continue;
        st.param[p][e] = r->params[p][e];
        filled[p][e] = 1;
      }
    }
  }
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    const RankState* r = ranks[rank];
    if (r == nullptr) continue;
    std::optional<std::vector<std::vector<float>>> own;
    for (size_t p = 0; p < r->params.size(); ++p) {
      for (size_t e = 0; e < r->params[p].size(); ++e) {
        if (r->params_held[p][e] == 0 ||
            std::bit_cast<uint32_t>(r->params[p][e]) == std::bit_cast<uint32_t>(st.param[p][e]))
          continue;
        if (!own) own = st.param;
        (*own)[p][e] = r->params[p][e];
      }
    }
    if (own) st.param_on_rank.emplace(static_cast<int>(rank), std::move(*own));
  }
}

// A TP replica's shard against the main copy gathered into `st` (TP rank 0's): the first
// difference into st.replica_differences. Whether any value differs.
bool compare_replica(const Scenario& s, size_t rank, const ShardSnapshot& shard, GlobalState& st) {
  const auto begin = static_cast<size_t>(shard.param_range.start);
  const std::vector<std::pair<const char*, const std::vector<float>*>> fields = {
      {"master", &shard.master}, {"exp_avg", &shard.exp_avg}, {"exp_avg_sq", &shard.exp_avg_sq}};
  const std::vector<const std::vector<std::vector<float>>*> mains = {&st.master, &st.exp_avg,
                                                                     &st.exp_avg_sq};
  for (size_t f = 0; f < fields.size(); ++f) {
    const std::vector<float>& mine = *fields[f].second;
    const std::vector<float>& main = (*mains[f])[shard.model_param];
    for (size_t i = 0; i < mine.size() && begin + i < main.size(); ++i) {
      if (std::bit_cast<uint32_t>(mine[i]) == std::bit_cast<uint32_t>(main[begin + i]) ||
          (std::isnan(mine[i]) && std::isnan(main[begin + i])))
        continue;
      st.replica_differences.push_back(fmt::format(
          "rank {} holds {}[{}] = {} of replicated param {}, TP rank 0 {}", rank, fields[f].first,
          begin + i, mine[i], s.params[shard.model_param].name, main[begin + i]));
      return true;
    }
  }
  return false;
}

// The disjoint element ranges of one param that ranks hold, sorted by start.
class HeldRanges {
 public:
  // The first element of `range` already held, with its holder; nullopt: none is.
  std::optional<std::pair<int64_t, int>> first_held(model::Range range) const {
    const auto it = first_after(range.start);
    if (it != held_.begin() && std::prev(it)->end > range.start)
      return std::pair{range.start, std::prev(it)->rank};
    if (it != held_.end() && it->start < range.end) return std::pair{it->start, it->rank};
    return std::nullopt;
  }
  // REQUIRES: no element of `range` is held (first_held).
  void add(model::Range range, int rank) {
    held_.insert(first_after(range.start), Held{range.start, range.end, rank});
  }

 private:
  struct Held {
    int64_t start;
    int64_t end;
    int rank;
  };
  // The first range that starts after `element`.
  std::vector<Held>::const_iterator first_after(int64_t element) const {
    return std::upper_bound(held_.begin(), held_.end(), element,
                            [](int64_t start, const Held& h) { return start < h.start; });
  }
  std::vector<Held> held_;
};

// What std::vector::at raises for element `n` of `size` (the element-by-element holder table
// this replaced raised it for a shard outside its param, or of a param the scenario lacks).
[[noreturn]] void out_of_range(size_t n, size_t size) {
  throw std::out_of_range(fmt::format(
      "vector::_M_range_check: __n (which is {}) >= this->size() (which is {})", n, size));
}

// The record of rank `r`'s shard `shard` (the step it used from the rank's `uses`).
ShardRecord record_of(const ShardSnapshot& shard, size_t r, const RankState& rank) {
  ShardRecord rec;
  rec.param = shard.model_param;
  rec.range = shard.param_range;
  rec.rank = static_cast<int>(r);
  rec.step_aliases = shard.step_aliases;
  rec.part = shard.part;
  rec.kernel = shard.kernel;
  rec.counter = shard.step;
  rec.kernel_offset = shard.kernel_offset;
  rec.kernel_numel = shard.kernel_numel;
  rec.state_dtypes = shard.state_dtypes;
  rec.chain = shard.chain;
  for (const auto& u : rank.uses) {
    if (u.model_param == shard.model_param) rec.step_used = u.step;
  }
  return rec;
}

}  // namespace

namespace {

// gather_state; `owned` (null: none): the same states, which may give up their model params.
GlobalState gather(const Scenario& s, int64_t global_step,
                   const std::vector<const RankState*>& ranks,
                   const std::vector<RankState*>* owned) {
  GlobalState st = empty_state(s, global_step);
  // The first rank that has a state (rank 0 unless a partial load left it out).
  size_t first = 0;
  while (first < ranks.size() && ranks[first] == nullptr) ++first;
  if (first < ranks.size()) {
    if (owned != nullptr && ranks[first]->params_held.empty()) {
      st.param = std::move((*owned)[first]->params);
    } else {
      st.param = ranks[first]->params;
    }
    st.param_groups = ranks[first]->groups;
    st.hypers = ranks[first]->hypers;
    for (size_t r = first + 1; r < ranks.size(); ++r) {
      if (ranks[r] != nullptr && ranks[r]->hypers != st.hypers)
        st.hypers_on_rank.emplace(static_cast<int>(r), ranks[r]->hypers);
    }
    if (!ranks[first]->params_held.empty()) {
      gather_params_of_pieces(ranks, st);
    } else {
      for (size_t r = first + 1; r < ranks.size(); ++r) {
        if (ranks[r] != nullptr && !bitwise_equal(ranks[r]->params, st.param))
          st.param_on_rank.emplace(static_cast<int>(r), ranks[r]->params);
      }
    }
  }
  // Invariant 1: the ranges held so far, per param.
  std::vector<HeldRanges> held(s.params.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r] == nullptr) continue;
    for (const auto& shard : ranks[r]->shards) {
      if (shard.replica) continue;  // compared with the main copy below
      const model::Range range = shard.param_range;
      if (range.start < range.end) {
        const size_t p = shard.model_param;
        if (p >= held.size()) out_of_range(p, held.size());
        const auto numel = static_cast<size_t>(s.params[p].numel);
        // An element before the param was the table's first index (a huge size_t).
        if (range.start < 0) out_of_range(static_cast<size_t>(range.start), numel);
        // Every range held is inside the param, so a held element comes before one outside.
        const std::optional<std::pair<int64_t, int>> taken = held[p].first_held(range);
        CKPTSIM_CHECK(!taken, fmt::format("element {} of param {} held by ranks {} and {}",
                                          taken ? taken->first : 0, s.params[p].name,
                                          taken ? taken->second : 0, r));
        if (static_cast<size_t>(range.end) > numel)
          out_of_range(std::max(static_cast<size_t>(range.start), numel), numel);
        held[p].add(range, static_cast<int>(r));
      }
      put_shard(st, shard);
      st.shards.push_back(record_of(shard, r, *ranks[r]));
    }
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r] == nullptr) continue;
    for (const auto& shard : ranks[r]->shards) {
      if (!shard.replica) continue;
      GlobalState::Replica replica{record_of(shard, r, *ranks[r]), std::nullopt};
      if (compare_replica(s, r, shard, st))
        replica.own = std::array{shard.master, shard.exp_avg, shard.exp_avg_sq};
      st.replicas.push_back(std::move(replica));
    }
  }
  return st;
}

}  // namespace

GlobalState gather_state(const Scenario& s, int64_t global_step,
                         const std::vector<const RankState*>& ranks) {
  return gather(s, global_step, ranks, nullptr);
}

GlobalState gather_given_states(const Scenario& s, int64_t global_step,
                                const std::vector<RankState*>& ranks) {
  return gather(s, global_step, {ranks.begin(), ranks.end()}, &ranks);
}

uint64_t fnv1a(const void* data, size_t n, uint64_t h) { return model::fnv1a(data, n, h); }

uint64_t fnv1a_floats(std::span<const float> values, uint64_t h) {
  constexpr uint32_t kQuietNan = 0x7fc00000U;
  for (const float v : values) {
    const uint32_t bits = std::isnan(v) ? kQuietNan : std::bit_cast<uint32_t>(v);
    h = fnv1a(&bits, sizeof bits, h);
  }
  return h;
}

uint64_t GlobalState::hash() const {
  uint64_t h = fnv1a(&global_step, sizeof global_step);
  for (const auto* group : {&master, &exp_avg, &exp_avg_sq, &param}) {
    for (const auto& v : *group) h = fnv1a_floats(v, h);
  }
  for (const auto& [rank, params] : param_on_rank) {
    h = fnv1a(&rank, sizeof rank, h);
    for (const auto& v : params) h = fnv1a_floats(v, h);
  }
  for (const auto& s : shards) {
    const double c = s.counter.value_or(-1.0);
    const double u = s.step_used.value_or(-1.0);
    h = fnv1a(&c, sizeof c, h);
    h = fnv1a(&u, sizeof u, h);
  }
  return h;
}

const std::vector<std::vector<float>>& GlobalState::params_of(int rank) const {
  const auto it = param_on_rank.find(rank);
  return it != param_on_rank.end() ? it->second : param;
}

const std::vector<GroupHyper>& GlobalState::hypers_of(int rank) const {
  const auto it = hypers_on_rank.find(rank);
  return it != hypers_on_rank.end() ? it->second : hypers;
}

const ShardRecord* GlobalState::shard_at(size_t param, int64_t element) const {
  for (const auto& s : shards) {
    if (s.param == param && s.range.start <= element && element < s.range.end) return &s;
  }
  return nullptr;
}

std::string RankError::summary() const {
  std::string out = fmt::format("rank {} {}: {}: {}", rank, stage, py_type, message);
  if (!site.empty()) out += " [" + site + "]";
  return out;
}

const GlobalState* PhaseRecord::saved_at(int64_t iteration) const {
  if (save_iteration == iteration && at_save.has_value()) return &*at_save;
  for (const GlobalState& g : earlier_saves) {
    if (g.global_step - iteration_origin == iteration) return &g;
  }
  return nullptr;
}

const GlobalState* PhaseRecord::final_state() const {
  if (!after_step.empty()) return &after_step.back();
  if (after_load.has_value()) return &*after_load;
  if (index > 0) return nullptr;  // the load failed: the phase never had a state to save
  return initial.has_value() ? &*initial : nullptr;
}

bool Uninitialized::any_in(const Field& field, size_t p, int64_t begin, int64_t end) {
  if (p >= field.size()) return false;
  const auto& v = field[p];
  const auto b = static_cast<size_t>(std::max<int64_t>(begin, 0));
  const auto e = std::min(static_cast<size_t>(std::max<int64_t>(end, 0)), v.size());
  return b < e &&
         std::any_of(v.begin() + static_cast<std::ptrdiff_t>(b),
                     v.begin() + static_cast<std::ptrdiff_t>(e), [](uint8_t x) { return x != 0; });
}

namespace {

Uninitialized unmarked(const Scenario& s) {
  Uninitialized u;
  for (Uninitialized::Field* field : {&u.master, &u.exp_avg, &u.exp_avg_sq, &u.param}) {
    for (const auto& p : s.params) field->emplace_back(static_cast<size_t>(p.numel), uint8_t{0});
  }
  return u;
}

// One optimizer step from `before`: each moment keeps its mark, the master takes its own and
// its moments' (the update reads all three), the model param its master's (the all-gather
// writes every element from its master). Over-marks an element no part updated (its master
// did not read the moments); it never under-marks.
Uninitialized stepped(const Uninitialized& before) {
  Uninitialized after = before;
  for (size_t p = 0; p < after.master.size(); ++p) {
    for (size_t e = 0; e < after.master[p].size(); ++e) {
      uint8_t& m = after.master[p][e];
      m = static_cast<uint8_t>(m | before.exp_avg[p][e] | before.exp_avg_sq[p][e]);
      after.param[p][e] = m;
    }
  }
  return after;
}

}  // namespace

void mark_uninitialized(const Scenario& s, const GlobalState* checkpoint,
                        const std::vector<std::vector<UninitializedSlice>>& slices,
                        PhaseRecord& phase) {
  if (!phase.after_load.has_value()) return;
  const bool inherited = checkpoint != nullptr && checkpoint->uninitialized.any();
  const UninitializedSlice* first = nullptr;
  for (const auto& rank : slices) {
    if (first == nullptr && !rank.empty()) first = &rank.front();
  }
  if (!inherited && first == nullptr) return;
  // After the load: what the checkpoint held (copied in), then what the load left as it was.
  Uninitialized loaded = inherited ? checkpoint->uninitialized : unmarked(s);
  if (first != nullptr && !inherited) {
    loaded.origin = fmt::format("the load of phase {} (dp={}, {}) {} (torch.empty contents)",
                                phase.index, phase.spec.dp, phase.spec.profile->name, first->why);
  }
  for (const auto& rank : slices) {
    for (const auto& slice : rank) {
      auto& field = slice.field == StateField::kMaster   ? loaded.master
                    : slice.field == StateField::kExpAvg ? loaded.exp_avg
                                                         : loaded.exp_avg_sq;
      auto& v = field.at(slice.model_param);
      for (int64_t e = slice.range.start; e < slice.range.end; ++e)
        v.at(static_cast<size_t>(e)) = 1;
    }
  }
  phase.after_load->uninitialized = loaded;
  const Uninitialized* last = &phase.after_load->uninitialized;
  for (auto& st : phase.after_step) {
    st.uninitialized = stepped(*last);
    last = &st.uninitialized;
  }
  if (phase.at_save.has_value()) phase.at_save->uninitialized = *last;
}

const GlobalState* RunResult::reference_after_load(const PhaseRecord& p) const {
  // A phase whose optimizer began at its start step: a --no-load-optim resume, or a resume of
  // the save such a phase made without a step.
  const std::vector<int64_t> origins = optimizer_origins(scenario);
  const bool fresh =
      p.index < origins.size() && origins[p.index] > 0 && origins[p.index] == p.start_step;
  if (!fresh) return reference_at(p.start_step);
  const auto it = reference_restarts.find(p.start_step);
  return it != reference_restarts.end() ? &it->second : nullptr;
}

const GlobalState* RunResult::reference_at(int64_t global_step) const {
  if (global_step == 0) return &reference_initial;
  if (global_step < 1 || global_step > static_cast<int64_t>(reference.size())) return nullptr;
  return &reference[static_cast<size_t>(global_step - 1)];
}

}  // namespace ckptsim::sim

namespace ckptsim::sim {

std::map<std::string, std::vector<std::vector<float>>> saved_state_by_param(
    const Scenario& s, const PhaseRecord& phase) {
  return saved_state_by_param(s, phase.checkpoint_values, phase);
}

std::map<std::string, std::vector<std::vector<float>>> saved_state_by_param(
    const Scenario& s, const std::map<std::string, std::vector<float>>& checkpoint_values,
    const PhaseRecord& phase) {
  std::map<std::string, std::vector<std::vector<float>>> out;
  const auto slot = [&](const std::string& state) -> std::vector<std::vector<float>>& {
    auto [it, fresh] = out.try_emplace(state);
    if (fresh) {
      for (const auto& p : s.params)
        it->second.emplace_back(static_cast<size_t>(p.numel),
                                std::numeric_limits<float>::quiet_NaN());
    }
    return it->second;
  };
  for (const auto& [key, values] : checkpoint_values) {
    if (const auto k = model::parse_model_space_key(key)) {
      const auto param =
          std::find_if(s.params.begin(), s.params.end(),
                       [&](const model::ParamSpec& p) { return p.name == k->model_key; });
      if (param == s.params.end() || static_cast<int64_t>(values.size()) != param->numel) continue;
      slot(k->state)[static_cast<size_t>(param - s.params.begin())] = values;
      continue;
    }
    // The key's DP group: its buffers hold that (TP, PP) rank's pieces of the params (or an EP
    // rank's pieces of the expert params).
    const GroupLayout* group = nullptr;
    std::optional<model::OptimizerBucketKey> k;
    for (const GroupLayout& gl : phase.groups) {
      if ((k = gl.bucket_key(key))) {
        group = &gl;
        break;
      }
    }
    if (group == nullptr && phase.groups.empty()) k = model::parse_bucket_key(key);
    if (!k || (group == nullptr && k->dp_group_idx != 0)) continue;
    const std::vector<model::BufferLayout>& layouts =
        group != nullptr ? group->layouts : phase.layouts;
    const std::vector<BufferInfo>& buffers = group != nullptr ? group->buffers : phase.buffers;
    const model::ModelParallelRank mp = group != nullptr ? group->mp : model::ModelParallelRank{};
    const bool expert_group = group != nullptr && group->part == 1;
    const auto g = static_cast<size_t>(k->gbuf_idx);
    if (g >= layouts.size() || g >= buffers.size()) continue;
    const model::BufferLayout& layout = layouts[g];
    const auto b = static_cast<size_t>(k->bucket_idx);
    if (b >= layout.buckets.size()) continue;
    const model::BucketLayout& bucket = layout.buckets[b];
    for (size_t local : bucket.params) {
      const model::ParamIndex& pi = layout.param_index_map[local];
      const size_t param = buffers[g].params.at(local);
      std::vector<float>& dst = slot(k->state)[param];
      // Local element e - pi.start of the TP piece, placed run by run in the whole param.
      int64_t e = pi.start;
      const model::ParamSpec spec =
          expert_group ? model::expert_split_spec(s.params[param]) : s.params[param];
      for (const auto& [global_begin, length] : model::tp_element_runs(spec, mp)) {
        for (int64_t j = 0; j < length && e < pi.end; ++j, ++e) {
          const auto i = static_cast<size_t>(e - bucket.offset);
          if (i < values.size()) dst[static_cast<size_t>(global_begin + j)] = values[i];
        }
      }
    }
  }
  return out;
}

float master_from_remainder(float bf16_value, float remainder) {
  auto hi = static_cast<uint16_t>(std::bit_cast<uint32_t>(bf16_value) >> 16);
  const auto rem = static_cast<int16_t>(remainder);
  if (rem < 0) hi = static_cast<uint16_t>(hi - 1);
  return std::bit_cast<float>((uint32_t{hi} << 16) | static_cast<uint16_t>(rem));
}

std::optional<model::OptimizerBucketKey> GroupLayout::bucket_key(const std::string& key) const {
  if (!key.starts_with(key_prefix)) return std::nullopt;
  auto k = model::parse_bucket_key(key.substr(key_prefix.size()));
  if (!k || k->dp_group_idx != dp_group_idx) return std::nullopt;
  return k;
}

}  // namespace ckptsim::sim
