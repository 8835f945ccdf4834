#include "common/io/gzip_sink.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/failing_sink.h"

namespace clusterprof::io {
namespace {

// Levels 1-3 go through ISA-L, the others through zlib; every one must produce standard gzip.
class GzipSinkLevelTest : public ::testing::TestWithParam<int> {};

TEST_P(GzipSinkLevelTest, RoundTrip) {
  StringSink compressed;
  GzipSink gzip(&compressed, GetParam());
  std::string input;
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const std::string piece = "event " + std::to_string(rng() % 1000) + "\n";
    input += piece;
    ASSERT_TRUE(gzip.Append(piece).ok());
  }
  ASSERT_TRUE(gzip.Finish().ok());
  EXPECT_EQ(gzip.bytes_in(), input.size());
  EXPECT_EQ(gzip.bytes_out(), compressed.data().size());
  // gzip magic.
  ASSERT_GE(compressed.data().size(), 2u);
  EXPECT_EQ(static_cast<unsigned char>(compressed.data()[0]), 0x1f);
  EXPECT_EQ(static_cast<unsigned char>(compressed.data()[1]), 0x8b);
  std::string output;
  ASSERT_TRUE(GunzipString(compressed.data(), &output).ok());
  EXPECT_EQ(output, input);
}

INSTANTIATE_TEST_SUITE_P(Levels, GzipSinkLevelTest, ::testing::Values(0, 1, 2, 3, 6, 9));

TEST_P(GzipSinkLevelTest, EmptyStreamIsValidGzip) {
  StringSink compressed;
  GzipSink gzip(&compressed, GetParam());
  ASSERT_TRUE(gzip.Finish().ok());
  std::string output;
  ASSERT_TRUE(GunzipString(compressed.data(), &output).ok());
  EXPECT_EQ(output, "");
}

TEST(GzipSinkTest, BadLevelIsRejected) {
  StringSink compressed;
  GzipSink gzip(&compressed, 12);
  EXPECT_EQ(gzip.Append("x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(GzipSinkTest, AppendAfterFinishFails) {
  StringSink compressed;
  GzipSink gzip(&compressed);
  ASSERT_TRUE(gzip.Finish().ok());
  EXPECT_EQ(gzip.Append("x").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GzipSinkTest, DownstreamErrorsStick) {
  testing::FailingSink failing(absl::UnavailableError("down"));
  GzipSink gzip(&failing, 1);
  // Incompressible input, so compressed output reaches the failing sink before Finish.
  std::mt19937 rng(1);
  std::string noise(64 << 10, '\0');
  for (char& c : noise) c = static_cast<char>(rng());
  absl::Status status;
  for (int i = 0; i < 100 && status.ok(); ++i) status = gzip.Append(noise);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(gzip.Finish().code(), absl::StatusCode::kUnavailable);
}

TEST(GunzipStringTest, TruncatedAndCorrupt) {
  StringSink compressed;
  GzipSink gzip(&compressed);
  ASSERT_TRUE(gzip.Append(std::string(100000, 'a') + "tail").ok());
  ASSERT_TRUE(gzip.Finish().ok());
  std::string out;
  EXPECT_EQ(GunzipString(compressed.data().substr(0, compressed.data().size() / 2), &out).code(),
            absl::StatusCode::kDataLoss);
  std::string corrupt = compressed.data();
  corrupt[12] ^= 0x55;
  out.clear();
  EXPECT_FALSE(GunzipString(corrupt, &out).ok() && out == std::string(100000, 'a') + "tail");
}

}  // namespace
}  // namespace clusterprof::io
