// The cross-host analysis: how fast a host's XSpace becomes its digest (the sidecar will do this
// at the end of every capture), and the verdict over many hosts' digests.
//
//   build/bench/analysis_benchmark --benchmark_filter=Digest
#include <benchmark/benchmark.h>

#include <random>

#include "analysis/digest.h"
#include "analysis/stragglers.h"
#include "common/base/strings.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "common/xspace/xspace_io.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::analysis {
namespace {

// `steps` steps of a GPU training host, `per_step` events each: a step marker, host ops on two
// threads, GPU kernels on four streams, an input wait and NCCL collectives.
tensorflow::profiler::XSpace MakeHost(int steps, int per_step, uint32_t seed) {
  std::mt19937 rng(seed);
  tensorflow::profiler::XSpace space;
  xspace::XPlaneBuilder cpu(
      xspace::FindOrAddMutablePlaneWithName(&space, xspace::kHostThreadsPlaneName));
  xspace::XPlaneBuilder gpu(
      xspace::FindOrAddMutablePlaneWithName(&space, StrCat(xspace::kGpuPlanePrefix, 0)));
  const int64_t t0 = 1'767'225'600'000'000'000;
  for (int line = 1; line <= 2; ++line) cpu.GetOrCreateLine(line).SetTimestampNs(t0);
  for (int stream = 7; stream < 11; ++stream) gpu.GetOrCreateLine(stream).SetTimestampNs(t0);
  std::vector<const tensorflow::profiler::XEventMetadata*> host_ops, kernels;
  for (int i = 0; i < 50; ++i) {
    host_ops.push_back(cpu.GetOrCreateEventMetadata(StrCat("aten::op_", i)));
    kernels.push_back(gpu.GetOrCreateEventMetadata(StrCat("ampere_sgemm_", i, "_tn")));
  }
  const auto* train = cpu.GetOrCreateEventMetadata("train");
  const auto* load = cpu.GetOrCreateEventMetadata("data_load");
  const auto* nccl = gpu.GetOrCreateEventMetadata("ncclDevKernel_AllReduce_Sum_f32_RING_LL");
  const auto* step_stat = cpu.GetOrCreateStatMetadata(xspace::kStepNum);
  const int64_t step_ns = 100'000'000;
  for (int s = 0; s < steps; ++s) {
    const int64_t start = t0 + s * step_ns;
    xspace::XEventBuilder marker = cpu.GetOrCreateLine(1).AddEvent(*train);
    marker.SetTimestampNs(start);
    marker.SetDurationNs(step_ns - 1000);
    marker.AddStatValue(*step_stat, int64_t{s});
    xspace::XEventBuilder input = cpu.GetOrCreateLine(2).AddEvent(*load);
    input.SetTimestampNs(start);
    input.SetDurationNs(5'000'000);
    const int rest = per_step - 2;
    const int64_t slot = (step_ns - 10'000'000) / rest;
    for (int i = 0; i < rest; ++i) {
      const int64_t at = start + 5'000'000 + i * slot;
      if (i % 3 == 0) {
        xspace::XEventBuilder op = cpu.GetOrCreateLine(1 + i % 2).AddEvent(*host_ops[rng() % 50]);
        op.SetTimestampNs(at);
        op.SetDurationNs(slot / 2);
      } else {
        xspace::XEventBuilder k =
            gpu.GetOrCreateLine(7 + i % 4).AddEvent(i + 10 >= rest ? *nccl : *kernels[rng() % 50]);
        k.SetTimestampNs(at);
        k.SetDurationNs(slot);
      }
    }
  }
  return space;
}

void BM_Digest(benchmark::State& state) {
  const int steps = static_cast<int>(state.range(0));
  const int per_step = static_cast<int>(state.range(1));
  const tensorflow::profiler::XSpace space = MakeHost(steps, per_step, 1);
  int64_t events = 0;
  for (auto _ : state) {
    absl::StatusOr<HostDigest> digest = DigestXSpace(space, "host-0");
    if (!digest.ok() || static_cast<int>(digest->steps.size()) != steps) {
      state.SkipWithError("digest failed");
      return;
    }
    events = digest->events;
    benchmark::DoNotOptimize(digest);
  }
  state.SetItemsProcessed(state.iterations() * events);
  state.counters["events"] = static_cast<double>(events);
}
BENCHMARK(BM_Digest)->Args({1000, 1000})->Args({100, 10000})->Unit(benchmark::kMillisecond);

// The same host read back from its file, as `clusterprof report` reads it (the parser puts the
// events in an arena, next to each other).
void BM_DigestParsed(benchmark::State& state) {
  const std::string bytes = MakeHost(1000, 1000, 1).SerializeAsString();
  absl::StatusOr<std::unique_ptr<xspace::LoadedXSpace>> loaded =
      xspace::ParseXSpace(bytes, "benchmark");
  if (!loaded.ok()) {
    state.SkipWithError("parse failed");
    return;
  }
  int64_t events = 0;
  for (auto _ : state) {
    absl::StatusOr<HostDigest> digest = DigestXSpace((*loaded)->space(), "host-0");
    events = digest->events;
    benchmark::DoNotOptimize(digest);
  }
  state.SetItemsProcessed(state.iterations() * events);
  state.counters["events"] = static_cast<double>(events);
}
BENCHMARK(BM_DigestParsed)->Unit(benchmark::kMillisecond);

void BM_FindStragglers(benchmark::State& state) {
  const int hosts = static_cast<int>(state.range(0));
  const tensorflow::profiler::XSpace space = MakeHost(1000, 20, 2);
  std::vector<HostRun> runs;
  const HostDigest digest = *DigestXSpace(space, "host");
  for (int h = 0; h < hosts; ++h) {
    runs.push_back({digest, 0});
    runs.back().digest.host = StrCat("host-", h);
  }
  for (auto _ : state) benchmark::DoNotOptimize(FindStragglers(runs));
  state.SetItemsProcessed(state.iterations() * hosts * 1000);
}
BENCHMARK(BM_FindStragglers)->Arg(64)->Arg(1000)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace clusterprof::analysis

BENCHMARK_MAIN();
