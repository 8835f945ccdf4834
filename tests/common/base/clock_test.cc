#include "common/base/clock.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace clusterprof {
namespace {

TEST(RealClockTest, ClocksMoveForwardAndWallIsEpochScale) {
  RealClock clock;
  const int64_t m0 = clock.MonotonicNs();
  const int64_t w0 = clock.WallNs();
  EXPECT_GT(w0, 1'600'000'000LL * kNanosPerSecond);  // after 2020
  clock.SleepForNs(1'000'000);
  EXPECT_GE(clock.MonotonicNs() - m0, 1'000'000);
}

TEST(RealClockTest, SleepUntilWallReachesTheInstant) {
  RealClock clock;
  const int64_t target = clock.WallNs() + 2 * kNanosPerMilli;
  clock.SleepUntilWallNs(target);
  EXPECT_GE(clock.WallNs(), target);
  // A past instant returns at once.
  clock.SleepUntilWallNs(target - kNanosPerSecond);
}

TEST(SimulatedClockTest, AdvanceAndStep) {
  SimulatedClock clock(1000, 5);
  EXPECT_EQ(clock.WallNs(), 1000);
  EXPECT_EQ(clock.MonotonicNs(), 5);
  clock.AdvanceNs(10);
  EXPECT_EQ(clock.WallNs(), 1010);
  EXPECT_EQ(clock.MonotonicNs(), 15);
  clock.StepWallNs(-500);
  EXPECT_EQ(clock.WallNs(), 510);
  EXPECT_EQ(clock.MonotonicNs(), 15);
}

TEST(SimulatedClockTest, SleepersWakeOnlyWhenTheirTimeComes) {
  SimulatedClock clock(0, 0);
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepUntilMonotonicNs(100);
    woke = true;
  });
  clock.WaitForSleepers(1);
  clock.AdvanceNs(99);
  // The sleeper cannot have woken: its deadline is not reached. (If it had, it would have
  // stopped sleeping and the count would drop.)
  EXPECT_EQ(clock.sleepers(), 1);
  EXPECT_FALSE(woke);
  clock.AdvanceNs(1);
  sleeper.join();
  EXPECT_TRUE(woke);
  EXPECT_EQ(clock.sleepers(), 0);
}

TEST(SimulatedClockTest, WallSleeperWakesOnWallStep) {
  SimulatedClock clock(0, 0);
  std::thread sleeper([&] { clock.SleepUntilWallNs(1000); });
  clock.WaitForSleepers(1);
  clock.StepWallNs(1000);
  sleeper.join();
  EXPECT_EQ(clock.MonotonicNs(), 0);
}

TEST(SimulatedClockTest, PastDeadlineReturnsAtOnce) {
  SimulatedClock clock(100, 100);
  clock.SleepUntilMonotonicNs(50);
  clock.SleepUntilWallNs(50);
  clock.SleepForNs(0);
}

TEST(RealClockTest, MonotonicSleepUnlessReachesTheDeadline) {
  RealClock clock;
  std::atomic<bool> stop{false};
  const int64_t deadline = clock.MonotonicNs() + 2 * kNanosPerMilli;
  EXPECT_TRUE(clock.SleepUntilMonotonicNsUnless(deadline, stop));
  EXPECT_GE(clock.MonotonicNs(), deadline);
}

TEST(RealClockTest, MonotonicSleepUnlessEndsWhenStopped) {
  RealClock clock;
  std::atomic<bool> stop{false};
  std::atomic<bool> other{false};
  std::thread sleeper([&] {
    // An hour away: only the stop flag can end this.
    EXPECT_FALSE(
        clock.SleepUntilMonotonicNsUnless(clock.MonotonicNs() + 3600 * kNanosPerSecond, stop));
  });
  // A wake for another flag leaves the sleeper asleep; its own flag ends the sleep.
  other = true;
  clock.Wake();
  stop = true;
  clock.Wake();
  sleeper.join();
}

TEST(SimulatedClockTest, MonotonicSleepUnlessWakesOnAdvanceOrStop) {
  SimulatedClock clock;
  std::atomic<bool> stop{false};
  bool reached = false;
  std::thread sleeper(
      [&] { reached = clock.SleepUntilMonotonicNsUnless(clock.MonotonicNs() + 100, stop); });
  clock.WaitForSleepers(1);
  clock.AdvanceNs(99);
  EXPECT_EQ(clock.sleepers(), 1);
  clock.AdvanceNs(1);
  sleeper.join();
  EXPECT_TRUE(reached);

  std::thread stopped(
      [&] { reached = clock.SleepUntilMonotonicNsUnless(clock.MonotonicNs() + 100, stop); });
  clock.WaitForSleepers(1);
  stop = true;
  clock.Wake();
  stopped.join();
  EXPECT_FALSE(reached);
}

// A single-threaded clock for following a wait read by read: every WallNs() moves the wall clock
// on by `step_ns`, a wall sleep jumps it to the sleep's deadline, and `on_read` may change it (or
// a stop flag) before a read returns. Not thread-safe.
class SteppingClock final : public Clock {
 public:
  SteppingClock(int64_t wall_ns, int64_t step_ns) : wall_ns_(wall_ns), step_ns_(step_ns) {}

  int64_t WallNs() const override {
    ++reads_;
    if (on_read) on_read(reads_, &wall_ns_);
    const int64_t now = wall_ns_;
    wall_ns_ += step_ns_;
    return now;
  }
  int64_t MonotonicNs() const override { return 0; }
  void SleepUntilMonotonicNs(int64_t) override {}
  void SleepUntilWallNs(int64_t deadline_ns) override {
    wall_ns_ = std::max(wall_ns_, deadline_ns);
  }
  bool SleepUntilWallNsUnless(int64_t deadline_ns, const std::atomic<bool>& stop) override {
    sleeps.push_back(deadline_ns);
    if (stop.load()) return false;
    wall_ns_ = std::max(wall_ns_, deadline_ns);
    return true;
  }
  bool SleepUntilMonotonicNsUnless(int64_t, const std::atomic<bool>& stop) override {
    return !stop.load();
  }
  void Wake() override {}

  int reads() const { return reads_; }

  std::vector<int64_t> sleeps;  // the deadlines of the wall sleeps, in order
  std::function<void(int read, int64_t* wall_ns)> on_read;

 private:
  mutable int64_t wall_ns_;
  const int64_t step_ns_;
  mutable int reads_ = 0;
};

TEST(WaitForWallInstantTest, SleepsToTheSpinThenReturnsTheFirstReadingAtTheInstant) {
  constexpr int64_t kInstant = 1'000'000;
  for (int64_t spin_ns : {0, 1, 1000, 200'000}) {
    for (int64_t step_ns : {1, 7, 999}) {
      SCOPED_TRACE(testing::Message() << "spin " << spin_ns << " ns, step " << step_ns << " ns");
      SteppingClock clock(0, step_ns);
      std::atomic<bool> stop{false};
      const std::optional<int64_t> now = WaitForWallInstant(clock, kInstant, stop, spin_ns);
      ASSERT_TRUE(now.has_value());
      EXPECT_GE(*now, kInstant) << "never before the instant";
      EXPECT_LT(*now, kInstant + step_ns) << "the first reading at or after it";
      EXPECT_EQ(clock.sleeps, std::vector<int64_t>{kInstant - spin_ns});
      // The spin reads the clock until the instant and no longer.
      EXPECT_LE(clock.reads(), spin_ns / step_ns + 2);
    }
  }
}

TEST(WaitForWallInstantTest, APastInstantReturnsAtOnce) {
  SteppingClock clock(5000, 1);
  std::atomic<bool> stop{false};
  EXPECT_EQ(WaitForWallInstant(clock, 1000, stop, 100), 5000);
  EXPECT_EQ(clock.reads(), 1);
}

TEST(WaitForWallInstantTest, AStopEndsTheSleepOrTheSpin) {
  SteppingClock asleep(0, 1);
  std::atomic<bool> stop{true};
  EXPECT_EQ(WaitForWallInstant(asleep, 1'000'000, stop, 1000), std::nullopt);
  EXPECT_EQ(asleep.reads(), 0);

  SteppingClock spinning(0, 1);
  stop = false;
  spinning.on_read = [&stop](int read, int64_t*) {
    if (read == 10) stop = true;
  };
  EXPECT_EQ(WaitForWallInstant(spinning, 1'000'000, stop, 1000), std::nullopt);
  EXPECT_EQ(spinning.reads(), 10) << "the spin sees the stop at its next turn";
}

TEST(WaitForWallInstantTest, AWallStepBackSendsItBackToSleep) {
  constexpr int64_t kInstant = 1'000'000;
  for (int64_t spin_ns : {0, 1000}) {
    SCOPED_TRACE(testing::Message() << "spin " << spin_ns << " ns");
    SteppingClock clock(0, 1);
    // NTP steps the clock back a second as the sleep ends: spinning for a second (at a raised
    // priority, perhaps) is not an option; the wait sleeps again.
    clock.on_read = [](int read, int64_t* wall_ns) {
      if (read == 1) *wall_ns -= kNanosPerSecond;
    };
    std::atomic<bool> stop{false};
    const std::optional<int64_t> now = WaitForWallInstant(clock, kInstant, stop, spin_ns);
    ASSERT_TRUE(now.has_value());
    EXPECT_GE(*now, kInstant);
    EXPECT_EQ(clock.sleeps, (std::vector<int64_t>{kInstant - spin_ns, kInstant - spin_ns}));
  }
}

TEST(SimulatedClockTest, RunAtWallRunsAtTheInstantOrNotAtAllWhenStopped) {
  SimulatedClock clock(0, 0);
  std::atomic<bool> stop{false};
  std::optional<int64_t> ran_at;
  bool reached = false;
  std::thread waiter([&] {
    reached = clock.RunAtWallNsUnless(1000, stop, [&](int64_t now_ns) { ran_at = now_ns; });
  });
  clock.WaitForSleepers(1);
  clock.AdvanceNs(999);
  EXPECT_EQ(clock.sleepers(), 1);
  clock.AdvanceNs(1);
  waiter.join();
  EXPECT_TRUE(reached);
  EXPECT_EQ(ran_at, 1000);

  ran_at.reset();
  std::thread stopped([&] {
    reached = clock.RunAtWallNsUnless(5000, stop, [&](int64_t now_ns) { ran_at = now_ns; });
  });
  clock.WaitForSleepers(1);
  stop = true;
  clock.Wake();
  stopped.join();
  EXPECT_FALSE(reached);
  EXPECT_EQ(ran_at, std::nullopt);
}

TEST(RealClockTest, RunAtWallIsNeverEarlyWithOrWithoutASpin) {
  for (int64_t spin_ns : {int64_t{0}, 300 * kNanosPerMicro}) {
    RealClock clock(RealClock::StartOptions{.spin_ns = spin_ns});
    std::atomic<bool> stop{false};
    const int64_t instant = clock.WallNs() + 2 * kNanosPerMilli;
    int64_t ran_at = 0;
    EXPECT_TRUE(clock.RunAtWallNsUnless(instant, stop, [&](int64_t now_ns) { ran_at = now_ns; }));
    EXPECT_GE(ran_at, instant);
    // A past instant runs at once.
    EXPECT_TRUE(clock.RunAtWallNsUnless(instant - kNanosPerSecond, stop,
                                        [&](int64_t now_ns) { ran_at = now_ns; }));
    EXPECT_GE(ran_at, instant);
  }
}

TEST(RealClockTest, RunAtWallRaisesTheThreadOnlyWhilePermittedAndPutsItBack) {
  const int policy_before = sched_getscheduler(0);
  const bool permitted = RealClock::CheckRealtimePermitted().ok();
  EXPECT_EQ(sched_getscheduler(0), policy_before) << "the check leaves the thread as it was";
  RealClock clock(RealClock::StartOptions{.realtime = true});
  std::atomic<bool> stop{false};
  int policy_at_instant = -1;
  EXPECT_TRUE(clock.RunAtWallNsUnless(clock.WallNs() + kNanosPerMilli, stop, [&](int64_t) {
    policy_at_instant = sched_getscheduler(0) & ~SCHED_RESET_ON_FORK;
  }));
  const bool already_realtime = (policy_before & ~SCHED_RESET_ON_FORK) == SCHED_FIFO ||
                                (policy_before & ~SCHED_RESET_ON_FORK) == SCHED_RR;
  if (permitted && !already_realtime) {
    EXPECT_EQ(policy_at_instant, SCHED_FIFO);
  } else if (!permitted) {
    EXPECT_EQ(policy_at_instant, policy_before & ~SCHED_RESET_ON_FORK) << "falls back quietly";
  }
  EXPECT_EQ(sched_getscheduler(0), policy_before);

  // Stopped before the instant: nothing runs, and the thread is put back all the same.
  stop = true;
  EXPECT_FALSE(clock.RunAtWallNsUnless(clock.WallNs() + kNanosPerSecond, stop,
                                       [&](int64_t) { ADD_FAILURE() << "ran after a stop"; }));
  EXPECT_EQ(sched_getscheduler(0), policy_before);
}

TEST(RealClockTest, WithoutPermissionTheWaitFallsBackToTheNormalClass) {
  if (geteuid() != 0 && RealClock::CheckRealtimePermitted().ok()) {
    GTEST_SKIP() << "privileged without being root: no way to drop it here";
  }
  // A child process without the privilege, as a sidecar in a pod without CAP_SYS_NICE.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (geteuid() == 0) {
      const rlimit none{0, 0};
      if (setrlimit(RLIMIT_RTPRIO, &none) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(10);
    }
    if (RealClock::CheckRealtimePermitted().ok()) _exit(11);
    RealClock clock(RealClock::StartOptions{.realtime = true});
    std::atomic<bool> stop{false};
    int policy = -1;
    const bool ran = clock.RunAtWallNsUnless(clock.WallNs() + kNanosPerMilli, stop,
                                             [&](int64_t) { policy = sched_getscheduler(0); });
    _exit(ran && policy == SCHED_OTHER ? 0 : 12);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: could not drop root, 11: still permitted, 12: did "
                                       "not run in the normal class";
}

TEST(RealClockTest, ARefusedRealtimeCheckSaysWhatWouldAllowIt) {
  const absl::Status status = RealClock::CheckRealtimePermitted();
  if (status.ok()) GTEST_SKIP() << "this process may use SCHED_FIFO";
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(status.message().find("CAP_SYS_NICE"), std::string_view::npos) << status;
}

}  // namespace
}  // namespace clusterprof
