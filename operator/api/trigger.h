// The ProfileTrigger API (crds/profiletrigger.yaml, docs/triggers.md): rules over the live steps
// of a set of pods, and the ProfileJob a firing rule creates. Parsed and validated here (the
// CRD's schema and CEL rules, checked again because older API servers ignore CEL), with the
// status that survives operator restarts: when the trigger last fired, and how often today.
#ifndef CLUSTERPROF_OPERATOR_API_TRIGGER_H_
#define CLUSTERPROF_OPERATOR_API_TRIGGER_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/trigger_rules.h"
#include "cpprest/json.h"
#include "operator/api/types.h"

namespace clusterprof::api {

kube::ResourceType ProfileTriggers();
// Label on the ProfileJobs a ProfileTrigger creates: the trigger's name.
inline constexpr std::string_view kTriggerLabel = "clusterprof.io/trigger";
// Annotations on them: the rule that fired and its evidence.
inline constexpr std::string_view kTriggerRuleAnnotation = "clusterprof.io/trigger-rule";
inline constexpr std::string_view kTriggerEvidenceAnnotation = "clusterprof.io/trigger-evidence";

inline constexpr int64_t kDefaultTriggerDurationMs = 5'000;
inline constexpr int64_t kDefaultTriggerLookbackMs = 10'000;
inline constexpr int64_t kDefaultCooldownSeconds = 1'800;
inline constexpr int32_t kDefaultMaxCapturesPerDay = 10;

struct ProfileTriggerSpec {
  analysis::TriggerRules rules;
  // The rules in spec order, for the RULES column ("stepTimeRegression 20%/10 steps, ...").
  std::string rules_summary;
  // spec.targets, and the capture as the ProfileJob spec each firing creates (targets
  // included), validated.
  web::json::value job_spec;
  ProfileJobSpec capture;
  int64_t cooldown_seconds = kDefaultCooldownSeconds;
  int32_t max_captures_per_day = kDefaultMaxCapturesPerDay;
  bool suspend = false;
  int32_t successful_jobs_history_limit = 3;
  int32_t failed_jobs_history_limit = 1;
};

// Reads and validates a ProfileTrigger's spec. `recorder_window_ms` is how long the sidecars'
// flight recorders keep annotations (the chart's value): a longer capture.lookbackMs is refused.
// Errors name the field ("spec.rules[0].stepTimeRegression.percent: must be above 0, got -5").
absl::StatusOr<ProfileTriggerSpec> ParseProfileTriggerSpec(const web::json::value& spec,
                                                           int64_t recorder_window_ms);

// One firing, as status.lastFiring and status.recentFirings keep it.
struct TriggerFiringStatus {
  std::string time;  // RFC 3339, when the operator acted on it
  int64_t detected_ns = 0;
  std::string rule;
  std::string evidence;
  std::vector<std::string> pods;
  int64_t first_step = 0;
  int64_t last_step = 0;
  std::string job;  // the ProfileJob it created

  bool operator==(const TriggerFiringStatus&) const = default;
};

struct ProfileTriggerStatus {
  int64_t observed_generation = 0;
  std::vector<Condition> conditions;
  std::string rules;  // the RULES column
  // The job's live telemetry: pods followed, those with steps, the last step, the step time
  // (median over the regression window) and its baseline.
  int32_t pods = 0;
  int32_t pods_with_steps = 0;
  int64_t last_step = -1;
  int64_t step_time_ns = 0;
  int64_t baseline_ns = 0;
  std::string step_time;  // "142ms", for the STEP TIME and BASELINE columns
  std::string baseline;
  // When a rule last fired (RFC 3339, and in ns for the cooldown), and what happened.
  std::string last_fired_time;
  int64_t last_fired_ns = 0;
  std::string last_job;
  // Whether last_job was created: false between the status write that records a firing and the
  // create (a new leader finding it false creates the job under that name).
  bool last_job_created = false;
  std::vector<TriggerFiringStatus> recent_firings;  // newest first, at most 10
  // The daily cap: the UTC day ("2026-11-28") and the captures started on it.
  std::string captures_day;
  int32_t captures_today = 0;
  std::vector<JobReference> active;

  bool operator==(const ProfileTriggerStatus&) const = default;
};

absl::StatusOr<ProfileTriggerStatus> ParseProfileTriggerStatus(const web::json::value& status);
web::json::value ProfileTriggerStatusToJson(const ProfileTriggerStatus& status);

}  // namespace clusterprof::api

#endif  // CLUSTERPROF_OPERATOR_API_TRIGGER_H_
