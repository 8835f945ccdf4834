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

}  // namespace
}  // namespace clusterprof
