// In-process profiler servers for coordinator and controller tests: a ProfilerConnector whose
// connections answer from a script, at once, on the test's clock. What client-go's fake
// clientset is to a Go controller, this is to the coordinator: state (sessions per server), not
// expectations. The real protocol is tested against real sidecars elsewhere.
//
//   FakeProfilers servers(&clock);
//   servers.Add("10.0.0.1:8466", {.host_name = "worker-0", .clock_offset_ns = 3'000'000});
//   servers.Add("10.0.0.2:8466", {.profile_errors = {absl::UnavailableError("restarting")}});
//   options.connector = &servers;
#ifndef CLUSTERPROF_TESTS_SUPPORT_FAKE_PROFILERS_H_
#define CLUSTERPROF_TESTS_SUPPORT_FAKE_PROFILERS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "coordinator/connector.h"

namespace clusterprof::testing {

class FakeProfilers final : public coordinator::ProfilerConnector {
 public:
  struct Script {
    // false: a TF/JAX profiler server (the Sidecar service is UNIMPLEMENTED).
    bool is_sidecar = true;
    // false: every call fails UNAVAILABLE, as from a server that is down.
    bool reachable = true;
    std::string host_name;
    // The server's wall clock minus the test clock.
    int64_t clock_offset_ns = 0;
    // Profile answers these errors first, one per call, then succeeds.
    std::deque<absl::Status> profile_errors;
    bool empty_trace = false;
    // Profile calls are held until CancelCalls (then CANCELLED) or Release().
    bool hold_profile = false;
    // Sidecars: a request asked to outlive its client is announced as accepted (the connection's
    // `accepted` runs) and held; its session reads WAITING until the server's clock passes its
    // planned end, then finishes (as `session_failure` says, else as a capture), whether or not
    // the call is still there.
    bool announce_accept = false;
    std::optional<absl::Status> session_failure;
    // The sidecar restarts during its next accepted capture: the session is gone when read.
    bool restarts_during_capture = false;
    // Sidecars: what a finished session reports.
    uint64_t events = 100;
    uint64_t bytes = 4096;
    // Sidecars: where a finished session's file upload stands, and its error.
    v1alpha1::UploadState upload_state = v1alpha1::UPLOAD_STATE_COMMITTED;
    std::string upload_error;
    // Sidecars: the session's digest; without one, digest_error is reported instead.
    std::optional<v1alpha1::HostDigest> digest;
    std::string digest_error = "no steps";
  };

  explicit FakeProfilers(Clock* clock) : clock_(clock) {}
  ~FakeProfilers() override;

  // Adds (or replaces) the server at `address` (host:port). An address never added is
  // unreachable.
  void Add(const std::string& address, Script script);
  // Changes a server's script while connected (a sidecar that restarts, a network cut).
  void Update(const std::string& address, const std::function<void(Script&)>& change);

  // The sidecar at `address` restarts: every session it knew is forgotten.
  void ForgetSessions(const std::string& address);

  // Called (on the calling thread, no lock held) after each Profile call to `address` was
  // handled (answered, held or announced). Set before the capture starts.
  void OnProfile(std::function<void(const std::string& address)> hook) {
    on_profile_ = std::move(hook);
  }

  // Answers every held Profile call (as finished captures).
  void Release();
  // Blocks until `count` Profile calls are held.
  void WaitForHeld(int count);
  // Blocks until a Profile call to `address` is held.
  void WaitForHeld(const std::string& address);

  // What each server was asked, in order.
  std::vector<tensorflow::ProfileRequest> ProfileRequests(const std::string& address) const;
  int GetInfoCalls(const std::string& address) const;
  int GetSessionCalls(const std::string& address) const;
  int TerminateCalls(const std::string& address) const;
  // The most connections that were open at once.
  int MaxConnections() const;

  std::unique_ptr<coordinator::ProfilerConnection> Connect(const std::string& address) override;

 private:
  class Connection;
  struct Server {
    Script script;
    std::vector<tensorflow::ProfileRequest> profiles;
    std::map<std::string, v1alpha1::GetSessionResponse> sessions;
    // Accepted sessions (announce_accept) until their planned end, by session id.
    std::map<std::string, tensorflow::ProfileRequest> running;
    // Sessions ended early by Terminate.
    std::set<std::string> terminated;
    int get_info_calls = 0;
    int get_session_calls = 0;
    int terminate_calls = 0;
  };
  struct Held {
    Connection* connection;
    std::string address;
    tensorflow::ProfileRequest request;
    coordinator::Done<tensorflow::ProfileResponse> done;
  };

  // Finishes a capture of `request` on `address`: records its session, returns the answer.
  absl::StatusOr<tensorflow::ProfileResponse> FinishProfile(
      const std::string& address, const tensorflow::ProfileRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CancelHeld(Connection* connection);
  void Forget(Connection* connection);

  Clock* const clock_;
  std::function<void(const std::string& address)> on_profile_;
  mutable Mutex mu_;
  std::map<std::string, Server> servers_ ABSL_GUARDED_BY(mu_);
  std::vector<Held> held_ ABSL_GUARDED_BY(mu_);
  int connections_ ABSL_GUARDED_BY(mu_) = 0;
  int max_connections_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_FAKE_PROFILERS_H_
