#include "common/io/crc32c.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace clusterprof {
namespace {

TEST(Crc32cTest, KnownValues) {
  // The CRC-32C check value (RFC 3720, B.4) and GCS's own example.
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
}

TEST(Crc32cTest, ExtendingPiecesEqualsOneShot) {
  std::mt19937 random(7);
  std::string data(1 << 20, '\0');
  for (char& c : data) c = static_cast<char>(random());
  const uint32_t whole = Crc32c(data);
  for (size_t split : {size_t{0}, size_t{1}, size_t{4095}, size_t{262144}, data.size()}) {
    uint32_t crc = Crc32cExtend(0, data.data(), split);
    crc = Crc32cExtend(crc, data.data() + split, data.size() - split);
    EXPECT_EQ(crc, whole) << "split at " << split;
  }
  EXPECT_NE(Crc32c(data.substr(1)), whole);
}

TEST(Crc32cTest, Base64IsBigEndianAsGcsWritesIt) {
  EXPECT_EQ(Crc32cToBase64(0xE3069283u), "4waSgw==");
  EXPECT_EQ(Crc32cToBase64(0), "AAAAAA==");
  EXPECT_EQ(Crc32cFromBase64("4waSgw=="), 0xE3069283u);
  EXPECT_EQ(Crc32cFromBase64(Crc32cToBase64(0x01020304u)), 0x01020304u);
  EXPECT_FALSE(Crc32cFromBase64("not base64!").has_value());
  EXPECT_FALSE(Crc32cFromBase64("AAAAAAAA").has_value());  // 6 bytes
}

}  // namespace
}  // namespace clusterprof
