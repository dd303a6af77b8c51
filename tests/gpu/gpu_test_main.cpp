// main() of the GPU tests. Run with --skip-all-without-gpu (how ctest runs them where configure
// saw no GPU), it exits at once with code 77 — which ctest reports as skipped — when no CUDA
// device can run the kernel, and prints why: the GPU tests then cost one process start on a
// machine without a GPU, not one per test. Otherwise it runs the tests as gtest_main would.
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <vector>

#include "model/kernels/fused_adam_cuda.h"

int main(int argc, char** argv) {
  bool skip_all_without_gpu = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--skip-all-without-gpu") == 0) {
      skip_all_without_gpu = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  if (skip_all_without_gpu && !ckptsim::model::cuda_fused_adam_available()) {
    std::cout << "every GPU test skips: no CUDA device can run the kernel here: "
              << ckptsim::model::cuda_unavailable_reason() << std::endl;
    return 77;
  }
  int n = static_cast<int>(args.size());
  testing::InitGoogleTest(&n, args.data());
  return RUN_ALL_TESTS();
}
