// clusterprof-sidecar driven from Python grpcio exactly as an outside client (TensorFlow, JAX,
// XProf) would: stubs generated at test time from the repository's .proto files by
// grpc_tools.protoc, one real sidecar process per test on ports it picks itself, and
// tests/sidecar/grpc_client.py making the calls and reading the files back.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

extern char** environ;

namespace clusterprof::sidecar {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;
using testing::TempDir;

constexpr int64_t kNsPerSecond = 1'000'000'000;
// Generous bounds: they only catch a process that hangs.
constexpr int64_t kScriptTimeoutNs = 120 * kNsPerSecond;
constexpr int64_t kSidecarStartTimeoutNs = 30 * kNsPerSecond;
constexpr int64_t kSidecarStopTimeoutNs = 30 * kNsPerSecond;
constexpr char kHostName[] = "interop-host";

struct ProcessResult {
  int exit_code = -1;
  bool timed_out = false;
  std::string output;  // stdout and stderr together
  // The `key=value` lines of the output.
  std::map<std::string, std::string> values;

  // The value of `key`, or "<missing key>" so that a comparison fails with the key's name.
  std::string Get(const std::string& key) const {
    auto it = values.find(key);
    return it != values.end() ? it->second : "<missing " + key + ">";
  }
};

// The environment for child processes: ours, without Python settings from another interpreter
// (python3 on PATH may be a pyenv whose PYTHONPATH does not fit Debian's python).
std::vector<std::string> ChildEnvironment(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    if (text.rfind("PYTHON", 0) == 0) continue;
    env.push_back(text);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// In a forked child: runs argv[0]. A child must not outlive a test that crashed.
[[noreturn]] void ExecChild(const std::vector<char*>& argv, const std::vector<char*>& env) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  execve(argv[0], argv.data(), env.data());
  _exit(127);
}

// Waits for `pid` until `deadline_ns` (monotonic); kills it with SIGKILL past the deadline.
// Returns the wait status, and whether it had to be killed.
int WaitOrKill(pid_t pid, int64_t deadline_ns, bool* killed) {
  RealClock clock;
  *killed = false;
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) return status;
    if (clock.MonotonicNs() >= deadline_ns) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  *killed = true;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// Runs `argv` with stdout and stderr in one pipe; kills it after `timeout_ns`.
ProcessResult RunProcess(std::vector<std::string> argv, const std::vector<std::string>& extra_env,
                         int64_t timeout_ns) {
  ProcessResult result;
  std::vector<std::string> env = ChildEnvironment(extra_env);
  std::vector<char*> c_argv = CStrings(argv);
  std::vector<char*> c_env = CStrings(env);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    result.output = std::string("pipe2: ") + std::strerror(errno);
    return result;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    result.output = std::string("fork: ") + std::strerror(errno);
    close(fds[0]);
    close(fds[1]);
    return result;
  }
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    ExecChild(c_argv, c_env);
  }
  close(fds[1]);
  RealClock clock;
  const int64_t deadline = clock.MonotonicNs() + timeout_ns;
  char buffer[4096];
  while (true) {
    const int64_t left_ms = (deadline - clock.MonotonicNs()) / 1'000'000;
    if (left_ms <= 0) {
      result.timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(left_ms));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = read(fds[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buffer, static_cast<size_t>(n));
  }
  close(fds[0]);
  bool killed = false;
  const int status = WaitOrKill(pid, result.timed_out ? 0 : deadline, &killed);
  result.timed_out = result.timed_out || killed;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  size_t start = 0;
  while (start < result.output.size()) {
    size_t end = result.output.find('\n', start);
    if (end == std::string::npos) end = result.output.size();
    const std::string line = result.output.substr(start, end - start);
    if (const size_t eq = line.find('='); eq != std::string::npos) {
      result.values[line.substr(0, eq)] = line.substr(eq + 1);
    }
    start = end + 1;
  }
  return result;
}

// A clusterprof-sidecar process. The destructor stops it (SIGTERM, then SIGKILL) and reaps it,
// whatever state the test left it in.
class SidecarProcess {
 public:
  // Starts the sidecar with `args` (beside the port flags) and waits until it serves. Its output
  // goes to `log_path`.
  static std::unique_ptr<SidecarProcess> Start(std::vector<std::string> args,
                                               const std::string& port_file,
                                               const std::string& log_path, std::string* error) {
    std::vector<std::string> argv = {CLUSTERPROF_SIDECAR_PATH,
                                     "--address",
                                     "127.0.0.1",
                                     "--port",
                                     "0",
                                     "--http-port",
                                     "0",
                                     "--port-file",
                                     port_file};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> env = ChildEnvironment({});
    std::vector<char*> c_argv = CStrings(argv);
    std::vector<char*> c_env = CStrings(env);
    const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log < 0) {
      *error = "cannot open " + log_path + ": " + std::strerror(errno);
      return nullptr;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      *error = std::string("fork: ") + std::strerror(errno);
      close(log);
      return nullptr;
    }
    if (pid == 0) {
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
      ExecChild(c_argv, c_env);
    }
    close(log);
    std::unique_ptr<SidecarProcess> process(new SidecarProcess(pid, log_path));

    RealClock clock;
    const int64_t deadline = clock.MonotonicNs() + kSidecarStartTimeoutNs;
    while (!process->ReadPortFile(port_file)) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        process->pid_ = -1;
        *error = "clusterprof-sidecar exited (status " + std::to_string(status) +
                 ") before serving:\n" + process->Log();
        return nullptr;
      }
      if (clock.MonotonicNs() >= deadline) {
        *error = "clusterprof-sidecar wrote no port file within the timeout:\n" + process->Log();
        return nullptr;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return process;
  }

  ~SidecarProcess() { Stop(); }

  // SIGTERM, and SIGKILL if it does not exit in time. Returns the exit code (-1 when it was
  // killed by a signal); idempotent.
  int Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      RealClock clock;
      bool killed = false;
      const int status = WaitOrKill(pid_, clock.MonotonicNs() + kSidecarStopTimeoutNs, &killed);
      exit_code_ = !killed && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      pid_ = -1;
    }
    return exit_code_;
  }

  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_port_; }
  std::string Log() const { return FileExists(log_path_) ? testing::ReadFileOrDie(log_path_) : ""; }

 private:
  SidecarProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}

  static bool FileExists(const std::string& path) { return std::filesystem::exists(path); }

  // The sidecar writes the file to a temporary name and renames it: once it exists, it is whole.
  bool ReadPortFile(const std::string& path) {
    if (!FileExists(path)) return false;
    const std::string text = testing::ReadFileOrDie(path);
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(start, end - start);
      if (line.rfind("grpc=", 0) == 0) grpc_port_ = std::atoi(line.c_str() + 5);
      if (line.rfind("http=", 0) == 0) http_port_ = std::atoi(line.c_str() + 5);
      start = end + 1;
    }
    return grpc_port_ > 0;
  }

  pid_t pid_;
  const std::string log_path_;
  int exit_code_ = -1;
  int grpc_port_ = 0;
  int http_port_ = 0;
};

class PythonInteropTest : public ::testing::Test {
 protected:
  // Generates the Python stubs once for all tests.
  static void SetUpTestSuite() {
    stubs_ = new TempDir();
    const std::string proto_dir = CLUSTERPROF_PROTO_DIR;
    std::vector<std::string> argv = {CLUSTERPROF_TEST_PYTHON,
                                     "-B",
                                     "-m",
                                     "grpc_tools.protoc",
                                     "-I" + proto_dir,
                                     "--python_out=" + stubs_->path(),
                                     "--grpc_python_out=" + stubs_->path()};
    for (const char* proto :
         {"tsl/profiler/protos/profiler_options.proto",
          "tsl/profiler/protos/profiler_service_monitor_result.proto",
          "tsl/profiler/protos/xplane.proto", "tsl/profiler/protos/profiler_service.proto",
          "clusterprof/v1alpha1/sidecar.proto"}) {
      argv.push_back(proto_dir + "/" + proto);
    }
    const ProcessResult generated = RunProcess(argv, {}, kScriptTimeoutNs);
    stubs_error_ = new std::string(
        generated.exit_code == 0 ? "" : "grpc_tools.protoc failed:\n" + generated.output);
  }

  static void TearDownTestSuite() {
    delete stubs_;
    stubs_ = nullptr;
    delete stubs_error_;
    stubs_error_ = nullptr;
  }

  void SetUp() override {
    if (!std::filesystem::exists(CLUSTERPROF_TEST_PYTHON)) {
      GTEST_SKIP() << CLUSTERPROF_TEST_PYTHON << " is not installed";
    }
    const ProcessResult probe = RunProcess(
        {CLUSTERPROF_TEST_PYTHON, "-c", "import grpc, grpc_tools"}, {}, kScriptTimeoutNs);
    if (probe.exit_code != 0) {
      GTEST_SKIP() << "python3-grpcio and python3-grpc-tools are not installed for "
                   << CLUSTERPROF_TEST_PYTHON << " (scripts/install-deps installs them):\n"
                   << probe.output;
    }
    ASSERT_THAT(*stubs_error_, IsEmpty());
    std::filesystem::create_directories(dir_.Join("shm"));
    std::filesystem::create_directories(logdir());
    std::string error;
    sidecar_ = SidecarProcess::Start({"--shm-dir", dir_.Join("shm"), "--allowed-logdir", logdir(),
                                      "--host-name", kHostName, "--log-level", "debug"},
                                     dir_.Join("ports"), dir_.Join("sidecar.log"), &error);
    ASSERT_NE(sidecar_, nullptr) << error;
  }

  void TearDown() override {
    if (sidecar_ == nullptr) return;
    // SIGTERM is the normal way a sidecar ends (pod deletion): it must exit cleanly.
    EXPECT_EQ(sidecar_->Stop(), 0) << "clusterprof-sidecar did not exit cleanly on SIGTERM";
    if (HasFailure()) std::cerr << "sidecar log:\n" << sidecar_->Log();
  }

  std::string logdir() const { return dir_.Join("logdir"); }
  std::string repository_root() const { return logdir() + "/plugins/profile"; }
  std::string target() const { return "127.0.0.1:" + std::to_string(sidecar_->grpc_port()); }

  // Runs grpc_client.py with `args`.
  static ProcessResult Python(std::vector<std::string> args) {
    std::vector<std::string> argv = {
        CLUSTERPROF_TEST_PYTHON,
        "-B",
        "-s",
        std::string(CLUSTERPROF_SOURCE_DIR) + "/tests/sidecar/grpc_client.py",
        "--stubs",
        stubs_->path()};
    argv.insert(argv.end(), args.begin(), args.end());
    ProcessResult result = RunProcess(argv, {}, kScriptTimeoutNs);
    EXPECT_FALSE(result.timed_out) << "grpc_client.py did not finish:\n" << result.output;
    return result;
  }

  // grpc_client.py `command` against this test's sidecar.
  ProcessResult Client(const std::string& command, std::vector<std::string> args = {}) {
    std::vector<std::string> argv = {"--target", target(), command};
    argv.insert(argv.end(), args.begin(), args.end());
    return Python(argv);
  }

  static TempDir* stubs_;
  static std::string* stubs_error_;
  TempDir dir_;
  std::unique_ptr<SidecarProcess> sidecar_;
};

TempDir* PythonInteropTest::stubs_ = nullptr;
std::string* PythonInteropTest::stubs_error_ = nullptr;

TEST_F(PythonInteropTest, ProfileWritesXPlaneAndTraceJsonThatPythonReads) {
  RealClock clock;
  const int64_t before_ns = clock.WallNs();
  const ProcessResult profile = Client(
      "profile", {"--version", "1", "--duration-ms", "300", "--repository-root", repository_root(),
                  "--session-id", "run_v1", "--host-name", "10.0.0.2:8466"});
  const int64_t after_ns = clock.WallNs();
  ASSERT_EQ(profile.exit_code, 0) << profile.output;
  ASSERT_EQ(profile.Get("code"), "OK") << profile.output;
  // No workload annotates beside this sidecar: the trace holds only the Task Environment.
  EXPECT_EQ(profile.Get("empty_trace"), "1");
  EXPECT_EQ(profile.Get("tool_data"), "0");
  EXPECT_EQ(profile.Get("has_xspace"), "0");

  // The host name's ':' becomes '_', as upstream names host files; nothing else is left behind
  // (no temporary files).
  const std::string run_dir = "plugins/profile/run_v1/";
  EXPECT_THAT(
      testing::ListFilesRecursively(logdir()),
      ElementsAre(run_dir + "10.0.0.2_8466.trace.json.gz", run_dir + "10.0.0.2_8466.xplane.pb"));

  const ProcessResult xplane =
      Python({"xplane", logdir() + "/" + run_dir + "10.0.0.2_8466.xplane.pb"});
  ASSERT_EQ(xplane.exit_code, 0) << xplane.output;
  EXPECT_EQ(xplane.Get("hostnames"), "10.0.0.2_8466");
  EXPECT_THAT(xplane.Get("planes"), HasSubstr("Task Environment"));
  EXPECT_EQ(xplane.Get("task_environment"), "1");
  const int64_t start_ns = std::atoll(xplane.Get("profile_start_time").c_str());
  const int64_t stop_ns = std::atoll(xplane.Get("profile_stop_time").c_str());
  // Same machine, same wall clock: the capture lies inside the client's call (the margin only
  // absorbs a clock step while the test runs).
  EXPECT_GE(start_ns, before_ns - 5 * kNsPerSecond) << xplane.output;
  EXPECT_GE(stop_ns, start_ns) << xplane.output;
  EXPECT_LE(stop_ns, after_ns + 5 * kNsPerSecond) << xplane.output;
  EXPECT_THAT(xplane.Get("profile_options"),
              AllOf(HasSubstr("version: 1"), HasSubstr("duration_ms: 300")));

  const ProcessResult json =
      Python({"trace-json", logdir() + "/" + run_dir + "10.0.0.2_8466.trace.json.gz"});
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_EQ(json.Get("display_time_unit"), "ns");
  EXPECT_NE(json.Get("trace_events"), "0");
}

TEST_F(PythonInteropTest, OptsDurationZeroFallsBackToTheRequestField) {
  const ProcessResult profile =
      Client("profile", {"--version", "1", "--request-duration-ms", "200", "--repository-root",
                         repository_root(), "--opts-session-id", "run_opts_id"});
  ASSERT_EQ(profile.exit_code, 0) << profile.output;
  ASSERT_EQ(profile.Get("code"), "OK") << profile.output;
  // opts.session_id names the run; the host is the sidecar's own name.
  EXPECT_TRUE(testing::FileExists(repository_root() + "/run_opts_id/" + kHostName + ".xplane.pb"))
      << profile.output;
  const ProcessResult xplane =
      Python({"xplane", repository_root() + "/run_opts_id/" + kHostName + ".xplane.pb"});
  ASSERT_EQ(xplane.exit_code, 0) << xplane.output;
  EXPECT_THAT(xplane.Get("profile_options"), HasSubstr("duration_ms: 200"));
}

TEST_F(PythonInteropTest, EmitXSpaceReturnsTheSpaceAndWritesNoFile) {
  const ProcessResult profile =
      Client("profile", {"--version", "1", "--duration-ms", "200", "--repository-root",
                         repository_root(), "--session-id", "run_emit", "--emit-xspace"});
  ASSERT_EQ(profile.exit_code, 0) << profile.output;
  ASSERT_EQ(profile.Get("code"), "OK") << profile.output;
  EXPECT_EQ(profile.Get("has_xspace"), "1");
  EXPECT_EQ(profile.Get("tool_data"), "0");
  EXPECT_EQ(profile.Get("xspace.hostnames"), kHostName);
  EXPECT_EQ(profile.Get("xspace.task_environment"), "1");
  EXPECT_NE(profile.Get("xspace.profile_start_time"), "<missing xspace.profile_start_time>");
  EXPECT_NE(profile.Get("xspace.profile_stop_time"), "<missing xspace.profile_stop_time>");
  EXPECT_THAT(testing::ListFilesRecursively(logdir()), IsEmpty());
}

TEST_F(PythonInteropTest, VersionZeroMeansUpstreamDefaultsAndTheRequestDuration) {
  // With version 0 every option is discarded, opts.session_id and override_hostname included.
  const ProcessResult profile =
      Client("profile", {"--request-duration-ms", "200", "--repository-root", repository_root(),
                         "--session-id", "run_v0", "--opts-session-id", "ignored_run",
                         "--override-hostname", "ignored-host", "--host-name", "worker-0"});
  ASSERT_EQ(profile.exit_code, 0) << profile.output;
  ASSERT_EQ(profile.Get("code"), "OK") << profile.output;
  EXPECT_THAT(testing::ListFilesRecursively(logdir()),
              ElementsAre("plugins/profile/run_v0/worker-0.trace.json.gz",
                          "plugins/profile/run_v0/worker-0.xplane.pb"));
  const ProcessResult xplane = Python({"xplane", repository_root() + "/run_v0/worker-0.xplane.pb"});
  ASSERT_EQ(xplane.exit_code, 0) << xplane.output;
  EXPECT_THAT(xplane.Get("profile_options"),
              AllOf(HasSubstr("version: 1"), HasSubstr("host_tracer_level: 2"),
                    HasSubstr("device_tracer_level: 1"), HasSubstr("enable_hlo_proto: true"),
                    HasSubstr("include_dataset_ops: true"), HasSubstr("duration_ms: 200")));
}

TEST_F(PythonInteropTest, RepositoryRootOutsideTheAllowedLogdirIsPermissionDenied) {
  const std::string outside = dir_.Join("elsewhere/plugins/profile");
  const ProcessResult profile =
      Client("profile", {"--version", "1", "--duration-ms", "100", "--repository-root", outside,
                         "--session-id", "run_outside"});
  ASSERT_EQ(profile.exit_code, 0) << profile.output;
  EXPECT_EQ(profile.Get("code"), "PERMISSION_DENIED") << profile.output;
  // The message names the refused root and what is allowed.
  EXPECT_THAT(profile.Get("details"), AllOf(HasSubstr(outside), HasSubstr(logdir())));
  EXPECT_FALSE(testing::FileExists(dir_.Join("elsewhere")));
  EXPECT_THAT(testing::ListFilesRecursively(logdir()), IsEmpty());

  // A symbolic link inside the allowed logdir does not lead out of it.
  std::filesystem::create_directories(dir_.Join("target"));
  std::filesystem::create_directory_symlink(dir_.Join("target"), logdir() + "/link");
  const ProcessResult linked =
      Client("profile", {"--version", "1", "--duration-ms", "100", "--repository-root",
                         logdir() + "/link/plugins/profile", "--session-id", "run_linked"});
  ASSERT_EQ(linked.exit_code, 0) << linked.output;
  EXPECT_EQ(linked.Get("code"), "PERMISSION_DENIED") << linked.output;
  EXPECT_THAT(testing::ListFilesRecursively(dir_.Join("target")), IsEmpty());

  // '..' cannot climb out either.
  const ProcessResult dotdot =
      Client("profile", {"--version", "1", "--duration-ms", "100", "--repository-root",
                         logdir() + "/../elsewhere/plugins/profile", "--session-id", "run_dotdot"});
  ASSERT_EQ(dotdot.exit_code, 0) << dotdot.output;
  EXPECT_EQ(dotdot.Get("code"), "INVALID_ARGUMENT") << dotdot.output;
  EXPECT_THAT(dotdot.Get("details"), HasSubstr(".."));
  EXPECT_FALSE(testing::FileExists(dir_.Join("elsewhere")));
}

TEST_F(PythonInteropTest, LinkedPluginsDirectoryInsideTheAllowedLogdirDoesNotLeadOut) {
  // The allowed-logdir check resolves links all the way down to the run directory the writer
  // creates: a link at <allowed>/plugins must not make the sidecar write outside.
  // The logdir itself is allowed, but its plugins/ is a link to a directory outside it.
  std::filesystem::create_directories(dir_.Join("outside"));
  std::filesystem::create_directory_symlink(dir_.Join("outside"), logdir() + "/plugins");
  const ProcessResult profile =
      Client("profile", {"--version", "1", "--duration-ms", "100", "--repository-root",
                         repository_root(), "--session-id", "run_escape"});
  ASSERT_EQ(profile.exit_code, 0) << profile.output;
  EXPECT_EQ(profile.Get("code"), "PERMISSION_DENIED") << profile.output;
  EXPECT_THAT(testing::ListFilesRecursively(dir_.Join("outside")), IsEmpty());
}

TEST_F(PythonInteropTest, HealthReadinessAndMetricsOverHttp) {
  const std::string http = "http://127.0.0.1:" + std::to_string(sidecar_->http_port());
  const ProcessResult healthz = Python({"http-get", http + "/healthz"});
  ASSERT_EQ(healthz.exit_code, 0) << healthz.output;
  EXPECT_EQ(healthz.Get("status"), "200");
  EXPECT_EQ(healthz.Get("body.0"), "ok");
  const ProcessResult readyz = Python({"http-get", http + "/readyz"});
  ASSERT_EQ(readyz.exit_code, 0) << readyz.output;
  EXPECT_EQ(readyz.Get("status"), "200") << readyz.output;

  // One capture and one refused request show in the metrics.
  ASSERT_EQ(Client("profile", {"--version", "1", "--duration-ms", "100", "--repository-root",
                               repository_root(), "--session-id", "run_metrics"})
                .Get("code"),
            "OK");
  ASSERT_EQ(Client("profile", {"--version", "1", "--duration-ms", "100", "--repository-root",
                               dir_.Join("elsewhere/plugins/profile"), "--session-id", "run_no"})
                .Get("code"),
            "PERMISSION_DENIED");
  const ProcessResult metrics = Python({"http-get", http + "/metrics"});
  ASSERT_EQ(metrics.exit_code, 0) << metrics.output;
  EXPECT_EQ(metrics.Get("status"), "200");
  EXPECT_THAT(
      metrics.output,
      AllOf(HasSubstr("clusterprof_sidecar_captures_total{outcome=\"empty\"} 1"),
            HasSubstr("clusterprof_sidecar_refused_requests_total{code=\"PERMISSION_DENIED\"} 1")));
}

TEST_F(PythonInteropTest, UnsafeNamesAreInvalidArgument) {
  struct Case {
    std::vector<std::string> args;
    const char* names;
  };
  const std::vector<Case> cases = {
      {{"--session-id", "../x"}, "session_id"},
      {{"--opts-session-id", "a/b"}, "session_id"},
      {{"--session-id", "run_bad_host", "--override-hostname", "../h"}, "host"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {
        "--version", "1", "--duration-ms", "100", "--repository-root", repository_root()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const ProcessResult profile = Client("profile", args);
    ASSERT_EQ(profile.exit_code, 0) << profile.output;
    EXPECT_EQ(profile.Get("code"), "INVALID_ARGUMENT") << profile.output;
    EXPECT_THAT(profile.Get("details"), HasSubstr(c.names)) << profile.output;
  }
  EXPECT_THAT(testing::ListFilesRecursively(dir_.path()),
              ::testing::Each(::testing::Not(HasSubstr("x.xplane.pb"))));
  EXPECT_THAT(testing::ListFilesRecursively(logdir()), IsEmpty());
}

TEST_F(PythonInteropTest, MonitorIsUnimplemented) {
  const ProcessResult monitor = Client("monitor");
  ASSERT_EQ(monitor.exit_code, 0) << monitor.output;
  EXPECT_EQ(monitor.Get("code"), "UNIMPLEMENTED") << monitor.output;
  EXPECT_THAT(monitor.Get("details"), HasSubstr("Monitor"));
}

TEST_F(PythonInteropTest, GetInfoReportsVersionHostTracersAndTheWallClock) {
  const ProcessResult info = Client("info");
  ASSERT_EQ(info.exit_code, 0) << info.output;
  ASSERT_EQ(info.Get("code"), "OK") << info.output;
  EXPECT_EQ(info.Get("version"), CLUSTERPROF_VERSION);
  EXPECT_EQ(info.Get("host_name"), kHostName);
  EXPECT_THAT(info.Get("tracers"), StartsWith("annotations:"));
  EXPECT_EQ(info.Get("active_session_id"), "");
  // The sidecar reads the clock Python's time.time_ns() reads, between the two readings; the
  // margin only absorbs a clock step while the test runs.
  const int64_t before = std::atoll(info.Get("python_before_ns").c_str());
  const int64_t after = std::atoll(info.Get("python_after_ns").c_str());
  const int64_t wall = std::atoll(info.Get("wall_time_ns").c_str());
  EXPECT_GE(wall, before - 5 * kNsPerSecond) << info.output;
  EXPECT_LE(wall, after + 5 * kNsPerSecond) << info.output;
  EXPECT_GT(std::atoll(info.Get("monotonic_time_ns").c_str()), 0) << info.output;
}

TEST_F(PythonInteropTest, GetSessionReportsAFinishedSessionAndItsFiles) {
  const ProcessResult profile =
      Client("profile", {"--version", "1", "--duration-ms", "200", "--repository-root",
                         repository_root(), "--session-id", "run_status"});
  ASSERT_EQ(profile.Get("code"), "OK") << profile.output;

  const ProcessResult session = Client("session", {"run_status"});
  ASSERT_EQ(session.exit_code, 0) << session.output;
  ASSERT_EQ(session.Get("code"), "OK") << session.output;
  EXPECT_EQ(session.Get("session_id"), "run_status");
  EXPECT_EQ(session.Get("state"), "SESSION_STATE_DONE");
  EXPECT_EQ(session.Get("error"), "");
  const std::string xplane = repository_root() + "/run_status/" + kHostName + ".xplane.pb";
  const std::string json = repository_root() + "/run_status/" + kHostName + ".trace.json.gz";
  EXPECT_EQ(session.Get("files"), xplane + "|" + json);
  EXPECT_EQ(session.Get("file_bytes"), std::to_string(std::filesystem::file_size(xplane)) + "|" +
                                           std::to_string(std::filesystem::file_size(json)));
  EXPECT_EQ(session.Get("upload_states"), "UPLOAD_STATE_COMMITTED|UPLOAD_STATE_COMMITTED");
  EXPECT_LE(std::atoll(session.Get("start_time_ns").c_str()),
            std::atoll(session.Get("stop_time_ns").c_str()));
}

TEST_F(PythonInteropTest, GetSessionOfAnUnknownSessionIsNotFound) {
  const ProcessResult session = Client("session", {"no_such_run"});
  ASSERT_EQ(session.exit_code, 0) << session.output;
  EXPECT_EQ(session.Get("code"), "NOT_FOUND") << session.output;
  EXPECT_THAT(session.Get("details"), HasSubstr("no_such_run"));
}

TEST_F(PythonInteropTest, TerminateEndsARunningProfileWhichStillWritesItsFiles) {
  // A 10 s capture, terminated about 0.5 s after it starts capturing.
  const ProcessResult r =
      Client("terminate",
             {"--version", "1", "--duration-ms", "10000", "--repository-root", repository_root(),
              "--session-id", "run_terminated", "--terminate-after-s", "0.5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.Get("state_before_terminate"), "SESSION_STATE_CAPTURING") << r.output;
  EXPECT_EQ(r.Get("terminate_code"), "OK") << r.output;
  ASSERT_EQ(r.Get("code"), "OK") << r.output;
  // Sanity only: it returned before the full 10 s.
  EXPECT_LT(std::atof(r.Get("profile_seconds").c_str()), 9.0) << r.output;
  EXPECT_THAT(
      testing::ListFilesRecursively(logdir()),
      ElementsAre(std::string("plugins/profile/run_terminated/") + kHostName + ".trace.json.gz",
                  std::string("plugins/profile/run_terminated/") + kHostName + ".xplane.pb"));

  const ProcessResult session = Client("session", {"run_terminated"});
  ASSERT_EQ(session.Get("code"), "OK") << session.output;
  EXPECT_EQ(session.Get("state"), "SESSION_STATE_DONE");
  const int64_t captured_ns = std::atoll(session.Get("stop_time_ns").c_str()) -
                              std::atoll(session.Get("start_time_ns").c_str());
  EXPECT_GE(captured_ns, 0);
  EXPECT_LT(captured_ns, 9 * kNsPerSecond);
}

}  // namespace
}  // namespace clusterprof::sidecar
