#include "properties/expect.h"

#include <fmt/format.h>

namespace ckptsim::properties {

namespace {

std::optional<Verdict> parse_verdict(const nlohmann::json& want) {
  if (want.is_boolean()) return want.get<bool>() ? Verdict::kPass : Verdict::kFail;
  if (!want.is_string()) return std::nullopt;
  for (Verdict v : {Verdict::kPass, Verdict::kFail, Verdict::kNotEvaluated}) {
    if (want.get<std::string>() == verdict_name(v)) return v;
  }
  return std::nullopt;
}

const PropertyResult* result_of(const std::vector<PropertyResult>& results,
                                const std::string& name) {
  for (const auto& r : results) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

}  // namespace

Result<std::optional<Expectation>> parse_expectation(const nlohmann::json& block,
                                                     const std::string& source) {
  auto error = [&](const std::string& field, const std::string& what) {
    return Status::invalid_input(fmt::format("{}: field 'expect.{}': {}", source, field, what));
  };
  if (block.is_null()) return std::optional<Expectation>();
  Expectation e;
  if (block.contains("ok")) {
    if (!block["ok"].is_boolean()) return error("ok", "must be true or false");
    e.ok = block["ok"].get<bool>();
  }
  for (const char* field : {"properties", "detail_contains"}) {
    if (!block.contains(field)) continue;
    const nlohmann::json& m = block[field];
    if (!m.is_object()) return error(field, "must be an object from property names");
    const bool verdicts = std::string(field) == "properties";
    for (const auto& [name, want] : m.items()) {
      const std::string path = std::string(field) + "." + name;
      if (find_property(name) == nullptr)
        return error(path, "unknown property (known: " + property_names() + ")");
      if (verdicts) {
        const auto v = parse_verdict(want);
        if (!v.has_value()) {
          return error(path, "must be true, false, \"pass\", \"fail\" or \"not_evaluated\", got " +
                                 want.dump());
        }
        e.verdicts.emplace_back(name, *v);
      } else {
        if (!want.is_string()) return error(path, "must be a string, got " + want.dump());
        e.detail_contains.emplace_back(name, want.get<std::string>());
      }
    }
  }
  return std::optional<Expectation>(std::move(e));
}

std::vector<std::string> expectation_mismatches(const Expectation& expect,
                                                const std::vector<PropertyResult>& results) {
  std::vector<std::string> out;
  if (expect.ok.has_value() && *expect.ok != all_ok(results)) {
    out.push_back(fmt::format("expected overall ok={}, observed {}", *expect.ok, all_ok(results)));
  }
  for (const auto& [name, want] : expect.verdicts) {
    const PropertyResult* r = result_of(results, name);
    if (r == nullptr) {
      out.push_back("expect names an unknown property " + name);
      continue;
    }
    if (want != r->verdict) {
      out.push_back(fmt::format("{}: expected {}, observed {} ({})", name, verdict_name(want),
                                verdict_name(r->verdict), r->detail));
    }
  }
  for (const auto& [name, text] : expect.detail_contains) {
    const PropertyResult* r = result_of(results, name);
    if (r == nullptr || r->detail.find(text) == std::string::npos) {
      out.push_back(fmt::format("{}: expected the detail to contain \"{}\", observed \"{}\"", name,
                                text,
                                r != nullptr ? r->detail : std::string("(no such property)")));
    }
  }
  return out;
}

}  // namespace ckptsim::properties
