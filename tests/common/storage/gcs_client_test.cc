// gcs::Client over the in-process FakeHttpTransport: the requests it builds, how it reads GCS's
// answers (errors mapped once, common/http/status.h), its retries and token refresh. The
// loopback GCS server (gcs_storage_integration_test) covers what needs real connections.
#include "common/storage/gcs_client.h"

#include "common/storage/gcs_credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/clock_advancer.h"
#include "tests/support/fake_http_transport.h"

namespace clusterprof::storage::gcs {
namespace {

using testing::FakeHttpTransport;
using ::testing::HasSubstr;
using testing::Reply;

constexpr char kEndpoint[] = "http://gcs.test";
constexpr char kObject[] =
    R"({"bucket":"b","name":"tb/run/host.xplane.pb","generation":"7","size":"12",)"
    R"("crc32c":"AAAAAA==","contentType":"application/octet-stream"})";

// Bearer tokens numbered by fetch; Invalidate makes the next one new.
class CountingCredentials final : public Credentials {
 public:
  absl::StatusOr<std::string> AuthorizationHeader() override {
    return "Bearer token-" + std::to_string(generation_);
  }
  void Invalidate() override { ++generation_; }
  std::string Identity() override { return "test account"; }
  int64_t token_fetches() const override { return generation_; }
  std::string QuotaProject() override { return quota_project_; }
  void set_quota_project(std::string project) { quota_project_ = std::move(project); }

 private:
  std::atomic<int> generation_{1};
  std::string quota_project_;
};

class GcsClientTest : public ::testing::Test {
 protected:
  std::unique_ptr<Client> NewClient() {
    ClientOptions options;
    options.endpoint = kEndpoint;
    options.credentials = credentials_;
    options.clock = &clock_;
    options.transport = &transport_;
    options.retry.backoff.initial_ns = kNanosPerMilli;
    options.on_retry = [this](std::string_view, const absl::Status& why) {
      retries_.push_back(why);
    };
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(std::move(options));
    EXPECT_TRUE(client.ok()) << client.status();
    return std::move(*client);
  }

  SimulatedClock clock_;
  FakeHttpTransport transport_;
  std::shared_ptr<CountingCredentials> credentials_ = std::make_shared<CountingCredentials>();
  std::vector<absl::Status> retries_;
};

TEST_F(GcsClientTest, GetsObjectMetadataWithTheTokenAndUserAgent) {
  transport_.Route(kEndpoint, [](const http::Request&) { return Reply(200, kObject); });
  absl::StatusOr<ObjectMetadata> object =
      NewClient()->GetObjectMetadata("b", "tb/run/host.xplane.pb");
  ASSERT_TRUE(object.ok()) << object.status();
  EXPECT_EQ(object->generation, 7);
  EXPECT_EQ(object->size, 12u);
  ASSERT_EQ(transport_.count(), 1);
  const testing::RecordedRequest sent = transport_.Requests()[0];
  EXPECT_EQ(sent.method, "GET");
  EXPECT_EQ(sent.url, "http://gcs.test/storage/v1/b/b/o/tb%2Frun%2Fhost.xplane.pb")
      << "the object name is one path segment";
  EXPECT_EQ(sent.Header("Authorization"), "Bearer token-1");
  EXPECT_EQ(sent.Header("User-Agent"), "clusterprof");
}

TEST_F(GcsClientTest, TheCredentialsQuotaProjectIsSentAsUserProject) {
  transport_.Route(kEndpoint, [](const http::Request&) { return Reply(200, kObject); });
  ASSERT_TRUE(NewClient()->GetObjectMetadata("b", "tb/run/host.xplane.pb").ok());
  EXPECT_EQ(transport_.Requests()[0].Header("x-goog-user-project"), "") << "none by default";
  credentials_->set_quota_project("billing-project");
  ASSERT_TRUE(NewClient()->GetObjectMetadata("b", "tb/run/host.xplane.pb").ok());
  EXPECT_EQ(transport_.Requests()[1].Header("x-goog-user-project"), "billing-project");
}

TEST_F(GcsClientTest, A503IsRetriedUntilItSucceeds) {
  testing::ClockAdvancer advancer(&clock_, kNanosPerMilli);
  transport_.Enqueue(Reply(503, R"({"error":{"message":"backend busy"}})"));
  transport_.Enqueue(absl::UnavailableError("connection reset by peer"));
  transport_.Route(kEndpoint, [](const http::Request&) { return Reply(200, kObject); });
  absl::StatusOr<ObjectMetadata> object = NewClient()->GetObjectMetadata("b", "o");
  ASSERT_TRUE(object.ok()) << object.status();
  EXPECT_EQ(transport_.count(), 3);
  ASSERT_EQ(retries_.size(), 2u);
  EXPECT_EQ(retries_[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(retries_[0].message()), HasSubstr("HTTP 503"));
  EXPECT_THAT(std::string(retries_[0].message()), HasSubstr("backend busy"));
  EXPECT_THAT(std::string(retries_[1].message()), HasSubstr("http://gcs.test did not answer"));
  EXPECT_THAT(std::string(retries_[1].message()), HasSubstr("connection reset by peer"));
}

TEST_F(GcsClientTest, A401RefreshesTheTokenAndSendsOnceMore) {
  transport_.Enqueue(Reply(401, R"({"error":{"message":"token expired"}})"));
  transport_.Route(kEndpoint, [](const http::Request&) { return Reply(200, kObject); });
  ASSERT_TRUE(NewClient()->GetObjectMetadata("b", "o").ok());
  const std::vector<testing::RecordedRequest> sent = transport_.Requests();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].Header("Authorization"), "Bearer token-1");
  EXPECT_EQ(sent[1].Header("Authorization"), "Bearer token-2");

  // A second 401 in a row is the answer: the account lacks the permission.
  transport_.Enqueue(Reply(401, R"({"error":{"message":"still no"}})"));
  transport_.Enqueue(Reply(401, R"({"error":{"message":"still no"}})"));
  absl::StatusOr<ObjectMetadata> denied = NewClient()->GetObjectMetadata("b", "o");
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(denied.status().message()), HasSubstr("as test account"));
}

TEST_F(GcsClientTest, ErrorsAreMappedOnceForGcs) {
  struct Case {
    int http;
    absl::StatusCode code;
  };
  for (const Case& c :
       {Case{404, absl::StatusCode::kNotFound}, Case{403, absl::StatusCode::kPermissionDenied},
        Case{409, absl::StatusCode::kAlreadyExists},
        Case{412, absl::StatusCode::kFailedPrecondition}, Case{410, absl::StatusCode::kNotFound}}) {
    transport_.Enqueue(Reply(c.http, R"({"error":{"message":"no"}})"));
    absl::StatusOr<ObjectMetadata> object = NewClient()->GetObjectMetadata("b", "o");
    ASSERT_FALSE(object.ok()) << c.http;
    EXPECT_EQ(object.status().code(), c.code) << c.http << ": " << object.status();
    EXPECT_THAT(std::string(object.status().message()), HasSubstr(std::to_string(c.http)));
  }
}

TEST_F(GcsClientTest, AResumableUploadAsksWhereTheSessionStandsFromTheRangeHeader) {
  // The session URI, then a chunk that GCS takes only part of (308 with Range), then the rest.
  transport_.Route(kEndpoint, [](const http::Request& request) {
    if (request.method == "POST") {
      return Reply(200, "", {{"Location", "http://gcs.test/session/1"}});
    }
    return Reply(404);
  });
  int puts = 0;
  transport_.Route("http://gcs.test/session/1", [&puts](const http::Request& request) {
    ++puts;
    if (puts == 1) return Reply(308, "", {{"range", "bytes=0-262143"}});
    return Reply(200, R"({"bucket":"b","name":"o","generation":"1","size":"524288",)"
                      R"("crc32c":"AAAAAA=="})");
  });
  UploadRequest upload;
  upload.bucket = "b";
  upload.name = "o";
  const std::string data(512 * 1024, 'x');
  upload.crc32c = 0;
  upload.size = data.size();
  std::vector<UploadProgress> progress;
  absl::StatusOr<ObjectMetadata> done = NewClient()->UploadResumable(
      upload,
      [&](uint64_t offset, size_t length) -> absl::StatusOr<std::string_view> {
        return std::string_view(data).substr(offset, length);
      },
      ResumableState{}, 256 * 1024, [&](const UploadProgress& step) { progress.push_back(step); });
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.front().state.session_uri, "http://gcs.test/session/1");
  std::vector<uint64_t> committed;
  for (const UploadProgress& step : progress) committed.push_back(step.committed);
  EXPECT_THAT(committed, ::testing::Contains(262144u));
  const std::vector<testing::RecordedRequest> sent = transport_.Requests();
  ASSERT_GE(sent.size(), 3u);
  EXPECT_EQ(sent[1].Header("Content-Range"), "bytes 0-262143/524288");
  EXPECT_EQ(sent.back().Header("Content-Range"), "bytes 262144-524287/524288");
}

}  // namespace
}  // namespace clusterprof::storage::gcs
