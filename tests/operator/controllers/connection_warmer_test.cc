// The leader's connections to sidecars, made as pods become Ready and dropped as they go.
#include "operator/controllers/connection_warmer.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::controllers {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

std::shared_ptr<kube::Pod> SidecarPod(const std::string& name, const std::string& ip) {
  auto pod = std::make_shared<kube::Pod>();
  pod->metadata.namespace_ = "training";
  pod->metadata.name = name;
  pod->phase = "Running";
  pod->ready = true;
  pod->pod_ip = ip;
  pod->containers.push_back({"trainer", {}});
  pod->containers.push_back({"clusterprof-sidecar", {}});
  return pod;
}

TEST(ConnectionWarmerTest, WarmsReadySidecarPodsOnlyOnceActive) {
  coordinator::ChannelPool pool({});
  ConnectionWarmer warmer(&pool);
  auto a = SidecarPod("a", "10.0.0.1");
  warmer.OnAdd(a, /*initial_list=*/true);
  EXPECT_THAT(warmer.Warmed(), IsEmpty()) << "not the leader yet";
  EXPECT_EQ(pool.size(), 0u);

  auto b = SidecarPod("b", "10.0.0.2");
  b->metadata.annotations.emplace_back("clusterprof.io/port", "9000");
  auto plain = SidecarPod("plain", "10.0.0.3");
  plain->containers.pop_back();  // no sidecar
  auto starting = SidecarPod("starting", "10.0.0.4");
  starting->ready = false;
  warmer.Activate({a, b, plain, starting});
  EXPECT_THAT(warmer.Warmed(), ElementsAre(Pair("training/a", "10.0.0.1:8466"),
                                           Pair("training/b", "10.0.0.2:9000")));
  EXPECT_EQ(pool.size(), 2u);

  // Ready later: warmed; not ready any more, or gone: dropped; a new IP: the old one dropped.
  auto ready = SidecarPod("starting", "10.0.0.4");
  warmer.OnUpdate(starting, ready);
  EXPECT_EQ(pool.size(), 3u);
  warmer.OnUpdate(a, starting);  // any pod that is not a target now: its channel goes
  auto moved = SidecarPod("b", "10.0.0.9");
  warmer.OnUpdate(b, moved);
  warmer.OnDelete(ready, false);
  auto not_ready_a = SidecarPod("a", "10.0.0.1");
  not_ready_a->ready = false;
  warmer.OnUpdate(a, not_ready_a);
  EXPECT_THAT(warmer.Warmed(), ElementsAre(Pair("training/b", "10.0.0.9:8466")));
  EXPECT_EQ(pool.size(), 1u);
}

TEST(ConnectionWarmerTest, AFullPoolWarmsNoMore) {
  coordinator::ChannelPool pool({.max_channels = 1});
  ConnectionWarmer warmer(&pool);
  warmer.Activate({SidecarPod("a", "10.0.0.1"), SidecarPod("b", "10.0.0.2")});
  EXPECT_EQ(warmer.Warmed().size(), 1u);
  EXPECT_EQ(pool.size(), 1u);
}

}  // namespace
}  // namespace clusterprof::controllers
