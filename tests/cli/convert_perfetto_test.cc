// `clusterprof convert --format perfetto` (one file, and --run over a run directory) on files
// written to disk: the trace decoded with Perfetto's own schema, the hosts on one clock, default
// names, gzip, bad host files left out, and the JSON formats unchanged.
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/base/strings.h"
#include "common/io/byte_sink.h"
#include "common/io/gzip_sink.h"
#include "common/xspace/schema.h"
#include "common/xspace/trace_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/analysis/synthetic_run.h"
#include "tests/support/perfetto_trace_decoder.h"
#include "tests/support/temp_dir.h"
#include "tests/support/xspace_samples.h"

namespace clusterprof::cli {
namespace {

using testing::DecodePerfettoTrace;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using testing::PerfettoTrace;

struct Output {
  int code = 0;
  std::string out;
  std::string err;
};

Output Convert(const ConvertOptions& options) {
  std::ostringstream out, err;
  Output result;
  result.code = RunConvert(options, out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

// Writes a run of `spec` as <dir>/host-N.xplane.pb files and a manifest with the offsets.
std::vector<tensorflow::profiler::XSpace> WriteRun(const analysis::testing::RunSpec& spec,
                                                   const std::string& dir) {
  std::vector<tensorflow::profiler::XSpace> spaces = analysis::testing::MakeRun(spec);
  std::string manifest = R"({"kind":"clusterprof.io/v1alpha1/CaptureRun","targets":[)";
  for (size_t h = 0; h < spaces.size(); ++h) {
    testing::WriteFileOrDie(StrCat(dir, "/host-", h, ".xplane.pb"), spaces[h].SerializeAsString());
    StrAppend(&manifest, h == 0 ? "" : ",", R"({"host":"host-)", h, R"(","clock_offset_ns":)",
              spec.hosts[h].clock_offset_ns, "}");
  }
  manifest += "]}";
  testing::WriteFileOrDie(StrCat(dir, "/clusterprof_run.json"), manifest);
  return spaces;
}

analysis::testing::RunSpec ThreeHostsWithSkewedClocks() {
  analysis::testing::RunSpec spec;
  spec.hosts.resize(3);
  spec.steps = 5;
  spec.hosts[1].clock_offset_ns = 4'000'000;
  spec.hosts[2].clock_offset_ns = -7'000'123;
  return spec;
}

PerfettoTrace DecodeFile(const std::string& path) {
  PerfettoTrace trace = DecodePerfettoTrace(testing::ReadFileOrDie(path));
  EXPECT_THAT(trace.problems, IsEmpty());
  return trace;
}

// The process named "<host> /host:CPU" of each host, and the first "train" slice on it.
std::map<std::string, int64_t> FirstTrainStartByProcess(const PerfettoTrace& trace) {
  std::map<uint64_t, std::string> process_of_thread;
  for (const auto& [uuid, track] : trace.tracks) {
    if (!track.is_thread) continue;
    for (const auto& [other, process] : trace.tracks) {
      if (process.is_process && process.pid == track.pid) {
        process_of_thread[uuid] = process.process_name;
      }
    }
  }
  std::map<std::string, int64_t> first;
  for (const auto* slice : trace.SlicesNamed("train")) {
    const std::string& process = process_of_thread[slice->track_uuid];
    if (!first.count(process) || slice->start_ns < first[process]) {
      first[process] = slice->start_ns;
    }
  }
  return first;
}

TEST(ConvertPerfettoTest, EveryHostOfARunOnTheCoordinatorsClock) {
  testing::TempDir dir;
  const auto spec = ThreeHostsWithSkewedClocks();
  const auto spaces = WriteRun(spec, dir.path());
  const Output result = Convert({.input = dir.path(),
                                 .run = true,
                                 .output = dir.Join("all.perfetto-trace"),
                                 .format = ConvertFormat::kPerfetto});
  ASSERT_EQ(result.code, kExitOk) << result.err;
  EXPECT_THAT(result.out, HasSubstr("of Perfetto protobuf"));
  EXPECT_THAT(result.out, HasSubstr("https://ui.perfetto.dev"));
  EXPECT_THAT(result.out, HasSubstr("trace_processor"));
  const PerfettoTrace trace = DecodeFile(dir.Join("all.perfetto-trace"));
  int processes = 0;
  std::map<int, int> pids;
  for (const auto& [uuid, track] : trace.tracks) {
    if (track.is_process) {
      ++processes;
      ++pids[track.pid];
    }
  }
  EXPECT_EQ(processes, 6) << "a /host:CPU and a /device:GPU:0 process per host";
  EXPECT_EQ(pids.size(), 6u) << "every process its own pid";
  EXPECT_EQ(trace.TracksNamed("host-1 /device:GPU:0").size(), 1u);

  // Each host's events moved by exactly its manifest offset: the first steps, which began
  // together on the reference clock, begin at the same nanosecond.
  const auto first = FirstTrainStartByProcess(trace);
  ASSERT_EQ(first.size(), 3u);
  for (size_t h = 0; h < 3; ++h) {
    const auto& line = spaces[h].planes(0).lines(0);
    const int64_t in_xspace = line.timestamp_ns() + line.events(0).offset_ps() / 1000;
    EXPECT_EQ(first.at(StrCat("host-", h, " /host:CPU")), in_xspace - spec.hosts[h].clock_offset_ns)
        << h;
  }
  EXPECT_EQ(first.at("host-0 /host:CPU"), first.at("host-2 /host:CPU"));
  int64_t events = 0;
  for (const auto& space : spaces) {
    for (const auto& plane : space.planes()) {
      for (const auto& line : plane.lines()) events += line.events_size();
    }
  }
  EXPECT_EQ(static_cast<int64_t>(trace.slices.size()), events);
}

TEST(ConvertPerfettoTest, ACorruptOrTruncatedHostIsNamedAndLeftOut) {
  testing::TempDir dir;
  WriteRun(ThreeHostsWithSkewedClocks(), dir.path());
  const std::string good = testing::ReadFileOrDie(dir.Join("host-1.xplane.pb"));
  testing::WriteFileOrDie(dir.Join("host-1.xplane.pb"), good.substr(0, good.size() / 2));
  testing::WriteFileOrDie(dir.Join("host-2.xplane.pb"), "\xff\xfe garbage");
  const Output result = Convert({.input = dir.path(),
                                 .run = true,
                                 .output = dir.Join("all.perfetto-trace"),
                                 .format = ConvertFormat::kPerfetto});
  ASSERT_EQ(result.code, kExitOk) << result.err;
  EXPECT_THAT(result.err, HasSubstr("skipping host host-1: "));
  EXPECT_THAT(result.err, HasSubstr("host-1.xplane.pb is not a valid XSpace"));
  EXPECT_THAT(result.err, HasSubstr("skipping host host-2: "));
  EXPECT_THAT(result.err, HasSubstr("2 of 3 hosts left out: host-1, host-2"));
  const PerfettoTrace trace = DecodeFile(dir.Join("all.perfetto-trace"));
  EXPECT_EQ(trace.TracksNamed("host-0 /host:CPU").size(), 1u);
  EXPECT_THAT(trace.TracksNamed("host-1 /host:CPU"), IsEmpty());
  EXPECT_THAT(trace.TracksNamed("host-2 /host:CPU"), IsEmpty());
}

TEST(ConvertPerfettoTest, NoHostConvertedFailsAndLeavesNoOutput) {
  testing::TempDir dir;
  testing::WriteFileOrDie(dir.Join("host-0.xplane.pb"), "\xff\xfe garbage");
  testing::WriteFileOrDie(dir.Join("host-1.xplane.pb"), "\x0a\x7f truncated");
  const Output result = Convert({.input = dir.path(),
                                 .run = true,
                                 .output = dir.Join("all.perfetto-trace"),
                                 .format = ConvertFormat::kPerfetto});
  EXPECT_EQ(result.code, kExitFailure);
  EXPECT_THAT(result.err, HasSubstr("could be converted (2 unreadable: host-0, host-1)"));
  EXPECT_FALSE(testing::FileExists(dir.Join("all.perfetto-trace")));
}

TEST(ConvertPerfettoTest, ACorruptFileIsAnErrorNamingItAndLeavesNoOutput) {
  testing::TempDir dir;
  const std::string good = testing::SmallXSpace().SerializeAsString();
  const std::string input = dir.Join("worker-0.xplane.pb");
  testing::WriteFileOrDie(input, good.substr(0, good.size() - 5));
  const Output result = Convert({.input = input, .format = ConvertFormat::kPerfetto});
  EXPECT_EQ(result.code, kExitFailure);
  EXPECT_THAT(result.err, HasSubstr(input + " is not a valid XSpace"));
  EXPECT_FALSE(testing::FileExists(dir.Join("worker-0.perfetto-trace")));
  EXPECT_THAT(testing::ListFilesRecursively(dir.path()),
              ::testing::ElementsAre("worker-0.xplane.pb"))
      << "no temporary file left behind either";
}

TEST(ConvertPerfettoTest, DefaultNameBesideTheInputGzipAndStdout) {
  testing::TempDir dir;
  const std::string input = dir.Join("worker-0.xplane.pb");
  testing::WriteFileOrDie(input, testing::SmallXSpace().SerializeAsString());
  const Output plain = Convert({.input = input, .format = ConvertFormat::kPerfetto});
  ASSERT_EQ(plain.code, kExitOk) << plain.err;
  EXPECT_THAT(plain.out, HasSubstr("worker-0.perfetto-trace"));
  const std::string bytes = testing::ReadFileOrDie(dir.Join("worker-0.perfetto-trace"));
  const PerfettoTrace trace = DecodePerfettoTrace(bytes);
  EXPECT_THAT(trace.problems, IsEmpty());
  EXPECT_EQ(trace.TracksNamed("worker-0 /host:CPU").size(), 1u) << "processes named by host";

  const Output gzipped = Convert({.input = input,
                                  .output = dir.Join("w.perfetto-trace.gz"),
                                  .format = ConvertFormat::kPerfetto});
  ASSERT_EQ(gzipped.code, kExitOk) << gzipped.err;
  std::string unzipped;
  ASSERT_TRUE(
      io::GunzipString(testing::ReadFileOrDie(dir.Join("w.perfetto-trace.gz")), &unzipped).ok());
  EXPECT_EQ(unzipped, bytes);

  const Output stdout_trace =
      Convert({.input = input, .output = "-", .format = ConvertFormat::kPerfetto});
  ASSERT_EQ(stdout_trace.code, kExitOk) << stdout_trace.err;
  EXPECT_EQ(stdout_trace.out, bytes);
}

TEST(ConvertPerfettoTest, JsonFormatsAreByteForByteTheTraceJson) {
  testing::TempDir dir;
  const auto space = testing::SmallXSpace();
  const std::string input = dir.Join("worker-0.xplane.pb");
  testing::WriteFileOrDie(input, space.SerializeAsString());
  for (const ConvertFormat format : {ConvertFormat::kJson, ConvertFormat::kPerfettoJson}) {
    io::StringSink expected;
    ASSERT_TRUE(xspace::WriteTraceJson(space, &expected,
                                       {.include_metadata = format == ConvertFormat::kJson})
                    .ok());
    const Output json = Convert({.input = input, .output = dir.Join("w.json"), .format = format});
    ASSERT_EQ(json.code, kExitOk) << json.err;
    EXPECT_EQ(testing::ReadFileOrDie(dir.Join("w.json")), expected.data());
  }
  // The default stays gzipped JSON under the name it always had.
  const Output default_json = Convert({.input = input});
  ASSERT_EQ(default_json.code, kExitOk) << default_json.err;
  std::string json;
  ASSERT_TRUE(
      io::GunzipString(testing::ReadFileOrDie(dir.Join("worker-0.trace.json.gz")), &json).ok());
  io::StringSink expected;
  ASSERT_TRUE(xspace::WriteTraceJson(space, &expected).ok());
  EXPECT_EQ(json, expected.data());
  EXPECT_THAT(default_json.out, Not(HasSubstr("Perfetto protobuf")));
}

}  // namespace
}  // namespace clusterprof::cli
