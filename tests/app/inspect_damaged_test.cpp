// `ckptsim inspect` on damaged copies of a real checkpoint (tests/fixtures/real-checkpoints):
// each kind of damage a crashed or interrupted save leaves (a torn or empty data file, a data
// file or `.metadata` or metadata.json missing, a torn common.pt, a tracker written before its
// data or left empty) is exit 2 with a message that names the damaged file. None crashes the
// tool. The expected file names come from the damage applied, not from the code under test.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "app/commands.h"

namespace {

namespace fs = std::filesystem;
using namespace ckptsim;

const fs::path kFixture =
    fs::path(CKPTSIM_SOURCE_DIR) / "tests/fixtures/real-checkpoints/nv-f4502eb1c9__torch-adamw-dp2";
const std::string kIter = "iter_0000003";

void truncate_to_half(const fs::path& f) { fs::resize_file(f, fs::file_size(f) / 2); }

void write_text(const fs::path& f, const std::string& text) { std::ofstream(f) << text; }

struct Damage {
  std::string name;
  std::function<void(const fs::path& root)> apply;
  std::string named;  // what the message must name
};

void PrintTo(const Damage& d, std::ostream* os) { *os << d.name; }

const std::vector<Damage>& damages() {
  static const std::vector<Damage> all = {
      {"torn data file", [](const fs::path& r) { truncate_to_half(r / kIter / "__1_0.distcp"); },
       kIter + "/__1_0.distcp"},
      {"empty data file (disk full)",
       [](const fs::path& r) { fs::resize_file(r / kIter / "__0_0.distcp", 0); },
       kIter + "/__0_0.distcp"},
      {"missing data file", [](const fs::path& r) { fs::remove(r / kIter / "__1_0.distcp"); },
       kIter + "/__1_0.distcp"},
      {"missing .metadata (crash before the coordinator's finalize)",
       [](const fs::path& r) { fs::remove(r / kIter / ".metadata"); }, kIter + "/.metadata"},
      {"torn .metadata", [](const fs::path& r) { truncate_to_half(r / kIter / ".metadata"); },
       kIter + "/.metadata"},
      {"missing metadata.json (crash between .metadata and metadata.json)",
       [](const fs::path& r) { fs::remove(r / kIter / "metadata.json"); },
       kIter + "/metadata.json"},
      {"torn common.pt", [](const fs::path& r) { truncate_to_half(r / kIter / "common.pt"); },
       kIter + "/common.pt"},
      {"tracker written before its data",
       [](const fs::path& r) { write_text(r / "latest_checkpointed_iteration.txt", "9\n"); },
       "names iteration 9, but iter_0000009 is absent; present: " + kIter},
      {"empty tracker",
       [](const fs::path& r) { write_text(r / "latest_checkpointed_iteration.txt", ""); },
       "latest_checkpointed_iteration.txt"},
  };
  return all;
}

class InspectDamaged : public ::testing::TestWithParam<Damage> {};

TEST_P(InspectDamaged, ExitsTwoNamingTheDamagedFile) {
  std::string slug = GetParam().name;
  for (char& ch : slug) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '-';
  const fs::path dir = fs::temp_directory_path() / ("ckptsim-damaged-" + slug);
  fs::remove_all(dir);
  fs::copy(kFixture, dir, fs::copy_options::recursive);
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  }
  GetParam().apply(dir);
  app::InspectCommand c;
  c.dir = dir.string();
  c.revisions = {"fix-complete"};
  std::ostringstream out;
  std::ostringstream err;
  const int code = app::inspect_command(c, out, err);
  EXPECT_EQ(code, app::kExitInvalid) << out.str() << err.str();
  EXPECT_NE(err.str().find(GetParam().named), std::string::npos) << err.str();
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Kinds, InspectDamaged, ::testing::ValuesIn(damages()),
                         [](const ::testing::TestParamInfo<Damage>& info) {
                           std::string name;
                           for (char ch : info.param.name) {
                             if (ch == '(') break;
                             if (std::isalnum(static_cast<unsigned char>(ch))) name += ch;
                           }
                           return name;
                         });

}  // namespace
