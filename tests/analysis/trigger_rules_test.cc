#include "analysis/trigger_rules.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/analysis/simulated_job.h"

namespace clusterprof::analysis {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::JobSpec;
using ::testing::Not;
using testing::SimulatedJob;

constexpr int64_t kMs = kNanosPerMilli;
constexpr int64_t kT0 = SimulatedClock::kDefaultWallNs;

// `pods` pods running steps [first, first + count) back to back from kT0 (reference clock), each
// `duration(step)` long; pod p enters the step's collective `entry(p, step)` after the step's
// start, and starts and ends its steps p microseconds after pod 0 (so the last pod's end is the
// latest). Each pod's times are on its own clock: offsets[p] ahead of the reference.
std::vector<PodSteps> Lockstep(int pods, int64_t first, int count,
                               const std::function<int64_t(int64_t)>& duration,
                               const std::function<int64_t(int, int64_t)>& entry,
                               const std::vector<int64_t>& offsets = {}) {
  std::vector<PodSteps> out(static_cast<size_t>(pods));
  for (int p = 0; p < pods; ++p) {
    out[p].pod = StrCat("pod-", p);
    out[p].clock_offset_ns = offsets.empty() ? 0 : offsets[p];
  }
  int64_t start = kT0;
  for (int64_t step = first; step < first + count; ++step) {
    const int64_t end = start + duration(step);
    for (int p = 0; p < pods; ++p) {
      StepDigest& s = out[p].steps.emplace_back();
      s.step = step;
      s.start_ns = start + p * kNanosPerMicro + out[p].clock_offset_ns;
      s.collective_entry_ns = start + entry(p, step) + out[p].clock_offset_ns;
      s.end_ns = end + p * kNanosPerMicro + out[p].clock_offset_ns;
    }
    start = end + pods * kNanosPerMicro;
  }
  return out;
}

int64_t Constant100Ms(int64_t) { return 100 * kMs; }
int64_t OnTime(int, int64_t) { return 80 * kMs; }

// The end of `step` on the reference clock: the latest among the pods that have it.
int64_t LatestEnd(const std::vector<PodSteps>& pods, int64_t step) {
  int64_t latest = std::numeric_limits<int64_t>::min();
  for (const PodSteps& pod : pods) {
    for (const StepDigest& s : pod.steps) {
      if (s.step == step) latest = std::max(latest, s.end_ns - pod.clock_offset_ns);
    }
  }
  return latest;
}

int64_t LastEnd(const std::vector<PodSteps>& pods) {
  int64_t latest = std::numeric_limits<int64_t>::min();
  for (const PodSteps& pod : pods) {
    if (!pod.steps.empty())
      latest = std::max(latest, pod.steps.back().end_ns - pod.clock_offset_ns);
  }
  return latest;
}

TriggerRules Regression(double percent = 20, int steps = 10) {
  TriggerRules rules;
  rules.warmup_steps = 0;  // the windows' tests see every step (warm-up: WarmUpTest)
  rules.step_time_regression = StepTimeRegressionRule{percent, steps};
  return rules;
}

TriggerRules Straggler(int steps = 20) {
  TriggerRules rules;
  rules.warmup_steps = 0;  // the windows' tests see every step (warm-up: WarmUpTest)
  rules.straggler = StragglerTriggerRule{steps};
  return rules;
}

TriggerRules Stall(int64_t seconds = 120) {
  TriggerRules rules;
  rules.warmup_steps = 0;  // the windows' tests see every step (warm-up: WarmUpTest)
  rules.step_stall = StepStallRule{seconds};
  return rules;
}

TriggerRules AllRules() {
  TriggerRules rules;
  rules.warmup_steps = 0;  // the windows' tests see every step (warm-up: WarmUpTest)
  rules.step_time_regression = StepTimeRegressionRule{10, 10};
  rules.straggler = StragglerTriggerRule{20};
  rules.step_stall = StepStallRule{120};
  return rules;
}

std::vector<std::string> FiredRules(const TriggerEvaluation& evaluation) {
  std::vector<std::string> rules;
  for (const TriggerFiring& firing : evaluation.firings) rules.push_back(firing.rule);
  return rules;
}

// --- Warm-up ---

TEST(WarmUpTest, APodsFirstStepsAreNotJudged) {
  // pod-1 is late by 30 ms in its first 20 steps only (it joined late), then on time.
  const auto late_at_start = [](int p, int64_t step) -> int64_t {
    return p == 1 && step < 20 ? 110 * kMs : 80 * kMs;
  };
  std::vector<PodSteps> pods = Lockstep(
      4, 0, 20, [](int64_t) { return 130 * kMs; }, late_at_start);
  TriggerRules rules = Straggler(14);
  ASSERT_THAT(FiredRules(EvaluateTriggerRules(rules, pods, LastEnd(pods))),
              ElementsAre(kStragglerRuleName))
      << "without a warm-up the start fires";
  rules.warmup_steps = 20;
  TriggerEvaluation evaluation = EvaluateTriggerRules(rules, pods, LastEnd(pods));
  EXPECT_THAT(evaluation.firings, IsEmpty());
  EXPECT_THAT(evaluation.notes, Contains(HasSubstr("are still in the first 20 steps")));
  // Ten steps later: steps 20-29 are too few for the window, and said so; still no firing.
  pods = Lockstep(
      4, 0, 30, [](int64_t) { return 130 * kMs; }, late_at_start);
  evaluation = EvaluateTriggerRules(rules, pods, LastEnd(pods));
  EXPECT_THAT(evaluation.firings, IsEmpty());
  EXPECT_THAT(evaluation.notes, Contains(HasSubstr("has 10")));
}

TEST(WarmUpTest, AStragglerAfterTheWarmUpStillFires) {
  const auto late_later = [](int p, int64_t step) -> int64_t {
    return p == 2 && step >= 30 ? 110 * kMs : 80 * kMs;
  };
  const std::vector<PodSteps> pods = Lockstep(
      4, 0, 60, [](int64_t) { return 130 * kMs; }, late_later);
  TriggerRules rules = Straggler(20);
  rules.warmup_steps = 20;
  const TriggerEvaluation evaluation = EvaluateTriggerRules(rules, pods, LastEnd(pods));
  ASSERT_THAT(FiredRules(evaluation), ElementsAre(kStragglerRuleName));
  EXPECT_THAT(evaluation.firings[0].pods, ElementsAre("pod-2"));
}

TEST(WarmUpTest, SlowFirstStepsDoNotEnterTheRegressionBaselineOrWindow) {
  // Compilation: the first 20 steps take 1 s; then 100 ms. With them counted, 60 steps of 100 ms
  // after a baseline full of 1 s steps read as fast; after the warm-up they are the baseline.
  const std::vector<PodSteps> pods = Lockstep(
      2, 0, 80, [](int64_t step) { return step < 20 ? 1000 * kMs : 100 * kMs; }, OnTime);
  TriggerRules rules = Regression(20, 10);
  rules.warmup_steps = 20;
  const TriggerEvaluation evaluation = EvaluateTriggerRules(rules, pods, LastEnd(pods));
  EXPECT_THAT(evaluation.firings, IsEmpty());
  EXPECT_EQ(evaluation.telemetry.baseline_ns, 100 * kMs);
  EXPECT_EQ(evaluation.telemetry.step_p50_ns, 100 * kMs);
}

TEST(WarmUpTest, AFullHistoryLeavesNothingOut) {
  // 1,024 steps kept: the oldest are not the pod's first, so they are judged like the rest.
  TriggerRules rules = Straggler(30);
  rules.warmup_steps = 1000;
  std::vector<PodSteps> pods = Lockstep(4, 5000, kMaxTriggerSteps - 1, Constant100Ms, OnTime);
  EXPECT_THAT(EvaluateTriggerRules(rules, pods, LastEnd(pods)).notes,
              Contains(HasSubstr("has 23")));
  pods = Lockstep(4, 5000, kMaxTriggerSteps, Constant100Ms, OnTime);
  EXPECT_THAT(EvaluateTriggerRules(rules, pods, LastEnd(pods)).notes,
              Not(Contains(HasSubstr("needs"))));
}

TEST(WarmUpTest, AStallDuringTheWarmUpStillFires) {
  const std::vector<PodSteps> pods = Lockstep(2, 0, 5, Constant100Ms, OnTime);
  TriggerRules rules = Stall(120);
  rules.warmup_steps = 20;
  EXPECT_THAT(FiredRules(EvaluateTriggerRules(rules, pods, LastEnd(pods) + 121 * kNanosPerSecond)),
              ElementsAre(kStepStallRuleName));
}

// --- Validation ---

TEST(ValidateTriggerRulesTest, TheDefaultsOfEachRuleAreValid) {
  EXPECT_TRUE(ValidateTriggerRules(Regression()).ok());
  EXPECT_TRUE(ValidateTriggerRules(Straggler()).ok());
  EXPECT_TRUE(ValidateTriggerRules(Stall()).ok());
  EXPECT_TRUE(ValidateTriggerRules(AllRules()).ok());
}

TEST(ValidateTriggerRulesTest, WarmupStepsIsBounded) {
  TriggerRules rules = Stall();
  rules.warmup_steps = 1001;
  EXPECT_THAT(ValidateTriggerRules(rules).message(), HasSubstr("warmupSteps must be 0 to 1000"));
  rules.warmup_steps = -1;
  EXPECT_FALSE(ValidateTriggerRules(rules).ok());
}

TEST(ValidateTriggerRulesTest, ErrorsNameTheFieldAndTheValue) {
  const auto message = [](const TriggerRules& rules) {
    const absl::Status status = ValidateTriggerRules(rules);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  };
  EXPECT_EQ(message(Regression(-5)), "stepTimeRegression.percent must be above 0 (got -5)");
  EXPECT_EQ(message(Regression(0)), "stepTimeRegression.percent must be above 0 (got 0)");
  EXPECT_THAT(message(Regression(std::numeric_limits<double>::quiet_NaN())),
              HasSubstr("stepTimeRegression.percent must be above 0 (got nan)"));
  EXPECT_EQ(message(Regression(std::numeric_limits<double>::infinity())),
            "stepTimeRegression.percent must be finite (got inf)");
  EXPECT_EQ(message(Regression(20, 0)), "stepTimeRegression.steps must be 1 to 512 (got 0)");
  EXPECT_EQ(message(Regression(20, 513)), "stepTimeRegression.steps must be 1 to 512 (got 513)");
  EXPECT_EQ(message(Straggler(0)), "straggler.steps must be 14 to 1000 (got 0)");
  EXPECT_EQ(message(Straggler(13)), "straggler.steps must be 14 to 1000 (got 13)");
  EXPECT_EQ(message(Straggler(1001)), "straggler.steps must be 14 to 1000 (got 1001)");
  EXPECT_EQ(message(Stall(0)), "stepStall.seconds must be 1 to 86400 (got 0)");
  EXPECT_EQ(message(Stall(-120)), "stepStall.seconds must be 1 to 86400 (got -120)");
  EXPECT_THAT(message(TriggerRules{}), HasSubstr("set at least one of stepTimeRegression"));
  // The first bad field of several.
  TriggerRules rules = AllRules();
  rules.straggler->steps = 1;
  EXPECT_THAT(message(rules), HasSubstr("straggler.steps"));
}

// --- stepTimeRegression ---

TEST(StepTimeRegressionTest, FiresOnAClearRegressionWithItsEvidence) {
  // Steps 1150-1199 at 101 ms, then 1200-1209 at 142 ms.
  const std::vector<PodSteps> pods = Lockstep(
      4, 1150, 60, [](int64_t step) { return (step < 1200 ? 101 : 142) * kMs; }, OnTime);
  const TriggerEvaluation evaluation = EvaluateTriggerRules(Regression(), pods, LastEnd(pods));
  ASSERT_EQ(evaluation.firings.size(), 1u);
  const TriggerFiring& firing = evaluation.firings[0];
  EXPECT_EQ(firing.rule, "stepTimeRegression");
  EXPECT_EQ(firing.evidence, "step time p50 142 ms over steps 1200-1209, baseline 101 ms: +41%");
  EXPECT_EQ(firing.first_step, 1200);
  EXPECT_EQ(firing.last_step, 1209);
  EXPECT_THAT(firing.pods, IsEmpty());
  EXPECT_EQ(firing.detected_ns, LatestEnd(pods, 1209));
  EXPECT_EQ(evaluation.telemetry.step_p50_ns, 142 * kMs);
  EXPECT_EQ(evaluation.telemetry.baseline_ns, 101 * kMs);
  EXPECT_EQ(evaluation.telemetry.pods_with_steps, 4);
  EXPECT_EQ(evaluation.telemetry.last_step, 1209);
  EXPECT_EQ(evaluation.telemetry.last_step_end_ns, LatestEnd(pods, 1209));
}

TEST(StepTimeRegressionTest, FiresOnlyAboveThePercent) {
  // +19%, +20% (not above) and +21% against a 100 ms baseline.
  for (const auto& [slower_ms, fires] : {std::pair{119, false}, {120, false}, {121, true}}) {
    const std::vector<PodSteps> pods = Lockstep(
        3, 0, 70, [&](int64_t step) { return (step < 60 ? 100 : slower_ms) * kMs; }, OnTime);
    EXPECT_EQ(EvaluateTriggerRules(Regression(20, 10), pods, LastEnd(pods)).firings.size(),
              fires ? 1u : 0u)
        << slower_ms << " ms";
  }
}

TEST(StepTimeRegressionTest, TheBaselineIsAtMostMax5xStepsOr50StepsBeforeTheWindow) {
  // 200 ms long ago, then 100 ms, 125 ms for the last 10 steps: +25% against the 50 steps
  // before them (10 of them at 200 ms), whatever came before.
  const auto duration = [](int64_t step) {
    return (step < 110 ? 200 : step < 150 ? 100 : 125) * kMs;
  };
  const std::vector<PodSteps> pods = Lockstep(2, 0, 160, duration, OnTime);
  const TriggerEvaluation evaluation = EvaluateTriggerRules(Regression(), pods, LastEnd(pods));
  ASSERT_THAT(FiredRules(evaluation), ElementsAre("stepTimeRegression"));
  EXPECT_THAT(evaluation.firings[0].evidence, HasSubstr("baseline 100 ms: +25%"));
  // A window of 20 steps takes a baseline of 100 (steps 50-149), 60 of them at 200 ms.
  const std::vector<PodSteps> longer = Lockstep(2, 0, 170, duration, OnTime);
  EXPECT_THAT(EvaluateTriggerRules(Regression(20, 20), longer, LastEnd(longer)).firings, IsEmpty());
}

TEST(StepTimeRegressionTest, ABaselineTooShortIsANoteNotAFiring) {
  // 15 steps: 10 for the window and 5 of the 10 the baseline needs; the last ones twice as slow.
  const std::vector<PodSteps> pods = Lockstep(
      4, 0, 15, [](int64_t step) { return (step < 5 ? 100 : 200) * kMs; }, OnTime);
  const TriggerEvaluation evaluation = EvaluateTriggerRules(Regression(), pods, LastEnd(pods));
  EXPECT_THAT(evaluation.firings, IsEmpty());
  EXPECT_THAT(evaluation.notes, ElementsAre("stepTimeRegression: baseline needs 5 more steps"));
  EXPECT_EQ(evaluation.telemetry.step_p50_ns, 200 * kMs);
  EXPECT_EQ(evaluation.telemetry.baseline_ns, 0);

  const std::vector<PodSteps> three = Lockstep(4, 0, 3, Constant100Ms, OnTime);
  EXPECT_THAT(EvaluateTriggerRules(Regression(), three, LastEnd(three)).notes,
              ElementsAre("stepTimeRegression: baseline needs 17 more steps"));
}

TEST(StepTimeRegressionTest, JobStepTimeIsTheMedianOverPodsAndStepsOnFewerThanHalfAreSkipped) {
  // One of five pods is twice as slow throughout: the median pod's time is the job's.
  std::vector<PodSteps> pods = Lockstep(5, 0, 60, Constant100Ms, OnTime);
  for (StepDigest& step : pods[4].steps) step.end_ns += 100 * kMs;
  EXPECT_THAT(EvaluateTriggerRules(Regression(), pods, LastEnd(pods)).firings, IsEmpty());
  // Two of five pods report ten more steps, very slow: not on half of the pods, not complete.
  for (int p = 0; p < 2; ++p) {
    int64_t start = pods[p].steps.back().end_ns;
    for (int64_t step = 60; step < 70; ++step) {
      pods[p].steps.push_back({.step = step, .start_ns = start, .end_ns = start + 500 * kMs});
      start += 500 * kMs;
    }
  }
  const TriggerEvaluation evaluation = EvaluateTriggerRules(Regression(), pods, LastEnd(pods));
  EXPECT_THAT(evaluation.firings, IsEmpty());
  EXPECT_EQ(evaluation.telemetry.step_p50_ns, 100 * kMs);
  EXPECT_EQ(evaluation.telemetry.last_step, 69);
  // With a third pod, they are.
  std::vector<PodSteps> more = pods;
  for (int64_t step = 60; step < 70; ++step) {
    more[2].steps.push_back({.step = step, .start_ns = 0, .end_ns = 500 * kMs});
  }
  EXPECT_THAT(FiredRules(EvaluateTriggerRules(Regression(), more, LastEnd(more))),
              ElementsAre("stepTimeRegression"));
}

// Simulated jobs: a step 20-30% longer from some step on is caught within `steps` steps.
TEST(StepTimeRegressionTest, ARegressionOf20To30PercentFiresWithinTheWindow) {
  for (int pods : {8, 64}) {
    for (uint32_t seed = 1; seed <= 6; ++seed) {
      JobSpec spec;
      spec.pods = pods;
      spec.jitter = 0.02 + 0.008 * (seed - 1);
      spec.seed = seed;
      SimulatedClock clock;
      SimulatedJob job(spec, &clock);
      const TriggerRules rules = Regression(10, 10);
      for (int s = 0; s < 80; ++s) {
        job.Step();
        ASSERT_THAT(EvaluateTriggerRules(rules, job.pods(), clock.WallNs()).firings, IsEmpty());
      }
      job.SetStepScale(1.2 + 0.02 * (seed - 1));
      int fired_after = 0;
      for (int s = 1; s <= 10 && fired_after == 0; ++s) {
        const int64_t step = job.Step();
        const TriggerEvaluation evaluation =
            EvaluateTriggerRules(rules, job.pods(), clock.WallNs());
        if (evaluation.firings.empty()) continue;
        fired_after = s;
        EXPECT_EQ(evaluation.firings[0].last_step, step);
        EXPECT_EQ(evaluation.firings[0].first_step, step - 9);
      }
      EXPECT_GT(fired_after, 0) << pods << " pods, seed " << seed;
    }
  }
}

// --- straggler ---

TEST(StragglerTriggerTest, FiresOnAClearStragglerWithItsEvidence) {
  // pod-3 enters the collective 12.3 ms after the others in the last 20 steps but 1195, 1200 and
  // 1205. The pods' clocks are up to 3 s apart, known.
  const std::vector<int64_t> offsets = {-2'000 * kMs, 0, 1'000 * kMs, 3'000 * kMs, 7 * kMs, 0};
  const std::vector<PodSteps> pods = Lockstep(
      6, 1150, 60, Constant100Ms,
      [](int p, int64_t step) {
        const bool late = p == 3 && step >= 1190 && step != 1195 && step != 1200 && step != 1205;
        return late ? 92'300'000 : 80 * kMs;
      },
      offsets);
  const TriggerEvaluation evaluation = EvaluateTriggerRules(Straggler(), pods, LastEnd(pods));
  ASSERT_EQ(evaluation.firings.size(), 1u) << ::testing::PrintToString(evaluation.notes);
  const TriggerFiring& firing = evaluation.firings[0];
  EXPECT_EQ(firing.rule, "straggler");
  EXPECT_EQ(firing.evidence,
            "pod-3 enters the collectives 12.3 ms late (median) in 17 of the last 20 steps "
            "(1190-1209)");
  EXPECT_EQ(firing.first_step, 1190);
  EXPECT_EQ(firing.last_step, 1209);
  EXPECT_THAT(firing.pods, ElementsAre("pod-3"));
  EXPECT_EQ(firing.detected_ns, LatestEnd(pods, 1209));
  EXPECT_THAT(evaluation.notes, IsEmpty());
}

TEST(StragglerTriggerTest, LateInFewerThanHalfOfTheStepsDoesNotFire) {
  // Late in 9 of the last 20 steps.
  const std::vector<PodSteps> pods = Lockstep(4, 0, 40, Constant100Ms, [](int p, int64_t step) {
    return p == 1 && step >= 31 ? 95 * kMs : 80 * kMs;
  });
  EXPECT_THAT(EvaluateTriggerRules(Straggler(), pods, LastEnd(pods)).firings, IsEmpty());
}

TEST(StragglerTriggerTest, AStragglerWith15PercentMoreComputeFiresWithinTheWindow) {
  for (int pods : {8, 64}) {
    for (uint32_t seed = 1; seed <= 5; ++seed) {
      JobSpec spec;
      spec.pods = pods;
      spec.jitter = 0.02 + 0.005 * (seed - 1);
      spec.max_clock_offset_ns = 2 * kNanosPerSecond;
      spec.offset_error_ns = 50 * kNanosPerMicro;
      spec.seed = seed;
      SimulatedClock clock;
      SimulatedJob job(spec, &clock);
      const TriggerRules rules = Straggler(20);
      for (int s = 0; s < 40; ++s) {
        job.Step();
        ASSERT_THAT(EvaluateTriggerRules(rules, job.pods(), clock.WallNs()).firings, IsEmpty());
      }
      const int slow = static_cast<int>(seed * 7) % pods;
      job.SetComputeScale(slow, 1.15);
      bool fired = false;
      for (int s = 1; s <= 20 && !fired; ++s) {
        job.Step();
        const TriggerEvaluation evaluation =
            EvaluateTriggerRules(rules, job.pods(), clock.WallNs());
        if (evaluation.firings.empty()) continue;
        fired = true;
        EXPECT_THAT(evaluation.firings[0].pods, ElementsAre(StrCat("pod-", slow)));
        EXPECT_THAT(evaluation.firings[0].evidence, HasSubstr(" of the last 20 steps"));
      }
      EXPECT_TRUE(fired) << pods << " pods, seed " << seed;
    }
  }
}

TEST(StragglerTriggerTest, APodWhoseClockIs5SecondsAheadIsNotAStraggler) {
  JobSpec spec;
  spec.pods = 8;
  SimulatedClock clock;
  SimulatedJob job(spec, &clock);
  for (int s = 0; s < 40; ++s) job.Step();
  std::vector<PodSteps> pods = job.pods();
  for (StepDigest& step : pods[3].steps) {
    step.start_ns += 5 * kNanosPerSecond;
    step.collective_entry_ns += 5 * kNanosPerSecond;
    step.end_ns += 5 * kNanosPerSecond;
  }
  pods[3].clock_offset_ns = 5 * kNanosPerSecond;
  const TriggerEvaluation evaluation = EvaluateTriggerRules(Straggler(), pods, clock.WallNs());
  EXPECT_THAT(evaluation.firings, IsEmpty());
  EXPECT_THAT(evaluation.notes, IsEmpty());
  // Unknown, the offset would keep its steps from being compared at all.
  pods[3].clock_offset_ns = 0;
  EXPECT_THAT(EvaluateTriggerRules(Straggler(), pods, clock.WallNs()).notes,
              ::testing::Contains(HasSubstr("only 0 of the last 20 steps could be compared")));
}

TEST(StragglerTriggerTest, StepsSomePodLacksAreSkipped) {
  // pod-2 straggles in every step; pod-1's telemetry lost 5 of the last steps: the window reaches
  // back past them, to 20 steps every pod has.
  std::vector<PodSteps> pods = Lockstep(
      4, 0, 60, Constant100Ms, [](int p, int64_t) { return p == 2 ? 90 * kMs : 80 * kMs; });
  std::erase_if(pods[1].steps, [](const StepDigest& s) { return s.step % 5 == 0 && s.step > 30; });
  const TriggerEvaluation evaluation = EvaluateTriggerRules(Straggler(), pods, LastEnd(pods));
  ASSERT_THAT(FiredRules(evaluation), ElementsAre("straggler"));
  EXPECT_THAT(evaluation.firings[0].pods, ElementsAre("pod-2"));
  EXPECT_EQ(evaluation.firings[0].first_step, 36);
  EXPECT_EQ(evaluation.firings[0].last_step, 59);
  EXPECT_THAT(evaluation.firings[0].evidence, HasSubstr("in 20 of the last 20 steps (36-59)"));
}

TEST(StragglerTriggerTest, TooFewStepsInCommonIsANote) {
  const std::vector<PodSteps> pods = Lockstep(
      4, 0, 12, Constant100Ms, [](int p, int64_t) { return p == 2 ? 95 * kMs : 80 * kMs; });
  const TriggerEvaluation evaluation = EvaluateTriggerRules(Straggler(), pods, LastEnd(pods));
  EXPECT_THAT(evaluation.firings, IsEmpty());
  EXPECT_THAT(evaluation.notes, ElementsAre(HasSubstr("straggler: needs 20 steps")));
  EXPECT_THAT(evaluation.notes[0], HasSubstr("has 12"));
}

TEST(StragglerTriggerTest, PodsWithoutCollectivesAreNamedAndLeftOut) {
  std::vector<PodSteps> pods = Lockstep(
      5, 0, 30, Constant100Ms, [](int p, int64_t) { return p == 1 ? 95 * kMs : 80 * kMs; });
  for (StepDigest& step : pods[4].steps) step.collective_entry_ns = 0;
  const TriggerEvaluation evaluation = EvaluateTriggerRules(Straggler(), pods, LastEnd(pods));
  EXPECT_THAT(evaluation.notes, ElementsAre("straggler: pod-4 has no collectives in its steps"));
  ASSERT_THAT(FiredRules(evaluation), ElementsAre("straggler"));
  EXPECT_THAT(evaluation.firings[0].pods, ElementsAre("pod-1"));

  // With one pod left there is nothing to compare.
  for (int p = 1; p < 4; ++p) {
    for (StepDigest& step : pods[p].steps) step.collective_entry_ns = 0;
  }
  const TriggerEvaluation alone = EvaluateTriggerRules(Straggler(), pods, LastEnd(pods));
  EXPECT_THAT(alone.firings, IsEmpty());
  EXPECT_THAT(alone.notes, ElementsAre("straggler: pod-1, pod-2, pod-3, pod-4 have no collectives "
                                       "in their steps",
                                       HasSubstr("nothing to compare")));
}

// --- stepStall ---

TEST(StepStallTest, FiresWhenNoPodFinishedAStepForTheSecondsWithItsEvidence) {
  std::vector<PodSteps> pods = Lockstep(4, 1150, 60, Constant100Ms, OnTime);
  pods[2].steps.back().end_ns += 1 * kMs;  // pod-2 finished step 1209 last
  const int64_t last = LastEnd(pods);
  SimulatedClock clock(last);
  clock.AdvanceNs(134 * kNanosPerSecond + 500 * kMs);
  const TriggerEvaluation evaluation = EvaluateTriggerRules(Stall(), pods, clock.WallNs());
  ASSERT_EQ(evaluation.firings.size(), 1u);
  const TriggerFiring& firing = evaluation.firings[0];
  EXPECT_EQ(firing.rule, "stepStall");
  EXPECT_EQ(firing.evidence, "no pod finished a step for 134 s (the last: step 1209 on pod-2)");
  EXPECT_EQ(firing.first_step, 1209);
  EXPECT_EQ(firing.last_step, 1209);
  EXPECT_THAT(firing.pods, ElementsAre("pod-0", "pod-1", "pod-2", "pod-3"));
  EXPECT_EQ(firing.detected_ns, last + 120 * kNanosPerSecond);
  EXPECT_EQ(evaluation.telemetry.last_step_end_ns, last);
}

TEST(StepStallTest, FiresAtTheSecondsNotJustBelow) {
  const std::vector<PodSteps> pods = Lockstep(3, 0, 5, Constant100Ms, OnTime);
  SimulatedClock clock(LastEnd(pods));
  clock.AdvanceNs(120 * kNanosPerSecond - 1);
  EXPECT_THAT(EvaluateTriggerRules(Stall(), pods, clock.WallNs()).firings, IsEmpty());
  clock.AdvanceNs(1);
  const TriggerEvaluation evaluation = EvaluateTriggerRules(Stall(), pods, clock.WallNs());
  ASSERT_THAT(FiredRules(evaluation), ElementsAre("stepStall"));
  EXPECT_EQ(evaluation.firings[0].detected_ns, clock.WallNs());
}

TEST(StepStallTest, NamesThePodsThatStoppedEarlier) {
  std::vector<PodSteps> pods = Lockstep(4, 0, 30, Constant100Ms, OnTime);
  pods[1].steps.pop_back();
  pods[1].steps.pop_back();
  SimulatedClock clock(LastEnd(pods));
  clock.AdvanceNs(300 * kNanosPerSecond);
  const TriggerEvaluation evaluation = EvaluateTriggerRules(Stall(), pods, clock.WallNs());
  ASSERT_EQ(evaluation.firings.size(), 1u);
  EXPECT_EQ(evaluation.firings[0].evidence,
            "no pod finished a step for 300 s (the last: step 29 on pod-3); stopped earlier: "
            "pod-1 (step 27)");
}

TEST(StepStallTest, ClockOffsetsAreHonoured) {
  // Every pod's last step ended 119 s ago on the reference clock; pod-1's clock is 5 s behind and
  // pod-2's 5 s ahead: read on their own clocks, pod-1 would look stalled for 124 s already.
  const std::vector<PodSteps> pods =
      Lockstep(3, 0, 10, Constant100Ms, OnTime, {0, -5 * kNanosPerSecond, 5 * kNanosPerSecond});
  SimulatedClock clock(LastEnd(pods));
  clock.AdvanceNs(119 * kNanosPerSecond);
  const TriggerRules rules = Stall(120);
  EXPECT_THAT(EvaluateTriggerRules(rules, pods, clock.WallNs()).firings, IsEmpty());
  // Nor does the pod ahead postpone the stall.
  clock.AdvanceNs(1 * kNanosPerSecond);
  EXPECT_THAT(FiredRules(EvaluateTriggerRules(rules, pods, clock.WallNs())),
              ElementsAre("stepStall"));
}

TEST(StepStallTest, NoStepAtAllIsANoteNotAStall) {
  SimulatedClock clock;
  std::vector<PodSteps> pods(3);
  for (int p = 0; p < 3; ++p) pods[p].pod = StrCat("pod-", p);
  clock.AdvanceNs(3600 * kNanosPerSecond);
  const TriggerEvaluation evaluation = EvaluateTriggerRules(AllRules(), pods, clock.WallNs());
  EXPECT_THAT(evaluation.firings, IsEmpty());
  EXPECT_THAT(evaluation.notes, ElementsAre("no pod has reported a step"));
  EXPECT_EQ(evaluation.telemetry.pods_with_steps, 0);
  EXPECT_EQ(evaluation.telemetry.last_step, -1);
  EXPECT_THAT(EvaluateTriggerRules(AllRules(), {}, clock.WallNs()).notes,
              ElementsAre("no pod has reported a step"));
}

// --- All rules together ---

TEST(EvaluateTriggerRulesTest, EveryRuleThatHoldsFiresInRuleOrder) {
  // A regression from step 60, pod-2 straggling throughout, and then nothing for 10 minutes.
  const std::vector<PodSteps> pods = Lockstep(
      4, 0, 70, [](int64_t step) { return (step < 60 ? 100 : 150) * kMs; },
      [](int p, int64_t) { return p == 2 ? 95 * kMs : 80 * kMs; });
  SimulatedClock clock(LastEnd(pods));
  clock.AdvanceNs(600 * kNanosPerSecond);
  const TriggerEvaluation evaluation = EvaluateTriggerRules(AllRules(), pods, clock.WallNs());
  EXPECT_THAT(FiredRules(evaluation), ElementsAre("stepTimeRegression", "straggler", "stepStall"));
  EXPECT_THAT(evaluation.notes, IsEmpty());
}

TEST(EvaluateTriggerRulesTest, PodsWithoutStepsAreNamedAndTheOthersEvaluated) {
  std::vector<PodSteps> pods = Lockstep(
      4, 0, 40, Constant100Ms, [](int p, int64_t) { return p == 0 ? 95 * kMs : 80 * kMs; });
  pods.push_back({.pod = "pod-late-starter"});
  const TriggerEvaluation evaluation = EvaluateTriggerRules(Straggler(), pods, LastEnd(pods));
  EXPECT_THAT(evaluation.notes, ElementsAre("pod-late-starter has reported no step"));
  EXPECT_THAT(FiredRules(evaluation), ElementsAre("straggler"));
  EXPECT_EQ(evaluation.telemetry.pods_with_steps, 4);
}

TEST(EvaluateTriggerRulesTest, WithoutTheRegressionRuleTheTelemetryShowsTheLast10Steps) {
  const std::vector<PodSteps> pods = Lockstep(
      2, 0, 100, [](int64_t step) { return (step < 90 ? 100 : 130) * kMs; }, OnTime);
  const TriggerEvaluation evaluation = EvaluateTriggerRules(Stall(), pods, LastEnd(pods));
  EXPECT_THAT(evaluation.firings, IsEmpty());
  EXPECT_THAT(evaluation.notes, IsEmpty());
  EXPECT_EQ(evaluation.telemetry.step_p50_ns, 130 * kMs);
  EXPECT_EQ(evaluation.telemetry.baseline_ns, 100 * kMs);
  EXPECT_EQ(evaluation.telemetry.last_step, 99);
}

// Noise only: healthy jobs with 2-6% compute jitter, the rules evaluated after every step, never
// fire.
TEST(EvaluateTriggerRulesTest, NoiseAloneNeverFires) {
  struct Case {
    int pods;
    double jitter;
    int steps;
  };
  for (const Case& c :
       {Case{8, 0.02, 1500}, Case{8, 0.06, 3000}, Case{64, 0.02, 600}, Case{64, 0.06, 2000}}) {
    JobSpec spec;
    spec.pods = c.pods;
    spec.jitter = c.jitter;
    spec.step_ns = 250 * kMs;
    spec.max_clock_offset_ns = 2 * kNanosPerSecond;
    spec.offset_error_ns = 50 * kNanosPerMicro;
    spec.seed = static_cast<uint32_t>(c.pods * 1000 + c.steps);
    SimulatedClock clock;
    SimulatedJob job(spec, &clock);
    int firings = 0;
    for (int s = 0; s < c.steps; ++s) {
      job.Step();
      const TriggerEvaluation evaluation =
          EvaluateTriggerRules(AllRules(), job.pods(), clock.WallNs());
      firings += static_cast<int>(evaluation.firings.size());
      if (s == c.steps - 1) {
        EXPECT_THAT(evaluation.notes, IsEmpty());
        EXPECT_EQ(evaluation.telemetry.pods_with_steps, c.pods);
        EXPECT_NEAR(static_cast<double>(evaluation.telemetry.step_p50_ns),
                    static_cast<double>(evaluation.telemetry.baseline_ns),
                    0.05 * static_cast<double>(evaluation.telemetry.baseline_ns));
      }
    }
    EXPECT_EQ(firings, 0) << c.pods << " pods, jitter " << c.jitter;
  }
}

}  // namespace
}  // namespace clusterprof::analysis
