// The GPU path's costs without a GPU: converting CUPTI activity buffers into GPU records (what
// the workload's CUPTI thread spends per record), draining a GPU ring in the sidecar (records
// drained per second), and building the GPU planes from the records. bench/RESULTS.md has the
// figures and the commands.
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>
#include <vector>

#include "sdk/gpu_ring_writer.h"
#include "sidecar/tracers/gpu_ring_reader.h"
#include "sidecar/tracers/gpu_xplane.h"
#include "tests/support/temp_dir.h"
#include "tsl/profiler/protos/xplane.pb.h"
#ifdef CLUSTERPROF_BENCH_CUPTI
#include "sdk/cupti/cupti_recorder.h"
#include "tests/sdk/cupti/mock_cupti_api.h"
#endif

namespace clusterprof {
namespace {

constexpr size_t kBatch = 16384;

shm::GpuRecord Kernel(uint64_t i) {
  shm::GpuRecord r{};
  r.kind = shm::GpuRecordKind::kKernel;
  r.start = 1'000'000'000 + i * 2000;
  r.end = r.start + 1500;
  r.correlation_id = static_cast<uint32_t>(i);
  r.stream_id = 7;
  r.name_id = 1;
  return r;
}

// The sidecar's drain: records out of the ring into the tracer's buffer.
void BM_DrainGpuRing(benchmark::State& state) {
  testing::TempDir dir;
  std::string error;
  auto ring = shm::GpuRingWriter::Create(dir.path(), kBatch, "bench", &error);
  auto reader = shm::GpuRingReader::Open(ring->path());
  std::vector<shm::GpuRecord> batch;
  for (size_t i = 0; i < kBatch; ++i) batch.push_back(Kernel(i));
  std::vector<shm::GpuRecord> kept;
  kept.reserve(kBatch);
  for (auto _ : state) {
    state.PauseTiming();
    ring->Append(batch, std::chrono::microseconds(0), [](std::chrono::microseconds) {});
    kept.clear();
    state.ResumeTiming();
    (*reader)->Drain([&](std::span<const shm::GpuRecord> records) {
      kept.insert(kept.end(), records.begin(), records.end());
    });
    benchmark::DoNotOptimize(kept.data());
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_DrainGpuRing);

// Records into /device:GPU:0 and /host:CPU planes, launches and kernels correlated.
void BM_GpuRecordsToXPlanes(benchmark::State& state) {
  std::vector<shm::GpuRecord> records;
  shm::GpuRecord clock{};
  clock.kind = shm::GpuRecordKind::kClock;
  clock.start = 1'000'000'000;
  clock.end = 1'700'000'000'000'000'000;
  records.push_back(clock);
  for (size_t i = 0; i < kBatch; ++i) {
    shm::GpuRecord api = Kernel(i);
    api.kind = shm::GpuRecordKind::kRuntimeApi;
    api.stream_id = 4242;
    api.name_id = 2;
    records.push_back(api);
    records.push_back(Kernel(i));
  }
  for (auto _ : state) {
    tensorflow::profiler::XSpace space;
    sidecar::GpuXPlaneConverter converter(&space, 1'700'000'000'000'000'000,
                                          1'700'000'100'000'000'000);
    converter.AddProcess(
        1, "bench", {},
        [&](const std::function<void(const shm::GpuRecord&)>& visit) {
          for (const auto& r : records) visit(r);
        },
        [](uint32_t id) -> std::string_view {
          return id == 1 ? "_Z5saxpyifPfS_" : "cudaLaunchKernel";
        });
    benchmark::DoNotOptimize(space.planes_size());
  }
  state.SetItemsProcessed(state.iterations() * (records.size() - 1));
}
BENCHMARK(BM_GpuRecordsToXPlanes);

#ifdef CLUSTERPROF_BENCH_CUPTI
// Inside the workload: CUPTI's completed buffer of kernel records converted into the ring.
void BM_RecorderConvertsCuptiBuffer(benchmark::State& state) {
  testing::TempDir dir;
  std::string error;
  auto ring = shm::GpuRingWriter::Create(dir.path(), 1 << 20, "bench", &error);
  auto reader = shm::GpuRingReader::Open(ring->path());
  cupti::testing::MockCuptiApi api;
  cupti::CuptiRecorder recorder(
      api, *ring, [] { return int64_t{0}; }, [](std::chrono::microseconds) {});
  cupti::RecorderConfig config;
  config.max_activity_events = UINT64_MAX;
  recorder.Enable(1, config);
  cupti::testing::ActivityBuffer buffer;
  for (size_t i = 0; i < kBatch; ++i) {
    buffer.Add(cupti::testing::KernelRecord(i * 2000, i * 2000 + 1500, static_cast<uint32_t>(i), 7,
                                            "_Z5saxpyifPfS_"));
  }
  for (auto _ : state) {
    state.PauseTiming();
    api.Produce(buffer);
    state.ResumeTiming();
    recorder.Flush();
    state.PauseTiming();
    (*reader)->Skip();
    state.ResumeTiming();
  }
  recorder.Disable();
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_RecorderConvertsCuptiBuffer);
#endif

}  // namespace
}  // namespace clusterprof

BENCHMARK_MAIN();
