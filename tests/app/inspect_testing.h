// `inspect --json` as a user runs it, for the app tests.
#pragma once

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "app/commands.h"

namespace ckptsim::test {

struct Inspected {
  int code = -1;
  nlohmann::json out;
  std::string err;
};

inline Inspected inspect_json(app::InspectCommand c) {
  c.json = true;
  std::ostringstream out;
  std::ostringstream err;
  Inspected r;
  r.code = app::inspect_command(c, out, err);
  r.err = err.str();
  if (!out.str().empty()) r.out = nlohmann::json::parse(out.str());
  return r;
}

}  // namespace ckptsim::test
