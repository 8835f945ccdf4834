// The ProfileJob controller: drives a ProfileJob from Pending to Succeeded, PartiallySucceeded or
// Failed with the capture coordinator (operator/coordinator/coordinator.h).
//
//   Pending    spec checked (an invalid one -> Failed, naming the field), targets resolved from
//              the pod cache (fewer than minReady -> Failed), run name and T0 chosen
//   Scheduled  the above written to status: from here a restarted operator can resume
//   Capturing  written before each attempt's Profile requests go out (attempt, T0)
//   Succeeded / PartiallySucceeded / Failed, with per-target results, a summary and conditions
//
// Captures run on threads of their own, so a worker is never held for a capture's duration.
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
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "operator/controllers/api.h"
#include "operator/controllers/metrics.h"
#include "operator/kube/event_recorder.h"
#include "operator/kube/informer.h"
#include "operator/kube/rest_client.h"
#include "operator/kube/workqueue.h"

namespace clusterprof::storage {
class StorageSet;
}  // namespace clusterprof::storage

namespace clusterprof::controllers {

struct ProfileJobControllerOptions {
  int workers = 4;
  // The coordinator's timing (operator/coordinator/coordinator.h, CaptureOptions).
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
};

class ProfileJobController : public kube::ResourceEventHandler {
 public:
  // Everything must outlive the controller. `jobs` is a ProfileJob informer (JsonDecoder),
  // `pods` a Pod informer (PodDecoder) over the same namespaces; both should have synced before
  // Start. `events` and `metrics` may be null.
  ProfileJobController(kube::RestClient* client, Clock* clock, kube::Informer* jobs,
                       kube::Informer* pods, kube::EventRecorder* events, OperatorMetrics* metrics,
                       ProfileJobControllerOptions options = {});
  ~ProfileJobController() override;
  ProfileJobController(const ProfileJobController&) = delete;
  ProfileJobController& operator=(const ProfileJobController&) = delete;

  // Registers with the job informer and starts the workers.
  void Start();
  // Stops the workers, then waits up to `capture_grace_ns` for running captures to finish.
  // Returns whether none is left running (those left are abandoned to a future operator).
  bool Stop(int64_t capture_grace_ns);

  // One reconcile of the job `key` ("namespace/name"); public for tests. An error requeues it.
  absl::Status Reconcile(const std::string& key);

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
    std::thread thread;
    std::atomic<bool> finished{false};
    // The final status was written (the job is terminal as far as this process knows).
    std::atomic<bool> wrote_final{false};
  };
  struct JobRef {
    std::string namespace_;
    std::string name;
    std::string uid;
  };

  void Worker();
  absl::Status Schedule(const kube::ObjectMeta& meta, const web::json::value& job,
                        const ProfileJobSpec& spec, ProfileJobStatus status);
  absl::Status Fail(const kube::ObjectMeta& meta, const web::json::value& job,
                    ProfileJobStatus status, std::string_view reason, std::string_view message);
  absl::Status HandleFinished(const std::string& key, const kube::ObjectMeta& meta,
                              const web::json::value& job, const ProfileJobStatus& status);
  void StartCapture(const std::string& key, const JobRef& job, const ProfileJobSpec& spec,
                    const ProfileJobStatus& status, bool resume);
  void RunCapture(const std::string& key, const JobRef& job, const ProfileJobSpec& spec,
                  const ProfileJobStatus& status, bool resume, Capture* capture);
  // Writes phase Capturing with the attempt and its T0, if the job is still in `expected_phase`
  // of `run`; FailedPrecondition when it moved on, NotFound when it is gone.
  absl::Status MarkCapturing(const JobRef& job, const std::string& run,
                             const std::string& expected_phase, int attempt, int64_t t0);
  // Read-modify-write of the job's status from the server's latest copy, retried on conflicts.
  // NotFound when the job is gone or is another object (uid); `mutate`'s error aborts.
  absl::Status WriteStatus(const JobRef& job,
                           const std::function<absl::Status(ProfileJobStatus&)>& mutate);
  // Writes `status` over the cached object `job` (optimistic: a Conflict requeues).
  absl::Status UpdateStatus(const web::json::value& job, const ProfileJobStatus& status);
  void Event(const JobRef& job, std::string_view type, std::string_view reason,
             std::string_view message);

  kube::RestClient* const client_;
  Clock* const clock_;
  kube::Informer* const jobs_;
  kube::Informer* const pods_;
  kube::EventRecorder* const events_;
  OperatorMetrics* const metrics_;
  const ProfileJobControllerOptions options_;
  kube::RateLimitingQueue queue_;
  std::vector<std::thread> workers_;
  std::atomic<bool> stopping_{false};

  mutable Mutex mu_;
  // By job key.
  std::map<std::string, std::unique_ptr<Capture>> captures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace clusterprof::controllers

#endif  // CLUSTERPROF_OPERATOR_CONTROLLERS_PROFILEJOB_CONTROLLER_H_
