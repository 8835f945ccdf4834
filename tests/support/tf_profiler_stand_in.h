// A stand-in for the profiler server of TensorFlow and JAX (`tf.profiler.experimental.server.
// start(port)`, `jax.profiler.start_server(port)`), in process, on 127.0.0.1 and a port the
// system picks. It behaves as docs/protocol.md ("How the upstream server behaves") says, quirks
// included:
//   - version 0 in opts means "defaults": every other option is discarded, start_timestamp_ns
//     included (host 2, device 1, python 0);
//   - one capture at a time: a second Profile is INTERNAL "Another profiling session active.";
//   - waits for opts.start_timestamp_ns (wall clock), starting at once if it has passed;
//   - records for opts.duration_ms, else request.duration_ms; Terminate(session_id) ends the
//     capture early and keeps the data; a cancelled call returns CANCELLED and loses it;
//   - emit_xspace returns the XSpace and writes no file; otherwise it writes
//     <repository_root>/<session_id>/<host>.xplane.pb (host: opts.override_hostname, else
//     advanced_configuration["override_hostname"], else request.host_name; ':' -> '_'), and a
//     write failure is INTERNAL;
//   - Monitor is UNIMPLEMENTED, and there is no clusterprof.v1alpha1.Sidecar service.
// Options turn on an older server that ignores emit_xspace (TF before 2.15 and its XProf), a slow
// answer, and a padded XSpace for large-response tests.
//
// Fidelity limits: the XSpace is synthetic (a `/host:CPU` plane with a Python thread, a
// `/device:TPU:0` plane with XLA ops at fixed 1 ms steps, and a `Task Environment` plane); the
// tracer levels and advanced_configuration are recorded, not acted on; upstream's own options
// validation (which refuses unknown GPU keys) is not modelled.
//
// Thread-safe.
#ifndef CLUSTERPROF_TESTS_SUPPORT_TF_PROFILER_STAND_IN_H_
#define CLUSTERPROF_TESTS_SUPPORT_TF_PROFILER_STAND_IN_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"

namespace clusterprof::testing {

class TfProfilerStandIn final : public tensorflow::ProfilerService::Service {
 public:
  struct Options {
    // An older server: emit_xspace is ignored and the file is always written.
    bool ignore_emit_xspace = false;
    // Waits this long after the capture before answering.
    int64_t answer_delay_ms = 0;
    // Pads the XSpace with a bytes stat of this size (for responses over gRPC's 4 MiB default).
    size_t padding_bytes = 0;
  };

  // What a Profile call received and did.
  struct Call {
    tensorflow::ProfileRequest request;
    int64_t received_ns = 0;
    int64_t started_ns = 0;  // 0 when refused
    int64_t stopped_ns = 0;
    bool terminated = false;
    std::string status;  // "OK", "INTERNAL", "CANCELLED", ...
    std::string file;    // the file written, if any
  };

  // Serves on 127.0.0.1 at a port the system picks.
  static std::unique_ptr<TfProfilerStandIn> Start(Options options);
  ~TfProfilerStandIn() override;

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::vector<Call> calls() const;
  int terminates() const;
  // Waits until a capture is running (for busy tests); false after `timeout_ms`.
  bool WaitUntilCapturing(int64_t timeout_ms) const;

  grpc::Status Profile(grpc::ServerContext* context, const tensorflow::ProfileRequest* request,
                       tensorflow::ProfileResponse* response) override;
  grpc::Status Terminate(grpc::ServerContext* context, const tensorflow::TerminateRequest* request,
                         tensorflow::TerminateResponse* response) override;

 private:
  explicit TfProfilerStandIn(Options options) : options_(options) {}

  const Options options_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  bool active_ = false;
  std::string active_session_;
  bool terminate_ = false;
  int terminates_ = 0;
  std::vector<Call> calls_;
};

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_TF_PROFILER_STAND_IN_H_
