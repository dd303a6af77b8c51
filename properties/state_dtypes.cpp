// state_dtypes_survive_resume: every state of TE's precision-aware FusedAdam (the moments in
// exp_avg_dtype / exp_avg_sq_dtype, the master whole or as int16 remainders) is stored, after
// every load and every step of a resumed run, in the dtype the uninterrupted run stores it in at
// that point (issue 26: a moment promoted or demoted on resume, torchtitan PR #4615; a remainder
// master reinterpreted as an fp32 one). Judged on the run and on a trace (its parts'
// state_dtypes), shard by shard: the uninterrupted run's shard holding the same first element.
#include <fmt/format.h>

#include <map>
#include <optional>
#include <string>

#include "properties/common.h"
#include "properties/trace_checks.h"

namespace ckptsim::properties {

namespace {

constexpr const char* kName = "state_dtypes_survive_resume";

using Dtypes = std::map<std::string, std::string>;

Dtypes as_map(const std::vector<std::pair<std::string, std::string>>& v) {
  return Dtypes(v.begin(), v.end());
}

// The first state whose dtype differs (a state on one side only counts), as "state: a vs b".
std::optional<std::string> difference(const Dtypes& got, const Dtypes& want) {
  for (const auto& [state, dtype] : want) {
    const auto it = got.find(state);
    if (it == got.end() || it->second != dtype)
      return fmt::format("{} {} (uninterrupted run: {})", state,
                         it == got.end() ? "absent" : it->second, dtype);
  }
  for (const auto& [state, dtype] : got) {
    if (!want.contains(state))
      return fmt::format("{} {} (uninterrupted run: absent)", state, dtype);
  }
  return std::nullopt;
}

}  // namespace

PropertyResult state_dtypes_survive_resume(const sim::RunResult& run) {
  struct Failure {
    int phase;
    std::string signature;
    std::string detail;
  };
  int64_t compared = 0;
  // The first shard of `st` whose dtypes differ from the uninterrupted run's `ref`.
  auto scan = [&](const sim::PhaseRecord& p, const sim::GlobalState& st,
                  const sim::GlobalState* ref, const std::string& when) -> std::optional<Failure> {
    if (ref == nullptr) return std::nullopt;
    for (const auto& s : st.shards) {
      if (s.state_dtypes.empty()) continue;
      const sim::ShardRecord* rs = ref->shard_at(s.param, s.range.start);
      if (rs == nullptr || rs->state_dtypes.empty()) continue;
      ++compared;
      if (auto d = difference(as_map(s.state_dtypes), as_map(rs->state_dtypes))) {
        return Failure{
            static_cast<int>(p.index), fmt::format("{}:{}", kName, sim::part_name(s.part)),
            fmt::format("{} {}: {} stores {}", phase_label(p), when, shard_label(run, s), *d)};
      }
    }
    return std::nullopt;
  };
  std::optional<Failure> found;
  for (const auto& p : run.phases) {
    if (found || !p.ran || p.index == 0) continue;
    if (p.after_load) {
      found = scan(p, *p.after_load, run.reference_after_load(p),
                   fmt::format("after the load at global step {}", p.start_step));
    }
    for (const auto& st : p.after_step) {
      if (!found)
        found = scan(p, st, run.reference_at(st.global_step),
                     fmt::format("after global step {}", st.global_step));
    }
  }
  PropertyResult r = pass(kName);
  if (found) return fail(std::move(r), found->phase, found->signature, found->detail);
  if (compared == 0) {
    for (const auto& p : run.phases) {
      if (p.ran && p.index > 0 && !p.after_load)
        return mark_not_evaluated(std::move(r), phase_label(p) + ": the load did not complete");
    }
  }
  r.detail = compared == 0 ? "no resumed run holds state of a precision-aware FusedAdam to compare"
                           : fmt::format(
                                 "{} shard states of resumed runs store each state in the "
                                 "uninterrupted run's dtype",
                                 compared);
  return r;
}

TraceVerdict trace_state_dtypes_survive_resume(const trace::Trace& t) {
  const trace::Run* reference = t.find("reference");
  int64_t compared = 0;
  for (const auto& run : t.runs) {
    if (&run == reference || reference == nullptr) continue;
    for (const auto& e : run.events) {
      if (e.at != "after_load" && e.at != "after_step") continue;
      const auto ref = trace::reference_at(t, e.global_step);
      for (const auto& p : e.parts) {
        if (!p.state_dtypes) continue;
        const trace::Part* rp = trace::part_at(ref, p.param, p.begin);
        if (rp == nullptr || !rp->state_dtypes) continue;
        ++compared;
        if (auto d = difference(*p.state_dtypes, *rp->state_dtypes)) {
          return {kName, Verdict::kFail,
                  fmt::format("{} {} global step {}: {} (rank {}) stores {}", run.id, e.at,
                              e.global_step, p.label(), e.rank, *d),
                  fmt::format("{}:{}", kName, p.part), run.id};
        }
      }
    }
  }
  if (compared == 0) {
    for (const auto& run : t.runs) {
      if (run.phase > 0 && run.status != "skipped" && !trace::load_completed(run)) {
        return {kName, Verdict::kNotEvaluated, fmt::format("{}: the load did not complete", run.id),
                "", ""};
      }
    }
    return {kName, Verdict::kPass,
            "no resumed run records state dtypes of a precision-aware FusedAdam to compare", "",
            ""};
  }
  return {kName, Verdict::kPass,
          fmt::format("{} parts of resumed runs store each state in the reference run's dtype",
                      compared),
          "", ""};
}

}  // namespace ckptsim::properties
