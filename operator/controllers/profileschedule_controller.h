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
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "operator/controllers/metrics.h"
#include "operator/kube/event_recorder.h"
#include "operator/kube/informer.h"
#include "operator/kube/rest_client.h"
#include "operator/kube/workqueue.h"

namespace clusterprof::controllers {

struct ProfileScheduleControllerOptions {
  int workers = 1;
};

class ProfileScheduleController : public kube::ResourceEventHandler {
 public:
  // `schedules` and `jobs` are informers (JsonDecoder) over the same namespaces. `events` and
  // `metrics` may be null. Everything must outlive the controller.
  ProfileScheduleController(kube::RestClient* client, Clock* clock, kube::Informer* schedules,
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

 private:
  // Queues the owning schedule when a child job changes.
  class JobHandler;

  void Worker();
  void EnqueueOwner(const kube::ObjectPtr& job);
  void Event(const kube::ObjectMeta& meta, std::string_view type, std::string_view reason,
             std::string_view message);

  kube::RestClient* const client_;
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
