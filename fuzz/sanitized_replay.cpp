// The readers' sanitizer subset: every fuzz target of fuzz/ (fuzz/fuzz_targets.h), built with
// GCC, AddressSanitizer and UndefinedBehaviorSanitizer (preset `sanitize-readers`, run by
// scripts/sanitize-readers.sh; not in CI, reports/sanitizers.md says why), on
//   1. the committed reproducers of tests/fixtures/fuzz-regressions/<fuzzer>/,
//   2. its seeds (fuzz/seeds.h: the real fixtures, scenarios/, revisions/),
//   3. deterministic mutants of the seeds (fuzz/mutator.h), --mutants N per target (default
//      kMutants below), the same ones on every machine.
// A sanitizer report aborts the process (ASan) or stops it (UBSan, -fno-sanitize-recover); a
// broken promise of a reader (fuzz/fuzz_support.h) or an exception that leaves it is printed
// with the input's origin, the run goes on, and the program exits 1 at its end. The full
// sanitizer run of the whole test suite is scripts/sanitize.sh; the coverage-guided search is
// scripts/fuzz.sh.
//
// Usage: ckptsim_sanitized_replay [--mutants N] [FUZZER...]   (default: every target)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_targets.h"
#include "fuzz/libtorch_backtraces.h"
#include "fuzz/mutator.h"
#include "fuzz/seeds.h"

namespace ckptsim::fuzz {
namespace {

namespace fs = std::filesystem;

// Mutants per target by default: about 1 to 3 s each under the sanitizers on the 2-core VM
// (reports/sanitizers.md has the measurement). The readers through libtorch's zip reader cost
// the most per input.
const std::map<std::string_view, uint64_t> kMutants = {
    {"pickle_tree_fuzzer", 2000},          {"torch_save_fuzzer", 300},
    {"dcp_metadata_fuzzer", 1000},         {"dcp_reader_fuzzer", 300},
    {"torch_dist_checkpoint_fuzzer", 200}, {"scenario_fuzzer", 500},
    {"revision_profile_fuzzer", 1000}};
constexpr uint64_t kMutantsMax = 10'000'000;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in) {
    std::fprintf(stderr, "sanitized_replay: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  return ss.str();
}

// The same FNV-1a as the short fuzz run (tests/fuzz/fuzz_short_run_test.cpp), so that a target
// sees the same mutant stream in both.
uint64_t name_hash(std::string_view name) {
  uint64_t h = 14695981039346656037ull;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// Runs the target on one input; false (with the reason printed) when a promise broke.
bool run_one(const FuzzTarget& target, const std::string& input, const std::string& origin) {
  try {
    target.run({input.data(), input.size()});
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sanitized_replay: %.*s on %s: %s\n", static_cast<int>(target.name.size()),
                 target.name.data(), origin.c_str(), e.what());
    return false;
  }
}

struct Counts {
  uint64_t inputs = 0;
  uint64_t broken = 0;
};

Counts replay_target(const FuzzTarget& target, const std::vector<std::string>& seeds,
                     uint64_t mutants) {
  Counts counts;
  auto one = [&](const std::string& input, const std::string& origin) {
    ++counts.inputs;
    if (!run_one(target, input, origin)) ++counts.broken;
  };
  const fs::path regressions = fs::path(CKPTSIM_SOURCE_DIR) / "tests" / "fixtures" /
                               "fuzz-regressions" / std::string(target.name);
  if (fs::is_directory(regressions)) {
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(regressions)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) one(read_file(f), f.string());
  }
  for (size_t i = 0; i < seeds.size(); ++i) {
    one(seeds[i], "seed " + std::to_string(i) + " (" + seed_name(seeds[i]) + ")");
  }
  if (seeds.empty()) return counts;
  Mutator mutator(name_hash(target.name));
  for (uint64_t i = 0; i < mutants; ++i) {
    one(mutator.mutant(seeds), "mutant " + std::to_string(i) + " of " + std::to_string(mutants));
  }
  return counts;
}

int main_impl(int argc, char** argv) {
  int64_t mutants_arg = -1;  // -1: kMutants
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mutants" && i + 1 < argc) {
      mutants_arg = std::strtoll(argv[++i], nullptr, 10);
      if (mutants_arg < 0 || static_cast<uint64_t>(mutants_arg) > kMutantsMax) {
        std::fprintf(stderr, "sanitized_replay: --mutants must be 0 to %llu\n",
                     static_cast<unsigned long long>(kMutantsMax));
        return 2;
      }
    } else {
      only.push_back(arg);
    }
  }
  skip_libtorch_backtraces();  // libtorch's messages stay; only its backtraces are skipped
  SeedCorpora corpora;
  try {
    corpora = seed_corpora(CKPTSIM_SOURCE_DIR);
  } catch (const SeedError& e) {
    std::fprintf(stderr, "sanitized_replay: seeds: %s\n", e.message.c_str());
    return 2;
  } catch (const fs::filesystem_error& e) {
    std::fprintf(stderr, "sanitized_replay: seeds: %s\n", e.what());
    return 2;
  }
  uint64_t broken = 0;
  size_t ran = 0;
  for (const FuzzTarget& target : kFuzzTargets) {
    if (!only.empty() && std::find(only.begin(), only.end(), target.name) == only.end()) continue;
    ++ran;
    const auto found = corpora.find(std::string(target.name));
    const std::vector<std::string> none;
    const std::vector<std::string>& seeds = found != corpora.end() ? found->second : none;
    if (seeds.empty()) {
      std::fprintf(stderr, "sanitized_replay: no seeds for %.*s\n",
                   static_cast<int>(target.name.size()), target.name.data());
      ++broken;
    }
    const auto it = kMutants.find(target.name);
    const uint64_t mutants = mutants_arg >= 0 ? static_cast<uint64_t>(mutants_arg)
                                              : (it != kMutants.end() ? it->second : 100);
    const auto start = std::chrono::steady_clock::now();
    const Counts c = replay_target(target, seeds, mutants);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("sanitized_replay: %-29.*s %6llu inputs (%zu seeds, %llu mutants) %5.1f s  %s\n",
                static_cast<int>(target.name.size()), target.name.data(),
                static_cast<unsigned long long>(c.inputs), seeds.size(),
                static_cast<unsigned long long>(mutants), s,
                c.broken == 0 ? "ok" : "BROKEN PROMISES");
    std::fflush(stdout);
    broken += c.broken;
  }
  if (ran != (only.empty() ? std::size(kFuzzTargets) : only.size())) {
    std::fprintf(stderr, "sanitized_replay: a fuzzer named on the command line does not exist\n");
    return 2;
  }
  return broken == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ckptsim::fuzz

int main(int argc, char** argv) { return ckptsim::fuzz::main_impl(argc, argv); }
