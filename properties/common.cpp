#include "properties/common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ckptsim::properties {

namespace {

// Moments as Adam sees them: state that does not exist yet is zeros. `m` itself where every
// element is present (no copy), else a copy in `store` with the absent elements zeroed.
const std::vector<std::vector<float>>* effective_moments(
    const std::vector<std::vector<float>>& m, const std::vector<std::vector<uint8_t>>& present,
    std::vector<std::vector<float>>& store) {
  auto absent = [&](size_t p, size_t e) { return present[p][e] == 0; };
  bool any_absent = false;
  for (size_t p = 0; p < m.size() && p < present.size() && !any_absent; ++p) {
    for (size_t e = 0; e < m[p].size() && e < present[p].size(); ++e) {
      if (absent(p, e)) {
        any_absent = true;
        break;
      }
    }
  }
  if (!any_absent) return &m;
  store = m;
  for (size_t p = 0; p < store.size() && p < present.size(); ++p) {
    for (size_t e = 0; e < store[p].size() && e < present[p].size(); ++e) {
      if (absent(p, e)) store[p][e] = 0.0F;
    }
  }
  return &store;
}

}  // namespace

PropertyResult pass(const std::string& name) {
  return PropertyResult{name, Verdict::kPass, "", ""};
}

PropertyResult fail(PropertyResult r, int phase, std::string signature, std::string detail) {
  r.verdict = Verdict::kFail;
  r.phase = phase;
  r.signature = std::move(signature);
  r.detail = std::move(detail);
  return r;
}

PropertyResult mark_not_evaluated(PropertyResult r, const std::string& why) {
  r.verdict = Verdict::kNotEvaluated;
  r.detail = "not evaluated: " + why;
  return r;
}

std::string phase_label(const sim::PhaseRecord& p) {
  if (p.spec.tp * p.spec.pp != 1) {
    return fmt::format("phase {} (tp={}, pp={}, dp={}, {})", p.index, p.spec.tp, p.spec.pp,
                       p.spec.dp, p.spec.revision);
  }
  return fmt::format("phase {} (dp={}, {})", p.index, p.spec.dp, p.spec.revision);
}

std::string param_name(const sim::RunResult& run, size_t p) {
  return run.scenario.params.at(p).name;
}

std::string shard_label(const sim::RunResult& run, const sim::ShardRecord& s) {
  // An MoE model's chained optimizer: which part the shard's optimizer is (issue 26).
  const bool moe = std::any_of(run.scenario.params.begin(), run.scenario.params.end(),
                               [](const model::ParamSpec& p) { return p.expert; });
  const std::string chain =
      moe && s.chain.has_value() ? (*s.chain == 0 ? ", dense part" : ", expert part") : "";
  return fmt::format("{} on {}[{}:{}] (rank {}{})", sim::part_name(s.part),
                     param_name(run, s.param), s.range.start, s.range.end, s.rank, chain);
}

std::string num(double x) {
  if (std::isnan(x)) return "none";
  if (x == std::floor(x) && std::fabs(x) < 1e15) return fmt::format("{:.0f}", x);
  return fmt::format("{:.9g}", x);
}

double counter_value(const std::optional<double>& c) { return c.value_or(0.0); }

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

const sim::RankError* first_primary(const std::vector<sim::RankError>& errors) {
  for (const auto& e : errors) {
    if (!e.secondary) return &e;
  }
  return errors.empty() ? nullptr : &errors.front();
}

bool bitwise_equal(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  uint32_t x = 0;
  uint32_t y = 0;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

double ulp_of(double x, model::DType dtype) {
  int exp = 0;
  std::frexp(x, &exp);
  return std::ldexp(1.0, exp - (dtype == model::DType::kBFloat16 ? 8 : 24));
}

bool within_tolerance(float observed, float expected, bool bf16, double drift) {
  if (std::isnan(observed) || std::isnan(expected))
    return std::isnan(observed) && std::isnan(expected);
  const double x = static_cast<double>(expected);
  const double d = std::fabs(static_cast<double>(observed) - x);
  if (bf16) return d <= ulp_of(x, model::DType::kBFloat16) + kTrajectoryAtol + drift;
  return d <= kTrajectoryAtol + kTrajectoryRtol * std::fabs(x) + drift;
}

ComparedFields::ComparedFields(const sim::GlobalState& a, const sim::GlobalState& b)
    : fields_{{{"master param", &a.master, &b.master},
               {"exp_avg", effective_moments(a.exp_avg, a.moments_present, a_m_),
                effective_moments(b.exp_avg, b.moments_present, b_m_)},
               {"exp_avg_sq", effective_moments(a.exp_avg_sq, a.moments_present, a_v_),
                effective_moments(b.exp_avg_sq, b.moments_present, b_v_)},
               {"model param", &a.param, &b.param}}} {}

}  // namespace ckptsim::properties
