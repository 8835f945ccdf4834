// The fake API keeps the rules a controller depends on; each test here is one of them.
#include "tests/support/fake_api_client.h"

#include <thread>

#include "common/base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/api_error.h"

namespace clusterprof::testing {
namespace {

using web::json::value;

value Parse(const char* json) { return value::parse(json); }

value Pod(const char* name, const char* labels = "{}") {
  value pod = Parse(R"({"metadata": {}, "spec": {"containers": []}})");
  pod["metadata"]["name"] = value::string(name);
  pod["metadata"]["labels"] = value::parse(labels);
  return pod;
}

std::string Rv(const value& object) {
  return object.at("metadata").at("resourceVersion").as_string();
}

class FakeApiClientTest : public ::testing::Test {
 protected:
  SimulatedClock clock_;
  FakeApiClient api_{&clock_};
};

TEST_F(FakeApiClientTest, CreateStampsWhatTheServerOwnsAndDropsStatus) {
  value pod = Pod("a");
  pod["status"] = Parse(R"({"phase": "Running"})");
  absl::StatusOr<value> created = api_.Create(kube::Pods(), "ns", pod);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->at("metadata").at("namespace").as_string(), "ns");
  EXPECT_FALSE(created->at("metadata").at("uid").as_string().empty());
  EXPECT_EQ(created->at("metadata").at("creationTimestamp").as_string(), "2026-01-01T00:00:00Z");
  EXPECT_EQ(created->at("apiVersion").as_string(), "v1");
  EXPECT_FALSE(created->has_field("status")) << "status is written through /status";
  EXPECT_TRUE(absl::IsAlreadyExists(api_.Create(kube::Pods(), "ns", pod).status()));
}

TEST_F(FakeApiClientTest, AStaleResourceVersionIsAConflict) {
  value created = *api_.Create(kube::Pods(), "ns", Pod("a"));
  value first = created;
  first["metadata"]["labels"]["x"] = value::string("1");
  absl::StatusOr<value> updated = api_.Update(kube::Pods(), "ns", first);
  ASSERT_TRUE(updated.ok());
  EXPECT_NE(Rv(*updated), Rv(created));
  value stale = created;
  stale["metadata"]["labels"]["x"] = value::string("2");
  const absl::Status conflict = api_.Update(kube::Pods(), "ns", stale).status();
  EXPECT_TRUE(kube::IsConflict(conflict)) << conflict;
}

TEST_F(FakeApiClientTest, TheStatusSubresourceAndTheObjectAreWrittenApart) {
  value created = *api_.Create(kube::Pods(), "ns", Pod("a"));
  value with_status = created;
  with_status["status"] = Parse(R"({"phase": "Running"})");
  with_status["spec"]["nodeName"] = value::string("ignored");
  value written = *api_.UpdateStatus(kube::Pods(), "ns", with_status);
  EXPECT_EQ(written.at("status").at("phase").as_string(), "Running");
  EXPECT_FALSE(written.at("spec").has_field("nodeName")) << "a status write changes only status";
  EXPECT_EQ(written.at("metadata").at("generation").as_integer(), 1);

  value spec_change = written;
  spec_change["spec"]["nodeName"] = value::string("node-1");
  spec_change.erase("status");
  value after = *api_.Update(kube::Pods(), "ns", spec_change);
  EXPECT_EQ(after.at("status").at("phase").as_string(), "Running") << "kept by a main write";
  EXPECT_EQ(after.at("metadata").at("generation").as_integer(), 2) << "the spec changed";
}

TEST_F(FakeApiClientTest, JsonPatchTestsGuardTheWrite) {
  value created = *api_.Create(kube::Pods(), "ns", Pod("a"));
  value status = created;
  status["status"] = Parse(R"({"phase": "Pending"})");
  ASSERT_TRUE(api_.UpdateStatus(kube::Pods(), "ns", status).ok());
  const value patch = Parse(R"([{"op": "test", "path": "/status/phase", "value": "Pending"},
                                {"op": "replace", "path": "/status/phase", "value": "Running"},
                                {"op": "add", "path": "/status/attempt", "value": 2}])");
  absl::StatusOr<value> patched =
      api_.Patch(kube::Pods(), "ns", "a", kube::PatchType::kJson, patch, "status");
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ(patched->at("status").at("phase").as_string(), "Running");
  EXPECT_EQ(patched->at("status").at("attempt").as_integer(), 2);
  const absl::Status refused =
      api_.Patch(kube::Pods(), "ns", "a", kube::PatchType::kJson, patch, "status").status();
  EXPECT_TRUE(kube::IsInvalid(refused)) << refused;
  EXPECT_EQ(api_.Peek(kube::Pods(), "ns", "a")->at("status").at("phase").as_string(), "Running");
}

TEST_F(FakeApiClientTest, MergePatchRemovesNullsAndMergesObjects) {
  ASSERT_TRUE(api_.Create(kube::Pods(), "ns", Pod("a", R"({"x": "1", "y": "2"})")).ok());
  absl::StatusOr<value> patched = api_.Patch(kube::Pods(), "ns", "a", kube::PatchType::kMerge,
                                             Parse(R"({"metadata": {"labels": {"x": null,
                                                                               "z": "3"}}})"));
  ASSERT_TRUE(patched.ok()) << patched.status();
  const value& labels = patched->at("metadata").at("labels");
  EXPECT_FALSE(labels.has_field("x"));
  EXPECT_EQ(labels.at("y").as_string(), "2");
  EXPECT_EQ(labels.at("z").as_string(), "3");
}

TEST_F(FakeApiClientTest, ListsSelectAndPage) {
  for (const char* name : {"a", "b", "c"}) {
    ASSERT_TRUE(api_.Create(kube::Pods(), "ns", Pod(name, R"({"app": "train"})")).ok());
  }
  ASSERT_TRUE(api_.Create(kube::Pods(), "ns", Pod("d", R"({"app": "serve"})")).ok());
  ASSERT_TRUE(api_.Create(kube::Pods(), "other", Pod("e", R"({"app": "train"})")).ok());
  kube::ListOptions options;
  options.label_selector = "app=train";
  EXPECT_EQ(api_.List(kube::Pods(), "ns", options)->items.size(), 3u);
  EXPECT_EQ(api_.List(kube::Pods(), "", options)->items.size(), 4u) << "every namespace";
  options.limit = 2;
  absl::StatusOr<kube::ObjectList> page = api_.List(kube::Pods(), "ns", options);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->items.size(), 2u);
  EXPECT_FALSE(page->continue_token.empty());
  EXPECT_EQ(api_.ListAll(kube::Pods(), "ns", options)->items.size(), 3u);
}

TEST_F(FakeApiClientTest, WatchesReplayFromAResourceVersionUntilCompacted) {
  value a = *api_.Create(kube::Pods(), "ns", Pod("a"));
  const std::string since = Rv(a);
  ASSERT_TRUE(api_.Create(kube::Pods(), "ns", Pod("b")).ok());
  ASSERT_TRUE(api_.Delete(kube::Pods(), "ns", "a").ok());
  kube::ListOptions options;
  options.resource_version = since;
  {
    std::unique_ptr<kube::WatchStream> watch = *api_.Watch(kube::Pods(), "ns", options);
    absl::StatusOr<std::optional<kube::WatchEvent>> first = watch->Next();
    ASSERT_TRUE(first.ok() && first->has_value());
    EXPECT_EQ((*first)->type, kube::WatchEvent::Type::kAdded);
    EXPECT_EQ((*first)->object.at("metadata").at("name").as_string(), "b");
    EXPECT_EQ((*watch->Next())->type, kube::WatchEvent::Type::kDeleted);
    // Live events follow; a server timeout ends the stream cleanly.
    ASSERT_TRUE(api_.Create(kube::Pods(), "ns", Pod("c")).ok());
    EXPECT_EQ((*watch->Next())->object.at("metadata").at("name").as_string(), "c");
    api_.EndWatches();
    absl::StatusOr<std::optional<kube::WatchEvent>> end = watch->Next();
    ASSERT_TRUE(end.ok());
    EXPECT_FALSE(end->has_value());
  }
  api_.Compact();
  std::unique_ptr<kube::WatchStream> expired = *api_.Watch(kube::Pods(), "ns", options);
  absl::StatusOr<std::optional<kube::WatchEvent>> error = expired->Next();
  ASSERT_TRUE(error.ok() && error->has_value());
  EXPECT_EQ((*error)->type, kube::WatchEvent::Type::kError);
  EXPECT_EQ((*error)->object.at("code").as_integer(), 410);
}

TEST_F(FakeApiClientTest, CancelEndsABlockedNext) {
  std::unique_ptr<kube::WatchStream> watch = *api_.Watch(kube::Pods(), "ns", {});
  std::thread canceller([&] { watch->Cancel(); });
  absl::StatusOr<std::optional<kube::WatchEvent>> next = watch->Next();
  canceller.join();
  EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(FakeApiClientTest, ReactorsInjectErrorsAndActionsAreRecorded) {
  api_.FailNext("create", "pods", 503, 2);
  EXPECT_TRUE(kube::IsRetryable(api_.Create(kube::Pods(), "ns", Pod("a")).status()));
  EXPECT_TRUE(kube::IsRetryable(api_.Create(kube::Pods(), "ns", Pod("a")).status()));
  EXPECT_TRUE(api_.Create(kube::Pods(), "ns", Pod("a")).ok());
  EXPECT_EQ(api_.CountActions("create", "pods"), 3);
  EXPECT_TRUE(absl::IsNotFound(api_.Get(kube::Pods(), "ns", "missing").status()));
  EXPECT_EQ(api_.Actions().back().verb, "get");
}

TEST_F(FakeApiClientTest, GenerateNameAndDeletePreconditions) {
  value pod = Pod("");
  pod["metadata"].erase("name");
  pod["metadata"]["generateName"] = value::string("job-");
  value created = *api_.Create(kube::Pods(), "ns", pod);
  const std::string name = created.at("metadata").at("name").as_string();
  EXPECT_THAT(name, ::testing::StartsWith("job-"));
  kube::DeleteOptions wrong;
  wrong.uid = "someone-else";
  EXPECT_TRUE(kube::IsConflict(api_.Delete(kube::Pods(), "ns", name, wrong)));
  EXPECT_TRUE(api_.Delete(kube::Pods(), "ns", name).ok());
  EXPECT_TRUE(absl::IsNotFound(api_.Delete(kube::Pods(), "ns", name)));
}

}  // namespace
}  // namespace clusterprof::testing
