// The REST client against a real kube-apiserver: CRUD, patches, the status subresource, paging,
// selectors, conflicts, RBAC errors, token rotation, watches, and the client-side rate limit.
#include <openssl/err.h>
#include <openssl/pem.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/api_error.h"
#include "operator/kube/rest_client.h"
#include "operator/kube/retry.h"
#include "tests/operator/kube/kube_fixture.h"

namespace clusterprof::kube {
namespace {

using ::testing::HasSubstr;

std::string Name(const web::json::value& object) {
  return object.at("metadata").at("name").as_string();
}
std::string ResourceVersion(const web::json::value& object) {
  return object.at("metadata").at("resourceVersion").as_string();
}

class RestClientTest : public KubeFixture {};

TEST_F(RestClientTest, CreateGetUpdateDelete) {
  absl::StatusOr<web::json::value> created = admin_->Create(ConfigMaps(), ns_, ConfigMap("a", "1"));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->at("kind").as_string(), "ConfigMap");
  EXPECT_FALSE(ResourceVersion(*created).empty());

  absl::StatusOr<web::json::value> got = admin_->Get(ConfigMaps(), ns_, "a");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->at("data").at("v").as_string(), "1");

  web::json::value changed = *got;
  changed["data"]["v"] = web::json::value("2");
  absl::StatusOr<web::json::value> updated = admin_->Update(ConfigMaps(), ns_, changed);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(updated->at("data").at("v").as_string(), "2");
  EXPECT_NE(ResourceVersion(*updated), ResourceVersion(*got));

  ASSERT_TRUE(admin_->Delete(ConfigMaps(), ns_, "a").ok());
  const absl::Status gone = admin_->Get(ConfigMaps(), ns_, "a").status();
  EXPECT_TRUE(absl::IsNotFound(gone)) << gone;
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.message(), HasSubstr("configmaps \"a\" not found"));
  EXPECT_TRUE(absl::IsNotFound(admin_->Delete(ConfigMaps(), ns_, "a")));
}

TEST_F(RestClientTest, CreatingTwiceIsAlreadyExists) {
  ASSERT_TRUE(admin_->Create(ConfigMaps(), ns_, ConfigMap("dup")).ok());
  const absl::Status again = admin_->Create(ConfigMaps(), ns_, ConfigMap("dup")).status();
  EXPECT_TRUE(absl::IsAlreadyExists(again)) << again;
  EXPECT_FALSE(IsConflict(again));
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(RestClientTest, StaleUpdateIsAConflictAndARetryWithTheLatestSucceeds) {
  absl::StatusOr<web::json::value> created = admin_->Create(ConfigMaps(), ns_, ConfigMap("c", "0"));
  ASSERT_TRUE(created.ok());
  web::json::value first = *created;
  first["data"]["v"] = web::json::value("first");
  ASSERT_TRUE(admin_->Update(ConfigMaps(), ns_, first).ok());

  // The same stale resourceVersion again: 409 Conflict.
  web::json::value second = *created;
  second["data"]["v"] = web::json::value("second");
  const absl::Status conflict = admin_->Update(ConfigMaps(), ns_, second).status();
  ASSERT_TRUE(IsConflict(conflict)) << conflict;
  EXPECT_EQ(GetApiErrorInfo(conflict)->reason, "Conflict");
  EXPECT_EQ(conflict.code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(IsRetryable(conflict));

  // Conflict retry: read the latest, apply the change again.
  absl::StatusOr<web::json::value> latest = admin_->Get(ConfigMaps(), ns_, "c");
  ASSERT_TRUE(latest.ok());
  (*latest)["data"]["v"] = web::json::value("second");
  absl::StatusOr<web::json::value> updated = admin_->Update(ConfigMaps(), ns_, *latest);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(updated->at("data").at("v").as_string(), "second");
}

// Several writers increment one counter with read-modify-write updates: every increment must
// land, conflicts being retried.
TEST_F(RestClientTest, RetryOnConflictLosesNoUpdateUnderContention) {
  ASSERT_TRUE(admin_->Create(ConfigMaps(), ns_, ConfigMap("counter", "0")).ok());
  constexpr int kWriters = 4;
  constexpr int kIncrements = 10;
  std::atomic<int> attempts{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        const absl::Status status = RetryOnConflict(
            &clock_,
            [&]() -> absl::Status {
              ++attempts;
              absl::StatusOr<web::json::value> latest = admin_->Get(ConfigMaps(), ns_, "counter");
              if (!latest.ok()) return latest.status();
              const int value = std::stoi(latest->at("data").at("v").as_string());
              (*latest)["data"]["v"] = web::json::value(std::to_string(value + 1));
              return admin_->Update(ConfigMaps(), ns_, *latest).status();
            },
            ConflictBackoff{.max_attempts = 100, .delay_ns = kNanosPerMilli});
        if (!status.ok()) ++failures;
      }
    });
  }
  for (std::thread& writer : writers) writer.join();
  EXPECT_EQ(failures, 0);
  absl::StatusOr<web::json::value> counter = admin_->Get(ConfigMaps(), ns_, "counter");
  ASSERT_TRUE(counter.ok());
  EXPECT_EQ(counter->at("data").at("v").as_string(), std::to_string(kWriters * kIncrements));
  EXPECT_GE(attempts, kWriters * kIncrements);
}

TEST(RetryOnConflictTest, StopsAtTheFirstOtherOutcomeOrAfterMaxAttempts) {
  RealClock clock;
  const absl::Status conflict =
      ApiErrorFromResponse(409, R"({"kind":"Status","reason":"Conflict"})", "", "PUT /x");
  const ConflictBackoff quick{.max_attempts = 5, .delay_ns = kNanosPerMicro};
  int calls = 0;
  const absl::Status status = RetryOnConflict(
      &clock,
      [&] {
        ++calls;
        return calls < 3 ? conflict : absl::NotFoundError("gone");
      },
      quick);
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_EQ(calls, 3);

  calls = 0;
  EXPECT_TRUE(IsConflict(RetryOnConflict(
      &clock,
      [&] {
        ++calls;
        return conflict;
      },
      quick)));
  EXPECT_EQ(calls, 5);
}

TEST_F(RestClientTest, MergeJsonAndStrategicPatches) {
  ASSERT_TRUE(admin_->Create(ConfigMaps(), ns_, ConfigMap("p", "0")).ok());
  web::json::value merge = web::json::value::parse(R"({"data":{"w":"merged"}})");
  absl::StatusOr<web::json::value> merged =
      admin_->Patch(ConfigMaps(), ns_, "p", PatchType::kMerge, merge);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->at("data").at("v").as_string(), "0");
  EXPECT_EQ(merged->at("data").at("w").as_string(), "merged");

  web::json::value json_patch = web::json::value::parse(
      R"([{"op":"test","path":"/data/v","value":"0"},{"op":"replace","path":"/data/v","value":"j"}])");
  absl::StatusOr<web::json::value> patched =
      admin_->Patch(ConfigMaps(), ns_, "p", PatchType::kJson, json_patch);
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ(patched->at("data").at("v").as_string(), "j");

  // A JSON patch whose test fails is refused, and changes nothing.
  const absl::Status failed =
      admin_->Patch(ConfigMaps(), ns_, "p", PatchType::kJson, json_patch).status();
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(GetApiErrorInfo(failed)->http_code, 422) << failed;

  web::json::value strategic = web::json::value::parse(R"({"metadata":{"labels":{"x":"y"}}})");
  absl::StatusOr<web::json::value> labelled =
      admin_->Patch(ConfigMaps(), ns_, "p", PatchType::kStrategicMerge, strategic);
  ASSERT_TRUE(labelled.ok()) << labelled.status();
  EXPECT_EQ(labelled->at("metadata").at("labels").at("x").as_string(), "y");
}

TEST_F(RestClientTest, ListsWithSelectorsAndPagesOverTwoThousandObjects) {
  constexpr int kObjects = 2000;
  // Create them from a few threads: the server, not the client, is the slow part.
  std::atomic<int> next{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> writers;
  for (int t = 0; t < 8; ++t) {
    writers.emplace_back([&] {
      for (int i = next++; i < kObjects; i = next++) {
        web::json::value object = ConfigMap(StrCat("cm-", i));
        object["metadata"]["labels"]["parity"] = web::json::value(i % 2 == 0 ? "even" : "odd");
        object["metadata"]["labels"]["tens"] = web::json::value(std::to_string(i / 10 % 10));
        if (!admin_->Create(ConfigMaps(), ns_, object).ok()) ++failures;
      }
    });
  }
  for (std::thread& writer : writers) writer.join();
  ASSERT_EQ(failures, 0);

  ListOptions paged;
  paged.limit = 150;
  absl::StatusOr<ObjectList> first = admin_->List(ConfigMaps(), ns_, paged);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->items.size(), 150u);
  EXPECT_FALSE(first->continue_token.empty());

  absl::StatusOr<ObjectList> all = admin_->ListAll(ConfigMaps(), ns_, paged);
  ASSERT_TRUE(all.ok()) << all.status();
  std::set<std::string> names;
  for (const web::json::value& item : all->items) names.insert(Name(item));
  EXPECT_EQ(names.size(), static_cast<size_t>(kObjects));
  EXPECT_EQ(all->items.size(), static_cast<size_t>(kObjects)) << "duplicates across pages";
  EXPECT_FALSE(all->resource_version.empty());

  ListOptions selected;
  selected.label_selector = "parity=even,tens in (3,4)";
  selected.limit = 37;
  absl::StatusOr<ObjectList> some = admin_->ListAll(ConfigMaps(), ns_, selected);
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_EQ(some->items.size(), 200u);  // 1000 even, 2 of 10 tens digits
  for (const web::json::value& item : some->items) {
    const web::json::value& labels = item.at("metadata").at("labels");
    EXPECT_EQ(labels.at("parity").as_string(), "even");
    EXPECT_THAT(labels.at("tens").as_string(), ::testing::AnyOf("3", "4"));
  }

  ListOptions by_field;
  by_field.field_selector = "metadata.name=cm-1999";
  absl::StatusOr<ObjectList> one = admin_->List(ConfigMaps(), ns_, by_field);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->items.size(), 1u);
  EXPECT_EQ(Name(one->items[0]), "cm-1999");
}

TEST_F(RestClientTest, UnprivilegedTokenGetsAClearForbidden) {
  std::unique_ptr<RestClient> user = NewClient(plane_->user_token());
  const absl::Status denied = user->List(ConfigMaps(), ns_).status();
  ASSERT_TRUE(IsForbidden(denied)) << denied;
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  // The message names the user, the verb and the resource, as the server says them.
  EXPECT_THAT(denied.message(), HasSubstr(testing::KubeControlPlane::kUser));
  EXPECT_THAT(denied.message(), HasSubstr("cannot list resource \"configmaps\""));
  EXPECT_THAT(denied.message(), HasSubstr(StrCat("GET /api/v1/namespaces/", ns_, "/configmaps")));
  EXPECT_FALSE(IsRetryable(denied));

  // A bad token is 401.
  std::unique_ptr<RestClient> stranger = NewClient("not-a-token");
  const absl::Status unauthorized = stranger->List(ConfigMaps(), ns_).status();
  EXPECT_TRUE(IsUnauthorized(unauthorized)) << unauthorized;
  EXPECT_EQ(unauthorized.code(), absl::StatusCode::kUnauthenticated);
}

// A token source that hands out a stale token until invalidated: the client must retry a 401
// once with a fresh token (a rotated service-account token).
class RotatingToken : public TokenSource {
 public:
  RotatingToken(std::string stale, std::string fresh)
      : stale_(std::move(stale)), fresh_(std::move(fresh)) {}
  absl::StatusOr<std::string> Token() override { return invalidated_ ? fresh_ : stale_; }
  void Invalidate() override {
    invalidated_ = true;
    ++invalidations_;
  }
  std::atomic<int> invalidations_{0};

 private:
  const std::string stale_;
  const std::string fresh_;
  std::atomic<bool> invalidated_{false};
};

TEST_F(RestClientTest, A401AsksTheTokenSourceAgainOnce) {
  auto token = std::make_shared<RotatingToken>("expired-token", plane_->admin_token());
  RestConfig config = ConfigFor("");
  config.token = token;
  absl::StatusOr<std::unique_ptr<RestClient>> client = RestClient::Create(config, &clock_);
  ASSERT_TRUE(client.ok());
  absl::StatusOr<ObjectList> list = (*client)->List(ConfigMaps(), ns_);
  EXPECT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(token->invalidations_, 1);
  EXPECT_EQ((*client)->requests(), 1);
}

// A token file that the kubelet rotates: the client picks up the new token after a 401.
TEST_F(RestClientTest, ARotatedTokenFileIsReadAgain) {
  const std::string path = plane_->dir() + "/rotating-token";
  testing::WriteFileOrDie(path, "stale-token\n");
  SimulatedClock token_clock;
  RestConfig config = ConfigFor("");
  config.token = FileToken(path, &token_clock);
  absl::StatusOr<std::unique_ptr<RestClient>> client = RestClient::Create(config, &clock_);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(IsUnauthorized((*client)->List(ConfigMaps(), ns_).status()));
  // The rotation: a new file moved into place, as the kubelet's atomic writer does.
  testing::WriteFileOrDie(path + ".new", plane_->admin_token() + "\n");
  ASSERT_EQ(std::rename((path + ".new").c_str(), path.c_str()), 0);
  absl::StatusOr<ObjectList> list = (*client)->List(ConfigMaps(), ns_);
  EXPECT_TRUE(list.ok()) << list.status();
}

TEST_F(RestClientTest, BadConfigsFailAtCreate) {
  RestConfig no_server = ConfigFor("x");
  no_server.server.clear();
  EXPECT_EQ(RestClient::Create(no_server, &clock_).status().code(),
            absl::StatusCode::kInvalidArgument);
  RestConfig bad_url = ConfigFor("x");
  bad_url.server = "ftp://example";
  EXPECT_THAT(RestClient::Create(bad_url, &clock_).status().message(), HasSubstr("ftp://example"));
  RestConfig bad_ca = ConfigFor("x");
  bad_ca.ca_pem = "not a certificate";
  EXPECT_THAT(RestClient::Create(bad_ca, &clock_).status().message(),
              HasSubstr("no PEM certificate"));
  RestConfig cert_without_key = ConfigFor("x");
  cert_without_key.client_cert_pem = testing::ReadFileOrDie(plane_->ca_file());
  EXPECT_EQ(RestClient::Create(cert_without_key, &clock_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RestClientTest, AnUntrustedServerCertificateIsRefusedUnlessVerificationIsOff) {
  RestConfig untrusted = ConfigFor(plane_->admin_token());
  untrusted.ca_pem.clear();  // system roots only: the test CA is not among them
  absl::StatusOr<std::unique_ptr<RestClient>> client = RestClient::Create(untrusted, &clock_);
  ASSERT_TRUE(client.ok());
  const absl::Status refused = (*client)->List(ConfigMaps(), ns_).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_TRUE(IsRetryable(refused));

  untrusted.insecure_skip_tls_verify = true;
  client = RestClient::Create(untrusted, &clock_);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->List(ConfigMaps(), ns_).ok());
}

TEST_F(RestClientTest, UnreachableServerIsUnavailable) {
  RestConfig config = ConfigFor("x");
  config.server = "https://127.0.0.1:1";  // nothing listens on port 1
  absl::StatusOr<std::unique_ptr<RestClient>> client = RestClient::Create(config, &clock_);
  ASSERT_TRUE(client.ok());
  const absl::Status status = (*client)->Get(ConfigMaps(), ns_, "x").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("127.0.0.1:1"));
  EXPECT_TRUE(IsRetryable(status));
}

// OpenSSL keeps errors in a per-thread queue, and SSL_get_error reads it: a stale error there
// (reading a PEM bundle ends with one) once turned a watch's "no data yet" into "the connection
// broke", now and then, depending on whether the next event had arrived.
TEST_F(RestClientTest, AnOpenSslErrorLeftOnTheThreadDoesNotBreakAWatch) {
  absl::StatusOr<ObjectList> start = admin_->List(ConfigMaps(), ns_);
  ASSERT_TRUE(start.ok());
  ListOptions options;
  options.resource_version = start->resource_version;
  options.timeout_seconds = 60;
  absl::StatusOr<std::unique_ptr<WatchStream>> watch = admin_->Watch(ConfigMaps(), ns_, options);
  ASSERT_TRUE(watch.ok()) << watch.status();
  std::thread creator([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(admin_->Create(ConfigMaps(), ns_, ConfigMap("late", "1")).ok());
  });
  // A failed PEM read leaves "no start line" in this thread's queue.
  const std::string not_pem = "not a certificate";
  BIO* bio = BIO_new_mem_buf(not_pem.data(), static_cast<int>(not_pem.size()));
  EXPECT_EQ(PEM_read_bio_X509(bio, nullptr, nullptr, nullptr), nullptr);
  BIO_free(bio);
  ASSERT_NE(ERR_peek_error(), 0u) << "the queue holds an error";
  // Next() finds no data at first (the object comes 200 ms later): SSL_read wants to read.
  absl::StatusOr<std::optional<WatchEvent>> event = (*watch)->Next();
  creator.join();
  ASSERT_TRUE(event.ok()) << event.status();
  ASSERT_TRUE(event->has_value());
  EXPECT_EQ((*event)->type, WatchEvent::Type::kAdded);
  (*watch)->Cancel();
}

TEST_F(RestClientTest, WatchSeesChangesInOrderAndCancels) {
  absl::StatusOr<ObjectList> start = admin_->List(ConfigMaps(), ns_);
  ASSERT_TRUE(start.ok());
  ListOptions options;
  options.resource_version = start->resource_version;
  options.allow_watch_bookmarks = true;
  options.timeout_seconds = 60;
  absl::StatusOr<std::unique_ptr<WatchStream>> watch = admin_->Watch(ConfigMaps(), ns_, options);
  ASSERT_TRUE(watch.ok()) << watch.status();

  ASSERT_TRUE(admin_->Create(ConfigMaps(), ns_, ConfigMap("w", "1")).ok());
  ASSERT_TRUE(admin_
                  ->Patch(ConfigMaps(), ns_, "w", PatchType::kMerge,
                          web::json::value::parse(R"({"data":{"v":"2"}})"))
                  .ok());
  ASSERT_TRUE(admin_->Delete(ConfigMaps(), ns_, "w").ok());

  std::vector<std::string> seen;
  while (seen.size() < 3) {
    absl::StatusOr<std::optional<WatchEvent>> event = (*watch)->Next();
    ASSERT_TRUE(event.ok()) << event.status();
    ASSERT_TRUE(event->has_value()) << "the watch ended early";
    if ((*event)->type == WatchEvent::Type::kBookmark) continue;
    seen.push_back(StrCat(WatchEventTypeName((*event)->type), " ",
                          (*event)->object.at("data").at("v").as_string()));
  }
  EXPECT_THAT(seen, ::testing::ElementsAre("ADDED 1", "MODIFIED 2", "DELETED 2"));

  // Cancel from another thread ends a blocked Next().
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (*watch)->Cancel();
  });
  const absl::StatusOr<std::optional<WatchEvent>> after_cancel = (*watch)->Next();
  canceller.join();
  EXPECT_FALSE(after_cancel.ok() && after_cancel->has_value());
}

TEST_F(RestClientTest, WatchEndsCleanlyAtItsTimeout) {
  ListOptions options;
  options.timeout_seconds = 1;
  absl::StatusOr<std::unique_ptr<WatchStream>> watch = admin_->Watch(ConfigMaps(), ns_, options);
  ASSERT_TRUE(watch.ok()) << watch.status();
  while (true) {
    absl::StatusOr<std::optional<WatchEvent>> event = (*watch)->Next();
    ASSERT_TRUE(event.ok()) << event.status();
    if (!event->has_value()) break;  // the clean end
  }
}

TEST_F(RestClientTest, StatusSubresourceOfACustomResource) {
  // A CRD with a status subresource: writes to the main resource ignore status, writes to
  // /status ignore the spec.
  const std::string group = "test.clusterprof.dev";
  web::json::value crd = web::json::value::parse(R"({
    "metadata": {"name": "gadgets.test.clusterprof.dev"},
    "spec": {"group": "test.clusterprof.dev", "scope": "Namespaced",
      "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
      "versions": [{"name": "v1", "served": true, "storage": true,
        "subresources": {"status": {}},
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {
          "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
          "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}}}}]}})");
  absl::StatusOr<web::json::value> created_crd =
      admin_->Create(CustomResourceDefinitions(), "", crd);
  ASSERT_TRUE(created_crd.ok() || absl::IsAlreadyExists(created_crd.status()))
      << created_crd.status();
  const ResourceType gadgets{group, "v1", "gadgets", "Gadget", true};

  web::json::value gadget = web::json::value::parse(
      R"({"metadata":{"name":"g"},"spec":{"size":3},"status":{"phase":"Ignored"}})");
  absl::StatusOr<web::json::value> created = absl::UnavailableError("not yet");
  // The CRD's endpoint appears shortly after the CRD is created.
  ASSERT_TRUE(Eventually([&] {
    created = admin_->Create(gadgets, ns_, gadget);
    return !absl::IsNotFound(created.status());
  }));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_FALSE(created->has_field("status") && created->at("status").has_field("phase"));

  web::json::value with_status = *created;
  with_status["status"]["phase"] = web::json::value("Running");
  with_status["spec"]["size"] = web::json::value(99);
  absl::StatusOr<web::json::value> updated = admin_->UpdateStatus(gadgets, ns_, with_status);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(updated->at("status").at("phase").as_string(), "Running");
  EXPECT_EQ(updated->at("spec").at("size").as_integer(), 3);

  absl::StatusOr<web::json::value> patched =
      admin_->Patch(gadgets, ns_, "g", PatchType::kMerge,
                    web::json::value::parse(R"({"status":{"phase":"Done"}})"), "status");
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ(patched->at("status").at("phase").as_string(), "Done");
  absl::StatusOr<web::json::value> status = admin_->Get(gadgets, ns_, "g", "status");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->at("status").at("phase").as_string(), "Done");
}

TEST_F(RestClientTest, RateLimitSpacesRequestsAfterTheBurst) {
  SimulatedClock simulated;
  RestClientOptions options;
  options.qps = 10;
  options.burst = 2;
  absl::StatusOr<std::unique_ptr<RestClient>> client =
      RestClient::Create(ConfigFor(plane_->admin_token()), &simulated, options);
  ASSERT_TRUE(client.ok());
  // The burst goes at once.
  ASSERT_TRUE((*client)->Get(Namespaces(), "", ns_).ok());
  ASSERT_TRUE((*client)->Get(Namespaces(), "", ns_).ok());
  EXPECT_EQ((*client)->throttled_ns(), 0);
  // The third waits for the simulated clock: 100 ms at 10 QPS.
  std::atomic<bool> done{false};
  std::thread third([&] {
    EXPECT_TRUE((*client)->Get(Namespaces(), "", ns_).ok());
    done = true;
  });
  simulated.WaitForSleepers(1);
  EXPECT_FALSE(done);
  simulated.AdvanceNs(100 * kNanosPerMilli);
  third.join();
  EXPECT_TRUE(done);
  EXPECT_EQ((*client)->throttled_ns(), 100 * kNanosPerMilli);
}

TEST_F(RestClientTest, RawReachesOtherEndpoints) {
  absl::StatusOr<RestResponse> version = admin_->Raw("GET", "/version");
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(version->http_code, 200);
  EXPECT_THAT(version->body, HasSubstr("gitVersion"));
}

}  // namespace
}  // namespace clusterprof::kube
