// Scenario cases per second of the property search, at the search's own size schedule
// (case k drawn at size k % 101: the default generator size range), one case = draw the
// scenario, run the simulator (reference run + every phase, memory store), check every
// property. Reported as items_per_second; compare the two revisions within one run.
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include "model/py/runtime.h"
#include "search/search.h"
#include "sim/allocator.h"

namespace {

using namespace ckptsim;

void BM_SearchCase(benchmark::State& state, const char* revision) {
  at::set_num_threads(1);
  sim::keep_freed_memory();
  auto registry = model::RevisionRegistry::load_embedded().value();
  search::GeneratorConfig g;
  g.revisions = {sim::resolve_revision(registry, revision).value()};
  const auto gen = search::gen_scenario(g);
  const auto judge = search::property_judge();
  int64_t k = 0;
  int64_t failing = 0;
  for (auto _ : state) {
    const sim::Scenario s =
        gen(rc::Random(model::mix_seed(1, static_cast<uint64_t>(k))), static_cast<int>(k % 101))
            .value();
    const auto finding = judge(s);
    failing += finding.has_value() ? 1 : 0;
    benchmark::DoNotOptimize(finding);
    ++k;
  }
  state.SetItemsProcessed(k);
  state.counters["failing_fraction"] =
      k > 0 ? static_cast<double>(failing) / static_cast<double>(k) : 0.0;
}

BENCHMARK_CAPTURE(BM_SearchCase, upstream_2874, "upstream-2874")
    ->Unit(benchmark::kMillisecond)
    ->MinTime(10.0)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_SearchCase, fix_complete, "fix-complete")
    ->Unit(benchmark::kMillisecond)
    ->MinTime(10.0)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
