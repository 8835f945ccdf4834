// Injectable time source. Only RealClock (and main()) read the system clocks; everything else
// takes a Clock so tests can drive time with SimulatedClock instead of sleeping.
#ifndef CLUSTERPROF_COMMON_BASE_CLOCK_H_
#define CLUSTERPROF_COMMON_BASE_CLOCK_H_

#include <atomic>
#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
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

  // For work that must begin at a wall-clock instant (a capture's start): waits as
  // SleepUntilWallNsUnless does, then calls `at_instant(now_ns)` with the first WallNs() reading
  // at or after `deadline_ns`, so whatever takes that reading as its start is never early (a
  // wall clock stepped back during the wait sends it back to sleep). Returns false, without
  // calling `at_instant`, when `stop` came first. RealClock can spin the last stretch and raise
  // the thread's priority until `at_instant` returns (RealClock::StartOptions); this default
  // does neither.
  virtual bool RunAtWallNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop,
                                 absl::FunctionRef<void(int64_t now_ns)> at_instant);

  void SleepForNs(int64_t duration_ns) { SleepUntilMonotonicNs(MonotonicNs() + duration_ns); }
};

// Waits on `clock` until WallNs() >= deadline_ns: sleeps (SleepUntilWallNsUnless) until
// `spin_ns` before it, then re-reads the clock in a loop, so a thread that is already on a CPU at
// the instant needs no wake-up. Returns that first reading at or after the deadline (never
// earlier), or nullopt once `stop` is seen. A wall clock stepped back while spinning (further
// than spin_ns from the deadline) sends it back to sleep instead of spinning on.
std::optional<int64_t> WaitForWallInstant(Clock& clock, int64_t deadline_ns,
                                          const std::atomic<bool>& stop, int64_t spin_ns);

// The system clocks: CLOCK_REALTIME and CLOCK_MONOTONIC. Thread-safe.
class RealClock final : public Clock {
 public:
  // How RunAtWallNsUnless meets a start instant on a busy machine. With every CPU taken by
  // workloads at normal priority, a thread of the normal class that wakes at the instant waits
  // for the scheduler's next tick (up to 4 ms at HZ=250, more behind several busy threads)
  // before it runs; a SCHED_FIFO thread runs at once (bench/RESULTS.md, "start instant under
  // load").
  struct StartOptions {
    // Spin on the clock for this long before the instant instead of sleeping to it; 0: sleep
    // to the instant itself. Costs up to this much CPU per start.
    int64_t spin_ns = 0;
    // Run the waiting thread under SCHED_FIFO (priority 1, reset on fork) from the start of the
    // wait until `at_instant` returns, when the process may (CheckRealtimePermitted); otherwise,
    // or when the raise fails, it waits in its own class.
    bool realtime = false;
  };

  RealClock() = default;
  explicit RealClock(StartOptions start_options) : start_options_(start_options) {}

  // Whether this process may raise a thread to SCHED_FIFO: tries it on the calling thread and
  // puts the thread back. An error names the errno and what would allow it (CAP_SYS_NICE or
  // RLIMIT_RTPRIO; with cgroup v1 RT group scheduling also a cpu.rt_runtime_us budget for the
  // process's cgroup).
  static absl::Status CheckRealtimePermitted();

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
  bool RunAtWallNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop,
                         absl::FunctionRef<void(int64_t now_ns)> at_instant) override;

 private:
  const StartOptions start_options_{};
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
