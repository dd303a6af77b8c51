// The torch_dist exporter against the real checkpoints of tests/fixtures/real-checkpoints: the
// model runs the very scenario that produced each real checkpoint (runs/), its own checkpoint
// of the same phase is exported, and both are read back with the torch_dist reader and compared
// structurally. Every expected value comes from the real fixture (its files), never from the
// writer; the one list written by hand, kModelParamGroupGaps, names the param-group keys the
// model does not model. Each comparison has a canary: a deliberately broken export it must
// catch.
#include "model/megatron/torch_dist_writer.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <charconv>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/megatron/mapping.h"
#include "model/megatron/serialization.h"
#include "model/megatron/torch_dist_checkpoint.h"
#include "model/py/pickle_codec.h"
#include "model/py/pickle_tree.h"
#include "model/py/pickle_writer.h"
#include "model/storage.h"
#include "model/torch/distributed_checkpoint.h"
#include "model/torch/torch_save_format.h"
#include "tests/testing.h"

namespace ckptsim::model {
namespace {

const std::string kFixtures = std::string(CKPTSIM_SOURCE_DIR) + "/tests/fixtures/real-checkpoints";
const char* kTeFusedAdam = "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam";
const char* kStandin = "replay.emulation.StandinFusedAdam";

struct Fixture {
  std::string dir;
  std::string scenario;
  int phase;
  bool torch_adamw;  // the param groups of torch AdamW (decoupled_weight_decay)
};

void PrintTo(const Fixture& f, std::ostream* os) { *os << f.dir; }

const std::vector<Fixture>& fixtures() {
  static const std::vector<Fixture> all = {
      {"nv-f4502eb1c9__hybrid-offload1-dp2-resumed-steps-reset",
       "fx-upstream-2874-hybrid-resumed-dp2", 1, false},
      {"nv-f4502eb1c9__hybrid-offload1-dp2-before-resume", "fx-upstream-2874-hybrid-resumed-dp2", 0,
       false},
      {"rx-2e64d788b6__hybrid-offload1-dp1-raw-step-in-common", "fx-miles-main-hybrid-raw-step-dp1",
       0, false},
      {"nv-f4502eb1c9__fused-adam-dp1-bf16-and-fp32-buffers", "fx-upstream-2874-fused-adam-dp1", 0,
       false},
      {"nv-f4502eb1c9__torch-adamw-dp1", "fx-upstream-2874-torch-adamw-dp1", 0, true},
      {"nv-f4502eb1c9__torch-adamw-dp2", "fx-upstream-2874-torch-adamw-dp2", 0, true},
      {"nv-f4502eb1c9__hybrid-offload-half-dp2", "fx-upstream-2874-hybrid-half-dp2", 0, false},
      {"nv-d98e8a64dd__fused-adam-dp2-common-state-object", "fx-upstream-head-fused-adam-dp2", 0,
       false},
      {"nv-d98e8a64dd__hybrid-offload1-dp1-common-state-object", "fx-upstream-head-hybrid-dp2", 1,
       false},
  };
  return all;
}

// The model's own checkpoints of a scenario, run once per test binary into a temp directory.
// The own format's checkpoint directory of the scenario's run, and each phase's iteration
// directory in it.
struct OwnCheckpoints {
  std::filesystem::path dir;
  std::vector<std::string> phases;  // sim::saved_directory of each phase
  std::filesystem::path phase(size_t p) const { return dir / phases.at(p); }
};

const OwnCheckpoints& own_checkpoints(const std::string& scenario) {
  static std::map<std::string, OwnCheckpoints> done;
  auto it = done.find(scenario);
  if (it != done.end()) return it->second;
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("ckptsim-torch-dist-writer-{}-{}", ::getpid(), scenario);
  std::filesystem::remove_all(dir);
  sim::RunOptions options;
  options.checkpoint_dir = dir.string();
  const auto run = test::run(
      test::scenario_file("tests/fixtures/real-checkpoints/runs/" + scenario + ".scenario.json"),
      options);
  OwnCheckpoints out{dir, {}};
  for (size_t p = 0; p < run.phases.size(); ++p) out.phases.push_back(sim::saved_directory(run, p));
  return done.emplace(scenario, std::move(out)).first->second;
}

// The export, as the real runs had it: TE's FusedAdam class under the replay's stand-in.
TorchDistExportOptions as_the_real_runs() {
  TorchDistExportOptions o;
  o.class_renames[kTeFusedAdam] = kStandin;
  return o;
}

std::unique_ptr<MemoryStorage> export_phase(const Fixture& f) {
  DirectoryStorage own(own_checkpoints(f.scenario).phase(static_cast<size_t>(f.phase)));
  auto out = std::make_unique<MemoryStorage>();
  auto report = export_torch_dist_checkpoint(own, *out, "", as_the_real_runs());
  if (!report.is_ok()) throw std::runtime_error(report.status().to_string());
  return out;
}

// ---- structure of a torch_dist checkpoint, read with the reader ------------------------------

std::string shape_repr(const at::Tensor& t) {
  std::string out = "(";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + (t.dim() == 1 ? ",)" : ")");
}

// One line per node: "<path>: <type>", symbols and tensors with what identifies them.
void shape_lines(const Value& v, const std::string& path, std::set<std::string>& out) {
  switch (v.kind()) {
    case Value::Kind::kDict:
      out.insert(path + ": dict");
      for (const auto& [k, child] : *v.dict()) shape_lines(child, path + "/" + k.repr(), out);
      return;
    case Value::Kind::kList:
      out.insert(fmt::format("{}: list[{}]", path, v.list()->size()));
      for (size_t i = 0; i < v.list()->size(); ++i)
        shape_lines(v.list()->at(i), fmt::format("{}/{}", path, i), out);
      return;
    case Value::Kind::kTuple:
      out.insert(fmt::format("{}: tuple[{}]", path, v.as_tuple().size()));
      for (size_t i = 0; i < v.as_tuple().size(); ++i)
        shape_lines(v.as_tuple()[i], fmt::format("{}/{}", path, i), out);
      return;
    case Value::Kind::kSymbol:
      out.insert(path + ": symbol " + v.as_symbol().name);
      return;
    case Value::Kind::kTensor:
      out.insert(path + ": Tensor " + torch_dtype_name(v.tensor().scalar_type()) + " " +
                 shape_repr(v.tensor()));
      return;
    default:
      out.insert(path + ": " + v.type_name());
  }
}

std::optional<int64_t> file_rank(const std::string& file) {
  int64_t rank = -1;
  if (!file.starts_with("__")) return std::nullopt;
  const auto [end, ec] = std::from_chars(file.data() + 2, file.data() + file.size(), rank);
  if (ec != std::errc() || *end != '_') return std::nullopt;
  return rank;
}

struct Structure {
  int64_t iteration = -1;
  std::string metadata_json;
  bool common_pt = false;
  std::map<std::string, std::string> keys;  // fqn -> "bytes" | "tensor <dtype> <size>"
  // fqn -> (rank, offset, size) of every chunk
  std::map<std::string, std::set<std::tuple<int64_t, int64_t, int64_t>>> chunks;
  std::set<std::string> common;                          // shape lines
  std::map<std::string, std::set<std::string>> objects;  // ShardedObject key -> shape lines
  std::set<int64_t> ranks;                               // ranks that wrote a data file
  int64_t chunk_count = 0;
  std::string read_error;  // what the reader refused, if it did
};

Structure structure(const Storage& s) {
  Structure out;
  auto iteration = read_checkpoint_tracker(s, "");
  if (!iteration.is_ok()) throw std::runtime_error(iteration.status().to_string());
  out.iteration = iteration.value();
  const std::string dir = iteration_dir_name(out.iteration);
  auto mj = s.read_file(dir + "/metadata.json");
  if (mj.is_ok()) out.metadata_json = std::string(mj.value().begin(), mj.value().end());
  out.common_pt = s.exists(dir + "/common.pt");
  // Keys and chunks from `.metadata` alone, so that a layout the reader refuses still shows.
  DcpReader reader(s, dir);
  if (Status opened = reader.open(); !opened.is_ok()) {
    out.read_error = opened.to_string();
    return out;
  }
  const DcpMetadata& m = reader.metadata();
  for (const auto& [fqn, t] : m.tensors) {
    out.keys[fqn] = "tensor " + torch_dtype_name(t.dtype) + " " + fmt::format("{}", t.size[0]);
  }
  for (const std::string& fqn : m.bytes_items) out.keys[fqn] = "bytes";
  for (const StorageDataEntry& e : m.storage_data) {
    const int64_t rank = file_rank(e.info.relative_path).value_or(-1);
    out.ranks.insert(rank);
    if (!e.index.offset) continue;
    for (const ChunkStorageMetadata& c : m.tensors.at(e.index.fqn).chunks) {
      if (c.offsets != *e.index.offset) continue;
      out.chunks[e.index.fqn].emplace(rank, c.offsets[0], c.sizes[0]);
      ++out.chunk_count;
    }
  }
  // The common state and the objects through the reader.
  auto ckpt = read_torch_dist_checkpoint(s, "");
  if (!ckpt.is_ok()) {
    out.read_error = ckpt.status().to_string();
    return out;
  }
  shape_lines(ckpt.value().common, "common", out.common);
  for (const auto& [key, value] : *ckpt.value().sharded.dict()) {
    if (value.is_tensor()) continue;
    shape_lines(value, "object", out.objects[key.str()]);
  }
  return out;
}

Structure real_structure(const Fixture& f) {
  DirectoryStorage real(kFixtures + "/" + f.dir);
  return structure(real);
}

// The param-group keys the real groups have and the model's do not: torch 2.11 AdamW's
// decoupled_weight_decay (the model does not model it: a gap of the model, not of the export);
// every other line must agree.
std::set<std::string> model_param_group_gaps(const Fixture& f, const Structure& real) {
  std::set<std::string> gaps;
  const std::string key = "optimizer.distributed.dp_group_idx_0.optimizer";
  for (const std::string& line : real.objects.at(key)) {
    // torch >= 2.x AdamW's own group default (the model's torch AdamW is 1.13's).
    for (const char* gap : {"'decoupled_weight_decay': bool"}) {
      if (!f.torch_adamw) continue;
      if (line.starts_with("object/'param_groups'/") && line.ends_with(gap)) {
        gaps.insert(key + " " + line);
      }
    }
  }
  return gaps;
}

// Every difference, one line each ("<what>: real ... exported ..."); object lines only on one
// side are "<object key> <line>" in real_only_objects (the caller expects the gaps there).
struct Differences {
  std::vector<std::string> lines;
  std::set<std::string> real_only_objects;
};

// The fixtures were saved by the replay runner before it saved the scheduler's state (Megatron's
// training loop always does, as 'opt_param_scheduler' in the common state): where a fixture has
// none, the exported scheduler state is not a difference.
bool holds_scheduler(const Structure& s) {
  auto in = [](const auto& lines) {
    return std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
      return l.find("'opt_param_scheduler'") != std::string::npos;
    });
  };
  return in(s.common) || std::any_of(s.objects.begin(), s.objects.end(),
                                     [&](const auto& o) { return in(o.second); });
}

Differences compare(const Structure& real, const Structure& out) {
  Differences d;
  const bool real_scheduler = holds_scheduler(real);
  auto line = [&](const std::string& s) {
    if (!real_scheduler && s.find("'opt_param_scheduler'") != std::string::npos) return;
    d.lines.push_back(s);
  };
  if (real.iteration != out.iteration)
    line(fmt::format("iteration: real {} exported {}", real.iteration, out.iteration));
  if (real.metadata_json != out.metadata_json)
    line("metadata.json: real " + real.metadata_json + " exported " + out.metadata_json);
  if (real.common_pt != out.common_pt) line("common.pt present differs");
  if (real.read_error != out.read_error)
    line("read: real '" + real.read_error + "' exported '" + out.read_error + "'");
  for (const auto& [k, v] : real.keys) {
    const auto it = out.keys.find(k);
    if (it == out.keys.end()) {
      line("key only real: " + k);
    } else if (it->second != v) {
      line("key " + k + ": real " + v + " exported " + it->second);
    }
  }
  for (const auto& [k, v] : out.keys) {
    if (!real.keys.contains(k)) line("key only exported: " + k);
  }
  for (const auto& [k, chunks] : real.chunks) {
    const auto it = out.chunks.find(k);
    if (it == out.chunks.end() || it->second != chunks) line("chunk layout of " + k);
  }
  for (const auto& s : real.common)
    if (!out.common.contains(s)) line("common only real: " + s);
  for (const auto& s : out.common)
    if (!real.common.contains(s)) line("common only exported: " + s);
  for (const auto& [k, lines] : real.objects) {
    const auto it = out.objects.find(k);
    for (const auto& s : lines) {
      if (it == out.objects.end() || !it->second.contains(s))
        d.real_only_objects.insert(k + " " + s);
    }
  }
  for (const auto& [k, lines] : out.objects) {
    const auto it = real.objects.find(k);
    for (const auto& s : lines) {
      if (it == real.objects.end() || !it->second.contains(s))
        line("object only exported: " + k + " " + s);
    }
  }
  return d;
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += "\n  " + s;
  return out;
}

class ExportVsRealFixture : public ::testing::TestWithParam<Fixture> {};

// The exported checkpoint has the real one's structure: keys, dtypes, global sizes, every
// chunk at the same offset on the same rank, the same common-state tree (keys, types, dtype
// symbols, tensors' dtypes and shapes), the same ShardedObject trees but for the model's
// param-group gaps, the same metadata.json bytes and iteration.
TEST_P(ExportVsRealFixture, SameStructureAsTheRealCheckpoint) {
  const Fixture& f = GetParam();
  const Structure real = real_structure(f);
  const auto exported = export_phase(f);
  const Structure out = structure(*exported);
  const Differences d = compare(real, out);
  EXPECT_TRUE(d.lines.empty()) << f.dir << ":" << joined(d.lines);
  EXPECT_EQ(d.real_only_objects, model_param_group_gaps(f, real)) << f.dir;
  EXPECT_EQ(out.ranks, real.ranks) << f.dir;
  // The figures, for the record.
  RecordProperty("keys", static_cast<int>(real.keys.size()));
  RecordProperty("chunks", static_cast<int>(real.chunk_count));
  RecordProperty("model_gaps", static_cast<int>(d.real_only_objects.size()));
  std::cout << fmt::format(
                   "[figures] {}: iteration {}, {} keys ({} tensors), {} chunks on ranks {}, "
                   "{} common lines, {} object lines, equal but {} param-group keys the model "
                   "lacks",
                   f.dir, real.iteration, real.keys.size(), real.chunks.size(), real.chunk_count,
                   fmt::join(real.ranks, ","), real.common.size(),
                   [&] {
                     size_t n = 0;
                     for (const auto& [k, l] : real.objects) n += l.size();
                     return n;
                   }(),
                   d.real_only_objects.size())
            << std::endl;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ExportVsRealFixture, ::testing::ValuesIn(fixtures()),
                         [](const auto& info) {
                           std::string name = info.param.dir;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

// ---- canaries: broken exports the comparison must catch ---------------------------------------

std::string iter_dir_of(const Storage& s) {
  auto it = read_checkpoint_tracker(s, "");
  return iteration_dir_name(it.value());
}

// Rewrites the export's `.metadata` after `change`.
void rewrite_metadata(Storage& s, const std::function<void(DcpMetadata&)>& change) {
  const std::string dir = iter_dir_of(s);
  DcpReader reader(s, dir);
  ASSERT_TRUE(reader.open().is_ok());
  DcpMetadata m = reader.metadata();
  change(m);
  ASSERT_TRUE(
      s.write_file(dir + "/" + std::string(kDcpMetadataFile), serialize_dcp_metadata(m)).is_ok());
}

// A string_view, not a const std::string&: GCC 13's -Wdangling-reference takes a reference
// returned from a call with a temporary string argument for one into that temporary.
const Fixture& fixture_named(std::string_view dir) {
  for (const Fixture& f : fixtures())
    if (f.dir == dir) return f;
  throw std::runtime_error("no fixture " + std::string(dir));
}

bool has_line_starting(const std::vector<std::string>& lines, const std::string& prefix) {
  for (const auto& l : lines)
    if (l.starts_with(prefix)) return true;
  return false;
}

// A chunk moved to another offset of its tensor (rank 1's chunk of the param state starts one
// element later): the layout comparison fails.
TEST(ExportVsRealFixtureCanary, WrongChunkOffsetIsCaught) {
  const Fixture& f = fixture_named("nv-f4502eb1c9__torch-adamw-dp2");
  auto exported = export_phase(f);
  const std::string key =
      "optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.bfloat16, "
      "torch.float32).bucket_idx_0.param";
  rewrite_metadata(*exported, [&](DcpMetadata& m) {
    for (auto& c : m.tensors.at(key).chunks) {
      if (c.offsets[0] == 128) c.offsets[0] = 127, c.sizes[0] = 32;
    }
    for (auto& e : m.storage_data) {
      if (e.index.fqn == key && e.index.offset && (*e.index.offset)[0] == 128)
        (*e.index.offset)[0] = 127;
    }
  });
  const Differences d = compare(real_structure(f), structure(*exported));
  EXPECT_TRUE(has_line_starting(d.lines, "chunk layout of " + key)) << joined(d.lines);
}

// A chunk written by another rank (rank 1's file renamed into rank 0's name space): caught.
TEST(ExportVsRealFixtureCanary, ChunkOnAnotherRankIsCaught) {
  const Fixture& f = fixture_named("nv-f4502eb1c9__torch-adamw-dp2");
  auto exported = export_phase(f);
  const std::string dir = iter_dir_of(*exported);
  auto bytes = exported->read_file(dir + "/__1_0.distcp");
  ASSERT_TRUE(bytes.is_ok());
  ASSERT_TRUE(exported->write_file(dir + "/__2_0.distcp", bytes.value()).is_ok());
  rewrite_metadata(*exported, [&](DcpMetadata& m) {
    for (auto& e : m.storage_data)
      if (e.info.relative_path == "__1_0.distcp") e.info.relative_path = "__2_0.distcp";
  });
  const Differences d = compare(real_structure(f), structure(*exported));
  EXPECT_TRUE(has_line_starting(d.lines, "chunk layout of ")) << joined(d.lines);
}

// A common state without the training loop's content_metadata: caught.
TEST(ExportVsRealFixtureCanary, CommonStateWithoutContentMetadataIsCaught) {
  const Fixture& f = fixture_named("nv-f4502eb1c9__torch-adamw-dp1");
  auto exported = export_phase(f);
  const std::string file = iter_dir_of(*exported) + "/common.pt";
  auto common = load_torch_save(exported->read_file(file).value());
  ASSERT_TRUE(common.is_ok());
  common.value().dict()->erase("content_metadata");
  ASSERT_TRUE(exported->write_file(file, torch_save(common.value()).value()).is_ok());
  const Differences d = compare(real_structure(f), structure(*exported));
  EXPECT_TRUE(has_line_starting(d.lines, "common only real: common/'content_metadata'"))
      << joined(d.lines);
}

// A tuple dict key written as its repr string (what the own format's codec does): caught.
TEST(ExportVsRealFixtureCanary, TupleKeyAsStringIsCaught) {
  const Fixture& f = fixture_named("nv-f4502eb1c9__torch-adamw-dp1");
  auto exported = export_phase(f);
  const std::string fqn = "optimizer.distributed.dp_group_idx_0.per_bucket_numel/shard_0_1";
  rewrite_metadata(*exported, [&](DcpMetadata& m) {
    // Point the item at a pickle_codec blob of the same object, appended to rank 0's file.
    const std::string dir = iter_dir_of(*exported);
    auto data = exported->read_file(dir + "/__0_0.distcp").value();
    auto& entry = *std::find_if(m.storage_data.begin(), m.storage_data.end(),
                                [&](const StorageDataEntry& e) { return e.index.fqn == fqn; });
    auto obj =
        load_torch_save(std::span<const char>(data).subspan(entry.info.offset, entry.info.length));
    ASSERT_TRUE(obj.is_ok());
    const std::vector<char> lossy = pickle_value(obj.value());
    entry.info.offset = static_cast<int64_t>(data.size());
    entry.info.length = static_cast<int64_t>(lossy.size());
    data.insert(data.end(), lossy.begin(), lossy.end());
    ASSERT_TRUE(exported->write_file(dir + "/__0_0.distcp", data).is_ok());
  });
  const Differences d = compare(real_structure(f), structure(*exported));
  EXPECT_TRUE(has_line_starting(d.lines, "object only exported: " + fqn.substr(0, fqn.size() - 10)))
      << joined(d.lines);
}

// metadata.json of another revision (HEAD's, without the common backend): caught.
TEST(ExportVsRealFixtureCanary, MetadataJsonOfAnotherRevisionIsCaught) {
  const Fixture& f = fixture_named("nv-f4502eb1c9__torch-adamw-dp1");
  auto exported = export_phase(f);
  const std::string text = R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})";
  ASSERT_TRUE(exported
                  ->write_file(iter_dir_of(*exported) + "/metadata.json",
                               std::span<const char>(text.data(), text.size()))
                  .is_ok());
  const Differences d = compare(real_structure(f), structure(*exported));
  EXPECT_TRUE(has_line_starting(d.lines, "metadata.json: ")) << joined(d.lines);
}

// ---- round trip: export -> read_torch_dist_checkpoint -> the model's own checkpoint ---------

// Python == for what a checkpoint holds, with tensors compared by dtype, shape and bits, and a
// class symbol equal to the str the own format stores it as ("<class 'M.C'>", renamed as the
// export renames it).
bool same(const Value& own, const Value& out, std::string& why, const std::string& path) {
  if (own.is_str() && class_global(own.as_str())) {
    std::string want = own.as_str();
    if (want == std::string("<class '") + kTeFusedAdam + "'>")
      want = std::string("<class '") + kStandin + "'>";
    if (out.kind() == Value::Kind::kSymbol && want == out.as_symbol().name) return true;
    why = path + ": " + out.repr() + " where the class " + want + " belongs";
    return false;
  }
  if (own.kind() != out.kind()) {
    why = path + ": " + own.type_name() + " vs " + out.type_name();
    return false;
  }
  switch (own.kind()) {
    case Value::Kind::kTensor: {
      const at::Tensor& a = own.tensor();
      const at::Tensor& b = out.tensor();
      if (a.scalar_type() != b.scalar_type() || !a.sizes().equals(b.sizes()) || !a.equal(b)) {
        why = path + ": tensors differ";
        return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (own.dict()->size() != out.dict()->size()) {
        why = path + ": dict sizes differ";
        return false;
      }
      for (const auto& [k, v] : *own.dict()) {
        const Value* w = out.dict()->find(k);
        if (w == nullptr) {
          why = path + ": key " + k.repr() + " missing";
          return false;
        }
        if (!same(v, *w, why, path + "/" + k.repr())) return false;
      }
      return true;
    }
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const auto& a = own.is_list() ? std::vector<Value>(own.list()->begin(), own.list()->end())
                                    : own.as_tuple();
      const auto& b = out.is_list() ? std::vector<Value>(out.list()->begin(), out.list()->end())
                                    : out.as_tuple();
      if (a.size() != b.size()) {
        why = path + ": lengths differ";
        return false;
      }
      for (size_t i = 0; i < a.size(); ++i)
        if (!same(a[i], b[i], why, fmt::format("{}/{}", path, i))) return false;
      return true;
    }
    default:
      if (!py_equal(own, out)) {
        why = path + ": " + own.repr() + " vs " + out.repr();
        return false;
      }
      return true;
  }
}

// What the round trip found wrong, one line each (empty: the export gives back the source).
std::vector<std::string> round_trip_differences(const Storage& own, const Storage& exported) {
  std::vector<std::string> out;
  auto ckpt = read_torch_dist_checkpoint(exported, "");
  if (!ckpt.is_ok()) return {"unreadable: " + ckpt.status().to_string()};
  const Dict& sharded = *ckpt.value().sharded.dict();
  auto index = read_checkpoint_index(own);
  std::set<std::string> keys;
  for (const SavedPiece& p : index.value().pieces) keys.insert(p.key);
  for (const std::string& key : keys) {
    auto tensors = read_checkpoint_tensors(own, index.value().pieces, key);
    const std::vector<float>& want = tensors.value().at(key);
    const Value* got = sharded.find(key);
    if (got == nullptr || !got->is_tensor()) {
      out.push_back(key + ": not a tensor of the export");
      continue;
    }
    const at::Tensor f = got->tensor().to(at::kFloat).contiguous();
    if (f.numel() != static_cast<int64_t>(want.size()) ||
        std::memcmp(f.data_ptr<float>(), want.data(), want.size() * sizeof(float)) != 0) {
      out.push_back(key + ": values differ");
    }
  }
  for (const SavedObject& o : index.value().objects) {
    auto own_value = unpickle_value(own.read_file(o.file).value());
    const std::string key = o.unique_key.substr(0, o.unique_key.size() - 10);  // "/shard_0_1"
    const Value* got = sharded.find(key);
    std::string why;
    if (got == nullptr) {
      out.push_back(o.unique_key + ": missing");
      continue;
    }
    Value want = own_value.value();
    if (key == "common_state") {
      want = deepcopy(want);
      want.dict()->set("content_metadata", ckpt.value().common.dict()->at("content_metadata"));
    }
    if (!same(want, *got, why, o.unique_key)) out.push_back(why);
  }
  if (index.value().common_in_common_pt) {
    Value want = deepcopy(read_common_state(own).value());
    const Value* cm = ckpt.value().common.dict()->find("content_metadata");
    if (cm == nullptr) {
      out.push_back("common: no content_metadata");
    } else {
      want.dict()->set("content_metadata",
                       dict_value({{"distrib_optim_sharding_type", Value("dp_reshardable")},
                                   {"singleton_local_shards", Value(false)},
                                   {"chained_optim_avoid_prefix", Value(true)}}));
    }
    std::string why;
    if (!same(want, ckpt.value().common, why, "common")) out.push_back(why);
  }
  return out;
}

class ExportRoundTrip : public ::testing::TestWithParam<Fixture> {};

// Every phase the model saved in the fixture's scenario: the export reads back as the source.
TEST_P(ExportRoundTrip, ReadsBackAsTheModelsOwnCheckpoint) {
  const Fixture& f = GetParam();
  const auto& root = own_checkpoints(f.scenario);
  int phases = 0;
  for (size_t p = 0;
       p < root.phases.size() && std::filesystem::exists(root.phase(p) / "metadata.json"); ++p) {
    DirectoryStorage own(root.phase(p));
    MemoryStorage out;
    auto report = export_torch_dist_checkpoint(own, out, "ckpt", as_the_real_runs());
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    auto sub = subdir(out, "ckpt");
    EXPECT_EQ(round_trip_differences(own, *sub), std::vector<std::string>{})
        << f.scenario << " phase " << p;
    ++phases;
  }
  EXPECT_GT(phases, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ExportRoundTrip, ::testing::ValuesIn(fixtures()),
                         [](const auto& info) {
                           std::string name = info.param.dir;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

// Canary: a chunk's bytes pointing at another chunk of the same size (two storage items
// swapped in `.metadata`): the round trip sees other values.
TEST(ExportRoundTripCanary, SwappedChunkItemsAreCaught) {
  const Fixture& f = fixture_named("nv-f4502eb1c9__torch-adamw-dp2");
  DirectoryStorage own(own_checkpoints(f.scenario).phase(0));
  auto exported = export_phase(f);
  const std::string key =
      "optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.bfloat16, "
      "torch.float32).bucket_idx_0.exp_avg";
  rewrite_metadata(*exported, [&](DcpMetadata& m) {
    StorageInfo* a = nullptr;
    StorageInfo* b = nullptr;
    for (auto& e : m.storage_data) {
      if (e.index.fqn == key && (*e.index.offset)[0] == 0) a = &e.info;
      if (e.index.fqn == key + "_sq" && (*e.index.offset)[0] == 0) b = &e.info;
    }
    ASSERT_TRUE(a != nullptr && b != nullptr);
    std::swap(*a, *b);
  });
  const auto diffs = round_trip_differences(own, *exported);
  EXPECT_TRUE(has_line_starting(diffs, key + ": values differ")) << joined(diffs);
}

// Canary: a chunk offset shifted by one element leaves a gap and an overlap: unreadable.
TEST(ExportRoundTripCanary, ShiftedChunkOffsetIsCaught) {
  const Fixture& f = fixture_named("nv-f4502eb1c9__hybrid-offload-half-dp2");
  DirectoryStorage own(own_checkpoints(f.scenario).phase(0));
  auto exported = export_phase(f);
  rewrite_metadata(*exported, [&](DcpMetadata& m) {
    for (auto& [fqn, t] : m.tensors) {
      if (t.chunks.size() < 2) continue;
      const int64_t was = t.chunks.back().offsets[0];
      t.chunks.back().offsets[0] = was - 1;
      for (auto& e : m.storage_data)
        if (e.index.fqn == fqn && e.index.offset && (*e.index.offset)[0] == was)
          (*e.index.offset)[0] = was - 1;
      return;
    }
  });
  const auto diffs = round_trip_differences(own, *exported);
  EXPECT_TRUE(has_line_starting(diffs, "unreadable: ")) << joined(diffs);
}

// Canary: the param-group class left as the own format's str: the round trip sees a str where
// the class belongs.
TEST(ExportRoundTripCanary, ClassLeftAsStringIsCaught) {
  const Fixture& f = fixture_named("nv-f4502eb1c9__hybrid-offload-half-dp2");
  DirectoryStorage own(own_checkpoints(f.scenario).phase(0));
  MemoryStorage exported;
  ASSERT_TRUE(export_torch_dist_checkpoint(own, exported, "", as_the_real_runs()).is_ok());
  const std::string fqn = "optimizer.distributed.dp_group_idx_0.optimizer/shard_0_1";
  const std::string dir = iter_dir_of(exported);
  rewrite_metadata(exported, [&](DcpMetadata& m) {
    auto data = exported.read_file(dir + "/__0_0.distcp").value();
    auto& entry = *std::find_if(m.storage_data.begin(), m.storage_data.end(),
                                [&](const StorageDataEntry& e) { return e.index.fqn == fqn; });
    auto lossy = unpickle_value(own.read_file("objects/" + fqn + ".pt").value());
    const std::vector<char> blob =
        torch_save(list_value({lossy.value()}), {.weights_only = false}).value();
    entry.info.offset = static_cast<int64_t>(data.size());
    entry.info.length = static_cast<int64_t>(blob.size());
    data.insert(data.end(), blob.begin(), blob.end());
    ASSERT_TRUE(exported.write_file(dir + "/__0_0.distcp", data).is_ok());
  });
  const auto diffs = round_trip_differences(own, exported);
  EXPECT_FALSE(diffs.empty());
  EXPECT_TRUE(has_line_starting(diffs, fqn + "/'param_groups'/0/'cpu_optimizer_cls'"))
      << joined(diffs);
}

// ---- the bytes Python would write --------------------------------------------------------------

class SpanAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit SpanAdapter(std::span<const char> b) : b_(b) {}
  size_t size() const override { return b_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char*) const override {
    if (pos >= b_.size()) return 0;
    const size_t k = std::min<uint64_t>(n, b_.size() - pos);
    std::memcpy(buf, b_.data() + pos, k);
    return k;
  }

 private:
  std::span<const char> b_;
};

std::vector<char> data_pkl(std::span<const char> blob) {
  caffe2::serialize::PyTorchStreamReader r(std::make_shared<SpanAdapter>(blob));
  auto [data, size] = r.getRecord("data.pkl");
  const char* p = static_cast<const char*>(data.get());
  return std::vector<char>(p, p + size);
}

// torch_save of what the reader made of a real torch.save blob writes the very data.pkl that
// torch 2.11 wrote: every common.pt and every item (ShardedObjects and tensor chunks) of every
// fixture. Expected bytes: the fixture's.
TEST(TorchSave, WritesTheDataPklTorchWroteForEveryFixtureBlob) {
  int blobs = 0;
  for (const Fixture& f : fixtures()) {
    DirectoryStorage real(kFixtures + "/" + f.dir);
    const std::string dir = iteration_dir_name(read_checkpoint_tracker(real, "").value());
    std::vector<std::pair<std::string, std::vector<char>>> items;
    if (real.exists(dir + "/common.pt"))
      items.emplace_back("common.pt", real.read_file(dir + "/common.pt").value());
    DcpReader reader(real, dir);
    ASSERT_TRUE(reader.open().is_ok());
    for (const StorageDataEntry& e : reader.metadata().storage_data) {
      auto file = real.read_file(dir + "/" + e.info.relative_path).value();
      items.emplace_back(e.index.fqn,
                         std::vector<char>(file.begin() + e.info.offset,
                                           file.begin() + e.info.offset + e.info.length));
    }
    for (const auto& [what, blob] : items) {
      auto value = load_torch_save(blob);
      ASSERT_TRUE(value.is_ok()) << what;
      auto again = torch_save(value.value(), {.weights_only = false});
      ASSERT_TRUE(again.is_ok()) << what << ": " << again.status().to_string();
      EXPECT_EQ(data_pkl(again.value()), data_pkl(blob)) << f.dir << " " << what;
      ++blobs;
    }
  }
  EXPECT_GE(blobs, 9 * 4) << "every fixture has a common state and at least 3 objects";
  std::cout << "[figures] " << blobs << " real torch.save blobs re-written byte for byte"
            << std::endl;
}

// A blob torch_save writes reads back as what was written (tuple keys, dtype and class
// symbols, aliasing, views sharing a storage, 0-dim and bf16 tensors).
TEST(TorchSave, RoundTripKeepsWhatPythonPicklesKeep) {
  const at::Tensor base = at::arange(6, at::kFloat);
  const Value shared = dict_value({{"x", Value(1)}});
  Value v =
      dict_value({{Key::tuple({Key::symbol("torch.bfloat16"), Key::symbol("torch.float32")}),
                   list_value({Value(int64_t{256}), Value(int64_t{1} << 40), Value(int64_t{-5})})},
                  {"cls", Value::symbol("<class 'torch.optim.adamw.AdamW'>")},
                  {"dtype", Value::symbol("torch.bfloat16")},
                  {"a", shared},
                  {"b", shared},
                  {"view", Value(base.narrow(0, 2, 3))},
                  {"base", Value(base)},
                  {"step", Value(at::scalar_tensor(3.0, at::kFloat))},
                  {"bf16", Value(at::ones({2, 2}, at::kBFloat16))},
                  {"t", Value::tuple({Value(1.5), Value("s"), Value(), Value(true)})}});
  auto blob = torch_save(v, {.weights_only = false});
  ASSERT_TRUE(blob.is_ok()) << blob.status().to_string();
  auto back = load_torch_save(blob.value());
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  const Dict& d = *back.value().dict();
  EXPECT_EQ(d.keys().front().repr(), "(torch.bfloat16, torch.float32)");
  EXPECT_EQ(d.at(d.keys().front()).repr(), "[256, 1099511627776, -5]");
  EXPECT_EQ(d.at("cls").as_symbol().name, "<class 'torch.optim.adamw.AdamW'>");
  EXPECT_EQ(d.at("dtype").as_symbol().name, "torch.bfloat16");
  EXPECT_TRUE(d.at("a").is(d.at("b")));
  EXPECT_TRUE(d.at("view").tensor().equal(base.narrow(0, 2, 3)));
  EXPECT_EQ(d.at("view").tensor().storage().unsafeGetStorageImpl(),
            d.at("base").tensor().storage().unsafeGetStorageImpl());
  EXPECT_EQ(d.at("step").tensor().dim(), 0);
  EXPECT_EQ(d.at("bf16").tensor().scalar_type(), at::kBFloat16);
  EXPECT_EQ(d.at("t").repr(), "(1.5, 's', None, True)");
}

TEST(TorchSave, WeightsOnlyRefusesAClass) {
  const Value v = dict_value({{"cls", Value::symbol("<class 'torch.optim.adamw.AdamW'>")}});
  auto blob = torch_save(v);
  ASSERT_FALSE(blob.is_ok());
  EXPECT_NE(blob.status().message().find("weights_only"), std::string::npos);
  EXPECT_FALSE(
      torch_save(dict_value({{"x", Value::symbol("not a global")}}), {.weights_only = false})
          .is_ok());
}

// ---- `.metadata` -------------------------------------------------------------------------------

// serialize_dcp_metadata of a real `.metadata` parses back to the same metadata, and uses the
// opcodes pickle.dump used (protocol 4, framed, the same classes): the pickle-tree reader,
// which names every class, sees the same graph.
TEST(DcpMetadataWriter, RealMetadataSerializesToTheSameGraph) {
  for (const Fixture& f : fixtures()) {
    DirectoryStorage real(kFixtures + "/" + f.dir);
    const std::string dir = iteration_dir_name(read_checkpoint_tracker(real, "").value());
    const auto bytes = real.read_file(dir + "/.metadata").value();
    auto parsed = parse_dcp_metadata(bytes, f.dir);
    ASSERT_TRUE(parsed.is_ok());
    const std::vector<char> again = serialize_dcp_metadata(parsed.value());
    EXPECT_EQ(again[0], '\x80');
    EXPECT_EQ(again[1], '\x04');
    EXPECT_EQ(again[2], '\x95') << "a FRAME follows PROTO, as pickle.dump writes it";
    auto reparsed = parse_dcp_metadata(again, "again");
    ASSERT_TRUE(reparsed.is_ok()) << reparsed.status().to_string();
    const DcpMetadata& a = parsed.value();
    const DcpMetadata& b = reparsed.value();
    EXPECT_EQ(a.key_order, b.key_order);
    EXPECT_EQ(a.bytes_items, b.bytes_items);
    ASSERT_EQ(a.storage_data.size(), b.storage_data.size());
    for (size_t i = 0; i < a.storage_data.size(); ++i) {
      EXPECT_EQ(a.storage_data[i].index.fqn, b.storage_data[i].index.fqn);
      EXPECT_EQ(a.storage_data[i].index.offset, b.storage_data[i].index.offset);
      EXPECT_EQ(a.storage_data[i].index.index, b.storage_data[i].index.index);
      EXPECT_EQ(a.storage_data[i].info.relative_path, b.storage_data[i].info.relative_path);
      EXPECT_EQ(a.storage_data[i].info.offset, b.storage_data[i].info.offset);
      EXPECT_EQ(a.storage_data[i].info.length, b.storage_data[i].info.length);
    }
    for (const auto& [fqn, t] : a.tensors) {
      EXPECT_EQ(t.dtype, b.tensors.at(fqn).dtype);
      EXPECT_EQ(t.size, b.tensors.at(fqn).size);
      EXPECT_EQ(t.chunks, b.tensors.at(fqn).chunks);
    }
    EXPECT_EQ(a.storage_meta->checkpoint_id, b.storage_meta->checkpoint_id);
    EXPECT_EQ(a.storage_meta->save_id, b.storage_meta->save_id);
    EXPECT_EQ(a.version, b.version);
    // Same size within the strings Python writes twice (equal but distinct objects) and we
    // write once: never larger.
    EXPECT_LE(again.size(), bytes.size()) << f.dir;
  }
}

TEST(DcpMetadataWriter, RefusesInconsistentChunks) {
  MemoryStorage s;
  DcpRankToWrite r0{0, {}, {}};
  r0.chunks.push_back({"w", {8}, {0}, at::zeros({4}, at::kFloat)});
  r0.chunks.push_back({"w", {8}, {4}, at::zeros({4}, at::kBFloat16)});
  auto bad_dtype = write_dcp_checkpoint(s, "d", {r0}, {});
  EXPECT_FALSE(bad_dtype.is_ok());
  r0.chunks.back().data = at::zeros({5}, at::kFloat);
  auto outside = write_dcp_checkpoint(s, "d", {r0}, {});
  EXPECT_FALSE(outside.is_ok());
  r0.chunks.back() = {"w", {8}, {0}, at::zeros({4}, at::kFloat)};
  EXPECT_FALSE(write_dcp_checkpoint(s, "d", {r0}, {}).is_ok()) << "the same offset twice";
  r0.chunks.back() = {"w", {8}, {4}, at::zeros({4}, at::kFloat)};
  r0.bytes_items.push_back({"w", {'x'}});
  EXPECT_FALSE(write_dcp_checkpoint(s, "d", {r0}, {}).is_ok()) << "a key as bytes and tensor";
  r0.bytes_items.clear();
  auto ok = write_dcp_checkpoint(s, "d", {r0}, {});
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  DcpReader reader(s, "d");
  ASSERT_TRUE(reader.open().is_ok());
  EXPECT_TRUE(reader.read_tensor("w").value().equal(at::zeros({8}, at::kFloat)));
}

// Protocol 4 frames: a pickle over 64 KiB is cut into frames at opcode boundaries, and the
// reader reads it whole.
TEST(PickleWriter, LargePicklesAreFramedAndReadBack) {
  PickleWriter w(4);
  w.empty_list();
  const size_t n = 5000;
  for (size_t begin = 0; begin < n; begin += 1000) {
    w.mark();
    for (size_t i = begin; i < begin + 1000; ++i) w.str(fmt::format("item-{:08d}-padding", i));
    w.appends(1000);
  }
  const std::vector<char> bytes = w.finish();
  size_t frames = 0;
  // FRAME headers sit at the start and after each frame's declared length.
  size_t pos = 2;
  while (pos < bytes.size()) {
    ASSERT_EQ(bytes[pos], '\x95');
    uint64_t len = 0;
    std::memcpy(&len, bytes.data() + pos + 1, 8);
    pos += 9 + len;
    ++frames;
  }
  EXPECT_EQ(pos, bytes.size());
  EXPECT_GE(frames, 2u);
  auto tree = read_pickle_tree(bytes, {});
  ASSERT_TRUE(tree.is_ok()) << tree.status().to_string();
  EXPECT_EQ(tree.value().at(tree.value().root).items.size(), n);
}

TEST(PickleWriter, UnbalancedStackIsOurBug) {
  PickleWriter w(2);
  w.none();
  w.none();
  EXPECT_THROW(w.finish(), InvariantViolation);
  PickleWriter m(2);
  m.mark();
  m.none();
  EXPECT_THROW(m.tuple(4), InvariantViolation);
}

// ---- the simulator's torch_dist output ------------------------------------------------------

// `ckptsim run --checkpoint-format torch_dist`: the same trace as the own format, and each
// phase's directory holds the export of that phase (same bytes as exporting the own format's
// checkpoint, storage_meta.checkpoint_id apart, which names the directory).
TEST(SimulatorTorchDist, PhasesAreExportedAndTheTraceIsUnchanged) {
  const std::string scenario = "fx-upstream-head-fused-adam-dp2";
  const auto& own_root = own_checkpoints(scenario);
  const auto dir =
      std::filesystem::temp_directory_path() / fmt::format("ckptsim-torch-dist-sim-{}", ::getpid());
  std::filesystem::remove_all(dir);
  sim::RunOptions options;
  options.checkpoint_dir = dir.string();
  options.checkpoint_format = sim::CheckpointFormat::kTorchDist;
  const auto s =
      test::scenario_file("tests/fixtures/real-checkpoints/runs/" + scenario + ".scenario.json");
  const auto torch_dist = test::run(s, options);
  sim::RunOptions own_options;
  own_options.checkpoint_dir = (dir / "own").string();
  EXPECT_EQ(torch_dist.trace_hash, test::run(s, own_options).trace_hash);
  for (int p = 0; p < 2; ++p) {
    const std::string phase = fmt::format("phase_{}", p);
    ASSERT_TRUE(std::filesystem::exists(dir / phase / "latest_checkpointed_iteration.txt"));
    EXPECT_FALSE(std::filesystem::exists(dir / phase / "metadata.json"));
    DirectoryStorage own(own_root.phase(static_cast<size_t>(p)));
    MemoryStorage mine;
    TorchDistExportOptions o;
    o.checkpoint_root = (dir / phase).string();
    ASSERT_TRUE(export_torch_dist_checkpoint(own, mine, "", o).is_ok());
    DirectoryStorage written(dir / phase);
    const std::string it = iter_dir_of(written);
    for (const std::string f : {".metadata", "__0_0.distcp", "__1_0.distcp", "metadata.json"}) {
      auto a = written.read_file(it + "/" + f);
      auto b = mine.read_file(it + "/" + f);
      ASSERT_TRUE(a.is_ok() && b.is_ok()) << phase << " " << f;
      EXPECT_EQ(a.value(), b.value()) << phase << " " << f;
    }
  }
  std::filesystem::remove_all(dir);
}

// The export reads each piece as the load does: one whose metadata points at another piece's
// bytes (a directory overwritten in place by a save that died) is an error naming the file and
// the key, not a DCP checkpoint that passes those bytes off as its values (fidelity audit N5).
// Mutation caught: the header check left out of collect_chunks (the export succeeds).
TEST(ExportOfAnOverwrittenPiece, IsAnErrorNotAnExport) {
  const Fixture& f = fixture_named("nv-f4502eb1c9__torch-adamw-dp2");
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "ckptsim-export-overwritten-piece";
  std::filesystem::remove_all(dir);
  std::filesystem::copy(own_checkpoints(f.scenario).phase(0), dir,
                        std::filesystem::copy_options::recursive);
  DirectoryStorage own(dir);
  auto meta = own.read_file("metadata.json");
  ASSERT_TRUE(meta.is_ok());
  nlohmann::json j = nlohmann::json::parse(meta.value().begin(), meta.value().end());
  ASSERT_EQ(j["piece_header_bytes"], 16);
  auto& pieces = j["pieces"];
  ASSERT_GE(pieces.size(), 2u);
  // The second piece of rank 0's file, pointed at the first one's bytes (enough of them).
  size_t first = pieces.size();
  size_t second = pieces.size();
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i]["file"] != "shards/rank_0.bin") continue;
    if (first == pieces.size()) {
      first = i;
    } else if (pieces[i]["numel"].get<int64_t>() <= pieces[first]["numel"].get<int64_t>() &&
               pieces[i]["dtype"] == pieces[first]["dtype"]) {
      second = i;
      break;
    }
  }
  ASSERT_LT(second, pieces.size());
  pieces[second]["byte_offset"] = pieces[first]["byte_offset"];
  const std::string text = j.dump(1);
  ASSERT_TRUE(own.write_file("metadata.json", {text.begin(), text.end()}).is_ok());
  MemoryStorage out;
  auto report = export_torch_dist_checkpoint(own, out, "ckpt", as_the_real_runs());
  ASSERT_FALSE(report.is_ok());
  EXPECT_NE(report.status().message().find(
                fmt::format("shards/rank_0.bin: key '{}' piece at {}: the bytes at offset",
                            pieces[second]["key"].get<std::string>(),
                            pieces[second]["global_offset"].get<int64_t>())),
            std::string::npos)
      << report.status().message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ckptsim::model
