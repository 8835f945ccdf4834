// The informer's event path in-process, without a server: watch frames of realistic pods
// decoded and applied to the cache. This is the rate the informer can absorb; the end-to-end
// figures against a real API server come from bench/informer_scale.cc.
//
//   build/bench/informer_benchmark --benchmark_min_time=2
#include <string>
#include <vector>

#include "bench/realistic_pod.h"
#include "benchmark/benchmark.h"
#include "operator/kube/informer.h"
#include "operator/kube/object.h"
#include "operator/kube/watch_decoder.h"

namespace clusterprof::kube {
namespace {

constexpr int kPods = 2000;

// kPods MODIFIED events for distinct pods, as the server writes them (managedFields included).
const std::string& EventStream() {
  static const std::string* stream = [] {
    auto* out = new std::string;
    for (int i = 0; i < kPods; ++i) {
      StrAppend(out, R"({"type":"MODIFIED","object":)",
                bench::RealisticPodJson("training", i, /*with_status=*/true,
                                        /*with_managed_fields=*/true),
                "}\n");
    }
    return out;
  }();
  return *stream;
}

// Frames, decodes and caches every event; state.range(0) picks the decoder (0 Pod, 1 JSON).
void BM_WatchEventsIntoCache(benchmark::State& state) {
  const std::string& stream = EventStream();
  const Decoder decoder = state.range(0) == 0 ? PodDecoder() : JsonDecoder();
  ObjectStore store;
  int64_t events = 0;
  for (auto _ : state) {
    WatchDecoder frames;
    for (size_t offset = 0; offset < stream.size(); offset += 64 << 10) {
      frames.Feed(std::string_view(stream).substr(offset, 64 << 10));
      while (true) {
        absl::StatusOr<std::optional<WatchEvent>> event = frames.Next();
        if (!event.ok() || !event->has_value()) break;
        absl::StatusOr<std::shared_ptr<Object>> object = decoder((*event)->object);
        if (!object.ok()) state.SkipWithError("decode failed");
        store.Upsert(*std::move(object));
        ++events;
      }
    }
  }
  state.SetItemsProcessed(events);
  state.SetBytesProcessed(static_cast<int64_t>(stream.size()) * state.iterations());
  state.SetLabel(state.range(0) == 0 ? "PodDecoder" : "JsonDecoder");
}
BENCHMARK(BM_WatchEventsIntoCache)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// Listing from the cache with a label selector over 10,000 pods (the operator resolving a
// ProfileJob's targets).
void BM_ListBySelector(benchmark::State& state) {
  ObjectStore store;
  for (int i = 0; i < 10000; ++i) {
    web::json::value json = web::json::value::parse(
        bench::RealisticPodJson(i < 5000 ? "training" : "serving", i, /*with_status=*/true));
    if (i % 100 == 0) json["metadata"]["labels"]["app"] = web::json::value("rare");
    store.Upsert(*PodDecoder()(json));
  }
  absl::StatusOr<LabelSelector> selector = LabelSelector::Parse("app=rare");
  size_t found = 0;
  for (auto _ : state) {
    found = store.List("training", &*selector).size();
    benchmark::DoNotOptimize(found);
  }
  state.counters["matched"] = static_cast<double>(found);
}
BENCHMARK(BM_ListBySelector)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace clusterprof::kube

BENCHMARK_MAIN();
