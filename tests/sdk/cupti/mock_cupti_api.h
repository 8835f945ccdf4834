// A CuptiApi for tests: records the calls, fails the ones it is told to, and plays CUPTI's side
// of the activity buffers. Tests Produce() activity records; the mock fills a buffer obtained
// through the registered request callback and hands it back through the completion callback at
// the next flush, as CUPTI does. Thread-safe.
#ifndef CLUSTERPROF_TESTS_SDK_CUPTI_MOCK_CUPTI_API_H_
#define CLUSTERPROF_TESTS_SDK_CUPTI_MOCK_CUPTI_API_H_

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sdk/cupti/cupti_api.h"

namespace clusterprof::cupti::testing {

// The size CUPTI gives a record of `kind` in a buffer (records are 8-byte aligned).
// The size of the record a libcupti of API `version` writes for `kind`: the newest struct its
// own headers define (docs/gpu.md, "CUPTI versions"), which is how far cuptiActivityGetNextRecord
// steps.
inline size_t ActivityRecordSize(CUpti_ActivityKind kind, uint32_t version = CUPTI_API_VERSION) {
  size_t size = 0;
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      size = version >= 130000 ? sizeof(CUpti_ActivityKernel10) : sizeof(CUpti_ActivityKernel9);
      break;
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      size = version >= 26 ? sizeof(CUpti_ActivityMemcpy6) : sizeof(CUpti_ActivityMemcpy5);
      break;
    case CUPTI_ACTIVITY_KIND_MEMCPY2:
      size = sizeof(CUpti_ActivityMemcpyPtoP4);
      break;
    case CUPTI_ACTIVITY_KIND_MEMSET:
      size = sizeof(CUpti_ActivityMemset4);
      break;
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
      size = version >= 26 ? sizeof(CUpti_ActivitySynchronization2)
                           : sizeof(CUpti_ActivitySynchronization);
      break;
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER:
      size = sizeof(CUpti_ActivityAPI);
      break;
    case CUPTI_ACTIVITY_KIND_MARKER:
      size = sizeof(CUpti_ActivityMarker2);
      break;
    default:
      size = sizeof(CUpti_Activity);
  }
  return (size + 7) & ~size_t{7};
}

// Activity records laid out as in a CUPTI buffer.
// `version`: the CUPTI API version whose layouts the records have (the mock's `version` must
// match); a record struct longer than that version's is a test bug, and aborts.
class ActivityBuffer {
 public:
  explicit ActivityBuffer(uint32_t version = CUPTI_API_VERSION) : version_(version) {}
  template <typename Record>
  ActivityBuffer& Add(const Record& record) {
    const size_t size =
        ActivityRecordSize(reinterpret_cast<const CUpti_Activity&>(record).kind, version_);
    if (sizeof(Record) > size) std::abort();
    const size_t offset = bytes_.size();
    bytes_.resize(offset + size, 0);
    std::memcpy(bytes_.data() + offset, &record, sizeof(Record));
    return *this;
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  uint32_t version_;
  std::vector<uint8_t> bytes_;
};

class MockCuptiApi final : public CuptiApi {
 public:
  // What the mock's calls do.
  uint32_t version = CUPTI_API_VERSION;
  std::string library_path = "/usr/local/cuda/lib64/libcupti.so.13";
  std::map<CUpti_ActivityKind, CUptiResult> enable_results;
  CUptiResult flush_result = CUPTI_SUCCESS;
  size_t dropped_per_buffer = 0;
  // CUPTI's clock, which tests move.
  std::atomic<uint64_t> cupti_now{1'000'000'000};
  int device_count = 1;

  // Queues `buffer` as CUPTI would fill it; it completes at the next flush.
  void Produce(const ActivityBuffer& buffer) {
    uint8_t* data = nullptr;
    size_t size = 0;
    size_t max_records = 0;
    CUpti_BuffersCallbackRequestFunc request;
    {
      std::lock_guard<std::mutex> lock(mu_);
      request = request_;
    }
    request(&data, &size, &max_records);
    if (data == nullptr || size < buffer.bytes().size()) std::abort();
    std::memcpy(data, buffer.bytes().data(), buffer.bytes().size());
    std::lock_guard<std::mutex> lock(mu_);
    pending_.emplace_back(data, buffer.bytes().size());
  }

  std::vector<std::string> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  std::set<CUpti_ActivityKind> enabled() const {
    std::lock_guard<std::mutex> lock(mu_);
    return enabled_;
  }
  bool callbacks_registered() const {
    std::lock_guard<std::mutex> lock(mu_);
    return request_ != nullptr && complete_ != nullptr;
  }

  std::string LibraryPath() const override { return library_path; }
  CUptiResult GetVersion(uint32_t* v) override {
    Log("GetVersion");
    *v = version;
    return CUPTI_SUCCESS;
  }
  CUptiResult GetResultString(CUptiResult result, const char** text) override {
    switch (result) {
      case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
        *text = "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES";
        break;
      case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
        *text = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
        break;
      default:
        *text = "CUPTI_ERROR_UNKNOWN";
    }
    return CUPTI_SUCCESS;
  }
  CUptiResult SetThreadIdType(CUpti_ActivityThreadIdType) override {
    Log("SetThreadIdType");
    return CUPTI_SUCCESS;
  }
  CUptiResult ActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                        CUpti_BuffersCallbackCompleteFunc complete) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back("RegisterCallbacks");
    request_ = request;
    complete_ = complete;
    return CUPTI_SUCCESS;
  }
  CUptiResult ActivityEnable(CUpti_ActivityKind kind) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back("Enable " + std::to_string(kind));
    if (auto it = enable_results.find(kind); it != enable_results.end()) return it->second;
    enabled_.insert(kind);
    return CUPTI_SUCCESS;
  }
  CUptiResult ActivityDisable(CUpti_ActivityKind kind) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back("Disable " + std::to_string(kind));
    enabled_.erase(kind);
    return CUPTI_SUCCESS;
  }
  CUptiResult ActivityFlushAll(uint32_t flag) override {
    std::vector<std::pair<uint8_t*, size_t>> pending;
    CUpti_BuffersCallbackCompleteFunc complete;
    {
      std::lock_guard<std::mutex> lock(mu_);
      calls_.push_back(flag == CUPTI_ACTIVITY_FLAG_FLUSH_FORCED ? "FlushAll forced" : "FlushAll");
      if (flush_result != CUPTI_SUCCESS) return flush_result;
      pending.swap(pending_);
      complete = complete_;
    }
    for (auto& [data, valid] : pending) complete(nullptr, 0, data, valid, valid);
    return CUPTI_SUCCESS;
  }
  CUptiResult ActivityGetNextRecord(uint8_t* buffer, size_t valid_size,
                                    CUpti_Activity** record) override {
    uint8_t* next = buffer;
    if (*record != nullptr) {
      next = reinterpret_cast<uint8_t*>(*record) + ActivityRecordSize((*record)->kind, version);
    }
    if (next + sizeof(CUpti_Activity) > buffer + valid_size) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = reinterpret_cast<CUpti_Activity*>(next);
    return CUPTI_SUCCESS;
  }
  CUptiResult ActivityGetNumDroppedRecords(CUcontext, uint32_t, size_t* dropped) override {
    *dropped = dropped_per_buffer;
    return CUPTI_SUCCESS;
  }
  CUptiResult GetTimestamp(uint64_t* timestamp) override {
    *timestamp = cupti_now.load();
    return CUPTI_SUCCESS;
  }
  CUptiResult GetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid,
                              const char** name) override {
    static const std::map<std::pair<int, uint32_t>, const char*> kNames = {
        {{CUPTI_CB_DOMAIN_RUNTIME_API, 211}, "cudaLaunchKernel"},
        {{CUPTI_CB_DOMAIN_RUNTIME_API, 31}, "cudaMemcpy"},
        {{CUPTI_CB_DOMAIN_DRIVER_API, 307}, "cuLaunchKernel"},
    };
    auto it = kNames.find({domain, cbid});
    if (it == kNames.end()) return CUPTI_ERROR_INVALID_PARAMETER;
    *name = it->second;
    return CUPTI_SUCCESS;
  }

  CUresult DeviceGetCount(int* count) override {
    *count = device_count;
    return CUDA_SUCCESS;
  }
  CUresult DeviceGet(CUdevice* device, int ordinal) override {
    *device = ordinal;
    return CUDA_SUCCESS;
  }
  CUresult DeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice) override {
    switch (attribute) {
      case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *value = 9;
        break;
      case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        *value = 0;
        break;
      case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *value = 132;
        break;
      case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
        *value = 1'980'000;
        break;
      case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
        *value = 2'619'000;
        break;
      case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
        *value = 5120;
        break;
      // An H100's occupancy limits.
      case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
        *value = 1024;
        break;
      case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
        *value = 2048;
        break;
      case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
      case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR:
        *value = 65536;
        break;
      case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
        *value = 32;
        break;
      case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
        *value = 48 * 1024;
        break;
      case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
        *value = 228 * 1024;
        break;
      case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
        *value = 227 * 1024;
        break;
      case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK:
        *value = 1024;
        break;
      default:
        *value = 0;
    }
    return CUDA_SUCCESS;
  }
  CUresult DeviceGetName(char* name, int length, CUdevice) override {
    std::strncpy(name, "NVIDIA H100 80GB HBM3", length);
    return CUDA_SUCCESS;
  }
  CUresult DeviceTotalMem(size_t* bytes, CUdevice) override {
    *bytes = size_t{85'520'809'984};
    return CUDA_SUCCESS;
  }
  CUresult DeviceGetUuid(CUuuid* uuid, CUdevice device) override {
    for (int i = 0; i < 16; ++i) uuid->bytes[i] = static_cast<char>(0x10 * device + i);
    return CUDA_SUCCESS;
  }

 private:
  void Log(const std::string& call) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(call);
  }

  mutable std::mutex mu_;
  std::vector<std::string> calls_;
  std::set<CUpti_ActivityKind> enabled_;
  CUpti_BuffersCallbackRequestFunc request_ = nullptr;
  CUpti_BuffersCallbackCompleteFunc complete_ = nullptr;
  std::vector<std::pair<uint8_t*, size_t>> pending_;
};

// Records as CUPTI would report them.
// Record builders; the struct is CUDA 13's unless a test names an older one.
template <typename Kernel = CUpti_ActivityKernel10>
Kernel KernelRecord(uint64_t start, uint64_t end, uint32_t correlation, uint32_t stream,
                    const char* name) {
  Kernel k{};
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.start = start;
  k.end = end;
  k.correlationId = correlation;
  k.streamId = stream;
  k.contextId = 1;
  k.deviceId = 0;
  k.gridX = 128;
  k.gridY = 1;
  k.gridZ = 1;
  k.blockX = 256;
  k.blockY = 1;
  k.blockZ = 1;
  k.registersPerThread = 32;
  k.staticSharedMemory = 1024;
  k.dynamicSharedMemory = 2048;
  k.name = name;
  return k;
}

template <typename Memcpy = CUpti_ActivityMemcpy6>
Memcpy MemcpyRecord(uint64_t start, uint64_t end, uint32_t correlation, uint32_t stream,
                    uint8_t copy_kind, uint64_t bytes) {
  Memcpy m{};
  m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  m.copyKind = copy_kind;
  m.srcKind = CUPTI_ACTIVITY_MEMORY_KIND_PINNED;
  m.dstKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  m.flags = CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC;
  m.bytes = bytes;
  m.start = start;
  m.end = end;
  m.correlationId = correlation;
  m.streamId = stream;
  m.contextId = 1;
  return m;
}

inline CUpti_ActivityMemset4 MemsetRecord(uint64_t start, uint64_t end, uint32_t correlation,
                                          uint32_t stream, uint64_t bytes) {
  CUpti_ActivityMemset4 m{};
  m.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  m.bytes = bytes;
  m.start = start;
  m.end = end;
  m.correlationId = correlation;
  m.streamId = stream;
  m.contextId = 1;
  m.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  return m;
}

inline CUpti_ActivityAPI ApiRecord(CUpti_ActivityKind kind, uint32_t cbid, uint64_t start,
                                   uint64_t end, uint32_t correlation, uint32_t thread) {
  CUpti_ActivityAPI a{};
  a.kind = kind;
  a.cbid = cbid;
  a.start = start;
  a.end = end;
  a.correlationId = correlation;
  a.threadId = thread;
  a.processId = 1;
  return a;
}

template <typename Sync = CUpti_ActivitySynchronization2>
Sync SyncRecord(uint64_t start, uint64_t end, uint32_t correlation, uint32_t stream) {
  Sync s{};
  s.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
  s.type = CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE;
  s.start = start;
  s.end = end;
  s.correlationId = correlation;
  s.contextId = 1;
  s.streamId = stream;
  return s;
}

inline CUpti_ActivityMarker2 MarkerRecord(uint32_t id, uint64_t timestamp, bool start,
                                          const char* name, uint32_t thread) {
  CUpti_ActivityMarker2 m{};
  m.kind = CUPTI_ACTIVITY_KIND_MARKER;
  m.flags = start ? CUPTI_ACTIVITY_FLAG_MARKER_START : CUPTI_ACTIVITY_FLAG_MARKER_END;
  m.timestamp = timestamp;
  m.id = id;
  m.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
  m.objectId.pt.threadId = thread;
  m.name = name;
  m.domain = nullptr;
  return m;
}

}  // namespace clusterprof::cupti::testing

#endif  // CLUSTERPROF_TESTS_SDK_CUPTI_MOCK_CUPTI_API_H_
