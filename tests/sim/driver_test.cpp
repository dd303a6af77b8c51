// The simulator's determinism is designed and then tested (STYLE 7): a rerun of a seed gives
// the same trace hash; the directory store and the memory store give the same run; the trace
// starts with the seed and the revisions. Mutations caught: a clock or unseeded random source in
// model/ or sim/ (RerunGivesTheSameTraceHash would differ), reduction in arrival order
// (DeterministicAcrossRepeats with dp 5), different bytes in the two stores
// (SameRunOnDiskAndInMemory).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "model/py/pickle_codec.h"
#include "tests/testing.h"

using namespace ckptsim;

TEST(Driver, TraceStartsWithSeedAndRevisions) {
  const auto run = test::run(test::scenario_file("scenarios/bug2-step-reset-dp2-to-4.json"));
  ASSERT_GE(run.trace.size(), 3u);
  EXPECT_EQ(run.trace[0],
            "seed=1 revision=upstream-2874,upstream-2874 scenario=bug2-step-reset-dp2-to-4");
  EXPECT_EQ(run.trace[1].rfind("options optimizer=hybrid", 0), 0u) << run.trace[1];
  EXPECT_NE(std::find(run.trace.begin(), run.trace.end(), "reshard dp 2->4"), run.trace.end());
}

TEST(Driver, RerunGivesTheSameTraceHash) {
  const auto s = test::scenario_file("scenarios/spec17-J-lno-lno-offload-half.json");
  const auto a = test::run(s);
  const auto b = test::run(s);
  EXPECT_EQ(a.trace_hash, b.trace_hash);
  EXPECT_EQ(a.trace, b.trace);
  EXPECT_EQ(a.reference.back().hash(), b.reference.back().hash());
}

// RunOptions::trace_steps = false (the search's judge) leaves out only the per-step state
// lines: the rest of the trace, every recorded state and every verdict are the same. Mutations
// caught: the option ignored (step lines still there); the option skipping the capture instead
// of only its trace line (the recorded states differ).
TEST(Driver, WithoutStepTracesOnlyTheStepLinesGo) {
  const auto s = test::scenario_file("scenarios/bug2-step-reset-dp2-to-4.json");
  const auto full = test::run(s);
  sim::RunOptions options;
  options.trace_steps = false;
  const auto lean = test::run(s, options);
  std::vector<std::string> full_without_steps;
  size_t step_lines = 0;
  for (const auto& line : full.trace) {
    if (line.rfind("step phase=", 0) == 0) {
      ++step_lines;
    } else if (line.rfind("trace_hash=", 0) != 0) {
      full_without_steps.push_back(line);
    }
  }
  EXPECT_GT(step_lines, 0u);
  std::vector<std::string> lean_trace(lean.trace.begin(), lean.trace.end() - 1);  // no trace_hash
  EXPECT_EQ(lean_trace, full_without_steps);
  ASSERT_EQ(lean.reference.size(), full.reference.size());
  for (size_t k = 0; k < full.reference.size(); ++k)
    EXPECT_EQ(lean.reference[k].hash(), full.reference[k].hash()) << "reference step " << k;
  ASSERT_EQ(lean.phases.size(), full.phases.size());
  for (size_t i = 0; i < full.phases.size(); ++i) {
    ASSERT_EQ(lean.phases[i].after_step.size(), full.phases[i].after_step.size()) << i;
    for (size_t k = 0; k < full.phases[i].after_step.size(); ++k) {
      EXPECT_EQ(lean.phases[i].after_step[k].hash(), full.phases[i].after_step[k].hash())
          << "phase " << i << " step " << k;
    }
  }
  for (const auto& p : properties::all_properties()) {
    EXPECT_EQ(p.check(lean).verdict, p.check(full).verdict) << p.name;
  }
}

TEST(Driver, DeterministicAcrossRepeatsWithManyRanks) {
  // Five ranks, threads scheduled differently each time: the final states must not change.
  const auto s = test::scenario_from_json(
      test::two_phase_json("fused_adam", 0, 5, 3, "upstream-2874", "upstream-2874"));
  const auto first = test::run(s);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(test::run(s).trace_hash, first.trace_hash) << "repeat " << i;
}

TEST(Driver, DifferentSeedsDiffer) {
  auto s = test::scenario_from_json(
      test::two_phase_json("fused_adam", 0, 2, 2, "upstream-2874", "upstream-2874"));
  const auto a = test::run(s);
  s.seed += 1;
  EXPECT_NE(test::run(s).reference.back().hash(), a.reference.back().hash());
}

TEST(Driver, SameRunOnDiskAndInMemory) {
  const auto s = test::scenario_file("scenarios/bug1-duplicate-leaf-dp2-to-4.json");
  const auto mem = test::run(s);
  const auto dir = std::filesystem::temp_directory_path() /
                   ("ckptsim-driver-test-" + std::to_string(::getpid()));
  sim::RunOptions options;
  options.checkpoint_dir = dir.string();
  const auto disk = test::run(s, options);
  EXPECT_EQ(mem.trace_hash, disk.trace_hash);
  // The checkpoint really is on disk, with a common.pt that decodes to the saved common state.
  // In the training loop's layout: phase 0 saved iteration 5, and the tracker names phase 1's.
  EXPECT_EQ(sim::saved_directory(disk, 0), "iter_0000005");
  const auto common = dir / "iter_0000005" / "common.pt";
  ASSERT_TRUE(std::filesystem::exists(common));
  ASSERT_TRUE(std::filesystem::exists(dir / "latest_checkpointed_iteration.txt"));
  model::DirectoryStorage store(dir / "iter_0000005");
  auto decoded = model::read_common_state(store);
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  EXPECT_EQ(decoded.value().dict()->at("iteration").as_int(), 5);
  // miles-main leaves the raw step in the common state (bug 1's ingredient).
  EXPECT_TRUE(decoded.value().dict()->at("optimizer").dict()->contains("param_state"));
  std::filesystem::remove_all(dir);
}

TEST(Driver, ResumedFusedAdamRunIsBitIdenticalAcrossDpSizes) {
  // The exact-sum gradients make a resume at another DP size reproduce the reference bit for bit.
  const auto run = test::run(test::scenario_file("scenarios/fused-adam-upstream-dp4-to-2.json"));
  const auto& last = run.phases.at(1).after_step.back();
  const auto* ref = run.reference_at(last.global_step);
  ASSERT_NE(ref, nullptr);
  EXPECT_EQ(last.master, ref->master);
  EXPECT_EQ(last.param, ref->param);
}

// A torch error outside the modeled sites is reported as Python would show it: a RuntimeError
// with torch's message and without the C++ backtrace that c10::Error::what() appends (it broke
// the gate report's table). The case: a loader with B8's gbuf-order group index (miles-main
// without its installed-order fix) loading a checkpoint that fix-complete saved for a group
// mixing bf16 and fp32 params. Mutations caught: what() instead of what_without_backtrace();
// "Exception" as the type.
TEST(Driver, TorchErrorsAreOneLineRuntimeErrors) {
  auto& reg = test::registry();
  if (!reg.get("miles-main-gbuf-order").is_ok()) {
    ASSERT_TRUE(reg.add(R"({"name": "miles-main-gbuf-order", "extends": "miles-main",
                           "switches": {"group_index_map_installed_order": false}})",
                        "driver_test.cpp")
                    .is_ok());
  }
  const auto s = test::scenario_from_json(R"({"seed": 0,
    "params": [{"name": "p0", "numel": 1, "dtype": "bf16"}, {"name": "p1", "numel": 2, "dtype": "fp32"},
               {"name": "p2", "numel": 3, "dtype": "bf16"}],
    "optimizer": {"kind": "fused_adam", "lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
    "phases": [{"dp": 1, "revision": "fix-complete", "steps": 0},
               {"dp": 1, "revision": "miles-main-gbuf-order", "steps": 0}]})");
  const auto run = test::run(s);
  const auto& resumed = run.phases.at(1);
  ASSERT_FALSE(resumed.completed);
  const auto& e = resumed.errors.front();
  EXPECT_EQ(e.stage, "load");
  EXPECT_EQ(e.py_type, "RuntimeError");
  EXPECT_NE(e.message.find("must match the size of tensor"), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find('\n'), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find("Exception raised from"), std::string::npos) << e.message;
}

// Issue 25: phase 1's save writes all of iteration 5's files, then the job dies before the
// tracker: phase 2, the restarted job, resumes from iteration 3 (phase 0's save, which the
// tracker still names) and trains on from there, as the uninterrupted run did.
// Mutation caught: the load reading the newest iter_* directory instead of the tracker
// (phase 2 would start at 5).
TEST(Driver, AJobThatDiesBeforeItsTrackerWriteResumesFromTheCommittedIteration) {
  std::string json = test::two_phase_json("fused_adam", 0, 2, 4, "fix-complete", "fix-complete");
  json.replace(json.find("\"steps\": 2}"), 11,
               "\"steps\": 2, \"storage_faults\": [{\"kind\": \"crash_before\", \"file\": "
               "\"tracker\"}]}, {\"dp\": 3, \"revision\": \"fix-complete\", \"steps\": 1}");
  const auto run = test::run(test::scenario_from_json(json));
  ASSERT_EQ(run.phases.size(), 3u);
  EXPECT_TRUE(run.phases[1].crashed);
  EXPECT_EQ(run.phases[1].save_iteration, 5);
  ASSERT_TRUE(run.phases[2].committed_before.has_value());
  EXPECT_EQ(run.phases[2].committed_before->first, 3);
  EXPECT_EQ(run.phases[2].start_step, 3);
  EXPECT_EQ(run.phases[2].loaded_phase, std::optional<size_t>(0));
  EXPECT_EQ(run.phases[2].after_step.size(), 1u);
  EXPECT_NE(std::find(run.trace.begin(), run.trace.end(),
                      "storage fault phase=1 crash_before at write 0 of "
                      "'*latest_checkpointed_iteration.txt': latest_checkpointed_iteration.txt"),
            run.trace.end());
  for (const auto& r : properties::check_all(run))
    EXPECT_TRUE(r.ok()) << r.name << ": " << r.detail;
}

namespace {

// Phase 0 of two_phase_json trained for `steps` with `saves` (the phase's save fields), then
// phase 1 (dp 4, 2 steps).
sim::Scenario with_saves(int steps, const std::string& saves, const std::string& extra = "") {
  std::string json =
      test::two_phase_json("hybrid", 1.0, 2, 4, "fix-complete", "fix-complete", extra);
  json.replace(json.find("\"steps\": 3"), 10, fmt::format("\"steps\": {}, {}", steps, saves));
  return test::scenario_from_json(json);
}

// Every file under `dir`, relative path -> bytes.
std::map<std::string, std::string> files_under(const std::filesystem::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    out[std::filesystem::relative(e.path(), dir).string()] =
        std::string(std::istreambuf_iterator<char>(in), {});
  }
  return out;
}

}  // namespace

// --async-save (model/megatron/async_save.h, invariant 1): the files an async save leaves once
// finalized are byte for byte the synchronous save's, interval saves and the exit save alike,
// and every phase resumes from the same iteration. Mutations caught: the recording view
// dropping the worker's writes of one rank, or applying the finalize before the writes of a
// later-scheduled save (the tracker would name another iteration).
TEST(Driver, AnAsyncSaveLeavesTheFilesOfTheSynchronousSave) {
  const auto base =
      std::filesystem::temp_directory_path() / ("ckptsim-async-test-" + std::to_string(::getpid()));
  std::map<std::string, std::string> files[2];
  for (int async = 0; async < 2; ++async) {
    const auto s =
        with_saves(5, async ? R"("save_interval": 2, "async_save": true, "async_write_steps": 1)"
                            : R"("save_interval": 2)");
    sim::RunOptions options;
    options.checkpoint_dir = (base / std::to_string(async)).string();
    const auto run = test::run(s, options);
    EXPECT_EQ(run.phases[1].start_step, 5) << "async=" << async;
    EXPECT_EQ(run.phases[0].earlier_saves.size(), 2u) << "async=" << async;
    for (const auto& r : properties::check_all(run))
      EXPECT_TRUE(r.ok()) << "async=" << async << " " << r.name << ": " << r.detail;
    files[async] = files_under(options.checkpoint_dir);
  }
  std::filesystem::remove_all(base);
  // iterations 2, 4 and 5 of phase 0, 7 of phase 1, and the tracker.
  EXPECT_TRUE(files[0].contains("iter_0000002/metadata.json"));
  EXPECT_TRUE(files[0].contains("iter_0000004/shards/rank_1.bin"));
  EXPECT_EQ(files[0].at("latest_checkpointed_iteration.txt"), "7");
  ASSERT_EQ(files[0].size(), files[1].size());
  for (const auto& [path, bytes] : files[0]) {
    ASSERT_TRUE(files[1].contains(path)) << path;
    EXPECT_TRUE(files[1].at(path) == bytes) << path << " differs";
  }
}

// When an async save is finalized: at the top of the first iteration `async_write_steps` after
// its own (maybe_finalize_async_save(blocking=False) once every rank's worker is done). Seen
// through the fault site that writes the live iteration into the tracker: saves at 3 and 6,
// the second crashing at its first shard, so the tracker left is the first save's finalize's,
// written at iteration 3 + w. Without the fault it names 3, which the next job resumes from.
// Mutations caught: finalizing one iteration late (`>` for `>=`), or at the end of the job only.
TEST(Driver, AnAsyncSaveIsFinalizedAsManyIterationsLaterAsItsWritesTake) {
  for (int w = 0; w <= 2; ++w) {
    const std::string saves = fmt::format(
        R"("save_interval": 3, "async_save": true, "async_write_steps": {}, "storage_faults": )"
        R"([{{"kind": "crash_before", "file": "shard", "nth": 2}}])",
        w);
    const auto faulty = test::run(
        with_saves(6, saves, R"(, "faults": ["save.async_finalize_reads_live_iteration"])"));
    ASSERT_TRUE(faulty.phases[0].on_disk.has_value());
    EXPECT_EQ(faulty.phases[0].on_disk->tracker, std::optional<std::string>(std::to_string(3 + w)))
        << "w=" << w;
    const auto clean = test::run(with_saves(6, saves));
    ASSERT_TRUE(clean.phases[0].on_disk.has_value());
    EXPECT_EQ(clean.phases[0].on_disk->tracker, std::optional<std::string>("3")) << "w=" << w;
    EXPECT_EQ(clean.phases[1].start_step, 3) << "w=" << w;
    EXPECT_EQ(clean.phases[1].loaded_phase, std::optional<size_t>(0)) << "w=" << w;
    for (const auto& r : properties::check_all(clean))
      EXPECT_TRUE(r.ok()) << "w=" << w << " " << r.name << ": " << r.detail;
  }
}

// --finetune (PhaseSpec::finetune): phase 1 loads phase 0's weights after 3 steps and counts
// its iterations from 0, saving every iteration (iter_0000001, iter_0000002 at global steps 4
// and 5); phase 2 resumes from the tracker's iteration 2, which is global step 5, and saves
// iteration 4 (global 7). Mutations caught: global steps taken for iterations in the saves
// (phase 1 would save iter_0000005), the loaded iteration taken as the global step (phase 2
// would start at global 2: its reference state differs), the gradients drawn by iteration
// (phase 1 would repeat global steps 1 and 2: trajectory_matches_uninterrupted fails).
TEST(Driver, AFinetuneJobCountsItsIterationsFromZeroAndTheNextJobResumesFromThem) {
  std::string json = test::two_phase_json("fused_adam", 0, 2, 4, "upstream-head", "upstream-head");
  json.replace(json.find("\"steps\": 2}"), 11,
               "\"steps\": 2, \"finetune\": true, \"save_interval\": 1}, {\"dp\": 2, "
               "\"revision\": \"upstream-head\", \"steps\": 2}");
  const auto run = test::run(test::scenario_from_json(json));
  ASSERT_EQ(run.phases.size(), 3u);
  EXPECT_EQ(sim::iteration_origins(run.scenario), (std::vector<int64_t>{0, 3, 3}));
  EXPECT_EQ(sim::optimizer_origins(run.scenario), (std::vector<int64_t>{0, 3, 3}));
  EXPECT_EQ(run.phases[1].start_step, 3);
  EXPECT_EQ(run.phases[1].iteration_origin, 3);
  EXPECT_EQ(run.phases[1].save_iteration, 2);
  ASSERT_EQ(run.phases[1].earlier_saves.size(), 1u);
  EXPECT_EQ(run.phases[1].earlier_saves[0].global_step, 4);
  EXPECT_NE(run.phases[1].saved_at(1), nullptr);
  EXPECT_EQ(sim::saved_directory(run, 1), "iter_0000002");
  EXPECT_EQ(run.phases[2].start_step, 5);
  EXPECT_EQ(run.phases[2].iteration_origin, 3);
  EXPECT_EQ(run.phases[2].loaded_phase, std::optional<size_t>(1));
  EXPECT_EQ(sim::saved_directory(run, 2), "iter_0000004");
  ASSERT_TRUE(run.phases[2].on_disk.has_value());
  EXPECT_EQ(run.phases[2].on_disk->named, std::optional<int64_t>(4));
  EXPECT_EQ(run.phases[2].on_disk->files_iteration, std::optional<int64_t>(4));
  const auto traced = [&](const std::string& prefix) {
    return std::any_of(run.trace.begin(), run.trace.end(),
                       [&](const std::string& l) { return l.starts_with(prefix); });
  };
  EXPECT_TRUE(traced("load phase=1 rank=0 iteration=0 checkpoint_iteration=3 state="));
  EXPECT_TRUE(traced("load phase=2 rank=0 iteration=2 state="));
  EXPECT_TRUE(traced("save phase=1 rank=0 iteration=1 "));
  for (const auto& r : properties::check_all(run))
    EXPECT_TRUE(r.ok()) << r.name << ": " << r.detail;
}

// An MoE model (issue 26): an expert param beside a dense one gives the chain an expert part on
// the expert-DP group; EP rank e holds rows [e n/ep, (e+1) n/ep) of it, and a resume from DP 2
// to DP 4 at EP 2 continues the uninterrupted run bit for bit (an expert gradient summed over
// its EP group's tokens, then over the expert-DP group, is every sample's sum whatever the DP
// size; Gradients.AnExpertDpGroupSumsEverySample pins that sum). Mutation caught: the EP piece
// taken as the whole param (the ranges).
TEST(Driver, AnExpertParamIsTheChainsExpertPartSplitOverEp) {
  const auto s = test::scenario_from_json(R"({"name": "moe", "seed": 5,
    "params": [{"name": "w0", "numel": 600, "dtype": "bf16"},
               {"name": "e0", "numel": 512, "dtype": "bf16", "expert": true}],
    "optimizer": {"kind": "fused_adam", "lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8,
                  "weight_decay": 0.1},
    "phases": [{"dp": 2, "ep": 2, "revision": "upstream-head", "steps": 3},
               {"dp": 4, "ep": 2, "revision": "upstream-head", "steps": 2}]})");
  const auto run = test::run(s);
  const auto t = test::verdict(run, "trajectory_matches_uninterrupted");
  EXPECT_EQ(t.verdict, properties::Verdict::kPass) << t.detail;
  ASSERT_FALSE(run.phases[0].after_step.empty());
  // At DP 2 and EP 2 each rank is its own expert-DP group: its shard is its whole EP piece.
  std::map<int, std::pair<int64_t, int64_t>> expert_ranges;
  for (const auto& shard : run.phases[0].after_step.back().shards) {
    if (shard.param == 1) expert_ranges[shard.rank] = {shard.range.start, shard.range.end};
  }
  EXPECT_EQ(expert_ranges[0], (std::pair<int64_t, int64_t>{0, 256}));
  EXPECT_EQ(expert_ranges[1], (std::pair<int64_t, int64_t>{256, 512}));
}
