#include "common/xspace/xspace_io.h"

#include "common/io/byte_sink.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/support/failing_sink.h"
#include "tests/support/temp_dir.h"
#include "tests/support/xspace_samples.h"
#include "tsl/profiler/protos/profiler_service.pb.h"

namespace clusterprof::xspace {
namespace {

using ::testing::HasSubstr;

std::string Serialize(const tensorflow::profiler::XSpace& space) {
  io::StringSink sink;
  EXPECT_TRUE(WriteXSpace(space, &sink).ok());
  return sink.Release();
}

TEST(XSpaceIoTest, WriteMatchesProtobufSerialization) {
  const auto space = testing::SyntheticXSpace(3, 10'000);
  EXPECT_EQ(Serialize(space), space.SerializeAsString());
}

TEST(XSpaceIoTest, RoundTripThroughFile) {
  testing::TempDir dir;
  const auto space = testing::SmallXSpace();
  testing::WriteFileOrDie(dir.Join("h.xplane.pb"), Serialize(space));
  auto loaded = ReadXSpaceFile(dir.Join("h.xplane.pb"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals((*loaded)->space(), space));
  EXPECT_EQ((*loaded)->serialized_bytes(), space.ByteSizeLong());
}

TEST(XSpaceIoTest, MissingFileNamesThePath) {
  auto loaded = ReadXSpaceFile("/nonexistent/dir/h.xplane.pb");
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(loaded.status().message(), HasSubstr("/nonexistent/dir/h.xplane.pb"));
}

TEST(XSpaceIoTest, DirectoryIsRejected) {
  testing::TempDir dir;
  auto loaded = ReadXSpaceFile(dir.path());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loaded.status().message(), HasSubstr("is a directory"));
}

TEST(XSpaceIoTest, EmptyFileIsRejected) {
  testing::TempDir dir;
  testing::WriteFileOrDie(dir.Join("empty.xplane.pb"), "");
  auto loaded = ReadXSpaceFile(dir.Join("empty.xplane.pb"));
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loaded.status().message(), HasSubstr("empty"));
  EXPECT_THAT(loaded.status().message(), HasSubstr("empty.xplane.pb"));
}

TEST(XSpaceIoTest, TruncatedFileIsRejected) {
  const std::string bytes = Serialize(testing::SmallXSpace());
  for (size_t cut : {bytes.size() - 1, bytes.size() / 2, size_t{3}}) {
    auto loaded = ParseXSpace(std::string_view(bytes).substr(0, cut), "cut.xplane.pb");
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument) << "cut at " << cut;
    EXPECT_THAT(loaded.status().message(), HasSubstr("cut.xplane.pb"));
  }
}

TEST(XSpaceIoTest, GarbageIsRejected) {
  for (std::string_view garbage :
       {std::string_view("{\"traceEvents\":[]}"), std::string_view("\xff\xff\xff\xff\xff"),
        std::string_view("hello world, this is text")}) {
    auto loaded = ParseXSpace(garbage, "garbage.pb");
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument) << garbage;
    EXPECT_THAT(loaded.status().message(), HasSubstr("garbage.pb"));
  }
}

TEST(XSpaceIoTest, OtherProtobufMessageIsRejected) {
  tensorflow::ProfileRequest request;
  request.set_duration_ms(2000);
  request.set_max_events(5);
  request.set_session_id("run");
  request.set_host_name("10.0.0.2:8466");
  auto loaded = ParseXSpace(request.SerializeAsString(), "request.pb");
  ASSERT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loaded.status().message(), HasSubstr("not an XSpace"));
}

TEST(XSpaceIoTest, UnknownNewFieldsAreTolerated) {
  std::string bytes = Serialize(testing::SmallXSpace());
  bytes += std::string("\xa8\x01\x07", 3);  // field 21, varint 7: a field from a newer writer
  auto loaded = ParseXSpace(bytes, "newer.xplane.pb");
  EXPECT_TRUE(loaded.ok()) << loaded.status();
}

TEST(XSpaceIoTest, WriteReportsSinkErrors) {
  testing::FailingSink sink(absl::DataLossError("gone"));
  EXPECT_EQ(WriteXSpace(testing::SyntheticXSpace(1, 100'000), &sink).code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace clusterprof::xspace
