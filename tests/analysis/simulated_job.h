// A synchronized training job's live step telemetry, simulated, for the trigger rules' tests and
// accuracy benchmark. Every pod starts a step when the previous one ends, computes (its own
// jitter), and enters the step's collective; the collective ends for everyone a collective time
// after the last pod entered, and that ends the step on every pod (plus a few microseconds of
// skew). Each pod's times are on its own clock (its offset from the reference clock, measured with
// a small error the rules do not know about). Pods keep their last kMaxTriggerSteps steps, as the
// operator does (dropping the oldest kDropSteps at a time, so a pod has between
// kMaxTriggerSteps - kDropSteps and kMaxTriggerSteps).
#ifndef CLUSTERPROF_TESTS_ANALYSIS_SIMULATED_JOB_H_
#define CLUSTERPROF_TESTS_ANALYSIS_SIMULATED_JOB_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "analysis/trigger_rules.h"
#include "common/base/clock.h"
#include "common/base/strings.h"

namespace clusterprof::analysis::testing {

struct JobSpec {
  int pods = 8;
  // The step's nominal time: compute before the collective, then the collective.
  int64_t step_ns = 100 * kNanosPerMilli;
  double compute_fraction = 0.8;
  // Per pod and step, compute and collective times vary by a normal factor of this deviation.
  double jitter = 0.04;
  // Pods' clocks, drawn uniformly within +-max_clock_offset_ns of the reference clock and
  // reported with an error within +-offset_error_ns.
  int64_t max_clock_offset_ns = 0;
  int64_t offset_error_ns = 0;
  int64_t first_step = 0;
  uint32_t seed = 1;
};

class SimulatedJob {
 public:
  static constexpr int kDropSteps = 32;

  // `clock` (reference time) is advanced to the end of each step; it must outlive the job.
  SimulatedJob(const JobSpec& spec, SimulatedClock* clock)
      : spec_(spec),
        clock_(clock),
        rng_(spec.seed),
        compute_scale_(static_cast<size_t>(spec.pods), 1.0),
        true_offset_ns_(static_cast<size_t>(spec.pods), 0),
        next_step_(spec.first_step) {
    std::uniform_int_distribution<int64_t> offset(-spec.max_clock_offset_ns,
                                                  spec.max_clock_offset_ns);
    std::uniform_int_distribution<int64_t> error(-spec.offset_error_ns, spec.offset_error_ns);
    for (int p = 0; p < spec.pods; ++p) {
      PodSteps& pod = pods_.emplace_back();
      pod.pod = StrCat("pod-", p);
      true_offset_ns_[static_cast<size_t>(p)] = offset(rng_);
      pod.clock_offset_ns = true_offset_ns_[static_cast<size_t>(p)] + error(rng_);
    }
  }

  // From the next step on: pod `pod`'s compute takes `scale` times as long (a straggler).
  void SetComputeScale(int pod, double scale) { compute_scale_[static_cast<size_t>(pod)] = scale; }
  // From the next step on: every step takes `scale` times as long (a regression).
  void SetStepScale(double scale) { step_scale_ = scale; }
  // Pods whose steps are not recorded (they run, but report nothing).
  void SetSilent(int pod, bool silent) {
    if (silent_.empty()) silent_.assign(static_cast<size_t>(spec_.pods), false);
    silent_[static_cast<size_t>(pod)] = silent;
  }

  // Runs one step on every pod; returns its number.
  int64_t Step() {
    std::normal_distribution<double> noise(1.0, spec_.jitter);
    const double compute_ns =
        static_cast<double>(spec_.step_ns) * spec_.compute_fraction * step_scale_;
    const double collective_ns =
        static_cast<double>(spec_.step_ns) * (1 - spec_.compute_fraction) * step_scale_;
    const int64_t start = clock_->WallNs();
    entries_.resize(pods_.size());
    int64_t last_entry = start;
    for (size_t p = 0; p < pods_.size(); ++p) {
      const double factor = std::max(0.1, noise(rng_));
      entries_[p] = start + static_cast<int64_t>(compute_ns * compute_scale_[p] * factor);
      last_entry = std::max(last_entry, entries_[p]);
    }
    const int64_t end =
        last_entry + static_cast<int64_t>(collective_ns * std::max(0.1, noise(rng_)));
    std::uniform_int_distribution<int64_t> skew(0, 20 * kNanosPerMicro);
    for (size_t p = 0; p < pods_.size(); ++p) {
      if (!silent_.empty() && silent_[p]) continue;
      std::vector<StepDigest>& steps = pods_[p].steps;
      if (steps.size() == static_cast<size_t>(kMaxTriggerSteps)) {
        steps.erase(steps.begin(), steps.begin() + kDropSteps);
      }
      StepDigest& s = steps.emplace_back();
      const int64_t offset = true_offset_ns_[p];
      s.step = next_step_;
      s.start_ns = start + offset + skew(rng_);
      s.collective_entry_ns = entries_[p] + offset;
      s.end_ns = end + offset + skew(rng_);
    }
    clock_->AdvanceNs(end + 20 * kNanosPerMicro - start);
    return next_step_++;
  }

  const std::vector<PodSteps>& pods() const { return pods_; }
  std::vector<PodSteps>& mutable_pods() { return pods_; }

 private:
  JobSpec spec_;
  SimulatedClock* clock_;
  std::mt19937 rng_;
  std::vector<PodSteps> pods_;
  std::vector<double> compute_scale_;
  std::vector<int64_t> true_offset_ns_;
  std::vector<bool> silent_;
  std::vector<int64_t> entries_;
  double step_scale_ = 1.0;
  int64_t next_step_;
};

}  // namespace clusterprof::analysis::testing

#endif  // CLUSTERPROF_TESTS_ANALYSIS_SIMULATED_JOB_H_
