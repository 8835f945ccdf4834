#include "analysis/stragglers.h"

#include <algorithm>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/analysis/synthetic_run.h"

namespace clusterprof::analysis {
namespace {

using ::testing::HasSubstr;

std::vector<HostRun> Digests(const testing::RunSpec& spec) {
  std::vector<HostRun> runs;
  const std::vector<tensorflow::profiler::XSpace> spaces = testing::MakeRun(spec);
  for (size_t h = 0; h < spaces.size(); ++h) {
    absl::StatusOr<HostDigest> digest = DigestXSpace(spaces[h], StrCat("host-", h));
    EXPECT_TRUE(digest.ok()) << digest.status();
    runs.push_back({*std::move(digest), spec.hosts[h].clock_offset_ns});
  }
  return runs;
}

std::vector<std::string> Stragglers(const Analysis& analysis) {
  std::vector<std::string> names;
  for (const HostVerdict* host : analysis.stragglers()) names.push_back(host->host);
  return names;
}

TEST(StragglersTest, AHostWithSlowerComputeIsFlaggedThoughEveryStepTimeIsEqual) {
  testing::RunSpec spec;
  spec.hosts.resize(8);
  spec.hosts[5].compute_scale = 1.2;
  const Analysis analysis = FindStragglers(Digests(spec));
  EXPECT_EQ(analysis.steps, 50);
  EXPECT_EQ(analysis.compared_steps, 50);
  ASSERT_EQ(analysis.compared_step_numbers.size(), 50u);
  EXPECT_EQ(analysis.compared_step_numbers.front(), 100);
  EXPECT_EQ(analysis.compared_step_numbers.back(), 149);
  ASSERT_THAT(Stragglers(analysis), ::testing::ElementsAre("host-5"));
  const HostVerdict& slow = analysis.hosts[5];
  EXPECT_EQ(slow.cause, Cause::kCompute);
  EXPECT_GE(slow.late_steps, 45);
  EXPECT_NEAR(static_cast<double>(slow.median_lateness_ns), 4e6, 1.5e6) << "20% of 20 ms";
  EXPECT_GT(slow.others_wait_ns, 7 * 45 * 2'000'000LL);
  EXPECT_THAT(slow.evidence, HasSubstr("late (median) in"));
  EXPECT_THAT(slow.evidence, HasSubstr("the other 7 hosts wait"));
  // Every host's step time is the same: the step time alone would not tell.
  EXPECT_NEAR(static_cast<double>(analysis.hosts[0].step_p50_ns),
              static_cast<double>(slow.step_p50_ns), 1e5);
}

TEST(StragglersTest, AHostWaitingOnInputIsFlaggedWithCauseInput) {
  testing::RunSpec spec;
  spec.hosts.resize(6);
  spec.hosts[2].extra_input_ns = 6'000'000;
  const Analysis analysis = FindStragglers(Digests(spec));
  ASSERT_THAT(Stragglers(analysis), ::testing::ElementsAre("host-2"));
  EXPECT_EQ(analysis.hosts[2].cause, Cause::kInput);
  EXPECT_THAT(analysis.hosts[2].evidence, HasSubstr("input pipeline"));
}

TEST(StragglersTest, NoiseAloneFlagsNobody) {
  testing::RunSpec spec;
  spec.hosts.resize(16);
  const Analysis analysis = FindStragglers(Digests(spec));
  EXPECT_THAT(Stragglers(analysis), ::testing::IsEmpty());
}

// Many hosts with normal (not uniform) compute jitter: the earliest of 64 hosts enters some 2.4
// deviations before the median one, so lateness measured from it would put most healthy hosts
// past max(5% of the step, 3 x MAD) in most steps. Measured from the median host, nobody is late
// in half of them; a host 15% slower still is.
TEST(StragglersTest, NoiseAmongManyHostsWithNormalJitterFlagsNobody) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<double> jitter(1.0, 0.06);
    std::vector<HostRun> runs(64);
    for (size_t h = 0; h < runs.size(); ++h) runs[h].digest.host = StrCat("host-", h);
    int64_t start = 1'767'225'600'000'000'000;
    for (int64_t step = 0; step < 50; ++step) {
      std::vector<int64_t> entries;
      for (size_t h = 0; h < runs.size(); ++h) {
        const double slow = seed == 5 && h == 9 ? 1.15 : 1.0;
        entries.push_back(start + static_cast<int64_t>(80'000'000 * slow * jitter(rng)));
      }
      const int64_t end = *std::max_element(entries.begin(), entries.end()) + 20'000'000;
      for (size_t h = 0; h < runs.size(); ++h) {
        runs[h].digest.steps.push_back({.step = step,
                                        .start_ns = start,
                                        .end_ns = end,
                                        .collective_entry_ns = entries[h],
                                        .collective_ns = end - entries[h]});
      }
      start = end;
    }
    const Analysis analysis = FindStragglers(runs);
    EXPECT_EQ(analysis.compared_steps, 50);
    if (seed == 5) {
      EXPECT_THAT(Stragglers(analysis), ::testing::ElementsAre("host-9"));
    } else {
      EXPECT_THAT(Stragglers(analysis), ::testing::IsEmpty()) << "seed " << seed;
    }
  }
}

TEST(StragglersTest, ClockOffsetsMeasuredAtCaptureTimeAreTakenOut) {
  testing::RunSpec spec;
  spec.hosts.resize(8);
  spec.hosts[3].compute_scale = 1.25;
  for (size_t h = 0; h < spec.hosts.size(); ++h) {
    spec.hosts[h].clock_offset_ns = (h % 2 == 0 ? 5 : -5) * 1'000'000;
  }
  const Analysis analysis = FindStragglers(Digests(spec));
  EXPECT_THAT(Stragglers(analysis), ::testing::ElementsAre("host-3"));

  // Without the offsets the ±5 ms look like lateness of their own: the even hosts, 10 ms "late".
  std::vector<HostRun> unaligned = Digests(spec);
  for (HostRun& run : unaligned) run.clock_offset_ns = 0;
  EXPECT_NE(Stragglers(FindStragglers(unaligned)), std::vector<std::string>{"host-3"});
}

TEST(StragglersTest, HostsThatDoNotRunTheirStepsTogetherAreNotCompared) {
  // Independent processes (no collective couples them): step 120 of one host ran half a second
  // before step 120 of the other.
  testing::RunSpec spec;
  spec.hosts.resize(4);
  spec.hosts[2].clock_offset_ns = 500'000'000;
  std::vector<HostRun> runs = Digests(spec);
  for (HostRun& run : runs) run.clock_offset_ns = 0;  // and no manifest to say so
  const Analysis analysis = FindStragglers(runs);
  EXPECT_THAT(Stragglers(analysis), ::testing::IsEmpty());
  EXPECT_EQ(analysis.compared_steps, 0);
  EXPECT_THAT(analysis.compared_step_numbers, ::testing::IsEmpty());
  ASSERT_FALSE(analysis.notes.empty());
  EXPECT_THAT(analysis.notes[0], HasSubstr("did not run those steps together"));
}

TEST(StragglersTest, HostsWithoutStepsAreLeftOutByName) {
  testing::RunSpec spec;
  spec.hosts.resize(4);
  spec.hosts[1].compute_scale = 1.3;
  std::vector<HostRun> runs = Digests(spec);
  HostRun empty;
  empty.digest.host = "tf-worker";
  empty.digest.step_source = "events with a step_num stat";
  runs.push_back(empty);
  const Analysis analysis = FindStragglers(runs);
  ASSERT_EQ(analysis.left_out.size(), 1u);
  EXPECT_THAT(analysis.left_out[0], HasSubstr("tf-worker: no steps found"));
  EXPECT_THAT(Stragglers(analysis), ::testing::ElementsAre("host-1"));
}

TEST(StragglersTest, OneHostHasNothingToCompare) {
  testing::RunSpec spec;
  spec.hosts.resize(1);
  const Analysis analysis = FindStragglers(Digests(spec));
  ASSERT_EQ(analysis.hosts.size(), 1u);
  EXPECT_GT(analysis.hosts[0].step_p50_ns, 0);
  ASSERT_EQ(analysis.notes.size(), 1u);
  EXPECT_THAT(analysis.notes[0], HasSubstr("nothing to compare"));
}

TEST(StragglersTest, StepsAreComparedOnlyWhereEveryHostHasThem) {
  testing::RunSpec spec;
  spec.hosts.resize(3);
  spec.hosts[0].compute_scale = 1.3;
  std::vector<HostRun> runs = Digests(spec);
  // Host 2 was captured for the last 20 steps only.
  runs[2].digest.steps.erase(runs[2].digest.steps.begin(), runs[2].digest.steps.begin() + 30);
  const Analysis analysis = FindStragglers(runs);
  EXPECT_EQ(analysis.steps, 20);
  EXPECT_EQ(analysis.first_step, 130);
  EXPECT_THAT(Stragglers(analysis), ::testing::ElementsAre("host-0"));
}

// 200 random runs: 3 to 16 hosts, ±5 ms clock offsets (known), 5% jitter, and either nobody
// slow, one host 15-40% slower at compute, or one host waiting 20-40% of a step longer on input.
TEST(StragglersTest, TheVerdictIsRightInAtLeast98PercentOfRandomRuns) {
  std::mt19937 rng(20261126);
  int right = 0;
  int false_stragglers_in_noise = 0;
  constexpr int kRuns = 200;
  for (int i = 0; i < kRuns; ++i) {
    testing::RunSpec spec;
    spec.seed = rng();
    spec.hosts.resize(std::uniform_int_distribution<int>(3, 16)(rng));
    for (testing::HostSpec& host : spec.hosts) {
      host.clock_offset_ns = std::uniform_int_distribution<int64_t>(-5'000'000, 5'000'000)(rng);
    }
    const int kind = i % 3;  // 0 noise, 1 compute, 2 input
    const size_t slow = std::uniform_int_distribution<size_t>(0, spec.hosts.size() - 1)(rng);
    if (kind == 1) {
      spec.hosts[slow].compute_scale = std::uniform_real_distribution<double>(1.15, 1.4)(rng);
    } else if (kind == 2) {
      spec.hosts[slow].extra_input_ns =
          std::uniform_int_distribution<int64_t>(5'000'000, 10'000'000)(rng);
    }
    const Analysis analysis = FindStragglers(Digests(spec));
    const std::vector<std::string> flagged = Stragglers(analysis);
    bool ok = false;
    if (kind == 0) {
      ok = flagged.empty();
      false_stragglers_in_noise += flagged.empty() ? 0 : 1;
    } else {
      ok = flagged == std::vector<std::string>{StrCat("host-", slow)} &&
           analysis.hosts[slow].cause == (kind == 1 ? Cause::kCompute : Cause::kInput);
    }
    right += ok ? 1 : 0;
  }
  std::printf("stragglers: %d of %d random runs right (%.1f%%); %d false straggler(s) in noise\n",
              right, kRuns, 100.0 * right / kRuns, false_stragglers_in_noise);
  EXPECT_GE(right, kRuns * 98 / 100);
  EXPECT_EQ(false_stragglers_in_noise, 0);
}

}  // namespace
}  // namespace clusterprof::analysis
