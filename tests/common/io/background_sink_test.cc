#include "common/io/background_sink.h"

#include <atomic>
#include <string>
#include <thread>

#include "common/base/mutex.h"
#include "gtest/gtest.h"

namespace clusterprof::io {
namespace {

TEST(BackgroundSinkTest, DeliversEverythingInOrder) {
  StringSink out;
  std::string expected;
  {
    BackgroundSink sink(&out, /*buffer_size=*/4096, /*max_buffers=*/2);
    for (int i = 0; i < 20000; ++i) {
      const std::string piece = std::to_string(i) + ",";
      expected += piece;
      ASSERT_TRUE(sink.Append(piece).ok());
    }
    ASSERT_TRUE(sink.Append(std::string(100000, 'z')).ok());  // larger than a buffer
    expected += std::string(100000, 'z');
    ASSERT_TRUE(sink.Finish().ok());
    EXPECT_EQ(out.data(), expected) << "all bytes are downstream once Finish returns";
  }
}

TEST(BackgroundSinkTest, AppendAfterFinishFails) {
  StringSink out;
  BackgroundSink sink(&out);
  ASSERT_TRUE(sink.Finish().ok());
  EXPECT_EQ(sink.Append("x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(sink.Finish().ok());
}

TEST(BackgroundSinkTest, DestructorFinishes) {
  StringSink out;
  {
    BackgroundSink sink(&out);
    ASSERT_TRUE(sink.Append("tail").ok());
  }
  EXPECT_EQ(out.data(), "tail");
}

// Fails on the second buffer it receives.
class FailOnSecond final : public ByteSink {
 public:
  absl::Status Append(std::string_view) override {
    if (++calls_ >= 2) return absl::ResourceExhaustedError("disk full");
    return absl::OkStatus();
  }
  std::atomic<int> calls_{0};
};

TEST(BackgroundSinkTest, DownstreamErrorReachesTheProducer) {
  FailOnSecond out;
  BackgroundSink sink(&out, 4096, 2);
  absl::Status status;
  for (int i = 0; i < 10000 && status.ok(); ++i) status = sink.Append(std::string(1000, 'x'));
  const absl::Status finished = sink.Finish();
  EXPECT_EQ(finished.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(out.calls_, 2) << "nothing is sent after the first error";
}

// Blocks until released, so the test can see the producer wait for room.
class Gate final : public ByteSink {
 public:
  absl::Status Append(std::string_view data) override {
    release_.WaitForNotification();
    bytes_ += data.size();
    return absl::OkStatus();
  }
  Notification release_;
  std::atomic<size_t> bytes_{0};
};

TEST(BackgroundSinkTest, MemoryIsBoundedByWaitingForRoom) {
  Gate out;
  BackgroundSink sink(&out, 4096, 2);
  std::atomic<size_t> appended{0};
  std::thread producer([&] {
    for (int i = 0; i < 64; ++i) {
      ASSERT_TRUE(sink.Append(std::string(4096, 'x')).ok());
      appended += 4096;
    }
  });
  // With downstream blocked, the producer can fill at most: the buffer in flight, two queued,
  // and the one it is filling. It stays stuck until the gate opens.
  while (appended < 3 * 4096) std::this_thread::yield();
  EXPECT_LE(appended.load(), 4u * 4096);
  out.release_.Notify();
  producer.join();
  ASSERT_TRUE(sink.Finish().ok());
  EXPECT_EQ(out.bytes_, 64u * 4096);
}

}  // namespace
}  // namespace clusterprof::io

namespace clusterprof::io {
namespace {

TEST(BackgroundSinkTest, ZeroCopyRegionsMixWithAppends) {
  StringSink out;
  BackgroundSink sink(&out, 4096, 2);
  std::string expected;
  for (int i = 0; i < 50; ++i) {
    auto region = sink.NextWritable();
    ASSERT_TRUE(region.ok());
    ASSERT_FALSE(region->empty());
    const size_t used = std::min<size_t>(region->size(), 1000);
    for (size_t j = 0; j < used; ++j) (*region)[j] = static_cast<char>('a' + (i + j) % 26);
    expected.append(region->data(), used);
    sink.BackUp(region->size() - used);
    const std::string piece = "|" + std::to_string(i) + "|";
    ASSERT_TRUE(sink.Append(piece).ok());
    expected += piece;
  }
  ASSERT_TRUE(sink.Finish().ok());
  EXPECT_EQ(out.data(), expected);
}

TEST(BackgroundSinkTest, PlainSinksHaveNoZeroCopyPath) {
  StringSink out;
  EXPECT_EQ(out.NextWritable().status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace clusterprof::io
