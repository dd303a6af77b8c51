// The two files ckptsim exchanges with the replay runner (replay/PLAN_AND_TRACE.md, version 1;
// replay/plan.py and replay/trace_schema.py validate them):
//   - the replay plan: a scenario with its resolved revisions (and the upstream commit each
//     stands for), the initial params, and every rank's local gradient at every step of the
//     reference run and of every phase, exactly as the simulator feeds them (the runner never
//     recomputes them);
//   - the trace: per run, rank and point (init or after_load, after each step, at_save), every
//     Adam part's step counter and the bias-correction step it used, FNV-1a hashes of the
//     master params, moments and model params, and every error with its Python type, message,
//     site and merge() key path. The replay runner writes one from the real code ("source":
//     "real"); trace_json writes the model's ("source": "model").
//
// Invariants:
//   1. Floats travel as base64 of little-endian IEEE-754 binary32 values; hashes are FNV-1a 64
//      (sim::fnv1a) over those bytes, as 16 lowercase hex digits ("fnv1a64-f32le").
//   2. A trace's events are ordered by (position in the rank's own sequence, rank).
//   3. A plan's local gradients summed over the ranks of any run give the same fp32 values at a
//      global step as in every other run (sim/gradients.h invariant 1).
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sim/float_codec.h"
#include "sim/record.h"

namespace ckptsim::report {

// The format's float codec (sim/float_codec.h), named here too for the trace's users.
using sim::base64_f32;
using sim::floats_of_base64;
using sim::hash_f32;

// The replay plan of a scenario (every phase's profile resolved).
nlohmann::json replay_plan_json(const sim::Scenario& s);

// The model's trace of a run; with `values`, every hashed array also as base64.
nlohmann::json trace_json(const sim::RunResult& run, bool values = false);

}  // namespace ckptsim::report
