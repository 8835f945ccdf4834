// The pod informer at scale against a real kube-apiserver and etcd on loopback
// (tests/support/kube_control_plane.h): creates N realistic running pods, then measures
//   - the initial list-and-sync time of an informer over all of them,
//   - the heap the informer's cache holds per pod (glibc's allocator statistics, before and
//     after the sync), with the operator's PodDecoder and with the generic JsonDecoder,
//   - the watch events per second the informer absorbs while writers patch pods as fast as the
//     server takes them, and how far behind it is when they stop.
//
//   eval "$(scripts/install-kube-control-plane)"; export CLUSTERPROF_KUBE_APISERVER
//   CLUSTERPROF_ETCD build/bench/informer_scale --pods 10000 --writers 8 --seconds 20
#include <malloc.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/realistic_pod.h"
#include "common/base/clock.h"
#include "operator/kube/informer.h"
#include "operator/kube/rest_client.h"
#include "tests/support/kube_control_plane.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::kube {
namespace {

int64_t HeapBytes() {
  malloc_trim(0);
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "informer_scale: %s\n", std::string(status.message()).c_str());
  return 1;
}

// Counts events; the informer calls it from one thread.
class Counter : public ResourceEventHandler {
 public:
  void OnUpdate(const ObjectPtr&, const ObjectPtr&) override {
    updates.fetch_add(1, std::memory_order_relaxed);
  }
  std::atomic<int64_t> updates{0};
};

struct SyncFigures {
  double seconds = 0;
  double bytes_per_pod = 0;
};

SyncFigures MeasureSync(RestClient* client, Clock* clock, const std::string& ns, int pods,
                        Decoder decoder) {
  const int64_t before = HeapBytes();
  InformerOptions options;
  options.type = Pods();
  options.namespace_ = ns;
  options.decoder = std::move(decoder);
  options.name = "pods";
  auto informer = std::make_unique<Informer>(client, clock, options);
  const auto start = std::chrono::steady_clock::now();
  informer->Start();
  informer->WaitForSync();
  const double seconds = Seconds(std::chrono::steady_clock::now() - start);
  // Stop the threads so only the cache remains, then weigh it.
  informer->Stop();
  const int64_t after = HeapBytes();
  if (static_cast<int>(informer->List().size()) != pods) {
    std::fprintf(stderr, "informer_scale: the cache holds %zu pods, not %d\n",
                 informer->List().size(), pods);
    std::exit(1);
  }
  return {seconds, static_cast<double>(after - before) / pods};
}

int Run(int pods, int writers, int seconds) {
  absl::StatusOr<std::unique_ptr<testing::KubeControlPlane>> plane =
      testing::KubeControlPlane::Start();
  if (!plane.ok()) return Fail(plane.status());
  RealClock clock;
  RestConfig config;
  config.server = (*plane)->url();
  config.ca_pem = testing::ReadFileOrDie((*plane)->ca_file());
  config.token = StaticToken((*plane)->admin_token());
  RestClientOptions unlimited;
  unlimited.qps = 0;
  absl::StatusOr<std::unique_ptr<RestClient>> client =
      RestClient::Create(config, &clock, unlimited);
  if (!client.ok()) return Fail(client.status());
  const std::string ns = "training";
  web::json::value namespace_object = web::json::value::object();
  namespace_object["metadata"]["name"] = web::json::value(ns);
  if (absl::Status s = (*client)->Create(Namespaces(), "", namespace_object).status(); !s.ok()) {
    return Fail(s);
  }

  // Create the pods and report them running, from several threads.
  std::fprintf(stderr, "creating %d pods...\n", pods);
  const auto create_start = std::chrono::steady_clock::now();
  std::atomic<int> next{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < pods; i = next++) {
        absl::StatusOr<web::json::value> created =
            (*client)->Create(Pods(), ns, web::json::value::parse(bench::RealisticPodJson(ns, i)));
        if (!created.ok()) {
          if (failures++ == 0) std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
          continue;
        }
        web::json::value status = *created;
        status["status"] =
            web::json::value::parse("{" + bench::RealisticPodStatusJson(i) + "}").at("status");
        if (!(*client)->UpdateStatus(Pods(), ns, status).ok()) ++failures;
        if (i > 0 && i % 1000 == 0) std::fprintf(stderr, "  %d\n", i);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  threads.clear();
  if (failures > 0) return Fail(absl::InternalError(StrCat(failures.load(), " writes failed")));
  std::fprintf(stderr, "created in %.1f s\n",
               Seconds(std::chrono::steady_clock::now() - create_start));

  const SyncFigures pod_decoder = MeasureSync(client->get(), &clock, ns, pods, PodDecoder());
  const SyncFigures json_decoder = MeasureSync(client->get(), &clock, ns, pods, JsonDecoder());

  // Watch throughput: writers patch pods' annotations as fast as the server takes them.
  InformerOptions options;
  options.type = Pods();
  options.namespace_ = ns;
  options.decoder = PodDecoder();
  options.name = "pods";
  Informer informer(client->get(), &clock, options);
  Counter counter;
  informer.AddEventHandler(&counter);
  informer.Start();
  informer.WaitForSync();
  std::atomic<bool> stop{false};
  std::atomic<int64_t> writes{0};
  for (int t = 0; t < writers; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; !stop.load(); i += writers) {
        const std::string patch =
            StrCat(R"({"metadata":{"annotations":{"bench/step":")", i, R"("}}})");
        if ((*client)
                ->Patch(Pods(), ns, StrCat("llama-trainer-worker-", i % pods), PatchType::kMerge,
                        web::json::value::parse(patch))
                .ok()) {
          writes.fetch_add(1);
        }
      }
    });
  }
  const auto watch_start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  stop = true;
  for (std::thread& t : threads) t.join();
  const double write_seconds = Seconds(std::chrono::steady_clock::now() - watch_start);
  const int64_t seen_at_stop = counter.updates.load();
  // Wait for the informer to catch up with every write.
  const auto drain_start = std::chrono::steady_clock::now();
  while (counter.updates.load() < writes.load() &&
         std::chrono::steady_clock::now() - drain_start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double lag = Seconds(std::chrono::steady_clock::now() - drain_start);
  const double total_seconds = Seconds(std::chrono::steady_clock::now() - watch_start);
  informer.Stop();

  std::printf("pods                               %d\n", pods);
  std::printf("list-and-sync, PodDecoder          %.2f s\n", pod_decoder.seconds);
  std::printf("cache heap per pod, PodDecoder     %.0f B\n", pod_decoder.bytes_per_pod);
  std::printf("list-and-sync, JsonDecoder         %.2f s\n", json_decoder.seconds);
  std::printf("cache heap per pod, JsonDecoder    %.0f B\n", json_decoder.bytes_per_pod);
  std::printf("writes (patches), %d writers        %lld in %.1f s = %.0f/s\n", writers,
              static_cast<long long>(writes.load()), write_seconds, writes.load() / write_seconds);
  std::printf("watch events applied               %lld (%lld when writers stopped)\n",
              static_cast<long long>(counter.updates.load()), static_cast<long long>(seen_at_stop));
  std::printf("watch events per second absorbed   %.0f/s\n",
              counter.updates.load() / total_seconds);
  std::printf("lag after the last write           %.3f s\n", lag);
  std::printf("informer relists / watches         %lld / %lld\n",
              static_cast<long long>(informer.stats().relists),
              static_cast<long long>(informer.stats().watches));
  return counter.updates.load() >= writes.load() ? 0 : 1;
}

}  // namespace
}  // namespace clusterprof::kube

int main(int argc, char** argv) {
  CLI::App app{"Pod informer memory, sync time and watch throughput against a real API server"};
  int pods = 10000;
  int writers = 8;
  int seconds = 20;
  app.add_option("--pods", pods, "pods to create")->check(CLI::PositiveNumber);
  app.add_option("--writers", writers, "threads patching pods")->check(CLI::PositiveNumber);
  app.add_option("--seconds", seconds, "how long the writers run")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  return clusterprof::kube::Run(pods, writers, seconds);
}
