// TLS on a real gRPC server on loopback: the server's files reread, the client's verification of
// a fixed name over an IP, and each refusal (another CA, expired, another name, a plaintext
// server) diagnosed with its cause.
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/strings.h"
#include "common/grpc/tls.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/server_credentials.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_pki.h"

namespace clusterprof::tls {
namespace {

using ::testing::HasSubstr;
using testing::IssuedPair;
using testing::PublishSecret;
using testing::TempDir;
using testing::TestCa;

class InfoService final : public v1alpha1::Sidecar::Service {
  grpc::Status GetInfo(grpc::ServerContext*, const v1alpha1::GetInfoRequest*,
                       v1alpha1::GetInfoResponse* response) override {
    response->set_host_name("tls-test");
    return grpc::Status::OK;
  }
};

// A server on 127.0.0.1:0 with `credentials`.
struct Server {
  explicit Server(const std::shared_ptr<grpc::ServerCredentials>& credentials) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", credentials, &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Server() { server->Shutdown(); }
  std::string address() const { return StrCat("127.0.0.1:", port); }

  InfoService service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// One GetInfo on a channel of its own (a new connection, so a new handshake); the subject of the
// server's certificate in `subject` when asked.
grpc::Status Call(const ChannelSecurity& security, const std::string& address,
                  std::string* subject = nullptr) {
  static int unique = 0;
  grpc::ChannelArguments args;
  security.ConfigureArgs(&args);
  args.SetInt("clusterprof.test.unique", ++unique);
  auto channel = grpc::CreateCustomChannel("ipv4:" + address, security.credentials(), args);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1alpha1::GetInfoResponse response;
  grpc::Status status =
      v1alpha1::Sidecar::NewStub(channel)->GetInfo(&context, v1alpha1::GetInfoRequest(), &response);
  if (status.ok() && subject != nullptr) {
    auto values = context.auth_context()->FindPropertyValues("x509_subject");
    *subject = values.empty() ? "" : std::string(values.front().data(), values.front().size());
  }
  return status;
}

TEST(TlsTest, ReadsCertificatesAndChecksPairs) {
  TempDir dir;
  TestCa ca;
  const IssuedPair pair = ca.Issue({"clusterprof-sidecar", "other.example"});
  const IssuedPair other = ca.Issue({"clusterprof-sidecar"});
  PublishSecret(dir.Join("tls"), {{"tls.crt", pair.cert_pem},
                                  {"tls.key", pair.key_pem},
                                  {"other.key", other.key_pem},
                                  {"garbage", "not a certificate"}});
  absl::StatusOr<CertificateInfo> info = ReadCertificate(dir.Join("tls/tls.crt"));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->subject, "CN=clusterprof-sidecar");
  EXPECT_EQ(info->issuer, "CN=clusterprof-test-ca");
  EXPECT_THAT(info->dns_names, ::testing::ElementsAre("clusterprof-sidecar", "other.example"));
  EXPECT_GT(info->not_after_s, info->not_before_s);

  EXPECT_TRUE(CheckKeyPair(dir.Join("tls/tls.crt"), dir.Join("tls/tls.key")).ok());
  absl::Status mismatched = CheckKeyPair(dir.Join("tls/tls.crt"), dir.Join("tls/other.key"));
  EXPECT_THAT(mismatched.message(), HasSubstr("does not belong to the certificate"));
  EXPECT_THAT(mismatched.message(), Not(HasSubstr("PRIVATE KEY")));
  EXPECT_THAT(CheckKeyPair(dir.Join("tls/tls.crt"), dir.Join("tls/missing.key")).message(),
              HasSubstr("missing.key"));
  EXPECT_THAT(CheckKeyPair(dir.Join("tls/garbage"), dir.Join("tls/tls.key")).message(),
              HasSubstr("holds no PEM certificate"));
  EXPECT_FALSE(MakeServerCredentials(dir.Join("tls/tls.crt"), dir.Join("tls/other.key")).ok());
  EXPECT_THAT(ChannelSecurity::Tls(dir.Join("tls/garbage")).status().message(),
              HasSubstr("the TLS CA"));
}

TEST(TlsTest, VerifiesTheFixedNameOverAnIpAddress) {
  TempDir dir;
  TestCa ca;
  const IssuedPair pair = ca.Issue({kDefaultServerName});
  PublishSecret(dir.Join("tls"), {{"tls.crt", pair.cert_pem}, {"tls.key", pair.key_pem}});
  PublishSecret(dir.Join("ca"), {{"ca.crt", ca.ca_pem()}});
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(dir.Join("tls/tls.crt"), dir.Join("tls/tls.key"));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  Server server(*credentials);
  auto security = ChannelSecurity::Tls(dir.Join("ca/ca.crt"));
  ASSERT_TRUE(security.ok()) << security.status();
  std::string subject;
  const grpc::Status status = Call(**security, server.address(), &subject);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(subject, "CN=clusterprof-sidecar");
  EXPECT_EQ((*security)->Diagnose(server.address()), "");
  // A plaintext client on the TLS port is refused, and told why.
  const grpc::Status plaintext = Call(*ChannelSecurity::Insecure(), server.address());
  EXPECT_EQ(plaintext.error_code(), grpc::StatusCode::UNAVAILABLE);
  const std::string diagnosis = ChannelSecurity::Insecure()->Diagnose(server.address());
  EXPECT_THAT(diagnosis, HasSubstr("serves TLS, and this client spoke plaintext"));
  EXPECT_EQ(TlsFailureReason(plaintext.error_message() + " (" + diagnosis + ")"), "tls_peer");
}

struct Refusal {
  std::string name;
  std::string expected_diagnosis;
  std::string_view expected_reason;
};

TEST(TlsTest, EachRefusalIsDiagnosedWithItsCause) {
  TempDir dir;
  TestCa ca;
  TestCa other_ca("another-ca");
  PublishSecret(dir.Join("ca"), {{"ca.crt", ca.ca_pem()}});
  auto security = ChannelSecurity::Tls(dir.Join("ca/ca.crt"));
  ASSERT_TRUE(security.ok()) << security.status();

  const std::vector<std::pair<IssuedPair, Refusal>> cases = {
      {other_ca.Issue({kDefaultServerName}),
       {"another CA", "is not signed by a CA in", "certificate_unknown_ca"}},
      {ca.Issue({kDefaultServerName}, -7200, -3600),
       {"expired", "expired at", "certificate_expired"}},
      {ca.Issue({"other.example"}),
       {"another name", "names DNS:other.example, not clusterprof-sidecar",
        "certificate_wrong_name"}},
  };
  for (const auto& [pair, refusal] : cases) {
    SCOPED_TRACE(refusal.name);
    const std::string tls_dir = dir.Join("tls-" + std::to_string(&refusal - &cases[0].second));
    PublishSecret(tls_dir, {{"tls.crt", pair.cert_pem}, {"tls.key", pair.key_pem}});
    auto credentials = MakeServerCredentials(tls_dir + "/tls.crt", tls_dir + "/tls.key");
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    Server server(*credentials);
    const grpc::Status status = Call(**security, server.address());
    ASSERT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
    EXPECT_TRUE(IsTlsVerificationFailure(status.error_message())) << status.error_message();
    const std::string diagnosis = (*security)->Diagnose(server.address());
    EXPECT_THAT(diagnosis, HasSubstr(refusal.expected_diagnosis));
    EXPECT_THAT(diagnosis, HasSubstr(server.address()));
    EXPECT_EQ(TlsFailureReason(status.error_message() + " (" + diagnosis + ")"),
              refusal.expected_reason);
  }

  // A plaintext server.
  Server plaintext(grpc::InsecureServerCredentials());
  const grpc::Status status = Call(**security, plaintext.address());
  ASSERT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  const std::string diagnosis = (*security)->Diagnose(plaintext.address());
  EXPECT_THAT(diagnosis, ::testing::AnyOf(HasSubstr("answered a TLS handshake in plaintext"),
                                          HasSubstr("closed the connection during the TLS")));
  EXPECT_NE(TlsFailureReason(status.error_message() + " (" + diagnosis + ")"), "");
  // Nothing listening: not a TLS matter.
  const std::string address = plaintext.address();
  plaintext.server->Shutdown();
  plaintext.server->Wait();
  EXPECT_EQ((*security)->Diagnose(address, 500), "");
}

TEST(TlsTest, ServesARotatedCertificateWithoutARestart) {
  TempDir dir;
  TestCa ca;
  const IssuedPair first = ca.Issue({kDefaultServerName}, -60, 86400, "first");
  const IssuedPair second = ca.Issue({kDefaultServerName}, -60, 86400, "second");
  PublishSecret(dir.Join("tls"), {{"tls.crt", first.cert_pem}, {"tls.key", first.key_pem}});
  PublishSecret(dir.Join("ca"), {{"ca.crt", ca.ca_pem()}});
  auto credentials =
      MakeServerCredentials(dir.Join("tls/tls.crt"), dir.Join("tls/tls.key"), /*reload=*/1);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  Server server(*credentials);
  auto security = ChannelSecurity::Tls(dir.Join("ca/ca.crt"));
  ASSERT_TRUE(security.ok());
  std::string subject;
  ASSERT_TRUE(Call(**security, server.address(), &subject).ok());
  EXPECT_EQ(subject, "CN=first");

  PublishSecret(dir.Join("tls"), {{"tls.crt", second.cert_pem}, {"tls.key", second.key_pem}});
  // The server rereads its files every second: new connections get the new pair.
  for (int i = 0; i < 100 && subject != "CN=second"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(Call(**security, server.address(), &subject).ok());
  }
  EXPECT_EQ(subject, "CN=second");
}

TEST(TlsTest, ClientsRereadTheirCa) {
  TempDir dir;
  TestCa ca;
  TestCa old_ca("old-ca");
  const IssuedPair pair = ca.Issue({kDefaultServerName});
  PublishSecret(dir.Join("tls"), {{"tls.crt", pair.cert_pem}, {"tls.key", pair.key_pem}});
  PublishSecret(dir.Join("ca"), {{"ca.crt", old_ca.ca_pem()}});
  auto credentials = MakeServerCredentials(dir.Join("tls/tls.crt"), dir.Join("tls/tls.key"));
  ASSERT_TRUE(credentials.ok());
  Server server(*credentials);
  auto security = ChannelSecurity::Tls(dir.Join("ca/ca.crt"), kDefaultServerName, /*reload=*/1);
  ASSERT_TRUE(security.ok());
  EXPECT_FALSE(Call(**security, server.address()).ok());
  PublishSecret(dir.Join("ca"), {{"ca.crt", ca.ca_pem()}});
  bool ok = false;
  for (int i = 0; i < 100 && !ok; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ok = Call(**security, server.address()).ok();
  }
  EXPECT_TRUE(ok) << "new channels still refuse the server after the CA file changed";
}

TEST(TlsTest, ClassifiesFailureTexts) {
  EXPECT_EQ(TlsFailureReason("UNAVAILABLE: failed to connect to all addresses; last error: "
                             "UNKNOWN: ipv4:10.0.0.2:8466: Tls handshake failed: SSL_ERROR_SSL: "
                             "error:0A000086:SSL routines::certificate verify failed"),
            "tls_other");
  EXPECT_EQ(TlsFailureReason("UNKNOWN: Custom verification check failed with error: "
                             "UNAUTHENTICATED: Hostname Verification Check failed."),
            "certificate_wrong_name");
  EXPECT_EQ(TlsFailureReason("UNAVAILABLE: connection refused"), "");
  EXPECT_FALSE(IsTlsVerificationFailure("UNAVAILABLE: Socket closed"));
}

}  // namespace
}  // namespace clusterprof::tls
