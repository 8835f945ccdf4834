// A sidecar started with --auth-token-file, as the chart starts it: calls without the token, or
// with another one, are UNAUTHENTICATED, whatever the RPC; the coordinator's calls carry it; a
// rotated Secret takes effect without a restart; and neither the token nor a wrong one shows in
// the sidecar's log, its metrics or the CLI's output.
#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <thread>

#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "coordinator/coordinator.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "sidecar/token_auth.h"
#include "tests/support/local_http.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"

namespace clusterprof {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::Subprocess;
using testing::TempDir;

constexpr char kSidecar[] = CLUSTERPROF_SIDECAR_PATH;
constexpr char kCli[] = CLUSTERPROF_CLI_PATH;

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
  // No grace: the old token is refused as soon as the file changes (grace: token rotation tests).
  Subprocess sidecar({kSidecar, "--port", "0", "--http-port", "-1", "--shm-dir", root.Join("shm"),
                      "--port-file", root.Join("ports"), "--allowed-logdir", root.Join("logs"),
                      "--no-gpu", "--auth-token-file", token_file, "--token-grace-seconds", "0"},
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
  for (const std::string token : {"", "s3cret-token"}) {
    // The live steps too; with the token the stream opens (its first message comes at once).
    grpc::ClientContext context;
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    auto reader = clusterprof::v1alpha1::Sidecar::NewStub(channel)->WatchSteps(
        &context, clusterprof::v1alpha1::WatchStepsRequest());
    clusterprof::v1alpha1::WatchStepsResponse message;
    const bool read = reader->Read(&message);
    if (read) context.TryCancel();  // the stream runs until the client ends it
    const grpc::Status status = reader->Finish();
    if (token.empty()) {
      EXPECT_FALSE(read);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "WatchSteps too";
    } else {
      EXPECT_TRUE(read) << status.error_message();
    }
  }

  // The coordinator sends the token on every call: probes, Profile, session queries.
  coordinator::CaptureOptions options;
  options.targets.push_back({StrCat("127.0.0.1:", port), ""});
  options.layout =
      *storage::RunLayout::Create(*storage::ParseLogdir(root.Join("logs")), "with_token");
  options.duration_ms = 200;
  options.delay_ms = 300;
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

// Every RPC of both services, with no token, a wrong one, a malformed header and the right one;
// then nothing the sidecar logged at its most verbose, nothing its /metrics serves and nothing the
// CLI printed holds either token.
TEST(IsLoopbackPeerTest, OnlyLoopbackAddressesAre) {
  using sidecar::IsLoopbackPeer;
  EXPECT_TRUE(IsLoopbackPeer("ipv4:127.0.0.1:5000"));
  EXPECT_TRUE(IsLoopbackPeer("ipv4:127.10.0.3:1"));
  EXPECT_TRUE(IsLoopbackPeer("ipv6:[::1]:5000"));
  EXPECT_TRUE(IsLoopbackPeer("ipv6:[::ffff:127.0.0.1]:5000"));
  EXPECT_FALSE(IsLoopbackPeer("ipv4:10.0.0.5:5000"));
  EXPECT_FALSE(IsLoopbackPeer("ipv4:128.0.0.1:5000"));
  EXPECT_FALSE(IsLoopbackPeer("ipv4:127.0.0.1.example:5000"));
  EXPECT_FALSE(IsLoopbackPeer("ipv6:[::ffff:10.0.0.1]:5000"));
  EXPECT_FALSE(IsLoopbackPeer("ipv6:[fe80::1]:5000"));
  EXPECT_FALSE(IsLoopbackPeer("unix:/tmp/socket"));
  EXPECT_FALSE(IsLoopbackPeer(""));
}

// kubectl port-forward arrives on the pod's loopback: with --allow-loopback-without-token a
// client that sends no token (XProf's capture button, jax.collect_profile) gets through there.
TEST(TokenAuthIntegrationTest, LoopbackCallsNeedNoTokenWhenAllowed) {
  TempDir root;
  const std::string token_file = root.Join("token");
  testing::WriteFileOrDie(token_file, "s3cret-token\n");
  Subprocess sidecar(
      {kSidecar, "--port", "0", "--http-port", "-1", "--shm-dir", root.Join("shm"), "--port-file",
       root.Join("ports"), "--allowed-logdir", root.Join("logs"), "--no-gpu", "--auth-token-file",
       token_file, "--allow-loopback-without-token"},
      {}, root.Join("sidecar.log"));
  const int port = testing::ReadGrpcPort(root.Join("ports"));
  ASSERT_NE(port, 0) << "the sidecar did not start";
  auto channel =
      grpc::CreateChannel(StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  EXPECT_TRUE(GetInfo(channel, "").ok());
  EXPECT_TRUE(GetInfo(channel, "s3cret-token").ok());
  // Callers from elsewhere still need it: IsLoopbackPeerTest above.
}

TEST(TokenAuthIntegrationTest, EveryRpcNeedsTheTokenAndNoLogShowsIt) {
  TempDir root;
  const std::string token = "s3cret-7f1c9a2e58d4-token";
  const std::string wrong = "wrong-4b8d1e0c93aa-guess";
  const std::string token_file = root.Join("token");
  const std::string wrong_file = root.Join("wrong");
  testing::WriteFileOrDie(token_file, token + "\n");
  testing::WriteFileOrDie(wrong_file, wrong + "\n");
  const std::string log = root.Join("sidecar.log");
  Subprocess sidecar({kSidecar, "--port", "0", "--http-port", "0", "--shm-dir", root.Join("shm"),
                      "--port-file", root.Join("ports"), "--allowed-logdir", root.Join("logs"),
                      "--no-gpu", "--auth-token-file", token_file, "--log-level", "trace"},
                     {}, log);
  const int port = testing::ReadGrpcPort(root.Join("ports"));
  ASSERT_NE(port, 0) << "the sidecar did not start";
  const int http_port = testing::ReadPortFile(root.Join("ports"))["http"];
  auto channel =
      grpc::CreateChannel(StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  auto profiler = tensorflow::ProfilerService::NewStub(channel);
  auto sidecar_service = clusterprof::v1alpha1::Sidecar::NewStub(channel);

  // The value of the authorization header: none, or as given.
  using Rpc = std::function<grpc::Status(const std::optional<std::string>& authorization)>;
  auto with = [](const std::optional<std::string>& authorization, grpc::ClientContext* context) {
    if (authorization.has_value()) context->AddMetadata("authorization", *authorization);
  };
  const std::map<std::string, Rpc> rpcs = {
      {"Profile",
       [&](const std::optional<std::string>& authorization) {
         grpc::ClientContext context;
         with(authorization, &context);
         tensorflow::ProfileRequest request;
         request.mutable_opts()->set_version(1);
         request.mutable_opts()->set_duration_ms(50);
         request.set_session_id("with_the_token");
         request.set_repository_root(root.Join("logs/plugins/profile"));
         tensorflow::ProfileResponse response;
         return profiler->Profile(&context, request, &response);
       }},
      {"Terminate",
       [&](const std::optional<std::string>& authorization) {
         grpc::ClientContext context;
         with(authorization, &context);
         tensorflow::TerminateRequest request;
         request.set_session_id("with_the_token");
         tensorflow::TerminateResponse response;
         return profiler->Terminate(&context, request, &response);
       }},
      {"Monitor",
       [&](const std::optional<std::string>& authorization) {
         grpc::ClientContext context;
         with(authorization, &context);
         tensorflow::MonitorRequest request;
         tensorflow::MonitorResponse response;
         return profiler->Monitor(&context, request, &response);
       }},
      {"GetInfo",
       [&](const std::optional<std::string>& authorization) {
         grpc::ClientContext context;
         with(authorization, &context);
         clusterprof::v1alpha1::GetInfoResponse response;
         return sidecar_service->GetInfo(&context, {}, &response);
       }},
      {"GetSession",
       [&](const std::optional<std::string>& authorization) {
         grpc::ClientContext context;
         with(authorization, &context);
         clusterprof::v1alpha1::GetSessionRequest request;
         request.set_session_id("with_the_token");
         clusterprof::v1alpha1::GetSessionResponse response;
         return sidecar_service->GetSession(&context, request, &response);
       }},
      // A method no service here has (a health check, as a load balancer would send it).
      {"Unknown",
       [&](const std::optional<std::string>& authorization) {
         grpc::ClientContext context;
         with(authorization, &context);
         grpc::GenericStub generic(channel);
         grpc::Slice empty("");
         grpc::ByteBuffer request(&empty, 1);  // an empty HealthCheckRequest
         grpc::ByteBuffer response;
         std::promise<grpc::Status> done;
         generic.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                           &response,
                           [&done](grpc::Status status) { done.set_value(std::move(status)); });
         return done.get_future().get();
       }},
  };
  // What each RPC answers with the token (Profile runs first, so GetSession finds its session).
  const std::map<std::string, grpc::StatusCode> authorized = {
      {"Profile", grpc::StatusCode::OK},
      {"Terminate", grpc::StatusCode::OK},
      {"Monitor", grpc::StatusCode::UNIMPLEMENTED},
      {"GetInfo", grpc::StatusCode::OK},
      {"GetSession", grpc::StatusCode::OK},
      {"Unknown", grpc::StatusCode::UNIMPLEMENTED},
  };
  const std::vector<std::string> order = {"Profile", "Terminate",  "Monitor",
                                          "GetInfo", "GetSession", "Unknown"};
  for (const std::string& name : order) {
    SCOPED_TRACE(name);
    const Rpc& rpc = rpcs.at(name);
    const grpc::Status none = rpc(std::nullopt);
    EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
    EXPECT_THAT(none.error_message(), HasSubstr("requires a bearer token"));
    for (const std::string& refused :
         {StrCat("Bearer ", wrong), token, StrCat("Bearer ", token, "x"), StrCat("Basic ", token),
          StrCat("Bearer  ", token), std::string("Bearer ")}) {
      const grpc::Status status = rpc(refused);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << "authorization: " << refused;
      EXPECT_THAT(status.error_message(), ::testing::AnyOf(HasSubstr("does not match"),
                                                           HasSubstr("is not \"Bearer <token>\"")));
      EXPECT_THAT(status.error_message(), Not(HasSubstr(token)));
      EXPECT_THAT(status.error_message(), Not(HasSubstr(wrong)));
    }
    const grpc::Status right = rpc(StrCat("Bearer ", token));
    EXPECT_EQ(right.error_code(), authorized.at(name)) << right.error_message();
  }

  // The CLI, with the wrong token and with the right one.
  for (const std::string& file : {wrong_file, token_file}) {
    const std::string out = root.Join("cli.out");
    Subprocess cli({kCli, "capture", "--service-addr", StrCat("127.0.0.1:", port), "--logdir",
                    root.Join("logs"), "--duration-ms", "100", "--num-tracing-attempts", "1",
                    "--token-file", file, "--no-progress"},
                   {}, out);
    ASSERT_TRUE(cli.Wait(std::chrono::seconds(60)).has_value());
  }
  const std::string cli_output = testing::ReadFileOrDie(root.Join("cli.out"));
  EXPECT_THAT(cli_output, HasSubstr("UNAUTHENTICATED")) << "the wrong token's run failed";

  const std::string metrics = testing::HttpGet(http_port, "/metrics");
  ASSERT_THAT(metrics, HasSubstr("clusterprof_sidecar_refused_requests_total"));
  EXPECT_GT(
      testing::MetricSum(metrics, "clusterprof_sidecar_refused_requests_total", "UNAUTHENTICATED"),
      0);
  sidecar.Signal(SIGTERM);
  ASSERT_TRUE(sidecar.Wait(std::chrono::seconds(30)).has_value());
  const std::string sidecar_log = testing::ReadFileOrDie(log);
  EXPECT_THAT(sidecar_log, HasSubstr("refused")) << "the refusals were logged";
  for (const std::string& secret : {token, wrong}) {
    SCOPED_TRACE(secret);
    EXPECT_THAT(sidecar_log, Not(HasSubstr(secret)));
    EXPECT_THAT(metrics, Not(HasSubstr(secret)));
    EXPECT_THAT(cli_output, Not(HasSubstr(secret)));
  }
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
