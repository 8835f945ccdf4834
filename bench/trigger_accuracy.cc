// How well the ProfileTrigger rules (analysis/trigger_rules.h) tell a real change from noise, and
// what one evaluation costs. Randomized simulated jobs (tests/analysis/simulated_job.h): 8-64
// pods, a step of 50-500 ms of which 60-90% is compute before the collective, per-pod compute
// jitter of 2-6% (normal deviation), clocks up to 2 s apart and known to within 50 us. The rules
// are evaluated after every step, as the operator does.
//
// - Regressions: after 60-200 healthy steps every step becomes 20-30% longer; caught when
//   stepTimeRegression fires within `steps` steps of the onset.
// - Stragglers: after 20-200 healthy steps one pod computes 15-30% longer; caught when the
//   straggler rule names that pod (and no other) within `steps` steps of the onset.
// - Noise: jobs with nothing injected; every firing is false. The healthy steps before each
//   injection above count as noise too.
// - Cost: CPU time of one evaluation with all three rules at 8 and 64 pods x 1,024 steps.
//
//   build-bench/bench/trigger_accuracy                   # the figures in bench/RESULTS.md
//   build/bench/trigger_accuracy --quick                 # a functional run (ctest)
//
// Exits 1 when the catch rates fall below --min-catch or noise fires.
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "analysis/trigger_rules.h"
#include "common/base/clock.h"
#include "tests/analysis/simulated_job.h"

namespace clusterprof::analysis {
namespace {

using testing::JobSpec;
using testing::SimulatedJob;

struct Options {
  int regressions = 1000;
  int stragglers = 1000;
  int noise_jobs = 40;
  int noise_steps = 1500;
  double regression_percent = 10;
  int regression_steps = 10;
  double regression_min = 0.20;
  double regression_max = 0.30;
  int straggler_steps = 20;
  double straggler_min = 0.15;
  double straggler_max = 0.30;
  double jitter_min = 0.02;
  double jitter_max = 0.06;
  int cost_iterations = 2000;
  double min_catch = 0.99;
  uint32_t seed = 20261201;
};

int64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * kNanosPerSecond + ts.tv_nsec;
}

JobSpec RandomJob(const Options& options, std::mt19937& rng) {
  JobSpec spec;
  spec.pods = std::uniform_int_distribution<int>(8, 64)(rng);
  spec.step_ns = std::uniform_int_distribution<int64_t>(50, 500)(rng) * kNanosPerMilli;
  spec.compute_fraction = std::uniform_real_distribution<double>(0.6, 0.9)(rng);
  spec.jitter = std::uniform_real_distribution<double>(options.jitter_min, options.jitter_max)(rng);
  spec.max_clock_offset_ns = 2 * kNanosPerSecond;
  spec.offset_error_ns = 50 * kNanosPerMicro;
  spec.first_step = std::uniform_int_distribution<int64_t>(0, 100000)(rng);
  spec.seed = rng();
  return spec;
}

// False firings, over how many evaluations.
struct Noise {
  int64_t steps = 0;
  int64_t firings = 0;
  int64_t by_rule[3] = {0, 0, 0};

  void Count(const TriggerEvaluation& evaluation) {
    ++steps;
    for (const TriggerFiring& firing : evaluation.firings) {
      ++firings;
      if (firing.rule == kStepTimeRegressionRuleName) ++by_rule[0];
      if (firing.rule == kStragglerRuleName) ++by_rule[1];
      if (firing.rule == kStepStallRuleName) ++by_rule[2];
    }
  }
};

// Caught injections, and after how many steps of the onset (1: the onset step itself).
struct Catches {
  int injected = 0;
  int caught = 0;
  int wrong_pod = 0;
  std::vector<int> latency;
  // The smallest and largest injected changes among the missed ones, when any.
  double smallest_missed = 0;
  double missed_jitter = 0;
  double largest_missed = 0;

  void Missed(double change, double jitter) {
    if (smallest_missed == 0 || change < smallest_missed) {
      smallest_missed = change;
      missed_jitter = jitter;
    }
    largest_missed = std::max(largest_missed, change);
  }
};

TriggerRules AllRules(const Options& options) {
  TriggerRules rules;
  rules.step_time_regression =
      StepTimeRegressionRule{options.regression_percent, options.regression_steps};
  rules.straggler = StragglerTriggerRule{options.straggler_steps};
  rules.step_stall = StepStallRule{120};
  return rules;
}

bool Fired(const TriggerEvaluation& evaluation, const char* rule) {
  return std::any_of(evaluation.firings.begin(), evaluation.firings.end(),
                     [&](const TriggerFiring& f) { return f.rule == rule; });
}

void RunRegressions(const Options& options, std::mt19937& rng, Catches& catches, Noise& noise) {
  const TriggerRules rules = AllRules(options);
  for (int i = 0; i < options.regressions; ++i) {
    const JobSpec spec = RandomJob(options, rng);
    SimulatedClock clock;
    SimulatedJob job(spec, &clock);
    const int healthy = std::uniform_int_distribution<int>(60, 200)(rng);
    for (int s = 0; s < healthy; ++s) {
      job.Step();
      noise.Count(EvaluateTriggerRules(rules, job.pods(), clock.WallNs()));
    }
    const double change =
        std::uniform_real_distribution<double>(options.regression_min, options.regression_max)(rng);
    job.SetStepScale(1 + change);
    ++catches.injected;
    bool caught = false;
    for (int s = 1; s <= options.regression_steps && !caught; ++s) {
      job.Step();
      if (Fired(EvaluateTriggerRules(rules, job.pods(), clock.WallNs()),
                kStepTimeRegressionRuleName)) {
        caught = true;
        catches.latency.push_back(s);
      }
    }
    if (caught) {
      ++catches.caught;
    } else {
      catches.Missed(change, spec.jitter);
    }
  }
}

void RunStragglers(const Options& options, std::mt19937& rng, Catches& catches, Noise& noise) {
  const TriggerRules rules = AllRules(options);
  for (int i = 0; i < options.stragglers; ++i) {
    const JobSpec spec = RandomJob(options, rng);
    SimulatedClock clock;
    SimulatedJob job(spec, &clock);
    const int healthy = std::uniform_int_distribution<int>(20, 200)(rng);
    for (int s = 0; s < healthy; ++s) {
      job.Step();
      noise.Count(EvaluateTriggerRules(rules, job.pods(), clock.WallNs()));
    }
    const int slow = std::uniform_int_distribution<int>(0, spec.pods - 1)(rng);
    const double change =
        std::uniform_real_distribution<double>(options.straggler_min, options.straggler_max)(rng);
    job.SetComputeScale(slow, 1 + change);
    ++catches.injected;
    bool caught = false;
    for (int s = 1; s <= options.straggler_steps && !caught; ++s) {
      job.Step();
      const TriggerEvaluation evaluation = EvaluateTriggerRules(rules, job.pods(), clock.WallNs());
      for (const TriggerFiring& firing : evaluation.firings) {
        if (firing.rule != kStragglerRuleName) continue;
        if (firing.pods == std::vector<std::string>{StrCat("pod-", slow)}) {
          caught = true;
          catches.latency.push_back(s);
        } else {
          ++catches.wrong_pod;
        }
      }
    }
    if (caught) {
      ++catches.caught;
    } else {
      catches.Missed(change, spec.jitter);
    }
  }
}

void RunNoise(const Options& options, std::mt19937& rng, Noise& noise) {
  const TriggerRules rules = AllRules(options);
  for (int j = 0; j < options.noise_jobs; ++j) {
    JobSpec spec = RandomJob(options, rng);
    // Half of the jobs at the extremes, where the noise is worst: 64 pods, 6% jitter.
    if (j % 2 == 0) {
      spec.pods = 64;
      spec.jitter = options.jitter_max;
    }
    SimulatedClock clock;
    SimulatedJob job(spec, &clock);
    for (int s = 0; s < options.noise_steps; ++s) {
      job.Step();
      noise.Count(EvaluateTriggerRules(rules, job.pods(), clock.WallNs()));
    }
  }
}

void PrintCatches(const char* what, const Catches& catches, int window) {
  std::vector<int> latency = catches.latency;
  std::sort(latency.begin(), latency.end());
  const auto at = [&](double q) {
    return latency.empty() ? 0 : latency[static_cast<size_t>(q * (latency.size() - 1))];
  };
  std::printf(
      "%s: %d of %d caught within %d steps (%.2f%%); steps after onset p50 %d, p99 %d, "
      "max %d",
      what, catches.caught, catches.injected, window,
      100.0 * catches.caught / std::max(1, catches.injected), at(0.5), at(0.99),
      latency.empty() ? 0 : latency.back());
  if (catches.wrong_pod > 0) std::printf("; %d firing(s) naming another pod", catches.wrong_pod);
  if (catches.caught < catches.injected) {
    std::printf("; missed +%.1f%% (at %.1f%% jitter) to +%.1f%%", 100 * catches.smallest_missed,
                100 * catches.missed_jitter, 100 * catches.largest_missed);
  }
  std::printf("\n");
}

// CPU time per evaluation of all three rules, over pods x ~1,024 steps.
void MeasureCost(const Options& options, int pods, bool one_pod_silent) {
  JobSpec spec;
  spec.pods = pods;
  spec.jitter = 0.04;
  spec.max_clock_offset_ns = 2 * kNanosPerSecond;
  SimulatedClock clock;
  SimulatedJob job(spec, &clock);
  for (int s = 0; s < kMaxTriggerSteps; ++s) {
    // A pod whose telemetry stopped 100 steps ago: no recent step is on every pod, so the
    // straggler rule reads every pod's whole history looking for its window.
    if (one_pod_silent && s == kMaxTriggerSteps - 100) job.SetSilent(0, true);
    job.Step();
  }
  const TriggerRules rules = AllRules(options);
  size_t sink = 0;
  const int64_t start = ThreadCpuNs();
  for (int i = 0; i < options.cost_iterations; ++i) {
    sink += EvaluateTriggerRules(rules, job.pods(), clock.WallNs()).notes.size();
  }
  const double per = static_cast<double>(ThreadCpuNs() - start) / options.cost_iterations;
  size_t steps = 0;
  for (const PodSteps& pod : job.pods()) steps += pod.steps.size();
  std::printf("cost: %d pods, %zu steps in all%s: %.1f us CPU per evaluation (%zu)\n", pods, steps,
              one_pod_silent ? ", one pod silent for the last 100 (worst case)" : "", per / 1e3,
              sink % 2);
}

}  // namespace
}  // namespace clusterprof::analysis

int main(int argc, char** argv) {
  using namespace clusterprof::analysis;
  Options options;
  bool quick = false;
  CLI::App app{"Accuracy and cost of the ProfileTrigger rules on simulated jobs"};
  app.add_flag("--quick", quick, "a short functional run (ctest)");
  app.add_option("--regressions", options.regressions, "regressions injected");
  app.add_option("--stragglers", options.stragglers, "stragglers injected");
  app.add_option("--noise-jobs", options.noise_jobs, "noise-only jobs");
  app.add_option("--noise-steps", options.noise_steps, "steps per noise-only job");
  app.add_option("--regression-percent", options.regression_percent, "stepTimeRegression.percent");
  app.add_option("--regression-steps", options.regression_steps, "stepTimeRegression.steps");
  app.add_option("--regression-min", options.regression_min, "smallest regression (0.2: +20%)");
  app.add_option("--regression-max", options.regression_max, "largest regression");
  app.add_option("--straggler-steps", options.straggler_steps, "straggler.steps");
  app.add_option("--straggler-min", options.straggler_min, "smallest extra compute (0.15: +15%)");
  app.add_option("--straggler-max", options.straggler_max, "largest extra compute");
  app.add_option("--jitter-min", options.jitter_min, "smallest per-pod compute jitter");
  app.add_option("--jitter-max", options.jitter_max, "largest per-pod compute jitter");
  app.add_option("--min-catch", options.min_catch, "the catch rate below which it fails");
  app.add_option("--seed", options.seed, "random seed");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    options.regressions = 20;
    options.stragglers = 20;
    options.noise_jobs = 2;
    options.noise_steps = 300;
    options.cost_iterations = 20;
    options.min_catch = 0.9;
  }
  std::mt19937 rng(options.seed);
  Noise noise;
  Catches regressions, stragglers;
  RunRegressions(options, rng, regressions, noise);
  RunStragglers(options, rng, stragglers, noise);
  Noise noise_only;
  RunNoise(options, rng, noise_only);
  std::printf(
      "rules: stepTimeRegression {percent: %g, steps: %d}, straggler {steps: %d}, stepStall "
      "{seconds: 120}; jitter %.0f-%.0f%%\n",
      options.regression_percent, options.regression_steps, options.straggler_steps,
      100 * options.jitter_min, 100 * options.jitter_max);
  PrintCatches("regressions", regressions, options.regression_steps);
  PrintCatches("stragglers", stragglers, options.straggler_steps);
  for (const auto& [what, n] : {std::pair{"noise-only jobs", &noise_only},
                                std::pair{"healthy steps before injections", &noise}}) {
    std::printf(
        "%s: %lld firings in %lld evaluations (regression %lld, straggler %lld, stall %lld)\n",
        what, static_cast<long long>(n->firings), static_cast<long long>(n->steps),
        static_cast<long long>(n->by_rule[0]), static_cast<long long>(n->by_rule[1]),
        static_cast<long long>(n->by_rule[2]));
  }
  for (int pods : {8, 64}) MeasureCost(options, pods, false);
  MeasureCost(options, 64, true);
  const bool ok = regressions.caught >= options.min_catch * regressions.injected &&
                  stragglers.caught >= options.min_catch * stragglers.injected &&
                  stragglers.wrong_pod == 0 && noise.firings == 0 && noise_only.firings == 0;
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
