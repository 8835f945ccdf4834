#include "common/retry/backoff.h"

#include "gtest/gtest.h"

namespace clusterprof {
namespace {

TEST(BackoffTest, GrowsWithinJitterBoundsUpToTheCap) {
  Backoff backoff({.initial_ns = 100, .max_ns = 1000, .multiplier = 2}, /*seed=*/1);
  int64_t bound = 100;
  for (int i = 0; i < 12; ++i) {
    const int64_t delay = backoff.NextDelayNs();
    EXPECT_GE(delay, bound / 2) << "retry " << i;
    EXPECT_LE(delay, bound) << "retry " << i;
    bound = std::min<int64_t>(bound * 2, 1000);
  }
}

TEST(BackoffTest, ResetStartsOver) {
  Backoff backoff({.initial_ns = 100, .max_ns = 100000, .multiplier = 10}, /*seed=*/2);
  backoff.NextDelayNs();
  backoff.NextDelayNs();
  EXPECT_GT(backoff.NextDelayNs(), 100);
  backoff.Reset();
  EXPECT_LE(backoff.NextDelayNs(), 100);
}

TEST(BackoffTest, JitterSpreadsClients) {
  Backoff a({.initial_ns = 1'000'000'000}, /*seed=*/3);
  Backoff b({.initial_ns = 1'000'000'000}, /*seed=*/4);
  EXPECT_NE(a.NextDelayNs(), b.NextDelayNs());
}

TEST(BackoffTest, UpwardJitterIsNeverShorterThanTheBound) {
  Backoff backoff({.initial_ns = 1000,
                   .max_ns = 8000,
                   .multiplier = 2,
                   .jitter_mode = BackoffPolicy::Jitter::kUp,
                   .jitter = 0.5},
                  /*seed=*/5);
  int64_t bound = 1000;
  for (int i = 0; i < 8; ++i) {
    const int64_t delay = backoff.NextDelayNs();
    EXPECT_GE(delay, bound) << "retry " << i;
    EXPECT_LE(delay, bound + bound / 2) << "retry " << i;
    bound = std::min<int64_t>(bound * 2, 8000);
  }
}

TEST(BackoffTest, NoJitterIsExactAndMultiplierOneIsConstant) {
  Backoff doubling({.initial_ns = 10, .max_ns = 10 << 10, .multiplier = 2, .jitter = 0});
  EXPECT_EQ(doubling.NextDelayNs(), 10);
  EXPECT_EQ(doubling.NextDelayNs(), 20);
  EXPECT_EQ(doubling.NextDelayNs(), 40);
  Backoff constant({.initial_ns = 10, .max_ns = 10, .multiplier = 1, .jitter = 0});
  EXPECT_EQ(constant.NextDelayNs(), 10);
  EXPECT_EQ(constant.NextDelayNs(), 10);
}

}  // namespace
}  // namespace clusterprof
