// Fuzzes the readers of a trace file (report/trace_file.h: what `conform`, `check --trace` and
// `gate` read from the replay runner's output or from a bug report) with the file's text:
// properties/trace.h parse(), the trace checks (judge_trace) and the conformance judge
// (conform). Checked:
//   - parse() gives a trace or a one-line Status that names the file (trace.h invariant 1);
//   - conform() never throws (an exception is a crash by itself); it judges both sides with
//     the trace checks, as judge_trace() does, so that is not run again;
//   - a trace that parses conforms with itself: conform(t, t) gives a one-line Status naming the
//     file (a trace at odds with itself), or every property's verdicts agree and no divergence
//     is listed.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz/fuzz_targets.h"
#include "properties/conformance.h"
#include "properties/trace.h"

namespace ckptsim::fuzz {

namespace {

constexpr const char* kSource = "fuzz.trace.json";

}  // namespace

void fuzz_trace(std::span<const char> input) {
  const nlohmann::json j = nlohmann::json::parse(input.begin(), input.end(), nullptr, false);
  if (j.is_discarded()) return;  // report::read_trace_file: "not valid JSON", before any reader
  Result<properties::trace::Trace> t = properties::trace::parse(j, kSource);
  if (!t.is_ok()) {
    check_error(t.status(), kSource);
    return;
  }
  Result<properties::Conformance> self = properties::conform(j, j, kSource);
  if (!self.is_ok()) {
    // Both sides parse; what conform() may still refuse is a trace at odds with itself (its
    // model setup needs TE, a run says it ran without): an error naming the file.
    // (setup.transformer_engine is read from the model's side, which conform() names so.)
    const bool model_side = self.status().message().starts_with("the model's trace");
    check_error(self.status(), model_side ? "the model's trace" : kSource);
    return;
  }
  for (const properties::PropertyAgreement& p : self.value().properties) {
    if (!p.agree()) broken("a trace disagrees with itself on " + p.property);
  }
  const properties::Conformance& c = self.value();
  if (!c.divergences.empty())
    broken("a trace diverges from itself: " + c.divergences.front().describe());
  if (!c.hash_divergences.empty()) {
    broken("a trace's hashes differ from its own: " + c.hash_divergences.front().describe());
  }
  if (!c.agrees()) broken("a trace does not agree with itself (Conformance::agrees)");
}

}  // namespace ckptsim::fuzz

#ifndef CKPTSIM_FUZZ_IN_TESTS
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptsim::fuzz::fuzz_trace(ckptsim::fuzz::as_chars(data, size));
  return 0;
}
#endif
