// Pictures of a run (report/plot.h, `ckptsim plot`). The traces of the first tests are made by
// hand: three params, a reference run, a phase that saves at step 2 and a phase at DP 2 that
// resumes with the CPU AdamW counters reset to 1 (bug 2's shape); the real trace is the same
// run with hashes only, resuming correctly. Every expected row below is worked out here from
// those numbers, not read back from the code's output.
//
// Mutations tried (each made a test here fail): the model's and the real trace's runs swapped
// in plot_spec (DataHoldsEverySourceAndPart: the "model" line read 2 after the load where the
// model resets to 1, the "real" one 1); the last (part, param) pair dropped from the series
// keys (DataHoldsEverySourceAndPart and Bug2PictureShowsTheReset: no line named "... p0, p2",
// "... w0, w1").
#include "report/plot.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "app/commands.h"
#include "report/trace_json.h"
#include "tests/testing.h"

using namespace ckptsim;
using nlohmann::json;

namespace {

namespace fs = std::filesystem;

// One param's state at one point; an empty moment is null (not created yet).
struct ParamState {
  std::vector<float> master, exp_avg, exp_avg_sq;
};
using State = std::map<std::string, ParamState>;

// The uninterrupted run's state after `k` steps.
State reference_state(int k) {
  const float f = static_cast<float>(k);
  State s;
  s["p0"].master = {1.0F + 0.5F * f, 2.0F + 0.5F * f};
  s["p1"].master = {-1.0F, -1.0F + 0.25F * f};
  s["p2"].master = {f};
  if (k > 0) {
    s["p0"].exp_avg = {0.125F * f, 0.125F};
    s["p0"].exp_avg_sq = {0.25F, 0.25F};
    s["p1"].exp_avg = {0.0F, 0.0F};
    s["p1"].exp_avg_sq = {0.5F, 0.5F};
    s["p2"].exp_avg = {0.5F};
    s["p2"].exp_avg_sq = {0.5F};
  }
  return s;
}

struct Part {
  std::string part;
  std::string param;
  int64_t start = 0;
  int64_t end = 0;
  json step;
  json step_used;
};

std::vector<float> slice(const std::vector<float>& v, int64_t a, int64_t b) {
  return {v.begin() + a, v.begin() + b};
}

json event(int rank, const std::string& at, int64_t step, const std::vector<Part>& parts,
           const State& st, bool with_values) {
  json ev{{"rank", rank}, {"at", at}, {"global_step", step}, {"parts", json::array()}};
  json hashes{{"master", json::object()},
              {"exp_avg", json::object()},
              {"exp_avg_sq", json::object()},
              {"model_param", json::object()}};
  json values = hashes;
  for (const auto& p : parts) {
    ev["parts"].push_back({{"part", p.part},
                           {"param", p.param},
                           {"range", {p.start, p.end}},
                           {"step", p.step},
                           {"step_used", p.step_used}});
    const ParamState& ps = st.at(p.param);
    for (const auto& [kind, v] : {std::pair{"master", &ps.master},
                                  {"exp_avg", &ps.exp_avg},
                                  {"exp_avg_sq", &ps.exp_avg_sq}}) {
      if (v->empty()) {
        hashes[kind][p.param] = nullptr;
        values[kind][p.param] = nullptr;
        continue;
      }
      hashes[kind][p.param] = report::hash_f32(slice(*v, p.start, p.end));
      values[kind][p.param] = report::base64_f32(slice(*v, p.start, p.end));
    }
  }
  for (const auto& [param, ps] : st) {
    hashes["model_param"][param] = report::hash_f32(ps.master);
    values["model_param"][param] = report::base64_f32(ps.master);
  }
  ev["hashes"] = hashes;
  if (with_values) ev["values"] = values;
  return ev;
}

json counter(std::optional<double> v) { return v ? json(*v) : json(nullptr); }

// Rank 0 holding every param whole (DP 1), with the CPU AdamW counter `cpu`, FusedAdam's `gpu`.
std::vector<Part> dp1_parts(std::optional<double> cpu, std::optional<double> gpu, bool stepped) {
  return {{"HDO cpu AdamW", "p0", 0, 2, counter(cpu), stepped ? counter(cpu) : json(nullptr)},
          {"HDO gpu FusedAdam", "p1", 0, 2, counter(gpu), stepped ? counter(gpu) : json(nullptr)},
          {"HDO cpu AdamW", "p2", 0, 1, counter(cpu), stepped ? counter(cpu) : json(nullptr)}};
}

json run(const std::string& id, int dp, int64_t start, int64_t steps, json events) {
  json r{{"id", id},
         {"dp", dp},
         {"revision", "upstream-2874"},
         {"start_step", start},
         {"steps", steps},
         {"load", id == "phase1"},
         {"save", id != "reference"},
         {"status", "completed"},
         {"events", std::move(events)}};
  if (id != "reference") r["phase"] = id == "phase0" ? 0 : 1;
  return r;
}

// model: the resumed CPU AdamW counters are 1 (reset); real: 2 (kept), hashes only, and the
// FusedAdam shard not updated by the last step.
json small_trace(bool real) {
  const bool values = !real;
  json reference = json::array();
  reference.push_back(event(0, "init", 0, dp1_parts({}, {}, false), reference_state(0), values));
  for (int k = 1; k <= 3; ++k)
    reference.push_back(
        event(0, "after_step", k, dp1_parts(k, k, true), reference_state(k), values));
  json phase0 = json::array();
  phase0.push_back(event(0, "init", 0, dp1_parts({}, {}, false), reference_state(0), values));
  for (int k = 1; k <= 2; ++k)
    phase0.push_back(event(0, "after_step", k, dp1_parts(k, k, true), reference_state(k), values));
  phase0.push_back(event(0, "at_save", 2, dp1_parts(2, 2, false), reference_state(2), values));
  // phase1 at DP 2: p0 split over the ranks, p1 on rank 1, p2 on rank 0.
  const double cpu_loaded = real ? 2 : 1;
  State last = reference_state(3);
  if (real) {
    last["p2"].master = {99.0F};  // differs from the real uninterrupted run: hashes tell only that
  } else {
    last["p0"].master[1] += 0.25F;   // |diff| 0.25
    last["p1"].exp_avg[0] = 0.375F;  // |diff| 0.375 (the largest)
  }
  auto parts = [&](double cpu, double gpu, bool stepped, int rank) {
    const json gpu_used = stepped && !real ? json(gpu) : json(nullptr);
    std::vector<Part> p;
    if (rank == 0) {
      p.push_back({"HDO cpu AdamW", "p0", 0, 1, cpu, stepped ? json(cpu) : json(nullptr)});
      p.push_back({"HDO cpu AdamW", "p2", 0, 1, cpu, stepped ? json(cpu) : json(nullptr)});
    } else {
      p.push_back({"HDO cpu AdamW", "p0", 1, 2, cpu, stepped ? json(cpu) : json(nullptr)});
      p.push_back({"HDO gpu FusedAdam", "p1", 0, 2, gpu, gpu_used});
    }
    return p;
  };
  json phase1 = json::array();
  for (int r = 0; r < 2; ++r)
    phase1.push_back(
        event(r, "after_load", 2, parts(cpu_loaded, 2, false, r), reference_state(2), values));
  for (int r = 0; r < 2; ++r)
    phase1.push_back(event(r, "after_step", 3, parts(cpu_loaded + 1, 3, true, r), last, values));
  return {{"format", "ckptsim-trace"},
          {"version", 1},
          {"source", real ? "real" : "model"},
          {"scenario", "tiny"},
          {"runs",
           {run("reference", 1, 0, 3, reference), run("phase0", 1, 0, 2, phase0),
            run("phase1", 2, 2, 1, phase1)}}};
}

// The data file's blocks by "panel | label | source": their lines ("" where a line breaks).
std::map<std::string, std::vector<std::string>> blocks_of(const std::string& data,
                                                          std::map<int, std::string>* by_index) {
  std::map<std::string, std::vector<std::string>> out;
  std::istringstream in(data);
  std::string line;
  std::string current;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, std::regex(R"(# \[(\d+)\] (.*))"))) {
      current = m[2];
      out[current];
      if (by_index != nullptr) (*by_index)[std::stoi(m[1])] = current;
    } else if (!current.empty() && (line.empty() || line[0] != '#')) {
      out[current].push_back(line);
    }
  }
  for (auto& [k, rows] : out) {  // the two blank lines that end a block are not breaks
    while (!rows.empty() && rows.back().empty()) rows.pop_back();
  }
  return out;
}

const std::string kCpu = "HDO cpu AdamW p0, p2";
const std::string kGpu = "HDO gpu FusedAdam p1";
const std::string kVsRef = "max |diff| vs uninterrupted (master, exp_avg, exp_avg_sq)";

report::PlotSpec small_spec() {
  static const json model = small_trace(false);
  static const json real = small_trace(true);
  auto spec = report::plot_spec({&model, &real, "real.trace.json", {}});
  if (!spec.is_ok()) throw std::runtime_error(spec.status().to_string());
  return spec.value();
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

fs::path fresh_dir(const std::string& tag) {
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("ckptsim-plot-" + tag + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace

TEST(Plot, DataHoldsEverySourceAndPart) {
  const auto blocks = blocks_of(report::plot_data(small_spec()), nullptr);
  using Rows = std::vector<std::string>;
  // p0 and p2 share a line (equal counters everywhere); null counters at init draw nothing.
  // model: 1, 2, 2 at save, 1 after the load (the reset), 2 after step 3.
  EXPECT_EQ(blocks.at("counters | " + kCpu + " | model"),
            (Rows{"1 1", "2 2", "2 2", "2 1", "3 2"}));
  EXPECT_EQ(blocks.at("counters | " + kCpu + " | uninterrupted"), (Rows{"1 1", "2 2", "3 3"}));
  EXPECT_EQ(blocks.at("counters | " + kCpu + " | real"), (Rows{"1 1", "2 2", "2 2", "2 2", "3 3"}));
  EXPECT_EQ(blocks.at("counters | " + kCpu + " | real uninterrupted"), (Rows{"1 1", "2 2", "3 3"}));
  EXPECT_EQ(blocks.at("counters | " + kGpu + " | model"),
            (Rows{"1 1", "2 2", "2 2", "2 2", "3 3"}));
  EXPECT_EQ(blocks.at("counters | " + kGpu + " | real"), (Rows{"1 1", "2 2", "2 2", "2 2", "3 3"}));
  // The real FusedAdam shard was not updated by step 3 (step_used null): a mark at its counter.
  EXPECT_EQ(blocks.at("counters | " + kGpu + ": not updated by this step (step_used null) | real"),
            (Rows{"3 3"}));
  EXPECT_EQ(
      blocks.count("counters | " + kGpu + ": not updated by this step (step_used null) | model"),
      0u);
  // Divergence from values: init, steps 1 and 2, the save and the load at step 2 equal the
  // uninterrupted run; after step 3, max(|3.75 - 3.5|, |0.375 - 0|) = 0.375.
  EXPECT_EQ(blocks.at("divergence | " + kVsRef + " | model"),
            (Rows{"0 0", "1 0", "2 0", "2 0", "2 0", "3 0.375"}));
  // From hashes only: equal (0) until p2 differs after step 3 (1); the real uninterrupted run
  // equals the model's everywhere.
  EXPECT_EQ(blocks.at("divergence-flag | vs real uninterrupted (hashes, no values: 0 equal, 1 "
                      "differs) | real"),
            (Rows{"0 0", "1 0", "2 0", "2 0", "2 0", "3 1"}));
  EXPECT_EQ(blocks.at("divergence-flag | vs the model's uninterrupted run (hashes, no values: 0 "
                      "equal, 1 differs) | real uninterrupted"),
            (Rows{"0 0", "1 0", "2 0", "3 0"}));
  // Nothing else: 2 groups x 4 sources, one mark series, three comparisons.
  EXPECT_EQ(blocks.size(), 2u * 4 + 1 + 3);
}

TEST(Plot, ScriptPlotsEveryBlockUnderItsOwnTitle) {
  const auto spec = small_spec();
  std::map<int, std::string> by_index;
  const auto blocks = blocks_of(report::plot_data(spec), &by_index);
  const std::string script = report::plot_script(spec);
  // Every `index N` of the script names block N, and its legend title is that block's
  // "source: label".
  const std::regex clause(R"(data index (\d+) using 1:2.*? title "([^"]*)\")");
  size_t plotted = 0;
  for (auto it = std::sregex_iterator(script.begin(), script.end(), clause);
       it != std::sregex_iterator(); ++it, ++plotted) {
    const std::string header = by_index.at(std::stoi((*it)[1]));  // "panel | label | source"
    const auto bar1 = header.find(" | ");
    const auto bar2 = header.rfind(" | ");
    const std::string label = header.substr(bar1 + 3, bar2 - bar1 - 3);
    const std::string source = header.substr(bar2 + 3);
    EXPECT_EQ((*it)[2], source + ": " + label) << header;
    if (header.starts_with("divergence-flag")) {
      EXPECT_NE(it->str().find("axes x1y2"), std::string::npos) << it->str();
    }
  }
  EXPECT_EQ(plotted, blocks.size());
  // A fixed canvas and font; no date, no path of this machine.
  EXPECT_NE(script.find("set terminal pngcairo size 1600,1000 font 'DejaVu Sans,10'"),
            std::string::npos);
  EXPECT_EQ(script.find(::testing::TempDir()), std::string::npos);
  EXPECT_EQ(script.find(CKPTSIM_SOURCE_DIR), std::string::npos);
  // The resume at step 2, and the phase it starts.
  EXPECT_NE(script.find("from first 2, graph 0 to first 2, graph 1"), std::string::npos);
  EXPECT_NE(script.find("\"phase1: dp 2, upstream-2874\""), std::string::npos);
}

TEST(Plot, ARealTraceOfAnotherScenarioIsRefused) {
  const json model = small_trace(false);
  json real = small_trace(true);
  real["scenario"] = "other";
  auto spec = report::plot_spec({&model, &real, "other.trace.json", {}});
  ASSERT_FALSE(spec.is_ok());
  EXPECT_EQ(spec.status().code(), Status::Code::kInvalidInput);
  EXPECT_NE(spec.status().message().find("other.trace.json: field 'scenario'"), std::string::npos)
      << spec.status().message();
}

TEST(Plot, TheSameInputGivesTheSameBytes) {
  const auto spec = small_spec();
  const fs::path dir = fresh_dir("bytes");
  std::string first;
  for (const char* name : {"a.png", "b.png"}) {
    auto drawn = report::render_plot(spec, {(dir / name).string()});
    ASSERT_TRUE(drawn.is_ok()) << drawn.status().to_string();
    if (drawn.value().outcome == report::GnuplotOutcome::kMissing)
      GTEST_SKIP() << "gnuplot is not installed (apt-get install gnuplot-nox)";
    ASSERT_EQ(drawn.value().outcome, report::GnuplotOutcome::kOk) << drawn.value().output;
    EXPECT_EQ(drawn.value().output, "") << "gnuplot warned about the script";
  }
  const std::string a = read_bytes(dir / "a.png");
  EXPECT_EQ(a.substr(0, 8), "\x89PNG\r\n\x1a\n");
  EXPECT_EQ(a, read_bytes(dir / "b.png"));
  // Only the two pictures are left: the working folders are gone.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2);
  fs::remove_all(dir);
}

TEST(Plot, WithoutGnuplotTheCommandSaysWhatToInstall) {
  const fs::path dir = fresh_dir("missing");
  app::PlotCommand c;
  c.scenario = test::source_path("scenarios/bug2-step-reset-dp2-to-4.json");
  c.out = (dir / "bug2.png").string();
  c.gnuplot = "ckptsim-no-such-gnuplot";
  std::ostringstream out, err;
  EXPECT_EQ(app::plot_command(c, out, err), app::kExitInvalid);
  const std::string said = err.str();
  EXPECT_NE(said.find("apt-get install gnuplot-nox"), std::string::npos) << said;
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1) << said;
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir);
}

// Bug 2 end to end: the CPU AdamW counters go 5 -> 1 at the resume in the model's line, and
// stay 5 -> 6 in the uninterrupted one (the spec's numbers); the picture is the same twice.
TEST(Plot, Bug2PictureShowsTheReset) {
  const fs::path dir = fresh_dir("bug2");
  app::PlotCommand c;
  c.scenario = test::source_path("scenarios/bug2-step-reset-dp2-to-4.json");
  c.keep_data = true;
  for (const char* name : {"a.png", "b.png"}) {
    c.out = (dir / name).string();
    std::ostringstream out, err;
    const int code = app::plot_command(c, out, err);
    if (code == app::kExitInvalid && err.str().find("gnuplot-nox") != std::string::npos)
      GTEST_SKIP() << "gnuplot is not installed (apt-get install gnuplot-nox)";
    ASSERT_EQ(code, app::kExitOk) << err.str();
    EXPECT_EQ(err.str(), "");
  }
  EXPECT_EQ(read_bytes(dir / "a.png"), read_bytes(dir / "b.png"));
  EXPECT_EQ(read_bytes(dir / "a.dat"), read_bytes(dir / "b.dat"));
  const auto blocks = blocks_of(read_bytes(dir / "a.dat"), nullptr);
  const auto& model = blocks.at("counters | HDO cpu AdamW w0, w1 | model");
  const auto& reference = blocks.at("counters | HDO cpu AdamW w0, w1 | uninterrupted");
  const auto at = [](const std::vector<std::string>& rows, const std::string& row) {
    return std::find(rows.begin(), rows.end(), row) - rows.begin();
  };
  // ... "5 5" (after step 5), "5 5" (at save), "5 1" (after the load), "6 2" ...
  ASSERT_LT(at(model, "5 1"), static_cast<long>(model.size()));
  EXPECT_EQ(model[static_cast<size_t>(at(model, "5 1")) - 1], "5 5");
  EXPECT_EQ(model[static_cast<size_t>(at(model, "5 1")) + 1], "6 2");
  EXPECT_LT(at(reference, "6 6"), static_cast<long>(reference.size()));
  EXPECT_EQ(at(reference, "5 1"), static_cast<long>(reference.size()));
  fs::remove_all(dir);
}

TEST(Plot, TheReproductionReportLinksAPictureOfEachFailingScenario) {
  const fs::path dir = fresh_dir("report");
  app::RunCommand c;
  c.files = {test::source_path("scenarios/bug2-fixed-dp2-to-4.json"),
             test::source_path("scenarios/bug2-step-reset-dp2-to-4.json")};
  c.memory = true;
  c.quiet = true;
  c.expect = true;
  c.report = (dir / "reproduction.md").string();
  c.plots = (dir / "plots").string();
  std::ostringstream out, err;
  const int code = app::run_command(c, out, err);
  if (code == app::kExitInvalid && err.str().find("gnuplot-nox") != std::string::npos)
    GTEST_SKIP() << "gnuplot is not installed (apt-get install gnuplot-nox)";
  ASSERT_EQ(code, app::kExitOk) << err.str();
  const std::string md = read_bytes(dir / "reproduction.md");
  EXPECT_NE(md.find("| bug2-step-reset-dp2-to-4 | upstream-2874 | step_matches_uninterrupted fail"),
            std::string::npos);
  EXPECT_NE(md.find("| yes | [png](plots/bug2-step-reset-dp2-to-4.png) |"), std::string::npos);
  EXPECT_NE(md.find("](plots/bug2-step-reset-dp2-to-4.png)\n"), std::string::npos);
  EXPECT_NE(md.find("| bug2-fixed-dp2-to-4 | fix-recommended | all pass | yes | — |"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(dir / "plots" / "bug2-step-reset-dp2-to-4.png"));
  EXPECT_FALSE(fs::exists(dir / "plots" / "bug2-fixed-dp2-to-4.png"));
  fs::remove_all(dir);
}

// A TP piece split on dim 1 is one trace part per row, its floats in one blob per param: the
// picture reads each part at its offset in the blob. The bundled TP 2 x PP 2 -> 1 x 1 -> 4 x 2
// run follows the uninterrupted one bit for bit (every property passes), so every divergence
// point is 0. Mutation caught: each part read from the blob's start (offset ignored): the
// row-split params' later rows compared with their first, divergences above 0.
TEST(Plot, RowSplitPartsReadTheirOwnFloats) {
  const fs::path dir = fresh_dir("tp");
  app::PlotCommand c;
  c.scenario =
      test::source_path("scenarios/fully-reshardable-reshards-tp-pp-dp-upstream-head.json");
  c.keep_data = true;
  c.out = (dir / "tp.png").string();
  std::ostringstream out, err;
  const int code = app::plot_command(c, out, err);
  if (code == app::kExitInvalid && err.str().find("gnuplot-nox") != std::string::npos)
    GTEST_SKIP() << "gnuplot is not installed (apt-get install gnuplot-nox)";
  ASSERT_EQ(code, app::kExitOk) << err.str();
  const auto blocks = blocks_of(read_bytes(dir / "tp.dat"), nullptr);
  const auto& divergence =
      blocks.at("divergence | max |diff| vs uninterrupted (master, exp_avg, exp_avg_sq) | model");
  ASSERT_GT(divergence.size(), 8u);
  for (const std::string& row : divergence) {
    if (row.empty()) continue;
    EXPECT_EQ(row.substr(row.find(' ') + 1), "0") << row;
  }
  fs::remove_all(dir);
}
