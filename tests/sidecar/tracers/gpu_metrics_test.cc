#include "sidecar/tracers/gpu_metrics.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "common/base/strings.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "gtest/gtest.h"
#include "sidecar/tracers/nvml_api.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::sidecar {
namespace {

using tensorflow::profiler::XEvent;
using tensorflow::profiler::XLine;
using tensorflow::profiler::XPlane;
using tensorflow::profiler::XSpace;
using tensorflow::profiler::XStat;

constexpr int64_t kMs = kNanosPerMilli;
constexpr char kUuid0[] = "GPU-00000000-1111-2222-3333-444444444444";
constexpr char kUuid1[] = "GPU-11111111-1111-2222-3333-444444444444";
constexpr char kUuid2[] = "GPU-22222222-1111-2222-3333-444444444444";

// An NvmlApi with scripted devices: values and errors per device, and a count of the queries.
class FakeNvml final : public NvmlApi {
 public:
  enum Query { kUtilization, kMemory, kPower, kClock, kNumQueries };

  struct Device {
    std::string uuid;
    std::string name = "NVIDIA H100 80GB HBM3";
    NvmlUtilization utilization{.gpu_percent = 87, .memory_percent = 41};
    NvmlMemory memory{.used_bytes = 12'345'678'901, .total_bytes = 85'520'809'984};
    uint32_t power_milliwatts = 312'250;
    uint32_t sm_clock_mhz = 1980;
    absl::Status uuid_error;
    // By Query; OK means "answer with the value".
    absl::Status errors[kNumQueries];
  };

  int AddDevice(Device device) {
    MutexLock lock(&mu_);
    devices_.push_back(std::move(device));
    return static_cast<int>(devices_.size()) - 1;
  }
  // Changes a device between samples.
  template <typename Fn>
  void Update(int index, Fn&& fn) {
    MutexLock lock(&mu_);
    fn(devices_[index]);
  }
  void SetCountError(absl::Status status) {
    MutexLock lock(&mu_);
    count_error_ = std::move(status);
  }

  int calls(int index, Query query) {
    MutexLock lock(&mu_);
    return calls_[{index, query}];
  }
  // Blocks until device 0 has been asked for its SM clock (the last query of a sample) `count`
  // times.
  void WaitForSamples(int count) {
    MutexLock lock(&mu_);
    mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return calls_[{0, kClock}] >= count; });
  }

  absl::StatusOr<int> DeviceCount() override {
    MutexLock lock(&mu_);
    if (!count_error_.ok()) return count_error_;
    return static_cast<int>(devices_.size());
  }
  absl::StatusOr<std::string> DeviceUuid(int index) override {
    MutexLock lock(&mu_);
    if (!devices_.at(index).uuid_error.ok()) return devices_[index].uuid_error;
    return devices_[index].uuid;
  }
  absl::StatusOr<std::string> DeviceName(int index) override {
    MutexLock lock(&mu_);
    return devices_.at(index).name;
  }
  absl::StatusOr<NvmlUtilization> Utilization(int index) override {
    MutexLock lock(&mu_);
    if (absl::Status status = Call(index, kUtilization); !status.ok()) return status;
    return devices_[index].utilization;
  }
  absl::StatusOr<NvmlMemory> MemoryUsed(int index) override {
    MutexLock lock(&mu_);
    if (absl::Status status = Call(index, kMemory); !status.ok()) return status;
    return devices_[index].memory;
  }
  absl::StatusOr<uint32_t> PowerUsageMilliwatts(int index) override {
    MutexLock lock(&mu_);
    if (absl::Status status = Call(index, kPower); !status.ok()) return status;
    return devices_[index].power_milliwatts;
  }
  absl::StatusOr<uint32_t> SmClockMhz(int index) override {
    MutexLock lock(&mu_);
    if (absl::Status status = Call(index, kClock); !status.ok()) return status;
    return devices_[index].sm_clock_mhz;
  }

 private:
  absl::Status Call(int index, Query query) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++calls_[{index, query}];
    return devices_.at(index).errors[query];
  }

  Mutex mu_;
  std::vector<Device> devices_ ABSL_GUARDED_BY(mu_);
  absl::Status count_error_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, Query>, int> calls_ ABSL_GUARDED_BY(mu_);
};

FakeNvml::Device DeviceWithUuid(std::string uuid) {
  FakeNvml::Device device;
  device.uuid = std::move(uuid);
  return device;
}

// One counter event as a reader sees it.
struct Counter {
  int64_t time_ns = 0;
  XStat named;  // the stat named after the counter
  XStat value;  // the `value` stat
  int stats = 0;
  int64_t duration_ps = 0;
};

const XPlane* GpuPlane(const XSpace& space, int number) {
  return xspace::FindPlaneWithName(space, StrCat(xspace::kGpuPlanePrefix, number));
}

const XLine* CounterLine(const XPlane& plane) {
  for (const XLine& line : plane.lines()) {
    if (line.id() == kUpstreamCounterLineId) return &line;
  }
  return nullptr;
}

// The counter events of `plane`, by counter name.
std::map<std::string, std::vector<Counter>> Counters(const XPlane& plane) {
  std::map<std::string, std::vector<Counter>> counters;
  const XLine* line = CounterLine(plane);
  if (line == nullptr) return counters;
  for (const XEvent& event : line->events()) {
    const std::string& name = plane.event_metadata().at(event.metadata_id()).name();
    Counter counter;
    counter.time_ns = line->timestamp_ns() + event.offset_ps() / 1000;
    counter.duration_ps = event.duration_ps();
    counter.stats = event.stats_size();
    for (const XStat& stat : event.stats()) {
      const std::string& stat_name = plane.stat_metadata().at(stat.metadata_id()).name();
      if (stat_name == name) counter.named = stat;
      if (stat_name == xspace::kCounterValue) counter.value = stat;
    }
    counters[name].push_back(counter);
  }
  return counters;
}

double NumericValue(const XStat& stat) {
  switch (stat.value_case()) {
    case XStat::kDoubleValue:
      return stat.double_value();
    case XStat::kUint64Value:
      return static_cast<double>(stat.uint64_value());
    case XStat::kInt64Value:
      return static_cast<double>(stat.int64_value());
    default:
      return -1;
  }
}

std::vector<int64_t> Times(const std::vector<Counter>& counters) {
  std::vector<int64_t> times;
  times.reserve(counters.size());
  for (const Counter& counter : counters) times.push_back(counter.time_ns);
  return times;
}

std::vector<std::string> Warnings(const XSpace& space) {
  return {space.warnings().begin(), space.warnings().end()};
}

GpuMetricsSampler::Options DefaultOptions() { return GpuMetricsSampler::Options{}; }

TEST(GpuMetricsSamplerTest, WritesEveryMetricAsAnUpstreamCounterEvent) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  SimulatedClock clock;
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  sampler.SampleOnce();
  XSpace space;
  const GpuMetricsSampler::CollectResult result = sampler.CollectInto(&space, {{kUuid0, 0}});

  EXPECT_EQ(result.events, 5u);
  EXPECT_EQ(result.dropped_samples, 0u);
  EXPECT_TRUE(space.warnings().empty());
  ASSERT_EQ(space.planes_size(), 1);
  const XPlane& plane = space.planes(0);
  EXPECT_EQ(plane.name(), "/device:GPU:0");
  ASSERT_EQ(plane.lines_size(), 1);
  EXPECT_EQ(plane.lines(0).id(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(plane.lines(0).name(), "_counters_");

  const auto counters = Counters(plane);
  ASSERT_EQ(counters.size(), 5u);
  for (const auto& [name, events] : counters) {
    ASSERT_EQ(events.size(), 1u) << name;
    EXPECT_EQ(events[0].time_ns, clock.WallNs()) << name;
    EXPECT_EQ(events[0].duration_ps, 0) << name;
    EXPECT_EQ(events[0].stats, 2) << name;
  }
  const Counter& gpu = counters.at("gpu_utilization_percent")[0];
  ASSERT_EQ(gpu.named.value_case(), XStat::kDoubleValue);
  EXPECT_EQ(gpu.named.double_value(), 87.0);
  const Counter& memory_percent = counters.at("memory_utilization_percent")[0];
  ASSERT_EQ(memory_percent.named.value_case(), XStat::kDoubleValue);
  EXPECT_EQ(memory_percent.named.double_value(), 41.0);
  const Counter& memory = counters.at("memory_used_bytes")[0];
  ASSERT_EQ(memory.named.value_case(), XStat::kUint64Value);
  EXPECT_EQ(memory.named.uint64_value(), 12'345'678'901u);
  const Counter& power = counters.at("power_watts")[0];
  ASSERT_EQ(power.named.value_case(), XStat::kDoubleValue);
  EXPECT_DOUBLE_EQ(power.named.double_value(), 312.25);
  const Counter& clock_mhz = counters.at("sm_clock_mhz")[0];
  ASSERT_EQ(clock_mhz.named.value_case(), XStat::kUint64Value);
  EXPECT_EQ(clock_mhz.named.uint64_value(), 1980u);
  // The `value` stat repeats the value, with the same type.
  for (const auto& [name, events] : counters) {
    EXPECT_EQ(events[0].value.value_case(), events[0].named.value_case()) << name;
    EXPECT_EQ(NumericValue(events[0].value), NumericValue(events[0].named)) << name;
  }
}

TEST(GpuMetricsSamplerTest, StampsEachSampleWithTheClockWallTime) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  SimulatedClock clock;
  const int64_t t0 = clock.WallNs();
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  sampler.SampleOnce();
  clock.AdvanceNs(20 * kMs);
  nvml.Update(0, [](FakeNvml::Device& device) { device.sm_clock_mhz = 1410; });
  sampler.SampleOnce();
  XSpace space;
  EXPECT_EQ(sampler.CollectInto(&space, {}).events, 10u);

  const auto counters = Counters(*GpuPlane(space, 0));
  EXPECT_EQ(CounterLine(*GpuPlane(space, 0))->timestamp_ns(), t0);
  const std::vector<Counter>& clocks = counters.at("sm_clock_mhz");
  EXPECT_EQ(Times(clocks), (std::vector<int64_t>{t0, t0 + 20 * kMs}));
  EXPECT_EQ(clocks[0].named.uint64_value(), 1980u);
  EXPECT_EQ(clocks[1].named.uint64_value(), 1410u);
}

TEST(GpuMetricsSamplerTest, PutsMappedDevicesOnThePlaneOfTheirCudaOrdinal) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  nvml.AddDevice(DeviceWithUuid(kUuid1));
  nvml.Update(1, [](FakeNvml::Device& device) { device.sm_clock_mhz = 1111; });
  SimulatedClock clock;
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  sampler.SampleOnce();
  XSpace space;
  sampler.CollectInto(&space, {{kUuid0, 1}, {kUuid1, 0}});

  ASSERT_NE(GpuPlane(space, 0), nullptr);
  ASSERT_NE(GpuPlane(space, 1), nullptr);
  EXPECT_EQ(Counters(*GpuPlane(space, 0)).at("sm_clock_mhz")[0].named.uint64_value(), 1111u);
  EXPECT_EQ(Counters(*GpuPlane(space, 1)).at("sm_clock_mhz")[0].named.uint64_value(), 1980u);
}

TEST(GpuMetricsSamplerTest, UnmappedDeviceKeepsItsNvmlIndex) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  nvml.AddDevice(DeviceWithUuid(kUuid1));
  nvml.Update(1, [](FakeNvml::Device& device) { device.sm_clock_mhz = 1111; });
  SimulatedClock clock;
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  sampler.SampleOnce();
  XSpace space;
  sampler.CollectInto(&space, {{kUuid0, 0}});

  ASSERT_EQ(space.planes_size(), 2);
  EXPECT_EQ(Counters(*GpuPlane(space, 0)).at("sm_clock_mhz")[0].named.uint64_value(), 1980u);
  EXPECT_EQ(Counters(*GpuPlane(space, 1)).at("sm_clock_mhz")[0].named.uint64_value(), 1111u);
}

TEST(GpuMetricsSamplerTest, UnmappedDeviceWhoseIndexIsTakenGetsTheLowestFreeNumber) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  nvml.AddDevice(DeviceWithUuid(kUuid1));
  nvml.AddDevice(DeviceWithUuid(kUuid2));
  for (int i = 0; i < 3; ++i) {
    nvml.Update(i, [i](FakeNvml::Device& device) { device.sm_clock_mhz = 1000 + i; });
  }
  SimulatedClock clock;
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  sampler.SampleOnce();
  XSpace space;
  // The workload sees only NVML device 2, as CUDA device 0: NVML device 1 keeps plane 1, and NVML
  // device 0 moves to the first number nobody has.
  sampler.CollectInto(&space, {{kUuid2, 0}});

  ASSERT_EQ(space.planes_size(), 3);
  EXPECT_EQ(Counters(*GpuPlane(space, 0)).at("sm_clock_mhz")[0].named.uint64_value(), 1002u);
  EXPECT_EQ(Counters(*GpuPlane(space, 1)).at("sm_clock_mhz")[0].named.uint64_value(), 1001u);
  EXPECT_EQ(Counters(*GpuPlane(space, 2)).at("sm_clock_mhz")[0].named.uint64_value(), 1000u);
}

TEST(GpuMetricsSamplerTest, DeviceWithoutUuidGoesByIndexAndWarns) {
  FakeNvml nvml;
  FakeNvml::Device device = DeviceWithUuid(kUuid0);
  device.uuid_error = absl::InternalError("nvmlDeviceGetUUID on NVML device 0: Unknown Error");
  nvml.AddDevice(device);
  SimulatedClock clock;
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  sampler.SampleOnce();
  XSpace space;
  EXPECT_EQ(sampler.CollectInto(&space, {{kUuid0, 3}}).events, 5u);

  EXPECT_NE(GpuPlane(space, 0), nullptr);
  ASSERT_EQ(space.warnings_size(), 1);
  EXPECT_TRUE(StartsWith(space.warnings(0), "gpu metrics: ")) << space.warnings(0);
  EXPECT_NE(space.warnings(0).find("nvmlDeviceGetUUID"), std::string::npos) << space.warnings(0);
}

TEST(GpuMetricsSamplerTest, AddsTheCounterLineToAnExistingPlaneAndNothingElse) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  SimulatedClock clock;
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());
  XSpace space;
  XPlane* activity = space.add_planes();
  activity->set_id(7);
  activity->set_name("/device:GPU:0");
  xspace::XPlaneBuilder builder(activity);
  builder.AddStatValue(*builder.GetOrCreateStatMetadata(xspace::kGpuDeviceName), "NVIDIA H100");
  builder.GetOrCreateLine(1).SetName("Stream #1(Compute)");

  sampler.SampleOnce();
  sampler.CollectInto(&space, {{kUuid0, 0}});

  ASSERT_EQ(space.planes_size(), 1);
  EXPECT_EQ(space.planes(0).id(), 7);
  EXPECT_EQ(space.planes(0).stats_size(), 1);
  ASSERT_EQ(space.planes(0).lines_size(), 2);
  EXPECT_EQ(Counters(space.planes(0)).size(), 5u);
}

TEST(GpuMetricsSamplerTest, NewPlaneGetsNoDeviceStats) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  SimulatedClock clock;
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  sampler.SampleOnce();
  XSpace space;
  sampler.CollectInto(&space, {});

  ASSERT_NE(GpuPlane(space, 0), nullptr);
  EXPECT_EQ(GpuPlane(space, 0)->stats_size(), 0);
  EXPECT_EQ(GpuPlane(space, 0)->lines_size(), 1);
}

TEST(GpuMetricsSamplerTest, CollectingTwiceReusesTheCounterLine) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  SimulatedClock clock;
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  sampler.SampleOnce();
  XSpace space;
  sampler.CollectInto(&space, {});
  sampler.CollectInto(&space, {});

  ASSERT_EQ(space.planes_size(), 1);
  ASSERT_EQ(space.planes(0).lines_size(), 1);
  EXPECT_EQ(space.planes(0).lines(0).events_size(), 10);
  EXPECT_EQ(space.planes(0).event_metadata_size(), 5);
}

TEST(GpuMetricsSamplerTest, SkipsUnsupportedMetricsSilentlyAndStopsAskingForThem) {
  FakeNvml nvml;
  FakeNvml::Device device = DeviceWithUuid(kUuid0);
  device.errors[FakeNvml::kPower] = absl::UnimplementedError("not supported");
  device.errors[FakeNvml::kUtilization] = absl::UnimplementedError("not supported");
  nvml.AddDevice(device);
  SimulatedClock clock;
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  sampler.SampleOnce();
  clock.AdvanceNs(20 * kMs);
  sampler.SampleOnce();
  XSpace space;
  EXPECT_EQ(sampler.CollectInto(&space, {}).events, 4u);

  const auto counters = Counters(*GpuPlane(space, 0));
  EXPECT_EQ(counters.size(), 2u);
  EXPECT_EQ(counters.count("memory_used_bytes"), 1u);
  EXPECT_EQ(counters.count("sm_clock_mhz"), 1u);
  EXPECT_TRUE(space.warnings().empty());
  EXPECT_EQ(nvml.calls(0, FakeNvml::kPower), 1);
  EXPECT_EQ(nvml.calls(0, FakeNvml::kUtilization), 1);
  EXPECT_EQ(nvml.calls(0, FakeNvml::kClock), 2);
}

TEST(GpuMetricsSamplerTest, DeviceWithNoSupportedMetricGetsNoPlane) {
  FakeNvml nvml;
  FakeNvml::Device device = DeviceWithUuid(kUuid0);
  for (absl::Status& error : device.errors) error = absl::UnimplementedError("not supported");
  nvml.AddDevice(device);
  SimulatedClock clock;
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  sampler.SampleOnce();
  XSpace space;
  EXPECT_EQ(sampler.CollectInto(&space, {}).events, 0u);

  EXPECT_EQ(space.planes_size(), 0);
  EXPECT_TRUE(space.warnings().empty());
  EXPECT_EQ(sampler.sample_count(), 0u);
}

TEST(GpuMetricsSamplerTest, NvmlErrorBecomesOneWarningAndTheOtherMetricsAreKept) {
  FakeNvml nvml;
  FakeNvml::Device device = DeviceWithUuid(kUuid0);
  device.errors[FakeNvml::kClock] =
      absl::InternalError("nvmlDeviceGetClockInfo(NVML_CLOCK_SM) on NVML device 0: Unknown Error");
  nvml.AddDevice(device);
  SimulatedClock clock;
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  for (int i = 0; i < 3; ++i) {
    sampler.SampleOnce();
    clock.AdvanceNs(20 * kMs);
  }
  XSpace space;
  EXPECT_EQ(sampler.CollectInto(&space, {}).events, 12u);
  // A second collection into the same space adds no second copy of the warning.
  sampler.CollectInto(&space, {});

  ASSERT_EQ(space.warnings_size(), 1) << ::testing::PrintToString(Warnings(space));
  const std::string& warning = space.warnings(0);
  EXPECT_TRUE(StartsWith(warning, "gpu metrics: ")) << warning;
  EXPECT_NE(warning.find(kUuid0), std::string::npos) << warning;
  EXPECT_NE(warning.find("SM clock"), std::string::npos) << warning;
  EXPECT_NE(warning.find("Unknown Error"), std::string::npos) << warning;
  EXPECT_EQ(Counters(*GpuPlane(space, 0)).count("sm_clock_mhz"), 0u);
  // Other errors may be transient: the query is tried every time.
  EXPECT_EQ(nvml.calls(0, FakeNvml::kClock), 3);
}

TEST(GpuMetricsSamplerTest, DeviceCountErrorBecomesAWarning) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  nvml.SetCountError(absl::InternalError("nvmlDeviceGetCount_v2: Unknown Error"));
  SimulatedClock clock;
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  sampler.SampleOnce();
  sampler.SampleOnce();
  XSpace space;
  EXPECT_EQ(sampler.CollectInto(&space, {}).events, 0u);

  ASSERT_EQ(space.warnings_size(), 1) << ::testing::PrintToString(Warnings(space));
  EXPECT_NE(space.warnings(0).find("cannot list the GPUs"), std::string::npos);
  EXPECT_EQ(space.planes_size(), 0);

  // Listing is tried again until it works.
  nvml.SetCountError(absl::OkStatus());
  sampler.SampleOnce();
  EXPECT_EQ(sampler.sample_count(), 1u);
}

TEST(GpuMetricsSamplerTest, DropsAndCountsSamplesBeyondTheCap) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  nvml.AddDevice(DeviceWithUuid(kUuid1));
  SimulatedClock clock;
  GpuMetricsSampler::Options options;
  options.max_samples = 3;
  GpuMetricsSampler sampler(nvml, clock, options);

  sampler.SampleOnce();
  clock.AdvanceNs(20 * kMs);
  sampler.SampleOnce();
  clock.AdvanceNs(20 * kMs);
  sampler.SampleOnce();
  XSpace space;
  const GpuMetricsSampler::CollectResult result = sampler.CollectInto(&space, {});

  EXPECT_EQ(sampler.sample_count(), 3u);
  EXPECT_EQ(result.dropped_samples, 3u);
  EXPECT_EQ(result.events, 15u);
  ASSERT_EQ(space.warnings_size(), 1) << ::testing::PrintToString(Warnings(space));
  EXPECT_TRUE(StartsWith(space.warnings(0), "gpu metrics: dropped 3 samples")) << space.warnings(0);
}

TEST(GpuMetricsSamplerTest, WritesOnlySamplesInsideTheWindow) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  SimulatedClock clock;
  const int64_t t0 = clock.WallNs();
  GpuMetricsSampler::Options options;
  options.interval_ms = 1000;  // the thread's second sample comes after this test's
  GpuMetricsSampler sampler(nvml, clock, options);

  // Starting ahead of the window's start: the thread's first sample, at t0, is before it.
  ASSERT_TRUE(sampler.Start(t0 + 10 * kMs).ok());
  nvml.WaitForSamples(1);
  clock.AdvanceNs(10 * kMs);
  sampler.SampleOnce();  // at the start: in
  clock.AdvanceNs(10 * kMs);
  sampler.SampleOnce();  // at the stop: in
  clock.AdvanceNs(10 * kMs);
  sampler.SampleOnce();  // after the stop: out
  sampler.Stop(t0 + 20 * kMs);
  XSpace space;
  EXPECT_EQ(sampler.CollectInto(&space, {}).events, 10u);

  EXPECT_EQ(sampler.sample_count(), 4u);
  EXPECT_EQ(Times(Counters(*GpuPlane(space, 0)).at("power_watts")),
            (std::vector<int64_t>{t0 + 10 * kMs, t0 + 20 * kMs}));
  EXPECT_EQ(CounterLine(*GpuPlane(space, 0))->timestamp_ns(), t0 + 10 * kMs);
}

TEST(GpuMetricsSamplerTest, ThreadSamplesEveryIntervalOfTheClock) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  nvml.AddDevice(DeviceWithUuid(kUuid1));
  SimulatedClock clock;
  const int64_t t0 = clock.WallNs();
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  ASSERT_TRUE(sampler.Start(t0).ok());
  for (int sample = 1; sample <= 3; ++sample) {
    nvml.WaitForSamples(sample);
    clock.WaitForSleepers(1);  // the sample is done and the thread waits for the next
    if (sample < 3) clock.AdvanceNs(20 * kMs);
  }
  sampler.Stop(clock.WallNs());
  XSpace space;
  EXPECT_EQ(sampler.CollectInto(&space, {}).events, 30u);

  const std::vector<int64_t> expected = {t0, t0 + 20 * kMs, t0 + 40 * kMs};
  EXPECT_EQ(Times(Counters(*GpuPlane(space, 0)).at("gpu_utilization_percent")), expected);
  EXPECT_EQ(Times(Counters(*GpuPlane(space, 1)).at("gpu_utilization_percent")), expected);
  // Stop ended the thread while it waited: no sample after it.
  EXPECT_EQ(nvml.calls(0, FakeNvml::kClock), 3);
}

TEST(GpuMetricsSamplerTest, ThreadSkipsSamplesItFellBehindOn) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  SimulatedClock clock;
  const int64_t t0 = clock.WallNs();
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  ASSERT_TRUE(sampler.Start(t0).ok());
  nvml.WaitForSamples(1);
  clock.WaitForSleepers(1);
  clock.AdvanceNs(70 * kMs);  // three and a half intervals at once
  nvml.WaitForSamples(2);
  clock.WaitForSleepers(1);
  clock.AdvanceNs(10 * kMs);  // the next interval, at 80 ms
  nvml.WaitForSamples(3);
  clock.WaitForSleepers(1);
  sampler.Stop(clock.WallNs());
  XSpace space;
  sampler.CollectInto(&space, {});

  EXPECT_EQ(Times(Counters(*GpuPlane(space, 0)).at("sm_clock_mhz")),
            (std::vector<int64_t>{t0, t0 + 70 * kMs, t0 + 80 * kMs}));
}

TEST(GpuMetricsSamplerTest, StartForgetsThePreviousCapture) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  nvml.Update(0, [](FakeNvml::Device& device) {
    device.errors[FakeNvml::kPower] = absl::InternalError("Unknown Error");
  });
  SimulatedClock clock;
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());
  sampler.SampleOnce();
  sampler.SampleOnce();
  ASSERT_EQ(sampler.sample_count(), 2u);
  nvml.Update(0, [](FakeNvml::Device& device) { device.errors[FakeNvml::kPower] = {}; });

  ASSERT_TRUE(sampler.Start(clock.WallNs()).ok());
  nvml.WaitForSamples(3);
  sampler.Stop(clock.WallNs());
  XSpace space;
  sampler.CollectInto(&space, {});

  EXPECT_EQ(sampler.sample_count(), 1u);
  EXPECT_TRUE(space.warnings().empty()) << ::testing::PrintToString(Warnings(space));
}

TEST(GpuMetricsSamplerTest, StartFailsWhenNvmlListsNoGpu) {
  FakeNvml nvml;
  SimulatedClock clock;
  GpuMetricsSampler sampler(nvml, clock, DefaultOptions());

  const absl::Status status = sampler.Start(clock.WallNs());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("NVIDIA_VISIBLE_DEVICES"), absl::string_view::npos) << status;
  sampler.Stop(clock.WallNs());
  EXPECT_FALSE(sampler.Prepare().ok());
}

TEST(GpuMetricsSamplerTest, DestructorStopsARunningThread) {
  FakeNvml nvml;
  nvml.AddDevice(DeviceWithUuid(kUuid0));
  SimulatedClock clock;
  {
    GpuMetricsSampler sampler(nvml, clock, DefaultOptions());
    ASSERT_TRUE(sampler.Start(clock.WallNs()).ok());
    nvml.WaitForSamples(1);
  }
  EXPECT_EQ(nvml.calls(0, FakeNvml::kClock), 1);
}

TEST(LoadNvmlApiTest, MissingLibraryFailsNamingItAndWhatToDo) {
  absl::StatusOr<std::unique_ptr<NvmlApi>> nvml = LoadNvmlApi("libdoes-not-exist.so");

  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(nvml.status().message());
  EXPECT_NE(message.find("libdoes-not-exist.so"), std::string::npos) << message;
  EXPECT_NE(message.find("NVIDIA_DRIVER_CAPABILITIES=utility"), std::string::npos) << message;
}

TEST(LoadNvmlApiTest, LibraryWithoutNvmlFailsNamingTheMissingFunctions) {
  absl::StatusOr<std::unique_ptr<NvmlApi>> nvml = LoadNvmlApi("libc.so.6");

  ASSERT_FALSE(nvml.ok());
  const std::string message(nvml.status().message());
  EXPECT_NE(message.find("libc.so.6 lacks nvmlInit_v2"), std::string::npos) << message;
}

TEST(LoadNvmlApiTest, RealNvmlListsDevices) {
  absl::StatusOr<std::unique_ptr<NvmlApi>> nvml = LoadNvmlApi();
  if (!nvml.ok()) GTEST_SKIP() << "no usable NVML on this machine: " << nvml.status();

  absl::StatusOr<int> count = (*nvml)->DeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_GE(*count, 0);
  for (int index = 0; index < *count; ++index) {
    absl::StatusOr<std::string> uuid = (*nvml)->DeviceUuid(index);
    ASSERT_TRUE(uuid.ok()) << uuid.status();
    EXPECT_TRUE(StartsWith(*uuid, "GPU-")) << *uuid;
    absl::StatusOr<std::string> name = (*nvml)->DeviceName(index);
    ASSERT_TRUE(name.ok()) << name.status();
    EXPECT_FALSE(name->empty());
    absl::StatusOr<NvmlMemory> memory = (*nvml)->MemoryUsed(index);
    ASSERT_TRUE(memory.ok()) << memory.status();
    EXPECT_GT(memory->total_bytes, 0u);
    EXPECT_LE(memory->used_bytes, memory->total_bytes);
    // The other queries answer, or say the device does not support them.
    const absl::Status statuses[] = {(*nvml)->Utilization(index).status(),
                                     (*nvml)->PowerUsageMilliwatts(index).status(),
                                     (*nvml)->SmClockMhz(index).status()};
    for (const absl::Status& status : statuses) {
      EXPECT_TRUE(status.ok() || absl::IsUnimplemented(status)) << status;
    }
  }
}

TEST(LoadNvmlApiTest, RealNvmlFeedsTheSampler) {
  absl::StatusOr<std::unique_ptr<NvmlApi>> nvml = LoadNvmlApi();
  if (!nvml.ok()) GTEST_SKIP() << "no usable NVML on this machine: " << nvml.status();
  absl::StatusOr<int> count = (*nvml)->DeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  if (*count == 0) GTEST_SKIP() << "NVML lists no GPU on this machine";
  SimulatedClock clock;
  GpuMetricsSampler sampler(**nvml, clock, DefaultOptions());

  ASSERT_TRUE(sampler.Prepare().ok());
  sampler.SampleOnce();
  XSpace space;
  const GpuMetricsSampler::CollectResult result = sampler.CollectInto(&space, {});

  EXPECT_TRUE(space.warnings().empty()) << ::testing::PrintToString(Warnings(space));
  EXPECT_EQ(space.planes_size(), *count);
  EXPECT_GE(result.events, static_cast<uint64_t>(*count));
  for (int index = 0; index < *count; ++index) {
    const XPlane* plane = GpuPlane(space, index);
    ASSERT_NE(plane, nullptr) << index;
    const auto counters = Counters(*plane);
    ASSERT_EQ(counters.count("memory_used_bytes"), 1u) << index;
    EXPECT_EQ(counters.at("memory_used_bytes")[0].value.value_case(), XStat::kUint64Value);
  }
}

}  // namespace
}  // namespace clusterprof::sidecar
