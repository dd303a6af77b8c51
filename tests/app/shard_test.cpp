// Which shard a check runs (app/shard.h): the flag, then CKPTSIM_SHARD, then Slurm's, then
// torchrun's variables; a bad value is one line naming its flag or variable. Mutations shown
// caught: torchrun's pair read before Slurm's (Precedence); half a pair used, the other taken as
// rank 0 or size 1 (HalfAPairIsIgnored, Precedence); K > N accepted (BadValuesNameTheirVariable).
#include "app/shard.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <map>

using namespace ckptsim;

namespace {

app::EnvLookup env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

std::string chosen(const std::string& flag, std::map<std::string, std::string> vars) {
  auto c = app::choose_shard(flag, env(std::move(vars)));
  if (!c.is_ok()) return "error: " + c.status().message();
  return fmt::format("{}/{} {}", c.value().shard.index, c.value().shard.count, c.value().source);
}

const std::map<std::string, std::string> kAll = {{"CKPTSIM_SHARD", "2/5"},
                                                 {"SLURM_PROCID", "2"},
                                                 {"SLURM_NTASKS", "6"},
                                                 {"RANK", "3"},
                                                 {"WORLD_SIZE", "7"}};

}  // namespace

TEST(Shard, Precedence) {
  EXPECT_EQ(chosen("1/4", kAll), "1/4 --shard");
  EXPECT_EQ(chosen("", kAll), "2/5 CKPTSIM_SHARD");
  auto vars = kAll;
  vars.erase("CKPTSIM_SHARD");
  EXPECT_EQ(chosen("", vars), "3/6 SLURM_PROCID/SLURM_NTASKS");
  vars.erase("SLURM_PROCID");
  EXPECT_EQ(chosen("", vars), "4/7 RANK/WORLD_SIZE");
  EXPECT_EQ(chosen("", {}), "1/1 ");
}

TEST(Shard, HalfAPairIsIgnored) {
  EXPECT_EQ(chosen("", {{"RANK", "3"}}), "1/1 ");
  EXPECT_EQ(chosen("", {{"SLURM_NTASKS", "4"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}}),
            "1/2 RANK/WORLD_SIZE");
}

TEST(Shard, BadValuesNameTheirVariable) {
  EXPECT_EQ(chosen("0/2", {}), "error: --shard: must be K/N with 1 <= K <= N <= 100000, got '0/2'");
  EXPECT_EQ(chosen("3/2", {}), "error: --shard: must be K/N with 1 <= K <= N <= 100000, got '3/2'");
  EXPECT_EQ(chosen("1/2x", {}),
            "error: --shard: must be K/N with 1 <= K <= N <= 100000, got '1/2x'");
  EXPECT_EQ(chosen("", {{"CKPTSIM_SHARD", "2"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}}),
            "error: CKPTSIM_SHARD: must be K/N with 1 <= K <= N <= 100000, got '2'");
  EXPECT_EQ(chosen("", {{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}),
            "error: SLURM_PROCID: must be a whole number in [0, 4) (SLURM_NTASKS=4), got '4'");
  EXPECT_EQ(chosen("", {{"RANK", "0"}, {"WORLD_SIZE", "zero"}}),
            "error: WORLD_SIZE: must be a whole number in [1, 100000], got 'zero'");
  EXPECT_EQ(chosen("", {{"RANK", "-1"}, {"WORLD_SIZE", "2"}}),
            "error: RANK: must be a whole number in [0, 2) (WORLD_SIZE=2), got '-1'");
}

// Case k belongs to shard (k mod N) + 1: the shards partition the cases.
TEST(Shard, ShardsPartitionTheCases) {
  for (int64_t k = 0; k < 20; ++k) {
    int owners = 0;
    for (int64_t i = 1; i <= 3; ++i) owners += search::Shard{i, 3}.holds(k) ? 1 : 0;
    EXPECT_EQ(owners, 1) << k;
    EXPECT_TRUE((search::Shard{(k % 3) + 1, 3}.holds(k)));
  }
}
