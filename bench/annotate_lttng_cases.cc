// annotate_benchmark's LTTng-UST cases: a scoped event as a begin and an end tracepoint
// (annotate_lttng_provider.h). Whether they record depends on the LTTng session daemon, outside
// the process: with no session enabling clusterprof_bench:*, each tracepoint costs the check of
// its enabled flag; with one, it writes an event into LTTng's per-CPU ring buffer. The label says
// which of the two was measured. bench/RESULTS.md has the commands for both.
#include <benchmark/benchmark.h>

#include <cstdint>

#include "bench/annotate_lttng_provider.h"

namespace clusterprof {
namespace {

void SetSessionLabel(benchmark::State& state) {
  const bool enabled = lttng_ust_tracepoint_enabled(clusterprof_bench, begin) &&
                       lttng_ust_tracepoint_enabled(clusterprof_bench, end);
  state.SetLabel(enabled ? "session enabled" : "no session");
}

void BM_LttngUst_Tracepoints(benchmark::State& state) {
  if (state.thread_index() == 0) SetSessionLabel(state);
  int step = 0;
  for (auto _ : state) {
    ++step;
    lttng_ust_tracepoint(clusterprof_bench, begin, "train_step", step);
    benchmark::ClobberMemory();
    lttng_ust_tracepoint(clusterprof_bench, end, "train_step", step);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_LttngUst_Tracepoints)->ThreadRange(1, 8);

}  // namespace
}  // namespace clusterprof
