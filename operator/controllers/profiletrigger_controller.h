// The ProfileTrigger controller (docs/triggers.md): captures without a human.
//
// For each valid, unsuspended trigger it follows the live steps of the sidecars of the pods its
// targets select (Sidecar.WatchSteps, one StepSource per trigger), and an evaluator thread runs
// the trigger's rules (analysis/trigger_rules.h) over them every 100 ms. When a rule holds, the
// trigger is reconciled at once, and the reconcile decides from the trigger's status, which is
// what survives a restart or a failover:
//
// - cooldown: nothing fires within cooldownSeconds of status.lastFiredNs;
// - daily cap: at most maxCapturesPerDay firings per UTC day (status.capturesDay/Today);
// - one at a time: nothing fires while a job the trigger created is still running.
//
// A firing is written to the status first (lastFiredTime, lastJob, lastJobCreated false), then
// the job is created, then lastJobCreated is set: a new leader that finds lastJobCreated false
// creates the job under the recorded name (AlreadyExists is fine), and one that finds it true
// never fires again for the same episode. The job is named "<trigger>-<unix seconds of the
// detection>", labelled clusterprof.io/trigger and owned by the trigger; a Triggered Event
// carries the evidence. Finished jobs beyond the history limits are deleted, oldest first.
//
// Status also shows the job's live telemetry (step time, baseline, pods with steps), written at
// most every status_interval, and conditions: Valid, Watching, NoStepTelemetry (naming the pods
// without step markers or unreachable sidecars), CooldownActive, DailyCapReached.
#ifndef CLUSTERPROF_OPERATOR_CONTROLLERS_PROFILETRIGGER_CONTROLLER_H_
#define CLUSTERPROF_OPERATOR_CONTROLLERS_PROFILETRIGGER_CONTROLLER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "analysis/trigger_rules.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "common/grpc/tls.h"
#include "coordinator/step_watcher.h"
#include "operator/api/trigger.h"
#include "operator/controllers/metrics.h"
#include "operator/kube/api_client.h"
#include "operator/kube/event_recorder.h"
#include "operator/kube/informer.h"
#include "operator/kube/workqueue.h"

namespace clusterprof::controllers {

struct ProfileTriggerControllerOptions {
  int workers = 1;
  // How long the sidecars' flight recorders keep annotations (the chart's
  // sidecar.recorder.windowMs): a longer capture.lookbackMs is refused. -1: not checked.
  int64_t recorder_window_ms = 30'000;
  // How often the rules are evaluated, and how often the status's telemetry is refreshed.
  int64_t evaluate_interval_ms = 100;
  int64_t status_interval_ms = 10'000;
  // Makes the StepSource of each trigger; default: a StepWatcher that sends the token of
  // `sidecar_token_file` (reread each time a stream to a sidecar opens; empty: none) over
  // `sidecar_security` (null: plaintext).
  std::function<std::unique_ptr<coordinator::StepSource>()> step_source;
  std::string sidecar_token_file;
  std::shared_ptr<const tls::ChannelSecurity> sidecar_security;
  // As ProfileJobControllerOptions::allow_external_addresses: off, capture.targets.addresses
  // that are not pods of the trigger's namespace are not followed (and its jobs fail).
  bool allow_external_addresses = false;
};

class ProfileTriggerController : public kube::ResourceEventHandler {
 public:
  // `triggers`, `jobs` (JsonDecoder) and `pods` (PodDecoder) are informers over the same
  // namespaces. `events` and `metrics` may be null. Everything must outlive the controller.
  ProfileTriggerController(kube::ApiClient* client, Clock* clock, kube::Informer* triggers,
                           kube::Informer* jobs, kube::Informer* pods, kube::EventRecorder* events,
                           OperatorMetrics* metrics, ProfileTriggerControllerOptions options = {});
  ~ProfileTriggerController() override;
  ProfileTriggerController(const ProfileTriggerController&) = delete;
  ProfileTriggerController& operator=(const ProfileTriggerController&) = delete;

  // Registers with the informers and starts the workers and the evaluator.
  void Start();
  void Stop();

  // One reconcile of the trigger `key`; public for tests. An error requeues it.
  absl::Status Reconcile(const std::string& key);
  // Evaluates the rules of every followed trigger once, queueing those whose rules hold; the
  // evaluator thread does this every evaluate_interval_ms. Public for tests.
  void EvaluateAll();

  // The live steps of a followed trigger's pods, as JSON (`clusterprof top --operator-addr`
  // reads it from the operator's health port, /triggers/<namespace>/<name>): each sidecar's
  // address, pod, connection, clock offset, processes, recorder and its last `max_steps` steps
  // ([number, start_ns, end_ns, collective_entry_ns] on the pod's clock). nullopt when this
  // replica does not follow the trigger (no such trigger, suspended, or not the leader).
  std::optional<std::string> StepsJson(const std::string& key, size_t max_steps = 256);

  void OnAdd(const kube::ObjectPtr& object, bool initial_list) override;
  void OnUpdate(const kube::ObjectPtr& old_object, const kube::ObjectPtr& new_object) override;
  void OnDelete(const kube::ObjectPtr& object, bool final_state_unknown) override;

  struct Child {
    std::string name;
    std::string uid;
    api::JobPhase phase = api::JobPhase::kPending;
    std::string finished_or_created;
  };

 private:
  class JobHandler;
  class PodHandler;

  // What is followed for one trigger, and the last evaluation of its rules.
  struct Watch {
    analysis::TriggerRules rules;
    std::unique_ptr<coordinator::StepSource> source;
    // target address -> pod name (the host name when the sidecar has not said)
    std::map<std::string, std::string> pods;
    std::optional<analysis::TriggerEvaluation> evaluation;
    std::vector<coordinator::WatchedSidecar> sidecars;
    int64_t last_status_ns = 0;
  };

  // `written` is set to the trigger as the server returned it when a firing wrote its status
  // (so the reconcile's last write goes over that version, not the cached one).
  absl::Status ReconcileValid(const kube::JsonObject& trigger, const api::ProfileTriggerSpec& spec,
                              api::ProfileTriggerStatus& status, int64_t now_ns,
                              std::optional<web::json::value>* written);
  // The Watching and NoStepTelemetry conditions (each silent pod named with why) and the count
  // of followed pods.
  static void SetWatchingConditions(const kube::ObjectMeta& meta, int followed,
                                    const std::vector<std::string>& skipped,
                                    const std::vector<coordinator::WatchedSidecar>& sidecars,
                                    const std::map<std::string, std::string>& names,
                                    const std::string& now_text, api::ProfileTriggerStatus& status);
  // The job's live step figures into the status.
  static void CopyTelemetry(const analysis::JobTelemetry& telemetry,
                            api::ProfileTriggerStatus& status);
  // What holds a firing back: the cooldown and the daily cap (its day rolled over at UTC
  // midnight), each set as a condition.
  struct Limits {
    bool cooling = false;
    bool capped = false;
    bool was_capped = false;  // DailyCapReached was already True
  };
  static Limits SetLimitConditions(const kube::ObjectMeta& meta,
                                   const api::ProfileTriggerSpec& spec, int64_t now_ns,
                                   const std::string& now_text, api::ProfileTriggerStatus& status);
  // Records `firing` in the status (written first, into `written`, so that a new leader never
  // fires twice for it), then creates its ProfileJob.
  absl::Status Fire(const kube::JsonObject& trigger, const api::ProfileTriggerSpec& spec,
                    const analysis::TriggerFiring& firing, int64_t now_ns,
                    api::ProfileTriggerStatus& status, std::optional<web::json::value>* written);
  // Starts, updates or stops following the trigger's pods.
  void Follow(const std::string& key, const api::ProfileTriggerSpec& spec,
              const kube::ObjectMeta& meta, int* followed, std::vector<std::string>* skipped);
  void Unfollow(const std::string& key);
  std::vector<Child> ListChildren(const kube::ObjectMeta& meta);
  absl::Status CreateJob(const kube::ObjectMeta& meta, const api::ProfileTriggerSpec& spec,
                         const api::TriggerFiringStatus& firing);
  absl::Status PruneHistory(const kube::ObjectMeta& meta, std::vector<Child> children,
                            int32_t limit);
  // Writes `status` over `base` (the trigger as last read or written) when it differs from
  // `current`. A Conflict is returned (and the key requeued): a write over a stale copy never
  // replaces a newer status, which holds the firings the cooldown counts from.
  absl::Status WriteStatus(const web::json::value& base, const std::string& ns,
                           const absl::StatusOr<api::ProfileTriggerStatus>& current,
                           const api::ProfileTriggerStatus& status);
  void Worker();
  void Evaluator();
  void EnqueueOwner(const kube::ObjectPtr& job);
  void Event(const kube::ObjectMeta& meta, std::string_view type, std::string_view reason,
             std::string_view message);

  kube::ApiClient* const client_;
  Clock* const clock_;
  kube::Informer* const triggers_;
  kube::Informer* const jobs_;
  kube::Informer* const pods_;
  kube::EventRecorder* const events_;
  OperatorMetrics* const metrics_;
  const ProfileTriggerControllerOptions options_;
  std::unique_ptr<JobHandler> job_handler_;
  std::unique_ptr<PodHandler> pod_handler_;
  kube::RateLimitingQueue queue_;
  std::vector<std::thread> workers_;
  std::thread evaluator_;

  Mutex mu_;
  std::map<std::string, std::unique_ptr<Watch>> watches_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace clusterprof::controllers

#endif  // CLUSTERPROF_OPERATOR_CONTROLLERS_PROFILETRIGGER_CONTROLLER_H_
