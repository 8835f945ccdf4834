// GPU counters from NVML: utilization, memory, power and SM clock of every GPU the sidecar sees,
// sampled on a fixed interval during a capture and written as counter lines of the
// `/device:GPU:<n>` planes.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_GPU_METRICS_H_
#define CLUSTERPROF_SIDECAR_TRACERS_GPU_METRICS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "sidecar/tracers/nvml_api.h"

namespace tensorflow::profiler {
class XSpace;
}  // namespace tensorflow::profiler

namespace clusterprof::sidecar {

// Upstream XLA's convention for counters on a device plane: a line with id INT64_MAX named
// "_counters_", one zero-duration event per sample whose metadata name is the counter's and
// whose stat of that same name holds the value.
inline constexpr int64_t kUpstreamCounterLineId = std::numeric_limits<int64_t>::max();

// The counters (event metadata and stat names).
inline constexpr std::string_view kGpuUtilizationPercent = "gpu_utilization_percent";
inline constexpr std::string_view kMemoryUtilizationPercent = "memory_utilization_percent";
inline constexpr std::string_view kMemoryUsedBytes = "memory_used_bytes";
inline constexpr std::string_view kPowerWatts = "power_watts";
inline constexpr std::string_view kSmClockMhz = "sm_clock_mhz";

// Samples every GPU NVML lists, on a background thread between Start and Stop (or once per
// SampleOnce call), keeps the samples in memory up to a cap, and writes those inside the capture
// window into an XSpace.
//
// Each device is listed once, on the first Prepare, Start or SampleOnce; the list is kept for the
// sampler's life. A query a device does not support (NVML_ERROR_NOT_SUPPORTED) is skipped for
// that device from then on, silently; other NVML errors skip the value and become one warning
// per distinct message in the XSpace. Beyond Options::max_samples samples are dropped and
// counted.
//
// Thread-safe. Start and Stop pair up: Start while sampling is a bug (CHECK).
class GpuMetricsSampler {
 public:
  struct Options {
    // Time between samples. NVML's utilization figures are themselves averages over 1/6 s to
    // 1 s, by product; memory, power and clocks are current values.
    int64_t interval_ms = 20;
    // Samples (one device at one instant) kept per capture: 100000 samples are 500000 events,
    // half of what the trace viewer shows.
    size_t max_samples = 100'000;
  };

  // What CollectInto wrote.
  struct CollectResult {
    uint64_t events = 0;
    // Samples lost to Options::max_samples in this capture.
    uint64_t dropped_samples = 0;
  };

  // `nvml` and `clock` must outlive the sampler.
  GpuMetricsSampler(NvmlApi& nvml, Clock& clock, Options options);
  GpuMetricsSampler(const GpuMetricsSampler&) = delete;
  GpuMetricsSampler& operator=(const GpuMetricsSampler&) = delete;
  // Stops the sampling thread if it runs.
  ~GpuMetricsSampler();

  // Lists the devices now (slow NVML calls), so that Start is quick. Optional. Fails when NVML
  // cannot list them or lists none; the caller decides whether that is worth a warning.
  absl::Status Prepare();
  // Forgets the previous capture's samples and warnings and starts sampling: at once, then every
  // interval (on the Clock's monotonic time). Only samples at or after `start_ns` (wall clock)
  // are collected. Fails, without sampling, as Prepare does.
  absl::Status Start(int64_t start_ns);
  // Stops sampling and waits for the thread to end. Only samples at or before `stop_ns` (wall
  // clock) are collected.
  void Stop(int64_t stop_ns);

  // Takes one sample of every device now, stamped with the Clock's wall time. The background
  // thread calls it; tests call it directly.
  void SampleOnce();

  // Adds the samples inside the window (all of them before the first Start) to `space`. Each
  // device's go to the counter line of plane `/device:GPU:<n>` (created if absent), where n is
  // ordinal_by_uuid[the device's UUID] (the CUDA ordinal, as the GPU activity tracer numbers its
  // planes); a device not in the map keeps its NVML index when no mapped device has that number,
  // else takes the lowest free number. Adds nothing else to the planes. Warnings go to
  // space->warnings(), each distinct one once.
  CollectResult CollectInto(tensorflow::profiler::XSpace* space,
                            const absl::flat_hash_map<std::string, int>& ordinal_by_uuid);

  // Samples kept in this capture.
  size_t sample_count() const;

 private:
  // The NVML queries, as bits of Device::unsupported and Sample::present.
  enum Query : uint8_t {
    kUtilizationQuery = 1 << 0,
    kMemoryQuery = 1 << 1,
    kPowerQuery = 1 << 2,
    kClockQuery = 1 << 3,
  };

  struct Device {
    int index = 0;
    // How warnings name the device: its UUID and product name when NVML told them.
    std::string label;
    // Queries NVML said the device does not support: not asked again.
    uint8_t unsupported = 0;
  };

  // One device at one instant; 40 bytes, the raw NVML figures.
  struct Sample {
    int64_t time_ns = 0;
    int device = 0;
    uint8_t present = 0;  // the Query bits that have values
    uint32_t gpu_percent = 0;
    uint32_t memory_percent = 0;
    uint32_t power_milliwatts = 0;
    uint32_t sm_clock_mhz = 0;
    uint64_t memory_used_bytes = 0;
  };

  absl::Status ListDevicesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sample_mu_);
  // Reads the values of `device` into `sample`; appends errors other than "not supported".
  void ReadDeviceLocked(Device& device, Sample* sample, std::vector<std::string>* errors)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sample_mu_);
  void AddWarningLocked(std::string message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopThread() ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  void Run();

  NvmlApi& nvml_;
  Clock& clock_;
  const Options options_;

  // Lock order: run_mu_, then sample_mu_, then mu_.
  //
  // Held by Start and Stop throughout, so they never overlap.
  Mutex run_mu_;
  std::thread thread_ ABSL_GUARDED_BY(run_mu_);
  // Tells the thread to end; set under run_mu_, read by the thread and the Clock.
  std::atomic<bool> stop_{false};

  // Serializes the NVML queries (the thread and SampleOnce callers) without blocking
  // CollectInto, which only needs mu_.
  Mutex sample_mu_;
  bool listed_ ABSL_GUARDED_BY(sample_mu_) = false;
  std::vector<Device> devices_ ABSL_GUARDED_BY(sample_mu_);

  mutable Mutex mu_;
  // By NVML index; empty where NVML did not tell.
  std::vector<std::string> uuids_ ABSL_GUARDED_BY(mu_);
  std::vector<Sample> samples_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t start_ns_ ABSL_GUARDED_BY(mu_) = std::numeric_limits<int64_t>::min();
  int64_t stop_ns_ ABSL_GUARDED_BY(mu_) = std::numeric_limits<int64_t>::max();
  // Distinct messages in the order they first occurred.
  std::vector<std::string> warnings_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> warning_set_ ABSL_GUARDED_BY(mu_);
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_GPU_METRICS_H_
