#include "common/grpc/log_bridge.h"

#include <arpa/inet.h>
#include <grpc/support/log.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/base/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"

namespace clusterprof::grpclog {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// The texts gRPC 1.51.1 (Debian, with OpenSSL 3) logged after "Handshaking failed: " on a TLS
// port, one per kind of client, trimmed of their time stamps.
constexpr char kPlaintextPreface[] =
    "UNKNOWN:Ssl handshake failed: SSL_ERROR_SSL: error:0A00010B:SSL routines::wrong version "
    "number {file:\"./src/core/lib/security/transport/security_handshaker.cc\", file_line:393, "
    "tsi_error:\"TSI_PROTOCOL_FAILURE\", tsi_code:10}";
constexpr char kHttp1Request[] =
    "UNKNOWN:Ssl handshake failed: SSL_ERROR_SSL: error:0A00009C:SSL routines::http request "
    "{tsi_code:10, tsi_error:\"TSI_PROTOCOL_FAILURE\", file_line:393, "
    "file:\"./src/core/lib/security/transport/security_handshaker.cc\"}";
constexpr char kTimedOut[] =
    "UNKNOWN:Handshake read failed {file_line:487, "
    "file:\"./src/core/lib/security/transport/security_handshaker.cc\", children:[UNKNOWN:FD "
    "Shutdown {file_line:200, file:\"./src/core/lib/iomgr/lockfree_event.cc\", "
    "children:[UNKNOWN:Handshake timed out {file_line:167, "
    "file:\"./src/core/lib/transport/handshaker.cc\"}]}]}";
constexpr char kSocketClosed[] =
    "UNKNOWN:Handshake read failed {file_line:487, "
    "file:\"./src/core/lib/security/transport/security_handshaker.cc\", children:[INTERNAL:Socket "
    "closed {target_address:\"ipv4:127.0.0.1:52400\", grpc_status:14, fd:9}]}";
constexpr char kConnectionReset[] =
    "UNKNOWN:Handshake read failed {file_line:487, "
    "file:\"./src/core/lib/security/transport/security_handshaker.cc\", "
    "children:[INTERNAL:recvmsg:Connection reset by peer {fd:9, grpc_status:14, "
    "target_address:\"ipv4:127.0.0.1:52404\"}]}";
constexpr char kClientCertificateFromOtherCa[] =
    "UNKNOWN:Ssl handshake failed: SSL_ERROR_SSL: error:0A000086:SSL routines::certificate verify "
    "failed {file:\"./src/core/lib/security/transport/security_handshaker.cc\", file_line:393, "
    "tsi_error:\"TSI_PROTOCOL_FAILURE\", tsi_code:10}";
constexpr char kNoClientCertificate[] =
    "UNKNOWN:Ssl handshake failed: SSL_ERROR_SSL: error:0A0000C7:SSL routines::peer did not "
    "return a certificate {tsi_code:10, tsi_error:\"TSI_PROTOCOL_FAILURE\", file_line:393, "
    "file:\"./src/core/lib/security/transport/security_handshaker.cc\"}";
constexpr char kListenerStopped[] =
    "UNKNOWN:Handshake read failed {file_line:487, children:[UNKNOWN:FD Shutdown {file_line:200, "
    "children:[UNKNOWN:Listener stopped serving. {file:"
    "\"./src/core/ext/transport/chttp2/server/chttp2_server.cc\", file_line:392}]}]}";

constexpr char kServerFile[] = "./src/core/ext/transport/chttp2/server/chttp2_server.cc";

TEST(ClassifyHandshakeFailureTest, GrpcTexts) {
  EXPECT_EQ(ClassifyHandshakeFailure(kPlaintextPreface), HandshakeFailureReason::kPlaintextClient);
  EXPECT_EQ(ClassifyHandshakeFailure(kHttp1Request), HandshakeFailureReason::kPlaintextClient);
  EXPECT_EQ(ClassifyHandshakeFailure(kTimedOut), HandshakeFailureReason::kTimeout);
  EXPECT_EQ(ClassifyHandshakeFailure(kSocketClosed), HandshakeFailureReason::kClosed);
  EXPECT_EQ(ClassifyHandshakeFailure(kConnectionReset), HandshakeFailureReason::kClosed);
  EXPECT_EQ(ClassifyHandshakeFailure(kClientCertificateFromOtherCa),
            HandshakeFailureReason::kTlsError);
  EXPECT_EQ(ClassifyHandshakeFailure(kNoClientCertificate), HandshakeFailureReason::kTlsError);
  EXPECT_EQ(ClassifyHandshakeFailure(kListenerStopped), HandshakeFailureReason::kServerShutdown);
  EXPECT_EQ(ClassifyHandshakeFailure("OK"), HandshakeFailureReason::kServerShutdown);
  // Other TLS libraries' spellings.
  EXPECT_EQ(ClassifyHandshakeFailure("SSL_ERROR_SSL: error:100000f7:SSL "
                                     "routines:OPENSSL_internal:WRONG_VERSION_NUMBER"),
            HandshakeFailureReason::kPlaintextClient);
  EXPECT_EQ(ClassifyHandshakeFailure("Handshake read failed: End of TCP stream"),
            HandshakeFailureReason::kClosed);
  EXPECT_EQ(ClassifyHandshakeFailure("Deadline Exceeded"), HandshakeFailureReason::kTimeout);
  EXPECT_EQ(ClassifyHandshakeFailure("UNKNOWN:Handshake read failed {children:[something new]}"),
            HandshakeFailureReason::kOther);
}

TEST(ClassifyHandshakeFailureTest, ReasonNames) {
  std::vector<std::string_view> names;
  for (int i = 0; i < kNumHandshakeFailureReasons; ++i) {
    names.push_back(HandshakeFailureReasonName(static_cast<HandshakeFailureReason>(i)));
  }
  EXPECT_THAT(names, ElementsAre("timeout", "plaintext_client", "closed", "tls_error",
                                 "server_shutdown", "other"));
}

// Each test installs a bridge, with spdlog's default logger replaced by one that keeps what it
// was given.
class LogBridgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_logger_ = spdlog::default_logger();
    sink_ = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
    sink_->set_pattern("%l %v");
    auto logger = std::make_shared<spdlog::logger>("test", sink_);
    logger->set_level(spdlog::level::trace);
    spdlog::set_default_logger(logger);
  }

  void TearDown() override {
    bridge_.reset();
    spdlog::set_default_logger(previous_logger_);
  }

  void InstallBridge(LogBridge::Options options = {}) {
    options.clock = &clock_;
    options.on_handshake_failure = [this](const HandshakeFailure& failure) {
      MutexLock lock(&failures_mu_);
      failures_.push_back(failure);
    };
    bridge_ = std::make_unique<LogBridge>(std::move(options));
    ASSERT_TRUE(bridge_->Install().ok());
  }

  // What was logged, one line each (without the line ends).
  std::vector<std::string> Logged() {
    std::vector<std::string> lines = sink_->last_formatted();
    for (std::string& line : lines) {
      if (!line.empty() && line.back() == '\n') line.pop_back();
    }
    return lines;
  }

  // The handshake failures reported once there are `count`, or after 20 s.
  std::vector<HandshakeFailure> AwaitFailures(size_t count) {
    MutexLock lock(&failures_mu_);
    failures_mu_.AwaitWithDeadline(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return failures_.size() >= count; },
        std::chrono::steady_clock::now() + std::chrono::seconds(20));
    return failures_;
  }

  SimulatedClock clock_;
  std::shared_ptr<spdlog::logger> previous_logger_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  std::unique_ptr<LogBridge> bridge_;
  Mutex failures_mu_;
  std::vector<HandshakeFailure> failures_ ABSL_GUARDED_BY(failures_mu_);
};

TEST_F(LogBridgeTest, ForwardsErrorAndInfoDropsDebug) {
  InstallBridge();
  gpr_log("./src/core/tsi/ssl_transport_security.cc", 1501, GPR_LOG_SEVERITY_ERROR,
          "Handshake failed with fatal error %s.", "SSL_ERROR_SSL");
  gpr_log("./src/core/lib/iomgr/ev_epoll1_linux.cc", 121, GPR_LOG_SEVERITY_INFO,
          "grpc epoll fd: %d", 3);
  gpr_log("./src/core/lib/iomgr/ev_posix.cc", 141, GPR_LOG_SEVERITY_DEBUG,
          "Using polling engine: epoll1");
  EXPECT_THAT(Logged(),
              ElementsAre("error grpc: ssl_transport_security.cc:1501: Handshake failed with fatal "
                          "error SSL_ERROR_SSL.",
                          "debug grpc: ev_epoll1_linux.cc:121: grpc epoll fd: 3"));
  EXPECT_EQ(bridge_->handshake_failures_total(), 0);
}

TEST_F(LogBridgeTest, CountsHandshakeFailuresByCause) {
  InstallBridge();
  for (const char* text : {kPlaintextPreface, kHttp1Request, kTimedOut, kSocketClosed,
                           kConnectionReset, kClientCertificateFromOtherCa, kListenerStopped}) {
    gpr_log(kServerFile, 448, GPR_LOG_SEVERITY_DEBUG, "Handshaking failed: %s", text);
  }
  EXPECT_EQ(bridge_->handshake_failures(HandshakeFailureReason::kPlaintextClient), 2);
  EXPECT_EQ(bridge_->handshake_failures(HandshakeFailureReason::kTimeout), 1);
  EXPECT_EQ(bridge_->handshake_failures(HandshakeFailureReason::kClosed), 2);
  EXPECT_EQ(bridge_->handshake_failures(HandshakeFailureReason::kTlsError), 1);
  EXPECT_EQ(bridge_->handshake_failures(HandshakeFailureReason::kServerShutdown), 1);
  EXPECT_EQ(bridge_->handshake_failures(HandshakeFailureReason::kOther), 0);
  EXPECT_EQ(bridge_->handshake_failures_total(), 7);

  const std::vector<HandshakeFailure> failures = AwaitFailures(7);
  ASSERT_EQ(failures.size(), 7u);
  EXPECT_EQ(failures[0].reason, HandshakeFailureReason::kPlaintextClient);
  EXPECT_EQ(failures[0].error, kPlaintextPreface);
  EXPECT_EQ(failures[2].reason, HandshakeFailureReason::kTimeout);
  // Logged at debug, the cause named; the same call site, so 5 of 7 and then suppressed.
  const std::vector<std::string> logged = Logged();
  ASSERT_EQ(logged.size(), 5u);
  EXPECT_THAT(logged[0], AllOf(HasSubstr("debug grpc: chttp2_server.cc:448: Handshaking failed: "
                                         "UNKNOWN:Ssl handshake failed"),
                               HasSubstr("(cause: plaintext_client)")));
  EXPECT_EQ(bridge_->suppressed_lines(), 2);
}

TEST_F(LogBridgeTest, RateLimitsRepeatsPerCallSiteAndSummarisesAfterTheWindow) {
  InstallBridge({.max_lines_per_window = 5, .window_ns = 60 * kNanosPerSecond});
  for (int i = 0; i < 8; ++i) {
    gpr_log("./src/core/a/flood.cc", 7, GPR_LOG_SEVERITY_ERROR, "flood %d", i);
    clock_.AdvanceNs(kNanosPerSecond);
  }
  // Another call site has its own allowance.
  gpr_log("./src/core/a/flood.cc", 8, GPR_LOG_SEVERITY_ERROR, "other");
  std::vector<std::string> logged = Logged();
  EXPECT_THAT(logged,
              ElementsAre("error grpc: flood.cc:7: flood 0", "error grpc: flood.cc:7: flood 1",
                          "error grpc: flood.cc:7: flood 2", "error grpc: flood.cc:7: flood 3",
                          "error grpc: flood.cc:7: flood 4", "error grpc: flood.cc:8: other"));
  EXPECT_EQ(bridge_->suppressed_lines(), 3);

  // Within the window nothing is summarised yet.
  bridge_->FlushSuppressed();
  EXPECT_EQ(Logged().size(), 6u);

  // After it, the next line of any call site brings the summary, and the call site starts over.
  clock_.AdvanceNs(60 * kNanosPerSecond);
  gpr_log("./src/core/a/flood.cc", 7, GPR_LOG_SEVERITY_ERROR, "flood again");
  logged = Logged();
  ASSERT_EQ(logged.size(), 8u);
  EXPECT_EQ(logged[6], "error grpc: flood.cc:7: 3 more like this suppressed");
  EXPECT_EQ(logged[7], "error grpc: flood.cc:7: flood again");
}

TEST_F(LogBridgeTest, FlushAndUninstallSummarise) {
  InstallBridge({.max_lines_per_window = 1, .window_ns = 10 * kNanosPerSecond});
  gpr_log("./src/core/a/x.cc", 1, GPR_LOG_SEVERITY_ERROR, "one");
  gpr_log("./src/core/a/x.cc", 1, GPR_LOG_SEVERITY_ERROR, "two");
  clock_.AdvanceNs(10 * kNanosPerSecond);
  bridge_->FlushSuppressed();
  EXPECT_THAT(Logged(), ElementsAre("error grpc: x.cc:1: one",
                                    "error grpc: x.cc:1: 1 more like this suppressed"));

  gpr_log("./src/core/a/y.cc", 2, GPR_LOG_SEVERITY_INFO, "three");
  gpr_log("./src/core/a/y.cc", 2, GPR_LOG_SEVERITY_INFO, "four");
  gpr_log("./src/core/a/y.cc", 2, GPR_LOG_SEVERITY_INFO, "five");
  bridge_->Uninstall();
  EXPECT_THAT(Logged(), Contains("debug grpc: y.cc:2: 2 more like this suppressed"));
  // gRPC's own log function again: nothing more arrives here.
  const size_t before = Logged().size();
  gpr_log("./src/core/a/z.cc", 3, GPR_LOG_SEVERITY_ERROR, "after uninstall (expected on stderr)");
  EXPECT_EQ(Logged().size(), before);
}

TEST_F(LogBridgeTest, OneBridgeAtATime) {
  InstallBridge();
  LogBridge other({.clock = &clock_});
  EXPECT_EQ(other.Install().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(bridge_->Install().ok());
  bridge_->Uninstall();
  EXPECT_TRUE(other.Install().ok());
  gpr_log("./src/core/a/x.cc", 1, GPR_LOG_SEVERITY_ERROR, "to the other");
  EXPECT_THAT(Logged(), ElementsAre("error grpc: x.cc:1: to the other"));
}

TEST_F(LogBridgeTest, SpdlogLevelOffSkipsLines) {
  InstallBridge();
  spdlog::default_logger()->set_level(spdlog::level::info);
  gpr_log("./src/core/a/x.cc", 1, GPR_LOG_SEVERITY_INFO, "below info");
  gpr_log(kServerFile, 448, GPR_LOG_SEVERITY_DEBUG, "Handshaking failed: %s", kSocketClosed);
  EXPECT_THAT(Logged(), IsEmpty());
  // Counted all the same.
  EXPECT_EQ(bridge_->handshake_failures(HandshakeFailureReason::kClosed), 1);
}

// A self-signed EC P-256 certificate for 127.0.0.1 and its key, PEM.
struct CertificateAndKey {
  std::string certificate;
  std::string key;
};

CertificateAndKey MakeSelfSignedCertificate() {
  const auto take = [](BIO* bio) {
    char* data = nullptr;
    const long length = BIO_get_mem_data(bio, &data);
    std::string text(data, length);
    BIO_free(bio);
    return text;
  };
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* certificate = X509_new();
  X509_set_version(certificate, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(certificate), 1);
  X509_gmtime_adj(X509_getm_notBefore(certificate), -60);
  X509_gmtime_adj(X509_getm_notAfter(certificate), 3600);
  X509_set_pubkey(certificate, key);
  X509_NAME* name = X509_get_subject_name(certificate);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("clusterprof-test"), -1, -1, 0);
  X509_set_issuer_name(certificate, name);
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, certificate, certificate, nullptr, nullptr, 0);
  X509_EXTENSION* san =
      X509V3_EXT_conf_nid(nullptr, &context, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
  X509_add_ext(certificate, san, -1);
  X509_EXTENSION_free(san);
  X509_sign(certificate, key, EVP_sha256());
  CertificateAndKey result;
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, certificate);
  result.certificate = take(bio);
  bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  result.key = take(bio);
  X509_free(certificate);
  EVP_PKEY_free(key);
  return result;
}

// A gRPC server with TLS on 127.0.0.1 and an ephemeral port, serving nothing (every call is
// UNIMPLEMENTED), which is enough for handshakes.
struct TlsServer {
  grpc::CallbackGenericService service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

std::unique_ptr<TlsServer> StartTlsServer(const CertificateAndKey& identity,
                                          int handshake_timeout_ms = 0,
                                          const std::string& client_ca = "") {
  auto result = std::make_unique<TlsServer>();
  grpc::SslServerCredentialsOptions options(
      client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                        : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_key_cert_pairs.push_back({identity.key, identity.certificate});
  options.pem_root_certs = client_ca;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(options), &result->port);
  if (handshake_timeout_ms > 0) {
    builder.AddChannelArgument("grpc.server_handshake_timeout_ms", handshake_timeout_ms);
  }
  builder.RegisterCallbackGenericService(&result->service);
  result->server = builder.BuildAndStart();
  return result;
}

// A TCP connection to 127.0.0.1:`port`, or -1.
int ConnectTcp(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the server ended the connection (EOF or reset) within 20 s.
bool ServerClosed(int fd) {
  pollfd entry = {.fd = fd, .events = POLLIN, .revents = 0};
  if (poll(&entry, 1, 20'000) != 1) return false;
  char buffer[256];
  return read(fd, buffer, sizeof(buffer)) <= 0;
}

TEST_F(LogBridgeTest, PlaintextClientOnTlsPortIsCountedOnce) {
  InstallBridge();
  const std::unique_ptr<TlsServer> server = StartTlsServer(MakeSelfSignedCertificate());
  ASSERT_NE(server->port, 0);

  const int fd = ConnectTcp(server->port);
  ASSERT_GE(fd, 0);
  constexpr std::string_view kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  ASSERT_EQ(write(fd, kPreface.data(), kPreface.size()), static_cast<ssize_t>(kPreface.size()));
  EXPECT_TRUE(ServerClosed(fd));
  close(fd);

  const std::vector<HandshakeFailure> failures = AwaitFailures(1);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].reason, HandshakeFailureReason::kPlaintextClient);
  EXPECT_THAT(failures[0].error, HasSubstr("wrong version number"));
  EXPECT_EQ(bridge_->handshake_failures(HandshakeFailureReason::kPlaintextClient), 1);
  EXPECT_EQ(bridge_->handshake_failures_total(), 1);
  // OpenSSL's own ERROR line came through as well.
  EXPECT_THAT(Logged(), Contains(HasSubstr("error grpc: ssl_transport_security.cc")));
  server->server->Shutdown();
}

TEST_F(LogBridgeTest, IdleClientIsCountedAsTimeout) {
  InstallBridge();
  const std::unique_ptr<TlsServer> server =
      StartTlsServer(MakeSelfSignedCertificate(), /*handshake_timeout_ms=*/300);
  ASSERT_NE(server->port, 0);

  const int fd = ConnectTcp(server->port);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(ServerClosed(fd));
  close(fd);

  const std::vector<HandshakeFailure> failures = AwaitFailures(1);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].reason, HandshakeFailureReason::kTimeout);
  EXPECT_THAT(failures[0].error, HasSubstr("Handshake timed out"));
  EXPECT_EQ(bridge_->handshake_failures_total(), 1);
  server->server->Shutdown();
}

TEST_F(LogBridgeTest, ClientCertificateFromAnotherCaIsTlsError) {
  InstallBridge();
  const CertificateAndKey server_identity = MakeSelfSignedCertificate();
  const CertificateAndKey stranger = MakeSelfSignedCertificate();
  // Mutual TLS: clients must present a certificate that the server's own CA signed.
  const std::unique_ptr<TlsServer> server =
      StartTlsServer(server_identity, 0, /*client_ca=*/server_identity.certificate);
  ASSERT_NE(server->port, 0);

  grpc::SslCredentialsOptions client;
  client.pem_root_certs = server_identity.certificate;
  client.pem_private_key = stranger.key;
  client.pem_cert_chain = stranger.certificate;
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server->port),
                                     grpc::SslCredentials(client));
  // Connecting starts the handshake; it fails, so this waits out its deadline (or gRPC's
  // backoff) and returns false.
  EXPECT_FALSE(
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::milliseconds(500)));

  const std::vector<HandshakeFailure> failures = AwaitFailures(1);
  ASSERT_GE(failures.size(), 1u);
  for (const HandshakeFailure& failure : failures) {
    EXPECT_EQ(failure.reason, HandshakeFailureReason::kTlsError) << failure.error;
    EXPECT_THAT(failure.error, HasSubstr("certificate verify failed"));
  }
  EXPECT_THAT(Logged(), Not(Contains(HasSubstr("BEGIN"))));
  server->server->Shutdown();
}

}  // namespace
}  // namespace clusterprof::grpclog
