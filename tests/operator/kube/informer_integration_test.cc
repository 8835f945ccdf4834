// Informers against a real kube-apiserver: list then watch, paging, handlers, indexes, resync,
// relist after 410 Gone (the server's watch cache is made small so that it happens), and a
// randomized test that compares the cache with the server after many changes.
#include "operator/kube/informer.h"

#include <atomic>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/api_error.h"
#include "operator/kube/object.h"
#include "spdlog/spdlog.h"
#include "tests/operator/kube/kube_fixture.h"

namespace clusterprof::kube {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

// Records what handlers are told, and replays it into a model of the cache, so tests can check
// that the events alone rebuild exactly what the server has (no missed, no phantom events).
class RecordingHandler : public ResourceEventHandler {
 public:
  void OnAdd(const ObjectPtr& object, bool initial_list) override {
    MutexLock lock(&mu_);
    const std::string key = object->metadata.Key();
    if (model_.contains(key)) ++phantoms_;  // an add for something already there
    model_[key] = object->metadata.resource_version;
    log_.push_back(StrCat("add ", key, initial_list ? " (initial)" : ""));
  }
  void OnUpdate(const ObjectPtr& old_object, const ObjectPtr& new_object) override {
    MutexLock lock(&mu_);
    const std::string key = new_object->metadata.Key();
    if (old_object == new_object) {
      ++resyncs_;
      return;
    }
    if (!model_.contains(key)) ++phantoms_;  // an update for something never added
    model_[key] = new_object->metadata.resource_version;
    log_.push_back(StrCat("update ", key));
  }
  void OnDelete(const ObjectPtr& object, bool final_state_unknown) override {
    MutexLock lock(&mu_);
    const std::string key = object->metadata.Key();
    if (model_.erase(key) == 0) ++phantoms_;
    log_.push_back(StrCat("delete ", key, final_state_unknown ? " (unknown)" : ""));
    if (final_state_unknown) ++unknown_deletes_;
  }

  std::vector<std::string> log() {
    MutexLock lock(&mu_);
    return log_;
  }
  std::map<std::string, std::string> model() {
    MutexLock lock(&mu_);
    return model_;
  }
  int phantoms() {
    MutexLock lock(&mu_);
    return phantoms_;
  }
  int resyncs() {
    MutexLock lock(&mu_);
    return resyncs_;
  }
  int unknown_deletes() {
    MutexLock lock(&mu_);
    return unknown_deletes_;
  }

 private:
  Mutex mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> model_ ABSL_GUARDED_BY(mu_);
  int phantoms_ ABSL_GUARDED_BY(mu_) = 0;
  int resyncs_ ABSL_GUARDED_BY(mu_) = 0;
  int unknown_deletes_ ABSL_GUARDED_BY(mu_) = 0;
};

class InformerTest : public KubeFixture {
 protected:
  static void SetUpTestSuite() {
    // A watch cache of 20 events per resource: a watch that falls 20 changes behind gets
    // 410 Gone, so relists are easy to provoke.
    testing::KubeControlPlaneOptions options;
    options.extra_apiserver_flags = {"--default-watch-cache-size=20",
                                     "--watch-cache-sizes=configmaps#20"};
    StartPlane(options);
  }

  InformerOptions ConfigMapOptions() {
    InformerOptions options;
    options.type = ConfigMaps();
    options.namespace_ = ns_;
    options.name = "configmaps";
    options.page_size = 50;
    options.initial_backoff_ns = 50 * kNanosPerMilli;
    options.max_backoff_ns = 500 * kNanosPerMilli;
    return options;
  }

  // What the server has: key -> resourceVersion.
  std::map<std::string, std::string> ServerState() {
    absl::StatusOr<ObjectList> list = admin_->ListAll(ConfigMaps(), ns_);
    EXPECT_TRUE(list.ok()) << list.status();
    std::map<std::string, std::string> state;
    if (!list.ok()) return state;
    for (const web::json::value& item : list->items) {
      absl::StatusOr<ObjectMeta> meta = DecodeObjectMeta(item);
      EXPECT_TRUE(meta.ok());
      state[meta->Key()] = meta->resource_version;
    }
    return state;
  }

  static std::map<std::string, std::string> CacheState(const Informer& informer) {
    std::map<std::string, std::string> state;
    for (const ObjectPtr& object : informer.List()) {
      state[object->metadata.Key()] = object->metadata.resource_version;
    }
    return state;
  }

  absl::Status CreateLabelled(const std::string& name, const std::string& app) {
    web::json::value object = ConfigMap(name, "0");
    object["metadata"]["labels"]["app"] = web::json::value(app);
    return admin_->Create(ConfigMaps(), ns_, object).status();
  }
};

TEST_F(InformerTest, ListsInPagesThenWatchesChanges) {
  for (int i = 0; i < 120; ++i) ASSERT_TRUE(CreateLabelled(StrCat("pre-", i), "old").ok());

  RecordingHandler handler;
  Informer informer(admin_.get(), &clock_, ConfigMapOptions());
  informer.AddEventHandler(&handler);
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync());
  EXPECT_EQ(informer.List().size(), 120u);
  EXPECT_EQ(handler.log().size(), 120u);
  EXPECT_EQ(handler.log()[0].find("(initial)") != std::string::npos, true);
  EXPECT_FALSE(informer.resource_version().empty());

  ASSERT_TRUE(CreateLabelled("new", "fresh").ok());
  ASSERT_TRUE(admin_->Patch(ConfigMaps(), ns_, "new", PatchType::kMerge,
                            web::json::value::parse(R"({"data":{"v":"1"}})"))
                  .ok());
  ASSERT_TRUE(admin_->Delete(ConfigMaps(), ns_, "pre-7").ok());
  ASSERT_TRUE(Eventually([&] { return handler.log().size() == 123; })) << handler.log().size();
  const std::vector<std::string> log = handler.log();
  EXPECT_THAT(std::vector<std::string>(log.begin() + 120, log.end()),
              ElementsAre(StrCat("add ", ns_, "/new"), StrCat("update ", ns_, "/new"),
                          StrCat("delete ", ns_, "/pre-7")));
  EXPECT_EQ(informer.Get(ns_, "pre-7"), nullptr);
  ObjectPtr fresh = informer.Get(ns_, "new");
  ASSERT_NE(fresh, nullptr);
  const auto* json = dynamic_cast<const JsonObject*>(fresh.get());
  ASSERT_NE(json, nullptr);
  EXPECT_EQ(json->json.at("data").at("v").as_string(), "1");
  // managedFields are dropped from what the cache keeps.
  EXPECT_FALSE(json->json.at("metadata").has_field("managedFields"));
  EXPECT_EQ(CacheState(informer), ServerState());
  EXPECT_EQ(handler.phantoms(), 0);

  // The label index.
  absl::StatusOr<LabelSelector> fresh_only = LabelSelector::Parse("app=fresh");
  ASSERT_TRUE(fresh_only.ok());
  std::vector<ObjectPtr> selected = informer.List(ns_, &*fresh_only);
  ASSERT_EQ(selected.size(), 1u);
  EXPECT_EQ(selected[0]->metadata.name, "new");
  absl::StatusOr<LabelSelector> not_old = LabelSelector::Parse("app!=old");
  ASSERT_TRUE(not_old.ok());
  EXPECT_EQ(informer.List(ns_, &*not_old).size(), 1u);
  EXPECT_TRUE(informer.List("another-namespace").empty());
  informer.Stop();
  EXPECT_EQ(informer.stats().lists, 1);
}

TEST_F(InformerTest, ResyncCallsUpdateWithTheSameObjectOnTheInformersClock) {
  ASSERT_TRUE(CreateLabelled("a", "x").ok());
  ASSERT_TRUE(CreateLabelled("b", "x").ok());
  SimulatedClock simulated;
  InformerOptions options = ConfigMapOptions();
  options.resync_period_ns = 30 * kNanosPerSecond;
  RecordingHandler handler;
  Informer informer(admin_.get(), &simulated, options);
  informer.AddEventHandler(&handler);
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync());
  // The resync thread sleeps on the simulated clock.
  simulated.WaitForSleepers(1);
  EXPECT_EQ(handler.resyncs(), 0);
  simulated.AdvanceNs(30 * kNanosPerSecond);
  ASSERT_TRUE(Eventually([&] { return handler.resyncs() == 2; }));
  informer.Stop();
}

TEST_F(InformerTest, AHandlerAddedLateSeesTheCacheAsAdds) {
  ASSERT_TRUE(CreateLabelled("a", "x").ok());
  Informer informer(admin_.get(), &clock_, ConfigMapOptions());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync());
  RecordingHandler late;
  informer.AddEventHandler(&late);
  EXPECT_THAT(late.log(), ElementsAre(StrCat("add ", ns_, "/a (initial)")));
  informer.Stop();
}

TEST_F(InformerTest, PodDecoderKeepsWhatTheOperatorReads) {
  web::json::value pod = web::json::value::parse(R"({
    "metadata": {"name": "trainer-0", "labels": {"app": "trainer"},
                 "annotations": {"clusterprof.io/port": "9000"}},
    "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "busybox",
             "ports": [{"name": "profiler", "containerPort": 8466, "protocol": "TCP"}]}]}})");
  absl::StatusOr<web::json::value> created = admin_->Create(Pods(), ns_, pod);
  ASSERT_TRUE(created.ok()) << created.status();
  // No kubelet: the test plays its part and reports the pod running and ready.
  web::json::value status = *created;
  status["status"] = web::json::value::parse(R"({"phase": "Running", "podIP": "127.0.0.5",
      "hostIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]})");
  ASSERT_TRUE(admin_->UpdateStatus(Pods(), ns_, status).ok());

  InformerOptions options;
  options.type = Pods();
  options.namespace_ = ns_;
  options.decoder = PodDecoder();
  Informer informer(admin_.get(), &clock_, options);
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync());
  ObjectPtr object = informer.Get(ns_, "trainer-0");
  ASSERT_NE(object, nullptr);
  const auto* cached = dynamic_cast<const Pod*>(object.get());
  ASSERT_NE(cached, nullptr);
  EXPECT_EQ(cached->node_name, "node-a");
  EXPECT_EQ(cached->phase, "Running");
  EXPECT_EQ(cached->pod_ip, "127.0.0.5");
  EXPECT_TRUE(cached->ready);
  ASSERT_EQ(cached->containers.size(), 1u);
  ASSERT_EQ(cached->containers[0].ports.size(), 1u);
  EXPECT_EQ(cached->containers[0].ports[0].container_port, 8466);
  EXPECT_EQ(*FindValue(cached->metadata.annotations, "clusterprof.io/port"), "9000");
  informer.Stop();
}

TEST_F(InformerTest, AnUnprivilegedInformerReportsForbiddenAndNeverSyncs) {
  std::unique_ptr<RestClient> user = NewClient(plane_->user_token());
  Informer informer(user.get(), &clock_, ConfigMapOptions());
  informer.Start();
  ASSERT_TRUE(Eventually([&] { return !informer.last_error().empty(); }));
  EXPECT_THAT(informer.last_error(), ::testing::HasSubstr("forbidden"));
  EXPECT_FALSE(informer.HasSynced());
  informer.Stop();
}

// Many random changes, with the informer's watch repeatedly falling behind the server's small
// watch cache (its watches end every second and it is held back by a slow handler), so that it
// has to relist after 410 Gone. At the end the cache must equal the server, and the events the
// handler saw must rebuild the same state, with no phantom add, update or delete.
TEST_F(InformerTest, RandomChangesAndRelistsLeaveTheCacheEqualToTheServer) {
  InformerOptions options = ConfigMapOptions();
  options.min_watch_timeout_s = 1;
  RecordingHandler handler;
  Informer informer(admin_.get(), &clock_, options);
  informer.AddEventHandler(&handler);

  // A handler that stalls now and then, so that the informer falls behind.
  class SlowHandler : public ResourceEventHandler {
   public:
    std::atomic<bool> stall{false};
    void OnUpdate(const ObjectPtr&, const ObjectPtr&) override {
      while (stall.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  } slow;
  informer.AddEventHandler(&slow);
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync());

  std::mt19937 random(20261122);
  std::set<std::string> live;
  for (int round = 0; round < 6; ++round) {
    slow.stall = round % 2 == 1;
    for (int i = 0; i < 60; ++i) {
      const int choice = static_cast<int>(random() % 3);
      const std::string name = StrCat("cm-", random() % 40);
      if (choice == 0 || live.empty()) {
        const absl::Status status =
            admin_->Create(ConfigMaps(), ns_, ConfigMap(name, "0")).status();
        ASSERT_TRUE(status.ok() || absl::IsAlreadyExists(status)) << status;
        live.insert(name);
      } else if (choice == 1) {
        const absl::Status status =
            admin_->Patch(ConfigMaps(), ns_, name, PatchType::kMerge,
                          web::json::value::parse(StrCat(R"({"data":{"v":")", i, R"("}})")))
                .status();
        ASSERT_TRUE(status.ok() || absl::IsNotFound(status)) << status;
      } else {
        const absl::Status status = admin_->Delete(ConfigMaps(), ns_, name);
        ASSERT_TRUE(status.ok() || absl::IsNotFound(status)) << status;
        live.erase(name);
      }
    }
    if (slow.stall) {
      // Let the server's watch cache move well past the stalled watch, then release it.
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      slow.stall = false;
    }
  }
  const std::map<std::string, std::string> server = ServerState();
  ASSERT_TRUE(Eventually([&] { return CacheState(informer) == server; }))
      << "the cache never caught up with the server";
  ASSERT_TRUE(Eventually([&] { return handler.model() == server; }))
      << "the events do not rebuild the server's state";
  EXPECT_EQ(handler.phantoms(), 0);
  const InformerStats stats = informer.stats();
  EXPECT_GT(stats.watches, 1);
  spdlog::info("relists {}, watches {}, events {}, unknown-state deletes {}", stats.relists,
               stats.watches, stats.events, handler.unknown_deletes());
  informer.Stop();
}

}  // namespace
}  // namespace clusterprof::kube
