// `ckptsim properties`: the registry of properties (properties/properties.h), as a user reads it:
// each property's name, what must hold, what it is judged on (the model's run, a trace of the
// model or of the real code, a real checkpoint's files) and its canary.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "properties/properties.h"

namespace ckptsim::app {

int properties_command(bool json, std::ostream& out) {
  nlohmann::json all = nlohmann::json::array();
  for (const auto& p : properties::all_properties()) {
    nlohmann::json j{{"name", p.name},
                     {"description", p.description},
                     {"run", static_cast<bool>(p.check)},
                     {"trace", static_cast<bool>(p.trace_check)},
                     {"checkpoint", p.checkpoint_check ? nlohmann::json(p.checkpoint_check_name)
                                                       : nlohmann::json(nullptr)},
                     {"canary", p.canary}};
    all.push_back(j);
    if (json) continue;
    out << p.name << "\n  " << p.description << "\n  judged on: " << properties::judged_on(p)
        << (p.checkpoint_check ? " (inspect's " + p.checkpoint_check_name + ")" : "")
        << "\n  canary: " << p.canary << "\n";
  }
  if (json) out << all.dump(2) << std::endl;
  return kExitOk;
}

}  // namespace ckptsim::app
