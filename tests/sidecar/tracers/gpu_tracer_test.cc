// The GPU tracer against a process that runs the real injection watcher and recorder over a mock
// CUPTI: arming through the control page, records through the GPU ring, flush at stop, and the
// XPlanes and warnings that come out.
#include "sidecar/tracers/gpu_tracer.h"

#include <unistd.h>

#include <atomic>
#include <thread>

#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/control_page.h"
#include "sdk/cupti/injection_watcher.h"
#include "tests/sdk/cupti/mock_cupti_api.h"
#include "tests/support/temp_dir.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::sidecar {
namespace {

using cupti::InjectionWatcher;
using cupti::testing::ActivityBuffer;
using cupti::testing::ApiRecord;
using cupti::testing::KernelRecord;
using cupti::testing::MockCuptiApi;
using tensorflow::profiler::XPlane;
using tensorflow::profiler::XSpace;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kWallStart = 1'700'000'000'000'000'000;
constexpr int64_t kStop = kWallStart + 1'000'000'000;
constexpr uint64_t kCuptiStart = 1'000'000'000;  // the mock's clock at kWallStart

class GpuTracerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto shm = ShmTransport::Create({.dir = dir_.path()});
    ASSERT_TRUE(shm.ok()) << shm.status();
    shm_ = std::move(*shm);
    GpuTracer::Options options;
    options.flush_timeout_ms = 60'000;  // a failing test, not a slow machine, should end it
    auto tracer = GpuTracer::Create(shm_.get(), options, nullptr);
    ASSERT_TRUE(tracer.ok()) << tracer.status();
    tracer_ = std::move(*tracer);
  }

  // The workload's side: the watcher of libclusterprof_cupti over `api`.
  std::unique_ptr<InjectionWatcher> Workload(MockCuptiApi* api) {
    InjectionWatcher::Options options;
    options.dir = dir_.path();
    options.ring_records = 4096;
    options.process_name = "trainer";
    options.wall_ns = [api] {
      return kWallStart + static_cast<int64_t>(api->cupti_now.load() - kCuptiStart);
    };
    options.sleep = [](std::chrono::microseconds d) { std::this_thread::sleep_for(d); };
    options.log = [](const std::string&) {};
    return std::make_unique<InjectionWatcher>(std::move(options),
                                              std::unique_ptr<cupti::CuptiApi>(api), "");
  }

  static CaptureWindow Window() { return {kWallStart, kStop}; }
  static CaptureConfig Config() {
    CaptureConfig config;
    config.options.set_device_tracer_level(1);
    return config;
  }

  // Stops the capture while the workload keeps polling, as its thread would.
  void StopWhilePolling(InjectionWatcher* watcher) {
    std::atomic<bool> stopped{false};
    std::thread stop([&] {
      EXPECT_TRUE(tracer_->Stop(kStop).ok());
      stopped = true;
    });
    while (!stopped) {
      if (watcher != nullptr) watcher->Poll();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stop.join();
  }

  clusterprof::testing::TempDir dir_;
  std::unique_ptr<ShmTransport> shm_;
  std::unique_ptr<GpuTracer> tracer_;
};

TEST(GpuCaptureOptionsTest, ComeFromTheLevelAndTheAdvancedConfiguration) {
  tensorflow::ProfileOptions options;
  absl::StatusOr<GpuCaptureOptions> defaults = ParseGpuCaptureOptions(options);
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->level, 0u);
  EXPECT_EQ(defaults->max_activity_events, 0u) << "0: the tracer's default";
  EXPECT_FALSE(defaults->nvtx);
  EXPECT_TRUE(defaults->runtime_api);
  EXPECT_TRUE(defaults->driver_api);

  options.set_device_tracer_level(1);
  auto& config = *options.mutable_advanced_configuration();
  config["gpu_max_activity_api_events"].set_int64_value(4194304);
  config["gpu_max_callback_api_events"].set_int64_value(1000);
  config["gpu_enable_nvtx_tracking"].set_bool_value(true);
  config["clusterprof_gpu_api_tracing"].set_string_value("driver");
  absl::StatusOr<GpuCaptureOptions> parsed = ParseGpuCaptureOptions(options);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->level, 1u);
  EXPECT_EQ(parsed->max_activity_events, 4194304u);
  EXPECT_EQ(parsed->max_api_events, 1000u);
  EXPECT_TRUE(parsed->nvtx);
  EXPECT_FALSE(parsed->runtime_api);
  EXPECT_TRUE(parsed->driver_api);

  config["clusterprof_gpu_api_tracing"].set_string_value("none");
  parsed = ParseGpuCaptureOptions(options);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->runtime_api);
  EXPECT_FALSE(parsed->driver_api);
}

TEST_F(GpuTracerTest, OwnsTheGpuKeys) {
  EXPECT_THAT(tracer_->OwnedKeys(),
              ::testing::UnorderedElementsAre(kGpuMaxActivityEventsKey, kGpuMaxApiEventsKey,
                                              kGpuEnableNvtxKey, kGpuApiTracingKey));
  tensorflow::ProfileOptions options;
  (*options.mutable_advanced_configuration())[kGpuEnableNvtxKey].set_string_value("yes");
  EXPECT_EQ(tracer_->Validate(options).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(tracer_->EnabledFor(options)) << "device_tracer_level 0";
}

TEST_F(GpuTracerTest, CapturesTheActivityOfAnInstrumentedProcess) {
  auto* api = new MockCuptiApi();
  auto workload = Workload(api);
  EXPECT_TRUE(tracer_->EnabledFor(Config().options));
  ASSERT_TRUE(tracer_->Prepare(Window(), Config()).ok());
  workload->Poll();
  ASSERT_NE(workload->recorder(), nullptr);
  EXPECT_TRUE(workload->recorder()->armed()) << "armed before the start instant";
  ASSERT_TRUE(tracer_->Start(Window(), Config()).ok());
  const uint32_t tid = static_cast<uint32_t>(gettid());
  api->Produce(
      ActivityBuffer()
          .Add(ApiRecord(CUPTI_ACTIVITY_KIND_RUNTIME, 211, kCuptiStart + 1'000, kCuptiStart + 5'000,
                         1, tid))
          .Add(KernelRecord(kCuptiStart + 10'000, kCuptiStart + 90'000, 1, 7, "_Z4stepv")));
  api->cupti_now = kCuptiStart + 500'000'000;
  StopWhilePolling(workload.get());

  XSpace space;
  TracerStats stats;
  ASSERT_TRUE(tracer_->CollectInto(&space, &stats).ok());
  EXPECT_THAT(space.warnings(), IsEmpty());
  EXPECT_EQ(stats.events, 2u);
  EXPECT_EQ(stats.dropped_events, 0u);
  const XPlane* gpu = xspace::FindPlaneWithName(space, "/device:GPU:0");
  ASSERT_NE(gpu, nullptr);
  ASSERT_EQ(gpu->lines_size(), 1);
  EXPECT_EQ(gpu->lines(0).name(), "Stream #7(Kernel)");
  ASSERT_EQ(gpu->lines(0).events_size(), 1);
  EXPECT_EQ(gpu->event_metadata().at(gpu->lines(0).events(0).metadata_id()).name(), "step()");
  const XPlane* host = xspace::FindPlaneWithName(space, xspace::kHostThreadsPlaneName);
  ASSERT_NE(host, nullptr);
  ASSERT_EQ(host->lines_size(), 1);
  EXPECT_EQ(host->lines(0).id(), tid);
  EXPECT_EQ(host->event_metadata().at(host->lines(0).events(0).metadata_id()).name(),
            "cudaLaunchKernel");
}

TEST_F(GpuTracerTest, EachCaptureHasOnlyItsOwnRecords) {
  auto* api = new MockCuptiApi();
  auto workload = Workload(api);
  ASSERT_TRUE(tracer_->Prepare(Window(), Config()).ok());
  workload->Poll();
  ASSERT_TRUE(tracer_->Start(Window(), Config()).ok());
  api->Produce(ActivityBuffer().Add(KernelRecord(kCuptiStart + 10, kCuptiStart + 20, 1, 7, "k")));
  StopWhilePolling(workload.get());
  XSpace first;
  TracerStats stats;
  ASSERT_TRUE(tracer_->CollectInto(&first, &stats).ok());
  EXPECT_EQ(stats.events, 1u);

  ASSERT_TRUE(tracer_->Prepare(Window(), Config()).ok());
  workload->Poll();
  ASSERT_TRUE(tracer_->Start(Window(), Config()).ok());
  StopWhilePolling(workload.get());
  XSpace second;
  TracerStats second_stats;
  ASSERT_TRUE(tracer_->CollectInto(&second, &second_stats).ok());
  EXPECT_EQ(second_stats.events, 0u);
  EXPECT_EQ(xspace::FindPlaneWithName(second, "/device:GPU:0"), nullptr);
}

TEST_F(GpuTracerTest, CapsFromTheRequestReachTheProcessAndDropsAreReported) {
  auto* api = new MockCuptiApi();
  auto workload = Workload(api);
  CaptureConfig config = Config();
  (*config.options.mutable_advanced_configuration())[kGpuMaxActivityEventsKey].set_int64_value(1);
  ASSERT_TRUE(tracer_->Prepare(Window(), config).ok());
  workload->Poll();
  ASSERT_TRUE(tracer_->Start(Window(), config).ok());
  ActivityBuffer buffer;
  for (uint32_t i = 0; i < 3; ++i) {
    buffer.Add(KernelRecord(kCuptiStart + 100 * i, kCuptiStart + 100 * i + 50, i, 7, "k"));
  }
  api->Produce(buffer);
  StopWhilePolling(workload.get());
  XSpace space;
  TracerStats stats;
  ASSERT_TRUE(tracer_->CollectInto(&space, &stats).ok());
  EXPECT_EQ(stats.events, 1u);
  EXPECT_EQ(stats.dropped_events, 2u);
  ASSERT_EQ(space.warnings_size(), 1);
  EXPECT_THAT(space.warnings(0), HasSubstr("2 GPU activity and 0 API events were dropped"));
  EXPECT_THAT(space.warnings(0), HasSubstr("gpu_max_activity_api_events"));
}

TEST_F(GpuTracerTest, ACuptiRefusalIsAWarningNotAFailure) {
  auto* api = new MockCuptiApi();
  api->enable_results[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL] = CUPTI_ERROR_INSUFFICIENT_PRIVILEGES;
  auto workload = Workload(api);
  ASSERT_TRUE(tracer_->Prepare(Window(), Config()).ok());
  workload->Poll();
  ASSERT_TRUE(tracer_->Start(Window(), Config()).ok());
  StopWhilePolling(nullptr);  // nothing to wait for: the process is not recording
  XSpace space;
  TracerStats stats;
  ASSERT_TRUE(tracer_->CollectInto(&space, &stats).ok());
  ASSERT_EQ(space.warnings_size(), 1);
  EXPECT_THAT(space.warnings(0), HasSubstr("gpu: no GPU activity from trainer (pid "));
  EXPECT_THAT(space.warnings(0), HasSubstr("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"));
  EXPECT_THAT(space.warnings(0), HasSubstr("NVreg_RestrictProfilingToAdminUsers"));
}

TEST_F(GpuTracerTest, WithoutAnyCudaProcessTheWarningSaysHowToGetOne) {
  ASSERT_TRUE(tracer_->Prepare(Window(), Config()).ok());
  ASSERT_TRUE(tracer_->Start(Window(), Config()).ok());
  ASSERT_TRUE(tracer_->Stop(kStop).ok());
  XSpace space;
  TracerStats stats;
  ASSERT_TRUE(tracer_->CollectInto(&space, &stats).ok());
  ASSERT_EQ(space.warnings_size(), 1);
  EXPECT_THAT(space.warnings(0), HasSubstr("CUDA_INJECTION64_PATH"));
  EXPECT_EQ(stats.events, 0u);
}

TEST_F(GpuTracerTest, AHostWithoutGpusWarnsOnlyWhenTheRequestAskedForGpuTracing) {
  GpuTracer::Options options;
  options.host_has_gpus = false;
  tracer_.reset();
  auto tracer = GpuTracer::Create(shm_.get(), options, nullptr);
  ASSERT_TRUE(tracer.ok());
  tracer_ = std::move(*tracer);
  auto capture = [&](const CaptureConfig& config) {
    EXPECT_TRUE(tracer_->Prepare(Window(), config).ok());
    EXPECT_TRUE(tracer_->Start(Window(), config).ok());
    EXPECT_TRUE(tracer_->Stop(kStop).ok());
    XSpace space;
    TracerStats stats;
    EXPECT_TRUE(tracer_->CollectInto(&space, &stats).ok());
    return space;
  };
  // The default device tracer level, as every client sends it: no GPU here, no warning.
  EXPECT_EQ(capture(Config()).warnings_size(), 0);
  // A request that names a GPU option asked for GPU tracing: it hears why there is none.
  CaptureConfig asked = Config();
  (*asked.options.mutable_advanced_configuration())[kGpuEnableNvtxKey].set_bool_value(true);
  const XSpace space = capture(asked);
  ASSERT_EQ(space.warnings_size(), 1);
  EXPECT_THAT(space.warnings(0), HasSubstr("CUDA_INJECTION64_PATH"));
}

TEST_F(GpuTracerTest, AProcessThatNeverFlushesHoldsTheStopOnlyUntilTheTimeout) {
  GpuTracer::Options options;
  options.flush_timeout_ms = 50;
  tracer_.reset();
  auto tracer = GpuTracer::Create(shm_.get(), options, nullptr);
  ASSERT_TRUE(tracer.ok());
  tracer_ = std::move(*tracer);
  auto* api = new MockCuptiApi();
  auto workload = Workload(api);
  ASSERT_TRUE(tracer_->Prepare(Window(), Config()).ok());
  workload->Poll();  // armed, and then the process stops answering (stuck in a long kernel)
  ASSERT_TRUE(tracer_->Start(Window(), Config()).ok());
  ASSERT_TRUE(tracer_->Stop(kStop).ok());
  XSpace space;
  TracerStats stats;
  ASSERT_TRUE(tracer_->CollectInto(&space, &stats).ok());
  ASSERT_EQ(space.warnings_size(), 1);
  EXPECT_THAT(space.warnings(0), HasSubstr("did not hand over its last GPU records within 50 ms"));
}

TEST_F(GpuTracerTest, StatusCountsTheCudaProcesses) {
  auto* api = new MockCuptiApi();
  auto workload = Workload(api);
  EXPECT_THAT(tracer_->Status().reason, HasSubstr("0 CUDA process(es)"));
  ASSERT_TRUE(tracer_->Prepare(Window(), Config()).ok());
  workload->Poll();
  EXPECT_THAT(tracer_->Status().reason, HasSubstr("1 CUDA process(es)"));
  ASSERT_TRUE(tracer_->Start(Window(), Config()).ok());
  StopWhilePolling(workload.get());
}

}  // namespace
}  // namespace clusterprof::sidecar
