#include "common/xspace/trace_json.h"

#include <algorithm>
#include <limits>
#include <string>

#include "common/io/byte_sink.h"
#include "common/io/gzip_sink.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "common/xspace/xspace_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/failing_sink.h"
#include "tests/support/temp_dir.h"
#include "tests/support/xspace_samples.h"

namespace clusterprof::xspace {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ToJson(const XSpace& space, const TraceJsonOptions& options = {}) {
  io::StringSink sink;
  auto stats = WriteTraceJson(space, &sink, options);
  EXPECT_TRUE(stats.ok()) << stats.status();
  return sink.Release();
}

TEST(TraceJsonTest, SmallXSpaceMatchesGolden) {
  const std::string golden = testing::ReadFileOrDie(std::string(CLUSTERPROF_SOURCE_DIR) +
                                                    "/tests/data/golden/small_xspace.trace.json");
  const std::string actual = ToJson(testing::SmallXSpace());
  if (actual != golden) {
    testing::WriteFileOrDie(std::string(CLUSTERPROF_BINARY_DIR) + "/small_xspace.trace.json",
                            actual);
  }
  EXPECT_EQ(actual, golden) << "actual output written to " CLUSTERPROF_BINARY_DIR
                               "/small_xspace.trace.json";
}

TEST(TraceJsonTest, Stats) {
  io::CountingSink sink;
  auto stats = WriteTraceJson(testing::SmallXSpace(), &sink);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->complete_events, 6);
  EXPECT_EQ(stats->counter_events, 2);
  EXPECT_EQ(stats->flow_events, 2);
  EXPECT_EQ(stats->bytes, sink.bytes());
}

TEST(TraceJsonTest, PerfettoShapeHasNoMetadataKey) {
  const std::string json = ToJson(testing::SmallXSpace(), {.include_metadata = false});
  EXPECT_THAT(json, Not(HasSubstr("\"metadata\"")));
  EXPECT_THAT(json, HasSubstr("{\"displayTimeUnit\":\"ns\",\"traceEvents\":["));
}

TEST(TraceJsonTest, EmptySpaceIsValidJson) {
  EXPECT_EQ(ToJson(XSpace(), {.newline_per_event = false}),
            "{\"displayTimeUnit\":\"ns\",\"metadata\":{\"highres-ticks\":true},"
            "\"traceEvents\":[{}]}");
}

TEST(TraceJsonTest, TimestampsAreExactMicroseconds) {
  XSpace space;
  XPlaneBuilder plane(space.add_planes());
  plane.SetName(kHostThreadsPlaneName);
  XLineBuilder line = plane.GetOrCreateLine(1);
  line.SetTimestampNs(1'767'225'600'123'456'789);
  XEventBuilder e = line.AddEvent(*plane.GetOrCreateEventMetadata("e"));
  e.SetOffsetPs(1);  // one picosecond after the line start
  e.SetDurationPs(1'000'001);
  const std::string json = ToJson(space);
  EXPECT_THAT(json, HasSubstr("\"ts\":1767225600123456.789001,\"dur\":1.000001,"));
}

TEST(TraceJsonTest, NegativeOffsetBorrowsFromTheLineStart) {
  XSpace space;
  XPlaneBuilder plane(space.add_planes());
  plane.SetName(kHostThreadsPlaneName);
  XLineBuilder line = plane.GetOrCreateLine(1);
  line.SetTimestampNs(2'000);
  XEventBuilder e = line.AddEvent(*plane.GetOrCreateEventMetadata("e"));
  e.SetOffsetPs(-500);
  EXPECT_THAT(ToJson(space), HasSubstr("\"ts\":1.9995,\"dur\":0,"));
}

TEST(TraceJsonTest, EscapesNamesAndReplacesInvalidUtf8) {
  XSpace space;
  XPlaneBuilder plane(space.add_planes());
  plane.SetName(kHostThreadsPlaneName);
  XLineBuilder line = plane.GetOrCreateLine(1);
  line.SetName("tab\there");
  line.AddEvent(*plane.GetOrCreateEventMetadata("q\"b\\s\n\x01 \xff ok \xc3\xa9"));
  const std::string json = ToJson(space);
  EXPECT_THAT(json, HasSubstr("\"name\":\"q\\\"b\\\\s\\n\\u0001 \\ufffd ok \xc3\xa9\""));
  EXPECT_THAT(json, HasSubstr("\"args\":{\"name\":\"tab\\there\"}"));
}

TEST(TraceJsonTest, DisplayNameWinsAndKeepsLongName) {
  XSpace space;
  XPlaneBuilder plane(space.add_planes());
  plane.SetName(kHostThreadsPlaneName);
  XEventMetadata* md = plane.GetOrCreateEventMetadata("very/long/op/name");
  md->set_display_name("name");
  plane.GetOrCreateLine(1).AddEvent(*md);
  EXPECT_THAT(ToJson(space),
              HasSubstr("\"name\":\"name\",\"args\":{\"long_name\":\"very/long/op/name\"}"));
}

TEST(TraceJsonTest, ExtraHostPlanesGetTheirOwnPids) {
  XSpace space;
  for (int i = 0; i < 2; ++i) {
    XPlaneBuilder plane(space.add_planes());
    plane.SetName(kHostThreadsPlaneName);
    plane.GetOrCreateLine(1).AddEvent(*plane.GetOrCreateEventMetadata("e"));
  }
  const std::string json = ToJson(space);
  EXPECT_THAT(json, HasSubstr("{\"ph\":\"X\",\"pid\":701,\"tid\":1,"));
  EXPECT_THAT(json, HasSubstr("{\"ph\":\"X\",\"pid\":702,\"tid\":1,"));
}

TEST(TraceJsonTest, AggregatedEventsAreSkipped) {
  XSpace space;
  XPlaneBuilder plane(space.add_planes());
  plane.SetName(kHostThreadsPlaneName);
  plane.GetOrCreateLine(1).AddEvent(*plane.GetOrCreateEventMetadata("agg")).SetNumOccurrences(3);
  io::StringSink sink;
  auto stats = WriteTraceJson(space, &sink);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->complete_events, 0);
  EXPECT_EQ(stats->skipped_events, 1);
}

TEST(TraceJsonTest, SparseMetadataIdsResolve) {
  XSpace space;
  XPlane* plane = space.add_planes();
  plane->set_name(std::string(kHostThreadsPlaneName));
  auto& md = (*plane->mutable_event_metadata())[1'000'000'007];
  md.set_id(1'000'000'007);
  md.set_name("sparse");
  XLine* line = plane->add_lines();
  line->add_events()->set_metadata_id(1'000'000'007);
  line->add_events()->set_metadata_id(5);  // no such metadata: empty name, no crash
  const std::string json = ToJson(space);
  EXPECT_THAT(json, HasSubstr("\"name\":\"sparse\""));
  EXPECT_THAT(json, HasSubstr("\"name\":\"\""));
}

TEST(TraceJsonTest, SinkErrorIsReturned) {
  testing::FailingSink sink(absl::ResourceExhaustedError("disk full"));
  auto stats = WriteTraceJson(testing::SyntheticXSpace(2, 50'000), &sink);
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(TraceJsonTest, LargeOutputStreamsThroughGzip) {
  const XSpace space = testing::SyntheticXSpace(4, 100'000);
  io::StringSink compressed;
  io::GzipSink gzip(&compressed);
  auto stats = WriteTraceJson(space, &gzip);
  ASSERT_TRUE(stats.ok());
  ASSERT_TRUE(gzip.Finish().ok());
  EXPECT_EQ(stats->complete_events, 400'000);
  std::string json;
  ASSERT_TRUE(io::GunzipString(compressed.data(), &json).ok());
  EXPECT_EQ(json.size(), stats->bytes);
  EXPECT_EQ(json, ToJson(space));
  EXPECT_LT(compressed.data().size(), json.size() / 5);
}

}  // namespace
}  // namespace clusterprof::xspace

namespace clusterprof::xspace {
namespace {

// Found by the xspace_reader fuzzer: extreme timestamps must not overflow.
TEST(TraceJsonTest, ExtremeTimestampsAreExact) {
  XSpace space;
  XPlaneBuilder plane(space.add_planes());
  plane.SetName(kHostThreadsPlaneName);
  XLineBuilder line = plane.GetOrCreateLine(1);
  line.SetTimestampNs(std::numeric_limits<int64_t>::max());
  line.AddEvent(*plane.GetOrCreateEventMetadata("max")).SetOffsetPs(1'000'000'000'000);
  XLineBuilder low = plane.GetOrCreateLine(2);
  low.SetTimestampNs(std::numeric_limits<int64_t>::min());
  low.AddEvent(*plane.GetOrCreateEventMetadata("min")).SetOffsetPs(-1);
  const std::string json = ToJson(space);
  // INT64_MAX ns + 1e12 ps = 9223372037854775807 ns = 9223372037854775.807 us.
  EXPECT_THAT(json, HasSubstr("\"ts\":9223372037854775.807,"));
  // INT64_MIN ns - 1 ps = -9223372036854775808.001 ns.
  EXPECT_THAT(json, HasSubstr("\"ts\":-9223372036854775.808001,"));
}

TEST(TraceJsonTest, DevicePlaneIdsOutOfPidRangeGetOtherPids) {
  XSpace space;
  XPlaneBuilder plane(space.add_planes());
  plane.SetName("/device:GPU:x");
  plane.SetId(std::numeric_limits<int32_t>::max());
  plane.GetOrCreateLine(1).AddEvent(*plane.GetOrCreateEventMetadata("k"));
  EXPECT_THAT(ToJson(space), HasSubstr("{\"ph\":\"X\",\"pid\":801,"));
}

}  // namespace
}  // namespace clusterprof::xspace

namespace clusterprof::xspace {
namespace {

// Error messages without the byte offset, which differs between the two readers for corrupt data.
std::string WithoutOffset(absl::string_view message) {
  std::string text(message.data(), message.size());
  return text.substr(0, text.find(" (parsing stopped near byte"));
}

std::string StreamJson(std::string_view serialized, absl::Status* status = nullptr) {
  io::StringSink sink;
  auto stats = WriteTraceJsonFromSerialized(serialized, "input.xplane.pb", &sink);
  if (status != nullptr) *status = stats.status();
  return sink.Release();
}

TEST(TraceJsonStreamTest, MatchesInMemoryConversion) {
  for (const XSpace& space :
       {testing::SmallXSpace(), testing::SyntheticXSpace(3, 1000), XSpace()}) {
    absl::Status status;
    const std::string streamed = StreamJson(space.SerializeAsString(), &status);
    if (space.ByteSizeLong() == 0) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);  // an empty file
      continue;
    }
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(streamed, ToJson(space));
  }
}

TEST(TraceJsonStreamTest, MatchesOnEveryCorpusFile) {
  const std::string dir = std::string(CLUSTERPROF_SOURCE_DIR) + "/tests/data/fuzz/xspace_reader";
  int compared = 0;
  for (const std::string& name : testing::ListFilesRecursively(dir)) {
    const std::string bytes = testing::ReadFileOrDie(dir + "/" + name);
    auto loaded = ParseXSpace(bytes, "input.xplane.pb");
    absl::Status status;
    const std::string streamed = StreamJson(bytes, &status);
    if (!loaded.ok()) {
      EXPECT_FALSE(status.ok()) << name;
      EXPECT_EQ(WithoutOffset(status.message()), WithoutOffset(loaded.status().message())) << name;
      continue;
    }
    ASSERT_TRUE(status.ok()) << name << ": " << status;
    EXPECT_EQ(streamed, ToJson((*loaded)->space())) << name;
    ++compared;
  }
  EXPECT_GE(compared, 3);
}

TEST(TraceJsonStreamTest, ReleaseReportsProgress) {
  const std::string bytes = testing::SyntheticXSpace(4, 1000).SerializeAsString();
  std::vector<size_t> offsets;
  io::CountingSink sink;
  ASSERT_TRUE(WriteTraceJsonFromSerialized(bytes, "x", &sink, {}, [&](size_t offset) {
                offsets.push_back(offset);
              }).ok());
  ASSERT_EQ(offsets.size(), 4u);  // one per line
  EXPECT_TRUE(std::is_sorted(offsets.begin(), offsets.end()));
  EXPECT_LE(offsets.back(), bytes.size());
}

TEST(TraceJsonStreamTest, ErrorsMatchTheParser) {
  const std::string good = testing::SmallXSpace().SerializeAsString();
  for (const std::string& bad :
       {good.substr(0, good.size() - 3), std::string("\x08\xd0\x0f\x32\x03run", 8),
        std::string("\xff\xff\xff")}) {
    auto parsed = ParseXSpace(bad, "input.xplane.pb");
    absl::Status status;
    StreamJson(bad, &status);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(WithoutOffset(status.message()), WithoutOffset(parsed.status().message()));
  }
}

}  // namespace
}  // namespace clusterprof::xspace

namespace clusterprof::xspace {
namespace {

// A GPU launch and its kernel, tied by upstream's flow stat; an NVML counter on upstream's
// counter line.
TEST(TraceJsonGpuTest, LaunchFlowsAndUpstreamCounters) {
  XSpace space;
  constexpr uint64_t kFlowId = 77;
  {
    XPlaneBuilder host(FindOrAddMutablePlaneWithName(&space, kHostThreadsPlaneName));
    XLineBuilder thread = host.GetOrCreateLine(42);
    XEventBuilder launch = thread.AddEvent(*host.GetOrCreateEventMetadata("cudaLaunchKernel"));
    launch.SetTimestampNs(1000);
    launch.SetDurationNs(10);
    launch.AddStatValue(*host.GetOrCreateStatMetadata(kFlow),
                        uint64_t{2} | (kFlowId << 2) | (kFlowCategoryGpuLaunch << 58));
  }
  {
    XPlaneBuilder gpu(FindOrAddMutablePlaneWithName(&space, "/device:GPU:0"));
    XLineBuilder stream = gpu.GetOrCreateLine(7);
    XEventBuilder kernel = stream.AddEvent(*gpu.GetOrCreateEventMetadata("saxpy"));
    kernel.SetTimestampNs(1020);
    kernel.SetDurationNs(100);
    kernel.AddStatValue(*gpu.GetOrCreateStatMetadata(kFlow),
                        uint64_t{1} | (kFlowId << 2) | (kFlowCategoryGpuLaunch << 58));
    XLineBuilder counters = gpu.GetOrCreateLine(INT64_MAX);
    counters.SetName(kUpstreamCounterLineName);
    XEventBuilder sample = counters.AddEvent(*gpu.GetOrCreateEventMetadata("power_watts"));
    sample.SetTimestampNs(1000);
    sample.AddStatValue(*gpu.GetOrCreateStatMetadata("power_watts"), 312.5);
    sample.AddStatValue(*gpu.GetOrCreateStatMetadata(kCounterValue), 312.5);
  }
  io::StringSink sink;
  auto stats = WriteTraceJson(space, &sink, {});
  ASSERT_TRUE(stats.ok()) << stats.status();
  const std::string json = sink.Release();
  EXPECT_THAT(json, HasSubstr("\"name\":\"cudaLaunchKernel\",\"bind_id\":77,\"cat\":\"gpu_launch\","
                              "\"flow_out\":true"));
  EXPECT_THAT(json, HasSubstr("\"name\":\"saxpy\",\"bind_id\":77,\"cat\":\"gpu_launch\","
                              "\"flow_in\":true"));
  EXPECT_THAT(json, HasSubstr("\"ph\":\"C\""));
  EXPECT_THAT(json, HasSubstr("\"name\":\"power_watts\",\"args\":{\"value\":312.5}"));
  EXPECT_EQ(stats->flow_events, 2);
  EXPECT_EQ(stats->counter_events, 1);
}

}  // namespace
}  // namespace clusterprof::xspace
