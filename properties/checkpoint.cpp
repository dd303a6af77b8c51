// Checkpoint family: what a save writes. shards_tile_buckets (the pieces tile every bucket's
// [0, numel_unpadded) exactly once: I3, I4), common_state_rank_independent (only rank 0's
// common state is persisted, so every rank's must equal it: I8) and reshard_round_trip_bytes
// (resume and save again without a step writes the same param bytes at any DP size: I5).
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "model/megatron/optimizer_key.h"
#include "properties/common.h"

namespace ckptsim::properties {

namespace {

using Pieces = std::map<std::string, std::vector<const model::SavedPiece*>>;

// Every bucket of every buffer of every DP group has its keys (dp_reshardable, under the group's
// dp_group_idx), each at the bucket's numel_unpadded; nullopt when it does.
std::optional<std::string> bucket_keys_missing(const sim::PhaseRecord& p, const Pieces& by_key) {
  std::vector<sim::GroupLayout> groups = p.groups;
  if (groups.empty())
    groups.push_back({model::ModelParallelRank{}, p.buffers, p.layouts, 0, 0, ""});
  for (size_t group = 0; group < groups.size(); ++group) {
    const std::vector<sim::BufferInfo>& buffers = groups[group].buffers;
    for (size_t g = 0; g < buffers.size(); ++g) {
      for (size_t b = 0; b < buffers[g].numel_unpadded.size(); ++b) {
        bool found = false;
        for (const auto& [key, pieces] : by_key) {
          const auto k = groups[group].bucket_key(key);
          if (!k || k->gbuf_idx != static_cast<int64_t>(g) || k->dtype != buffers[g].dtype_key ||
              k->bucket_idx != static_cast<int64_t>(b)) {
            continue;
          }
          found = true;
          if (pieces.front()->global_numel != buffers[g].numel_unpadded[b]) {
            return fmt::format(
                "{} checkpoint: key {} has global shape ({},), expected "
                "numel_unpadded {}",
                phase_label(p), key, pieces.front()->global_numel, buffers[g].numel_unpadded[b]);
          }
        }
        if (!found) {
          return fmt::format(
              "{} checkpoint: bucket {} of buffer {} {} of {}DP group {} has no saved optimizer "
              "state",
              phase_label(p), b, g, buffers[g].dtype_key,
              groups[group].part == 1 ? "the expert part's expert-" : "",
              groups[group].dp_group_idx);
        }
      }
    }
  }
  return std::nullopt;
}

// Every model param has its model-space keys (fully_reshardable), each of the param's numel.
std::optional<std::string> param_keys_missing(const sim::Scenario& s, const sim::PhaseRecord& p,
                                              const Pieces& by_key) {
  for (const model::ParamSpec& param : s.params) {
    for (const char* state : {"param", "exp_avg", "exp_avg_sq"}) {
      const std::string key = model::format_model_space_key({state, param.name});
      auto it = by_key.find(key);
      if (it == by_key.end()) {
        return fmt::format("{} checkpoint: param {} has no saved {} (key {})", phase_label(p),
                           param.name, state, key);
      }
      if (it->second.front()->global_numel != param.numel) {
        return fmt::format(
            "{} checkpoint: key {} has global shape ({},), expected the param's "
            "numel {}",
            phase_label(p), key, it->second.front()->global_numel, param.numel);
      }
    }
  }
  return std::nullopt;
}

// The failure of one key's pieces to tile [0, global numel) exactly once; nullopt when they do.
std::optional<std::string> key_tiling_failure(const sim::PhaseRecord& p, const std::string& key,
                                              const std::vector<const model::SavedPiece*>& pieces) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto* piece : pieces)
    ranges.emplace_back(piece->global_offset, piece->global_offset + piece->numel);
  std::sort(ranges.begin(), ranges.end());
  const int64_t total = pieces.front()->global_numel;
  int64_t cursor = 0;
  for (const auto& [b, e] : ranges) {
    if (b > cursor) {
      return fmt::format(
          "{} checkpoint: key {}: elements [{}, {}) of [0, {}) were saved by no rank (a gap)",
          phase_label(p), key, cursor, b, total);
    }
    if (b < cursor) {
      return fmt::format(
          "{} checkpoint: key {}: elements [{}, {}) of [0, {}) were saved twice (an overlap)",
          phase_label(p), key, b, std::min(cursor, e), total);
    }
    cursor = e;
  }
  if (cursor != total) {
    return fmt::format("{} checkpoint: key {}: pieces end at {}, expected exactly {} ({})",
                       phase_label(p), key, cursor, total,
                       cursor < total ? "a gap at the end" : "past the end");
  }
  return std::nullopt;
}

// The failure of one checkpoint's tiling, as a detail; nullopt when the format's keys are all
// there and every key is tiled.
std::optional<std::string> tiling_failure(const sim::Scenario& s, const sim::PhaseRecord& p,
                                          model::ShardingType format, const Pieces& by_key) {
  std::optional<std::string> missing;
  if (format == model::ShardingType::kDpReshardable) missing = bucket_keys_missing(p, by_key);
  if (format == model::ShardingType::kFullyReshardable) missing = param_keys_missing(s, p, by_key);
  if (missing) return missing;
  for (const auto& [key, pieces] : by_key) {
    if (auto failure = key_tiling_failure(p, key, pieces)) return failure;
  }
  return std::nullopt;
}

// The first element of a param's saved state that differs between two saves, as a detail.
std::optional<std::string> bytes_difference(const sim::RunResult& run, const sim::PhaseRecord& p,
                                            const std::string& state,
                                            const std::vector<std::vector<float>>& old_values,
                                            const std::vector<std::vector<float>>& new_values) {
  for (size_t param = 0; param < old_values.size() && param < new_values.size(); ++param) {
    const auto& before = old_values[param];
    const auto& after = new_values[param];
    for (size_t e = 0; e < before.size() && e < after.size(); ++e) {
      if (bitwise_equal(before[e], after[e])) continue;
      return fmt::format(
          "{} saved again without a step (dp {} -> {}, {} -> {}): {} of {}[{}] is {}, was {} in "
          "phase {}'s checkpoint",
          phase_label(p), run.loaded_from(p)->spec.dp, p.spec.dp,
          model::sharding_type_name(run.scenario.format_of(*p.loaded_phase).sharding_type),
          model::sharding_type_name(run.scenario.format_of(p.index).sharding_type), state,
          run.scenario.params[param].name, e, num(after[e]), num(before[e]), *p.loaded_phase);
    }
  }
  return std::nullopt;
}

}  // namespace

PropertyResult shards_tile_buckets(const sim::RunResult& run) {
  PropertyResult r = pass("shards_tile_buckets");
  int checkpoints = 0;
  int keys_checked = 0;
  for (const auto& p : run.phases) {
    if (!p.ran || p.saved_pieces.empty()) continue;
    ++checkpoints;
    Pieces by_key;
    for (const auto& piece : p.saved_pieces) {
      // A bucket key (with its part's 'chained_<i>.' in a chain of several) or a model-space
      // one.
      const bool bucket = std::any_of(p.groups.begin(), p.groups.end(), [&](const auto& g) {
        return g.bucket_key(piece.key).has_value();
      });
      if (bucket || model::parse_bucket_key(piece.key).has_value() ||
          model::parse_model_space_key(piece.key).has_value()) {
        by_key[piece.key].push_back(&piece);
      }
    }
    const model::ShardingType format = run.scenario.format_of(p.index).sharding_type;
    if (auto detail = tiling_failure(run.scenario, p, format, by_key)) {
      return fail(std::move(r), static_cast<int>(p.index), "shards_tile_buckets", *detail);
    }
    // A short write (a storage fault) lost bytes the save reported written: the disk's doing.
    if (!p.checkpoint_read_error.empty() && !p.short_write) {
      return fail(std::move(r), static_cast<int>(p.index), "shards_tile_buckets",
                  fmt::format("{} checkpoint: a saved piece cannot be read back: {}",
                              phase_label(p), p.checkpoint_read_error));
    }
    keys_checked += static_cast<int>(by_key.size());
  }
  r.detail =
      fmt::format("{} checkpoint(s): {} optimizer keys tile [0, their global numel) exactly once",
                  checkpoints, keys_checked);
  return r;
}

PropertyResult common_state_rank_independent(const sim::RunResult& run) {
  PropertyResult r = pass("common_state_rank_independent");
  int saves = 0;
  for (const auto& p : run.phases) {
    if (!p.ran || p.common_differences.empty()) continue;
    ++saves;
    for (size_t rank = 0; rank < p.common_differences.size(); ++rank) {
      // A None that rank 0 did not save loses no state (fully_reshardable mem_efficient gives
      // the param state as None on DP ranks > 0; rank 0 saves it sharded): not counted.
      std::vector<std::string> differences;
      for (const std::string& d : p.common_differences[rank]) {
        if (!d.starts_with("missing on rank 0 (None here)")) differences.push_back(d);
      }
      if (differences.empty()) continue;
      return fail(
          std::move(r), static_cast<int>(p.index), "common_state_rank_independent",
          fmt::format(
              "{} save: rank {}'s common state differs from rank 0's (only rank "
              "0's is persisted): {}{}",
              phase_label(p), rank, differences.front(),
              differences.size() > 1 ? fmt::format(" (+{} more)", differences.size() - 1) : ""));
    }
  }
  r.detail = fmt::format("{} save(s): every rank's common state equals rank 0's", saves);
  return r;
}

PropertyResult reshard_round_trip_bytes(const sim::RunResult& run) {
  PropertyResult r = pass("reshard_round_trip_bytes");
  int compared = 0;
  for (const auto& p : run.phases) {
    // A --no-load-optim resume loads no optimizer state: it saves a fresh one.
    if (!p.ran || p.index == 0 || p.spec.steps != 0 || p.saved_state.empty() ||
        p.spec.fresh_optimizer())
      continue;
    const sim::PhaseRecord* loaded = run.loaded_from(p);
    // The files of the phase's last save are kept (saved_state), not of an earlier one's.
    if (loaded == nullptr || loaded->saved_state.empty() ||
        loaded->saved_global_step() != p.start_step)
      continue;
    const auto& before = loaded->saved_state;
    ++compared;
    for (const auto& [state, old_values] : before) {
      auto it = p.saved_state.find(state);
      if (it == p.saved_state.end()) {
        return fail(std::move(r), static_cast<int>(p.index), "reshard_round_trip_bytes:missing_key",
                    fmt::format("{} saved again without a step, but no {} was saved, which "
                                "phase {}'s checkpoint holds",
                                phase_label(p), state, loaded->index));
      }
      if (auto d = bytes_difference(run, p, state, old_values, it->second)) {
        return fail(std::move(r), static_cast<int>(p.index), "reshard_round_trip_bytes", *d);
      }
    }
  }
  r.detail = fmt::format(
      "{} save-after-load pair(s) with no step between saved identical param states (master, "
      "moments), param by param",
      compared);
  return r;
}

}  // namespace ckptsim::properties

namespace ckptsim::properties {

// load_writes_every_element: every element a load requests (every optimizer state a rank owns,
// the model params, ...) is written from the checkpoint. The loader records each requested
// range no saved piece covered (sim::PhaseRecord::load_uncovered): such elements keep the
// values the request was built with (zeros, or dummy_step's), which only sometimes show in the
// trajectory.
PropertyResult load_writes_every_element(const sim::RunResult& run) {
  PropertyResult r = pass("load_writes_every_element");
  int loads = 0;
  std::string not_evaluated;
  for (const auto& p : run.phases) {
    if (!p.ran || p.index == 0 || p.started_fresh) continue;
    if (!p.after_load.has_value()) {
      if (not_evaluated.empty()) not_evaluated = phase_label(p) + ": the load did not complete";
      continue;
    }
    ++loads;
    if (p.load_uncovered.empty()) continue;
    std::string ranges;
    for (size_t i = 0; i < p.load_uncovered.size() && i < 4; ++i) {
      ranges += (i ? ", " : "") + p.load_uncovered[i];
    }
    if (p.load_uncovered.size() > 4)
      ranges += fmt::format(", +{} more", p.load_uncovered.size() - 4);
    // A missing key anywhere in the load names the cause (the trace check decides alike: its
    // ranges come in another order).
    const bool skipped = std::any_of(
        p.load_uncovered.begin(), p.load_uncovered.end(),
        [](const std::string& u) { return u.find("not in the checkpoint") != std::string::npos; });
    return fail(std::move(r), static_cast<int>(p.index),
                std::string("load_writes_every_element:") + (skipped ? "missing_key" : "gap"),
                fmt::format("{}: the load left {} requested range(s) unwritten, holding what the "
                            "load request was built with: {}",
                            phase_label(p), p.load_uncovered.size(), ranges));
  }
  if (!not_evaluated.empty() && loads == 0) return mark_not_evaluated(std::move(r), not_evaluated);
  r.detail =
      loads == 0
          ? std::string("no load in this run")
          : fmt::format("{} load(s) wrote every requested element from the checkpoint", loads);
  return r;
}

}  // namespace ckptsim::properties
