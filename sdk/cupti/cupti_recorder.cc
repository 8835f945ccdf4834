#include "sdk/cupti/cupti_recorder.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace clusterprof::cupti {
namespace {

std::atomic<CuptiRecorder*> g_recorder{nullptr};

// The activity records, CUDA 12.0 to 13.x (docs/gpu.md, "CUPTI versions"). Each libcupti writes,
// for a kind, the newest struct its own headers define, and a newer struct only appends fields or
// fills padding. Every field read here sits in the prefix that all of them share, so each kind is
// read through the oldest struct CUDA 12.0 writes: a view that never reaches past the end of a
// shorter record.
using KernelRecord = CUpti_ActivityKernel9;        // 12.0-12.9; 13.0 writes Kernel10
using MemcpyRecord = CUpti_ActivityMemcpy5;        // 12.0-12.6; 12.8 on write Memcpy6
using SyncRecord = CUpti_ActivitySynchronization;  // 12.0-12.6; 12.8 on write Synchronization2
// MemcpyPtoP4, Memset4, API and Marker2 are what every supported version writes.

#define CLUSTERPROF_SAME_FIELD(Old, New, field)                                                 \
  static_assert(                                                                                \
      offsetof(Old, field) == offsetof(New, field) && sizeof(Old::field) == sizeof(New::field), \
      #Old "::" #field " is not where " #New " has it")
CLUSTERPROF_SAME_FIELD(KernelRecord, CUpti_ActivityKernel10, start);
CLUSTERPROF_SAME_FIELD(KernelRecord, CUpti_ActivityKernel10, end);
CLUSTERPROF_SAME_FIELD(KernelRecord, CUpti_ActivityKernel10, correlationId);
CLUSTERPROF_SAME_FIELD(KernelRecord, CUpti_ActivityKernel10, name);
CLUSTERPROF_SAME_FIELD(KernelRecord, CUpti_ActivityKernel10, streamId);
CLUSTERPROF_SAME_FIELD(KernelRecord, CUpti_ActivityKernel10, contextId);
CLUSTERPROF_SAME_FIELD(KernelRecord, CUpti_ActivityKernel10, deviceId);
CLUSTERPROF_SAME_FIELD(KernelRecord, CUpti_ActivityKernel10, gridX);
CLUSTERPROF_SAME_FIELD(KernelRecord, CUpti_ActivityKernel10, gridZ);
CLUSTERPROF_SAME_FIELD(KernelRecord, CUpti_ActivityKernel10, blockX);
CLUSTERPROF_SAME_FIELD(KernelRecord, CUpti_ActivityKernel10, blockZ);
CLUSTERPROF_SAME_FIELD(KernelRecord, CUpti_ActivityKernel10, registersPerThread);
CLUSTERPROF_SAME_FIELD(KernelRecord, CUpti_ActivityKernel10, staticSharedMemory);
CLUSTERPROF_SAME_FIELD(KernelRecord, CUpti_ActivityKernel10, dynamicSharedMemory);
CLUSTERPROF_SAME_FIELD(MemcpyRecord, CUpti_ActivityMemcpy6, copyKind);
CLUSTERPROF_SAME_FIELD(MemcpyRecord, CUpti_ActivityMemcpy6, srcKind);
CLUSTERPROF_SAME_FIELD(MemcpyRecord, CUpti_ActivityMemcpy6, dstKind);
CLUSTERPROF_SAME_FIELD(MemcpyRecord, CUpti_ActivityMemcpy6, flags);
CLUSTERPROF_SAME_FIELD(MemcpyRecord, CUpti_ActivityMemcpy6, bytes);
CLUSTERPROF_SAME_FIELD(MemcpyRecord, CUpti_ActivityMemcpy6, start);
CLUSTERPROF_SAME_FIELD(MemcpyRecord, CUpti_ActivityMemcpy6, end);
CLUSTERPROF_SAME_FIELD(MemcpyRecord, CUpti_ActivityMemcpy6, deviceId);
CLUSTERPROF_SAME_FIELD(MemcpyRecord, CUpti_ActivityMemcpy6, contextId);
CLUSTERPROF_SAME_FIELD(MemcpyRecord, CUpti_ActivityMemcpy6, streamId);
CLUSTERPROF_SAME_FIELD(MemcpyRecord, CUpti_ActivityMemcpy6, correlationId);
CLUSTERPROF_SAME_FIELD(SyncRecord, CUpti_ActivitySynchronization2, type);
CLUSTERPROF_SAME_FIELD(SyncRecord, CUpti_ActivitySynchronization2, start);
CLUSTERPROF_SAME_FIELD(SyncRecord, CUpti_ActivitySynchronization2, end);
CLUSTERPROF_SAME_FIELD(SyncRecord, CUpti_ActivitySynchronization2, correlationId);
CLUSTERPROF_SAME_FIELD(SyncRecord, CUpti_ActivitySynchronization2, contextId);
CLUSTERPROF_SAME_FIELD(SyncRecord, CUpti_ActivitySynchronization2, streamId);
CLUSTERPROF_SAME_FIELD(SyncRecord, CUpti_ActivitySynchronization2, cudaEventId);
#undef CLUSTERPROF_SAME_FIELD

// cuptiGetVersion of CUDA 12.0 and 12.1; CUDA 11.8's CUPTI reports it too (told apart by its
// file, libcupti.so.11.8). 12.2 to 12.9 report 20 to 28, 13.0 130000 and up.
constexpr uint32_t kOldestCuptiVersion = 18;

bool IsCuda11Library(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string_view file =
      std::string_view(path).substr(slash == std::string::npos ? 0 : slash + 1);
  return file.find("libcupti.so.11") != std::string_view::npos ||
         file.find("libcupti.so.10") != std::string_view::npos;
}

// Activity records hold 8-byte fields: CUPTI wants its buffers aligned so.
constexpr size_t kBufferAlignment = 8;

// The device activity kinds, in the order they are enabled (and disabled in reverse); the API
// kinds and NVTX follow as configured.
constexpr CUpti_ActivityKind kActivityKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_MEMCPY2,
    CUPTI_ACTIVITY_KIND_MEMSET,
};

// "cudaLaunchKernel_v7000" -> "cudaLaunchKernel": CUPTI's callback names carry the version of
// the entry point, which the trace does not need.
std::string ApiFunctionName(std::string_view name) {
  const size_t at = name.rfind("_v");
  if (at != std::string_view::npos && at + 2 < name.size() &&
      name.find_first_not_of("0123456789", at + 2) == std::string_view::npos) {
    name = name.substr(0, at);
  }
  return std::string(name);
}

const char* KindName(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      return "kernel tracing (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)";
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      return "memcpy tracing (CUPTI_ACTIVITY_KIND_MEMCPY)";
    case CUPTI_ACTIVITY_KIND_MEMCPY2:
      return "peer memcpy tracing (CUPTI_ACTIVITY_KIND_MEMCPY2)";
    case CUPTI_ACTIVITY_KIND_MEMSET:
      return "memset tracing (CUPTI_ACTIVITY_KIND_MEMSET)";
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
      return "synchronization tracing (CUPTI_ACTIVITY_KIND_SYNCHRONIZATION)";
    case CUPTI_ACTIVITY_KIND_RUNTIME:
      return "runtime API tracing (CUPTI_ACTIVITY_KIND_RUNTIME)";
    case CUPTI_ACTIVITY_KIND_DRIVER:
      return "driver API tracing (CUPTI_ACTIVITY_KIND_DRIVER)";
    case CUPTI_ACTIVITY_KIND_MARKER:
      return "NVTX range tracing (CUPTI_ACTIVITY_KIND_MARKER)";
    default:
      return "activity tracing";
  }
}

std::string Hint(CUptiResult result) {
  switch (result) {
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
      return "The NVIDIA driver lets only administrators profile GPUs: set the driver option "
             "NVreg_RestrictProfilingToAdminUsers=0 on the node, or give the workload container "
             "CAP_SYS_ADMIN (docs/gpu.md).";
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
      return "Another profiler (Nsight Systems, the TensorFlow or JAX GPU profiler) is using "
             "CUPTI in this process: profile with one of them at a time.";
    case CUPTI_ERROR_NOT_INITIALIZED:
    case CUPTI_ERROR_INVALID_DEVICE:
      return "CUPTI found no usable GPU: check that the driver supports this CUDA version "
             "(nvidia-smi) and that the container sees the GPU.";
    default:
      return "";
  }
}

uint8_t CopyKind(uint8_t cupti_kind) {
  switch (cupti_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return static_cast<uint8_t>(shm::GpuCopyKind::kHtoD);
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return static_cast<uint8_t>(shm::GpuCopyKind::kDtoH);
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return static_cast<uint8_t>(shm::GpuCopyKind::kDtoD);
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return static_cast<uint8_t>(shm::GpuCopyKind::kHtoH);
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return static_cast<uint8_t>(shm::GpuCopyKind::kPtoP);
    case CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN:
      return static_cast<uint8_t>(shm::GpuCopyKind::kUnknown);
    default:
      return static_cast<uint8_t>(shm::GpuCopyKind::kOther);
  }
}

// The fields the memcpy and peer-memcpy records share.
template <typename Copy>
void FillCopy(const Copy& m, uint8_t copy_kind, uint32_t dst_device, shm::GpuRecord* out) {
  out->kind = shm::GpuRecordKind::kMemcpy;
  out->subkind = copy_kind;
  out->start = m.start;
  out->end = m.end;
  out->correlation_id = m.correlationId;
  out->stream_id = m.streamId;
  out->context_id = m.contextId;
  out->device_id = static_cast<uint16_t>(m.deviceId);
  out->memcpy.bytes = m.bytes;
  out->memcpy.src_kind = m.srcKind;
  out->memcpy.dst_kind = m.dstKind;
  out->memcpy.async = (m.flags & CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC) != 0;
  out->memcpy.dst_device = dst_device;
}

void FillMemset(const CUpti_ActivityMemset4& m, shm::GpuRecord* out) {
  out->kind = shm::GpuRecordKind::kMemset;
  out->start = m.start;
  out->end = m.end;
  out->correlation_id = m.correlationId;
  out->stream_id = m.streamId;
  out->context_id = m.contextId;
  out->device_id = static_cast<uint16_t>(m.deviceId);
  out->memset.bytes = m.bytes;
  out->memset.value = m.value;
  out->memset.memory_kind = m.memoryKind;
  out->memset.async = (m.flags & CUPTI_ACTIVITY_FLAG_MEMSET_ASYNC) != 0;
}

void FillSync(const SyncRecord& s, shm::GpuRecord* out) {
  out->kind = shm::GpuRecordKind::kSync;
  out->subkind = static_cast<uint8_t>(s.type);
  out->start = s.start;
  out->end = s.end;
  out->correlation_id = s.correlationId;
  out->stream_id = s.streamId;
  out->context_id = s.contextId;
  out->sync.cuda_event_id = s.cudaEventId;
}

uint16_t Clamp16(int32_t value) {
  return static_cast<uint16_t>(std::clamp<int32_t>(value, 0, UINT16_MAX));
}

}  // namespace

CuptiRecorder::CuptiRecorder(CuptiApi& api, shm::GpuRingWriter& ring, WallClockFn wall_ns,
                             SleepFn sleep)
    : api_(api), ring_(ring), wall_ns_(std::move(wall_ns)), sleep_(std::move(sleep)) {}

CuptiRecorder::~CuptiRecorder() {
  CuptiRecorder* self = this;
  g_recorder.compare_exchange_strong(self, nullptr);
}

std::string CuptiRecorder::ResultText(CUptiResult result) {
  const char* text = nullptr;
  if (api_.GetResultString(result, &text) != CUPTI_SUCCESS || text == nullptr) {
    text = "unknown error";
  }
  return std::string(text) + " (CUPTI error " + std::to_string(static_cast<int>(result)) + ")";
}

void CuptiRecorder::Fail(const std::string& what, CUptiResult result) {
  std::string message = "CUPTI refused " + what + ": " + ResultText(result) + ".";
  if (const std::string hint = Hint(result); !hint.empty()) message += " " + hint;
  message += " GPU tracing stays off in this process until it restarts.";
  failed_ = true;
  ring_.SetError(message);
}

bool CuptiRecorder::Setup() {
  if (setup_done_) return !failed_;
  setup_done_ = true;
  uint32_t version = 0;
  if (CUptiResult r = api_.GetVersion(&version); r != CUPTI_SUCCESS) {
    Fail("its version query", r);
    return false;
  }
  const std::string library = api_.LibraryPath();
  if (version < kOldestCuptiVersion ||
      (version == kOldestCuptiVersion && IsCuda11Library(library))) {
    // Before CUDA 12 the activity records are laid out differently.
    failed_ = true;
    ring_.SetError("the libcupti loaded" + (library.empty() ? "" : " (" + library + ")") +
                   " has API version " + std::to_string(version) +
                   ", from CUDA 11 or older; GPU tracing reads the CUPTI of CUDA 12.0 to 13.x "
                   "(API version 18 from libcupti.so.12, 20 to 28, or 130000 and up): point "
                   "CLUSTERPROF_CUPTI_LIBRARY at one. GPU tracing stays off in this process.");
    return false;
  }
  // Thread ids as the system knows them, so API calls land on the same trace lines as the
  // thread's annotations.
  if (CUptiResult r = api_.SetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM);
      r != CUPTI_SUCCESS) {
    Fail("system thread ids", r);
    return false;
  }
  g_recorder.store(this, std::memory_order_release);
  if (CUptiResult r = api_.ActivityRegisterCallbacks(&BufferRequested, &BufferCompleted);
      r != CUPTI_SUCCESS) {
    Fail("its buffer callbacks", r);
    return false;
  }
  return true;
}

bool CuptiRecorder::Enable(uint64_t seq, const RecorderConfig& config) {
  if (failed_ || !Setup()) return false;
  if (armed_) Disable();
  config_ = config;
  buffer_bytes_.store(config.buffer_bytes, std::memory_order_relaxed);
  max_activity_events_.store(config.max_activity_events, std::memory_order_relaxed);
  max_api_events_.store(config.max_api_events, std::memory_order_relaxed);
  ring_wait_us_.store(config.ring_wait_us, std::memory_order_relaxed);
  activity_count_.store(0, std::memory_order_relaxed);
  api_count_.store(0, std::memory_order_relaxed);
  shm::GpuRingHeader& header = ring_.header();
  header.capped_activity.store(0, std::memory_order_relaxed);
  header.capped_api.store(0, std::memory_order_relaxed);
  header.cupti_dropped.store(0, std::memory_order_relaxed);
  if (!devices_done_) FillDeviceTable();

  std::vector<CUpti_ActivityKind> kinds(std::begin(kActivityKinds), std::end(kActivityKinds));
  if (config.synchronization) kinds.push_back(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
  if (config.runtime_api) kinds.push_back(CUPTI_ACTIVITY_KIND_RUNTIME);
  if (config.driver_api) kinds.push_back(CUPTI_ACTIVITY_KIND_DRIVER);
  if (config.nvtx) kinds.push_back(CUPTI_ACTIVITY_KIND_MARKER);
  // Calibrate before enabling: every record of the capture comes after this pair.
  AddClockRecord();
  for (CUpti_ActivityKind kind : kinds) {
    if (CUptiResult r = api_.ActivityEnable(kind); r != CUPTI_SUCCESS) {
      // Undo, newest first; errors here change nothing (tracing is off either way).
      for (auto it = enabled_.rbegin(); it != enabled_.rend(); ++it) api_.ActivityDisable(*it);
      enabled_.clear();
      Fail(KindName(kind), r);
      return false;
    }
    enabled_.push_back(kind);
  }
  seq_ = seq;
  armed_ = true;
  header.armed_wall_ns.store(wall_ns_(), std::memory_order_relaxed);
  header.armed_seq.store(seq, std::memory_order_release);
  header.state.store(static_cast<uint32_t>(shm::GpuState::kArmed), std::memory_order_release);
  return true;
}

void CuptiRecorder::Disable() {
  if (!armed_) return;
  armed_ = false;
  // Disable first, so nothing new starts; the forced flush then hands over every buffer,
  // including the ones CUPTI is still filling.
  CUptiResult failure = CUPTI_SUCCESS;
  std::string failed_what;
  for (auto it = enabled_.rbegin(); it != enabled_.rend(); ++it) {
    if (CUptiResult r = api_.ActivityDisable(*it); r != CUPTI_SUCCESS && failure == CUPTI_SUCCESS) {
      failure = r;
      failed_what = std::string("turning off ") + KindName(*it);
    }
  }
  enabled_.clear();
  if (CUptiResult r = api_.ActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
      r != CUPTI_SUCCESS && failure == CUPTI_SUCCESS) {
    failure = r;
    failed_what = "flushing its activity buffers";
  }
  AddClockRecord();
  shm::GpuRingHeader& header = ring_.header();
  header.flushed_seq.store(seq_, std::memory_order_release);
  if (failure != CUPTI_SUCCESS) {
    Fail(failed_what, failure);
  } else {
    header.state.store(static_cast<uint32_t>(shm::GpuState::kIdle), std::memory_order_release);
  }
}

void CuptiRecorder::Flush() {
  if (!armed_) return;
  if (CUptiResult r = api_.ActivityFlushAll(0); r != CUPTI_SUCCESS) {
    Disable();
    Fail("flushing its activity buffers", r);
  }
}

void CuptiRecorder::AddClockRecord() {
  // The tightest of a few (wall, CUPTI, wall) readings: the pair's error is half its spread.
  uint64_t best_cupti = 0;
  int64_t best_wall = 0;
  int64_t best_spread = INT64_MAX;
  for (int i = 0; i < 5; ++i) {
    const int64_t before = wall_ns_();
    uint64_t cupti = 0;
    if (api_.GetTimestamp(&cupti) != CUPTI_SUCCESS) return;
    const int64_t after = wall_ns_();
    if (after - before < best_spread) {
      best_spread = after - before;
      best_cupti = cupti;
      best_wall = before + (after - before) / 2;
    }
  }
  shm::GpuRecord record{};
  record.kind = shm::GpuRecordKind::kClock;
  record.start = best_cupti;
  record.end = static_cast<uint64_t>(best_wall);
  ring_.Append({&record, 1}, std::chrono::microseconds(ring_wait_us_.load()), sleep_);
}

void CuptiRecorder::FillDeviceTable() {
  int count = 0;
  if (api_.DeviceGetCount(&count) != CUDA_SUCCESS || count <= 0) return;
  shm::GpuRingHeader& header = ring_.header();
  const uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(count), shm::kMaxGpuDevices);
  for (uint32_t i = 0; i < n; ++i) {
    CUdevice device = 0;
    if (api_.DeviceGet(&device, static_cast<int>(i)) != CUDA_SUCCESS) return;
    shm::GpuDeviceInfo& info = header.devices[i];
    info = shm::GpuDeviceInfo{};
    info.ordinal = i;
    auto attribute = [&](CUdevice_attribute which) {
      int value = 0;
      return api_.DeviceGetAttribute(&value, which, device) == CUDA_SUCCESS ? value : 0;
    };
    info.compute_cap_major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    info.compute_cap_minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    info.core_count = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    info.clock_rate_khz = attribute(CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
    // Double data rate: two transfers per memory clock.
    info.memory_bandwidth = uint64_t{2} * attribute(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE) * 1000 *
                            attribute(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH) / 8;
    info.max_threads_per_block = attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    info.max_threads_per_sm = attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
    info.regs_per_block = attribute(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
    info.regs_per_sm = attribute(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
    info.warp_size = attribute(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
    info.shared_per_block = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
    info.shared_per_sm = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
    info.shared_per_block_optin = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    info.reserved_shared_per_block =
        attribute(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK);
    size_t memory = 0;
    if (api_.DeviceTotalMem(&memory, device) == CUDA_SUCCESS) info.memory_size = memory;
    CUuuid uuid{};
    if (api_.DeviceGetUuid(&uuid, device) == CUDA_SUCCESS) {
      std::memcpy(info.uuid, uuid.bytes, sizeof(info.uuid));
    }
    if (api_.DeviceGetName(info.name, sizeof(info.name) - 1, device) != CUDA_SUCCESS) {
      info.name[0] = '\0';
    }
  }
  header.num_devices.store(n, std::memory_order_release);
  devices_done_ = true;
}

uint32_t CuptiRecorder::ApiName(CUpti_CallbackDomain domain, uint32_t cbid) {
  const uint64_t key = (uint64_t{static_cast<uint32_t>(domain)} << 32) | cbid;
  std::lock_guard<std::mutex> lock(names_mu_);
  if (auto it = api_names_.find(key); it != api_names_.end()) return it->second;
  const char* name = nullptr;
  uint32_t id = 0;
  if (api_.GetCallbackName(domain, cbid, &name) == CUPTI_SUCCESS && name != nullptr) {
    id = ring_.Intern(ApiFunctionName(name));
  } else {
    id = ring_.Intern(
        (domain == CUPTI_CB_DOMAIN_RUNTIME_API ? "cuda runtime call " : "cuda driver call ") +
        std::to_string(cbid));
  }
  api_names_.emplace(key, id);
  return id;
}

void CUPTIAPI CuptiRecorder::BufferRequested(uint8_t** buffer, size_t* size,
                                             size_t* max_num_records) {
  CuptiRecorder* self = g_recorder.load(std::memory_order_acquire);
  const size_t bytes = self != nullptr ? self->buffer_bytes_.load() : size_t{1} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlignment, bytes));
  *size = *buffer != nullptr ? bytes : 0;
  *max_num_records = 0;  // as many as fit
}

void CUPTIAPI CuptiRecorder::BufferCompleted(CUcontext context, uint32_t stream_id, uint8_t* buffer,
                                             size_t size, size_t valid_size) {
  CuptiRecorder* self = g_recorder.load(std::memory_order_acquire);
  if (self != nullptr && buffer != nullptr && valid_size > 0) {
    self->HandleBuffer(buffer, valid_size);
    size_t dropped = 0;
    if (self->api_.ActivityGetNumDroppedRecords(context, stream_id, &dropped) == CUPTI_SUCCESS &&
        dropped > 0) {
      self->ring_.header().cupti_dropped.fetch_add(dropped, std::memory_order_relaxed);
    }
  }
  std::free(buffer);
}

void CuptiRecorder::HandleBuffer(uint8_t* buffer, size_t valid_size) {
  std::vector<shm::GpuRecord> batch;
  batch.reserve(4096);
  CUpti_Activity* record = nullptr;
  while (api_.ActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS) {
    shm::GpuRecord out{};
    if (Convert(*record, &out)) batch.push_back(out);
  }
  if (!batch.empty()) {
    written_.fetch_add(ring_.Append(batch, std::chrono::microseconds(ring_wait_us_.load()), sleep_),
                       std::memory_order_relaxed);
  }
}

bool CuptiRecorder::Take(bool api) {
  std::atomic<uint64_t>& count = api ? api_count_ : activity_count_;
  const uint64_t cap = (api ? max_api_events_ : max_activity_events_).load();
  if (count.fetch_add(1, std::memory_order_relaxed) < cap) return true;
  shm::GpuRingHeader& header = ring_.header();
  (api ? header.capped_api : header.capped_activity).fetch_add(1, std::memory_order_relaxed);
  return false;
}

bool CuptiRecorder::Convert(const CUpti_Activity& record, shm::GpuRecord* out) {
  switch (record.kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      if (!Take(false)) return false;
      FillKernel(reinterpret_cast<const KernelRecord&>(record), out);
      return true;
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      if (!Take(false)) return false;
      const auto& m = reinterpret_cast<const MemcpyRecord&>(record);
      FillCopy(m, CopyKind(m.copyKind), m.deviceId, out);
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY2: {
      if (!Take(false)) return false;
      const auto& m = reinterpret_cast<const CUpti_ActivityMemcpyPtoP4&>(record);
      FillCopy(m, static_cast<uint8_t>(shm::GpuCopyKind::kPtoP), m.dstDeviceId, out);
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET:
      if (!Take(false)) return false;
      FillMemset(reinterpret_cast<const CUpti_ActivityMemset4&>(record), out);
      return true;
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
      if (!Take(false)) return false;
      FillSync(reinterpret_cast<const SyncRecord&>(record), out);
      return true;
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER:
      if (!Take(true)) return false;
      FillApi(reinterpret_cast<const CUpti_ActivityAPI&>(record),
              record.kind == CUPTI_ACTIVITY_KIND_RUNTIME, out);
      return true;
    case CUPTI_ACTIVITY_KIND_MARKER:
      return EndNvtxRange(reinterpret_cast<const CUpti_ActivityMarker2&>(record), out) &&
             Take(false);
    default:
      return false;
  }
}

void CuptiRecorder::FillKernel(const KernelRecord& k, shm::GpuRecord* out) {
  out->kind = shm::GpuRecordKind::kKernel;
  out->start = k.start;
  out->end = k.end;
  out->correlation_id = k.correlationId;
  out->name_id = k.name != nullptr ? ring_.Intern(k.name) : 0;
  out->stream_id = k.streamId;
  out->context_id = k.contextId;
  out->device_id = static_cast<uint16_t>(k.deviceId);
  out->kernel.grid[0] = k.gridX;
  out->kernel.grid[1] = k.gridY;
  out->kernel.grid[2] = k.gridZ;
  out->kernel.block[0] = Clamp16(k.blockX);
  out->kernel.block[1] = Clamp16(k.blockY);
  out->kernel.block[2] = Clamp16(k.blockZ);
  out->kernel.registers = k.registersPerThread;
  out->kernel.static_shared = k.staticSharedMemory;
  out->kernel.dynamic_shared = k.dynamicSharedMemory;
}

void CuptiRecorder::FillApi(const CUpti_ActivityAPI& a, bool runtime, shm::GpuRecord* out) {
  out->kind = runtime ? shm::GpuRecordKind::kRuntimeApi : shm::GpuRecordKind::kDriverApi;
  out->start = a.start;
  out->end = a.end;
  out->correlation_id = a.correlationId;
  out->stream_id = a.threadId;
  out->name_id =
      ApiName(runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, a.cbid);
  out->api.cbid = a.cbid;
  out->api.return_value = a.returnValue;
}

bool CuptiRecorder::EndNvtxRange(const CUpti_ActivityMarker2& m, shm::GpuRecord* out) {
  // NVTX ranges arrive as a start marker and an end marker with the same id.
  std::lock_guard<std::mutex> lock(ranges_mu_);
  if ((m.flags & CUPTI_ACTIVITY_FLAG_MARKER_START) != 0) {
    open_ranges_[m.id] =
        OpenRange{m.timestamp, m.name != nullptr ? ring_.Intern(m.name) : 0,
                  m.domain != nullptr ? ring_.Intern(m.domain) : 0, m.objectId.pt.threadId};
    return false;
  }
  if ((m.flags & CUPTI_ACTIVITY_FLAG_MARKER_END) == 0) return false;
  auto it = open_ranges_.find(m.id);
  if (it == open_ranges_.end()) return false;
  const OpenRange range = it->second;
  open_ranges_.erase(it);
  out->kind = shm::GpuRecordKind::kNvtxRange;
  out->start = range.start;
  out->end = m.timestamp;
  out->name_id = range.name_id;
  out->stream_id = range.thread_id;
  out->nvtx.domain_id = range.domain_id;
  return true;
}

}  // namespace clusterprof::cupti
