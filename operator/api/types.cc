#include "operator/api/types.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "absl/time/time.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/storage/logdir.h"
#include "operator/api/fields.h"

namespace clusterprof::api {
namespace {

using api_internal::Fields;
using api_internal::Range;
using web::json::value;

value Str(std::string_view s) { return value::string(std::string(s)); }

}  // namespace

kube::ResourceType ProfileJobs() {
  return {std::string(kGroup), "v1alpha1", "profilejobs", "ProfileJob", true};
}
kube::ResourceType ProfileSchedules() {
  return {std::string(kGroup), "v1alpha1", "profileschedules", "ProfileSchedule", true};
}

kube::ObjectReference ReferenceTo(std::string_view kind, std::string_view ns, std::string_view name,
                                  std::string_view uid) {
  kube::ObjectReference ref;
  ref.api_version = std::string(kApiVersion);
  ref.kind = std::string(kind);
  ref.namespace_ = std::string(ns);
  ref.name = std::string(name);
  ref.uid = std::string(uid);
  return ref;
}

namespace {

using api_internal::IntField;
using api_internal::IntRef;
using api_internal::ReadInts;

constexpr IntField<ProfileJobSpec> kTargetInts[] = {
    {"port", [](auto& o) -> IntRef { return &o.port; }, 1, 65535, {}, /*zero_is_unset=*/true},
    {"minReady", [](auto& o) -> IntRef { return &o.min_ready; }, 0,
     std::numeric_limits<int32_t>::max()},
    {"waitSeconds", [](auto& o) -> IntRef { return &o.wait_seconds; }, 0, kMaxWaitSeconds,
     "seconds"},
    {"maxTargets", [](auto& o) -> IntRef { return &o.max_targets; }, 1, kMaxMaxTargets, "targets"},
};

constexpr IntField<ProfileJobSpec> kTimingInts[] = {
    {"durationMs", [](auto& o) -> IntRef { return &o.duration_ms; }, 1, kMaxDurationMs,
     "milliseconds"},
    {"delayMs", [](auto& o) -> IntRef { return &o.delay_ms; }, 0, kMaxDelayMs, "milliseconds"},
    {"lookbackMs", [](auto& o) -> IntRef { return &o.lookback_ms; }, 0, kMaxLookbackMs,
     "milliseconds"},
};

constexpr IntField<ProfileJobSpec> kRetryInts[] = {
    {"tracingAttempts", [](auto& o) -> IntRef { return &o.tracing_attempts; }, 1,
     kMaxTracingAttempts},
    {"queueTimeoutSeconds", [](auto& o) -> IntRef { return &o.queue_timeout_seconds; }, 0,
     kMaxQueueTimeoutSeconds, "seconds"},
};

struct TracerLevels {
  uint32_t host;
  uint32_t device;
  uint32_t python;
};

constexpr IntField<TracerLevels> kLevelInts[] = {
    {"hostTracerLevel", [](auto& o) -> IntRef { return &o.host; }, 0, 3},
    {"deviceTracerLevel", [](auto& o) -> IntRef { return &o.device; }, 0, 2},
    {"pythonTracerLevel", [](auto& o) -> IntRef { return &o.python; }, 0, 1},
};

// spec.targets.addresses: host:port strings, at most kMaxAddresses.
absl::Status ReadAddresses(const value& addresses, const std::string& path, ProfileJobSpec& out) {
  if (!addresses.is_array()) {
    return absl::InvalidArgumentError(StrCat(path, ": must be a list of host:port strings"));
  }
  int index = 0;
  for (const value& address : addresses.as_array()) {
    if (!address.is_string() || !IsHostPort(address.as_string())) {
      return absl::InvalidArgumentError(
          StrCat(path, "[", index, "]: must be host:port with a port from 1 to 65535, got ",
                 address.serialize()));
    }
    ++index;
    out.addresses.push_back(address.as_string());
  }
  if (out.addresses.size() > kMaxAddresses) {
    return absl::InvalidArgumentError(
        StrCat(path, ": at most ", kMaxAddresses, " addresses, got ", out.addresses.size()));
  }
  return absl::OkStatus();
}

// spec.targets: a selector, addresses, or both, and how many of them to wait for.
absl::Status ReadTargets(const Fields& spec, ProfileJobSpec& out) {
  if (const value* targets_json = spec.Find("targets")) {
    CLUSTERPROF_ASSIGN_OR_RETURN(Fields targets, Fields::Of(*targets_json, spec.Path("targets")));
    if (const value* selector = targets.Find("selector")) {
      absl::StatusOr<kube::LabelSelector> parsed = kube::LabelSelector::FromJson(*selector);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(
            StrCat(targets.Path("selector"), ": ", parsed.status().message()));
      }
      out.selector = *std::move(parsed);
    }
    if (const value* addresses = targets.Find("addresses")) {
      CLUSTERPROF_RETURN_IF_ERROR(ReadAddresses(*addresses, targets.Path("addresses"), out));
    }
    CLUSTERPROF_RETURN_IF_ERROR(ReadInts(targets, kTargetInts, out));
    if (out.min_ready > out.max_targets) {
      return absl::InvalidArgumentError(StrCat(targets.Path("minReady"), ": ", out.min_ready,
                                               " is more than targets.maxTargets (",
                                               out.max_targets, ")"));
    }
  }
  if (!out.selector.has_value() && out.addresses.empty()) {
    return absl::InvalidArgumentError(
        StrCat(spec.Path("targets"),
               ": needs a selector (targets.selector.matchLabels) or at least one address "
               "(targets.addresses)"));
  }
  return absl::OkStatus();
}

// spec.logdir and spec.runName: where the run goes.
absl::Status ReadRunPlace(const Fields& spec, ProfileJobSpec& out) {
  std::string logdir_text;
  CLUSTERPROF_RETURN_IF_ERROR(spec.String("logdir", &logdir_text));
  if (logdir_text.empty()) {
    return absl::InvalidArgumentError(
        StrCat(spec.Path("logdir"),
               ": required: gs://bucket/prefix or an absolute path such as /data/tensorboard"));
  }
  absl::StatusOr<storage::Logdir> logdir = storage::ParseAbsoluteLogdir(logdir_text);
  if (!logdir.ok()) {
    return absl::InvalidArgumentError(StrCat(spec.Path("logdir"), ": ", logdir.status().message()));
  }
  out.logdir = *std::move(logdir);

  CLUSTERPROF_RETURN_IF_ERROR(spec.String("runName", &out.run_name));
  if (out.run_name.empty()) return absl::OkStatus();
  if (absl::Status valid = storage::ValidatePathComponent("run name", out.run_name); !valid.ok()) {
    return absl::InvalidArgumentError(StrCat(spec.Path("runName"), ": ", valid.message()));
  }
  if (out.run_name.size() > 128) {
    return absl::InvalidArgumentError(StrCat(spec.Path("runName"), ": at most 128 characters"));
  }
  return absl::OkStatus();
}

// spec.options: the tracer levels and ProfileOptions.advanced_configuration.
absl::Status ReadProfileOptions(const Fields& spec, tensorflow::ProfileOptions& profile) {
  const value* options_json = spec.Find("options");
  if (options_json == nullptr) return absl::OkStatus();
  CLUSTERPROF_ASSIGN_OR_RETURN(Fields options, Fields::Of(*options_json, spec.Path("options")));
  TracerLevels levels{profile.host_tracer_level(), profile.device_tracer_level(),
                      profile.python_tracer_level()};
  CLUSTERPROF_RETURN_IF_ERROR(ReadInts(options, kLevelInts, levels));
  profile.set_host_tracer_level(levels.host);
  profile.set_device_tracer_level(levels.device);
  profile.set_python_tracer_level(levels.python);
  const value* advanced = options.Find("advancedConfiguration");
  if (advanced == nullptr) return absl::OkStatus();
  const std::string path = options.Path("advancedConfiguration");
  if (!advanced->is_object()) {
    return absl::InvalidArgumentError(StrCat(path, ": must be a map of option names to values"));
  }
  if (advanced->as_object().size() > 64) {
    return absl::InvalidArgumentError(
        StrCat(path, ": at most 64 options, got ", advanced->as_object().size()));
  }
  for (const auto& [key, v] : advanced->as_object()) {
    tensorflow::ProfileOptions::AdvancedConfigValue& entry =
        (*profile.mutable_advanced_configuration())[key];
    if (v.is_string()) {
      entry.set_string_value(v.as_string());
    } else if (v.is_boolean()) {
      entry.set_bool_value(v.as_bool());
    } else if (v.is_number() && v.as_number().is_int64()) {
      entry.set_int64_value(v.as_number().to_int64());
    } else {
      return absl::InvalidArgumentError(StrCat(
          path, ".", key, ": must be a string, a boolean or an integer, got ", v.serialize()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ProfileJobSpec> ParseProfileJobSpec(const value& spec_json, std::string_view where) {
  if (spec_json.is_null()) {
    return absl::InvalidArgumentError(StrCat(where, ": missing; a ProfileJob needs a spec"));
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(Fields spec, Fields::Of(spec_json, std::string(where)));
  ProfileJobSpec out;
  CLUSTERPROF_RETURN_IF_ERROR(ReadTargets(spec, out));
  CLUSTERPROF_RETURN_IF_ERROR(ReadInts(spec, kTimingInts, out));
  CLUSTERPROF_RETURN_IF_ERROR(ReadRunPlace(spec, out));
  CLUSTERPROF_RETURN_IF_ERROR(ReadInts(spec, kRetryInts, out));
  CLUSTERPROF_RETURN_IF_ERROR(ReadProfileOptions(spec, out.profile_options));
  if (out.lookback_ms > 0) {
    (*out.profile_options.mutable_advanced_configuration())[proto::kLookbackMsKey].set_int64_value(
        out.lookback_ms);
  }
  CLUSTERPROF_RETURN_IF_ERROR(
      spec.OptionalInt("ttlSecondsAfterFinished", &out.ttl_seconds_after_finished));
  if (out.ttl_seconds_after_finished.has_value()) {
    CLUSTERPROF_RETURN_IF_ERROR(Range(spec.Path("ttlSecondsAfterFinished"),
                                      *out.ttl_seconds_after_finished, 0,
                                      std::numeric_limits<int32_t>::max(), "seconds"));
  }
  return out;
}

std::string_view JobPhaseName(JobPhase phase) {
  switch (phase) {
    case JobPhase::kPending:
      return "Pending";
    case JobPhase::kScheduled:
      return "Scheduled";
    case JobPhase::kCapturing:
      return "Capturing";
    case JobPhase::kSucceeded:
      return "Succeeded";
    case JobPhase::kPartiallySucceeded:
      return "PartiallySucceeded";
    case JobPhase::kFailed:
      return "Failed";
  }
  return "Pending";
}

JobPhase ParseJobPhase(std::string_view name) {
  for (JobPhase phase : {JobPhase::kScheduled, JobPhase::kCapturing, JobPhase::kSucceeded,
                         JobPhase::kPartiallySucceeded, JobPhase::kFailed}) {
    if (name == JobPhaseName(phase)) return phase;
  }
  return JobPhase::kPending;
}

bool IsTerminal(JobPhase phase) {
  return phase == JobPhase::kSucceeded || phase == JobPhase::kPartiallySucceeded ||
         phase == JobPhase::kFailed;
}

void SetCondition(std::vector<Condition>& conditions, Condition condition,
                  std::string_view now_rfc3339) {
  for (Condition& existing : conditions) {
    if (existing.type != condition.type) continue;
    condition.last_transition_time = existing.status == condition.status
                                         ? existing.last_transition_time
                                         : std::string(now_rfc3339);
    existing = std::move(condition);
    return;
  }
  condition.last_transition_time = std::string(now_rfc3339);
  conditions.push_back(std::move(condition));
}

const Condition* FindCondition(const std::vector<Condition>& conditions, std::string_view type) {
  for (const Condition& condition : conditions) {
    if (condition.type == type) return &condition;
  }
  return nullptr;
}

absl::StatusOr<std::vector<Condition>> ParseConditions(const value& list, std::string_view where) {
  if (!list.is_array()) return absl::InvalidArgumentError(StrCat(where, ": must be a list"));
  std::vector<Condition> out;
  for (const value& item : list.as_array()) {
    CLUSTERPROF_ASSIGN_OR_RETURN(Fields c, Fields::Of(item, StrCat(where, "[]")));
    Condition condition;
    CLUSTERPROF_RETURN_IF_ERROR(c.String("type", &condition.type));
    CLUSTERPROF_RETURN_IF_ERROR(c.String("status", &condition.status));
    CLUSTERPROF_RETURN_IF_ERROR(c.String("reason", &condition.reason));
    CLUSTERPROF_RETURN_IF_ERROR(c.String("message", &condition.message));
    CLUSTERPROF_RETURN_IF_ERROR(c.Int("observedGeneration", &condition.observed_generation));
    CLUSTERPROF_RETURN_IF_ERROR(c.String("lastTransitionTime", &condition.last_transition_time));
    out.push_back(std::move(condition));
  }
  return out;
}

value ConditionsToJson(const std::vector<Condition>& conditions) {
  value out = value::array();
  size_t i = 0;
  for (const Condition& condition : conditions) {
    value c = value::object();
    c["type"] = Str(condition.type);
    c["status"] = Str(condition.status);
    // The CRD (metav1.Condition) requires both; never send "" (some servers take it for null).
    const std::string reason = condition.reason.empty() ? "Unknown" : condition.reason;
    c["reason"] = Str(reason);
    c["message"] = Str(condition.message.empty() ? reason : condition.message);
    c["observedGeneration"] = value::number(condition.observed_generation);
    c["lastTransitionTime"] = Str(condition.last_transition_time);
    out[i++] = std::move(c);
  }
  return out;
}

namespace {

absl::StatusOr<JobAnalysis> ParseJobAnalysis(const value& json) {
  CLUSTERPROF_ASSIGN_OR_RETURN(Fields a, Fields::Of(json, "status.analysis"));
  JobAnalysis out;
  CLUSTERPROF_RETURN_IF_ERROR(a.Int("firstStep", &out.first_step));
  CLUSTERPROF_RETURN_IF_ERROR(a.Int("lastStep", &out.last_step));
  CLUSTERPROF_RETURN_IF_ERROR(a.Int("steps", &out.steps));
  CLUSTERPROF_RETURN_IF_ERROR(a.Int("comparedSteps", &out.compared_steps));
  CLUSTERPROF_RETURN_IF_ERROR(a.String("stragglers", &out.stragglers));
  CLUSTERPROF_RETURN_IF_ERROR(a.StringList("leftOut", &out.left_out));
  CLUSTERPROF_RETURN_IF_ERROR(a.StringList("notes", &out.notes));
  CLUSTERPROF_RETURN_IF_ERROR(a.String("reportURI", &out.report_uri));
  CLUSTERPROF_RETURN_IF_ERROR(a.String("reportJSONURI", &out.report_json_uri));
  CLUSTERPROF_RETURN_IF_ERROR(a.Int("hostsNotListed", &out.hosts_not_listed));
  if (const value* hosts = a.Find("hosts")) {
    if (!hosts->is_array()) {
      return absl::InvalidArgumentError("status.analysis.hosts: must be a list");
    }
    for (const value& item : hosts->as_array()) {
      CLUSTERPROF_ASSIGN_OR_RETURN(Fields h, Fields::Of(item, "status.analysis.hosts[]"));
      HostAnalysis host;
      CLUSTERPROF_RETURN_IF_ERROR(h.String("host", &host.host));
      CLUSTERPROF_RETURN_IF_ERROR(h.String("node", &host.node));
      CLUSTERPROF_RETURN_IF_ERROR(h.Int("steps", &host.steps));
      CLUSTERPROF_RETURN_IF_ERROR(h.Int("stepP50Ns", &host.step_p50_ns));
      CLUSTERPROF_RETURN_IF_ERROR(h.Int("stepP90Ns", &host.step_p90_ns));
      CLUSTERPROF_RETURN_IF_ERROR(h.Int("stepMaxNs", &host.step_max_ns));
      CLUSTERPROF_RETURN_IF_ERROR(h.Bool("straggler", &host.straggler));
      CLUSTERPROF_RETURN_IF_ERROR(h.Int("lateSteps", &host.late_steps));
      CLUSTERPROF_RETURN_IF_ERROR(h.Int("medianLatenessNs", &host.median_lateness_ns));
      CLUSTERPROF_RETURN_IF_ERROR(h.Int("othersWaitNs", &host.others_wait_ns));
      CLUSTERPROF_RETURN_IF_ERROR(h.String("cause", &host.cause));
      CLUSTERPROF_RETURN_IF_ERROR(h.String("evidence", &host.evidence));
      out.hosts.push_back(std::move(host));
    }
  }
  return out;
}

value StringsToJson(const std::vector<std::string>& strings) {
  value out = value::array();
  for (size_t i = 0; i < strings.size(); ++i) out[i] = Str(strings[i]);
  return out;
}

value JobAnalysisToJson(const JobAnalysis& analysis) {
  value a = value::object();
  a["firstStep"] = value::number(analysis.first_step);
  a["lastStep"] = value::number(analysis.last_step);
  a["steps"] = value::number(analysis.steps);
  a["comparedSteps"] = value::number(analysis.compared_steps);
  a["stragglers"] = Str(analysis.stragglers);
  value hosts = value::array();
  size_t i = 0;
  for (const HostAnalysis& host : analysis.hosts) {
    value h = value::object();
    h["host"] = Str(host.host);
    if (!host.node.empty()) h["node"] = Str(host.node);
    h["steps"] = value::number(host.steps);
    h["stepP50Ns"] = value::number(host.step_p50_ns);
    h["stepP90Ns"] = value::number(host.step_p90_ns);
    h["stepMaxNs"] = value::number(host.step_max_ns);
    h["stepP50"] = Str(FormatDuration(host.step_p50_ns));
    h["straggler"] = value::boolean(host.straggler);
    h["lateSteps"] = value::number(host.late_steps);
    h["medianLatenessNs"] = value::number(host.median_lateness_ns);
    h["othersWaitNs"] = value::number(host.others_wait_ns);
    if (!host.cause.empty()) h["cause"] = Str(host.cause);
    if (!host.evidence.empty()) h["evidence"] = Str(host.evidence);
    hosts[i++] = std::move(h);
  }
  a["hosts"] = std::move(hosts);
  if (analysis.hosts_not_listed > 0) a["hostsNotListed"] = value::number(analysis.hosts_not_listed);
  if (!analysis.left_out.empty()) a["leftOut"] = StringsToJson(analysis.left_out);
  if (!analysis.notes.empty()) a["notes"] = StringsToJson(analysis.notes);
  if (!analysis.report_uri.empty()) a["reportURI"] = Str(analysis.report_uri);
  if (!analysis.report_json_uri.empty()) a["reportJSONURI"] = Str(analysis.report_json_uri);
  return a;
}

}  // namespace

absl::StatusOr<ProfileJobStatus> ParseProfileJobStatus(const value& status_json) {
  ProfileJobStatus out;
  if (status_json.is_null()) return out;
  CLUSTERPROF_ASSIGN_OR_RETURN(Fields status, Fields::Of(status_json, "status"));
  std::string phase;
  CLUSTERPROF_RETURN_IF_ERROR(status.String("phase", &phase));
  out.phase = ParseJobPhase(phase);
  CLUSTERPROF_RETURN_IF_ERROR(status.String("message", &out.message));
  CLUSTERPROF_RETURN_IF_ERROR(status.String("runName", &out.run_name));
  CLUSTERPROF_RETURN_IF_ERROR(status.String("runURI", &out.run_uri));
  CLUSTERPROF_RETURN_IF_ERROR(status.String("manifestURI", &out.manifest_uri));
  CLUSTERPROF_RETURN_IF_ERROR(status.String("startTime", &out.start_time));
  CLUSTERPROF_RETURN_IF_ERROR(status.Int("startTimeNs", &out.start_time_ns));
  CLUSTERPROF_RETURN_IF_ERROR(status.String("completionTime", &out.completion_time));
  CLUSTERPROF_RETURN_IF_ERROR(status.Int("attempt", &out.attempt));
  CLUSTERPROF_RETURN_IF_ERROR(status.Int("observedGeneration", &out.observed_generation));
  if (const value* conditions = status.Find("conditions")) {
    CLUSTERPROF_ASSIGN_OR_RETURN(out.conditions, ParseConditions(*conditions, "status.conditions"));
  }
  if (const value* targets = status.Find("targets")) {
    if (!targets->is_array()) return absl::InvalidArgumentError("status.targets: must be a list");
    for (const value& item : targets->as_array()) {
      CLUSTERPROF_ASSIGN_OR_RETURN(Fields t, Fields::Of(item, "status.targets[]"));
      TargetStatus target;
      CLUSTERPROF_RETURN_IF_ERROR(t.String("name", &target.name));
      CLUSTERPROF_RETURN_IF_ERROR(t.String("address", &target.address));
      CLUSTERPROF_RETURN_IF_ERROR(t.String("node", &target.node));
      CLUSTERPROF_RETURN_IF_ERROR(t.String("phase", &target.phase));
      CLUSTERPROF_RETURN_IF_ERROR(t.Int("attempts", &target.attempts));
      CLUSTERPROF_RETURN_IF_ERROR(t.Int("events", &target.events));
      CLUSTERPROF_RETURN_IF_ERROR(t.Int("droppedEvents", &target.dropped_events));
      CLUSTERPROF_RETURN_IF_ERROR(t.Int("lookbackMs", &target.lookback_ms));
      CLUSTERPROF_RETURN_IF_ERROR(t.Int("bytes", &target.bytes));
      CLUSTERPROF_RETURN_IF_ERROR(t.String("file", &target.file));
      CLUSTERPROF_RETURN_IF_ERROR(t.Int("clockOffsetNs", &target.clock_offset_ns));
      CLUSTERPROF_RETURN_IF_ERROR(t.Int("clockUncertaintyNs", &target.clock_uncertainty_ns));
      CLUSTERPROF_RETURN_IF_ERROR(t.Int("startErrorNs", &target.start_error_ns));
      CLUSTERPROF_RETURN_IF_ERROR(t.String("message", &target.message));
      out.targets.push_back(std::move(target));
    }
  }
  CLUSTERPROF_RETURN_IF_ERROR(status.Int("targetsNotListed", &out.targets_not_listed));
  if (const value* summary_json = status.Find("summary")) {
    CLUSTERPROF_ASSIGN_OR_RETURN(Fields s, Fields::Of(*summary_json, "status.summary"));
    JobSummary summary;
    CLUSTERPROF_RETURN_IF_ERROR(s.Int("targets", &summary.targets));
    CLUSTERPROF_RETURN_IF_ERROR(s.Int("succeeded", &summary.succeeded));
    CLUSTERPROF_RETURN_IF_ERROR(s.Int("empty", &summary.empty));
    CLUSTERPROF_RETURN_IF_ERROR(s.Int("failed", &summary.failed));
    CLUSTERPROF_RETURN_IF_ERROR(s.Int("skipped", &summary.skipped));
    CLUSTERPROF_RETURN_IF_ERROR(s.Int("maxStartSkewNs", &summary.max_start_skew_ns));
    CLUSTERPROF_RETURN_IF_ERROR(s.Int("startErrorP50Ns", &summary.start_error_p50_ns));
    CLUSTERPROF_RETURN_IF_ERROR(s.Int("startErrorP99Ns", &summary.start_error_p99_ns));
    if (const value* slowest = s.Find("slowestStarts")) {
      if (!slowest->is_array()) {
        return absl::InvalidArgumentError("status.summary.slowestStarts: must be a list");
      }
      for (const value& item : slowest->as_array()) {
        CLUSTERPROF_ASSIGN_OR_RETURN(Fields t, Fields::Of(item, "status.summary.slowestStarts[]"));
        TargetStart start;
        CLUSTERPROF_RETURN_IF_ERROR(t.String("name", &start.name));
        CLUSTERPROF_RETURN_IF_ERROR(t.Int("startErrorNs", &start.start_error_ns));
        summary.slowest_starts.push_back(std::move(start));
      }
    }
    out.summary = summary;
  }
  if (const value* analysis = status.Find("analysis")) {
    CLUSTERPROF_ASSIGN_OR_RETURN(out.analysis, ParseJobAnalysis(*analysis));
  }
  return out;
}

value ProfileJobStatusToJson(const ProfileJobStatus& status) {
  value out = value::object();
  out["phase"] = Str(JobPhaseName(status.phase));
  if (!status.message.empty()) out["message"] = Str(status.message);
  if (!status.run_name.empty()) out["runName"] = Str(status.run_name);
  if (!status.run_uri.empty()) out["runURI"] = Str(status.run_uri);
  if (!status.manifest_uri.empty()) out["manifestURI"] = Str(status.manifest_uri);
  if (!status.start_time.empty()) out["startTime"] = Str(status.start_time);
  if (status.start_time_ns != 0) out["startTimeNs"] = value::number(status.start_time_ns);
  if (!status.completion_time.empty()) out["completionTime"] = Str(status.completion_time);
  out["attempt"] = value::number(status.attempt);
  out["observedGeneration"] = value::number(status.observed_generation);
  if (!status.conditions.empty()) out["conditions"] = ConditionsToJson(status.conditions);
  if (!status.targets.empty()) {
    value targets = value::array();
    size_t i = 0;
    for (const TargetStatus& target : status.targets) {
      value t = value::object();
      if (!target.name.empty()) t["name"] = Str(target.name);
      if (!target.address.empty()) t["address"] = Str(target.address);
      if (!target.node.empty()) t["node"] = Str(target.node);
      t["phase"] = Str(target.phase);
      t["attempts"] = value::number(target.attempts);
      t["events"] = value::number(target.events);
      t["droppedEvents"] = value::number(target.dropped_events);
      if (target.lookback_ms > 0) t["lookbackMs"] = value::number(target.lookback_ms);
      t["bytes"] = value::number(target.bytes);
      if (!target.file.empty()) t["file"] = Str(target.file);
      t["clockOffsetNs"] = value::number(target.clock_offset_ns);
      // Absent: unknown (a server that is not a clusterprof sidecar cannot be probed).
      if (target.clock_uncertainty_ns >= 0) {
        t["clockUncertaintyNs"] = value::number(target.clock_uncertainty_ns);
      }
      t["startErrorNs"] = value::number(target.start_error_ns);
      if (!target.message.empty()) t["message"] = Str(target.message);
      targets[i++] = std::move(t);
    }
    out["targets"] = std::move(targets);
  }
  if (status.targets_not_listed > 0) {
    out["targetsNotListed"] = value::number(status.targets_not_listed);
  }
  if (status.summary.has_value()) {
    const JobSummary& summary = *status.summary;
    value s = value::object();
    s["targets"] = value::number(summary.targets);
    s["succeeded"] = value::number(summary.succeeded);
    s["empty"] = value::number(summary.empty);
    s["failed"] = value::number(summary.failed);
    if (summary.skipped > 0) s["skipped"] = value::number(summary.skipped);
    s["maxStartSkewNs"] = value::number(summary.max_start_skew_ns);
    s["maxStartSkew"] = Str(FormatDuration(summary.max_start_skew_ns));
    if (summary.start_error_p99_ns > 0) {
      s["startErrorP50Ns"] = value::number(summary.start_error_p50_ns);
      s["startErrorP99Ns"] = value::number(summary.start_error_p99_ns);
      s["startErrorP99"] = Str(FormatDuration(summary.start_error_p99_ns));
    }
    if (!summary.slowest_starts.empty()) {
      value slowest = value::array();
      size_t k = 0;
      for (const TargetStart& start : summary.slowest_starts) {
        value t = value::object();
        t["name"] = Str(start.name);
        t["startErrorNs"] = value::number(start.start_error_ns);
        t["startError"] = Str(FormatDuration(start.start_error_ns));
        slowest[k++] = std::move(t);
      }
      s["slowestStarts"] = std::move(slowest);
    }
    out["summary"] = std::move(s);
    out["targetsSucceeded"] = Str(StrCat(summary.succeeded, "/", summary.targets));
  } else if (!status.targets.empty()) {
    out["targetsSucceeded"] = Str(StrCat(0, "/", status.targets.size()));
  }
  if (status.analysis.has_value()) out["analysis"] = JobAnalysisToJson(*status.analysis);
  return out;
}

std::string FormatDuration(int64_t ns) {
  // Unsigned: -ns overflows for INT64_MIN (a status read back from the API server may hold it).
  const uint64_t magnitude = ns < 0 ? 0 - static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
  const char* sign = ns < 0 ? "-" : "";
  char buffer[64];
  if (magnitude < 1000) {
    snprintf(buffer, sizeof(buffer), "%s%ldns", sign, static_cast<long>(magnitude));
  } else if (magnitude < 1'000'000) {
    snprintf(buffer, sizeof(buffer), "%s%.3gus", sign, magnitude / 1e3);
  } else if (magnitude < 1'000'000'000) {
    snprintf(buffer, sizeof(buffer), "%s%.3gms", sign, magnitude / 1e6);
  } else {
    snprintf(buffer, sizeof(buffer), "%s%.3gs", sign, magnitude / 1e9);
  }
  return buffer;
}

std::string FormatTime(int64_t wall_ns) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixNanos(wall_ns), absl::UTCTimeZone());
}

absl::StatusOr<int64_t> ParseTime(std::string_view rfc3339) {
  absl::Time time;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, AbslView(rfc3339), &time, &error)) {
    return absl::InvalidArgumentError(
        StrCat("\"", rfc3339, "\" is not an RFC 3339 time (", error, ")"));
  }
  return absl::ToUnixNanos(time);
}

absl::StatusOr<ProfileScheduleSpec> ParseProfileScheduleSpec(const value& spec_json) {
  if (spec_json.is_null()) {
    return absl::InvalidArgumentError("spec: missing; a ProfileSchedule needs a spec");
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(Fields spec, Fields::Of(spec_json, "spec"));
  ProfileScheduleSpec out;
  CLUSTERPROF_RETURN_IF_ERROR(spec.String("schedule", &out.schedule));
  if (StripAsciiWhitespace(out.schedule).empty()) {
    return absl::InvalidArgumentError(
        "spec.schedule: required: a cron expression such as \"*/30 * * * *\" or \"@hourly\"");
  }
  CLUSTERPROF_RETURN_IF_ERROR(spec.String("timeZone", &out.time_zone));
  std::string policy = "Forbid";
  CLUSTERPROF_RETURN_IF_ERROR(spec.String("concurrencyPolicy", &policy));
  if (policy == "Allow") {
    out.concurrency_policy = ConcurrencyPolicy::kAllow;
  } else if (policy == "Forbid") {
    out.concurrency_policy = ConcurrencyPolicy::kForbid;
  } else if (policy == "Replace") {
    out.concurrency_policy = ConcurrencyPolicy::kReplace;
  } else {
    return absl::InvalidArgumentError(
        StrCat("spec.concurrencyPolicy: must be Allow, Forbid or "
               "Replace, got \"",
               policy, "\""));
  }
  CLUSTERPROF_RETURN_IF_ERROR(
      spec.OptionalInt("startingDeadlineSeconds", &out.starting_deadline_seconds));
  if (out.starting_deadline_seconds.has_value() && *out.starting_deadline_seconds < 0) {
    return absl::InvalidArgumentError(
        StrCat("spec.startingDeadlineSeconds: must not be negative, got ",
               *out.starting_deadline_seconds));
  }
  CLUSTERPROF_RETURN_IF_ERROR(spec.Bool("suspend", &out.suspend));
  CLUSTERPROF_RETURN_IF_ERROR(
      spec.Int("successfulJobsHistoryLimit", &out.successful_jobs_history_limit));
  CLUSTERPROF_RETURN_IF_ERROR(Range("spec.successfulJobsHistoryLimit",
                                    out.successful_jobs_history_limit, 0,
                                    std::numeric_limits<int32_t>::max()));
  CLUSTERPROF_RETURN_IF_ERROR(spec.Int("failedJobsHistoryLimit", &out.failed_jobs_history_limit));
  CLUSTERPROF_RETURN_IF_ERROR(Range("spec.failedJobsHistoryLimit", out.failed_jobs_history_limit, 0,
                                    std::numeric_limits<int32_t>::max()));
  const value* template_json = spec.Find("jobTemplate");
  if (template_json == nullptr) {
    return absl::InvalidArgumentError(
        "spec.jobTemplate: required: the ProfileJob to create at each scheduled time");
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(Fields job_template, Fields::Of(*template_json, "spec.jobTemplate"));
  if (const value* metadata_json = job_template.Find("metadata")) {
    CLUSTERPROF_ASSIGN_OR_RETURN(Fields metadata,
                                 Fields::Of(*metadata_json, "spec.jobTemplate.metadata"));
    CLUSTERPROF_RETURN_IF_ERROR(metadata.StringMap("labels", &out.job_labels));
    CLUSTERPROF_RETURN_IF_ERROR(metadata.StringMap("annotations", &out.job_annotations));
  }
  const value* job_spec = job_template.Find("spec");
  CLUSTERPROF_RETURN_IF_ERROR(
      ParseProfileJobSpec(job_spec == nullptr ? value::null() : *job_spec, "spec.jobTemplate.spec")
          .status());
  out.job_spec = *job_spec;
  return out;
}

absl::StatusOr<std::vector<JobReference>> ParseJobReferences(const value* list,
                                                             std::string_view where) {
  std::vector<JobReference> jobs;
  if (list == nullptr) return jobs;
  if (!list->is_array()) return absl::InvalidArgumentError(StrCat(where, ": must be a list"));
  for (const value& item : list->as_array()) {
    CLUSTERPROF_ASSIGN_OR_RETURN(Fields ref, Fields::Of(item, StrCat(where, "[]")));
    JobReference job;
    CLUSTERPROF_RETURN_IF_ERROR(ref.String("name", &job.name));
    CLUSTERPROF_RETURN_IF_ERROR(ref.String("namespace", &job.namespace_));
    CLUSTERPROF_RETURN_IF_ERROR(ref.String("uid", &job.uid));
    jobs.push_back(std::move(job));
  }
  return jobs;
}

value JobReferenceToJson(const JobReference& job) {
  value ref = value::object();
  ref["name"] = Str(job.name);
  ref["namespace"] = Str(job.namespace_);
  ref["uid"] = Str(job.uid);
  return ref;
}

absl::StatusOr<ProfileScheduleStatus> ParseProfileScheduleStatus(const value& status_json) {
  ProfileScheduleStatus out;
  if (status_json.is_null()) return out;
  CLUSTERPROF_ASSIGN_OR_RETURN(Fields status, Fields::Of(status_json, "status"));
  CLUSTERPROF_ASSIGN_OR_RETURN(out.active,
                               ParseJobReferences(status.Find("active"), status.Path("active")));
  CLUSTERPROF_RETURN_IF_ERROR(status.String("lastScheduleTime", &out.last_schedule_time));
  CLUSTERPROF_RETURN_IF_ERROR(status.String("lastSuccessfulTime", &out.last_successful_time));
  CLUSTERPROF_RETURN_IF_ERROR(status.String("message", &out.message));
  CLUSTERPROF_RETURN_IF_ERROR(status.Int("observedGeneration", &out.observed_generation));
  if (const value* conditions = status.Find("conditions")) {
    CLUSTERPROF_ASSIGN_OR_RETURN(out.conditions, ParseConditions(*conditions, "status.conditions"));
  }
  return out;
}

value ProfileScheduleStatusToJson(const ProfileScheduleStatus& status) {
  value out = value::object();
  if (!status.active.empty()) {
    value active = value::array();
    size_t i = 0;
    for (const JobReference& job : status.active) {
      value ref = JobReferenceToJson(job);
      ref["apiVersion"] = Str(kApiVersion);
      ref["kind"] = Str("ProfileJob");
      active[i++] = std::move(ref);
    }
    out["active"] = std::move(active);
  }
  out["activeCount"] = value::number(static_cast<int32_t>(status.active.size()));
  if (!status.last_schedule_time.empty()) out["lastScheduleTime"] = Str(status.last_schedule_time);
  if (!status.last_successful_time.empty()) {
    out["lastSuccessfulTime"] = Str(status.last_successful_time);
  }
  if (!status.message.empty()) out["message"] = Str(status.message);
  out["observedGeneration"] = value::number(status.observed_generation);
  if (!status.conditions.empty()) out["conditions"] = ConditionsToJson(status.conditions);
  return out;
}

}  // namespace clusterprof::api
