// Shared helpers for tests that run whole scenarios.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "properties/properties.h"
#include "sim/driver.h"
#include "sim/scenario.h"

namespace ckptsim::test {

inline model::RevisionRegistry& registry() {
  static model::RevisionRegistry r = [] {
    auto reg = model::RevisionRegistry::load_embedded();
    if (!reg.is_ok()) throw std::runtime_error(reg.status().to_string());
    return reg.value();
  }();
  return r;
}

// Sets an environment variable for one test, and restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

inline std::string source_path(const std::string& relative) {
  return std::string(CKPTSIM_SOURCE_DIR) + "/" + relative;
}

inline sim::Scenario scenario_from_json(const std::string& text,
                                        const std::string& source = "test.json") {
  auto s = sim::parse_scenario(text, source, registry());
  if (!s.is_ok()) throw std::runtime_error(s.status().to_string());
  return s.value();
}

inline sim::Scenario scenario_file(const std::string& relative) {
  auto s = sim::load_scenario_file(source_path(relative), registry());
  if (!s.is_ok()) throw std::runtime_error(s.status().to_string());
  return s.value();
}

inline sim::RunResult run(const sim::Scenario& s, const sim::RunOptions& options = {}) {
  auto r = sim::run_scenario(s, options);
  if (!r.is_ok()) throw std::runtime_error(r.status().to_string());
  return std::move(r.value());
}

// Resolved revisions, for generator configs.
inline std::vector<sim::Revision> revisions(const std::vector<std::string>& names) {
  std::vector<sim::Revision> out;
  for (const auto& n : names) {
    auto r = sim::resolve_revision(registry(), n);
    if (!r.is_ok()) throw std::runtime_error(r.status().to_string());
    out.push_back(r.value());
  }
  return out;
}

inline properties::PropertyResult verdict(const sim::RunResult& run, const std::string& property) {
  const auto* p = properties::find_property(property);
  if (p == nullptr) throw std::runtime_error("no property " + property);
  return p->check(run);
}

// A small hybrid scenario (offload 1.0 unless said otherwise), two phases, JSON text.
inline std::string two_phase_json(const std::string& kind, double offload, int dp0, int dp1,
                                  const std::string& rev0, const std::string& rev1,
                                  const std::string& extra = "") {
  std::string opt =
      "{\"kind\": \"" + kind +
      "\", \"lr\": 0.01, \"betas\": [0.9, 0.95], \"eps\": 1e-8, \"weight_decay\": 0.1";
  if (kind == "hybrid") opt += ", \"offload_fraction\": " + std::to_string(offload);
  opt += "}";
  return "{\"seed\": 7, \"name\": \"t\", \"params\": [{\"name\": \"w0\", \"numel\": 300, "
         "\"dtype\": \"bf16\"}, "
         "{\"name\": \"w1\", \"numel\": 130, \"dtype\": \"bf16\"}], \"optimizer\": " +
         opt + ", \"phases\": [{\"dp\": " + std::to_string(dp0) + ", \"revision\": \"" + rev0 +
         "\", \"steps\": 3}, {\"dp\": " + std::to_string(dp1) + ", \"revision\": \"" + rev1 +
         "\", \"steps\": 2}]" + extra + "}";
}

}  // namespace ckptsim::test
