// A sidecar started with --auth-token-file, as the chart starts it: calls without the token, or
// with another one, are UNAUTHENTICATED; the coordinator's calls carry it; a rotated Secret
// takes effect without a restart.
#include <sys/stat.h>

#include <fstream>
#include <thread>

#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "coordinator/coordinator.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"

namespace clusterprof {
namespace {

using ::testing::HasSubstr;
using testing::Subprocess;
using testing::TempDir;

constexpr char kSidecar[] = CLUSTERPROF_SIDECAR_PATH;

grpc::Status GetInfo(const std::shared_ptr<grpc::Channel>& channel, const std::string& token) {
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  clusterprof::v1alpha1::GetInfoRequest request;
  clusterprof::v1alpha1::GetInfoResponse response;
  return clusterprof::v1alpha1::Sidecar::NewStub(channel)->GetInfo(&context, request, &response);
}

TEST(TokenAuthIntegrationTest, OnlyCallsWithTheTokenGetThrough) {
  TempDir root;
  const std::string token_file = root.Join("token");
  testing::WriteFileOrDie(token_file, "s3cret-token\n");
  Subprocess sidecar({kSidecar, "--port", "0", "--http-port", "-1", "--shm-dir", root.Join("shm"),
                      "--port-file", root.Join("ports"), "--allowed-logdir", root.Join("logs"),
                      "--no-gpu", "--auth-token-file", token_file},
                     {}, root.Join("sidecar.log"));
  const int port = testing::ReadGrpcPort(root.Join("ports"));
  ASSERT_NE(port, 0) << "the sidecar did not start";
  auto channel =
      grpc::CreateChannel(StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());

  const grpc::Status none = GetInfo(channel, "");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.error_message(), HasSubstr("requires a bearer token"));
  EXPECT_EQ(GetInfo(channel, "guess").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(GetInfo(channel, "s3cret-token").ok()) << "the file's newline is not the token's";
  {
    tensorflow::ProfileRequest request;
    request.mutable_opts()->set_version(1);
    request.mutable_opts()->set_duration_ms(100);
    request.set_emit_xspace(true);
    tensorflow::ProfileResponse response;
    grpc::ClientContext context;
    const grpc::Status status =
        tensorflow::ProfilerService::NewStub(channel)->Profile(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "Profile too";
  }

  // The coordinator sends the token on every call: probes, Profile, session queries.
  coordinator::CaptureOptions options;
  options.targets.push_back({StrCat("127.0.0.1:", port), ""});
  options.logdir = *storage::ParseLogdir(root.Join("logs"));
  options.duration_ms = 200;
  options.delay_ms = 300;
  options.run = "with_token";
  options.auth_token = "s3cret-token";
  RealClock clock;
  auto result = coordinator::Capture(options, clock);
  ASSERT_TRUE(result.ok() || result.status().code() == absl::StatusCode::kUnavailable)
      << result.status();
  // Nothing annotates here, so the capture is empty (UNAVAILABLE), but it ran: the sidecar
  // knows the session.
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer s3cret-token");
    clusterprof::v1alpha1::GetSessionRequest request;
    request.set_session_id("with_token");
    clusterprof::v1alpha1::GetSessionResponse response;
    const grpc::Status status =
        clusterprof::v1alpha1::Sidecar::NewStub(channel)->GetSession(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }

  // A rotated Secret: the new token works at once, the old one no more.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a new mtime
  testing::WriteFileOrDie(token_file, "rotated-token");
  EXPECT_TRUE(GetInfo(channel, "rotated-token").ok());
  EXPECT_EQ(GetInfo(channel, "s3cret-token").error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST(TokenAuthIntegrationTest, AnUnreadableTokenFileStopsTheSidecarWithAClearError) {
  TempDir root;
  Subprocess sidecar({kSidecar, "--port", "0", "--http-port", "-1", "--shm-dir", root.Join("shm"),
                      "--no-gpu", "--auth-token-file", root.Join("missing")},
                     {}, root.Join("sidecar.log"));
  const std::optional<int> status = sidecar.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_NE(*status, 0);
  EXPECT_THAT(testing::ReadFileOrDie(root.Join("sidecar.log")),
              HasSubstr("--auth-token-file: cannot stat the token file"));
}

}  // namespace
}  // namespace clusterprof
