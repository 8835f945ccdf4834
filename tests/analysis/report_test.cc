// MakeRunReport: the verdict of a capture that reached back (a lookback) is over its window.
#include "analysis/report.h"

#include <string>
#include <vector>

#include "analysis/report_html.h"
#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::analysis {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kT0 = 1'800'000'000'000'000'000;

// Four hosts in lockstep, 100 ms steps; host-2 enters the collectives 30 ms late from step
// `slow_from` on. Steps 0-59; step 40 starts at T0 (0-39 are the lookback).
std::vector<HostRun> Runs(int slow_from) {
  std::vector<HostRun> runs;
  for (int h = 0; h < 4; ++h) {
    HostRun run;
    run.digest.host = StrCat("host-", h);
    run.clock_offset_ns = (h - 1) * 7 * kMs;  // the hosts' clocks disagree a little
    for (int s = 0; s < 60; ++s) {
      StepDigest step;
      step.step = s;
      step.start_ns = kT0 + (s - 40) * 100 * kMs + run.clock_offset_ns;
      step.end_ns = step.start_ns + 100 * kMs;
      const int64_t compute = (h == 2 && s >= slow_from ? 80 : 50) + (h + s) % 3;
      step.collective_entry_ns = step.start_ns + compute * kMs;
      run.digest.steps.push_back(step);
    }
    runs.push_back(run);
  }
  return runs;
}

TEST(MakeRunReportTest, ALookbacksHealthyStepsDoNotOutvoteTheCaptureWindow) {
  // host-2 slows down at step 34: 6 slow steps in the lookback, all 20 in the window.
  const RunReport whole = MakeRunReport("/logs/plugins/profile/r", {}, Runs(34), {}, true);
  EXPECT_TRUE(whole.analysis.stragglers().empty()) << "26 of 60 steps late: under half";

  const RunReport window = MakeRunReport("/logs/plugins/profile/r", {}, Runs(34), {}, true, kT0);
  ASSERT_EQ(window.analysis.stragglers().size(), 1u);
  EXPECT_EQ(window.analysis.stragglers()[0]->host, "host-2");
  EXPECT_EQ(window.analysis.first_step, 40);
  EXPECT_THAT(window.analysis.notes,
              ::testing::Contains(::testing::HasSubstr("40 steps of the lookback")));
  // The digests keep every step, the lookback's included, for the report's pages.
  ASSERT_EQ(window.runs.size(), 4u);
  EXPECT_EQ(window.runs[0].digest.steps.size(), 60u);
}

TEST(MakeRunReportTest, AHostWhoseStepsAllCameBeforeTheStartHasNoVerdictAndNoPage) {
  // A workload that ended in the lookback: its steps are all before T0.
  std::vector<HostRun> runs = Runs(0);
  std::erase_if(runs[3].digest.steps, [](const StepDigest& step) { return step.step >= 40; });
  const RunReport report = MakeRunReport("/logs/plugins/profile/r", {}, runs, {}, true, kT0);
  ASSERT_EQ(report.analysis.hosts.size(), 3u);
  ASSERT_EQ(report.runs.size(), report.analysis.hosts.size()) << "one page per verdict";
  for (size_t i = 0; i < report.runs.size(); ++i) {
    EXPECT_EQ(report.runs[i].digest.host, report.analysis.hosts[i].host);
  }
  EXPECT_THAT(ReportHtml(report), ::testing::HasSubstr("host-2"));
}

TEST(MakeRunReportTest, WithoutALookbackTheVerdictIsOverEveryStep) {
  const RunReport report = MakeRunReport("/logs/plugins/profile/r", {}, Runs(0), {}, true);
  ASSERT_EQ(report.analysis.stragglers().size(), 1u);
  EXPECT_EQ(report.analysis.first_step, 0);
}

}  // namespace
}  // namespace clusterprof::analysis
