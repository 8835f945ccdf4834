// Live step telemetry (docs/triggers.md): the pod's recent steps, known without a capture. The
// annotation tracer's drainer hands it every record it drains from the workloads' rings; it picks
// out the step markers (events with a step_num stat, as the digest does, or events named like a
// step pattern) and the collectives inside them, and keeps the last `max_steps` steps of the pod:
// step number, start and end (wall clock) and when the first collective began. Steps of several
// processes (ranks) with one number are one step of the pod, from the earliest start to the
// latest end, as in the digest.
//
// Thread-safe: the drainer writes, the gRPC stream, /metrics and tests read.
#ifndef CLUSTERPROF_SIDECAR_TRACERS_STEP_TELEMETRY_H_
#define CLUSTERPROF_SIDECAR_TRACERS_STEP_TELEMETRY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/mutex.h"
#include "sdk/shm_format.h"

namespace clusterprof::shm {
class RingReader;
}  // namespace clusterprof::shm

namespace clusterprof::sidecar {

struct LiveStep {
  int64_t step = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  // The first collective that starts inside the step; 0 when none was seen.
  int64_t collective_entry_ns = 0;

  int64_t duration_ns() const { return end_ns - start_ns; }
};

class StepTelemetry {
 public:
  struct Options {
    // Empty: step markers are events with a step_num stat. Otherwise a regular expression
    // (ECMAScript, case-insensitive) on event names, as the digest's step pattern.
    std::string step_pattern;
    // Collectives, as the digest's collective pattern; empty: the digest's default.
    std::string collective_pattern;
    // Steps kept.
    size_t max_steps = 1024;
  };

  // What one ring's names are, decided once per string id. Owned by whoever owns the ring (the
  // annotation tracer keeps one beside each ring reader).
  class RingNames {
   public:
    enum Kind : uint8_t { kUnknown = 0, kOther, kStep, kCollective };
    struct Entry {
      Kind kind = kUnknown;
      bool has_step_number = false;
      int64_t step_number = 0;
    };

   private:
    friend class StepTelemetry;
    std::unordered_map<uint32_t, Entry> names;
    std::unordered_map<uint32_t, bool> step_keys;  // key ids: is it "step_num"?
   public:
    // Whether this process has shown a step marker.
    bool saw_step = false;
  };

  // A copy of the telemetry at one instant.
  struct Snapshot {
    // Bumped whenever a step is added or updated.
    uint64_t sequence = 0;
    // The last steps, ascending by number.
    std::vector<LiveStep> steps;
    uint64_t steps_total = 0;
    // Wall clock ns when the last step marker was seen to end; 0 before the first.
    int64_t last_step_end_ns = 0;
    // Processes whose rings were drained, and how many of them showed a step marker.
    int processes = 0;
    int processes_with_steps = 0;
    // "events with a step_num stat" or the pattern.
    std::string step_source;
  };

  // INVALID_ARGUMENT naming the pattern that is not a regular expression.
  static absl::StatusOr<std::unique_ptr<StepTelemetry>> Create(Options options);

  // --- the drainer's side (one thread) ---
  // Records drained from one process's ring (any thread of it).
  void Observe(RingNames& names, const shm::RingReader& reader,
               std::span<const shm::Record> records);
  // Ends one drain of every ring: matches the steps seen to the collectives inside them and
  // publishes them. `processes` is how many rings are open, `processes_with_steps` how many of
  // them have shown a step marker (RingNames::saw_step).
  void EndDrain(int processes, int processes_with_steps);

  // --- readers ---
  // Steps after `after_step` only (-1: all kept), at most `max_steps` of the latest.
  Snapshot Get(int64_t after_step = -1, size_t max_steps = SIZE_MAX) const;
  // Waits until the sequence passes `sequence` or `timeout` elapses; returns the sequence now.
  uint64_t WaitForChange(uint64_t sequence, absl::Duration timeout) const;
  // Called (from the drainer, without the lock) for each step as it is first published: the
  // metrics observe durations this way. Set before the drainer starts.
  void SetStepObserver(std::function<void(const LiveStep&)> observer) {
    observer_ = std::move(observer);
  }

  const std::string& step_source() const { return step_source_; }

 private:
  StepTelemetry(Options options, std::optional<std::regex> step_re, std::regex collective_re,
                std::string step_source);
  const RingNames::Entry& Classify(RingNames& names, const shm::RingReader& reader, uint32_t id);
  bool HasStepArg(RingNames& names, const shm::RingReader& reader, const shm::Record& record,
                  int64_t* step);

  const Options options_;
  const std::optional<std::regex> step_re_;
  const std::regex collective_re_;
  const std::string step_source_;
  std::function<void(const LiveStep&)> observer_;

  // The drainer's own state between EndDrain calls.
  std::vector<LiveStep> pending_;  // step markers seen in this drain
  // Starts of collectives seen recently (ascending by start after sorting), pruned to the span
  // of the steps still open.
  std::vector<int64_t> collective_starts_;
  // Markers matched by a step pattern that carry no step_num are numbered in order.
  int64_t unnumbered_steps_ = 0;

  mutable Mutex mu_;
  std::deque<LiveStep> steps_ ABSL_GUARDED_BY(mu_);  // ascending by number
  uint64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t steps_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_step_end_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int processes_ ABSL_GUARDED_BY(mu_) = 0;
  int processes_with_steps_count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_TRACERS_STEP_TELEMETRY_H_
