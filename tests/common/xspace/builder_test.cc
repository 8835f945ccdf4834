#include "common/xspace/builder.h"

#include "common/xspace/schema.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::xspace {
namespace {

TEST(XPlaneBuilderTest, InternsMetadataByName) {
  XPlane plane;
  XPlaneBuilder builder(&plane);
  XEventMetadata* a = builder.GetOrCreateEventMetadata("a");
  XEventMetadata* b = builder.GetOrCreateEventMetadata("b");
  EXPECT_EQ(builder.GetOrCreateEventMetadata("a"), a);
  EXPECT_NE(a->id(), b->id());
  EXPECT_GT(a->id(), 0);
  EXPECT_EQ(plane.event_metadata().size(), 2u);
  EXPECT_EQ(plane.event_metadata().at(a->id()).name(), "a");

  XStatMetadata* s = builder.GetOrCreateStatMetadata("step_num");
  EXPECT_EQ(builder.GetOrCreateStatMetadata("step_num"), s);
  EXPECT_EQ(plane.stat_metadata().at(s->id()).name(), "step_num");
}

TEST(XPlaneBuilderTest, IndexesAnExistingPlane) {
  XPlane plane;
  {
    XPlaneBuilder builder(&plane);
    builder.GetOrCreateEventMetadata("a");
    builder.GetOrCreateLine(5).SetName("t");
  }
  XPlaneBuilder again(&plane);
  EXPECT_EQ(again.GetOrCreateEventMetadata("a")->id(), 1);
  EXPECT_EQ(again.GetOrCreateEventMetadata("new")->id(), 2);
  again.GetOrCreateLine(5);
  EXPECT_EQ(plane.lines_size(), 1);
}

TEST(XPlaneBuilderTest, EventsAndStatsOfEveryType) {
  XPlane plane;
  XPlaneBuilder builder(&plane);
  XLineBuilder line = builder.GetOrCreateLine(42);
  line.SetName("worker");
  line.SetTimestampNs(1000);
  XEventBuilder event = line.AddEvent(*builder.GetOrCreateEventMetadata("op"));
  event.SetTimestampNs(1500);
  event.SetEndTimestampNs(1750);
  event.AddStatValue(*builder.GetOrCreateStatMetadata("i"), -3);
  event.AddStatValue(*builder.GetOrCreateStatMetadata("u"), 3u);
  event.AddStatValue(*builder.GetOrCreateStatMetadata("b"), true);
  event.AddStatValue(*builder.GetOrCreateStatMetadata("d"), 2.5);
  event.AddStatValue(*builder.GetOrCreateStatMetadata("s"), "text");
  event.AddStatValue(*builder.GetOrCreateStatMetadata("bytes"), Bytes{"\0\1"});
  event.AddStatValue(*builder.GetOrCreateStatMetadata("ref"),
                     *builder.GetOrCreateStatMetadata("interned"));

  ASSERT_EQ(plane.lines_size(), 1);
  const XLine& l = plane.lines(0);
  EXPECT_EQ(l.id(), 42);
  EXPECT_EQ(l.display_id(), 42);
  ASSERT_EQ(l.events_size(), 1);
  const XEvent& e = l.events(0);
  EXPECT_EQ(e.offset_ps(), 500'000);
  EXPECT_EQ(e.duration_ps(), 250'000);
  ASSERT_EQ(e.stats_size(), 7);
  EXPECT_EQ(e.stats(0).int64_value(), -3);
  EXPECT_EQ(e.stats(1).uint64_value(), 3u);
  EXPECT_EQ(e.stats(2).int64_value(), 1);
  EXPECT_EQ(e.stats(3).double_value(), 2.5);
  EXPECT_EQ(e.stats(4).str_value(), "text");
  EXPECT_EQ(e.stats(5).value_case(), XStat::kBytesValue);
  EXPECT_EQ(e.stats(6).value_case(), XStat::kRefValue);
  EXPECT_EQ(plane.stat_metadata().at(static_cast<int64_t>(e.stats(6).ref_value())).name(),
            "interned");
}

TEST(XPlaneBuilderTest, ParseAndAddStatValueTypesLikeTraceMe) {
  XPlane plane;
  XPlaneBuilder builder(&plane);
  XEventBuilder event =
      builder.GetOrCreateLine(1).AddEvent(*builder.GetOrCreateEventMetadata("op"));
  event.ParseAndAddStatValue(*builder.GetOrCreateStatMetadata("a"), "12");
  event.ParseAndAddStatValue(*builder.GetOrCreateStatMetadata("b"), "18446744073709551615");
  event.ParseAndAddStatValue(*builder.GetOrCreateStatMetadata("c"), "0.5");
  event.ParseAndAddStatValue(*builder.GetOrCreateStatMetadata("d"), "[1,2]");
  const XEvent& e = plane.lines(0).events(0);
  EXPECT_EQ(e.stats(0).value_case(), XStat::kInt64Value);
  EXPECT_EQ(e.stats(1).value_case(), XStat::kUint64Value);
  EXPECT_EQ(e.stats(2).value_case(), XStat::kDoubleValue);
  ASSERT_EQ(e.stats(3).value_case(), XStat::kRefValue);
  EXPECT_EQ(plane.stat_metadata().at(static_cast<int64_t>(e.stats(3).ref_value())).name(), "[1,2]");
}

TEST(XSpaceUtilTest, FindOrAddPlaneAndEmptiness) {
  XSpace space;
  EXPECT_TRUE(IsEmpty(space));
  XPlane* host = FindOrAddMutablePlaneWithName(&space, kHostThreadsPlaneName);
  XPlane* gpu = FindOrAddMutablePlaneWithName(&space, "/device:GPU:0");
  EXPECT_EQ(FindOrAddMutablePlaneWithName(&space, kHostThreadsPlaneName), host);
  EXPECT_NE(host->id(), gpu->id());
  EXPECT_EQ(FindPlaneWithName(space, "/device:GPU:0"), gpu);
  EXPECT_EQ(FindPlaneWithName(space, "missing"), nullptr);
  XPlaneBuilder builder(host);
  builder.GetOrCreateLine(1);
  EXPECT_TRUE(IsEmpty(space)) << "a line without events is still empty";
  builder.GetOrCreateLine(1).AddEvent(*builder.GetOrCreateEventMetadata("e"));
  EXPECT_FALSE(IsEmpty(space));
  EXPECT_EQ(CountEvents(space), 1);
}

TEST(XSpaceUtilTest, SortPutsParentsBeforeChildren) {
  XSpace space;
  XPlaneBuilder builder(space.add_planes());
  XLineBuilder line = builder.GetOrCreateLine(1);
  auto add = [&](const char* name, int64_t offset_ps, int64_t duration_ps) {
    XEventBuilder e = line.AddEvent(*builder.GetOrCreateEventMetadata(name));
    e.SetOffsetPs(offset_ps);
    e.SetDurationPs(duration_ps);
  };
  add("late", 500, 10);
  add("child", 100, 10);
  add("parent", 100, 100);
  SortXSpace(&space);
  std::vector<std::string> order;
  for (const XEvent& e : space.planes(0).lines(0).events()) {
    order.push_back(space.planes(0).event_metadata().at(e.metadata_id()).name());
  }
  EXPECT_THAT(order, ::testing::ElementsAre("parent", "child", "late"));
}

}  // namespace
}  // namespace clusterprof::xspace
