// The workload's TF/JAX profiler server as the framework tracer calls it: the seam between
// FrameworkTracer and gRPC, as coordinator/connector.h is the coordinator's, so that tests give
// the tracer a fake server (absent, busy, slow, an older version) without a network.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_FRAMEWORK_CLIENT_H_
#define CLUSTERPROF_SIDECAR_TRACERS_FRAMEWORK_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tensorflow {
class ProfileRequest;
class ProfileResponse;
}  // namespace tensorflow

namespace clusterprof::sidecar {

// One server. Thread-safe: Cancel() comes from another thread than the Profile it ends.
class FrameworkClient {
 public:
  virtual ~FrameworkClient() = default;

  // ProfilerService.Profile. Blocks until the answer, `deadline_ns` (wall clock: the call ends
  // DEADLINE_EXCEEDED) or Cancel() (CANCELLED). An absent server is UNAVAILABLE; a busy one
  // answers with its own error ("Another profiling session active.").
  virtual absl::StatusOr<tensorflow::ProfileResponse> Profile(
      const tensorflow::ProfileRequest& request, int64_t deadline_ns) = 0;
  // ProfilerService.Terminate of `session_id`: its capture ends now and is still answered.
  // Waits at most `timeout_ns`.
  virtual absl::Status Terminate(const std::string& session_id, int64_t timeout_ns) = 0;
  // Ends the Profile call in flight, and any made later, with CANCELLED (the tracer going away).
  virtual void Cancel() = 0;
};

// gRPC to `address` (host:port), plaintext (the server listens on the pod's loopback), with no
// bound on the answer's size: a framework's XSpace easily passes gRPC's 4 MiB default.
std::unique_ptr<FrameworkClient> MakeGrpcFrameworkClient(const std::string& address);

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_FRAMEWORK_CLIENT_H_
