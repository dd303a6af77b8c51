// Layout family: layout_invariants (every buffer layout and DP shard keeps I1, I2 and I4).
// The checkers themselves are in layout_checks.h.
#include <fmt/format.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "properties/common.h"
#include "properties/layout_checks.h"

namespace ckptsim::properties {

namespace {

Status check_layout(const model::BufferLayout& layout, const model::LayoutOptions& options) {
  Status s = check_layout_invariants(layout, options);
  for (size_t b = 0; s.is_ok() && b < layout.buckets.size(); ++b) {
    const auto shards = model::build_bucket_shards(layout, b, options.dp_size);
    s = check_bucket_shards(layout, b, options.dp_size, shards);
  }
  return s;
}

}  // namespace

// Each DP group's buffers as the phase recorded them (every group's, or rank 0's alone).
std::vector<sim::GroupLayout> groups_of(const sim::PhaseRecord& p) {
  if (!p.groups.empty()) return p.groups;
  return {sim::GroupLayout{model::ModelParallelRank{}, p.buffers, p.layouts, 0, 0, ""}};
}

PropertyResult layout_invariants(const sim::RunResult& run) {
  PropertyResult r = pass("layout_invariants");
  int layouts = 0;
  // I4: per (TP, PP, DP group, buffer, bucket), numel_unpadded of the first phase that ran with
  // that TP and PP (another TP or PP holds other pieces of the params: other buckets).
  std::map<std::tuple<int64_t, int64_t, size_t, size_t, size_t>, std::pair<int64_t, size_t>>
      unpadded;
  for (const auto& p : run.phases) {
    if (!p.ran) continue;
    const std::vector<sim::GroupLayout> groups = groups_of(p);
    for (size_t group = 0; group < groups.size(); ++group) {
      const sim::GroupLayout& gl = groups[group];
      const std::string where = groups.size() > 1
                                    ? fmt::format(" DP group {} (tp_rank {}, pp_rank {})", group,
                                                  gl.mp.tp_rank, gl.mp.pp_rank)
                                    : "";
      for (size_t g = 0; g < gl.layouts.size(); ++g) {
        ++layouts;
        const model::BufferLayout& layout = gl.layouts[g];
        if (Status s = check_layout(layout, p.layout_options); !s.is_ok()) {
          return fail(
              std::move(r), static_cast<int>(p.index), "layout_invariants",
              fmt::format("{}{} buffer {} ({}): {}", phase_label(p), where, g,
                          g < gl.buffers.size() ? gl.buffers[g].dtype_key : "?", s.message()));
        }
        for (size_t b = 0; b < layout.buckets.size(); ++b) {
          auto [it, inserted] = unpadded.try_emplace({p.spec.tp, p.spec.pp, group, g, b},
                                                     layout.buckets[b].numel_unpadded, p.index);
          if (inserted || it->second.first == layout.buckets[b].numel_unpadded) continue;
          return fail(std::move(r), static_cast<int>(p.index), "layout_invariants:I4",
                      fmt::format("{}{} buffer {} bucket {}: numel_unpadded {} differs from {} in "
                                  "phase {} (I4: the checkpoint tensor's global shape must not "
                                  "depend on the DP size)",
                                  phase_label(p), where, g, b, layout.buckets[b].numel_unpadded,
                                  it->second.first, it->second.second));
        }
      }
    }
  }
  r.detail = fmt::format("{} buffer layout(s) keep I1, I2 and I4", layouts);
  return r;
}

}  // namespace ckptsim::properties
