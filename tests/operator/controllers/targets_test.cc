// Target resolution: which pods a ProfileJob captures, at which address, and why others are
// left out.
#include "operator/controllers/targets.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::controllers {
namespace {

using ::testing::ElementsAre;

struct PodBuilder {
  std::shared_ptr<kube::Pod> pod = std::make_shared<kube::Pod>();
  explicit PodBuilder(std::string name) {
    pod->metadata.name = std::move(name);
    pod->phase = "Running";
    pod->ready = true;
    pod->pod_ip = "10.0.0.1";
    pod->node_name = "node-a";
    pod->containers.push_back({"trainer", {}});
    pod->containers.push_back({"clusterprof-sidecar", {}});
  }
  PodBuilder& Annotation(std::string key, std::string value) {
    pod->metadata.annotations.emplace_back(std::move(key), std::move(value));
    return *this;
  }
};

api::ProfileJobSpec Spec() {
  api::ProfileJobSpec spec;
  spec.selector = kube::LabelSelector();
  return spec;
}

TEST(TargetsTest, ReadyPodsWithSidecarsAreTargetsSortedByName) {
  PodBuilder b("b"), a("a");
  a.pod->pod_ip = "10.0.0.2";
  const TargetResolution resolution = ResolveTargets(Spec(), {b.pod, a.pod});
  ASSERT_EQ(resolution.targets.size(), 2u);
  EXPECT_EQ(resolution.targets[0].name, "a");
  EXPECT_EQ(resolution.targets[0].address, "10.0.0.2:8466");
  EXPECT_EQ(resolution.targets[0].node, "node-a");
  EXPECT_EQ(resolution.targets[1].address, "10.0.0.1:8466");
  EXPECT_TRUE(resolution.skipped.empty());
}

TEST(TargetsTest, PodsThatCannotBeCapturedAreSkippedWithTheReason) {
  PodBuilder pending("pending"), unready("unready"), no_ip("no-ip"), no_sidecar("plain"),
      deleting("deleting"), bad_port("bad-port");
  pending.pod->phase = "Pending";
  unready.pod->ready = false;
  no_ip.pod->pod_ip.clear();
  no_sidecar.pod->containers.pop_back();
  deleting.pod->metadata.deletion_timestamp = "2026-01-01T00:00:00Z";
  bad_port.Annotation("clusterprof.io/port", "http");
  const TargetResolution resolution = ResolveTargets(
      Spec(), {pending.pod, unready.pod, no_ip.pod, no_sidecar.pod, deleting.pod, bad_port.pod});
  EXPECT_TRUE(resolution.targets.empty());
  EXPECT_THAT(resolution.skipped,
              ElementsAre("bad-port: annotation clusterprof.io/port=\"http\" is not a port number "
                          "(1-65535)",
                          "deleting: being deleted", "no-ip: no pod IP yet",
                          "pending: phase Pending, not Running",
                          "plain: no clusterprof sidecar (no clusterprof-sidecar container, no "
                          "container port named clusterprof, no clusterprof.io/port annotation)",
                          "unready: not Ready"));
}

TEST(TargetsTest, ASkippedPodSaysWhatItsContainersWaitFor) {
  PodBuilder missing("missing");
  missing.pod->phase = "Pending";
  missing.pod->ready = false;
  missing.pod->pod_ip.clear();
  missing.pod->waiting = {
      "container trainer: ErrImageNeverPull: Container image \"w:none\" is not present with pull "
      "policy of Never"};
  PodBuilder starting("starting");
  starting.pod->phase = "Pending";
  starting.pod->pod_ip.clear();
  const TargetResolution resolution = ResolveTargets(Spec(), {missing.pod, starting.pod});
  EXPECT_THAT(resolution.skipped,
              ElementsAre("missing: phase Pending, not Running (container trainer: "
                          "ErrImageNeverPull: Container image \"w:none\" is not present with pull "
                          "policy of Never)",
                          "starting: phase Pending, not Running"));
}

TEST(TargetsTest, PodsOnTheirWayAreStartingWithTheStepTheyWaitOn) {
  PodBuilder unscheduled("a-unscheduled"), pulling("b-pulling"), creating("c-creating"),
      unready("d-unready"), crashing("e-crashing"), never("f-never"), plain("g-plain"),
      done("h-done"), ready("i-ready");
  unscheduled.pod->phase = "Pending";
  unscheduled.pod->node_name.clear();
  unscheduled.pod->unschedulable = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.";
  unscheduled.pod->metadata.creation_timestamp = "2026-11-28T10:00:00Z";
  pulling.pod->phase = "Pending";
  pulling.pod->waiting_reasons = {"ImagePullBackOff"};
  creating.pod->phase = "Pending";
  unready.pod->ready = false;
  crashing.pod->ready = false;
  crashing.pod->waiting_reasons = {"CrashLoopBackOff"};
  never.pod->phase = "Pending";
  never.pod->waiting_reasons = {"ErrImageNeverPull"};
  plain.pod->ready = false;
  plain.pod->containers.pop_back();  // no sidecar: it will not get one by waiting
  done.pod->phase = "Succeeded";
  const TargetResolution resolution =
      ResolveTargets(Spec(), {unscheduled.pod, pulling.pod, creating.pod, unready.pod, crashing.pod,
                              never.pod, plain.pod, done.pod, ready.pod});
  ASSERT_EQ(resolution.targets.size(), 1u);
  std::vector<std::pair<std::string, std::string>> starting;
  for (const StartingPod& pod : resolution.starting) starting.emplace_back(pod.name, pod.stage);
  EXPECT_THAT(starting,
              ElementsAre(std::pair<std::string, std::string>{"a-unscheduled", "scheduling"},
                          std::pair<std::string, std::string>{"b-pulling", "image pull"},
                          std::pair<std::string, std::string>{"c-creating", "containers starting"},
                          std::pair<std::string, std::string>{"d-unready", "readiness"}));
  EXPECT_EQ(resolution.starting[0].created_ns, *api::ParseTime("2026-11-28T10:00:00Z"));
  EXPECT_EQ(resolution.starting[1].created_ns, 0) << "no creationTimestamp: unknown";
  EXPECT_EQ(resolution.skipped[0],
            "a-unscheduled: phase Pending, not Running (not scheduled: 0/1 nodes are available: 1 "
            "Insufficient nvidia.com/gpu.)");

  EXPECT_EQ(DescribeWait(resolution, 4),
            "1 target(s) ready, 4 needed; waiting on scheduling (1: a-unscheduled), image pull (1: "
            "b-pulling), containers starting (1: c-creating), readiness (1: d-unready); not "
            "coming: e-crashing: not Ready (and 3 more)");
}

TEST(TargetsTest, DescribeWaitNamesAFewPodsPerStep) {
  std::vector<kube::ObjectPtr> pods;
  for (int i = 0; i < 5; ++i) {
    PodBuilder pod("w-" + std::to_string(i));
    pod.pod->ready = false;
    pods.push_back(pod.pod);
  }
  EXPECT_EQ(DescribeWait(ResolveTargets(Spec(), pods), 5),
            "0 target(s) ready, 5 needed; waiting on readiness (5: w-0, w-1, w-2, ...)");
}

TEST(TargetsTest, PortPrecedenceAndSidecarDetection) {
  api::ProfileJobSpec spec = Spec();
  PodBuilder annotated("annotated");
  annotated.Annotation("clusterprof.io/port", "9001");
  annotated.pod->containers.pop_back();  // the annotation alone marks a sidecar
  PodBuilder named("named");
  named.pod->containers.pop_back();
  named.pod->containers[0].ports.push_back({"clusterprof", 7000, "TCP"});
  PodBuilder native("native");
  native.pod->containers.pop_back();
  native.pod->init_containers.push_back({"clusterprof-sidecar", {}});
  PodBuilder v6("v6");
  v6.pod->pod_ip = "fd00::5";
  TargetResolution resolution =
      ResolveTargets(spec, {annotated.pod, named.pod, native.pod, v6.pod});
  ASSERT_EQ(resolution.targets.size(), 4u) << ::testing::PrintToString(resolution.skipped);
  EXPECT_EQ(resolution.targets[0].address, "10.0.0.1:9001");
  EXPECT_EQ(resolution.targets[1].address, "10.0.0.1:7000");
  EXPECT_EQ(resolution.targets[2].address, "10.0.0.1:8466");
  EXPECT_EQ(resolution.targets[3].address, "[fd00::5]:8466");

  spec.port = 9100;  // the spec wins over the annotation
  spec.addresses = {"tpu-host:8466"};
  resolution = ResolveTargets(spec, {annotated.pod});
  ASSERT_EQ(resolution.targets.size(), 2u);
  EXPECT_EQ(resolution.targets[0].address, "10.0.0.1:9100");
  EXPECT_EQ(resolution.targets[1].name, "tpu-host:8466");
  EXPECT_EQ(resolution.targets[1].address, "tpu-host:8466");
}

}  // namespace
}  // namespace clusterprof::controllers
