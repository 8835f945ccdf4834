#include "sidecar/session.h"

#include <filesystem>
#include <functional>
#include <map>
#include <thread>

#include "common/base/mutex.h"
#include "common/base/strings.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "common/xspace/xspace_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/ring_writer.h"
#include "sidecar/tracers/annotation_tracer.h"
#include "sidecar/tracers/shm_transport.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::sidecar {
namespace {

using clusterprof::testing::FileExists;
using clusterprof::testing::TempDir;
using tensorflow::profiler::XSpace;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kMs = 1'000'000;

// A tracer that records what the session asked of it and adds `events` events.
class FakeTracer final : public Tracer {
 public:
  std::string_view name() const override { return "fake"; }
  bool EnabledFor(const tensorflow::ProfileOptions& options) const override {
    return options.host_tracer_level() >= 1;
  }
  TracerStatus Status() const override { return {true, ""}; }
  absl::Status Start(const CaptureWindow& window, const CaptureConfig&) override {
    if (on_start) on_start();
    MutexLock lock(&mu_);
    if (!start_error.ok()) return start_error;
    window_ = window;
    started_ = true;
    return absl::OkStatus();
  }
  absl::Status Stop(int64_t stop_ns) override {
    MutexLock lock(&mu_);
    stop_ns_ = stop_ns;
    return absl::OkStatus();
  }
  absl::Status CollectInto(XSpace* space, TracerStats* stats) override {
    xspace::XPlaneBuilder plane(
        xspace::FindOrAddMutablePlaneWithName(space, xspace::kHostThreadsPlaneName));
    xspace::XLineBuilder line = plane.GetOrCreateLine(1);
    line.SetTimestampNs(window().start_ns);
    for (int i = 0; i < events; ++i) {
      line.AddEvent(*plane.GetOrCreateEventMetadata("step")).SetDurationNs(10);
    }
    stats->events += events;
    stats->dropped_events += 2;
    return absl::OkStatus();
  }

  bool started() {
    MutexLock lock(&mu_);
    return started_;
  }
  CaptureWindow window() {
    MutexLock lock(&mu_);
    return window_;
  }
  int64_t stop_ns() {
    MutexLock lock(&mu_);
    return stop_ns_;
  }

  int64_t DataStartNs(const CaptureWindow& window) const override {
    return data_start ? data_start(window) : window.start_ns;
  }

  int events = 3;
  absl::Status start_error;
  // Where its data starts (DataStartNs); unset: at its Start, as a GPU tracer.
  std::function<int64_t(const CaptureWindow&)> data_start;
  std::function<void()> on_start;  // called at the top of Start, when set

 private:
  Mutex mu_;
  bool started_ = false;
  CaptureWindow window_;
  int64_t stop_ns_ = 0;
};

class RecordingObserver final : public SessionObserver {
 public:
  void CaptureFinished(std::string_view outcome, const TracerStats& stats, uint64_t bytes,
                       double start_error_seconds, double latency_seconds) override {
    MutexLock lock(&mu_);
    outcomes_.push_back(std::string(outcome));
  }
  std::vector<std::string> outcomes() {
    MutexLock lock(&mu_);
    return outcomes_;
  }

 private:
  Mutex mu_;
  std::vector<std::string> outcomes_;
};

// A client waiting for the outcome.
struct Waiter {
  Notification done;
  absl::StatusOr<CaptureResult> result = absl::UnknownError("not called");
  CaptureSession::Done Callback() {
    return [this](const absl::StatusOr<CaptureResult>& r) {
      result = r;
      done.Notify();
    };
  }
};

class SessionTest : public ::testing::Test {
 protected:
  SessionTest() : sessions_(clock_, {&tracer_}, &observer_) {}

  CaptureRequest Request(std::string session, int64_t start_ns, int64_t duration_ms,
                         bool emit_xspace = false) {
    tensorflow::ProfileRequest request;
    request.mutable_opts()->set_version(1);
    request.mutable_opts()->set_host_tracer_level(2);
    request.mutable_opts()->set_duration_ms(duration_ms);
    request.mutable_opts()->set_start_timestamp_ns(start_ns);
    request.set_session_id(session);
    request.set_host_name("worker-0");
    request.set_emit_xspace(emit_xspace);
    request.set_repository_root(logdir_.Join("plugins/profile"));
    RequestPolicy policy;
    policy.allowed_logdirs.push_back(*storage::ParseLogdir(logdir_.path()));
    auto parsed = ParseCaptureRequest(request, policy, clock_.WallNs());
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    return *parsed;
  }

  std::shared_ptr<CaptureSession> Start(CaptureRequest request, Waiter& waiter,
                                        CaptureSession::ClientId* client = nullptr) {
    auto started = sessions_.StartOrJoin(std::move(request), waiter.Callback());
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return nullptr;
    if (client != nullptr) *client = started->second;
    return started->first;
  }

  std::string XPlanePath(std::string_view session) {
    return logdir_.Join(StrCat("plugins/profile/", session, "/worker-0.xplane.pb"));
  }

  TempDir logdir_;
  SimulatedClock clock_;
  FakeTracer tracer_;
  RecordingObserver observer_;
  SessionManager sessions_;
};

TEST_F(SessionTest, WaitsForTheStartThenCapturesForTheDuration) {
  const int64_t t0 = clock_.WallNs();
  Waiter waiter;
  auto session = Start(Request("run1", t0 + 1000 * kMs, 2000), waiter);
  clock_.WaitForSleepers(1);
  EXPECT_EQ(session->Snapshot().state(), clusterprof::v1alpha1::SESSION_STATE_WAITING);
  EXPECT_FALSE(tracer_.started());

  clock_.AdvanceNs(1000 * kMs);
  // The session wakes, starts the tracer, and sleeps again until the stop.
  while (session->Snapshot().state() != clusterprof::v1alpha1::SESSION_STATE_CAPTURING) {
    std::this_thread::yield();
  }
  clock_.WaitForSleepers(1);
  EXPECT_TRUE(tracer_.started());
  EXPECT_EQ(tracer_.window().start_ns, t0 + 1000 * kMs);
  EXPECT_EQ(tracer_.window().planned_stop_ns, t0 + 3000 * kMs);
  auto capturing = session->Snapshot();
  EXPECT_EQ(capturing.state(), clusterprof::v1alpha1::SESSION_STATE_CAPTURING);
  EXPECT_EQ(capturing.start_error_ns(), 0);
  EXPECT_FALSE(waiter.done.HasBeenNotified());

  clock_.AdvanceNs(2000 * kMs);
  waiter.done.WaitForNotification();
  ASSERT_TRUE(waiter.result.ok()) << waiter.result.status();
  EXPECT_FALSE(waiter.result->empty_trace);
  EXPECT_EQ(waiter.result->xspace, nullptr);
  EXPECT_EQ(tracer_.stop_ns(), t0 + 3000 * kMs);

  auto done = session->Snapshot();
  EXPECT_EQ(done.state(), clusterprof::v1alpha1::SESSION_STATE_DONE);
  EXPECT_EQ(done.events(), 3u);
  EXPECT_EQ(done.dropped_events(), 2u);
  ASSERT_EQ(done.files_size(), 2);
  EXPECT_EQ(done.files(0).uri(), XPlanePath("run1"));
  EXPECT_EQ(done.files(0).upload_state(), clusterprof::v1alpha1::UPLOAD_STATE_COMMITTED);

  auto loaded = xspace::ReadXSpaceFile(XPlanePath("run1"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const XSpace& space = (*loaded)->space();
  ASSERT_EQ(space.hostnames_size(), 1);
  EXPECT_EQ(space.hostnames(0), "worker-0");
  const auto* env = xspace::FindPlaneWithName(space, xspace::kTaskEnvPlaneName);
  ASSERT_NE(env, nullptr);
  std::map<std::string, uint64_t> stats;
  for (const auto& stat : env->stats()) {
    stats[env->stat_metadata().at(stat.metadata_id()).name()] = stat.uint64_value();
  }
  EXPECT_EQ(stats[std::string(xspace::kProfileStartTime)], t0 + 1000 * kMs);
  EXPECT_EQ(stats[std::string(xspace::kProfileStopTime)], t0 + 3000 * kMs);
  EXPECT_THAT(observer_.outcomes(), ::testing::ElementsAre("ok"));
  EXPECT_EQ(sessions_.ActiveSessionId(), "");
}

TEST_F(SessionTest, TheSessionCarriesTheCapturesDigestForTheCrossHostAnalysis) {
  tracer_.events = 4;
  CaptureRequest request = Request("run1", 0, 1000);
  request.digest_options.step_pattern = "^step$";
  Waiter waiter;
  Start(std::move(request), waiter);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(1000 * kMs);
  waiter.done.WaitForNotification();
  ASSERT_TRUE(waiter.result.ok()) << waiter.result.status();
  const clusterprof::v1alpha1::GetSessionResponse done = sessions_.Find("run1")->Snapshot();
  ASSERT_TRUE(done.has_digest()) << done.digest_error();
  EXPECT_EQ(done.digest().host(), "worker-0");
  EXPECT_EQ(done.digest().steps_size(), 4) << "each 'step' event is a step, in time order";
  EXPECT_EQ(done.digest().events(), 4);
  EXPECT_THAT(done.digest().step_source(), HasSubstr("^step$"));
  EXPECT_EQ(done.digest_error(), "");
}

TEST_F(SessionTest, AStartInThePastStartsAtOnceWithAWarning) {
  const int64_t t0 = clock_.WallNs();
  Waiter waiter;
  auto session = Start(Request("late", t0 - 5000 * kMs, 100), waiter);
  clock_.WaitForSleepers(1);
  EXPECT_TRUE(tracer_.started());
  EXPECT_EQ(tracer_.window().start_ns, t0);
  EXPECT_EQ(session->Snapshot().start_error_ns(), 5000 * kMs);
  clock_.AdvanceNs(100 * kMs);
  waiter.done.WaitForNotification();
  ASSERT_TRUE(waiter.result.ok());
  EXPECT_THAT(session->Snapshot().warnings(), ::testing::Contains(HasSubstr("in the past")));
}

TEST_F(SessionTest, TerminateEndsTheCaptureEarlyAndKeepsTheData) {
  const int64_t t0 = clock_.WallNs();
  Waiter waiter;
  Start(Request("term", 0, 60'000), waiter);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(500 * kMs);
  sessions_.Terminate("other-session");  // not ours: no effect
  sessions_.Terminate("term");
  waiter.done.WaitForNotification();
  ASSERT_TRUE(waiter.result.ok());
  EXPECT_FALSE(waiter.result->empty_trace);
  EXPECT_EQ(tracer_.stop_ns(), t0 + 500 * kMs);
  EXPECT_TRUE(FileExists(XPlanePath("term")));
}

// SIGTERM mid-capture (the pod deleted): the part recorded is written, and the answer says the
// window was cut short, and where that part is, instead of passing for the window asked for.
TEST_F(SessionTest, AShutdownMidCaptureWritesWhatItHasAndAnswersAborted) {
  Waiter waiter;
  Start(Request("cut", 0, 5000), waiter);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(1500 * kMs);
  sessions_.EndActiveForShutdown();
  waiter.done.WaitForNotification();
  ASSERT_FALSE(waiter.result.ok());
  EXPECT_EQ(waiter.result.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(
      waiter.result.status().message(),
      AllOf(HasSubstr("the sidecar shut down"), HasSubstr("3500.0 ms before the end"),
            HasSubstr("the 1500.0 ms it recorded (3 events)"), HasSubstr(XPlanePath("cut"))));
  EXPECT_TRUE(FileExists(XPlanePath("cut"))) << "what was recorded is kept";
  EXPECT_EQ(sessions_.Find("cut")->Snapshot().state(), clusterprof::v1alpha1::SESSION_STATE_FAILED);
  EXPECT_THAT(observer_.outcomes(), ::testing::ElementsAre("failed"));
  sessions_.EndActiveForShutdown();  // nothing running: no effect
}

TEST_F(SessionTest, TerminateWhileWaitingStillAnswers) {
  Waiter waiter;
  Start(Request("early", clock_.WallNs() + 10'000 * kMs, 1000), waiter);
  clock_.WaitForSleepers(1);
  sessions_.Terminate("early");
  waiter.done.WaitForNotification();
  EXPECT_TRUE(waiter.result.ok()) << waiter.result.status();
}

TEST_F(SessionTest, TheSameSessionJoinsAndAnotherIsRefused) {
  Waiter first;
  Waiter second;
  Waiter third;
  auto session = Start(Request("shared", 0, 1000), first);
  clock_.WaitForSleepers(1);
  auto joined = sessions_.StartOrJoin(Request("shared", 0, 1000), second.Callback());
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->first, session) << "a second request for the session joins it";
  auto refused = sessions_.StartOrJoin(Request("intruder", 0, 1000), third.Callback());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("'shared'"));

  clock_.AdvanceNs(1000 * kMs);
  first.done.WaitForNotification();
  second.done.WaitForNotification();
  EXPECT_TRUE(first.result.ok());
  EXPECT_TRUE(second.result.ok());
  EXPECT_THAT(observer_.outcomes(), ::testing::ElementsAre("ok")) << "captured once";

  // Once done, the next session may start, and the old one is still known.
  Waiter fourth;
  Start(Request("next", 0, 10), fourth);
  EXPECT_NE(sessions_.Find("shared"), nullptr);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(10 * kMs);
  fourth.done.WaitForNotification();
}

TEST_F(SessionTest, ARequestForASessionThatIsDoneGetsItsResultNotASecondCapture) {
  Waiter first;
  auto session = Start(Request("once", 0, 100), first);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(100 * kMs);
  first.done.WaitForNotification();
  ASSERT_TRUE(first.result.ok()) << first.result.status();

  // The client lost the answer and asks again, for a later start.
  Waiter retry;
  auto again = Start(Request("once", clock_.WallNs() + 500 * kMs, 100), retry);
  EXPECT_EQ(again, session);
  ASSERT_TRUE(retry.done.HasBeenNotified()) << "answered at once";
  ASSERT_TRUE(retry.result.ok());
  EXPECT_EQ(retry.result->files.size(), first.result->files.size());
  EXPECT_THAT(observer_.outcomes(), ::testing::ElementsAre("ok")) << "captured once";
}

TEST_F(SessionTest, ASessionThatFailedIsCapturedAgainWhenAskedAgain) {
  // The run directory's parent is a file: the first capture cannot be written.
  testing::WriteFileOrDie(logdir_.Join("plugins"), "not a directory");
  Waiter first;
  Start(Request("flaky", 0, 10), first);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(10 * kMs);
  first.done.WaitForNotification();
  ASSERT_FALSE(first.result.ok());
  std::filesystem::remove(logdir_.Join("plugins"));
  Waiter retry;
  Start(Request("flaky", 0, 10), retry);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(10 * kMs);
  retry.done.WaitForNotification();
  ASSERT_TRUE(retry.result.ok()) << retry.result.status();
  EXPECT_THAT(observer_.outcomes(), ::testing::ElementsAre("failed", "ok"));
}

TEST_F(SessionTest, WhenEveryClientIsGoneTheCaptureStopsAndStillWrites) {
  const int64_t t0 = clock_.WallNs();
  Waiter waiter;
  CaptureSession::ClientId client = 0;
  auto session = Start(Request("cancelled", 0, 60'000), waiter, &client);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(200 * kMs);
  session->Detach(client);
  // Detached clients are not called back; wait for the session itself.
  while (!session->finished()) std::this_thread::yield();
  EXPECT_FALSE(waiter.done.HasBeenNotified());
  EXPECT_EQ(tracer_.stop_ns(), t0 + 200 * kMs);
  EXPECT_TRUE(FileExists(XPlanePath("cancelled")));
  EXPECT_THAT(observer_.outcomes(), ::testing::ElementsAre("cancelled"));
}

TEST_F(SessionTest, AnOutlivingCaptureRunsToItsEndWhenEveryClientIsGone) {
  const int64_t t0 = clock_.WallNs();
  Waiter waiter;
  CaptureSession::ClientId client = 0;
  CaptureRequest request = Request("outlives", 0, 1000);
  request.outlive_client = true;
  auto session = Start(std::move(request), waiter, &client);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(200 * kMs);
  session->Detach(client);
  EXPECT_FALSE(session->finished());
  // A coordinator that comes back joins the same session.
  Waiter rejoined;
  Start(Request("outlives", 0, 1000), rejoined);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(800 * kMs);
  rejoined.done.WaitForNotification();
  ASSERT_TRUE(rejoined.result.ok()) << rejoined.result.status();
  EXPECT_EQ(tracer_.stop_ns(), t0 + 1000 * kMs) << "the planned end, not the disconnect";
  EXPECT_TRUE(FileExists(XPlanePath("outlives")));
  EXPECT_THAT(observer_.outcomes(), ::testing::ElementsAre("ok"));
}

TEST_F(SessionTest, EmitXSpaceReturnsTheSpaceAndWritesNoFile) {
  Waiter waiter;
  Start(Request("inline", 0, 10, /*emit_xspace=*/true), waiter);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(10 * kMs);
  waiter.done.WaitForNotification();
  ASSERT_TRUE(waiter.result.ok());
  ASSERT_NE(waiter.result->xspace, nullptr);
  EXPECT_EQ(xspace::CountEvents(*waiter.result->xspace), 3);
  EXPECT_FALSE(FileExists(XPlanePath("inline")));
}

TEST_F(SessionTest, WhatTheRequestAskedThatNoTracerReadsIsAWarningInTheXSpace) {
  CaptureRequest request = Request("unknown-key", 0, 10, /*emit_xspace=*/true);
  request.warnings.push_back("advanced_configuration[\"tpu_trace_mode\"] is read by none");
  Waiter waiter;
  Start(std::move(request), waiter);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(10 * kMs);
  waiter.done.WaitForNotification();
  ASSERT_TRUE(waiter.result.ok());
  ASSERT_NE(waiter.result->xspace, nullptr);
  EXPECT_THAT(waiter.result->xspace->warnings(), ::testing::Contains(HasSubstr("tpu_trace_mode")));
  EXPECT_EQ(xspace::CountEvents(*waiter.result->xspace), 3) << "and the capture went on";
}

TEST_F(SessionTest, AnEmptyCaptureIsReportedAsEmpty) {
  tracer_.events = 0;
  Waiter waiter;
  Start(Request("quiet", 0, 10), waiter);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(10 * kMs);
  waiter.done.WaitForNotification();
  ASSERT_TRUE(waiter.result.ok());
  EXPECT_TRUE(waiter.result->empty_trace);
  EXPECT_TRUE(FileExists(XPlanePath("quiet"))) << "written anyway: it holds the warnings";
  EXPECT_THAT(observer_.outcomes(), ::testing::ElementsAre("empty"));
}

TEST_F(SessionTest, ATracerThatCannotStartIsAWarning) {
  tracer_.start_error = absl::FailedPreconditionError("no CUDA process");
  Waiter waiter;
  auto session = Start(Request("degraded", 0, 10), waiter);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(10 * kMs);
  waiter.done.WaitForNotification();
  ASSERT_TRUE(waiter.result.ok());
  EXPECT_TRUE(waiter.result->empty_trace);
  EXPECT_THAT(session->Snapshot().warnings(),
              ::testing::Contains(HasSubstr("fake tracer did not start: no CUDA process")));
}

TEST_F(SessionTest, AWriteFailureIsInternalAndSaysHowMuchWasLost) {
  // The run directory's parent is a file: nothing can be created under it.
  testing::WriteFileOrDie(logdir_.Join("plugins"), "not a directory");
  Waiter waiter;
  auto session = Start(Request("unwritable", 0, 10), waiter);
  clock_.WaitForSleepers(1);
  clock_.AdvanceNs(10 * kMs);
  waiter.done.WaitForNotification();
  ASSERT_FALSE(waiter.result.ok());
  EXPECT_EQ(waiter.result.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(waiter.result.status().message()), HasSubstr("recorded 3 events"));
  EXPECT_EQ(session->Snapshot().state(), clusterprof::v1alpha1::SESSION_STATE_FAILED);
  EXPECT_THAT(observer_.outcomes(), ::testing::ElementsAre("failed"));
}

TEST_F(SessionTest, DestroyingTheManagerEndsARunningCapture) {
  Waiter waiter;
  {
    SessionManager sessions(clock_, {&tracer_});
    auto started = sessions.StartOrJoin(Request("shutdown", 0, 60'000), waiter.Callback());
    ASSERT_TRUE(started.ok());
    clock_.WaitForSleepers(1);
  }
  EXPECT_TRUE(waiter.done.HasBeenNotified());
  EXPECT_TRUE(FileExists(XPlanePath("shutdown")));
}

// A SimulatedClock that notes whether the caller is inside RunAtWallNsUnless's at_instant: where
// RealClock keeps the thread raised (RealClock::StartOptions).
class InstantClock final : public Clock {
 public:
  int64_t WallNs() const override { return sim.WallNs(); }
  int64_t MonotonicNs() const override { return sim.MonotonicNs(); }
  void SleepUntilMonotonicNs(int64_t deadline_ns) override {
    sim.SleepUntilMonotonicNs(deadline_ns);
  }
  void SleepUntilWallNs(int64_t deadline_ns) override { sim.SleepUntilWallNs(deadline_ns); }
  bool SleepUntilWallNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop) override {
    return sim.SleepUntilWallNsUnless(deadline_ns, stop);
  }
  bool SleepUntilMonotonicNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop) override {
    return sim.SleepUntilMonotonicNsUnless(deadline_ns, stop);
  }
  void Wake() override { sim.Wake(); }
  bool RunAtWallNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop,
                         absl::FunctionRef<void(int64_t now_ns)> at_instant) override {
    ++instants;
    return sim.RunAtWallNsUnless(deadline_ns, stop, [&](int64_t now_ns) {
      inside = true;
      at_instant(now_ns);
      inside = false;
    });
  }

  SimulatedClock sim;
  std::atomic<bool> inside{false};
  std::atomic<int> instants{0};
};

TEST_F(SessionTest, TheTracersStartWithinTheClocksStartInstant) {
  InstantClock clock;
  std::atomic<bool> started_inside{false};
  tracer_.on_start = [&] { started_inside = clock.inside.load(); };
  SessionManager sessions(clock, {&tracer_});
  const int64_t t0 = clock.sim.WallNs();
  tensorflow::ProfileRequest request;
  request.mutable_opts()->set_version(1);
  request.mutable_opts()->set_host_tracer_level(2);
  request.mutable_opts()->set_duration_ms(10);
  request.mutable_opts()->set_start_timestamp_ns(t0 + 100 * kMs);
  request.set_session_id("instant");
  request.set_host_name("worker-0");
  request.set_emit_xspace(true);
  auto parsed = ParseCaptureRequest(request, RequestPolicy{}, t0);
  ASSERT_TRUE(parsed.ok()) << parsed.status();

  Waiter waiter;
  auto started = sessions.StartOrJoin(*std::move(parsed), waiter.Callback());
  ASSERT_TRUE(started.ok()) << started.status();
  clock.sim.WaitForSleepers(1);
  clock.sim.AdvanceNs(100 * kMs);
  while (started->first->Snapshot().state() != clusterprof::v1alpha1::SESSION_STATE_CAPTURING) {
    std::this_thread::yield();
  }
  clock.sim.WaitForSleepers(1);
  clock.sim.AdvanceNs(10 * kMs);
  waiter.done.WaitForNotification();
  ASSERT_TRUE(waiter.result.ok()) << waiter.result.status();
  EXPECT_EQ(clock.instants, 1);
  EXPECT_TRUE(started_inside) << "the start reading and the tracers' Start go together";
  EXPECT_EQ(started->first->Snapshot().start_error_ns(), 0);
}

// A sidecar that wakes 5 ms after the requested instant T0 (busy CPUs, no SCHED_FIFO) beside a
// workload that annotates all along, with the real annotation tracer and its flight recorder.
class LateWakeTest : public SessionTest {
 protected:
  static constexpr int64_t kWake = 5 * kMs;

  void SetUp() override {
    auto shm = ShmTransport::Create({.dir = shm_dir_.path()});
    ASSERT_TRUE(shm.ok()) << shm.status();
    shm_ = std::move(*shm);
    std::string error;
    shm::RingOptions ring;
    ring.process_name = "trainer";
    ring.max_threads = 2;
    writer_ = shm::RingWriter::Create(shm_dir_.path(), ring, &error);
    ASSERT_NE(writer_, nullptr) << error;
    thread_ = writer_->ClaimThread(7);
  }
  std::unique_ptr<AnnotationTracer> NewAnnotationTracer(uint32_t recorder_level) {
    AnnotationTracer::Options options;
    options.recorder_level = recorder_level;
    options.recorder_window_ms = 10'000;
    options.drain_interval_ms = 3'600'000;  // the test drains
    options.recorder_drain_interval_ms = 3'600'000;
    options.now_ns = [this] { return clock_.WallNs(); };
    auto tracer = AnnotationTracer::Create(shm_.get(), options);
    EXPECT_TRUE(tracer.ok()) << tracer.status();
    return std::move(*tracer);
  }
  void Annotate(std::string_view name, int64_t start_ns, int64_t end_ns) {
    shm::Record record{};
    record.kind = shm::RecordKind::kComplete;
    record.name_id = writer_->Intern(name);
    record.start_ns = start_ns;
    record.end_ns = end_ns;
    thread_->Append(record);
  }
  // Runs a 100 ms capture at T0 = now + 1 s that wakes kWake late; the workload annotates before
  // T0, between T0 and the wake-up (drained by the recorder, and still in its ring), and during
  // the capture. Returns the session's status; `space` gets the XSpace.
  clusterprof::v1alpha1::GetSessionResponse CaptureLate(AnnotationTracer& annotations,
                                                        std::vector<Tracer*> tracers, XSpace* space,
                                                        int64_t* t0_out) {
    SessionManager sessions(clock_, std::move(tracers));
    const int64_t t0 = clock_.WallNs() + 1000 * kMs;
    *t0_out = t0;
    Waiter waiter;
    auto started =
        sessions.StartOrJoin(Request("late", t0, 100, /*emit_xspace=*/true), waiter.Callback());
    EXPECT_TRUE(started.ok()) << started.status();
    std::shared_ptr<CaptureSession> session = started->first;
    clock_.WaitForSleepers(1);
    Annotate("before_instant", t0 - 3 * kMs, t0 - 1 * kMs);
    Annotate("after_instant", t0 + 1 * kMs, t0 + 2 * kMs);
    annotations.DrainOnce();  // the recorder's drain between captures
    Annotate("in_ring", t0 + 3 * kMs, t0 + 4 * kMs);
    clock_.AdvanceNs(1000 * kMs + kWake);
    while (session->Snapshot().state() != clusterprof::v1alpha1::SESSION_STATE_CAPTURING) {
      std::this_thread::yield();
    }
    clock_.WaitForSleepers(1);
    Annotate("during", t0 + 6 * kMs, t0 + 7 * kMs);
    clock_.AdvanceNs(100 * kMs);
    waiter.done.WaitForNotification();
    EXPECT_TRUE(waiter.result.ok()) << waiter.result.status();
    if (waiter.result.ok()) *space = *waiter.result->xspace;
    return session->Snapshot();
  }
  static std::vector<std::string> EventNames(const XSpace& space) {
    std::vector<std::string> names;
    const auto* plane = xspace::FindPlaneWithName(space, xspace::kHostThreadsPlaneName);
    if (plane == nullptr) return names;
    for (const auto& line : plane->lines()) {
      for (const auto& event : line.events()) {
        names.push_back(plane->event_metadata().at(event.metadata_id()).name());
      }
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  static uint64_t ProfileStart(const XSpace& space) {
    const auto* env = xspace::FindPlaneWithName(space, xspace::kTaskEnvPlaneName);
    if (env == nullptr) return 0;
    for (const auto& stat : env->stats()) {
      if (env->stat_metadata().at(stat.metadata_id()).name() == xspace::kProfileStartTime) {
        return stat.uint64_value();
      }
    }
    return 0;
  }

  TempDir shm_dir_;
  std::unique_ptr<ShmTransport> shm_;
  std::unique_ptr<shm::RingWriter> writer_;
  shm::ThreadRing* thread_ = nullptr;
};

TEST_F(LateWakeTest, WithTheRecorderTheDataStartsAtTheRequestedInstant) {
  auto annotations = NewAnnotationTracer(/*recorder_level=*/2);
  XSpace space;
  int64_t t0 = 0;
  auto status = CaptureLate(*annotations, {annotations.get()}, &space, &t0);
  EXPECT_THAT(EventNames(space), ::testing::ElementsAre("after_instant", "during", "in_ring"));
  EXPECT_EQ(status.start_time_ns(), t0);
  EXPECT_EQ(status.start_error_ns(), 0);
  EXPECT_EQ(status.wake_error_ns(), kWake);
  EXPECT_EQ(ProfileStart(space), static_cast<uint64_t>(t0));
  EXPECT_EQ(status.stop_time_ns(), t0 + 100 * kMs + kWake) << "the stop's own wake-up";
}

TEST_F(LateWakeTest, WithoutTheRecorderTheDataStartsAtTheWakeUp) {
  auto annotations = NewAnnotationTracer(/*recorder_level=*/0);
  XSpace space;
  int64_t t0 = 0;
  auto status = CaptureLate(*annotations, {annotations.get()}, &space, &t0);
  EXPECT_THAT(EventNames(space), ::testing::ElementsAre("during"));
  EXPECT_EQ(status.start_time_ns(), t0 + kWake);
  EXPECT_EQ(status.start_error_ns(), kWake);
  EXPECT_EQ(status.wake_error_ns(), kWake);
  EXPECT_EQ(ProfileStart(space), static_cast<uint64_t>(t0 + kWake));
}

TEST_F(LateWakeTest, ATracerThatRecordsOnlyFromItsStartKeepsTheWakeUpAsTheStart) {
  auto annotations = NewAnnotationTracer(/*recorder_level=*/2);
  tracer_.events = 0;  // a GPU tracer, say: its data starts when it starts
  XSpace space;
  int64_t t0 = 0;
  auto status = CaptureLate(*annotations, {annotations.get(), &tracer_}, &space, &t0);
  EXPECT_EQ(status.start_time_ns(), t0 + kWake);
  EXPECT_EQ(status.start_error_ns(), kWake);
  EXPECT_EQ(status.wake_error_ns(), kWake);
  // The annotations still reach back to T0 (aligned across hosts); the capture as a whole starts
  // at the wake-up, where the GPU data begins.
  EXPECT_THAT(EventNames(space), ::testing::ElementsAre("after_instant", "during", "in_ring"));
  EXPECT_EQ(tracer_.window().requested_start_ns, t0);
}

TEST_F(LateWakeTest, ATracerWithNothingToRecordDoesNotHoldTheStartBack) {
  auto annotations = NewAnnotationTracer(/*recorder_level=*/2);
  tracer_.events = 0;
  tracer_.data_start = [](const CaptureWindow&) { return int64_t{0}; };  // a GPU tracer, no CUDA
  XSpace space;
  int64_t t0 = 0;
  auto status = CaptureLate(*annotations, {annotations.get(), &tracer_}, &space, &t0);
  EXPECT_EQ(status.start_error_ns(), 0);
  EXPECT_EQ(status.wake_error_ns(), kWake);
  EXPECT_THAT(EventNames(space), ::testing::ElementsAre("after_instant", "during", "in_ring"));
}

}  // namespace
}  // namespace clusterprof::sidecar
