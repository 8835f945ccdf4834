#include "sidecar/tracers/gpu_xplane.h"

#include <map>
#include <string>
#include <vector>

#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::sidecar {
namespace {

using tensorflow::profiler::XEvent;
using tensorflow::profiler::XLine;
using tensorflow::profiler::XPlane;
using tensorflow::profiler::XSpace;
using tensorflow::profiler::XStat;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr int64_t kWallStart = 1'700'000'000'000'000'000;
// CUPTI's clock reads 5'000'000'000 at kWallStart in these tests.
constexpr uint64_t kCuptiStart = 5'000'000'000;
constexpr int64_t kStop = kWallStart + 1'000'000'000;

// Records of one fake process and its string table.
struct FakeProcess {
  std::vector<shm::GpuRecord> records;
  std::vector<std::string> strings{""};
  std::vector<shm::GpuDeviceInfo> devices;

  uint32_t Intern(const std::string& text) {
    strings.push_back(text);
    return static_cast<uint32_t>(strings.size() - 1);
  }
  void Clock(uint64_t cupti, int64_t wall) {
    shm::GpuRecord r{};
    r.kind = shm::GpuRecordKind::kClock;
    r.start = cupti;
    r.end = static_cast<uint64_t>(wall);
    records.push_back(r);
  }
  shm::GpuRecord& Add(shm::GpuRecordKind kind, uint64_t start_us, uint64_t end_us,
                      uint32_t correlation, uint32_t stream) {
    shm::GpuRecord r{};
    r.kind = kind;
    r.start = kCuptiStart + start_us * 1000;
    r.end = kCuptiStart + end_us * 1000;
    r.correlation_id = correlation;
    r.stream_id = stream;
    r.context_id = 1;
    records.push_back(r);
    return records.back();
  }
  void AddTo(GpuXPlaneConverter& converter, uint32_t pid, std::string_view name) const {
    converter.AddProcess(
        pid, name, devices,
        [this](const std::function<void(const shm::GpuRecord&)>& visit) {
          for (const auto& r : records) visit(r);
        },
        [this](uint32_t id) -> std::string_view {
          return id < strings.size() ? std::string_view(strings[id]) : std::string_view();
        });
  }
};

const XPlane* Plane(const XSpace& space, std::string_view name) {
  return xspace::FindPlaneWithName(space, name);
}
const XLine* Line(const XPlane& plane, int64_t id) {
  for (const XLine& line : plane.lines()) {
    if (line.id() == id) return &line;
  }
  return nullptr;
}
std::string EventName(const XPlane& plane, const XEvent& event) {
  return plane.event_metadata().at(event.metadata_id()).name();
}
const XStat* Stat(const XPlane& plane, const XEvent& event, std::string_view name) {
  for (const XStat& stat : event.stats()) {
    if (plane.stat_metadata().at(stat.metadata_id()).name() == name) return &stat;
  }
  return nullptr;
}
std::string StatText(const XPlane& plane, const XStat& stat) {
  if (stat.value_case() == XStat::kRefValue) {
    return plane.stat_metadata().at(static_cast<int64_t>(stat.ref_value())).name();
  }
  return stat.str_value();
}
int64_t StartNs(const XLine& line, const XEvent& event) {
  return line.timestamp_ns() + event.offset_ps() / 1000;
}

class GpuXPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    process_.Clock(kCuptiStart - 1'000'000, kWallStart - 1'000'000);
    process_.Clock(kCuptiStart + 900'000'000, kWallStart + 900'000'000);
    shm::GpuDeviceInfo device{};
    device.ordinal = 0;
    device.compute_cap_major = 9;
    device.core_count = 132;
    device.clock_rate_khz = 1'980'000;
    device.memory_size = 80ull << 30;
    device.memory_bandwidth = 3'352'320'000'000;
    for (int i = 0; i < 16; ++i) device.uuid[i] = static_cast<char>(i);
    std::strcpy(device.name, "NVIDIA H100 80GB HBM3");
    process_.devices.push_back(device);
  }

  FakeProcess process_;
  XSpace space_;
};

TEST_F(GpuXPlaneTest, AKernelOnADeviceWithKnownLimitsCarriesItsOccupancy) {
  shm::GpuDeviceInfo& device = process_.devices[0];
  device.max_threads_per_block = 1024;
  device.max_threads_per_sm = 2048;
  device.regs_per_block = device.regs_per_sm = 65536;
  device.warp_size = 32;
  device.shared_per_block = 48 * 1024;
  device.shared_per_sm = 228 * 1024;
  device.shared_per_block_optin = 227 * 1024;
  device.reserved_shared_per_block = 1024;
  auto& kernel = process_.Add(shm::GpuRecordKind::kKernel, 20, 120, 11, /*stream=*/7);
  kernel.name_id = process_.Intern("_Z4gemmv");
  kernel.kernel.grid[0] = kernel.kernel.grid[1] = kernel.kernel.grid[2] = 1;
  kernel.kernel.block[0] = 256;
  kernel.kernel.block[1] = kernel.kernel.block[2] = 1;
  kernel.kernel.registers = 64;  // 4 blocks of 8 warps: half the SM's 64
  GpuXPlaneConverter converter(&space_, kWallStart, kStop);
  process_.AddTo(converter, 77, "trainer");
  const XPlane* gpu = Plane(space_, "/device:GPU:0");
  ASSERT_NE(gpu, nullptr);
  const XLine* stream = Line(*gpu, 7);
  ASSERT_NE(stream, nullptr);
  const std::string details = StatText(*gpu, *Stat(*gpu, stream->events(0), "kernel_details"));
#if CLUSTERPROF_TEST_HAVE_CUDA_OCCUPANCY
  EXPECT_EQ(details,
            "regs:64 static_shared:0 dynamic_shared:0 grid:1,1,1 block:256,1,1 "
            "occ_pct:50.0");
#else
  EXPECT_EQ(details, "regs:64 static_shared:0 dynamic_shared:0 grid:1,1,1 block:256,1,1");
#endif
}

TEST_F(GpuXPlaneTest, KernelsCopiesAndTheirLaunchesAreCorrelated) {
  auto& launch = process_.Add(shm::GpuRecordKind::kRuntimeApi, 10, 15, 11, /*tid=*/4242);
  launch.name_id = process_.Intern("cudaLaunchKernel");
  auto& kernel = process_.Add(shm::GpuRecordKind::kKernel, 20, 120, 11, /*stream=*/7);
  kernel.name_id = process_.Intern("_Z5saxpyifPfS_");
  kernel.kernel.grid[0] = 128;
  kernel.kernel.grid[1] = kernel.kernel.grid[2] = 1;
  kernel.kernel.block[0] = 256;
  kernel.kernel.block[1] = kernel.kernel.block[2] = 1;
  kernel.kernel.registers = 32;
  kernel.kernel.static_shared = 1024;
  kernel.kernel.dynamic_shared = 0;
  auto& copy = process_.Add(shm::GpuRecordKind::kMemcpy, 200, 300, 12, 7);
  copy.subkind = static_cast<uint8_t>(shm::GpuCopyKind::kHtoD);
  copy.memcpy.bytes = 100'000'000;  // in 100 us: 1000 GB/s
  copy.memcpy.src_kind = 2;
  copy.memcpy.dst_kind = 3;
  copy.memcpy.async = 1;

  GpuXPlaneConverter converter(&space_, kWallStart, kStop);
  process_.AddTo(converter, 77, "trainer");
  EXPECT_EQ(converter.stats().events, 3u);

  const XPlane* gpu = Plane(space_, "/device:GPU:0");
  ASSERT_NE(gpu, nullptr);
  const XLine* stream = Line(*gpu, 7);
  ASSERT_NE(stream, nullptr);
  EXPECT_EQ(stream->name(), "Stream #7(Kernel,MemcpyH2D)");
  ASSERT_EQ(stream->events_size(), 2);
  const XEvent& k = stream->events(0);
  EXPECT_EQ(EventName(*gpu, k), "saxpy(int, float, float*, float*)");
  EXPECT_EQ(StartNs(*stream, k), kWallStart + 20'000) << "CUPTI time mapped to the wall clock";
  EXPECT_EQ(k.duration_ps(), 100'000'000);
  EXPECT_EQ(Stat(*gpu, k, "correlation_id")->uint64_value(), 11u);
  EXPECT_EQ(Stat(*gpu, k, "context_id")->str_value(), "$$1");
  EXPECT_EQ(StatText(*gpu, *Stat(*gpu, k, "kernel_details")),
            "regs:32 static_shared:1024 dynamic_shared:0 grid:128,1,1 block:256,1,1");
  const XEvent& c = stream->events(1);
  EXPECT_EQ(EventName(*gpu, c), "MemcpyH2D");
  EXPECT_EQ(StatText(*gpu, *Stat(*gpu, c, "memcpy_details")),
            "kind_src:pinned kind_dst:device size:100000000 dest:0 async:1 "
            "bandwidth_gbps:1000.000");

  // The launch on its thread's line of /host:CPU, with the kernel's correlation id and flow.
  const XPlane* host = Plane(space_, xspace::kHostThreadsPlaneName);
  ASSERT_NE(host, nullptr);
  const XLine* thread = Line(*host, 4242);
  ASSERT_NE(thread, nullptr);
  EXPECT_EQ(thread->name(), "trainer/4242");
  ASSERT_EQ(thread->events_size(), 1);
  const XEvent& api = thread->events(0);
  EXPECT_EQ(EventName(*host, api), "cudaLaunchKernel");
  EXPECT_EQ(Stat(*host, api, "correlation_id")->uint64_value(), 11u);
  const uint64_t flow_out = Stat(*host, api, "flow")->uint64_value();
  const uint64_t flow_in = Stat(*gpu, k, "flow")->uint64_value();
  EXPECT_EQ(flow_out & 3, 2u) << "out at the launch";
  EXPECT_EQ(flow_in & 3, 1u) << "in at the kernel";
  EXPECT_EQ(flow_out >> 2, flow_in >> 2) << "the same flow id";
  EXPECT_EQ(flow_out >> 58, 9u) << "category: GPU launch";
  EXPECT_EQ(Stat(*gpu, c, "flow"), nullptr) << "the copy has no launch record";
}

TEST_F(GpuXPlaneTest, TheDevicePlaneDescribesTheGpu) {
  process_.Add(shm::GpuRecordKind::kKernel, 20, 30, 1, 7);
  GpuXPlaneConverter converter(&space_, kWallStart, kStop);
  process_.AddTo(converter, 77, "trainer");
  const XPlane* gpu = Plane(space_, "/device:GPU:0");
  ASSERT_NE(gpu, nullptr);
  std::map<std::string, XStat> stats;
  for (const XStat& stat : gpu->stats()) {
    stats[gpu->stat_metadata().at(stat.metadata_id()).name()] = stat;
  }
  EXPECT_EQ(stats["device_vendor"].str_value(), "Nvidia");
  EXPECT_EQ(stats["gpu_device_name"].str_value(), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(stats["core_count"].uint64_value(), 132u);
  EXPECT_EQ(stats["clock_rate"].uint64_value(), 1'980'000u);
  EXPECT_EQ(stats["memory_bandwidth"].uint64_value(), 3'352'320'000'000u);
  EXPECT_EQ(stats["memory_size"].uint64_value(), 80ull << 30);
  EXPECT_EQ(stats["compute_cap_major"].int64_value(), 9);
  EXPECT_EQ(converter.ordinal_by_uuid().at("GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"), 0);
}

TEST_F(GpuXPlaneTest, EventsOutsideTheWindowAreLeftOut) {
  process_.Add(shm::GpuRecordKind::kKernel, 0, 10, 1, 7);  // inside
  // Starts before the window.
  shm::GpuRecord& early = process_.Add(shm::GpuRecordKind::kKernel, 0, 10, 2, 7);
  early.start = kCuptiStart - 5'000;
  process_.Add(shm::GpuRecordKind::kKernel, 999'000, 1'001'000, 3, 7);  // past the stop
  GpuXPlaneConverter converter(&space_, kWallStart, kStop);
  process_.AddTo(converter, 77, "trainer");
  EXPECT_EQ(converter.stats().events, 1u);
  EXPECT_EQ(converter.stats().outside_window, 2u);
}

TEST_F(GpuXPlaneTest, ClockDriftBetweenCalibrationsIsFollowed) {
  FakeProcess drifting;
  // The wall clock runs 100 ppm faster than CUPTI's over the capture.
  drifting.Clock(kCuptiStart, kWallStart);
  drifting.Clock(kCuptiStart + 500'000'000, kWallStart + 500'050'000);
  drifting.Add(shm::GpuRecordKind::kKernel, 400'000, 400'010, 1, 7);
  GpuXPlaneConverter converter(&space_, kWallStart, kStop);
  drifting.AddTo(converter, 77, "trainer");
  const XPlane* gpu = Plane(space_, "/device:GPU:0");
  ASSERT_NE(gpu, nullptr);
  const XLine* stream = Line(*gpu, 7);
  EXPECT_EQ(StartNs(*stream, stream->events(0)), kWallStart + 400'040'000);
}

TEST_F(GpuXPlaneTest, TwoProcessesOnOneStreamIdGetLinesOfTheirOwn) {
  process_.Add(shm::GpuRecordKind::kKernel, 20, 30, 1, 7);
  FakeProcess other = process_;
  GpuXPlaneConverter converter(&space_, kWallStart, kStop);
  process_.AddTo(converter, 77, "trainer");
  other.AddTo(converter, 78, "evaluator");
  const XPlane* gpu = Plane(space_, "/device:GPU:0");
  ASSERT_NE(gpu, nullptr);
  ASSERT_EQ(gpu->lines_size(), 2);
  EXPECT_NE(Line(*gpu, 7), nullptr);
  EXPECT_NE(Line(*gpu, (int64_t{78} << 32) | 7), nullptr);
  EXPECT_EQ(gpu->stats_size(), 8) << "the device is described once";
}

TEST_F(GpuXPlaneTest, MemsetsSyncsAndNvtxRanges) {
  auto& memset = process_.Add(shm::GpuRecordKind::kMemset, 10, 20, 5, 7);
  memset.memset.bytes = 4096;
  memset.memset.memory_kind = 3;
  process_.Add(shm::GpuRecordKind::kKernel, 30, 40, 6, 7).device_id = 0;
  auto& sync = process_.Add(shm::GpuRecordKind::kSync, 35, 50, 7, 7);
  sync.subkind = 3;
  auto& context_sync = process_.Add(shm::GpuRecordKind::kSync, 60, 70, 8, 0xFFFFFFFF);
  context_sync.subkind = 4;
  auto& range = process_.Add(shm::GpuRecordKind::kNvtxRange, 5, 80, 0, /*tid=*/77);
  range.name_id = process_.Intern("forward");
  GpuXPlaneConverter converter(&space_, kWallStart, kStop);
  process_.AddTo(converter, 77, "trainer");

  const XPlane* gpu = Plane(space_, "/device:GPU:0");
  ASSERT_NE(gpu, nullptr);
  const XLine* stream = Line(*gpu, 7);
  ASSERT_NE(stream, nullptr);
  EXPECT_EQ(stream->name(), "Stream #7(Kernel,Memset)");
  EXPECT_EQ(StatText(*gpu, *Stat(*gpu, stream->events(0), "Memset_details")),
            "kind:device num_bytes:4096 async:0");
  std::vector<std::string> sync_lines;
  for (const XLine& line : gpu->lines()) {
    if (line.id() >= (int64_t{1} << 40)) {
      sync_lines.push_back(line.name() + ": " + EventName(*gpu, line.events(0)));
    }
  }
  EXPECT_THAT(sync_lines, UnorderedElementsAre("Stream #7 synchronization: Stream synchronize",
                                               "Synchronization: Context synchronize"));
  const XPlane* nvtx = Plane(space_, xspace::kNvtxPlaneName);
  ASSERT_NE(nvtx, nullptr);
  ASSERT_EQ(nvtx->lines_size(), 1);
  EXPECT_EQ(nvtx->lines(0).name(), "trainer NVTX") << "the main thread takes the process's name";
  EXPECT_EQ(EventName(*nvtx, nvtx->lines(0).events(0)), "forward");
}

TEST_F(GpuXPlaneTest, WithoutACalibrationNothingIsPlaced) {
  FakeProcess uncalibrated;
  uncalibrated.Add(shm::GpuRecordKind::kKernel, 20, 30, 1, 7);
  GpuXPlaneConverter converter(&space_, kWallStart, kStop);
  uncalibrated.AddTo(converter, 77, "trainer");
  EXPECT_EQ(space_.planes_size(), 0);
}

TEST(GpuXPlaneHelpersTest, DemanglesAndFormats) {
  EXPECT_EQ(DemangleKernelName("_Z5saxpyifPfS_"), "saxpy(int, float, float*, float*)");
  EXPECT_EQ(DemangleKernelName("plain_kernel"), "plain_kernel");
  const char uuid[16] = {'\xde', '\xad', '\xbe', '\xef', 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  EXPECT_EQ(FormatGpuUuid(uuid), "GPU-deadbeef-0001-0203-0405-060708090a0b");
  EXPECT_EQ(EncodeGpuLaunchFlow(5, true), 2u | (5u << 2) | (uint64_t{9} << 58));
  EXPECT_NE(GpuLaunchFlowId(1, 7), GpuLaunchFlowId(2, 7));
}

}  // namespace
}  // namespace clusterprof::sidecar
