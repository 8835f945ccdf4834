#include "operator/controllers/profiletrigger_controller.h"

#include <algorithm>
#include <chrono>

#include "absl/time/time.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "operator/controllers/capture_lifecycle.h"
#include "operator/controllers/targets.h"
#include "operator/controllers/worker.h"
#include "operator/kube/api_error.h"
#include "operator/kube/rate_limiter.h"
#include "operator/kube/selector.h"
#include "spdlog/spdlog.h"

namespace clusterprof::controllers {

using Child = ProfileTriggerController::Child;

namespace {

using web::json::value;

constexpr std::string_view kController = "profiletrigger";
constexpr size_t kRecentFirings = 10;

value Str(std::string_view s) { return value::string(std::string(s)); }

const kube::JsonObject* AsJson(const kube::ObjectPtr& object) {
  return dynamic_cast<const kube::JsonObject*>(object.get());
}

bool OwnedBy(const kube::ObjectMeta& child, std::string_view uid) {
  return std::any_of(child.owner_references.begin(), child.owner_references.end(),
                     [&](const kube::OwnerReference& ref) { return ref.uid == uid; });
}

std::string UtcDay(int64_t wall_ns) {
  return absl::FormatTime("%Y-%m-%d", absl::FromUnixNanos(wall_ns), absl::UTCTimeZone());
}

// The ProfileJob of one firing.
value ChildJob(const kube::ObjectMeta& trigger, const api::ProfileTriggerSpec& spec,
               const api::TriggerFiringStatus& firing) {
  value metadata = value::object();
  metadata["name"] = Str(firing.job);
  metadata["namespace"] = Str(trigger.namespace_);
  value labels = value::object();
  labels[std::string(api::kTriggerLabel)] = Str(trigger.name);
  metadata["labels"] = labels;
  value annotations = value::object();
  annotations[std::string(api::kTriggerRuleAnnotation)] = Str(firing.rule);
  annotations[std::string(api::kTriggerEvidenceAnnotation)] = Str(firing.evidence);
  metadata["annotations"] = annotations;
  value owner = value::object();
  owner["apiVersion"] = Str(api::kApiVersion);
  owner["kind"] = Str("ProfileTrigger");
  owner["name"] = Str(trigger.name);
  owner["uid"] = Str(trigger.uid);
  owner["controller"] = value::boolean(true);
  owner["blockOwnerDeletion"] = value::boolean(true);
  metadata["ownerReferences"][0] = owner;
  value job = value::object();
  job["apiVersion"] = Str(api::kApiVersion);
  job["kind"] = Str("ProfileJob");
  job["metadata"] = metadata;
  job["spec"] = spec.job_spec;
  return job;
}

// What a followed sidecar is called: its pod's name; for spec.targets.addresses the name the
// sidecar reports, else the address.
std::string NameOf(const coordinator::WatchedSidecar& sidecar,
                   const std::map<std::string, std::string>& names) {
  auto name = names.find(sidecar.address);
  if (name != names.end() && name->second != sidecar.address) return name->second;
  return sidecar.host_name.empty() ? sidecar.address : sidecar.host_name;
}

// The pods' steps on one clock, for the rules: those with a name and steps.
std::vector<analysis::PodSteps> PodStepsOf(const std::vector<coordinator::WatchedSidecar>& sidecars,
                                           const std::map<std::string, std::string>& names) {
  std::vector<analysis::PodSteps> pods;
  for (const coordinator::WatchedSidecar& sidecar : sidecars) {
    if (sidecar.steps.empty()) continue;
    analysis::PodSteps pod;
    pod.pod = NameOf(sidecar, names);
    pod.clock_offset_ns = sidecar.clock_offset_ns;
    pod.steps = sidecar.steps;
    pods.push_back(std::move(pod));
  }
  return pods;
}

}  // namespace

class ProfileTriggerController::JobHandler : public kube::ResourceEventHandler {
 public:
  explicit JobHandler(ProfileTriggerController* controller) : controller_(controller) {}
  void OnAdd(const kube::ObjectPtr& object, bool) override { controller_->EnqueueOwner(object); }
  void OnUpdate(const kube::ObjectPtr&, const kube::ObjectPtr& object) override {
    controller_->EnqueueOwner(object);
  }
  void OnDelete(const kube::ObjectPtr& object, bool) override { controller_->EnqueueOwner(object); }

 private:
  ProfileTriggerController* controller_;
};

// A pod that comes, goes or gets its IP changes what the triggers of its namespace follow.
class ProfileTriggerController::PodHandler : public kube::ResourceEventHandler {
 public:
  explicit PodHandler(ProfileTriggerController* controller) : controller_(controller) {}
  void OnAdd(const kube::ObjectPtr& object, bool) override { Enqueue(object); }
  void OnUpdate(const kube::ObjectPtr& old_object, const kube::ObjectPtr& object) override {
    const auto* before = dynamic_cast<const kube::Pod*>(old_object.get());
    const auto* after = dynamic_cast<const kube::Pod*>(object.get());
    if (before != nullptr && after != nullptr && before->pod_ip == after->pod_ip &&
        before->phase == after->phase && before->ready == after->ready) {
      return;
    }
    Enqueue(object);
  }
  void OnDelete(const kube::ObjectPtr& object, bool) override { Enqueue(object); }

 private:
  void Enqueue(const kube::ObjectPtr& pod) {
    for (const kube::ObjectPtr& trigger : controller_->triggers_->List(pod->metadata.namespace_)) {
      controller_->queue_.Add(trigger->metadata.Key());
    }
  }
  ProfileTriggerController* controller_;
};

ProfileTriggerController::ProfileTriggerController(kube::ApiClient* client, Clock* clock,
                                                   kube::Informer* triggers, kube::Informer* jobs,
                                                   kube::Informer* pods,
                                                   kube::EventRecorder* events,
                                                   OperatorMetrics* metrics,
                                                   ProfileTriggerControllerOptions options)
    : client_(client),
      clock_(clock),
      triggers_(triggers),
      jobs_(jobs),
      pods_(pods),
      events_(events),
      metrics_(metrics),
      options_(std::move(options)),
      job_handler_(std::make_unique<JobHandler>(this)),
      pod_handler_(std::make_unique<PodHandler>(this)),
      queue_(clock, kube::DefaultControllerRateLimiter(clock),
             metrics != nullptr ? metrics->QueueMetrics("profiletriggers") : nullptr) {}

ProfileTriggerController::~ProfileTriggerController() { Stop(); }

void ProfileTriggerController::Start() {
  triggers_->AddEventHandler(this);
  jobs_->AddEventHandler(job_handler_.get());
  pods_->AddEventHandler(pod_handler_.get());
  for (int i = 0; i < std::max(1, options_.workers); ++i) {
    workers_.emplace_back([this] { Worker(); });
  }
  evaluator_ = std::thread([this] { Evaluator(); });
}

void ProfileTriggerController::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  queue_.ShutDown();
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  workers_.clear();
  if (evaluator_.joinable()) evaluator_.join();
  std::map<std::string, std::unique_ptr<Watch>> watches;
  {
    MutexLock lock(&mu_);
    watches.swap(watches_);
  }
  watches.clear();  // closes the streams, outside the mutex
}

void ProfileTriggerController::OnAdd(const kube::ObjectPtr& object, bool) {
  queue_.Add(object->metadata.Key());
}
void ProfileTriggerController::OnUpdate(const kube::ObjectPtr&, const kube::ObjectPtr& object) {
  queue_.Add(object->metadata.Key());
}
void ProfileTriggerController::OnDelete(const kube::ObjectPtr& object, bool) {
  queue_.Add(object->metadata.Key());
}

void ProfileTriggerController::EnqueueOwner(const kube::ObjectPtr& job) {
  for (const kube::OwnerReference& ref : job->metadata.owner_references) {
    if (ref.kind == "ProfileTrigger" && ref.controller) {
      queue_.Add(kube::ObjectKey(job->metadata.namespace_, ref.name));
    }
  }
}

void ProfileTriggerController::Worker() {
  RunWorker(queue_, kController, metrics_,
            [this](const std::string& key) { return Reconcile(key); });
}

void ProfileTriggerController::Evaluator() {
  while (true) {
    {
      MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_; },
                               std::chrono::milliseconds(options_.evaluate_interval_ms))) {
        return;
      }
    }
    EvaluateAll();
  }
}

void ProfileTriggerController::EvaluateAll() {
  const int64_t now_ns = clock_->WallNs();
  std::vector<std::string> due;
  MutexLock lock(&mu_);
  for (auto& [key, watch] : watches_) {
    watch->sidecars = watch->source->Snapshot();
    analysis::TriggerEvaluation evaluation = analysis::EvaluateTriggerRules(
        watch->rules, PodStepsOf(watch->sidecars, watch->pods), now_ns);
    const bool fires = !evaluation.firings.empty();
    watch->evaluation = std::move(evaluation);
    if (fires || now_ns - watch->last_status_ns >= options_.status_interval_ms * kNanosPerMilli) {
      due.push_back(key);
    }
  }
  for (const std::string& key : due) queue_.Add(key);
}

std::optional<std::string> ProfileTriggerController::StepsJson(const std::string& key,
                                                               size_t max_steps) {
  std::vector<coordinator::WatchedSidecar> sidecars;
  std::map<std::string, std::string> names;
  {
    MutexLock lock(&mu_);
    auto it = watches_.find(key);
    if (it == watches_.end()) return std::nullopt;
    sidecars = it->second->source->Snapshot();
    names = it->second->pods;
  }
  value out = value::object();
  out["trigger"] = Str(key);
  out["sidecars"] = value::array();
  for (size_t i = 0; i < sidecars.size(); ++i) {
    const coordinator::WatchedSidecar& s = sidecars[i];
    value sidecar = value::object();
    sidecar["address"] = Str(s.address);
    sidecar["pod"] = Str(NameOf(s, names));
    sidecar["connected"] = value::boolean(s.connected);
    sidecar["error"] = Str(s.error);
    sidecar["lastMessageNs"] = value::number(s.last_message_ns);
    sidecar["clockOffsetNs"] = value::number(s.clock_offset_ns);
    sidecar["clockUncertaintyNs"] = value::number(s.clock_uncertainty_ns);
    sidecar["processes"] = value::number(s.processes);
    sidecar["processesWithSteps"] = value::number(s.processes_with_steps);
    sidecar["stepSource"] = Str(s.step_source);
    sidecar["stepsTotal"] = value::number(s.steps_total);
    sidecar["lastStepEndNs"] = value::number(s.last_step_end_ns);
    sidecar["recorderLevel"] = value::number(s.recorder_level);
    sidecar["recorderWindowMs"] = value::number(s.recorder_window_ms);
    value steps = value::array();
    const size_t first = s.steps.size() > max_steps ? s.steps.size() - max_steps : 0;
    for (size_t j = first; j < s.steps.size(); ++j) {
      const analysis::StepDigest& step = s.steps[j];
      value row = value::array(4);
      row[0] = value::number(step.step);
      row[1] = value::number(step.start_ns);
      row[2] = value::number(step.end_ns);
      row[3] = value::number(step.collective_entry_ns);
      steps[j - first] = row;
    }
    sidecar["steps"] = steps;
    out["sidecars"][i] = sidecar;
  }
  return out.serialize();
}

void ProfileTriggerController::Unfollow(const std::string& key) {
  std::unique_ptr<Watch> watch;
  {
    MutexLock lock(&mu_);
    auto it = watches_.find(key);
    if (it == watches_.end()) return;
    watch = std::move(it->second);
    watches_.erase(it);
  }
  // The streams close here, outside the mutex.
}

void ProfileTriggerController::Follow(const std::string& key, const api::ProfileTriggerSpec& spec,
                                      const kube::ObjectMeta& meta, int* followed,
                                      std::vector<std::string>* skipped) {
  std::vector<kube::ObjectPtr> pods;
  if (spec.capture.selector.has_value())
    pods = pods_->List(meta.namespace_, &*spec.capture.selector);
  TargetResolution resolution = ResolveTargets(spec.capture, pods);
  if (!options_.allow_external_addresses && !spec.capture.addresses.empty()) {
    const std::vector<std::string> outside =
        AddressesOutsideNamespace(spec.capture, pods_->List(meta.namespace_));
    std::erase_if(resolution.targets, [&outside](const ResolvedTarget& target) {
      return std::find(outside.begin(), outside.end(), target.address) != outside.end();
    });
    for (const std::string& address : outside) {
      resolution.skipped.push_back(
          StrCat(address, ": not a pod of namespace ", meta.namespace_,
                 " (the operator's --allow-external-addresses lets it be followed)"));
    }
  }
  std::vector<std::string> addresses;
  std::map<std::string, std::string> names;
  for (const ResolvedTarget& target : resolution.targets) {
    addresses.push_back(target.address);
    names[target.address] = target.name;
  }
  *followed = static_cast<int>(addresses.size());
  *skipped = resolution.skipped;
  coordinator::StepSource* source = nullptr;
  {
    MutexLock lock(&mu_);
    std::unique_ptr<Watch>& watch = watches_[key];
    if (watch == nullptr) {
      watch = std::make_unique<Watch>();
      if (options_.step_source) {
        watch->source = options_.step_source();
      } else {
        coordinator::StepWatcher::Options watch_options;
        watch_options.auth_token_file = options_.sidecar_token_file;
        watch_options.security = options_.sidecar_security;
        watch_options.clock = clock_;
        watch->source = std::make_unique<coordinator::StepWatcher>(watch_options);
      }
    }
    watch->rules = spec.rules;
    watch->pods = names;
    source = watch->source.get();
  }
  // Outside the mutex: it may join the threads of streams that end. The watch stays while this
  // worker runs (only reconciles of this key, serialized by the queue, remove it).
  source->SetTargets(addresses);
}

absl::Status ProfileTriggerController::Reconcile(const std::string& key) {
  const kube::ObjectPtr object = triggers_->store().Get(key);
  if (object == nullptr) {
    Unfollow(key);
    return absl::OkStatus();
  }
  const kube::JsonObject* trigger = AsJson(object);
  CLUSTERPROF_CHECK(trigger != nullptr) << "the ProfileTrigger informer must use JsonDecoder";
  const kube::ObjectMeta& meta = trigger->metadata;
  if (!meta.deletion_timestamp.empty()) {
    Unfollow(key);
    return absl::OkStatus();
  }
  const value null_value;
  const int64_t now_ns = clock_->WallNs();
  const absl::StatusOr<api::ProfileTriggerStatus> current = api::ParseProfileTriggerStatus(
      trigger->json.has_field("status") ? trigger->json.at("status") : null_value);
  api::ProfileTriggerStatus status = current.value_or(api::ProfileTriggerStatus{});
  status.observed_generation = meta.generation;
  const std::string now_text = api::FormatTime(now_ns);

  absl::StatusOr<api::ProfileTriggerSpec> spec = api::ParseProfileTriggerSpec(
      trigger->json.has_field("spec") ? trigger->json.at("spec") : null_value,
      options_.recorder_window_ms);
  if (!spec.ok()) {
    Unfollow(key);
    const std::string message(spec.status().message());
    const api::Condition* valid = api::FindCondition(status.conditions, "Valid");
    if (valid == nullptr || valid->message != message) {
      Event(meta, kube::kEventTypeWarning, "InvalidSpec", message);
    }
    api::SetCondition(status.conditions,
                      {"Valid", "False", "InvalidSpec", message, meta.generation, ""}, now_text);
    return WriteStatus(trigger->json, meta.namespace_, current, status);
  }
  api::SetCondition(
      status.conditions,
      {"Valid", "True", "Valid", "the rules and the capture are valid", meta.generation, ""},
      now_text);
  status.rules = spec->rules_summary;
  std::optional<value> written;
  CLUSTERPROF_RETURN_IF_ERROR(ReconcileValid(*trigger, *spec, status, now_ns, &written));
  CLUSTERPROF_RETURN_IF_ERROR(
      WriteStatus(written.has_value() ? *written : trigger->json, meta.namespace_,
                  written.has_value()
                      ? absl::StatusOr<api::ProfileTriggerStatus>(absl::UnknownError("rewritten"))
                      : current,
                  status));
  // Finished jobs beyond the history limits, once the status that records them is written.
  std::vector<Child> succeeded, failed;
  for (Child& child : ListChildren(meta)) {
    if (child.phase == api::JobPhase::kSucceeded ||
        child.phase == api::JobPhase::kPartiallySucceeded) {
      succeeded.push_back(std::move(child));
    } else if (child.phase == api::JobPhase::kFailed) {
      failed.push_back(std::move(child));
    }
  }
  CLUSTERPROF_RETURN_IF_ERROR(
      PruneHistory(meta, std::move(succeeded), spec->successful_jobs_history_limit));
  CLUSTERPROF_RETURN_IF_ERROR(
      PruneHistory(meta, std::move(failed), spec->failed_jobs_history_limit));
  return absl::OkStatus();
}

absl::Status ProfileTriggerController::ReconcileValid(const kube::JsonObject& trigger,
                                                      const api::ProfileTriggerSpec& spec,
                                                      api::ProfileTriggerStatus& status,
                                                      int64_t now_ns,
                                                      std::optional<value>* written) {
  const kube::ObjectMeta& meta = trigger.metadata;
  const std::string key = meta.Key();
  const std::string now_text = api::FormatTime(now_ns);

  // A firing recorded in the status whose job was not created yet (the operator stopped in
  // between): created now, under the recorded name.
  if (!status.last_job.empty() && !status.last_job_created && !status.recent_firings.empty() &&
      status.recent_firings.front().job == status.last_job) {
    CLUSTERPROF_RETURN_IF_ERROR(CreateJob(meta, spec, status.recent_firings.front()));
    status.last_job_created = true;
  }
  status.active.clear();
  for (const Child& child : ListChildren(meta)) {
    if (!api::IsTerminal(child.phase)) {
      status.active.push_back({child.name, meta.namespace_, child.uid});
    }
  }
  if (spec.suspend) {
    Unfollow(key);
    api::SetCondition(status.conditions,
                      {"Watching", "False", "Suspended",
                       "spec.suspend is true: the pods' steps are not followed and no rule fires",
                       meta.generation, ""},
                      now_text);
    return absl::OkStatus();
  }
  int followed = 0;
  std::vector<std::string> skipped;
  Follow(key, spec, meta, &followed, &skipped);
  std::optional<analysis::TriggerEvaluation> evaluation;
  {
    MutexLock lock(&mu_);
    Watch& watch = *watches_.at(key);
    evaluation = watch.evaluation;
    watch.last_status_ns = now_ns;
    SetWatchingConditions(meta, followed, skipped, watch.sidecars, watch.pods, now_text, status);
  }
  if (evaluation.has_value()) CopyTelemetry(evaluation->telemetry, status);
  const Limits limits = SetLimitConditions(meta, spec, now_ns, now_text, status);

  if (!evaluation.has_value() || evaluation->firings.empty()) return absl::OkStatus();
  const analysis::TriggerFiring& firing = evaluation->firings.front();
  // One firing per detection: the rule must hold again on a step newer than the one the last
  // firing was detected on (a reconcile may run on an evaluation it already acted on).
  if (!status.recent_firings.empty() &&
      firing.detected_ns <= status.recent_firings.front().detected_ns) {
    return absl::OkStatus();
  }
  if (limits.cooling || limits.capped || !status.active.empty()) {
    const std::string_view reason = limits.cooling  ? "cooldown"
                                    : limits.capped ? "daily-cap"
                                                    : "active-job";
    if (metrics_ != nullptr) metrics_->TriggerSuppressed(reason);
    if (limits.capped && !limits.was_capped) {
      Event(meta, kube::kEventTypeWarning, "DailyCapReached",
            StrCat(firing.rule, " held (", firing.evidence, ") but maxCapturesPerDay ",
                   spec.max_captures_per_day, " is reached for today"));
    }
    return absl::OkStatus();
  }
  return Fire(trigger, spec, firing, now_ns, status, written);
}

void ProfileTriggerController::SetWatchingConditions(
    const kube::ObjectMeta& meta, int followed, const std::vector<std::string>& skipped,
    const std::vector<coordinator::WatchedSidecar>& sidecars,
    const std::map<std::string, std::string>& names, const std::string& now_text,
    api::ProfileTriggerStatus& status) {
  api::SetCondition(
      status.conditions,
      followed > 0
          ? api::Condition{"Watching", "True", "Following",
                           StrCat("following the live steps of ", followed, " pod(s)",
                                  skipped.empty() ? ""
                                                  : StrCat("; left out: ", JoinNames(skipped, 10))),
                           meta.generation, ""}
          : api::Condition{"Watching", "False", "NoTargets",
                           StrCat("no pod to follow: ", skipped.empty()
                                                            ? "none matches spec.targets"
                                                            : JoinNames(skipped, 10)),
                           meta.generation, ""},
      now_text);
  status.pods = static_cast<int32_t>(sidecars.size());
  if (sidecars.empty()) return;
  // Pods that report no steps, each with why.
  std::vector<std::string> silent;
  for (const coordinator::WatchedSidecar& sidecar : sidecars) {
    if (!sidecar.steps.empty()) continue;
    const std::string pod = NameOf(sidecar, names);
    if (!sidecar.connected && sidecar.last_message_ns == 0) {
      silent.push_back(StrCat(pod, " (its sidecar does not answer",
                              sidecar.error.empty() ? "" : StrCat(": ", sidecar.error), ")"));
    } else if (sidecar.processes == 0) {
      silent.push_back(StrCat(pod, " (no instrumented process attached)"));
    } else {
      silent.push_back(StrCat(pod, " (", sidecar.processes,
                              " process(es) attached, none marks steps: ", sidecar.step_source,
                              ")"));
    }
  }
  api::SetCondition(status.conditions,
                    silent.empty()
                        ? api::Condition{"NoStepTelemetry", "False", "AllPodsReportSteps",
                                         "every followed pod reports steps", meta.generation, ""}
                        : api::Condition{"NoStepTelemetry", "True", "PodsWithoutSteps",
                                         StrCat("no steps from ", JoinNames(silent, 10),
                                                "; mark steps with step_num (docs/annotations.md)"),
                                         meta.generation, ""},
                    now_text);
}

void ProfileTriggerController::CopyTelemetry(const analysis::JobTelemetry& telemetry,
                                             api::ProfileTriggerStatus& status) {
  status.pods_with_steps = telemetry.pods_with_steps;
  status.last_step = telemetry.last_step;
  status.step_time_ns = telemetry.step_p50_ns;
  status.step_time = telemetry.step_p50_ns > 0 ? api::FormatDuration(telemetry.step_p50_ns) : "";
  status.baseline_ns = telemetry.baseline_ns;
  status.baseline = telemetry.baseline_ns > 0 ? api::FormatDuration(telemetry.baseline_ns) : "";
}

ProfileTriggerController::Limits ProfileTriggerController::SetLimitConditions(
    const kube::ObjectMeta& meta, const api::ProfileTriggerSpec& spec, int64_t now_ns,
    const std::string& now_text, api::ProfileTriggerStatus& status) {
  Limits limits;
  // The cooldown and the daily cap, from the status (they hold across restarts).
  limits.cooling = status.last_fired_ns > 0 &&
                   now_ns - status.last_fired_ns < spec.cooldown_seconds * kNanosPerSecond;
  api::SetCondition(
      status.conditions,
      limits.cooling
          ? api::Condition{"CooldownActive", "True", "Cooldown",
                           StrCat("fired at ", status.last_fired_time, "; no firing before ",
                                  api::FormatTime(status.last_fired_ns +
                                                  spec.cooldown_seconds * kNanosPerSecond),
                                  " (cooldownSeconds ", spec.cooldown_seconds, ")"),
                           meta.generation, ""}
          : api::Condition{"CooldownActive", "False", "Ready", "a rule may fire", meta.generation,
                           ""},
      now_text);
  const std::string today = UtcDay(now_ns);
  if (status.captures_day != today) {
    status.captures_day = today;
    status.captures_today = 0;
  }
  limits.capped = status.captures_today >= spec.max_captures_per_day;
  const api::Condition* was_capped = api::FindCondition(status.conditions, "DailyCapReached");
  limits.was_capped = was_capped != nullptr && was_capped->status == "True";
  api::SetCondition(
      status.conditions,
      limits.capped ? api::Condition{"DailyCapReached", "True", "DailyCap",
                                     StrCat(status.captures_today, " captures today (", today,
                                            ", UTC): maxCapturesPerDay ", spec.max_captures_per_day,
                                            " reached; rules fire again tomorrow"),
                                     meta.generation, ""}
                    : api::Condition{"DailyCapReached", "False", "BelowCap",
                                     StrCat(status.captures_today, " of ",
                                            spec.max_captures_per_day, " captures today (UTC)"),
                                     meta.generation, ""},
      now_text);
  return limits;
}

absl::Status ProfileTriggerController::Fire(const kube::JsonObject& trigger,
                                            const api::ProfileTriggerSpec& spec,
                                            const analysis::TriggerFiring& firing, int64_t now_ns,
                                            api::ProfileTriggerStatus& status,
                                            std::optional<value>* written) {
  const kube::ObjectMeta& meta = trigger.metadata;
  const std::string now_text = api::FormatTime(now_ns);
  // The status first (so a new leader never fires twice for this episode), then the job.
  api::TriggerFiringStatus record;
  record.time = now_text;
  record.detected_ns = firing.detected_ns;
  record.rule = firing.rule;
  record.evidence = firing.evidence;
  // A stall names every pod: the status keeps the first 20 (the evidence counts them all).
  record.pods.assign(
      firing.pods.begin(),
      firing.pods.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(firing.pods.size(), 20)));
  record.first_step = firing.first_step;
  record.last_step = firing.last_step;
  record.job = StrCat(meta.name, "-", std::max<int64_t>(firing.detected_ns, 0) / kNanosPerSecond);
  status.last_fired_time = now_text;
  status.last_fired_ns = now_ns;
  status.last_job = record.job;
  status.last_job_created = false;
  status.recent_firings.insert(status.recent_firings.begin(), record);
  if (status.recent_firings.size() > kRecentFirings) status.recent_firings.resize(kRecentFirings);
  ++status.captures_today;
  api::SetCondition(status.conditions,
                    {"CooldownActive", "True", "Cooldown",
                     StrCat("fired at ", now_text, "; no firing before ",
                            api::FormatTime(now_ns + spec.cooldown_seconds * kNanosPerSecond),
                            " (cooldownSeconds ", spec.cooldown_seconds, ")"),
                     meta.generation, ""},
                    now_text);
  value updated = trigger.json;
  updated["status"] = api::ProfileTriggerStatusToJson(status);
  absl::StatusOr<value> recorded =
      client_->UpdateStatus(api::ProfileTriggers(), meta.namespace_, updated);
  // A conflict means another writer got there first: the next reconcile sees its status.
  if (!recorded.ok()) return recorded.status();
  *written = *std::move(recorded);
  CLUSTERPROF_RETURN_IF_ERROR(CreateJob(meta, spec, record));
  status.last_job_created = true;
  status.active.push_back({record.job, meta.namespace_, ""});
  if (metrics_ != nullptr) metrics_->TriggerFired(firing.rule);
  Event(meta, kube::kEventTypeNormal, "Triggered",
        StrCat(firing.rule, ": ", firing.evidence, "; capturing ", spec.capture.duration_ms,
               " ms with ", spec.capture.lookback_ms, " ms before, as ProfileJob ", record.job));
  spdlog::info("profiletrigger {}: {} fired ({}); created ProfileJob {}", meta.Key(), firing.rule,
               firing.evidence, record.job);
  return absl::OkStatus();
}

absl::Status ProfileTriggerController::CreateJob(const kube::ObjectMeta& meta,
                                                 const api::ProfileTriggerSpec& spec,
                                                 const api::TriggerFiringStatus& firing) {
  absl::StatusOr<value> job =
      client_->Create(api::ProfileJobs(), meta.namespace_, ChildJob(meta, spec, firing));
  if (job.ok() || absl::IsAlreadyExists(job.status())) return absl::OkStatus();
  if (kube::IsInvalid(job.status()) || kube::IsForbidden(job.status())) {
    Event(meta, kube::kEventTypeWarning, "FailedCreate",
          StrCat("could not create job ", firing.job, ": ", job.status().message()));
  }
  return job.status();
}

std::vector<Child> ProfileTriggerController::ListChildren(const kube::ObjectMeta& meta) {
  std::vector<Child> children;
  kube::LabelSelector selector;
  if (absl::StatusOr<kube::LabelSelector> parsed =
          kube::LabelSelector::Parse(StrCat(api::kTriggerLabel, "=", meta.name));
      parsed.ok()) {
    selector = *std::move(parsed);
  }
  const value null_value;
  for (const kube::ObjectPtr& job_object : jobs_->List(meta.namespace_, &selector)) {
    const kube::JsonObject* job = AsJson(job_object);
    if (job == nullptr || !OwnedBy(job->metadata, meta.uid)) continue;
    if (!job->metadata.deletion_timestamp.empty()) continue;
    Child child;
    child.name = job->metadata.name;
    child.uid = job->metadata.uid;
    const value& job_status = job->json.has_field("status") ? job->json.at("status") : null_value;
    std::string completion;
    if (job_status.is_object() && job_status.has_string_field("phase")) {
      child.phase = api::ParseJobPhase(job_status.at("phase").as_string());
    }
    if (job_status.is_object() && job_status.has_string_field("completionTime")) {
      completion = job_status.at("completionTime").as_string();
    }
    child.finished_or_created = !completion.empty() ? completion : job->metadata.creation_timestamp;
    children.push_back(std::move(child));
  }
  return children;
}

absl::Status ProfileTriggerController::PruneHistory(const kube::ObjectMeta& meta,
                                                    std::vector<Child> children, int32_t limit) {
  if (static_cast<int32_t>(children.size()) <= limit) return absl::OkStatus();
  std::sort(children.begin(), children.end(), [](const Child& a, const Child& b) {
    return a.finished_or_created < b.finished_or_created;
  });
  const size_t excess = children.size() - static_cast<size_t>(limit);
  for (size_t i = 0; i < excess; ++i) {
    kube::DeleteOptions options;
    options.uid = children[i].uid;
    options.propagation_policy = "Background";
    absl::Status deleted =
        client_->Delete(api::ProfileJobs(), meta.namespace_, children[i].name, options);
    if (!deleted.ok() && !absl::IsNotFound(deleted) && !kube::IsConflict(deleted)) return deleted;
    Event(meta, kube::kEventTypeNormal, "SuccessfulDelete",
          StrCat("deleted finished job ", children[i].name, " (history limit ", limit, ")"));
  }
  return absl::OkStatus();
}

absl::Status ProfileTriggerController::WriteStatus(
    const value& base, const std::string& ns,
    const absl::StatusOr<api::ProfileTriggerStatus>& current,
    const api::ProfileTriggerStatus& status) {
  if (current.ok() && *current == status) return absl::OkStatus();
  value updated = base;
  updated["status"] = api::ProfileTriggerStatusToJson(status);
  absl::StatusOr<value> written = client_->UpdateStatus(api::ProfileTriggers(), ns, updated);
  return absl::IsNotFound(written.status()) ? absl::OkStatus() : written.status();
}

void ProfileTriggerController::Event(const kube::ObjectMeta& meta, std::string_view type,
                                     std::string_view reason, std::string_view message) {
  if (events_ == nullptr) return;
  events_->Event(api::ReferenceTo("ProfileTrigger", meta.namespace_, meta.name, meta.uid), type,
                 reason, message);
}

}  // namespace clusterprof::controllers
