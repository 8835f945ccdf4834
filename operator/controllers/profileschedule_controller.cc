#include "operator/controllers/profileschedule_controller.h"

#include <algorithm>
#include <set>

#include "absl/time/time.h"
#include "common/check.h"
#include "common/status.h"
#include "common/storage/logdir.h"
#include "common/strings.h"
#include "operator/controllers/api.h"
#include "operator/controllers/cron.h"
#include "operator/controllers/worker.h"
#include "operator/kube/api_error.h"
#include "operator/kube/rate_limiter.h"
#include "operator/kube/selector.h"
#include "spdlog/spdlog.h"

namespace clusterprof::controllers {
namespace {

using web::json::value;

constexpr std::string_view kController = "profileschedule";

value Str(std::string_view s) { return value::string(std::string(s)); }

// A child ProfileJob as the controller sees it.
struct Child {
  std::string name;
  std::string uid;
  JobPhase phase = JobPhase::kPending;
  // For ordering the history: completion, else the scheduled time, else creation.
  std::string finished_or_created;
  std::string completion_time;
};

bool IsSuccess(JobPhase phase) {
  return phase == JobPhase::kSucceeded || phase == JobPhase::kPartiallySucceeded;
}

const kube::JsonObject* AsJson(const kube::ObjectPtr& object) {
  return dynamic_cast<const kube::JsonObject*>(object.get());
}

bool OwnedBy(const kube::ObjectMeta& child, std::string_view uid) {
  return std::any_of(child.owner_references.begin(), child.owner_references.end(),
                     [&](const kube::OwnerReference& ref) { return ref.uid == uid; });
}

std::optional<absl::Time> ReadTime(const value& status, const char* field) {
  if (!status.is_object() || !status.has_string_field(field)) return std::nullopt;
  absl::StatusOr<int64_t> ns = ParseTime(status.at(field).as_string());
  if (!ns.ok()) return std::nullopt;
  return absl::FromUnixNanos(*ns);
}

std::string FormatAbsl(absl::Time time) { return FormatTime(absl::ToUnixNanos(time)); }

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
    kube::RestClient* client, Clock* clock, kube::Informer* schedules, kube::Informer* jobs,
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

absl::Status ProfileScheduleController::Reconcile(const std::string& key) {
  const kube::ObjectPtr object = schedules_->store().Get(key);
  if (object == nullptr) return absl::OkStatus();
  const kube::JsonObject* schedule = AsJson(object);
  CLUSTERPROF_CHECK(schedule != nullptr) << "the ProfileSchedule informer must use JsonDecoder";
  const kube::ObjectMeta& meta = schedule->metadata;
  if (!meta.deletion_timestamp.empty()) return absl::OkStatus();
  const value null_value;
  const value& status_json =
      schedule->json.has_field("status") ? schedule->json.at("status") : null_value;
  const int64_t now_ns = clock_->WallNs();
  const absl::Time now = absl::FromUnixNanos(now_ns);

  // The new status, written at the end when it differs from the current one.
  value status = status_json.is_object() ? status_json : value::object();
  // Written over the cached object: its resourceVersion makes a write from a stale cache a
  // Conflict (requeued) instead of one that drops what a newer status holds (lastSuccessfulTime of
  // a job pruned since).
  const auto write_status = [&]() -> absl::Status {
    status["observedGeneration"] = value::number(meta.generation);
    if (status == status_json) return absl::OkStatus();
    value updated = schedule->json;
    updated["status"] = status;
    absl::StatusOr<value> written =
        client_->UpdateStatus(ProfileSchedules(), meta.namespace_, updated);
    return absl::IsNotFound(written.status()) ? absl::OkStatus() : written.status();
  };
  const auto set_valid = [&](bool valid, std::string_view reason, std::string_view message) {
    std::vector<Condition> conditions;
    if (status.has_field("conditions")) {
      // Conditions written by something else that do not parse are replaced.
      absl::StatusOr<std::vector<Condition>> parsed =
          ParseConditions(status.at("conditions"), "status.conditions");
      if (parsed.ok()) conditions = *std::move(parsed);
    }
    SetCondition(conditions,
                 {"Valid", valid ? "True" : "False", std::string(reason), std::string(message),
                  meta.generation, ""},
                 FormatTime(now_ns));
    status["conditions"] = ConditionsToJson(conditions);
  };
  const auto invalid = [&](std::string_view message) -> absl::Status {
    const bool already =
        status.has_string_field("message") && status.at("message").as_string() == message;
    set_valid(false, "InvalidSpec", message);
    status["message"] = Str(message);
    if (!already) Event(meta, kube::kEventTypeWarning, "InvalidSchedule", message);
    // Not requeued: nothing changes until the spec does (an update queues it).
    return write_status();
  };

  const value& spec_json =
      schedule->json.has_field("spec") ? schedule->json.at("spec") : null_value;
  absl::StatusOr<ProfileScheduleSpec> spec = ParseProfileScheduleSpec(spec_json);
  if (!spec.ok()) return invalid(StdView(spec.status().message()));
  absl::StatusOr<CronSchedule> cron = CronSchedule::Parse(spec->schedule);
  if (!cron.ok()) return invalid(StrCat("spec.schedule: ", cron.status().message()));
  absl::StatusOr<absl::TimeZone> zone = LoadScheduleTimeZone(spec->time_zone);
  if (!zone.ok()) return invalid(StrCat("spec.timeZone: ", zone.status().message()));
  if (!cron->Next(now, *zone).has_value() && !cron->Prev(now, *zone).has_value()) {
    return invalid(StrCat("spec.schedule: \"", spec->schedule,
                          "\" never fires (no date matches it); check the day and month fields"));
  }
  set_valid(true, "Valid", "the schedule and the job template are valid");
  if (status.has_field("message")) status.erase("message");

  // The children, from the cache.
  kube::LabelSelector selector;
  {
    absl::StatusOr<kube::LabelSelector> parsed =
        kube::LabelSelector::Parse(StrCat(kScheduleLabel, "=", meta.name));
    if (parsed.ok()) selector = *std::move(parsed);
  }
  std::vector<Child> active, succeeded, failed;
  std::set<std::string> child_names;
  for (const kube::ObjectPtr& job_object : jobs_->List(meta.namespace_, &selector)) {
    const kube::JsonObject* job = AsJson(job_object);
    if (job == nullptr || !OwnedBy(job->metadata, meta.uid)) continue;
    Child child;
    child.name = job->metadata.name;
    child.uid = job->metadata.uid;
    child_names.insert(child.name);
    const value& job_status = job->json.has_field("status") ? job->json.at("status") : null_value;
    if (job_status.is_object() && job_status.has_string_field("phase")) {
      child.phase = ParseJobPhase(job_status.at("phase").as_string());
    }
    if (job_status.is_object() && job_status.has_string_field("completionTime")) {
      child.completion_time = job_status.at("completionTime").as_string();
    }
    // RFC 3339 UTC strings of one format order as times do.
    child.finished_or_created =
        !child.completion_time.empty() ? child.completion_time : job->metadata.creation_timestamp;
    if (!job->metadata.deletion_timestamp.empty()) continue;
    if (!IsTerminal(child.phase)) {
      active.push_back(std::move(child));
    } else if (IsSuccess(child.phase)) {
      succeeded.push_back(std::move(child));
    } else {
      failed.push_back(std::move(child));
    }
  }

  spdlog::debug("profileschedule {}: {} active, {} succeeded, {} failed job(s)", key, active.size(),
                succeeded.size(), failed.size());
  // lastSuccessfulTime.
  std::optional<absl::Time> last_successful = ReadTime(status, "lastSuccessfulTime");
  for (const Child& child : succeeded) {
    absl::StatusOr<int64_t> completed = ParseTime(child.completion_time);
    if (completed.ok() &&
        (!last_successful.has_value() || absl::FromUnixNanos(*completed) > *last_successful)) {
      last_successful = absl::FromUnixNanos(*completed);
    }
  }
  if (last_successful.has_value()) status["lastSuccessfulTime"] = Str(FormatAbsl(*last_successful));
  // What is due.
  std::optional<absl::Time> last_schedule = ReadTime(status, "lastScheduleTime");
  std::optional<absl::Time> requeue_at;
  if (!spec->suspend) {
    absl::StatusOr<int64_t> created = ParseTime(meta.creation_timestamp);
    const absl::Time creation = created.ok() ? absl::FromUnixNanos(*created) : now;
    const MissedRuns due = ComputeMissedRuns(*cron, *zone, creation, last_schedule,
                                             spec->starting_deadline_seconds, now);
    requeue_at = due.next;
    if (due.too_many) {
      Event(meta, kube::kEventTypeWarning, "TooManyMissedTimes",
            StrCat("more than ", MissedRuns::kTooMany,
                   " start times were missed; starting the latest only. Set or lower "
                   "startingDeadlineSeconds, or check the operator's clock"));
    }
    if (due.most_recent.has_value()) {
      const absl::Time scheduled = *due.most_recent;
      const std::string child_name = StrCat(meta.name, "-", absl::ToUnixSeconds(scheduled) / 60);
      if (child_names.count(child_name) > 0) {
        // Created already (by us before a restart, or a moment ago).
        if (!last_schedule.has_value() || *last_schedule < scheduled) last_schedule = scheduled;
      } else if (!active.empty() && spec->concurrency_policy == ConcurrencyPolicy::kForbid) {
        Event(meta, kube::kEventTypeNormal, "JobAlreadyActive",
              StrCat("not starting the job for ", FormatAbsl(scheduled), ": ", active.front().name,
                     " is still running (concurrencyPolicy Forbid)"));
        // Looked at again when the active job finishes (its update queues the schedule).
      } else {
        if (spec->concurrency_policy == ConcurrencyPolicy::kReplace) {
          for (const Child& child : active) {
            kube::DeleteOptions options;
            options.uid = child.uid;
            options.propagation_policy = "Background";
            absl::Status deleted =
                client_->Delete(ProfileJobs(), meta.namespace_, child.name, options);
            if (!deleted.ok() && !absl::IsNotFound(deleted) && !kube::IsConflict(deleted)) {
              return deleted;
            }
            Event(meta, kube::kEventTypeNormal, "SuccessfulDelete",
                  StrCat("deleted active job ", child.name, " (concurrencyPolicy Replace)"));
          }
          active.clear();
        }
        value job = value::object();
        job["apiVersion"] = Str(kApiVersion);
        job["kind"] = Str("ProfileJob");
        value metadata = value::object();
        metadata["name"] = Str(child_name);
        metadata["namespace"] = Str(meta.namespace_);
        value labels = value::object();
        for (const auto& [k, v] : spec->job_labels) labels[k] = Str(v);
        labels[std::string(kScheduleLabel)] = Str(meta.name);
        metadata["labels"] = labels;
        value annotations = value::object();
        for (const auto& [k, v] : spec->job_annotations) annotations[k] = Str(v);
        annotations[std::string(kScheduledAtAnnotation)] = Str(FormatAbsl(scheduled));
        metadata["annotations"] = annotations;
        value owner = value::object();
        owner["apiVersion"] = Str(kApiVersion);
        owner["kind"] = Str("ProfileSchedule");
        owner["name"] = Str(meta.name);
        owner["uid"] = Str(meta.uid);
        owner["controller"] = value::boolean(true);
        owner["blockOwnerDeletion"] = value::boolean(true);
        metadata["ownerReferences"][0] = owner;
        job["metadata"] = metadata;
        value job_spec = spec->job_spec;
        // Every child needs a run of its own: a fixed run name gets the scheduled time.
        if (job_spec.has_string_field("runName") && !job_spec.at("runName").as_string().empty()) {
          job_spec["runName"] = Str(StrCat(job_spec.at("runName").as_string(), "_",
                                           storage::DefaultRunName(absl::ToUnixNanos(scheduled))));
        }
        job["spec"] = job_spec;
        absl::StatusOr<value> created = client_->Create(ProfileJobs(), meta.namespace_, job);
        if (created.ok()) {
          Event(meta, kube::kEventTypeNormal, "SuccessfulCreate",
                StrCat("created job ", child_name, " for ", FormatAbsl(scheduled)));
          Child child;
          child.name = child_name;
          absl::StatusOr<kube::ObjectMeta> created_meta = kube::DecodeObjectMeta(*created);
          if (created_meta.ok()) child.uid = created_meta->uid;
          active.push_back(std::move(child));
        } else if (!absl::IsAlreadyExists(created.status())) {
          if (kube::IsInvalid(created.status()) || kube::IsForbidden(created.status())) {
            Event(meta, kube::kEventTypeWarning, "FailedCreate",
                  StrCat("could not create job ", child_name, ": ", created.status().message()));
          }
          return created.status();
        }
        last_schedule = scheduled;
      }
    }
  }
  if (last_schedule.has_value()) status["lastScheduleTime"] = Str(FormatAbsl(*last_schedule));

  value active_refs = value::array();
  size_t i = 0;
  for (const Child& child : active) {
    value ref = value::object();
    ref["apiVersion"] = Str(kApiVersion);
    ref["kind"] = Str("ProfileJob");
    ref["name"] = Str(child.name);
    ref["namespace"] = Str(meta.namespace_);
    ref["uid"] = Str(child.uid);
    active_refs[i++] = ref;
  }
  if (active.empty()) {
    if (status.has_field("active")) status.erase("active");
  } else {
    status["active"] = active_refs;
  }
  status["activeCount"] = value::number(static_cast<int32_t>(active.size()));
  CLUSTERPROF_RETURN_IF_ERROR(write_status());
  // The history limits, once the status that records these jobs is written.
  for (auto [children, limit] :
       {std::pair<std::vector<Child>*, int32_t>{&succeeded, spec->successful_jobs_history_limit},
        {&failed, spec->failed_jobs_history_limit}}) {
    if (static_cast<int32_t>(children->size()) <= limit) continue;
    std::sort(children->begin(), children->end(), [](const Child& a, const Child& b) {
      return a.finished_or_created < b.finished_or_created;
    });
    const size_t excess = children->size() - static_cast<size_t>(limit);
    for (size_t i = 0; i < excess; ++i) {
      const Child& child = (*children)[i];
      kube::DeleteOptions options;
      options.uid = child.uid;
      options.propagation_policy = "Background";
      absl::Status deleted = client_->Delete(ProfileJobs(), meta.namespace_, child.name, options);
      if (!deleted.ok() && !absl::IsNotFound(deleted) && !kube::IsConflict(deleted)) {
        return deleted;
      }
      Event(meta, kube::kEventTypeNormal, "SuccessfulDelete",
            StrCat("deleted finished job ", child.name, " (history limit ", limit, ")"));
    }
  }
  if (requeue_at.has_value()) {
    // A little past the time, so the clock has reached it when the reconcile runs.
    const int64_t delay = absl::ToUnixNanos(*requeue_at) - now_ns + 100 * kNanosPerMilli;
    queue_.AddAfter(key, std::max<int64_t>(delay, 0));
  }
  return absl::OkStatus();
}

void ProfileScheduleController::Event(const kube::ObjectMeta& meta, std::string_view type,
                                      std::string_view reason, std::string_view message) {
  if (events_ == nullptr) return;
  events_->Event(ReferenceTo("ProfileSchedule", meta.namespace_, meta.name, meta.uid), type, reason,
                 message);
}

}  // namespace clusterprof::controllers
