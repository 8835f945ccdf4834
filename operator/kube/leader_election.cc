#include "operator/kube/leader_election.h"

#include <time.h>

#include <cstdio>
#include <functional>
#include <utility>

#include "common/base/check.h"
#include "common/base/strings.h"
#include "common/retry/backoff.h"
#include "operator/kube/api_error.h"
#include "operator/kube/resource.h"
#include "spdlog/spdlog.h"

namespace clusterprof::kube {
namespace {

// client-go's JitterFactor: candidates wait between 1 and 2.2 retry periods between attempts, so
// they do not move in lockstep.
constexpr double kJitterFactor = 1.2;

// RFC 3339 with microseconds in UTC, as metav1.MicroTime marshals: "2006-01-02T15:04:05.000000Z".
std::string FormatMicroTime(int64_t wall_ns) {
  const time_t seconds = static_cast<time_t>(wall_ns / kNanosPerSecond);
  const int64_t micros = (wall_ns % kNanosPerSecond) / kNanosPerMicro;
  struct tm utc;
  gmtime_r(&seconds, &utc);
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<long long>(micros));
  return buffer;
}

std::string StringField(const web::json::value& object, const char* name) {
  if (!object.is_object() || !object.has_field(name)) return "";
  const web::json::value& field = object.at(name);
  return field.is_string() ? field.as_string() : "";
}

int64_t IntegerField(const web::json::value& object, const char* name) {
  if (!object.is_object() || !object.has_field(name)) return 0;
  const web::json::value& field = object.at(name);
  return field.is_number() && field.as_number().is_int64() ? field.as_number().to_int64() : 0;
}

// The record in a Lease's spec; missing fields read as empty (a Lease created by hand, or
// released by client-go, may lack some).
LeaderElectionRecord RecordFromLease(const web::json::value& lease) {
  LeaderElectionRecord record;
  if (!lease.is_object() || !lease.has_field("spec")) return record;
  const web::json::value& spec = lease.at("spec");
  record.holder_identity = StringField(spec, "holderIdentity");
  record.lease_duration_seconds = IntegerField(spec, "leaseDurationSeconds");
  record.acquire_time = StringField(spec, "acquireTime");
  record.renew_time = StringField(spec, "renewTime");
  record.lease_transitions = IntegerField(spec, "leaseTransitions");
  return record;
}

web::json::value SpecFromRecord(const LeaderElectionRecord& record) {
  web::json::value spec = web::json::value::object();
  spec["holderIdentity"] = web::json::value(record.holder_identity);
  spec["leaseDurationSeconds"] = web::json::value(record.lease_duration_seconds);
  spec["acquireTime"] = web::json::value(record.acquire_time);
  spec["renewTime"] = web::json::value(record.renew_time);
  spec["leaseTransitions"] = web::json::value(record.lease_transitions);
  return spec;
}

std::string Seconds(int64_t ns) { return StrCat(static_cast<double>(ns) / kNanosPerSecond, " s"); }

}  // namespace

absl::StatusOr<std::unique_ptr<LeaderElector>> LeaderElector::Create(ApiClient* client,
                                                                     Clock* clock,
                                                                     LeaderElectionConfig config) {
  CLUSTERPROF_CHECK(client != nullptr);
  CLUSTERPROF_CHECK(clock != nullptr);
  if (config.lease_namespace.empty() || config.lease_name.empty()) {
    return absl::InvalidArgumentError(
        "leader election needs the namespace and name of its Lease; set lease_namespace and "
        "lease_name");
  }
  if (config.identity.empty()) {
    return absl::InvalidArgumentError(
        "leader election needs a unique identity per candidate (e.g. <hostname>_<pid>)");
  }
  if (config.retry_period_ns <= 0 || config.lease_duration_ns <= config.renew_deadline_ns ||
      static_cast<double>(config.renew_deadline_ns) <=
          kJitterFactor * static_cast<double>(config.retry_period_ns)) {
    return absl::InvalidArgumentError(StrCat(
        "leader election durations must satisfy lease duration > renew deadline > ", kJitterFactor,
        " * retry period > 0; got lease duration ", Seconds(config.lease_duration_ns),
        ", renew deadline ", Seconds(config.renew_deadline_ns), ", retry period ",
        Seconds(config.retry_period_ns)));
  }
  return std::unique_ptr<LeaderElector>(new LeaderElector(client, clock, std::move(config)));
}

LeaderElector::LeaderElector(ApiClient* client, Clock* clock, LeaderElectionConfig config)
    : client_(client), clock_(clock), config_(std::move(config)) {}

absl::Status LeaderElector::Run() { return Run(stop_); }

void LeaderElector::Stop() {
  stop_.store(true, std::memory_order_release);
  clock_->Wake();
}

bool LeaderElector::IsLeader() const {
  MutexLock lock(&mu_);
  return leading_ && clock_->MonotonicNs() < renew_deadline_mono_ns_;
}

std::string LeaderElector::GetLeader() const {
  MutexLock lock(&mu_);
  return leader_;
}

absl::Status LeaderElector::last_error() const {
  MutexLock lock(&mu_);
  return last_error_;
}

bool LeaderElector::WaitUntil(int64_t deadline_ns, const std::atomic<bool>& stop) {
  return clock_->SleepUntilMonotonicNsUnless(deadline_ns, stop);
}

absl::Status LeaderElector::Run(const std::atomic<bool>& stop) {
  const std::string lease = StrCat(config_.lease_namespace, "/", config_.lease_name);
  // Retries every retry period, with up to kJitterFactor more at random (client-go's
  // wait.JitterUntil), so candidates started together do not collide again.
  Backoff retry(
      {.initial_ns = config_.retry_period_ns,
       .max_ns = config_.retry_period_ns,
       .multiplier = 1,
       .jitter_mode = BackoffPolicy::Jitter::kUp,
       .jitter = kJitterFactor},
      std::hash<std::string>()(config_.identity) ^ static_cast<size_t>(clock_->MonotonicNs()));
  have_lease_ = false;
  observed_record_ = {};
  observed_mono_ns_ = 0;

  // Campaign.
  while (true) {
    if (stop.load(std::memory_order_acquire)) return absl::OkStatus();
    const int64_t start = clock_->MonotonicNs();
    const absl::Status acquired = TryAcquireOrRenew();
    RecordAttempt(acquired);
    if (acquired.ok()) {
      MutexLock lock(&mu_);
      leading_ = true;
      renew_deadline_mono_ns_ = start + config_.renew_deadline_ns;
      break;
    }
    if (!WaitUntil(start + retry.NextDelayNs(), stop)) return absl::OkStatus();
  }
  spdlog::info("{} became the leader (lease {})", config_.identity, lease);
  if (config_.on_started_leading) config_.on_started_leading();

  // Renew every retry period until stopped, or until renewals fail past the renew deadline.
  absl::Status lost;
  int64_t last_start = clock_->MonotonicNs();
  while (true) {
    if (!WaitUntil(last_start + config_.retry_period_ns, stop)) break;
    last_start = clock_->MonotonicNs();
    const absl::Status renewed = TryAcquireOrRenew();
    RecordAttempt(renewed);
    MutexLock lock(&mu_);
    if (renewed.ok()) {
      renew_deadline_mono_ns_ = last_start + config_.renew_deadline_ns;
      continue;
    }
    // Another holder in the Lease: it took over (the Lease was replaced, or we were too late);
    // stepping down at once is safer than waiting for the deadline.
    if (absl::IsFailedPrecondition(renewed) || clock_->MonotonicNs() >= renew_deadline_mono_ns_) {
      lost = absl::UnavailableError(StrCat(config_.identity, " lost the leadership of lease ",
                                           lease, ": ", renewed.message()));
      break;
    }
  }
  {
    MutexLock lock(&mu_);
    leading_ = false;
  }
  if (lost.ok()) {
    spdlog::info("{} stops leading (lease {}): asked to stop", config_.identity, lease);
  } else {
    spdlog::error("{}", std::string(lost.message()));
  }
  if (config_.on_stopped_leading) config_.on_stopped_leading();
  if (lost.ok() && config_.release_on_cancel) Release();
  return lost;
}

absl::Status LeaderElector::TryAcquireOrRenew() {
  attempts_.fetch_add(1, std::memory_order_relaxed);
  const std::string now = FormatMicroTime(clock_->WallNs());
  LeaderElectionRecord desired;
  desired.holder_identity = config_.identity;
  desired.lease_duration_seconds =
      (config_.lease_duration_ns + kNanosPerSecond - 1) / kNanosPerSecond;
  desired.acquire_time = now;
  desired.renew_time = now;

  absl::StatusOr<web::json::value> got =
      client_->Get(Leases(), config_.lease_namespace, config_.lease_name);
  if (absl::IsNotFound(got.status())) {
    web::json::value object = web::json::value::object();
    object["metadata"]["name"] = web::json::value(config_.lease_name);
    object["metadata"]["namespace"] = web::json::value(config_.lease_namespace);
    object["spec"] = SpecFromRecord(desired);
    absl::StatusOr<web::json::value> created =
        client_->Create(Leases(), config_.lease_namespace, object);
    // AlreadyExists: another candidate created it first; the next attempt reads theirs.
    if (!created.ok()) return created.status();
    lease_ = *std::move(created);
    have_lease_ = true;
    observed_record_ = desired;
    observed_mono_ns_ = clock_->MonotonicNs();
    ObserveHolder(desired.holder_identity);
    return absl::OkStatus();
  }
  if (!got.ok()) return got.status();

  lease_ = *std::move(got);
  have_lease_ = true;
  const LeaderElectionRecord old = RecordFromLease(lease_);
  // Expiry is judged by when this process saw the record change, on its own monotonic clock:
  // comparing the renewTime written by another machine with our wall clock would trust both
  // clocks to agree.
  if (!(old == observed_record_)) {
    observed_record_ = old;
    observed_mono_ns_ = clock_->MonotonicNs();
  }
  ObserveHolder(old.holder_identity);
  const int64_t duration_ns = old.lease_duration_seconds > 0
                                  ? old.lease_duration_seconds * kNanosPerSecond
                                  : config_.lease_duration_ns;
  if (!old.holder_identity.empty() && old.holder_identity != config_.identity &&
      clock_->MonotonicNs() < observed_mono_ns_ + duration_ns) {
    return absl::FailedPreconditionError(StrCat("lease ", config_.lease_namespace, "/",
                                                config_.lease_name, " is held by ",
                                                old.holder_identity, " and has not expired"));
  }
  if (old.holder_identity == config_.identity) {
    desired.acquire_time = old.acquire_time;
    desired.lease_transitions = old.lease_transitions;
  } else {
    desired.lease_transitions = old.lease_transitions + 1;
  }

  web::json::value update = lease_;
  update["spec"] = SpecFromRecord(desired);
  // The resourceVersion read is in `update`: a 409 Conflict means another candidate wrote first.
  absl::StatusOr<web::json::value> updated =
      client_->Update(Leases(), config_.lease_namespace, update);
  if (!updated.ok()) return updated.status();
  lease_ = *std::move(updated);
  observed_record_ = desired;
  observed_mono_ns_ = clock_->MonotonicNs();
  ObserveHolder(desired.holder_identity);
  return absl::OkStatus();
}

void LeaderElector::Release() {
  if (!have_lease_ || observed_record_.holder_identity != config_.identity) return;
  const std::string now = FormatMicroTime(clock_->WallNs());
  LeaderElectionRecord released;
  released.lease_duration_seconds = 1;
  released.acquire_time = now;
  released.renew_time = now;
  released.lease_transitions = observed_record_.lease_transitions;
  web::json::value update = lease_;
  update["spec"] = SpecFromRecord(released);
  absl::StatusOr<web::json::value> updated =
      client_->Update(Leases(), config_.lease_namespace, update);
  if (!updated.ok()) {
    // The others take over when the lease expires instead.
    spdlog::warn("{} could not release lease {}/{}: {}", config_.identity, config_.lease_namespace,
                 config_.lease_name, std::string(updated.status().message()));
    return;
  }
  lease_ = *std::move(updated);
  observed_record_ = released;
  observed_mono_ns_ = clock_->MonotonicNs();
  spdlog::info("{} released lease {}/{}", config_.identity, config_.lease_namespace,
               config_.lease_name);
  ObserveHolder("");
}

void LeaderElector::RecordAttempt(const absl::Status& status) {
  bool log = false;
  {
    MutexLock lock(&mu_);
    // A lease held by another is the normal state of a follower, not an error worth a log line;
    // other errors are logged when they change, not every retry period.
    log = !status.ok() && !absl::IsFailedPrecondition(status) &&
          status.message() != last_error_.message();
    last_error_ = status;
  }
  if (log) {
    spdlog::warn("{} could not acquire or renew lease {}/{} (will retry): {}{}", config_.identity,
                 config_.lease_namespace, config_.lease_name, std::string(status.message()),
                 IsForbidden(status) ? "; grant get, create and update on "
                                       "leases.coordination.k8s.io in that namespace"
                                     : "");
  }
}

void LeaderElector::ObserveHolder(const std::string& holder) {
  {
    MutexLock lock(&mu_);
    if (holder == leader_) return;
    leader_ = holder;
  }
  if (!holder.empty()) {
    spdlog::info("lease {}/{} is held by {}", config_.lease_namespace, config_.lease_name, holder);
  }
  if (config_.on_new_leader) config_.on_new_leader(holder);
}

}  // namespace clusterprof::kube
