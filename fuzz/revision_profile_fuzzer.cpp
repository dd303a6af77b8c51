// Fuzzes model/revision.h RevisionRegistry::add(), which parses one revision profile's JSON
// text, and then get() of the name it defined, which resolves its `extends` chain against the
// embedded profiles (a copy of them per input). A name ending in ".json" would make get() read
// a file, so it is resolved only when it does not.
// Checked: ok or a one-line Status that names the file (invariant 2); a profile that add()
// accepted resolves, or fails on its `extends` with a one-line Status.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz/fuzz_targets.h"
#include "model/revision.h"

namespace ckptsim::fuzz {
namespace {

constexpr const char* kSource = "fuzz-profile.json";

const model::RevisionRegistry& embedded() {
  static const model::RevisionRegistry r = [] {
    Result<model::RevisionRegistry> loaded = model::RevisionRegistry::load_embedded();
    if (!loaded.is_ok()) broken("the embedded profiles: " + loaded.status().message());
    return loaded.value();
  }();
  return r;
}

}  // namespace

void fuzz_revision_profile(std::span<const char> input) {
  model::RevisionRegistry registry = embedded();
  const std::string text(input.begin(), input.end());
  const Status added = registry.add(text, kSource);
  if (!added.is_ok()) {
    check_error(added, kSource);
    return;
  }
  // add() accepted it, so it is a JSON object with a non-empty string name.
  const std::string name = nlohmann::json::parse(text)["name"].get<std::string>();
  if (name.ends_with(".json")) return;
  Result<model::RevisionProfile> profile = registry.get(name);
  if (!profile.is_ok()) {
    check_error(profile.status(), kSource);
    return;
  }
  if (profile.value().name != name) broken("get() resolved another profile");
  for (const std::string& s : profile.value().explicit_switches) {
    (void)model::switch_value_text(profile.value().switches, s);
  }
}

}  // namespace ckptsim::fuzz

#ifndef CKPTSIM_FUZZ_IN_TESTS
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptsim::fuzz::fuzz_revision_profile(ckptsim::fuzz::as_chars(data, size));
  return 0;
}
#endif
