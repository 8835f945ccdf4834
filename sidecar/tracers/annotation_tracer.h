// The annotation tracer: arms the control page for a capture, drains the shared-memory rings of
// every process that uses libclusterprof_annotate while it runs, and turns the records into the
// `/host:CPU` plane: one line per thread, TraceMe names decoded into stats, async begin/end pairs
// on lanes of their own. Rings of processes that are gone are removed after their last drain.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_ANNOTATION_TRACER_H_
#define CLUSTERPROF_SIDECAR_TRACERS_ANNOTATION_TRACER_H_

#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "sidecar/sdk/control_page.h"
#include "sidecar/sdk/shm_format.h"
#include "sidecar/tracers/block_buffer.h"
#include "sidecar/tracers/ring_reader.h"
#include "sidecar/tracers/shm_transport.h"
#include "sidecar/tracers/tracer.h"

namespace clusterprof::sidecar {

class AnnotationTracer final : public Tracer {
 public:
  struct Options {
    // How often rings are drained during a capture. A 16384-record ring absorbs 3 M events/s
    // from one thread at the default.
    int64_t drain_interval_ms = 5;
    // Events kept per capture when the request does not say (64 bytes each while capturing).
    uint64_t default_max_events = 4'000'000;
  };

  // Arms the host part of `shm`'s control page and reads its annotation rings; `shm` must outlive
  // the tracer.
  static absl::StatusOr<std::unique_ptr<AnnotationTracer>> Create(ShmTransport* shm,
                                                                  Options options);
  ~AnnotationTracer() override;

  std::string_view name() const override { return "annotations"; }
  bool EnabledFor(const tensorflow::ProfileOptions& options) const override {
    return options.host_tracer_level() >= 1;
  }
  TracerStatus Status() const override;
  // Finds the rings before the start instant, so Start itself is cheap.
  absl::Status Prepare(const CaptureWindow& window, const CaptureConfig& config) override;
  absl::Status Start(const CaptureWindow& window, const CaptureConfig& config) override;
  absl::Status Stop(int64_t stop_ns) override;
  absl::Status CollectInto(tensorflow::profiler::XSpace* space, TracerStats* stats) override;

  // Drains every ring once (the background thread does this during a capture); returns the
  // records read. For benchmarks and tests.
  uint64_t DrainOnce();

 private:
  struct ThreadEvents {
    uint32_t tid = 0;
    std::string name;
    BlockBuffer<shm::Record> records;
  };
  struct Ring {
    std::unique_ptr<shm::RingReader> reader;
    std::vector<ThreadEvents> threads;  // by slot index
    uint64_t dropped = 0;               // by the producer (ring full)
  };

  AnnotationTracer(ShmTransport* shm, Options options);
  void PrepareLocked(const CaptureWindow& window, const CaptureConfig& config)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DrainLoop();

  const Options options_;
  ShmTransport* const shm_;

  Mutex mu_;
  RingSet<Ring> rings_ ABSL_GUARDED_BY(mu_);
  CaptureWindow window_ ABSL_GUARDED_BY(mu_);
  int64_t stop_ns_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t max_events_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t kept_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t capped_ ABSL_GUARDED_BY(mu_) = 0;  // dropped because max_events was reached
  std::vector<std::string> open_errors_ ABSL_GUARDED_BY(mu_);
  uint32_t host_level_ ABSL_GUARDED_BY(mu_) = 0;
  bool prepared_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread drainer_;
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_ANNOTATION_TRACER_H_
