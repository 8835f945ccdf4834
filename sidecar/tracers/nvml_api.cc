#include "sidecar/tracers/nvml_api.h"

#include <dlfcn.h>

#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/base/mutex.h"
#include "common/base/strings.h"

namespace clusterprof::sidecar {
namespace {

// The few NVML types used here, as nvml.h declares them (NVML's ABI is stable; the versioned
// entry points below are the ones current drivers export).
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlErrorInvalidArgument = 2;
constexpr nvmlReturn_t kNvmlErrorNotSupported = 3;
constexpr nvmlReturn_t kNvmlErrorNoPermission = 4;
constexpr nvmlReturn_t kNvmlErrorDriverNotLoaded = 9;
constexpr nvmlReturn_t kNvmlErrorTimeout = 10;
constexpr nvmlReturn_t kNvmlErrorGpuIsLost = 15;
constexpr nvmlReturn_t kNvmlErrorLibRmVersionMismatch = 18;
constexpr int kNvmlClockSm = 1;
// NVML_DEVICE_UUID_V2_BUFFER_SIZE and NVML_DEVICE_NAME_V2_BUFFER_SIZE.
constexpr unsigned int kNvmlStringBufferSize = 96;

using NvmlInitFn = nvmlReturn_t (*)();
using NvmlShutdownFn = nvmlReturn_t (*)();
using NvmlErrorStringFn = const char* (*)(nvmlReturn_t);
using NvmlDeviceGetCountFn = nvmlReturn_t (*)(unsigned int*);
using NvmlDeviceGetHandleByIndexFn = nvmlReturn_t (*)(unsigned int, nvmlDevice_t*);
using NvmlDeviceGetStringFn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int);
using NvmlDeviceGetUtilizationRatesFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t*);
using NvmlDeviceGetMemoryInfoFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using NvmlDeviceGetPowerUsageFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*);
using NvmlDeviceGetClockInfoFn = nvmlReturn_t (*)(nvmlDevice_t, int, unsigned int*);

struct NvmlFunctions {
  NvmlInitFn init = nullptr;
  NvmlShutdownFn shutdown = nullptr;
  NvmlErrorStringFn error_string = nullptr;
  NvmlDeviceGetCountFn get_count = nullptr;
  NvmlDeviceGetHandleByIndexFn get_handle_by_index = nullptr;
  NvmlDeviceGetStringFn get_uuid = nullptr;
  NvmlDeviceGetStringFn get_name = nullptr;
  NvmlDeviceGetUtilizationRatesFn get_utilization_rates = nullptr;
  NvmlDeviceGetMemoryInfoFn get_memory_info = nullptr;
  NvmlDeviceGetPowerUsageFn get_power_usage = nullptr;
  NvmlDeviceGetClockInfoFn get_clock_info = nullptr;
};

std::string DlError() {
  const char* error = dlerror();
  return error != nullptr ? error : "unknown dlopen error";
}

// Looks up `name` in `handle` into `*fn`; on failure appends the name to `missing`.
template <typename Fn>
void Resolve(void* handle, const char* name, Fn* fn, std::vector<std::string>* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr) missing->push_back(name);
}

// "Unknown Error (NVML error 999)", with NVML's own text when it has one.
std::string Describe(NvmlErrorStringFn error_string, nvmlReturn_t result) {
  const char* text = error_string != nullptr ? error_string(result) : nullptr;
  return StrCat(text != nullptr ? text : "unknown error", " (NVML error ", result, ")");
}

class DlNvmlApi final : public NvmlApi {
 public:
  DlNvmlApi(void* handle, const NvmlFunctions& functions)
      : handle_(handle), functions_(functions) {}
  DlNvmlApi(const DlNvmlApi&) = delete;
  DlNvmlApi& operator=(const DlNvmlApi&) = delete;

  ~DlNvmlApi() override {
    functions_.shutdown();
    dlclose(handle_);
  }

  absl::StatusOr<int> DeviceCount() override {
    unsigned int count = 0;
    const nvmlReturn_t result = functions_.get_count(&count);
    if (result != kNvmlSuccess) return Error("nvmlDeviceGetCount_v2", -1, result);
    return static_cast<int>(count);
  }

  absl::StatusOr<std::string> DeviceUuid(int index) override {
    return String(index, functions_.get_uuid, "nvmlDeviceGetUUID");
  }

  absl::StatusOr<std::string> DeviceName(int index) override {
    return String(index, functions_.get_name, "nvmlDeviceGetName");
  }

  absl::StatusOr<NvmlUtilization> Utilization(int index) override {
    absl::StatusOr<nvmlDevice_t> device = Handle(index);
    if (!device.ok()) return device.status();
    nvmlUtilization_t utilization{};
    const nvmlReturn_t result = functions_.get_utilization_rates(*device, &utilization);
    if (result != kNvmlSuccess) return Error("nvmlDeviceGetUtilizationRates", index, result);
    return NvmlUtilization{utilization.gpu, utilization.memory};
  }

  absl::StatusOr<NvmlMemory> MemoryUsed(int index) override {
    absl::StatusOr<nvmlDevice_t> device = Handle(index);
    if (!device.ok()) return device.status();
    nvmlMemory_t memory{};
    const nvmlReturn_t result = functions_.get_memory_info(*device, &memory);
    if (result != kNvmlSuccess) return Error("nvmlDeviceGetMemoryInfo", index, result);
    return NvmlMemory{memory.used, memory.total};
  }

  absl::StatusOr<uint32_t> PowerUsageMilliwatts(int index) override {
    absl::StatusOr<nvmlDevice_t> device = Handle(index);
    if (!device.ok()) return device.status();
    unsigned int milliwatts = 0;
    const nvmlReturn_t result = functions_.get_power_usage(*device, &milliwatts);
    if (result != kNvmlSuccess) return Error("nvmlDeviceGetPowerUsage", index, result);
    return milliwatts;
  }

  absl::StatusOr<uint32_t> SmClockMhz(int index) override {
    absl::StatusOr<nvmlDevice_t> device = Handle(index);
    if (!device.ok()) return device.status();
    unsigned int mhz = 0;
    const nvmlReturn_t result = functions_.get_clock_info(*device, kNvmlClockSm, &mhz);
    if (result != kNvmlSuccess)
      return Error("nvmlDeviceGetClockInfo(NVML_CLOCK_SM)", index, result);
    return mhz;
  }

 private:
  // The handle of device `index`, looked up once: NVML handles stay valid until nvmlShutdown.
  absl::StatusOr<nvmlDevice_t> Handle(int index) {
    if (index < 0) {
      return absl::InvalidArgumentError(StrCat("NVML device index ", index, " is negative"));
    }
    MutexLock lock(&mu_);
    if (static_cast<size_t>(index) < handles_.size() && handles_[index] != nullptr) {
      return handles_[index];
    }
    nvmlDevice_t device = nullptr;
    const nvmlReturn_t result =
        functions_.get_handle_by_index(static_cast<unsigned int>(index), &device);
    if (result != kNvmlSuccess) return Error("nvmlDeviceGetHandleByIndex_v2", index, result);
    if (handles_.size() <= static_cast<size_t>(index)) handles_.resize(index + 1, nullptr);
    handles_[index] = device;
    return device;
  }

  absl::StatusOr<std::string> String(int index, NvmlDeviceGetStringFn fn, const char* name) {
    absl::StatusOr<nvmlDevice_t> device = Handle(index);
    if (!device.ok()) return device.status();
    char buffer[kNvmlStringBufferSize] = {};
    const nvmlReturn_t result = fn(*device, buffer, sizeof(buffer));
    if (result != kNvmlSuccess) return Error(name, index, result);
    buffer[sizeof(buffer) - 1] = '\0';
    return std::string(buffer);
  }

  // The status for `call` failing with `result` on device `index` (-1: no device).
  absl::Status Error(const char* call, int index, nvmlReturn_t result) const {
    std::string message = StrCat(call);
    if (index >= 0) StrAppend(&message, " on NVML device ", index);
    StrAppend(&message, ": ", Describe(functions_.error_string, result));
    switch (result) {
      case kNvmlErrorNotSupported:
        return absl::UnimplementedError(StrCat(message, "; the device does not report this"));
      case kNvmlErrorInvalidArgument:
        return absl::InvalidArgumentError(message);
      case kNvmlErrorNoPermission:
        return absl::PermissionDeniedError(
            StrCat(message, "; the sidecar lacks the privilege NVML needs for this query"));
      case kNvmlErrorTimeout:
        return absl::DeadlineExceededError(message);
      case kNvmlErrorGpuIsLost:
        return absl::UnavailableError(
            StrCat(message,
                   "; the GPU fell off the bus or stopped answering: check the node "
                   "(dmesg, nvidia-smi)"));
      default:
        return absl::InternalError(message);
    }
  }

  void* const handle_;
  const NvmlFunctions functions_;
  Mutex mu_;
  std::vector<nvmlDevice_t> handles_ ABSL_GUARDED_BY(mu_);
};

constexpr char kDriverLibrariesHint[] =
    "GPU counters need libnvidia-ml.so.1 from the NVIDIA driver; on Kubernetes give the sidecar "
    "container the GPU driver libraries (run it with the NVIDIA container runtime and "
    "NVIDIA_DRIVER_CAPABILITIES=utility, NVIDIA_VISIBLE_DEVICES set to the workload's GPUs or "
    "\"all\"), or turn GPU counters off";

}  // namespace

absl::StatusOr<std::unique_ptr<NvmlApi>> LoadNvmlApi(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        StrCat("cannot load ", library, " (", DlError(), "): ", kDriverLibrariesHint));
  }
  NvmlFunctions functions;
  std::vector<std::string> missing;
  Resolve(handle, "nvmlInit_v2", &functions.init, &missing);
  Resolve(handle, "nvmlShutdown", &functions.shutdown, &missing);
  Resolve(handle, "nvmlErrorString", &functions.error_string, &missing);
  Resolve(handle, "nvmlDeviceGetCount_v2", &functions.get_count, &missing);
  Resolve(handle, "nvmlDeviceGetHandleByIndex_v2", &functions.get_handle_by_index, &missing);
  Resolve(handle, "nvmlDeviceGetUUID", &functions.get_uuid, &missing);
  Resolve(handle, "nvmlDeviceGetName", &functions.get_name, &missing);
  Resolve(handle, "nvmlDeviceGetUtilizationRates", &functions.get_utilization_rates, &missing);
  Resolve(handle, "nvmlDeviceGetMemoryInfo", &functions.get_memory_info, &missing);
  Resolve(handle, "nvmlDeviceGetPowerUsage", &functions.get_power_usage, &missing);
  Resolve(handle, "nvmlDeviceGetClockInfo", &functions.get_clock_info, &missing);
  if (!missing.empty()) {
    std::string names;
    for (const std::string& name : missing) StrAppend(&names, names.empty() ? "" : ", ", name);
    dlclose(handle);
    return absl::FailedPreconditionError(
        StrCat(library, " lacks ", names,
               ": it is not NVIDIA's NVML library, or it comes from a driver too old for the "
               "sidecar; ",
               kDriverLibrariesHint));
  }
  const nvmlReturn_t result = functions.init();
  if (result != kNvmlSuccess) {
    std::string message = StrCat("nvmlInit_v2 from ", library,
                                 " failed: ", Describe(functions.error_string, result), "; ");
    switch (result) {
      case kNvmlErrorDriverNotLoaded:
        StrAppend(&message,
                  "the NVIDIA kernel driver is not loaded on this node, or the container cannot "
                  "see /dev/nvidiactl: ",
                  kDriverLibrariesHint);
        break;
      case kNvmlErrorNoPermission:
        StrAppend(&message,
                  "the container may not open the NVIDIA device files: run it with the NVIDIA "
                  "container runtime (NVIDIA_VISIBLE_DEVICES) or grant access to /dev/nvidia*");
        break;
      case kNvmlErrorLibRmVersionMismatch:
        StrAppend(&message,
                  "the library does not match the node's kernel driver: mount the driver's own "
                  "libraries into the container instead of shipping a copy in the image");
        break;
      default:
        StrAppend(&message, "check the node's driver with nvidia-smi; ", kDriverLibrariesHint);
        break;
    }
    dlclose(handle);
    return absl::FailedPreconditionError(message);
  }
  return std::unique_ptr<NvmlApi>(new DlNvmlApi(handle, functions));
}

}  // namespace clusterprof::sidecar
