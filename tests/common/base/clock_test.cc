#include "common/base/clock.h"

#include <atomic>
#include <thread>

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

}  // namespace
}  // namespace clusterprof
