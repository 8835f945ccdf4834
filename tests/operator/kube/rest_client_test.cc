// kube::RestClient over the in-process FakeHttpTransport: the requests it builds, how answers
// become statuses (api_error.h), token refresh after a 401 and transport failures. The real API
// server (rest_client_integration_test) and the fault proxy cover what needs a connection.
#include "operator/kube/rest_client.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/api_error.h"
#include "tests/support/fake_http_transport.h"

namespace clusterprof::kube {
namespace {

using testing::FakeHttpTransport;
using ::testing::HasSubstr;
using testing::Reply;

constexpr char kServer[] = "https://api.test:6443";

// Tokens numbered by how often the source was told the last one was rejected.
class RotatingToken final : public TokenSource {
 public:
  absl::StatusOr<std::string> Token() override { return "t" + std::to_string(generation_); }
  void Invalidate() override { ++generation_; }

 private:
  std::atomic<int> generation_{1};
};

class RestClientTest : public ::testing::Test {
 protected:
  std::unique_ptr<RestClient> NewClient(std::shared_ptr<TokenSource> token = nullptr) {
    RestConfig config;
    config.server = kServer;
    config.token = std::move(token);
    config.description = "test config";
    RestClientOptions options;
    options.qps = 0;
    options.transport = &transport_;
    options.observe_request = [this](std::string_view method, int code, int64_t) {
      observed_.emplace_back(std::string(method), code);
    };
    absl::StatusOr<std::unique_ptr<RestClient>> client =
        RestClient::Create(std::move(config), &clock_, options);
    EXPECT_TRUE(client.ok()) << client.status();
    return std::move(*client);
  }

  SimulatedClock clock_;
  FakeHttpTransport transport_;
  std::vector<std::pair<std::string, int>> observed_;
};

TEST_F(RestClientTest, AGetCarriesTheTokenAndReadsTheObject) {
  transport_.Route(kServer, [](const http::Request&) {
    return Reply(200, R"({"kind":"Pod","metadata":{"name":"p","namespace":"ns"}})");
  });
  absl::StatusOr<web::json::value> pod = NewClient(StaticToken("secret"))->Get(Pods(), "ns", "p");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->at("metadata").at("name").as_string(), "p");
  const std::vector<testing::RecordedRequest> sent = transport_.Requests();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].method, "GET");
  EXPECT_EQ(sent[0].url, "https://api.test:6443/api/v1/namespaces/ns/pods/p");
  EXPECT_EQ(sent[0].Header("Authorization"), "Bearer secret");
  EXPECT_EQ(sent[0].Header("Accept"), "application/json");
  EXPECT_EQ(sent[0].Header("User-Agent"), "clusterprof");
  EXPECT_THAT(observed_, ::testing::ElementsAre(std::pair<std::string, int>("GET", 200)));
}

TEST_F(RestClientTest, ARejectedTokenIsReadAgainOnce) {
  transport_.Enqueue(Reply(401, StatusBody(401, "", "token expired")));
  transport_.Route(kServer, [](const http::Request&) { return Reply(200, R"({"kind":"Pod"})"); });
  auto token = std::make_shared<RotatingToken>();
  ASSERT_TRUE(NewClient(token)->Get(Pods(), "ns", "p").ok());
  const std::vector<testing::RecordedRequest> sent = transport_.Requests();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].Header("Authorization"), "Bearer t1");
  EXPECT_EQ(sent[1].Header("Authorization"), "Bearer t2");
}

TEST_F(RestClientTest, ErrorAnswersBecomeStatusesWithTheServersReason) {
  transport_.Enqueue(Reply(410, StatusBody(410, "Expired", "too old resource version: 5 (9)")));
  absl::StatusOr<web::json::value> gone = NewClient()->Get(Pods(), "ns", "p");
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(GetApiErrorInfo(gone.status()).has_value());
  EXPECT_EQ(GetApiErrorInfo(gone.status())->reason, "Expired");

  transport_.Enqueue(Reply(429, "slow down", {{"Retry-After", "7"}}));
  absl::StatusOr<web::json::value> throttled = NewClient()->Get(Pods(), "ns", "p");
  ASSERT_FALSE(throttled.ok());
  EXPECT_EQ(throttled.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(GetApiErrorInfo(throttled.status()).has_value());
  EXPECT_EQ(GetApiErrorInfo(throttled.status())->retry_after_s, 7);
  EXPECT_THAT(std::string(throttled.status().message()),
              HasSubstr("GET /api/v1/namespaces/ns/pods/p"));
}

TEST_F(RestClientTest, NoAnswerIsUnavailableOrDeadlineExceededNamingTheServer) {
  transport_.Enqueue(absl::UnavailableError("connection refused"));
  absl::StatusOr<web::json::value> refused = NewClient()->Get(Pods(), "ns", "p");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("cannot reach https://api.test:6443: connection refused"));
  EXPECT_THAT(observed_, ::testing::ElementsAre(std::pair<std::string, int>("GET", 0)))
      << "no code when nothing answered";

  transport_.Enqueue(absl::DeadlineExceededError("no answer within 30000 ms"));
  absl::StatusOr<web::json::value> slow = NewClient()->Get(Pods(), "ns", "p");
  EXPECT_EQ(slow.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(slow.status().message()), HasSubstr("no answer from"));
}

TEST_F(RestClientTest, APatchSendsItsBodyAndContentType) {
  transport_.Route(kServer, [](const http::Request&) { return Reply(200, R"({"kind":"Pod"})"); });
  const web::json::value patch = web::json::value::parse(R"({"metadata":{"labels":{"a":"b"}}})");
  ASSERT_TRUE(NewClient()->Patch(Pods(), "ns", "p", PatchType::kMerge, patch).ok());
  const testing::RecordedRequest sent = transport_.Requests().at(0);
  EXPECT_EQ(sent.method, "PATCH");
  EXPECT_EQ(sent.content_type, "application/merge-patch+json");
  EXPECT_EQ(web::json::value::parse(sent.body), patch);
}

}  // namespace
}  // namespace clusterprof::kube
