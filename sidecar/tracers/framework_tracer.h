// The framework proxy: forwards a capture to the workload's own TF/JAX profiler server
// (`--framework-profiler=host:port`, what `jax.profiler.start_server(port)` or
// `tf.profiler.experimental.server.start(port)` serves) and merges the XSpace it returns into
// the capture: the only way to get TPU activity, XLA ops and the Python tracer into the same
// synchronized window as everything else (docs/frameworks.md).
//
// The request carries the capture's start_timestamp_ns, duration, tracer levels and
// advanced_configuration (our own clusterprof_* keys left out) and asks for emit_xspace. An
// older server that ignores emit_xspace writes its file under repository_root, which points into
// a private directory of the sidecar's spool; the file is read from there and removed.
//
// A framework server that is absent, busy ("Another profiling session active."), slow or failing
// becomes a warning; it never fails the capture of the other tracers. Thread-safe: the session
// drives it from one thread while the call runs on another.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_FRAMEWORK_TRACER_H_
#define CLUSTERPROF_SIDECAR_TRACERS_FRAMEWORK_TRACER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "sidecar/tracers/framework_client.h"
#include "sidecar/tracers/tracer.h"

namespace tensorflow {
class ProfileResponse;
}  // namespace tensorflow

namespace clusterprof::sidecar {

class FrameworkTracer final : public Tracer {
 public:
  struct Options {
    // host:port of the framework's ProfilerService.
    std::string address;
    // How it is called (framework_client.h); null: gRPC to `address`.
    std::shared_ptr<FrameworkClient> client;
    // A directory of the sidecar's own: older servers write their file under it.
    std::string work_dir;
    // How long after the planned stop the framework's answer is awaited (a large XSpace takes a
    // while to serialize and send).
    int64_t grace_ms = 30'000;
  };

  static absl::StatusOr<std::unique_ptr<FrameworkTracer>> Create(Options options);
  ~FrameworkTracer() override;

  std::string_view name() const override { return "framework"; }
  // The framework's profiler reads the request's options itself.
  bool ForwardsOptions() const override { return true; }
  bool EnabledFor(const tensorflow::ProfileOptions& options) const override {
    return options.host_tracer_level() >= 1 || options.device_tracer_level() >= 1 ||
           options.python_tracer_level() >= 1;
  }
  TracerStatus Status() const override;
  // Sends the request ahead of the start instant, so the framework waits for the same instant.
  absl::Status Prepare(const CaptureWindow& window, const CaptureConfig& config) override;
  absl::Status Start(const CaptureWindow& window, const CaptureConfig& config) override;
  // A stop before the planned one is forwarded as Terminate.
  absl::Status Stop(int64_t stop_ns) override;
  absl::Status CollectInto(tensorflow::profiler::XSpace* space, TracerStats* stats) override;

 private:
  explicit FrameworkTracer(Options options);
  // Sends the Profile request for `window`, once per capture.
  void Launch(const CaptureWindow& window, const CaptureConfig& config);
  void LaunchLocked(const CaptureWindow& window, const CaptureConfig& config)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void JoinCall();

  const Options options_;
  const std::shared_ptr<FrameworkClient> client_;

  Mutex mu_;
  CaptureWindow window_ ABSL_GUARDED_BY(mu_);
  bool launched_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::string session_id_ ABSL_GUARDED_BY(mu_);
  std::string repository_root_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<tensorflow::ProfileResponse> response_ ABSL_GUARDED_BY(mu_);
  absl::Status call_status_ ABSL_GUARDED_BY(mu_);
  uint64_t captures_ ABSL_GUARDED_BY(mu_) = 0;
  // The call in flight; only the session's thread starts and joins it.
  std::thread call_;
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_FRAMEWORK_TRACER_H_
