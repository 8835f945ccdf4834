// The informer's cache and the decoders that fill it.
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/api_error.h"
#include "operator/kube/informer.h"
#include "operator/kube/object.h"

namespace clusterprof::kube {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

ObjectPtr Make(const std::string& ns, const std::string& name, const std::string& rv,
               StringMap labels = {}) {
  auto object = std::make_shared<Object>();
  object->metadata.namespace_ = ns;
  object->metadata.name = name;
  object->metadata.resource_version = rv;
  std::sort(labels.begin(), labels.end());
  object->metadata.labels = std::move(labels);
  return object;
}

std::vector<std::string> Names(const std::vector<ObjectPtr>& objects) {
  std::vector<std::string> names;
  for (const ObjectPtr& o : objects) names.push_back(o->metadata.Key());
  return names;
}

TEST(ObjectStoreTest, IndexesByNamespaceAndLabelFollowUpdates) {
  ObjectStore store;
  EXPECT_EQ(store.Upsert(Make("a", "x", "1", {{"app", "t"}})).kind,
            ObjectStore::Change::Kind::kAdd);
  store.Upsert(Make("a", "y", "1", {{"app", "u"}}));
  store.Upsert(Make("b", "x", "1", {{"app", "t"}}));
  absl::StatusOr<LabelSelector> t = LabelSelector::Parse("app=t");
  EXPECT_THAT(Names(store.List("", &*t)), UnorderedElementsAre("a/x", "b/x"));
  EXPECT_THAT(Names(store.List("a", &*t)), UnorderedElementsAre("a/x"));
  EXPECT_THAT(Names(store.List("a")), UnorderedElementsAre("a/x", "a/y"));

  // Relabelling moves the object between label index entries.
  ObjectStore::Change change = store.Upsert(Make("a", "x", "2", {{"app", "u"}}));
  EXPECT_EQ(change.kind, ObjectStore::Change::Kind::kUpdate);
  EXPECT_EQ(change.old_object->metadata.resource_version, "1");
  EXPECT_THAT(Names(store.List("", &*t)), UnorderedElementsAre("b/x"));
  absl::StatusOr<LabelSelector> u = LabelSelector::Parse("app in (u)");
  EXPECT_THAT(Names(store.List("", &*u)), UnorderedElementsAre("a/x", "a/y"));

  EXPECT_NE(store.Remove(Make("b", "x", "3")).old_object, nullptr);
  EXPECT_EQ(store.Remove(Make("b", "x", "3")).old_object, nullptr);
  EXPECT_TRUE(store.List("b").empty());
  EXPECT_TRUE(store.List("", &*t).empty());
  EXPECT_EQ(store.size(), 2u);
}

TEST(ObjectStoreTest, ReplaceReportsExactlyTheDifferences) {
  ObjectStore store;
  store.Upsert(Make("n", "kept", "1"));
  store.Upsert(Make("n", "changed", "1"));
  store.Upsert(Make("n", "gone", "1"));
  const ObjectPtr kept = store.Get("n/kept");
  std::vector<ObjectStore::Change> changes =
      store.Replace({Make("n", "kept", "1"), Make("n", "changed", "2"), Make("n", "new", "3")});
  std::vector<std::string> seen;
  for (const ObjectStore::Change& c : changes) {
    switch (c.kind) {
      case ObjectStore::Change::Kind::kAdd:
        seen.push_back("add " + c.new_object->metadata.name);
        break;
      case ObjectStore::Change::Kind::kUpdate:
        seen.push_back("update " + c.new_object->metadata.name);
        break;
      case ObjectStore::Change::Kind::kDelete:
        seen.push_back("delete " + c.old_object->metadata.name);
        break;
    }
  }
  EXPECT_THAT(seen, UnorderedElementsAre("add new", "update changed", "delete gone"));
  EXPECT_EQ(seen[0], "delete gone") << "deletions come first";
  // The unchanged object is the same instance: readers holding it see no churn.
  EXPECT_EQ(store.Get("n/kept"), kept);
  EXPECT_EQ(store.size(), 3u);
}

TEST(ObjectDecodeTest, MetadataAndManagedFields) {
  web::json::value json = web::json::value::parse(R"({
    "metadata": {"name": "a", "namespace": "n", "uid": "u-1", "resourceVersion": "7",
      "generation": 3, "labels": {"b": "2", "a": "1"},
      "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "u-0",
                           "controller": true}],
      "managedFields": [{"manager": "kubectl"}]},
    "spec": {"k": 1}})");
  absl::StatusOr<std::shared_ptr<Object>> decoded = JsonDecoder()(json);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const ObjectMeta& meta = (*decoded)->metadata;
  EXPECT_EQ(meta.Key(), "n/a");
  EXPECT_EQ(meta.generation, 3);
  ASSERT_EQ(meta.labels.size(), 2u);
  EXPECT_EQ(meta.labels[0].first, "a") << "labels are sorted";
  EXPECT_EQ(*FindValue(meta.labels, "b"), "2");
  EXPECT_EQ(FindValue(meta.labels, "c"), nullptr);
  ASSERT_EQ(meta.owner_references.size(), 1u);
  EXPECT_TRUE(meta.owner_references[0].controller);
  const auto& cached = static_cast<const JsonObject&>(**decoded);
  EXPECT_FALSE(cached.json.at("metadata").has_field("managedFields"));
  EXPECT_EQ(cached.json.at("spec").at("k").as_integer(), 1);
}

TEST(ObjectDecodeTest, BadMetadataIsAnErrorNamingTheField) {
  web::json::value no_name = web::json::value::parse(R"({"metadata": {"namespace": "n"}})");
  EXPECT_THAT(JsonDecoder()(no_name).status().message(), HasSubstr("metadata.name"));
  web::json::value bad_labels =
      web::json::value::parse(R"({"metadata": {"name": "a", "labels": {"x": 1}}})");
  EXPECT_THAT(JsonDecoder()(bad_labels).status().message(), HasSubstr("metadata.labels.x"));
  web::json::value bad_phase =
      web::json::value::parse(R"({"metadata": {"name": "a"}, "status": {"phase": 3}})");
  EXPECT_THAT(PodDecoder()(bad_phase).status().message(), HasSubstr("status.phase"));
}

TEST(ObjectDecodeTest, PodWaitingContainersSayWhy) {
  web::json::value json = web::json::value::parse(R"({
    "metadata": {"name": "p"},
    "status": {"phase": "Pending",
      "initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 0}}}],
      "containerStatuses": [
        {"name": "trainer", "state": {"waiting": {"reason": "ErrImageNeverPull",
          "message": "Container image \"w:none\" is not present with pull policy of Never"}}},
        {"name": "starting", "state": {"waiting": {"reason": "ContainerCreating"}}},
        {"name": "looping", "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
        {"name": "up", "state": {"running": {}}}]}})");
  absl::StatusOr<std::shared_ptr<Object>> decoded = PodDecoder()(json);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const auto* pod = dynamic_cast<const Pod*>(decoded->get());
  ASSERT_NE(pod, nullptr);
  EXPECT_THAT(pod->waiting,
              ElementsAre("container trainer: ErrImageNeverPull: Container image \"w:none\" is "
                          "not present with pull policy of Never",
                          "container looping: CrashLoopBackOff"));
}

TEST(ApiErrorTest, StatusBodiesBecomeStatusesWithReasonAndCode) {
  const absl::Status conflict = ApiErrorFromResponse(
      409,
      R"({"kind":"Status","status":"Failure","message":"the object has been modified","reason":"Conflict","code":409})",
      "", "PUT /x");
  EXPECT_TRUE(IsConflict(conflict));
  EXPECT_EQ(conflict.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(conflict.message(), "PUT /x: 409 Conflict: the object has been modified");

  const absl::Status exists = ApiErrorFromResponse(
      409, R"({"kind":"Status","reason":"AlreadyExists","message":"exists"})", "", "POST /x");
  EXPECT_TRUE(absl::IsAlreadyExists(exists));
  EXPECT_FALSE(IsConflict(exists));

  const absl::Status throttled = ApiErrorFromResponse(
      429, R"({"kind":"Status","reason":"TooManyRequests","details":{"retryAfterSeconds":2}})", "",
      "GET /y");
  EXPECT_TRUE(IsTooManyRequests(throttled));
  EXPECT_EQ(GetApiErrorInfo(throttled)->retry_after_s, 2);
  EXPECT_TRUE(IsRetryable(throttled));
  // The header wins over the body.
  EXPECT_EQ(GetApiErrorInfo(ApiErrorFromResponse(429, "{}", " 7 ", "GET /y"))->retry_after_s, 7);

  // A proxy's HTML error page: the reason comes from the code, the message from the body.
  const absl::Status bad_gateway =
      ApiErrorFromResponse(502, "<html>Bad Gateway</html>", "", "GET /z");
  EXPECT_EQ(bad_gateway.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(bad_gateway.message(), HasSubstr("Bad Gateway"));
  EXPECT_TRUE(IsRetryable(bad_gateway));
  EXPECT_TRUE(IsGone(ApiErrorFromResponse(410, R"({"kind":"Status","reason":"Expired"})", "", "")));
  EXPECT_FALSE(GetApiErrorInfo(absl::NotFoundError("plain")).has_value());
  EXPECT_TRUE(IsRetryable(absl::UnavailableError("connection refused")));
  EXPECT_FALSE(IsRetryable(absl::InvalidArgumentError("bad")));
}

TEST(ApiErrorTest, StatusBodiesRoundTripThroughTheClientsParser) {
  EXPECT_EQ(StatusReasonFor(404), "NotFound");
  EXPECT_EQ(StatusReasonFor(410), "Expired");
  EXPECT_EQ(StatusReasonFor(502), "InternalError");
  const std::string body = StatusBody(429, "", "slow down \"now\"", 3);
  const absl::Status status = ApiErrorFromResponse(429, body, "", "GET /x");
  const std::optional<ApiErrorInfo> info = GetApiErrorInfo(status);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->reason, "TooManyRequests");
  EXPECT_EQ(info->retry_after_s, 3);
  EXPECT_THAT(status.message(), HasSubstr("slow down \"now\""));
  EXPECT_TRUE(IsConflict(ApiErrorFromResponse(409, StatusBody(409, "", "stale"), "", "PUT /y")));
  EXPECT_TRUE(absl::IsAlreadyExists(
      ApiErrorFromResponse(409, StatusBody(409, "AlreadyExists", "exists"), "", "POST /y")));
}

}  // namespace
}  // namespace clusterprof::kube
