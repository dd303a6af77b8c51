#include "app/shard.h"

#include <fmt/format.h>

#include <charconv>
#include <optional>

namespace ckptsim::app {

namespace {

// A whole decimal number, nothing around it.
std::optional<int64_t> whole_number(const std::string& text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return v;
}

Status bad_shard(const std::string& name, const std::string& text) {
  return Status::invalid_input(fmt::format("{}: must be K/N with 1 <= K <= N <= {}, got '{}'", name,
                                           search::Shard::kCountMax, text));
}

// A (rank, size) pair of variables: shard rank + 1 of size.
Result<search::Shard> shard_of_pair(const char* rank_name, const char* rank, const char* size_name,
                                    const char* size) {
  const std::optional<int64_t> r = whole_number(rank);
  const std::optional<int64_t> n = whole_number(size);
  if (!n || *n < 1 || *n > search::Shard::kCountMax) {
    return Status::invalid_input(fmt::format("{}: must be a whole number in [1, {}], got '{}'",
                                             size_name, search::Shard::kCountMax, size));
  }
  if (!r || *r < 0 || *r >= *n) {
    return Status::invalid_input(
        fmt::format("{}: must be a whole number in [0, {}) ({}={}), got '{}'", rank_name, *n,
                    size_name, *n, rank));
  }
  return search::Shard{*r + 1, *n};
}

}  // namespace

Result<search::Shard> parse_shard(const std::string& text, const std::string& name) {
  const size_t slash = text.find('/');
  if (slash == std::string::npos) return bad_shard(name, text);
  const std::optional<int64_t> k = whole_number(text.substr(0, slash));
  const std::optional<int64_t> n = whole_number(text.substr(slash + 1));
  if (!k || !n || *n < 1 || *n > search::Shard::kCountMax || *k < 1 || *k > *n)
    return bad_shard(name, text);
  return search::Shard{*k, *n};
}

Result<ShardChoice> choose_shard(const std::string& flag, const EnvLookup& env) {
  auto chosen = [](Result<search::Shard> s, const std::string& source) -> Result<ShardChoice> {
    if (!s.is_ok()) return s.status();
    return ShardChoice{s.value(), source};
  };
  if (!flag.empty()) return chosen(parse_shard(flag, "--shard"), "--shard");
  if (const char* v = env("CKPTSIM_SHARD"); v != nullptr)
    return chosen(parse_shard(v, "CKPTSIM_SHARD"), "CKPTSIM_SHARD");
  struct Pair {
    const char* rank;
    const char* size;
  };
  for (const Pair& p : {Pair{"SLURM_PROCID", "SLURM_NTASKS"}, Pair{"RANK", "WORLD_SIZE"}}) {
    const char* rank = env(p.rank);
    const char* size = env(p.size);
    if (rank == nullptr || size == nullptr) continue;
    return chosen(shard_of_pair(p.rank, rank, p.size, size), std::string(p.rank) + "/" + p.size);
  }
  return ShardChoice{search::Shard{}, ""};
}

}  // namespace ckptsim::app
