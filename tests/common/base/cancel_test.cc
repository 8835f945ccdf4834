#include "common/base/cancel.h"

#include <atomic>
#include <thread>

#include "common/base/clock.h"
#include "gtest/gtest.h"

namespace clusterprof {
namespace {

TEST(CancelTokenTest, CallbacksRunOnceOnCancel) {
  CancelToken token;
  int calls = 0;
  CancelToken::Registration registration = token.OnCancel([&] { ++calls; });
  EXPECT_FALSE(token.cancelled());
  token.Cancel();
  token.Cancel();
  EXPECT_TRUE(token.cancelled());
  EXPECT_EQ(calls, 1);
}

TEST(CancelTokenTest, RegisteringAfterCancelRunsAtOnce) {
  CancelToken token;
  token.Cancel();
  bool called = false;
  CancelToken::Registration registration = token.OnCancel([&] { called = true; });
  EXPECT_TRUE(called);
}

TEST(CancelTokenTest, AnEndedRegistrationIsNotCalled) {
  CancelToken token;
  int calls = 0;
  {
    CancelToken::Registration registration = token.OnCancel([&] { ++calls; });
  }
  CancelToken::Registration moved;
  {
    CancelToken::Registration registration = token.OnCancel([&] { calls += 10; });
    moved = std::move(registration);
  }
  token.Cancel();
  EXPECT_EQ(calls, 10) << "the moved registration still holds its callback";
}

TEST(CancelTokenTest, WakesASleeperOnTheClock) {
  SimulatedClock clock;
  CancelToken token;
  CancelToken::Registration registration = token.OnCancel([&] { clock.Wake(); });
  std::thread sleeper([&] {
    EXPECT_FALSE(
        clock.SleepUntilMonotonicNsUnless(clock.MonotonicNs() + kNanosPerSecond, token.flag()));
  });
  clock.WaitForSleepers(1);
  token.Cancel();
  sleeper.join();
}

}  // namespace
}  // namespace clusterprof
