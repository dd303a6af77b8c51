// ckptsim_fuzz_seeds SOURCE_DIR OUT_DIR: writes the seed corpus of every fuzzer of fuzz/
// (fuzz/seeds.h says what each holds) into OUT_DIR/<fuzzer>/, one file per seed named by
// seed_name(). Each OUT_DIR/<fuzzer>/ is emptied first. Exit 0, or 1 with the reason.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz/seeds.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  using namespace ckptsim::fuzz;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s SOURCE_DIR OUT_DIR\n", argv[0]);
    return 1;
  }
  try {
    for (const auto& [fuzzer, seeds] : seed_corpora(argv[1])) {
      const fs::path dir = fs::path(argv[2]) / fuzzer;
      fs::remove_all(dir);
      fs::create_directories(dir);
      for (const std::string& s : seeds) std::ofstream(dir / seed_name(s), std::ios::binary) << s;
      std::printf("%s: %zu seeds\n", fuzzer.c_str(), seeds.size());
    }
  } catch (const SeedError& e) {
    std::fprintf(stderr, "ckptsim_fuzz_seeds: %s\n", e.message.c_str());
    return 1;
  } catch (const fs::filesystem_error& e) {
    std::fprintf(stderr, "ckptsim_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
