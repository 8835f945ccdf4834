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
#include "coordinator/coordinator.h"
#include "operator/api/types.h"

namespace clusterprof::controllers {

// Condition types of a ProfileJob.
inline constexpr std::string_view kTargetsResolved = "TargetsResolved";
inline constexpr std::string_view kComplete = "Complete";
inline constexpr std::string_view kFailed = "Failed";

// What the operator adds to a job's spec for its captures (ProfileJobControllerOptions).
struct CaptureSettings {
  int64_t fan_out_lead_ms = 200;
  int64_t retry_backoff_ms = 1000;
  int64_t grace_ms = 30'000;
  int clock_probes = 5;
  std::string auth_token;
  coordinator::ProfilerConnector* connector = nullptr;
  storage::StorageSet* storages = nullptr;
};

// The coordinator's options for capturing (or, with `resume`, resuming) the run that `status`
// planned: its targets, run, T0 and attempts so far. The capture outlives the operator, so a
// successor can rejoin it.
coordinator::CaptureOptions CaptureOptionsFor(const api::ProfileJobSpec& spec,
                                              const api::ProfileJobStatus& status,
                                              const CaptureSettings& settings, bool resume);

// What a target that came back without data gets in its status and Events: the coordinator's
// message, with what to look at when nothing listened on its port.
std::string FailureMessage(const coordinator::TargetResult& result);

// A target's status from its result; `planned` gives what the result does not know (its node).
api::TargetStatus TargetStatusFor(const coordinator::TargetResult& result,
                                  const std::vector<api::TargetStatus>& planned);

// Succeeded when every target has data, PartiallySucceeded when some do, else Failed.
api::JobPhase PhaseFor(const coordinator::RunResult& result);

// "host (address): why" for each target without data.
std::vector<std::string> TargetFailures(const coordinator::RunResult& result);

// The job's message for a finished run: "all 4 target(s) captured; max start skew 42us", or
// "3 of 4 target(s) captured; worker-2 (10.0.0.7:8466): UNAVAILABLE: ...".
std::string FinalMessage(const coordinator::RunResult& result);

// "a, b, c, and 4 more".
std::string JoinNames(const std::vector<std::string>& names, size_t limit);

// The job's analysis from the run's report: every host with its node (from `targets`), the
// stragglers named for the printer column, and where the report files are.
api::JobAnalysis AnalysisFor(const coordinator::RunResult& result,
                             const std::vector<api::TargetStatus>& targets);
// One StragglerDetected Event message per straggler, naming its pod and node: "pod worker-1 on
// node gpu-7 holds the job back (compute): enters the collectives 9.5 ms late ...".
std::vector<std::string> StragglerMessages(const api::JobAnalysis& analysis);

// Writes the finished run into `status` (the server's latest copy). FailedPrecondition, writing
// nothing, when the job moved on: another run, or already finished.
absl::Status FinalStatus(api::ProfileJobStatus& status, const std::string& run,
                         const coordinator::RunResult& result, int64_t now_ns);

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
