// Which shard of a search this process runs (`check --shard K/N`, search::Shard): from the
// flag, or else from the environment a CI matrix, Slurm or torchrun gives each process.
//
// Precedence, first that is set wins:
//   1. --shard K/N;
//   2. CKPTSIM_SHARD=K/N (ours: a CI matrix passes it, e.g. GitHub Actions' matrix, which has
//      no index of its own);
//   3. SLURM_PROCID and SLURM_NTASKS (srun: shard SLURM_PROCID + 1 of SLURM_NTASKS);
//   4. RANK and WORLD_SIZE (torchrun: shard RANK + 1 of WORLD_SIZE);
//   5. none: the whole search (1/1).
//
// Invariants:
//   1. A pair (3, 4) counts only when both of its variables are set; half a pair is ignored
//      (RANK alone is set by unrelated tools too).
//   2. A value that is set but bad is an error, never a fallback to the next source: one line
//      naming the flag or variable and the value, e.g. "CKPTSIM_SHARD: must be K/N with
//      1 <= K <= N <= 100000, got '3/2'".
//   3. The result says where it came from (`source`), for the line every search prints first.
#pragma once

#include <functional>
#include <string>

#include "model/status.h"
#include "search/search.h"

namespace ckptsim::app {

struct ShardChoice {
  search::Shard shard;
  std::string source;  // "--shard", "CKPTSIM_SHARD", "SLURM_PROCID/SLURM_NTASKS", ... or ""
};

// Reads one environment variable: nullptr when unset (std::getenv; tests pass a map).
using EnvLookup = std::function<const char*(const char*)>;

// "K/N" as a shard; `name` (the flag or variable) starts the error message.
Result<search::Shard> parse_shard(const std::string& text, const std::string& name);

// The shard by the precedence above; `flag` is --shard's value ("" when absent).
Result<ShardChoice> choose_shard(const std::string& flag, const EnvLookup& env);

}  // namespace ckptsim::app
