// The framework proxy against the TF/JAX profiler server stand-in on loopback: what it forwards,
// what it merges, and every way a framework server can let it down.
#include <chrono>
#include <filesystem>
#include <thread>

#include "common/base/clock.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "sidecar/tracers/framework_tracer.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tf_profiler_stand_in.h"
#include "tests/support/xspace_samples.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::sidecar {
namespace {

using tensorflow::profiler::XPlane;
using tensorflow::profiler::XSpace;
using ::testing::HasSubstr;
using testing::TfProfilerStandIn;

int PlanesNamed(const XSpace& space, std::string_view name) {
  int count = 0;
  for (const XPlane& plane : space.planes()) count += plane.name() == name;
  return count;
}

class FrameworkTracerTest : public ::testing::Test {
 protected:
  std::unique_ptr<FrameworkTracer> Tracer(const std::string& address, int64_t grace_ms = 30'000) {
    FrameworkTracer::Options options;
    options.address = address;
    options.work_dir = dir_.Join("framework");
    options.grace_ms = grace_ms;
    auto tracer = FrameworkTracer::Create(options);
    EXPECT_TRUE(tracer.ok()) << tracer.status();
    return std::move(*tracer);
  }

  // A capture 300 ms from now, as the sidecar's session asks for it.
  static CaptureWindow Window(int64_t duration_ms = 300) {
    CaptureWindow window;
    window.start_ns = RealClock().WallNs() + 300'000'000;
    window.planned_stop_ns = window.start_ns + duration_ms * 1'000'000;
    return window;
  }
  // The request's options, as the session hands them on.
  static CaptureConfig Config() {
    CaptureConfig config;
    config.options.set_version(1);
    config.options.set_host_tracer_level(2);
    config.options.set_device_tracer_level(1);
    config.options.set_python_tracer_level(1);
    return config;
  }

  // Prepare, Start, Stop at the planned end, Collect: the session's calls.
  XSpace Capture(FrameworkTracer& tracer, const CaptureWindow& window, TracerStats* stats,
                 const CaptureConfig& config = Config()) {
    EXPECT_TRUE(tracer.Prepare(window, config).ok());
    EXPECT_TRUE(tracer.Start(window, config).ok());
    EXPECT_TRUE(tracer.Stop(window.planned_stop_ns).ok());
    XSpace space;
    EXPECT_TRUE(tracer.CollectInto(&space, stats).ok());
    return space;
  }

  clusterprof::testing::TempDir dir_;
};

TEST_F(FrameworkTracerTest, ForwardsTheCaptureAndMergesItsTrace) {
  auto server = TfProfilerStandIn::Start({});
  ASSERT_NE(server, nullptr);
  auto tracer = Tracer(server->address());
  CaptureWindow window = Window();
  CaptureConfig capture = Config();
  auto& config = *capture.options.mutable_advanced_configuration();
  config["tpu_trace_mode"].set_string_value("TRACE_COMPUTE_AND_SYNC");
  config["gpu_max_activity_api_events"].set_int64_value(4194304);
  config["clusterprof_outlive_client"].set_bool_value(true);
  config["override_hostname"].set_string_value("pod-0");
  TracerStats stats;
  const XSpace space = Capture(*tracer, window, &stats, capture);

  const std::vector<TfProfilerStandIn::Call> calls = server->calls();
  ASSERT_EQ(calls.size(), 1u);
  const tensorflow::ProfileRequest& request = calls[0].request;
  EXPECT_EQ(request.opts().version(), 1u);
  EXPECT_EQ(request.opts().start_timestamp_ns(), static_cast<uint64_t>(window.start_ns))
      << "the same start instant as every other tracer";
  EXPECT_EQ(request.opts().duration_ms(), 300u);
  EXPECT_EQ(request.duration_ms(), 300u);
  EXPECT_EQ(request.opts().host_tracer_level(), 2u);
  EXPECT_EQ(request.opts().device_tracer_level(), 1u);
  EXPECT_EQ(request.opts().python_tracer_level(), 1u);
  EXPECT_TRUE(request.emit_xspace());
  const auto& sent = request.opts().advanced_configuration();
  EXPECT_EQ(sent.at("tpu_trace_mode").string_value(), "TRACE_COMPUTE_AND_SYNC");
  EXPECT_EQ(sent.at("gpu_max_activity_api_events").int64_value(), 4194304);
  EXPECT_EQ(sent.count("clusterprof_outlive_client"), 0u) << "our keys stay with us";
  EXPECT_EQ(sent.count("override_hostname"), 0u);
  EXPECT_GE(calls[0].started_ns, window.start_ns) << "the framework waited for the start";
  EXPECT_EQ(calls[0].status, "OK");

  EXPECT_EQ(PlanesNamed(space, "/host:CPU"), 1);
  EXPECT_EQ(PlanesNamed(space, "/device:TPU:0"), 1);
  EXPECT_EQ(PlanesNamed(space, xspace::kTaskEnvPlaneName), 0) << "the session writes its own";
  EXPECT_THAT(testing::WarningsOf(space), HasSubstr("framework: stand-in: synthetic trace"));
  EXPECT_GT(stats.events, 0u);
  EXPECT_THAT(std::vector<std::string>(space.hostnames().begin(), space.hostnames().end()),
              ::testing::ElementsAre("framework"));
}

TEST_F(FrameworkTracerTest, AnOlderServerThatIgnoresEmitXspaceIsReadFromItsFile) {
  auto server = TfProfilerStandIn::Start({.ignore_emit_xspace = true});
  ASSERT_NE(server, nullptr);
  auto tracer = Tracer(server->address());
  TracerStats stats;
  const XSpace space = Capture(*tracer, Window(), &stats);
  const std::vector<TfProfilerStandIn::Call> calls = server->calls();
  ASSERT_EQ(calls.size(), 1u);
  ASSERT_FALSE(calls[0].file.empty());
  EXPECT_THAT(calls[0].file, HasSubstr(dir_.Join("framework")))
      << "repository_root points into the sidecar's own directory";
  EXPECT_EQ(PlanesNamed(space, "/device:TPU:0"), 1);
  EXPECT_FALSE(std::filesystem::exists(calls[0].file)) << "read, then removed";
}

TEST_F(FrameworkTracerTest, AnAbsentServerIsAWarning) {
  auto tracer = Tracer("127.0.0.1:" + std::to_string(testing::UnusedPort()));
  TracerStats stats;
  const XSpace space = Capture(*tracer, Window(), &stats);
  EXPECT_THAT(testing::WarningsOf(space),
              HasSubstr("framework: no TF/JAX profiler answered at 127.0.0.1:"));
  EXPECT_THAT(testing::WarningsOf(space), HasSubstr("jax.profiler.start_server"));
  EXPECT_EQ(space.planes_size(), 0);
}

TEST_F(FrameworkTracerTest, ABusyServerIsAWarning) {
  auto server = TfProfilerStandIn::Start({});
  ASSERT_NE(server, nullptr);
  // Someone else's capture holds the server.
  std::thread other([&] {
    tensorflow::ProfileRequest request;
    request.mutable_opts()->set_version(1);
    request.mutable_opts()->set_duration_ms(60'000);
    request.mutable_opts()->set_session_id("theirs");
    request.set_emit_xspace(true);
    tensorflow::ProfileResponse response;
    grpc::ClientContext context;
    auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
    tensorflow::ProfilerService::NewStub(channel)->Profile(&context, request, &response);
  });
  ASSERT_TRUE(server->WaitUntilCapturing(30'000));
  auto tracer = Tracer(server->address());
  TracerStats stats;
  const XSpace space = Capture(*tracer, Window(), &stats);
  EXPECT_THAT(testing::WarningsOf(space), HasSubstr("is busy with another capture"));
  EXPECT_THAT(testing::WarningsOf(space), HasSubstr("Another profiling session active."));
  // End theirs.
  {
    tensorflow::TerminateRequest request;
    request.set_session_id("theirs");
    tensorflow::TerminateResponse response;
    grpc::ClientContext context;
    auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
    tensorflow::ProfilerService::NewStub(channel)->Terminate(&context, request, &response);
  }
  other.join();
}

TEST_F(FrameworkTracerTest, ResponsesOverFourAndSixtyFourMebibytesArrive) {
  for (const size_t padding : {size_t{5} << 20, size_t{70} << 20}) {
    SCOPED_TRACE(padding);
    auto server = TfProfilerStandIn::Start({.padding_bytes = padding});
    ASSERT_NE(server, nullptr);
    auto tracer = Tracer(server->address());
    TracerStats stats;
    const XSpace space = Capture(*tracer, Window(100), &stats);
    EXPECT_THAT(testing::WarningsOf(space), Not(HasSubstr("failed"))) << testing::WarningsOf(space);
    const XPlane* tpu = xspace::FindPlaneWithName(space, "/device:TPU:0");
    ASSERT_NE(tpu, nullptr);
    ASSERT_EQ(tpu->stats_size(), 1);
    EXPECT_EQ(tpu->stats(0).bytes_value().size(), padding);
  }
}

TEST_F(FrameworkTracerTest, AnEarlyStopIsForwardedAsTerminate) {
  auto server = TfProfilerStandIn::Start({});
  ASSERT_NE(server, nullptr);
  auto tracer = Tracer(server->address());
  const CaptureWindow window = Window(/*duration_ms=*/600'000);
  ASSERT_TRUE(tracer->Prepare(window, Config()).ok());
  ASSERT_TRUE(tracer->Start(window, Config()).ok());
  ASSERT_TRUE(server->WaitUntilCapturing(30'000));
  ASSERT_TRUE(tracer->Stop(RealClock().WallNs()).ok());
  XSpace space;
  TracerStats stats;
  ASSERT_TRUE(tracer->CollectInto(&space, &stats).ok());
  EXPECT_EQ(server->terminates(), 1);
  const std::vector<TfProfilerStandIn::Call> calls = server->calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_TRUE(calls[0].terminated);
  EXPECT_EQ(PlanesNamed(space, "/device:TPU:0"), 1) << "a terminated capture keeps its data";
}

TEST_F(FrameworkTracerTest, ASlowServerIsAWarningAfterTheGrace) {
  auto server = TfProfilerStandIn::Start({.answer_delay_ms = 1'500});
  ASSERT_NE(server, nullptr);
  auto tracer = Tracer(server->address(), /*grace_ms=*/200);
  TracerStats stats;
  const XSpace space = Capture(*tracer, Window(100), &stats);
  EXPECT_THAT(testing::WarningsOf(space),
              HasSubstr("did not answer within 200 ms of the capture's end"));
  EXPECT_EQ(space.planes_size(), 0);
}

TEST_F(FrameworkTracerTest, EnabledByAnyTracerLevel) {
  auto tracer = Tracer("127.0.0.1:1");
  tensorflow::ProfileOptions options;
  EXPECT_FALSE(tracer->EnabledFor(options));
  options.set_python_tracer_level(1);
  EXPECT_TRUE(tracer->EnabledFor(options));
  EXPECT_TRUE(tracer->ForwardsOptions()) << "no key is unknown to the framework's profiler";
  EXPECT_THAT(tracer->Status().reason, HasSubstr("127.0.0.1:1"));
}

}  // namespace
}  // namespace clusterprof::sidecar
