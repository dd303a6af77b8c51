#include "sim/checkpoint_scenario.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "model/errors.h"
#include "model/megatron/mapping.h"
#include "model/megatron/optimizer_key.h"
#include "model/megatron/param_and_grad_buffer.h"

namespace ckptsim::sim {

namespace {

using model::TorchDistCheckpoint;
using model::Value;

// "w2" before "w10": digit runs compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0;
  size_t j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ei = i;
      size_t ej = j;
      while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
      while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
      const std::string na = a.substr(i, ei - i);
      const std::string nb = b.substr(j, ej - j);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ei;
      j = ej;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

std::string buffer_dtype_key(model::DType d) {
  return d == model::DType::kBFloat16 ? "(torch.bfloat16, torch.float32)"
                                      : "(torch.float32, torch.float32)";
}

// Every ShardedTensor that is no optimizer state, as a param (natural order of names).
Result<std::vector<model::ParamSpec>> read_params(const TorchDistCheckpoint& c) {
  std::vector<model::ParamSpec> params;
  for (const auto& [key, value] : *c.sharded.dict()) {
    const std::string name = key.as_str();
    if (!value.is_tensor() || c.object_unique_keys.contains(name) ||
        model::parse_chained_key(name).rest.starts_with("optimizer.")) {
      continue;
    }
    const at::Tensor& t = value.tensor();
    model::ParamSpec p;
    p.name = name;
    p.numel = t.numel();
    if (t.scalar_type() == at::kBFloat16) {
      p.dtype = model::DType::kBFloat16;
    } else if (t.scalar_type() == at::kFloat) {
      p.dtype = model::DType::kFloat32;
    } else {
      return Status::invalid_input(
          fmt::format("param '{}': dtype {} (the model has bf16 and fp32 params)", name,
                      model::torch_dtype_name(t.scalar_type())));
    }
    if (t.dim() > 2) {
      return Status::invalid_input(
          fmt::format("param '{}': {} dims (the model has 1-D and 2-D params)", name, t.dim()));
    }
    if (t.dim() == 2) p.shape = {t.size(0), t.size(1)};
    if (p.numel < 1 || p.numel > Scenario::kParamNumelMax) {
      return Status::invalid_input(fmt::format("param '{}': {} elements (the model takes 1 to {})",
                                               name, p.numel, Scenario::kParamNumelMax));
    }
    params.push_back(std::move(p));
  }
  if (params.empty()) return Status::invalid_input("no model params in the checkpoint");
  if (params.size() > Scenario::kParamsMax) {
    return Status::invalid_input(
        fmt::format("{} params (the model takes at most {})", params.size(), Scenario::kParamsMax));
  }
  std::sort(params.begin(), params.end(),
            [](const auto& a, const auto& b) { return natural_less(a.name, b.name); });
  return params;
}

// The param groups of the chain's part `part` (part 0: also an unchained checkpoint's).
Result<const model::List*> param_groups(const TorchDistCheckpoint& c, int64_t part = 0) {
  const std::string where =
      c.sharding_type == "fully_reshardable"
          ? std::string("the common state's ['optimizer']['optimizer']")
          : fmt::format("ShardedObject '{}{}'",
                        model::chained_parts(c) > 1 ? model::format_chained_prefix(part) : "",
                        model::format_object_key(0, "optimizer"));
  const Value* opt = model::optimizer_state_object(c, part);
  if (opt == nullptr) return Status::invalid_input("no " + where);
  const Value* groups = opt->dict()->find("param_groups");
  if (groups == nullptr || !groups->is_list() || groups->list()->empty()) {
    return Status::invalid_input(where + ": no param_groups");
  }
  for (const Value& g : *groups->list()) {
    if (!g.is_dict()) return Status::invalid_input(where + ": a param group that is no dict");
  }
  return &*groups->list();
}

double number(const model::Dict& group, const char* name, double fallback) {
  const Value* v = group.find(name);
  return v != nullptr && (v->is_float() || v->is_int()) ? v->as_float() : fallback;
}

Result<model::OptimizerConfig> read_optimizer(const model::List& groups) {
  const model::Dict& g0 = *groups.at(0).dict();
  model::OptimizerConfig cfg;
  if (g0.contains("cpu_optimizer_cls")) {
    cfg.kind = model::OptimizerKind::kHybrid;
    cfg.offload_fraction = number(g0, "offload_fraction", -1);
    if (cfg.offload_fraction < 0 || cfg.offload_fraction > 1) {
      return Status::invalid_input("param_groups[0]: hybrid without an offload_fraction in [0, 1]");
    }
    const Value* overlap = g0.find("overlap_cpu_optimizer_d2h_h2d");
    cfg.overlap_cpu_optimizer_d2h_h2d =
        overlap != nullptr && overlap->is_bool() && overlap->as_bool();
    const Value* gpu = g0.find("gpu_optimizer_cls");
    cfg.te_installed =
        gpu == nullptr || gpu->repr().find("torch.optim.adamw.AdamW") == std::string::npos;
  } else if (g0.contains("amsgrad")) {
    cfg.kind = model::OptimizerKind::kTorchAdamW;
  } else if (g0.contains("bias_correction")) {
    cfg.kind = model::OptimizerKind::kFusedAdam;
  } else {
    return Status::invalid_input(
        "param_groups[0]: neither the hybrid's, torch AdamW's nor FusedAdam's keys");
  }
  const Value* betas = g0.find("betas");
  if (betas == nullptr || !betas->is_tuple() || betas->as_tuple().size() != 2) {
    return Status::invalid_input("param_groups[0]: no betas pair");
  }
  cfg.adam.beta1 = betas->as_tuple()[0].as_float();
  cfg.adam.beta2 = betas->as_tuple()[1].as_float();
  cfg.adam.eps = number(g0, "eps", 1e-8);
  cfg.adam.lr = -1;
  cfg.adam.weight_decay = 0;
  for (const Value& g : groups) {
    const model::Dict& d = *g.dict();
    const double lr_mult = number(d, "lr_mult", 1.0);
    const double wd_mult = number(d, "wd_mult", 1.0);
    // max_lr, where the group has one, is --lr (times lr_mult); 'lr' is where the schedule was.
    if (cfg.adam.lr < 0 && lr_mult != 0) {
      cfg.adam.lr = number(d, "max_lr", number(d, "lr", 0)) / lr_mult;
      cfg.min_lr = number(d, "min_lr", 0) / lr_mult;
    }
    if (cfg.adam.weight_decay == 0 && wd_mult != 0) {
      cfg.adam.weight_decay = number(d, "weight_decay", 0) / wd_mult;
    }
  }
  if (cfg.adam.lr < 0) cfg.adam.lr = number(g0, "lr", 0);
  return cfg;
}

// One part of the distributed optimizer as its keys show it: the chain's part (nullopt: keys
// without 'chained_<i>.'), and its DP groups' keys dp_group_idx_0 .. groups - 1 (an expert part:
// one per EP rank, each holding that rank's piece of every expert param, rows split on dim 0).
struct PartView {
  std::optional<int64_t> chained_part;
  int64_t groups = 1;
  // Whether each bucket's 'param' (the master) must hold the saved param where the layout puts
  // it: not where a precision-aware optimizer saved it (int16 remainders of bf16 masters; the
  // fp32 masters TE keeps of fp32 params, which it never updates).
  bool check_masters = true;
};

// The checkpoint's DP-padded bucket numel (per_bucket_numel), or -1.
int64_t padded_numel(const TorchDistCheckpoint& c, const model::DpReshardableBucket& b) {
  const Value* per = c.sharded.dict()->find(model::bucket_object_key(b, "per_bucket_numel"));
  if (per == nullptr || !per->is_list() || per->list()->size() <= size_t(b.key.gbuf_idx)) return -1;
  const Value& by_dtype = per->list()->at(b.key.gbuf_idx);
  if (!by_dtype.is_dict()) return -1;
  for (const auto& [k, numels] : *by_dtype.dict()) {
    if (k.repr() != b.key.dtype || !numels.is_list() ||
        numels.list()->size() <= size_t(b.key.bucket_idx)) {
      continue;
    }
    const Value& n = numels.list()->at(b.key.bucket_idx);
    return n.is_int() ? n.as_int() : -1;
  }
  return -1;
}

const model::DpReshardableBucket* find_bucket(const TorchDistCheckpoint& c, const PartView& part,
                                              const model::OptimizerBucketKey& key) {
  const auto it = std::find_if(c.buckets.begin(), c.buckets.end(), [&](const auto& x) {
    return x.key == key && x.chained_part == part.chained_part;
  });
  return it == c.buckets.end() ? nullptr : &*it;
}

// Why bucket `b` of `layout` (params[members[i]] its params) is not the checkpoint's bucket of
// DP group `group`; "" when it is. `params` are the part's pieces (an expert param's EP piece).
std::string bucket_mismatch(const TorchDistCheckpoint& c, const PartView& part,
                            const model::OptimizerBucketKey& key, const model::BufferLayout& layout,
                            size_t b, const std::vector<model::ParamSpec>& params,
                            const std::vector<size_t>& members) {
  const model::DpReshardableBucket* saved = find_bucket(c, part, key);
  model::DpReshardableBucket want{key, part.chained_part, 0, {}};
  if (saved == nullptr) return "no bucket " + model::bucket_key_text(want);
  const std::string name = model::bucket_key_text(*saved);
  const model::BucketLayout& lb = layout.buckets[b];
  if (saved->numel_unpadded != lb.numel_unpadded) {
    return fmt::format("{}: {} elements where the layout has {}", name, saved->numel_unpadded,
                       lb.numel_unpadded);
  }
  const int64_t padded = padded_numel(c, *saved);
  if (padded >= 0 && padded != lb.numel) {
    return fmt::format("{}: padded to {} where the layout pads to {}", name, padded, lb.numel);
  }
  const auto master = saved->states.find("param");
  if (!part.check_masters || master == saved->states.end()) return "";
  for (size_t local : lb.params) {
    const model::ParamSpec& p = params[members[local]];
    const Value* whole = c.sharded.dict()->find(p.name);
    const int64_t start = layout.param_index_map[local].start - lb.offset;
    if (whole == nullptr || start + p.numel > master->second.numel() ||
        whole->tensor().numel() < (key.dp_group_idx + 1) * p.numel) {
      return "param " + p.name;
    }
    // The DP group's piece: the EP rank's rows of an expert param (the whole param otherwise).
    const at::Tensor s = whole->tensor().flatten().narrow(0, key.dp_group_idx * p.numel, p.numel);
    if (!at::equal(master->second.narrow(0, start, p.numel).to(s.scalar_type()), s)) {
      return fmt::format("param '{}' is not at [{}, {}) of {}", p.name, start, start + p.numel,
                         name);
    }
  }
  return "";
}

// Why `params` (the part's pieces, in model order) with these layout options do not reproduce
// the part's buckets in every one of its DP groups; "" when they do.
std::string layout_mismatch(const TorchDistCheckpoint& c, const PartView& part,
                            const std::vector<model::ParamSpec>& params,
                            const model::LayoutOptions& options) {
  std::vector<model::DType> dtypes;  // one buffer per dtype, in order of first use
  for (const auto& p : params) {
    if (std::find(dtypes.begin(), dtypes.end(), p.dtype) == dtypes.end()) dtypes.push_back(p.dtype);
  }
  size_t buckets_seen = 0;
  for (size_t g = 0; g < dtypes.size(); ++g) {
    std::vector<size_t> members;
    std::vector<int64_t> numels;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].dtype != dtypes[g]) continue;
      members.push_back(i);
      numels.push_back(params[i].numel);
    }
    model::BufferLayout layout;
    try {
      layout = model::build_buffer_layout(numels, options);
    } catch (const model::InvariantViolation& e) {
      return std::string("no layout: ") + e.what();
    }
    for (int64_t group = 0; group < part.groups; ++group) {
      for (size_t b = 0; b < layout.buckets.size(); ++b, ++buckets_seen) {
        const model::OptimizerBucketKey key{group, static_cast<int64_t>(g),
                                            buffer_dtype_key(dtypes[g]), static_cast<int64_t>(b),
                                            ""};
        if (std::string why = bucket_mismatch(c, part, key, layout, b, params, members);
            !why.empty()) {
          return why;
        }
      }
    }
  }
  const auto in_part =
      static_cast<size_t>(std::count_if(c.buckets.begin(), c.buckets.end(), [&](const auto& x) {
        return x.chained_part == part.chained_part;
      }));
  return buckets_seen == in_part
             ? ""
             : fmt::format("{} buckets where the layout has {}", in_part, buckets_seen);
}

// Megatron's default rule: no weight decay for biases and norms.
bool no_weight_decay(const std::string& name) {
  return name.ends_with("bias") || name.find("norm") != std::string::npos;
}

// Megatron's default rule for groups (no weight decay for biases and norms), checked against the
// checkpoint's groups and their order.
Status assign_groups(const model::List& groups, std::vector<model::ParamSpec>& params,
                     std::vector<std::string>& guesses) {
  if (groups.size() == 1) {
    const model::Dict& g = *groups.at(0).dict();
    for (auto& p : params) {
      p.wd_mult = number(g, "wd_mult", 1.0);
      p.lr_mult = number(g, "lr_mult", 1.0);
    }
    return Status::ok();
  }
  std::vector<std::pair<double, double>> want;  // (wd_mult, lr_mult) per group
  for (const Value& g : groups) {
    want.emplace_back(number(*g.dict(), "wd_mult", 1.0), number(*g.dict(), "lr_mult", 1.0));
  }
  std::vector<std::pair<double, double>> got;  // in order of first appearance
  for (auto& p : params) {
    p.wd_mult = no_weight_decay(p.name) ? 0.0 : 1.0;
    p.lr_mult = 1.0;
    const std::pair<double, double> k{p.wd_mult, p.lr_mult};
    if (std::find(got.begin(), got.end(), k) == got.end()) got.push_back(k);
  }
  if (got != want) {
    return Status::invalid_input(fmt::format(
        "{} param groups, and which param is in which is not in a checkpoint: Megatron's default "
        "rule (no weight decay for names ending in 'bias' or holding 'norm') does not give them; "
        "pass the scenario that saved it (--scenario)",
        groups.size()));
  }
  guesses.push_back(
      "param groups: by Megatron's default rule (no weight decay for names ending in 'bias' or "
      "holding 'norm'); the checkpoint does not say which param is in which group");
  return Status::ok();
}

// Each part's params against its own param groups (a chain's dense part: the dense params; its
// expert part: the expert params); the params keep their order.
Status assign_part_groups(const TorchDistCheckpoint& c, std::vector<model::ParamSpec>& params,
                          std::vector<std::string>& guesses) {
  if (model::chained_parts(c) == 1) {
    auto groups = param_groups(c);
    return groups.is_ok() ? assign_groups(*groups.value(), params, guesses) : groups.status();
  }
  std::vector<model::ParamSpec> assigned;
  for (const bool expert : {false, true}) {
    auto groups = param_groups(c, expert ? 1 : 0);
    if (!groups.is_ok()) return groups.status();
    std::vector<model::ParamSpec> mine;
    for (const auto& p : params) {
      if (p.expert == expert) mine.push_back(p);
    }
    if (Status st = assign_groups(*groups.value(), mine, guesses); !st.is_ok()) {
      return Status::invalid_input(
          fmt::format("the chain's {} part: {}", expert ? "expert" : "dense", st.message()));
    }
    assigned.insert(assigned.end(), mine.begin(), mine.end());
  }
  for (auto& p : params) {
    p = *std::find_if(assigned.begin(), assigned.end(),
                      [&](const auto& q) { return q.name == p.name; });
  }
  return Status::ok();
}

// The params in buffer order (the part's gbuf_idx order of dtypes, since a buffer is made at
// the first param of its dtype), each buffer's params in natural (reverse: false) or reverse
// natural order of names.
std::vector<model::ParamSpec> buffer_order(const TorchDistCheckpoint& c, const PartView& part,
                                           const std::vector<model::ParamSpec>& params,
                                           bool reverse) {
  std::map<int64_t, std::string> gbuf_dtypes;
  for (const auto& b : c.buckets) {
    if (b.chained_part == part.chained_part) gbuf_dtypes[b.key.gbuf_idx] = b.key.dtype;
  }
  std::vector<model::ParamSpec> out;
  for (const auto& [g, dtype] : gbuf_dtypes) {
    std::vector<model::ParamSpec> mine;
    for (const auto& p : params) {
      if (buffer_dtype_key(p.dtype) == dtype) mine.push_back(p);
    }
    if (reverse) std::reverse(mine.begin(), mine.end());
    out.insert(out.end(), mine.begin(), mine.end());
  }
  for (const auto& p : params) {  // params of a dtype no bucket has: the layout check refuses
    if (std::none_of(out.begin(), out.end(), [&](const auto& q) { return q.name == p.name; })) {
      out.push_back(p);
    }
  }
  return out;
}

// The pieces an expert part's DP groups hold: an expert param's EP piece (rows split on dim 0).
std::vector<model::ParamSpec> ep_pieces(std::vector<model::ParamSpec> params, int64_t ep) {
  for (auto& p : params) {
    p.numel /= ep;
    if (!p.shape.empty()) p.shape[0] /= ep;
  }
  return params;
}

// The optimizer's parts as the keys show them, and which params each holds: one part (every
// param), or a chain's dense part 0 and expert part 1 (the expert params, `ep` groups).
struct Parts {
  std::vector<PartView> views;
  std::vector<std::vector<model::ParamSpec>> params;  // per part, pieces (see ep_pieces)
};

Parts split_parts(const TorchDistCheckpoint& c, const std::vector<model::ParamSpec>& params,
                  int64_t ep, bool check_masters) {
  Parts out;
  if (model::chained_parts(c) == 1) {
    out.views.push_back({std::nullopt, 1, check_masters});
    out.params.push_back(params);
    return out;
  }
  for (const bool expert : {false, true}) {
    out.views.push_back({int64_t{expert ? 1 : 0}, expert ? ep : 1, check_masters});
    std::vector<model::ParamSpec> mine;
    for (const auto& p : params) {
      if (p.expert == expert) mine.push_back(p);
    }
    out.params.push_back(expert ? ep_pieces(mine, ep) : mine);
  }
  return out;
}

// The first of `orders` that reproduces the part's buckets with these options (its index), or
// nullopt; `why` gets the first reason.
std::optional<size_t> first_fitting(const TorchDistCheckpoint& c, const PartView& part,
                                    const std::vector<std::vector<model::ParamSpec>>& orders,
                                    const model::LayoutOptions& options, std::string& why) {
  for (size_t o = 0; o < orders.size(); ++o) {
    const std::string reason = layout_mismatch(c, part, orders[o], options);
    if (reason.empty()) return o;
    if (why.empty()) why = reason;
  }
  return std::nullopt;
}

// The bucket sizes to try: None (one bucket), then each bucket's numel that is not its
// buffer's last.
std::vector<std::optional<int64_t>> bucket_sizes(const TorchDistCheckpoint& c) {
  std::vector<std::optional<int64_t>> sizes{std::nullopt};
  std::map<std::tuple<std::optional<int64_t>, int64_t, std::string>, int64_t> last_bucket;
  for (const auto& b : c.buckets) {
    auto& last = last_bucket[{b.chained_part, b.key.gbuf_idx, b.key.dtype}];
    last = std::max(last, b.key.bucket_idx);
  }
  for (const auto& b : c.buckets) {
    if (b.key.bucket_idx < last_bucket[{b.chained_part, b.key.gbuf_idx, b.key.dtype}] &&
        std::find(sizes.begin(), sizes.end(), b.numel_unpadded) == sizes.end()) {
      sizes.push_back(b.numel_unpadded);
    }
  }
  return sizes;
}

std::string layout_guess(const std::vector<model::ParamSpec>& params, bool reversed,
                         std::optional<int64_t> size, bool pad) {
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name);
  return fmt::format(
      "param order: {} ({}), bucket_size {}{}: the first layout that reproduces every bucket",
      reversed ? "by buffer, names in reverse natural order" : "by buffer, names in natural order",
      fmt::join(names, ", "), size ? std::to_string(*size) : "None",
      pad ? ", padded for NCCL bus bandwidth" : "");
}

// Searches param order, bucket_size and padding for a layout that reproduces the checkpoint's
// buckets, in every part (a chain's dense part at DP `dp`, its expert part at expert-DP dp / ep).
Status find_layout(const TorchDistCheckpoint& c, int64_t dp, int64_t ep, bool check_masters,
                   Scenario& s, std::vector<std::string>& guesses) {
  const Parts parts = split_parts(c, s.params, ep, check_masters);
  std::string first_reason;
  for (const auto& size : bucket_sizes(c)) {
    for (bool pad : {false, true}) {
      std::vector<model::ParamSpec> found;  // the whole params, parts in order
      bool reversed = false;
      for (size_t i = 0; i < parts.views.size(); ++i) {
        const PartView& part = parts.views[i];
        const std::vector<std::vector<model::ParamSpec>> orders{
            buffer_order(c, part, parts.params[i], false),
            buffer_order(c, part, parts.params[i], true)};
        const auto o = first_fitting(c, part, orders, {dp / part.groups, size, pad}, first_reason);
        if (!o) break;
        reversed = reversed || *o == 1;
        for (const auto& piece : orders[*o]) {
          found.push_back(*std::find_if(s.params.begin(), s.params.end(),
                                        [&](const auto& p) { return p.name == piece.name; }));
        }
      }
      if (found.size() != s.params.size()) continue;
      s.params = found;
      s.bucket_size = size;
      s.pad_buckets_for_high_nccl_busbw = pad;
      guesses.push_back(layout_guess(found, reversed, size, pad));
      return Status::ok();
    }
  }
  return Status::invalid_input(
      "no param order and bucket size tried reproduce the checkpoint's buckets (" + first_reason +
      "); pass the scenario that saved it (--scenario)");
}

// A param's split across TP at save, from its chunks in `.metadata` (one per TP rank that saved
// a piece): one chunk of the whole shape is a replicated param; `tp` equal pieces along dim 0
// a column-parallel one, along dim 1 a row-parallel one.
Result<model::TpSplit> tp_split_from_chunks(const TorchDistCheckpoint& c, const model::ParamSpec& p,
                                            int64_t tp) {
  const auto it = c.tensor_chunks.find(p.name);
  if (it == c.tensor_chunks.end()) {
    return Status::invalid_input("param '" + p.name + "': no chunks in the .metadata");
  }
  const std::vector<model::ChunkStorageMetadata>& chunks = it->second;
  const std::vector<int64_t> shape = p.shape.empty() ? std::vector<int64_t>{p.numel} : p.shape;
  if (chunks.size() == 1 && chunks[0].sizes == shape) return model::TpSplit::kReplicated;
  for (size_t dim = 0; dim < shape.size(); ++dim) {
    const bool split_here =
        static_cast<int64_t>(chunks.size()) == tp && shape[dim] % tp == 0 &&
        std::all_of(chunks.begin(), chunks.end(), [&](const model::ChunkStorageMetadata& k) {
          for (size_t d = 0; d < shape.size(); ++d) {
            const int64_t size = d == dim ? shape[d] / tp : shape[d];
            if (k.sizes.size() != shape.size() || k.sizes[d] != size || k.offsets[d] % size != 0 ||
                (d != dim && k.offsets[d] != 0)) {
              return false;
            }
          }
          return true;
        });
    if (split_here) return dim == 0 ? model::TpSplit::kColumn : model::TpSplit::kRow;
  }
  return Status::invalid_input(
      fmt::format("param '{}': its {} chunk(s) in the .metadata are no TP {} split of shape ({}) "
                  "along dim 0 or 1; pass the scenario that saved it (--scenario)",
                  p.name, chunks.size(), tp, fmt::join(shape, ", ")));
}

// A fully_reshardable checkpoint: every param whole, in model space. Its shape is the tensor's,
// its TP split what the chunks show; no bucket layout is in the checkpoint (nor needed to load
// it), so the scenario's default layout (one bucket per buffer, names in natural order) is taken.
Status infer_model_space(const TorchDistCheckpoint& c, const SaveParallelism& at_save,
                         const model::List& groups, Scenario& s,
                         std::vector<std::string>& guesses) {
  if (at_save.pp != 1) {
    return Status::invalid_input(fmt::format(
        "saved at PP {}: which layer holds a param is not in a checkpoint; pass the scenario that "
        "saved it (--scenario)",
        at_save.pp));
  }
  for (auto& p : s.params) {
    if (at_save.tp == 1) continue;
    auto split = tp_split_from_chunks(c, p, at_save.tp);
    if (!split.is_ok()) return split.status();
    p.tp_split = split.value();
  }
  guesses.push_back(
      at_save.tp == 1
          ? "TP split: replicated for every param (a checkpoint saved at TP 1 does not show "
            "how a param splits; pass --scenario for a resume at another TP)"
          : fmt::format("TP split: read from each param's chunks at TP {} in the .metadata",
                        at_save.tp));
  // Megatron makes its param groups in the order of their first params: with several groups,
  // the params of each (by the default rule; assign_groups checks it) go together, in the
  // checkpoint's order of groups, names in natural order within one.
  if (groups.size() > 1) {
    std::vector<double> wd_order;
    for (const Value& g : groups) wd_order.push_back(number(*g.dict(), "wd_mult", 1.0));
    const auto group_of = [&](const model::ParamSpec& p) {
      return std::find(wd_order.begin(), wd_order.end(), no_weight_decay(p.name) ? 0.0 : 1.0) -
             wd_order.begin();
    };
    std::stable_sort(s.params.begin(), s.params.end(),
                     [&](const auto& a, const auto& b) { return group_of(a) < group_of(b); });
  }
  guesses.push_back(
      "bucket layout: one bucket per buffer; params in natural order of names, each param "
      "group's together in the checkpoint's order of groups (a fully_reshardable checkpoint "
      "holds each param whole, in no bucket; the layout does not change what loads)");
  return Status::ok();
}

// A chain of a dense and an expert part (an MoE model): the expert params are those whose
// `.metadata` chunks split dim 0 into the expert part's EP pieces (GroupedMLP's ShardedTensor,
// global over EP), the EP size the expert part's DP groups (dp_group_idx_<EP rank>, at TP = PP =
// 1). Returns the EP size (1 for a checkpoint of one part).
Result<int64_t> mark_experts(const TorchDistCheckpoint& c, std::vector<model::ParamSpec>& params) {
  const int64_t parts = model::chained_parts(c);
  if (parts == 1) return int64_t{1};
  if (parts != 2) {
    return Status::invalid_input(fmt::format(
        "keys of {} chained parts ('chained_0.' to 'chained_{}.'): the model chains a dense and "
        "an expert part; pass the scenario that saved it (--scenario)",
        parts, parts - 1));
  }
  int64_t ep = 0;
  for (const auto& b : c.buckets) {
    if (b.chained_part == 1) ep = std::max(ep, b.key.dp_group_idx + 1);
  }
  if (ep < 2) {
    return Status::invalid_input(
        "an expert part ('chained_1.') at expert_model_parallel_size 1: every param is saved "
        "whole, so which are expert params is not in the checkpoint; pass the scenario that "
        "saved it (--scenario)");
  }
  size_t experts = 0;
  for (auto& p : params) {
    const auto it = c.tensor_chunks.find(p.name);
    if (it == c.tensor_chunks.end() || it->second.size() < 2) continue;
    auto split = tp_split_from_chunks(c, p, ep);
    if (!split.is_ok() || split.value() != model::TpSplit::kColumn) {
      return Status::invalid_input(fmt::format(
          "param '{}': its {} chunks in the .metadata are no split of dim 0 over the expert "
          "part's EP size {} (its keys' dp_group_idx_0 to dp_group_idx_{})",
          p.name, it->second.size(), ep, ep - 1));
    }
    p.expert = true;
    ++experts;
  }
  if (experts == 0) {
    return Status::invalid_input(fmt::format(
        "an expert part ('chained_1.') at EP {}, but no param's chunks in the .metadata split "
        "over EP",
        ep));
  }
  return ep;
}

// Whether every value of `state` in every bucket is a bf16 value (and one is not zero): a
// moment TE's FusedAdam keeps in bf16 is saved unscaled, as its fp32 value.
bool bf16_values_only(const TorchDistCheckpoint& c, const std::string& state) {
  bool nonzero = false;
  for (const auto& b : c.buckets) {
    const auto it = b.states.find(state);
    if (it == b.states.end()) continue;
    const at::Tensor t = it->second;
    if (t.scalar_type() != at::kFloat) return false;
    if (!at::equal(t.to(at::kBFloat16).to(at::kFloat), t)) return false;
    nonzero = nonzero || t.ne(0).any().item<bool>();
  }
  return nonzero;
}

// --use-precision-aware-optimizer and its state dtypes, as far as the bucket states say them
// (distrib_optimizer.py _get_main_param_and_optimizer_states saves every state of TE's FusedAdam
// through get_unscaled_state): an int16 'param' is the remainders of bf16 masters
// (store_param_remainders); a bf16 moment has only bf16 values. An fp16 moment (scaled per
// tensor) and an fp32 one both save as fp32 values: not told apart.
void infer_precision(const TorchDistCheckpoint& c, const std::vector<model::ParamSpec>& params,
                     model::OptimizerConfig& cfg, std::vector<std::string>& guesses) {
  if (cfg.kind != model::OptimizerKind::kFusedAdam) return;
  const bool remainders = std::any_of(c.buckets.begin(), c.buckets.end(), [](const auto& b) {
    const auto it = b.states.find("param");
    return it != b.states.end() && it->second.scalar_type() == at::kShort;
  });
  const bool exp_avg_bf16 = bf16_values_only(c, "exp_avg");
  const bool exp_avg_sq_bf16 = bf16_values_only(c, "exp_avg_sq");
  if (!remainders && !exp_avg_bf16 && !exp_avg_sq_bf16) {
    guesses.push_back(
        "precision-aware optimizer: off, upstream's default (fp32 masters and moments, as saved "
        "without it; with it, fp32 masters and fp32 or fp16 moments would save alike)");
    return;
  }
  cfg.precision_aware = true;
  cfg.exp_avg_dtype = exp_avg_bf16 ? model::StateDType::kBFloat16 : model::StateDType::kFloat32;
  cfg.exp_avg_sq_dtype =
      exp_avg_sq_bf16 ? model::StateDType::kBFloat16 : model::StateDType::kFloat32;
  for (const auto& [name, bf16] :
       {std::pair{"exp_avg", exp_avg_bf16}, {"exp_avg_sq", exp_avg_sq_bf16}}) {
    if (bf16) continue;
    guesses.push_back(fmt::format(
        "{}_dtype: fp32, upstream's default (saved unscaled as fp32 values, which an fp32 and an "
        "fp16 state give alike)",
        name));
  }
  const bool bf16_params = std::any_of(params.begin(), params.end(), [](const auto& p) {
    return p.dtype == model::DType::kBFloat16;
  });
  cfg.store_param_remainders = remainders || !bf16_params;
  if (!bf16_params) {
    guesses.push_back(
        "store_param_remainders: on, upstream's default (no bf16 param, so no master is kept as "
        "remainders either way)");
  }
}

// The DP size at save: proven by the files (dp_reshardable), else what the args say
// (fully_reshardable, whose DP replicas write nothing), else a guess from the writers.
void dp_at_save(const TorchDistCheckpoint& checkpoint, const SaveParallelism& at_save,
                InferredScenario& out) {
  if (checkpoint.sharding_type == "fully_reshardable") {
    const int64_t writers_per_dp =
        std::max<int64_t>(checkpoint.writer_ranks / (at_save.tp * at_save.pp), 1);
    out.dp_at_save = at_save.dp.value_or(writers_per_dp);
    if (!at_save.dp) {
      out.guesses.push_back(fmt::format(
          "DP size at save: {}, the ranks that wrote data files per TP x PP rank (the args hold "
          "no data_parallel_size)",
          out.dp_at_save));
    }
    return;
  }
  out.dp_at_save =
      checkpoint.dp_size_at_save.value_or(std::max<int64_t>(checkpoint.writer_ranks, 1));
  if (!checkpoint.dp_size_at_save) {
    out.guesses.push_back(
        fmt::format("DP size at save: {}, the number of ranks that wrote data files (the files do "
                    "not prove it)",
                    out.dp_at_save));
  }
}

}  // namespace

Result<InferredScenario> infer_scenario(const TorchDistCheckpoint& checkpoint,
                                        const Revision& save_revision,
                                        const SaveParallelism& at_save) {
  CKPTSIM_CHECK(save_revision.profile != nullptr, "an unresolved revision: " + save_revision.name);
  const bool model_space = checkpoint.sharding_type == "fully_reshardable";
  if (!model_space && checkpoint.sharding_type != "dp_reshardable") {
    return Status::invalid_input(
        "sharding type '" + checkpoint.sharding_type +
        "': inspect infers a scenario from dp_reshardable and fully_reshardable checkpoints only");
  }
  if (!model_space && (at_save.tp != 1 || at_save.pp != 1)) {
    return Status::invalid_input(fmt::format(
        "a dp_reshardable checkpoint saved at TP {} x PP {}: inspect infers its buckets at TP = "
        "PP = 1 only; pass the scenario that saved it (--scenario)",
        at_save.tp, at_save.pp));
  }
  InferredScenario out;
  dp_at_save(checkpoint, at_save, out);
  Scenario& s = out.scenario;
  s.name = "checkpoint " + checkpoint.iter_dir;
  s.description = "inferred from the checkpoint by ckptsim inspect";
  auto params = read_params(checkpoint);
  if (!params.is_ok()) return params.status();
  s.params = std::move(params.value());
  auto groups = param_groups(checkpoint);
  if (!groups.is_ok()) return groups.status();
  auto optimizer = read_optimizer(*groups.value());
  if (!optimizer.is_ok()) return optimizer.status();
  s.optimizer = optimizer.value();
  // A checkpoint's optimizer holds no schedule arguments: constant at the groups' max_lr and
  // min_lr, which a resume must be started with (upstream HEAD pairs the saved groups with the
  // live ones by max_lr and min_lr; other values raise KeyError there).
  s.schedule = model::ScheduleConfig::constant(s.optimizer.adam.lr, s.optimizer.adam.weight_decay);
  s.schedule.min_lr = s.optimizer.min_lr;
  out.guesses.push_back(fmt::format(
      "schedule: constant at lr {:g} (min_lr {:g}): the param groups' max_lr and min_lr",
      s.schedule.lr, s.schedule.min_lr));
  auto ep = model_space ? Result<int64_t>(int64_t{1}) : mark_experts(checkpoint, s.params);
  if (!ep.is_ok()) return ep.status();
  if (!model_space) infer_precision(checkpoint, s.params, s.optimizer, out.guesses);
  if (Status st = model_space
                      ? infer_model_space(checkpoint, at_save, *groups.value(), s, out.guesses)
                      : find_layout(checkpoint, out.dp_at_save, ep.value(),
                                    !s.optimizer.te_precision_aware(), s, out.guesses);
      !st.is_ok()) {
    return st;
  }
  if (Status st = assign_part_groups(checkpoint, s.params, out.guesses); !st.is_ok()) return st;
  if (s.total_numel() > Scenario::kTotalNumelMax) {
    return Status::invalid_input(fmt::format("{} param elements (the model takes at most {})",
                                             s.total_numel(), Scenario::kTotalNumelMax));
  }
  if (model_space) s.format.sharding_type = model::ShardingType::kFullyReshardable;
  PhaseSpec save;
  save.dp = out.dp_at_save;
  save.tp = at_save.tp;
  save.pp = at_save.pp;
  save.ep = ep.value();
  save.steps = 1;
  save.set_revision(save_revision);
  s.phases.push_back(save);
  return out;
}

Status check_scenario_fits(const TorchDistCheckpoint& checkpoint, const Scenario& scenario,
                           int64_t dp_at_save) {
  auto params = read_params(checkpoint);
  if (!params.is_ok()) return params.status();
  std::vector<model::ParamSpec> sorted = scenario.params;
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return natural_less(a.name, b.name); });
  for (size_t i = 0; i < std::max(sorted.size(), params.value().size()); ++i) {
    const model::ParamSpec* mine = i < sorted.size() ? &sorted[i] : nullptr;
    const model::ParamSpec* saved = i < params.value().size() ? &params.value()[i] : nullptr;
    if (mine == nullptr || saved == nullptr || mine->name != saved->name ||
        mine->numel != saved->numel || mine->dtype != saved->dtype) {
      return Status::invalid_input(fmt::format(
          "{}: param '{}' of the scenario is not the checkpoint's '{}'", scenario.source,
          mine ? mine->name : "(none)", saved ? saved->name : "(none)"));
    }
  }
  // A model-space format (fully_reshardable) saves each param whole: no bucket to fit.
  if (checkpoint.sharding_type == "fully_reshardable") return Status::ok();
  const int64_t ep = scenario.phases.empty() ? 1 : scenario.phases.front().ep;
  const Parts parts =
      split_parts(checkpoint, scenario.params, ep, !scenario.optimizer.te_precision_aware());
  for (size_t i = 0; i < parts.views.size(); ++i) {
    const std::string why =
        layout_mismatch(checkpoint, parts.views[i], parts.params[i],
                        {dp_at_save / parts.views[i].groups, scenario.bucket_size,
                         scenario.pad_buckets_for_high_nccl_busbw});
    if (!why.empty()) {
      return Status::invalid_input(scenario.source +
                                   ": its layout is not the checkpoint's: " + why);
    }
  }
  return Status::ok();
}

}  // namespace ckptsim::sim
