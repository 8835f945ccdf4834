#include "operator/controllers/capture_lifecycle.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <unordered_map>

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

// Cuts `text` to at most `limit` bytes, at a UTF-8 character boundary, marking the cut.
std::string Cut(std::string text, size_t limit) {
  if (text.size() <= limit) return text;
  constexpr std::string_view kMore = " [...]";
  size_t end = limit - kMore.size();
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  text.resize(end);
  text += kMore;
  return text;
}

std::unordered_map<std::string, std::string> NodesByAddress(const TargetResolution& plan) {
  std::unordered_map<std::string, std::string> nodes;
  for (const ResolvedTarget& target : plan.targets) nodes[target.address] = target.node;
  return nodes;
}

// "trainer-3: not Ready" as a status entry.
api::TargetStatus SkippedStatus(const std::string& skipped) {
  api::TargetStatus entry;
  const size_t colon = skipped.find(": ");
  entry.name = skipped.substr(0, colon);
  entry.phase = "Skipped";
  entry.message =
      Cut(colon == std::string::npos ? std::string("left out") : skipped.substr(colon + 2),
          api::kMaxTargetMessageBytes);
  return entry;
}

// What went wrong, without the details that differ between targets: the gRPC code name of
// "UNAVAILABLE: failed to connect ...", or the whole message when it has no code.
std::string FailureKind(const std::string& message) {
  const size_t colon = message.find(':');
  const std::string head = message.substr(0, colon);
  const bool code = !head.empty() && std::all_of(head.begin(), head.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || c == '_';
  });
  return code ? head : Cut(message, 80);
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

absl::StatusOr<storage::RunLayout> JobRunLayout(const api::ProfileJobSpec& spec,
                                                std::string_view run) {
  return storage::RunLayout::Create(spec.logdir, run);
}

absl::StatusOr<coordinator::CaptureOptions> CaptureOptionsFor(
    const api::ProfileJobSpec& spec, const api::ProfileJobStatus& status,
    const std::vector<ResolvedTarget>& targets, const CaptureSettings& settings, bool resume) {
  coordinator::CaptureOptions options;
  CLUSTERPROF_ASSIGN_OR_RETURN(options.layout, JobRunLayout(spec, status.run_name));
  options.targets.reserve(targets.size());
  for (const ResolvedTarget& target : targets) {
    options.targets.push_back({target.address, target.name, target.node});
  }
  options.duration_ms = spec.duration_ms;
  options.delay_ms = spec.delay_ms;
  options.num_tracing_attempts = spec.tracing_attempts;
  options.profile = spec.profile_options;
  options.fan_out_lead_ms = settings.fan_out_lead_ms;
  options.retry_backoff_ms = settings.retry_backoff_ms;
  options.grace_ms = settings.grace_ms;
  options.clock_probes = settings.clock_probes;
  options.auth_token = settings.auth_token;
  options.previous_auth_token = settings.previous_auth_token;
  options.security = settings.security;
  options.channel_pool = settings.channel_pool;
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

api::TargetStatus TargetStatusFor(const coordinator::TargetResult& result, std::string node) {
  api::TargetStatus entry;
  entry.name = result.host_name;
  entry.address = result.address;
  entry.node = std::move(node);
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
  entry.message = Cut(std::move(entry.message), api::kMaxTargetMessageBytes);
  return entry;
}

std::vector<api::TargetStatus> ListedTargets(const coordinator::RunResult& result,
                                             const TargetResolution& plan, int32_t* not_listed) {
  const std::unordered_map<std::string, std::string> nodes = NodesByAddress(plan);
  const auto node_of = [&](const coordinator::TargetResult& target) {
    auto it = nodes.find(target.address);
    return it == nodes.end() ? std::string() : it->second;
  };
  const size_t total = result.targets.size() + plan.skipped.size();
  std::vector<api::TargetStatus> listed;
  if (total <= api::kMaxListedTargets) {
    for (const coordinator::TargetResult& target : result.targets) {
      listed.push_back(TargetStatusFor(target, node_of(target)));
    }
    for (const std::string& skipped : plan.skipped) listed.push_back(SkippedStatus(skipped));
    *not_listed = 0;
    return listed;
  }
  // Only what needs attention, most serious first, without building a status for the rest.
  const auto take = [&](coordinator::Outcome outcome) {
    for (const coordinator::TargetResult& target : result.targets) {
      if (listed.size() == api::kMaxListedTargets) return;
      if (target.outcome == outcome) listed.push_back(TargetStatusFor(target, node_of(target)));
    }
  };
  take(coordinator::Outcome::kFailed);
  take(coordinator::Outcome::kPending);  // never heard back (a capture cut short)
  take(coordinator::Outcome::kEmpty);
  for (const std::string& skipped : plan.skipped) {
    if (listed.size() == api::kMaxListedTargets) break;
    listed.push_back(SkippedStatus(skipped));
  }
  for (const coordinator::TargetResult* target :
       coordinator::LatestStarts(result, api::kMaxListedTargets - listed.size())) {
    listed.push_back(TargetStatusFor(*target, node_of(*target)));
  }
  *not_listed = static_cast<int32_t>(total - listed.size());
  return listed;
}

void PlannedTargets(const TargetResolution& plan, api::ProfileJobStatus& status) {
  status.targets.clear();
  const size_t total = plan.targets.size() + plan.skipped.size();
  if (total <= api::kMaxListedTargets) {
    for (const ResolvedTarget& target : plan.targets) {
      status.targets.push_back(
          {.name = target.name, .address = target.address, .node = target.node});
    }
    for (const std::string& skipped : plan.skipped)
      status.targets.push_back(SkippedStatus(skipped));
    status.targets_not_listed = 0;
  } else {
    status.targets_not_listed = static_cast<int32_t>(total);
  }
  status.summary = api::JobSummary{.targets = static_cast<int32_t>(plan.targets.size()),
                                   .skipped = static_cast<int32_t>(plan.skipped.size())};
}

api::JobSummary SummaryFor(const coordinator::RunResult& result, const TargetResolution& plan) {
  api::JobSummary summary{.targets = static_cast<int32_t>(result.targets.size()),
                          .succeeded = result.succeeded,
                          .empty = result.empty,
                          .failed = result.failed,
                          .skipped = static_cast<int32_t>(plan.skipped.size()),
                          .max_start_skew_ns = result.max_start_skew_ns};
  std::vector<const coordinator::TargetResult*> known;
  for (const coordinator::TargetResult& target : result.targets) {
    if (target.start_known) known.push_back(&target);
  }
  if (known.empty()) return summary;
  const auto farther = [](const coordinator::TargetResult* a, const coordinator::TargetResult* b) {
    return std::llabs(a->start_error_ns) > std::llabs(b->start_error_ns);
  };
  // Farthest first: index k holds the (k+1)-th largest error.
  std::sort(known.begin(), known.end(), farther);
  const auto percentile = [&](double p) {
    const size_t from_top = static_cast<size_t>((1.0 - p) * static_cast<double>(known.size()));
    return std::llabs(known[std::min(from_top, known.size() - 1)]->start_error_ns);
  };
  summary.start_error_p50_ns = percentile(0.50);
  summary.start_error_p99_ns = percentile(0.99);
  for (size_t i = 0; i < known.size() && i < 5; ++i) {
    summary.slowest_starts.push_back({known[i]->host_name, known[i]->start_error_ns});
  }
  return summary;
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

namespace {

// The failures of `result` grouped by kind, with up to 3 names each: "UNAVAILABLE (2): w-1
// (10.0.0.1:8466), w-7 (...); no trace data (1): w-9 (...)"; a single failure in full. Empty when
// every target has data.
std::string GroupedFailures(const coordinator::RunResult& result) {
  // Kinds in the order first seen.
  std::vector<std::string> order;
  std::map<std::string, std::pair<size_t, std::vector<std::string>>> kinds;
  size_t failed = 0;
  for (const coordinator::TargetResult& target : result.targets) {
    if (target.outcome == coordinator::Outcome::kOk) continue;
    ++failed;
    const std::string kind = FailureKind(FailureMessage(target));
    auto [it, inserted] = kinds.try_emplace(kind);
    if (inserted) order.push_back(kind);
    ++it->second.first;
    if (it->second.second.size() < 3) {
      it->second.second.push_back(StrCat(target.host_name, " (", target.address, ")"));
    }
  }
  if (failed == 0) return "";
  if (failed == 1) return TargetFailures(result).front();
  std::string out;
  for (size_t i = 0; i < order.size() && i < 5; ++i) {
    const auto& [count, names] = kinds.at(order[i]);
    StrAppend(&out, i == 0 ? "" : "; ", order[i], " (", count, "): ", JoinNames(names, 3),
              count > names.size() ? StrCat(", and ", count - names.size(), " more") : "");
  }
  if (order.size() > 5) StrAppend(&out, "; and ", order.size() - 5, " other kind(s) of failure");
  return out;
}

}  // namespace

std::string TargetFailuresEvent(const coordinator::RunResult& result) {
  const std::string failures = GroupedFailures(result);
  if (failures.empty()) return "";
  const size_t failed = result.targets.size() - static_cast<size_t>(result.succeeded);
  std::string out = StrCat(failed, " of ", result.targets.size(), " target(s) ",
                           failed == 1 ? "has" : "have", " no data: ", failures);
  if (!result.manifest_uri.empty()) StrAppend(&out, "; every target in ", result.manifest_uri);
  return Cut(std::move(out), 4096);
}

std::string SkippedEvent(const std::vector<std::string>& skipped) {
  if (skipped.empty()) return "";
  return Cut(StrCat(skipped.size(), " matching pod(s) left out: ", JoinNames(skipped, 10)), 4096);
}

std::string FinalMessage(const coordinator::RunResult& result) {
  if (PhaseFor(result) == api::JobPhase::kSucceeded) {
    return StrCat("all ", result.targets.size(), " target(s) captured; max start skew ",
                  api::FormatDuration(result.max_start_skew_ns));
  }
  return Cut(StrCat(result.succeeded, " of ", result.targets.size(), " target(s) captured; ",
                    GroupedFailures(result)),
             4096);
}

api::JobAnalysis AnalysisFor(const coordinator::RunResult& result, const TargetResolution& plan) {
  const analysis::Analysis& a = result.report->analysis;
  api::JobAnalysis out;
  out.first_step = a.first_step;
  out.last_step = a.last_step;
  out.steps = a.steps;
  out.compared_steps = a.compared_steps;
  std::unordered_map<std::string, std::string> nodes;
  for (const ResolvedTarget& target : plan.targets) nodes[target.name] = target.node;
  // Which hosts are listed: all when they fit; else the stragglers, then the hosts whose late
  // steps cost the others most.
  std::vector<const analysis::HostVerdict*> listed;
  for (const analysis::HostVerdict& verdict : a.hosts) listed.push_back(&verdict);
  if (listed.size() > api::kMaxListedHosts) {
    std::stable_sort(listed.begin(), listed.end(),
                     [](const analysis::HostVerdict* x, const analysis::HostVerdict* y) {
                       if (x->straggler != y->straggler) return x->straggler;
                       return x->others_wait_ns > y->others_wait_ns;
                     });
    out.hosts_not_listed = static_cast<int32_t>(listed.size() - api::kMaxListedHosts);
    listed.resize(api::kMaxListedHosts);
  }
  std::vector<std::string> stragglers;
  for (const analysis::HostVerdict& verdict : a.hosts) {
    if (verdict.straggler) stragglers.push_back(verdict.host);
  }
  for (const analysis::HostVerdict* listed_verdict : listed) {
    const analysis::HostVerdict& verdict = *listed_verdict;
    api::HostAnalysis host;
    host.host = verdict.host;
    if (auto it = nodes.find(verdict.host); it != nodes.end()) host.node = it->second;
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
      host.evidence = Cut(verdict.evidence, api::kMaxTargetMessageBytes);
    }
    out.hosts.push_back(std::move(host));
  }
  // A column stays narrow: a few names, then how many more.
  out.stragglers = stragglers.empty() ? "none" : JoinNames(stragglers, 3);
  // Lists of hosts stay short too (the report has them all).
  for (size_t i = 0; i < a.left_out.size() && i < api::kMaxListedHosts; ++i) {
    out.left_out.push_back(Cut(a.left_out[i], api::kMaxTargetMessageBytes));
  }
  if (a.left_out.size() > api::kMaxListedHosts) {
    out.left_out.push_back(
        StrCat("and ", a.left_out.size() - api::kMaxListedHosts, " more host(s) left out"));
  }
  for (size_t i = 0; i < a.notes.size() && i < api::kMaxListedHosts; ++i) {
    out.notes.push_back(Cut(a.notes[i], api::kMaxTargetMessageBytes));
  }
  out.report_uri = result.report_html_uri;
  out.report_json_uri = result.report_json_uri;
  return out;
}

std::vector<std::string> StragglerMessages(const api::JobAnalysis& analysis) {
  std::vector<std::string> messages;
  size_t stragglers = 0;
  for (const api::HostAnalysis& host : analysis.hosts) stragglers += host.straggler ? 1 : 0;
  for (const api::HostAnalysis& host : analysis.hosts) {
    if (!host.straggler) continue;
    if (messages.size() == kMaxStragglerEvents) {
      // The rest in one: the printer column and the report name them.
      messages.push_back(StrCat(
          stragglers - kMaxStragglerEvents, " more straggler(s) hold the job back",
          analysis.report_uri.empty() ? "" : StrCat("; every host in ", analysis.report_uri)));
      break;
    }
    messages.push_back(StrCat("pod ", host.host,
                              host.node.empty() ? "" : StrCat(" on node ", host.node),
                              " holds the job back (", host.cause, "): ", host.evidence));
  }
  return messages;
}

absl::Status FinalStatus(api::ProfileJobStatus& status, const std::string& run,
                         const coordinator::RunResult& result, const TargetResolution& plan,
                         int64_t now_ns) {
  CLUSTERPROF_RETURN_IF_ERROR(CheckStillOurs(status, run));
  const api::JobPhase phase = PhaseFor(result);
  std::string message = FinalMessage(result);
  if (result.stopped_ns > 0) {
    // Cancelled (annotation clusterprof.io/cancel) while it ran: what was recorded until then.
    const int64_t into_ms = std::max<int64_t>(0, result.stopped_ns - result.t0_ns) / kNanosPerMilli;
    message = StrCat("stopped early on request (", api::kCancelAnnotation, "), ",
                     result.stopped_ns < result.t0_ns ? "before its start"
                                                      : StrCat(into_ms, " ms into the window"),
                     ": ", message);
  }
  status.targets = ListedTargets(result, plan, &status.targets_not_listed);
  if (status.targets_not_listed > 0 && !result.manifest_uri.empty()) {
    StrAppend(&message, "; every target in ", result.manifest_uri);
  }
  status.phase = phase;
  status.message = message;
  status.completion_time = api::FormatTime(now_ns);
  status.attempt = std::max(status.attempt, result.attempt);
  status.manifest_uri = result.manifest_uri;
  status.summary = SummaryFor(result, plan);
  status.analysis.reset();
  if (result.report != nullptr) status.analysis = AnalysisFor(result, plan);
  if (phase == api::JobPhase::kFailed) {
    api::SetCondition(status.conditions,
                      {std::string(kFailed), "True",
                       result.stopped_ns > 0 ? "Cancelled" : "NoTraceData", message, 0, ""},
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
