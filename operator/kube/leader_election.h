// Leader election over a coordination.k8s.io/v1 Lease, with client-go's
// tools/leaderelection semantics: candidates race to write their identity into the Lease with an
// Update that carries the resourceVersion they read (the server's optimistic concurrency picks
// one winner); the leader renews every retry period, and steps down when it has not renewed for
// the renew deadline, before the others may take the Lease (after the lease duration).
#ifndef CLUSTERPROF_OPERATOR_KUBE_LEADER_ELECTION_H_
#define CLUSTERPROF_OPERATOR_KUBE_LEADER_ELECTION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "cpprest/json.h"
#include "operator/kube/api_client.h"

namespace clusterprof::kube {

struct LeaderElectionConfig {
  std::string lease_namespace;
  std::string lease_name;
  // Unique among the candidates (the operator passes "<hostname>_<pid>").
  std::string identity;

  // How long the others wait, from the last change of the Lease they saw, before taking it.
  int64_t lease_duration_ns = 15 * kNanosPerSecond;
  // How long the leader keeps trying to renew before it steps down.
  int64_t renew_deadline_ns = 10 * kNanosPerSecond;
  // How often candidates try to acquire, and the leader renews.
  int64_t retry_period_ns = 2 * kNanosPerSecond;
  // On Stop() while leading, write an empty holder so the next candidate takes over at once.
  bool release_on_cancel = true;

  // Callbacks run on the thread in Run() and must return quickly: renewals wait for them.
  // OnStartedLeading starts the leader's work elsewhere; OnStoppedLeading stops it, and is
  // called only after an OnStartedLeading.
  std::function<void()> on_started_leading;
  std::function<void()> on_stopped_leading;
  // Another holder of the Lease was seen: ours, another candidate's, or "" after a release.
  std::function<void(const std::string& identity)> on_new_leader;
};

// What a Lease's spec says (client-go's LeaderElectionRecord).
struct LeaderElectionRecord {
  std::string holder_identity;
  int64_t lease_duration_seconds = 0;
  std::string acquire_time;  // RFC 3339 micro time, as the server stores it
  std::string renew_time;
  int64_t lease_transitions = 0;

  bool operator==(const LeaderElectionRecord&) const = default;
};

// Elects one leader among candidates that share a Lease. One thread calls Run(), which blocks;
// IsLeader(), GetLeader(), last_error() and Stop() are thread-safe and may be called from any
// thread.
//
// Failure: API errors while acquiring (403 without RBAC for leases, the server unreachable) are
// logged when they change, kept in last_error(), and retried every retry period; the candidate
// never leads until a write succeeds. A leader whose renewals fail for the renew deadline steps
// down (IsLeader() turns false at the deadline even while a request hangs) and Run() returns the
// error. Requests can outlast the deadline by up to the client's request timeout: give the
// elector a client whose request_timeout_ns is at most half the renew deadline, as
// kube-controller-manager does, so OnStoppedLeading comes in time.
class LeaderElector {
 public:
  // InvalidArgument when the config is incomplete, or its durations do not satisfy
  // lease duration > renew deadline > 1.2 * retry period (client-go's rule).
  static absl::StatusOr<std::unique_ptr<LeaderElector>> Create(ApiClient* client, Clock* clock,
                                                               LeaderElectionConfig config);

  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  // Campaigns until it leads, then renews until it stops leading. Returns OK when stopped
  // (through Stop(), or `stop` set followed by clock->Wake()); a leader stopped this way with
  // release_on_cancel releases the Lease after OnStoppedLeading returns, so the next leader's
  // work never overlaps this one's. Returns the error when leadership was lost (the Lease
  // taken, or not renewed within the deadline). Call again to stand for a new term.
  absl::Status Run();
  absl::Status Run(const std::atomic<bool>& stop);
  // Ends Run() (the form without a flag) promptly, for good: a later Run() returns at once.
  void Stop();

  // True while this candidate holds the Lease and its last renewal is within the renew deadline.
  bool IsLeader() const;
  // The holder of the Lease as last observed ("" when none).
  std::string GetLeader() const;
  // The error of the last failed attempt to acquire or renew (OK when the last one succeeded).
  absl::Status last_error() const;
  // Attempts to acquire or renew so far.
  int64_t attempts() const { return attempts_.load(std::memory_order_relaxed); }

  const LeaderElectionConfig& config() const { return config_; }

 private:
  LeaderElector(ApiClient* client, Clock* clock, LeaderElectionConfig config);

  // One round of client-go's tryAcquireOrRenew: OK when this candidate holds the Lease after it.
  absl::Status TryAcquireOrRenew();
  // Writes an empty holder into the Lease, if we still hold it.
  void Release();
  // Sleeps until `deadline_ns` (monotonic); false when `stop` ended the wait.
  bool WaitUntil(int64_t deadline_ns, const std::atomic<bool>& stop);
  void RecordAttempt(const absl::Status& status);
  void ObserveHolder(const std::string& holder);

  ApiClient* const client_;
  Clock* const clock_;
  const LeaderElectionConfig config_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> attempts_{0};

  // Touched only by the thread in Run().
  LeaderElectionRecord observed_record_;
  int64_t observed_mono_ns_ = 0;
  // The Lease as last read or written (its resourceVersion guards our next write).
  web::json::value lease_;
  bool have_lease_ = false;

  mutable Mutex mu_;
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  // Monotonic time by which the next renewal must succeed.
  int64_t renew_deadline_mono_ns_ ABSL_GUARDED_BY(mu_) = 0;
  std::string leader_ ABSL_GUARDED_BY(mu_);
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_LEADER_ELECTION_H_
