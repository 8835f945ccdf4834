// The interface every tracer hosted by the sidecar implements (docs/architecture.md, "Sidecar
// side"). A capture session calls, in order and from one thread:
//
//   Start(window)  ->  Stop()  ->  CollectInto(space, stats)
//
// A tracer that cannot record (no instrumented process, CUPTI refused, ...) returns an error from
// Start; the session turns it into a warning in XSpace.warnings and carries on with the others.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_TRACER_H_
#define CLUSTERPROF_SIDECAR_TRACERS_TRACER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace tensorflow {
class ProfileOptions;
}  // namespace tensorflow
namespace tensorflow::profiler {
class XSpace;
}  // namespace tensorflow::profiler

namespace clusterprof::sidecar {

// What a capture asks of the tracers: levels from ProfileOptions (0 = off) and the window.
struct CaptureWindow {
  // Wall clock, ns since the Unix epoch: the instant the tracers start, and the planned stop
  // (Terminate or a cancelled client may end the capture earlier).
  int64_t start_ns = 0;
  int64_t planned_stop_ns = 0;
  uint32_t host_tracer_level = 0;
  uint32_t device_tracer_level = 0;
  uint32_t python_tracer_level = 0;
  // Most events a tracer keeps; 0 = its own default. Beyond it events are dropped and counted.
  uint64_t max_events = 0;
  // GPU tracing, from advanced_configuration (0 = the default, 2*1024*1024 as upstream):
  // gpu_max_activity_api_events, gpu_max_callback_api_events, gpu_enable_nvtx_tracking.
  uint64_t gpu_max_activity_events = 0;
  uint64_t gpu_max_api_events = 0;
  bool gpu_nvtx = false;
  // The CUDA calls recorded on the host side (advanced_configuration clusterprof_gpu_api_tracing).
  bool gpu_runtime_api = true;
  bool gpu_driver_api = true;
  // The request's options as given (upstream defaults applied for version 0), for tracers that
  // pass them on (the framework proxy). May be null.
  std::shared_ptr<const tensorflow::ProfileOptions> options;
};

struct TracerStats {
  uint64_t events = 0;
  // Events lost anywhere between the workload and the XSpace (full rings, caps).
  uint64_t dropped_events = 0;
};

// Readiness as GetInfo reports it.
struct TracerStatus {
  bool ready = false;
  std::string reason;
};

class Tracer {
 public:
  virtual ~Tracer() = default;

  // "annotations", "gpu", "framework", "system_metrics".
  virtual std::string_view name() const = 0;
  // Whether this tracer takes part in a capture with these levels.
  virtual bool EnabledFor(const CaptureWindow& window) const = 0;
  virtual TracerStatus Status() const = 0;

  // Slow setup, called before the session waits for the start instant (window.start_ns is the
  // requested start then, or 0 for "at once"). Optional: Start must work without it.
  virtual absl::Status Prepare(const CaptureWindow& window) { return absl::OkStatus(); }
  // Begins recording; called at window.start_ns. Keep it quick: every sidecar on a machine runs
  // its Start at the same instant.
  virtual absl::Status Start(const CaptureWindow& window) = 0;
  // Ends recording at `stop_ns` (wall clock); what was recorded until then is kept.
  virtual absl::Status Stop(int64_t stop_ns) = 0;
  // Adds what was recorded to `space` and counts it into `stats`. Warnings go into
  // space->warnings().
  virtual absl::Status CollectInto(tensorflow::profiler::XSpace* space, TracerStats* stats) = 0;
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_TRACER_H_
