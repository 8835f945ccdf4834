// The coordinator driving a TensorFlow/JAX profiler server beside a clusterprof sidecar, as real
// processes on loopback. TensorFlow cannot be installed here, so tf_profiler_server.py stands in
// for `tf.profiler.experimental.server.start(port)`: Python grpcio serving only
// tensorflow.ProfilerService (no clusterprof Sidecar service), behaving as docs/protocol.md says
// upstream's server does, with stubs generated at test time from proto/ by grpc_tools.protoc.
// It records the start it was asked for and the start it made in a side file.
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "analysis/report.h"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "common/storage/logdir.h"
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

// cpprestsdk's U() macro collides with gtest's templates unless turned off.
#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/json.h>

namespace clusterprof {
namespace {

using coordinator::Outcome;
using coordinator::TargetResult;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::Subprocess;
using testing::TempDir;

constexpr char kSidecar[] = CLUSTERPROF_SIDECAR_PATH;
constexpr char kAnnotator[] = CLUSTERPROF_TEST_ANNOTATOR_PATH;
constexpr char kPython[] = CLUSTERPROF_TEST_PYTHON;
constexpr char kProtoDir[] = CLUSTERPROF_PROTO_DIR;
constexpr char kServerScript[] = CLUSTERPROF_SOURCE_DIR "/tests/coordinator/tf_profiler_server.py";
constexpr auto kProcessTimeout = std::chrono::seconds(120);

// Runs `argv` to its end with its output in `log`; the exit code, or -1 (signal or timeout).
int RunToEnd(const std::vector<std::string>& argv, const std::string& log) {
  Subprocess process(argv, {}, log);
  const std::optional<int> status = process.Wait(kProcessTimeout);
  return status.has_value() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
}

// Python with -I: no PYTHON* variables from the environment (python3 on PATH may be another
// interpreter whose settings do not fit Debian's) and no user site-packages; -B: no .pyc files
// in the source tree.
std::vector<std::string> PythonArgv(std::vector<std::string> args) {
  std::vector<std::string> argv = {kPython, "-B", "-I"};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// One line of the stand-in's side file: `event=started session_id=run ...`.
using RecordLine = std::map<std::string, std::string>;

int64_t Int(const RecordLine& line, const std::string& key) {
  auto it = line.find(key);
  return it == line.end() ? -1 : std::stoll(it->second);
}

// A clusterprof-sidecar with a test_annotator workload beside it.
class SidecarHost {
 public:
  SidecarHost(const TempDir& root, const std::string& logs) {
    const std::string shm_dir = root.Join("shm");
    const std::string port_file = root.Join("sidecar.ports");
    log_ = root.Join("sidecar.log");
    sidecar_ = std::make_unique<Subprocess>(
        std::vector<std::string>{kSidecar, "--port", "0", "--http-port", "-1", "--shm-dir", shm_dir,
                                 "--port-file", port_file, "--allowed-logdir", logs, "--host-name",
                                 name(), "--log-level", "debug"},
        std::map<std::string, std::string>{}, log_);
    port_ = testing::ReadGrpcPort(port_file);
    EXPECT_NE(port_, 0) << "the sidecar did not start:\n" << Log();
    workload_ = std::make_unique<Subprocess>(
        std::vector<std::string>{kAnnotator},
        std::map<std::string, std::string>{{"CLUSTERPROF_DIR", shm_dir}}, log_);
  }

  std::string name() const { return "host-0"; }
  std::string address() const { return StrCat("127.0.0.1:", port_); }
  std::string Log() const {
    return testing::FileExists(log_) ? testing::ReadFileOrDie(log_) : std::string();
  }

 private:
  int port_ = 0;
  std::string log_;
  std::unique_ptr<Subprocess> sidecar_;
  std::unique_ptr<Subprocess> workload_;
};

// tf_profiler_server.py: a profiler server as TensorFlow and JAX run it.
class TfServer {
 public:
  TfServer(const TempDir& root, const std::string& stubs) {
    const std::string port_file = root.Join("tf.port");
    record_ = root.Join("tf.record");
    log_ = root.Join("tf.log");
    process_ =
        std::make_unique<Subprocess>(PythonArgv({kServerScript, "--stubs", stubs, "--port-file",
                                                 port_file, "--record", record_}),
                                     std::map<std::string, std::string>{}, log_);
    port_ = testing::ReadGrpcPort(port_file, kProcessTimeout);
    EXPECT_NE(port_, 0) << "tf_profiler_server.py did not start:\n" << Log();
    channel_ = grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
  }

  int port() const { return port_; }
  std::string address() const { return StrCat("127.0.0.1:", port_); }
  std::string Log() const {
    return testing::FileExists(log_) ? testing::ReadFileOrDie(log_) : std::string();
  }
  std::unique_ptr<tensorflow::ProfilerService::Stub> Profiler() const {
    return tensorflow::ProfilerService::NewStub(channel_);
  }

  // The side file's lines for `event` of `session_id`, oldest first (whole lines only: the
  // server may be writing).
  std::vector<RecordLine> Events(const std::string& event, const std::string& session_id) const {
    std::vector<RecordLine> lines;
    if (!testing::FileExists(record_)) return lines;
    const std::string text = testing::ReadFileOrDie(record_);
    size_t start = 0;
    while (true) {
      const size_t end = text.find('\n', start);
      if (end == std::string::npos) break;
      RecordLine fields;
      std::istringstream words(text.substr(start, end - start));
      std::string word;
      while (words >> word) {
        const size_t eq = word.find('=');
        if (eq != std::string::npos) fields[word.substr(0, eq)] = word.substr(eq + 1);
      }
      if (fields["event"] == event && fields["session_id"] == session_id) {
        lines.push_back(fields);
      }
      start = end + 1;
    }
    return lines;
  }

  // Waits until `event` of `session_id` is recorded.
  bool WaitForEvent(const std::string& event, const std::string& session_id) const {
    const auto deadline = std::chrono::steady_clock::now() + kProcessTimeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!Events(event, session_id).empty()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

 private:
  int port_ = 0;
  std::string record_;
  std::string log_;
  std::unique_ptr<Subprocess> process_;
  std::shared_ptr<grpc::Channel> channel_;
};

class TfServerIntegrationTest : public ::testing::Test {
 protected:
  // Generates the Python stubs once for all tests (or notes why the tests are skipped).
  static void SetUpTestSuite() {
    suite_dir_ = new TempDir();
    skip_reason_ = new std::string();
    stubs_error_ = new std::string();
    if (!std::filesystem::exists(kPython)) {
      *skip_reason_ = StrCat(kPython, " is not installed");
      return;
    }
    const std::string probe_log = suite_dir_->Join("probe.log");
    if (RunToEnd(PythonArgv({"-c", "import grpc, grpc_tools"}), probe_log) != 0) {
      *skip_reason_ =
          StrCat("python3-grpcio and python3-grpc-tools are not installed for ", kPython,
                 " (scripts/install-deps installs them):\n", testing::ReadFileOrDie(probe_log));
      return;
    }
    const std::string stubs = suite_dir_->Join("stubs");
    std::filesystem::create_directories(stubs);
    std::vector<std::string> args = {"-m", "grpc_tools.protoc", StrCat("-I", kProtoDir),
                                     StrCat("--python_out=", stubs),
                                     StrCat("--grpc_python_out=", stubs)};
    for (const char* proto :
         {"tsl/profiler/protos/profiler_options.proto",
          "tsl/profiler/protos/profiler_service_monitor_result.proto",
          "tsl/profiler/protos/xplane.proto", "tsl/profiler/protos/profiler_service.proto"}) {
      args.push_back(StrCat(kProtoDir, "/", proto));
    }
    const std::string protoc_log = suite_dir_->Join("protoc.log");
    if (RunToEnd(PythonArgv(args), protoc_log) != 0) {
      *stubs_error_ = StrCat("grpc_tools.protoc failed:\n", testing::ReadFileOrDie(protoc_log));
    }
  }

  static void TearDownTestSuite() {
    delete suite_dir_;
    suite_dir_ = nullptr;
    delete skip_reason_;
    skip_reason_ = nullptr;
    delete stubs_error_;
    stubs_error_ = nullptr;
  }

  TfServerIntegrationTest() : logs_(root_.Join("logs")) {}

  void SetUp() override {
    if (!skip_reason_->empty()) GTEST_SKIP() << *skip_reason_;
    ASSERT_THAT(*stubs_error_, IsEmpty());
  }

  void TearDown() override {
    if (!HasFailure()) return;
    if (tf_ != nullptr) std::cerr << "tf_profiler_server.py log:\n" << tf_->Log();
    if (sidecar_ != nullptr) std::cerr << "sidecar log:\n" << sidecar_->Log();
  }

  void StartServers(bool with_sidecar = true) {
    std::filesystem::create_directories(logs_);
    if (with_sidecar) sidecar_ = std::make_unique<SidecarHost>(root_, logs_);
    tf_ = std::make_unique<TfServer>(root_, suite_dir_->Join("stubs"));
  }

  coordinator::CaptureOptions Options(const std::string& run) const {
    coordinator::CaptureOptions options;
    if (sidecar_ != nullptr) options.targets.push_back({sidecar_->address(), ""});
    options.targets.push_back({tf_->address(), ""});
    options.layout = *storage::RunLayout::Create(*storage::ParseLogdir(logs_), run);
    options.duration_ms = 600;
    options.delay_ms = 300;
    options.retry_backoff_ms = 200;
    return options;
  }

  // The run's manifest, parsed; its targets in the order given.
  web::json::value Manifest(const coordinator::RunResult& result) {
    const std::string text = testing::ReadFileOrDie(result.manifest_uri);
    web::json::value json;
    try {
      json = web::json::value::parse(text);
    } catch (const std::exception& error) {
      ADD_FAILURE() << "clusterprof_run.json is not JSON (" << error.what() << "):\n" << text;
    }
    return json;
  }

  static TempDir* suite_dir_;
  static std::string* skip_reason_;
  static std::string* stubs_error_;
  TempDir root_;
  const std::string logs_;
  RealClock clock_;
  std::unique_ptr<SidecarHost> sidecar_;
  std::unique_ptr<TfServer> tf_;
};

TempDir* TfServerIntegrationTest::suite_dir_ = nullptr;
std::string* TfServerIntegrationTest::skip_reason_ = nullptr;
std::string* TfServerIntegrationTest::stubs_error_ = nullptr;

TEST_F(TfServerIntegrationTest, CapturesATensorFlowServerBesideASidecar) {
  StartServers();
  const auto result = coordinator::Capture(Options("tf_and_sidecar"), clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->succeeded, 2);
  EXPECT_EQ(result->failed, 0);
  ASSERT_EQ(result->targets.size(), 2u);

  // The sidecar: its own name, a probed clock, its achieved start and statistics.
  const TargetResult& side = result->targets[0];
  EXPECT_EQ(side.outcome, Outcome::kOk) << side.message;
  EXPECT_TRUE(side.is_sidecar);
  EXPECT_EQ(side.host_name, sidecar_->name());
  EXPECT_GE(side.clock_uncertainty_ns, 0);
  EXPECT_TRUE(side.start_known);
  EXPECT_TRUE(side.stats_known);
  EXPECT_GT(side.events, 0u);
  EXPECT_EQ(side.attempts, 1);

  // The TF server: GetInfo is UNIMPLEMENTED there, so offset 0 with an unknown uncertainty, the
  // address as its name (as upstream clients name hosts), and upstream's file.
  const TargetResult& tf = result->targets[1];
  EXPECT_EQ(tf.outcome, Outcome::kOk) << tf.message;
  EXPECT_FALSE(tf.is_sidecar);
  EXPECT_EQ(tf.attempts, 1);
  EXPECT_EQ(tf.clock_offset_ns, 0);
  EXPECT_EQ(tf.clock_uncertainty_ns, -1);
  EXPECT_FALSE(tf.clock_offset_applied);
  EXPECT_FALSE(tf.start_known);
  EXPECT_FALSE(tf.stats_known);
  EXPECT_EQ(tf.host_name, tf_->address());
  EXPECT_EQ(tf.requested_start_ns, result->t0_ns) << "offset 0: the start is T0";
  const std::string stem = StrCat("127.0.0.1_", tf_->port());
  const std::string tf_file = StrCat(logs_, "/plugins/profile/tf_and_sidecar/", stem, ".xplane.pb");
  EXPECT_THAT(tf.files, ElementsAre(tf_file));
  ASSERT_TRUE(testing::FileExists(tf_file));
  const auto loaded = xspace::ReadXSpaceFile(tf_file);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const auto& space = (*loaded)->space();
  EXPECT_THAT(space.hostnames(), ElementsAre(stem));
  const auto* plane = xspace::FindPlaneWithName(space, xspace::kHostThreadsPlaneName);
  ASSERT_NE(plane, nullptr);
  EXPECT_GT(xspace::CountEvents(space), 0);
  EXPECT_NE(xspace::FindPlaneWithName(space, "Task Environment"), nullptr);

  // Both hosts in one run directory, beside the manifest and the report, which says the TF
  // server made no digest.
  EXPECT_THAT(testing::ListFilesRecursively(StrCat(logs_, "/plugins/profile/tf_and_sidecar")),
              ElementsAre(stem + ".xplane.pb", "clusterprof_report.html", "clusterprof_report.json",
                          "clusterprof_run.json", "host-0.trace.json.gz", "host-0.xplane.pb"));
  ASSERT_NE(result->report, nullptr);
  EXPECT_THAT(result->report->analysis.left_out,
              Contains(HasSubstr("a TF/JAX profiler server: it makes no digest")));

  // What the server was sent, and what it did: version 1 (version 0 would discard the start),
  // the start T0 on its own clock, which it waited for.
  const std::vector<RecordLine> received = tf_->Events("received", "tf_and_sidecar");
  ASSERT_EQ(received.size(), 1u) << tf_->Log();
  EXPECT_EQ(Int(received[0], "version"), 1);
  EXPECT_EQ(Int(received[0], "start_timestamp_ns"), tf.requested_start_ns);
  const std::vector<RecordLine> started = tf_->Events("started", "tf_and_sidecar");
  ASSERT_EQ(started.size(), 1u) << tf_->Log();
  EXPECT_EQ(Int(started[0], "start_timestamp_ns"), result->t0_ns);
  const int64_t actual_start_ns = Int(started[0], "actual_start_ns");
  EXPECT_GE(actual_start_ns, result->t0_ns) << "the server waited for the start it was given";
  EXPECT_LT(actual_start_ns - result->t0_ns, 5'000'000'000LL) << "and started then";
  const std::vector<RecordLine> finished = tf_->Events("finished", "tf_and_sidecar");
  ASSERT_EQ(finished.size(), 1u) << tf_->Log();
  EXPECT_EQ(finished[0].at("file"), tf_file);

  // The manifest: the TF server's achieved start and start error are unknown (null), and its
  // requested start is T0.
  ASSERT_FALSE(result->manifest_uri.empty());
  const web::json::value manifest = Manifest(*result);
  ASSERT_TRUE(manifest.is_object());
  EXPECT_EQ(manifest.at("t0_ns").as_number().to_int64(), result->t0_ns);
  EXPECT_EQ(manifest.at("summary").at("succeeded").as_integer(), 2);
  const auto& targets = manifest.at("targets").as_array();
  ASSERT_EQ(targets.size(), 2u);
  const web::json::value& side_json = targets.at(0);
  EXPECT_TRUE(side_json.at("clusterprof_sidecar").as_bool());
  EXPECT_FALSE(side_json.at("achieved_start_ns").is_null());
  EXPECT_FALSE(side_json.at("start_error_ns").is_null());
  const web::json::value& tf_json = targets.at(1);
  EXPECT_EQ(tf_json.at("address").as_string(), tf_->address());
  EXPECT_EQ(tf_json.at("host").as_string(), tf_->address());
  EXPECT_EQ(tf_json.at("outcome").as_string(), "ok");
  EXPECT_FALSE(tf_json.at("clusterprof_sidecar").as_bool());
  EXPECT_EQ(tf_json.at("clock_offset_ns").as_number().to_int64(), 0);
  EXPECT_TRUE(tf_json.at("clock_uncertainty_ns").is_null());
  EXPECT_FALSE(tf_json.at("clock_offset_applied").as_bool());
  EXPECT_EQ(tf_json.at("requested_start_ns").as_number().to_int64(), result->t0_ns);
  EXPECT_TRUE(tf_json.at("achieved_start_ns").is_null());
  EXPECT_TRUE(tf_json.at("start_error_ns").is_null());
  EXPECT_FALSE(tf_json.has_field("events")) << "unknown for a server that is not a sidecar";
  ASSERT_EQ(tf_json.at("files").as_array().size(), 1u);
  EXPECT_EQ(tf_json.at("files").as_array().at(0).as_string(), tf_file);
}

TEST_F(TfServerIntegrationTest, AGivenHostNameReachesTheServerAsOverrideHostname) {
  StartServers(/*with_sidecar=*/false);
  coordinator::CaptureOptions options = Options("named");
  options.targets[0].host_name = "tpu-worker:0";
  const auto result = coordinator::Capture(options, clock_);
  ASSERT_TRUE(result.ok()) << result.status();
  const TargetResult& tf = result->targets[0];
  EXPECT_EQ(tf.outcome, Outcome::kOk) << tf.message;
  EXPECT_EQ(tf.host_name, "tpu-worker:0");
  const std::string file = StrCat(logs_, "/plugins/profile/named/tpu-worker_0.xplane.pb");
  EXPECT_THAT(tf.files, ElementsAre(file));
  const auto loaded = xspace::ReadXSpaceFile(file);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_THAT((*loaded)->space().hostnames(), ElementsAre("tpu-worker_0"));
}

TEST_F(TfServerIntegrationTest, ABusyTensorFlowServerFailsOnceWhileTheSidecarSucceeds) {
  StartServers();
  // Another client's capture keeps the TF server busy until it is terminated.
  grpc::Status blocker_status;
  std::thread blocker([&] {
    tensorflow::ProfileRequest request;
    request.mutable_opts()->set_version(1);
    request.mutable_opts()->set_duration_ms(60'000);
    request.set_session_id("blocker");
    request.set_host_name("blocker");
    request.set_repository_root(StrCat(logs_, "/plugins/profile"));
    grpc::ClientContext context;
    tensorflow::ProfileResponse response;
    blocker_status = tf_->Profiler()->Profile(&context, request, &response);
  });
  ASSERT_TRUE(tf_->WaitForEvent("started", "blocker")) << tf_->Log();

  coordinator::CaptureOptions options = Options("busy");
  options.num_tracing_attempts = 3;
  const auto result = coordinator::Capture(options, clock_);

  // End the blocker's capture; upstream keeps a terminated capture's data.
  {
    grpc::ClientContext context;
    tensorflow::TerminateRequest terminate;
    terminate.set_session_id("blocker");
    tensorflow::TerminateResponse terminated;
    EXPECT_TRUE(tf_->Profiler()->Terminate(&context, terminate, &terminated).ok());
  }
  blocker.join();
  EXPECT_TRUE(blocker_status.ok()) << blocker_status.error_message();
  EXPECT_TRUE(testing::FileExists(StrCat(logs_, "/plugins/profile/blocker/blocker.xplane.pb")));

  ASSERT_TRUE(result.ok()) << result.status() << "\n" << tf_->Log();
  EXPECT_EQ(result->succeeded, 1);
  EXPECT_EQ(result->failed, 1);
  ASSERT_EQ(result->targets.size(), 2u);
  const TargetResult& side = result->targets[0];
  EXPECT_EQ(side.outcome, Outcome::kOk) << side.message;
  EXPECT_EQ(side.attempts, 1);
  EXPECT_FALSE(side.files.empty());

  // Upstream's busy answer is INTERNAL, which upstream's rule does not retry.
  const TargetResult& tf = result->targets[1];
  EXPECT_EQ(tf.outcome, Outcome::kFailed);
  EXPECT_EQ(tf.attempts, 1) << "INTERNAL is not retried";
  EXPECT_THAT(tf.message, AllOf(HasSubstr("INTERNAL"), HasSubstr("Another profiling session")));
  EXPECT_THAT(tf.files, IsEmpty());
  EXPECT_EQ(tf_->Events("received", "busy").size(), 1u) << "one Profile call, no retry";
  EXPECT_EQ(tf_->Events("refused", "busy").size(), 1u);
  EXPECT_FALSE(testing::FileExists(
      StrCat(logs_, "/plugins/profile/busy/127.0.0.1_", tf_->port(), ".xplane.pb")));

  const web::json::value manifest = Manifest(*result);
  ASSERT_TRUE(manifest.is_object());
  EXPECT_EQ(manifest.at("summary").at("failed").as_integer(), 1);
  const web::json::value& tf_json = manifest.at("targets").as_array().at(1);
  EXPECT_EQ(tf_json.at("outcome").as_string(), "failed");
  EXPECT_EQ(tf_json.at("attempts").as_integer(), 1);
  EXPECT_FALSE(tf_json.at("clusterprof_sidecar").as_bool());
  EXPECT_THAT(tf_json.at("message").as_string(), HasSubstr("Another profiling session active."));
  EXPECT_EQ(tf_json.at("files").as_array().size(), 0u);
}

}  // namespace
}  // namespace clusterprof
