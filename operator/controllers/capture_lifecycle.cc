#include "operator/controllers/capture_lifecycle.h"

#include <algorithm>

#include "analysis/report.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/storage/logdir.h"

namespace clusterprof::controllers {
namespace {

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

// Only the job's own run, while it is not finished, takes a final status.
absl::Status CheckStillOurs(const api::ProfileJobStatus& status, const std::string& run) {
  if (status.run_name != run || api::IsTerminal(status.phase)) {
    return absl::FailedPreconditionError(StrCat("the job moved on (phase ",
                                                api::JobPhaseName(status.phase), ", run ",
                                                status.run_name, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string JoinNames(const std::vector<std::string>& names, size_t limit) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) {
    if (i > 0) out += ", ";
    out += names[i];
  }
  if (names.size() > limit) StrAppend(&out, ", and ", names.size() - limit, " more");
  return out;
}

coordinator::CaptureOptions CaptureOptionsFor(const api::ProfileJobSpec& spec,
                                              const api::ProfileJobStatus& status,
                                              const CaptureSettings& settings, bool resume) {
  coordinator::CaptureOptions options;
  for (const api::TargetStatus& target : status.targets) {
    options.targets.push_back({target.address, target.name});
  }
  options.logdir = spec.parsed_logdir;
  options.run = status.run_name;
  options.duration_ms = spec.duration_ms;
  options.delay_ms = spec.delay_ms;
  options.num_tracing_attempts = spec.tracing_attempts;
  options.profile = spec.profile_options;
  options.fan_out_lead_ms = settings.fan_out_lead_ms;
  options.retry_backoff_ms = settings.retry_backoff_ms;
  options.grace_ms = settings.grace_ms;
  options.clock_probes = settings.clock_probes;
  options.auth_token = settings.auth_token;
  options.connector = settings.connector;
  options.storages = settings.storages;
  options.start_at_ns = status.start_time_ns;
  options.resume = resume;
  // A capture must survive this operator: a successor rejoins or reads it back.
  options.outlive_client = true;
  // The attempt under way when the last operator stopped is made again (joined when running).
  options.attempts_used = resume ? std::max(0, status.attempt - 1) : 0;
  return options;
}

std::string FailureMessage(const coordinator::TargetResult& result) {
  if (result.outcome == coordinator::Outcome::kEmpty) return "no trace data";
  // Nothing listens on the port: an injected sidecar whose process does not run (its container
  // runs on: docs/webhook.md), or a profiler server that is down. Its own log says why.
  if (result.outcome == coordinator::Outcome::kFailed &&
      result.message.find("Connection refused") != std::string::npos) {
    return StrCat(result.message,
                  "; nothing listens there: the sidecar is not serving (for a pod, `kubectl "
                  "logs POD -c clusterprof-sidecar` says why)");
  }
  return result.message;
}

api::TargetStatus TargetStatusFor(const coordinator::TargetResult& result,
                                  const std::vector<api::TargetStatus>& planned) {
  api::TargetStatus entry;
  entry.name = result.host_name;
  entry.address = result.address;
  for (const api::TargetStatus& old : planned) {
    if (old.address == result.address) entry.node = old.node;
  }
  entry.phase = TargetPhase(result.outcome);
  entry.attempts = result.attempts;
  entry.events = static_cast<int64_t>(result.events);
  entry.dropped_events = static_cast<int64_t>(result.dropped_events);
  entry.lookback_ms = result.lookback_ns / kNanosPerMilli;
  entry.bytes = static_cast<int64_t>(result.bytes);
  for (const std::string& file : result.files) {
    if (EndsWith(file, storage::kXPlaneSuffix)) entry.file = file;
  }
  entry.clock_offset_ns = result.clock_offset_ns;
  entry.clock_uncertainty_ns = result.clock_uncertainty_ns;
  entry.start_error_ns = result.start_error_ns;
  entry.message =
      result.outcome == coordinator::Outcome::kOk ? result.message : FailureMessage(result);
  if (!result.warnings.empty()) {
    const std::string warnings = JoinNames(result.warnings, 3);
    entry.message = entry.message.empty() ? StrCat("warnings: ", warnings)
                                          : StrCat(entry.message, "; warnings: ", warnings);
  }
  if (result.recovered) {
    entry.message = entry.message.empty()
                        ? "read back from the sidecar after an operator restart"
                        : StrCat(entry.message, " (read back after an operator restart)");
  }
  return entry;
}

api::JobPhase PhaseFor(const coordinator::RunResult& result) {
  if (result.succeeded == static_cast<int>(result.targets.size()) && result.succeeded > 0) {
    return api::JobPhase::kSucceeded;
  }
  return result.succeeded > 0 ? api::JobPhase::kPartiallySucceeded : api::JobPhase::kFailed;
}

std::vector<std::string> TargetFailures(const coordinator::RunResult& result) {
  std::vector<std::string> failures;
  for (const coordinator::TargetResult& target : result.targets) {
    if (target.outcome == coordinator::Outcome::kOk) continue;
    failures.push_back(
        StrCat(target.host_name, " (", target.address, "): ", FailureMessage(target)));
  }
  return failures;
}

std::string FinalMessage(const coordinator::RunResult& result) {
  if (PhaseFor(result) == api::JobPhase::kSucceeded) {
    return StrCat("all ", result.targets.size(), " target(s) captured; max start skew ",
                  api::FormatDuration(result.max_start_skew_ns));
  }
  return StrCat(result.succeeded, " of ", result.targets.size(), " target(s) captured; ",
                JoinNames(TargetFailures(result), 5));
}

api::JobAnalysis AnalysisFor(const coordinator::RunResult& result,
                             const std::vector<api::TargetStatus>& targets) {
  const analysis::Analysis& a = result.report->analysis;
  api::JobAnalysis out;
  out.first_step = a.first_step;
  out.last_step = a.last_step;
  out.steps = a.steps;
  out.compared_steps = a.compared_steps;
  std::vector<std::string> stragglers;
  for (const analysis::HostVerdict& verdict : a.hosts) {
    api::HostAnalysis host;
    host.host = verdict.host;
    for (const api::TargetStatus& target : targets) {
      if (target.name == verdict.host) host.node = target.node;
    }
    host.steps = verdict.steps;
    host.step_p50_ns = verdict.step_p50_ns;
    host.step_p90_ns = verdict.step_p90_ns;
    host.step_max_ns = verdict.step_max_ns;
    host.straggler = verdict.straggler;
    host.late_steps = verdict.late_steps;
    host.median_lateness_ns = verdict.median_lateness_ns;
    host.others_wait_ns = verdict.others_wait_ns;
    if (verdict.straggler) {
      host.cause = std::string(analysis::CauseName(verdict.cause));
      host.evidence = verdict.evidence;
      stragglers.push_back(verdict.host);
    }
    out.hosts.push_back(std::move(host));
  }
  // A column stays narrow: a few names, then how many more.
  out.stragglers = stragglers.empty() ? "none" : JoinNames(stragglers, 3);
  out.left_out = a.left_out;
  out.notes = a.notes;
  out.report_uri = result.report_html_uri;
  out.report_json_uri = result.report_json_uri;
  return out;
}

std::vector<std::string> StragglerMessages(const api::JobAnalysis& analysis) {
  std::vector<std::string> messages;
  for (const api::HostAnalysis& host : analysis.hosts) {
    if (!host.straggler) continue;
    messages.push_back(StrCat("pod ", host.host,
                              host.node.empty() ? "" : StrCat(" on node ", host.node),
                              " holds the job back (", host.cause, "): ", host.evidence));
  }
  return messages;
}

absl::Status FinalStatus(api::ProfileJobStatus& status, const std::string& run,
                         const coordinator::RunResult& result, int64_t now_ns) {
  CLUSTERPROF_RETURN_IF_ERROR(CheckStillOurs(status, run));
  const api::JobPhase phase = PhaseFor(result);
  const std::string message = FinalMessage(result);
  const std::vector<api::TargetStatus> planned = std::move(status.targets);
  status.phase = phase;
  status.message = message;
  status.completion_time = api::FormatTime(now_ns);
  status.attempt = std::max(status.attempt, result.attempt);
  status.manifest_uri = result.manifest_uri;
  status.targets.clear();
  for (const coordinator::TargetResult& target : result.targets) {
    status.targets.push_back(TargetStatusFor(target, planned));
  }
  status.summary = api::JobSummary{.targets = static_cast<int32_t>(result.targets.size()),
                                   .succeeded = result.succeeded,
                                   .empty = result.empty,
                                   .failed = result.failed,
                                   .max_start_skew_ns = result.max_start_skew_ns};
  status.analysis.reset();
  if (result.report != nullptr) status.analysis = AnalysisFor(result, status.targets);
  if (phase == api::JobPhase::kFailed) {
    api::SetCondition(status.conditions,
                      {std::string(kFailed), "True", "NoTraceData", message, 0, ""},
                      status.completion_time);
  } else {
    api::SetCondition(
        status.conditions,
        {std::string(kComplete), "True", std::string(api::JobPhaseName(phase)), message, 0, ""},
        status.completion_time);
  }
  return absl::OkStatus();
}

absl::Status CaptureErrorStatus(api::ProfileJobStatus& status, const std::string& run,
                                std::string_view why, int64_t now_ns) {
  CLUSTERPROF_RETURN_IF_ERROR(CheckStillOurs(status, run));
  status.phase = api::JobPhase::kFailed;
  status.message = StrCat("the capture could not start: ", why);
  status.completion_time = api::FormatTime(now_ns);
  api::SetCondition(status.conditions,
                    {std::string(kFailed), "True", "CaptureError", status.message, 0, ""},
                    status.completion_time);
  return absl::OkStatus();
}

AttemptEvent AttemptEventFor(int attempt, int64_t t0_ns, bool resume, int attempts_used,
                             int tracing_attempts, size_t targets, const std::string& run) {
  if (attempt == 1 && !resume) {
    return {"CaptureStarted", StrCat("Profile requests sent to ", targets, " target(s); start at ",
                                     api::FormatTime(t0_ns))};
  }
  if (resume && attempt == attempts_used + 1) {
    return {"CaptureResumed", StrCat("resuming run ", run, " (attempt ", attempt,
                                     "): finished sessions are read back, running ones joined")};
  }
  return {"CaptureRetried",
          StrCat("attempt ", attempt, " of ", tracing_attempts,
                 " for the targets that came back empty or unavailable; start at ",
                 api::FormatTime(t0_ns))};
}

}  // namespace clusterprof::controllers
