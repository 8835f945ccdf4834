// `clusterprof capture`'s summary at any size: every host up to 25, else what needs attention and
// one line for the rest (--all: every host).
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "common/base/strings.h"
#include "coordinator/coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// `n` hosts h0 .. h(n-1), all ok and 10 us late, but for the ones changed by the test.
coordinator::RunResult Hosts(int n) {
  coordinator::RunResult result;
  for (int i = 0; i < n; ++i) {
    coordinator::TargetResult& t = result.targets.emplace_back();
    t.host_name = StrCat("h", i);
    t.address = StrCat("10.0.0.", i, ":8466");
    t.outcome = coordinator::Outcome::kOk;
    t.is_sidecar = true;
    t.stats_known = true;
    t.events = 100;
    t.start_known = true;
    t.start_error_ns = 10'000;
  }
  result.succeeded = n;
  return result;
}

int Lines(const std::string& text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

TEST(CaptureSummaryTest, AFewHostsEachGetARow) {
  std::ostringstream out;
  PrintCaptureSummary(Hosts(25), false, out);
  for (int i = 0; i < 25; ++i) EXPECT_THAT(out.str(), HasSubstr(StrCat("  h", i, " "))) << i;
  EXPECT_THAT(out.str(), Not(HasSubstr("more hosts")));
}

TEST(CaptureSummaryTest, ManyHostsShowWhatNeedsAttentionAndOneLineForTheRest) {
  coordinator::RunResult result = Hosts(10'000);
  result.targets[7].outcome = coordinator::Outcome::kFailed;
  result.targets[7].message = "UNAVAILABLE: connection refused";
  result.targets[9'000].outcome = coordinator::Outcome::kEmpty;
  result.targets[4'242].start_error_ns = 3'500'000;  // late
  result.succeeded -= 2;
  result.failed = 1;
  result.empty = 1;
  std::ostringstream out;
  PrintCaptureSummary(result, false, out);
  const std::string text = out.str();
  EXPECT_LT(Lines(text), 12) << text;
  EXPECT_THAT(text, HasSubstr("h7 "));
  EXPECT_THAT(text, HasSubstr("UNAVAILABLE: connection refused"));
  EXPECT_THAT(text, HasSubstr("h9000 "));
  EXPECT_THAT(text, HasSubstr("h4242 "));
  EXPECT_THAT(text, HasSubstr("... 9997 more hosts: 999700 events, start error p50 +10 us, p99 "
                              "+10 us (--all lists every host)"));
  EXPECT_THAT(text, HasSubstr("9998 of 10000 hosts returned data (1 empty, 1 failed)"));

  std::ostringstream all;
  PrintCaptureSummary(result, true, all);
  EXPECT_GT(Lines(all.str()), 10'000);
}

TEST(CaptureSummaryTest, LookbacksNameTheTenThatReachLeast) {
  coordinator::RunResult result = Hosts(40);
  for (int i = 0; i < 40; ++i) result.targets[i].lookback_ns = (10 + i) * 1'000'000'000LL;
  result.targets[33].lookback_ns = 2'000'000'000;
  std::ostringstream out;
  PrintCaptureSummary(result, false, out);
  EXPECT_THAT(out.str(), HasSubstr("lookback before the start: h33 2.0 s, h0 10.0 s, h1 11.0 s"));
  EXPECT_THAT(out.str(), HasSubstr(", and 30 more"));
}

}  // namespace
}  // namespace clusterprof::cli
