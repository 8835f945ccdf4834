// A capture across a clusterprof sidecar that forwards to its pod's TF/JAX profiler server and a
// TF/JAX profiler server reached directly, all real processes on loopback: both kinds of target
// in one synchronized run.
#include <fstream>
#include <map>

#include "common/base/clock.h"
#include "common/base/strings.h"
#include "common/xspace/builder.h"
#include "common/xspace/xspace_io.h"
#include "coordinator/coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace clusterprof {
namespace {

using ::testing::HasSubstr;
using testing::Subprocess;
using testing::TempDir;

constexpr char kSidecar[] = CLUSTERPROF_SIDECAR_PATH;
constexpr char kStandIn[] = CLUSTERPROF_STAND_IN_PATH;

TEST(FrameworkIntegrationTest, SidecarWithFrameworkAndADirectFrameworkServerInOneRun) {
  TempDir root;
  const std::string logs = root.Join("logs");
  // The pod's JAX server, behind the sidecar; another one reached directly.
  Subprocess pod_framework({kStandIn, "--port-file", root.Join("pod_framework.port")}, {},
                           root.Join("pod_framework.log"));
  Subprocess direct({kStandIn, "--port-file", root.Join("direct.port")}, {},
                    root.Join("direct.log"));
  const int pod_framework_port = testing::ReadGrpcPort(root.Join("pod_framework.port"));
  const int direct_port = testing::ReadGrpcPort(root.Join("direct.port"));
  Subprocess sidecar({kSidecar, "--port", "0", "--http-port", "-1", "--shm-dir", root.Join("shm"),
                      "--port-file", root.Join("sidecar.port"), "--allowed-logdir", logs,
                      "--host-name", "tpu-pod-0", "--spool-dir", root.Join("spool"), "--no-gpu",
                      "--framework-profiler", StrCat("127.0.0.1:", pod_framework_port)},
                     {}, root.Join("sidecar.log"));
  const int sidecar_port = testing::ReadGrpcPort(root.Join("sidecar.port"));

  coordinator::CaptureOptions options;
  options.targets.push_back({StrCat("127.0.0.1:", sidecar_port), ""});
  options.targets.push_back({StrCat("127.0.0.1:", direct_port), "jax-host-1"});
  options.layout = *storage::RunLayout::Create(*storage::ParseLogdir(logs), "mixed");
  options.duration_ms = 400;
  options.delay_ms = 500;
  RealClock clock;
  auto result = coordinator::Capture(options, clock);
  ASSERT_TRUE(result.ok()) << result.status() << "\n"
                           << testing::ReadFileOrDie(root.Join("sidecar.log"));
  ASSERT_EQ(result->targets.size(), 2u);
  EXPECT_EQ(result->succeeded, 2);

  const coordinator::TargetResult& pod = result->targets[0];
  EXPECT_TRUE(pod.is_sidecar);
  EXPECT_EQ(pod.host_name, "tpu-pod-0");
  ASSERT_FALSE(pod.files.empty());
  auto loaded = xspace::ReadXSpaceFile(pod.files[0]);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const auto& space = (*loaded)->space();
  EXPECT_NE(xspace::FindPlaneWithName(space, "/device:TPU:0"), nullptr)
      << "the framework's TPU plane, merged into the sidecar's file";
  std::string warnings;
  for (const std::string& w : space.warnings()) warnings += w + "\n";
  EXPECT_THAT(warnings, HasSubstr("framework: stand-in: synthetic trace"));

  const coordinator::TargetResult& jax = result->targets[1];
  EXPECT_FALSE(jax.is_sidecar) << "a TF/JAX server has no Sidecar.GetInfo";
  EXPECT_EQ(jax.clock_offset_ns, 0);
  EXPECT_LT(jax.clock_uncertainty_ns, 0) << "unknown";
  EXPECT_TRUE(testing::FileExists(StrCat(logs, "/plugins/profile/mixed/jax-host-1.xplane.pb")));
  const std::string manifest =
      testing::ReadFileOrDie(StrCat(logs, "/plugins/profile/mixed/clusterprof_run.json"));
  EXPECT_THAT(manifest, HasSubstr("\"clusterprof_sidecar\":false"));
  EXPECT_THAT(manifest, HasSubstr("\"clock_uncertainty_ns\":null"));
}

}  // namespace
}  // namespace clusterprof
