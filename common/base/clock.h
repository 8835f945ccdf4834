// Injectable time source. Only RealClock (and main()) read the system clocks; everything else
// takes a Clock so tests can drive time with SimulatedClock instead of sleeping.
#ifndef CLUSTERPROF_COMMON_BASE_CLOCK_H_
#define CLUSTERPROF_COMMON_BASE_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "common/base/mutex.h"

namespace clusterprof {

inline constexpr int64_t kNanosPerMicro = 1'000;
inline constexpr int64_t kNanosPerMilli = 1'000'000;
inline constexpr int64_t kNanosPerSecond = 1'000'000'000;

// A wall clock (ns since the Unix epoch, can step) and a monotonic clock (ns, arbitrary origin,
// never steps). Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;

  virtual int64_t WallNs() const = 0;
  virtual int64_t MonotonicNs() const = 0;

  // Blocks until MonotonicNs() >= deadline_ns.
  virtual void SleepUntilMonotonicNs(int64_t deadline_ns) = 0;

  // Blocks until WallNs() >= deadline_ns, as precisely as the implementation can (the real clock
  // sleeps to shortly before the instant, then spins). Returns at once for a past instant.
  virtual void SleepUntilWallNs(int64_t deadline_ns) = 0;

  // As SleepUntilWallNs, but returns early once `stop` is true; whoever sets `stop` then calls
  // Wake(). Returns true when the deadline was reached, false when stopped first.
  virtual bool SleepUntilWallNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop) = 0;
  // As SleepUntilMonotonicNs, but returns early once `stop` is true; whoever sets `stop` then
  // calls Wake(). Returns true when the deadline was reached, false when stopped first. Threads
  // that wait for "a deadline or news" (timers, queues, retry loops) use this.
  virtual bool SleepUntilMonotonicNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop) = 0;
  // Makes every SleepUntil*Unless re-check its stop flag.
  virtual void Wake() = 0;

  void SleepForNs(int64_t duration_ns) { SleepUntilMonotonicNs(MonotonicNs() + duration_ns); }
};

// The system clocks: CLOCK_REALTIME and CLOCK_MONOTONIC. Thread-safe.
class RealClock final : public Clock {
 public:
  // Wall-clock deadlines are met in three steps: a condition-variable wait (which Wake() ends)
  // until kFinalSleepNs before the instant; then clock_nanosleep on CLOCK_REALTIME, with the
  // thread's timer slack at 1 ns, until kSpinWindowNs before it; then a spin on the clock. The
  // spin is short on purpose: many sidecars on one machine must not starve each other of CPU
  // right at the start instant (a long spin costs more precision than it buys).
  static constexpr int64_t kFinalSleepNs = 2 * kNanosPerMilli;
  static constexpr int64_t kSpinWindowNs = 0;

  int64_t WallNs() const override;
  int64_t MonotonicNs() const override;
  void SleepUntilMonotonicNs(int64_t deadline_ns) override;
  void SleepUntilWallNs(int64_t deadline_ns) override;
  bool SleepUntilWallNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop) override;
  bool SleepUntilMonotonicNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop) override;
  void Wake() override;

 private:
  Mutex wake_mu_;
  uint64_t wakes_ ABSL_GUARDED_BY(wake_mu_) = 0;
};

// One RealClock for the process: the default of options whose Clock is left null. main() and
// tests pass their own.
Clock& SystemClock();

// A clock that moves only when told to. Sleepers block until another thread advances the clock
// past their deadline; tests use WaitForSleepers() to know a thread reached its sleep before
// advancing, so no test depends on timing luck. Thread-safe.
class SimulatedClock final : public Clock {
 public:
  // 2026-01-01T00:00:00Z, a recognisable instant for test output.
  static constexpr int64_t kDefaultWallNs = 1'767'225'600LL * kNanosPerSecond;

  explicit SimulatedClock(int64_t wall_ns = kDefaultWallNs, int64_t monotonic_ns = 0);

  int64_t WallNs() const override;
  int64_t MonotonicNs() const override;
  void SleepUntilMonotonicNs(int64_t deadline_ns) override;
  void SleepUntilWallNs(int64_t deadline_ns) override;
  bool SleepUntilWallNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop) override;
  bool SleepUntilMonotonicNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop) override;
  void Wake() override;

  // Moves both clocks forward by `delta_ns` (>= 0) and wakes the sleepers whose time has come.
  void AdvanceNs(int64_t delta_ns);
  // Steps the wall clock only, as an NTP step would; the monotonic clock is unaffected.
  void StepWallNs(int64_t delta_ns);
  // Blocks until at least `count` threads are sleeping on this clock.
  void WaitForSleepers(int count);
  int sleepers() const;

 private:
  mutable Mutex mu_;
  int64_t wall_ns_ ABSL_GUARDED_BY(mu_);
  int64_t monotonic_ns_ ABSL_GUARDED_BY(mu_);
  int sleepers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_BASE_CLOCK_H_
