#include "properties/properties.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstring>
#include <map>

#include "model/megatron/param_and_grad_buffer.h"
#include "model/py/key.h"

namespace ckptsim::properties {

namespace {

using sim::ModelState;
using sim::PhaseRecord;
using sim::RunResult;
using sim::ShardRecord;

// The verdict of a property whose run never reached what it judges; `why` names the phase.
PropertyResult mark_not_evaluated(PropertyResult r, const std::string& why) {
  r.verdict = Verdict::kNotEvaluated;
  r.detail = "not evaluated: " + why;
  return r;
}

std::string phase_label(const RunResult& run, const PhaseRecord& p) {
  return fmt::format("phase {} (dp={}, {})", p.index, p.spec.dp, p.spec.revision);
}

std::string param_name(const RunResult& run, size_t p) { return run.scenario.params.at(p).name; }

std::string shard_label(const RunResult& run, const ShardRecord& s) {
  return fmt::format("{} on {}[{}:{}] (rank {})", s.part, param_name(run, s.param), s.range.start,
                     s.range.end, s.rank);
}

std::string num(double x) {
  if (std::isnan(x)) return "none";
  if (x == std::floor(x) && std::fabs(x) < 1e15) return fmt::format("{:.0f}", x);
  return fmt::format("{:.9g}", x);
}

// The reference shard that holds element `e` of param `p`.
const ShardRecord* shard_at(const ModelState& st, size_t p, int64_t e) {
  for (const auto& s : st.shards) {
    if (s.param == p && s.range.start <= e && e < s.range.end) return &s;
  }
  return nullptr;
}

// The step counter a shard will advance from; none (no step yet) counts as 0, as a fresh
// Adam starts from 0.
double counter_value(const std::optional<double>& c) { return c.value_or(0.0); }

// An error message with its numbers blanked and cut short, so that two failures of one cause
// at different sizes share a signature and two causes at one site do not.
std::string message_shape(const std::string& m) {
  std::string out;
  for (char c : m) {
    if (out.size() >= 48) break;
    if (std::isdigit(static_cast<unsigned char>(c))) {
      if (out.empty() || out.back() != '#') out.push_back('#');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// Moments as Adam sees them: state that does not exist yet is zeros.
std::vector<std::vector<float>> effective_moments(
    const std::vector<std::vector<float>>& m, const std::vector<std::vector<uint8_t>>& present) {
  std::vector<std::vector<float>> out = m;
  for (size_t p = 0; p < out.size() && p < present.size(); ++p) {
    for (size_t e = 0; e < out[p].size() && e < present[p].size(); ++e) {
      if (present[p][e] == 0) out[p][e] = 0.0F;
    }
  }
  return out;
}

// The four arrays two states are compared on, moments normalized (absent state = zeros).
class ComparedFields {
 public:
  struct Field {
    const char* name;
    const std::vector<std::vector<float>>* a;
    const std::vector<std::vector<float>>* b;
  };
  ComparedFields(const ModelState& a, const ModelState& b)
      : a_m_(effective_moments(a.exp_avg, a.moments_present)),
        a_v_(effective_moments(a.exp_avg_sq, a.moments_present)),
        b_m_(effective_moments(b.exp_avg, b.moments_present)),
        b_v_(effective_moments(b.exp_avg_sq, b.moments_present)),
        fields_{{{"master param", &a.master, &b.master},
                 {"exp_avg", &a_m_, &b_m_},
                 {"exp_avg_sq", &a_v_, &b_v_},
                 {"model param", &a.param, &b.param}}} {}
  ComparedFields(const ComparedFields&) = delete;  // fields_ points into this object
  ComparedFields& operator=(const ComparedFields&) = delete;
  const std::array<Field, 4>& fields() const { return fields_; }

 private:
  std::vector<std::vector<float>> a_m_, a_v_, b_m_, b_v_;
  std::array<Field, 4> fields_;
};

bool any_primary_error(const PhaseRecord& p) {
  for (const auto& e : p.errors) {
    if (!e.secondary) return true;
  }
  return !p.errors.empty();
}

const sim::RankError* first_primary(const std::vector<sim::RankError>& errors) {
  for (const auto& e : errors) {
    if (!e.secondary) return &e;
  }
  return errors.empty() ? nullptr : &errors.front();
}

// ---------------------------------------------------------------------------------------------

PropertyResult no_duplicate_leaves(const RunResult& run) {
  PropertyResult r{"no_duplicate_leaves", Verdict::kPass, "", ""};
  int loads = 0;
  for (const auto& p : run.phases) {
    if (!p.ran || p.index == 0) continue;
    ++loads;
    for (const auto& e : p.errors) {
      if (!e.merge_kind.has_value()) continue;
      r.verdict = Verdict::kFail;
      r.phase = static_cast<int>(p.index);
      const char* what = *e.merge_kind == model::MergeError::Kind::kDuplicateLeaf
                             ? "duplicate leaf"
                             : "lists of different lengths";
      r.detail = fmt::format(
          "{} load, rank {}: merge() met {} at path {}; expected no overlap between the "
          "checkpoint's common state and the load request; observed {}: {}",
          phase_label(run, p), e.rank, what, model::repr(e.merge_path), e.py_type, e.message);
      r.signature = std::string("no_duplicate_leaves:") + what;
      return r;
    }
  }
  r.detail = fmt::format(
      "{} load(s) merged common state, local objects and loaded shards without a collision", loads);
  return r;
}

PropertyResult resume_completes(const RunResult& run) {
  PropertyResult r{"resume_completes", Verdict::kPass, "", ""};
  if (const auto* e = first_primary(run.reference_errors)) {
    r.verdict = Verdict::kFail;
    r.detail = "the uninterrupted reference run failed: " + e->summary();
    r.signature = "resume_completes:reference:" + e->py_type + "@" + e->site;
    return r;
  }
  int saves = 0;
  int loads = 0;
  for (const auto& p : run.phases) {
    if (!p.ran) continue;
    if (any_primary_error(p)) {
      r.verdict = Verdict::kFail;
      r.phase = static_cast<int>(p.index);
      const auto* e = first_primary(p.errors);
      r.detail = fmt::format(
          "{}: expected every rank to {} without error; observed {}", phase_label(run, p),
          p.index == 0 ? "train and save" : "load, train and save", e->summary());
      r.signature = "resume_completes:" + e->stage + ":" + e->py_type + "@" + e->site + ":" +
                    message_shape(e->message);
      return r;
    }
    saves += p.spec.save ? 1 : 0;
    loads += p.index > 0 ? 1 : 0;
  }
  r.detail = fmt::format("{} save(s) and {} load(s) completed on every rank", saves, loads);
  return r;
}

PropertyResult step_matches_uninterrupted(const RunResult& run) {
  PropertyResult r{"step_matches_uninterrupted", Verdict::kPass, "", ""};
  int resumes = 0;
  int64_t checks = 0;
  std::string not_evaluated;
  std::vector<std::string> failures;
  std::string signature;
  int first_phase = -1;
  for (const auto& p : run.phases) {
    if (!p.ran || p.index == 0) continue;
    if (!p.after_load.has_value()) {
      if (not_evaluated.empty()) {
        const auto* e = first_primary(p.errors);
        not_evaluated = fmt::format("{}: the load did not complete ({})", phase_label(run, p),
                                    e != nullptr ? e->summary() : "no state");
      }
      continue;
    }
    ++resumes;
    // Right after the load: the counter the next update advances from equals the reference's.
    const ModelState* ref = run.reference_at(p.start_step);
    if (ref == nullptr) {
      failures.push_back(fmt::format("{}: resumed at global step {}, beyond the reference run",
                                     phase_label(run, p), p.start_step));
      continue;
    }
    for (const auto& s : p.after_load->shards) {
      const ShardRecord* rs = shard_at(*ref, s.param, s.range.start);
      const double expected = rs != nullptr ? counter_value(rs->counter) : 0.0;
      const double observed = counter_value(s.counter);
      ++checks;
      if (expected != observed) {
        if (signature.empty()) signature = "step_matches_uninterrupted:after_load:" + s.part;
        if (first_phase < 0) first_phase = static_cast<int>(p.index);
        failures.push_back(fmt::format(
            "{}, after the load at global step {}: the step counter of {} is {} (expected {}, as "
            "in the uninterrupted "
            "run){}",
            phase_label(run, p), p.start_step, shard_label(run, s),
            s.counter ? num(observed) : "none", num(expected),
            !s.counter ? ": no step was restored, so bias correction restarts at t=1" : ""));
      }
    }
    for (const auto& st : p.after_step) {
      const ModelState* rst = run.reference_at(st.global_step);
      if (rst == nullptr) continue;
      for (const auto& s : st.shards) {
        if (!s.step_used) continue;
        const ShardRecord* rs = shard_at(*rst, s.param, s.range.start);
        const double expected = rs != nullptr && rs->step_used ? *rs->step_used : std::nan("");
        ++checks;
        if (*s.step_used != expected) {
          if (signature.empty()) signature = "step_matches_uninterrupted:training:" + s.part;
          if (first_phase < 0) first_phase = static_cast<int>(p.index);
          failures.push_back(fmt::format(
              "{}, global step {}: {} used bias-correction step t={} (uninterrupted run: t={})",
              phase_label(run, p), st.global_step, shard_label(run, s), num(*s.step_used),
              num(expected)));
        }
      }
    }
  }
  if (!failures.empty()) {
    r.verdict = Verdict::kFail;
    r.signature = signature;
    r.phase = first_phase;
    r.detail = failures.front();
    if (failures.size() > 1)
      r.detail += fmt::format(" (+{} more mismatches; first ones: ", failures.size() - 1);
    for (size_t i = 1; i < failures.size() && i < 4; ++i)
      r.detail += (i > 1 ? "; " : "") + failures[i];
    if (failures.size() > 1) r.detail += ")";
    return r;
  }
  if (!not_evaluated.empty()) {
    return mark_not_evaluated(std::move(r), not_evaluated);
  }
  r.detail = fmt::format(
      "{} resume(s): {} step counters and bias-correction steps equal the uninterrupted run's",
      resumes, checks);
  return r;
}

bool bitwise_equal(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  uint32_t x = 0;
  uint32_t y = 0;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

bool within_tolerance(float observed, float expected, bool bf16) {
  if (std::isnan(observed) || std::isnan(expected))
    return std::isnan(observed) && std::isnan(expected);
  const double d = std::fabs(static_cast<double>(observed) - static_cast<double>(expected));
  if (bf16) {
    // One bf16 ulp at the expected value's magnitude (8 significand bits).
    int exp = 0;
    std::frexp(static_cast<double>(expected), &exp);
    return d <= std::ldexp(1.0, exp - 8) + kTrajectoryAtol;
  }
  return d <= kTrajectoryAtol + kTrajectoryRtol * std::fabs(static_cast<double>(expected));
}

PropertyResult trajectory_matches_uninterrupted(const RunResult& run) {
  PropertyResult r{"trajectory_matches_uninterrupted", Verdict::kPass, "", ""};
  const auto& params = run.scenario.params;
  // Per element: has a reshard ever put it under a different kernel kind than the reference?
  std::vector<std::vector<uint8_t>> moved(params.size());
  for (size_t p = 0; p < params.size(); ++p)
    moved[p].assign(static_cast<size_t>(params[p].numel), 0);
  int64_t bitwise = 0;
  int64_t tolerant = 0;
  int64_t states = 0;
  std::string not_evaluated;
  auto update_moved = [&](const ModelState& st, const ModelState& ref) {
    for (const auto& s : st.shards) {
      for (int64_t e = s.range.start; e < s.range.end; ++e) {
        const ShardRecord* rs = shard_at(ref, s.param, e);
        if (rs == nullptr || rs->kernel != s.kernel) moved[s.param][static_cast<size_t>(e)] = 1;
      }
    }
  };
  // Compares one recorded state with the reference; returns a failure text or "".
  auto compare = [&](const PhaseRecord& phase, const ModelState& st, const ModelState& ref,
                     const char* when) -> std::string {
    ++states;
    const ComparedFields compared(st, ref);  // a: observed, b: expected
    for (const auto& f : compared.fields()) {
      if (f.a->empty() || f.b->empty()) continue;
      for (size_t p = 0; p < params.size(); ++p) {
        const auto& o = (*f.a)[p];
        const auto& x = (*f.b)[p];
        int64_t differing = 0;
        double max_diff = 0;
        int64_t first = -1;
        bool first_moved = false;
        for (size_t e = 0; e < o.size(); ++e) {
          const bool m = moved[p][e] != 0;
          const bool bf16 =
              std::string(f.name) == "model param" && params[p].dtype == at::kBFloat16;
          const bool ok = m ? within_tolerance(o[e], x[e], bf16) : bitwise_equal(o[e], x[e]);
          (m ? tolerant : bitwise)++;
          if (ok) continue;
          ++differing;
          max_diff =
              std::max(max_diff, std::fabs(static_cast<double>(o[e]) - static_cast<double>(x[e])));
          if (first < 0) {
            first = static_cast<int64_t>(e);
            first_moved = m;
          }
        }
        if (differing == 0) continue;
        const ShardRecord* s = shard_at(st, p, first);
        r.signature = std::string("trajectory_matches_uninterrupted:") + f.name;
        r.phase = static_cast<int>(phase.index);
        return fmt::format(
            "{}, {} global step {}: {} of {}[{}] is {} (uninterrupted run: {}); comparison {}; {} "
            "of {} elements of {} "
            "differ, max |diff| {:.3g}{}",
            phase_label(run, phase), when, st.global_step, f.name, params[p].name, first,
            num(o[first]), num(x[first]),
            first_moved ? fmt::format("within tolerance (rtol {:g}, atol {:g}; the reshard moved "
                                      "the element to another "
                                      "kernel kind)",
                                      kTrajectoryRtol, kTrajectoryAtol)
                        : "bitwise (the same kernel kind updated the element in both runs)",
            differing, o.size(), params[p].name, max_diff,
            s != nullptr ? ", updated by " + shard_label(run, *s) : "");
      }
    }
    return "";
  };
  for (const auto& p : run.phases) {
    if (!p.ran) continue;
    if (p.index > 0) {
      if (!p.after_load.has_value()) {
        if (not_evaluated.empty())
          not_evaluated = phase_label(run, p) + ": the load did not complete";
        continue;
      }
      const ModelState* ref = run.reference_at(p.after_load->global_step);
      if (ref != nullptr) {
        // A restored state holds no kernel decision yet: compare with the history so far.
        if (auto f = compare(p, *p.after_load, *ref, "after the load at"); !f.empty()) {
          r.verdict = Verdict::kFail;
          r.detail = f;
          return r;
        }
      }
    }
    for (const auto& st : p.after_step) {
      const ModelState* ref = run.reference_at(st.global_step);
      if (ref == nullptr) continue;
      update_moved(st, *ref);
      if (auto f = compare(p, st, *ref, "after"); !f.empty()) {
        r.verdict = Verdict::kFail;
        r.detail = f;
        return r;
      }
    }
  }
  if (!not_evaluated.empty()) {
    return mark_not_evaluated(std::move(r), not_evaluated);
  }
  r.detail = fmt::format(
      "{} states compared with the uninterrupted run: {} element values bit for bit, {} within "
      "tolerance (moved between kernel kinds)",
      states, bitwise, tolerant);
  return r;
}

PropertyResult shards_tile_buckets_impl(const RunResult& run);

PropertyResult shards_tile_buckets(const RunResult& run) {
  PropertyResult r = shards_tile_buckets_impl(run);
  if (!r.ok()) r.signature = "shards_tile_buckets";
  return r;
}

PropertyResult shards_tile_buckets_impl(const RunResult& run) {
  PropertyResult r{"shards_tile_buckets", Verdict::kPass, "", ""};
  int checkpoints = 0;
  int keys_checked = 0;
  for (const auto& p : run.phases) {
    if (!p.ran || p.saved_pieces.empty()) continue;
    ++checkpoints;
    std::map<std::string, std::vector<const model::SavedPiece*>> by_key;
    for (const auto& piece : p.saved_pieces) {
      if (piece.key.rfind("optimizer.distributed.", 0) == 0 &&
          piece.key.find(".bucket_idx_") != std::string::npos) {
        by_key[piece.key].push_back(&piece);
      }
    }
    // Every bucket of every buffer has its keys.
    for (size_t g = 0; g < p.buffers.size(); ++g) {
      for (size_t b = 0; b < p.buffers[g].numel_unpadded.size(); ++b) {
        const std::string prefix =
            fmt::format("optimizer.distributed.dp_group_idx_0.gbuf_idx_{}.dtype_{}.bucket_idx_{}.",
                        g, p.buffers[g].dtype_key, b);
        bool found = false;
        for (const auto& [key, pieces] : by_key) {
          if (key.rfind(prefix, 0) != 0) continue;
          found = true;
          if (pieces.front()->global_numel != p.buffers[g].numel_unpadded[b]) {
            r.verdict = Verdict::kFail;
            r.phase = static_cast<int>(p.index);
            r.detail = fmt::format(
                "{} checkpoint: key {} has global shape ({},), expected numel_unpadded {}",
                phase_label(run, p), key, pieces.front()->global_numel,
                p.buffers[g].numel_unpadded[b]);
            return r;
          }
        }
        if (!found) {
          r.verdict = Verdict::kFail;
          r.phase = static_cast<int>(p.index);
          r.detail =
              fmt::format("{} checkpoint: bucket {} of buffer {} {} has no saved optimizer state",
                          phase_label(run, p), b, g, p.buffers[g].dtype_key);
          return r;
        }
      }
    }
    for (auto& [key, pieces] : by_key) {
      ++keys_checked;
      std::vector<std::pair<int64_t, int64_t>> ranges;
      for (const auto* piece : pieces)
        ranges.emplace_back(piece->global_offset, piece->global_offset + piece->numel);
      std::sort(ranges.begin(), ranges.end());
      const int64_t total = pieces.front()->global_numel;
      int64_t cursor = 0;
      for (const auto& [b, e] : ranges) {
        if (b > cursor) {
          r.verdict = Verdict::kFail;
          r.phase = static_cast<int>(p.index);
          r.detail = fmt::format(
              "{} checkpoint: key {}: elements [{}, {}) of [0, {}) were saved by no rank (a gap)",
              phase_label(run, p), key, cursor, b, total);
          return r;
        }
        if (b < cursor) {
          r.verdict = Verdict::kFail;
          r.phase = static_cast<int>(p.index);
          r.detail = fmt::format(
              "{} checkpoint: key {}: elements [{}, {}) of [0, {}) were saved twice (an overlap)",
              phase_label(run, p), key, b, std::min(cursor, e), total);
          return r;
        }
        cursor = e;
      }
      if (cursor != total) {
        r.verdict = Verdict::kFail;
        r.phase = static_cast<int>(p.index);
        r.detail = fmt::format(
            "{} checkpoint: key {}: pieces end at {}, expected exactly numel_unpadded {} ({})",
            phase_label(run, p), key, cursor, total,
            cursor < total ? "a gap at the end" : "past the end");
        return r;
      }
    }
  }
  r.detail =
      fmt::format("{} checkpoint(s): {} optimizer keys tile [0, numel_unpadded) exactly once",
                  checkpoints, keys_checked);
  return r;
}

PropertyResult common_state_rank_independent(const RunResult& run) {
  PropertyResult r{"common_state_rank_independent", Verdict::kPass, "", ""};
  int saves = 0;
  for (const auto& p : run.phases) {
    if (!p.ran || p.common_differences.empty()) continue;
    ++saves;
    for (size_t rank = 0; rank < p.common_differences.size(); ++rank) {
      if (p.common_differences[rank].empty()) continue;
      r.verdict = Verdict::kFail;
      r.phase = static_cast<int>(p.index);
      r.signature = "common_state_rank_independent";
      r.detail = fmt::format(
          "{} save: rank {}'s common state differs from rank 0's (only rank 0's is persisted): "
          "{}{}",
          phase_label(run, p), rank, p.common_differences[rank].front(),
          p.common_differences[rank].size() > 1
              ? fmt::format(" (+{} more)", p.common_differences[rank].size() - 1)
              : "");
      return r;
    }
  }
  r.detail = fmt::format("{} save(s): every rank's common state equals rank 0's", saves);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Invariants of spec §15 beyond the foundation's four.

PropertyResult layout_invariants(const RunResult& run) {
  PropertyResult r{"layout_invariants", Verdict::kPass, "", ""};
  int layouts = 0;
  // I4: per (buffer, bucket), numel_unpadded of the first phase that ran.
  std::map<std::pair<size_t, size_t>, std::pair<int64_t, size_t>> unpadded;
  for (const auto& p : run.phases) {
    if (!p.ran) continue;
    for (size_t g = 0; g < p.layouts.size(); ++g) {
      ++layouts;
      const model::BufferLayout& layout = p.layouts[g];
      Status s = model::check_layout_invariants(layout, p.layout_options);
      for (size_t b = 0; s.is_ok() && b < layout.buckets.size(); ++b) {
        const auto shards = model::build_bucket_shards(layout, b, p.layout_options.dp_size);
        s = model::check_bucket_shards(layout, b, p.layout_options.dp_size, shards);
      }
      if (!s.is_ok()) {
        r.verdict = Verdict::kFail;
        r.phase = static_cast<int>(p.index);
        r.signature = "layout_invariants";
        r.detail = fmt::format("{} buffer {} ({}): {}", phase_label(run, p), g,
                               g < p.buffers.size() ? p.buffers[g].dtype_key : "?", s.message());
        return r;
      }
      for (size_t b = 0; b < layout.buckets.size(); ++b) {
        auto [it, inserted] =
            unpadded.try_emplace({g, b}, layout.buckets[b].numel_unpadded, p.index);
        if (!inserted && it->second.first != layout.buckets[b].numel_unpadded) {
          r.verdict = Verdict::kFail;
          r.phase = static_cast<int>(p.index);
          r.signature = "layout_invariants:I4";
          r.detail = fmt::format(
              "{} buffer {} bucket {}: numel_unpadded {} differs from {} in phase {} (I4: the "
              "checkpoint tensor's global shape must not depend on the DP size)",
              phase_label(run, p), g, b, layout.buckets[b].numel_unpadded, it->second.first,
              it->second.second);
          return r;
        }
      }
    }
  }
  r.detail = fmt::format("{} buffer layout(s) keep I1, I2 and I4", layouts);
  return r;
}

// Per element, the step counter of the shard that holds it (none counts as 0).
std::vector<double> element_counters(const ModelState& st, size_t p, int64_t numel) {
  std::vector<double> out(static_cast<size_t>(numel), 0.0);
  for (const auto& s : st.shards) {
    if (s.param != p) continue;
    for (int64_t e = s.range.start; e < s.range.end && e < numel; ++e)
      out[static_cast<size_t>(e)] = counter_value(s.counter);
  }
  return out;
}

PropertyResult round_trip_identity(const RunResult& run) {
  PropertyResult r{"round_trip_identity", Verdict::kPass, "", ""};
  int loads = 0;
  std::string not_evaluated;
  for (const auto& p : run.phases) {
    if (!p.ran || p.index == 0) continue;
    const auto& prev = run.phases[p.index - 1];
    const ModelState* saved = prev.at_save.has_value() ? &*prev.at_save : nullptr;
    if (!p.after_load.has_value() || saved == nullptr) {
      if (not_evaluated.empty())
        not_evaluated = phase_label(run, p) + ": the load did not complete";
      continue;
    }
    ++loads;
    const ModelState& loaded = *p.after_load;
    auto fail = [&](const std::string& sig, const std::string& detail) {
      r.verdict = Verdict::kFail;
      r.phase = static_cast<int>(p.index);
      r.phase = static_cast<int>(p.index);
      r.signature = "round_trip_identity:" + sig;
      r.detail =
          fmt::format("{}: the load did not give back what phase {} saved at global step {}: {}",
                      phase_label(run, p), p.index - 1, saved->global_step, detail);
    };
    const ComparedFields compared(loaded, *saved);
    for (const auto& f : compared.fields()) {
      for (size_t q = 0; q < run.scenario.params.size() && q < f.a->size() && q < f.b->size();
           ++q) {
        for (size_t e = 0; e < (*f.a)[q].size(); ++e) {
          if (!bitwise_equal((*f.a)[q][e], (*f.b)[q][e])) {
            fail(f.name, fmt::format("{} of {}[{}] is {} after the load, {} when saved", f.name,
                                     param_name(run, q), e, num((*f.a)[q][e]), num((*f.b)[q][e])));
            return r;
          }
        }
      }
    }
    for (size_t q = 0; q < run.scenario.params.size(); ++q) {
      const int64_t n = run.scenario.params[q].numel;
      const auto a = element_counters(loaded, q, n);
      const auto b = element_counters(*saved, q, n);
      for (size_t e = 0; e < a.size(); ++e) {
        if (a[e] != b[e]) {
          const ShardRecord* s = shard_at(loaded, q, static_cast<int64_t>(e));
          fail("step", fmt::format("the step counter of {} is {} after the load, {} when saved",
                                   s != nullptr ? shard_label(run, *s) : param_name(run, q),
                                   num(a[e]), num(b[e])));
          return r;
        }
      }
    }
    if (loaded.param_groups != saved->param_groups) {
      fail("param_groups", fmt::format("param groups after the load {} ; when saved {}",
                                       loaded.param_groups, saved->param_groups));
      return r;
    }
  }
  if (!not_evaluated.empty() && loads == 0) {
    return mark_not_evaluated(std::move(r), not_evaluated);
  }
  r.detail = fmt::format(
      "{} load(s) gave back the saved master params, moments, model params, step counters and "
      "param groups exactly",
      loads);
  return r;
}

// (gbuf, bucket) of an optimizer key
// "optimizer.distributed.dp_group_idx_G.gbuf_idx_g.dtype_(...).bucket_idx_b.k".
std::optional<std::pair<size_t, size_t>> key_bucket(const std::string& key) {
  const auto g = key.find(".gbuf_idx_");
  const auto b = key.rfind(".bucket_idx_");
  if (g == std::string::npos || b == std::string::npos) return std::nullopt;
  return std::make_pair(std::stoul(key.substr(g + 10)), std::stoul(key.substr(b + 12)));
}

PropertyResult reshard_round_trip_bytes(const RunResult& run) {
  PropertyResult r{"reshard_round_trip_bytes", Verdict::kPass, "", ""};
  int compared = 0;
  for (const auto& p : run.phases) {
    if (!p.ran || p.index == 0 || p.spec.steps != 0 || p.checkpoint_values.empty()) continue;
    const auto& before = run.phases[p.index - 1].checkpoint_values;
    if (before.empty()) continue;
    ++compared;
    for (const auto& [key, old_values] : before) {
      auto it = p.checkpoint_values.find(key);
      if (it == p.checkpoint_values.end()) {
        r.verdict = Verdict::kFail;
        r.phase = static_cast<int>(p.index);
        r.signature = "reshard_round_trip_bytes:missing_key";
        r.detail = fmt::format(
            "{} saved again without a step, but key {} of phase {}'s checkpoint is missing",
            phase_label(run, p), key, p.index - 1);
        return r;
      }
      const auto gb = key_bucket(key);
      if (!gb || gb->first >= p.layouts.size() || gb->second >= p.layouts[gb->first].buckets.size())
        continue;
      const model::BufferLayout& layout = p.layouts[gb->first];
      const model::BucketLayout& bucket = layout.buckets[gb->second];
      for (size_t local : bucket.params) {
        const model::ParamIndex& pi = layout.param_index_map[local];
        for (int64_t e = pi.start - bucket.offset; e < pi.end - bucket.offset; ++e) {
          const auto i = static_cast<size_t>(e);
          if (i >= old_values.size() || i >= it->second.size()) continue;
          if (!bitwise_equal(old_values[i], it->second[i])) {
            r.verdict = Verdict::kFail;
            r.phase = static_cast<int>(p.index);
            r.signature = "reshard_round_trip_bytes";
            r.detail = fmt::format(
                "{} saved again without a step (dp {} -> {}): {}[{}] (a param element) is {}, "
                "was {} in phase {}'s checkpoint",
                phase_label(run, p), run.phases[p.index - 1].spec.dp, p.spec.dp, key, e,
                num(it->second[i]), num(old_values[i]), p.index - 1);
            return r;
          }
        }
      }
    }
  }
  r.detail = fmt::format(
      "{} save-after-load pair(s) with no step between wrote identical param-region bytes",
      compared);
  return r;
}

PropertyResult step_tensors_not_aliased(const RunResult& run) {
  PropertyResult r{"step_tensors_not_aliased", Verdict::kPass, "", ""};
  int64_t checked = 0;
  auto scan = [&](const PhaseRecord& p, const ModelState& st, const std::string& when) {
    for (const auto& s : st.shards) {
      ++checked;
      if (s.step_aliases == 0) continue;
      r.verdict = Verdict::kFail;
      r.phase = static_cast<int>(p.index);
      r.signature = "step_tensors_not_aliased:" + s.part;
      r.detail = fmt::format(
          "{} {}: the step tensor of {} is the same object as {} other param(s)' (each step() "
          "then advances it {} times)",
          phase_label(run, p), when, shard_label(run, s), s.step_aliases, s.step_aliases + 1);
      return true;
    }
    return false;
  };
  for (const auto& p : run.phases) {
    if (!p.ran) continue;
    if (p.after_load &&
        scan(p, *p.after_load, fmt::format("after the load at global step {}", p.start_step)))
      return r;
    for (const auto& st : p.after_step) {
      if (scan(p, st, fmt::format("after global step {}", st.global_step))) return r;
    }
  }
  r.detail = fmt::format("{} shard states: every param has its own step tensor", checked);
  return r;
}

}  // namespace

std::string verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kPass:
      return "pass";
    case Verdict::kFail:
      return "fail";
    case Verdict::kNotEvaluated:
      return "not_evaluated";
  }
  return "?";
}

const std::vector<Property>& all_properties() {
  static const std::vector<Property> props = {
      {"no_duplicate_leaves",
       "no merge() in any load meets a duplicate leaf or lists of different lengths",
       no_duplicate_leaves},
      {"resume_completes", "every save and load runs to the end on every rank", resume_completes},
      {"step_matches_uninterrupted",
       "after every resume every Adam part holds and uses the uninterrupted run's bias-correction "
       "step",
       step_matches_uninterrupted},
      {"trajectory_matches_uninterrupted",
       "master params, moments and model params equal the uninterrupted run (bitwise for the same "
       "kernel kind)",
       trajectory_matches_uninterrupted},
      {"shards_tile_buckets",
       "saved optimizer pieces tile [0, numel_unpadded) of every bucket and key exactly once",
       shards_tile_buckets},
      {"common_state_rank_independent",
       "every rank's common state equals rank 0's, the only one persisted",
       common_state_rank_independent},
      {"layout_invariants", "buffer layouts and DP shards keep I1, I2 and I4", layout_invariants},
      {"round_trip_identity", "a load gives back exactly what the previous phase saved (I13)",
       round_trip_identity},
      {"reshard_round_trip_bytes",
       "resume then save with no step writes the same param-region bytes (I5)",
       reshard_round_trip_bytes},
      {"step_tensors_not_aliased", "no two params share one step tensor object (I14)",
       step_tensors_not_aliased},
  };
  return props;
}

const Property* find_property(const std::string& name) {
  for (const auto& p : all_properties()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::vector<PropertyResult> check_all(const RunResult& run) {
  std::vector<PropertyResult> out;
  for (const auto& p : all_properties()) out.push_back(p.check(run));
  return out;
}

bool all_ok(const std::vector<PropertyResult>& results) {
  return std::all_of(results.begin(), results.end(),
                     [](const PropertyResult& r) { return r.ok(); });
}

Status validate_expect(const nlohmann::json& expect, const std::string& source) {
  auto error = [&](const std::string& field, const std::string& what) {
    return Status::invalid_input(fmt::format("{}: field 'expect.{}': {}", source, field, what));
  };
  if (expect.is_null()) return Status::ok();
  std::string known;
  for (const auto& p : all_properties()) known += (known.empty() ? "" : ", ") + p.name;
  if (expect.contains("ok") && !expect["ok"].is_boolean())
    return error("ok", "must be true or false");
  for (const char* field : {"properties", "detail_contains"}) {
    if (!expect.contains(field)) continue;
    const nlohmann::json& m = expect[field];
    if (!m.is_object()) return error(field, "must be an object from property names");
    for (const auto& [name, want] : m.items()) {
      const std::string path = std::string(field) + "." + name;
      if (find_property(name) == nullptr)
        return error(path, "unknown property (known: " + known + ")");
      const bool verdict_text =
          want.is_string() && (want == "pass" || want == "fail" || want == "not_evaluated");
      if (std::string(field) == "properties" && !want.is_boolean() && !verdict_text)
        return error(path, "must be true, false, \"pass\", \"fail\" or \"not_evaluated\", got " +
                               want.dump());
      if (std::string(field) == "detail_contains" && !want.is_string())
        return error(path, "must be a string, got " + want.dump());
    }
  }
  return Status::ok();
}

std::vector<std::string> expectation_mismatches(const nlohmann::json& expect,
                                                const std::vector<PropertyResult>& results) {
  std::vector<std::string> out;
  if (expect.is_null()) return out;
  auto find = [&](const std::string& name) -> const PropertyResult* {
    for (const auto& r : results) {
      if (r.name == name) return &r;
    }
    return nullptr;
  };
  if (expect.contains("ok") && expect["ok"].get<bool>() != all_ok(results)) {
    out.push_back(fmt::format("expected overall ok={}, observed {}", expect["ok"].get<bool>(),
                              all_ok(results)));
  }
  if (expect.contains("properties")) {
    for (const auto& [name, want] : expect["properties"].items()) {
      const PropertyResult* r = find(name);
      if (r == nullptr) {
        out.push_back("expect names an unknown property " + name);
        continue;
      }
      const std::string observed = verdict_name(r->verdict);
      const std::string expected =
          want.is_boolean() ? (want.get<bool>() ? "pass" : "fail") : want.get<std::string>();
      if (expected != observed) {
        out.push_back(
            fmt::format("{}: expected {}, observed {} ({})", name, expected, observed, r->detail));
      }
    }
  }
  if (expect.contains("detail_contains")) {
    for (const auto& [name, text] : expect["detail_contains"].items()) {
      const PropertyResult* r = find(name);
      if (r == nullptr || r->detail.find(text.get<std::string>()) == std::string::npos) {
        out.push_back(fmt::format("{}: expected the detail to contain \"{}\", observed \"{}\"",
                                  name, text.get<std::string>(),
                                  r != nullptr ? r->detail : std::string("(no such property)")));
      }
    }
  }
  return out;
}

nlohmann::json results_to_json(const std::vector<PropertyResult>& results) {
  nlohmann::json j{{"ok", all_ok(results)}, {"properties", nlohmann::json::array()}};
  for (const auto& r : results) {
    j["properties"].push_back({{"name", r.name},
                               {"ok", r.ok()},
                               {"verdict", verdict_name(r.verdict)},
                               {"detail", r.detail}});
  }
  return j;
}

}  // namespace ckptsim::properties
