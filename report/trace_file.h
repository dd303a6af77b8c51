// Trace files on disk: a trace (report/trace_json.h) is written as `<name>.trace.json`, or
// gzip-compressed as `<name>.trace.json.gz` (the recorded corpus keeps its long-phase traces so:
// a 260-step phase at DP 8 holds a hash of every rank's state after every step). Readers take
// either.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "model/status.h"

namespace ckptsim::report {

// Whether `path` names a trace file (".trace.json" or ".trace.json.gz").
bool is_trace_file(const std::string& path);
// The file name without its directory and its trace extension.
std::string trace_stem(const std::string& path);
// The JSON of a trace file, gunzipped when it ends with ".gz". Errors name the file.
Result<nlohmann::json> read_trace_file(const std::string& path);

}  // namespace ckptsim::report
