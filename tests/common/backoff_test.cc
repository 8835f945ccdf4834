#include "common/backoff.h"

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

}  // namespace
}  // namespace clusterprof
