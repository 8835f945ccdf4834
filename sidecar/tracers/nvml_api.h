// The NVML calls the GPU metrics sampler makes, behind an interface: the real implementation
// loads libnvidia-ml at run time (so the sidecar builds and runs where there is no NVIDIA driver),
// and tests use a fake with scripted values.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_NVML_API_H_
#define CLUSTERPROF_SIDECAR_TRACERS_NVML_API_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace clusterprof::sidecar {

// The library the NVIDIA driver installs (and the NVIDIA container runtime mounts).
inline constexpr char kDefaultNvmlLibrary[] = "libnvidia-ml.so.1";

struct NvmlUtilization {
  // Percent of the last sample period (1/6 s to 1 s, by product) during which a kernel ran.
  uint32_t gpu_percent = 0;
  // Percent of the same period during which device memory was read or written.
  uint32_t memory_percent = 0;
};

struct NvmlMemory {
  uint64_t used_bytes = 0;
  uint64_t total_bytes = 0;
};

// Devices are named by NVML index (0 .. DeviceCount() - 1), which is not the CUDA ordinal in
// general (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER): match devices across the two by UUID.
//
// Errors: a query the device does not support (NVML_ERROR_NOT_SUPPORTED) is
// absl::UnimplementedError, so a caller can skip that query for that device; anything else is
// another code with NVML's description in the message. Implementations are thread-safe.
class NvmlApi {
 public:
  virtual ~NvmlApi() = default;

  virtual absl::StatusOr<int> DeviceCount() = 0;
  // NVML's string form, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (as CUDA reports it too).
  virtual absl::StatusOr<std::string> DeviceUuid(int index) = 0;
  // The product name, e.g. "NVIDIA H100 80GB HBM3".
  virtual absl::StatusOr<std::string> DeviceName(int index) = 0;
  virtual absl::StatusOr<NvmlUtilization> Utilization(int index) = 0;
  virtual absl::StatusOr<NvmlMemory> MemoryUsed(int index) = 0;
  // The board's power draw.
  virtual absl::StatusOr<uint32_t> PowerUsageMilliwatts(int index) = 0;
  // The current streaming-multiprocessor clock.
  virtual absl::StatusOr<uint32_t> SmClockMhz(int index) = 0;
};

// Loads `library` with dlopen() and initializes NVML (nvmlShutdown runs when the result is
// destroyed). Fails, with what to do in the message, when the library is missing, lacks a
// function, or NVML cannot initialize (no driver loaded, no access to the devices).
absl::StatusOr<std::unique_ptr<NvmlApi>> LoadNvmlApi(
    const std::string& library = kDefaultNvmlLibrary);

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_NVML_API_H_
