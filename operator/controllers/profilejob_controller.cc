#include "operator/controllers/profilejob_controller.h"

#include <algorithm>
#include <cstdlib>
#include <future>

#include "common/check.h"
#include "common/status.h"
#include "common/storage/logdir.h"
#include "common/strings.h"
#include "common/token_file.h"
#include "operator/controllers/targets.h"
#include "operator/controllers/worker.h"
#include "operator/coordinator/coordinator.h"
#include "operator/kube/api_error.h"
#include "operator/kube/rate_limiter.h"
#include "operator/kube/retry.h"
#include "spdlog/spdlog.h"

namespace clusterprof::controllers {
namespace {

constexpr std::string_view kController = "profilejob";
// Condition types.
constexpr std::string_view kTargetsResolved = "TargetsResolved";
constexpr std::string_view kComplete = "Complete";
constexpr std::string_view kFailed = "Failed";

std::string TargetPhase(coordinator::Outcome outcome) {
  switch (outcome) {
    case coordinator::Outcome::kOk:
      return "Succeeded";
    case coordinator::Outcome::kEmpty:
      return "Empty";
    case coordinator::Outcome::kFailed:
      return "Failed";
    case coordinator::Outcome::kPending:
      return "Pending";
  }
  return "Pending";
}

std::string JoinNames(const std::vector<std::string>& names, size_t limit) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) {
    if (i > 0) out += ", ";
    out += names[i];
  }
  if (names.size() > limit) StrAppend(&out, ", and ", names.size() - limit, " more");
  return out;
}

const kube::JsonObject* AsJson(const kube::ObjectPtr& object) {
  return dynamic_cast<const kube::JsonObject*>(object.get());
}

}  // namespace

ProfileJobController::ProfileJobController(kube::RestClient* client, Clock* clock,
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
      queue_(clock, kube::DefaultControllerRateLimiter(clock),
             metrics != nullptr ? metrics->QueueMetrics("profilejobs") : nullptr) {}

ProfileJobController::~ProfileJobController() { Stop(0); }

void ProfileJobController::Start() {
  jobs_->AddEventHandler(this);
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
  MutexLock lock(&mu_);
  bool all_finished = true;
  for (auto& [key, capture] : captures_) {
    if (capture->finished) {
      if (capture->thread.joinable()) capture->thread.join();
    } else {
      all_finished = false;
      // Left running: the process is ending, and a future operator resumes the job.
      capture->thread.detach();
      static_cast<void>(capture.release());  // the detached thread still uses it
    }
  }
  captures_.clear();
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
}
void ProfileJobController::OnDelete(const kube::ObjectPtr& object, bool) {
  queue_.Add(object->metadata.Key());
}

void ProfileJobController::Worker() {
  RunWorker(queue_, kController, metrics_,
            [this](const std::string& key) { return Reconcile(key); });
}

void ProfileJobController::RefreshMetrics() {
  if (metrics_ == nullptr) return;
  std::map<std::string, int> counts;
  for (JobPhase phase : {JobPhase::kPending, JobPhase::kScheduled, JobPhase::kCapturing,
                         JobPhase::kSucceeded, JobPhase::kPartiallySucceeded, JobPhase::kFailed}) {
    counts[std::string(JobPhaseName(phase))] = 0;
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
      phase = std::string(JobPhaseName(ParseJobPhase(status.at("phase").as_string())));
    }
    ++counts[phase];
  }
  metrics_->SetJobsByPhase(counts);
}

absl::Status ProfileJobController::Reconcile(const std::string& key) {
  const kube::ObjectPtr object = jobs_->store().Get(key);
  if (object == nullptr) {
    // Deleted. A capture still running finishes on its own; its status write finds no job.
    MutexLock lock(&mu_);
    auto it = captures_.find(key);
    if (it != captures_.end() && it->second->finished) {
      if (it->second->thread.joinable()) it->second->thread.join();
      captures_.erase(it);
    }
    return absl::OkStatus();
  }
  const kube::JsonObject* job = AsJson(object);
  CLUSTERPROF_CHECK(job != nullptr) << "the ProfileJob informer must use JsonDecoder";
  const kube::ObjectMeta& meta = job->metadata;
  if (!meta.deletion_timestamp.empty()) return absl::OkStatus();

  const web::json::value null_value;
  const web::json::value& status_json =
      job->json.has_field("status") ? job->json.at("status") : null_value;
  absl::StatusOr<ProfileJobStatus> parsed_status = ParseProfileJobStatus(status_json);
  if (!parsed_status.ok()) {
    return Fail(meta, job->json, ProfileJobStatus{}, "InvalidStatus",
                StrCat("the status cannot be read (", parsed_status.status().message(),
                       "); it was written by something other than the operator"));
  }
  ProfileJobStatus status = *std::move(parsed_status);

  // A capture of this process for the job.
  {
    MutexLock lock(&mu_);
    auto it = captures_.find(key);
    if (it != captures_.end()) {
      Capture& capture = *it->second;
      // Still running (for this job, or for one deleted and re-created under the same name,
      // whose capture must end before this one can start).
      if (!capture.finished) return absl::OkStatus();
      if (capture.uid == meta.uid && capture.wrote_final && !IsTerminal(status.phase)) {
        // Our final status is written; the cache has not caught up. Its update requeues us.
        return absl::OkStatus();
      }
      if (capture.thread.joinable()) capture.thread.join();
      captures_.erase(it);
    }
  }

  if (IsTerminal(status.phase)) return HandleFinished(key, meta, job->json, status);

  const web::json::value& spec_json =
      job->json.has_field("spec") ? job->json.at("spec") : null_value;
  absl::StatusOr<ProfileJobSpec> spec = ParseProfileJobSpec(spec_json);
  if (!spec.ok()) {
    return Fail(meta, job->json, std::move(status), "InvalidSpec",
                StrCat(spec.status().message(),
                       ". The spec cannot change: delete the ProfileJob and create a fixed one."));
  }
  if (status.phase == JobPhase::kScheduled || status.phase == JobPhase::kCapturing) {
    if (status.run_name.empty() || status.targets.empty()) {
      return Fail(meta, job->json, std::move(status), "InvalidStatus",
                  "the job is past Pending but its status has no run or targets to resume");
    }
    // Begun by an earlier operator (or replica): resume it.
    spdlog::info("profilejob {}: resuming run {} ({}, attempt {})", key, status.run_name,
                 JobPhaseName(status.phase), status.attempt);
    StartCapture(key, {meta.namespace_, meta.name, meta.uid}, *spec, status, /*resume=*/true);
    return absl::OkStatus();
  }
  return Schedule(meta, job->json, *spec, std::move(status));
}

absl::Status ProfileJobController::Schedule(const kube::ObjectMeta& meta,
                                            const web::json::value& job, const ProfileJobSpec& spec,
                                            ProfileJobStatus status) {
  std::vector<kube::ObjectPtr> pods;
  if (spec.selector.has_value()) pods = pods_->List(meta.namespace_, &*spec.selector);
  const TargetResolution resolution = ResolveTargets(spec, pods);
  const size_t needed = std::max<size_t>(1, static_cast<size_t>(spec.min_ready));
  if (resolution.targets.size() < needed) {
    std::string message;
    if (spec.selector.has_value() && pods.empty()) {
      message = StrCat("no pods in namespace ", meta.namespace_, " match the selector \"",
                       spec.selector->ToString(), "\"");
    } else {
      message = StrCat(resolution.targets.size(), " target(s) ready, ", needed,
                       " needed (spec.targets.minReady)");
    }
    if (!resolution.skipped.empty()) {
      StrAppend(&message, "; not ready: ", JoinNames(resolution.skipped, 10));
    }
    StrAppend(&message,
              ". Check the selector and that the pods are Running and Ready with a clusterprof "
              "sidecar, then create the ProfileJob again.");
    return Fail(meta, job, std::move(status), "NotEnoughTargets", message);
  }

  const int64_t now = clock_->WallNs();
  const int64_t t0 = now + std::max(spec.delay_ms, options_.fan_out_lead_ms) * kNanosPerMilli;
  const std::string run = spec.run_name.empty() ? storage::DefaultRunName(t0) : spec.run_name;
  absl::StatusOr<storage::RunLayout> layout = storage::RunLayout::Create(spec.parsed_logdir, run);
  if (!layout.ok()) {
    return Fail(meta, job, std::move(status), "InvalidSpec",
                std::string(layout.status().message()));
  }

  status.phase = JobPhase::kScheduled;
  status.message.clear();
  status.run_name = run;
  status.run_uri = layout->RunDir();
  status.start_time_ns = t0;
  status.start_time = FormatTime(t0);
  status.attempt = 0;
  status.observed_generation = meta.generation;
  status.targets.clear();
  std::vector<std::string> names;
  for (const ResolvedTarget& target : resolution.targets) {
    TargetStatus entry;
    entry.name = target.name;
    entry.address = target.address;
    entry.node = target.node;
    status.targets.push_back(std::move(entry));
    names.push_back(target.name);
  }
  std::string resolved = StrCat(resolution.targets.size(), " target(s): ", JoinNames(names, 10));
  if (!resolution.skipped.empty()) {
    StrAppend(&resolved, "; left out: ", JoinNames(resolution.skipped, 10));
  }
  SetCondition(status.conditions,
               {std::string(kTargetsResolved), "True", "Resolved", resolved, meta.generation, ""},
               FormatTime(now));
  CLUSTERPROF_RETURN_IF_ERROR(UpdateStatus(job, status));

  const JobRef ref{meta.namespace_, meta.name, meta.uid};
  Event(ref, kube::kEventTypeNormal, "Scheduled",
        StrCat("capturing ", resolution.targets.size(), " target(s) for ", spec.duration_ms,
               " ms from ", status.start_time, " into run ", run));
  for (const std::string& skipped : resolution.skipped) {
    Event(ref, kube::kEventTypeWarning, "TargetSkipped", skipped);
  }
  StartCapture(meta.Key(), ref, spec, status, /*resume=*/false);
  return absl::OkStatus();
}

absl::Status ProfileJobController::Fail(const kube::ObjectMeta& meta, const web::json::value& job,
                                        ProfileJobStatus status, std::string_view reason,
                                        std::string_view message) {
  const int64_t now = clock_->WallNs();
  status.phase = JobPhase::kFailed;
  status.message = std::string(message);
  status.completion_time = FormatTime(now);
  status.observed_generation = meta.generation;
  SetCondition(status.conditions,
               {std::string(kFailed), "True", std::string(reason), std::string(message),
                meta.generation, ""},
               FormatTime(now));
  CLUSTERPROF_RETURN_IF_ERROR(UpdateStatus(job, status));
  spdlog::warn("profilejob {}: failed: {}: {}", meta.Key(), reason, message);
  Event({meta.namespace_, meta.name, meta.uid}, kube::kEventTypeWarning, reason, message);
  return absl::OkStatus();
}

absl::Status ProfileJobController::HandleFinished(const std::string& key,
                                                  const kube::ObjectMeta& meta,
                                                  const web::json::value& job,
                                                  const ProfileJobStatus& status) {
  // Read on its own: a job that failed for an invalid spec still expires.
  int64_t ttl_seconds = -1;
  if (job.has_field("spec") && job.at("spec").has_field("ttlSecondsAfterFinished")) {
    const web::json::value& ttl = job.at("spec").at("ttlSecondsAfterFinished");
    if (ttl.is_number() && ttl.as_number().is_int64()) ttl_seconds = ttl.as_number().to_int64();
  }
  if (ttl_seconds < 0) return absl::OkStatus();
  absl::StatusOr<int64_t> completed = ParseTime(status.completion_time);
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
  absl::Status deleted = client_->Delete(ProfileJobs(), meta.namespace_, meta.name, options);
  if (absl::IsNotFound(deleted) || kube::IsConflict(deleted)) return absl::OkStatus();
  if (deleted.ok()) {
    spdlog::info("profilejob {}: deleted {} s after it finished (ttlSecondsAfterFinished)", key,
                 ttl_seconds);
  }
  return deleted;
}

void ProfileJobController::StartCapture(const std::string& key, const JobRef& job,
                                        const ProfileJobSpec& spec, const ProfileJobStatus& status,
                                        bool resume) {
  MutexLock lock(&mu_);
  if (stopping_) return;
  auto capture = std::make_unique<Capture>();
  capture->uid = job.uid;
  Capture* raw = capture.get();
  capture->thread = std::thread([this, key, job, spec, status, resume, raw] {
    RunCapture(key, job, spec, status, resume, raw);
  });
  captures_[key] = std::move(capture);
}

void ProfileJobController::RunCapture(const std::string& key, const JobRef& job,
                                      const ProfileJobSpec& spec, const ProfileJobStatus& status,
                                      bool resume, Capture* capture) {
  coordinator::CaptureOptions options;
  for (const TargetStatus& target : status.targets) {
    options.targets.push_back({target.address, target.name});
  }
  options.logdir = spec.parsed_logdir;
  options.storages = options_.storages;
  options.run = status.run_name;
  options.duration_ms = spec.duration_ms;
  options.delay_ms = spec.delay_ms;
  options.fan_out_lead_ms = options_.fan_out_lead_ms;
  options.retry_backoff_ms = options_.retry_backoff_ms;
  options.grace_ms = options_.grace_ms;
  if (!options_.sidecar_token_file.empty()) {
    if (absl::StatusOr<std::string> token = ReadTokenFile(options_.sidecar_token_file);
        token.ok()) {
      options.auth_token = *std::move(token);
    } else {
      spdlog::error("ProfileJob {}: no bearer token for the sidecars: {}", key,
                    std::string(token.status().message()));
    }
  }
  options.clock_probes = options_.clock_probes;
  options.num_tracing_attempts = spec.tracing_attempts;
  options.host_tracer_level = spec.host_tracer_level;
  options.device_tracer_level = spec.device_tracer_level;
  options.python_tracer_level = spec.python_tracer_level;
  options.advanced_configuration = spec.advanced_configuration;
  options.start_at_ns = status.start_time_ns;
  options.resume = resume;
  // A capture must survive this operator: a successor rejoins or reads it back.
  options.outlive_client = true;
  options.attempts_used = resume ? std::max(0, status.attempt - 1) : 0;
  const std::string run = status.run_name;
  // The phase the next Capturing write expects to replace.
  std::string expected_phase(JobPhaseName(status.phase));
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
      expected_phase = std::string(JobPhaseName(JobPhase::kCapturing));
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
    if (attempt == 1 && !resume) {
      Event(job, kube::kEventTypeNormal, "CaptureStarted",
            StrCat("Profile requests sent to ", status.targets.size(), " target(s); start at ",
                   FormatTime(t0)));
    } else if (resume && attempt == options.attempts_used + 1) {
      Event(job, kube::kEventTypeNormal, "CaptureResumed",
            StrCat("resuming run ", run, " (attempt ", attempt,
                   "): finished sessions are read back, running ones joined"));
    } else {
      Event(job, kube::kEventTypeNormal, "CaptureRetried",
            StrCat("attempt ", attempt, " of ", spec.tracing_attempts,
                   " for the targets that "
                   "came back empty or unavailable; start at ",
                   FormatTime(t0)));
    }
    return absl::OkStatus();
  };
  coordinator::RunResult last;
  bool have_result = false;
  const int64_t started = clock_->MonotonicNs();
  absl::StatusOr<coordinator::RunResult> result =
      coordinator::Capture(options, *clock_, [&](const coordinator::RunResult& state, int64_t) {
        last = state;
        have_result = true;
      });
  // The last Capturing write lands before anything else is written.
  if (absl::Status settled = settle_write(); !settled.ok()) aborted = true;
  if (result.ok()) {
    last = *result;
    have_result = true;
  }
  if (aborted || !have_result) {
    if (!aborted) {
      // Bad options (the spec was checked, so this is a bug or a logdir the run layout refuses).
      absl::Status failed = WriteStatus(job, [&](ProfileJobStatus& current) -> absl::Status {
        if (current.run_name != run || IsTerminal(current.phase)) {
          return absl::FailedPreconditionError("the job moved on");
        }
        current.phase = JobPhase::kFailed;
        current.message = StrCat("the capture could not start: ", result.status().message());
        current.completion_time = FormatTime(clock_->WallNs());
        SetCondition(current.conditions,
                     {std::string(kFailed), "True", "CaptureError", current.message, 0, ""},
                     current.completion_time);
        return absl::OkStatus();
      });
      capture->wrote_final = failed.ok();
      if (failed.ok()) {
        Event(job, kube::kEventTypeWarning, "CaptureError",
              StrCat("the capture could not start: ", result.status().message()));
      }
    } else {
      spdlog::info("profilejob {}: capture of run {} stopped: {}", key, run,
                   std::string(result.status().message()));
    }
    capture->finished = true;
    queue_.Add(key);
    return;
  }
  if (metrics_ != nullptr) {
    metrics_->CaptureFinished(static_cast<double>(clock_->MonotonicNs() - started) / 1e9);
  }

  // The final status: written until it lands, the job is gone, or the time runs out (the
  // sidecars keep the sessions for a resume).
  const int64_t now = clock_->WallNs();
  JobPhase phase = JobPhase::kFailed;
  if (last.succeeded == static_cast<int>(last.targets.size())) {
    phase = JobPhase::kSucceeded;
  } else if (last.succeeded > 0) {
    phase = JobPhase::kPartiallySucceeded;
  }
  std::vector<std::string> failures;
  for (const coordinator::TargetResult& target : last.targets) {
    if (target.outcome == coordinator::Outcome::kOk) continue;
    failures.push_back(StrCat(target.host_name, " (", target.address, "): ",
                              target.outcome == coordinator::Outcome::kEmpty
                                  ? std::string("no trace data")
                                  : target.message));
  }
  std::string message;
  if (phase == JobPhase::kSucceeded) {
    message = StrCat("all ", last.targets.size(), " target(s) captured; max start skew ",
                     FormatDuration(last.max_start_skew_ns));
  } else {
    message = StrCat(last.succeeded, " of ", last.targets.size(), " target(s) captured; ",
                     JoinNames(failures, 5));
  }
  const auto finalize = [&](ProfileJobStatus& current) -> absl::Status {
    if (current.run_name != run || IsTerminal(current.phase)) {
      return absl::FailedPreconditionError("the job moved on");
    }
    current.phase = phase;
    current.message = message;
    current.completion_time = FormatTime(now);
    current.attempt = std::max(current.attempt, last.attempt);
    current.manifest_uri = last.manifest_uri;
    current.targets.clear();
    for (const coordinator::TargetResult& target : last.targets) {
      TargetStatus entry;
      entry.name = target.host_name;
      entry.address = target.address;
      for (const TargetStatus& old : status.targets) {
        if (old.address == target.address) entry.node = old.node;
      }
      entry.phase = TargetPhase(target.outcome);
      entry.attempts = target.attempts;
      entry.events = static_cast<int64_t>(target.events);
      entry.dropped_events = static_cast<int64_t>(target.dropped_events);
      entry.bytes = static_cast<int64_t>(target.bytes);
      for (const std::string& file : target.files) {
        if (EndsWith(file, storage::kXPlaneSuffix)) entry.file = file;
      }
      entry.clock_offset_ns = target.clock_offset_ns;
      entry.clock_uncertainty_ns = target.clock_uncertainty_ns;
      entry.start_error_ns = target.start_error_ns;
      entry.message =
          target.outcome == coordinator::Outcome::kEmpty ? "no trace data" : target.message;
      if (!target.warnings.empty()) {
        std::string warnings = JoinNames(target.warnings, 3);
        entry.message = entry.message.empty() ? StrCat("warnings: ", warnings)
                                              : StrCat(entry.message, "; warnings: ", warnings);
      }
      if (target.recovered) {
        entry.message = entry.message.empty()
                            ? "read back from the sidecar after an operator restart"
                            : StrCat(entry.message, " (read back after an operator restart)");
      }
      current.targets.push_back(std::move(entry));
    }
    JobSummary summary;
    summary.targets = static_cast<int32_t>(last.targets.size());
    summary.succeeded = last.succeeded;
    summary.empty = last.empty;
    summary.failed = last.failed;
    summary.max_start_skew_ns = last.max_start_skew_ns;
    current.summary = summary;
    const std::string when = FormatTime(now);
    if (phase == JobPhase::kFailed) {
      SetCondition(current.conditions,
                   {std::string(kFailed), "True", "NoTraceData", message, 0, ""}, when);
    } else {
      SetCondition(
          current.conditions,
          {std::string(kComplete), "True", std::string(JobPhaseName(phase)), message, 0, ""}, when);
    }
    return absl::OkStatus();
  };
  const int64_t give_up = clock_->MonotonicNs() + options_.final_status_retry_ns;
  int64_t backoff = 500 * kNanosPerMilli;
  absl::Status written;
  while (true) {
    written = WriteStatus(job, finalize);
    if (written.ok() || absl::IsNotFound(written) || absl::IsFailedPrecondition(written) ||
        clock_->MonotonicNs() >= give_up) {
      break;
    }
    spdlog::warn("profilejob {}: the final status of run {} is not written yet: {}", key, run,
                 std::string(written.message()));
    clock_->SleepForNs(backoff);
    backoff = std::min<int64_t>(backoff * 2, 10 * kNanosPerSecond);
  }
  if (written.ok()) {
    capture->wrote_final = true;
    spdlog::info("profilejob {}: {}: {}", key, JobPhaseName(phase), message);
    Event(job, phase == JobPhase::kFailed ? kube::kEventTypeWarning : kube::kEventTypeNormal,
          StrCat("Capture", JobPhaseName(phase)), message);
    for (const std::string& failure : failures) {
      Event(job, kube::kEventTypeWarning, "TargetFailed", failure);
    }
    if (metrics_ != nullptr) {
      for (const coordinator::TargetResult& target : last.targets) {
        metrics_->TargetFinished(target.outcome == coordinator::Outcome::kOk      ? "succeeded"
                                 : target.outcome == coordinator::Outcome::kEmpty ? "empty"
                                                                                  : "failed");
        if (target.start_known) {
          metrics_->ObserveStartSkew(static_cast<double>(std::llabs(target.start_error_ns)) / 1e9);
        }
      }
    }
  } else {
    spdlog::error("profilejob {}: the final status of run {} was not written: {}", key, run,
                  std::string(written.message()));
  }
  capture->finished = true;
  queue_.Add(key);
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
  patch[3] = op("replace", "/status/phase",
                web::json::value::string(std::string(JobPhaseName(JobPhase::kCapturing))));
  patch[4] = op("add", "/status/attempt", web::json::value::number(attempt));
  patch[5] = op("add", "/status/startTimeNs", web::json::value::number(t0));
  patch[6] = op("add", "/status/startTime", web::json::value::string(FormatTime(t0)));
  absl::StatusOr<web::json::value> patched = client_->Patch(
      ProfileJobs(), job.namespace_, job.name, kube::PatchType::kJson, patch, "status");
  if (patched.ok() || absl::IsNotFound(patched.status()) || kube::IsRetryable(patched.status())) {
    return patched.status();
  }
  // A test failed (or something else was refused): read the job to tell which.
  return WriteStatus(job, [&](ProfileJobStatus& current) -> absl::Status {
    if (current.run_name != run || IsTerminal(current.phase)) {
      return absl::FailedPreconditionError(StrCat("the job moved on (phase ",
                                                  JobPhaseName(current.phase), ", run ",
                                                  current.run_name, ")"));
    }
    current.phase = JobPhase::kCapturing;
    current.attempt = attempt;
    current.start_time_ns = t0;
    current.start_time = FormatTime(t0);
    return absl::OkStatus();
  });
}

absl::Status ProfileJobController::WriteStatus(
    const JobRef& job, const std::function<absl::Status(ProfileJobStatus&)>& mutate) {
  return kube::RetryOnConflict(clock_, [&]() -> absl::Status {
    CLUSTERPROF_ASSIGN_OR_RETURN(web::json::value latest,
                                 client_->Get(ProfileJobs(), job.namespace_, job.name));
    CLUSTERPROF_ASSIGN_OR_RETURN(kube::ObjectMeta meta, kube::DecodeObjectMeta(latest));
    if (meta.uid != job.uid) {
      return absl::NotFoundError(
          StrCat("profilejob ", job.namespace_, "/", job.name, " was replaced by another object"));
    }
    const web::json::value null_value;
    CLUSTERPROF_ASSIGN_OR_RETURN(
        ProfileJobStatus status,
        ParseProfileJobStatus(latest.has_field("status") ? latest.at("status") : null_value));
    CLUSTERPROF_RETURN_IF_ERROR(mutate(status));
    status.observed_generation = meta.generation;
    for (Condition& condition : status.conditions) {
      if (condition.observed_generation == 0) condition.observed_generation = meta.generation;
    }
    latest["status"] = ProfileJobStatusToJson(status);
    return client_->UpdateStatus(ProfileJobs(), job.namespace_, latest).status();
  });
}

absl::Status ProfileJobController::UpdateStatus(const web::json::value& job,
                                                const ProfileJobStatus& status) {
  web::json::value updated = job;
  updated["status"] = ProfileJobStatusToJson(status);
  const std::string ns = job.at("metadata").at("namespace").as_string();
  absl::StatusOr<web::json::value> written = client_->UpdateStatus(ProfileJobs(), ns, updated);
  if (absl::IsNotFound(written.status())) return absl::OkStatus();  // deleted meanwhile
  return written.status();
}

void ProfileJobController::Event(const JobRef& job, std::string_view type, std::string_view reason,
                                 std::string_view message) {
  if (events_ == nullptr) return;
  events_->Event(ReferenceTo("ProfileJob", job.namespace_, job.name, job.uid), type, reason,
                 message);
}

}  // namespace clusterprof::controllers
