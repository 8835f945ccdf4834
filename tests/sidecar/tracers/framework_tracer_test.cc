// FrameworkTracer against a fake TF/JAX profiler server (framework_client.h): what it asks for,
// and every way a framework server can let it down (absent, busy, slow, an older or another
// kind of server), without a network. framework_tracer_integration_test.cc runs the same tracer
// over gRPC against the stand-in server.
#include "sidecar/tracers/framework_tracer.h"

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sidecar/tracers/framework_client.h"
#include "tests/support/temp_dir.h"
#include "tests/support/xspace_samples.h"
#include "tsl/profiler/protos/profiler_service.pb.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::sidecar {
namespace {

using tensorflow::ProfileRequest;
using tensorflow::ProfileResponse;
using tensorflow::profiler::XSpace;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kAddress[] = "localhost:9012";

// One plane, `plane_name`, with one 1 us event: a framework's trace in small.
XSpace FrameworkTrace(const std::string& plane_name) {
  XSpace space;
  tensorflow::profiler::XPlane* plane = space.add_planes();
  plane->set_id(1);
  plane->set_name(plane_name);
  tensorflow::profiler::XEventMetadata& metadata = (*plane->mutable_event_metadata())[1];
  metadata.set_id(1);
  metadata.set_name("fusion.1");
  tensorflow::profiler::XLine* line = plane->add_lines();
  line->set_id(1);
  line->set_name("XLA Ops");
  line->set_timestamp_ns(RealClock().WallNs());
  tensorflow::profiler::XEvent* event = line->add_events();
  event->set_metadata_id(1);
  event->set_duration_ps(1'000'000);
  return space;
}

// A framework server in this process. `answer` says what each Profile call gets; `hang` makes the
// call wait for Cancel() instead.
class FakeFramework final : public FrameworkClient {
 public:
  std::function<absl::StatusOr<ProfileResponse>(const ProfileRequest&)> answer =
      [](const ProfileRequest& request) {
        ProfileResponse response;
        *response.mutable_xspace() = FrameworkTrace("/device:TPU:0");
        return response;
      };
  bool hang = false;

  absl::StatusOr<ProfileResponse> Profile(const ProfileRequest& request,
                                          int64_t deadline_ns) override {
    std::unique_lock<std::mutex> lock(mu_);
    requests_.push_back(request);
    deadlines_.push_back(deadline_ns);
    if (hang) {
      cancelled_changed_.wait(lock, [&] { return cancelled_; });
      return absl::CancelledError("cancelled by the client");
    }
    lock.unlock();
    return answer(request);
  }

  absl::Status Terminate(const std::string& session_id, int64_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    terminated_.push_back(session_id);
    return absl::OkStatus();
  }

  void Cancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    cancelled_changed_.notify_all();
  }

  std::vector<ProfileRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  std::vector<int64_t> deadlines() {
    std::lock_guard<std::mutex> lock(mu_);
    return deadlines_;
  }
  std::vector<std::string> terminated() {
    std::lock_guard<std::mutex> lock(mu_);
    return terminated_;
  }
  bool cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cancelled_changed_;
  std::vector<ProfileRequest> requests_;
  std::vector<int64_t> deadlines_;
  std::vector<std::string> terminated_;
  bool cancelled_ = false;
};

class FrameworkTracerFakeTest : public ::testing::Test {
 protected:
  std::unique_ptr<FrameworkTracer> Tracer(int64_t grace_ms = 30'000) {
    FrameworkTracer::Options options;
    options.address = kAddress;
    options.client = framework_;
    options.work_dir = dir_.Join("framework");
    options.grace_ms = grace_ms;
    absl::StatusOr<std::unique_ptr<FrameworkTracer>> tracer = FrameworkTracer::Create(options);
    EXPECT_TRUE(tracer.ok()) << tracer.status();
    return std::move(*tracer);
  }

  // A capture 1 s from now, 300 ms long.
  static CaptureWindow Window() {
    CaptureWindow window;
    window.start_ns = RealClock().WallNs() + 1'000'000'000;
    window.planned_stop_ns = window.start_ns + 300'000'000;
    return window;
  }
  static CaptureConfig Config() {
    CaptureConfig config;
    config.options.set_version(1);
    config.options.set_host_tracer_level(2);
    config.options.set_python_tracer_level(1);
    return config;
  }

  // The session's calls: Prepare, Start, Stop at `stop_ns` (0: the planned end), Collect.
  XSpace Capture(FrameworkTracer& tracer, const CaptureWindow& window, int64_t stop_ns = 0,
                 TracerStats* stats = nullptr) {
    TracerStats unused;
    EXPECT_TRUE(tracer.Prepare(window, Config()).ok());
    EXPECT_TRUE(tracer.Start(window, Config()).ok());
    EXPECT_TRUE(tracer.Stop(stop_ns != 0 ? stop_ns : window.planned_stop_ns).ok());
    XSpace space;
    EXPECT_TRUE(tracer.CollectInto(&space, stats != nullptr ? stats : &unused).ok())
        << "a framework server never fails the capture of the other tracers";
    return space;
  }

  std::shared_ptr<FakeFramework> framework_ = std::make_shared<FakeFramework>();
  clusterprof::testing::TempDir dir_;
};

TEST_F(FrameworkTracerFakeTest, AsksForTheSameWindowWithoutItsOwnKeysAndMergesTheAnswer) {
  auto tracer = Tracer(/*grace_ms=*/5'000);
  const CaptureWindow window = Window();
  CaptureConfig config = Config();
  auto& advanced = *config.options.mutable_advanced_configuration();
  advanced["tpu_trace_mode"].set_string_value("TRACE_ONLY_XLA");
  advanced["clusterprof_outlive_client"].set_bool_value(true);
  ASSERT_TRUE(tracer->Prepare(window, config).ok());
  ASSERT_TRUE(tracer->Start(window, config).ok());
  ASSERT_TRUE(tracer->Stop(window.planned_stop_ns).ok());
  XSpace space;
  TracerStats stats;
  ASSERT_TRUE(tracer->CollectInto(&space, &stats).ok());

  const std::vector<ProfileRequest> requests = framework_->requests();
  ASSERT_EQ(requests.size(), 1u) << "Prepare and Start send one request";
  const ProfileRequest& request = requests[0];
  EXPECT_EQ(request.opts().start_timestamp_ns(), static_cast<uint64_t>(window.start_ns));
  EXPECT_EQ(request.opts().duration_ms(), 300u);
  EXPECT_EQ(request.duration_ms(), 300u);
  EXPECT_EQ(request.opts().host_tracer_level(), 2u);
  EXPECT_EQ(request.opts().python_tracer_level(), 1u);
  EXPECT_TRUE(request.emit_xspace());
  EXPECT_EQ(request.host_name(), "framework");
  EXPECT_EQ(request.repository_root(), dir_.Join("framework"));
  EXPECT_EQ(request.opts().advanced_configuration().count("clusterprof_outlive_client"), 0u);
  EXPECT_EQ(request.opts().advanced_configuration().at("tpu_trace_mode").string_value(),
            "TRACE_ONLY_XLA");
  EXPECT_EQ(framework_->deadlines(), std::vector<int64_t>{window.planned_stop_ns + 5'000'000'000})
      << "the answer is awaited for the grace after the planned stop";
  EXPECT_TRUE(framework_->terminated().empty()) << "stopped at the planned end";

  ASSERT_EQ(space.planes_size(), 1);
  EXPECT_EQ(space.planes(0).name(), "/device:TPU:0");
  EXPECT_EQ(stats.events, 1u);
  EXPECT_THAT(testing::WarningsOf(space), IsEmpty());
}

TEST_F(FrameworkTracerFakeTest, AnAbsentServerIsAWarningThatSaysHowToStartOne) {
  framework_->answer = [](const ProfileRequest&) {
    return absl::UnavailableError("failed to connect to all addresses");
  };
  auto tracer = Tracer();
  const XSpace space = Capture(*tracer, Window());
  EXPECT_THAT(testing::WarningsOf(space),
              HasSubstr(StrCat("framework: no TF/JAX profiler answered at ", kAddress)));
  EXPECT_THAT(testing::WarningsOf(space), HasSubstr("jax.profiler.start_server(port)"));
  EXPECT_EQ(space.planes_size(), 0);
}

TEST_F(FrameworkTracerFakeTest, ABusyServerIsAWarningAndTheNextCaptureAsksAgain) {
  int calls = 0;
  framework_->answer = [&](const ProfileRequest&) -> absl::StatusOr<ProfileResponse> {
    if (++calls == 1) return absl::UnknownError("Another profiling session active.");
    ProfileResponse response;
    *response.mutable_xspace() = FrameworkTrace("/host:CPU");
    return response;
  };
  auto tracer = Tracer();
  const XSpace busy = Capture(*tracer, Window());
  EXPECT_THAT(testing::WarningsOf(busy), HasSubstr("is busy with another capture"));
  EXPECT_EQ(busy.planes_size(), 0);
  const XSpace next = Capture(*tracer, Window());
  EXPECT_THAT(testing::WarningsOf(next), IsEmpty());
  EXPECT_EQ(next.planes_size(), 1);
  const std::vector<ProfileRequest> requests = framework_->requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_NE(requests[0].session_id(), requests[1].session_id()) << "a session id a capture";
}

TEST_F(FrameworkTracerFakeTest, ASlowServerIsAWarningNamingTheGrace) {
  framework_->answer = [](const ProfileRequest&) {
    return absl::DeadlineExceededError("Deadline Exceeded");
  };
  auto tracer = Tracer(/*grace_ms=*/2'500);
  const XSpace space = Capture(*tracer, Window());
  EXPECT_THAT(testing::WarningsOf(space),
              HasSubstr("did not answer within 2500 ms of the capture's end"));
}

TEST_F(FrameworkTracerFakeTest, AnOlderServerWritesAFileThatIsReadThenRemoved) {
  std::string written;
  framework_->answer = [&](const ProfileRequest& request) {
    // TF 2.x before emit_xspace: <repository_root>/<session_id>/<host_name>.xplane.pb.
    const std::string run_dir = StrCat(request.repository_root(), "/", request.session_id());
    std::filesystem::create_directories(run_dir);
    written = StrCat(run_dir, "/", request.host_name(), ".xplane.pb");
    std::ofstream(written, std::ios::binary) << FrameworkTrace("/device:TPU:0").SerializeAsString();
    return ProfileResponse();
  };
  auto tracer = Tracer();
  const XSpace space = Capture(*tracer, Window());
  ASSERT_FALSE(written.empty());
  ASSERT_EQ(space.planes_size(), 1);
  EXPECT_EQ(space.planes(0).name(), "/device:TPU:0");
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(written).parent_path()))
      << "the run directory is removed once read";
}

TEST_F(FrameworkTracerFakeTest, AnAnswerWithNeitherTraceNorFileIsAWarningUnlessEmptyOnPurpose) {
  framework_->answer = [](const ProfileRequest&) { return ProfileResponse(); };
  auto tracer = Tracer();
  EXPECT_THAT(testing::WarningsOf(Capture(*tracer, Window())),
              HasSubstr("answered with neither an XSpace nor a file"));
  framework_->answer = [](const ProfileRequest&) {
    ProfileResponse response;
    response.set_empty_trace(true);
    return response;
  };
  EXPECT_THAT(testing::WarningsOf(Capture(*tracer, Window())), IsEmpty())
      << "nothing ran: no warning";
}

TEST_F(FrameworkTracerFakeTest, AServerOfAnotherKindIsAWarningWithItsError) {
  framework_->answer = [](const ProfileRequest&) {
    return absl::UnimplementedError("unknown service tensorflow.ProfilerService");
  };
  auto tracer = Tracer();
  const XSpace space = Capture(*tracer, Window());
  EXPECT_THAT(testing::WarningsOf(space), HasSubstr(StrCat("framework: the TF/JAX profiler at ",
                                                           kAddress, " failed: UNIMPLEMENTED")));
}

TEST_F(FrameworkTracerFakeTest, AnEarlyStopTerminatesTheFrameworksSession) {
  auto tracer = Tracer();
  const CaptureWindow window = Window();
  Capture(*tracer, window, /*stop_ns=*/window.start_ns + 100'000'000);
  const std::vector<ProfileRequest> requests = framework_->requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(framework_->terminated(), std::vector<std::string>{requests[0].session_id()});
}

TEST_F(FrameworkTracerFakeTest, ATracerGoingAwayCancelsItsCallInFlight) {
  framework_->hang = true;
  auto tracer = Tracer();
  const CaptureWindow window = Window();
  ASSERT_TRUE(tracer->Start(window, Config()).ok());
  tracer.reset();  // returns only once the call has ended
  EXPECT_TRUE(framework_->cancelled());
  EXPECT_EQ(framework_->requests().size(), 1u);
}

}  // namespace
}  // namespace clusterprof::sidecar
