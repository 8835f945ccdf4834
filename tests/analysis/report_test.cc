// MakeRunReport: the verdict of a capture that reached back (a lookback) is over its window. The
// report at scale: hosts in natural order, packed steps that unpack exactly, the terminal table of
// thousands of hosts (the worst and a summary line), every host in the JSON, digests too large
// left out by name.
#include "analysis/report.h"

#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/digest_proto.h"
#include "analysis/report_html.h"
#include "common/base/strings.h"
#include "cpprest/json.h"
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
  EXPECT_EQ(window.runs[0].steps.size(), 60u);
}

TEST(MakeRunReportTest, AHostWhoseStepsAllCameBeforeTheStartHasNoVerdictAndNoPage) {
  // A workload that ended in the lookback: its steps are all before T0.
  std::vector<HostRun> runs = Runs(0);
  std::erase_if(runs[3].digest.steps, [](const StepDigest& step) { return step.step >= 40; });
  const RunReport report = MakeRunReport("/logs/plugins/profile/r", {}, runs, {}, true, kT0);
  ASSERT_EQ(report.analysis.hosts.size(), 3u);
  ASSERT_EQ(report.runs.size(), report.analysis.hosts.size()) << "one page per verdict";
  for (size_t i = 0; i < report.runs.size(); ++i) {
    EXPECT_EQ(report.runs[i].host, report.analysis.hosts[i].host);
  }
  EXPECT_THAT(ReportHtml(report), ::testing::HasSubstr("host-2"));
}

TEST(MakeRunReportTest, WithoutALookbackTheVerdictIsOverEveryStep) {
  const RunReport report = MakeRunReport("/logs/plugins/profile/r", {}, Runs(0), {}, true);
  ASSERT_EQ(report.analysis.stragglers().size(), 1u);
  EXPECT_EQ(report.analysis.first_step, 0);
}

// `hosts` hosts named node-N (no leading zeros: their natural order is not their byte order), in
// lockstep over `steps` steps of 100 ms, entries jittered by up to 2 ms; node-`slow` enters 30 ms
// late in every step.
std::vector<HostRun> ManyHosts(int hosts, int steps, int slow) {
  std::vector<HostRun> runs;
  for (int h = hosts - 1; h >= 0; --h) {  // given in reverse: the report puts them in order
    HostRun run;
    run.digest.host = StrCat("node-", h);
    run.clock_offset_ns = (h % 5 - 2) * kMs;
    for (int s = 0; s < steps; ++s) {
      StepDigest step;
      step.step = s;
      step.start_ns = kT0 + s * 100 * kMs + run.clock_offset_ns;
      step.end_ns = step.start_ns + 100 * kMs;
      const int64_t compute = 50 * kMs + ((h * 7919 + s * 104729) % 2000) * 1000;
      step.collective_entry_ns = step.start_ns + compute + (h == slow ? 30 * kMs : 0);
      step.device_busy_ns = compute - kMs + (h == slow ? 30 * kMs : 0);
      step.collective_ns = step.end_ns - step.collective_entry_ns;
      run.digest.steps.push_back(step);
    }
    runs.push_back(std::move(run));
  }
  return runs;
}

// The table's rows of hosts in a report's text.
size_t HostRows(const std::string& text) {
  std::istringstream lines(text);
  size_t rows = 0;
  for (std::string line; std::getline(lines, line);) rows += line.starts_with("  node-") ? 1 : 0;
  return rows;
}

TEST(NaturalLessTest, NumbersCompareAsNumbers) {
  EXPECT_TRUE(NaturalLess("h2", "h10"));
  EXPECT_FALSE(NaturalLess("h10", "h2"));
  EXPECT_TRUE(NaturalLess("h11", "h100"));
  EXPECT_TRUE(NaturalLess("trainer-9", "trainer-10"));
  EXPECT_TRUE(NaturalLess("rack2-gpu10", "rack10-gpu2"));
  EXPECT_TRUE(NaturalLess("a", "b"));
  EXPECT_TRUE(NaturalLess("host", "host-0"));
  EXPECT_TRUE(NaturalLess("h007", "h7")) << "equal numbers: more leading zeros first";
  EXPECT_FALSE(NaturalLess("h7", "h7"));
  std::vector<std::string> names = {"h100", "h11", "h2", "h1", "h10"};
  std::sort(names.begin(), names.end(), NaturalLess);
  EXPECT_THAT(names, ::testing::ElementsAre("h1", "h2", "h10", "h11", "h100"));
}

TEST(PackedStepsTest, UnpacksExactlyWhatWasPackedInAThirdOfTheSpace) {
  std::vector<StepDigest> steps = ManyHosts(1, 1000, -1)[0].digest.steps;
  // Extremes: steps out of order, times across the whole int64 range, no collective.
  steps.push_back({.step = -5,
                   .start_ns = std::numeric_limits<int64_t>::min(),
                   .end_ns = std::numeric_limits<int64_t>::max(),
                   .collective_entry_ns = 0,
                   .collective_ns = -1,
                   .device_busy_ns = std::numeric_limits<int64_t>::max(),
                   .host_busy_ns = std::numeric_limits<int64_t>::min(),
                   .input_ns = 7});
  steps.push_back({.step = std::numeric_limits<int64_t>::max(),
                   .start_ns = 0,
                   .end_ns = 0,
                   .collective_entry_ns = 0});
  const PackedSteps packed(steps);
  EXPECT_EQ(packed.size(), steps.size());
  EXPECT_LT(packed.bytes(), steps.size() * sizeof(StepDigest) / 2);
  const std::vector<StepDigest> back = packed.Unpack();
  ASSERT_EQ(back.size(), steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepDigest& a = steps[i];
    const StepDigest& b = back[i];
    EXPECT_EQ(std::tie(a.step, a.start_ns, a.end_ns, a.collective_entry_ns, a.collective_ns,
                       a.device_busy_ns, a.host_busy_ns, a.input_ns),
              std::tie(b.step, b.start_ns, b.end_ns, b.collective_entry_ns, b.collective_ns,
                       b.device_busy_ns, b.host_busy_ns, b.input_ns))
        << "step " << i;
  }
}

TEST(RunReportTest, ManyHostsTheTableShowsTheWorstAndOneLineForTheRest) {
  const RunReport report =
      MakeRunReport("/logs/plugins/profile/r", {}, ManyHosts(300, 40, 123), {}, true);
  ASSERT_EQ(report.analysis.hosts.size(), 300u);
  // Natural order of names throughout: node-2 before node-10.
  EXPECT_EQ(report.analysis.hosts[2].host, "node-2");
  EXPECT_EQ(report.analysis.hosts[10].host, "node-10");
  EXPECT_EQ(report.runs[10].host, "node-10");
  const std::vector<size_t> worst = HostsWorstFirst(report.analysis);
  EXPECT_EQ(report.analysis.hosts[worst[0]].host, "node-123");

  const std::string text = FormatReportText(report);
  EXPECT_THAT(text, ::testing::HasSubstr("STRAGGLER node-123 (compute)"));
  EXPECT_THAT(text, ::testing::HasSubstr("verdict\n  node-123 "))
      << "the straggler is the table's first row";
  EXPECT_THAT(text, ::testing::HasSubstr("\n  ... 280 more hosts "));
  EXPECT_THAT(text, ::testing::EndsWith("step p50 100.000 ms to 100.000 ms, late in 0 to 0 of 40 "
                                        "steps, none a straggler (--all lists every host)\n"));
  EXPECT_EQ(HostRows(text), kTextWorstHosts);

  const std::string all = FormatReportText(report, /*all=*/true);
  EXPECT_EQ(HostRows(all), 300u);
  EXPECT_LT(all.find("  node-9 "), all.find("  node-10 ")) << "--all: in natural order";
  EXPECT_THAT(all, ::testing::Not(::testing::HasSubstr("more hosts")));

  // The JSON keeps every host's verdict, in natural order.
  const web::json::value json = web::json::value::parse(ReportJson(report));
  ASSERT_EQ(json.at("hosts").size(), 300u);
  EXPECT_EQ(json.at("hosts").at(10).at("host").as_string(), "node-10");
  EXPECT_TRUE(json.at("hosts").at(123).at("straggler").as_bool());
}

TEST(RunReportTest, AFewHostsGetARowEachInNaturalOrder) {
  const RunReport report =
      MakeRunReport("/logs/plugins/profile/r", {}, ManyHosts(12, 20, 3), {}, true);
  const std::string text = FormatReportText(report);
  EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("more hosts")));
  size_t last = 0;
  for (int h = 0; h < 12; ++h) {
    const size_t at = text.find(StrCat("  node-", h, " "));
    ASSERT_NE(at, std::string::npos) << h;
    EXPECT_GT(at, last) << "node-" << h << " out of order";
    last = at;
  }
}

TEST(RunReportTest, ADigestOfTooManyStepsIsLeftOutByNameAndTheReportGoesOn) {
  std::vector<HostRun> runs = ManyHosts(3, 10, -1);
  HostRun huge;
  huge.digest.host = "node-huge";
  huge.digest.steps.resize(static_cast<size_t>(kMaxDigestSteps) + 1);
  runs.push_back(std::move(huge));
  const RunReport report = MakeRunReport("/logs/plugins/profile/r", {}, std::move(runs), {}, true);
  EXPECT_EQ(report.analysis.hosts.size(), 3u);
  EXPECT_EQ(report.analysis.compared_steps, 10);
  EXPECT_THAT(report.analysis.left_out,
              ::testing::ElementsAre(::testing::HasSubstr(
                  "node-huge: 100001 steps, more than the 100000 a host's digest may hold")));
}

}  // namespace
}  // namespace clusterprof::analysis
