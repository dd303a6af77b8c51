// Every bundled scenario with GPU-resident state (the simulated 'cuda' device on a real GPU,
// FusedAdam through the CUDA kernel) gives the same verdicts as on the CPU — and, since the
// kernel is bitwise equal to the CPU reference and every other GPU op is a copy, the same
// trace hash. Skipped (never failed) where no GPU can hold the state.
#include <gtest/gtest.h>

#if CKPTSIM_WITH_CORE
#include <filesystem>

#include "model/py/runtime.h"
#include "properties/properties.h"
#include "sim/driver.h"

namespace {

using namespace ckptsim;

std::vector<std::string> scenario_files() {
  std::vector<std::string> out;
  for (const char* dir : {"scenarios", "scenarios/found"}) {
    for (const auto& e :
         std::filesystem::directory_iterator(std::string(CKPTSIM_SOURCE_DIR) + "/" + dir)) {
      if (e.path().extension() == ".json") out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

class GpuScenario : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuScenario, SameVerdictsAndTraceAsOnTheCpu) {
  std::string why;
  if (!model::real_cuda_available(&why)) GTEST_SKIP() << "no GPU can hold the state: " << why;
  auto registry = model::RevisionRegistry::load_embedded().value();
  auto s = sim::load_scenario_file(GetParam(), registry);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  sim::RunOptions cpu;
  cpu.device = sim::DeviceChoice::kCpu;
  sim::RunOptions gpu;
  gpu.device = sim::DeviceChoice::kCuda;
  auto a = sim::run_scenario(s.value(), cpu);
  auto b = sim::run_scenario(s.value(), gpu);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_FALSE(a.value().gpu_resident);
  EXPECT_TRUE(b.value().gpu_resident);
  const auto va = properties::check_all(a.value());
  const auto vb = properties::check_all(b.value());
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) {
    EXPECT_EQ(va[i].verdict, vb[i].verdict)
        << va[i].name << "\n cpu: " << va[i].detail << "\n gpu: " << vb[i].detail;
  }
  EXPECT_EQ(a.value().trace_hash, b.value().trace_hash)
      << "GPU-resident run diverged from the CPU run";
}

INSTANTIATE_TEST_SUITE_P(Bundled, GpuScenario, ::testing::ValuesIn(scenario_files()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = std::filesystem::path(info.param).stem().string();
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

}  // namespace
#endif
