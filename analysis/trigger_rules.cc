#include "analysis/trigger_rules.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "common/base/clock.h"
#include "common/base/saturating.h"
#include "common/base/strings.h"

namespace clusterprof::analysis {
namespace {

constexpr int kMaxStragglerSteps = 1000;
// Shorter straggler windows fire on noise: with 2-6% jitter, 20 false firings in 47,700 healthy
// steps at 10 steps, none at 14 (bench/RESULTS.md, "Triggers: rule accuracy and cost").
constexpr int kMinStragglerSteps = 14;
constexpr int64_t kMaxStallSeconds = 86'400;
constexpr int kMaxWarmupSteps = 1000;
// How many pods a note or an evidence names before "and N more".
constexpr size_t kMaxNamed = 5;

// The median of `values` (the lower middle for an even count, as FindStragglers); 0 for none.
int64_t Median(std::vector<int64_t>& values) {
  if (values.empty()) return 0;
  const size_t middle = (values.size() - 1) / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle),
                   values.end());
  return values[middle];
}

// Milliseconds with 3 significant digits: "142 ms", "12.3 ms", "1.05 ms", "0.125 ms"; whole
// milliseconds from 100 ms up ("1534 ms").
std::string FormatMs(int64_t ns) {
  const double ms = static_cast<double>(ns) / 1e6;
  const double magnitude = std::fabs(ms);
  int decimals = 0;
  if (magnitude > 0 && magnitude < 100) {
    decimals = std::min(6, 2 - static_cast<int>(std::floor(std::log10(magnitude))));
  }
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f ms", decimals, ms);
  return buffer;
}

std::string NameList(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kMaxNamed; ++i) {
    StrAppend(&out, i == 0 ? "" : ", ", names[i]);
  }
  if (names.size() > kMaxNamed) StrAppend(&out, " and ", names.size() - kMaxNamed, " more");
  return out;
}

// One step number as the pods reported it: members_[first, first + count) of StepIndex.
struct Row {
  int64_t step = 0;
  size_t first = 0;
  int count = 0;
  // Every pod with collectives has it, with a collective entry.
  bool comparable = false;
};

struct Member {
  size_t pod = 0;  // index into the pods with steps
  const StepDigest* step = nullptr;
};

// The pods' steps by step number, newest first, read only as far back as the rules need:
// a merge from the end of each pod's steps (O(pods) per step number).
class StepIndex {
 public:
  // floor[p]: how many of pod p's oldest steps are not read (its warm-up).
  StepIndex(const std::vector<const PodSteps*>& pods, const std::vector<bool>& with_collectives,
            std::vector<size_t> floor)
      : pods_(pods),
        with_collectives_(with_collectives),
        floor_(std::move(floor)),
        cursor_(pods.size()) {
    for (size_t p = 0; p < pods.size(); ++p) {
      cursor_[p] = pods[p]->steps.size();
      if (with_collectives[p]) ++pods_with_collectives_;
    }
  }

  // Reads rows until `complete` rows present on at least half of the pods and `comparable`
  // comparable rows were read, or the steps run out.
  void ReadUntil(size_t complete, size_t comparable) {
    while (complete_.size() < complete || comparable_.size() < comparable) {
      if (!ReadRow()) return;
    }
  }

  const std::vector<size_t>& complete() const { return complete_; }
  const std::vector<size_t>& comparable() const { return comparable_; }
  const Row& row(size_t i) const { return rows_[i]; }
  const Member* members(size_t i) const { return members_.data() + rows_[i].first; }

  // The latest end of the row's step on the reference clock.
  int64_t LatestEndNs(size_t i) const {
    int64_t latest = std::numeric_limits<int64_t>::min();
    const Member* m = members(i);
    for (int k = 0; k < rows_[i].count; ++k) {
      latest = std::max(latest, SaturatingSub(m[k].step->end_ns, pods_[m[k].pod]->clock_offset_ns));
    }
    return latest;
  }

  // The median of the pods' durations of the row's step.
  int64_t JobStepNs(size_t i) {
    scratch_.clear();
    const Member* m = members(i);
    for (int k = 0; k < rows_[i].count; ++k) scratch_.push_back(m[k].step->duration_ns());
    return Median(scratch_);
  }

 private:
  bool ReadRow() {
    int64_t step = std::numeric_limits<int64_t>::min();
    bool any = false;
    for (size_t p = 0; p < pods_.size(); ++p) {
      if (cursor_[p] == floor_[p]) continue;
      step = std::max(step, pods_[p]->steps[cursor_[p] - 1].step);
      any = true;
    }
    if (!any) return false;
    Row row{step, members_.size(), 0, pods_with_collectives_ >= 2};
    int with_collectives = 0;
    for (size_t p = 0; p < pods_.size(); ++p) {
      if (cursor_[p] == floor_[p]) continue;
      const StepDigest& s = pods_[p]->steps[cursor_[p] - 1];
      if (s.step != step) continue;
      members_.push_back({p, &s});
      --cursor_[p];
      ++row.count;
      if (with_collectives_[p]) {
        if (s.collective_entry_ns == 0) row.comparable = false;
        ++with_collectives;
      }
    }
    if (with_collectives != pods_with_collectives_) row.comparable = false;
    rows_.push_back(row);
    if (2 * static_cast<size_t>(row.count) >= pods_.size()) complete_.push_back(rows_.size() - 1);
    if (row.comparable) comparable_.push_back(rows_.size() - 1);
    return true;
  }

  const std::vector<const PodSteps*>& pods_;
  const std::vector<bool>& with_collectives_;
  const std::vector<size_t> floor_;
  int pods_with_collectives_ = 0;
  // Per pod, one past the newest step not read yet.
  std::vector<size_t> cursor_;
  std::vector<Row> rows_;
  std::vector<Member> members_;
  std::vector<size_t> complete_;    // rows on at least half of the pods, newest first
  std::vector<size_t> comparable_;  // rows every pod with collectives has with an entry
  std::vector<int64_t> scratch_;
};

int BaselineSteps(const StepTimeRegressionRule& rule) { return std::max(5 * rule.steps, 50); }

void EvaluateRegression(const std::optional<StepTimeRegressionRule>& configured, StepIndex& index,
                        TriggerEvaluation& out) {
  // Without the rule, the telemetry still shows the last 10 steps against the default baseline.
  const StepTimeRegressionRule rule = configured.value_or(StepTimeRegressionRule{});
  const std::vector<size_t>& complete = index.complete();
  const size_t current_steps = std::min(complete.size(), static_cast<size_t>(rule.steps));
  const size_t baseline_steps =
      std::min(complete.size() - current_steps, static_cast<size_t>(BaselineSteps(rule)));
  std::vector<int64_t> times;
  for (size_t i = 0; i < current_steps; ++i) times.push_back(index.JobStepNs(complete[i]));
  const int64_t current = Median(times);
  out.telemetry.step_p50_ns = current;
  if (current_steps + baseline_steps < 2 * static_cast<size_t>(rule.steps)) {
    if (configured.has_value()) {
      const int more = 2 * rule.steps - static_cast<int>(current_steps + baseline_steps);
      out.notes.push_back(StrCat(kStepTimeRegressionRuleName, ": baseline needs ", more,
                                 " more step", more == 1 ? "" : "s"));
    }
    return;
  }
  times.clear();
  for (size_t i = current_steps; i < current_steps + baseline_steps; ++i) {
    times.push_back(index.JobStepNs(complete[i]));
  }
  const int64_t baseline = Median(times);
  out.telemetry.baseline_ns = baseline;
  if (!configured.has_value() || baseline <= 0) return;
  if (static_cast<double>(current) <=
      static_cast<double>(baseline) * (1.0 + rule.percent / 100.0)) {
    return;
  }
  TriggerFiring firing;
  firing.rule = kStepTimeRegressionRuleName;
  firing.last_step = index.row(complete.front()).step;
  firing.first_step = index.row(complete[current_steps - 1]).step;
  const double change = 100.0 * (static_cast<double>(current) / static_cast<double>(baseline) - 1);
  char percent[32];
  std::snprintf(percent, sizeof(percent), "%+.0f%%", change);
  firing.evidence = StrCat("step time p50 ", FormatMs(current), " over steps ", firing.first_step,
                           "-", firing.last_step, ", baseline ", FormatMs(baseline), ": ", percent);
  firing.detected_ns = index.LatestEndNs(complete.front());
  out.firings.push_back(std::move(firing));
}

void EvaluateStraggler(const StragglerTriggerRule& rule, const std::vector<const PodSteps*>& pods,
                       const std::vector<bool>& with_collectives, StepIndex& index,
                       TriggerEvaluation& out) {
  const std::string prefix = StrCat(kStragglerRuleName, ": ");
  std::vector<std::string> without;
  for (size_t p = 0; p < pods.size(); ++p) {
    if (!with_collectives[p]) without.push_back(pods[p]->pod);
  }
  if (!without.empty()) {
    out.notes.push_back(StrCat(prefix, NameList(without), without.size() == 1 ? " has" : " have",
                               " no collectives in ", without.size() == 1 ? "its" : "their",
                               " steps"));
  }
  if (pods.size() - without.size() < 2) {
    out.notes.push_back(StrCat(prefix, pods.size() - without.size(),
                               " pod(s) with collectives in their steps: nothing to compare"));
    return;
  }
  const std::vector<size_t>& comparable = index.comparable();
  if (comparable.size() < static_cast<size_t>(rule.steps)) {
    out.notes.push_back(StrCat(prefix, "needs ", rule.steps,
                               " steps that every pod with collectives has, with a collective on "
                               "each; has ",
                               comparable.size()));
    return;
  }
  // The window, oldest first, as each pod's digest.
  std::vector<HostRun> runs;
  std::vector<size_t> run_of(pods.size(), pods.size());
  for (size_t p = 0; p < pods.size(); ++p) {
    if (!with_collectives[p]) continue;
    run_of[p] = runs.size();
    HostRun& run = runs.emplace_back();
    run.digest.host = pods[p]->pod;
    run.digest.step_source = "live step telemetry";
    run.digest.steps.reserve(static_cast<size_t>(rule.steps));
    run.clock_offset_ns = pods[p]->clock_offset_ns;
  }
  for (size_t w = static_cast<size_t>(rule.steps); w-- > 0;) {
    const size_t row = comparable[w];
    const Member* m = index.members(row);
    for (int k = 0; k < index.row(row).count; ++k) {
      if (run_of[m[k].pod] < runs.size()) runs[run_of[m[k].pod]].digest.steps.push_back(*m[k].step);
    }
  }
  const Analysis analysis = FindStragglers(runs, StragglerRule{});
  if (analysis.compared_steps < rule.steps) {
    out.notes.push_back(StrCat(prefix, "only ", analysis.compared_steps, " of the last ",
                               rule.steps, " steps could be compared"));
    for (const std::string& note : analysis.notes) out.notes.push_back(StrCat(prefix, note));
    return;
  }
  TriggerFiring firing;
  firing.rule = kStragglerRuleName;
  firing.first_step = analysis.first_step;
  firing.last_step = analysis.last_step;
  for (const HostVerdict* verdict : analysis.stragglers()) {
    firing.pods.push_back(verdict->host);
    StrAppend(&firing.evidence, firing.evidence.empty() ? "" : "; ", verdict->host,
              " enters the collectives ", FormatMs(verdict->median_lateness_ns),
              " late (median) in ", verdict->late_steps, " of the last ", analysis.compared_steps,
              " steps (", analysis.first_step, "-", analysis.last_step, ")");
  }
  if (firing.pods.empty()) return;
  firing.detected_ns = index.LatestEndNs(comparable.front());
  out.firings.push_back(std::move(firing));
}

void EvaluateStall(const std::optional<StepStallRule>& rule,
                   const std::vector<const PodSteps*>& pods, int64_t now_ns,
                   TriggerEvaluation& out) {
  // The pod that finished a step last, on the reference clock.
  size_t latest = 0;
  int64_t last_end = std::numeric_limits<int64_t>::min();
  int64_t highest = std::numeric_limits<int64_t>::min();
  for (size_t p = 0; p < pods.size(); ++p) {
    const StepDigest& last = pods[p]->steps.back();
    const int64_t end = SaturatingSub(last.end_ns, pods[p]->clock_offset_ns);
    if (end > last_end) {
      last_end = end;
      latest = p;
    }
    highest = std::max(highest, last.step);
  }
  out.telemetry.last_step = highest;
  out.telemetry.last_step_end_ns = last_end;
  if (!rule.has_value()) return;
  const int64_t stall_ns = SaturatingMul(rule->seconds, kNanosPerSecond);
  const int64_t quiet_ns = SaturatingSub(now_ns, last_end);
  if (quiet_ns < stall_ns) return;
  TriggerFiring firing;
  firing.rule = kStepStallRuleName;
  firing.first_step = firing.last_step = pods[latest]->steps.back().step;
  firing.detected_ns = SaturatingAdd(last_end, stall_ns);
  std::vector<std::string> behind;
  for (const PodSteps* pod : pods) {
    firing.pods.push_back(pod->pod);
    if (pod->steps.back().step < highest) {
      behind.push_back(StrCat(pod->pod, " (step ", pod->steps.back().step, ")"));
    }
  }
  firing.evidence = StrCat("no pod finished a step for ", quiet_ns / kNanosPerSecond,
                           " s (the last: step ", firing.last_step, " on ", pods[latest]->pod, ")");
  if (!behind.empty()) StrAppend(&firing.evidence, "; stopped earlier: ", NameList(behind));
  out.firings.push_back(std::move(firing));
}

}  // namespace

absl::Status ValidateTriggerRules(const TriggerRules& rules) {
  if (!rules.step_time_regression && !rules.straggler && !rules.step_stall) {
    return absl::InvalidArgumentError(StrCat("rules: set at least one of ",
                                             kStepTimeRegressionRuleName, ", ", kStragglerRuleName,
                                             " or ", kStepStallRuleName, " (got none)"));
  }
  if (const auto& r = rules.step_time_regression) {
    if (!(r->percent > 0)) {
      return absl::InvalidArgumentError(
          StrCat(kStepTimeRegressionRuleName, ".percent must be above 0 (got ", r->percent, ")"));
    }
    if (!std::isfinite(r->percent)) {
      return absl::InvalidArgumentError(
          StrCat(kStepTimeRegressionRuleName, ".percent must be finite (got ", r->percent, ")"));
    }
    if (r->steps < 1 || r->steps > kMaxTriggerSteps / 2) {
      return absl::InvalidArgumentError(StrCat(kStepTimeRegressionRuleName, ".steps must be 1 to ",
                                               kMaxTriggerSteps / 2, " (got ", r->steps, ")"));
    }
  }
  if (const auto& r = rules.straggler) {
    if (r->steps < kMinStragglerSteps || r->steps > kMaxStragglerSteps) {
      return absl::InvalidArgumentError(StrCat(kStragglerRuleName, ".steps must be ",
                                               kMinStragglerSteps, " to ", kMaxStragglerSteps,
                                               " (got ", r->steps, ")"));
    }
  }
  if (rules.warmup_steps < 0 || rules.warmup_steps > kMaxWarmupSteps) {
    return absl::InvalidArgumentError(
        StrCat("warmupSteps must be 0 to ", kMaxWarmupSteps, " (got ", rules.warmup_steps, ")"));
  }
  if (const auto& r = rules.step_stall) {
    if (r->seconds < 1 || r->seconds > kMaxStallSeconds) {
      return absl::InvalidArgumentError(StrCat(kStepStallRuleName, ".seconds must be 1 to ",
                                               kMaxStallSeconds, " (got ", r->seconds, ")"));
    }
  }
  return absl::OkStatus();
}

TriggerEvaluation EvaluateTriggerRules(const TriggerRules& rules, const std::vector<PodSteps>& pods,
                                       int64_t now_ns) {
  TriggerEvaluation out;
  std::vector<const PodSteps*> with_steps;
  std::vector<std::string> without_steps;
  for (const PodSteps& pod : pods) {
    if (pod.steps.empty()) {
      without_steps.push_back(pod.pod);
    } else {
      with_steps.push_back(&pod);
    }
  }
  out.telemetry.pods_with_steps = static_cast<int>(with_steps.size());
  if (with_steps.empty()) {
    out.notes.push_back("no pod has reported a step");
    return out;
  }
  if (!without_steps.empty()) {
    out.notes.push_back(StrCat(NameList(without_steps),
                               without_steps.size() == 1 ? " has" : " have", " reported no step"));
  }
  // A pod "with collectives" has a collective entry in at least one of its steps (searched from
  // the newest: a live pod has one in its last step).
  std::vector<bool> with_collectives(with_steps.size(), false);
  for (size_t p = 0; p < with_steps.size(); ++p) {
    const std::vector<StepDigest>& steps = with_steps[p]->steps;
    with_collectives[p] = std::any_of(steps.rbegin(), steps.rend(), [](const StepDigest& s) {
      return s.collective_entry_ns != 0;
    });
  }
  // A pod's first warmup_steps steps are not judged (compilation, data loaders filling, ranks
  // joining): while its history is not full, its oldest steps are its first ones.
  std::vector<size_t> floor(with_steps.size(), 0);
  std::vector<std::string> warming;
  for (size_t p = 0; p < with_steps.size(); ++p) {
    const size_t n = with_steps[p]->steps.size();
    if (n >= static_cast<size_t>(kMaxTriggerSteps)) continue;
    floor[p] = std::min(n, static_cast<size_t>(rules.warmup_steps));
    if (n <= static_cast<size_t>(rules.warmup_steps)) warming.push_back(with_steps[p]->pod);
  }
  if (!warming.empty()) {
    out.notes.push_back(StrCat(NameList(warming), warming.size() == 1 ? " is" : " are",
                               " still in the first ", rules.warmup_steps,
                               " steps (warmupSteps), which are not judged"));
  }
  StepIndex index(with_steps, with_collectives, std::move(floor));
  const StepTimeRegressionRule regression =
      rules.step_time_regression.value_or(StepTimeRegressionRule{});
  index.ReadUntil(static_cast<size_t>(regression.steps + BaselineSteps(regression)),
                  rules.straggler ? static_cast<size_t>(rules.straggler->steps) : 0);

  EvaluateRegression(rules.step_time_regression, index, out);
  if (rules.straggler) {
    EvaluateStraggler(*rules.straggler, with_steps, with_collectives, index, out);
  }
  EvaluateStall(rules.step_stall, with_steps, now_ns, out);
  return out;
}

}  // namespace clusterprof::analysis
