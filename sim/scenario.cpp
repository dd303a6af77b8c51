#include "sim/scenario.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "model/faults.h"
#include "model/json_depth.h"

namespace ckptsim::sim {

namespace {

using nlohmann::json;

// A small reader that turns every problem into "<file>: field '<path>': <what>".
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  Status error(const std::string& path, const std::string& what) const {
    return Status::invalid_input(fmt::format("{}: field '{}': {}", source_, path, what));
  }

  Status check_fields(const json& obj, const std::string& path,
                      const std::set<std::string>& allowed) const {
    for (const auto& [k, v] : obj.items()) {
      if (allowed.count(k) == 0) {
        std::string names;
        for (const auto& a : allowed) names += (names.empty() ? "" : ", ") + a;
        return error(path.empty() ? k : path + "." + k,
                     "unknown field (expected one of: " + names + ")");
      }
    }
    return Status::ok();
  }

  Status integer(const json& obj, const std::string& key, const std::string& path, int64_t lo,
                 int64_t hi, int64_t& out, std::optional<int64_t> fallback = std::nullopt) const {
    return bounded(obj, key, path, lo, hi, out, fallback, "an integer", &json::is_number_integer);
  }

  Status number(const json& obj, const std::string& key, const std::string& path, double lo,
                double hi, double& out, std::optional<double> fallback = std::nullopt) const {
    return bounded(obj, key, path, lo, hi, out, fallback, "a number", &json::is_number);
  }

  template <typename T>
  Status bounded(const json& obj, const std::string& key, const std::string& path, T lo, T hi,
                 T& out, std::optional<T> fallback, const char* what,
                 bool (json::*is_kind)() const noexcept) const {
    if (!obj.contains(key)) {
      if (fallback.has_value()) {
        out = *fallback;
        return Status::ok();
      }
      return error(path, "is required");
    }
    const json& v = obj.at(key);
    if (!(v.*is_kind)() || v.get<T>() < lo || v.get<T>() > hi) {
      return error(path, fmt::format("must be {} in [{}, {}], got {}", what, lo, hi, v.dump()));
    }
    out = v.get<T>();
    return Status::ok();
  }

  Status boolean(const json& obj, const std::string& key, const std::string& path, bool& out,
                 bool fallback) const {
    if (!obj.contains(key)) {
      out = fallback;
      return Status::ok();
    }
    if (!obj.at(key).is_boolean())
      return error(path, "must be true or false, got " + obj.at(key).dump());
    out = obj.at(key).get<bool>();
    return Status::ok();
  }

  Status string(const json& obj, const std::string& key, const std::string& path, std::string& out,
                std::optional<std::string> fallback = std::nullopt) const {
    if (!obj.contains(key)) {
      if (fallback.has_value()) {
        out = *fallback;
        return Status::ok();
      }
      return error(path, "is required");
    }
    if (!obj.at(key).is_string()) return error(path, "must be a string, got " + obj.at(key).dump());
    out = obj.at(key).get<std::string>();
    return Status::ok();
  }

 private:
  std::string source_;
};

#define CKPTSIM_TRY(expr)       \
  do {                          \
    Status _s = (expr);         \
    if (!_s.is_ok()) return _s; \
  } while (0)

}  // namespace

int64_t Scenario::total_steps() const {
  int64_t n = 0;
  for (const auto& p : phases) n += p.steps;
  return n;
}

bool Scenario::has_storage_faults() const {
  return std::any_of(phases.begin(), phases.end(),
                     [](const PhaseSpec& p) { return !p.storage_faults.empty(); });
}

namespace {
constexpr std::pair<SaveFile, const char*> kSaveFiles[] = {{SaveFile::kAny, "any"},
                                                           {SaveFile::kShard, "shard"},
                                                           {SaveFile::kObject, "object"},
                                                           {SaveFile::kMetadata, "metadata"},
                                                           {SaveFile::kTracker, "tracker"}};
}  // namespace

std::string save_file_name(SaveFile f) {
  for (const auto& [file, name] : kSaveFiles) {
    if (file == f) return name;
  }
  return "?";
}

std::optional<SaveFile> parse_save_file(std::string_view name) {
  for (const auto& [file, n] : kSaveFiles) {
    if (n == name) return file;
  }
  return std::nullopt;
}

model::StorageFault StorageFaultSpec::fault(int64_t world) const {
  if (file != SaveFile::kShard || world < 1) return {kind, save_file_suffix(file), nth};
  return {kind, fmt::format("shards/rank_{}.bin", nth % world), nth / world};
}

std::string save_file_suffix(SaveFile f) {
  switch (f) {
    case SaveFile::kAny:
      return "";
    case SaveFile::kShard:
      return ".bin";
    case SaveFile::kObject:
      return ".pt";
    case SaveFile::kMetadata:
      return "metadata.json";
    case SaveFile::kTracker:
      return "latest_checkpointed_iteration.txt";
  }
  return "";
}

int64_t Scenario::total_numel() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel;
  return n;
}

model::CheckpointFormat Scenario::format_of(size_t phase) const {
  const PhaseSpec& p = phases.at(phase);
  if (!p.sharding_type.has_value() && !p.mem_efficient.has_value()) return format;
  return {p.sharding_type.value_or(format.sharding_type),
          p.mem_efficient.value_or(p.sharding_type.has_value() ? false : format.mem_efficient)};
}

const model::ScheduleConfig& Scenario::schedule_of(size_t phase) const {
  const auto& own = phases.at(phase).schedule;
  return own.has_value() ? *own : schedule;
}

namespace {

// Expert params and EP (issue 26): the same EP in every phase, dividing its DP size and every
// expert param's dim 0; TP = PP = 1 where a param is an expert one; a dense param besides.
std::optional<std::pair<std::string, std::string>> expert_problem(const Scenario& s) {
  using Problem = std::pair<std::string, std::string>;
  const bool experts = std::any_of(s.params.begin(), s.params.end(),
                                   [](const model::ParamSpec& p) { return p.expert; });
  if (experts && std::all_of(s.params.begin(), s.params.end(),
                             [](const model::ParamSpec& p) { return p.expert; })) {
    return Problem{"params", "every param is an expert one: a stub dense part is not modeled"};
  }
  for (size_t i = 0; i < s.phases.size(); ++i) {
    const PhaseSpec& phase = s.phases[i];
    const std::string path = fmt::format("phases[{}]", i);
    if (phase.ep != s.phases[0].ep) {
      return Problem{path + ".ep", fmt::format("is {}, phases[0]'s {}: an EP change between "
                                               "phases is not modeled",
                                               phase.ep, s.phases[0].ep)};
    }
    if (phase.dp % phase.ep != 0)
      return Problem{path + ".ep", fmt::format("{} does not divide dp {}", phase.ep, phase.dp)};
    if (experts && phase.tp * phase.pp != 1) {
      return Problem{path, "expert params with tp or pp above 1 are not modeled"};
    }
    for (size_t k = 0; k < s.params.size(); ++k) {
      const model::ParamSpec& spec = s.params[k];
      if (!spec.expert) continue;
      const int64_t rows = model::global_shape(spec)[0];
      if (rows % phase.ep != 0) {
        return Problem{path + ".ep", fmt::format("{} does not divide dim 0 ({}) of expert "
                                                 "params[{}] (\"{}\")",
                                                 phase.ep, rows, k, spec.name)};
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::pair<std::string, std::string>> model_parallel_problem(const Scenario& s) {
  using Problem = std::pair<std::string, std::string>;
  for (size_t k = 0; k < s.params.size(); ++k) {
    const model::ParamSpec& spec = s.params[k];
    int64_t product = 1;
    for (const int64_t d : model::global_shape(spec)) product *= d;
    if (product != spec.numel) {
      return Problem{fmt::format("params[{}].shape", k),
                     fmt::format("holds {} elements, numel is {}", product, spec.numel)};
    }
    if (spec.tp_split == model::TpSplit::kRow && model::global_shape(spec).size() != 2)
      return Problem{fmt::format("params[{}].tp_split", k),
                     "row splits dim 1: the param needs a 2-D shape"};
  }
  if (auto problem = expert_problem(s)) return problem;
  const int64_t layers = model::num_layers(s.params);
  for (size_t i = 0; i < s.phases.size(); ++i) {
    const PhaseSpec& phase = s.phases[i];
    const std::string path = fmt::format("phases[{}]", i);
    if (phase.world() > kWorldSizeMax) {
      return Problem{path, fmt::format("the world of tp {} x pp {} x dp {} = {} ranks exceeds {}",
                                       phase.tp, phase.pp, phase.dp, phase.world(), kWorldSizeMax)};
    }
    for (size_t k = 0; k < s.params.size(); ++k) {
      const model::ParamSpec& spec = s.params[k];
      const int64_t axis = model::tp_axis(spec);
      if (axis < 0) continue;
      const int64_t dim = model::global_shape(spec)[static_cast<size_t>(axis)];
      if (dim % phase.tp != 0) {
        return Problem{path + ".tp", fmt::format("{} does not divide dim {} ({}) of params[{}] "
                                                 "(\"{}\", {}-parallel)",
                                                 phase.tp, axis, dim, k, spec.name,
                                                 model::tp_split_name(spec.tp_split))};
      }
    }
    if (layers % phase.pp != 0) {
      return Problem{path + ".pp", fmt::format("{} stages cannot split the {} layers the params "
                                               "name (params[].layer)",
                                               phase.pp, layers)};
    }
    for (int64_t stage = 0; stage < phase.pp; ++stage) {
      if (model::params_of_stage(s.params, {1, 0, phase.pp, stage}).empty()) {
        return Problem{path + ".pp",
                       fmt::format("stage {} (layers {} to {}) holds no param", stage,
                                   stage * layers / phase.pp, (stage + 1) * layers / phase.pp - 1)};
      }
    }
  }
  return std::nullopt;
}

std::vector<model::ScheduleConfig> intended_schedules(const Scenario& s) {
  std::vector<model::ScheduleConfig> out;
  for (size_t i = 0; i < s.phases.size(); ++i) {
    const model::ScheduleConfig& args = s.schedule_of(i);
    // --no-load-optim, --finetune: the scheduler is not loaded, it starts from the phase's
    // arguments.
    if (i == 0 || s.phases[i].fresh_optimizer() ||
        s.phases[i].opt_param_scheduler != model::SchedulerResume::kUseCheckpoint) {
      out.push_back(args);
      continue;
    }
    model::ScheduleConfig kept = out.back();
    kept.lr_warmup_init = args.lr_warmup_init;
    out.push_back(kept);
  }
  return out;
}

std::vector<int64_t> optimizer_origins(const Scenario& s) {
  std::vector<int64_t> out;
  int64_t done = 0;
  for (size_t i = 0; i < s.phases.size(); ++i) {
    out.push_back(i == 0 ? 0 : s.phases[i].fresh_optimizer() ? done : out.back());
    done += s.phases[i].steps;
  }
  return out;
}

std::vector<int64_t> iteration_origins(const Scenario& s) {
  std::vector<int64_t> out;
  int64_t done = 0;
  for (size_t i = 0; i < s.phases.size(); ++i) {
    out.push_back(i == 0 ? 0 : s.phases[i].finetune ? done : out.back());
    done += s.phases[i].steps;
  }
  return out;
}

namespace {

Status parse_param_parallel(const Reader& r, const json& p, const std::string& path,
                            model::ParamSpec& spec);

Status parse_params(const Reader& r, const json& j, Scenario& s) {
  if (!j.contains("params") || !j["params"].is_array() || j["params"].empty()) {
    return r.error("params", "must be a non-empty array of {name, numel, dtype}");
  }
  if (j["params"].size() > Scenario::kParamsMax) {
    return r.error("params", fmt::format("at most {} params, got {}", Scenario::kParamsMax,
                                         j["params"].size()));
  }
  std::set<std::string> names;
  for (size_t i = 0; i < j["params"].size(); ++i) {
    const json& p = j["params"][i];
    const std::string path = fmt::format("params[{}]", i);
    if (!p.is_object()) return r.error(path, "must be an object");
    CKPTSIM_TRY(r.check_fields(
        p, path,
        {"name", "numel", "dtype", "wd_mult", "lr_mult", "shape", "tp_split", "layer", "expert"}));
    model::ParamSpec spec;
    CKPTSIM_TRY(r.string(p, "name", path + ".name", spec.name));
    if (spec.name.empty() || !names.insert(spec.name).second) {
      return r.error(path + ".name",
                     "must be a non-empty name used once, got \"" + spec.name + "\"");
    }
    CKPTSIM_TRY(r.integer(p, "numel", path + ".numel", 1, Scenario::kParamNumelMax, spec.numel));
    std::string dtype;
    CKPTSIM_TRY(r.string(p, "dtype", path + ".dtype", dtype));
    const auto parsed = model::parse_dtype(dtype);
    if (!parsed.has_value()) {
      return r.error(path + ".dtype", "must be \"bf16\" or \"fp32\", got \"" + dtype + "\"");
    }
    spec.dtype = *parsed;
    CKPTSIM_TRY(r.number(p, "wd_mult", path + ".wd_mult", 0.0, 1e6, spec.wd_mult, 1.0));
    CKPTSIM_TRY(r.number(p, "lr_mult", path + ".lr_mult", 0.0, 1e6, spec.lr_mult, 1.0));
    CKPTSIM_TRY(parse_param_parallel(r, p, path, spec));
    CKPTSIM_TRY(r.boolean(p, "expert", path + ".expert", spec.expert, false));
    s.params.push_back(spec);
  }
  if (s.total_numel() > Scenario::kTotalNumelMax) {
    return r.error("params", fmt::format("total numel {} exceeds {}", s.total_numel(),
                                         Scenario::kTotalNumelMax));
  }
  return Status::ok();
}

Status parse_transformer_engine(const Reader& r, const json& o, model::OptimizerConfig& c) {
  if (!o.contains("transformer_engine")) return Status::ok();
  const json& v = o["transformer_engine"];
  const auto parsed =
      v.is_string() ? model::parse_te_presence(v.get<std::string>()) : std::optional<bool>();
  if (!parsed.has_value()) {
    return r.error("optimizer.transformer_engine",
                   "must be \"installed\" or \"absent\", got " + v.dump());
  }
  c.te_installed = *parsed;
  return Status::ok();
}

Status parse_hybrid_options(const Reader& r, const json& o, model::OptimizerConfig& c) {
  if (c.kind == model::OptimizerKind::kHybrid) {
    CKPTSIM_TRY(r.number(o, "offload_fraction", "optimizer.offload_fraction", 0.0, 1.0,
                         c.offload_fraction));
    CKPTSIM_TRY(parse_transformer_engine(r, o, c));
    return r.boolean(o, "overlap_cpu_optimizer_d2h_h2d", "optimizer.overlap_cpu_optimizer_d2h_h2d",
                     c.overlap_cpu_optimizer_d2h_h2d, false);
  }
  if (o.contains("transformer_engine")) {
    return r.error("optimizer.transformer_engine",
                   "applies only to kind \"hybrid\" (fused_adam without TE is kind "
                   "\"torch_adamw\", and torch_adamw is what Megatron builds only without TE)");
  }
  for (const char* field : {"offload_fraction", "overlap_cpu_optimizer_d2h_h2d"}) {
    if (o.contains(field)) {
      return r.error(std::string("optimizer.") + field, "applies only to kind \"hybrid\"");
    }
  }
  return Status::ok();
}

template <typename E>
Status parse_enum(const Reader& r, const json& o, const char* key, const std::string& path,
                  std::optional<E> (*parse)(std::string_view), const char* names, E& out) {
  if (!o.contains(key)) return Status::ok();
  const json& v = o.at(key);
  const auto parsed = v.is_string() ? parse(v.get<std::string>()) : std::nullopt;
  if (!parsed.has_value())
    return r.error(path, fmt::format("must be one of {}, got {}", names, v.dump()));
  out = *parsed;
  return Status::ok();
}

// The precision-aware optimizer's fields (--use-precision-aware-optimizer and its dtypes).
Status parse_precision_aware(const Reader& r, const json& o, model::OptimizerConfig& c) {
  const bool hybrid = c.kind == model::OptimizerKind::kHybrid;
  CKPTSIM_TRY(
      r.boolean(o, "precision_aware", "optimizer.precision_aware", c.precision_aware, false));
  if (hybrid && o.contains("precision_aware") && !c.precision_aware) {
    return r.error("optimizer.precision_aware",
                   "must be true for kind \"hybrid\" (Megatron requires "
                   "--use-precision-aware-optimizer with --optimizer-cpu-offload)");
  }
  if (c.precision_aware && c.kind == model::OptimizerKind::kTorchAdamW) {
    return r.error("optimizer.precision_aware",
                   "cannot be true for kind \"torch_adamw\" (Megatron without TE raises "
                   "RuntimeError: --use-precision-aware-optimizer requires FusedAdam from "
                   "TransformerEngine)");
  }
  c.precision_aware = c.precision_aware && !hybrid;  // the hybrid's is its kind
  for (const auto& [key, out] : {std::pair{"exp_avg_dtype", &c.exp_avg_dtype},
                                 std::pair{"exp_avg_sq_dtype", &c.exp_avg_sq_dtype}}) {
    if (!o.contains(key)) continue;
    const std::string path = std::string("optimizer.") + key;
    const json& v = o[key];
    if (v == "fp8") {
      return r.error(path,
                     "\"fp8\" is not modeled (FP8 states are TE Float8Tensors); use fp32, "
                     "bf16 or fp16");
    }
    CKPTSIM_TRY(parse_enum(r, o, key, path, model::parse_state_dtype, "fp32, bf16, fp16", *out));
    if (*out != model::StateDType::kFloat32 && !c.uses_precision_aware()) {
      return r.error(path, fmt::format("can only be fp32 when not using precision-aware optimizer "
                                       "(set optimizer.precision_aware), got {}",
                                       v.dump()));
    }
  }
  if (o.contains("main_params_dtype") && o["main_params_dtype"] != "fp32") {
    return r.error("optimizer.main_params_dtype",
                   "only \"fp32\" is modeled (TE's scaled fp16 master weights are not), got " +
                       o["main_params_dtype"].dump());
  }
  if (o.contains("store_param_remainders") && !c.uses_precision_aware()) {
    return r.error("optimizer.store_param_remainders",
                   "applies only to a precision-aware optimizer (optimizer.precision_aware or "
                   "kind \"hybrid\")");
  }
  return r.boolean(o, "store_param_remainders", "optimizer.store_param_remainders",
                   c.store_param_remainders, true);
}

Status parse_optimizer(const Reader& r, const json& j, model::OptimizerConfig& c) {
  if (!j.contains("optimizer") || !j["optimizer"].is_object())
    return r.error("optimizer", "is required (an object)");
  const json& o = j["optimizer"];
  CKPTSIM_TRY(r.check_fields(
      o, "optimizer",
      {"kind", "offload_fraction", "lr", "betas", "eps", "weight_decay",
       "overlap_cpu_optimizer_d2h_h2d", "transformer_engine", "precision_aware", "exp_avg_dtype",
       "exp_avg_sq_dtype", "main_params_dtype", "store_param_remainders"}));
  std::string kind;
  CKPTSIM_TRY(r.string(o, "kind", "optimizer.kind", kind));
  const auto parsed = model::parse_optimizer_kind(kind);
  if (!parsed.has_value()) {
    return r.error("optimizer.kind",
                   "must be one of " + model::optimizer_kind_names() + ", got \"" + kind + "\"");
  }
  c.kind = *parsed;
  CKPTSIM_TRY(parse_hybrid_options(r, o, c));
  CKPTSIM_TRY(parse_precision_aware(r, o, c));
  CKPTSIM_TRY(r.number(o, "lr", "optimizer.lr", 0.0, 10.0, c.adam.lr));
  if (!o.contains("betas") || !o["betas"].is_array() || o["betas"].size() != 2 ||
      !o["betas"][0].is_number() || !o["betas"][1].is_number()) {
    return r.error("optimizer.betas",
                   "must be two numbers [beta1, beta2], got " +
                       (o.contains("betas") ? o["betas"].dump() : std::string("nothing")));
  }
  c.adam.beta1 = o["betas"][0].get<double>();
  c.adam.beta2 = o["betas"][1].get<double>();
  if (!(c.adam.beta1 >= 0 && c.adam.beta1 < 1 && c.adam.beta2 >= 0 && c.adam.beta2 < 1)) {
    return r.error("optimizer.betas", "each beta must be in [0, 1), got " + o["betas"].dump());
  }
  CKPTSIM_TRY(r.number(o, "eps", "optimizer.eps", 1e-30, 1.0, c.adam.eps));
  return r.number(o, "weight_decay", "optimizer.weight_decay", 0.0, 10.0, c.adam.weight_decay);
}

// A param's shape, TP split and layer (model::ParamSpec).
Status parse_param_parallel(const Reader& r, const json& p, const std::string& path,
                            model::ParamSpec& spec) {
  if (p.contains("shape")) {
    const json& shape = p["shape"];
    int64_t product = 1;
    if (!shape.is_array() || shape.empty() || shape.size() > 2) {
      return r.error(path + ".shape", "must be [rows] or [rows, cols], got " + shape.dump());
    }
    for (const json& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 1 ||
          d.get<int64_t>() > Scenario::kParamNumelMax) {
        return r.error(path + ".shape", "dims must be integers >= 1, got " + shape.dump());
      }
      spec.shape.push_back(d.get<int64_t>());
      product *= d.get<int64_t>();
    }
    if (product != spec.numel) {
      return r.error(path + ".shape", fmt::format("{} holds {} elements, numel is {}", shape.dump(),
                                                  product, spec.numel));
    }
  }
  CKPTSIM_TRY(parse_enum(r, p, "tp_split", path + ".tp_split", &model::parse_tp_split,
                         "replicated, column, row", spec.tp_split));
  if (spec.tp_split == model::TpSplit::kRow && model::global_shape(spec).size() != 2) {
    return r.error(path + ".tp_split", "row splits dim 1: the param needs a 2-D shape");
  }
  return r.integer(p, "layer", path + ".layer", 0, Scenario::kLayersMax - 1, spec.layer, 0);
}

Status check_model_parallel(const Reader& r, const Scenario& s) {
  if (const auto problem = model_parallel_problem(s))
    return r.error(problem->first, problem->second);
  return Status::ok();
}

// Upstream's OptimizerParamScheduler asserts, as scenario errors: a schedule that would
// assert in __init__ or get_wd() is not a run to simulate.
Status check_schedule(const Reader& r, const std::string& path, const model::ScheduleConfig& c) {
  if (c.min_lr > c.lr) return r.error(path + ".min_lr", "must be <= the lr");
  if (c.lr_warmup_init > c.lr) return r.error(path + ".lr_warmup_init", "must be <= the lr");
  if (c.lr_warmup_iters >= c.lr_decay_iters)
    return r.error(path + ".lr_warmup_iters", "must be < lr_decay_iters");
  if (c.end_wd < c.start_wd)
    return r.error(path + ".end_weight_decay", "must be >= start_weight_decay");
  if (c.wd_incr_style == model::WdIncrStyle::kConstant && c.start_wd != c.end_wd) {
    return r.error(path + ".weight_decay_incr_style",
                   "\"constant\" needs start_weight_decay == end_weight_decay");
  }
  return Status::ok();
}

// A schedule object: every field optional, defaulting to `out`'s value; "lr" only where
// `with_lr` (a phase's; the scenario's lr is optimizer.lr).
Status parse_schedule(const Reader& r, const json& j, const std::string& path, bool with_lr,
                      model::ScheduleConfig& out) {
  if (!j.contains("schedule")) return Status::ok();
  const json& o = j.at("schedule");
  if (!o.is_object()) return r.error(path, "must be an object");
  std::set<std::string> fields = {
      "min_lr",           "lr_warmup_init",          "lr_warmup_iters",
      "lr_decay_iters",   "lr_decay_style",          "start_weight_decay",
      "end_weight_decay", "weight_decay_incr_style", "train_iters"};
  if (with_lr) fields.insert("lr");
  CKPTSIM_TRY(r.check_fields(o, path, fields));
  const int64_t iters_max = Scenario::kStepsMax;
  CKPTSIM_TRY(r.number(o, "lr", path + ".lr", 0.0, 10.0, out.lr, out.lr));
  CKPTSIM_TRY(r.number(o, "min_lr", path + ".min_lr", 0.0, 10.0, out.min_lr, out.min_lr));
  CKPTSIM_TRY(r.number(o, "lr_warmup_init", path + ".lr_warmup_init", 0.0, 10.0, out.lr_warmup_init,
                       out.lr_warmup_init));
  CKPTSIM_TRY(r.integer(o, "lr_warmup_iters", path + ".lr_warmup_iters", 0, iters_max,
                        out.lr_warmup_iters, out.lr_warmup_iters));
  CKPTSIM_TRY(r.integer(o, "lr_decay_iters", path + ".lr_decay_iters", 1, iters_max,
                        out.lr_decay_iters, out.lr_decay_iters));
  CKPTSIM_TRY(parse_enum(r, o, "lr_decay_style", path + ".lr_decay_style",
                         &model::parse_lr_decay_style,
                         "constant, linear, cosine, inverse-square-root", out.lr_decay_style));
  CKPTSIM_TRY(r.number(o, "start_weight_decay", path + ".start_weight_decay", 0.0, 10.0,
                       out.start_wd, out.start_wd));
  CKPTSIM_TRY(r.number(o, "end_weight_decay", path + ".end_weight_decay", 0.0, 10.0, out.end_wd,
                       out.end_wd));
  CKPTSIM_TRY(parse_enum(r, o, "weight_decay_incr_style", path + ".weight_decay_incr_style",
                         &model::parse_wd_incr_style, "constant, linear, cosine",
                         out.wd_incr_style));
  CKPTSIM_TRY(r.integer(o, "train_iters", path + ".train_iters", 1, iters_max, out.wd_incr_iters,
                        out.wd_incr_iters));
  return check_schedule(r, path, out);
}

// sharding_type and fully_reshardable_mem_efficient of the scenario (`path` "") or of a phase.
Status parse_format(const Reader& r, const json& j, const std::string& path,
                    model::ShardingType& type, bool& mem_efficient) {
  const std::string prefix = path.empty() ? "" : path + ".";
  const std::string names = model::sharding_type_names();
  CKPTSIM_TRY(parse_enum(r, j, "sharding_type", prefix + "sharding_type",
                         &model::parse_sharding_type, names.c_str(), type));
  return r.boolean(j, "fully_reshardable_mem_efficient", prefix + "fully_reshardable_mem_efficient",
                   mem_efficient, mem_efficient);
}

Status parse_layout(const Reader& r, const json& j, Scenario& s) {
  if (j.contains("bucket_size") && !j["bucket_size"].is_null()) {
    int64_t b = 0;
    CKPTSIM_TRY(r.integer(j, "bucket_size", "bucket_size", 1, int64_t{1} << 40, b));
    s.bucket_size = b;
  }
  CKPTSIM_TRY(r.boolean(j, "pad_buckets_for_high_nccl_busbw", "pad_buckets_for_high_nccl_busbw",
                        s.pad_buckets_for_high_nccl_busbw, false));
  CKPTSIM_TRY(parse_format(r, j, "", s.format.sharding_type, s.format.mem_efficient));
  CKPTSIM_TRY(r.integer(j, "samples_per_step", "samples_per_step", 1, Scenario::kSamplesPerStepMax,
                        s.samples_per_step, 8));
  if ((s.samples_per_step & (s.samples_per_step - 1)) != 0) {
    // Gradients are averaged by multiplying with 1/samples_per_step before the reduce-scatter
    // (as DDP scales before reducing); only a power of two keeps that exact on every rank.
    return r.error("samples_per_step",
                   fmt::format("must be a power of two, got {}", s.samples_per_step));
  }
  return Status::ok();
}

// A profile file named by a relative path: next to the scenario file if it is there, else
// relative to the current directory.
std::string profile_path_beside(const std::string& revision, const std::string& source) {
  if (revision.size() > 5 && revision.ends_with(".json") &&
      std::filesystem::path(revision).is_relative()) {
    const auto dir = std::filesystem::path(source).parent_path();
    const auto beside = dir / revision;
    std::error_code ec;
    if (!dir.empty() && std::filesystem::is_regular_file(beside, ec)) return beside.string();
  }
  return revision;
}

Status parse_phase_schedule(const Reader& r, const json& p, const std::string& path,
                            const model::ScheduleConfig& base, PhaseSpec& phase) {
  if (p.contains("schedule")) {
    model::ScheduleConfig c = base;
    CKPTSIM_TRY(parse_schedule(r, p, path + ".schedule", /*with_lr=*/true, c));
    phase.schedule = c;
  }
  return parse_enum(r, p, "opt_param_scheduler", path + ".opt_param_scheduler",
                    &model::parse_scheduler_resume, "override, use_checkpoint, neither",
                    phase.opt_param_scheduler);
}

// phases[i].storage_faults.
Status parse_storage_faults(const Reader& r, const json& p, const std::string& path,
                            PhaseSpec& phase) {
  if (!p.contains("storage_faults")) return Status::ok();
  const json& list = p.at("storage_faults");
  const std::string at = path + ".storage_faults";
  if (!list.is_array() || list.size() > Scenario::kStorageFaultsMax) {
    return r.error(at, fmt::format("must be an array of at most {} {{kind, file, nth}}, got {}",
                                   Scenario::kStorageFaultsMax, list.dump()));
  }
  for (size_t k = 0; k < list.size(); ++k) {
    const json& f = list[k];
    const std::string fp = fmt::format("{}[{}]", at, k);
    if (!f.is_object()) return r.error(fp, "must be an object {kind, file, nth}");
    CKPTSIM_TRY(r.check_fields(f, fp, {"kind", "file", "nth"}));
    StorageFaultSpec spec;
    std::string kind;
    CKPTSIM_TRY(r.string(f, "kind", fp + ".kind", kind));
    const auto parsed_kind = model::parse_storage_fault_kind(kind);
    if (!parsed_kind) {
      return r.error(fp + ".kind",
                     "must be one of crash_before, crash_after, torn, short, "
                     "disk_full, got \"" +
                         kind + "\"");
    }
    spec.kind = *parsed_kind;
    std::string file;
    CKPTSIM_TRY(r.string(f, "file", fp + ".file", file, std::string("any")));
    const auto parsed_file = parse_save_file(file);
    if (!parsed_file) {
      return r.error(fp + ".file",
                     "must be one of any, shard, object, metadata, tracker, got \"" + file + "\"");
    }
    spec.file = *parsed_file;
    CKPTSIM_TRY(r.integer(f, "nth", fp + ".nth", 0, Scenario::kStorageFaultNthMax, spec.nth, 0));
    phase.storage_faults.push_back(spec);
  }
  return Status::ok();
}

Status parse_phase(const Reader& r, const json& p, const std::string& path, bool last,
                   const std::string& source, model::RevisionRegistry& registry,
                   const model::ScheduleConfig& schedule, PhaseSpec& phase) {
  if (!p.is_object()) return r.error(path, "must be an object");
  CKPTSIM_TRY(r.check_fields(
      p, path,
      {"dp", "tp", "pp", "ep", "revision", "steps", "save", "schedule", "opt_param_scheduler",
       "sharding_type", "fully_reshardable_mem_efficient", "storage_faults", "save_interval",
       "async_save", "async_write_steps", "no_load_optim", "finetune"}));
  CKPTSIM_TRY(parse_phase_schedule(r, p, path, schedule, phase));
  CKPTSIM_TRY(parse_storage_faults(r, p, path, phase));
  if (p.contains("sharding_type") || p.contains("fully_reshardable_mem_efficient")) {
    model::ShardingType type = model::ShardingType::kDpReshardable;
    bool mem_efficient = false;
    CKPTSIM_TRY(parse_format(r, p, path, type, mem_efficient));
    if (p.contains("sharding_type")) phase.sharding_type = type;
    if (p.contains("fully_reshardable_mem_efficient")) phase.mem_efficient = mem_efficient;
  }
  CKPTSIM_TRY(r.integer(p, "dp", path + ".dp", 1, Scenario::kDpMax, phase.dp));
  CKPTSIM_TRY(r.integer(p, "tp", path + ".tp", 1, Scenario::kTpMax, phase.tp, 1));
  CKPTSIM_TRY(r.integer(p, "pp", path + ".pp", 1, Scenario::kPpMax, phase.pp, 1));
  CKPTSIM_TRY(r.integer(p, "ep", path + ".ep", 1, Scenario::kDpMax, phase.ep, 1));
  std::string revision;
  CKPTSIM_TRY(r.string(p, "revision", path + ".revision", revision));
  auto resolved = resolve_revision(registry, profile_path_beside(revision, source));
  if (!resolved.is_ok()) return r.error(path + ".revision", resolved.status().message());
  phase.set_revision(resolved.value());
  CKPTSIM_TRY(r.integer(p, "steps", path + ".steps", 0, Scenario::kStepsMax, phase.steps));
  CKPTSIM_TRY(r.boolean(p, "save", path + ".save", phase.save, true));
  CKPTSIM_TRY(r.integer(p, "save_interval", path + ".save_interval", 0, Scenario::kStepsMax,
                        phase.save_interval, 0));
  CKPTSIM_TRY(r.boolean(p, "async_save", path + ".async_save", phase.async_save, false));
  CKPTSIM_TRY(r.integer(p, "async_write_steps", path + ".async_write_steps", 0, Scenario::kStepsMax,
                        phase.async_write_steps, 0));
  CKPTSIM_TRY(r.boolean(p, "no_load_optim", path + ".no_load_optim", phase.no_load_optim, false));
  CKPTSIM_TRY(r.boolean(p, "finetune", path + ".finetune", phase.finetune, false));
  if (phase.async_write_steps > 0 && !phase.async_save) {
    return r.error(path + ".async_write_steps", "needs \"async_save\": true");
  }
  if (!phase.saves() && !last) {
    return r.error(path + ".save",
                   "must be true (or save_interval set): the next phase resumes from this "
                   "phase's checkpoint");
  }
  if (!phase.saves() && !phase.storage_faults.empty()) {
    return r.error(path + ".storage_faults", "a phase that saves nothing has no save to fail");
  }
  return Status::ok();
}

Status parse_phases(const Reader& r, const json& j, const std::string& source,
                    model::RevisionRegistry& registry, Scenario& s) {
  if (!j.contains("phases") || !j["phases"].is_array() || j["phases"].empty()) {
    return r.error("phases", "must be a non-empty array of {dp, revision, steps}");
  }
  const size_t n = j["phases"].size();
  if (n > Scenario::kPhasesMax) {
    return r.error("phases", fmt::format("at most {} phases, got {}", Scenario::kPhasesMax, n));
  }
  for (size_t i = 0; i < n; ++i) {
    PhaseSpec phase;
    CKPTSIM_TRY(parse_phase(r, j["phases"][i], fmt::format("phases[{}]", i), i + 1 == n, source,
                            registry, s.schedule, phase));
    s.phases.push_back(std::move(phase));
  }
  for (size_t i = 0; i < n; ++i) {
    if (!s.phases[i].fresh_optimizer()) continue;
    const std::string path =
        fmt::format("phases[{}].{}", i, s.phases[i].finetune ? "finetune" : "no_load_optim");
    if (i == 0) return r.error(path, "the first phase loads no checkpoint");
    if (s.phases[i].finetune && s.phases[i].steps == 0 && s.phases[i].saves()) {
      // training.py: the exit save is made only at an iteration != 0.
      return r.error(path,
                     "a --finetune job of no steps ends at iteration 0, where the training loop "
                     "makes no save; give it steps or \"save\": false");
    }
    // The reference run starts its optimizer afresh where the phase's first step is planned
    // (and a --finetune phase's iterations count from there); after a storage fault the phase
    // may resume elsewhere (not modeled).
    if (s.has_storage_faults()) {
      return r.error(path,
                     "not modeled together with storage_faults (the fresh optimizer's "
                     "reference needs the phase to resume where the previous one ended)");
    }
  }
  if (s.total_steps() > Scenario::kStepsMax) {
    return r.error("phases",
                   fmt::format("total steps {} exceed {}", s.total_steps(), Scenario::kStepsMax));
  }
  if (s.total_numel() *
          std::max<int64_t>(1, s.total_steps() + static_cast<int64_t>(s.phases.size())) >
      Scenario::kStateElementsMax) {
    return r.error(
        "phases",
        fmt::format("total numel x steps exceeds {} (the recorded states would be too large)",
                    Scenario::kStateElementsMax));
  }
  return Status::ok();
}

Status parse_faults_and_expect(const Reader& r, const json& j, Scenario& s) {
  if (j.contains("faults")) {
    if (!j["faults"].is_array()) return r.error("faults", "must be an array of fault site names");
    for (size_t i = 0; i < j["faults"].size(); ++i) {
      const json& f = j["faults"][i];
      if (!f.is_string() || !model::is_fault_site(f.get<std::string>())) {
        std::string known;
        for (const auto& site : model::fault_sites())
          known += (known.empty() ? "" : ", ") + site.name;
        return r.error(fmt::format("faults[{}]", i),
                       "unknown fault site " + f.dump() + " (known: " + known + ")");
      }
      s.faults.push_back(f.get<std::string>());
    }
  }
  if (j.contains("expect")) {
    const json& e = j["expect"];
    if (!e.is_object()) return r.error("expect", "must be an object");
    CKPTSIM_TRY(r.check_fields(e, "expect", {"ok", "properties", "detail_contains"}));
    s.expect = e;
  }
  return Status::ok();
}

}  // namespace

Result<Revision> resolve_revision(model::RevisionRegistry& registry, const std::string& name) {
  auto profile = registry.get(name);
  if (!profile.is_ok()) return profile.status();
  return Revision{name, std::make_shared<const model::RevisionProfile>(profile.value())};
}

namespace {

Result<Scenario> parse_scenario_text(const std::string& json_text, const std::string& source,
                                     model::RevisionRegistry& registry) {
  const Reader r(source);
  if (model::json_nests_deeper_than(json_text)) {
    return Status::invalid_input(
        fmt::format("{}: nested deeper than kJsonDepthMax={}", source, model::kJsonDepthMax));
  }
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return Status::invalid_input(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) return Status::invalid_input(source + ": a scenario must be a JSON object");
  CKPTSIM_TRY(r.check_fields(
      j, "",
      {"seed", "name", "description", "params", "optimizer", "bucket_size",
       "pad_buckets_for_high_nccl_busbw", "sharding_type", "fully_reshardable_mem_efficient",
       "samples_per_step", "schedule", "phases", "faults", "expect"}));
  Scenario s;
  s.source = source;
  int64_t seed = 0;
  CKPTSIM_TRY(r.integer(j, "seed", "seed", 0, std::numeric_limits<int64_t>::max(), seed));
  s.seed = static_cast<uint64_t>(seed);
  CKPTSIM_TRY(r.string(j, "name", "name", s.name, std::string()));
  // Unnamed: the file's stem, so that the trace (and its hash) does not depend on how the
  // path was spelled.
  if (s.name.empty()) s.name = std::filesystem::path(source).stem().string();
  CKPTSIM_TRY(r.string(j, "description", "description", s.description, std::string()));
  CKPTSIM_TRY(parse_params(r, j, s));
  CKPTSIM_TRY(parse_optimizer(r, j, s.optimizer));
  CKPTSIM_TRY(parse_layout(r, j, s));
  s.schedule = model::ScheduleConfig::constant(s.optimizer.adam.lr, s.optimizer.adam.weight_decay);
  CKPTSIM_TRY(parse_schedule(r, j, "schedule", /*with_lr=*/false, s.schedule));
  CKPTSIM_TRY(parse_phases(r, j, source, registry, s));
  CKPTSIM_TRY(check_model_parallel(r, s));
  for (size_t i = 0; i < s.phases.size(); ++i) {
    const model::CheckpointFormat f = s.format_of(i);
    if (f.sharding_type == model::ShardingType::kFullyShardedModelSpace && s.phases[i].save &&
        !s.phases[i].profile->switches.flattened_range_refused) {
      return r.error(fmt::format("phases[{}].revision", i),
                     "'" + s.phases[i].revision +
                         "' warns about a flattened_range where upstream refuses it; its "
                         "fully_sharded_model_space save is not modeled");
    }
    if (f.mem_efficient && f.sharding_type != model::ShardingType::kFullyReshardable) {
      const bool own = s.phases[i].mem_efficient.value_or(false);
      return r.error(own ? fmt::format("phases[{}].fully_reshardable_mem_efficient", i)
                         : std::string("fully_reshardable_mem_efficient"),
                     "only with sharding_type fully_reshardable (phase " + std::to_string(i) +
                         " saves in " + model::sharding_type_name(f.sharding_type) + ")");
    }
  }
  CKPTSIM_TRY(parse_faults_and_expect(r, j, s));
  return s;
}

}  // namespace

Result<Scenario> parse_scenario(const std::string& json_text, const std::string& source,
                                model::RevisionRegistry& registry) {
  Result<Scenario> s = parse_scenario_text(json_text, source, registry);
  if (!s.is_ok()) return s.status().on_one_line();  // a field name may hold a newline
  return s;
}

Result<Scenario> load_scenario_file(const std::string& path, model::RevisionRegistry& registry) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return Status::invalid_input(path + ": is a directory, not a scenario file");
  std::ifstream in(path);
  if (!in) return Status::not_found(path + ": cannot open scenario file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_scenario(ss.str(), path, registry);
}

namespace {

// The fields of `c` that differ from `base` (so that a default schedule writes nothing).
json schedule_json(const model::ScheduleConfig& c, const model::ScheduleConfig& base,
                   bool with_lr) {
  json j = json::object();
  auto put = [&](const char* key, auto value, auto base_value) {
    if (value != base_value) j[key] = value;
  };
  if (with_lr) put("lr", c.lr, base.lr);
  put("min_lr", c.min_lr, base.min_lr);
  put("lr_warmup_init", c.lr_warmup_init, base.lr_warmup_init);
  put("lr_warmup_iters", c.lr_warmup_iters, base.lr_warmup_iters);
  put("lr_decay_iters", c.lr_decay_iters, base.lr_decay_iters);
  if (c.lr_decay_style != base.lr_decay_style)
    j["lr_decay_style"] = model::lr_decay_style_name(c.lr_decay_style);
  put("start_weight_decay", c.start_wd, base.start_wd);
  put("end_weight_decay", c.end_wd, base.end_wd);
  if (c.wd_incr_style != base.wd_incr_style)
    j["weight_decay_incr_style"] = model::wd_incr_style_name(c.wd_incr_style);
  put("train_iters", c.wd_incr_iters, base.wd_incr_iters);
  return j;
}

}  // namespace

namespace {

// The optimizer's fields, each only where it differs from its default (the required ones always).
json optimizer_json(const model::OptimizerConfig& c) {
  json o{{"kind", model::optimizer_kind_name(c.kind)},
         {"lr", c.adam.lr},
         {"betas", {c.adam.beta1, c.adam.beta2}},
         {"eps", c.adam.eps},
         {"weight_decay", c.adam.weight_decay}};
  if (c.kind == model::OptimizerKind::kHybrid) {
    o["offload_fraction"] = c.offload_fraction;
    if (c.overlap_cpu_optimizer_d2h_h2d) o["overlap_cpu_optimizer_d2h_h2d"] = true;
    if (!c.te_installed) o["transformer_engine"] = model::te_presence_name(false);
  }
  if (c.precision_aware) o["precision_aware"] = true;
  for (const auto& [key, d] : {std::pair{"exp_avg_dtype", c.exp_avg_dtype},
                               std::pair{"exp_avg_sq_dtype", c.exp_avg_sq_dtype}}) {
    if (d != model::StateDType::kFloat32) o[key] = model::state_dtype_name(d);
  }
  if (c.uses_precision_aware() && !c.store_param_remainders) o["store_param_remainders"] = false;
  return o;
}

}  // namespace

json scenario_to_json(const Scenario& s) {
  json j;
  j["seed"] = s.seed;
  if (!s.name.empty()) j["name"] = s.name;
  if (!s.description.empty()) j["description"] = s.description;
  j["params"] = json::array();
  for (const auto& p : s.params) {
    json pj{{"name", p.name}, {"numel", p.numel}, {"dtype", model::dtype_name(p.dtype)}};
    if (p.wd_mult != 1.0) pj["wd_mult"] = p.wd_mult;
    if (p.lr_mult != 1.0) pj["lr_mult"] = p.lr_mult;
    if (!p.shape.empty()) pj["shape"] = p.shape;
    if (p.tp_split != model::TpSplit::kReplicated)
      pj["tp_split"] = model::tp_split_name(p.tp_split);
    if (p.layer != 0) pj["layer"] = p.layer;
    if (p.expert) pj["expert"] = true;
    j["params"].push_back(pj);
  }
  j["optimizer"] = optimizer_json(s.optimizer);
  j["bucket_size"] = s.bucket_size.has_value() ? json(*s.bucket_size) : json(nullptr);
  if (s.pad_buckets_for_high_nccl_busbw) j["pad_buckets_for_high_nccl_busbw"] = true;
  j["sharding_type"] = model::sharding_type_name(s.format.sharding_type);
  if (s.format.mem_efficient) j["fully_reshardable_mem_efficient"] = true;
  if (s.samples_per_step != 8) j["samples_per_step"] = s.samples_per_step;
  const json schedule = schedule_json(
      s.schedule,
      model::ScheduleConfig::constant(s.optimizer.adam.lr, s.optimizer.adam.weight_decay),
      /*with_lr=*/false);
  if (!schedule.empty()) j["schedule"] = schedule;
  j["phases"] = json::array();
  for (const auto& p : s.phases) {
    json pj{{"dp", p.dp}, {"revision", p.revision}, {"steps", p.steps}};
    if (p.tp != 1) pj["tp"] = p.tp;
    if (p.pp != 1) pj["pp"] = p.pp;
    if (p.ep != 1) pj["ep"] = p.ep;
    if (!p.save) pj["save"] = false;
    if (p.save_interval != 0) pj["save_interval"] = p.save_interval;
    if (p.async_save) pj["async_save"] = true;
    if (p.async_write_steps != 0) pj["async_write_steps"] = p.async_write_steps;
    if (p.no_load_optim) pj["no_load_optim"] = true;
    if (p.finetune) pj["finetune"] = true;
    // Written as given, even when equal to the scenario's (a round trip keeps it).
    if (p.schedule.has_value()) pj["schedule"] = schedule_json(*p.schedule, s.schedule, true);
    if (p.opt_param_scheduler != model::SchedulerResume::kNeither)
      pj["opt_param_scheduler"] = model::scheduler_resume_name(p.opt_param_scheduler);
    if (p.sharding_type.has_value())
      pj["sharding_type"] = model::sharding_type_name(*p.sharding_type);
    if (p.mem_efficient.has_value()) pj["fully_reshardable_mem_efficient"] = *p.mem_efficient;
    for (const auto& f : p.storage_faults) {
      pj["storage_faults"].push_back({{"kind", model::storage_fault_kind_name(f.kind)},
                                      {"file", save_file_name(f.file)},
                                      {"nth", f.nth}});
    }
    j["phases"].push_back(pj);
  }
  if (!s.faults.empty()) j["faults"] = s.faults;
  if (!s.expect.is_null()) j["expect"] = s.expect;
  return j;
}

}  // namespace ckptsim::sim
