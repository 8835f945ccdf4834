// The annotation tracer: arms the control page for a capture, drains the shared-memory rings of
// every process that uses libclusterprof_annotate while it runs, and turns the records into the
// `/host:CPU` plane: one line per thread, TraceMe names decoded into stats, async begin/end pairs
// on lanes of their own. Rings of processes that are gone are removed after their last drain.
//
// Between captures it is the flight recorder (docs/triggers.md): the control page stays armed at
// the recorder's level, the rings are drained every recorder_drain_interval_ms, every record goes
// to the live step telemetry and is kept for recorder_window_ms (within recorder_max_bytes), so
// that a capture asking for a lookback (advanced_configuration clusterprof_lookback_ms) starts
// with the annotations of the seconds before its start instant.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_ANNOTATION_TRACER_H_
#define CLUSTERPROF_SIDECAR_TRACERS_ANNOTATION_TRACER_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "sdk/control_page.h"
#include "sdk/shm_format.h"
#include "sidecar/tracers/block_buffer.h"
#include "sidecar/tracers/record_window.h"
#include "sidecar/tracers/ring_reader.h"
#include "sidecar/tracers/shm_transport.h"
#include "sidecar/tracers/step_telemetry.h"
#include "sidecar/tracers/tracer.h"

namespace clusterprof::xspace {
class XPlaneBuilder;
}  // namespace clusterprof::xspace

namespace clusterprof::sidecar {

class LineIds;

// The span of a capture's events: from its start (less the lookback) to its stop, in ns.
struct EventWindow {
  int64_t start_ns = 0;
  int64_t stop_ns = 0;
};

class AnnotationTracer final : public Tracer {
 public:
  struct Options {
    // How often rings are drained during a capture. A 16384-record ring absorbs 3 M events/s
    // from one thread at the default.
    int64_t drain_interval_ms = 5;
    // Events kept per capture when the request does not say (64 bytes each while capturing).
    uint64_t default_max_events = 4'000'000;
    // The flight recorder. The host level armed between captures: 0 arms nothing then (no
    // live steps, no lookback), as before there was a recorder.
    uint32_t recorder_level = 2;
    // How long annotations are kept for a lookback; 0 keeps none (live steps still work).
    int64_t recorder_window_ms = 30'000;
    // Most memory the kept annotations take (64 bytes a record); past it the oldest go first.
    uint64_t recorder_max_bytes = uint64_t{64} << 20;
    // How often rings are drained between captures: each drain is a wake-up every injected pod
    // pays; a 65536-record ring absorbs 650,000 events/s from one thread at the default.
    int64_t recorder_drain_interval_ms = 100;
    // Fed with every record drained; may be null.
    StepTelemetry* telemetry = nullptr;
    // The wall clock (ns since the epoch) for the window's age; tests replace it.
    std::function<int64_t()> now_ns;
  };

  // Arms the host part of `shm`'s control page and reads its annotation rings; `shm` must outlive
  // the tracer.
  static absl::StatusOr<std::unique_ptr<AnnotationTracer>> Create(ShmTransport* shm,
                                                                  Options options);
  ~AnnotationTracer() override;

  std::string_view name() const override { return "annotations"; }
  // clusterprof_lookback_ms.
  std::vector<std::string_view> OwnedKeys() const override;
  absl::Status Validate(const tensorflow::ProfileOptions& options) const override;
  bool EnabledFor(const tensorflow::ProfileOptions& options) const override {
    return options.host_tracer_level() >= 1;
  }
  TracerStatus Status() const override;
  // Finds the rings before the start instant, so Start itself is cheap.
  absl::Status Prepare(const CaptureWindow& window, const CaptureConfig& config) override;
  absl::Status Start(const CaptureWindow& window, const CaptureConfig& config) override;
  // The requested start instant when the recorder holds everything since then at the capture's
  // level; else the wake-up (window.start_ns).
  int64_t DataStartNs(const CaptureWindow& window) const override;
  absl::Status Stop(int64_t stop_ns) override;
  absl::Status CollectInto(tensorflow::profiler::XSpace* space, TracerStats* stats) override;

  // Drains every ring once (the background thread does this during a capture and, with the
  // recorder on, between captures); returns the records read. For benchmarks and tests.
  uint64_t DrainOnce();

  // What the flight recorder holds now.
  struct RecorderStatus {
    bool on = false;
    uint32_t level = 0;
    int64_t window_ms = 0;
    uint64_t records = 0;
    uint64_t bytes = 0;
    // How far back it reaches now (0 when empty): the oldest instant it holds everything from.
    int64_t covered_since_ns = 0;
  };
  RecorderStatus Recorder() const;

 private:
  struct ThreadEvents {
    uint32_t tid = 0;
    std::string name;
    BlockBuffer<shm::Record> records;  // this capture's
    RecordWindow kept;                 // the recorder's
  };
  struct Ring {
    std::unique_ptr<shm::RingReader> reader;
    std::vector<ThreadEvents> threads;  // by slot index
    uint64_t dropped = 0;               // in this capture, by the producer (ring full)
    StepTelemetry::RingNames names;     // for the telemetry
    bool writer_gone = false;           // drained after its writer ended
  };

  AnnotationTracer(ShmTransport* shm, Options options);
  bool recorder_on() const { return options_.recorder_level > 0; }
  int64_t NowNs() const;
  void PrepareLocked(const CaptureWindow& window, const CaptureConfig& config)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the recorder holds every record since `since_ns` at `level` (nothing let go, no ring
  // full between drains since then).
  bool RecorderCoversLocked(int64_t since_ns, uint32_t level, int64_t now_ns) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies what the recorder kept from the data start (less the lookback) into the capture
  // (once, before the capture's first drain).
  void TakeLookbackLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lets go what is older than the window or beyond the memory bound.
  void TrimRecorderLocked(int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the rings of processes that have ended once their kept records have aged out, and
  // deletes their files. Not during a capture.
  void CloseEndedRingsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One process's ring into the capture: a line a thread, its async events on lanes of their
  // own, what it lost as warnings. Returns the events added.
  uint64_t AddRingLocked(Ring& ring, const EventWindow& window, xspace::XPlaneBuilder& plane,
                         LineIds& line_ids, tensorflow::profiler::XSpace* space)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WarnOfAnEmptyCaptureLocked(uint64_t events, tensorflow::profiler::XSpace* space)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ArmIdleLevel();
  void DrainLoop();

  const Options options_;
  ShmTransport* const shm_;

  mutable Mutex mu_;
  RingSet<Ring> rings_ ABSL_GUARDED_BY(mu_);
  CaptureWindow window_ ABSL_GUARDED_BY(mu_);
  // Where the capture's own window begins (before any lookback): the requested start instant
  // when the recorder covers it, else the wake-up. Set by Start.
  int64_t data_start_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t stop_ns_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t max_events_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t kept_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t capped_ ABSL_GUARDED_BY(mu_) = 0;  // dropped because max_events was reached
  std::vector<std::string> open_errors_ ABSL_GUARDED_BY(mu_);
  uint32_t host_level_ ABSL_GUARDED_BY(mu_) = 0;
  // The capture's lookback: asked, and reached (set when it is taken).
  int64_t lookback_asked_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t lookback_ns_ ABSL_GUARDED_BY(mu_) = 0;
  bool lookback_pending_ ABSL_GUARDED_BY(mu_) = false;
  std::string lookback_warning_ ABSL_GUARDED_BY(mu_);
  uint64_t lookback_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  // The recorder: records kept, since when it holds everything (it started, or the memory bound
  // let newer records go than the window would), and producer drops (drain time, count).
  uint64_t kept_records_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t recorder_since_ns_ ABSL_GUARDED_BY(mu_) = 0;
  bool recorder_trimmed_for_memory_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::pair<int64_t, uint64_t>> recorder_drops_ ABSL_GUARDED_BY(mu_);
  bool prepared_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread drainer_;
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_ANNOTATION_TRACER_H_
