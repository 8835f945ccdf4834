// Cost of a scoped annotation (begin + end) with capture off and on, by thread count.
// Figures and commands in bench/RESULTS.md.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "sidecar/sdk/annotate.h"
#include "sidecar/sdk/control_page.h"
#include "sidecar/tracers/ring_reader.h"
#include "tests/support/temp_dir.h"

namespace clusterprof {
namespace {

// One directory and control page for the whole run; a drainer is not needed: a full ring drops
// and counts, which costs the same as a write.
struct Environment {
  testing::TempDir dir;
  std::unique_ptr<shm::ControlWriter> control;
  Environment() {
    std::string error;
    control = shm::ControlWriter::Create(dir.path(), &error);
    annotate_internal::ResetForTesting(dir.path());
  }
};

Environment& Env() {
  static auto* env = new Environment();
  return *env;
}

void BM_TraceOff(benchmark::State& state) {
  Env().control->Disarm();
  { Trace warm("warm"); }  // the first call sets the SDK up
  for (auto _ : state) {
    Trace trace("train_step");
    benchmark::DoNotOptimize(trace);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_TraceOff)->ThreadRange(1, 2);

void BM_TraceOn(benchmark::State& state) {
  if (state.thread_index() == 0) Env().control->Arm(kAnnotationLevelInfo, 0, 0, 0);
  { Trace warm("warm"); }
  for (auto _ : state) {
    Trace trace("train_step");
    benchmark::DoNotOptimize(trace);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_TraceOn)->ThreadRange(1, 2);

void BM_TraceOnWithArgs(benchmark::State& state) {
  if (state.thread_index() == 0) Env().control->Arm(kAnnotationLevelInfo, 0, 0, 0);
  int64_t step = 0;
  for (auto _ : state) {
    Trace trace("train_step", {{"step_num", ++step}, {"_r", 1}});
    benchmark::DoNotOptimize(trace);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_TraceOnWithArgs);

}  // namespace
}  // namespace clusterprof

BENCHMARK_MAIN();
