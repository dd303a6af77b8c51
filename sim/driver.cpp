#include "sim/driver.h"

#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <memory>

#include <ATen/ops/empty.h>

#include "model/faults.h"
#include "model/megatron/mapping.h"
#include "model/py/pickle_codec.h"
#include "sim/gradients.h"
#include "sim/local_world.h"

namespace ckptsim::sim {

namespace {

using model::Dict;
using model::Value;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Runtime phase id of the reference run (its streams differ from every checkpointed phase).
constexpr int64_t kReferencePhaseId = 1'000'000;

// Initial model params: k/64 with |k| <= 32, exact in bf16, deterministic in (seed, param,
// element).
float initial_value(uint64_t seed, size_t param, int64_t element) {
  model::Rng r(
      model::mix_seed(model::mix_seed(seed ^ 0x5eedULL, param), static_cast<uint64_t>(element)));
  const int64_t k = static_cast<int64_t>(r.next_u64() % 65) - 32;
  return static_cast<float>(k) / 64.0F;
}

std::vector<float> tensor_floats(const at::Tensor& t) {
  const at::Tensor f = t.to(at::kFloat).to(at::kCPU).contiguous();
  return {f.data_ptr<float>(), f.data_ptr<float>() + f.numel()};
}

struct StepOut {
  std::vector<model::StepUse> uses;
  std::vector<model::ShardSnapshot> snapshot;
  std::vector<std::vector<float>> params;  // rank 0 only
  std::string groups;                      // rank 0 only
};

struct RankOut {
  std::vector<std::string> trace;
  std::optional<RankError> error;
  std::optional<std::vector<model::ShardSnapshot>> after_load;
  std::vector<std::vector<float>> after_load_params;  // rank 0 only
  int64_t start_step = 0;
  std::vector<StepOut> steps;
  std::optional<model::SaveReport> save;
  std::vector<model::ShardSnapshot> at_save_snapshot;
  std::vector<std::vector<float>> at_save_params;
  std::string at_save_groups;
  model::LoadReport load;
  std::vector<std::pair<std::string, int64_t>> firings;
  std::vector<BufferInfo> buffers;
  std::vector<std::vector<float>> initial_params;  // rank 0, before any step
  std::vector<model::ShardSnapshot> initial_snapshot;
  std::string initial_groups;
  std::string after_load_groups;
  std::vector<model::BufferLayout> layouts;
};

// Python repr of a value as a checkpoint would give it back: pickling writes a symbol (a class
// object) as its name string, so symbols print as strings here.
std::string checkpoint_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kSymbol:
      return model::py_str_repr(v.as_symbol().name);
    case Value::Kind::kDict: {
      std::string out = "{";
      for (const auto& [k, item] : *v.dict()) {
        if (out.size() > 1) out += ", ";
        out += k.repr() + ": " + checkpoint_repr(item);
      }
      return out + "}";
    }
    case Value::Kind::kList: {
      std::string out = "[";
      for (const auto& item : *v.list()) {
        if (out.size() > 1) out += ", ";
        out += checkpoint_repr(item);
      }
      return out + "]";
    }
    default:
      return v.repr();
  }
}

// Rank 0's state_dict() param groups as a checkpoint would hold them.
std::string groups_text(model::DistributedOptimizer& opt) {
  try {
    return checkpoint_repr(opt.state_dict().dict()->at("optimizer").dict()->at("param_groups"));
  } catch (const model::UpstreamError& e) {
    return std::string("<state_dict() raised ") + e.what() + ">";
  }
}

struct PhaseJob {
  const Scenario* scenario = nullptr;
  int64_t phase_id = 0;
  int64_t dp = 1;
  int64_t steps = 0;
  const model::RevisionSwitches* switches = nullptr;
  model::Storage* load_from = nullptr;  // null: fresh start
  model::Storage* save_to = nullptr;    // null: no save
  bool real_cuda = false;
};

uint64_t snapshot_hash(const std::vector<model::ShardSnapshot>& snap,
                       const std::vector<std::vector<float>>& params) {
  uint64_t h = fnv1a(nullptr, 0);
  for (const auto& s : snap) {
    h = fnv1a(&s.model_param, sizeof s.model_param, h);
    h = fnv1a(s.master.data(), s.master.size() * sizeof(float), h);
    h = fnv1a(s.exp_avg.data(), s.exp_avg.size() * sizeof(float), h);
    h = fnv1a(s.exp_avg_sq.data(), s.exp_avg_sq.size() * sizeof(float), h);
    const double step = s.step.value_or(-1.0);
    h = fnv1a(&step, sizeof step, h);
  }
  for (const auto& p : params) h = fnv1a(p.data(), p.size() * sizeof(float), h);
  return h;
}

// Mirrors megatron/training/checkpointing.py generate_state_dict() for one model chunk.
Value generate_state_dict(model::DistributedDataParallel& ddp, model::DistributedOptimizer& opt,
                          int64_t iteration, bool is_loading, model::Runtime& rt, int rank) {
  auto sd = Dict::make({{"checkpoint_version", Value(3.0)}, {"iteration", Value(iteration)}});
  const Value model_sd = ddp.sharded_state_dict();
  sd->set("model", model_sd);
  sd->set("optimizer", opt.sharded_state_dict(model_sd, is_loading, "dp_reshardable"));
  // Fault site save.rank_dependent_common: a common leaf that differs per rank.
  if (!is_loading && rt.fault(model::fault::kRankDependentCommon))
    sd->set("ckptsim_rank", Value(int64_t{rank}));
  return Value(sd);
}

RankError make_error(int rank, const std::string& stage) {
  RankError e;
  e.rank = rank;
  e.stage = stage;
  return e;
}

void rank_main(const PhaseJob& job, model::ProcessGroup& pg, RankOut& out) {
  const Scenario& s = *job.scenario;
  const int rank = pg.rank();
  model::Runtime rt(s.seed, job.phase_id, rank, job.real_cuda);
  rt.enable_faults(s.faults);
  std::string stage = "init";
  try {
    model::LayoutOptions layout;
    layout.dp_size = job.dp;
    layout.bucket_size = s.bucket_size;
    layout.pad_buckets_for_high_nccl_busbw = s.pad_buckets_for_high_nccl_busbw;
    model::DistributedDataParallel ddp(rt, s.params, layout, pg);
    for (size_t i = 0; i < s.params.size(); ++i) {
      at::Tensor src = at::empty({s.params[i].numel}, at::TensorOptions().dtype(at::kFloat));
      float* init = src.data_ptr<float>();
      for (int64_t e = 0; e < s.params[i].numel; ++e) init[e] = initial_value(s.seed, i, e);
      at::Tensor p = ddp.param(i);
      p.copy_(src);
    }
    for (const auto& buffer : ddp.buffers()) {
      out.layouts.push_back(buffer.layout);
      BufferInfo info;
      info.dtype_key = buffer.dtype_key().repr();
      for (const auto& b : buffer.layout.buckets) info.numel_unpadded.push_back(b.numel_unpadded);
      out.buffers.push_back(std::move(info));
    }
    model::DistributedOptimizer opt(rt, ddp, s.optimizer, *job.switches);
    auto model_params = [&] {
      std::vector<std::vector<float>> ps;
      if (rank == 0) {
        for (size_t i = 0; i < s.params.size(); ++i) ps.push_back(tensor_floats(ddp.param(i)));
      }
      return ps;
    };
    out.initial_snapshot = opt.snapshot();
    out.initial_params = model_params();
    if (rank == 0 && job.phase_id == 0) out.initial_groups = groups_text(opt);

    int64_t iteration = 0;
    if (job.load_from != nullptr) {
      stage = "load";
      const Value request = generate_state_dict(ddp, opt, iteration, /*is_loading=*/true, rt, rank);
      model::LoadOptions lo;
      lo.merge.truncate_optimizer_param_state_lists =
          job.switches->merge_truncates_param_state_lists;
      lo.strip_common_param_state = job.switches->load_strips_common_param_state;
      const Value loaded = model::load(request, *job.load_from, pg, rt, lo, &out.load);
      // model.load_state_dict(): the params were read in place; copy for fidelity.
      const Dict& model_sd = *loaded.dict()->at("model").dict();
      for (size_t i = 0; i < s.params.size(); ++i)
        model::py_copy_(ddp.param(i), model_sd.at(s.params[i].name).tensor());
      opt.load_state_dict(loaded.dict()->at("optimizer"));
      iteration = loaded.dict()->at("iteration").as_int();
      out.after_load = opt.snapshot();
      out.after_load_params = model_params();
      if (rank == 0) out.after_load_groups = groups_text(opt);
      out.trace.push_back(fmt::format("load phase={} rank={} iteration={} state={:016x}",
                                      job.phase_id, rank, iteration,
                                      snapshot_hash(*out.after_load, out.after_load_params)));
    }
    out.start_step = iteration;

    stage = "train";
    const GradientSpec grad_spec{s.seed, s.samples_per_step};
    const float scale = 1.0F / static_cast<float>(s.samples_per_step);
    for (int64_t k = 0; k < job.steps; ++k) {
      const int64_t global_step = iteration + 1;
      ddp.zero_grad_buffer();
      for (size_t i = 0; i < s.params.size(); ++i) {
        at::Tensor g = ddp.main_grad(i);
        at::Tensor host =
            g.is_cuda() ? at::empty({g.numel()}, at::TensorOptions().dtype(at::kFloat)) : g;
        std::span<float> span{host.data_ptr<float>(), static_cast<size_t>(host.numel())};
        local_gradient(grad_spec, global_step, static_cast<int64_t>(i), 0, rank, job.dp, span);
        for (float& x : span) x *= scale;
        if (g.is_cuda()) g.copy_(host);
      }
      ddp.finish_grad_sync();
      opt.apply_schedule(s.optimizer.lr, s.optimizer.weight_decay);
      opt.step();
      ddp.start_param_sync();
      iteration = global_step;
      // Param groups only where a checker reads them: the state a phase ends (and saves) in.
      const bool last = k + 1 == job.steps && job.phase_id != kReferencePhaseId;
      StepOut step_out{opt.last_step_uses(), opt.snapshot(), model_params(),
                       rank == 0 && last ? groups_text(opt) : ""};
      out.trace.push_back(fmt::format("step phase={} global={} rank={} state={:016x}", job.phase_id,
                                      global_step, rank,
                                      snapshot_hash(step_out.snapshot, step_out.params)));
      out.steps.push_back(std::move(step_out));
    }

    if (job.save_to != nullptr) {
      stage = "save";
      const Value sd = generate_state_dict(ddp, opt, iteration, /*is_loading=*/false, rt, rank);
      out.save = model::save(sd, *job.save_to, pg);
      out.at_save_snapshot = opt.snapshot();
      out.at_save_params = model_params();
      if (rank == 0) out.at_save_groups = groups_text(opt);
      out.trace.push_back(fmt::format("save phase={} rank={} iteration={} pieces={}", job.phase_id,
                                      rank, iteration, out.save->pieces.size()));
    }
    out.firings = rt.fault_firings();
  } catch (const model::MergeError& e) {
    RankError err = make_error(rank, stage);
    err.py_type = e.py_type();
    err.message = e.message();
    err.site = e.site();
    err.merge_kind = e.kind();
    err.merge_path = e.path();
    out.error = err;
    out.firings = rt.fault_firings();
    throw;
  } catch (const model::UpstreamError& e) {
    RankError err = make_error(rank, stage);
    err.py_type = e.py_type();
    err.message = e.message();
    err.site = e.site();
    out.error = err;
    out.firings = rt.fault_firings();
    throw;
  } catch (const PeerAborted& e) {
    RankError err = make_error(rank, stage);
    err.py_type = "PeerAborted";
    err.message = e.what();
    err.secondary = true;
    out.error = err;
    throw;
  } catch (const std::exception& e) {
    // An InvariantViolation (a ckptsim bug) or a torch error outside the modeled sites.
    RankError err = make_error(rank, stage);
    err.py_type = model::exception_py_type(e);
    err.message = model::exception_text(e);
    out.error = err;
    throw;
  }
}

std::vector<RankOut> run_world(const PhaseJob& job) {
  std::vector<RankOut> outs(static_cast<size_t>(job.dp));
  LocalWorld world(static_cast<int>(job.dp));
  world.run(
      [&](model::ProcessGroup& pg) { rank_main(job, pg, outs[static_cast<size_t>(pg.rank())]); });
  return outs;
}

ModelState gather_state(const Scenario& s, int64_t global_step,
                        const std::vector<const std::vector<model::ShardSnapshot>*>& snaps,
                        const std::vector<const std::vector<model::StepUse>*>& uses,
                        const std::vector<std::vector<float>>& params, std::string groups) {
  ModelState st;
  st.global_step = global_step;
  st.param_groups = std::move(groups);
  for (const auto& p : s.params) {
    const auto n = static_cast<size_t>(p.numel);
    st.master.emplace_back(n, kNaN);
    st.exp_avg.emplace_back(n, kNaN);
    st.exp_avg_sq.emplace_back(n, kNaN);
    st.moments_present.emplace_back(n, 0);
  }
  st.param = params;
  for (size_t r = 0; r < snaps.size(); ++r) {
    if (snaps[r] == nullptr) continue;
    for (const auto& shard : *snaps[r]) {
      const auto begin = static_cast<size_t>(shard.param_range.start);
      auto put = [&](std::vector<float>& dst, const std::vector<float>& src) {
        // A state tensor of the wrong size (an upstream mix-up such as B8) leaves the elements
        // unreported (NaN), which the trajectory check reports as missing state.
        if (src.size() != static_cast<size_t>(shard.param_range.size())) return;
        std::copy(src.begin(), src.end(), dst.begin() + static_cast<std::ptrdiff_t>(begin));
      };
      put(st.master[shard.model_param], shard.master);
      put(st.exp_avg[shard.model_param], shard.exp_avg);
      put(st.exp_avg_sq[shard.model_param], shard.exp_avg_sq);
      if (shard.exp_avg.size() == static_cast<size_t>(shard.param_range.size())) {
        std::fill_n(
            st.moments_present[shard.model_param].begin() + static_cast<std::ptrdiff_t>(begin),
            shard.param_range.size(), uint8_t{1});
      }
      ShardRecord rec;
      rec.param = shard.model_param;
      rec.range = shard.param_range;
      rec.rank = static_cast<int>(r);
      rec.step_aliases = shard.step_aliases;
      rec.part = shard.part;
      rec.kernel = shard.kernel;
      rec.counter = shard.step;
      if (uses.size() > r && uses[r] != nullptr) {
        for (const auto& u : *uses[r]) {
          if (u.model_param == shard.model_param) rec.step_used = u.step;
        }
      }
      st.shards.push_back(rec);
    }
  }
  return st;
}

// Every optimizer key of a checkpoint as one global tensor (floats), read back from storage.
std::map<std::string, std::vector<float>> assemble_checkpoint(
    const model::Storage& storage, const std::vector<model::SavedPiece>& pieces) {
  std::map<std::string, std::vector<float>> out;
  std::map<std::string, std::vector<char>> files;
  for (const auto& p : pieces) {
    if (p.key.rfind("optimizer.distributed.", 0) != 0) continue;
    auto& values = out[p.key];
    if (values.empty()) values.assign(static_cast<size_t>(p.global_numel), kNaN);
    auto it = files.find(p.file);
    if (it == files.end()) {
      auto bytes = storage.read_file(p.file);
      CKPTSIM_CHECK(bytes.is_ok(),
                    "a saved piece's file cannot be read back: " + bytes.status().to_string());
      it = files.emplace(p.file, std::move(bytes.value())).first;
    }
    at::ScalarType dtype = at::kFloat;
    for (at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
      if (model::torch_dtype_name(t) == p.dtype) dtype = t;
    }
    at::Tensor src = at::empty({p.numel}, at::TensorOptions().dtype(dtype));
    const size_t bytes = static_cast<size_t>(p.numel) * src.element_size();
    CKPTSIM_CHECK(static_cast<size_t>(p.byte_offset) + bytes <= it->second.size(),
                  "piece beyond its file");
    std::memcpy(src.data_ptr(), it->second.data() + p.byte_offset, bytes);
    const at::Tensor f = src.to(at::kFloat);
    std::copy(f.data_ptr<float>(), f.data_ptr<float>() + p.numel, values.begin() + p.global_offset);
  }
  return out;
}

void collect_errors(const std::vector<RankOut>& outs, std::vector<RankError>& errors) {
  for (const auto& o : outs) {
    if (o.error.has_value()) errors.push_back(*o.error);
  }
}

}  // namespace

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t ModelState::hash() const {
  uint64_t h = fnv1a(&global_step, sizeof global_step);
  for (const auto* group : {&master, &exp_avg, &exp_avg_sq, &param}) {
    for (const auto& v : *group) h = fnv1a(v.data(), v.size() * sizeof(float), h);
  }
  for (const auto& s : shards) {
    const double c = s.counter.value_or(-1.0);
    const double u = s.step_used.value_or(-1.0);
    h = fnv1a(&c, sizeof c, h);
    h = fnv1a(&u, sizeof u, h);
  }
  return h;
}

std::string RankError::summary() const {
  std::string out = fmt::format("rank {} {}: {}: {}", rank, stage, py_type, message);
  if (!site.empty()) out += " [" + site + "]";
  return out;
}

const ModelState* PhaseRecord::final_state() const {
  if (!after_step.empty()) return &after_step.back();
  if (after_load.has_value()) return &*after_load;
  if (index > 0) return nullptr;  // the load failed: the phase never had a state to save
  return initial.has_value() ? &*initial : nullptr;
}

const ModelState* RunResult::reference_at(int64_t global_step) const {
  if (global_step == 0) return &reference_initial;
  if (global_step < 1 || global_step > static_cast<int64_t>(reference.size())) return nullptr;
  return &reference[static_cast<size_t>(global_step - 1)];
}

Result<RunResult> run_scenario(const Scenario& scenario, model::RevisionRegistry& registry,
                               const RunOptions& options) {
  RunResult result;
  result.scenario = scenario;
  std::vector<model::RevisionProfile> profiles;
  std::string revisions;
  for (const auto& p : scenario.phases) {
    auto profile = registry.get(p.revision);
    if (!profile.is_ok()) return profile.status();
    revisions += (revisions.empty() ? "" : ",") + profile.value().name;
    profiles.push_back(profile.value());
  }
  result.trace.push_back(fmt::format("seed={} revision={} scenario={}", scenario.seed, revisions,
                                     scenario.name.empty() ? scenario.source : scenario.name));
  std::string why_not;
  const bool have_gpu = model::real_cuda_available(&why_not);
  if (options.device == DeviceChoice::kCuda && !have_gpu) {
    return Status::invalid_input("--device cuda: no GPU can hold the state here (" + why_not + ")");
  }
  result.gpu_resident =
      options.device == DeviceChoice::kCuda || (options.device == DeviceChoice::kAuto && have_gpu);
  {
    std::string derived = fmt::format(
        "options optimizer={} params={} total_numel={} bucket_size={} pad_65536={} "
        "samples_per_step={} phases=",
        model::optimizer_kind_name(scenario.optimizer.kind), scenario.params.size(),
        scenario.total_numel(),
        scenario.bucket_size ? std::to_string(*scenario.bucket_size) : "None",
        scenario.pad_buckets_for_high_nccl_busbw, scenario.samples_per_step);
    for (const auto& p : scenario.phases) derived += fmt::format("[dp={} steps={}]", p.dp, p.steps);
    if (!scenario.faults.empty()) {
      derived += " faults=";
      for (const auto& f : scenario.faults) derived += f + ";";
    }
    result.trace.push_back(derived);
  }

  // Checkpoint storage: memory by default, or a directory with one folder per phase.
  std::unique_ptr<model::Storage> root;
  if (options.checkpoint_dir.empty()) {
    root = std::make_unique<model::MemoryStorage>();
    result.checkpoint_location = "memory";
  } else {
    std::error_code ec;
    std::filesystem::create_directories(options.checkpoint_dir, ec);
    if (ec)
      return Status::io_error(options.checkpoint_dir +
                              ": cannot create checkpoint directory: " + ec.message());
    root = std::make_unique<model::DirectoryStorage>(options.checkpoint_dir);
    result.checkpoint_location = options.checkpoint_dir;
  }

  // 1. The uninterrupted reference run.
  {
    PhaseJob job;
    job.scenario = &scenario;
    job.phase_id = kReferencePhaseId;
    job.dp = scenario.phases.front().dp;
    job.steps = scenario.total_steps();
    job.switches = &profiles.front().switches;
    job.real_cuda = result.gpu_resident;
    const auto outs = run_world(job);
    collect_errors(outs, result.reference_errors);
    std::vector<const std::vector<model::ShardSnapshot>*> snaps;
    for (const auto& o : outs) snaps.push_back(&o.initial_snapshot);
    result.reference_initial = gather_state(scenario, 0, snaps, {}, outs.front().initial_params,
                                            outs.front().initial_groups);
    const size_t steps_done = result.reference_errors.empty() ? static_cast<size_t>(job.steps) : 0;
    for (size_t k = 0; k < steps_done; ++k) {
      std::vector<const std::vector<model::ShardSnapshot>*> step_snaps;
      std::vector<const std::vector<model::StepUse>*> step_uses;
      for (const auto& o : outs) {
        step_snaps.push_back(&o.steps.at(k).snapshot);
        step_uses.push_back(&o.steps.at(k).uses);
      }
      result.reference.push_back(gather_state(scenario, static_cast<int64_t>(k) + 1, step_snaps,
                                              step_uses, outs.front().steps.at(k).params,
                                              outs.front().steps.at(k).groups));
    }
    for (const auto& e : result.reference_errors)
      result.trace.push_back("reference error " + e.summary());
    result.trace.push_back(
        fmt::format("reference dp={} steps={} final={:016x}", job.dp, job.steps,
                    result.reference.empty() ? 0 : result.reference.back().hash()));
  }

  // 2. The phases.
  std::vector<std::unique_ptr<model::Storage>> stores;
  for (size_t i = 0; i < scenario.phases.size(); ++i) {
    const PhaseSpec& spec = scenario.phases[i];
    PhaseRecord rec;
    rec.index = i;
    rec.spec = spec;
    const bool previous_ok =
        i == 0 || (result.phases.back().completed && scenario.phases[i - 1].save);
    if (!previous_ok) {
      result.trace.push_back(fmt::format("phase={} not run: phase {} did not complete", i, i - 1));
      result.phases.push_back(std::move(rec));
      continue;
    }
    const std::string prefix = fmt::format("phase_{}", i);
    Status cleared = root->remove_all(prefix);
    if (!cleared.is_ok()) return cleared;
    stores.push_back(model::subdir(*root, prefix));
    if (i > 0 && scenario.phases[i - 1].dp != spec.dp) {
      result.trace.push_back(fmt::format("reshard dp {}->{}", scenario.phases[i - 1].dp, spec.dp));
    }
    result.trace.push_back(fmt::format("phase={} dp={} revision={} steps={}", i, spec.dp,
                                       profiles[i].name, spec.steps));
    PhaseJob job;
    job.scenario = &scenario;
    job.phase_id = static_cast<int64_t>(i);
    job.dp = spec.dp;
    job.steps = spec.steps;
    job.switches = &profiles[i].switches;
    job.real_cuda = result.gpu_resident;
    job.load_from = i > 0 ? stores[stores.size() - 2].get() : nullptr;
    job.save_to = spec.save ? stores.back().get() : nullptr;
    const auto outs = run_world(job);
    rec.ran = true;
    collect_errors(outs, rec.errors);
    rec.completed = rec.errors.empty();
    rec.start_step = outs.front().start_step;
    rec.buffers = outs.front().buffers;
    rec.layouts = outs.front().layouts;
    rec.layout_options.dp_size = spec.dp;
    rec.layout_options.bucket_size = scenario.bucket_size;
    rec.layout_options.pad_buckets_for_high_nccl_busbw = scenario.pad_buckets_for_high_nccl_busbw;
    if (i == 0 && !outs.front().layouts.empty()) {
      std::vector<const std::vector<model::ShardSnapshot>*> init;
      for (const auto& o : outs) init.push_back(&o.initial_snapshot);
      rec.initial = gather_state(scenario, 0, init, {}, outs.front().initial_params,
                                 outs.front().initial_groups);
    }
    for (const auto& o : outs) {
      for (const auto& f : o.firings) {
        auto it = std::find_if(rec.fault_firings.begin(), rec.fault_firings.end(),
                               [&](const auto& x) { return x.first == f.first; });
        if (it == rec.fault_firings.end()) {
          rec.fault_firings.push_back(f);
        } else {
          it->second += f.second;
        }
      }
      for (const auto& u : o.load.uncovered) rec.load_uncovered.push_back(u);
    }
    for (const auto& o : outs) {
      for (const auto& line : o.trace) result.trace.push_back(line);
    }
    if (i > 0 && std::all_of(outs.begin(), outs.end(),
                             [](const RankOut& o) { return o.after_load.has_value(); })) {
      std::vector<const std::vector<model::ShardSnapshot>*> snaps;
      for (const auto& o : outs) snaps.push_back(&*o.after_load);
      rec.after_load = gather_state(scenario, rec.start_step, snaps, {},
                                    outs.front().after_load_params, outs.front().after_load_groups);
    }
    size_t steps_everywhere = std::numeric_limits<size_t>::max();
    for (const auto& o : outs) steps_everywhere = std::min(steps_everywhere, o.steps.size());
    for (size_t k = 0; k < steps_everywhere; ++k) {
      std::vector<const std::vector<model::ShardSnapshot>*> snaps;
      std::vector<const std::vector<model::StepUse>*> uses;
      for (const auto& o : outs) {
        snaps.push_back(&o.steps[k].snapshot);
        uses.push_back(&o.steps[k].uses);
      }
      rec.after_step.push_back(gather_state(scenario, rec.start_step + static_cast<int64_t>(k) + 1,
                                            snaps, uses, outs.front().steps[k].params,
                                            outs.front().steps[k].groups));
    }
    if (std::all_of(outs.begin(), outs.end(),
                    [](const RankOut& o) { return o.save.has_value(); })) {
      rec.saved_pieces = outs.front().save->pieces;
      for (const auto& o : outs) rec.common_differences.push_back(o.save->common_state_differences);
      rec.checkpoint_values = assemble_checkpoint(*stores.back(), rec.saved_pieces);
      std::vector<const std::vector<model::ShardSnapshot>*> snaps;
      for (const auto& o : outs) snaps.push_back(&o.at_save_snapshot);
      rec.at_save =
          gather_state(scenario, rec.start_step + static_cast<int64_t>(rec.after_step.size()),
                       snaps, {}, outs.front().at_save_params, outs.front().at_save_groups);
    }
    for (const auto& e : rec.errors) {
      if (!e.secondary) result.trace.push_back("error " + e.summary());
    }
    for (const auto& [site, count] : rec.fault_firings) {
      result.trace.push_back(fmt::format("fault phase={} site={} fired={}", i, site, count));
    }
    if (options.progress) {
      std::string status = rec.completed ? fmt::format("ok, {} steps, saved {} pieces", spec.steps,
                                                       rec.saved_pieces.size())
                                         : "failed: " + rec.errors.front().summary();
      for (const auto& e : rec.errors) {
        if (!e.secondary) {
          status = "failed: " + e.summary();
          break;
        }
      }
      options.progress(
          fmt::format("phase {} (dp={}, {}): {}", i, spec.dp, profiles[i].name, status));
    }
    result.phases.push_back(std::move(rec));
  }
  uint64_t h = fnv1a(nullptr, 0);
  for (const auto& line : result.trace) h = fnv1a(line.data(), line.size(), h);
  result.trace_hash = h;
  result.trace.push_back(fmt::format("trace_hash={:016x}", h));
  return result;
}

}  // namespace ckptsim::sim
