// The ProfileSchedule controller: creates a ProfileJob from the schedule's jobTemplate at each
// time of its cron schedule, with the semantics of Kubernetes CronJob (the v2 controller):
//
// - the most recent schedule time in (lastScheduleTime or creation, now] is the one acted on;
//   with startingDeadlineSeconds, times older than now - deadline are missed for good; more
//   than 100 missed times give a TooManyMissedTimes warning (the latest still runs);
// - child names are deterministic, "<schedule>-<minutes since the epoch of the scheduled time>",
//   so a restarted operator never creates a time's job twice (the create gets AlreadyExists);
// - concurrencyPolicy: Allow runs jobs side by side; Forbid (the default: a sidecar runs one
//   capture at a time) skips a time while a child is active, and runs it later if it is still
//   within the starting deadline; Replace deletes the active children first;
// - suspend stops new jobs (missed times are judged when it is lifted, as CronJob does);
// - successful (Succeeded, PartiallySucceeded) and failed children beyond the history limits are
//   deleted, oldest first;
// - status: active children, lastScheduleTime, lastSuccessfulTime, a Valid condition that names
//   what is wrong with an invalid schedule.
//
// Children carry an owner reference (controller) to the schedule and the clusterprof.io/schedule
// label. Time comes from the injected clock, so tests drive schedules with a SimulatedClock.
// Thread-safe.
#ifndef CLUSTERPROF_OPERATOR_CONTROLLERS_PROFILESCHEDULE_CONTROLLER_H_
#define CLUSTERPROF_OPERATOR_CONTROLLERS_PROFILESCHEDULE_CONTROLLER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "operator/api/types.h"
#include "operator/controllers/metrics.h"
#include "operator/kube/api_client.h"
#include "operator/kube/event_recorder.h"
#include "operator/kube/informer.h"
#include "operator/kube/workqueue.h"

namespace clusterprof::controllers {

// A schedule whose spec, cron expression and time zone are valid (defined in the .cc).
struct ValidSchedule;

struct ProfileScheduleControllerOptions {
  int workers = 1;
};

class ProfileScheduleController : public kube::ResourceEventHandler {
 public:
  // `schedules` and `jobs` are informers (JsonDecoder) over the same namespaces. `events` and
  // `metrics` may be null. Everything must outlive the controller.
  ProfileScheduleController(kube::ApiClient* client, Clock* clock, kube::Informer* schedules,
                            kube::Informer* jobs, kube::EventRecorder* events,
                            OperatorMetrics* metrics,
                            ProfileScheduleControllerOptions options = {});
  ~ProfileScheduleController() override;
  ProfileScheduleController(const ProfileScheduleController&) = delete;
  ProfileScheduleController& operator=(const ProfileScheduleController&) = delete;

  // Registers with both informers and starts the workers.
  void Start();
  void Stop();

  // One reconcile of the schedule `key`; public for tests. An error requeues it.
  absl::Status Reconcile(const std::string& key);

  void OnAdd(const kube::ObjectPtr& object, bool initial_list) override;
  void OnUpdate(const kube::ObjectPtr& old_object, const kube::ObjectPtr& new_object) override;
  void OnDelete(const kube::ObjectPtr& object, bool final_state_unknown) override;

  // A child ProfileJob as the controller sees it.
  struct Child {
    std::string name;
    std::string uid;
    api::JobPhase phase = api::JobPhase::kPending;
    // For ordering the history: completion, else creation.
    std::string finished_or_created;
    std::string completion_time;
  };
  struct Children {
    std::vector<Child> active, succeeded, failed;
    std::set<std::string> names;
  };

 private:
  // Queues the owning schedule when a child job changes.
  class JobHandler;

  // The schedule's children in the job cache (owned by it, not being deleted).
  Children ListChildren(const kube::ObjectMeta& meta);
  // Creates the job for the most recent time that is due, as the concurrency policy allows,
  // recording it in `status` and `children`; returns the next time to look again.
  absl::StatusOr<std::optional<absl::Time>> StartDueJob(const kube::ObjectMeta& meta,
                                                        const ValidSchedule& valid, absl::Time now,
                                                        Children& children,
                                                        api::ProfileScheduleStatus& status);
  absl::Status DeleteChild(const kube::ObjectMeta& meta, const Child& child, std::string_view what,
                           std::string_view why);
  // Deletes the oldest of `children` beyond `limit`.
  absl::Status PruneHistory(const kube::ObjectMeta& meta, std::vector<Child> children,
                            int32_t limit);
  // Writes `status` over the cached schedule when it differs from `current`.
  absl::Status WriteStatus(const kube::JsonObject& schedule,
                           const absl::StatusOr<api::ProfileScheduleStatus>& current,
                           const api::ProfileScheduleStatus& status);

  void Worker();
  void EnqueueOwner(const kube::ObjectPtr& job);
  void Event(const kube::ObjectMeta& meta, std::string_view type, std::string_view reason,
             std::string_view message);

  kube::ApiClient* const client_;
  Clock* const clock_;
  kube::Informer* const schedules_;
  kube::Informer* const jobs_;
  kube::EventRecorder* const events_;
  OperatorMetrics* const metrics_;
  const ProfileScheduleControllerOptions options_;
  std::unique_ptr<JobHandler> job_handler_;
  kube::RateLimitingQueue queue_;
  std::vector<std::thread> workers_;
};

}  // namespace clusterprof::controllers

#endif  // CLUSTERPROF_OPERATOR_CONTROLLERS_PROFILESCHEDULE_CONTROLLER_H_
