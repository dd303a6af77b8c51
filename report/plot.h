// Pictures of a run (`ckptsim plot`): against the global step, every Adam part's step counter
// and the largest divergence from the uninterrupted run, for the model's run of a scenario, its
// uninterrupted reference run and, where given, a real trace of the same scenario (and the real
// trace's own uninterrupted run). The inputs are traces (report/trace_json.h,
// replay/PLAN_AND_TRACE.md): the model's, written with values, and the real one, which usually
// holds hashes only.
//
// What is plotted, per source (model: the phases' runs; uninterrupted: the model's reference
// run; real / real uninterrupted: the same runs of the real trace):
//   - top panel, one line per Adam part series: the part's `step` (the counter its next update
//     advances from) at every state event, in trace order: init or after_load, after each step,
//     at save. A resume is a vertical jump at the checkpoint's global step (the saved counter,
//     then the loaded one). A series is a (part, param) pair; pairs whose counters are equal in
//     every source at every point share one line and one legend entry. Where ranks hold
//     different counters for one series, the line is the minimum over ranks and a second series
//     shows the maximum. A `null` counter (no state yet) breaks the line. Open squares mark
//     after_step points where a shard was not updated (`step_used` null).
//   - bottom panel: the largest divergence of a run's state from the uninterrupted run at the
//     same global step (after_load, at_save: the reference's state after that step). From
//     values where both events carry them: max |a - b| over master params, exp_avg and
//     exp_avg_sq, element by element over the whole param (shards of every rank put together;
//     a moment that does not exist yet counts as zeros, as Adam's lazy state starts). From
//     hashes where an event has none (real traces): only "equal" (0) or "differs" (1), on the
//     right axis, comparing every shard hash of the same (param, range) and every whole model
//     param; nothing is invented about the size of a difference. A difference that is not a
//     finite number (NaN or inf in either run) is also plotted as "differs".
//   - with a real trace, the bottom panel also compares the real uninterrupted run with the
//     model's (the same run on both sides): where the real code and the model part ways.
//
// Invariants:
//   1. The data file and the script are functions of the traces and the options alone: fixed
//      number formats, series in a fixed order (parts in order of first appearance in the
//      model's trace, then the real one's), no paths, dates or host names inside.
//   2. Every series of the script is a block of the data file: `index N` of the script is the
//      block whose header line is `# [N] <panel> | <label> | <source>`, and the legend title is
//      built from the same label and source.
//   3. The PNG comes from gnuplot's pngcairo terminal at a fixed size and font, started with
//      `-d` (no initialisation file is read): the same files give the same bytes on one machine.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "model/status.h"

namespace ckptsim::report {

enum class PlotPanel { kCounters, kDivergence, kDivergenceFlag };

// One line (or set of points) of the picture: one block of the data file.
struct PlotSeries {
  PlotPanel panel = PlotPanel::kCounters;
  std::string label;   // "HDO cpu AdamW w0, w1", "max |diff| vs uninterrupted"
  std::string source;  // "model", "uninterrupted", "real", "real uninterrupted", ...
  std::string style;   // the gnuplot `with ...` clause
  // (global step, value); no value: the line breaks there.
  std::vector<std::pair<int64_t, std::optional<double>>> points;
  std::string title() const { return source + ": " + label; }
};

struct PlotMarker {
  int64_t global_step = 0;
  std::string label;  // "phase 1: dp 4, upstream-2874"
};

struct PlotSpec {
  std::string title;
  std::vector<std::string> notes;  // lines under the title: errors, the conformance verdict
  std::vector<PlotMarker> resumes;
  std::vector<PlotSeries> series;
  int64_t steps_max = 0;
};

struct PlotInputs {
  const nlohmann::json* model = nullptr;  // the model's trace, with values
  const nlohmann::json* real = nullptr;   // optional: a real trace of the same scenario
  std::string real_name;                  // how errors name the real trace (its file)
  std::vector<std::string> notes;         // extra lines under the title
};

// The picture's content. Fails (invalid input, naming the trace and the field) on a trace that
// is not of the format, or on a real trace of another scenario.
Result<PlotSpec> plot_spec(const PlotInputs& in);

// The data file: one block per series, `# [N] panel | label | source` then `step value` lines
// (a blank line where the line breaks), blocks separated by two blank lines.
std::string plot_data(const PlotSpec& spec);

// The gnuplot script. It reads the variables `data` and `out` (defaults `plot.dat` and
// `plot.png`, relative to where gnuplot runs): `gnuplot -d -e "data='x.dat'; out='x.png'" x.gp`.
std::string plot_script(const PlotSpec& spec);

// Where a picture goes, and with what.
struct PlotFiles {
  std::string png;
  bool keep_data = false;  // also write <png without .png>.dat and .gp next to it
  std::string gnuplot = "gnuplot";
};

enum class GnuplotOutcome { kOk, kMissing, kFailed };

struct GnuplotRun {
  GnuplotOutcome outcome = GnuplotOutcome::kOk;
  std::string output;  // what gnuplot printed (warnings; the error when it failed)
};

// Writes the data file and the script into a fresh folder next to the PNG, runs gnuplot there,
// moves the PNG into place and removes the folder. A Status only for files that cannot be
// written; gnuplot's own outcome in the result (kMissing: it could not be started).
Result<GnuplotRun> render_plot(const PlotSpec& spec, const PlotFiles& files);

// The one line a user reads when gnuplot is missing.
inline constexpr const char* kGnuplotMissing =
    "gnuplot not found: install it with `apt-get install gnuplot-nox` (or scripts/setup.sh)";

}  // namespace ckptsim::report
