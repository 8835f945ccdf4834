// Throughput of the XSpace data path: trace JSON conversion (plain and gzip level 1), Perfetto's
// protobuf trace (plain and gzip), xplane.pb serialization to a local file, parsing, and the
// TraceMe codec. Figures and commands are in bench/RESULTS.md.
#include <benchmark/benchmark.h>

#include "common/io/byte_sink.h"
#include "common/io/gzip_sink.h"
#include "common/storage/host_files.h"
#include "common/storage/local_storage.h"
#include "common/xspace/builder.h"
#include "common/xspace/trace_json.h"
#include "common/xspace/trace_perfetto.h"
#include "common/xspace/traceme.h"
#include "common/xspace/xspace_io.h"
#include "tests/support/temp_dir.h"
#include "tests/support/xspace_samples.h"

namespace clusterprof {
namespace {

constexpr int kThreads = 8;
constexpr int64_t kEventsPerThread = 125'000;  // 1M events in all

const tensorflow::profiler::XSpace& Space() {
  static const auto* space =
      new tensorflow::profiler::XSpace(testing::SyntheticXSpace(kThreads, kEventsPerThread));
  return *space;
}

void BM_TraceJson(benchmark::State& state) {
  const auto& space = Space();
  uint64_t bytes = 0;
  for (auto _ : state) {
    io::CountingSink sink;
    auto stats = xspace::WriteTraceJson(space, &sink);
    benchmark::DoNotOptimize(stats);
    bytes += sink.bytes();
  }
  state.SetItemsProcessed(state.iterations() * kThreads * kEventsPerThread);
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_TraceJson)->Unit(benchmark::kMillisecond);

void BM_TraceJsonGzip(benchmark::State& state) {
  const auto& space = Space();
  const int level = static_cast<int>(state.range(0));
  uint64_t in = 0;
  uint64_t out = 0;
  for (auto _ : state) {
    io::CountingSink sink;
    io::GzipSink gzip(&sink, level);
    auto stats = xspace::WriteTraceJson(space, &gzip);
    benchmark::DoNotOptimize(stats);
    (void)gzip.Finish();
    in += gzip.bytes_in();
    out += gzip.bytes_out();
  }
  state.SetItemsProcessed(state.iterations() * kThreads * kEventsPerThread);
  state.SetBytesProcessed(static_cast<int64_t>(in));
  state.counters["ratio"] = static_cast<double>(in) / static_cast<double>(out);
  state.counters["gz_bytes_per_event"] =
      static_cast<double>(out) /
      static_cast<double>(state.iterations() * kThreads * kEventsPerThread);
}
BENCHMARK(BM_TraceJsonGzip)->Arg(1)->Arg(6)->Unit(benchmark::kMillisecond);

// The serialized XSpace, as `clusterprof convert` reads it from the mapped file.
const std::string& Serialized() {
  static const auto* bytes = new std::string(Space().SerializeAsString());
  return *bytes;
}

// Trace JSON streamed from the serialized XSpace: what `clusterprof convert` runs.
void BM_TraceJsonStreamed(benchmark::State& state) {
  const std::string& bytes = Serialized();
  for (auto _ : state) {
    io::CountingSink sink;
    auto stats = xspace::WriteTraceJsonFromSerialized(bytes, "bench", &sink);
    benchmark::DoNotOptimize(stats);
  }
  state.SetItemsProcessed(state.iterations() * kThreads * kEventsPerThread);
}
BENCHMARK(BM_TraceJsonStreamed)->Unit(benchmark::kMillisecond);

// Perfetto's protobuf trace, streamed from the serialized XSpace (`convert --format perfetto`).
void BM_TracePerfetto(benchmark::State& state) {
  const std::string& bytes = Serialized();
  uint64_t out = 0;
  for (auto _ : state) {
    io::CountingSink sink;
    auto stats = xspace::WritePerfettoTraceFromSerialized(bytes, "bench", &sink);
    benchmark::DoNotOptimize(stats);
    out += sink.bytes();
  }
  const int64_t events = state.iterations() * kThreads * kEventsPerThread;
  state.SetItemsProcessed(events);
  state.SetBytesProcessed(static_cast<int64_t>(out));
  state.counters["bytes_per_event"] = static_cast<double>(out) / static_cast<double>(events);
}
BENCHMARK(BM_TracePerfetto)->Unit(benchmark::kMillisecond);

void BM_TracePerfettoGzip(benchmark::State& state) {
  const std::string& bytes = Serialized();
  const int level = static_cast<int>(state.range(0));
  uint64_t in = 0;
  uint64_t out = 0;
  for (auto _ : state) {
    io::CountingSink sink;
    io::GzipSink gzip(&sink, level);
    auto stats = xspace::WritePerfettoTraceFromSerialized(bytes, "bench", &gzip);
    benchmark::DoNotOptimize(stats);
    (void)gzip.Finish();
    in += gzip.bytes_in();
    out += gzip.bytes_out();
  }
  const int64_t events = state.iterations() * kThreads * kEventsPerThread;
  state.SetItemsProcessed(events);
  state.SetBytesProcessed(static_cast<int64_t>(in));
  state.counters["ratio"] = static_cast<double>(in) / static_cast<double>(out);
  state.counters["gz_bytes_per_event"] = static_cast<double>(out) / static_cast<double>(events);
}
BENCHMARK(BM_TracePerfettoGzip)->Arg(1)->Arg(6)->Unit(benchmark::kMillisecond);

// The xplane.pb as the sidecar commits it: serialize (this thread) while a background thread
// writes, then fsync, rename and fsync the directory.
void BM_WriteXPlaneFile(benchmark::State& state) {
  const auto& space = Space();
  testing::TempDir dir;
  auto storage = storage::NewLocalStorage({.sync = state.range(0) != 0});
  auto layout = storage::RunLayout::Create(*storage::ParseLogdir(dir.path()), "run");
  uint64_t bytes = 0;
  for (auto _ : state) {
    auto files =
        storage::WriteHostFiles(*storage, *layout, "h", space, {.write_trace_json = false});
    bytes += files->xplane.bytes;
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.SetLabel(state.range(0) ? "fsync" : "no fsync");
}
BENCHMARK(BM_WriteXPlaneFile)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

// Both host files, as a capture writes them: xplane.pb, then trace.json.gz (JSON generated on
// this thread, gzip level 1 and writing on a background thread).
void BM_WriteHostFiles(benchmark::State& state) {
  const auto& space = Space();
  testing::TempDir dir;
  auto storage = storage::NewLocalStorage();
  auto layout = storage::RunLayout::Create(*storage::ParseLogdir(dir.path()), "run");
  for (auto _ : state) {
    auto files = storage::WriteHostFiles(*storage, *layout, "h", space);
    benchmark::DoNotOptimize(files);
  }
  state.SetItemsProcessed(state.iterations() * kThreads * kEventsPerThread);
}
BENCHMARK(BM_WriteHostFiles)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ParseXSpace(benchmark::State& state) {
  const std::string bytes = Space().SerializeAsString();
  for (auto _ : state) {
    auto loaded = xspace::ParseXSpace(bytes, "bench");
    benchmark::DoNotOptimize(loaded);
  }
  state.SetItemsProcessed(state.iterations() * kThreads * kEventsPerThread);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes.size()));
}
BENCHMARK(BM_ParseXSpace)->Unit(benchmark::kMillisecond);

void BM_TraceMeEncode(benchmark::State& state) {
  int64_t step = 0;
  for (auto _ : state) {
    std::string name = traceme::Encode("train_step", {{"step_num", ++step}, {"_r", 1}});
    benchmark::DoNotOptimize(name);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_TraceMeEncode);

void BM_TraceMeDecode(benchmark::State& state) {
  const std::string name = "train_step#step_num=1200,_r=1,shape=[8,1024],algo=ring#";
  for (auto _ : state) {
    auto annotation = traceme::Decode(name);
    benchmark::DoNotOptimize(annotation);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_TraceMeDecode);

}  // namespace
}  // namespace clusterprof

BENCHMARK_MAIN();
