// The GPU tracer: arms GPU tracing on the control page for a capture, drains the GPU rings that
// libclusterprof_cupti writes in every CUDA process of the pod, and builds the /device:GPU:<n>
// planes (gpu_xplane.h); with NVML available, adds the GPUs' utilization, memory, power and
// clock counters (gpu_metrics.h). A process whose CUPTI refused, a ring that overflowed or a
// process that did not flush in time becomes a warning in the XSpace, never a failed capture.
// Thread-safe: the session calls Prepare/Start/Stop/CollectInto from one thread while a drainer
// thread of its own empties the rings.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_GPU_TRACER_H_
#define CLUSTERPROF_SIDECAR_TRACERS_GPU_TRACER_H_

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "sdk/control_page.h"
#include "sdk/shm_format.h"
#include "sidecar/tracers/block_buffer.h"
#include "sidecar/tracers/gpu_metrics.h"
#include "sidecar/tracers/gpu_ring_reader.h"
#include "sidecar/tracers/shm_transport.h"
#include "sidecar/tracers/tracer.h"

namespace clusterprof::sidecar {

// The advanced_configuration keys the GPU tracer owns. Upstream's (int64, int64, bool):
inline constexpr char kGpuMaxActivityEventsKey[] = "gpu_max_activity_api_events";
inline constexpr char kGpuMaxApiEventsKey[] = "gpu_max_callback_api_events";
inline constexpr char kGpuEnableNvtxKey[] = "gpu_enable_nvtx_tracking";
// Ours: which CUDA calls are recorded beside the GPU activity, a string_value of "runtime,driver"
// (the default), "runtime", "driver" or "none".
inline constexpr char kGpuApiTracingKey[] = "clusterprof_gpu_api_tracing";

// What a request asks of the GPU tracer.
struct GpuCaptureOptions {
  uint32_t level = 0;  // device_tracer_level
  // Records per process; 0 = the default, 2*1024*1024 as upstream.
  uint64_t max_activity_events = 0;
  uint64_t max_api_events = 0;
  bool nvtx = false;
  bool runtime_api = true;
  bool driver_api = true;
};

// Reads the GPU options of `options`, typed as upstream types them; a value of another type, or
// a cap that is not positive, is INVALID_ARGUMENT naming the key.
absl::StatusOr<GpuCaptureOptions> ParseGpuCaptureOptions(const tensorflow::ProfileOptions& options);

class NvmlApi;

// NVIDIA devices visible here: NVML lists one, or the driver exposes /dev/nvidia<N> or
// /proc/driver/nvidia/gpus entries. `nvml` may be null.
bool HostHasNvidiaDevices(NvmlApi* nvml);

class GpuTracer final : public Tracer {
 public:
  struct Options {
    // How often rings are drained during a capture (a ring holds 131072 records by default).
    int64_t drain_interval_ms = 10;
    // How long Stop waits for each process to hand over its last records.
    int64_t flush_timeout_ms = 3000;
    // Records kept per capture in the sidecar, all processes together (64 bytes each).
    uint64_t max_records = 8'000'000;
    // Times the flush wait; nullptr: the system clocks.
    Clock* clock = nullptr;
    // Whether this host (or pod) has NVIDIA devices (HostHasNvidiaDevices). Without them, a
    // capture with no CUDA process is no surprise: it carries no warning unless the request
    // asked for GPU tracing by one of the tracer's own keys.
    bool host_has_gpus = true;
  };

  // Arms the device part of `shm`'s control page and reads its GPU rings; `shm` must outlive the
  // tracer. `metrics` (NVML counters) may be null.
  static absl::StatusOr<std::unique_ptr<GpuTracer>> Create(
      ShmTransport* shm, Options options, std::unique_ptr<GpuMetricsSampler> metrics);
  ~GpuTracer() override;

  std::string_view name() const override { return "gpu"; }
  std::vector<std::string_view> OwnedKeys() const override;
  absl::Status Validate(const tensorflow::ProfileOptions& options) const override;
  bool EnabledFor(const tensorflow::ProfileOptions& options) const override {
    return options.device_tracer_level() >= 1;
  }
  TracerStatus Status() const override;
  // Arms the processes ahead of the start, so CUPTI is recording when the window opens.
  absl::Status Prepare(const CaptureWindow& window, const CaptureConfig& config) override;
  absl::Status Start(const CaptureWindow& window, const CaptureConfig& config) override;
  // CUPTI and the GPU counters record from the start only: window.start_ns while a CUDA process
  // is attached or the counters run, else 0 (nothing of this tracer's holds the start back).
  int64_t DataStartNs(const CaptureWindow& window) const override;
  absl::Status Stop(int64_t stop_ns) override;
  absl::Status CollectInto(tensorflow::profiler::XSpace* space, TracerStats* stats) override;

  // Drains every ring once; returns the records read. For tests and benchmarks.
  uint64_t DrainOnce();

 private:
  struct Ring {
    std::unique_ptr<shm::GpuRingReader> reader;
    BlockBuffer<shm::GpuRecord> records;
    uint64_t dropped_before = 0;  // ring drops before this capture
  };

  GpuTracer(ShmTransport* shm, Options options, std::unique_ptr<GpuMetricsSampler> metrics);
  void ArmLocked(const CaptureWindow& window, const CaptureConfig& config)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens the GPU rings not open yet.
  void RefreshRingsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DrainLoop();

  const Options options_;
  Clock* const clock_;
  ShmTransport* const shm_;
  const std::unique_ptr<GpuMetricsSampler> metrics_;

  mutable Mutex mu_;
  RingSet<Ring> rings_ ABSL_GUARDED_BY(mu_);
  CaptureWindow window_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  bool metrics_started_ ABSL_GUARDED_BY(mu_) = false;
  // The capture's request set one of OwnedKeys(): GPU tracing asked for by name.
  bool asked_for_gpu_ ABSL_GUARDED_BY(mu_) = false;
  int64_t stop_ns_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t kept_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t capped_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> warnings_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread drainer_;
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_GPU_TRACER_H_
