// The committed fuzz reproducers, replayed under GCC in the normal test suite: every file of
// tests/fixtures/fuzz-regressions/<fuzzer>/ is run through that fuzzer's target (fuzz/, built
// here without libFuzzer), which checks the reader's promises (a value or a one-line Status
// naming the file, tensors inside their storages, ...). A broken promise throws BrokenPromise
// here; a reader that throws or crashes fails the test as well. The fuzzers themselves (clang,
// libFuzzer, scripts/fuzz.sh) start from the same files.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz/fuzz_targets.h"

namespace ckptsim::fuzz {
namespace {

namespace fs = std::filesystem;

const fs::path kRegressions =
    fs::path(CKPTSIM_SOURCE_DIR) / "tests" / "fixtures" / "fuzz-regressions";

struct Reproducer {
  const FuzzTarget* target;
  fs::path file;
};

std::vector<Reproducer> reproducers() {
  std::vector<Reproducer> out;
  for (const FuzzTarget& t : kFuzzTargets) {
    const fs::path dir = kRegressions / t.name;
    if (!fs::is_directory(dir)) continue;  // none for this fuzzer
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) out.push_back({&t, f});
  }
  return out;
}

void PrintTo(const Reproducer& r, std::ostream* os) { *os << r.target->name << " " << r.file; }

class FuzzRegression : public ::testing::TestWithParam<Reproducer> {};

TEST_P(FuzzRegression, ReaderKeepsItsPromises) {
  std::ifstream in(GetParam().file, std::ios::binary);
  ASSERT_TRUE(in) << GetParam().file;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  try {
    GetParam().target->run({bytes.data(), bytes.size()});
  } catch (const std::exception& e) {
    FAIL() << GetParam().target->name << " on " << GetParam().file << ": " << e.what();
  }
}

// Every folder of reproducers names a fuzzer (a typo would silently replay nothing).
TEST(FuzzRegressions, EveryFolderNamesAFuzzer) {
  if (!fs::is_directory(kRegressions)) return;  // none committed yet
  for (const fs::directory_entry& e : fs::directory_iterator(kRegressions)) {
    if (!e.is_directory()) continue;
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(std::any_of(std::begin(kFuzzTargets), std::end(kFuzzTargets),
                            [&](const FuzzTarget& t) { return t.name == name; }))
        << name;
  }
}

std::string reproducer_name(const ::testing::TestParamInfo<Reproducer>& info) {
  std::string name = std::string(info.param.target->name) + "_" + info.param.file.stem().string();
  std::replace_if(
      name.begin(), name.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); },
      '_');
  return name;
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FuzzRegression);  // before the first reproducer
INSTANTIATE_TEST_SUITE_P(Committed, FuzzRegression, ::testing::ValuesIn(reproducers()),
                         reproducer_name);

}  // namespace
}  // namespace ckptsim::fuzz
