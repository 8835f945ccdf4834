// common/base/strings.h: the port and host:port checks the operator and the webhook share.
#include "common/base/strings.h"

#include "gtest/gtest.h"

namespace clusterprof {
namespace {

TEST(ParsePortTest, TakesDecimalPortsOnly) {
  EXPECT_EQ(ParsePort("1"), 1);
  EXPECT_EQ(ParsePort("8466"), 8466);
  EXPECT_EQ(ParsePort("65535"), 65535);
  EXPECT_EQ(ParsePort("00080"), 80);
  for (const char* bad : {"", "0", "65536", "70000", "123456", "+80", "-1", "80x", " 80", "8 0"}) {
    EXPECT_EQ(ParsePort(bad), std::nullopt) << bad;
  }
}

TEST(IsHostPortTest, NeedsAHostAndAPort) {
  EXPECT_TRUE(IsHostPort("localhost:9012"));
  EXPECT_TRUE(IsHostPort("10.0.0.1:8466"));
  EXPECT_TRUE(IsHostPort("[::1]:8466"));
  for (const char* bad : {"localhost", ":9012", "localhost:", "localhost:0", "host:99999", ""}) {
    EXPECT_FALSE(IsHostPort(bad)) << bad;
  }
}

TEST(AddressHostTest, StripsThePortAndTheBrackets) {
  EXPECT_EQ(AddressHost("10.0.0.1:8466"), "10.0.0.1");
  EXPECT_EQ(AddressHost("[::1]:8466"), "::1");
  EXPECT_EQ(AddressHost("localhost:9012"), "localhost");
  EXPECT_EQ(AddressHost("trainer-0"), "trainer-0");
}

TEST(IsLoopbackIpTest, OnlyLoopbackLiterals) {
  for (const char* loopback : {"127.0.0.1", "127.10.0.3", "::1", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackIp(loopback)) << loopback;
  }
  for (const char* other : {"10.0.0.1", "128.0.0.1", "127.0.0.1.example", "::ffff:10.0.0.1",
                            "fe80::1", "localhost", ""}) {
    EXPECT_FALSE(IsLoopbackIp(other)) << other;
  }
}

}  // namespace
}  // namespace clusterprof
