// The event recorder against a real kube-apiserver: the fields of a written Event, counting
// identical events on one Event, combining similar ones, namespaces, draining at destruction,
// and dropping (counted) when the queue is full or the writes are refused.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/event_recorder.h"
#include "operator/kube/rest_client.h"
#include "tests/operator/kube/kube_fixture.h"

namespace clusterprof::kube {
namespace {

using ::testing::MatchesRegex;

constexpr char kComponent[] = "clusterprof-operator";
constexpr char kHost[] = "node-1";

class EventRecorderTest : public KubeFixture {
 protected:
  // A ConfigMap in `ns` to record events about, as a reference with its uid.
  ObjectReference NewObject(const std::string& ns, const std::string& name) {
    absl::StatusOr<web::json::value> created = admin_->Create(ConfigMaps(), ns, ConfigMap(name));
    EXPECT_TRUE(created.ok()) << created.status();
    ObjectReference object;
    object.api_version = "v1";
    object.kind = "ConfigMap";
    object.namespace_ = ns;
    object.name = name;
    if (created.ok()) {
      object.uid = created->at("metadata").at("uid").as_string();
      object.resource_version = created->at("metadata").at("resourceVersion").as_string();
    }
    return object;
  }

  std::vector<web::json::value> EventsIn(const std::string& ns) {
    absl::StatusOr<ObjectList> list = admin_->List(Events(), ns);
    EXPECT_TRUE(list.ok()) << list.status();
    return list.ok() ? list->items : std::vector<web::json::value>{};
  }

  std::unique_ptr<EventRecorder> NewRecorder(RestClient* client,
                                             EventRecorderOptions options = {}) {
    return std::make_unique<EventRecorder>(client, &clock_, kComponent, kHost, options);
  }
};

std::string Message(const web::json::value& event) { return event.at("message").as_string(); }
int Count(const web::json::value& event) { return event.at("count").as_integer(); }

TEST_F(EventRecorderTest, AnEventLandsWithItsFields) {
  const ObjectReference object = NewObject(ns_, "profile-a");
  std::unique_ptr<EventRecorder> recorder = NewRecorder(admin_.get());
  recorder->Event(object, kEventTypeNormal, "CaptureStarted", "capture 1 started on 3 pods");
  ASSERT_TRUE(recorder->Flush());
  EXPECT_EQ(recorder->written(), 1);
  EXPECT_EQ(recorder->failed(), 0);
  EXPECT_EQ(recorder->pending(), 0u);

  std::vector<web::json::value> events = EventsIn(ns_);
  ASSERT_EQ(events.size(), 1u);
  const web::json::value& event = events[0];
  EXPECT_THAT(event.at("metadata").at("name").as_string(), MatchesRegex("profile-a\\.[0-9a-f]+"));
  const web::json::value& involved = event.at("involvedObject");
  EXPECT_EQ(involved.at("apiVersion").as_string(), "v1");
  EXPECT_EQ(involved.at("kind").as_string(), "ConfigMap");
  EXPECT_EQ(involved.at("namespace").as_string(), ns_);
  EXPECT_EQ(involved.at("name").as_string(), "profile-a");
  EXPECT_EQ(involved.at("uid").as_string(), object.uid);
  EXPECT_EQ(involved.at("resourceVersion").as_string(), object.resource_version);
  EXPECT_EQ(event.at("type").as_string(), "Normal");
  EXPECT_EQ(event.at("reason").as_string(), "CaptureStarted");
  EXPECT_EQ(Message(event), "capture 1 started on 3 pods");
  EXPECT_EQ(Count(event), 1);
  EXPECT_EQ(event.at("source").at("component").as_string(), kComponent);
  EXPECT_EQ(event.at("source").at("host").as_string(), kHost);
  EXPECT_EQ(event.at("reportingComponent").as_string(), kComponent);
  EXPECT_EQ(event.at("reportingInstance").as_string(), kHost);
  const std::string first = event.at("firstTimestamp").as_string();
  EXPECT_THAT(first, MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z"));
  EXPECT_EQ(event.at("lastTimestamp").as_string(), first);
}

TEST_F(EventRecorderTest, AnIdenticalEventIsCountedOnTheSameEvent) {
  const ObjectReference object = NewObject(ns_, "profile-b");
  std::unique_ptr<EventRecorder> recorder = NewRecorder(admin_.get());
  for (int i = 0; i < 3; ++i) {
    recorder->Event(object, kEventTypeWarning, "SidecarUnreachable", "pod p-0 did not answer");
  }
  // The same message with another reason is another Event.
  recorder->Event(object, kEventTypeWarning, "CaptureFailed", "pod p-0 did not answer");
  ASSERT_TRUE(recorder->Flush());
  EXPECT_EQ(recorder->written(), 4);

  std::vector<web::json::value> events = EventsIn(ns_);
  ASSERT_EQ(events.size(), 2u);
  std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
    return a.at("reason").as_string() < b.at("reason").as_string();
  });
  EXPECT_EQ(events[0].at("reason").as_string(), "CaptureFailed");
  EXPECT_EQ(Count(events[0]), 1);
  EXPECT_EQ(events[1].at("reason").as_string(), "SidecarUnreachable");
  EXPECT_EQ(Count(events[1]), 3);
  EXPECT_EQ(Message(events[1]), "pod p-0 did not answer");
  EXPECT_LE(events[1].at("firstTimestamp").as_string(), events[1].at("lastTimestamp").as_string());
}

TEST_F(EventRecorderTest, ManySimilarEventsAreCombined) {
  const ObjectReference object = NewObject(ns_, "profile-c");
  std::unique_ptr<EventRecorder> recorder = NewRecorder(admin_.get());
  for (int i = 1; i <= 12; ++i) {
    recorder->Event(object, kEventTypeWarning, "SidecarUnreachable",
                    StrCat("pod p-", i, " did not answer"));
  }
  // A message seen before keeps its own Event.
  recorder->Event(object, kEventTypeWarning, "SidecarUnreachable", "pod p-1 did not answer");
  ASSERT_TRUE(recorder->Flush());
  EXPECT_EQ(recorder->failed(), 0);

  std::vector<web::json::value> events = EventsIn(ns_);
  std::vector<web::json::value> combined;
  int plain = 0;
  for (const web::json::value& event : events) {
    if (StartsWith(Message(event), "(combined from similar events): ")) {
      combined.push_back(event);
    } else {
      ++plain;
      EXPECT_EQ(Count(event), Message(event) == "pod p-1 did not answer" ? 2 : 1) << Message(event);
    }
  }
  // As client-go: the first 9 distinct messages have Events of their own; from the 10th on they
  // go to one combined Event, which keeps the latest message.
  EXPECT_EQ(plain, 9);
  ASSERT_EQ(combined.size(), 1u);
  EXPECT_EQ(Message(combined[0]), "(combined from similar events): pod p-12 did not answer");
  EXPECT_EQ(Count(combined[0]), 3);
  EXPECT_EQ(combined[0].at("reason").as_string(), "SidecarUnreachable");
  EXPECT_EQ(combined[0].at("involvedObject").at("uid").as_string(), object.uid);
}

TEST_F(EventRecorderTest, EventsLandInTheirObjectsNamespaces) {
  const std::string other_ns = NewNamespace();
  const ObjectReference here = NewObject(ns_, "profile-d");
  const ObjectReference there = NewObject(other_ns, "profile-d");
  ObjectReference cluster_scoped;
  cluster_scoped.api_version = "v1";
  cluster_scoped.kind = "Namespace";
  cluster_scoped.name = other_ns;
  std::unique_ptr<EventRecorder> recorder = NewRecorder(admin_.get());
  recorder->Event(here, kEventTypeNormal, "CaptureStarted", "here");
  recorder->Event(there, kEventTypeNormal, "CaptureStarted", "there");
  recorder->Event(cluster_scoped, kEventTypeNormal, "Adopted", StrCat("namespace ", other_ns));
  ASSERT_TRUE(recorder->Flush());

  std::vector<web::json::value> events_here = EventsIn(ns_);
  ASSERT_EQ(events_here.size(), 1u);
  EXPECT_EQ(Message(events_here[0]), "here");
  std::vector<web::json::value> events_there = EventsIn(other_ns);
  ASSERT_EQ(events_there.size(), 1u);
  EXPECT_EQ(Message(events_there[0]), "there");
  EXPECT_EQ(events_there[0].at("involvedObject").at("uid").as_string(), there.uid);
  // Events about cluster-scoped objects go to "default", as client-go's.
  bool found = false;
  for (const web::json::value& event : EventsIn("default")) {
    if (Message(event) == StrCat("namespace ", other_ns)) {
      found = true;
      EXPECT_FALSE(event.at("involvedObject").has_field("namespace"));
    }
  }
  EXPECT_TRUE(found);
}

TEST_F(EventRecorderTest, TheDestructorDrainsTheQueue) {
  const ObjectReference object = NewObject(ns_, "profile-e");
  std::unique_ptr<EventRecorder> recorder = NewRecorder(admin_.get());
  for (int i = 0; i < 20; ++i) {
    recorder->Event(object, kEventTypeNormal, StrCat("Step", i), "the operator is shutting down");
  }
  recorder.reset();
  EXPECT_EQ(EventsIn(ns_).size(), 20u);
}

TEST_F(EventRecorderTest, RefusedWritesAreCountedNotRetried) {
  const ObjectReference object = NewObject(ns_, "profile-f");
  std::unique_ptr<RestClient> user = NewClient(plane_->user_token(), Unlimited());
  std::unique_ptr<EventRecorder> recorder = NewRecorder(user.get());
  recorder->Event(object, kEventTypeNormal, "CaptureStarted", "denied");
  ASSERT_TRUE(recorder->Flush());
  EXPECT_EQ(recorder->failed(), 1);
  EXPECT_EQ(recorder->written(), 0);
  EXPECT_EQ(user->requests(), 1) << "a 403 is not worth retrying";
  EXPECT_TRUE(EventsIn(ns_).empty());
}

TEST_F(EventRecorderTest, AFullQueueDropsAndCountsWithoutBlocking) {
  RestConfig config = ConfigFor(plane_->admin_token());
  config.server = "https://127.0.0.1:1";  // nothing listens on port 1
  absl::StatusOr<std::unique_ptr<RestClient>> unreachable = RestClient::Create(config, &clock_);
  ASSERT_TRUE(unreachable.ok());
  // The recorder's clock is simulated: its writer waits in the retry backoff until told.
  SimulatedClock simulated;
  EventRecorderOptions options;
  options.queue_limit = 2;
  options.flush_timeout_ns = kNanosPerSecond;
  auto recorder =
      std::make_unique<EventRecorder>(unreachable->get(), &simulated, kComponent, kHost, options);
  const ObjectReference object = NewObject(ns_, "profile-g");
  recorder->Event(object, kEventTypeNormal, "First", "written first");
  simulated.WaitForSleepers(1);  // the first failed to connect; the writer backs off
  for (int i = 0; i < 9; ++i) {
    recorder->Event(object, kEventTypeNormal, StrCat("Later", i), "queued or dropped");
  }
  EXPECT_EQ(recorder->dropped(), 7);  // 2 queued, 1 in flight
  EXPECT_EQ(recorder->pending(), 3u);
  EXPECT_EQ(recorder->written(), 0);
  // An unsupported type is dropped too.
  recorder->Event(object, "Info", "Odd", "not Normal nor Warning");
  EXPECT_EQ(recorder->dropped(), 8);

  // The destructor waits for the flush timeout (on the simulated clock), then gives up.
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    recorder.reset();
    destroyed = true;
  });
  while (!destroyed) {
    simulated.AdvanceNs(100 * kNanosPerMilli);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  destroyer.join();
  EXPECT_TRUE(EventsIn(ns_).empty());
}

}  // namespace
}  // namespace clusterprof::kube
