#include "common/base/clock.h"

#include <sched.h>
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
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

namespace {

// A hint to the CPU that this is a spin-wait loop (it saves power and lets a sibling hyperthread
// run).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Runs the calling thread under SCHED_FIFO priority 1 while it lives (when asked, permitted, and
// the thread is not real-time already), then puts its policy and priority back. Reset on fork:
// threads the thread creates meanwhile get the normal class.
class ScopedRealtimeThread {
 public:
  explicit ScopedRealtimeThread(bool wanted) {
    if (!wanted) return;
    policy_ = sched_getscheduler(0);
    if (policy_ < 0 || sched_getparam(0, &param_) != 0) return;
    const int base_policy = policy_ & ~SCHED_RESET_ON_FORK;
    if (base_policy == SCHED_FIFO || base_policy == SCHED_RR) return;
    sched_param fifo{};
    fifo.sched_priority = 1;
    raised_ = sched_setscheduler(0, SCHED_FIFO | SCHED_RESET_ON_FORK, &fifo) == 0;
    if (!raised_) error_ = errno;
  }
  ~ScopedRealtimeThread() {
    if (raised_) sched_setscheduler(0, policy_, &param_);
  }
  ScopedRealtimeThread(const ScopedRealtimeThread&) = delete;
  ScopedRealtimeThread& operator=(const ScopedRealtimeThread&) = delete;

  bool raised() const { return raised_; }
  int error() const { return error_; }

 private:
  int policy_ = -1;
  sched_param param_{};
  bool raised_ = false;
  int error_ = 0;
};

}  // namespace

bool Clock::RunAtWallNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop,
                              absl::FunctionRef<void(int64_t now_ns)> at_instant) {
  const std::optional<int64_t> now = WaitForWallInstant(*this, deadline_ns, stop, 0);
  if (!now.has_value()) return false;
  at_instant(*now);
  return true;
}

std::optional<int64_t> WaitForWallInstant(Clock& clock, int64_t deadline_ns,
                                          const std::atomic<bool>& stop, int64_t spin_ns) {
  spin_ns = std::max<int64_t>(spin_ns, 0);
  while (true) {
    if (!clock.SleepUntilWallNsUnless(deadline_ns - spin_ns, stop)) return std::nullopt;
    int64_t now = clock.WallNs();
    while (now < deadline_ns && deadline_ns - now <= spin_ns) {
      if (stop.load(std::memory_order_acquire)) return std::nullopt;
      CpuRelax();
      now = clock.WallNs();
    }
    if (now >= deadline_ns) return now;
    // The wall clock was stepped back by more than the spin: sleep again.
  }
}

absl::Status RealClock::CheckRealtimePermitted() {
  const int policy = sched_getscheduler(0) & ~SCHED_RESET_ON_FORK;
  if (policy == SCHED_FIFO || policy == SCHED_RR) return absl::OkStatus();
  ScopedRealtimeThread probe(true);
  if (probe.raised()) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "SCHED_FIFO is not permitted (", std::strerror(probe.error()),
      "): it needs CAP_SYS_NICE or an RLIMIT_RTPRIO of at least 1, and under cgroup v1 with "
      "real-time group scheduling a cpu.rt_runtime_us budget for this cgroup"));
}

bool RealClock::RunAtWallNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop,
                                  absl::FunctionRef<void(int64_t now_ns)> at_instant) {
  // Raised for the whole wait: a thread of the normal class may wake tens of ms late on busy
  // CPUs, so raising it only shortly before the instant would itself be late. Asleep, a
  // real-time thread costs nothing; it runs only for the wait's slices and the bounded spin.
  ScopedRealtimeThread realtime(start_options_.realtime);
  const std::optional<int64_t> now =
      WaitForWallInstant(*this, deadline_ns, stop, start_options_.spin_ns);
  if (!now.has_value()) return false;
  // Still raised: the start and what follows it (starting the tracers) run before any thread of
  // the normal class can take the CPU back.
  at_instant(*now);
  return true;
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
