// The webhook's HTTPS server on loopback: AdmissionReviews over verified TLS, certificate
// rotation without a restart, bad requests, start-up errors, and its metrics.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "absl/strings/escaping.h"
#include "common/base/strings.h"
#include "cpprest/json.h"
#include "operator/webhook/webhook_server.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_certificates.h"

namespace clusterprof::webhook {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using web::json::value;

constexpr char kReview[] = R"({
  "kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
  "request": {
    "uid": "0b6e4a2c-1d3f-4e5a-9b7c-8d9e0f1a2b3c",
    "kind": {"group": "", "version": "v1", "kind": "Pod"},
    "resource": {"group": "", "version": "v1", "resource": "pods"},
    "namespace": "training", "operation": "CREATE",
    "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
    "object": {
      "apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": "trainer-0", "namespace": "training",
                   "labels": {"clusterprof.io/inject": "true"}},
      "spec": {"containers": [{"name": "trainer", "image": "trainer:1",
                               "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    },
    "oldObject": null, "dryRun": false
  }
})";

class WebhookServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::TestCertificates> certificates =
        testing::MakeTestCertificates(dir_.path());
    if (!certificates.ok() && absl::IsNotFound(certificates.status())) {
      GTEST_SKIP() << certificates.status();
    }
    ASSERT_TRUE(certificates.ok()) << certificates.status();
    certificates_ = *certificates;
  }

  absl::StatusOr<std::unique_ptr<WebhookServer>> Start(const std::string& cert_dir) {
    WebhookServerOptions options;
    options.address = "127.0.0.1";
    options.port = 0;
    options.cert_dir = cert_dir;
    options.registry = registry_;
    return WebhookServer::Start(options);
  }

  std::string Metrics() const {
    return prometheus::TextSerializer().Serialize(registry_->Collect());
  }

  testing::TempDir dir_;
  testing::TestCertificates certificates_;
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
};

TEST_F(WebhookServerTest, AnswersAnAdmissionReviewOverVerifiedTls) {
  absl::StatusOr<std::unique_ptr<WebhookServer>> server = Start(dir_.path());
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<testing::HttpsResponse> response = testing::HttpsRequest(
      (*server)->port(), certificates_.ca_file, "POST", "/mutate-pods", kReview);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200) << response->body;
  EXPECT_EQ(response->server_serial, certificates_.serial);
  const value body = value::parse(response->body);
  EXPECT_EQ(body.at("kind").as_string(), "AdmissionReview");
  const value& answer = body.at("response");
  EXPECT_EQ(answer.at("uid").as_string(), "0b6e4a2c-1d3f-4e5a-9b7c-8d9e0f1a2b3c");
  EXPECT_TRUE(answer.at("allowed").as_bool());
  std::string patch;
  ASSERT_TRUE(absl::Base64Unescape(answer.at("patch").as_string(), &patch));
  EXPECT_THAT(patch, AllOf(HasSubstr("clusterprof-sidecar"), HasSubstr("CUDA_INJECTION64_PATH")));
  EXPECT_THAT(Metrics(), HasSubstr("clusterprof_webhook_admissions_total{outcome=\"injected\"} 1"));
}

TEST_F(WebhookServerTest, AnswersManyReviewsOverOneKeptAliveConnection) {
  absl::StatusOr<std::unique_ptr<WebhookServer>> server = Start(dir_.path());
  ASSERT_TRUE(server.ok()) << server.status();
  const std::vector<std::string> bodies(5, kReview);
  absl::StatusOr<std::vector<testing::HttpsResponse>> responses =
      testing::HttpsPostsOnOneConnection((*server)->port(), certificates_.ca_file, "/mutate-pods",
                                         bodies);
  ASSERT_TRUE(responses.ok()) << responses.status();
  ASSERT_EQ(responses->size(), 5u);
  for (const testing::HttpsResponse& response : *responses) {
    EXPECT_EQ(response.status, 200);
    EXPECT_TRUE(value::parse(response.body).at("response").at("allowed").as_bool());
  }
  EXPECT_THAT(Metrics(), HasSubstr("clusterprof_webhook_admissions_total{outcome=\"injected\"} 5"));
}

TEST_F(WebhookServerTest, ServesARotatedCertificateWithoutARestart) {
  absl::StatusOr<std::unique_ptr<WebhookServer>> server = Start(dir_.path());
  ASSERT_TRUE(server.ok()) << server.status();
  // A new CA and certificate, swapped in as kubelet updates a Secret volume (a rename).
  testing::TempDir next_dir;
  absl::StatusOr<testing::TestCertificates> next = testing::MakeTestCertificates(next_dir.path());
  ASSERT_TRUE(next.ok()) << next.status();
  for (const char* name : {"tls.crt", "tls.key"}) {
    std::filesystem::copy_file(next_dir.Join(name), dir_.Join(StrCat(name, ".new")));
  }
  std::filesystem::rename(dir_.Join("tls.key.new"), dir_.Join("tls.key"));
  std::filesystem::rename(dir_.Join("tls.crt.new"), dir_.Join("tls.crt"));
  // Files are checked at most once a second.
  std::string served;
  for (int attempt = 0; attempt < 50 && served != next->serial; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    absl::StatusOr<testing::HttpsResponse> response =
        testing::HttpsRequest((*server)->port(), next->ca_file, "POST", "/mutate-pods", kReview);
    if (response.ok()) served = response->server_serial;
  }
  EXPECT_EQ(served, next->serial);
  // The old CA no longer verifies the server.
  EXPECT_FALSE(testing::HttpsRequest((*server)->port(), certificates_.ca_file, "POST",
                                     "/mutate-pods", kReview)
                   .ok());
}

TEST_F(WebhookServerTest, AHalfWrittenCertificateKeepsThePreviousOne) {
  absl::StatusOr<std::unique_ptr<WebhookServer>> server = Start(dir_.path());
  ASSERT_TRUE(server.ok()) << server.status();
  testing::TempDir other_dir;
  ASSERT_TRUE(testing::MakeTestCertificates(other_dir.path()).ok());
  // A key that does not belong to the certificate.
  std::filesystem::copy_file(other_dir.Join("tls.key"), dir_.Join("tls.key"),
                             std::filesystem::copy_options::overwrite_existing);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  absl::StatusOr<testing::HttpsResponse> response = testing::HttpsRequest(
      (*server)->port(), certificates_.ca_file, "POST", "/mutate-pods", kReview);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->server_serial, certificates_.serial);
  EXPECT_EQ(response->status, 200);
}

TEST_F(WebhookServerTest, BadRequestsGetClearAnswers) {
  absl::StatusOr<std::unique_ptr<WebhookServer>> server = Start(dir_.path());
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  absl::StatusOr<testing::HttpsResponse> response =
      testing::HttpsRequest(port, certificates_.ca_file, "POST", "/mutate-pods", "{\"kind\": 1");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 400);
  EXPECT_THAT(response->body, HasSubstr("not JSON"));

  response = testing::HttpsRequest(port, certificates_.ca_file, "GET", "/mutate-pods");
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->status, 405);

  response = testing::HttpsRequest(port, certificates_.ca_file, "POST", "/validate", kReview);
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->status, 404);
  EXPECT_THAT(response->body, HasSubstr("/mutate-pods"));
  EXPECT_THAT(Metrics(),
              HasSubstr("clusterprof_webhook_admissions_total{outcome=\"bad-request\"} 1"));
}

TEST_F(WebhookServerTest, StartFailsClearlyWithoutACertificate) {
  testing::TempDir empty;
  absl::StatusOr<std::unique_ptr<WebhookServer>> server = Start(empty.path());
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(),
              HasSubstr(StrCat("cannot read the webhook certificate ", empty.path(), "/tls.crt")));

  testing::TempDir other_dir;
  ASSERT_TRUE(testing::MakeTestCertificates(other_dir.path()).ok());
  std::filesystem::copy_file(other_dir.Join("tls.key"), dir_.Join("tls.key"),
                             std::filesystem::copy_options::overwrite_existing);
  server = Start(dir_.path());
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("does not belong to the certificate"));
}

TEST_F(WebhookServerTest, StartRefusesAnInvalidInjectionConfig) {
  WebhookServerOptions options;
  options.port = 0;
  options.cert_dir = dir_.path();
  options.injection.image_pull_policy = "Sometimes";
  EXPECT_THAT(WebhookServer::Start(options).status().message(),
              HasSubstr("Always, IfNotPresent or Never"));
}

}  // namespace
}  // namespace clusterprof::webhook
