#include "operator/controllers/profilejob_controller.h"

#include <algorithm>
#include <cstdlib>
#include <future>
#include <optional>

#include "absl/strings/str_join.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/base/token_file.h"
#include "common/storage/logdir.h"
#include "coordinator/connector.h"
#include "coordinator/coordinator.h"
#include "operator/controllers/capture_lifecycle.h"
#include "operator/controllers/targets.h"
#include "operator/controllers/worker.h"
#include "operator/kube/api_error.h"
#include "operator/kube/rate_limiter.h"
#include "operator/kube/retry.h"
#include "spdlog/spdlog.h"

namespace clusterprof::controllers {
namespace {

constexpr std::string_view kController = "profilejob";
const kube::JsonObject* AsJson(const kube::ObjectPtr& object) {
  return dynamic_cast<const kube::JsonObject*>(object.get());
}

}  // namespace

ProfileJobController::ProfileJobController(kube::ApiClient* client, Clock* clock,
                                           kube::Informer* jobs, kube::Informer* pods,
                                           kube::EventRecorder* events, OperatorMetrics* metrics,
                                           ProfileJobControllerOptions options)
    : client_(client),
      clock_(clock),
      jobs_(jobs),
      pods_(pods),
      events_(events),
      metrics_(metrics),
      options_(options),
      status_writer_(client, clock),
      queue_(clock, kube::DefaultControllerRateLimiter(clock),
             metrics != nullptr ? metrics->QueueMetrics("profilejobs") : nullptr) {}

ProfileJobController::~ProfileJobController() { Stop(0); }

void ProfileJobController::Start() {
  jobs_->AddEventHandler(this);
  pods_->AddEventHandler(&pod_waker_);
  for (int i = 0; i < std::max(1, options_.workers); ++i) {
    workers_.emplace_back([this] { Worker(); });
  }
}

bool ProfileJobController::Stop(int64_t capture_grace_ns) {
  stopping_ = true;
  queue_.ShutDown();
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  workers_.clear();
  const int64_t deadline = clock_->MonotonicNs() + capture_grace_ns;
  while (RunningCaptures() > 0 && clock_->MonotonicNs() < deadline) {
    clock_->SleepForNs(std::min<int64_t>(50 * kNanosPerMilli, deadline - clock_->MonotonicNs()));
  }
  std::map<std::string, std::unique_ptr<Capture>> captures;
  {
    MutexLock lock(&mu_);
    captures.swap(captures_);
  }
  bool all_finished = true;
  for (auto& [key, capture] : captures) {
    // Cancelled: its calls end, and it returns without a final status. The sidecars finish the
    // capture (it outlives its client) and a future operator reads it back.
    if (!capture->finished) {
      all_finished = false;
      capture->cancel.Cancel();
    }
  }
  for (auto& [key, capture] : captures) {
    if (capture->thread.joinable()) capture->thread.join();
  }
  return all_finished;
}

int ProfileJobController::RunningCaptures() const {
  MutexLock lock(&mu_);
  int running = 0;
  for (const auto& [key, capture] : captures_) running += capture->finished ? 0 : 1;
  return running;
}

void ProfileJobController::OnAdd(const kube::ObjectPtr& object, bool) {
  queue_.Add(object->metadata.Key());
}
void ProfileJobController::OnUpdate(const kube::ObjectPtr&, const kube::ObjectPtr& new_object) {
  queue_.Add(new_object->metadata.Key());
  if (HoldsNoTargets(*new_object)) WakeQueued(new_object->metadata.namespace_);
}
void ProfileJobController::OnDelete(const kube::ObjectPtr& object, bool) {
  Dequeue(object->metadata.uid);
  queue_.Add(object->metadata.Key());
  WakeQueued(object->metadata.namespace_);
}

void ProfileJobController::PodWaker::OnAdd(const kube::ObjectPtr& pod, bool initial_list) {
  if (!initial_list) controller_->WakeWaiting(pod->metadata.namespace_);
}
void ProfileJobController::PodWaker::OnUpdate(const kube::ObjectPtr&,
                                              const kube::ObjectPtr& new_pod) {
  controller_->WakeWaiting(new_pod->metadata.namespace_);
}
void ProfileJobController::PodWaker::OnDelete(const kube::ObjectPtr& pod, bool) {
  controller_->WakeWaiting(pod->metadata.namespace_);
}

void ProfileJobController::WakeWaiting(const std::string& ns) {
  MutexLock lock(&queued_mu_);
  auto it = waiting_for_pods_.find(ns);
  if (it == waiting_for_pods_.end()) return;
  for (const std::string& key : it->second) queue_.Add(key);
}

void ProfileJobController::Dequeue(const std::string& uid) {
  MutexLock lock(&queued_mu_);
  queued_since_.erase(uid);
}

bool ProfileJobController::HoldsNoTargets(const kube::Object& object) {
  const kube::JsonObject* job = dynamic_cast<const kube::JsonObject*>(&object);
  if (job == nullptr || !job->json.has_field("status")) return false;
  const web::json::value& status = job->json.at("status");
  return status.has_string_field("phase") &&
         api::IsTerminal(api::ParseJobPhase(status.at("phase").as_string()));
}

void ProfileJobController::WakeQueued(const std::string& ns) {
  // A job that ended (or went) may have freed what queued jobs wait for: look at them now
  // rather than at their next poll. From the cache only: this runs on capture threads, which
  // must not take mu_ (a worker joins them under it).
  for (const JobClaim& claim : CachedClaims(ns)) {
    if (claim.queued) queue_.Add(kube::ObjectKey(ns, claim.name));
  }
}

void ProfileJobController::Worker() {
  RunWorker(queue_, kController, metrics_,
            [this](const std::string& key) { return Reconcile(key); });
}

void ProfileJobController::RefreshMetrics() {
  if (metrics_ == nullptr) return;
  std::map<std::string, int> counts;
  for (api::JobPhase phase :
       {api::JobPhase::kPending, api::JobPhase::kScheduled, api::JobPhase::kCapturing,
        api::JobPhase::kSucceeded, api::JobPhase::kPartiallySucceeded, api::JobPhase::kFailed}) {
    counts[std::string(api::JobPhaseName(phase))] = 0;
  }
  for (const kube::ObjectPtr& object : jobs_->List()) {
    const kube::JsonObject* job = AsJson(object);
    if (job == nullptr || !job->json.has_field("status")) {
      ++counts["Pending"];
      continue;
    }
    const web::json::value& status = job->json.at("status");
    std::string phase = "Pending";
    if (status.is_object() && status.has_string_field("phase")) {
      phase = std::string(api::JobPhaseName(api::ParseJobPhase(status.at("phase").as_string())));
    }
    ++counts[phase];
  }
  metrics_->SetJobsByPhase(counts);
}

absl::Status ProfileJobController::Reconcile(const std::string& key) {
  const kube::ObjectPtr object = jobs_->store().Get(key);
  if (object == nullptr) {
    ForgetDeleted(key);
    return absl::OkStatus();
  }
  const kube::JsonObject* job = AsJson(object);
  CLUSTERPROF_CHECK(job != nullptr) << "the ProfileJob informer must use JsonDecoder";
  const kube::ObjectMeta& meta = job->metadata;
  if (!meta.deletion_timestamp.empty()) return absl::OkStatus();

  const web::json::value null_value;
  const web::json::value& status_json =
      job->json.has_field("status") ? job->json.at("status") : null_value;
  absl::StatusOr<api::ProfileJobStatus> parsed_status = api::ParseProfileJobStatus(status_json);
  if (!parsed_status.ok()) {
    return Fail(meta, job->json, api::ProfileJobStatus{}, "InvalidStatus",
                StrCat("the status cannot be read (", parsed_status.status().message(),
                       "); it was written by something other than the operator"));
  }
  api::ProfileJobStatus status = *std::move(parsed_status);
  if (OwnCaptureHolds(key, meta, status)) return absl::OkStatus();
  if (api::IsTerminal(status.phase)) return HandleFinished(key, meta, job->json, status);

  const web::json::value& spec_json =
      job->json.has_field("spec") ? job->json.at("spec") : null_value;
  absl::StatusOr<api::ProfileJobSpec> spec = api::ParseProfileJobSpec(spec_json);
  if (!spec.ok()) {
    return Fail(meta, job->json, std::move(status), "InvalidSpec",
                StrCat(spec.status().message(),
                       ". The spec cannot change: delete the ProfileJob and create a fixed one."));
  }
  if (std::optional<Refusal> refused = Refuse(meta, *spec); refused.has_value()) {
    return Fail(meta, job->json, std::move(status), refused->reason, std::move(refused->message));
  }
  const std::string* cancel = kube::FindValue(meta.annotations, api::kCancelAnnotation);
  const bool cancelled = cancel != nullptr && *cancel == "true";
  if (cancelled && status.phase == api::JobPhase::kPending) {
    {
      MutexLock lock(&queued_mu_);
      if (auto it = waiting_for_pods_.find(meta.namespace_); it != waiting_for_pods_.end()) {
        it->second.erase(key);
      }
    }
    Dequeue(meta.uid);
    return Fail(
        meta, job->json, std::move(status), "Cancelled",
        StrCat("cancelled before it started (annotation ", api::kCancelAnnotation, "=true)"));
  }
  if (status.phase == api::JobPhase::kScheduled || status.phase == api::JobPhase::kCapturing) {
    return Resume(key, meta, job->json, *spec, std::move(status), cancelled);
  }
  return Schedule(meta, job->json, *spec, std::move(status));
}

void ProfileJobController::ForgetDeleted(const std::string& key) {
  // A capture still running finishes on its own; its status write finds no job.
  {
    MutexLock lock(&queued_mu_);
    const std::string ns = key.substr(0, key.find('/'));
    if (auto it = waiting_for_pods_.find(ns); it != waiting_for_pods_.end()) {
      it->second.erase(key);
      if (it->second.empty()) waiting_for_pods_.erase(it);
    }
  }
  MutexLock lock(&mu_);
  auto it = captures_.find(key);
  if (it != captures_.end() && it->second->finished) {
    if (it->second->thread.joinable()) it->second->thread.join();
    captures_.erase(it);
  }
}

bool ProfileJobController::OwnCaptureHolds(const std::string& key, const kube::ObjectMeta& meta,
                                           const api::ProfileJobStatus& status) {
  MutexLock lock(&mu_);
  auto it = captures_.find(key);
  if (it == captures_.end()) return false;
  Capture& capture = *it->second;
  // Still running (for this job, or for one deleted and re-created under the same name, whose
  // capture must end before this one can start).
  if (!capture.finished) {
    if (const std::string* cancel = kube::FindValue(meta.annotations, api::kCancelAnnotation);
        cancel != nullptr && *cancel == "true" && capture.uid == meta.uid &&
        !capture.stop.cancelled()) {
      spdlog::info("profilejob {}: cancel requested: stopping the capture", key);
      Event({meta.namespace_, meta.name, meta.uid}, kube::kEventTypeNormal, "Cancelling",
            StrCat("annotation ", api::kCancelAnnotation,
                   "=true: the sidecars stop recording; what they recorded is kept"));
      capture.stop.Cancel();
    }
    return true;
  }
  if (capture.uid == meta.uid && capture.wrote_final && !api::IsTerminal(status.phase)) {
    // Our final status is written; the cache has not caught up. Its update requeues us.
    return true;
  }
  if (capture.thread.joinable()) capture.thread.join();
  captures_.erase(it);
  return false;
}

std::optional<ProfileJobController::Refusal> ProfileJobController::Refuse(
    const kube::ObjectMeta& meta, const api::ProfileJobSpec& spec) {
  if (std::string why = LogdirOutsideAllowlist(spec.logdir, options_.allowed_logdirs);
      !why.empty()) {
    return Refusal{"LogdirNotAllowed", std::move(why)};
  }
  if (options_.allow_external_addresses || spec.addresses.empty()) return std::nullopt;
  const std::vector<std::string> outside =
      AddressesOutsideNamespace(spec, pods_->List(meta.namespace_));
  if (outside.empty()) return std::nullopt;
  return Refusal{"AddressNotAllowed",
                 StrCat("spec.targets.addresses: ", absl::StrJoin(outside, ", "),
                        outside.size() == 1 ? " is not the address" : " are not addresses",
                        " of a pod in namespace ", meta.namespace_,
                        ": a ProfileJob reaches only its own namespace's pods (the operator's "
                        "--allow-external-addresses, the chart's "
                        "operator.allowExternalAddresses, lets jobs name other servers)")};
}

absl::Status ProfileJobController::Resume(const std::string& key, const kube::ObjectMeta& meta,
                                          const web::json::value& job,
                                          const api::ProfileJobSpec& spec,
                                          api::ProfileJobStatus status, bool cancelled) {
  if (status.run_name.empty()) {
    return Fail(meta, job, std::move(status), "InvalidStatus",
                "the job is past Pending but its status has no run to resume");
  }
  // Begun by an earlier operator (or replica). The status does not list a large job's targets:
  // they are resolved again, and each sidecar says whether it has the run's session (read back
  // when finished, joined when running, never captured twice).
  TargetResolution plan = Resolve(meta.namespace_, spec);
  const int32_t planned = status.summary.has_value() ? status.summary->targets : 0;
  if (plan.targets.empty()) {
    return Fail(
        meta, job, std::move(status), "TargetsGone",
        StrCat("resuming run ", status.run_name, " after an operator restart: none of its ",
               planned, " target(s) can be found again (",
               plan.skipped.empty() ? "no pod matches the selector" : JoinNames(plan.skipped, 10),
               ")"));
  }
  spdlog::info("profilejob {}: resuming run {} ({}, attempt {}) with {} target(s){}", key,
               status.run_name, api::JobPhaseName(status.phase), status.attempt,
               plan.targets.size(),
               planned > 0 && static_cast<size_t>(planned) != plan.targets.size()
                   ? StrCat(" (", planned, " planned: pods came or went)")
                   : "");
  StartCapture(key, {meta.namespace_, meta.name, meta.uid}, spec, status, std::move(plan),
               /*resume=*/true);
  if (cancelled) {
    MutexLock lock(&mu_);
    if (auto it = captures_.find(key); it != captures_.end()) it->second->stop.Cancel();
  }
  return absl::OkStatus();
}

absl::Status ProfileJobController::Schedule(const kube::ObjectMeta& meta,
                                            const web::json::value& job,
                                            const api::ProfileJobSpec& spec,
                                            api::ProfileJobStatus status) {
  TargetResolution resolution = Resolve(meta.namespace_, spec);
  const size_t needed = std::max<size_t>(1, static_cast<size_t>(spec.min_ready));
  if (resolution.targets.size() > static_cast<size_t>(spec.max_targets)) {
    return Fail(meta, job, std::move(status), "TooManyTargets",
                StrCat(resolution.targets.size(),
                       " target(s) are ready, more than "
                       "spec.targets.maxTargets (",
                       spec.max_targets, "). Narrow the selector, or raise maxTargets (at most ",
                       api::kMaxMaxTargets, ") in a new ProfileJob."));
  }
  if (std::optional<absl::Status> waiting =
          WaitForTargets(meta, job, spec, status, resolution, needed)) {
    return *waiting;
  }
  if (resolution.targets.size() < needed) {
    std::string message = NotEnoughTargets(meta, spec, status, resolution, needed);
    return Fail(meta, job, std::move(status), "NotEnoughTargets", std::move(message));
  }

  JobClaim self{.name = meta.name, .uid = meta.uid, .created = meta.creation_timestamp};
  for (const ResolvedTarget& target : resolution.targets) self.addresses.push_back(target.address);
  MutexLock schedule_lock(&schedule_mu_);
  if (std::optional<Blocker> blocker = FindBlocker(self, Claims(meta.namespace_))) {
    return Wait(meta, job, spec, std::move(status), resolution, *blocker);
  }
  // When it began to wait for its targets, if it did (for the queue-wait metric): as this
  // process remembers, else as its Queued condition says (a wait begun under another operator).
  int64_t queued_since = -1;
  {
    MutexLock lock(&queued_mu_);
    if (auto it = queued_since_.find(meta.uid); it != queued_since_.end()) {
      queued_since = it->second;
    }
  }
  Dequeue(meta.uid);

  const int64_t now = clock_->WallNs();
  const int64_t t0 = now + std::max(spec.delay_ms, options_.fan_out_lead_ms) * kNanosPerMilli;
  const std::string run = spec.run_name.empty() ? storage::DefaultRunName(t0) : spec.run_name;
  absl::StatusOr<storage::RunLayout> layout = JobRunLayout(spec, run);
  if (!layout.ok()) {
    return Fail(meta, job, std::move(status), "InvalidSpec",
                std::string(layout.status().message()));
  }

  MarkScheduled(meta, resolution, run, layout->RunDir(), t0, now, status, &queued_since);
  CLUSTERPROF_RETURN_IF_ERROR(status_writer_.Overwrite(job, status));
  if (metrics_ != nullptr && queued_since >= 0) {
    metrics_->QueueWaitEnded("scheduled", static_cast<double>(now - queued_since) / 1e9);
  }

  const JobRef ref{meta.namespace_, meta.name, meta.uid};
  Event(ref, kube::kEventTypeNormal, "Scheduled",
        StrCat("capturing ", resolution.targets.size(), " target(s) for ", spec.duration_ms,
               " ms from ", status.start_time, " into run ", run));
  if (const std::string skipped = SkippedEvent(resolution.skipped); !skipped.empty()) {
    Event(ref, kube::kEventTypeWarning, "TargetSkipped", skipped);
  }
  StartCapture(meta.Key(), ref, spec, status, std::move(resolution), /*resume=*/false);
  return absl::OkStatus();
}

std::string ProfileJobController::NotEnoughTargets(const kube::ObjectMeta& meta,
                                                   const api::ProfileJobSpec& spec,
                                                   const api::ProfileJobStatus& status,
                                                   const TargetResolution& resolution,
                                                   size_t needed) {
  std::string message;
  if (spec.selector.has_value() && resolution.targets.empty() && resolution.skipped.empty()) {
    message = StrCat("no pods in namespace ", meta.namespace_, " match the selector \"",
                     spec.selector->ToString(), "\"");
  } else {
    message = StrCat(resolution.targets.size(), " target(s) ready, ", needed,
                     " needed (spec.targets.minReady)");
  }
  if (!resolution.skipped.empty()) {
    StrAppend(&message, "; not ready: ", JoinNames(resolution.skipped, 10));
  }
  if (const api::Condition* waited = api::FindCondition(status.conditions, kWaitingForTargets);
      waited != nullptr) {
    // The wait that just ended, as its condition says (it was not needed when every pod was
    // stuck).
    const absl::StatusOr<int64_t> created = api::ParseTime(meta.creation_timestamp);
    const int64_t seconds = created.ok() ? (clock_->WallNs() - *created) / kNanosPerSecond : 0;
    StrAppend(&message, ", after waiting ", seconds,
              " s (spec.targets.waitSeconds: ", spec.wait_seconds, ")");
  }
  StrAppend(&message,
            ". Check the selector and that the pods are Running and Ready with a clusterprof "
            "sidecar, then create the ProfileJob again.");
  return message;
}

void ProfileJobController::MarkScheduled(const kube::ObjectMeta& meta,
                                         const TargetResolution& resolution, const std::string& run,
                                         const std::string& run_uri, int64_t t0, int64_t now,
                                         api::ProfileJobStatus& status, int64_t* queued_since) {
  status.phase = api::JobPhase::kScheduled;
  status.message.clear();
  status.run_name = run;
  status.run_uri = run_uri;
  status.start_time_ns = t0;
  status.start_time = api::FormatTime(t0);
  status.attempt = 0;
  status.observed_generation = meta.generation;
  PlannedTargets(resolution, status);
  std::vector<std::string> names;
  names.reserve(resolution.targets.size());
  for (const ResolvedTarget& target : resolution.targets) names.push_back(target.name);
  std::string resolved = StrCat(resolution.targets.size(), " target(s): ", JoinNames(names, 10));
  if (!resolution.skipped.empty()) {
    StrAppend(&resolved, "; left out: ", JoinNames(resolution.skipped, 10));
  }
  api::SetCondition(
      status.conditions,
      {std::string(kTargetsResolved), "True", "Resolved", resolved, meta.generation, ""},
      api::FormatTime(now));
  if (const api::Condition* queued = api::FindCondition(status.conditions, kQueued);
      queued != nullptr && queued->status == "True") {
    if (absl::StatusOr<int64_t> t = api::ParseTime(queued->last_transition_time);
        t.ok() && *queued_since < 0) {
      *queued_since = *t;
    }
    api::SetCondition(status.conditions,
                      {std::string(kQueued), "False", "TargetsFree",
                       StrCat("waited since ", queued->last_transition_time, " for its targets"),
                       meta.generation, ""},
                      api::FormatTime(now));
  }
}

std::optional<absl::Status> ProfileJobController::WaitForTargets(
    const kube::ObjectMeta& meta, const web::json::value& job, const api::ProfileJobSpec& spec,
    api::ProfileJobStatus& status, const TargetResolution& resolution, size_t needed) {
  const int64_t now = clock_->WallNs();
  const absl::StatusOr<int64_t> created = api::ParseTime(meta.creation_timestamp);
  const int64_t wait_ns = spec.wait_seconds * kNanosPerSecond;
  const int64_t deadline = (created.ok() ? *created : now) + wait_ns;
  const api::Condition* condition = api::FindCondition(status.conditions, kWaitingForTargets);
  const bool was_waiting = condition != nullptr && condition->status == "True";
  // Pods on their way count only while young: one that has been starting for longer than the
  // wait (a readiness probe that never passes) is not worth waiting for.
  const bool pods_on_their_way =
      std::any_of(resolution.starting.begin(), resolution.starting.end(),
                  [&](const StartingPod& pod) { return pod.created_ns + wait_ns > now; });
  // Too few targets is worth waiting for while pods may still come: none matches yet (their
  // workload was applied with the job), or some are on their way. Pods that are all stuck (an
  // image missing on the node, a crash loop) fail the job at once, naming why.
  const bool more_may_come =
      (resolution.targets.empty() && resolution.skipped.empty()) || !resolution.starting.empty();
  const bool wait = now < deadline &&
                    ((resolution.targets.size() < needed && more_may_come) || pods_on_their_way);
  {
    MutexLock lock(&queued_mu_);
    if (wait) {
      waiting_for_pods_[meta.namespace_].insert(meta.Key());
    } else if (auto it = waiting_for_pods_.find(meta.namespace_); it != waiting_for_pods_.end()) {
      it->second.erase(meta.Key());
      if (it->second.empty()) waiting_for_pods_.erase(it);
    }
  }
  if (!wait) {
    if (was_waiting) {
      const bool timed_out = now >= deadline;
      api::SetCondition(
          status.conditions,
          {std::string(kWaitingForTargets), "False", timed_out ? "WaitTimeout" : "TargetsReady",
           StrCat(timed_out ? "waited " : "ready after ",
                  (now - (created.ok() ? *created : now)) / kNanosPerSecond,
                  " s: ", DescribeWait(resolution, needed)),
           meta.generation, ""},
          api::FormatTime(now));
    }
    return std::nullopt;
  }
  std::string message = "waiting for targets: ";
  if (spec.selector.has_value() && resolution.targets.empty() && resolution.skipped.empty()) {
    StrAppend(&message, "no pods in namespace ", meta.namespace_, " match the selector \"",
              spec.selector->ToString(), "\" yet (", needed, " needed)");
  } else {
    StrAppend(&message, DescribeWait(resolution, needed));
  }
  if (!was_waiting || status.message != message) {
    status.message = message;
    status.observed_generation = meta.generation;
    api::SetCondition(
        status.conditions,
        {std::string(kWaitingForTargets), "True", "TargetsNotReady", message, meta.generation, ""},
        api::FormatTime(now));
    if (absl::Status written = status_writer_.Overwrite(job, status); !written.ok()) {
      return written;
    }
    if (!was_waiting) {
      spdlog::info("profilejob {}: {}", meta.Key(), message);
      Event({meta.namespace_, meta.name, meta.uid}, kube::kEventTypeNormal, "WaitingForTargets",
            StrCat(message, "; waits up to ", spec.wait_seconds, " s (spec.targets.waitSeconds)"));
    }
  }
  // Looked at again each second (and at once when the cache sees this job change).
  queue_.AddAfter(meta.Key(), std::min(kNanosPerSecond, deadline - now));
  return absl::OkStatus();
}

TargetResolution ProfileJobController::Resolve(const std::string& ns,
                                               const api::ProfileJobSpec& spec) const {
  std::vector<kube::ObjectPtr> pods;
  if (spec.selector.has_value()) pods = pods_->List(ns, &*spec.selector);
  return ResolveTargets(spec, pods);
}

std::vector<JobClaim> ProfileJobController::CachedClaims(const std::string& ns) const {
  std::vector<JobClaim> claims;
  for (const kube::ObjectPtr& object : jobs_->store().List(ns)) {
    const kube::JsonObject* job = AsJson(object);
    if (job == nullptr || !job->json.has_field("status")) continue;
    absl::StatusOr<api::ProfileJobStatus> status =
        api::ParseProfileJobStatus(job->json.at("status"));
    if (!status.ok()) continue;
    std::optional<JobClaim> claim =
        ClaimOf(job->metadata.name, job->metadata.uid, job->metadata.creation_timestamp, *status);
    if (!claim.has_value()) continue;
    // What it holds: its spec's targets as they resolve now (its status does not list a large
    // job's targets). A pod that came since is held too, which only makes the queue careful.
    absl::StatusOr<api::ProfileJobSpec> spec = api::ParseProfileJobSpec(
        job->json.has_field("spec") ? job->json.at("spec") : web::json::value::null());
    if (!spec.ok()) continue;
    for (const ResolvedTarget& target : Resolve(ns, *spec).targets) {
      claim->addresses.push_back(target.address);
    }
    claims.push_back(*std::move(claim));
  }
  return claims;
}

std::vector<JobClaim> ProfileJobController::Claims(const std::string& ns) const {
  std::vector<JobClaim> claims = CachedClaims(ns);
  MutexLock lock(&mu_);
  for (const auto& [key, capture] : captures_) {
    if (capture->finished || key.rfind(ns + "/", 0) != 0) continue;
    claims.push_back({.name = capture->name,
                      .uid = capture->uid,
                      .phase = api::JobPhase::kCapturing,
                      .addresses = capture->addresses});
  }
  return claims;
}

absl::Status ProfileJobController::Wait(const kube::ObjectMeta& meta, const web::json::value& job,
                                        const api::ProfileJobSpec& spec,
                                        api::ProfileJobStatus status,
                                        const TargetResolution& resolution,
                                        const Blocker& blocker) {
  const int64_t now = clock_->WallNs();
  const api::Condition* queued = api::FindCondition(status.conditions, kQueued);
  const bool waiting = queued != nullptr && queued->status == "True";
  // Since when it waits: the status says (across restarts), and this process remembers (the
  // cache may not show its own Queued write yet), the earlier of the two.
  int64_t since = now;
  if (waiting) {
    if (absl::StatusOr<int64_t> t = api::ParseTime(queued->last_transition_time); t.ok()) {
      since = *t;
    }
  }
  bool announced = waiting;
  {
    MutexLock lock(&queued_mu_);
    auto [it, inserted] = queued_since_.try_emplace(meta.uid, since);
    announced = announced || !inserted;
    it->second = std::min(it->second, since);
    since = it->second;
  }
  std::vector<std::string> shared;
  for (const ResolvedTarget& target : resolution.targets) {
    if (std::binary_search(blocker.shared.begin(), blocker.shared.end(), target.address)) {
      shared.push_back(target.name);
    }
  }
  const std::string what =
      blocker.phase == api::JobPhase::kPending
          ? StrCat("ProfileJob ", blocker.job, ", queued before it for ", JoinNames(shared, 5))
          : StrCat("ProfileJob ", blocker.job, " (", api::JobPhaseName(blocker.phase),
                   "), which holds ", JoinNames(shared, 5));
  const int64_t timeout_ns = spec.queue_timeout_seconds * kNanosPerSecond;
  if (now - since >= timeout_ns) {
    Dequeue(meta.uid);
    if (waiting) {
      api::SetCondition(status.conditions,
                        {std::string(kQueued), "False", "QueueTimeout", "", meta.generation, ""},
                        api::FormatTime(now));
    }
    absl::Status failed =
        Fail(meta, job, std::move(status), "QueueTimeout",
             spec.queue_timeout_seconds == 0
                 ? StrCat("its targets are busy: ", what,
                          "; spec.queueTimeoutSeconds is 0, so it does not wait")
                 : StrCat("waited ", (now - since) / kNanosPerSecond, " s for ", what,
                          " (spec.queueTimeoutSeconds: ", spec.queue_timeout_seconds,
                          "); create it again when the other job is done, or raise it"));
    if (failed.ok() && metrics_ != nullptr && spec.queue_timeout_seconds > 0) {
      metrics_->QueueWaitEnded("timeout", static_cast<double>(now - since) / 1e9);
    }
    return failed;
  }
  const std::string message = StrCat("waiting for ", what);
  if (!waiting || status.message != message) {
    status.message = message;
    status.observed_generation = meta.generation;
    PlannedTargets(resolution, status);
    api::SetCondition(status.conditions,
                      {std::string(kQueued), "True", "TargetsBusy", message, meta.generation, ""},
                      api::FormatTime(since));
    CLUSTERPROF_RETURN_IF_ERROR(status_writer_.Overwrite(job, status));
    if (!announced) {
      spdlog::info("profilejob {}: queued: {}", meta.Key(), message);
      Event({meta.namespace_, meta.name, meta.uid}, kube::kEventTypeNormal, "Queued", message);
    }
  }
  // Looked at again each second (and at once when the cache sees this job change), until its
  // targets are free or its time is up.
  queue_.AddAfter(meta.Key(), std::min(kNanosPerSecond, timeout_ns - (now - since)));
  return absl::OkStatus();
}

absl::Status ProfileJobController::Fail(const kube::ObjectMeta& meta, const web::json::value& job,
                                        api::ProfileJobStatus status, std::string_view reason,
                                        std::string_view message) {
  const int64_t now = clock_->WallNs();
  status.phase = api::JobPhase::kFailed;
  status.message = std::string(message);
  status.completion_time = api::FormatTime(now);
  status.observed_generation = meta.generation;
  api::SetCondition(status.conditions,
                    {std::string(kFailed), "True", std::string(reason), std::string(message),
                     meta.generation, ""},
                    api::FormatTime(now));
  CLUSTERPROF_RETURN_IF_ERROR(status_writer_.Overwrite(job, status));
  spdlog::warn("profilejob {}: failed: {}: {}", meta.Key(), reason, message);
  Event({meta.namespace_, meta.name, meta.uid}, kube::kEventTypeWarning, reason, message);
  return absl::OkStatus();
}

absl::Status ProfileJobController::HandleFinished(const std::string& key,
                                                  const kube::ObjectMeta& meta,
                                                  const web::json::value& job,
                                                  const api::ProfileJobStatus& status) {
  // Read on its own: a job that failed for an invalid spec still expires.
  int64_t ttl_seconds = -1;
  if (job.has_field("spec") && job.at("spec").has_field("ttlSecondsAfterFinished")) {
    const web::json::value& ttl = job.at("spec").at("ttlSecondsAfterFinished");
    if (ttl.is_number() && ttl.as_number().is_int64()) ttl_seconds = ttl.as_number().to_int64();
  }
  if (ttl_seconds < 0) return absl::OkStatus();
  absl::StatusOr<int64_t> completed = api::ParseTime(status.completion_time);
  if (!completed.ok()) return absl::OkStatus();
  const int64_t expires = *completed + ttl_seconds * kNanosPerSecond;
  const int64_t now = clock_->WallNs();
  if (now < expires) {
    queue_.AddAfter(key, expires - now);
    return absl::OkStatus();
  }
  kube::DeleteOptions options;
  options.uid = meta.uid;
  options.propagation_policy = "Background";
  absl::Status deleted = client_->Delete(api::ProfileJobs(), meta.namespace_, meta.name, options);
  if (absl::IsNotFound(deleted) || kube::IsConflict(deleted)) return absl::OkStatus();
  if (deleted.ok()) {
    spdlog::info("profilejob {}: deleted {} s after it finished (ttlSecondsAfterFinished)", key,
                 ttl_seconds);
  }
  return deleted;
}

void ProfileJobController::StartCapture(const std::string& key, const JobRef& job,
                                        const api::ProfileJobSpec& spec,
                                        const api::ProfileJobStatus& status, TargetResolution plan,
                                        bool resume) {
  MutexLock lock(&mu_);
  if (stopping_) return;
  auto capture = std::make_unique<Capture>();
  capture->uid = job.uid;
  capture->name = job.name;
  capture->addresses.reserve(plan.targets.size());
  for (const ResolvedTarget& target : plan.targets) capture->addresses.push_back(target.address);
  Capture* raw = capture.get();
  capture->thread = std::thread([this, key, job, spec, status, plan = std::move(plan), resume,
                                 raw] { RunCapture(key, job, spec, status, plan, resume, raw); });
  captures_[key] = std::move(capture);
}

CaptureSettings ProfileJobController::SettingsForCapture(const std::string& key) {
  CaptureSettings settings{.fan_out_lead_ms = options_.fan_out_lead_ms,
                           .retry_backoff_ms = options_.retry_backoff_ms,
                           .grace_ms = options_.grace_ms,
                           .clock_probes = options_.clock_probes,
                           .security = options_.sidecar_security,
                           .channel_pool = options_.channel_pool,
                           .connector = options_.connector,
                           .storages = options_.storages};
  if (!options_.sidecar_token_file.empty()) {
    if (absl::StatusOr<std::string> token = ReadTokenFile(options_.sidecar_token_file);
        token.ok()) {
      MutexLock lock(&token_mu_);
      if (*token != last_token_) {
        // A rotation: the token before stays in use for sidecars whose copy of the Secret the
        // kubelet has not updated yet.
        if (!last_token_.empty()) previous_token_ = std::move(last_token_);
        last_token_ = *token;
      }
      settings.auth_token = *std::move(token);
      settings.previous_auth_token = previous_token_;
    } else {
      spdlog::error("ProfileJob {}: no bearer token for the sidecars: {}", key,
                    std::string(token.status().message()));
    }
  }
  return settings;
}

void ProfileJobController::RunCapture(const std::string& key, const JobRef& job,
                                      const api::ProfileJobSpec& spec,
                                      const api::ProfileJobStatus& status,
                                      const TargetResolution& plan, bool resume, Capture* capture) {
  absl::StatusOr<coordinator::CaptureOptions> made =
      CaptureOptionsFor(spec, status, plan.targets, SettingsForCapture(key), resume);
  coordinator::CaptureOptions options =
      made.ok() ? *std::move(made) : coordinator::CaptureOptions{};
  options.cancel = &capture->cancel;
  options.stop = &capture->stop;
  const std::string run = status.run_name;
  // The phase the next Capturing write expects to replace.
  std::string expected_phase(api::JobPhaseName(status.phase));
  bool aborted = false;
  // The Capturing write (attempt, T0) runs beside the requests, not before them: with 1,000
  // targets it takes longer than the fan-out lead. It only helps a successor resume (a lost
  // write costs the resumed run its exact T0 and one attempt of its count); the previous one is
  // waited for before the next attempt and before the final status, and one that finds the job
  // gone or moved on stops further attempts.
  std::future<absl::Status> capturing_write;
  const auto settle_write = [&]() -> absl::Status {
    if (!capturing_write.valid()) return absl::OkStatus();
    absl::Status written = capturing_write.get();
    if (written.ok()) {
      expected_phase = std::string(api::JobPhaseName(api::JobPhase::kCapturing));
      return absl::OkStatus();
    }
    if (absl::IsNotFound(written) || absl::IsFailedPrecondition(written)) return written;
    spdlog::warn("profilejob {}: the Capturing status was not written: {}", key,
                 std::string(written.message()));
    return absl::OkStatus();
  };
  options.before_attempt = [&](int attempt, int64_t t0) -> absl::Status {
    if (absl::Status settled = settle_write(); !settled.ok()) {
      aborted = true;
      return settled;
    }
    capturing_write = std::async(std::launch::async, [this, job, run, expected_phase, attempt, t0] {
      return MarkCapturing(job, run, expected_phase, attempt, t0);
    });
    const AttemptEvent event = AttemptEventFor(attempt, t0, resume, options.attempts_used,
                                               spec.tracing_attempts, plan.targets.size(), run);
    Event(job, kube::kEventTypeNormal, event.reason, event.message);
    return absl::OkStatus();
  };
  std::optional<coordinator::RunResult> last;
  const int64_t started = clock_->MonotonicNs();
  absl::StatusOr<coordinator::RunResult> result =
      made.ok() ? coordinator::Capture(
                      options, *clock_,
                      [&](const coordinator::RunResult& state, int64_t) { last = state; })
                : made.status();
  // The last Capturing write lands before anything else is written.
  if (absl::Status settled = settle_write(); !settled.ok()) aborted = true;
  if (result.ok()) last = *result;
  if (aborted || absl::IsCancelled(result.status())) {
    spdlog::info("profilejob {}: capture of run {} stopped: {}", key, run,
                 std::string(result.status().message()));
  } else if (!last.has_value()) {
    // Bad options (the spec was checked, so this is a bug or a logdir the run layout refuses).
    const absl::Status failed = status_writer_.Write(job, [&](api::ProfileJobStatus& current) {
      return CaptureErrorStatus(current, run, std::string(result.status().message()),
                                clock_->WallNs());
    });
    capture->wrote_final = failed.ok();
    if (failed.ok()) {
      Event(job, kube::kEventTypeWarning, "CaptureError",
            StrCat("the capture could not start: ", result.status().message()));
    }
  } else {
    if (metrics_ != nullptr) {
      metrics_->CaptureFinished(static_cast<double>(clock_->MonotonicNs() - started) / 1e9);
    }
    capture->wrote_final = FinishCapture(key, job, run, *last, plan, capture);
  }
  capture->finished = true;
  queue_.Add(key);
  // Its targets are free now, also as far as this process's claims go.
  WakeQueued(job.namespace_);
}

bool ProfileJobController::FinishCapture(const std::string& key, const JobRef& job,
                                         const std::string& run,
                                         const coordinator::RunResult& result,
                                         const TargetResolution& plan, Capture* capture) {
  // Written until it lands, the job is gone, or the time runs out (the sidecars keep the
  // sessions for a resume).
  const int64_t now = clock_->WallNs();
  std::optional<api::JobAnalysis> analysis;  // as written, with each host's node
  const absl::Status written = status_writer_.WriteUntilLanded(
      job,
      [&](api::ProfileJobStatus& current) {
        absl::Status status = FinalStatus(current, run, result, plan, now);
        analysis = current.analysis;
        return status;
      },
      options_.final_status_retry_ns, &capture->cancel);
  if (!written.ok()) {
    spdlog::error("profilejob {}: the final status of run {} was not written: {}", key, run,
                  std::string(written.message()));
    return false;
  }
  const api::JobPhase phase = PhaseFor(result);
  const std::string message = FinalMessage(result);
  spdlog::info("profilejob {}: {}: {}", key, api::JobPhaseName(phase), message);
  Event(job, phase == api::JobPhase::kFailed ? kube::kEventTypeWarning : kube::kEventTypeNormal,
        StrCat("Capture", api::JobPhaseName(phase)), message);
  // One Event for all the targets without data, not one each (10,000 Events for one job would
  // crowd out every other object's).
  if (const std::string failures = TargetFailuresEvent(result); !failures.empty()) {
    Event(job, kube::kEventTypeWarning, "TargetFailed", failures);
  }
  if (analysis.has_value()) {
    for (const std::string& straggler : StragglerMessages(*analysis)) {
      Event(job, kube::kEventTypeWarning, "StragglerDetected", straggler);
    }
  }
  if (metrics_ != nullptr) {
    for (const coordinator::TargetResult& target : result.targets) {
      metrics_->TargetFinished(target.outcome == coordinator::Outcome::kOk      ? "succeeded"
                               : target.outcome == coordinator::Outcome::kEmpty ? "empty"
                                                                                : "failed");
      metrics_->TargetUploads(target);
      metrics_->TargetRefused(target);
      if (target.start_known) {
        metrics_->ObserveStartSkew(static_cast<double>(std::llabs(target.start_error_ns)) / 1e9);
      }
    }
  }
  return true;
}

absl::Status ProfileJobController::MarkCapturing(const JobRef& job, const std::string& run,
                                                 const std::string& expected_phase, int attempt,
                                                 int64_t t0) {
  // A JSON patch, not a read and a write of the whole object: with 1,000 targets the status is
  // 300 KB, and this write sits between picking T0 and sending the requests. Its tests make it
  // apply only to this job and run, in the phase last written.
  const auto op = [](const char* kind, const char* path, web::json::value value) {
    web::json::value entry = web::json::value::object();
    entry["op"] = web::json::value::string(kind);
    entry["path"] = web::json::value::string(path);
    entry["value"] = std::move(value);
    return entry;
  };
  web::json::value patch = web::json::value::array();
  patch[0] = op("test", "/metadata/uid", web::json::value::string(job.uid));
  patch[1] = op("test", "/status/runName", web::json::value::string(run));
  patch[2] = op("test", "/status/phase", web::json::value::string(expected_phase));
  patch[3] =
      op("replace", "/status/phase",
         web::json::value::string(std::string(api::JobPhaseName(api::JobPhase::kCapturing))));
  patch[4] = op("add", "/status/attempt", web::json::value::number(attempt));
  patch[5] = op("add", "/status/startTimeNs", web::json::value::number(t0));
  patch[6] = op("add", "/status/startTime", web::json::value::string(api::FormatTime(t0)));
  absl::StatusOr<web::json::value> patched = client_->Patch(
      api::ProfileJobs(), job.namespace_, job.name, kube::PatchType::kJson, patch, "status");
  if (patched.ok() || absl::IsNotFound(patched.status()) || kube::IsRetryable(patched.status())) {
    return patched.status();
  }
  // A test failed (or something else was refused): read the job to tell which.
  return status_writer_.Write(job, [&](api::ProfileJobStatus& current) -> absl::Status {
    if (current.run_name != run || api::IsTerminal(current.phase)) {
      return absl::FailedPreconditionError(StrCat("the job moved on (phase ",
                                                  api::JobPhaseName(current.phase), ", run ",
                                                  current.run_name, ")"));
    }
    current.phase = api::JobPhase::kCapturing;
    current.attempt = attempt;
    current.start_time_ns = t0;
    current.start_time = api::FormatTime(t0);
    return absl::OkStatus();
  });
}

void ProfileJobController::Event(const JobRef& job, std::string_view type, std::string_view reason,
                                 std::string_view message) {
  if (events_ == nullptr) return;
  events_->Event(api::ReferenceTo("ProfileJob", job.namespace_, job.name, job.uid), type, reason,
                 message);
}

}  // namespace clusterprof::controllers
