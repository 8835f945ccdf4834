// The injection webhook's cost per pod: the AdmissionReview of a Job's GPU pod answered in
// process (parse, patch, serialize, base64), and over HTTPS on loopback, with a new TLS
// connection per review and over one kept-alive connection (bench/RESULTS.md).
#include <benchmark/benchmark.h>

#include <fstream>
#include <sstream>

#include "common/base/strings.h"
#include "operator/webhook/injection.h"
#include "operator/webhook/webhook_server.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_certificates.h"

namespace clusterprof {
namespace {

std::string ReviewJson() {
  std::ifstream in(
      StrCat(CLUSTERPROF_SOURCE_DIR, "/tests/data/webhook/admission-review-job-pod.json"));
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

void BM_Review(benchmark::State& state) {
  const std::string review = ReviewJson();
  const webhook::InjectionConfig config;
  for (auto _ : state) {
    absl::StatusOr<webhook::ReviewAnswer> answer = webhook::Review(config, review);
    if (!answer.ok() || answer->result.outcome != "injected") {
      state.SkipWithError("not injected");
      break;
    }
    benchmark::DoNotOptimize(answer->body.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Review);

// A webhook server on loopback with fresh certificates; null (the benchmark skipped) when it
// cannot start.
struct Server {
  testing::TempDir dir;
  testing::TestCertificates certificates;
  std::unique_ptr<webhook::WebhookServer> server;

  static std::unique_ptr<Server> Start(benchmark::State& state) {
    auto result = std::make_unique<Server>();
    absl::StatusOr<testing::TestCertificates> certificates =
        testing::MakeTestCertificates(result->dir.path());
    if (!certificates.ok()) {
      state.SkipWithError("no openssl");
      return nullptr;
    }
    result->certificates = *certificates;
    webhook::WebhookServerOptions options;
    options.address = "127.0.0.1";
    options.port = 0;
    options.cert_dir = result->dir.path();
    absl::StatusOr<std::unique_ptr<webhook::WebhookServer>> server =
        webhook::WebhookServer::Start(options);
    if (!server.ok()) {
      state.SkipWithError("the server did not start");
      return nullptr;
    }
    result->server = *std::move(server);
    return result;
  }
};

void BM_ReviewOverHttps(benchmark::State& state) {
  std::unique_ptr<Server> server = Server::Start(state);
  if (server == nullptr) return;
  const std::string review = ReviewJson();
  for (auto _ : state) {
    absl::StatusOr<testing::HttpsResponse> response = testing::HttpsRequest(
        server->server->port(), server->certificates.ca_file, "POST", "/mutate-pods", review);
    if (!response.ok() || response->status != 200) {
      state.SkipWithError("the review failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ReviewOverHttps)->UseRealTime();

// As the API server sends them: 100 reviews over one kept-alive connection per iteration.
void BM_ReviewsOverAKeptAliveConnection(benchmark::State& state) {
  std::unique_ptr<Server> server = Server::Start(state);
  if (server == nullptr) return;
  const std::vector<std::string> reviews(100, ReviewJson());
  for (auto _ : state) {
    absl::StatusOr<std::vector<testing::HttpsResponse>> responses =
        testing::HttpsPostsOnOneConnection(server->server->port(), server->certificates.ca_file,
                                           "/mutate-pods", reviews);
    if (!responses.ok() || responses->size() != reviews.size()) {
      state.SkipWithError("the reviews failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(reviews.size()));
}
BENCHMARK(BM_ReviewsOverAKeptAliveConnection)->UseRealTime();

}  // namespace
}  // namespace clusterprof

BENCHMARK_MAIN();
