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
#include "sidecar/sdk/control_page.h"
#include "sidecar/sdk/shm_format.h"
#include "sidecar/tracers/block_buffer.h"
#include "sidecar/tracers/gpu_metrics.h"
#include "sidecar/tracers/gpu_ring_reader.h"
#include "sidecar/tracers/tracer.h"

namespace clusterprof::sidecar {

class GpuTracer final : public Tracer {
 public:
  struct Options {
    // The shared-memory directory ($CLUSTERPROF_DIR of the workloads).
    std::string dir = shm::kDefaultDir;
    std::string proc_root = "/proc";
    // How often rings are drained during a capture (a ring holds 131072 records by default).
    int64_t drain_interval_ms = 10;
    // How long Stop waits for each process to hand over its last records.
    int64_t flush_timeout_ms = 3000;
    // Records kept per capture in the sidecar, all processes together (64 bytes each).
    uint64_t max_records = 8'000'000;
    // Times the flush wait; nullptr: the system clocks.
    Clock* clock = nullptr;
  };

  // `control` is the pod's control page (the annotation tracer's); it must outlive the tracer.
  // `metrics` (NVML counters) may be null.
  static absl::StatusOr<std::unique_ptr<GpuTracer>> Create(
      Options options, shm::ControlWriter* control, std::unique_ptr<GpuMetricsSampler> metrics);
  ~GpuTracer() override;

  std::string_view name() const override { return "gpu"; }
  bool EnabledFor(const CaptureWindow& window) const override {
    return window.device_tracer_level >= 1;
  }
  TracerStatus Status() const override;
  // Arms the processes ahead of the start, so CUPTI is recording when the window opens.
  absl::Status Prepare(const CaptureWindow& window) override;
  absl::Status Start(const CaptureWindow& window) override;
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

  GpuTracer(Options options, shm::ControlWriter* control,
            std::unique_ptr<GpuMetricsSampler> metrics);
  void ArmLocked(const CaptureWindow& window) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefreshRingsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DrainLoop();
  void ReleaseRingsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  Clock* const clock_;
  shm::ControlWriter* const control_;
  const std::unique_ptr<GpuMetricsSampler> metrics_;

  Mutex mu_;
  std::map<std::string, Ring> rings_ ABSL_GUARDED_BY(mu_);
  CaptureWindow window_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  bool metrics_started_ ABSL_GUARDED_BY(mu_) = false;
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
