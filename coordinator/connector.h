// The coordinator's view of a profiler server: three asynchronous calls, behind an interface so
// that the coordinator (and the operator's controller above it) can be tested against in-process
// fakes (tests/support/fake_profilers.h) on a SimulatedClock. GrpcConnector speaks the real
// protocol: tensorflow.ProfilerService and clusterprof.v1alpha1.Sidecar, one channel per server.
#ifndef CLUSTERPROF_COORDINATOR_CONNECTOR_H_
#define CLUSTERPROF_COORDINATOR_CONNECTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "clusterprof/v1alpha1/sidecar.pb.h"
#include "common/grpc/tls.h"
#include "tsl/profiler/protos/profiler_service.pb.h"

namespace clusterprof::coordinator {

template <typename Response>
using Done = std::function<void(absl::StatusOr<Response> response)>;

// One server. Every call returns at once; `done` runs exactly once, on any thread, with the
// answer or the call's error: DEADLINE_EXCEEDED after `timeout_ns`, CANCELLED after
// CancelCalls(), UNIMPLEMENTED from a TF/JAX server asked a Sidecar method. Thread-safe.
// Destroying a connection waits for its calls' `done` to return, so `done` must not destroy it.
class ProfilerConnection {
 public:
  virtual ~ProfilerConnection() = default;

  virtual void GetInfo(int64_t timeout_ns, Done<v1alpha1::GetInfoResponse> done) = 0;
  virtual void GetSession(const std::string& session_id, int64_t timeout_ns,
                          Done<v1alpha1::GetSessionResponse> done) = 0;
  // `accepted` (may be empty) runs, before `done`, when a clusterprof sidecar asked to outlive
  // its client (advanced_configuration "clusterprof_outlive_client") says it has taken the
  // request: its session records to the planned end without this call, which the caller may
  // then cancel, reading the results with GetSession. TF/JAX servers never say so.
  virtual void Profile(const tensorflow::ProfileRequest& request, int64_t timeout_ns,
                       Done<tensorflow::ProfileResponse> done, std::function<void()> accepted) = 0;
  // ProfilerService.Terminate: the session ends its recording now and is collected as at its
  // planned end (a held Profile call of it is answered with what was recorded).
  virtual void Terminate(const std::string& session_id, int64_t timeout_ns,
                         Done<tensorflow::TerminateResponse> done) = 0;
  // Ends the calls in flight, and any made later, with CANCELLED. Their `done` still runs.
  virtual void CancelCalls() = 0;
  // Starts connecting now, without a call, so that the first call does not wait for the
  // connection (targets that are not probed before their Profile call). Never fails.
  virtual void Warm() {}
};

class ProfilerConnector {
 public:
  virtual ~ProfilerConnector() = default;
  // `address` is host:port. Connecting does not fail: an unreachable server fails its calls
  // (UNAVAILABLE).
  virtual std::unique_ptr<ProfilerConnection> Connect(const std::string& address) = 0;
  // After calls to `address` failed to connect: the cause, when the connector can tell more than
  // the call's error (a TLS certificate that is expired, from another CA, or for another name),
  // else "". May block for a couple of seconds.
  virtual std::string ExplainConnectFailure(const std::string& address) { return ""; }
};

// gRPC, one channel per server, no message size limit on answers. `auth_token` non-empty: sent
// as "authorization: Bearer <token>" on every call (sidecars started with --auth-token-file
// refuse calls without it; TF/JAX servers ignore it). `previous_auth_token` non-empty: a call
// that a sidecar refuses (UNAUTHENTICATED) with `auth_token` is made again with it: during a
// rotation a sidecar may still hold the token before (the kubelet updates each pod's copy of a
// Secret in its own time), and the connection keeps to the token that worked. `security`:
// plaintext or TLS (common/grpc/tls.h); null: plaintext.
class GrpcConnector final : public ProfilerConnector {
 public:
  explicit GrpcConnector(std::string auth_token = "",
                         std::shared_ptr<const tls::ChannelSecurity> security = nullptr,
                         std::string previous_auth_token = "");
  std::unique_ptr<ProfilerConnection> Connect(const std::string& address) override;
  std::string ExplainConnectFailure(const std::string& address) override;

 private:
  const std::string auth_token_;
  const std::shared_ptr<const tls::ChannelSecurity> security_;
  const std::string previous_auth_token_;
};

}  // namespace clusterprof::coordinator

#endif  // CLUSTERPROF_COORDINATOR_CONNECTOR_H_
