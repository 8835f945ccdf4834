// The core of libclusterprof_cupti: turns CUPTI activity tracing on for a capture the sidecar
// armed, converts CUPTI's activity buffers into GpuRecords in the process's GPU ring, and turns
// tracing off again with everything flushed. Every CUPTI call goes through CuptiApi.
//
// Failure: any CUPTI error undoes what was enabled, marks the ring kFailed with a message that
// says how to fix it, and leaves GPU tracing off in this process (XLA's CuptiErrorManager does
// the same); the workload itself never sees an error, a crash or a stall.
//
// Thread-safety: Enable, Disable and Flush are serialized by the caller (the injection's watcher
// thread). CUPTI calls the buffer callbacks on its own threads; they only touch the ring (which
// is thread-safe) and atomics.
#ifndef CLUSTERPROF_SDK_CUPTI_CUPTI_RECORDER_H_
#define CLUSTERPROF_SDK_CUPTI_CUPTI_RECORDER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "sdk/cupti/cupti_api.h"
#include "sdk/gpu_ring_writer.h"

namespace clusterprof::cupti {

struct RecorderConfig {
  uint64_t max_activity_events = shm::kDefaultGpuMaxEvents;
  uint64_t max_api_events = shm::kDefaultGpuMaxEvents;
  bool nvtx = false;
  // The host calls recorded (for the launch -> kernel correlation). Each costs CUPTI time on the
  // calling thread: a launch-bound workload can leave one out (docs/gpu.md).
  bool runtime_api = true;
  bool driver_api = true;
  // Synchronization records (host waits on streams, events, contexts).
  bool synchronization = true;
  // Size of each buffer handed to CUPTI; a capture uses several (they are freed as they
  // complete).
  size_t buffer_bytes = 8 << 20;
  // How long a completed buffer may wait for room in a full ring (the sidecar drains it every
  // few ms) before its records are dropped and counted.
  int64_t ring_wait_us = 200'000;
};

class CuptiRecorder {
 public:
  using WallClockFn = std::function<int64_t()>;
  using SleepFn = shm::GpuRingWriter::SleepFn;

  CuptiRecorder(CuptiApi& api, shm::GpuRingWriter& ring, WallClockFn wall_ns, SleepFn sleep);
  ~CuptiRecorder();
  CuptiRecorder(const CuptiRecorder&) = delete;
  CuptiRecorder& operator=(const CuptiRecorder&) = delete;

  // One-time setup, as early as possible (InitializeInjection): checks the CUPTI version and
  // registers the buffer callbacks. Returns false (and marks the ring failed) when CUPTI cannot
  // be used.
  bool Setup();

  // Enables the activity kinds for capture `seq`. Returns false when tracing is off for good.
  bool Enable(uint64_t seq, const RecorderConfig& config);
  // Flushes every record of the capture into the ring, disables the kinds, and reports the
  // capture flushed.
  void Disable();
  // Hands CUPTI's buffers over while a capture runs (when the injection is configured to flush
  // periodically).
  void Flush();

  bool armed() const { return armed_; }
  bool failed() const { return failed_; }

  // CUPTI's buffer callbacks. They find the recorder through a process-wide pointer: CUPTI's C
  // callbacks carry no user data, and one recorder exists per process.
  static void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_num_records);
  static void CUPTIAPI BufferCompleted(CUcontext context, uint32_t stream_id, uint8_t* buffer,
                                       size_t size, size_t valid_size);

  // Records converted so far (for tests and benchmarks).
  uint64_t records_written() const { return written_.load(std::memory_order_relaxed); }

 private:
  void HandleBuffer(uint8_t* buffer, size_t valid_size);
  // One activity record into `out`; false when it is not kept (a kind not recorded, over its
  // cap, or an NVTX marker that does not end a range).
  bool Convert(const CUpti_Activity& record, shm::GpuRecord* out);
  // Counts a record against its cap (API calls or device activity); false beyond it.
  bool Take(bool api);
  // (Kernel9: the kernel record every supported CUDA version writes a prefix of, cupti_recorder.cc)
  void FillKernel(const CUpti_ActivityKernel9& k, shm::GpuRecord* out);
  void FillApi(const CUpti_ActivityAPI& a, bool runtime, shm::GpuRecord* out);
  // A start marker opens its range; the end marker of an open one fills `out` and is true.
  bool EndNvtxRange(const CUpti_ActivityMarker2& m, shm::GpuRecord* out);
  // Appends a kClock record pairing CUPTI's timestamp with the wall clock.
  void AddClockRecord();
  void FillDeviceTable();
  uint32_t ApiName(CUpti_CallbackDomain domain, uint32_t cbid);
  // Marks the ring failed with `what` failed because of `result`, and a hint how to fix it.
  void Fail(const std::string& what, CUptiResult result);
  std::string ResultText(CUptiResult result);

  CuptiApi& api_;
  shm::GpuRingWriter& ring_;
  const WallClockFn wall_ns_;
  const SleepFn sleep_;

  RecorderConfig config_;
  // What CUPTI's threads read of the configuration, set at Enable.
  std::atomic<size_t> buffer_bytes_{RecorderConfig().buffer_bytes};
  std::atomic<uint64_t> max_activity_events_{shm::kDefaultGpuMaxEvents};
  std::atomic<uint64_t> max_api_events_{shm::kDefaultGpuMaxEvents};
  std::atomic<int64_t> ring_wait_us_{RecorderConfig().ring_wait_us};
  std::vector<CUpti_ActivityKind> enabled_;
  bool setup_done_ = false;
  bool devices_done_ = false;
  bool armed_ = false;
  bool failed_ = false;
  uint64_t seq_ = 0;

  std::atomic<uint64_t> activity_count_{0};
  std::atomic<uint64_t> api_count_{0};
  std::atomic<uint64_t> written_{0};
  struct OpenRange {
    uint64_t start;
    uint32_t name_id;
    uint32_t domain_id;
    uint32_t thread_id;
  };
  std::mutex ranges_mu_;  // guards open_ranges_: NVTX ranges whose end marker has not come
  std::unordered_map<uint32_t, OpenRange> open_ranges_;
  std::mutex names_mu_;  // guards api_names_
  std::unordered_map<uint64_t, uint32_t> api_names_;
};

}  // namespace clusterprof::cupti

#endif  // CLUSTERPROF_SDK_CUPTI_CUPTI_RECORDER_H_
