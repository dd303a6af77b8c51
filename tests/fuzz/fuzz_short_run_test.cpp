// The short fuzz run of the test suite: every fuzz target of fuzz/ (built here with GCC,
// without libFuzzer) runs on its seeds (fuzz/seeds.h, from the real fixtures, scenarios and
// revision profiles) and then on deterministic mutants of them (fuzz/mutator.h): as many as
// kMutants says (about 1 to 3 s per target here), or CKPTSIM_FUZZ_SHORT_RUNS each. A broken promise
// of a reader (fuzz/fuzz_support.h: an exception, an error of more than one line or not naming its
// file, a tensor outside its storage, ...) fails the test, and the input is written to
// <build>/fuzz-short-run/<fuzzer>/<name> for `ckptsim_tests` or the fuzzer to replay; a keeper
// goes to tests/fixtures/fuzz-regressions/<fuzzer>/. The coverage-guided search is libFuzzer's
// (scripts/fuzz.sh); this run keeps every CI run probing the readers around the real inputs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_targets.h"
#include "fuzz/mutator.h"
#include "fuzz/seeds.h"

namespace ckptsim::fuzz {
namespace {

namespace fs = std::filesystem;

// Mutants per target: the readers through libtorch's zip reader cost about a millisecond an
// input, the pickle and JSON readers a few hundredths.
const std::map<std::string_view, uint64_t> kMutants = {
    {"pickle_tree_fuzzer", 20000},           {"torch_save_fuzzer", 2000},
    {"dcp_metadata_fuzzer", 20000},          {"dcp_reader_fuzzer", 2000},
    {"torch_dist_checkpoint_fuzzer", 10000}, {"scenario_fuzzer", 20000},
    {"revision_profile_fuzzer", 20000},      {"trace_fuzzer", 5000}};

const SeedCorpora& corpora() {
  static const SeedCorpora c = [] {
    try {
      return seed_corpora(CKPTSIM_SOURCE_DIR);
    } catch (const SeedError& e) {
      ADD_FAILURE() << "seeds: " << e.message;
    } catch (const fs::filesystem_error& e) {
      ADD_FAILURE() << "seeds: " << e.what();
    }
    return SeedCorpora{};
  }();
  return c;
}

uint64_t runs(std::string_view target) {
  const char* env = std::getenv("CKPTSIM_FUZZ_SHORT_RUNS");
  if (env != nullptr) return std::strtoull(env, nullptr, 10);
  const auto it = kMutants.find(target);
  return it != kMutants.end() ? it->second : 2000;
}

uint64_t name_hash(std::string_view name) {
  uint64_t h = 14695981039346656037ull;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// Runs the target on `input`; "" when it kept its promises, else what broke, with the input
// saved where the message says.
std::string run_one(const FuzzTarget& target, const std::string& input) {
  std::string what;
  try {
    target.run({input.data(), input.size()});
    return "";
  } catch (const BrokenPromise& e) {
    what = e.what();
  } catch (const std::exception& e) {
    what = std::string("an exception left the reader: ") + e.what();
  }
  const fs::path dir = fs::path("fuzz-short-run") / target.name;
  fs::create_directories(dir);
  const fs::path file = fs::absolute(dir / seed_name(input));
  std::ofstream(file, std::ios::binary) << input;
  return what + " (input: " + file.string() + ")";
}

class FuzzShortRun : public ::testing::TestWithParam<const FuzzTarget*> {};

TEST_P(FuzzShortRun, SeedsAndTheirMutantsKeepTheReadersPromises) {
  const FuzzTarget& target = *GetParam();
  const auto found = corpora().find(std::string(target.name));
  ASSERT_TRUE(found != corpora().end() && !found->second.empty()) << "no seeds";
  const std::vector<std::string>& seeds = found->second;
  for (const std::string& seed : seeds) {
    const std::string broken = run_one(target, seed);
    ASSERT_EQ(broken, "") << "on a seed";
  }
  Mutator mutator(name_hash(target.name));
  const uint64_t n = runs(target.name);
  for (uint64_t i = 0; i < n; ++i) {
    const std::string broken = run_one(target, mutator.mutant(seeds));
    ASSERT_EQ(broken, "") << "on mutant " << i << " of " << n;
  }
  RecordProperty("seeds", static_cast<int>(seeds.size()));
  RecordProperty("mutants", static_cast<int>(n));
}

// The mutator is deterministic: the same seed gives the same mutants (a failure replays).
TEST(FuzzShortRunMutator, TheSameSeedGivesTheSameMutants) {
  const std::vector<std::string> seeds = {"{\"a\": [1, 2, 3]}", std::string(40, 'x')};
  Mutator a(7), b(7), c(8);
  bool differs = false;
  for (int i = 0; i < 200; ++i) {
    const std::string ma = a.mutant(seeds);
    EXPECT_EQ(ma, b.mutant(seeds));
    differs = differs || ma != c.mutant(seeds);
  }
  EXPECT_TRUE(differs) << "another seed should give other mutants";
}

std::vector<const FuzzTarget*> targets() {
  std::vector<const FuzzTarget*> out;
  for (const FuzzTarget& t : kFuzzTargets) out.push_back(&t);
  return out;
}

std::string target_name(const ::testing::TestParamInfo<const FuzzTarget*>& info) {
  return std::string(info.param->name);
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzShortRun, ::testing::ValuesIn(targets()), target_name);

}  // namespace
}  // namespace ckptsim::fuzz
