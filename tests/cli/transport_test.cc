// How the CLI chooses plaintext or TLS for its targets.
#include "cli/transport.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_pki.h"

namespace clusterprof::cli {
namespace {

using ::testing::HasSubstr;

TEST(CliTransportTest, KnowsLoopbackAddresses) {
  EXPECT_TRUE(IsLoopbackAddress("localhost:8466"));
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:8466"));
  EXPECT_TRUE(IsLoopbackAddress("127.3.2.1:1"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:8466"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.2:8466"));
  EXPECT_FALSE(IsLoopbackAddress("128.0.0.1:8466"));
  EXPECT_FALSE(IsLoopbackAddress("[fd00::2]:8466"));
  EXPECT_FALSE(IsLoopbackAddress("localhost.example.com:8466"));
  EXPECT_FALSE(IsLoopbackAddress("trainer-0.trainer:8466"));
}

TEST(CliTransportTest, PlaintextOnlyToLoopbackUnlessAsked) {
  TransportFlags flags;
  auto local = ChooseTransport(flags, {"127.0.0.1:8466", "localhost:9000"});
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_FALSE((*local)->tls());

  auto remote = ChooseTransport(flags, {"127.0.0.1:8466", "10.0.0.2:8466"});
  ASSERT_FALSE(remote.ok());
  EXPECT_THAT(remote.status().message(), HasSubstr("10.0.0.2:8466 is not on this machine"));
  EXPECT_THAT(remote.status().message(), HasSubstr("--tls-ca"));
  EXPECT_THAT(remote.status().message(), HasSubstr("--insecure"));

  flags.insecure = true;
  auto insecure = ChooseTransport(flags, {"10.0.0.2:8466"});
  ASSERT_TRUE(insecure.ok());
  EXPECT_FALSE((*insecure)->tls());
}

TEST(CliTransportTest, TlsWithTheCaGiven) {
  testing::TempDir dir;
  testing::TestCa ca;
  testing::PublishSecret(dir.path(), {{"ca.crt", ca.ca_pem()}});
  TransportFlags flags;
  flags.tls_ca = dir.Join("ca.crt");
  flags.tls_server_name = "sidecar.example";
  auto security = ChooseTransport(flags, {"10.0.0.2:8466", "127.0.0.1:8466"});
  ASSERT_TRUE(security.ok()) << security.status();
  EXPECT_TRUE((*security)->tls());
  EXPECT_EQ((*security)->server_name(), "sidecar.example");

  flags.insecure = true;
  EXPECT_THAT(ChooseTransport(flags, {"10.0.0.2:8466"}).status().message(),
              HasSubstr("contradict"));
  flags.insecure = false;
  flags.tls_ca = dir.Join("missing.crt");
  EXPECT_THAT(ChooseTransport(flags, {"10.0.0.2:8466"}).status().message(),
              HasSubstr("--tls-ca: "));
}

}  // namespace
}  // namespace clusterprof::cli
