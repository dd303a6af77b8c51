// The seed corpus of every fuzzer of fuzz/, from the repository's real files:
//   pickle_tree_fuzzer            every `.metadata`, and the data.pkl of every torch.save blob
//   dcp_metadata_fuzzer           every `.metadata`
//   torch_save_fuzzer             every common.pt, and every item of every `.distcp` file, cut
//                                 out at the offset and length its `.metadata` gives
//   dcp_reader_fuzzer             the data files of the checkpoint dcp_reader_fuzzer reads
//   torch_dist_checkpoint_fuzzer  every checkpoint directory, packed (fuzz/fuzz_support.h)
//   scenario_fuzzer               scenarios/**/*.json
//   revision_profile_fuzzer       revisions/*.json
//   trace_fuzzer                  the trace files of tests/fixtures/model-traces/,
//                                 tests/fixtures/real-checkpoints/runs/ and
//                                 tests/conformance/crash/, each under 64 KiB
// The real checkpoints are tests/fixtures/real-checkpoints/*/ (the folder `runs/` aside).
// Used by ckptsim_fuzz_seeds (fuzz/make_seeds.cpp, the libFuzzer corpora) and by the short
// fuzz run of the test suite (tests/fuzz/fuzz_short_run_test.cpp).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace ckptsim::fuzz {

struct SeedError {
  std::string message;
};

// fuzzer -> its seeds, each once, in the order found (directory order sorted where it is
// iterated). Throws SeedError or std::filesystem::filesystem_error when a file cannot be read
// or a real checkpoint does not parse.
using SeedCorpora = std::map<std::string, std::vector<std::string>>;
SeedCorpora seed_corpora(const std::filesystem::path& source_dir);

// The name a seed's file gets: its bytes' FNV-1a hash, 16 hex digits.
std::string seed_name(const std::string& bytes);

}  // namespace ckptsim::fuzz
