// The sidecar's side of the annotation path:
//   Drain            rings -> the tracer's buffers (the loop that runs every 5 ms while capturing)
//   Collect          buffered records -> the /host:CPU plane (decoding names, building lines)
//   SustainedProducer  a workload thread writing 1 M events/s into a live capture: drops?
//
//   build/bench/sidecar_benchmark --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "sdk/annotate.h"
#include "sdk/ring_writer.h"
#include "sidecar/tracers/annotation_tracer.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::sidecar {
namespace {

constexpr int64_t kStart = 1'000'000'000'000;
constexpr uint32_t kSlots = 16384;

// The rings belong on tmpfs, as in a pod (an emptyDir with medium Memory): a disk-backed file
// system writes the dirty ring pages back to disk.
std::string NewDir(const char* name) {
  const std::filesystem::path base = std::filesystem::exists("/dev/shm")
                                         ? std::filesystem::path("/dev/shm")
                                         : std::filesystem::temp_directory_path();
  std::string dir =
      base / (std::string("clusterprof-bench-") + name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

CaptureWindow Window(int64_t start, int64_t stop) { return {start, stop}; }

CaptureConfig Config() {
  CaptureConfig config;
  config.options.set_host_tracer_level(2);
  config.max_events = uint64_t{1} << 40;
  return config;
}

// The shared memory of one benchmark directory; lives as long as the process.
ShmTransport* Shm(const std::string& dir) {
  static auto* transports = new std::vector<std::unique_ptr<ShmTransport>>();
  transports->push_back(std::move(*ShmTransport::Create({.dir = dir})));
  return transports->back().get();
}

// `threads` rings, each filled with a full ring of records per round.
struct Producer {
  explicit Producer(const std::string& dir, int threads) {
    shm::RingOptions options;
    options.slots_per_thread = kSlots;
    options.max_threads = threads;
    options.process_name = "bench";
    std::string error;
    writer = shm::RingWriter::Create(dir, options, &error);
    if (writer == nullptr) std::fprintf(stderr, "%s\n", error.c_str());
    for (int t = 0; t < threads; ++t) rings.push_back(writer->ClaimThread(1000 + t));
    names[0] = writer->Intern("forward");
    names[1] = writer->Intern("train#step_num=12,_r=1#");
    names[2] = writer->Intern("allreduce");
    key = writer->Intern("bytes");
  }
  void Fill() {
    for (shm::ThreadRing* ring : rings) {
      for (uint32_t i = 0; i < kSlots; ++i) {
        shm::Record record{};
        record.kind = shm::RecordKind::kComplete;
        record.name_id = names[i % 3];
        record.start_ns = kStart + i * 100;
        record.end_ns = record.start_ns + 50;
        record.num_args = 1;
        record.args[0] = {key, shm::ArgType::kInt64, i};
        ring->Append(record);
      }
    }
  }
  std::unique_ptr<shm::RingWriter> writer;
  std::vector<shm::ThreadRing*> rings;
  uint32_t names[3];
  uint32_t key;
};

std::unique_ptr<AnnotationTracer> NewTracer(const std::string& dir) {
  AnnotationTracer::Options options;
  options.drain_interval_ms = 3'600'000;  // the benchmark drains by hand
  options.recorder_level = 0;             // the capture path alone (RecorderDrain has it on)
  return std::move(*AnnotationTracer::Create(Shm(dir), options));
}

void BM_Drain(benchmark::State& state) {
  const std::string dir = NewDir("drain");
  Producer producer(dir, static_cast<int>(state.range(0)));
  auto tracer = NewTracer(dir);
  (void)tracer->Start(Window(kStart, kStart + (int64_t{1} << 50)), Config());
  uint64_t drained = 0;
  int rounds = 0;
  for (auto _ : state) {
    state.PauseTiming();
    // Keep the tracer's buffers from growing without bound: a new capture every 64 rounds.
    if (++rounds % 64 == 0) {
      (void)tracer->Stop(kStart + (int64_t{1} << 50));
      tensorflow::profiler::XSpace discard;
      TracerStats stats;
      (void)tracer->CollectInto(&discard, &stats);
      (void)tracer->Start(Window(kStart, kStart + (int64_t{1} << 50)), Config());
    }
    producer.Fill();
    state.ResumeTiming();
    drained += tracer->DrainOnce();
  }
  state.SetItemsProcessed(static_cast<int64_t>(drained));
  (void)tracer->Stop(kStart);
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_Drain)->Arg(1)->Arg(8)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_Collect(benchmark::State& state) {
  const std::string dir = NewDir("collect");
  const int threads = 8;
  Producer producer(dir, threads);
  auto tracer = NewTracer(dir);
  uint64_t events = 0;
  for (auto _ : state) {
    state.PauseTiming();
    (void)tracer->Start(Window(kStart, kStart + (int64_t{1} << 50)), Config());
    producer.Fill();
    tracer->DrainOnce();
    (void)tracer->Stop(kStart + (int64_t{1} << 50));
    tensorflow::profiler::XSpace space;
    TracerStats stats;
    state.ResumeTiming();
    (void)tracer->CollectInto(&space, &stats);
    events += stats.events;
    state.PauseTiming();
    space.Clear();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(events));
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_Collect)->Unit(benchmark::kMillisecond)->UseRealTime();

// One workload thread annotating at `range(0)` events/s for 1 s through the real SDK, while the
// tracer drains every 5 ms as in a capture. Reports the events kept and dropped per second.
void BM_SustainedProducer(benchmark::State& state) {
  const std::string dir = NewDir("sustained");
  const int64_t rate = state.range(0);
  auto tracer = std::move(*AnnotationTracer::Create(Shm(dir), {.recorder_level = 0}));
  annotate_internal::ResetForTesting(dir);
  uint64_t kept = 0;
  uint64_t dropped = 0;
  for (auto _ : state) {
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    const int64_t start = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
    (void)tracer->Start(Window(start, start + 2'000'000'000), Config());
    std::thread producer([rate] {
      { clusterprof::Trace warm("warm"); }  // sets the SDK up outside the paced loop
      // Events in bursts of 1 ms worth, then sleep until the next is due: the pattern of a
      // workload that annotates its ops and spends the rest of its time elsewhere.
      const auto begin = std::chrono::steady_clock::now();
      const int64_t per_ms = rate / 1000;
      int64_t written = 0;
      for (int ms = 1; ms <= 1000; ++ms) {
        for (const int64_t due = per_ms * ms; written < due; ++written) {
          clusterprof::Trace trace("op", {{"i", written}});
        }
        std::this_thread::sleep_until(begin + std::chrono::milliseconds(ms));
      }
    });
    producer.join();
    const auto stop = std::chrono::system_clock::now().time_since_epoch();
    (void)tracer->Stop(std::chrono::duration_cast<std::chrono::nanoseconds>(stop).count());
    tensorflow::profiler::XSpace space;
    TracerStats stats;
    (void)tracer->CollectInto(&space, &stats);
    kept += stats.events;
    dropped += stats.dropped_events;
  }
  state.counters["kept_per_s"] =
      benchmark::Counter(static_cast<double>(kept), benchmark::Counter::kAvgIterations);
  state.counters["dropped"] =
      benchmark::Counter(static_cast<double>(dropped), benchmark::Counter::kAvgIterations);
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_SustainedProducer)
    ->Arg(1'000'000)
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace clusterprof::sidecar

BENCHMARK_MAIN();
