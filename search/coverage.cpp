#include "search/coverage.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "search/generators.h"

namespace ckptsim::search {

namespace {

std::string hybrid_label(const model::OptimizerConfig& o) {
  const double f = o.offload_fraction;
  const char* offload = f == 0 ? "offload 0" : f == 1 ? "offload 1" : "offload between";
  return fmt::format("hybrid, {}{}", offload, o.te_installed ? "" : ", TE absent");
}

std::string dtypes_label(const sim::Scenario& s) {
  std::set<model::DType> dtypes;
  for (const auto& p : s.params) dtypes.insert(p.dtype);
  if (dtypes.size() > 1) return "bf16 and fp32 mixed";
  return *dtypes.begin() == model::DType::kBFloat16 ? "bf16 only" : "fp32 only";
}

// "wd_mult 0 and 1", "lr_mult 1 and 0.5": the distinct values of one group key, when they differ.
std::string mults_label(const sim::Scenario& s) {
  std::set<double> wd, lr;
  for (const auto& p : s.params) {
    wd.insert(p.wd_mult);
    lr.insert(p.lr_mult);
  }
  std::string out;
  auto add = [&](const char* name, const std::set<double>& values) {
    if (values.size() < 2) return;
    const bool beyond =
        std::any_of(values.begin(), values.end(), [](double v) { return v != 0.0 && v != 1.0; });
    out += fmt::format("{}{} differs{}", out.empty() ? "" : ", ", name,
                       beyond ? " (beyond 0/1)" : " (0/1)");
  };
  add("wd_mult", wd);
  add("lr_mult", lr);
  return out.empty() ? "one group setting" : out;
}

std::string schedule_label(const model::ScheduleConfig& c) {
  return fmt::format("lr {}{}, weight decay {}", model::lr_decay_style_name(c.lr_decay_style),
                     c.lr_warmup_iters > 0 ? " after warmup" : "",
                     model::wd_incr_style_name(c.wd_incr_style));
}

std::string resume_arguments_label(const sim::Scenario& s, size_t i) {
  const bool changed = s.schedule_of(i) != s.schedule_of(i - 1);
  return fmt::format("{}, {}", model::scheduler_resume_name(s.phases[i].opt_param_scheduler),
                     changed ? "arguments change" : "same arguments");
}

// "lr", "lr and min_lr", "min_lr and weight decay", ...: the --lr, --min-lr and weight decay
// arguments (start or end) a resume changes, then "other" for the rest of the schedule.
std::string changed_arguments_label(const model::ScheduleConfig& a,
                                    const model::ScheduleConfig& b) {
  std::vector<std::string> names;
  if (a.lr != b.lr) names.emplace_back("lr");
  if (a.min_lr != b.min_lr) names.emplace_back("min_lr");
  if (a.start_wd != b.start_wd || a.end_wd != b.end_wd) names.emplace_back("weight decay");
  model::ScheduleConfig rest = b;
  rest.lr = a.lr;
  rest.min_lr = a.min_lr;
  rest.start_wd = a.start_wd;
  rest.end_wd = a.end_wd;
  if (rest != a) names.emplace_back("other");
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  }
  return out;
}

// The hybrid's fp32 params: "some, offload between" (the CPU and GPU parts each hold params),
// or "none".
std::string hybrid_fp32_label(const sim::Scenario& s) {
  const bool fp32 = std::any_of(s.params.begin(), s.params.end(),
                                [](const auto& p) { return p.dtype == model::DType::kFloat32; });
  const double f = s.optimizer.offload_fraction;
  if (!fp32) return "none";
  return f == 0 ? "some, offload 0" : f == 1 ? "some, offload 1" : "some, offload between";
}

// The MoE draw (--ep-max): "dense", or "EP 2, 1 of 3 params expert".
std::string experts_label(const sim::Scenario& s) {
  const auto n = std::count_if(s.params.begin(), s.params.end(),
                               [](const model::ParamSpec& p) { return p.expert; });
  if (n == 0) return "dense";
  return fmt::format("EP {}, {} of {} params expert", s.phases.front().ep, n, s.params.size());
}

// The precision-aware states drawn (--state-dtype): "exp_avg bf16, exp_avg_sq fp32, remainders";
// nullopt where none were.
std::optional<std::string> precision_label(const model::OptimizerConfig& o) {
  if (o.te_precision_aware()) {
    return fmt::format("exp_avg {}, exp_avg_sq {}{}", model::state_dtype_name(o.exp_avg_dtype),
                       model::state_dtype_name(o.exp_avg_sq_dtype),
                       o.store_param_remainders ? ", remainders" : ", fp32 masters");
  }
  if (o.kind == model::OptimizerKind::kHybrid &&
      (o.exp_avg_dtype != model::StateDType::kFloat32 ||
       o.exp_avg_sq_dtype != model::StateDType::kFloat32))
    return "hybrid, dtypes given (its HDO keeps fp32)";
  return std::nullopt;
}

std::string reshard_label(int64_t from, int64_t to) {
  if (from == to) return "same DP";
  if (to % from == 0 || from % to == 0) return to > from ? "up, dividing" : "down, dividing";
  return to > from ? "up, not dividing" : "down, not dividing";
}

}  // namespace

std::string Coverage::steps_band(int64_t steps) {
  if (steps <= 1) return std::to_string(steps);
  if (steps <= 6) return "2-6";
  if (steps < kLongBand8.first) return fmt::format("7-{}", kLongBand8.first - 1);
  if (steps <= kLongBand8.second)
    return fmt::format("{}-{} (near 2^8)", kLongBand8.first, kLongBand8.second);
  if (steps < kLongBand11.first)
    return fmt::format("{}-{}", kLongBand8.second + 1, kLongBand11.first - 1);
  if (steps <= kLongBand11.second)
    return fmt::format("{}-{} (near 2^11)", kLongBand11.first, kLongBand11.second);
  return fmt::format(">{}", kLongBand11.second);
}

// A checkpoint format as coverage names it: "fully_reshardable, mem_efficient".
std::string format_label(const model::CheckpointFormat& f) {
  return model::sharding_type_name(f.sharding_type) + (f.mem_efficient ? ", mem_efficient" : "");
}

void Coverage::add(const sim::Scenario& s) {
  ++cases_;
  const model::OptimizerConfig& o = s.optimizer;
  bump("cases: optimizer", o.kind == model::OptimizerKind::kHybrid
                               ? hybrid_label(o)
                               : model::optimizer_kind_name(o.kind));
  bump("cases: dtypes", dtypes_label(s));
  if (const auto label = precision_label(o)) bump("cases: precision-aware states", *label);
  bump("cases: MoE expert params", experts_label(s));
  bump("cases: param groups", mults_label(s));
  bump("cases: params", std::to_string(s.params.size()));
  bump("cases: buckets", s.bucket_size ? "several (bucket_size set)" : "one");
  if (s.pad_buckets_for_high_nccl_busbw) bump("cases: buckets", "padded for NCCL busbw");
  bump("cases: phases", std::to_string(s.phases.size()));
  bump("cases: schedule", schedule_label(s.schedule));
  if (o.kind == model::OptimizerKind::kHybrid)
    bump("cases: hybrid, fp32 params", hybrid_fp32_label(s));
  const bool dp1 = std::all_of(s.phases.begin(), s.phases.end(),
                               [](const sim::PhaseSpec& p) { return p.dp == 1; });
  bump("cases: DP", dp1 ? "1 throughout" : "above 1 in a phase");
  int64_t longest = 0;
  for (size_t i = 0; i < s.phases.size(); ++i) {
    const sim::PhaseSpec& p = s.phases[i];
    ++phases_;
    longest = std::max(longest, p.steps);
    bump("phases: steps", steps_band(p.steps));
    bump("phases: revision", p.revision);
    bump("phases: DP", std::to_string(p.dp));
    bump("phases: TP x PP", fmt::format("{} x {}", p.tp, p.pp));
    bump("phases: saves in", format_label(s.format_of(i)));
    for (const auto& f : p.storage_faults) {  // only where drawn (--fault-space storage)
      bump("phases: storage fault", fmt::format("{} at {}", model::storage_fault_kind_name(f.kind),
                                                sim::save_file_name(f.file)));
    }
    if (p.save_interval > 0 || p.async_save) {  // only where drawn (--fault-space storage)
      bump("phases: saves",
           fmt::format("{}{}", p.save_interval > 0 ? "every few iterations" : "at the end",
                       p.async_save ? fmt::format(", async (writes take {} step(s))",
                                                  std::min<int64_t>(p.async_write_steps, 3))
                                    : std::string()));
    }
    if (i == 0) continue;
    const sim::PhaseSpec& prev = s.phases[i - 1];
    bump("resumes: DP", fmt::format("{} -> {}", prev.dp, p.dp));
    bump("resumes: reshard", reshard_label(prev.dp, p.dp));
    bump("resumes: optimizer state",
         p.fresh_optimizer() ? "not loaded (" + p.fresh_start_flag() + ")" : "loaded");
    bump("resumes: revision", prev.revision == p.revision ? "same revision" : "revision changes");
    bump("resumes: loads", format_label(s.format_of(i - 1)));
    if (prev.tp * prev.pp * p.tp * p.pp != 1) {
      const bool tp = prev.tp != p.tp, pp = prev.pp != p.pp, dp = prev.dp != p.dp;
      std::string changes;
      for (const auto& [changed, name] : {std::pair{tp, "TP"}, {pp, "PP"}, {dp, "DP"}}) {
        if (changed) changes += (changes.empty() ? "" : ", ") + std::string(name);
      }
      bump("resumes: TP, PP, DP that change", changes.empty() ? "none" : changes);
    }
    bump("resumes: opt_param_scheduler", resume_arguments_label(s, i));
    const model::ScheduleConfig& before = s.schedule_of(i - 1);
    if (s.schedule_of(i) == before) continue;
    bump("resumes: arguments that change", changed_arguments_label(before, s.schedule_of(i)));
    const std::string revision =
        prev.revision == p.revision ? p.revision : prev.revision + " -> " + p.revision;
    bump("resumes: arguments change, by revision",
         fmt::format("{}, {}", revision, model::scheduler_resume_name(p.opt_param_scheduler)));
  }
  bump("cases: longest phase", steps_band(longest));
}

void Coverage::merge(const Coverage& other) {
  cases_ += other.cases_;
  phases_ += other.phases_;
  for (const auto& [feature, values] : other.counts_) {
    for (const auto& [value, n] : values) counts_[feature][value] += n;
  }
}

int64_t Coverage::count(const std::string& feature, const std::string& value) const {
  const auto f = counts_.find(feature);
  if (f == counts_.end()) return 0;
  const auto v = f->second.find(value);
  return v == f->second.end() ? 0 : v->second;
}

std::string Coverage::text() const {
  std::string out = fmt::format("coverage: {} cases, {} phases drawn\n", cases_, phases_);
  for (const auto& [feature, values] : counts_) {
    std::vector<std::pair<std::string, int64_t>> sorted(values.begin(), values.end());
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    int64_t total = 0;
    for (const auto& [_, n] : sorted) total += n;
    out += "  " + feature + ":";
    size_t shown = 0;
    for (const auto& [value, n] : sorted) {
      if (shown++ == 12) {
        out += fmt::format(" ... and {} more", sorted.size() - 12);
        break;
      }
      out += fmt::format("{} {} {:.1f}% ({})", shown > 1 ? "," : "", value,
                         100.0 * static_cast<double>(n) / static_cast<double>(total), n);
    }
    out += "\n";
  }
  return out;
}

nlohmann::json Coverage::json() const {
  nlohmann::json j = {{"cases", cases_}, {"phases", phases_}, {"counts", nlohmann::json::object()}};
  for (const auto& [feature, values] : counts_) j["counts"][feature] = values;
  return j;
}

Result<Coverage> Coverage::from_json(const nlohmann::json& j, const std::string& source) {
  auto bad = [&](const std::string& what) {
    return Status::invalid_input(source + ": coverage: " + what);
  };
  auto count_at = [](const nlohmann::json& v) {
    return v.is_number_integer() && v.get<int64_t>() >= 0;
  };
  if (!j.is_object() || !j.contains("cases") || !count_at(j["cases"]) || !j.contains("phases") ||
      !count_at(j["phases"]) || !j.contains("counts") || !j["counts"].is_object())
    return bad("must be an object with counts 'cases', 'phases' and an object 'counts'");
  Coverage c;
  c.cases_ = j["cases"].get<int64_t>();
  c.phases_ = j["phases"].get<int64_t>();
  for (const auto& [feature, values] : j["counts"].items()) {
    if (!values.is_object()) return bad("'counts." + feature + "' must be an object");
    for (const auto& [value, n] : values.items()) {
      if (!count_at(n)) return bad("'counts." + feature + "." + value + "' must be a count");
      c.counts_[feature][value] = n.get<int64_t>();
    }
  }
  return c;
}

}  // namespace ckptsim::search
