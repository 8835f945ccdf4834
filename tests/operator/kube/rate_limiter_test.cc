#include "operator/kube/rate_limiter.h"

#include <atomic>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/base/clock.h"
#include "gtest/gtest.h"

namespace clusterprof::kube {
namespace {

constexpr int64_t kMs = kNanosPerMilli;

TEST(TokenBucketTest, BurstThenOneTokenPerInterval) {
  SimulatedClock clock;
  TokenBucket bucket(&clock, /*qps=*/10, /*burst=*/3);
  EXPECT_EQ(bucket.ReserveNs(), 0);
  EXPECT_EQ(bucket.ReserveNs(), 0);
  EXPECT_EQ(bucket.ReserveNs(), 0);
  EXPECT_FALSE(bucket.TryAccept());
  clock.AdvanceNs(99 * kMs);
  EXPECT_FALSE(bucket.TryAccept());
  clock.AdvanceNs(1 * kMs);
  EXPECT_TRUE(bucket.TryAccept());
  EXPECT_FALSE(bucket.TryAccept());
}

TEST(TokenBucketTest, ReservationsQueue) {
  SimulatedClock clock;
  TokenBucket bucket(&clock, /*qps=*/10, /*burst=*/1);
  EXPECT_EQ(bucket.ReserveNs(), 0);
  // Each reservation waits behind the ones before it.
  EXPECT_EQ(bucket.ReserveNs(), 100 * kMs);
  EXPECT_EQ(bucket.ReserveNs(), 200 * kMs);
  EXPECT_EQ(bucket.ReserveNs(), 300 * kMs);
  // Time pays the debt off; the queue keeps its order.
  clock.AdvanceNs(150 * kMs);
  EXPECT_EQ(bucket.ReserveNs(), 250 * kMs);
  // While reservations are pending there is nothing to take.
  EXPECT_FALSE(bucket.TryAccept());
  clock.AdvanceNs(250 * kMs);
  EXPECT_FALSE(bucket.TryAccept());
  clock.AdvanceNs(100 * kMs);
  EXPECT_TRUE(bucket.TryAccept());
}

TEST(TokenBucketTest, RefillsNoFurtherThanTheBurst) {
  SimulatedClock clock;
  TokenBucket bucket(&clock, /*qps=*/10, /*burst=*/2);
  clock.AdvanceNs(3600 * kNanosPerSecond);
  EXPECT_TRUE(bucket.TryAccept());
  EXPECT_TRUE(bucket.TryAccept());
  EXPECT_FALSE(bucket.TryAccept());
  EXPECT_EQ(bucket.ReserveNs(), 100 * kMs);
}

TEST(TokenBucketTest, FractionalRatesRoundTheWaitUp) {
  SimulatedClock clock;
  TokenBucket bucket(&clock, /*qps=*/3, /*burst=*/1);
  EXPECT_EQ(bucket.ReserveNs(), 0);
  const int64_t wait_ns = bucket.ReserveNs();
  EXPECT_EQ(wait_ns, 333'333'334);
  clock.AdvanceNs(wait_ns);
  // The token the first reservation waited for is there now, and spent.
  EXPECT_FALSE(bucket.TryAccept());
}

TEST(TokenBucketTest, InfiniteRateNeverWaits) {
  SimulatedClock clock;
  TokenBucket bucket(&clock, std::numeric_limits<double>::infinity(), 1);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(bucket.ReserveNs(), 0);
  EXPECT_TRUE(bucket.TryAccept());
}

TEST(TokenBucketTest, AcceptSleepsOnTheClockUntilTheTokenIsDue) {
  SimulatedClock clock;
  TokenBucket bucket(&clock, /*qps=*/10, /*burst=*/1);
  bucket.Accept();  // the burst: no sleep
  std::atomic<bool> accepted{false};
  std::thread caller([&] {
    bucket.Accept();
    accepted = true;
  });
  clock.WaitForSleepers(1);
  clock.AdvanceNs(99 * kMs);
  // Its deadline is not reached, so it is still asleep (leaving the sleep drops the count).
  EXPECT_EQ(clock.sleepers(), 1);
  EXPECT_FALSE(accepted);
  clock.AdvanceNs(1 * kMs);
  caller.join();
  EXPECT_TRUE(accepted);
}

TEST(TokenBucketTest, AcceptUnlessWaitsForTheTokenOrTheStopFlag) {
  SimulatedClock clock;
  TokenBucket bucket(&clock, /*qps=*/10, /*burst=*/1);
  std::atomic<bool> stop{false};
  EXPECT_TRUE(bucket.AcceptUnless(stop));

  bool result = false;
  std::thread reaches([&] { result = bucket.AcceptUnless(stop); });
  clock.WaitForSleepers(1);
  clock.AdvanceNs(100 * kMs);
  reaches.join();
  EXPECT_TRUE(result);

  result = true;
  std::thread stopped([&] { result = bucket.AcceptUnless(stop); });
  clock.WaitForSleepers(1);
  stop = true;
  clock.Wake();
  stopped.join();
  EXPECT_FALSE(result);
  // Already stopped: returns at once and reserves nothing.
  EXPECT_FALSE(bucket.AcceptUnless(stop));
  // The stopped wait kept its reservation (due at 200 ms): the next one is due at 300 ms.
  EXPECT_EQ(bucket.ReserveNs(), 200 * kMs);
}

TEST(ItemExponentialFailureRateLimiterTest, DoublesPerFailureUpToTheCap) {
  ItemExponentialFailureRateLimiter limiter(5 * kMs, 1000 * kNanosPerSecond);
  int64_t expected = 5 * kMs;
  for (int failure = 0; failure < 18; ++failure) {
    ASSERT_EQ(limiter.WhenNs("ns/a"), expected) << "failure " << failure;
    EXPECT_EQ(limiter.NumRequeues("ns/a"), failure + 1);
    expected *= 2;
  }
  // 5 ms * 2^18 = 1310.72 s: capped from here on, and never overflowing.
  for (int failure = 18; failure < 200; ++failure) {
    ASSERT_EQ(limiter.WhenNs("ns/a"), 1000 * kNanosPerSecond) << "failure " << failure;
  }
  EXPECT_EQ(limiter.NumRequeues("ns/a"), 200);
}

TEST(ItemExponentialFailureRateLimiterTest, ItemsAreIndependentAndForgetResets) {
  ItemExponentialFailureRateLimiter limiter(1 * kMs, 1000 * kMs);
  EXPECT_EQ(limiter.WhenNs("ns/a"), 1 * kMs);
  EXPECT_EQ(limiter.WhenNs("ns/a"), 2 * kMs);
  EXPECT_EQ(limiter.WhenNs("ns/b"), 1 * kMs);
  EXPECT_EQ(limiter.NumRequeues("ns/a"), 2);
  EXPECT_EQ(limiter.NumRequeues("ns/b"), 1);
  limiter.Forget("ns/a");
  EXPECT_EQ(limiter.NumRequeues("ns/a"), 0);
  EXPECT_EQ(limiter.WhenNs("ns/a"), 1 * kMs);
  EXPECT_EQ(limiter.WhenNs("ns/b"), 2 * kMs);
}

TEST(ItemExponentialFailureRateLimiterTest, LargeBaseSaturatesAtTheCap) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  ItemExponentialFailureRateLimiter limiter(max / 2 + 1, max);
  EXPECT_EQ(limiter.WhenNs("x"), max / 2 + 1);
  // 2 * (max / 2 + 1) overflows: the cap instead.
  EXPECT_EQ(limiter.WhenNs("x"), max);
  EXPECT_EQ(limiter.WhenNs("x"), max);
}

TEST(BucketRateLimiterTest, SharesOneBucketAcrossItems) {
  SimulatedClock clock;
  BucketRateLimiter limiter(&clock, /*qps=*/10, /*burst=*/2);
  EXPECT_EQ(limiter.WhenNs("a"), 0);
  EXPECT_EQ(limiter.WhenNs("b"), 0);
  EXPECT_EQ(limiter.WhenNs("c"), 100 * kMs);
  EXPECT_EQ(limiter.WhenNs("a"), 200 * kMs);
  EXPECT_EQ(limiter.NumRequeues("a"), 0);
  limiter.Forget("a");
  EXPECT_EQ(limiter.WhenNs("a"), 300 * kMs);
}

// A limiter that answers from a script and records what it was asked.
class ScriptedLimiter final : public RateLimiter {
 public:
  ScriptedLimiter(int64_t delay_ns, int requeues) : delay_ns_(delay_ns), requeues_(requeues) {}
  int64_t WhenNs(const std::string& item) override {
    ++whens;
    return delay_ns_;
  }
  void Forget(const std::string& item) override { ++forgets; }
  int NumRequeues(const std::string& item) override { return requeues_; }

  int whens = 0;
  int forgets = 0;

 private:
  const int64_t delay_ns_;
  const int requeues_;
};

TEST(MaxOfRateLimiterTest, TakesTheLongestDelayAndAsksEveryLimiter) {
  auto short_limiter = std::make_unique<ScriptedLimiter>(10, 7);
  auto long_limiter = std::make_unique<ScriptedLimiter>(30, 2);
  auto middle_limiter = std::make_unique<ScriptedLimiter>(20, 3);
  ScriptedLimiter* short_view = short_limiter.get();
  ScriptedLimiter* long_view = long_limiter.get();
  ScriptedLimiter* middle_view = middle_limiter.get();
  std::vector<std::unique_ptr<RateLimiter>> limiters;
  limiters.push_back(std::move(short_limiter));
  limiters.push_back(std::move(long_limiter));
  limiters.push_back(std::move(middle_limiter));
  MaxOfRateLimiter limiter(std::move(limiters));

  EXPECT_EQ(limiter.WhenNs("x"), 30);
  EXPECT_EQ(limiter.NumRequeues("x"), 7);
  limiter.Forget("x");
  for (const ScriptedLimiter* view : {short_view, long_view, middle_view}) {
    EXPECT_EQ(view->whens, 1);
    EXPECT_EQ(view->forgets, 1);
  }
}

TEST(DefaultControllerRateLimiterTest, ExponentialPerItemThenTheOverallBucket) {
  SimulatedClock clock;
  std::unique_ptr<RateLimiter> limiter = DefaultControllerRateLimiter(&clock);
  // One item failing: 5 ms, 10 ms, 20 ms, ... (the bucket's burst of 100 is not the limit).
  int64_t expected = 5 * kMs;
  for (int failure = 0; failure < 10; ++failure) {
    ASSERT_EQ(limiter->WhenNs("ns/a"), expected);
    expected *= 2;
  }
  EXPECT_EQ(limiter->NumRequeues("ns/a"), 10);
  limiter->Forget("ns/a");
  EXPECT_EQ(limiter->NumRequeues("ns/a"), 0);
  EXPECT_EQ(limiter->WhenNs("ns/a"), 5 * kMs);
  // 11 tokens spent; 89 distinct items more empty the bucket at 5 ms each.
  for (int i = 0; i < 89; ++i) ASSERT_EQ(limiter->WhenNs("item-" + std::to_string(i)), 5 * kMs);
  // Then 10 per second overall: the 101st retry waits 100 ms, the next 200 ms.
  EXPECT_EQ(limiter->WhenNs("ns/b"), 100 * kMs);
  EXPECT_EQ(limiter->WhenNs("ns/c"), 200 * kMs);
}

TEST(RateLimiterDeathTest, RejectsBadParameters) {
  SimulatedClock clock;
  EXPECT_DEATH(TokenBucket(&clock, 0, 1), "positive rate");
  EXPECT_DEATH(TokenBucket(&clock, 1, 0), "burst of at least 1");
  EXPECT_DEATH(ItemExponentialFailureRateLimiter(-1, 10), "negative backoff");
  EXPECT_DEATH(MaxOfRateLimiter({}), "at least one limiter");
}

}  // namespace
}  // namespace clusterprof::kube
