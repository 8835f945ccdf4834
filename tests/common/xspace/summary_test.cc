#include "common/xspace/summary.h"

#include <limits>

#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/xspace_samples.h"

namespace clusterprof::xspace {
namespace {

using ::testing::HasSubstr;

TEST(SummaryTest, SmallXSpace) {
  const SpaceSummary s = Summarize(testing::SmallXSpace(), 3);
  EXPECT_THAT(s.hostnames, ::testing::ElementsAre("worker-0"));
  EXPECT_EQ(s.events, 8);
  ASSERT_EQ(s.planes.size(), 3u);
  EXPECT_EQ(s.planes[0].name, "/host:CPU");
  EXPECT_EQ(s.planes[0].events, 4);
  ASSERT_EQ(s.planes[0].lines.size(), 2u);
  EXPECT_EQ(s.planes[0].lines[0].name, "python3");
  EXPECT_EQ(s.planes[0].lines[0].events, 3);
  // Span: first event (counter sample at base) to the end of the memcpy (base + 7300 ns).
  EXPECT_EQ(s.end_ns - s.begin_ns, 7300);
  EXPECT_EQ(s.profile_stop_ns - s.profile_start_ns, 10'000);
  ASSERT_EQ(s.top_events.size(), 3u);
  EXPECT_EQ(s.top_events[0].name, "train_step");
  EXPECT_EQ(s.top_events[0].total_ps, 5'000'000);
  EXPECT_EQ(s.top_events[1].name, "gemm_kernel");
  EXPECT_EQ(s.top_events[2].name, "matmul");
}

TEST(SummaryTest, FormatIsReadable) {
  const std::string text = FormatSummary(Summarize(testing::SmallXSpace()), "h.xplane.pb");
  EXPECT_THAT(text, HasSubstr("h.xplane.pb"));
  EXPECT_THAT(text, HasSubstr("worker-0"));
  EXPECT_THAT(text, HasSubstr("/device:GPU:0"));
  EXPECT_THAT(text, HasSubstr("Stream #7(Kernel,MemcpyH2D)"));
  EXPECT_THAT(text, HasSubstr("train_step"));
  EXPECT_THAT(text, HasSubstr("5.000 us"));
  EXPECT_THAT(text, HasSubstr("warning:  sample warning"));
}

TEST(SummaryTest, LinesWithoutAThreadShowAsShortLaneNumbers) {
  SpaceSummary s;
  PlaneSummary plane;
  plane.id = 1;
  plane.name = "/host:CPU";
  plane.lines = {{8208, "trainer", 194},
                 {int64_t{1} << 40, "train_loop async", 11},
                 {(int64_t{1} << 40) + 1, "train_loop async 1", 11}};
  s.planes.push_back(plane);
  const std::string text = FormatSummary(s, "h.xplane.pb");
  EXPECT_THAT(text, HasSubstr("    line 8208       trainer "));
  EXPECT_THAT(text, HasSubstr("    lane 0          train_loop async "));
  EXPECT_THAT(text, HasSubstr("    lane 1          train_loop async 1 "));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("1099511627776")));
}

TEST(SummaryTest, FormatDuration) {
  EXPECT_EQ(FormatDurationPs(500), "500 ps");
  EXPECT_EQ(FormatDurationPs(1'500), "1.500 ns");
  EXPECT_EQ(FormatDurationPs(2'000'000'000'000), "2.000 s");
}

}  // namespace
}  // namespace clusterprof::xspace

namespace clusterprof::xspace {
namespace {

// Found by the xspace_reader fuzzer: sums and spans of extreme values saturate.
TEST(SummaryTest, ExtremeValuesSaturate) {
  XSpace space;
  XPlaneBuilder host(space.add_planes());
  host.SetName(kHostThreadsPlaneName);
  XLineBuilder line = host.GetOrCreateLine(1);
  line.SetTimestampNs(std::numeric_limits<int64_t>::max());
  for (int i = 0; i < 2; ++i) {
    XEventBuilder e = line.AddEvent(*host.GetOrCreateEventMetadata("long"));
    e.SetOffsetPs(std::numeric_limits<int64_t>::max());
    e.SetDurationPs(std::numeric_limits<int64_t>::max());
  }
  XLineBuilder early = host.GetOrCreateLine(2);
  early.SetTimestampNs(std::numeric_limits<int64_t>::min());
  early.AddEvent(*host.GetOrCreateEventMetadata("early"));
  XPlaneBuilder env(space.add_planes());
  env.SetName(kTaskEnvPlaneName);
  env.AddStatValue(*env.GetOrCreateStatMetadata(kProfileStartTime), 1e300);
  const SpaceSummary s = Summarize(space);
  ASSERT_FALSE(s.top_events.empty());
  EXPECT_EQ(s.top_events[0].total_ps, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(s.profile_start_ns, std::numeric_limits<int64_t>::max());
  const std::string text = FormatSummary(s, "extreme");
  EXPECT_THAT(text, HasSubstr("extreme"));
}

}  // namespace
}  // namespace clusterprof::xspace
