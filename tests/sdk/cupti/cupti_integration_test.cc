// libclusterprof_cupti as a workload loads it, next to a real sidecar: on a machine without a
// GPU (or whose CUPTI refuses), the capture still succeeds and says why there is no GPU
// activity; with a GPU, the library arms and hands its records over (the `gpu` tests check
// what they contain).
#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/sdk/cupti/cupti_test_harness.h"

namespace clusterprof {
namespace {

using ::testing::AnyOf;
using testing::BinaryPath;
using ::testing::HasSubstr;
using testing::SidecarWithCudaProcess;

std::string Joined(const tensorflow::profiler::XSpace& space) {
  std::string all;
  for (const std::string& warning : space.warnings()) all += warning + "\n";
  return all;
}

TEST(CuptiInjectionTest, TheSidecarHearsWhyAProcessHasNoGpuActivity) {
  testing::TempDir root;
  SidecarWithCudaProcess pod(root);
  const std::string output =
      pod.StartCudaProcess({BinaryPath("CLUSTERPROF_TEST_CUPTI_HOST", CLUSTERPROF_CUPTI_HOST_PATH),
                            SidecarWithCudaProcess::CuptiLibrary(), "60"});
  ASSERT_TRUE(testing::WaitForText(output, "injected")) << testing::ReadFileOrDie(output);
  const bool by_driver =
      testing::WaitForText(output, "injected by the CUDA driver", std::chrono::seconds(0));

  tensorflow::ProfileResponse response;
  const grpc::Status status = pod.Profile(/*delay_ms=*/1000, /*duration_ms=*/300, &response);
  ASSERT_TRUE(status.ok()) << status.error_message() << "\n" << pod.Log();
  const std::string warnings = Joined(response.xspace());
  if (by_driver) {
    // A real driver and CUPTI: the process armed, recorded nothing (it runs no kernels) and
    // flushed in time.
    EXPECT_THAT(warnings, Not(HasSubstr("no GPU activity from"))) << warnings;
    EXPECT_THAT(warnings, Not(HasSubstr("did not hand over"))) << warnings;
    EXPECT_THAT(warnings, Not(HasSubstr("CUDA_INJECTION64_PATH"))) << warnings;
  } else {
    EXPECT_THAT(warnings, HasSubstr("gpu: no GPU activity from cupti_host (pid ")) << warnings;
    EXPECT_THAT(warnings, AnyOf(HasSubstr("cannot load the CUDA driver (libcuda.so.1)"),
                                HasSubstr("cannot load libcupti"), HasSubstr("CUPTI refused")))
        << warnings;
    // The workload's own log says it once, too.
    EXPECT_THAT(testing::ReadFileOrDie(output), HasSubstr("clusterprof_cupti: "));
  }
}

TEST(CuptiInjectionTest, WithoutACudaProcessTheWarningSaysHowToGetOne) {
  // A request that names a GPU option hears why there is no GPU activity, GPUs here or not.
  testing::TempDir root;
  SidecarWithCudaProcess pod(root);
  tensorflow::ProfileResponse response;
  ASSERT_TRUE(pod.Profile(300, 200, &response, /*device_level=*/1, /*nvtx=*/true).ok())
      << pod.Log();
  EXPECT_THAT(Joined(response.xspace()), HasSubstr("CUDA_INJECTION64_PATH"));

  // A plain request (device level 1, as every client sends it) warns only where there are
  // NVIDIA devices; elsewhere the sidecar logs one line.
  testing::TempDir plain_root;
  SidecarWithCudaProcess plain_pod(plain_root);
  tensorflow::ProfileResponse plain;
  ASSERT_TRUE(plain_pod.Profile(300, 200, &plain).ok()) << plain_pod.Log();
  if (std::filesystem::exists("/proc/driver/nvidia/gpus")) {
    EXPECT_THAT(Joined(plain.xspace()), HasSubstr("CUDA_INJECTION64_PATH"));
  } else {
    EXPECT_THAT(Joined(plain.xspace()), Not(HasSubstr("gpu:")));
    EXPECT_THAT(plain_pod.Log(), HasSubstr("no NVIDIA device on this host"));
  }
}

TEST(CuptiInjectionTest, DeviceLevelZeroOrNoGpuFlagLeavesGpuTracingOut) {
  testing::TempDir root;
  SidecarWithCudaProcess pod(root);
  tensorflow::ProfileResponse response;
  ASSERT_TRUE(pod.Profile(300, 200, &response, /*device_level=*/0).ok()) << pod.Log();
  EXPECT_THAT(Joined(response.xspace()), Not(HasSubstr("gpu:")));

  testing::TempDir other_root;
  SidecarWithCudaProcess no_gpu(other_root, {"--no-gpu"});
  tensorflow::ProfileResponse other;
  ASSERT_TRUE(no_gpu.Profile(300, 200, &other).ok()) << no_gpu.Log();
  EXPECT_THAT(Joined(other.xspace()), Not(HasSubstr("gpu:")));
}

}  // namespace
}  // namespace clusterprof
