// The Perfetto protobuf writer, checked by decoding its output with Perfetto's own schema
// (third_party/perfetto/perfetto_trace.proto) and rebuilding tracks, slices, flows and counters
// the way Perfetto's readers do (tests/support/perfetto_trace_decoder.h).
#include "common/xspace/trace_perfetto.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/io/byte_sink.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "common/xspace/trace_json.h"
#include "common/xspace/xspace_io.h"
#include "common/xspace/xspace_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/failing_sink.h"
#include "tests/support/perfetto_trace_decoder.h"
#include "tests/support/temp_dir.h"
#include "tests/support/xspace_samples.h"

namespace clusterprof::xspace {
namespace {

using testing::DecodePerfettoTrace;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using testing::PerfettoSlice;
using testing::PerfettoTrace;
using testing::PerfettoTrack;

constexpr int64_t kBaseNs = 1'767'225'600'000'000'000;  // as in xspace_samples.cc

std::string ToPerfetto(const XSpace& space, const PerfettoTraceOptions& options = {},
                       PerfettoTraceStats* stats_out = nullptr) {
  io::StringSink sink;
  auto stats = WritePerfettoTraceFromSerialized(space.SerializeAsString(), "test", &sink, options);
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (stats.ok() && stats_out != nullptr) *stats_out = *stats;
  return sink.Release();
}

PerfettoTrace Decode(const std::string& bytes) {
  PerfettoTrace trace = DecodePerfettoTrace(bytes);
  EXPECT_THAT(trace.problems, IsEmpty());
  return trace;
}

const PerfettoTrack& OnlyTrack(const PerfettoTrace& trace, std::string_view name) {
  auto tracks = trace.TracksNamed(name);
  EXPECT_EQ(tracks.size(), 1u) << name;
  static const PerfettoTrack kNone;
  return tracks.empty() ? kNone : *tracks.front();
}

const PerfettoSlice& OnlySlice(const PerfettoTrace& trace, std::string_view name) {
  auto slices = trace.SlicesNamed(name);
  EXPECT_EQ(slices.size(), 1u) << name;
  static const PerfettoSlice kNone;
  return slices.empty() ? kNone : *slices.front();
}

TEST(TracePerfettoTest, SmallXSpaceTracksNamesTimesFlowsAndCounters) {
  PerfettoTraceStats stats;
  const PerfettoTrace trace =
      Decode(ToPerfetto(testing::SmallXSpace(), {.process_name_prefix = "worker-0 "}, &stats));
  EXPECT_EQ(stats.complete_events, 6);
  EXPECT_EQ(stats.counter_events, 2);
  EXPECT_EQ(stats.flow_events, 2);
  EXPECT_EQ(stats.skipped_events, 0);
  EXPECT_EQ(trace.primary_trace_clock, 1u) << "CLOCK_REALTIME: the XSpace's epoch ns";

  // Processes: the trace JSON's pids; Task Environment left out.
  const PerfettoTrack& host = OnlyTrack(trace, "worker-0 /host:CPU");
  EXPECT_TRUE(host.is_process);
  EXPECT_EQ(host.pid, kHostThreadsPid);
  const PerfettoTrack& gpu = OnlyTrack(trace, "worker-0 /device:GPU:0");
  EXPECT_EQ(gpu.pid, kFirstDevicePid + 1);
  EXPECT_THAT(trace.TracksNamed("worker-0 Task Environment"), IsEmpty());

  // Host lines are threads; device lines are named tracks of their process.
  const PerfettoTrack& python = OnlyTrack(trace, "python3");
  EXPECT_TRUE(python.is_thread);
  EXPECT_EQ(python.pid, kHostThreadsPid);
  EXPECT_EQ(python.tid, 100);
  EXPECT_EQ(OnlyTrack(trace, "loader \"io\"").tid, 101);
  const PerfettoTrack& stream = OnlyTrack(trace, "Stream #7(Kernel,MemcpyH2D)");
  EXPECT_FALSE(stream.is_thread);
  EXPECT_EQ(stream.parent_uuid, gpu.uuid);

  // Slices: names, exact times, nesting, annotations (internal stats and bytes left out).
  const PerfettoSlice& step = OnlySlice(trace, "train_step");
  EXPECT_EQ(step.track_uuid, python.uuid);
  EXPECT_EQ(step.start_ns, kBaseNs + 1000);
  EXPECT_EQ(step.end_ns, kBaseNs + 6000);
  EXPECT_EQ(step.depth, 0);
  EXPECT_THAT(step.args, ElementsAre(Pair("step_num", "7")));
  const PerfettoSlice& matmul = OnlySlice(trace, "matmul");
  EXPECT_EQ(matmul.depth, 1);
  EXPECT_THAT(matmul.args, ElementsAre(Pair("flops", "123"), Pair("shape", "[8,16]")));
  // 1500.5 ns after a line starting 1000 ns in, for 250.25 ns: whole nanoseconds, rounded down.
  const PerfettoSlice& fetch = OnlySlice(trace, "fetch");
  EXPECT_EQ(fetch.start_ns, kBaseNs + 2500);
  EXPECT_EQ(fetch.end_ns, kBaseNs + 2750);
  EXPECT_THAT(fetch.args, ElementsAre(Pair("loss", "0.25")));

  // The launch's flow ends at its kernel.
  const PerfettoSlice& launch = OnlySlice(trace, "cudaLaunchKernel");
  const PerfettoSlice& kernel = OnlySlice(trace, "gemm_kernel");
  EXPECT_THAT(launch.flow_ids, ElementsAre(42u));
  EXPECT_THAT(launch.terminating_flow_ids, IsEmpty());
  EXPECT_THAT(kernel.terminating_flow_ids, ElementsAre(42u));
  EXPECT_EQ(kernel.track_uuid, stream.uuid);
  EXPECT_EQ(kernel.args.at("kernel_details"), "grid:1,1,1 block:128,1,1");
  EXPECT_EQ(kernel.args.at("correlation_id"), "42");

  // The counter line: one counter track under the GPU process, its samples and values.
  const PerfettoTrack& util = OnlyTrack(trace, "gpu_utilization");
  EXPECT_TRUE(util.is_counter);
  EXPECT_EQ(util.parent_uuid, gpu.uuid);
  ASSERT_EQ(trace.counters.size(), 2u);
  EXPECT_EQ(trace.counters[0].track_uuid, util.uuid);
  EXPECT_EQ(trace.counters[0].ts_ns, kBaseNs);
  EXPECT_DOUBLE_EQ(trace.counters[0].value, 12.5);
  EXPECT_EQ(trace.counters[1].ts_ns, kBaseNs + 5000);
  EXPECT_DOUBLE_EQ(trace.counters[1].value, 80);
  EXPECT_FALSE(trace.counters[1].is_double);
}

TEST(TracePerfettoTest, EveryTimestampEqualsTheXSpacesInNanoseconds) {
  const XSpace space = testing::SyntheticXSpace(3, 2000);
  const PerfettoTrace trace = Decode(ToPerfetto(space));
  // Expected (track name, start, end, name) from the XSpace itself.
  std::vector<std::tuple<std::string, int64_t, int64_t, std::string>> expected;
  const XPlane& plane = space.planes(0);
  for (const XLine& line : plane.lines()) {
    for (const XEvent& event : line.events()) {
      // Epoch picoseconds do not fit in 64 bits.
      const __int128 start_ps =
          static_cast<__int128>(line.timestamp_ns()) * 1000 + event.offset_ps();
      expected.emplace_back(line.name(), static_cast<int64_t>(start_ps / 1000),
                            static_cast<int64_t>((start_ps + event.duration_ps()) / 1000),
                            plane.event_metadata().at(event.metadata_id()).name());
    }
  }
  std::vector<std::tuple<std::string, int64_t, int64_t, std::string>> actual;
  for (const PerfettoSlice& slice : trace.slices) {
    actual.emplace_back(trace.tracks.at(slice.track_uuid).thread_name, slice.start_ns, slice.end_ns,
                        slice.name);
  }
  std::sort(expected.begin(), expected.end());
  std::sort(actual.begin(), actual.end());
  EXPECT_EQ(actual, expected);
  // One step of eight events: a parent and seven nested children.
  int nested = 0;
  for (const PerfettoSlice& slice : trace.slices) nested += slice.depth == 1;
  EXPECT_EQ(nested, 3 * 2000 * 7 / 8);
}

TEST(TracePerfettoTest, NamesAreInternedOncePerLine) {
  const XSpace space = testing::SyntheticXSpace(2, 1000);
  const PerfettoTrace trace = Decode(ToPerfetto(space));
  // 64 names per line, each defined once on each of the two lines (each line starts afresh).
  EXPECT_EQ(trace.event_name_definitions.size(), 64u);
  for (const auto& [name, definitions] : trace.event_name_definitions) {
    EXPECT_EQ(definitions, 2) << name;
  }
}

TEST(TracePerfettoTest, OverlappingEventsOnADeviceLineGoToChildLanes) {
  XSpace space;
  XPlaneBuilder gpu(space.add_planes());
  gpu.SetId(0);
  gpu.SetName("/device:GPU:0");
  XLineBuilder line = gpu.GetOrCreateLine(3);
  line.SetName("Stream #3");
  line.SetTimestampNs(kBaseNs);
  auto add = [&](const char* name, int64_t start_ns, int64_t duration_ns) {
    XEventBuilder event = line.AddEvent(*gpu.GetOrCreateEventMetadata(name));
    event.SetTimestampNs(kBaseNs + start_ns);
    event.SetDurationNs(duration_ns);
  };
  add("a", 0, 10);   // lane 0
  add("b", 5, 10);   // overlaps a without nesting: a new lane
  add("c", 6, 2);    // nests in a: lane 0
  add("d", 12, 10);  // after a ended, before b ended: lane 0 again
  const PerfettoTrace trace = Decode(ToPerfetto(space));
  auto tracks = trace.TracksNamed("Stream #3");
  ASSERT_EQ(tracks.size(), 2u);
  const PerfettoTrack* parent = tracks[0]->parent_uuid == tracks[1]->uuid ? tracks[1] : tracks[0];
  const PerfettoTrack* lane = parent == tracks[0] ? tracks[1] : tracks[0];
  EXPECT_EQ(lane->parent_uuid, parent->uuid) << "a lane is a child track of the line's track";
  EXPECT_EQ(OnlySlice(trace, "a").track_uuid, parent->uuid);
  EXPECT_EQ(OnlySlice(trace, "b").track_uuid, lane->uuid);
  EXPECT_EQ(OnlySlice(trace, "c").track_uuid, parent->uuid);
  EXPECT_EQ(OnlySlice(trace, "c").depth, 1);
  EXPECT_EQ(OnlySlice(trace, "d").track_uuid, parent->uuid);
  EXPECT_EQ(OnlySlice(trace, "d").depth, 0);
  EXPECT_EQ(OnlySlice(trace, "b").end_ns, kBaseNs + 15);
}

TEST(TracePerfettoTest, ALineOutOfOrderIsSortedFirst) {
  XSpace space;
  XPlaneBuilder host(space.add_planes());
  host.SetName(kHostThreadsPlaneName);
  XLineBuilder line = host.GetOrCreateLine(9);
  line.SetName("t");
  line.SetTimestampNs(kBaseNs);
  for (const auto& [name, start, duration] : std::vector<std::tuple<const char*, int64_t, int64_t>>{
           {"late", 50, 5}, {"inner", 2, 3}, {"outer", 0, 20}, {"zero", 30, 0}}) {
    XEventBuilder event = line.AddEvent(*host.GetOrCreateEventMetadata(name));
    event.SetTimestampNs(kBaseNs + start);
    event.SetDurationNs(duration);
  }
  const PerfettoTrace trace = Decode(ToPerfetto(space));
  EXPECT_EQ(trace.TracksNamed("t").size(), 1u) << "nested once sorted: no lane needed";
  EXPECT_EQ(OnlySlice(trace, "inner").depth, 1);
  EXPECT_EQ(OnlySlice(trace, "late").start_ns, kBaseNs + 50);
  EXPECT_EQ(OnlySlice(trace, "zero").end_ns, kBaseNs + 30);
}

TEST(TracePerfettoTest, UpstreamFlowsAndCounters) {
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
    for (const auto& [name, ts, value] : std::vector<std::tuple<const char*, int64_t, double>>{
             {"power_watts", 1000, 312.5},
             {"memory_used_bytes", 1000, 4e9},
             {"power_watts", 2000, 290.0},
             {"power_watts", 3000, std::numeric_limits<double>::quiet_NaN()}}) {
      XEventBuilder sample = counters.AddEvent(*gpu.GetOrCreateEventMetadata(name));
      sample.SetTimestampNs(ts);
      sample.AddStatValue(*gpu.GetOrCreateStatMetadata(kCounterValue), value);
    }
  }
  PerfettoTraceStats stats;
  const PerfettoTrace trace = Decode(ToPerfetto(space, {}, &stats));
  EXPECT_THAT(OnlySlice(trace, "cudaLaunchKernel").flow_ids, ElementsAre(kFlowId));
  EXPECT_THAT(OnlySlice(trace, "saxpy").terminating_flow_ids, ElementsAre(kFlowId));
  EXPECT_TRUE(OnlySlice(trace, "saxpy").args.empty()) << "the flow stat is not an annotation";
  const PerfettoTrack& power = OnlyTrack(trace, "power_watts");
  const PerfettoTrack& memory = OnlyTrack(trace, "memory_used_bytes");
  std::map<uint64_t, std::vector<std::pair<int64_t, double>>> samples;
  for (const auto& sample : trace.counters) {
    samples[sample.track_uuid].emplace_back(sample.ts_ns, sample.value);
  }
  EXPECT_THAT(samples[power.uuid], ElementsAre(Pair(1000, 312.5), Pair(2000, 290.0)));
  EXPECT_THAT(samples[memory.uuid], ElementsAre(Pair(1000, 4e9)));
  EXPECT_EQ(stats.counter_events, 3);
  EXPECT_EQ(stats.skipped_events, 1) << "NaN is not a sample, as in the trace JSON";
}

TEST(TracePerfettoTest, SeveralHostsShareOneClockAndKeepTheirFlowsApart) {
  // Two hosts with the same capture; the second's clock runs 3 ms ahead of the first's.
  const std::string bytes = testing::SmallXSpace().SerializeAsString();
  io::StringSink sink;
  PerfettoTraceWriter writer(&sink);
  ASSERT_TRUE(writer.Add(bytes, "h0", {.pid_base = 1000, .process_name_prefix = "h0 "}).ok());
  ASSERT_TRUE(writer
                  .Add(bytes, "h1",
                       {.pid_base = 2000,
                        .process_name_prefix = "h1 ",
                        .shift_ps = 3'000'000'000,
                        .flow_id_salt = 1})
                  .ok());
  ASSERT_TRUE(writer.Flush().ok());
  EXPECT_EQ(writer.total().complete_events, 12);
  EXPECT_EQ(writer.total().bytes, sink.data().size());
  const PerfettoTrace trace = Decode(sink.data());
  EXPECT_EQ(OnlyTrack(trace, "h0 /host:CPU").pid, 1000 + kHostThreadsPid);
  EXPECT_EQ(OnlyTrack(trace, "h1 /host:CPU").pid, 2000 + kHostThreadsPid);
  auto steps = trace.SlicesNamed("train_step");
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0]->start_ns, kBaseNs + 1000);
  EXPECT_EQ(steps[1]->start_ns, kBaseNs + 1000 - 3'000'000);
  auto launches = trace.SlicesNamed("cudaLaunchKernel");
  auto kernels = trace.SlicesNamed("gemm_kernel");
  ASSERT_EQ(launches.size(), 2u);
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_EQ(launches[0]->flow_ids, kernels[0]->terminating_flow_ids);
  EXPECT_EQ(launches[1]->flow_ids, kernels[1]->terminating_flow_ids);
  EXPECT_NE(launches[0]->flow_ids, launches[1]->flow_ids) << "each host's correlation id 42";
  std::set<uint64_t> uuids;
  for (const auto& [uuid, track] : trace.tracks) uuids.insert(uuid);
  EXPECT_EQ(uuids.size(), trace.tracks.size());
}

TEST(TracePerfettoTest, AggregatedEventsAndEmptyPlanesAreSkipped) {
  XSpace space;
  XPlaneBuilder host(space.add_planes());
  host.SetName(kHostThreadsPlaneName);
  XLineBuilder line = host.GetOrCreateLine(1);
  line.SetTimestampNs(kBaseNs);
  XEventBuilder aggregated = line.AddEvent(*host.GetOrCreateEventMetadata("agg"));
  aggregated.SetNumOccurrences(5);
  XEventBuilder timed = line.AddEvent(*host.GetOrCreateEventMetadata("timed"));
  timed.SetOffsetPs(1000);
  timed.SetDurationPs(1000);
  XPlaneBuilder metadata(space.add_planes());
  metadata.SetName(kHostMetadataPlaneName);
  PerfettoTraceStats stats;
  const PerfettoTrace trace = Decode(ToPerfetto(space, {}, &stats));
  EXPECT_EQ(stats.skipped_events, 1);
  EXPECT_EQ(trace.slices.size(), 1u);
  EXPECT_THAT(trace.TracksNamed("/host:metadata"), IsEmpty());
}

TEST(TracePerfettoTest, DisplayNameWinsAndKeepsLongName) {
  XSpace space;
  XPlaneBuilder plane(space.add_planes());
  plane.SetName(kHostThreadsPlaneName);
  XLineBuilder line = plane.GetOrCreateLine(1);
  XEventMetadata* md = plane.GetOrCreateEventMetadata("very::long::Name<T>");
  md->set_display_name("Name");
  line.AddEvent(*md).SetDurationNs(1);
  const PerfettoTrace trace = Decode(ToPerfetto(space));
  EXPECT_THAT(OnlySlice(trace, "Name").args, ElementsAre(Pair("long_name", "very::long::Name<T>")));
}

TEST(TracePerfettoTest, EmptySpaceIsAnEmptyTrace) {
  XSpace space;
  space.add_hostnames("h");
  PerfettoTraceStats stats;
  const std::string bytes = ToPerfetto(space, {}, &stats);
  EXPECT_TRUE(bytes.empty());
  EXPECT_EQ(stats.bytes, 0u);
}

std::string WithoutOffset(std::string_view message) {
  return std::string(message.substr(0, message.find("near byte")));
}

TEST(TracePerfettoTest, ErrorsMatchTheParserAndCheckFindsThemFirst) {
  const std::string good = testing::SmallXSpace().SerializeAsString();
  EXPECT_TRUE(CheckSerializedXSpace(good, "input.xplane.pb").ok());
  // An event whose string stat is not valid UTF-8 passes every framing check.
  XSpace bad_utf8 = testing::SmallXSpace();
  bad_utf8.mutable_planes(0)->mutable_lines(0)->mutable_events(0)->add_stats()->set_bytes_value(
      "\xff");
  std::string bad_utf8_bytes = bad_utf8.SerializeAsString();
  // bytes_value (6) -> str_value (5): same length, now a string field.
  const size_t at = bad_utf8_bytes.find("\x32\x01\xff");
  ASSERT_NE(at, std::string::npos);
  bad_utf8_bytes[at] = '\x2a';
  for (const std::string& bad :
       {good.substr(0, good.size() - 3), std::string("\x08\xd0\x0f\x32\x03run", 8),
        std::string("\xff\xff\xff"), std::string(), bad_utf8_bytes}) {
    auto parsed = ParseXSpace(bad, "input.xplane.pb");
    ASSERT_FALSE(parsed.ok());
    io::CountingSink sink;
    auto written = WritePerfettoTraceFromSerialized(bad, "input.xplane.pb", &sink);
    ASSERT_FALSE(written.ok());
    EXPECT_EQ(WithoutOffset(std::string(written.status().message())),
              WithoutOffset(std::string(parsed.status().message())));
    const absl::Status checked = CheckSerializedXSpace(bad, "input.xplane.pb");
    EXPECT_EQ(checked.message(), written.status().message());
  }
}

TEST(TracePerfettoTest, SinkErrorIsReturned) {
  testing::FailingSink sink(absl::DataLossError("disk full"));
  auto stats = WritePerfettoTraceFromSerialized(
      testing::SyntheticXSpace(2, 100'000).SerializeAsString(), "x", &sink);
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kDataLoss);
}

TEST(TracePerfettoTest, ReleaseReportsProgressPerLine) {
  const std::string bytes = testing::SyntheticXSpace(4, 1000).SerializeAsString();
  std::vector<size_t> offsets;
  io::CountingSink sink;
  ASSERT_TRUE(WritePerfettoTraceFromSerialized(bytes, "x", &sink, {}, [&](size_t offset) {
                offsets.push_back(offset);
              }).ok());
  ASSERT_EQ(offsets.size(), 4u);
  EXPECT_TRUE(std::is_sorted(offsets.begin(), offsets.end()));
  EXPECT_LE(offsets.back(), bytes.size());
}

TEST(TracePerfettoTest, SmallerThanTheJson) {
  const XSpace space = testing::SyntheticXSpace(4, 10'000);
  io::CountingSink json;
  ASSERT_TRUE(WriteTraceJson(space, &json).ok());
  const std::string perfetto = ToPerfetto(space);
  EXPECT_LT(perfetto.size() * 2, json.bytes());
}

// The trace JSON after the reading shared with the Perfetto writer moved to xspace_stream:
// streamed from the wire format, still byte for byte the golden file.
TEST(TraceJsonUnchangedTest, StreamedJsonIsTheGoldenFile) {
  const std::string golden = testing::ReadFileOrDie(std::string(CLUSTERPROF_SOURCE_DIR) +
                                                    "/tests/data/golden/small_xspace.trace.json");
  io::StringSink sink;
  ASSERT_TRUE(
      WriteTraceJsonFromSerialized(testing::SmallXSpace().SerializeAsString(), "x", &sink).ok());
  EXPECT_EQ(sink.data(), golden);
}

}  // namespace
}  // namespace clusterprof::xspace
