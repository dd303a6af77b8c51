#include "report/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "report/trace_json.h"

namespace ckptsim::report {

namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Reading traces

// One position of a run: every rank's state event there (error events are not points).
struct Point {
  std::string run;
  std::string at;
  int64_t global_step = 0;
  std::vector<const json*> events;  // rank order
};

// A run's state points in order: the k-th state event of every rank makes point k.
std::vector<Point> run_points(const json& run) {
  std::map<std::tuple<size_t, std::string, int64_t>, Point> by_position;
  std::map<int64_t, size_t> seen;  // rank -> state events so far
  for (const auto& e : run.at("events")) {
    const std::string at = e.at("at").get<std::string>();
    if (at == "error") continue;
    const size_t position = seen[e.at("rank").get<int64_t>()]++;
    const int64_t step = e.at("global_step").get<int64_t>();
    Point& p = by_position[{position, at, step}];
    p.run = run.at("id").get<std::string>();
    p.at = at;
    p.global_step = step;
    p.events.push_back(&e);
  }
  std::vector<Point> out;
  for (auto& [key, p] : by_position) out.push_back(std::move(p));
  return out;
}

// The points of a trace's reference run, and of its other runs in plan order.
struct SourceRuns {
  std::vector<Point> reference;
  std::vector<Point> phases;
};

SourceRuns source_runs(const json& trace) {
  SourceRuns out;
  for (const auto& run : trace.at("runs")) {
    auto points = run_points(run);
    auto& into = run.at("id") == "reference" ? out.reference : out.phases;
    into.insert(into.end(), points.begin(), points.end());
  }
  return out;
}

using SeriesKey = std::pair<std::string, std::string>;  // (part, param)

// What one series holds at one point: the counters over ranks, and whether a shard was not
// updated by the step just taken.
struct CounterAt {
  int64_t global_step = 0;
  std::optional<double> min;
  std::optional<double> max;
  bool not_updated = false;
};

CounterAt counter_at(const Point& p, const SeriesKey& key) {
  CounterAt c;
  c.global_step = p.global_step;
  for (const json* e : p.events) {
    for (const auto& part : e->at("parts")) {
      if (part.at("part") != key.first || part.at("param") != key.second) continue;
      if (p.at == "after_step" && part.value("step_used", json()).is_null()) c.not_updated = true;
      const json& step = part.at("step");
      if (step.is_null()) continue;
      const double v = step.get<double>();
      c.min = c.min ? std::min(*c.min, v) : v;
      c.max = c.max ? std::max(*c.max, v) : v;
    }
  }
  return c;
}

// The (part, param) pairs of a trace, in order of first appearance.
void collect_keys(const json& trace, std::vector<SeriesKey>& keys) {
  for (const auto& run : trace.at("runs")) {
    for (const auto& e : run.at("events")) {
      if (!e.contains("parts")) continue;
      for (const auto& part : e.at("parts")) {
        SeriesKey k{part.at("part").get<std::string>(), part.at("param").get<std::string>()};
        if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(std::move(k));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Series styles

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                    "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

struct Source {
  std::string name;
  const std::vector<Point>* points = nullptr;
  const char* line;  // the `with` clause without its colour
};

std::string counter_style(const Source& s, size_t group) {
  return fmt::format("{} lc rgb '{}'", s.line, kPalette[group % std::size(kPalette)]);
}

// ---------------------------------------------------------------------------------------------
// Counters

std::string number(double v) { return fmt::format("{:.10g}", v); }

std::string signature(const std::vector<Source>& sources, const SeriesKey& key) {
  std::string out;
  for (const auto& s : sources) {
    out += "|";
    for (const auto& p : *s.points) {
      const CounterAt c = counter_at(p, key);
      out += fmt::format("{}:{}:{}:{};", c.global_step, c.min ? number(*c.min) : "-",
                         c.max ? number(*c.max) : "-", c.not_updated ? 1 : 0);
    }
  }
  return out;
}

// "HDO cpu AdamW w0, w1; FusedAdam w2": the pairs of a group, by part.
std::string group_label(const std::vector<SeriesKey>& keys) {
  std::vector<std::pair<std::string, std::vector<std::string>>> by_part;
  for (const auto& [part, param] : keys) {
    auto it = std::find_if(by_part.begin(), by_part.end(),
                           [&](const auto& b) { return b.first == part; });
    if (it == by_part.end()) it = by_part.insert(by_part.end(), {part, {}});
    it->second.push_back(param);
  }
  constexpr size_t kParamsShown = 6;
  std::string out;
  for (const auto& [part, params] : by_part) {
    out += (out.empty() ? "" : "; ") + part + " ";
    for (size_t i = 0; i < params.size() && i < kParamsShown; ++i)
      out += (i ? ", " : "") + params[i];
    if (params.size() > kParamsShown) out += fmt::format(", +{}", params.size() - kParamsShown);
  }
  return out;
}

// One source's line for one group (keyed by its first pair), and its max-over-ranks twin.
void add_counter_series(const Source& s, const SeriesKey& key, const std::string& label,
                        size_t group, std::vector<PlotSeries>& out) {
  PlotSeries line{PlotPanel::kCounters, label, s.name, counter_style(s, group), {}};
  PlotSeries max{PlotPanel::kCounters,
                 label + " (max over ranks)",
                 s.name,
                 fmt::format("points pt 8 ps 1.2 lc rgb '{}'", kPalette[group % 8]),
                 {}};
  bool ranks_differ = false;
  bool any = false;
  for (const auto& p : *s.points) {
    const CounterAt c = counter_at(p, key);
    line.points.emplace_back(c.global_step, c.min);
    any = any || c.min.has_value();
    if (c.min != c.max) {
      ranks_differ = true;
      max.points.emplace_back(c.global_step, c.max);
    }
  }
  if (any) out.push_back(std::move(line));
  if (ranks_differ) out.push_back(std::move(max));
}

// Open squares where a shard of the group was not updated by the step just taken, at its
// counter, in the group's colour.
void add_not_updated(const Source& s, const SeriesKey& key, const std::string& label, size_t group,
                     std::vector<PlotSeries>& out) {
  PlotSeries marks{PlotPanel::kCounters,
                   label + ": not updated by this step (step_used null)",
                   s.name,
                   fmt::format("points pt 4 ps 2.2 lw 2 lc rgb '{}'", kPalette[group % 8]),
                   {}};
  for (const auto& p : *s.points) {
    const CounterAt c = counter_at(p, key);
    if (c.not_updated && c.min) marks.points.emplace_back(c.global_step, c.min);
  }
  if (!marks.points.empty()) out.push_back(std::move(marks));
}

void add_counters(const std::vector<Source>& sources, const std::vector<SeriesKey>& keys,
                  std::vector<PlotSeries>& out) {
  // Pairs with the same counters everywhere share a line: groups in order of first pair.
  std::vector<std::pair<std::string, std::vector<SeriesKey>>> groups;
  for (const auto& key : keys) {
    const std::string sig = signature(sources, key);
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == sig; });
    if (it == groups.end()) it = groups.insert(groups.end(), {sig, {}});
    it->second.push_back(key);
  }
  for (const auto& s : sources) {
    for (size_t g = 0; g < groups.size(); ++g)
      add_counter_series(s, groups[g].second.front(), group_label(groups[g].second), g, out);
  }
  for (const auto& s : sources) {
    for (size_t g = 0; g < groups.size(); ++g)
      add_not_updated(s, groups[g].second.front(), group_label(groups[g].second), g, out);
  }
}

// ---------------------------------------------------------------------------------------------
// Divergence

constexpr const char* kStateKinds[] = {"master", "exp_avg", "exp_avg_sq"};

struct Shard {
  int64_t start = 0;
  int64_t end = 0;
  const json* hash = nullptr;
  const json* values = nullptr;  // null where the event carries no values
  // Where this part's floats start in `values`: a rank's parts of one param (a row-split TP
  // piece's rows) share one blob, in part order.
  int64_t offset = 0;
};

// Every shard of a point, per (kind, param), from every rank.
using Shards = std::map<std::pair<std::string, std::string>, std::vector<Shard>>;

Shards shards_of(const Point& p) {
  Shards out;
  for (const json* e : p.events) {
    const json* values = e->contains("values") ? &e->at("values") : nullptr;
    std::map<std::string, int64_t> offsets;  // param -> floats of its earlier parts
    for (const auto& part : e->at("parts")) {
      const std::string param = part.at("param").get<std::string>();
      const auto& range = part.at("range");
      int64_t& offset = offsets[param];
      for (const char* kind : kStateKinds) {
        Shard s{range.at(0).get<int64_t>(), range.at(1).get<int64_t>(),
                &e->at("hashes").at(kind).at(param), nullptr, offset};
        if (values != nullptr) s.values = &values->at(kind).at(param);
        out[{kind, param}].push_back(s);
      }
      offset += range.at(1).get<int64_t>() - range.at(0).get<int64_t>();
    }
  }
  return out;
}

bool has_values(const Point& p) {
  return std::all_of(p.events.begin(), p.events.end(),
                     [](const json* e) { return e->contains("values"); });
}

// A param's elements from its shards, and which of them a shard holds. A null moment (not
// created yet) is zeros.
struct Whole {
  std::vector<float> values;
  std::vector<bool> held;
};

Whole whole(const std::vector<Shard>& shards, int64_t numel, const std::string& where) {
  Whole out{std::vector<float>(static_cast<size_t>(numel), 0.0F),
            std::vector<bool>(static_cast<size_t>(numel), false)};
  for (const auto& s : shards) {
    if (s.start < 0 || s.end < s.start || s.end > numel)
      throw std::invalid_argument(where + ": a shard range is out of order");
    std::vector<float> v(static_cast<size_t>(s.end - s.start), 0.0F);
    if (!s.values->is_null()) {
      auto decoded = floats_of_base64(s.values->get<std::string>());
      if (!decoded || decoded->size() < static_cast<size_t>(s.offset) + v.size())
        throw std::invalid_argument(where + ": values are not base64 of the shard's floats");
      std::copy_n(decoded->begin() + s.offset, v.size(), v.begin());
    }
    for (size_t i = 0; i < v.size(); ++i) {
      out.values[static_cast<size_t>(s.start) + i] = v[i];
      out.held[static_cast<size_t>(s.start) + i] = true;
    }
  }
  return out;
}

int64_t numel_of(const std::vector<Shard>& a, const std::vector<Shard>& b) {
  int64_t n = 0;
  for (const auto* side : {&a, &b})
    for (const auto& s : *side) n = std::max(n, s.end);
  return n;
}

// How a point differs from the uninterrupted run's point: a size (from values) or only whether
// (from hashes, or a difference that is not a finite number).
struct Difference {
  std::optional<double> max_abs;  // from values: the largest finite |a - b|
  bool differs = false;           // from hashes; or some |a - b| is not finite
  bool from_values = false;
};

Difference value_difference(const Point& a, const Point& b) {
  Difference d{0.0, false, true};
  const Shards sa = shards_of(a);
  const Shards sb = shards_of(b);
  for (const auto& [key, shards] : sa) {
    auto it = sb.find(key);
    if (it == sb.end()) continue;
    const int64_t n = numel_of(shards, it->second);
    const Whole wa = whole(shards, n, a.run);
    const Whole wb = whole(it->second, n, b.run);
    for (size_t i = 0; i < wa.values.size(); ++i) {
      if (!wa.held[i] || !wb.held[i]) continue;
      const double diff = std::fabs(static_cast<double>(wa.values[i]) - wb.values[i]);
      if (std::isfinite(diff)) {
        d.max_abs = std::max(*d.max_abs, diff);
      } else if (!(std::isnan(wa.values[i]) && std::isnan(wb.values[i]))) {
        d.differs = true;  // NaN against a number, or inf against anything else
      }
    }
  }
  return d;
}

// A shard's hash; a moment that does not exist yet is the hash of zeros.
std::string hash_or_zeros(const Shard& s) {
  if (!s.hash->is_null()) return s.hash->get<std::string>();
  return hash_f32(std::vector<float>(static_cast<size_t>(s.end - s.start), 0.0F));
}

// Equal or not, from every hash both points hold: shards of the same (param, range), and the
// whole model params.
Difference hash_difference(const Point& a, const Point& b) {
  std::map<std::tuple<std::string, std::string, int64_t, int64_t>, std::string> hashes;
  for (const json* e : a.events) {
    for (const auto& [param, h] : e->at("hashes").at("model_param").items())
      hashes[{"model_param", param, 0, 0}] = h.get<std::string>();
  }
  for (const auto& [key, shards] : shards_of(a)) {
    for (const auto& s : shards) hashes[{key.first, key.second, s.start, s.end}] = hash_or_zeros(s);
  }
  Difference d;
  auto compare = [&](const std::tuple<std::string, std::string, int64_t, int64_t>& k,
                     const std::string& h) {
    auto it = hashes.find(k);
    if (it != hashes.end() && it->second != h) d.differs = true;
  };
  for (const json* e : b.events) {
    for (const auto& [param, h] : e->at("hashes").at("model_param").items())
      compare({"model_param", param, 0, 0}, h.get<std::string>());
  }
  for (const auto& [key, shards] : shards_of(b)) {
    for (const auto& s : shards) compare({key.first, key.second, s.start, s.end}, hash_or_zeros(s));
  }
  return d;
}

Difference difference(const Point& a, const Point& b) {
  return has_values(a) && has_values(b) ? value_difference(a, b) : hash_difference(a, b);
}

// The uninterrupted run's state at a global step: its last point there (init at 0, then after
// each step).
const Point* reference_at(const std::vector<Point>& reference, int64_t global_step) {
  const Point* found = nullptr;
  for (const auto& p : reference) {
    if (p.global_step == global_step) found = &p;
  }
  return found;
}

// The same point of the same run on the other side: same run, event and global step.
const Point* same_point(const std::vector<Point>& points, const Point& p, size_t ordinal) {
  size_t seen = 0;
  for (const auto& q : points) {
    if (q.run != p.run || q.at != p.at || q.global_step != p.global_step) continue;
    if (seen++ == ordinal) return &q;
  }
  return nullptr;
}

struct Comparison {
  std::string source;
  std::string against;  // "uninterrupted", "the model's uninterrupted run"
  const char* colour;
  int point_type;
};

// One comparison's two series: the size of the difference (left axis) where values tell it,
// and equal/differs (right axis) where only hashes do or a difference is not finite.
void add_comparison(const Comparison& c, const std::vector<std::pair<int64_t, Difference>>& diffs,
                    std::vector<PlotSeries>& out) {
  PlotSeries size{PlotPanel::kDivergence,
                  "max |diff| vs " + c.against + " (master, exp_avg, exp_avg_sq)",
                  c.source,
                  fmt::format("linespoints lw 2 pt {} ps 1 lc rgb '{}'", c.point_type, c.colour),
                  {}};
  PlotSeries flag{PlotPanel::kDivergenceFlag,
                  "vs " + c.against + " (hashes, no values: 0 equal, 1 differs)",
                  c.source,
                  fmt::format("points pt {} ps 2 lw 2 lc rgb '{}'", c.point_type, c.colour),
                  {}};
  bool any_hash = false;
  for (const auto& [step, d] : diffs) {
    any_hash = any_hash || !d.from_values;
    size.points.emplace_back(step, d.from_values ? d.max_abs : std::nullopt);
    if (!d.from_values || d.differs) flag.points.emplace_back(step, d.differs ? 1.0 : 0.0);
  }
  if (!any_hash) flag.label = "vs " + c.against + " (1: a difference that is not finite)";
  if (std::any_of(size.points.begin(), size.points.end(), [](auto& p) { return p.second; }))
    out.push_back(std::move(size));
  if (!flag.points.empty()) out.push_back(std::move(flag));
}

std::vector<std::pair<int64_t, Difference>> against_reference(const SourceRuns& runs) {
  std::vector<std::pair<int64_t, Difference>> out;
  for (const auto& p : runs.phases) {
    const Point* ref = reference_at(runs.reference, p.global_step);
    if (ref != nullptr) out.emplace_back(p.global_step, difference(p, *ref));
  }
  return out;
}

std::vector<std::pair<int64_t, Difference>> reference_against_reference(const SourceRuns& real,
                                                                        const SourceRuns& model) {
  std::vector<std::pair<int64_t, Difference>> out;
  std::map<std::pair<std::string, int64_t>, size_t> ordinal;
  for (const auto& p : real.reference) {
    const Point* m = same_point(model.reference, p, ordinal[{p.at, p.global_step}]++);
    if (m != nullptr) out.emplace_back(p.global_step, difference(p, *m));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Title, notes, resumes

// Printable ASCII only, no backquote (gnuplot would run it), at most `max` characters.
std::string clean(const std::string& s, size_t max = 170) {
  std::string out;
  for (char c : s) {
    if (out.size() == max) {
      out.replace(out.size() - 3, 3, "...");
      break;
    }
    out.push_back(c >= 0x20 && c < 0x7f && c != '`' ? c : (c == '\n' ? ' ' : '?'));
  }
  return out;
}

// The global step each run starts at, as the plan lays them out: the reference at 0, each
// phase after the steps of the phases before it. (Not the trace's `start_step`: the model
// writes the step it resumed at, 0 where the load failed.)
std::map<std::string, int64_t> planned_starts(const json& trace) {
  std::map<std::string, int64_t> out{{"reference", 0}};
  int64_t done = 0;
  for (const auto& run : trace.at("runs")) {
    if (run.at("id") == "reference") continue;
    out[run.at("id").get<std::string>()] = done;
    done += run.value("steps", int64_t{0});
  }
  return out;
}

// Each run's first primary error: "model phase1 load (step 5): ValueError at dict_utils.py
// merge()"; a load or init error at the step the run starts at.
void add_error_notes(const std::string& source, const json& trace, std::vector<std::string>& out) {
  const auto starts = planned_starts(trace);
  for (const auto& run : trace.at("runs")) {
    const std::string id = run.at("id").get<std::string>();
    for (const auto& e : run.at("events")) {
      if (e.at("at") != "error" || e.value("secondary", false)) continue;
      const std::string stage = e.at("stage").get<std::string>();
      const std::string site = e.value("site", "");
      const int64_t step =
          stage == "load" || stage == "init" ? starts.at(id) : e.at("global_step").get<int64_t>();
      out.push_back(clean(fmt::format("{} {} {} (step {}): {}{}", source, id, stage, step,
                                      e.at("py_type").get<std::string>(),
                                      site.empty() ? "" : " at " + site)));
      break;
    }
  }
}

void add_resumes(const json& trace, PlotSpec& spec) {
  const auto starts = planned_starts(trace);
  for (const auto& run : trace.at("runs")) {
    const std::string id = run.at("id").get<std::string>();
    const int64_t start = starts.at(id);
    spec.steps_max = std::max(spec.steps_max, start + run.value("steps", int64_t{0}));
    if (id == "reference" || !run.value("load", false)) continue;
    spec.resumes.push_back(
        {start, clean(fmt::format("{}: dp {}, {}{}", id, run.at("dp").get<int64_t>(),
                                  run.at("revision").get<std::string>(),
                                  run.at("status") == "skipped" ? " (not run)" : ""),
                      60)});
  }
}

Status check_trace(const json& t, const std::string& name) {
  if (!t.is_object() || t.value("format", "") != "ckptsim-trace")
    return Status::invalid_input(name + ": field 'format': not \"ckptsim-trace\"");
  if (!t.contains("runs") || !t.at("runs").is_array())
    return Status::invalid_input(name + ": field 'runs': missing or not a list");
  return Status::ok();
}

PlotSpec build(const PlotInputs& in, const SourceRuns& model, const SourceRuns* real) {
  PlotSpec spec;
  spec.title = clean(in.model->at("scenario").get<std::string>() +
                     ": Adam step counters and divergence from the uninterrupted run");
  std::vector<Source> sources = {
      {"model", &model.phases, "linespoints lw 3 dt 1 pt 7 ps 0.8"},
      {"uninterrupted", &model.reference, "linespoints lw 2 dt 2 pt 9 ps 1"}};
  std::vector<SeriesKey> keys;
  collect_keys(*in.model, keys);
  if (real != nullptr) {
    sources.push_back({"real", &real->phases, "linespoints lw 1 dt 1 pt 6 ps 1.6"});
    sources.push_back(
        {"real uninterrupted", &real->reference, "linespoints lw 1 dt 3 pt 2 ps 1.4"});
    collect_keys(*in.real, keys);
  }
  add_counters(sources, keys, spec.series);
  add_comparison({"model", "uninterrupted", "#000000", 7}, against_reference(model), spec.series);
  if (real != nullptr) {
    add_comparison({"real", "real uninterrupted", "#d62728", 6}, against_reference(*real),
                   spec.series);
    add_comparison({"real uninterrupted", "the model's uninterrupted run", "#1f77b4", 2},
                   reference_against_reference(*real, model), spec.series);
  }
  add_error_notes("model", *in.model, spec.notes);
  if (real != nullptr) add_error_notes("real", *in.real, spec.notes);
  for (const auto& n : in.notes) spec.notes.push_back(clean(n));
  constexpr size_t kNotesMax = 6;  // the lines under the title push the top panel down
  if (spec.notes.size() > kNotesMax) {
    const size_t more = spec.notes.size() - (kNotesMax - 1);
    spec.notes.resize(kNotesMax - 1);
    spec.notes.push_back(
        fmt::format("(+{} more lines: errors of other runs, see the report)", more));
  }
  add_resumes(*in.model, spec);
  for (const auto& s : spec.series)
    for (const auto& [step, v] : s.points) spec.steps_max = std::max(spec.steps_max, step);
  return spec;
}

// ---------------------------------------------------------------------------------------------
// The script

const char* panel_name(PlotPanel p) {
  switch (p) {
    case PlotPanel::kCounters:
      return "counters";
    case PlotPanel::kDivergence:
      return "divergence";
    case PlotPanel::kDivergenceFlag:
      return "divergence-flag";
  }
  return "?";
}

// A gnuplot double-quoted string (labels are clean(): printable ASCII without backquotes).
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

std::string value_text(PlotPanel panel, double v) {
  return panel == PlotPanel::kDivergence ? fmt::format("{:.9g}", v) : number(v);
}

// The largest value the series of a panel reach (0 when none).
double panel_max(const PlotSpec& spec, PlotPanel panel) {
  double m = 0;
  for (const auto& s : spec.series) {
    if (s.panel != panel) continue;
    for (const auto& [step, v] : s.points)
      if (v) m = std::max(m, *v);
  }
  return m;
}

bool has_panel(const PlotSpec& spec, PlotPanel panel) {
  return std::any_of(spec.series.begin(), spec.series.end(),
                     [&](const PlotSeries& s) { return s.panel == panel; });
}

// Screen geometry (fractions of the canvas): the plots on the left, the keys on the right.
constexpr double kLeft = 0.07;
constexpr double kRight = 0.56;
constexpr double kKeyX = 0.62;
constexpr double kTopPanelBottom = 0.47;
constexpr double kBottomPanelTop = 0.40;
constexpr double kBottomPanelBottom = 0.07;

std::string header_lines(const PlotSpec& spec) {
  std::string out = fmt::format(
      "set multiplot\n"
      "set label 1 {} at screen 0.5,0.975 center font ',13'\n",
      quoted(spec.title));
  for (size_t i = 0; i < spec.notes.size(); ++i) {
    out += fmt::format("set label {} {} at screen {},{:.3f} left\n", i + 2, quoted(spec.notes[i]),
                       kLeft, 0.945 - 0.024 * static_cast<double>(i));
  }
  constexpr const char* kFooter[] = {
      "Counters: each part's step (what its next update advances from) at",
      "init or after_load, after each step and at save; min over ranks.",
      "A resume is a vertical jump at its global step.",
      "Divergence: from values, max |diff| over master params and moments;",
      "from hashes (no values) only equal (0) or differs (1), right axis."};
  for (size_t i = 0; i < std::size(kFooter); ++i) {
    out += fmt::format("set label {} {} at screen {},{:.3f} left font ',9' tc rgb '#404040'\n",
                       i + 90, quoted(kFooter[i]), kKeyX, 0.130 - 0.022 * static_cast<double>(i));
  }
  return out;
}

std::string x_axis(const PlotSpec& spec) {
  std::string out = fmt::format("set xrange [-0.25:{}.25]\n", spec.steps_max);
  out += spec.steps_max <= 30 ? "set xtics 1\n" : "set xtics autofreq\n";
  for (size_t i = 0; i < spec.resumes.size(); ++i) {
    out += fmt::format(
        "set arrow {} from first {}, graph 0 to first {}, graph 1 nohead dt 3 lw 1.5 "
        "lc rgb '#808080'\n",
        i + 1, spec.resumes[i].global_step, spec.resumes[i].global_step);
  }
  return out;
}

std::string key_at(const PlotSpec& spec, double top, bool counters) {
  size_t entries = 0;
  for (const auto& s : spec.series)
    entries += (s.panel == PlotPanel::kCounters) == counters ? 1 : 0;
  return fmt::format("set key at screen {},{} left top Left reverse samplen 4 font ',{}'\n", kKeyX,
                     top, entries > 14 ? 8 : 9);
}

// The plot command of one panel: every series of it, by index.
std::string plot_command(const PlotSpec& spec, std::initializer_list<PlotPanel> panels) {
  std::string out;
  for (size_t i = 0; i < spec.series.size(); ++i) {
    const PlotSeries& s = spec.series[i];
    if (std::find(panels.begin(), panels.end(), s.panel) == panels.end()) continue;
    out += fmt::format(
        "{}data index {} using 1:2{} with {} title {}", out.empty() ? "plot " : ", \\\n     ", i,
        s.panel == PlotPanel::kDivergenceFlag ? " axes x1y2" : "", s.style, quoted(s.title()));
  }
  return (out.empty() ? "plot NaN notitle" : out) + "\n";
}

std::string counter_panel(const PlotSpec& spec, double top) {
  std::string out = fmt::format(
      "set lmargin at screen {}\nset rmargin at screen {}\nset tmargin at screen {:.3f}\n"
      "set bmargin at screen {}\n",
      kLeft, kRight, top, kTopPanelBottom);
  out += x_axis(spec);
  for (size_t i = 0; i < spec.resumes.size(); ++i) {
    // Phases that resume at the same step: their labels one under the other.
    const auto same = std::count_if(spec.resumes.begin(), spec.resumes.begin() + i, [&](auto& r) {
      return r.global_step == spec.resumes[i].global_step;
    });
    out += fmt::format(
        "set label {} {} at first {}, graph {:.2f} left offset character 0.5,0 font ',9' "
        "tc rgb '#606060'\n",
        i + 10, quoted(spec.resumes[i].label), spec.resumes[i].global_step,
        0.97 - 0.05 * static_cast<double>(same));
  }
  const double ymax = panel_max(spec, PlotPanel::kCounters);
  out += fmt::format("set yrange [-0.5:{}]\nset ylabel 'Adam step counter'\nset grid\n",
                     number(std::ceil(ymax * 1.15) + 1));
  if (!has_panel(spec, PlotPanel::kCounters))
    out += "set label 9 'no step counter in any trace' at graph 0.5,0.5 center\n";
  out += key_at(spec, top, true);
  return out + plot_command(spec, {PlotPanel::kCounters});
}

std::string divergence_panel(const PlotSpec& spec) {
  std::string out = fmt::format(
      "unset label\nset tmargin at screen {}\nset bmargin at screen {}\n"
      "set xlabel 'global step'\n",
      kBottomPanelTop, kBottomPanelBottom);
  const double ymax = panel_max(spec, PlotPanel::kDivergence);
  out += fmt::format("set yrange [0:{}]\nset ylabel 'largest |diff| from the uninterrupted run'\n",
                     ymax > 0 ? fmt::format("{:.3g}", ymax * 1.15) : "1");
  out += "set format y '%.2g'\n";
  if (has_panel(spec, PlotPanel::kDivergenceFlag)) {
    out += "set ytics nomirror\nset y2range [-0.25:1.25]\nset y2tics ('equal' 0, 'differs' 1)\n";
  }
  if (!has_panel(spec, PlotPanel::kDivergence) && !has_panel(spec, PlotPanel::kDivergenceFlag))
    out += "set label 9 'no state to compare' at graph 0.5,0.5 center\n";
  out += key_at(spec, kBottomPanelTop, false);
  return out + plot_command(spec, {PlotPanel::kDivergence, PlotPanel::kDivergenceFlag});
}

}  // namespace

Result<PlotSpec> plot_spec(const PlotInputs& in) {
  CKPTSIM_CHECK(in.model != nullptr, "plot_spec needs the model's trace");
  if (Status s = check_trace(*in.model, "the model's trace"); !s.is_ok()) return s;
  const std::string real_name = in.real_name.empty() ? "the real trace" : in.real_name;
  if (in.real != nullptr) {
    if (Status s = check_trace(*in.real, real_name); !s.is_ok()) return s;
    if (in.real->value("scenario", "") != in.model->value("scenario", "")) {
      return Status::invalid_input(real_name + ": field 'scenario': a trace of '" +
                                   in.real->value("scenario", "") + "', not of '" +
                                   in.model->value("scenario", "") + "'");
    }
  }
  try {
    const SourceRuns model = source_runs(*in.model);
    if (in.real == nullptr) return build(in, model, nullptr);
    const SourceRuns real = source_runs(*in.real);
    return build(in, model, &real);
  } catch (const std::exception& e) {  // json's type and key errors, a bad shard
    return Status::invalid_input((in.real != nullptr ? real_name + " or the model's trace"
                                                     : std::string("the model's trace")) +
                                 ": not a trace of the format: " + e.what());
  }
}

}  // namespace ckptsim::report

namespace ckptsim::report {

std::string plot_data(const PlotSpec& spec) {
  std::string out = "# ckptsim plot data: " + spec.title + "\n";
  out += "# one block per series (gnuplot `index N`); columns: global step, value; a blank line\n";
  out += "# breaks a line\n";
  for (size_t i = 0; i < spec.series.size(); ++i) {
    const PlotSeries& s = spec.series[i];
    if (i > 0) out += "\n\n";
    out += fmt::format("# [{}] {} | {} | {}\n", i, panel_name(s.panel), s.label, s.source);
    bool last_was_data = false;
    for (const auto& [step, v] : s.points) {
      if (!v) {
        if (last_was_data) out += "\n";
        last_was_data = false;
        continue;
      }
      out += fmt::format("{} {}\n", step, value_text(s.panel, *v));
      last_was_data = true;
    }
  }
  return out;
}

std::string plot_script(const PlotSpec& spec) {
  const double top = 0.93 - 0.024 * static_cast<double>(spec.notes.size());
  std::string out =
      "# ckptsim plot script (report/plot.h). Run: gnuplot -d -e \"data='x.dat'; out='x.png'\" "
      "x.gp\n"
      "if (!exists(\"data\")) data = 'plot.dat'\n"
      "if (!exists(\"out\")) out = 'plot.png'\n"
      "set terminal pngcairo size 1600,1000 font 'DejaVu Sans,10' noenhanced background "
      "'#ffffff'\n"
      "set output out\n";
  out += header_lines(spec);
  out += counter_panel(spec, top);
  out += divergence_panel(spec);
  return out + "unset multiplot\nset output\n";
}

}  // namespace ckptsim::report
