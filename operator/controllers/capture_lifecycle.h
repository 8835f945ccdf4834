// The ProfileJob capture lifecycle as pure functions: spec and status in, coordinator options
// out; coordinator results in, status out. ProfileJobController only orchestrates them (API
// writes, events, threads); every decision about what a job's status says is made here and
// tested by table (tests/operator/controllers/capture_lifecycle_test.cc).
#ifndef CLUSTERPROF_OPERATOR_CONTROLLERS_CAPTURE_LIFECYCLE_H_
#define CLUSTERPROF_OPERATOR_CONTROLLERS_CAPTURE_LIFECYCLE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/grpc/tls.h"
#include "coordinator/coordinator.h"
#include "operator/api/types.h"
#include "operator/controllers/targets.h"

namespace clusterprof::controllers {

// Condition types of a ProfileJob.
inline constexpr std::string_view kTargetsResolved = "TargetsResolved";
// True while a Pending job waits for targets still on their way (spec.targets.waitSeconds).
inline constexpr std::string_view kWaitingForTargets = "WaitingForTargets";
inline constexpr std::string_view kComplete = "Complete";
inline constexpr std::string_view kFailed = "Failed";

// What the operator adds to a job's spec for its captures (ProfileJobControllerOptions).
struct CaptureSettings {
  int64_t fan_out_lead_ms = 200;
  int64_t retry_backoff_ms = 1000;
  int64_t grace_ms = 30'000;
  int clock_probes = 5;
  std::string auth_token;
  std::string previous_auth_token;
  std::shared_ptr<const tls::ChannelSecurity> security;
  coordinator::ChannelPool* channel_pool = nullptr;
  coordinator::ProfilerConnector* connector = nullptr;
  storage::StorageSet* storages = nullptr;
};

// Where the run `run` of the job with `spec` goes: its logdir and run name, checked. Scheduling
// records its directory in the status, and each capture (or resume) of the run writes there.
absl::StatusOr<storage::RunLayout> JobRunLayout(const api::ProfileJobSpec& spec,
                                                std::string_view run);

// The coordinator's options for capturing (or, with `resume`, resuming) the run that `status`
// planned (its run, T0 and attempts so far) from `targets`; an error when the run's name, as the
// status has it, is not one (JobRunLayout). The capture outlives the operator,
// so a successor can rejoin it: it resolves the targets again, and each sidecar's session state
// says what that target did (a finished session is read back, a running one joined).
absl::StatusOr<coordinator::CaptureOptions> CaptureOptionsFor(
    const api::ProfileJobSpec& spec, const api::ProfileJobStatus& status,
    const std::vector<ResolvedTarget>& targets, const CaptureSettings& settings, bool resume);

// What a target that came back without data gets in its status and Events: the coordinator's
// message, with what to look at when nothing listened on its port.
std::string FailureMessage(const coordinator::TargetResult& result);

// A target's status from its result and its node (what the result does not know). The message is
// cut to api::kMaxTargetMessageBytes.
api::TargetStatus TargetStatusFor(const coordinator::TargetResult& result, std::string node);

// The targets a finished run's status lists (api::kMaxListedTargets, docs/operator.md "Status at
// scale"): every target, then the skipped pods, when they all fit; else only those that need
// attention, in this order: failed, empty, skipped, and those that started more than
// coordinator::kLateStartNs from the start instant (farthest first), up to the cap. `not_listed`
// counts the others.
std::vector<api::TargetStatus> ListedTargets(const coordinator::RunResult& result,
                                             const TargetResolution& plan, int32_t* not_listed);

// What a Scheduled (or queued) job's status says of its targets: each as Pending, and the skipped
// pods, when they fit in api::kMaxListedTargets; else none, counted in targetsNotListed. The
// summary counts them.
void PlannedTargets(const TargetResolution& plan, api::ProfileJobStatus& status);

// The summary of a finished run: counts by outcome, skipped pods, skew and start-error
// percentiles, the five slowest starts.
api::JobSummary SummaryFor(const coordinator::RunResult& result, const TargetResolution& plan);

// Succeeded when every target has data, PartiallySucceeded when some do, else Failed.
api::JobPhase PhaseFor(const coordinator::RunResult& result);

// "host (address): why" for each target without data.
std::vector<std::string> TargetFailures(const coordinator::RunResult& result);

// One TargetFailed Event for all the targets without data, grouped by what went wrong:
// "3 of 10000 target(s) have no data: UNAVAILABLE (2): w-1 (10.0.0.1:8466), w-7 (...); no trace
// data (1): w-9 (...); every target in gs://b/run/clusterprof_run.json". Empty when none failed.
std::string TargetFailuresEvent(const coordinator::RunResult& result);

// One TargetSkipped Event for the pods left out ("2 matching pod(s) left out: a: not Ready, b:
// ..."); empty when none.
std::string SkippedEvent(const std::vector<std::string>& skipped);

// The job's message for a finished run: "all 4 target(s) captured; max start skew 42us",
// "3 of 4 target(s) captured; worker-2 (10.0.0.7:8466): UNAVAILABLE: ...", or with more failures
// grouped by kind: "9000 of 10000 target(s) captured; UNAVAILABLE (1000): w-1 (...), w-4 (...),
// w-9 (...), and 997 more".
std::string FinalMessage(const coordinator::RunResult& result);

// "a, b, c, and 4 more".
std::string JoinNames(const std::vector<std::string>& names, size_t limit);

// The job's analysis from the run's report: the hosts (all up to api::kMaxListedHosts, else the
// stragglers and the costliest others) with their nodes (from `plan`), the stragglers named for
// the printer column, and where the report files are.
api::JobAnalysis AnalysisFor(const coordinator::RunResult& result, const TargetResolution& plan);
// The StragglerDetected Event messages, naming each straggler's pod and node: "pod worker-1 on
// node gpu-7 holds the job back (compute): enters the collectives 9.5 ms late ..."; past
// kMaxStragglerEvents stragglers, one more message counts the rest.
std::vector<std::string> StragglerMessages(const api::JobAnalysis& analysis);
inline constexpr size_t kMaxStragglerEvents = 5;

// Writes the finished run into `status` (the server's latest copy), within api::kMaxStatusBytes
// whatever the targets did. `plan` is what the capture was asked of (nodes, skipped pods).
// FailedPrecondition, writing nothing, when the job moved on: another run, or already finished.
absl::Status FinalStatus(api::ProfileJobStatus& status, const std::string& run,
                         const coordinator::RunResult& result, const TargetResolution& plan,
                         int64_t now_ns);

// Marks `status` Failed because the capture could not start (`why`); FailedPrecondition when the
// job moved on.
absl::Status CaptureErrorStatus(api::ProfileJobStatus& status, const std::string& run,
                                std::string_view why, int64_t now_ns);

// The Event for the start of an attempt: reason (CaptureStarted, CaptureResumed,
// CaptureRetried) and message.
struct AttemptEvent {
  std::string reason;
  std::string message;
};
AttemptEvent AttemptEventFor(int attempt, int64_t t0_ns, bool resume, int attempts_used,
                             int tracing_attempts, size_t targets, const std::string& run);

}  // namespace clusterprof::controllers

#endif  // CLUSTERPROF_OPERATOR_CONTROLLERS_CAPTURE_LIFECYCLE_H_
