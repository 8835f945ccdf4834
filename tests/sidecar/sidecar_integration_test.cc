// clusterprof-sidecar and the coordinator as real processes on loopback: several sidecars, each
// next to an annotating workload, captured together; and the faults a capture must survive.
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "common/xspace/xspace_io.h"
#include "coordinator/coordinator.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"

namespace clusterprof {
namespace {

using coordinator::Outcome;
using ::testing::HasSubstr;
using testing::ListFilesRecursively;
using testing::Subprocess;
using testing::TempDir;

constexpr char kSidecar[] = CLUSTERPROF_SIDECAR_PATH;
constexpr char kAnnotator[] = CLUSTERPROF_TEST_ANNOTATOR_PATH;
constexpr char kCli[] = CLUSTERPROF_CLI_PATH;

// One sidecar (and optionally its workload), standing in for a host.
class Host {
 public:
  // `flags`: more sidecar flags.
  Host(const TempDir& root, int index, const std::string& logs,
       const std::vector<std::string>& flags = {})
      : index_(index) {
    shm_dir_ = root.Join(StrCat("shm", index));
    const std::string port_file = root.Join(StrCat("ports", index));
    log_ = root.Join(StrCat("sidecar", index, ".log"));
    std::vector<std::string> argv = {kSidecar,  "--port",           "0",      "--http-port",
                                     "-1",      "--shm-dir",        shm_dir_, "--port-file",
                                     port_file, "--allowed-logdir", logs,     "--host-name",
                                     name(),    "--log-level",      "debug"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    sidecar_ = std::make_unique<Subprocess>(argv, std::map<std::string, std::string>{}, log_);
    port_ = testing::ReadGrpcPort(port_file);
    EXPECT_NE(port_, 0) << "sidecar " << index << " did not start";
    channel_ = grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
  }

  void StartWorkload(std::vector<std::string> args = {}) {
    std::vector<std::string> argv = {kAnnotator};
    argv.insert(argv.end(), args.begin(), args.end());
    workload_ = std::make_unique<Subprocess>(
        argv, std::map<std::string, std::string>{{"CLUSTERPROF_DIR", shm_dir_}}, log_);
  }

  std::string name() const { return StrCat("host-", index_); }
  std::string address() const { return StrCat("127.0.0.1:", port_); }
  const std::string& shm_dir() const { return shm_dir_; }
  Subprocess& workload() { return *workload_; }
  std::string Log() const { return testing::ReadFileOrDie(log_); }

  std::unique_ptr<tensorflow::ProfilerService::Stub> Profiler() const {
    return tensorflow::ProfilerService::NewStub(channel_);
  }
  std::unique_ptr<clusterprof::v1alpha1::Sidecar::Stub> Sidecar() const {
    return clusterprof::v1alpha1::Sidecar::NewStub(channel_);
  }

 private:
  int index_;
  int port_ = 0;
  std::string shm_dir_;
  std::string log_;
  std::unique_ptr<Subprocess> sidecar_;
  std::unique_ptr<Subprocess> workload_;
  std::shared_ptr<grpc::Channel> channel_;
};

class SidecarIntegrationTest : public ::testing::Test {
 protected:
  SidecarIntegrationTest() : logs_(root_.Join("logs")) {}

  std::vector<std::unique_ptr<Host>> StartHosts(int count, bool workloads = true) {
    std::vector<std::unique_ptr<Host>> hosts;
    for (int i = 0; i < count; ++i) {
      hosts.push_back(std::make_unique<Host>(root_, i, logs_));
      if (workloads) hosts.back()->StartWorkload();
    }
    return hosts;
  }

  storage::RunLayout Layout(std::string_view run) {
    return *storage::RunLayout::Create(*storage::ParseLogdir(logs_), run);
  }

  coordinator::CaptureOptions Options(const std::vector<std::unique_ptr<Host>>& hosts) {
    coordinator::CaptureOptions options;
    for (const auto& host : hosts) options.targets.push_back({host->address(), ""});
    options.layout = Layout("capture");
    options.duration_ms = 600;
    options.delay_ms = 300;
    options.retry_backoff_ms = 200;
    return options;
  }

  tensorflow::ProfileRequest ProfileRequest(std::string_view session, int64_t duration_ms) {
    tensorflow::ProfileRequest request;
    request.mutable_opts()->set_version(1);
    request.mutable_opts()->set_host_tracer_level(2);
    request.mutable_opts()->set_duration_ms(duration_ms);
    request.set_session_id(std::string(session));
    request.set_host_name("direct");
    request.set_repository_root(StrCat(logs_, "/plugins/profile"));
    return request;
  }

  clusterprof::v1alpha1::GetSessionResponse WaitForSession(const Host& host,
                                                           std::string_view session) {
    auto stub = host.Sidecar();
    clusterprof::v1alpha1::GetSessionResponse response;
    for (int i = 0; i < 1000; ++i) {
      grpc::ClientContext context;
      clusterprof::v1alpha1::GetSessionRequest request;
      request.set_session_id(std::string(session));
      response.Clear();
      if (stub->GetSession(&context, request, &response).ok() &&
          (response.state() == clusterprof::v1alpha1::SESSION_STATE_DONE ||
           response.state() == clusterprof::v1alpha1::SESSION_STATE_FAILED)) {
        return response;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "session " << session << " did not finish";
    return response;
  }

  TempDir root_;
  const std::string logs_;
  RealClock clock_;
};

TEST_F(SidecarIntegrationTest, CapturesAcrossFourSidecars) {
  auto hosts = StartHosts(4);
  coordinator::CaptureOptions options = Options(hosts);
  options.layout = Layout("four_hosts");
  auto result = coordinator::Capture(options, clock_);
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << hosts[0]->Log();
  EXPECT_EQ(result->succeeded, 4);
  ASSERT_EQ(result->targets.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const coordinator::TargetResult& target = result->targets[i];
    SCOPED_TRACE(target.host_name);
    EXPECT_EQ(target.host_name, hosts[i]->name()) << "the sidecar's own name is used";
    EXPECT_EQ(target.outcome, Outcome::kOk) << target.message;
    EXPECT_TRUE(target.is_sidecar);
    EXPECT_GE(target.clock_uncertainty_ns, 0);
    EXPECT_TRUE(target.start_known);
    // Annotations only (no GPU here), the flight recorder on: the data starts at T0 itself,
    // however late the sidecar woke (docs/sidecar.md, "Start").
    EXPECT_EQ(target.start_error_ns, 0) << "wake error " << target.wake_error_ns;
    EXPECT_GE(target.wake_error_ns, 0);
    EXPECT_GT(target.events, 0u);
    EXPECT_GT(target.bytes, 0u);
    ASSERT_EQ(target.files.size(), 2u);

    auto loaded = xspace::ReadXSpaceFile(target.files[0]);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const auto& space = (*loaded)->space();
    EXPECT_THAT(space.hostnames(), ::testing::ElementsAre(hosts[i]->name()));
    const auto* plane = xspace::FindPlaneWithName(space, xspace::kHostThreadsPlaneName);
    ASSERT_NE(plane, nullptr);
    std::set<std::string> lines;
    for (const auto& line : plane->lines()) lines.insert(line.name());
    EXPECT_THAT(lines, ::testing::Contains("worker-0"));
    EXPECT_EQ(static_cast<uint64_t>(xspace::CountEvents(space)), target.events);
  }
  EXPECT_TRUE(
      testing::FileExists(StrCat(logs_, "/plugins/profile/four_hosts/clusterprof_run.json")));
  EXPECT_EQ(result->manifest_uri,
            StrCat(logs_, "/plugins/profile/four_hosts/clusterprof_run.json"));
}

// As the operator captures (outlive_client): each sidecar says it took the request, the
// coordinator lets the call go and closes the connection, the sidecars record the whole window
// without a client, and the results are read back from their sessions.
TEST_F(SidecarIntegrationTest, ReleasedCallsStillGiveEveryHostsFullCapture) {
  auto hosts = StartHosts(3);
  coordinator::CaptureOptions options = Options(hosts);
  options.layout = Layout("released");
  options.outlive_client = true;
  options.duration_ms = 800;
  auto result = coordinator::Capture(options, clock_);
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << hosts[0]->Log();
  EXPECT_EQ(result->succeeded, 3);
  for (size_t i = 0; i < hosts.size(); ++i) {
    const coordinator::TargetResult& target = result->targets[i];
    SCOPED_TRACE(target.host_name);
    EXPECT_EQ(target.outcome, Outcome::kOk) << target.message;
    EXPECT_EQ(target.attempts, 1);
    EXPECT_TRUE(target.start_known);
    EXPECT_GT(target.events, 0u) << "read from the session";
    ASSERT_EQ(target.files.size(), 2u);
    EXPECT_TRUE(testing::FileExists(target.files[0]));
    EXPECT_NE(target.digest, nullptr) << target.digest_note;
    // The call was let go before the capture: the sidecar went on alone.
    EXPECT_THAT(hosts[i]->Log(), HasSubstr("every client went away; capturing to the planned end"));
    auto session = WaitForSession(*hosts[i], "released");
    EXPECT_GE(session.stop_time_ns() - session.start_time_ns(), 750 * kNanosPerMilli)
        << "the whole window, not cut short when the call went";
  }
  EXPECT_TRUE(testing::FileExists(StrCat(logs_, "/plugins/profile/released/clusterprof_run.json")));
}

TEST_F(SidecarIntegrationTest, ADownSidecarIsReportedAndTheOthersSucceed) {
  auto hosts = StartHosts(2);
  coordinator::CaptureOptions options = Options(hosts);
  const std::string down = StrCat("127.0.0.1:", testing::UnusedPort());
  options.targets.push_back({down, ""});
  options.targets[0].address = StrCat("grpc://", hosts[0]->address());  // stripped, as upstream
  options.num_tracing_attempts = 2;
  auto result = coordinator::Capture(options, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->targets[0].address, hosts[0]->address());
  EXPECT_EQ(result->succeeded, 2);
  EXPECT_EQ(result->failed, 1);
  const coordinator::TargetResult& failed = result->targets[2];
  EXPECT_EQ(failed.address, down);
  EXPECT_EQ(failed.outcome, Outcome::kFailed);
  EXPECT_THAT(failed.message, HasSubstr("UNAVAILABLE"));
  EXPECT_EQ(failed.attempts, 2) << "UNAVAILABLE is retried";
  EXPECT_EQ(result->targets[0].attempts, 1) << "hosts that succeeded are not captured again";
}

TEST_F(SidecarIntegrationTest, NoHostWithDataFailsLikeUpstream) {
  coordinator::CaptureOptions options;
  options.targets.push_back({StrCat("127.0.0.1:", testing::UnusedPort()), ""});
  options.layout = Layout("unreachable");
  options.duration_ms = 100;
  options.num_tracing_attempts = 1;
  auto result = coordinator::Capture(options, clock_);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("No trace event was collected"));
}

TEST_F(SidecarIntegrationTest, ABusySidecarAnswersAlreadyExistsThenARetrySucceeds) {
  auto hosts = StartHosts(1);
  // Another client's capture keeps the sidecar busy for 800 ms.
  std::thread blocker([&] {
    grpc::ClientContext context;
    tensorflow::ProfileResponse response;
    auto stub = hosts[0]->Profiler();
    EXPECT_TRUE(stub->Profile(&context, ProfileRequest("blocker", 800), &response).ok());
  });
  auto sidecar = hosts[0]->Sidecar();
  for (int i = 0; i < 500; ++i) {  // wait until it is capturing
    grpc::ClientContext context;
    clusterprof::v1alpha1::GetInfoResponse info;
    sidecar->GetInfo(&context, {}, &info);
    if (info.active_session_id() == "blocker") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  coordinator::CaptureOptions options = Options(hosts);
  options.delay_ms = 0;
  options.fan_out_lead_ms = 50;
  options.retry_backoff_ms = 1500;
  options.num_tracing_attempts = 2;
  auto result = coordinator::Capture(options, clock_);
  blocker.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->targets[0].outcome, Outcome::kOk);
  EXPECT_EQ(result->targets[0].attempts, 2);
  EXPECT_THAT(hosts[0]->Log(), HasSubstr("another capture is running"));
}

TEST_F(SidecarIntegrationTest, TerminateEndsACaptureEarlyAndKeepsItsData) {
  auto hosts = StartHosts(1);
  const auto begin = std::chrono::steady_clock::now();
  grpc::Status status;
  std::thread capture([&] {
    grpc::ClientContext context;
    tensorflow::ProfileResponse response;
    status = hosts[0]->Profiler()->Profile(&context, ProfileRequest("long", 20'000), &response);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  grpc::ClientContext context;
  tensorflow::TerminateRequest terminate;
  terminate.set_session_id("long");
  tensorflow::TerminateResponse terminated;
  ASSERT_TRUE(hosts[0]->Profiler()->Terminate(&context, terminate, &terminated).ok());
  capture.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(15))
      << "Terminate ended the 20 s capture";
  auto session = WaitForSession(*hosts[0], "long");
  EXPECT_EQ(session.state(), clusterprof::v1alpha1::SESSION_STATE_DONE);
  EXPECT_GT(session.events(), 0u);
  EXPECT_TRUE(testing::FileExists(StrCat(logs_, "/plugins/profile/long/direct.xplane.pb")));
}

TEST_F(SidecarIntegrationTest, ACancelledClientStillGetsItsFilesWritten) {
  auto hosts = StartHosts(1);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(700));
  tensorflow::ProfileResponse response;
  const grpc::Status status =
      hosts[0]->Profiler()->Profile(&context, ProfileRequest("gone", 20'000), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  auto session = WaitForSession(*hosts[0], "gone");
  EXPECT_EQ(session.state(), clusterprof::v1alpha1::SESSION_STATE_DONE);
  EXPECT_GT(session.events(), 0u);
  EXPECT_LT(session.stop_time_ns() - session.start_time_ns(), 15'000'000'000LL)
      << "the capture stopped when its client went away";
  EXPECT_TRUE(testing::FileExists(StrCat(logs_, "/plugins/profile/gone/direct.xplane.pb")));
}

// A coordinator that went away mid-capture (an operator killed) and a successor resuming the
// run: the finished session is read back, the running one (kept alive by
// clusterprof_outlive_client) joined, the one that never started is captured; none twice.
TEST_F(SidecarIntegrationTest, AResumedRunReadsBackJoinsAndCapturesWithoutRepeating) {
  auto hosts = StartHosts(3);
  const std::string run = "resumed";
  // Host 0 finished the run before the first coordinator died.
  {
    tensorflow::ProfileRequest request = ProfileRequest(run, 300);
    request.set_host_name("host-0");
    grpc::ClientContext context;
    tensorflow::ProfileResponse response;
    ASSERT_TRUE(hosts[0]->Profiler()->Profile(&context, request, &response).ok());
  }
  // Host 1 is still capturing for it; its client is gone.
  const int64_t t0 = clock_.WallNs() + 300 * kNanosPerMilli;
  {
    tensorflow::ProfileRequest request = ProfileRequest(run, 1500);
    request.set_host_name("host-1");
    request.mutable_opts()->set_start_timestamp_ns(t0);
    (*request.mutable_opts()->mutable_advanced_configuration())["clusterprof_outlive_client"]
        .set_bool_value(true);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    tensorflow::ProfileResponse response;
    EXPECT_EQ(hosts[1]->Profiler()->Profile(&context, request, &response).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // Host 2 never heard of it.
  coordinator::CaptureOptions options = Options(hosts);
  for (size_t i = 0; i < hosts.size(); ++i) options.targets[i].host_name = hosts[i]->name();
  options.layout = Layout(run);
  options.resume = true;
  options.start_at_ns = t0;
  options.attempts_used = 0;
  options.duration_ms = 400;
  auto result = coordinator::Capture(options, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 3);
  const coordinator::TargetResult& read_back = result->targets[0];
  EXPECT_TRUE(read_back.recovered);
  EXPECT_EQ(read_back.attempts, 1);
  EXPECT_FALSE(result->targets[1].recovered);
  EXPECT_TRUE(result->targets[1].start_known);
  EXPECT_LT(std::abs(result->targets[1].start_error_ns), 200 * kNanosPerMilli)
      << "the joined session is judged against the T0 it started for";
  EXPECT_FALSE(result->targets[2].recovered);
  for (const auto& host : hosts) {
    SCOPED_TRACE(host->name());
    EXPECT_THAT(host->Log(), ::testing::Not(HasSubstr("another capture is running")));
    EXPECT_TRUE(testing::FileExists(
        StrCat(logs_, "/plugins/profile/", run, "/", host->name(), ".xplane.pb")));
  }
  // Host 1's capture ran its full 1.5 s, not the resumed request's 400 ms.
  auto session = WaitForSession(*hosts[1], run);
  EXPECT_GE(session.stop_time_ns() - session.start_time_ns(), 1400 * kNanosPerMilli);
}

TEST_F(SidecarIntegrationTest, ACrashingWorkloadKeepsItsEventsUpToTheCrash) {
  // Without the flight recorder the workload records only while the capture runs, so it crashes
  // in the capture.
  std::vector<std::unique_ptr<Host>> hosts;
  hosts.push_back(
      std::make_unique<Host>(root_, 0, logs_, std::vector<std::string>{"--recorder-level", "0"}));
  hosts[0]->StartWorkload({"--threads", "1", "--crash-after", "40"});
  coordinator::CaptureOptions options = Options(hosts);
  options.duration_ms = 1500;
  auto result = coordinator::Capture(options, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  auto exit = hosts[0]->workload().Wait(std::chrono::seconds(5));
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(WIFSIGNALED(*exit) && WTERMSIG(*exit) == SIGKILL) << "the workload crashed";
  EXPECT_GE(result->targets[0].events, 40u) << "its events up to the crash are kept";
  auto loaded = xspace::ReadXSpaceFile(result->targets[0].files[0]);
  ASSERT_TRUE(loaded.ok());
  int steps = 0;
  const auto* plane = xspace::FindPlaneWithName((*loaded)->space(), xspace::kHostThreadsPlaneName);
  for (const auto& line : plane->lines()) {
    for (const auto& event : line.events()) {
      steps += plane->event_metadata().at(event.metadata_id()).name() == "step";
    }
  }
  EXPECT_EQ(steps, 20);
  EXPECT_THAT(ListFilesRecursively(hosts[0]->shm_dir()), ::testing::ElementsAre("control"))
      << "the dead process's ring was removed after its last drain";
}

TEST_F(SidecarIntegrationTest, TheLookbackHoldsTheLastStepsOfAWorkloadThatCrashedBeforeTheCapture) {
  // With the flight recorder (the default) the workload records from its start and crashes
  // before anyone asks for a capture; a capture with a lookback still has its last steps.
  std::vector<std::unique_ptr<Host>> hosts;
  hosts.push_back(std::make_unique<Host>(root_, 0, logs_));
  hosts[0]->StartWorkload({"--threads", "1", "--crash-after", "40"});
  auto exit = hosts[0]->workload().Wait(std::chrono::seconds(20));
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(WIFSIGNALED(*exit) && WTERMSIG(*exit) == SIGKILL) << "the workload crashed";
  coordinator::CaptureOptions options = Options(hosts);
  options.duration_ms = 300;
  (*options.profile.mutable_advanced_configuration())["clusterprof_lookback_ms"].set_int64_value(
      20'000);
  auto result = coordinator::Capture(options, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(result->targets[0].lookback_ns, 0);
  auto loaded = xspace::ReadXSpaceFile(result->targets[0].files[0]);
  ASSERT_TRUE(loaded.ok());
  int steps = 0;
  const auto* plane = xspace::FindPlaneWithName((*loaded)->space(), xspace::kHostThreadsPlaneName);
  ASSERT_NE(plane, nullptr);
  for (const auto& line : plane->lines()) {
    for (const auto& event : line.events()) {
      steps += plane->event_metadata().at(event.metadata_id()).name() == "step";
    }
  }
  EXPECT_EQ(steps, 20) << "every step up to the crash, from before the capture";
}

TEST_F(SidecarIntegrationTest, WatchStepsStreamsTheLiveStepsWithoutACapture) {
  auto hosts = StartHosts(1);
  auto sidecar = hosts[0]->Sidecar();
  // The workload marks a step_num on each "step": the stream carries them, first the recent
  // ones, then each new one once, with heartbeats in between.
  grpc::ClientContext context;
  clusterprof::v1alpha1::WatchStepsRequest request;
  request.set_history(8);
  auto reader = sidecar->WatchSteps(&context, request);
  clusterprof::v1alpha1::WatchStepsResponse message;
  std::vector<int64_t> steps;
  int messages = 0;
  RealClock real;
  const int64_t guard = real.MonotonicNs() + 30 * kNanosPerSecond;
  while (steps.size() < 20 && real.MonotonicNs() < guard && reader->Read(&message)) {
    ++messages;
    EXPECT_EQ(message.host_name(), "host-0");
    EXPECT_EQ(message.recorder_level(), 2);
    EXPECT_EQ(message.recorder_window_ms(), 30000);
    if (messages == 1) {
      EXPECT_LE(message.steps_size(), 8);
    }
    for (const auto& step : message.steps()) {
      EXPECT_GT(step.end_ns(), step.start_ns());
      steps.push_back(step.step());
    }
  }
  context.TryCancel();
  reader->Finish();
  ASSERT_GE(steps.size(), 20u);
  for (size_t i = 1; i < steps.size(); ++i) EXPECT_LT(steps[i - 1], steps[i]) << "each once";

  grpc::ClientContext bad_context;
  request.set_history(5000);
  auto bad = sidecar->WatchSteps(&bad_context, request);
  while (bad->Read(&message)) {
  }
  const grpc::Status refused = bad->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("history 5000"));
}

TEST_F(SidecarIntegrationTest, AStartInThePastStartsAtOnce) {
  auto hosts = StartHosts(1);
  tensorflow::ProfileRequest request = ProfileRequest("past", 300);
  request.mutable_opts()->set_start_timestamp_ns(clock_.WallNs() - 5'000'000'000LL);
  grpc::ClientContext context;
  tensorflow::ProfileResponse response;
  ASSERT_TRUE(hosts[0]->Profiler()->Profile(&context, request, &response).ok());
  auto session = WaitForSession(*hosts[0], "past");
  EXPECT_GE(session.start_error_ns(), 5'000'000'000LL);
  EXPECT_THAT(session.warnings(), ::testing::Contains(HasSubstr("in the past")));
}

TEST_F(SidecarIntegrationTest, UnsafePathsAreRefusedAndNothingIsWritten) {
  auto hosts = StartHosts(1, /*workloads=*/false);
  auto profiler = hosts[0]->Profiler();
  auto call = [&](const tensorflow::ProfileRequest& request) {
    grpc::ClientContext context;
    tensorflow::ProfileResponse response;
    return profiler->Profile(&context, request, &response);
  };
  tensorflow::ProfileRequest outside = ProfileRequest("ok", 100);
  outside.set_repository_root(root_.Join("elsewhere/plugins/profile"));
  grpc::Status status = call(outside);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("--allowed-logdir"));

  tensorflow::ProfileRequest escape = ProfileRequest("ok", 100);
  escape.set_repository_root(StrCat(logs_, "/../escape/plugins/profile"));
  EXPECT_EQ(call(escape).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  EXPECT_EQ(call(ProfileRequest("../../x", 100)).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  tensorflow::ProfileRequest host = ProfileRequest("ok", 100);
  host.mutable_opts()->set_override_hostname("../evil");
  EXPECT_EQ(call(host).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  std::vector<std::string> files = ListFilesRecursively(root_.path());
  for (const std::string& file : files) {
    EXPECT_FALSE(StartsWith(file, "logs") || StartsWith(file, "elsewhere") ||
                 StartsWith(file, "escape") || file == "x")
        << "written: " << file;
  }
}

// A workload sharing the logdir swaps a directory on the way to the run directory for a link to
// elsewhere, again and again, while captures run: the request's check and the files' write are a
// capture apart, but no file ever appears outside; each capture's files land inside, or the call
// fails saying why.
TEST_F(SidecarIntegrationTest, ALinkSwappedIntoTheLogdirDuringCapturesNeverRedirectsTheirFiles) {
  auto hosts = StartHosts(1, /*workloads=*/false);
  const std::string outside = root_.Join("outside");
  const std::string plugins = StrCat(logs_, "/tb/plugins");
  const std::string link = StrCat(logs_, "/tb/link");
  std::filesystem::create_directories(StrCat(plugins, "/profile"));
  std::filesystem::create_directories(outside);
  ASSERT_EQ(symlink(outside.c_str(), link.c_str()), 0);
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    // One step each way: `plugins` is always the directory or the link.
    while (!stop.load()) {
      renameat2(AT_FDCWD, plugins.c_str(), AT_FDCWD, link.c_str(), RENAME_EXCHANGE);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::map<grpc::StatusCode, int> codes;
  std::vector<std::string> written;  // sessions answered OK
  auto profiler = hosts[0]->Profiler();
  for (int i = 0; i < 40; ++i) {
    tensorflow::ProfileRequest request = ProfileRequest(StrCat("swap", i), 20);
    request.set_repository_root(StrCat(plugins, "/profile"));
    grpc::ClientContext context;
    tensorflow::ProfileResponse response;
    const grpc::Status status = profiler->Profile(&context, request, &response);
    codes[status.error_code()]++;
    switch (status.error_code()) {
      case grpc::StatusCode::OK:
        written.push_back(request.session_id());
        break;
      case grpc::StatusCode::PERMISSION_DENIED:  // the check saw the link
        EXPECT_THAT(status.error_message(), HasSubstr("outside the logdirs"));
        break;
      case grpc::StatusCode::INTERNAL:  // the write met it
        EXPECT_THAT(status.error_message(),
                    HasSubstr(StrCat("is a symbolic link to ", outside, ", outside ", logs_)));
        break;
      default:
        ADD_FAILURE() << status.error_code() << ": " << status.error_message();
    }
  }
  stop = true;
  swapper.join();
  std::printf("captures: %d written, %d refused by the check, %d refused by the write\n",
              codes[grpc::StatusCode::OK], codes[grpc::StatusCode::PERMISSION_DENIED],
              codes[grpc::StatusCode::INTERNAL]);
  std::vector<std::string> escaped;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(outside)) {
    escaped.push_back(entry.path().string());
  }
  EXPECT_THAT(escaped, ::testing::IsEmpty());
  // Each capture that succeeded has both files inside, under whichever name the directory had
  // (the swap moves it between two names); one that failed may have written its first file.
  const std::vector<std::string> files = ListFilesRecursively(logs_);
  for (const std::string& session : written) {
    for (const char* name : {"direct.xplane.pb", "direct.trace.json.gz"}) {
      const std::string file = StrCat("/profile/", session, "/", name);
      const auto copies = std::count(files.begin(), files.end(), StrCat("tb/plugins", file)) +
                          std::count(files.begin(), files.end(), StrCat("tb/link", file));
      EXPECT_EQ(copies, 1) << file;
    }
  }
}

TEST_F(SidecarIntegrationTest, TheCliPrintsASummaryAndFailsWithoutData) {
  auto hosts = StartHosts(2);
  const std::string out = root_.Join("cli.out");
  Subprocess ok({kCli, "capture", "--service-addr",
                 StrCat("grpc://", hosts[0]->address(), ",", hosts[1]->address()), "--logdir",
                 logs_, "--duration-ms", "400", "--run", "cli_run"},
                {}, out);
  auto status = ok.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(status.has_value());
  const std::string text = testing::ReadFileOrDie(out);
  EXPECT_EQ(WEXITSTATUS(*status), 0) << text;
  EXPECT_THAT(text, HasSubstr("host-0"));
  EXPECT_THAT(text, HasSubstr("2 of 2 hosts returned data"));
  EXPECT_THAT(text, HasSubstr("plugins/profile/cli_run"));

  const std::string failed_out = root_.Join("cli_failed.out");
  Subprocess failed({kCli, "capture", "--service-addr", StrCat("127.0.0.1:", testing::UnusedPort()),
                     "--logdir", logs_, "--duration-ms", "100", "--num-tracing-attempts", "1"},
                    {}, failed_out);
  status = failed.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 1);
  EXPECT_THAT(testing::ReadFileOrDie(failed_out), HasSubstr("No trace event was collected"));
}

TEST_F(SidecarIntegrationTest, TheCliSendsItsOptionsAndAKeyNoTracerReadsIsAWarning) {
  auto hosts = StartHosts(1);
  const std::string out = root_.Join("cli_option.out");
  Subprocess cli({kCli, "capture", "--service-addr", hosts[0]->address(), "--logdir", logs_,
                  "--duration-ms", "200", "--run", "with_options", "--host-tracer-level", "3",
                  "--option", "tpu_trace_mode=TRACE_ONLY_XLA", "--no-progress"},
                 {}, out);
  auto status = cli.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(status.has_value());
  ASSERT_EQ(WEXITSTATUS(*status), 0) << testing::ReadFileOrDie(out);
  auto loaded = xspace::ReadXSpaceFile(
      StrCat(logs_, "/plugins/profile/with_options/", hosts[0]->name(), ".xplane.pb"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_THAT(
      (*loaded)->space().warnings(),
      ::testing::Contains(::testing::AllOf(HasSubstr("\"tpu_trace_mode\""), HasSubstr("ignored"))));
  EXPECT_THAT(hosts[0]->Log(), HasSubstr("tpu_trace_mode"));

  const std::string bad_out = root_.Join("cli_bad_option.out");
  Subprocess bad({kCli, "capture", "--service-addr", hosts[0]->address(), "--logdir", logs_,
                  "--option", "no_equals_sign"},
                 {}, bad_out);
  status = bad.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_NE(WEXITSTATUS(*status), 0);
  EXPECT_THAT(testing::ReadFileOrDie(bad_out), HasSubstr("is not KEY=VALUE"));
}

// A port another process holds: the sidecar exits, naming the flag that moves it.
TEST(SidecarPortsTest, APortInUseNamesTheFlagThatMovesIt) {
  testing::HeldPort taken;
  ASSERT_NE(taken.port(), 0);
  const std::string port = std::to_string(taken.port());
  const struct {
    std::vector<std::string> ports;
    std::string flag;
  } cases[] = {
      {{"--port", port, "--http-port", "0"},
       "choose another port with --port (0 picks a free one)"},
      {{"--port", "0", "--http-port", port},
       "choose another port with --http-port (0 picks a free one, -1 serves no HTTP)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.flag);
    TempDir root;
    std::vector<std::string> argv = {kSidecar,         "--address",      "127.0.0.1",
                                     "--shm-dir",      root.Join("shm"), "--allowed-logdir",
                                     root.Join("logs")};
    argv.insert(argv.end(), c.ports.begin(), c.ports.end());
    Subprocess sidecar(argv, {}, root.Join("log"));
    const std::optional<int> status = sidecar.Wait(std::chrono::seconds(30));
    const std::string log = testing::ReadFileOrDie(root.Join("log"));
    ASSERT_TRUE(status.has_value()) << "the sidecar kept running:\n" << log;
    EXPECT_NE(*status, 0);
    EXPECT_THAT(log, HasSubstr(StrCat("127.0.0.1:", port)));
    EXPECT_THAT(log, HasSubstr(c.flag));
  }
}

}  // namespace
}  // namespace clusterprof
