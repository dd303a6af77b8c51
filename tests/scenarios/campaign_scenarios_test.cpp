// The committed campaigns of scenarios/ (replayed on the real Megatron-LM elsewhere): every file
// of scenarios/campaign2/ parses, is named after its file, shares no name with the first
// campaign (traces are matched to scenarios by name), runs on the model, and the set holds what
// scenarios/campaign2/README.md says it covers. Mutations this catches: a file that does not
// parse or run, a name the first campaign already used, a set drawn without the campaign
// profile (the first campaign, scenarios/campaign/, fails the same promises: the test checks
// that too).
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "search/coverage.h"
#include "tests/testing.h"

using namespace ckptsim;

namespace {

std::vector<std::string> generated_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(test::source_path(dir))) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("gen-") && name.ends_with(".json")) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

double share(const search::Coverage& c, const std::string& feature,
             const std::vector<std::string>& values) {
  int64_t n = 0, total = 0;
  if (c.counts().count(feature) == 0) return 0;
  for (const auto& [value, count] : c.counts().at(feature)) {
    total += count;
    if (std::find(values.begin(), values.end(), value) != values.end()) n += count;
  }
  return total == 0 ? 0 : static_cast<double>(n) / static_cast<double>(total);
}

// What scenarios/campaign2/README.md promises, one line per shortfall.
std::string shortfalls(const search::Coverage& c) {
  std::string out;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) out += what + "\n";
  };
  need(c.cases() >= 650, "fewer than 650 scenarios");
  need(share(c, "resumes: reshard", {"up, not dividing", "down, not dividing"}) >= 0.30,
       "non-dividing reshards in fewer than 30% of resumes");
  need(share(c, "cases: DP", {"1 throughout"}) <= 0.05, "DP 1 throughout in more than 5%");
  const double long_phase = share(c, "cases: longest phase", {"250-270 (near 2^8)"});
  need(long_phase >= 0.05 && long_phase <= 0.10, "one long phase outside 5-10% of scenarios");
  for (const std::string r :
       {"upstream-pre-2874", "upstream-2874", "upstream-head", "miles-main", "pr69-graft"}) {
    need(c.count("phases: revision", r) > 0, "no phase at " + r);
    for (const std::string flag : {"override", "use_checkpoint"}) {
      need(c.count("resumes: arguments change, by revision", r + ", " + flag) > 0,
           "no argument change at " + r + " under " + flag);
    }
  }
  for (const std::string what : {"lr", "min_lr", "weight decay"})
    need(c.count("resumes: arguments that change", what) > 0, "no " + what + " change alone");
  need(c.count("resumes: revision", "revision changes") > 0, "no cross-revision resume");
  need(c.count("cases: hybrid, fp32 params", "some, offload between") > 0,
       "no fp32 params on the hybrid at offload between 0 and 1");
  need(share(c, "cases: param groups", {"one group setting"}) < 1, "no lr_mult/wd_mult groups");
  for (const std::string kind : {"fused_adam", "torch_adamw", "hybrid, offload between",
                                 "hybrid, offload between, TE absent"}) {
    need(c.count("cases: optimizer", kind) > 0, "no " + kind);
  }
  return out;
}

}  // namespace

TEST(CampaignScenarios, Campaign2ParsesRunsAndCoversWhatItsReadmeSays) {
  std::set<std::string> first;
  for (const auto& f : generated_files("scenarios/campaign"))
    first.insert(std::filesystem::path(f).stem().string());
  search::Coverage coverage;
  for (const auto& file : generated_files("scenarios/campaign2")) {
    auto s = sim::load_scenario_file(file, test::registry());
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    const std::string stem = std::filesystem::path(file).stem().string();
    EXPECT_EQ(s.value().name, stem);
    EXPECT_EQ(first.count(stem), 0u) << stem << " is a name of scenarios/campaign/";
    EXPECT_TRUE(s.value().description.starts_with("Drawn by `ckptsim generate --campaign "))
        << file;
    EXPECT_NO_THROW(test::run(s.value())) << file;
    coverage.add(s.value());
  }
  EXPECT_EQ(shortfalls(coverage), "") << coverage.text();
  search::Coverage old;
  for (const auto& file : generated_files("scenarios/campaign"))
    old.add(test::scenario_file(std::filesystem::relative(file, test::source_path("")).string()));
  EXPECT_NE(shortfalls(old), "");
}
