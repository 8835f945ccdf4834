// GPU tests (ctest label `gpu`): a real CUDA program (a custom kernel, cuBLAS SGEMMs, copies, a
// memset) under libclusterprof_cupti, captured by a real sidecar. Skipped without a GPU.
#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/sdk/cupti/cupti_test_harness.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof {
namespace {

using tensorflow::profiler::XEvent;
using tensorflow::profiler::XLine;
using tensorflow::profiler::XPlane;
using tensorflow::profiler::XStat;
using testing::BinaryPath;
using ::testing::HasSubstr;
using testing::SidecarWithCudaProcess;

constexpr int64_t kClockSkewToleranceNs = 50'000;

struct Event {
  std::string name;
  int64_t start_ns = 0;
  int64_t duration_ns = 0;
  std::map<std::string, XStat> stats;
};

std::vector<Event> Events(const XPlane& plane, const XLine& line) {
  std::vector<Event> events;
  for (const XEvent& e : line.events()) {
    Event event;
    event.name = plane.event_metadata().at(e.metadata_id()).name();
    event.start_ns = line.timestamp_ns() + e.offset_ps() / 1000;
    event.duration_ns = e.duration_ps() / 1000;
    for (const XStat& stat : e.stats()) {
      event.stats[plane.stat_metadata().at(stat.metadata_id()).name()] = stat;
    }
    events.push_back(std::move(event));
  }
  return events;
}

std::string Lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

class GpuCaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveGpu()) GTEST_SKIP() << "no NVIDIA GPU on this machine";
    workload_ = BinaryPath("CLUSTERPROF_TEST_GPU_WORKLOAD", CLUSTERPROF_GPU_WORKLOAD_PATH);
    if (workload_.empty()) GTEST_SKIP() << "gpu_workload was not built (no nvcc)";
  }
  std::string workload_;
};

TEST_F(GpuCaptureTest, KernelsCopiesAndLaunchesOfACudaProgram) {
  testing::TempDir root;
  SidecarWithCudaProcess pod(root);
  const std::string output = pod.StartCudaProcess({workload_, "--seconds", "60"});
  ASSERT_TRUE(testing::WaitForText(output, "ready", std::chrono::seconds(120)))
      << testing::ReadFileOrDie(output);

  constexpr int64_t kDurationMs = 1000;
  tensorflow::ProfileResponse response;
  const grpc::Status status = pod.Profile(/*delay_ms=*/1500, kDurationMs, &response);
  ASSERT_TRUE(status.ok()) << status.error_message() << "\n" << pod.Log();
  const tensorflow::profiler::XSpace& space = response.xspace();
  for (const std::string& warning : space.warnings()) {
    EXPECT_THAT(warning, Not(HasSubstr("gpu:"))) << warning;
  }

  const XPlane* task = xspace::FindPlaneWithName(space, xspace::kTaskEnvPlaneName);
  ASSERT_NE(task, nullptr);
  int64_t start_ns = 0;
  int64_t stop_ns = 0;
  for (const XStat& stat : task->stats()) {
    const std::string& name = task->stat_metadata().at(stat.metadata_id()).name();
    if (name == xspace::kProfileStartTime) start_ns = static_cast<int64_t>(stat.uint64_value());
    if (name == xspace::kProfileStopTime) stop_ns = static_cast<int64_t>(stat.uint64_value());
  }
  ASSERT_GT(stop_ns, start_ns);

  const XPlane* gpu = xspace::FindPlaneWithName(space, "/device:GPU:0");
  ASSERT_NE(gpu, nullptr) << "planes: " << space.planes_size();
  std::map<std::string, XStat> device_stats;
  for (const XStat& stat : gpu->stats()) {
    device_stats[gpu->stat_metadata().at(stat.metadata_id()).name()] = stat;
  }
  EXPECT_THAT(device_stats["gpu_device_name"].str_value(), HasSubstr("NVIDIA"));
  EXPECT_GT(device_stats["core_count"].uint64_value(), 0u);
  EXPECT_GT(device_stats["memory_bandwidth"].uint64_value(), 0u);
  EXPECT_GE(device_stats["compute_cap_major"].int64_value(), 7);

  std::map<uint64_t, Event> kernels_by_correlation;
  int saxpy = 0;
  int gemm = 0;
  int h2d = 0;
  int d2h = 0;
  int memsets = 0;
  bool stream_named = false;
  bool counters = false;
  for (const XLine& line : gpu->lines()) {
    if (line.name() == xspace::kUpstreamCounterLineName) {
      counters = line.events_size() > 0;
      continue;
    }
    if (line.name().rfind("Stream #", 0) == 0 && line.name().find("Kernel") != std::string::npos &&
        line.name().find("MemcpyH2D") != std::string::npos) {
      stream_named = true;
    }
    for (const Event& event : Events(*gpu, line)) {
      SCOPED_TRACE(event.name);
      EXPECT_GE(event.start_ns, start_ns);
      EXPECT_LE(event.start_ns + event.duration_ns, stop_ns);
      if (event.stats.count("kernel_details") > 0) {
        EXPECT_GT(event.duration_ns, 0);
        EXPECT_LT(event.duration_ns, kDurationMs * 1'000'000);
        kernels_by_correlation[event.stats.at("correlation_id").uint64_value()] = event;
        if (event.name.find("clusterprof_test_saxpy") != std::string::npos) ++saxpy;
        if (Lower(event.name).find("gemm") != std::string::npos) ++gemm;
      }
      if (event.name == "MemcpyH2D") ++h2d;
      if (event.name == "MemcpyD2H") ++d2h;
      if (event.name == "Memset") ++memsets;
    }
  }
  EXPECT_TRUE(stream_named);
  EXPECT_GT(saxpy, 0);
  EXPECT_GT(gemm, 0);
  EXPECT_GT(h2d, 0);
  EXPECT_GT(d2h, 0);
  EXPECT_GT(memsets, 0);
  EXPECT_TRUE(counters) << "NVML counters on the GPU plane";

  // Every saxpy kernel was launched by a cudaLaunchKernel with its correlation id, before it
  // ran (to within the clock's skew), and both carry the same flow.
  const XPlane* host = xspace::FindPlaneWithName(space, xspace::kHostThreadsPlaneName);
  ASSERT_NE(host, nullptr);
  int correlated = 0;
  for (const XLine& line : host->lines()) {
    for (const Event& event : Events(*host, line)) {
      if (event.name.rfind("cudaLaunchKernel", 0) != 0 ||
          event.stats.count("correlation_id") == 0) {
        continue;
      }
      auto kernel = kernels_by_correlation.find(event.stats.at("correlation_id").uint64_value());
      if (kernel == kernels_by_correlation.end()) continue;
      // CUPTI puts GPU and CPU timestamps on one clock to within a few microseconds.
      EXPECT_LE(event.start_ns, kernel->second.start_ns + kClockSkewToleranceNs);
      ASSERT_EQ(event.stats.count("flow"), 1u);
      ASSERT_EQ(kernel->second.stats.count("flow"), 1u);
      EXPECT_EQ(event.stats.at("flow").uint64_value() >> 2,
                kernel->second.stats.at("flow").uint64_value() >> 2);
      ++correlated;
    }
  }
  EXPECT_GE(correlated, saxpy) << "each saxpy launch found";
}

}  // namespace
}  // namespace clusterprof

namespace clusterprof {
namespace {

TEST_F(GpuCaptureTest, NvtxRangesWhenAsked) {
  testing::TempDir root;
  SidecarWithCudaProcess pod(root);
  const std::string output = pod.StartCudaProcess({workload_, "--seconds", "60"});
  ASSERT_TRUE(testing::WaitForText(output, "ready", std::chrono::seconds(120)))
      << testing::ReadFileOrDie(output);
  tensorflow::ProfileResponse response;
  const grpc::Status status = pod.Profile(1500, 500, &response, /*device_level=*/1, /*nvtx=*/true);
  ASSERT_TRUE(status.ok()) << status.error_message() << "\n" << pod.Log();
  const XPlane* nvtx = xspace::FindPlaneWithName(response.xspace(), xspace::kNvtxPlaneName);
  ASSERT_NE(nvtx, nullptr) << "no /host:NVTX-CUPTI plane";
  int ranges = 0;
  for (const XLine& line : nvtx->lines()) {
    for (const Event& event : Events(*nvtx, line)) {
      if (event.name == "clusterprof_test_iteration") {
        EXPECT_GT(event.duration_ns, 0);
        ++ranges;
      }
    }
  }
  EXPECT_GT(ranges, 0);
}

}  // namespace
}  // namespace clusterprof
