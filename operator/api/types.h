// The clusterprof.io/v1alpha1 API as the controllers read and write it: ProfileJob and
// ProfileSchedule specs (parsed and validated: the CRD's OpenAPI schema and CEL rules, checked
// again here because older API servers ignore CEL and a spec may predate a schema change) and
// the ProfileJob status. crds/ holds the schema; docs/operator.md is the reference.
#ifndef CLUSTERPROF_OPERATOR_API_TYPES_H_
#define CLUSTERPROF_OPERATOR_API_TYPES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "common/storage/logdir.h"
#include "cpprest/json.h"
#include "operator/kube/event_recorder.h"
#include "operator/kube/resource.h"
#include "operator/kube/selector.h"
#include "proto/profile_options.h"

namespace clusterprof::api {

inline constexpr std::string_view kGroup = "clusterprof.io";
inline constexpr std::string_view kApiVersion = "clusterprof.io/v1alpha1";
// The pod annotation that names the sidecar's port.
inline constexpr std::string_view kPortAnnotation = "clusterprof.io/port";
// On a ProfileJob, "true" asks the operator to end it: a job that has not started fails with
// reason Cancelled (`kubectl clusterprof capture` sets it when Ctrl-C is confirmed).
inline constexpr std::string_view kCancelAnnotation = "clusterprof.io/cancel";
// The sidecar's container name (a regular or a native sidecar container), and the name of the
// container port it listens on.
inline constexpr std::string_view kSidecarContainerName = "clusterprof-sidecar";
inline constexpr std::string_view kSidecarPortName = "clusterprof";
inline constexpr int32_t kDefaultSidecarPort = 8466;
// Label on the ProfileJobs a ProfileSchedule creates: the schedule's name.
inline constexpr std::string_view kScheduleLabel = "clusterprof.io/schedule";
// Annotation on those ProfileJobs: the scheduled time they were created for (RFC 3339).
inline constexpr std::string_view kScheduledAtAnnotation = "clusterprof.io/scheduled-at";

kube::ResourceType ProfileJobs();
kube::ResourceType ProfileSchedules();
// The object of an Event about one of ours: `kind` is "ProfileJob" or "ProfileSchedule".
kube::ObjectReference ReferenceTo(std::string_view kind, std::string_view ns, std::string_view name,
                                  std::string_view uid);

// Bounds the CRD schema states, and that the controllers enforce.
inline constexpr int64_t kMaxDurationMs = 600'000;
inline constexpr int64_t kMaxDelayMs = 3'600'000;
inline constexpr int32_t kMaxTracingAttempts = 10;
inline constexpr int64_t kDefaultQueueTimeoutSeconds = 600;
inline constexpr int64_t kMaxQueueTimeoutSeconds = 86400;
inline constexpr size_t kMaxAddresses = 1000;
// spec.targets.maxTargets: a selector that matches more ready pods is refused, naming both
// counts. The status stays within kMaxStatusBytes at any count; this bounds what one operator
// process dispatches and holds (bench/RESULTS.md, "One ProfileJob over 10,000 pods").
inline constexpr int32_t kDefaultMaxTargets = 20'000;
// spec.targets.waitSeconds: by default a job applied together with its workload waits two
// minutes for the pods to come up (an image pull, a scale-up) before it gives up.
inline constexpr int64_t kDefaultWaitSeconds = 120;
inline constexpr int64_t kMaxWaitSeconds = 86'400;
inline constexpr int32_t kMaxMaxTargets = 100'000;
// What a ProfileJob's status may grow to, whatever its targets did (etcd takes 1.5 MiB per
// object; the rest is the spec's and the metadata's).
inline constexpr size_t kMaxStatusBytes = 256 * 1024;
// status.targets lists every target of a job of up to this many targets; a larger job lists only
// the targets that need attention (failed, empty, skipped, late), this many at most, and counts
// the rest in status.targetsNotListed. The run manifest in the logdir has every target.
inline constexpr size_t kMaxListedTargets = 100;
// status.analysis.hosts: every host up to this many, else the stragglers and the latest hosts.
inline constexpr size_t kMaxListedHosts = 20;
// A target's message in the status is cut to this many bytes (the manifest has all of it).
inline constexpr size_t kMaxTargetMessageBytes = 512;
// The longest lookback asked of the sidecars' flight recorders (each refuses more than its
// --recorder-window-ms).
inline constexpr int64_t kMaxLookbackMs = 3'600'000;

struct ProfileJobSpec {
  // Pods in the job's namespace; nullopt: only `addresses`.
  std::optional<kube::LabelSelector> selector;
  std::vector<std::string> addresses;
  // 0: the pod's clusterprof.io/port annotation, else its "clusterprof" container port, else
  // 8466.
  int32_t port = 0;
  int32_t min_ready = 1;
  // More ready pods than this and the job fails with TooManyTargets.
  int32_t max_targets = kDefaultMaxTargets;
  // How long after its creation the job waits, Pending with the WaitingForTargets condition,
  // for fewer than min_ready ready targets, or for matching pods still on their way, before it
  // captures what is ready (or fails NotEnoughTargets). 0: no wait.
  int64_t wait_seconds = kDefaultWaitSeconds;
  int64_t duration_ms = 2000;
  int64_t delay_ms = 1000;
  // How far before the start the trace reaches: the annotations the sidecars' flight recorders
  // kept (docs/triggers.md); sent as advanced_configuration clusterprof_lookback_ms. 0: none.
  int64_t lookback_ms = 0;
  // gs://bucket/prefix or an absolute path, parsed once here.
  storage::Logdir logdir;
  // "": the UTC start time, YYYY_MM_DD_HH_MM_SS.
  std::string run_name;
  int32_t tracing_attempts = 3;
  // spec.options as the ProfileOptions every target is sent: the tracer levels and
  // advancedConfiguration, on upstream's defaults.
  tensorflow::ProfileOptions profile_options = proto::DefaultProfileOptions();
  std::optional<int64_t> ttl_seconds_after_finished;
  // How long the job may wait for other jobs to release its targets before it fails; 0: fail
  // at once instead of waiting.
  int64_t queue_timeout_seconds = kDefaultQueueTimeoutSeconds;
};

// Reads and validates a ProfileJob's spec (absent fields take the schema's defaults). The error
// names the field and says what to fix: `spec.durationMs: must be between 1 and 600000
// (milliseconds), got -5`. `where` prefixes field paths ("spec", "spec.jobTemplate.spec").
absl::StatusOr<ProfileJobSpec> ParseProfileJobSpec(const web::json::value& spec,
                                                   std::string_view where = "spec");

enum class JobPhase { kPending, kScheduled, kCapturing, kSucceeded, kPartiallySucceeded, kFailed };
std::string_view JobPhaseName(JobPhase phase);
// Unknown or empty names are kPending.
JobPhase ParseJobPhase(std::string_view name);
bool IsTerminal(JobPhase phase);

// metav1.Condition.
struct Condition {
  std::string type;
  std::string status;  // "True", "False", "Unknown"
  std::string reason;
  std::string message;
  int64_t observed_generation = 0;
  std::string last_transition_time;  // RFC 3339

  bool operator==(const Condition&) const = default;
};

// Sets `condition` in `conditions`, keeping last_transition_time when the status did not
// change (and taking `now_rfc3339` when it did).
void SetCondition(std::vector<Condition>& conditions, Condition condition,
                  std::string_view now_rfc3339);
// The condition of `type`; null when there is none.
const Condition* FindCondition(const std::vector<Condition>& conditions, std::string_view type);
// A metav1.Condition list from JSON and back; `where` names the list in errors.
absl::StatusOr<std::vector<Condition>> ParseConditions(const web::json::value& list,
                                                       std::string_view where);
web::json::value ConditionsToJson(const std::vector<Condition>& conditions);

struct TargetStatus {
  std::string name;  // the pod name (the host name in the run), or the address
  std::string address;
  std::string node;
  // Pending, Capturing, Succeeded, Empty, Failed; Skipped: matched the selector but was left out
  // (not Ready, no sidecar port).
  std::string phase = "Pending";
  int32_t attempts = 0;
  int64_t events = 0;
  int64_t dropped_events = 0;
  // How far before the start the host's trace reaches (less than spec.lookbackMs when its
  // recorder had not run that long).
  int64_t lookback_ms = 0;
  int64_t bytes = 0;
  std::string file;
  int64_t clock_offset_ns = 0;
  // -1: unknown (not a clusterprof sidecar).
  int64_t clock_uncertainty_ns = -1;
  int64_t start_error_ns = 0;
  std::string message;
};

// A target and how far from the start instant it began.
struct TargetStart {
  std::string name;
  int64_t start_error_ns = 0;
};

struct JobSummary {
  // Planned (from Scheduled on), then captured from.
  int32_t targets = 0;
  int32_t succeeded = 0;
  int32_t empty = 0;
  int32_t failed = 0;
  // Pods the selector matched that were left out (not Ready, no port).
  int32_t skipped = 0;
  int64_t max_start_skew_ns = 0;
  // |start error| percentiles over the targets with a known start; 0 when none is known.
  int64_t start_error_p50_ns = 0;
  int64_t start_error_p99_ns = 0;
  // The targets that started farthest from the start instant, farthest first (at most 5).
  std::vector<TargetStart> slowest_starts;
};

// One host of the cross-host analysis (docs/analysis.md).
struct HostAnalysis {
  std::string host;  // the pod name (the host name in the run)
  std::string node;
  int32_t steps = 0;
  int64_t step_p50_ns = 0;
  int64_t step_p90_ns = 0;
  int64_t step_max_ns = 0;
  bool straggler = false;
  // Steps it entered the collectives late in, its median lateness there, and what the other
  // hosts spent waiting for it.
  int32_t late_steps = 0;
  int64_t median_lateness_ns = 0;
  int64_t others_wait_ns = 0;
  std::string cause;  // stragglers: "compute", "input" or "launch/host overhead"
  std::string evidence;
};

// Which host holds the job back: the analysis of the targets' digests, made as the capture ends.
struct JobAnalysis {
  int64_t first_step = 0;
  int64_t last_step = 0;
  int32_t steps = 0;           // steps every analyzed host has
  int32_t compared_steps = 0;  // of those, with a collective on every host
  // For the STRAGGLERS printer column: "worker-1", "worker-1, worker-3", or "none".
  std::string stragglers;
  // Every host up to kMaxListedHosts; beyond, the stragglers and then the hosts whose late steps
  // cost the others most, kMaxListedHosts in all, and how many more there are (the report in the
  // run directory has every host).
  std::vector<HostAnalysis> hosts;
  int32_t hosts_not_listed = 0;
  std::vector<std::string> left_out;
  std::vector<std::string> notes;
  // clusterprof_report.html and .json in the run directory.
  std::string report_uri;
  std::string report_json_uri;
};

// Everything a restarted operator needs to resume a job is here: the run, T0 and the attempt. The
// targets are resolved again from the spec, and each sidecar says whether it has the run's
// session (docs/operator.md, "Status at scale").
struct ProfileJobStatus {
  JobPhase phase = JobPhase::kPending;
  std::string message;
  std::string run_name;
  std::string run_uri;
  std::string manifest_uri;
  std::string start_time;  // RFC 3339
  int64_t start_time_ns = 0;
  std::string completion_time;
  int32_t attempt = 0;
  int64_t observed_generation = 0;
  std::vector<Condition> conditions;
  // Every target (jobs of up to kMaxListedTargets), else only those that need attention.
  std::vector<TargetStatus> targets;
  // Targets not in `targets` (the run manifest has them).
  int32_t targets_not_listed = 0;
  std::optional<JobSummary> summary;
  std::optional<JobAnalysis> analysis;
};

// Reads a status (null or absent: the empty status). Lenient about unknown fields; an error
// names a field of the wrong type.
absl::StatusOr<ProfileJobStatus> ParseProfileJobStatus(const web::json::value& status);
web::json::value ProfileJobStatusToJson(const ProfileJobStatus& status);

// "142us", "1.5ms", "2.25s": the printer column's skew.
std::string FormatDuration(int64_t ns);
// RFC 3339 in UTC, seconds precision ("2026-11-24T10:00:00Z"), as Kubernetes writes times.
std::string FormatTime(int64_t wall_ns);
// Parses RFC 3339; InvalidArgument naming the value.
absl::StatusOr<int64_t> ParseTime(std::string_view rfc3339);

enum class ConcurrencyPolicy { kAllow, kForbid, kReplace };

struct ProfileScheduleSpec {
  std::string schedule;
  std::string time_zone;
  ConcurrencyPolicy concurrency_policy = ConcurrencyPolicy::kForbid;
  std::optional<int64_t> starting_deadline_seconds;
  bool suspend = false;
  int32_t successful_jobs_history_limit = 3;
  int32_t failed_jobs_history_limit = 1;
  // jobTemplate.metadata labels and annotations, and jobTemplate.spec as written (validated).
  std::map<std::string, std::string> job_labels;
  std::map<std::string, std::string> job_annotations;
  web::json::value job_spec;
};

// Reads and validates a ProfileSchedule's spec, the job template's spec included; the cron
// expression and time zone are checked by the controller (operator/controllers/cron.h).
absl::StatusOr<ProfileScheduleSpec> ParseProfileScheduleSpec(const web::json::value& spec);

// A ProfileJob a schedule started (status.active[]).
struct JobReference {
  std::string name;
  std::string namespace_;
  std::string uid;

  bool operator==(const JobReference&) const = default;
};
// status.active of a ProfileSchedule or a ProfileTrigger: a list of {name, namespace, uid}
// from JSON (absent: none) and back.
absl::StatusOr<std::vector<JobReference>> ParseJobReferences(const web::json::value* list,
                                                             std::string_view where);
web::json::value JobReferenceToJson(const JobReference& job);

struct ProfileScheduleStatus {
  std::vector<JobReference> active;
  // RFC 3339; empty: never.
  std::string last_schedule_time;
  std::string last_successful_time;
  // Why the schedule is invalid; empty when it is valid.
  std::string message;
  int64_t observed_generation = 0;
  std::vector<Condition> conditions;

  bool operator==(const ProfileScheduleStatus&) const = default;
};

// Reads a schedule's status (null or absent: the empty status); an error names a field of the
// wrong type.
absl::StatusOr<ProfileScheduleStatus> ParseProfileScheduleStatus(const web::json::value& status);
// With activeCount = active.size(); empty fields are left out.
web::json::value ProfileScheduleStatusToJson(const ProfileScheduleStatus& status);

}  // namespace clusterprof::api

#endif  // CLUSTERPROF_OPERATOR_API_TYPES_H_
