// clusterprof-sidecar --supervise, as the webhook starts it: the container's process keeps
// running while the sidecar fails (a missing token file, a bad flag, a crash), starts the sidecar
// again once it can run, and ends it on SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "sidecar/supervisor.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::sidecar {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::Subprocess;
using testing::TempDir;

constexpr char kSidecar[] = CLUSTERPROF_SIDECAR_PATH;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int Count(const std::string& text, const std::string& what) {
  int count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++count;
  }
  return count;
}

// Waits (polling, up to `timeout`) for `done`; the deadline only bounds a failing test.
bool Eventually(const std::function<bool()>& done,
                std::chrono::seconds timeout = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

// The supervisor's child processes, from /proc.
std::vector<pid_t> Children(pid_t pid) {
  std::vector<pid_t> children;
  std::istringstream list(ReadFile(StrCat("/proc/", pid, "/task/", pid, "/children")));
  for (pid_t child; list >> child;) children.push_back(child);
  return children;
}

grpc::Status GetInfo(int port, const std::string& token) {
  auto channel =
      grpc::CreateChannel(StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  clusterprof::v1alpha1::GetInfoRequest request;
  clusterprof::v1alpha1::GetInfoResponse response;
  return clusterprof::v1alpha1::Sidecar::NewStub(channel)->GetInfo(&context, request, &response);
}

TEST(SupervisedCommandTest, OnlyArgvWithTheFlagIsSupervisedAndTheChildDoesNotGetIt) {
  const char* plain[] = {"clusterprof-sidecar", "--port=8466"};
  EXPECT_FALSE(SupervisedCommand(2, plain).has_value());
  const char* supervised[] = {"clusterprof-sidecar", "--supervise", "--port=8466", "--no-gpu"};
  EXPECT_THAT(SupervisedCommand(4, supervised).value(),
              ElementsAre("/proc/self/exe", "--port=8466", "--no-gpu"));
}

TEST(SupervisedCommandTest, LogFormatArgumentReadsBothSpellings) {
  EXPECT_EQ(LogFormatArgument({"x", "--log-format=json"}), "json");
  EXPECT_EQ(LogFormatArgument({"x", "--log-format", "text"}), "text");
  EXPECT_EQ(LogFormatArgument({"x", "--port=1"}), "");
}

// The token Secret is missing in the pod's namespace (the volume is optional, so the pod starts):
// the sidecar refuses to serve without it, the container keeps running, and once the Secret's
// file appears the sidecar starts and requires it.
TEST(SupervisorIntegrationTest, ASidecarWithoutItsTokenFileStartsOnceTheFileAppears) {
  TempDir root;
  const std::string token_file = root.Join("token/token");
  Subprocess supervisor(
      {kSidecar, "--supervise", "--port", "0", "--http-port", "-1", "--shm-dir", root.Join("shm"),
       "--port-file", root.Join("ports"), "--allowed-logdir", root.Join("logs"), "--no-gpu",
       "--auth-token-file", token_file, "--log-format", "text"},
      {}, root.Join("sidecar.log"));
  ASSERT_TRUE(Eventually([&] {
    return Count(ReadFile(root.Join("sidecar.log")), "starting it again") >= 1;
  })) << ReadFile(root.Join("sidecar.log"));
  const std::string log = ReadFile(root.Join("sidecar.log"));
  EXPECT_THAT(log, HasSubstr("--auth-token-file"));
  EXPECT_THAT(log, HasSubstr("clusterprof-sidecar exited with status 1"));
  EXPECT_THAT(log, HasSubstr("The workload's containers are not affected"));
  EXPECT_TRUE(supervisor.running());

  ::mkdir(root.Join("token").c_str(), 0755);
  testing::WriteFileOrDie(token_file, "s3cret\n");
  const int port = testing::ReadGrpcPort(root.Join("ports"), std::chrono::seconds(90));
  ASSERT_NE(port, 0) << ReadFile(root.Join("sidecar.log"));
  EXPECT_TRUE(GetInfo(port, "s3cret").ok());
  EXPECT_EQ(GetInfo(port, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);

  supervisor.Signal(SIGTERM);
  const std::optional<int> status = supervisor.Wait();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status)) << *status;
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

// A sidecar that dies (here SIGKILL, as a crash would) is started again on the same port.
TEST(SupervisorIntegrationTest, ASidecarThatDiesIsStartedAgainAndTheContainerNeverStops) {
  TempDir root;
  const int fixed_port = testing::UnusedPort();
  Subprocess supervisor(
      {kSidecar, "--supervise", "--port", std::to_string(fixed_port), "--http-port", "-1",
       "--shm-dir", root.Join("shm"), "--port-file", root.Join("ports"), "--allowed-logdir",
       root.Join("logs"), "--no-gpu", "--log-format", "json"},
      {}, root.Join("sidecar.log"));
  ASSERT_EQ(testing::ReadGrpcPort(root.Join("ports")), fixed_port)
      << ReadFile(root.Join("sidecar.log"));
  ASSERT_TRUE(GetInfo(fixed_port, "").ok());
  const std::vector<pid_t> first = Children(supervisor.pid());
  ASSERT_EQ(first.size(), 1u);

  ::unlink(root.Join("ports").c_str());
  ::kill(first[0], SIGKILL);
  ASSERT_EQ(testing::ReadGrpcPort(root.Join("ports"), std::chrono::seconds(60)), fixed_port)
      << ReadFile(root.Join("sidecar.log"));
  EXPECT_TRUE(GetInfo(fixed_port, "").ok());
  const std::vector<pid_t> second = Children(supervisor.pid());
  ASSERT_EQ(second.size(), 1u);
  EXPECT_NE(second[0], first[0]);
  // The supervisor's line is in the sidecar's log format.
  EXPECT_THAT(ReadFile(root.Join("sidecar.log")),
              HasSubstr("\"msg\":\"clusterprof-sidecar was killed by signal 9"));

  supervisor.Signal(SIGTERM);
  const std::optional<int> status = supervisor.Wait();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 0);
  EXPECT_TRUE(Eventually([&] { return ::kill(second[0], 0) != 0; }, std::chrono::seconds(10)))
      << "the sidecar outlived its supervisor";
}

// A sidecar that cannot start at all (an unknown flag) fails again at every try; the container's
// process stays up all the same, and stops at once on SIGTERM.
TEST(SupervisorIntegrationTest, ASidecarThatExitsAtStartKeepsTheContainerRunning) {
  TempDir root;
  Subprocess supervisor({kSidecar, "--supervise", "--no-such-flag", "--log-format", "text"}, {},
                        root.Join("sidecar.log"));
  ASSERT_TRUE(Eventually([&] {
    return Count(ReadFile(root.Join("sidecar.log")), "clusterprof-sidecar exited with status") >= 2;
  })) << ReadFile(root.Join("sidecar.log"));
  EXPECT_THAT(ReadFile(root.Join("sidecar.log")), HasSubstr("--no-such-flag"));
  EXPECT_TRUE(supervisor.running());
  supervisor.Signal(SIGTERM);
  const std::optional<int> status = supervisor.Wait(std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

}  // namespace
}  // namespace clusterprof::sidecar
