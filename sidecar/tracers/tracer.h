// The interface every tracer hosted by the sidecar implements (docs/architecture.md, "Sidecar
// side"). When a Profile request arrives, every tracer checks the advanced_configuration keys it
// owns (Validate); a key no tracer owns is named in a warning. A capture session then calls, in
// order and from one thread:
//
//   Prepare(window, config)  ->  Start(window, config)  ->  Stop()  ->  CollectInto(space, stats)
//
// on the tracers that are EnabledFor the request's options. A tracer that cannot record (no
// instrumented process, CUPTI refused, ...) returns an error from Start; the session turns it
// into a warning in XSpace.warnings and carries on with the others.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_TRACER_H_
#define CLUSTERPROF_SIDECAR_TRACERS_TRACER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "tsl/profiler/protos/profiler_options.pb.h"

namespace tensorflow::profiler {
class XSpace;
}  // namespace tensorflow::profiler

namespace clusterprof::sidecar {

// When a capture records. Wall clock, ns since the Unix epoch: the instant the tracers start (the
// sidecar's wake-up), and the planned stop (Terminate or a cancelled client may end the capture
// earlier).
struct CaptureWindow {
  int64_t start_ns = 0;
  int64_t planned_stop_ns = 0;
  // The start instant the request asked for (start_timestamp_ns) when the sidecar waited for it,
  // at or before start_ns: a tracer that holds what happened before its Start (the flight
  // recorder) begins its data there, whatever the wake-up's delay. 0 when the request asked for
  // no instant, or one already past when it arrived.
  int64_t requested_start_ns = 0;
};

// What a capture asks of the tracers: the ProfileOptions of the request as the client sent them
// (upstream's defaults for version 0, duration_ms filled in), read by each tracer for its own
// level and keys, and ProfileRequest.max_events.
struct CaptureConfig {
  tensorflow::ProfileOptions options;
  // Most events a tracer keeps; 0 = its own default. Beyond it events are dropped and counted.
  uint64_t max_events = 0;
};

struct TracerStats {
  uint64_t events = 0;
  // Events lost anywhere between the workload and the XSpace (full rings, caps).
  uint64_t dropped_events = 0;
  // How far before the start instant the trace reaches (the flight recorder's lookback); 0 when
  // none was asked or none was kept.
  int64_t lookback_ns = 0;
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
  // The advanced_configuration keys this tracer reads.
  virtual std::vector<std::string_view> OwnedKeys() const { return {}; }
  // Whether it hands the whole ProfileOptions on (the framework proxy), so that no key is
  // unknown while it takes part.
  virtual bool ForwardsOptions() const { return false; }
  // Checks the values of this tracer's keys in `options`, before anything starts: an error is
  // INVALID_ARGUMENT and names the key and what it must be.
  virtual absl::Status Validate(const tensorflow::ProfileOptions& options) const {
    return absl::OkStatus();
  }
  // Whether this tracer takes part in a capture with these options (its level is not 0).
  virtual bool EnabledFor(const tensorflow::ProfileOptions& options) const = 0;
  virtual TracerStatus Status() const = 0;

  // Slow setup, called before the session waits for the start instant (window.start_ns is the
  // requested start then, or 0 for "at once"). Optional: Start must work without it.
  virtual absl::Status Prepare(const CaptureWindow& window, const CaptureConfig& config) {
    return absl::OkStatus();
  }
  // Begins recording; called at window.start_ns. Keep it quick: every sidecar on a machine runs
  // its Start at the same instant.
  virtual absl::Status Start(const CaptureWindow& window, const CaptureConfig& config) = 0;
  // Where this capture's data from this tracer begins, asked once Start succeeded (window as
  // given to Start; a lookback is not counted): window.start_ns for a tracer that records from
  // its Start (the default); as early as window.requested_start_ns for one that reaches back; 0
  // for one that has nothing to record from its Start (no source attached), so that it does not
  // hold the capture's start back.
  virtual int64_t DataStartNs(const CaptureWindow& window) const { return window.start_ns; }
  // Ends recording at `stop_ns` (wall clock); what was recorded until then is kept.
  virtual absl::Status Stop(int64_t stop_ns) = 0;
  // Adds what was recorded to `space` and counts it into `stats`. Warnings go into
  // space->warnings().
  virtual absl::Status CollectInto(tensorflow::profiler::XSpace* space, TracerStats* stats) = 0;
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_TRACER_H_
