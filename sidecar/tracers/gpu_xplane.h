// Turns the GPU records of CUDA processes (sdk/shm_format.h) into XPlanes the way the
// XLA GPU profiler lays them out (docs/trace-format.md, "GPU"):
//   /device:GPU:<n>   one line per stream, "Stream #<id>(<kinds>)"; kernels, memcpys and memsets
//                     with correlation_id, context_id and kernel_details / memcpy_details /
//                     Memset_details; synchronization on lines of their own; the device's
//                     capability stats on the plane
//   /host:CPU         the CUDA runtime and driver calls on their threads' lines, with the same
//                     correlation ids
//   /host:NVTX-CUPTI  NVTX ranges, one line per thread
// A launch and the work it started carry the same `flow` stat (upstream's XFlow encoding), so
// trace viewers draw an arrow between them. CUPTI timestamps are mapped to the wall clock with
// the process's clock calibrations. Not thread-safe.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_GPU_XPLANE_H_
#define CLUSTERPROF_SIDECAR_TRACERS_GPU_XPLANE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "sdk/shm_format.h"

namespace tensorflow::profiler {
class XSpace;
}  // namespace tensorflow::profiler

namespace clusterprof::sidecar {

// Maps CUPTI timestamps to the wall clock from (CUPTI, wall) pairs: through the first pair, with
// the drift measured between the first and the last.
class GpuClockMap {
 public:
  void Add(uint64_t cupti_ns, int64_t wall_ns);
  bool empty() const { return points_.empty(); }
  int64_t ToWall(uint64_t cupti_ns) const;

 private:
  std::vector<std::pair<uint64_t, int64_t>> points_;
};

// The upstream XFlow encoding of a `flow` stat: direction in bits 0-1 (1 in, 2 out), the id in
// bits 2-57, the category in bits 58-63 (9: GPU launch).
uint64_t EncodeGpuLaunchFlow(uint64_t flow_id, bool out);
// A flow id for launch `correlation_id` of process `pid`, 56 bits.
uint64_t GpuLaunchFlowId(uint32_t pid, uint32_t correlation_id);

// The kernel name a mangled name demangles to (the name itself when it is not mangled).
std::string DemangleKernelName(std::string_view name);

struct GpuConversionStats {
  uint64_t events = 0;
  uint64_t outside_window = 0;  // records of the process that fell outside the capture
};

class GpuXPlaneConverter {
 public:
  // Events outside [start_ns, stop_ns] are left out.
  GpuXPlaneConverter(tensorflow::profiler::XSpace* space, int64_t start_ns, int64_t stop_ns);

  // One process's records (in write order) and its device table. `strings` resolves name ids.
  using ForEachRecord = std::function<void(const std::function<void(const shm::GpuRecord&)>&)>;
  void AddProcess(uint32_t pid, std::string_view process_name,
                  std::span<const shm::GpuDeviceInfo> devices, const ForEachRecord& records,
                  const std::function<std::string_view(uint32_t)>& strings);

  // The device ordinal of each GPU uuid seen ("GPU-xxxxxxxx-..."), for NVML's counters.
  const absl::flat_hash_map<std::string, int>& ordinal_by_uuid() const { return ordinal_by_uuid_; }
  const GpuConversionStats& stats() const { return stats_; }

 private:
  // One process's records on their way into the planes (gpu_xplane.cc).
  class Process;

  tensorflow::profiler::XSpace* space_;
  const int64_t start_ns_;
  const int64_t stop_ns_;
  GpuConversionStats stats_;
  absl::flat_hash_map<std::string, int> ordinal_by_uuid_;
  // (device, line id) of every device line made, so that streams of two processes on one device
  // get lines of their own.
  std::set<std::pair<int, int64_t>> device_lines_;
  std::map<int, bool> device_described_;
};

// NVML's form of a CUDA uuid: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
std::string FormatGpuUuid(const char (&uuid)[16]);

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_GPU_XPLANE_H_
