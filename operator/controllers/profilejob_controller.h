// The ProfileJob controller: drives a ProfileJob from Pending to Succeeded, PartiallySucceeded or
// Failed with the capture coordinator (coordinator/coordinator.h).
//
//   Pending    spec checked (an invalid one -> Failed, naming the field), targets resolved from
//              the pod cache (while fewer than minReady are ready, or matching pods are still
//              starting, it waits up to spec.targets.waitSeconds with the WaitingForTargets
//              condition; then fewer than minReady -> Failed), run name and T0 chosen
//   Scheduled  the above written to status: from here a restarted operator can resume
//   Capturing  written before each attempt's Profile requests go out (attempt, T0)
//   Succeeded / PartiallySucceeded / Failed, with per-target results, a summary and conditions
//
// Captures run on threads of their own, so a worker is never held for a capture's duration; the
// controller owns them, and Stop cancels the ones still running and joins them all.
// A job found in Scheduled or Capturing with no capture running in this process (the operator
// restarted, or another replica led before) is resumed: each sidecar is asked for the run's
// session first, so a finished capture is read back and a running one joined, never repeated.
// Status is written through the /status subresource, read-modify-write with conflict retries,
// and only while the job is still the one the capture belongs to (same uid and run). Events are
// emitted at each phase change and for each failed target. Finished jobs with
// ttlSecondsAfterFinished are deleted when it passes.
//
// Thread-safe. Informer handlers only queue keys; Reconcile runs on the workers.
#ifndef CLUSTERPROF_OPERATOR_CONTROLLERS_PROFILEJOB_CONTROLLER_H_
#define CLUSTERPROF_OPERATOR_CONTROLLERS_PROFILEJOB_CONTROLLER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/base/cancel.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "common/grpc/tls.h"
#include "operator/api/types.h"
#include "operator/controllers/metrics.h"
#include "operator/controllers/status_writer.h"
#include "operator/controllers/target_queue.h"
#include "operator/controllers/targets.h"
#include "operator/kube/api_client.h"
#include "operator/kube/event_recorder.h"
#include "operator/kube/informer.h"
#include "operator/kube/workqueue.h"

namespace clusterprof::storage {
class StorageSet;
}  // namespace clusterprof::storage

namespace clusterprof::coordinator {
class ChannelPool;
class ProfilerConnector;
struct RunResult;
}  // namespace clusterprof::coordinator

namespace clusterprof::controllers {

struct CaptureSettings;  // capture_lifecycle.h

struct ProfileJobControllerOptions {
  int workers = 4;
  // The coordinator's timing (coordinator/coordinator.h, CaptureOptions).
  int64_t fan_out_lead_ms = 200;
  int64_t retry_backoff_ms = 1000;
  int64_t grace_ms = 30'000;
  // A file with the bearer token sidecars started with --auth-token-file require (a mounted
  // Secret, read for each capture so a rotated token is used); empty: none sent.
  std::string sidecar_token_file;
  int clock_probes = 5;
  // How long a capture keeps trying to write its final status while the API server is
  // unreachable; after that the results stay with the sidecars (GetSession) for a resume.
  int64_t final_status_retry_ns = 5 * 60 * kNanosPerSecond;
  // Where run manifests are written (common/storage/storage_set.h); nullptr: a set per capture.
  storage::StorageSet* storages = nullptr;
  // Where jobs may write (the sidecars' --allowed-logdir, from the injection config): a job
  // whose spec.logdir lies elsewhere fails LogdirNotAllowed before anything is captured or
  // written (the run manifest included, which the operator writes with its own credentials).
  // Empty: no check.
  std::vector<storage::Logdir> allowed_logdirs;
  // Whether spec.targets.addresses may name servers that are not pods of the job's namespace
  // (--allow-external-addresses): TF/JAX servers outside the cluster. Off: such a job fails
  // AddressNotAllowed, and no call, token included, goes to them.
  bool allow_external_addresses = false;
  // Plaintext or TLS to the sidecars (--sidecar-tls-ca-file; common/grpc/tls.h); null:
  // plaintext.
  std::shared_ptr<const tls::ChannelSecurity> sidecar_security;
  // Connections to the sidecars kept across captures and warmed as pods become Ready
  // (coordinator/connector.h, ConnectionWarmer); nullptr: each capture connects anew.
  coordinator::ChannelPool* channel_pool = nullptr;
  // How sidecars are reached (coordinator/connector.h); nullptr: gRPC, with the token file's
  // token and sidecar_security.
  coordinator::ProfilerConnector* connector = nullptr;
};

class ProfileJobController : public kube::ResourceEventHandler {
 public:
  // Everything must outlive the controller. `jobs` is a ProfileJob informer (JsonDecoder),
  // `pods` a Pod informer (PodDecoder) over the same namespaces; both should have synced before
  // Start. `events` and `metrics` may be null.
  ProfileJobController(kube::ApiClient* client, Clock* clock, kube::Informer* jobs,
                       kube::Informer* pods, kube::EventRecorder* events, OperatorMetrics* metrics,
                       ProfileJobControllerOptions options = {});
  ~ProfileJobController() override;
  ProfileJobController(const ProfileJobController&) = delete;
  ProfileJobController& operator=(const ProfileJobController&) = delete;

  // Registers with the job informer and starts the workers.
  void Start();
  // Stops the workers, waits up to `capture_grace_ns` for running captures to finish, cancels
  // the rest and joins them all. Returns whether every capture finished on its own (a cancelled
  // one is left to the sidecars, which finish it, and to a future operator, which resumes it).
  bool Stop(int64_t capture_grace_ns);

  // One reconcile of the job `key` ("namespace/name"); public for tests. An error requeues it.
  absl::Status Reconcile(const std::string& key);
  // A job gone from the cache: out of the queue; its capture, if finished, let go.
  void ForgetDeleted(const std::string& key);
  // Whether this process's capture under `key` holds the reconcile back (still running: a
  // cancel request is passed on; or its final status not yet in the cache). A finished one is
  // let go.
  bool OwnCaptureHolds(const std::string& key, const kube::ObjectMeta& meta,
                       const api::ProfileJobStatus& status);
  // Why the job may not run (its logdir outside the allowlist, addresses outside its
  // namespace), as the reason and message it fails with; nullopt when it may.
  struct Refusal {
    std::string reason;
    std::string message;
  };
  std::optional<Refusal> Refuse(const kube::ObjectMeta& meta, const api::ProfileJobSpec& spec);
  // A job begun by an earlier operator or replica: its targets resolved again and its capture
  // resumed (`cancelled`: and stopped at once).
  absl::Status Resume(const std::string& key, const kube::ObjectMeta& meta,
                      const web::json::value& job, const api::ProfileJobSpec& spec,
                      api::ProfileJobStatus status, bool cancelled);

  // Captures running in this process.
  int RunningCaptures() const;

  // Recounts the jobs in the cache by phase for the metrics (the manager calls it every second).
  void RefreshMetrics();

  void OnAdd(const kube::ObjectPtr& object, bool initial_list) override;
  void OnUpdate(const kube::ObjectPtr& old_object, const kube::ObjectPtr& new_object) override;
  void OnDelete(const kube::ObjectPtr& object, bool final_state_unknown) override;

 private:
  struct Capture {
    std::string uid;
    // The targets it holds (addresses), while not finished: the queue's claim of this process,
    // ahead of the informer's cache.
    std::string name;
    std::vector<std::string> addresses;
    std::thread thread;
    CancelToken cancel;
    // The job was cancelled (annotation clusterprof.io/cancel) while it captured: the sidecars
    // are told to stop, and what they recorded is collected (CaptureOptions.stop).
    CancelToken stop;
    std::atomic<bool> finished{false};
    // The final status was written (the job is terminal as far as this process knows).
    std::atomic<bool> wrote_final{false};
  };

  void Worker();
  // Why the job cannot run with the targets it has: the selector that matches nothing, or how
  // many are ready against minReady, with those not ready and how long it waited.
  std::string NotEnoughTargets(const kube::ObjectMeta& meta, const api::ProfileJobSpec& spec,
                               const api::ProfileJobStatus& status,
                               const TargetResolution& resolution, size_t needed);
  // The status of a job scheduled at `t0` into `run`: phase, run, targets and the
  // TargetsResolved condition; a Queued one ends (`queued_since` gets its start when this
  // process did not know it).
  void MarkScheduled(const kube::ObjectMeta& meta, const TargetResolution& resolution,
                     const std::string& run, const std::string& run_uri, int64_t t0, int64_t now,
                     api::ProfileJobStatus& status, int64_t* queued_since);
  absl::Status Schedule(const kube::ObjectMeta& meta, const web::json::value& job,
                        const api::ProfileJobSpec& spec, api::ProfileJobStatus status);
  // Whether the job should wait for targets still on their way, and if so keeps it Pending with
  // the WaitingForTargets condition (written when what it waits on changes) and looks again
  // within a second. Returns nullopt to go on: the wait is over or was never needed, and
  // `status` has the condition closed.
  std::optional<absl::Status> WaitForTargets(const kube::ObjectMeta& meta,
                                             const web::json::value& job,
                                             const api::ProfileJobSpec& spec,
                                             api::ProfileJobStatus& status,
                                             const TargetResolution& resolution, size_t needed);
  // Keeps the job Pending, Queued behind `blocker`, until its targets are free or
  // spec.queueTimeoutSeconds passes.
  absl::Status Wait(const kube::ObjectMeta& meta, const web::json::value& job,
                    const api::ProfileJobSpec& spec, api::ProfileJobStatus status,
                    const TargetResolution& resolution, const Blocker& blocker);
  // What every other job of `ns` claims: their statuses in the cache, and this process's
  // captures still running.
  std::vector<JobClaim> Claims(const std::string& ns) const;
  // What the jobs of `ns` claim by their statuses in the cache alone.
  std::vector<JobClaim> CachedClaims(const std::string& ns) const;
  // Whether the job has finished (its targets are free).
  static bool HoldsNoTargets(const kube::Object& object);
  // Forgets when the job began to wait (it is scheduled, failed or gone).
  void Dequeue(const std::string& uid);
  // Requeues the queued jobs of `ns` (from the cache; takes no lock of this class).
  void WakeQueued(const std::string& ns);
  absl::Status Fail(const kube::ObjectMeta& meta, const web::json::value& job,
                    api::ProfileJobStatus status, std::string_view reason,
                    std::string_view message);
  absl::Status HandleFinished(const std::string& key, const kube::ObjectMeta& meta,
                              const web::json::value& job, const api::ProfileJobStatus& status);
  // The job's targets as its spec resolves them against the pods in the cache now.
  TargetResolution Resolve(const std::string& ns, const api::ProfileJobSpec& spec) const;
  void StartCapture(const std::string& key, const JobRef& job, const api::ProfileJobSpec& spec,
                    const api::ProfileJobStatus& status, TargetResolution plan, bool resume);
  // The settings a capture of job `key` takes now: this controller's, and the sidecars' bearer
  // token as its file holds it (the one before a rotation kept beside it).
  CaptureSettings SettingsForCapture(const std::string& key) ABSL_LOCKS_EXCLUDED(token_mu_);
  void RunCapture(const std::string& key, const JobRef& job, const api::ProfileJobSpec& spec,
                  const api::ProfileJobStatus& status, const TargetResolution& plan, bool resume,
                  Capture* capture);
  // Writes the finished run's status, then its events and metrics; whether it was written.
  bool FinishCapture(const std::string& key, const JobRef& job, const std::string& run,
                     const coordinator::RunResult& result, const TargetResolution& plan,
                     Capture* capture);
  // Writes phase Capturing with the attempt and its T0, if the job is still in `expected_phase`
  // of `run`; FailedPrecondition when it moved on, NotFound when it is gone.
  absl::Status MarkCapturing(const JobRef& job, const std::string& run,
                             const std::string& expected_phase, int attempt, int64_t t0);
  void Event(const JobRef& job, std::string_view type, std::string_view reason,
             std::string_view message);

  kube::ApiClient* const client_;
  Clock* const clock_;
  kube::Informer* const jobs_;
  kube::Informer* const pods_;
  kube::EventRecorder* const events_;
  OperatorMetrics* const metrics_;
  const ProfileJobControllerOptions options_;
  StatusWriter status_writer_;
  kube::RateLimitingQueue queue_;
  std::vector<std::thread> workers_;
  std::atomic<bool> stopping_{false};

  // One scheduling decision at a time: the check that a job's targets are free and its claim
  // (the Scheduled write and the capture) go together. Taken before mu_.
  Mutex schedule_mu_;
  // When each job this process saw waiting began to (wall ns), by uid: the cache may lag behind
  // its own Queued write. Taken alone.
  // The sidecar token as last read, and the one before it (kept after a rotation: sidecars whose
  // copy of the Secret is not updated yet still hold it).
  Mutex token_mu_;
  std::string last_token_ ABSL_GUARDED_BY(token_mu_);
  std::string previous_token_ ABSL_GUARDED_BY(token_mu_);
  Mutex queued_mu_;
  std::map<std::string, int64_t> queued_since_ ABSL_GUARDED_BY(queued_mu_);
  // The jobs waiting for targets (WaitForTargets), by namespace: a pod of their namespace that
  // changes requeues them at once, so a job starts as soon as its pods are Ready.
  class PodWaker final : public kube::ResourceEventHandler {
   public:
    explicit PodWaker(ProfileJobController* controller) : controller_(controller) {}
    void OnAdd(const kube::ObjectPtr& pod, bool initial_list) override;
    void OnUpdate(const kube::ObjectPtr& old_pod, const kube::ObjectPtr& new_pod) override;
    void OnDelete(const kube::ObjectPtr& pod, bool final_state_unknown) override;

   private:
    ProfileJobController* const controller_;
  };
  void WakeWaiting(const std::string& ns);
  PodWaker pod_waker_{this};
  std::map<std::string, std::set<std::string>> waiting_for_pods_ ABSL_GUARDED_BY(queued_mu_);
  mutable Mutex mu_;
  // By job key.
  std::map<std::string, std::unique_ptr<Capture>> captures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace clusterprof::controllers

#endif  // CLUSTERPROF_OPERATOR_CONTROLLERS_PROFILEJOB_CONTROLLER_H_
