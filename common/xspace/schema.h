// Names that give an XSpace its meaning to XProf, TensorBoard and Perfetto (docs/protocol.md).
#ifndef CLUSTERPROF_COMMON_XSPACE_SCHEMA_H_
#define CLUSTERPROF_COMMON_XSPACE_SCHEMA_H_

#include <string_view>

namespace clusterprof::xspace {

// Planes.
inline constexpr std::string_view kHostThreadsPlaneName = "/host:CPU";
inline constexpr std::string_view kGpuPlanePrefix = "/device:GPU:";
inline constexpr std::string_view kTpuPlanePrefix = "/device:TPU:";
inline constexpr std::string_view kCustomPlanePrefix = "/device:CUSTOM:";
inline constexpr std::string_view kDevicePlanePrefix = "/device:";
inline constexpr std::string_view kCuptiDriverApiPlaneName = "/host:CUPTI";
inline constexpr std::string_view kNvtxPlaneName = "/host:NVTX-CUPTI";
inline constexpr std::string_view kHostMetadataPlaneName = "/host:metadata";
inline constexpr std::string_view kTaskEnvPlaneName = "Task Environment";

// Task Environment stats (epoch ns, and the options the capture ran with).
inline constexpr std::string_view kProfileStartTime = "profile_start_time";
inline constexpr std::string_view kProfileStopTime = "profile_stop_time";
inline constexpr std::string_view kProfileOptions = "profile_options";

// TraceMe stats.
inline constexpr std::string_view kStepNum = "step_num";
inline constexpr std::string_view kIterNum = "iter_num";
inline constexpr std::string_view kIsRoot = "_r";
inline constexpr std::string_view kProducerId = "_p";
inline constexpr std::string_view kConsumerId = "_c";
inline constexpr std::string_view kProducerType = "_pt";
inline constexpr std::string_view kConsumerType = "_ct";
// Upstream's flow stat (XFlow): uint64 with the direction in bits 0-1 (1 in, 2 out), the flow id
// in bits 2-57 and the category in bits 58-63; 9 is a GPU launch (launch -> kernel).
inline constexpr std::string_view kFlow = "flow";
inline constexpr uint64_t kFlowCategoryGpuLaunch = 9;

// Device event stats.
inline constexpr std::string_view kDeviceId = "device_id";
inline constexpr std::string_view kContextId = "context_id";
inline constexpr std::string_view kCorrelationId = "correlation_id";
inline constexpr std::string_view kStreamId = "stream";
inline constexpr std::string_view kKernelDetails = "kernel_details";
inline constexpr std::string_view kMemcpyDetails = "memcpy_details";
inline constexpr std::string_view kMemallocDetails = "memalloc_details";
inline constexpr std::string_view kMemsetDetails = "Memset_details";
inline constexpr std::string_view kNvtxRange = "nvtx_range";

// Device plane capabilities.
inline constexpr std::string_view kDevCapClockRateKHz = "clock_rate";
inline constexpr std::string_view kDevCapCoreCount = "core_count";
inline constexpr std::string_view kDevCapMemoryBandwidth = "memory_bandwidth";
inline constexpr std::string_view kDevCapMemorySize = "memory_size";
inline constexpr std::string_view kDevCapComputeCapMajor = "compute_cap_major";
inline constexpr std::string_view kDevCapComputeCapMinor = "compute_cap_minor";
inline constexpr std::string_view kDevVendor = "device_vendor";
inline constexpr std::string_view kGpuDeviceName = "gpu_device_name";
inline constexpr std::string_view kDeviceVendorNvidia = "Nvidia";

// clusterprof convention for counters (system metrics, NVML): a line with this name holds one
// zero-duration event per sample; the event's metadata name is the counter's name and its stat
// `value` the sample. The trace JSON turns them into "ph":"C" events.
inline constexpr std::string_view kCounterLineName = "Counters";
// Upstream XLA's counter line (id INT64_MAX), whose events carry a stat named after the counter;
// ours add a "value" stat too. Readers treat both lines as counters.
inline constexpr std::string_view kUpstreamCounterLineName = "_counters_";
inline bool IsCounterLine(std::string_view line_name) {
  return line_name == kCounterLineName || line_name == kUpstreamCounterLineName;
}
inline constexpr std::string_view kCounterValue = "value";

// Trace JSON process ids (docs/protocol.md): host threads use a fixed pid; device plane n uses 1 +
// n.
inline constexpr int kHostThreadsPid = 701;
inline constexpr int kFirstDevicePid = 1;
// Further /host:CPU planes (e.g. a framework's own, merged beside ours) and other planes with
// events get pids from here on, so they never collide with the host or device pids above.
inline constexpr int kFirstExtraHostPid = 702;
inline constexpr int kFirstOtherPlanePid = 801;

// Upstream caps (docs/protocol.md); beyond them events are dropped and counted.
inline constexpr long kMaxTraceViewerEvents = 1'000'000;

}  // namespace clusterprof::xspace

#endif  // CLUSTERPROF_COMMON_XSPACE_SCHEMA_H_
