#include "operator/api/trigger.h"

#include <cmath>

#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "operator/api/fields.h"

namespace clusterprof::api {
namespace {

using api_internal::Fields;
using api_internal::Range;
using web::json::value;

constexpr size_t kMaxRules = 10;
constexpr size_t kMaxRecentFirings = 10;
constexpr int64_t kMaxCooldownSeconds = 7 * 86'400;

value Str(std::string_view s) { return value::string(std::string(s)); }

absl::Status ParseRule(const value& item, std::string_view path, analysis::TriggerRules* rules,
                       std::vector<std::string>* summary) {
  CLUSTERPROF_ASSIGN_OR_RETURN(Fields rule, Fields::Of(item, std::string(path)));
  int kinds = 0;
  for (const auto& [key, v] : item.as_object()) {
    if (key != analysis::kStepTimeRegressionRuleName && key != analysis::kStragglerRuleName &&
        key != analysis::kStepStallRuleName) {
      return absl::InvalidArgumentError(StrCat(
          path, ".", key, ": not a rule; give one of stepTimeRegression, straggler, stepStall"));
    }
    ++kinds;
  }
  if (kinds != 1) {
    return absl::InvalidArgumentError(StrCat(
        path, ": give exactly one of stepTimeRegression, straggler, stepStall per rule, got ",
        kinds));
  }
  if (const value* regression = rule.Find(analysis::kStepTimeRegressionRuleName)) {
    if (rules->step_time_regression.has_value()) {
      return absl::InvalidArgumentError(StrCat(path, ": a second stepTimeRegression rule"));
    }
    CLUSTERPROF_ASSIGN_OR_RETURN(
        Fields fields, Fields::Of(*regression, rule.Path(analysis::kStepTimeRegressionRuleName)));
    analysis::StepTimeRegressionRule r;
    if (const value* percent = fields.Find("percent")) {
      if (!percent->is_number()) {
        return absl::InvalidArgumentError(
            StrCat(fields.Path("percent"), ": must be a number, got ", percent->serialize()));
      }
      r.percent = percent->as_double();
    }
    if (!(r.percent > 0) || r.percent > 10'000) {
      return absl::InvalidArgumentError(
          StrCat(fields.Path("percent"), ": must be above 0 and at most 10000, got ", r.percent));
    }
    int64_t steps = r.steps;
    CLUSTERPROF_RETURN_IF_ERROR(fields.Int("steps", &steps));
    CLUSTERPROF_RETURN_IF_ERROR(
        Range(fields.Path("steps"), steps, 1, analysis::kMaxTriggerSteps / 2, "steps"));
    r.steps = static_cast<int>(steps);
    rules->step_time_regression = r;
    summary->push_back(fmt::format("stepTimeRegression +{}%/{} steps", r.percent, r.steps));
  } else if (const value* straggler = rule.Find(analysis::kStragglerRuleName)) {
    if (rules->straggler.has_value()) {
      return absl::InvalidArgumentError(StrCat(path, ": a second straggler rule"));
    }
    CLUSTERPROF_ASSIGN_OR_RETURN(Fields fields,
                                 Fields::Of(*straggler, rule.Path(analysis::kStragglerRuleName)));
    analysis::StragglerTriggerRule r;
    int64_t steps = r.steps;
    CLUSTERPROF_RETURN_IF_ERROR(fields.Int("steps", &steps));
    CLUSTERPROF_RETURN_IF_ERROR(Range(fields.Path("steps"), steps, 14, 1000, "steps"));
    r.steps = static_cast<int>(steps);
    rules->straggler = r;
    summary->push_back(fmt::format("straggler {} steps", r.steps));
  } else if (const value* stall = rule.Find(analysis::kStepStallRuleName)) {
    if (rules->step_stall.has_value()) {
      return absl::InvalidArgumentError(StrCat(path, ": a second stepStall rule"));
    }
    CLUSTERPROF_ASSIGN_OR_RETURN(Fields fields,
                                 Fields::Of(*stall, rule.Path(analysis::kStepStallRuleName)));
    analysis::StepStallRule r;
    CLUSTERPROF_RETURN_IF_ERROR(fields.Int("seconds", &r.seconds));
    CLUSTERPROF_RETURN_IF_ERROR(Range(fields.Path("seconds"), r.seconds, 1, 86'400, "seconds"));
    rules->step_stall = r;
    summary->push_back(fmt::format("stepStall {}s", r.seconds));
  }
  return absl::OkStatus();
}

}  // namespace

kube::ResourceType ProfileTriggers() {
  return {std::string(kGroup), "v1alpha1", "profiletriggers", "ProfileTrigger", true};
}

namespace {

using api_internal::IntField;
using api_internal::IntRef;
using api_internal::ReadInts;

// How often a trigger may fire, and how many of its jobs are kept.
constexpr IntField<ProfileTriggerSpec> kTriggerInts[] = {
    {"cooldownSeconds", [](auto& o) -> IntRef { return &o.cooldown_seconds; }, 0,
     kMaxCooldownSeconds, "seconds"},
    {"maxCapturesPerDay", [](auto& o) -> IntRef { return &o.max_captures_per_day; }, 1, 1000},
    {"successfulJobsHistoryLimit",
     [](auto& o) -> IntRef { return &o.successful_jobs_history_limit; }, 0, 100},
    {"failedJobsHistoryLimit", [](auto& o) -> IntRef { return &o.failed_jobs_history_limit; }, 0,
     100},
};

}  // namespace

absl::StatusOr<ProfileTriggerSpec> ParseProfileTriggerSpec(const value& spec_json,
                                                           int64_t recorder_window_ms) {
  ProfileTriggerSpec out;
  CLUSTERPROF_ASSIGN_OR_RETURN(Fields spec, Fields::Of(spec_json, "spec"));

  // The targets, checked as a ProfileJob's (their errors name spec.targets).
  const value* targets = spec.Find("targets");
  if (targets == nullptr) {
    return absl::InvalidArgumentError(
        "spec.targets: required: the pods whose steps are watched (targets.selector.matchLabels)");
  }
  {
    value probe = value::object();
    probe["targets"] = *targets;
    probe["logdir"] = Str("/unused");
    CLUSTERPROF_RETURN_IF_ERROR(ParseProfileJobSpec(probe, "spec").status());
  }

  const value* rules = spec.Find("rules");
  if (rules == nullptr || !rules->is_array() || rules->as_array().size() == 0) {
    return absl::InvalidArgumentError(
        "spec.rules: required: at least one of stepTimeRegression, straggler, stepStall");
  }
  if (rules->as_array().size() > kMaxRules) {
    return absl::InvalidArgumentError(
        StrCat("spec.rules: at most ", kMaxRules, " rules, got ", rules->as_array().size()));
  }
  std::vector<std::string> summary;
  for (size_t i = 0; i < rules->as_array().size(); ++i) {
    CLUSTERPROF_RETURN_IF_ERROR(
        ParseRule(rules->as_array().at(i), StrCat("spec.rules[", i, "]"), &out.rules, &summary));
  }
  int64_t warmup = out.rules.warmup_steps;
  CLUSTERPROF_RETURN_IF_ERROR(spec.Int("warmupSteps", &warmup));
  CLUSTERPROF_RETURN_IF_ERROR(Range(spec.Path("warmupSteps"), warmup, 0, 1000, "steps"));
  out.rules.warmup_steps = static_cast<int>(warmup);
  if (absl::Status valid = analysis::ValidateTriggerRules(out.rules); !valid.ok()) {
    return absl::InvalidArgumentError(StrCat("spec.rules: ", valid.message()));
  }
  out.rules_summary = absl::StrJoin(summary, ", ");

  // The capture: a ProfileJob spec of its own, with the trigger's defaults.
  const value* capture_json = spec.Find("capture");
  if (capture_json == nullptr) {
    return absl::InvalidArgumentError(
        "spec.capture: required: at least capture.logdir (gs://bucket/prefix or an absolute "
        "path)");
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(Fields capture, Fields::Of(*capture_json, "spec.capture"));
  for (const auto& [key, v] : capture_json->as_object()) {
    if (key == "targets" || key == "runName" || key == "ttlSecondsAfterFinished") {
      return absl::InvalidArgumentError(
          StrCat("spec.capture.", key, ": not a capture field of a trigger (",
                 key == "targets" ? "the trigger's spec.targets are captured"
                                  : "each firing gets a run and a job of its own",
                 ")"));
    }
  }
  value job = *capture_json;
  job["targets"] = *targets;
  if (!job.has_field("durationMs")) job["durationMs"] = value::number(kDefaultTriggerDurationMs);
  if (!job.has_field("lookbackMs")) job["lookbackMs"] = value::number(kDefaultTriggerLookbackMs);
  // A firing captures as soon as the targets can be asked, and does not wait long for pods that
  // another job holds: by then the moment has passed.
  if (!job.has_field("delayMs")) job["delayMs"] = value::number(0);
  if (!job.has_field("queueTimeoutSeconds")) job["queueTimeoutSeconds"] = value::number(60);
  // Nor for pods still starting (spec.targets.waitSeconds): it captures the pods that are ready
  // at the instant it fires.
  job["targets"]["waitSeconds"] = value::number(0);
  CLUSTERPROF_ASSIGN_OR_RETURN(out.capture, ParseProfileJobSpec(job, "spec.capture"));
  if (recorder_window_ms >= 0 && out.capture.lookback_ms > recorder_window_ms) {
    return absl::InvalidArgumentError(
        StrCat("spec.capture.lookbackMs: ", out.capture.lookback_ms,
               " is longer than the sidecars' flight recorder keeps (", recorder_window_ms,
               " ms, the chart's sidecar.recorder.windowMs); ask for at most ", recorder_window_ms,
               " or raise the window"));
  }
  out.job_spec = job;

  CLUSTERPROF_RETURN_IF_ERROR(ReadInts(spec, kTriggerInts, out));
  CLUSTERPROF_RETURN_IF_ERROR(spec.Bool("suspend", &out.suspend));
  return out;
}

absl::StatusOr<ProfileTriggerStatus> ParseProfileTriggerStatus(const value& status_json) {
  ProfileTriggerStatus out;
  if (status_json.is_null()) return out;
  CLUSTERPROF_ASSIGN_OR_RETURN(Fields status, Fields::Of(status_json, "status"));
  CLUSTERPROF_RETURN_IF_ERROR(status.Int("observedGeneration", &out.observed_generation));
  if (const value* conditions = status.Find("conditions")) {
    CLUSTERPROF_ASSIGN_OR_RETURN(out.conditions,
                                 ParseConditions(*conditions, status.Path("conditions")));
  }
  CLUSTERPROF_RETURN_IF_ERROR(status.String("rules", &out.rules));
  CLUSTERPROF_RETURN_IF_ERROR(status.Int("pods", &out.pods));
  CLUSTERPROF_RETURN_IF_ERROR(status.Int("podsWithSteps", &out.pods_with_steps));
  CLUSTERPROF_RETURN_IF_ERROR(status.Int("lastStep", &out.last_step));
  CLUSTERPROF_RETURN_IF_ERROR(status.Int("stepTimeNs", &out.step_time_ns));
  CLUSTERPROF_RETURN_IF_ERROR(status.Int("baselineNs", &out.baseline_ns));
  CLUSTERPROF_RETURN_IF_ERROR(status.String("stepTime", &out.step_time));
  CLUSTERPROF_RETURN_IF_ERROR(status.String("baseline", &out.baseline));
  CLUSTERPROF_RETURN_IF_ERROR(status.String("lastFiredTime", &out.last_fired_time));
  CLUSTERPROF_RETURN_IF_ERROR(status.Int("lastFiredNs", &out.last_fired_ns));
  CLUSTERPROF_RETURN_IF_ERROR(status.String("lastJob", &out.last_job));
  CLUSTERPROF_RETURN_IF_ERROR(status.Bool("lastJobCreated", &out.last_job_created));
  CLUSTERPROF_RETURN_IF_ERROR(status.String("capturesDay", &out.captures_day));
  CLUSTERPROF_RETURN_IF_ERROR(status.Int("capturesToday", &out.captures_today));
  if (const value* firings = status.Find("recentFirings")) {
    if (!firings->is_array()) {
      return absl::InvalidArgumentError("status.recentFirings: must be a list");
    }
    for (size_t i = 0; i < firings->as_array().size(); ++i) {
      CLUSTERPROF_ASSIGN_OR_RETURN(
          Fields f, Fields::Of(firings->as_array().at(i), StrCat("status.recentFirings[", i, "]")));
      TriggerFiringStatus firing;
      CLUSTERPROF_RETURN_IF_ERROR(f.String("time", &firing.time));
      CLUSTERPROF_RETURN_IF_ERROR(f.Int("detectedNs", &firing.detected_ns));
      CLUSTERPROF_RETURN_IF_ERROR(f.String("rule", &firing.rule));
      CLUSTERPROF_RETURN_IF_ERROR(f.String("evidence", &firing.evidence));
      CLUSTERPROF_RETURN_IF_ERROR(f.StringList("pods", &firing.pods));
      CLUSTERPROF_RETURN_IF_ERROR(f.Int("firstStep", &firing.first_step));
      CLUSTERPROF_RETURN_IF_ERROR(f.Int("lastStep", &firing.last_step));
      CLUSTERPROF_RETURN_IF_ERROR(f.String("job", &firing.job));
      out.recent_firings.push_back(std::move(firing));
    }
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(out.active,
                               ParseJobReferences(status.Find("active"), status.Path("active")));
  return out;
}

value ProfileTriggerStatusToJson(const ProfileTriggerStatus& status) {
  value out = value::object();
  out["observedGeneration"] = value::number(status.observed_generation);
  if (!status.conditions.empty()) out["conditions"] = ConditionsToJson(status.conditions);
  if (!status.rules.empty()) out["rules"] = Str(status.rules);
  out["pods"] = value::number(status.pods);
  out["podsWithSteps"] = value::number(status.pods_with_steps);
  if (status.last_step >= 0) out["lastStep"] = value::number(status.last_step);
  if (status.step_time_ns > 0) {
    out["stepTimeNs"] = value::number(status.step_time_ns);
    out["stepTime"] = Str(status.step_time);
  }
  if (status.baseline_ns > 0) {
    out["baselineNs"] = value::number(status.baseline_ns);
    out["baseline"] = Str(status.baseline);
  }
  if (!status.last_fired_time.empty()) {
    out["lastFiredTime"] = Str(status.last_fired_time);
    out["lastFiredNs"] = value::number(status.last_fired_ns);
  }
  if (!status.last_job.empty()) {
    out["lastJob"] = Str(status.last_job);
    out["lastJobCreated"] = value::boolean(status.last_job_created);
  }
  if (!status.captures_day.empty()) {
    out["capturesDay"] = Str(status.captures_day);
    out["capturesToday"] = value::number(status.captures_today);
  }
  if (!status.recent_firings.empty()) {
    value firings = value::array();
    size_t i = 0;
    for (const TriggerFiringStatus& firing : status.recent_firings) {
      if (i == kMaxRecentFirings) break;
      value f = value::object();
      f["time"] = Str(firing.time);
      f["detectedNs"] = value::number(firing.detected_ns);
      f["rule"] = Str(firing.rule);
      f["evidence"] = Str(firing.evidence);
      if (!firing.pods.empty()) {
        value pods = value::array();
        for (size_t p = 0; p < firing.pods.size(); ++p) pods[p] = Str(firing.pods[p]);
        f["pods"] = pods;
      }
      f["firstStep"] = value::number(firing.first_step);
      f["lastStep"] = value::number(firing.last_step);
      if (!firing.job.empty()) f["job"] = Str(firing.job);
      firings[i++] = f;
    }
    out["recentFirings"] = firings;
  }
  if (!status.active.empty()) {
    value active = value::array();
    for (size_t i = 0; i < status.active.size(); ++i)
      active[i] = JobReferenceToJson(status.active[i]);
    out["active"] = active;
  }
  return out;
}

}  // namespace clusterprof::api
