// The sidecar binary with TLS, as the chart starts it: TLS on its port and plaintext only on
// loopback; a token that rotates with a grace period; each refusal counted in /metrics; and a
// certificate and token rotated in the middle of a capture losing nothing of it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "common/grpc/tls.h"
#include "coordinator/coordinator.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/support/local_http.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_pki.h"

namespace clusterprof {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::PublishSecret;
using testing::Subprocess;
using testing::TempDir;
using testing::TestCa;

constexpr char kSidecar[] = CLUSTERPROF_SIDECAR_PATH;
constexpr char kAnnotator[] = CLUSTERPROF_TEST_ANNOTATOR_PATH;

grpc::Status GetInfo(const tls::ChannelSecurity& security, const std::string& address,
                     const std::string& token) {
  static int unique = 0;
  grpc::ChannelArguments args;
  security.ConfigureArgs(&args);
  args.SetInt("clusterprof.test.unique", ++unique);
  auto channel = grpc::CreateCustomChannel("ipv4:" + address, security.credentials(), args);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  v1alpha1::GetInfoResponse response;
  return v1alpha1::Sidecar::NewStub(channel)->GetInfo(&context, v1alpha1::GetInfoRequest(),
                                                      &response);
}

// The sum of the samples of `name` whose labels contain `labels`, from /metrics.
double Metric(int http_port, const std::string& name, const std::string& labels = "") {
  return testing::MetricSum(testing::HttpGet(http_port, "/metrics"), name, labels);
}

class SidecarTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const testing::IssuedPair pair = ca_.Issue({tls::kDefaultServerName}, -60, 86400, "first");
    PublishSecret(root_.Join("tls"), {{"tls.crt", pair.cert_pem}, {"tls.key", pair.key_pem}});
    PublishSecret(root_.Join("token"), {{"token", "token-one"}});
    PublishSecret(root_.Join("ca"), {{"ca.crt", ca_.ca_pem()}});
    std::filesystem::create_directories(root_.Join("logs"));
  }

  void StartSidecar(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {kSidecar,
                                     "--port",
                                     "0",
                                     "--http-port",
                                     "0",
                                     "--shm-dir",
                                     root_.Join("shm"),
                                     "--port-file",
                                     root_.Join("ports"),
                                     "--allowed-logdir",
                                     root_.Join("logs"),
                                     "--no-gpu",
                                     "--tls-cert-file",
                                     root_.Join("tls/tls.crt"),
                                     "--tls-key-file",
                                     root_.Join("tls/tls.key"),
                                     "--auth-token-file",
                                     root_.Join("token/token"),
                                     "--log-level",
                                     "debug"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    sidecar_ = std::make_unique<Subprocess>(argv, std::map<std::string, std::string>{},
                                            root_.Join("sidecar.log"));
    port_ = testing::ReadGrpcPort(root_.Join("ports"));
    ASSERT_NE(port_, 0) << "the sidecar did not start: " << Log();
    std::map<std::string, int> ports = testing::ReadPortFile(root_.Join("ports"));
    http_port_ = ports["http"];
    loopback_port_ = ports["grpc_loopback"];
    auto security = tls::ChannelSecurity::Tls(root_.Join("ca/ca.crt"));
    ASSERT_TRUE(security.ok()) << security.status();
    security_ = *security;
  }

  std::string Log() const {
    return std::filesystem::exists(root_.Join("sidecar.log"))
               ? testing::ReadFileOrDie(root_.Join("sidecar.log"))
               : "";
  }
  std::string address() const { return StrCat("127.0.0.1:", port_); }

  TempDir root_;
  TestCa ca_;
  std::unique_ptr<Subprocess> sidecar_;
  int port_ = 0;
  int http_port_ = 0;
  int loopback_port_ = 0;
  std::shared_ptr<const tls::ChannelSecurity> security_;
};

TEST_F(SidecarTlsTest, ServesTlsAndPlaintextOnlyOnLoopback) {
  StartSidecar();
  EXPECT_TRUE(GetInfo(*security_, address(), "token-one").ok());
  EXPECT_EQ(GetInfo(*security_, address(), "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // Plaintext on the TLS port is refused, and counted.
  const grpc::Status plaintext = GetInfo(*tls::ChannelSecurity::Insecure(), address(), "token-one");
  EXPECT_EQ(plaintext.error_code(), grpc::StatusCode::UNAVAILABLE);
  double plaintext_counted = 0;
  for (int i = 0; i < 100 && plaintext_counted < 1; ++i) {
    plaintext_counted = Metric(http_port_, "clusterprof_sidecar_handshake_failures_total",
                               "reason=\"plaintext_client\"");
    if (plaintext_counted < 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GE(plaintext_counted, 1);
  // The loopback listener speaks plaintext (kubectl port-forward arrives there) and still wants
  // the token.
  ASSERT_NE(loopback_port_, 0);
  const std::string loopback = StrCat("127.0.0.1:", loopback_port_);
  EXPECT_TRUE(GetInfo(*tls::ChannelSecurity::Insecure(), loopback, "token-one").ok());
  EXPECT_EQ(GetInfo(*tls::ChannelSecurity::Insecure(), loopback, "").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_GE(
      Metric(http_port_, "clusterprof_sidecar_unauthenticated_calls_total", "reason=\"missing\""),
      2);
  EXPECT_GT(Metric(http_port_, "clusterprof_sidecar_tls_certificate_expiry_timestamp_seconds"), 0);
  EXPECT_THAT(Log(), HasSubstr("serving TLS with the certificate CN=first"));
  EXPECT_THAT(Log(), Not(HasSubstr("token-one")));
}

TEST_F(SidecarTlsTest, TheOldTokenIsAcceptedForItsGracePeriodOnly) {
  StartSidecar({"--token-grace-seconds", "2"});
  ASSERT_TRUE(GetInfo(*security_, address(), "token-one").ok());
  PublishSecret(root_.Join("token"), {{"token", "token-two"}});
  EXPECT_TRUE(GetInfo(*security_, address(), "token-two").ok());
  EXPECT_TRUE(GetInfo(*security_, address(), "token-one").ok()) << "within the grace period";
  grpc::Status old = grpc::Status::OK;
  for (int i = 0; i < 100 && old.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    old = GetInfo(*security_, address(), "token-one");
  }
  EXPECT_EQ(old.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(old.error_message(), HasSubstr("grace period"));
  EXPECT_GE(Metric(http_port_, "clusterprof_sidecar_unauthenticated_calls_total",
                   "reason=\"rotated_out\""),
            1);
  EXPECT_EQ(GetInfo(*security_, address(), "guess").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_GE(
      Metric(http_port_, "clusterprof_sidecar_unauthenticated_calls_total", "reason=\"wrong\""), 1);
  // An empty token file (a Secret being rewritten) keeps the token in force.
  PublishSecret(root_.Join("token"), {{"token", ""}});
  EXPECT_TRUE(GetInfo(*security_, address(), "token-two").ok());
  EXPECT_GE(Metric(http_port_, "clusterprof_sidecar_credential_reloads_total",
                   "file=\"token\",result=\"empty\""),
            1);
  // A missing one too.
  std::filesystem::remove(root_.Join("token/token"));
  EXPECT_TRUE(GetInfo(*security_, address(), "token-two").ok());
  EXPECT_THAT(Log(), Not(HasSubstr("token-one")));
  EXPECT_THAT(Log(), Not(HasSubstr("token-two")));
}

TEST_F(SidecarTlsTest, ARotationDuringACaptureLosesNothing) {
  StartSidecar();
  Subprocess workload({kAnnotator, "--seconds", "30"}, {{"CLUSTERPROF_DIR", root_.Join("shm")}},
                      root_.Join("workload.log"));
  // The operator's side of the Secret: its token file, reread for each capture.
  coordinator::CaptureOptions options;
  options.targets.push_back({address(), ""});
  const storage::Logdir logdir = *storage::ParseLogdir(root_.Join("logs"));
  options.layout = *storage::RunLayout::Create(logdir, "rotated");
  options.duration_ms = 3000;
  options.auth_token = "token-one";
  options.security = security_;
  RealClock clock;
  absl::StatusOr<coordinator::RunResult> result;
  std::thread capture([&] { result = coordinator::Capture(options, clock); });
  // Mid-window: a new certificate (same CA) and a new token, as `helm upgrade` rolls them out.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const testing::IssuedPair second = ca_.Issue({tls::kDefaultServerName}, -60, 86400, "second");
  PublishSecret(root_.Join("tls"), {{"tls.crt", second.cert_pem}, {"tls.key", second.key_pem}});
  PublishSecret(root_.Join("token"), {{"token", "token-two"}});
  capture.join();
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->targets.size(), 1u);
  EXPECT_EQ(result->targets[0].outcome, coordinator::Outcome::kOk) << result->targets[0].message;
  EXPECT_GT(result->targets[0].events, 0u);
  EXPECT_FALSE(result->targets[0].files.empty());
  for (const std::string& file : result->targets[0].files) {
    EXPECT_TRUE(std::filesystem::exists(file) ||
                std::filesystem::exists(root_.Join("logs") + "/" + file))
        << file;
  }
  // The next capture uses the new token, over the new certificate.
  options.layout = *storage::RunLayout::Create(logdir, "after");
  options.duration_ms = 300;
  options.auth_token = "token-two";
  auto after = coordinator::Capture(options, clock);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->targets[0].outcome, coordinator::Outcome::kOk) << after->targets[0].message;
  // The sidecar said what it now serves.
  for (int i = 0; i < 100 && Log().find("new connections get CN=second") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_THAT(Log(), HasSubstr("new connections get CN=second"));
  EXPECT_GE(Metric(http_port_, "clusterprof_sidecar_credential_reloads_total",
                   "file=\"token\",result=\"ok\""),
            1);
}

// Connections that never finish their handshake are closed after --handshake-timeout-ms, and one
// peer's pile of them beyond --max-connections-per-peer at once; others are served throughout.
TEST_F(SidecarTlsTest, HandshakesAreBoundedInTimeAndCount) {
  StartSidecar({"--handshake-timeout-ms", "1000", "--max-connections-per-peer", "8"});
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in source = {};
    source.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.2", &source.sin_addr);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof(source)), 0);
    sockaddr_in target = {};
    target.sin_family = AF_INET;
    target.sin_port = htons(static_cast<uint16_t>(port_));
    inet_pton(AF_INET, "127.0.0.1", &target.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&target), sizeof(target)), 0);
    idle.push_back(fd);
  }
  EXPECT_TRUE(GetInfo(*security_, address(), "token-one").ok()) << "others are served";
  // Every idle connection is closed by the server: over the cap at the next sweep, the rest
  // when their handshake time is up.
  int closed = 0;
  for (int fd : idle) {
    pollfd p = {fd, POLLIN, 0};
    char byte;
    if (poll(&p, 1, 10'000) == 1 && recv(fd, &byte, 1, 0) <= 0) ++closed;
    close(fd);
  }
  EXPECT_EQ(closed, 20);
  EXPECT_GE(
      Metric(http_port_, "clusterprof_sidecar_connections_closed_total", "reason=\"per_peer\""), 1);
  EXPECT_GE(
      Metric(http_port_, "clusterprof_sidecar_handshake_failures_total", "reason=\"timeout\""), 1);
  EXPECT_TRUE(GetInfo(*security_, address(), "token-one").ok());
}

// During a rotation the operator may hold the new token before a sidecar does: it falls back to
// the one before.
TEST_F(SidecarTlsTest, ACallerWithTheNewTokenFallsBackToTheOneBefore) {
  StartSidecar();
  coordinator::CaptureOptions options;
  options.targets.push_back({address(), ""});
  const storage::Logdir logdir = *storage::ParseLogdir(root_.Join("logs"));
  options.layout = *storage::RunLayout::Create(logdir, "fallback");
  options.duration_ms = 200;
  options.auth_token = "token-two";  // not yet in the sidecar's file
  options.previous_auth_token = "token-one";
  options.security = security_;
  RealClock clock;
  auto result = coordinator::Capture(options, clock);
  // Nothing annotates: the capture is empty, but it ran (no target refused).
  ASSERT_TRUE(result.ok() || result.status().code() == absl::StatusCode::kUnavailable)
      << result.status();
  EXPECT_EQ(Metric(http_port_, "clusterprof_sidecar_captures_total"), 1);
  options.previous_auth_token.clear();
  options.layout = *storage::RunLayout::Create(logdir, "no-fallback");
  result = coordinator::Capture(options, clock);
  ASSERT_FALSE(result.ok());
  EXPECT_GE(
      Metric(http_port_, "clusterprof_sidecar_unauthenticated_calls_total", "reason=\"wrong\""), 1);
}

TEST_F(SidecarTlsTest, BadTlsFilesStopTheSidecarWithAClearError) {
  const testing::IssuedPair other = ca_.Issue({tls::kDefaultServerName});
  PublishSecret(root_.Join("other"), {{"tls.key", other.key_pem}});
  Subprocess sidecar(
      {kSidecar, "--port", "0", "--http-port", "-1", "--shm-dir", root_.Join("shm"), "--no-gpu",
       "--tls-cert-file", root_.Join("tls/tls.crt"), "--tls-key-file", root_.Join("other/tls.key")},
      {}, root_.Join("bad.log"));
  EXPECT_NE(sidecar.Wait(), std::optional<int>(0));
  const std::string log = testing::ReadFileOrDie(root_.Join("bad.log"));
  EXPECT_THAT(log, HasSubstr("does not belong to the certificate"));
  EXPECT_THAT(log, Not(HasSubstr("PRIVATE KEY")));
  Subprocess half({kSidecar, "--port", "0", "--http-port", "-1", "--shm-dir", root_.Join("shm"),
                   "--no-gpu", "--tls-cert-file", root_.Join("tls/tls.crt")},
                  {}, root_.Join("half.log"));
  EXPECT_NE(half.Wait(), std::optional<int>(0));
  EXPECT_THAT(testing::ReadFileOrDie(root_.Join("half.log")), HasSubstr("go together"));
}

}  // namespace
}  // namespace clusterprof
