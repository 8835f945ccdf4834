#include "operator/controllers/profileschedule_controller.h"

#include <algorithm>
#include <set>

#include "absl/time/time.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/storage/logdir.h"
#include "operator/api/types.h"
#include "operator/controllers/cron.h"
#include "operator/controllers/worker.h"
#include "operator/kube/api_error.h"
#include "operator/kube/rate_limiter.h"
#include "operator/kube/selector.h"
#include "spdlog/spdlog.h"

namespace clusterprof::controllers {

using Child = ProfileScheduleController::Child;
using Children = ProfileScheduleController::Children;

namespace {

using web::json::value;

constexpr std::string_view kController = "profileschedule";

value Str(std::string_view s) { return value::string(std::string(s)); }

bool IsSuccess(api::JobPhase phase) {
  return phase == api::JobPhase::kSucceeded || phase == api::JobPhase::kPartiallySucceeded;
}

const kube::JsonObject* AsJson(const kube::ObjectPtr& object) {
  return dynamic_cast<const kube::JsonObject*>(object.get());
}

bool OwnedBy(const kube::ObjectMeta& child, std::string_view uid) {
  return std::any_of(child.owner_references.begin(), child.owner_references.end(),
                     [&](const kube::OwnerReference& ref) { return ref.uid == uid; });
}

std::string FormatAbsl(absl::Time time) { return api::FormatTime(absl::ToUnixNanos(time)); }

}  // namespace

class ProfileScheduleController::JobHandler : public kube::ResourceEventHandler {
 public:
  explicit JobHandler(ProfileScheduleController* controller) : controller_(controller) {}
  void OnAdd(const kube::ObjectPtr& object, bool) override { controller_->EnqueueOwner(object); }
  void OnUpdate(const kube::ObjectPtr&, const kube::ObjectPtr& object) override {
    controller_->EnqueueOwner(object);
  }
  void OnDelete(const kube::ObjectPtr& object, bool) override { controller_->EnqueueOwner(object); }

 private:
  ProfileScheduleController* controller_;
};

ProfileScheduleController::ProfileScheduleController(
    kube::ApiClient* client, Clock* clock, kube::Informer* schedules, kube::Informer* jobs,
    kube::EventRecorder* events, OperatorMetrics* metrics, ProfileScheduleControllerOptions options)
    : client_(client),
      clock_(clock),
      schedules_(schedules),
      jobs_(jobs),
      events_(events),
      metrics_(metrics),
      options_(options),
      job_handler_(std::make_unique<JobHandler>(this)),
      queue_(clock, kube::DefaultControllerRateLimiter(clock),
             metrics != nullptr ? metrics->QueueMetrics("profileschedules") : nullptr) {}

ProfileScheduleController::~ProfileScheduleController() { Stop(); }

void ProfileScheduleController::Start() {
  schedules_->AddEventHandler(this);
  jobs_->AddEventHandler(job_handler_.get());
  for (int i = 0; i < std::max(1, options_.workers); ++i) {
    workers_.emplace_back([this] { Worker(); });
  }
}

void ProfileScheduleController::Stop() {
  queue_.ShutDown();
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  workers_.clear();
}

void ProfileScheduleController::OnAdd(const kube::ObjectPtr& object, bool) {
  queue_.Add(object->metadata.Key());
}
void ProfileScheduleController::OnUpdate(const kube::ObjectPtr&,
                                         const kube::ObjectPtr& new_object) {
  queue_.Add(new_object->metadata.Key());
}
void ProfileScheduleController::OnDelete(const kube::ObjectPtr& object, bool) {
  queue_.Add(object->metadata.Key());
}

void ProfileScheduleController::EnqueueOwner(const kube::ObjectPtr& job) {
  for (const kube::OwnerReference& ref : job->metadata.owner_references) {
    if (ref.kind == "ProfileSchedule" && ref.controller) {
      queue_.Add(kube::ObjectKey(job->metadata.namespace_, ref.name));
    }
  }
}

void ProfileScheduleController::Worker() {
  RunWorker(queue_, kController, metrics_,
            [this](const std::string& key) { return Reconcile(key); });
}

// The parts of a valid spec the reconcile needs.
struct ValidSchedule {
  api::ProfileScheduleSpec spec;
  CronSchedule cron;
  absl::TimeZone zone;
};

namespace {

// The spec checked: InvalidArgument with what to fix.
absl::StatusOr<ValidSchedule> Validate(const value& spec_json, absl::Time now) {
  absl::StatusOr<api::ProfileScheduleSpec> spec = api::ParseProfileScheduleSpec(spec_json);
  if (!spec.ok()) return spec.status();
  absl::StatusOr<CronSchedule> cron = CronSchedule::Parse(spec->schedule);
  if (!cron.ok()) {
    return absl::InvalidArgumentError(StrCat("spec.schedule: ", cron.status().message()));
  }
  absl::StatusOr<absl::TimeZone> zone = LoadScheduleTimeZone(spec->time_zone);
  if (!zone.ok()) {
    return absl::InvalidArgumentError(StrCat("spec.timeZone: ", zone.status().message()));
  }
  if (!cron->Next(now, *zone).has_value() && !cron->Prev(now, *zone).has_value()) {
    return absl::InvalidArgumentError(
        StrCat("spec.schedule: \"", spec->schedule,
               "\" never fires (no date matches it); check the day and month fields"));
  }
  return ValidSchedule{*std::move(spec), *std::move(cron), *zone};
}

// "<schedule>-<minutes since the epoch>": one name per scheduled time.
std::string ChildName(std::string_view schedule, absl::Time scheduled) {
  return StrCat(schedule, "-", absl::ToUnixSeconds(scheduled) / 60);
}

// The ProfileJob a schedule creates for `scheduled`: the template, the schedule's label and
// annotation, and a controller owner reference.
value ChildJob(const kube::ObjectMeta& schedule, const api::ProfileScheduleSpec& spec,
               absl::Time scheduled) {
  value metadata = value::object();
  metadata["name"] = Str(ChildName(schedule.name, scheduled));
  metadata["namespace"] = Str(schedule.namespace_);
  value labels = value::object();
  for (const auto& [k, v] : spec.job_labels) labels[k] = Str(v);
  labels[std::string(api::kScheduleLabel)] = Str(schedule.name);
  metadata["labels"] = labels;
  value annotations = value::object();
  for (const auto& [k, v] : spec.job_annotations) annotations[k] = Str(v);
  annotations[std::string(api::kScheduledAtAnnotation)] = Str(FormatAbsl(scheduled));
  metadata["annotations"] = annotations;
  value owner = value::object();
  owner["apiVersion"] = Str(api::kApiVersion);
  owner["kind"] = Str("ProfileSchedule");
  owner["name"] = Str(schedule.name);
  owner["uid"] = Str(schedule.uid);
  owner["controller"] = value::boolean(true);
  owner["blockOwnerDeletion"] = value::boolean(true);
  metadata["ownerReferences"][0] = owner;
  value job_spec = spec.job_spec;
  // Every child needs a run of its own: a fixed run name gets the scheduled time.
  if (job_spec.has_string_field("runName") && !job_spec.at("runName").as_string().empty()) {
    job_spec["runName"] = Str(StrCat(job_spec.at("runName").as_string(), "_",
                                     storage::DefaultRunName(absl::ToUnixNanos(scheduled))));
  }
  value job = value::object();
  job["apiVersion"] = Str(api::kApiVersion);
  job["kind"] = Str("ProfileJob");
  job["metadata"] = metadata;
  job["spec"] = job_spec;
  return job;
}

// The latest completion among `succeeded`, or `previous` when later.
std::string LastSuccessful(const std::string& previous, const std::vector<Child>& succeeded) {
  std::string latest = previous;
  for (const Child& child : succeeded) {
    // RFC 3339 UTC strings of one format order as times do.
    if (api::ParseTime(child.completion_time).ok() && child.completion_time > latest) {
      latest = child.completion_time;
    }
  }
  return latest;
}

}  // namespace

absl::Status ProfileScheduleController::Reconcile(const std::string& key) {
  const kube::ObjectPtr object = schedules_->store().Get(key);
  if (object == nullptr) return absl::OkStatus();
  const kube::JsonObject* schedule = AsJson(object);
  CLUSTERPROF_CHECK(schedule != nullptr) << "the ProfileSchedule informer must use JsonDecoder";
  const kube::ObjectMeta& meta = schedule->metadata;
  if (!meta.deletion_timestamp.empty()) return absl::OkStatus();
  const value null_value;
  const int64_t now_ns = clock_->WallNs();
  const absl::Time now = absl::FromUnixNanos(now_ns);

  // Conditions or fields written by something else that do not parse are replaced.
  const absl::StatusOr<api::ProfileScheduleStatus> current = api::ParseProfileScheduleStatus(
      schedule->json.has_field("status") ? schedule->json.at("status") : null_value);
  api::ProfileScheduleStatus status = current.value_or(api::ProfileScheduleStatus{});
  status.observed_generation = meta.generation;

  absl::StatusOr<ValidSchedule> valid =
      Validate(schedule->json.has_field("spec") ? schedule->json.at("spec") : null_value, now);
  if (!valid.ok()) {
    const std::string message(valid.status().message());
    if (status.message != message) Event(meta, kube::kEventTypeWarning, "InvalidSchedule", message);
    status.message = message;
    api::SetCondition(status.conditions,
                      {"Valid", "False", "InvalidSpec", message, meta.generation, ""},
                      api::FormatTime(now_ns));
    // Not requeued: nothing changes until the spec does (an update queues it).
    return WriteStatus(*schedule, current, status);
  }
  status.message.clear();
  api::SetCondition(status.conditions,
                    {"Valid", "True", "Valid", "the schedule and the job template are valid",
                     meta.generation, ""},
                    api::FormatTime(now_ns));

  Children children = ListChildren(meta);
  spdlog::debug("profileschedule {}: {} active, {} succeeded, {} failed job(s)", key,
                children.active.size(), children.succeeded.size(), children.failed.size());
  status.last_successful_time = LastSuccessful(status.last_successful_time, children.succeeded);
  std::optional<absl::Time> requeue_at;
  if (!valid->spec.suspend) {
    absl::StatusOr<std::optional<absl::Time>> next =
        StartDueJob(meta, *valid, now, children, status);
    if (!next.ok()) return next.status();
    requeue_at = *next;
  }
  status.active.clear();
  for (const Child& child : children.active) {
    status.active.push_back({child.name, meta.namespace_, child.uid});
  }
  CLUSTERPROF_RETURN_IF_ERROR(WriteStatus(*schedule, current, status));
  // The history limits, once the status that records these jobs is written.
  CLUSTERPROF_RETURN_IF_ERROR(
      PruneHistory(meta, children.succeeded, valid->spec.successful_jobs_history_limit));
  CLUSTERPROF_RETURN_IF_ERROR(
      PruneHistory(meta, children.failed, valid->spec.failed_jobs_history_limit));
  if (requeue_at.has_value()) {
    // A little past the time, so the clock has reached it when the reconcile runs.
    const int64_t delay = absl::ToUnixNanos(*requeue_at) - now_ns + 100 * kNanosPerMilli;
    queue_.AddAfter(key, std::max<int64_t>(delay, 0));
  }
  return absl::OkStatus();
}

ProfileScheduleController::Children ProfileScheduleController::ListChildren(
    const kube::ObjectMeta& meta) {
  Children children;
  kube::LabelSelector selector;
  if (absl::StatusOr<kube::LabelSelector> parsed =
          kube::LabelSelector::Parse(StrCat(api::kScheduleLabel, "=", meta.name));
      parsed.ok()) {
    selector = *std::move(parsed);
  }
  const value null_value;
  for (const kube::ObjectPtr& job_object : jobs_->List(meta.namespace_, &selector)) {
    const kube::JsonObject* job = AsJson(job_object);
    if (job == nullptr || !OwnedBy(job->metadata, meta.uid)) continue;
    Child child;
    child.name = job->metadata.name;
    child.uid = job->metadata.uid;
    children.names.insert(child.name);
    const value& job_status = job->json.has_field("status") ? job->json.at("status") : null_value;
    if (job_status.is_object() && job_status.has_string_field("phase")) {
      child.phase = api::ParseJobPhase(job_status.at("phase").as_string());
    }
    if (job_status.is_object() && job_status.has_string_field("completionTime")) {
      child.completion_time = job_status.at("completionTime").as_string();
    }
    child.finished_or_created =
        !child.completion_time.empty() ? child.completion_time : job->metadata.creation_timestamp;
    if (!job->metadata.deletion_timestamp.empty()) continue;
    if (!api::IsTerminal(child.phase)) {
      children.active.push_back(std::move(child));
    } else if (IsSuccess(child.phase)) {
      children.succeeded.push_back(std::move(child));
    } else {
      children.failed.push_back(std::move(child));
    }
  }
  return children;
}

absl::StatusOr<std::optional<absl::Time>> ProfileScheduleController::StartDueJob(
    const kube::ObjectMeta& meta, const ValidSchedule& valid, absl::Time now, Children& children,
    api::ProfileScheduleStatus& status) {
  std::optional<absl::Time> last_schedule;
  if (absl::StatusOr<int64_t> last = api::ParseTime(status.last_schedule_time); last.ok()) {
    last_schedule = absl::FromUnixNanos(*last);
  }
  absl::StatusOr<int64_t> created = api::ParseTime(meta.creation_timestamp);
  const absl::Time creation = created.ok() ? absl::FromUnixNanos(*created) : now;
  const MissedRuns due = ComputeMissedRuns(valid.cron, valid.zone, creation, last_schedule,
                                           valid.spec.starting_deadline_seconds, now);
  if (due.too_many) {
    Event(meta, kube::kEventTypeWarning, "TooManyMissedTimes",
          StrCat("more than ", MissedRuns::kTooMany,
                 " start times were missed; starting the latest only. Set or lower "
                 "startingDeadlineSeconds, or check the operator's clock"));
  }
  if (!due.most_recent.has_value()) return due.next;
  const absl::Time scheduled = *due.most_recent;
  const std::string child_name = ChildName(meta.name, scheduled);
  const auto record = [&] {
    if (!last_schedule.has_value() || *last_schedule < scheduled) {
      status.last_schedule_time = FormatAbsl(scheduled);
    }
  };
  if (children.names.count(child_name) > 0) {
    record();  // created already (by us before a restart, or a moment ago)
    return due.next;
  }
  if (!children.active.empty() &&
      valid.spec.concurrency_policy == api::ConcurrencyPolicy::kForbid) {
    Event(meta, kube::kEventTypeNormal, "JobAlreadyActive",
          StrCat("not starting the job for ", FormatAbsl(scheduled), ": ",
                 children.active.front().name, " is still running (concurrencyPolicy Forbid)"));
    // Looked at again when the active job finishes (its update queues the schedule).
    return due.next;
  }
  if (valid.spec.concurrency_policy == api::ConcurrencyPolicy::kReplace) {
    for (const Child& child : children.active) {
      CLUSTERPROF_RETURN_IF_ERROR(
          DeleteChild(meta, child, "active job", "concurrencyPolicy Replace"));
    }
    children.active.clear();
  }
  absl::StatusOr<value> job =
      client_->Create(api::ProfileJobs(), meta.namespace_, ChildJob(meta, valid.spec, scheduled));
  if (job.ok()) {
    Event(meta, kube::kEventTypeNormal, "SuccessfulCreate",
          StrCat("created job ", child_name, " for ", FormatAbsl(scheduled)));
    Child child;
    child.name = child_name;
    if (absl::StatusOr<kube::ObjectMeta> job_meta = kube::DecodeObjectMeta(*job); job_meta.ok()) {
      child.uid = job_meta->uid;
    }
    children.active.push_back(std::move(child));
  } else if (!absl::IsAlreadyExists(job.status())) {
    if (kube::IsInvalid(job.status()) || kube::IsForbidden(job.status())) {
      Event(meta, kube::kEventTypeWarning, "FailedCreate",
            StrCat("could not create job ", child_name, ": ", job.status().message()));
    }
    return job.status();
  }
  status.last_schedule_time = FormatAbsl(scheduled);
  return due.next;
}

absl::Status ProfileScheduleController::DeleteChild(const kube::ObjectMeta& meta,
                                                    const Child& child, std::string_view what,
                                                    std::string_view why) {
  kube::DeleteOptions options;
  options.uid = child.uid;
  options.propagation_policy = "Background";
  absl::Status deleted = client_->Delete(api::ProfileJobs(), meta.namespace_, child.name, options);
  if (!deleted.ok() && !absl::IsNotFound(deleted) && !kube::IsConflict(deleted)) return deleted;
  Event(meta, kube::kEventTypeNormal, "SuccessfulDelete",
        StrCat("deleted ", what, " ", child.name, " (", why, ")"));
  return absl::OkStatus();
}

absl::Status ProfileScheduleController::PruneHistory(const kube::ObjectMeta& meta,
                                                     std::vector<Child> children, int32_t limit) {
  if (static_cast<int32_t>(children.size()) <= limit) return absl::OkStatus();
  std::sort(children.begin(), children.end(), [](const Child& a, const Child& b) {
    return a.finished_or_created < b.finished_or_created;
  });
  const size_t excess = children.size() - static_cast<size_t>(limit);
  for (size_t i = 0; i < excess; ++i) {
    CLUSTERPROF_RETURN_IF_ERROR(
        DeleteChild(meta, children[i], "finished job", StrCat("history limit ", limit)));
  }
  return absl::OkStatus();
}

absl::Status ProfileScheduleController::WriteStatus(
    const kube::JsonObject& schedule, const absl::StatusOr<api::ProfileScheduleStatus>& current,
    const api::ProfileScheduleStatus& status) {
  if (current.ok() && *current == status) return absl::OkStatus();
  // Written over the cached object: its resourceVersion makes a write from a stale cache a
  // Conflict (requeued) instead of one that drops what a newer status holds (lastSuccessfulTime
  // of a job pruned since).
  value updated = schedule.json;
  updated["status"] = api::ProfileScheduleStatusToJson(status);
  absl::StatusOr<value> written =
      client_->UpdateStatus(api::ProfileSchedules(), schedule.metadata.namespace_, updated);
  return absl::IsNotFound(written.status()) ? absl::OkStatus() : written.status();
}

void ProfileScheduleController::Event(const kube::ObjectMeta& meta, std::string_view type,
                                      std::string_view reason, std::string_view message) {
  if (events_ == nullptr) return;
  events_->Event(api::ReferenceTo("ProfileSchedule", meta.namespace_, meta.name, meta.uid), type,
                 reason, message);
}

}  // namespace clusterprof::controllers
