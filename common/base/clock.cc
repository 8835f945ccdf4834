#include "common/base/clock.h"

#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "common/base/check.h"

namespace clusterprof {
namespace {

int64_t ReadClock(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return static_cast<int64_t>(ts.tv_sec) * kNanosPerSecond + ts.tv_nsec;
}

timespec ToTimespec(int64_t ns) {
  timespec ts;
  ts.tv_sec = ns / kNanosPerSecond;
  ts.tv_nsec = ns % kNanosPerSecond;
  return ts;
}

}  // namespace

int64_t RealClock::WallNs() const { return ReadClock(CLOCK_REALTIME); }

int64_t RealClock::MonotonicNs() const { return ReadClock(CLOCK_MONOTONIC); }

void RealClock::SleepUntilMonotonicNs(int64_t deadline_ns) {
  const timespec ts = ToTimespec(deadline_ns);
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

namespace {

// The last stretch before a wall-clock instant: an absolute sleep on CLOCK_REALTIME (a clock step
// during it is honoured by the kernel) to shortly before the instant, then a spin.
void SleepPreciselyUntilWallNs(int64_t deadline_ns) {
  // The default 50 us of timer slack would be most of the error budget.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  const timespec ts = ToTimespec(deadline_ns - RealClock::kSpinWindowNs);
  while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
  while (ReadClock(CLOCK_REALTIME) < deadline_ns) {
  }
}

}  // namespace

void RealClock::SleepUntilWallNs(int64_t deadline_ns) { SleepPreciselyUntilWallNs(deadline_ns); }

bool RealClock::SleepUntilWallNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop) {
  // Wait on a condition variable in slices, so a wall-clock step is noticed within a slice and
  // Wake() ends the wait at once; only the last kFinalSleepNs cannot be interrupted.
  constexpr int64_t kSliceNs = 100 * kNanosPerMilli;
  while (true) {
    if (stop.load(std::memory_order_acquire)) return false;
    const int64_t remaining = deadline_ns - WallNs();
    if (remaining <= 0) return true;
    if (remaining <= kFinalSleepNs) {
      SleepPreciselyUntilWallNs(deadline_ns);
      return true;
    }
    const int64_t wait_ns = std::min(remaining - kFinalSleepNs, kSliceNs);
    MutexLock lock(&wake_mu_);
    const uint64_t wakes = wakes_;
    wake_mu_.AwaitWithDeadline(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return wakes_ != wakes || stop.load(std::memory_order_acquire);
        },
        std::chrono::steady_clock::now() + std::chrono::nanoseconds(wait_ns));
  }
}

bool RealClock::SleepUntilMonotonicNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop) {
  // std::chrono::steady_clock is CLOCK_MONOTONIC, the clock MonotonicNs() reads.
  const auto deadline =
      std::chrono::steady_clock::time_point(std::chrono::nanoseconds(deadline_ns));
  MutexLock lock(&wake_mu_);
  while (true) {
    if (stop.load(std::memory_order_acquire)) return false;
    if (MonotonicNs() >= deadline_ns) return true;
    // A Wake() for someone else's flag ends this wait too; the loop goes back to sleep.
    const uint64_t wakes = wakes_;
    wake_mu_.AwaitWithDeadline(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return wakes_ != wakes || stop.load(std::memory_order_acquire);
        },
        deadline);
  }
}

void RealClock::Wake() {
  MutexLock lock(&wake_mu_);
  ++wakes_;
}

SimulatedClock::SimulatedClock(int64_t wall_ns, int64_t monotonic_ns)
    : wall_ns_(wall_ns), monotonic_ns_(monotonic_ns) {}

int64_t SimulatedClock::WallNs() const {
  MutexLock lock(&mu_);
  return wall_ns_;
}

int64_t SimulatedClock::MonotonicNs() const {
  MutexLock lock(&mu_);
  return monotonic_ns_;
}

void SimulatedClock::SleepUntilMonotonicNs(int64_t deadline_ns) {
  MutexLock lock(&mu_);
  ++sleepers_;
  auto reached = [this, deadline_ns]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return monotonic_ns_ >= deadline_ns; };
  mu_.Await(reached);
  --sleepers_;
}

void SimulatedClock::SleepUntilWallNs(int64_t deadline_ns) {
  MutexLock lock(&mu_);
  ++sleepers_;
  auto reached = [this, deadline_ns]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wall_ns_ >= deadline_ns; };
  mu_.Await(reached);
  --sleepers_;
}

bool SimulatedClock::SleepUntilWallNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop) {
  MutexLock lock(&mu_);
  ++sleepers_;
  auto done = [this, deadline_ns, &stop]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return wall_ns_ >= deadline_ns || stop.load(std::memory_order_acquire);
  };
  mu_.Await(done);
  --sleepers_;
  return wall_ns_ >= deadline_ns;
}

bool SimulatedClock::SleepUntilMonotonicNsUnless(int64_t deadline_ns,
                                                 const std::atomic<bool>& stop) {
  MutexLock lock(&mu_);
  ++sleepers_;
  auto done = [this, deadline_ns, &stop]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return monotonic_ns_ >= deadline_ns || stop.load(std::memory_order_acquire);
  };
  mu_.Await(done);
  --sleepers_;
  return monotonic_ns_ >= deadline_ns;
}

void SimulatedClock::Wake() {
  // Releasing the mutex wakes the sleepers, which re-check their stop flags.
  MutexLock lock(&mu_);
}

void SimulatedClock::AdvanceNs(int64_t delta_ns) {
  CLUSTERPROF_CHECK(delta_ns >= 0) << "a simulated clock only moves forward";
  MutexLock lock(&mu_);
  wall_ns_ += delta_ns;
  monotonic_ns_ += delta_ns;
}

void SimulatedClock::StepWallNs(int64_t delta_ns) {
  MutexLock lock(&mu_);
  wall_ns_ += delta_ns;
}

void SimulatedClock::WaitForSleepers(int count) {
  MutexLock lock(&mu_);
  auto enough = [this, count]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return sleepers_ >= count; };
  mu_.Await(enough);
}

int SimulatedClock::sleepers() const {
  MutexLock lock(&mu_);
  return sleepers_;
}

Clock& SystemClock() {
  static RealClock* const clock = new RealClock();  // never destroyed: used until exit
  return *clock;
}

}  // namespace clusterprof
