// The rules of a ProfileTrigger (docs/triggers.md): when a job's live step telemetry says that a
// capture is worth taking without a human asking for it. Three rules:
//
// - stepTimeRegression: the job's step time has grown against its own recent past. The job step
//   time of a step is the median, over the pods that have the step, of their step durations;
//   only steps that at least half of the pods with steps have are considered ("complete"
//   steps). current = the median job step time over the last `steps` complete steps; baseline =
//   the median over the up to max(5 x steps, 50) complete steps before those (at least `steps`
//   of them, else a note says how many more are needed). Fires when
//   current > baseline x (1 + percent / 100).
// - straggler: one pod enters the collectives late, consistently. The last `steps` steps that
//   every pod with collectives has, each with a collective entry on every such pod, go through
//   FindStragglers (analysis/stragglers.h) with the report's rule (StragglerRule defaults: late
//   by more than max(5% of the step, 3 x MAD) from the median pod in at least half of the
//   steps), so a trigger and the report of the capture it starts agree. Fires when it names a
//   straggler and all `steps` steps could be compared. Pods whose steps carry no collective
//   entry are left out with a note.
// - stepStall: the job hangs. last = the latest step end over all pods (reference clock); fires
//   when now - last >= seconds and a step was ever seen.
//
// Evaluation is stateless and cheap (about 0.1 ms of CPU for 64 pods x 1,024 steps: only the
// newest steps the windows need are read, bench/RESULTS.md): the caller keeps the steps and
// applies cooldowns and caps, and a new leader after a failover computes the same from the same
// steps. Thread-safe (pure functions).
#ifndef CLUSTERPROF_ANALYSIS_TRIGGER_RULES_H_
#define CLUSTERPROF_ANALYSIS_TRIGGER_RULES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "analysis/digest.h"
#include "analysis/stragglers.h"

namespace clusterprof::analysis {

inline constexpr char kStepTimeRegressionRuleName[] = "stepTimeRegression";
inline constexpr char kStragglerRuleName[] = "straggler";
inline constexpr char kStepStallRuleName[] = "stepStall";

// How many recent steps per pod the caller keeps (and the most any rule's window can use).
inline constexpr int kMaxTriggerSteps = 1024;

struct StepTimeRegressionRule {
  // How much slower than the baseline, in percent (> 0).
  double percent = 20;
  // The current window, in complete steps (1 to kMaxTriggerSteps / 2: the baseline needs as many).
  int steps = 10;
};

struct StragglerTriggerRule {
  // The window, in steps every pod has (2 to 1000); a pod late in half of them is a straggler.
  // Short windows fire on noise: a healthy pod is late in ~3% of steps, so with 64 pods a window
  // of 10 fires about once per 2,400 steps (docs/triggers.md); 14 and more were quiet.
  int steps = 20;
};

struct StepStallRule {
  // How long no pod may finish a step (1 to 86,400).
  int64_t seconds = 120;
};

struct TriggerRules {
  std::optional<StepTimeRegressionRule> step_time_regression;
  std::optional<StragglerTriggerRule> straggler;
  std::optional<StepStallRule> step_stall;
  // Each pod's first steps are not judged by the regression and straggler rules (0 to 1,000):
  // compilation, data loaders filling and ranks joining make them slow and uneven. While a pod
  // has fewer than kMaxTriggerSteps steps, its oldest ones are its first; once it has that many,
  // none is left out. The stall rule sees every step (a job that hangs while warming up hangs).
  int warmup_steps = 20;
};

// INVALID_ARGUMENT naming the field and the bad value ("stepTimeRegression.percent must be above 0
// (got -5)"), or saying that no rule is set.
absl::Status ValidateTriggerRules(const TriggerRules& rules);

// One pod's live steps. Times are on the pod's clock (wall ns since the epoch); clock_offset_ns is
// the pod's clock minus the reference clock (subtract it to get reference time).
struct PodSteps {
  std::string pod;
  int64_t clock_offset_ns = 0;
  // Ascending, unique step numbers; start_ns, end_ns and collective_entry_ns (0: none) set, the
  // other fields 0. Steps out of order are not refused: the caller keeps them in order.
  std::vector<StepDigest> steps;
};

struct TriggerFiring {
  // kStepTimeRegressionRuleName, kStragglerRuleName or kStepStallRuleName.
  std::string rule;
  // "step time p50 142 ms over steps 1200-1209, baseline 101 ms: +41%";
  // "pod-3 enters the collectives 12.3 ms late (median) in 17 of the last 20 steps (1190-1209)";
  // "no pod finished a step for 134 s (the last: step 1209 on pod-2)".
  std::string evidence;
  // The steps of the rule's window; for a stall, the last step finished (both).
  int64_t first_step = 0;
  int64_t last_step = 0;
  // The straggler(s); for a stall, the pods that stopped (every pod with steps); none for a
  // regression, which is the whole job's.
  std::vector<std::string> pods;
  // Reference clock: the end of the step that completed the rule's window (the latest end among
  // the pods that have it), or for a stall the instant the stall reached `seconds`.
  int64_t detected_ns = 0;
};

// What `kubectl get profiletrigger` shows.
struct JobTelemetry {
  int pods_with_steps = 0;
  // The highest step finished by any pod; -1 when none.
  int64_t last_step = -1;
  // The job's median step time over the regression rule's current window (the last 10 complete
  // steps without that rule), and its baseline: 0 while there is not enough history.
  int64_t step_p50_ns = 0;
  int64_t baseline_ns = 0;
  // Reference clock; 0 when no step.
  int64_t last_step_end_ns = 0;
};

struct TriggerEvaluation {
  JobTelemetry telemetry;
  // Every rule that holds now, in rule order (regression, straggler, stall).
  std::vector<TriggerFiring> firings;
  // Why a rule could not be evaluated, or what was left out ("stepTimeRegression: baseline needs
  // 37 more steps"; "straggler: pod-4 has no collectives in its steps").
  std::vector<std::string> notes;
};

// Evaluates the rules on the steps as they are now (now_ns on the reference clock). Stateless:
// the caller keeps up to kMaxTriggerSteps recent steps per pod and applies cooldowns and daily
// caps itself. `rules` must be valid (ValidateTriggerRules).
TriggerEvaluation EvaluateTriggerRules(const TriggerRules& rules, const std::vector<PodSteps>& pods,
                                       int64_t now_ns);

}  // namespace clusterprof::analysis

#endif  // CLUSTERPROF_ANALYSIS_TRIGGER_RULES_H_
