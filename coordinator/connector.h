// The coordinator's view of a profiler server: three asynchronous calls, behind an interface so
// that the coordinator (and the operator's controller above it) can be tested against in-process
// fakes (tests/support/fake_profilers.h) on a SimulatedClock. GrpcConnector speaks the real
// protocol: tensorflow.ProfilerService and clusterprof.v1alpha1.Sidecar, one channel per server.
#ifndef CLUSTERPROF_COORDINATOR_CONNECTOR_H_
#define CLUSTERPROF_COORDINATOR_CONNECTOR_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "clusterprof/v1alpha1/sidecar.pb.h"
#include "common/base/mutex.h"
#include "common/grpc/tls.h"
#include "tsl/profiler/protos/profiler_service.pb.h"

namespace grpc {
class Channel;
}  // namespace grpc

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

// gRPC channels to profiler servers kept across captures (the operator's): the connections, TLS
// handshakes included, are made once, ahead of the captures when warmed (a pod that became
// Ready), and every capture and session read reuses them, so that no handshake is on a capture's
// path. Pooled channels keep their connection while idle and send keepalive pings (the sidecar
// permits them) so that one dropped on the way is found before a capture uses it. At most
// `max_channels`; beyond, the least recently used is dropped (its connection closes once no call
// holds it). A thread of the pool's polls gRPC's sockets all the while, so that a connection
// warmed ahead finishes its TLS handshake then, and keepalive pings are answered, rather than
// when a capture's calls first poll (gRPC advances a connection only while some thread polls).
// Thread-safe.
class ChannelPool {
 public:
  struct Options {
    std::shared_ptr<const tls::ChannelSecurity> security;  // null: plaintext
    size_t max_channels = 2048;
  };

  explicit ChannelPool(Options options);
  ~ChannelPool();
  ChannelPool(const ChannelPool&) = delete;
  ChannelPool& operator=(const ChannelPool&) = delete;

  // The channel to `address` (host:port), made when there is none.
  std::shared_ptr<grpc::Channel> Get(const std::string& address);
  // Makes the channel to `address` if there is none and the pool has room (warming never drops
  // another channel), and starts connecting it now. False when there was no room.
  bool Warm(const std::string& address);
  // Drops the channel to `address` (its pod went away).
  void Forget(const std::string& address);
  size_t size() const;
  const std::shared_ptr<const tls::ChannelSecurity>& security() const { return security_; }

 private:
  struct Entry;
  class Poller;
  // A channel in TRANSIENT_FAILURE (its server was down) is replaced, the old one handed out in
  // `dropped` to be let go outside the mutex.
  std::shared_ptr<grpc::Channel> GetLocked(const std::string& address,
                                           std::shared_ptr<grpc::Channel>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the entry out of the pool; its channel is returned, to be let go outside the mutex.
  std::shared_ptr<grpc::Channel> EraseLocked(std::map<std::string, Entry>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<const tls::ChannelSecurity> security_;
  const size_t max_channels_;
  mutable Mutex mu_;
  // Most recently used first.
  std::list<std::string> order_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Entry> channels_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Poller> poller_;
};

// The security of connections made through `pool` (when not null: the pool's), else
// `security` (when not null), else plaintext: the rule GrpcConnector follows.
std::shared_ptr<const tls::ChannelSecurity> ConnectionSecurity(
    const ChannelPool* pool, std::shared_ptr<const tls::ChannelSecurity> security);

// gRPC, one channel per server, no message size limit on answers. `auth_token` non-empty: sent
// as "authorization: Bearer <token>" on every call (sidecars started with --auth-token-file
// refuse calls without it; TF/JAX servers ignore it). `previous_auth_token` non-empty: a call
// that a sidecar refuses (UNAUTHENTICATED) with `auth_token` is made again with it: during a
// rotation a sidecar may still hold the token before (the kubelet updates each pod's copy of a
// Secret in its own time), and the connection keeps to the token that worked. `security`:
// plaintext or TLS (common/grpc/tls.h); null: plaintext. `pool` non-null: its channels (and
// its security) are used instead of a channel per connection.
class GrpcConnector final : public ProfilerConnector {
 public:
  explicit GrpcConnector(std::string auth_token = "",
                         std::shared_ptr<const tls::ChannelSecurity> security = nullptr,
                         std::string previous_auth_token = "", ChannelPool* pool = nullptr);
  std::unique_ptr<ProfilerConnection> Connect(const std::string& address) override;
  std::string ExplainConnectFailure(const std::string& address) override;

 private:
  const std::string auth_token_;
  const std::shared_ptr<const tls::ChannelSecurity> security_;
  const std::string previous_auth_token_;
  ChannelPool* const pool_;
};

}  // namespace clusterprof::coordinator

#endif  // CLUSTERPROF_COORDINATOR_CONNECTOR_H_
