#include "operator/kube/watch_decoder.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::kube {
namespace {

using ::testing::HasSubstr;

constexpr char kAdded[] =
    R"({"type":"ADDED","object":{"kind":"ConfigMap","metadata":{"name":"a","resourceVersion":"5"},"data":{"v":"{\"}"}}})";
constexpr char kBookmark[] =
    R"({"type":"BOOKMARK","object":{"kind":"ConfigMap","metadata":{"resourceVersion":"9"}}})";

TEST(WatchDecoderTest, DecodesNewlineSeparatedEvents) {
  WatchDecoder decoder;
  decoder.Feed(std::string(kAdded) + "\n" + kBookmark + "\n");
  absl::StatusOr<std::optional<WatchEvent>> first = decoder.Next();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->type, WatchEvent::Type::kAdded);
  // A brace inside a string does not end the frame.
  EXPECT_EQ((*first)->object.at("data").at("v").as_string(), "{\"}");
  absl::StatusOr<std::optional<WatchEvent>> second = decoder.Next();
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(second->has_value());
  EXPECT_EQ((*second)->type, WatchEvent::Type::kBookmark);
  absl::StatusOr<std::optional<WatchEvent>> none = decoder.Next();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_EQ(decoder.frames(), 2);
  EXPECT_EQ(decoder.buffered(), 0u);
}

TEST(WatchDecoderTest, EventsSplitAcrossReadsAtEveryByte) {
  const std::string stream = std::string(kAdded) + "\n" + kBookmark + kAdded;
  WatchDecoder decoder;
  int events = 0;
  for (char c : stream) {
    decoder.Feed(std::string_view(&c, 1));
    while (true) {
      absl::StatusOr<std::optional<WatchEvent>> event = decoder.Next();
      ASSERT_TRUE(event.ok()) << event.status();
      if (!event->has_value()) break;
      ++events;
    }
  }
  EXPECT_EQ(events, 3);  // no newline needed between frames
}

TEST(WatchDecoderTest, ABadFrameIsAnErrorAndTheNextOneStillDecodes) {
  WatchDecoder decoder;
  decoder.Feed(R"({"type":"SURPRISE","object":{}})"
               "\n"
               R"({"type":"ADDED"})"
               "\n" +
               std::string(kAdded));
  absl::StatusOr<std::optional<WatchEvent>> unknown = decoder.Next();
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("unknown type \"SURPRISE\""));
  EXPECT_THAT(unknown.status().message(), HasSubstr("event 1"));
  absl::StatusOr<std::optional<WatchEvent>> no_object = decoder.Next();
  ASSERT_FALSE(no_object.ok());
  EXPECT_THAT(no_object.status().message(), HasSubstr("no \"object\""));
  absl::StatusOr<std::optional<WatchEvent>> good = decoder.Next();
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(good->has_value());
}

TEST(WatchDecoderTest, GarbageBetweenFramesFailsTheStream) {
  WatchDecoder decoder;
  decoder.Feed("<html>502 Bad Gateway</html>");
  absl::StatusOr<std::optional<WatchEvent>> event = decoder.Next();
  ASSERT_FALSE(event.ok());
  EXPECT_THAT(event.status().message(), HasSubstr("expected '{'"));
  EXPECT_THAT(event.status().message(), HasSubstr("<html>"));
  decoder.Feed(kAdded);
  EXPECT_FALSE(decoder.Next().ok()) << "a failed stream stays failed";
}

TEST(WatchDecoderTest, AnOversizedFrameFailsInsteadOfGrowingForever) {
  WatchDecoder decoder(/*max_frame_bytes=*/64);
  decoder.Feed(R"({"type":"ADDED","object":{"data":")" + std::string(100, 'x'));
  absl::StatusOr<std::optional<WatchEvent>> event = decoder.Next();
  ASSERT_FALSE(event.ok());
  EXPECT_THAT(event.status().message(), HasSubstr("larger than 64 bytes"));
}

TEST(WatchDecoderTest, ParseWatchEventRejectsNonObjects) {
  EXPECT_THAT(ParseWatchEvent("[1,2]").status().message(), HasSubstr("not a JSON object"));
  EXPECT_THAT(ParseWatchEvent("{").status().message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseWatchEvent(R"({"type":"ADDED","object":3})").status().message(),
              HasSubstr("no \"object\" object"));
  absl::StatusOr<WatchEvent> error =
      ParseWatchEvent(R"({"type":"ERROR","object":{"kind":"Status","code":410}})");
  ASSERT_TRUE(error.ok());
  EXPECT_EQ(error->type, WatchEvent::Type::kError);
}

}  // namespace
}  // namespace clusterprof::kube
