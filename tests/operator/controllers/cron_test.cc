#include "operator/controllers/cron.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::controllers {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;

const absl::TimeZone kUtc = absl::UTCTimeZone();

absl::Time Utc(int y, int mo, int d, int h, int mi, int s = 0) {
  return absl::FromCivil(absl::CivilSecond(y, mo, d, h, mi, s), kUtc);
}

// RFC 3339 with an explicit offset, e.g. "2024-03-10T03:00:00-04:00".
absl::Time Rfc(std::string_view text) {
  absl::Time t;
  std::string error;
  EXPECT_TRUE(absl::ParseTime(absl::RFC3339_full, AbslView(text), &t, &error))
      << text << ": " << error;
  return t;
}

CronSchedule MustParse(std::string_view spec) {
  absl::StatusOr<CronSchedule> schedule = CronSchedule::Parse(spec);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  return schedule.ok() ? *schedule : *CronSchedule::Parse("* * * * *");
}

// The zone from the system tz database, or nullopt (the test then skips).
std::optional<absl::TimeZone> SystemZone(const char* name) {
  absl::TimeZone zone;
  if (!absl::LoadTimeZone(name, &zone)) return std::nullopt;
  return zone;
}

#define ZONE_OR_SKIP(var, name)                                                      \
  std::optional<absl::TimeZone> var##_or = SystemZone(name);                         \
  if (!var##_or) GTEST_SKIP() << "the tz database has no " name " (install tzdata)"; \
  const absl::TimeZone var = *var##_or

// The next `n` fire times after `after`.
std::vector<absl::Time> NextN(const CronSchedule& schedule, absl::Time after, int n,
                              absl::TimeZone zone) {
  std::vector<absl::Time> times;
  for (int i = 0; i < n; ++i) {
    std::optional<absl::Time> next = schedule.Next(after, zone);
    if (!next) break;
    times.push_back(*next);
    after = *next;
  }
  return times;
}

// ----------------------------------------------------------------------------------------------
// Parsing errors

struct BadSpec {
  std::string_view spec;
  std::string_view message;
};

TEST(CronScheduleParseTest, RejectsBadSchedulesWithPreciseMessages) {
  const BadSpec kCases[] = {
      {"",
       "schedule \"\": empty; expected 5 fields (minute hour day-of-month month day-of-week) or a "
       "descriptor such as @daily"},
      {"   ",
       "schedule \"   \": empty; expected 5 fields (minute hour day-of-month month day-of-week) "
       "or a descriptor such as @daily"},
      {"* * * *",
       "schedule \"* * * *\": expected 5 fields (minute hour day-of-month month day-of-week), "
       "got 4"},
      {"0 * * * * *",
       "schedule \"0 * * * * *\": expected 5 fields (minute hour day-of-month month "
       "day-of-week), got 6; a seconds field is not supported"},
      {"61 * * * *", "schedule \"61 * * * *\": minute field: 61 is out of range 0-59"},
      {"* 24 * * *", "schedule \"* 24 * * *\": hour field: 24 is out of range 0-23"},
      {"* * 0 * *", "schedule \"* * 0 * *\": day-of-month field: 0 is out of range 1-31"},
      {"* * 32 * *", "schedule \"* * 32 * *\": day-of-month field: 32 is out of range 1-31"},
      {"* * * 0 *", "schedule \"* * * 0 *\": month field: 0 is out of range 1-12"},
      {"* * * 13 *", "schedule \"* * * 13 *\": month field: 13 is out of range 1-12"},
      {"* * * * 8", "schedule \"* * * * 8\": day-of-week field: 8 is out of range 0-7"},
      {"99999999999999999999 * * * *",
       "schedule \"99999999999999999999 * * * *\": minute field: 99999999999999999999 is out of "
       "range 0-59"},
      {"0-60 * * * *", "schedule \"0-60 * * * *\": minute field: 60 is out of range 0-59"},
      {"x * * * *", "schedule \"x * * * *\": minute field: \"x\" is not a number"},
      {"+5 * * * *", "schedule \"+5 * * * *\": minute field: \"+5\" is not a number"},
      {"1.5 * * * *", "schedule \"1.5 * * * *\": minute field: \"1.5\" is not a number"},
      {"MON * * * *", "schedule \"MON * * * *\": minute field: \"MON\" is not a number"},
      {"* * * FOO *",
       "schedule \"* * * FOO *\": month field: \"FOO\" is not a number or a month name "
       "(JAN-DEC)"},
      {"* * * MON *",
       "schedule \"* * * MON *\": month field: \"MON\" is not a number or a month name "
       "(JAN-DEC)"},
      {"* * * JANUARY *",
       "schedule \"* * * JANUARY *\": month field: \"JANUARY\" is not a number or a month name "
       "(JAN-DEC)"},
      {"* * * * MONDAY",
       "schedule \"* * * * MONDAY\": day-of-week field: \"MONDAY\" is not a number or a day name "
       "(SUN-SAT)"},
      {"* * * * JAN",
       "schedule \"* * * * JAN\": day-of-week field: \"JAN\" is not a number or a day name "
       "(SUN-SAT)"},
      {"5-3 * * * *",
       "schedule \"5-3 * * * *\": minute field: range \"5-3\" runs backwards; the start must not "
       "be greater than the end"},
      {"* * * * SAT-SUN",
       "schedule \"* * * * SAT-SUN\": day-of-week field: range \"SAT-SUN\" runs backwards; the "
       "start must not be greater than the end"},
      {"*/0 * * * *",
       "schedule \"*/0 * * * *\": minute field: step 0 in \"*/0\" must be at least 1"},
      {"1-5/0 * * * *",
       "schedule \"1-5/0 * * * *\": minute field: step 0 in \"1-5/0\" must be at least 1"},
      {"*/x * * * *",
       "schedule \"*/x * * * *\": minute field: step \"x\" in \"*/x\" is not a number"},
      {"*/-1 * * * *",
       "schedule \"*/-1 * * * *\": minute field: step \"-1\" in \"*/-1\" is not a number"},
      {"*/ * * * *",
       "schedule \"*/ * * * *\": minute field: \"*/\" is missing the step after \"/\""},
      {"1/2/3 * * * *",
       "schedule \"1/2/3 * * * *\": minute field: \"1/2/3\" has more than one \"/\""},
      {"1-2-3 * * * *",
       "schedule \"1-2-3 * * * *\": minute field: \"1-2-3\" has more than one \"-\""},
      {"-5 * * * *",
       "schedule \"-5 * * * *\": minute field: \"-5\" is missing a value before \"-\""},
      {"5- * * * *",
       "schedule \"5- * * * *\": minute field: \"5-\" is missing a value after \"-\""},
      {"*-5 * * * *", "schedule \"*-5 * * * *\": minute field: \"*\" is not a number"},
      {"1,,2 * * * *", "schedule \"1,,2 * * * *\": minute field: empty element in list \"1,,2\""},
      {",1 * * * *", "schedule \",1 * * * *\": minute field: empty element in list \",1\""},
      {"1, * * * *", "schedule \"1, * * * *\": minute field: empty element in list \"1,\""},
      {"? * * * *",
       "schedule \"? * * * *\": minute field: \"?\" is only allowed in the day-of-month and "
       "day-of-week fields"},
      {"* ? * * *",
       "schedule \"* ? * * *\": hour field: \"?\" is only allowed in the day-of-month and "
       "day-of-week fields"},
      {"* * * ? *",
       "schedule \"* * * ? *\": month field: \"?\" is only allowed in the day-of-month and "
       "day-of-week fields"},
      {"@every 5m",
       "schedule \"@every 5m\": @every is not supported by ProfileSchedule (nor by Kubernetes "
       "CronJob); write a 5-field schedule such as \"*/5 * * * *\""},
      {"@EVERY 1h",
       "schedule \"@EVERY 1h\": @every is not supported by ProfileSchedule (nor by Kubernetes "
       "CronJob); write a 5-field schedule such as \"*/5 * * * *\""},
      {"@reboot",
       "schedule \"@reboot\": @reboot is not supported by ProfileSchedule (nor by Kubernetes "
       "CronJob); write a 5-field schedule such as \"*/5 * * * *\""},
      {"@fortnightly",
       "schedule \"@fortnightly\": unknown descriptor \"@fortnightly\"; use one of @yearly, "
       "@annually, @monthly, @weekly, @daily, @midnight, @hourly, or 5 fields (minute hour "
       "day-of-month month day-of-week)"},
      {"@daily 5", "schedule \"@daily 5\": descriptor @daily takes nothing after it"},
      {"TZ=Europe/Berlin 0 3 * * *",
       "schedule \"TZ=Europe/Berlin 0 3 * * *\": a TZ= prefix is not supported; remove it and "
       "set spec.timeZone to \"Europe/Berlin\""},
      {"CRON_TZ=America/New_York 0 3 * * *",
       "schedule \"CRON_TZ=America/New_York 0 3 * * *\": a CRON_TZ= prefix is not supported; "
       "remove it and set spec.timeZone to \"America/New_York\""},
      {"0\t61 * * *", "schedule \"0\\t61 * * *\": hour field: 61 is out of range 0-23"},
  };
  for (const BadSpec& c : kCases) {
    absl::StatusOr<CronSchedule> schedule = CronSchedule::Parse(c.spec);
    ASSERT_FALSE(schedule.ok()) << c.spec;
    EXPECT_EQ(schedule.status().code(), absl::StatusCode::kInvalidArgument) << c.spec;
    EXPECT_EQ(StdView(schedule.status().message()), c.message) << c.spec;
  }
}

TEST(CronScheduleParseTest, KeepsTheSpecTextAndAcceptsExtraWhitespace) {
  for (std::string_view spec : {"0 12 * * *", "  0\t12   *  * *\n", "0 12 * * ?"}) {
    absl::StatusOr<CronSchedule> schedule = CronSchedule::Parse(spec);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    EXPECT_EQ(schedule->spec(), spec);
    EXPECT_THAT(schedule->Next(Utc(2024, 5, 1, 0, 0), kUtc), Optional(Utc(2024, 5, 1, 12, 0)));
  }
}

// ----------------------------------------------------------------------------------------------
// Token forms, read back through Matches.

std::vector<int> MinutesOf(std::string_view field) {
  CronSchedule s = MustParse(std::string(field) + " * * * *");
  std::vector<int> out;
  for (int m = 0; m < 60; ++m) {
    if (s.Matches(absl::CivilMinute(2024, 1, 1, 0, m))) out.push_back(m);
  }
  return out;
}

std::vector<int> HoursOf(std::string_view field) {
  CronSchedule s = MustParse("0 " + std::string(field) + " * * *");
  std::vector<int> out;
  for (int h = 0; h < 24; ++h) {
    if (s.Matches(absl::CivilMinute(2024, 1, 1, h, 0))) out.push_back(h);
  }
  return out;
}

// Days of January 2024 (a month of 31 days).
std::vector<int> DaysOfMonthOf(std::string_view field) {
  CronSchedule s = MustParse("0 0 " + std::string(field) + " * *");
  std::vector<int> out;
  for (int d = 1; d <= 31; ++d) {
    if (s.Matches(absl::CivilMinute(2024, 1, d, 0, 0))) out.push_back(d);
  }
  return out;
}

std::vector<int> MonthsOf(std::string_view field) {
  CronSchedule s = MustParse("0 0 1 " + std::string(field) + " *");
  std::vector<int> out;
  for (int m = 1; m <= 12; ++m) {
    if (s.Matches(absl::CivilMinute(2024, m, 1, 0, 0))) out.push_back(m);
  }
  return out;
}

// 2024-01-07 is a Sunday, so day 7 + w is cron weekday w.
std::vector<int> WeekdaysOf(std::string_view field) {
  CronSchedule s = MustParse("0 0 * * " + std::string(field));
  std::vector<int> out;
  for (int w = 0; w < 7; ++w) {
    if (s.Matches(absl::CivilMinute(2024, 1, 7 + w, 0, 0))) out.push_back(w);
  }
  return out;
}

std::vector<int> Iota(int first, int last) {
  std::vector<int> out;
  for (int i = first; i <= last; ++i) out.push_back(i);
  return out;
}

TEST(CronScheduleParseTest, MinuteTokens) {
  EXPECT_EQ(MinutesOf("*"), Iota(0, 59));
  EXPECT_EQ(MinutesOf("*/1"), Iota(0, 59));
  EXPECT_THAT(MinutesOf("5"), ElementsAre(5));
  EXPECT_THAT(MinutesOf("05"), ElementsAre(5));
  EXPECT_THAT(MinutesOf("0"), ElementsAre(0));
  EXPECT_THAT(MinutesOf("59"), ElementsAre(59));
  EXPECT_THAT(MinutesOf("5-8"), ElementsAre(5, 6, 7, 8));
  EXPECT_THAT(MinutesOf("7-7"), ElementsAre(7));
  EXPECT_THAT(MinutesOf("*/15"), ElementsAre(0, 15, 30, 45));
  EXPECT_THAT(MinutesOf("*/45"), ElementsAre(0, 45));
  EXPECT_THAT(MinutesOf("10-30/10"), ElementsAre(10, 20, 30));
  EXPECT_THAT(MinutesOf("10-31/10"), ElementsAre(10, 20, 30));
  EXPECT_THAT(MinutesOf("50/4"), ElementsAre(50, 54, 58));
  EXPECT_THAT(MinutesOf("1,2,40-42"), ElementsAre(1, 2, 40, 41, 42));
  EXPECT_THAT(MinutesOf("0-59/30,7"), ElementsAre(0, 7, 30));
  EXPECT_THAT(MinutesOf("3,3,3"), ElementsAre(3));
  EXPECT_THAT(MinutesOf("*/60"), ElementsAre(0));
  EXPECT_THAT(MinutesOf("*/99999999999999999999"), ElementsAre(0));
}

TEST(CronScheduleParseTest, HourTokens) {
  EXPECT_EQ(HoursOf("*"), Iota(0, 23));
  EXPECT_THAT(HoursOf("9-17/4"), ElementsAre(9, 13, 17));
  EXPECT_THAT(HoursOf("23"), ElementsAre(23));
  EXPECT_THAT(HoursOf("22/1"), ElementsAre(22, 23));
  EXPECT_THAT(HoursOf("0,12"), ElementsAre(0, 12));
}

TEST(CronScheduleParseTest, DayOfMonthTokens) {
  EXPECT_EQ(DaysOfMonthOf("*"), Iota(1, 31));
  EXPECT_EQ(DaysOfMonthOf("?"), Iota(1, 31));
  EXPECT_THAT(DaysOfMonthOf("1,15,31"), ElementsAre(1, 15, 31));
  EXPECT_THAT(DaysOfMonthOf("*/10"), ElementsAre(1, 11, 21, 31));
  EXPECT_THAT(DaysOfMonthOf("28/2"), ElementsAre(28, 30));
  EXPECT_THAT(DaysOfMonthOf("?/15"), ElementsAre(1, 16, 31));
}

TEST(CronScheduleParseTest, MonthTokensAndNames) {
  EXPECT_EQ(MonthsOf("*"), Iota(1, 12));
  EXPECT_THAT(MonthsOf("JAN"), ElementsAre(1));
  EXPECT_THAT(MonthsOf("dec"), ElementsAre(12));
  EXPECT_THAT(MonthsOf("jan-Mar"), ElementsAre(1, 2, 3));
  EXPECT_THAT(MonthsOf("oct,Nov"), ElementsAre(10, 11));
  EXPECT_THAT(MonthsOf("*/3"), ElementsAre(1, 4, 7, 10));
  EXPECT_THAT(MonthsOf("2/5"), ElementsAre(2, 7, 12));
  EXPECT_THAT(MonthsOf("FEB-aug/3"), ElementsAre(2, 5, 8));
  EXPECT_THAT(MonthsOf("6-SEP"), ElementsAre(6, 7, 8, 9));
}

TEST(CronScheduleParseTest, DayOfWeekTokensNamesAndSeven) {
  EXPECT_EQ(WeekdaysOf("*"), Iota(0, 6));
  EXPECT_EQ(WeekdaysOf("?"), Iota(0, 6));
  EXPECT_EQ(WeekdaysOf("0-7"), Iota(0, 6));
  EXPECT_THAT(WeekdaysOf("MON-FRI"), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_THAT(WeekdaysOf("Tue-thu"), ElementsAre(2, 3, 4));
  EXPECT_THAT(WeekdaysOf("sun"), ElementsAre(0));
  EXPECT_THAT(WeekdaysOf("SAT"), ElementsAre(6));
  EXPECT_THAT(WeekdaysOf("0"), ElementsAre(0));
  EXPECT_THAT(WeekdaysOf("7"), ElementsAre(0));
  EXPECT_THAT(WeekdaysOf("0,7"), ElementsAre(0));
  EXPECT_THAT(WeekdaysOf("5-7"), ElementsAre(0, 5, 6));
  EXPECT_THAT(WeekdaysOf("FRI-7"), ElementsAre(0, 5, 6));
  EXPECT_THAT(WeekdaysOf("*/2"), ElementsAre(0, 2, 4, 6));
  // "a/step" and `*` stop at 6, as in robfig/cron: 7 only comes in when written.
  EXPECT_THAT(WeekdaysOf("1/2"), ElementsAre(1, 3, 5));
  EXPECT_THAT(WeekdaysOf("7/2"), ElementsAre(0));
}

TEST(CronScheduleParseTest, Descriptors) {
  // 2024-03-05 is a Tuesday.
  const absl::Time after = Utc(2024, 3, 5, 10, 0);
  EXPECT_THAT(MustParse("@yearly").Next(after, kUtc), Optional(Utc(2025, 1, 1, 0, 0)));
  EXPECT_THAT(MustParse("@annually").Next(after, kUtc), Optional(Utc(2025, 1, 1, 0, 0)));
  EXPECT_THAT(MustParse("@monthly").Next(after, kUtc), Optional(Utc(2024, 4, 1, 0, 0)));
  EXPECT_THAT(MustParse("@weekly").Next(after, kUtc), Optional(Utc(2024, 3, 10, 0, 0)));
  EXPECT_THAT(MustParse("@daily").Next(after, kUtc), Optional(Utc(2024, 3, 6, 0, 0)));
  EXPECT_THAT(MustParse("@midnight").Next(after, kUtc), Optional(Utc(2024, 3, 6, 0, 0)));
  EXPECT_THAT(MustParse("@hourly").Next(after, kUtc), Optional(Utc(2024, 3, 5, 11, 0)));
  EXPECT_THAT(MustParse("@Daily").Next(after, kUtc), Optional(Utc(2024, 3, 6, 0, 0)));
  EXPECT_THAT(MustParse("  @HOURLY \n").Next(after, kUtc), Optional(Utc(2024, 3, 5, 11, 0)));
  EXPECT_EQ(MustParse("@weekly").spec(), "@weekly");
  // @weekly is "0 0 * * 0": day-of-month unrestricted, so only Sundays.
  EXPECT_THAT(NextN(MustParse("@weekly"), after, 3, kUtc),
              ElementsAre(Utc(2024, 3, 10, 0, 0), Utc(2024, 3, 17, 0, 0), Utc(2024, 3, 24, 0, 0)));
  // @monthly is "0 0 1 * *": day-of-week unrestricted, so only the 1st.
  EXPECT_THAT(NextN(MustParse("@monthly"), after, 3, kUtc),
              ElementsAre(Utc(2024, 4, 1, 0, 0), Utc(2024, 5, 1, 0, 0), Utc(2024, 6, 1, 0, 0)));
}

// ----------------------------------------------------------------------------------------------
// Next and Prev in UTC

TEST(CronScheduleTest, NextIsStrictlyAfterAndPrevIsAtOrBefore) {
  // 2024-03-08 is a Friday, 2024-03-11 a Monday.
  const CronSchedule s = MustParse("30 9 * * MON-FRI");
  EXPECT_THAT(s.Next(Utc(2024, 3, 8, 10, 0), kUtc), Optional(Utc(2024, 3, 11, 9, 30)));
  EXPECT_THAT(s.Next(Utc(2024, 3, 11, 9, 30), kUtc), Optional(Utc(2024, 3, 12, 9, 30)));
  EXPECT_THAT(s.Next(Utc(2024, 3, 11, 9, 29, 59), kUtc), Optional(Utc(2024, 3, 11, 9, 30)));
  EXPECT_THAT(s.Next(Utc(2024, 3, 11, 9, 30) - absl::Nanoseconds(1), kUtc),
              Optional(Utc(2024, 3, 11, 9, 30)));
  EXPECT_THAT(s.Prev(Utc(2024, 3, 11, 9, 30), kUtc), Optional(Utc(2024, 3, 11, 9, 30)));
  EXPECT_THAT(s.Prev(Utc(2024, 3, 11, 9, 30, 1), kUtc), Optional(Utc(2024, 3, 11, 9, 30)));
  EXPECT_THAT(s.Prev(Utc(2024, 3, 11, 9, 29, 59), kUtc), Optional(Utc(2024, 3, 8, 9, 30)));
  EXPECT_THAT(s.Prev(Utc(2024, 3, 10, 23, 0), kUtc), Optional(Utc(2024, 3, 8, 9, 30)));
}

TEST(CronScheduleTest, OrdinarySchedulesInUtc) {
  const CronSchedule quarter = MustParse("*/15 * * * *");
  EXPECT_THAT(quarter.Next(Utc(2024, 6, 1, 10, 7, 30), kUtc), Optional(Utc(2024, 6, 1, 10, 15)));
  EXPECT_THAT(quarter.Prev(Utc(2024, 6, 1, 10, 7, 30), kUtc), Optional(Utc(2024, 6, 1, 10, 0)));
  EXPECT_THAT(quarter.Next(Utc(2024, 12, 31, 23, 45), kUtc), Optional(Utc(2025, 1, 1, 0, 0)));

  const CronSchedule new_year = MustParse("0 0 1 1 *");
  EXPECT_THAT(new_year.Next(Utc(2024, 12, 31, 23, 59), kUtc), Optional(Utc(2025, 1, 1, 0, 0)));
  EXPECT_THAT(new_year.Prev(Utc(2025, 6, 1, 0, 0), kUtc), Optional(Utc(2025, 1, 1, 0, 0)));
  EXPECT_THAT(new_year.Prev(Utc(2024, 12, 31, 23, 59), kUtc), Optional(Utc(2024, 1, 1, 0, 0)));

  const CronSchedule year_end = MustParse("59 23 31 12 *");
  EXPECT_THAT(year_end.Prev(Utc(2025, 1, 1, 0, 0), kUtc), Optional(Utc(2024, 12, 31, 23, 59)));
  EXPECT_THAT(year_end.Next(Utc(2025, 1, 1, 0, 0), kUtc), Optional(Utc(2025, 12, 31, 23, 59)));

  // The 31st skips months with 30 days or fewer.
  const CronSchedule thirty_first = MustParse("0 0 31 * *");
  EXPECT_THAT(NextN(thirty_first, Utc(2024, 1, 31, 0, 0), 4, kUtc),
              ElementsAre(Utc(2024, 3, 31, 0, 0), Utc(2024, 5, 31, 0, 0), Utc(2024, 7, 31, 0, 0),
                          Utc(2024, 8, 31, 0, 0)));
  EXPECT_THAT(thirty_first.Prev(Utc(2024, 3, 30, 0, 0), kUtc), Optional(Utc(2024, 1, 31, 0, 0)));

  const CronSchedule office = MustParse("0 9-17/4 * * *");
  EXPECT_THAT(NextN(office, Utc(2024, 6, 1, 9, 0), 4, kUtc),
              ElementsAre(Utc(2024, 6, 1, 13, 0), Utc(2024, 6, 1, 17, 0), Utc(2024, 6, 2, 9, 0),
                          Utc(2024, 6, 2, 13, 0)));
  EXPECT_THAT(office.Prev(Utc(2024, 6, 2, 8, 59), kUtc), Optional(Utc(2024, 6, 1, 17, 0)));

  const CronSchedule every_minute = MustParse("* * * * *");
  EXPECT_THAT(every_minute.Next(Utc(2024, 2, 29, 23, 59, 59), kUtc),
              Optional(Utc(2024, 3, 1, 0, 0)));
  EXPECT_THAT(every_minute.Prev(Utc(2024, 3, 1, 0, 0, 59), kUtc), Optional(Utc(2024, 3, 1, 0, 0)));
}

TEST(CronScheduleTest, DayOfMonthOrDayOfWeekWhenBothAreRestricted) {
  // September 2024 starts on a Sunday; the 13th is a Friday.
  const absl::Time start = Utc(2024, 9, 1, 0, 0);
  // Both restricted: the 13th or any Monday.
  EXPECT_THAT(NextN(MustParse("0 0 13 * 1"), start, 4, kUtc),
              ElementsAre(Utc(2024, 9, 2, 0, 0), Utc(2024, 9, 9, 0, 0), Utc(2024, 9, 13, 0, 0),
                          Utc(2024, 9, 16, 0, 0)));
  EXPECT_THAT(MustParse("0 0 13 * 1").Prev(Utc(2024, 9, 15, 0, 0), kUtc),
              Optional(Utc(2024, 9, 13, 0, 0)));
  // "*/2" has a step, so it is restricted (robfig/cron): odd days or Mondays.
  EXPECT_THAT(NextN(MustParse("0 0 */2 * 1"), start, 5, kUtc),
              ElementsAre(Utc(2024, 9, 2, 0, 0), Utc(2024, 9, 3, 0, 0), Utc(2024, 9, 5, 0, 0),
                          Utc(2024, 9, 7, 0, 0), Utc(2024, 9, 9, 0, 0)));
  // Day-of-week "*/2" (Sun, Tue, Thu, Sat) is restricted too: those days or the 13th.
  EXPECT_THAT(NextN(MustParse("0 0 13 * */2"), Utc(2024, 9, 10, 0, 0), 3, kUtc),
              ElementsAre(Utc(2024, 9, 12, 0, 0), Utc(2024, 9, 13, 0, 0), Utc(2024, 9, 14, 0, 0)));
}

TEST(CronScheduleTest, DayOfMonthAndDayOfWeekWhenEitherIsUnrestricted) {
  const absl::Time start = Utc(2024, 9, 1, 0, 0);
  EXPECT_THAT(NextN(MustParse("0 0 * * 1"), start, 3, kUtc),
              ElementsAre(Utc(2024, 9, 2, 0, 0), Utc(2024, 9, 9, 0, 0), Utc(2024, 9, 16, 0, 0)));
  EXPECT_THAT(NextN(MustParse("0 0 ? * MON"), start, 3, kUtc),
              ElementsAre(Utc(2024, 9, 2, 0, 0), Utc(2024, 9, 9, 0, 0), Utc(2024, 9, 16, 0, 0)));
  // "*/1" and a list holding `*` are unrestricted, like `*`.
  EXPECT_THAT(NextN(MustParse("0 0 */1 * 1"), start, 3, kUtc),
              ElementsAre(Utc(2024, 9, 2, 0, 0), Utc(2024, 9, 9, 0, 0), Utc(2024, 9, 16, 0, 0)));
  EXPECT_THAT(NextN(MustParse("0 0 1,* * 1"), start, 3, kUtc),
              ElementsAre(Utc(2024, 9, 2, 0, 0), Utc(2024, 9, 9, 0, 0), Utc(2024, 9, 16, 0, 0)));
  EXPECT_THAT(NextN(MustParse("0 0 13 * *"), start, 2, kUtc),
              ElementsAre(Utc(2024, 9, 13, 0, 0), Utc(2024, 10, 13, 0, 0)));
  EXPECT_THAT(NextN(MustParse("0 0 13 * ?"), start, 2, kUtc),
              ElementsAre(Utc(2024, 9, 13, 0, 0), Utc(2024, 10, 13, 0, 0)));
  EXPECT_THAT(NextN(MustParse("0 0 13 * */1"), start, 2, kUtc),
              ElementsAre(Utc(2024, 9, 13, 0, 0), Utc(2024, 10, 13, 0, 0)));
}

TEST(CronScheduleTest, LeapDay) {
  const CronSchedule leap = MustParse("0 0 29 2 *");
  EXPECT_THAT(leap.Next(Utc(2023, 1, 1, 0, 0), kUtc), Optional(Utc(2024, 2, 29, 0, 0)));
  EXPECT_THAT(leap.Next(Utc(2024, 3, 1, 0, 0), kUtc), Optional(Utc(2028, 2, 29, 0, 0)));
  EXPECT_THAT(leap.Prev(Utc(2024, 2, 29, 0, 0), kUtc), Optional(Utc(2024, 2, 29, 0, 0)));
  EXPECT_THAT(leap.Prev(Utc(2024, 2, 28, 23, 59), kUtc), Optional(Utc(2020, 2, 29, 0, 0)));
  // 2100 is not a leap year: the longest gap there is, 8 years.
  EXPECT_THAT(leap.Next(Utc(2096, 3, 1, 0, 0), kUtc), Optional(Utc(2104, 2, 29, 0, 0)));
  EXPECT_THAT(leap.Prev(Utc(2104, 2, 28, 0, 0), kUtc), Optional(Utc(2096, 2, 29, 0, 0)));
  // 2000 is one.
  EXPECT_THAT(leap.Next(Utc(1997, 1, 1, 0, 0), kUtc), Optional(Utc(2000, 2, 29, 0, 0)));
}

TEST(CronScheduleTest, ImpossibleSchedulesNeverFire) {
  for (std::string_view spec :
       {"0 0 30 2 *", "0 0 31 2 *", "0 0 31 4,6,9,11 *", "0 0 30,31 2 ?", "0 0 30 2 */1"}) {
    const CronSchedule s = MustParse(spec);
    EXPECT_EQ(s.Next(Utc(2024, 1, 1, 0, 0), kUtc), std::nullopt) << spec;
    EXPECT_EQ(s.Prev(Utc(2024, 1, 1, 0, 0), kUtc), std::nullopt) << spec;
  }
  // With a restricted day-of-week the same day-of-month fires on that weekday instead: the
  // Mondays of February. 2024-02-05 is the first.
  EXPECT_THAT(MustParse("0 0 31 2 1").Next(Utc(2024, 1, 1, 0, 0), kUtc),
              Optional(Utc(2024, 2, 5, 0, 0)));
  // Possible in some months only.
  EXPECT_THAT(MustParse("0 0 31 2,3 *").Next(Utc(2024, 1, 1, 0, 0), kUtc),
              Optional(Utc(2024, 3, 31, 0, 0)));
}

TEST(CronScheduleTest, InfiniteTimesHaveNoNeighbours) {
  const CronSchedule s = MustParse("* * * * *");
  EXPECT_EQ(s.Next(absl::InfiniteFuture(), kUtc), std::nullopt);
  EXPECT_EQ(s.Next(absl::InfinitePast(), kUtc), std::nullopt);
  EXPECT_EQ(s.Prev(absl::InfiniteFuture(), kUtc), std::nullopt);
  EXPECT_EQ(s.Prev(absl::InfinitePast(), kUtc), std::nullopt);
}

// ----------------------------------------------------------------------------------------------
// Time zones and daylight saving time

// New York, 2024: clocks jump from 02:00 EST to 03:00 EDT on March 10 (07:00Z) and fall back
// from 02:00 EDT to 01:00 EST on November 3 (06:00Z).
TEST(CronScheduleZoneTest, NewYorkSpringForwardSkipsTheMissingTime) {
  ZONE_OR_SKIP(ny, "America/New_York");
  const CronSchedule s = MustParse("30 2 * * *");
  EXPECT_THAT(s.Next(Rfc("2024-03-09T01:00:00-05:00"), ny),
              Optional(Rfc("2024-03-09T02:30:00-05:00")));
  EXPECT_THAT(s.Next(Rfc("2024-03-09T02:30:00-05:00"), ny),
              Optional(Rfc("2024-03-11T02:30:00-04:00")));
  EXPECT_THAT(s.Next(Rfc("2024-03-09T02:30:00-05:00"), ny), Optional(Utc(2024, 3, 11, 6, 30)));
  EXPECT_THAT(s.Prev(Rfc("2024-03-11T02:29:00-04:00"), ny),
              Optional(Rfc("2024-03-09T02:30:00-05:00")));

  const CronSchedule half_hourly = MustParse("*/30 * * * *");
  EXPECT_THAT(NextN(half_hourly, Rfc("2024-03-10T01:00:00-05:00"), 3, ny),
              ElementsAre(Rfc("2024-03-10T01:30:00-05:00"), Rfc("2024-03-10T03:00:00-04:00"),
                          Rfc("2024-03-10T03:30:00-04:00")));
  EXPECT_THAT(half_hourly.Prev(Utc(2024, 3, 10, 6, 59), ny), Optional(Utc(2024, 3, 10, 6, 30)));
  EXPECT_THAT(half_hourly.Prev(Utc(2024, 3, 10, 7, 0), ny), Optional(Utc(2024, 3, 10, 7, 0)));

  // A daily time after the gap keeps its wall-clock time, so that day is an hour shorter.
  EXPECT_THAT(NextN(MustParse("0 3 * * *"), Utc(2024, 3, 9, 0, 0), 3, ny),
              ElementsAre(Utc(2024, 3, 9, 8, 0), Utc(2024, 3, 10, 7, 0), Utc(2024, 3, 11, 7, 0)));
}

TEST(CronScheduleZoneTest, NewYorkFallBackFiresOnceAtTheFirstOccurrence) {
  ZONE_OR_SKIP(ny, "America/New_York");
  const CronSchedule s = MustParse("30 1 * * *");
  // 01:30 EDT is 05:30Z; 01:30 EST (06:30Z) does not fire.
  EXPECT_THAT(s.Next(Utc(2024, 11, 3, 5, 0), ny), Optional(Utc(2024, 11, 3, 5, 30)));
  EXPECT_THAT(s.Next(Utc(2024, 11, 3, 5, 30), ny), Optional(Rfc("2024-11-04T01:30:00-05:00")));
  EXPECT_THAT(s.Next(Utc(2024, 11, 3, 5, 30), ny), Optional(Utc(2024, 11, 4, 6, 30)));
  EXPECT_THAT(s.Next(Utc(2024, 11, 3, 6, 15), ny), Optional(Utc(2024, 11, 4, 6, 30)));
  // In the second pass through 01:xx, the last run was the first pass's 01:30.
  EXPECT_THAT(s.Prev(Utc(2024, 11, 3, 6, 45), ny), Optional(Utc(2024, 11, 3, 5, 30)));
  EXPECT_THAT(s.Prev(Utc(2024, 11, 3, 6, 15), ny), Optional(Utc(2024, 11, 3, 5, 30)));
  EXPECT_THAT(s.Prev(Utc(2024, 11, 4, 6, 29), ny), Optional(Utc(2024, 11, 3, 5, 30)));

  // Hourly: 01:00 EDT fires, 01:00 EST does not, 02:00 EST does.
  EXPECT_THAT(NextN(MustParse("0 * * * *"), Utc(2024, 11, 3, 4, 30), 3, ny),
              ElementsAre(Rfc("2024-11-03T01:00:00-04:00"), Rfc("2024-11-03T02:00:00-05:00"),
                          Rfc("2024-11-03T03:00:00-05:00")));
  EXPECT_THAT(MustParse("0 * * * *").Prev(Utc(2024, 11, 3, 6, 30), ny),
              Optional(Utc(2024, 11, 3, 5, 0)));

  // Every 20 minutes: the first pass's 01:00, 01:20, 01:40, then 02:00 EST.
  const CronSchedule twenty = MustParse("*/20 * * * *");
  EXPECT_THAT(NextN(twenty, Utc(2024, 11, 3, 4, 50), 4, ny),
              ElementsAre(Utc(2024, 11, 3, 5, 0), Utc(2024, 11, 3, 5, 20), Utc(2024, 11, 3, 5, 40),
                          Utc(2024, 11, 3, 7, 0)));
  EXPECT_THAT(twenty.Next(Utc(2024, 11, 3, 6, 10), ny), Optional(Utc(2024, 11, 3, 7, 0)));
  EXPECT_THAT(twenty.Prev(Utc(2024, 11, 3, 6, 10), ny), Optional(Utc(2024, 11, 3, 5, 40)));
  EXPECT_THAT(twenty.Prev(Utc(2024, 11, 3, 6, 59), ny), Optional(Utc(2024, 11, 3, 5, 40)));
  EXPECT_THAT(twenty.Prev(Utc(2024, 11, 3, 7, 0), ny), Optional(Utc(2024, 11, 3, 7, 0)));
}

// Berlin, 2024: 02:00 CET -> 03:00 CEST on March 31 (01:00Z); 03:00 CEST -> 02:00 CET on
// October 27 (01:00Z). Both are Sundays.
TEST(CronScheduleZoneTest, BerlinTransitions) {
  ZONE_OR_SKIP(berlin, "Europe/Berlin");
  const CronSchedule s = MustParse("30 2 * * *");
  EXPECT_THAT(s.Next(Rfc("2024-03-30T02:30:00+01:00"), berlin),
              Optional(Rfc("2024-04-01T02:30:00+02:00")));
  EXPECT_THAT(s.Next(Rfc("2024-03-30T02:30:00+01:00"), berlin), Optional(Utc(2024, 4, 1, 0, 30)));
  EXPECT_THAT(s.Prev(Utc(2024, 4, 1, 0, 0), berlin), Optional(Utc(2024, 3, 30, 1, 30)));
  // 02:30 on October 27 comes twice, at 00:30Z (CEST) and 01:30Z (CET); it fires at the first.
  EXPECT_THAT(NextN(s, Utc(2024, 10, 26, 12, 0), 2, berlin),
              ElementsAre(Utc(2024, 10, 27, 0, 30), Utc(2024, 10, 28, 1, 30)));
  EXPECT_THAT(s.Prev(Utc(2024, 10, 27, 1, 45), berlin), Optional(Utc(2024, 10, 27, 0, 30)));

  // Sundays at 02:00: March 31 has no 02:00.
  EXPECT_THAT(NextN(MustParse("0 2 * * SUN"), Utc(2024, 3, 20, 0, 0), 3, berlin),
              ElementsAre(Utc(2024, 3, 24, 1, 0), Utc(2024, 4, 7, 0, 0), Utc(2024, 4, 14, 0, 0)));
  EXPECT_THAT(MustParse("0 2 * * SUN").Prev(Utc(2024, 4, 6, 0, 0), berlin),
              Optional(Utc(2024, 3, 24, 1, 0)));
}

TEST(CronScheduleZoneTest, KathmanduQuarterHourOffset) {
  ZONE_OR_SKIP(kathmandu, "Asia/Kathmandu");
  const CronSchedule s = MustParse("0 9 * * *");
  EXPECT_THAT(s.Next(Utc(2024, 6, 1, 0, 0), kathmandu), Optional(Utc(2024, 6, 1, 3, 15)));
  EXPECT_THAT(s.Next(Utc(2024, 6, 1, 0, 0), kathmandu), Optional(Rfc("2024-06-01T09:00:00+05:45")));
  EXPECT_THAT(s.Prev(Utc(2024, 6, 1, 3, 14), kathmandu), Optional(Utc(2024, 5, 31, 3, 15)));
}

// Lord Howe Island: +10:30 standard, +11:00 in summer. 2024: clocks go back from 02:00 to 01:30
// on April 7 (15:00Z on April 6) and forward from 02:00 to 02:30 on October 6 (15:30Z on
// October 5).
TEST(CronScheduleZoneTest, LordHoweHalfHourTransitions) {
  ZONE_OR_SKIP(lord_howe, "Australia/Lord_Howe");
  // 01:45 on April 7 comes at 14:45Z (+11) and again at 15:15Z (+10:30).
  const CronSchedule repeated = MustParse("45 1 * * *");
  EXPECT_THAT(NextN(repeated, Utc(2024, 4, 6, 14, 0), 2, lord_howe),
              ElementsAre(Utc(2024, 4, 6, 14, 45), Rfc("2024-04-08T01:45:00+10:30")));
  EXPECT_THAT(repeated.Prev(Utc(2024, 4, 6, 15, 20), lord_howe), Optional(Utc(2024, 4, 6, 14, 45)));

  // 02:15 on October 6 does not exist; 02:45 does.
  const CronSchedule skipped = MustParse("15 2 * * *");
  EXPECT_THAT(skipped.Next(Rfc("2024-10-05T02:15:00+10:30"), lord_howe),
              Optional(Rfc("2024-10-07T02:15:00+11:00")));
  EXPECT_THAT(skipped.Next(Rfc("2024-10-05T02:15:00+10:30"), lord_howe),
              Optional(Utc(2024, 10, 6, 15, 15)));
  const CronSchedule after_gap = MustParse("45 2 * * *");
  EXPECT_THAT(after_gap.Next(Rfc("2024-10-05T02:45:00+10:30"), lord_howe),
              Optional(Utc(2024, 10, 5, 15, 45)));
  // Every 15 minutes across the gap: 01:45 +10:30, then 02:30 +11.
  EXPECT_THAT(NextN(MustParse("*/15 * * * *"), Rfc("2024-10-06T01:30:00+10:30"), 3, lord_howe),
              ElementsAre(Rfc("2024-10-06T01:45:00+10:30"), Rfc("2024-10-06T02:30:00+11:00"),
                          Rfc("2024-10-06T02:45:00+11:00")));
}

// Samoa skipped 30 December 2011 when it moved across the date line, from -10 to +14.
TEST(CronScheduleZoneTest, ApiaSkippedDay) {
  ZONE_OR_SKIP(apia, "Pacific/Apia");
  const CronSchedule noon = MustParse("0 12 * * *");
  EXPECT_THAT(noon.Next(Rfc("2011-12-29T12:00:00-10:00"), apia),
              Optional(Rfc("2011-12-31T12:00:00+14:00")));
  EXPECT_THAT(noon.Prev(Utc(2011, 12, 30, 21, 59), apia), Optional(Utc(2011, 12, 29, 22, 0)));
  EXPECT_THAT(MustParse("0 12 30 12 *").Next(Utc(2011, 12, 1, 0, 0), apia),
              Optional(Rfc("2012-12-30T12:00:00+14:00")));
}

// Fire times by brute force: every UTC minute, kept when its wall-clock minute matches and this
// is that wall-clock minute's first occurrence. Valid for zones whose offsets are whole minutes.
std::vector<absl::Time> BruteForce(const CronSchedule& s, absl::Time from, absl::Time to,
                                   absl::TimeZone zone) {
  std::vector<absl::Time> out;
  for (absl::Time t = from; t <= to; t += absl::Minutes(1)) {
    const absl::CivilSecond civil = absl::ToCivilSecond(t, zone);
    if (civil.second() != 0 || !s.Matches(absl::CivilMinute(civil))) continue;
    if (zone.At(civil).pre == t) out.push_back(t);
  }
  return out;
}

TEST(CronScheduleZoneTest, NextAndPrevAgreeWithBruteForceAroundTransitions) {
  struct Window {
    const char* zone;
    absl::Time from;
  };
  const Window kWindows[] = {
      {"America/New_York", Utc(2024, 3, 8, 0, 0)},
      {"America/New_York", Utc(2024, 11, 1, 0, 0)},
      {"Europe/Berlin", Utc(2024, 3, 29, 0, 0)},
      {"Europe/Berlin", Utc(2024, 10, 25, 0, 0)},
      {"Australia/Lord_Howe", Utc(2024, 4, 4, 0, 0)},
      {"Australia/Lord_Howe", Utc(2024, 10, 3, 0, 0)},
      {"UTC", Utc(2024, 2, 27, 0, 0)},
  };
  const char* kSpecs[] = {"*/7 * * * *",      "30 1 * * *",  "0 2 * * *",        "15,45 0-3 * * *",
                          "*/20 1-2 * * SUN", "59 23 * * *", "0,30 * 1,7,29 * 0"};
  int zones_tested = 0;
  for (const Window& w : kWindows) {
    absl::TimeZone zone;
    if (!absl::LoadTimeZone(w.zone, &zone)) continue;
    ++zones_tested;
    const absl::Time to = w.from + absl::Hours(24 * 5);
    for (const char* spec : kSpecs) {
      const CronSchedule s = MustParse(spec);
      const std::vector<absl::Time> expected = BruteForce(s, w.from, to, zone);
      std::vector<absl::Time> forward;
      for (std::optional<absl::Time> t = s.Next(w.from - absl::Seconds(1), zone); t && *t <= to;
           t = s.Next(*t, zone)) {
        forward.push_back(*t);
      }
      EXPECT_EQ(forward, expected) << w.zone << " " << spec;
      std::vector<absl::Time> backward;
      for (std::optional<absl::Time> t = s.Prev(to, zone); t && *t >= w.from;
           t = s.Prev(*t - absl::Seconds(1), zone)) {
        backward.insert(backward.begin(), *t);
      }
      EXPECT_EQ(backward, expected) << w.zone << " " << spec;
      // From arbitrary instants, not only fire times.
      for (absl::Time t = w.from; t < to; t += absl::Minutes(37) + absl::Seconds(11)) {
        std::optional<absl::Time> want_next;
        std::optional<absl::Time> want_prev;
        for (absl::Time e : expected) {
          if (e > t && !want_next) want_next = e;
          if (e <= t) want_prev = e;
        }
        if (want_next) {
          EXPECT_EQ(s.Next(t, zone), want_next) << w.zone << " " << spec << " " << t;
        }
        if (want_prev) {
          EXPECT_EQ(s.Prev(t, zone), want_prev) << w.zone << " " << spec << " " << t;
        }
      }
    }
  }
  if (zones_tested <= 1) GTEST_SKIP() << "the tz database is missing (install tzdata)";
}

// ----------------------------------------------------------------------------------------------
// LoadScheduleTimeZone

TEST(LoadScheduleTimeZoneTest, EmptyAndUtcMeanUtc) {
  for (std::string_view name : {"", "UTC"}) {
    absl::StatusOr<absl::TimeZone> zone = LoadScheduleTimeZone(name);
    ASSERT_TRUE(zone.ok()) << zone.status();
    EXPECT_EQ(zone->name(), "UTC");
  }
}

TEST(LoadScheduleTimeZoneTest, LoadsTzDatabaseNames) {
  ZONE_OR_SKIP(berlin, "Europe/Berlin");
  for (std::string_view name : {"Europe/Berlin", "Etc/UTC", "America/Argentina/Buenos_Aires",
                                "America/Port-au-Prince", "Etc/GMT+5", "Asia/Kathmandu"}) {
    absl::StatusOr<absl::TimeZone> zone = LoadScheduleTimeZone(name);
    ASSERT_TRUE(zone.ok()) << zone.status();
    EXPECT_EQ(zone->name(), name);
  }
  absl::StatusOr<absl::TimeZone> zone = LoadScheduleTimeZone("Europe/Berlin");
  ASSERT_TRUE(zone.ok());
  EXPECT_EQ(absl::FormatTime("%z", Utc(2024, 7, 1, 0, 0), *zone), "+0200");
  EXPECT_EQ(absl::FormatTime("%z", Utc(2024, 7, 1, 0, 0), berlin), "+0200");
}

TEST(LoadScheduleTimeZoneTest, RejectsNamesOutsideTheTzDatabase) {
  for (std::string_view name :
       {"Mars/Olympus_Mons", "europe/berlin", "Europe/Berlin ", "zone.tab", "CEST"}) {
    absl::StatusOr<absl::TimeZone> zone = LoadScheduleTimeZone(name);
    ASSERT_FALSE(zone.ok()) << name;
    EXPECT_EQ(zone.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(StdView(zone.status().message())),
                HasSubstr("time zone \"" + std::string(name) + "\" is not in the tz database"));
  }
  EXPECT_EQ(StdView(LoadScheduleTimeZone("Mars/Olympus_Mons").status().message()),
            "time zone \"Mars/Olympus_Mons\" is not in the tz database (names are "
            "case-sensitive; is the tzdata package installed?); use an IANA name such as "
            "\"Europe/Berlin\" or \"America/New_York\", or \"UTC\"");
}

TEST(LoadScheduleTimeZoneTest, RejectsNamesAbseilAcceptsButThatAreNotZoneNames) {
  // Fixed offsets, the local zone, paths and escapes from the database directory.
  for (std::string_view name :
       {"+01:00", "-05:00", "Fixed/UTC+01:00:00", "Local", "local", "localtime",
        "/usr/share/zoneinfo/Europe/Berlin", "../zoneinfo/Europe/Berlin", "Europe/../Europe/Berlin",
        "./UTC", "Europe//Berlin", "libc:Europe/Berlin"}) {
    absl::StatusOr<absl::TimeZone> zone = LoadScheduleTimeZone(name);
    ASSERT_FALSE(zone.ok()) << name;
    EXPECT_EQ(zone.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(StdView(zone.status().message())),
                HasSubstr("time zone \"" + std::string(name) + "\" is not in the tz database"));
  }
  EXPECT_EQ(StdView(LoadScheduleTimeZone("+01:00").status().message()),
            "time zone \"+01:00\" is not in the tz database: fixed offsets, \"Local\" and file "
            "paths are not time zone names; use an IANA name such as \"Europe/Berlin\" or "
            "\"America/New_York\", or \"UTC\"");
}

// ----------------------------------------------------------------------------------------------
// ComputeMissedRuns

TEST(ComputeMissedRunsTest, NoneMissed) {
  const CronSchedule hourly = MustParse("0 * * * *");
  const MissedRuns runs = ComputeMissedRuns(hourly, kUtc, Utc(2024, 5, 1, 10, 5), std::nullopt,
                                            std::nullopt, Utc(2024, 5, 1, 10, 30));
  EXPECT_EQ(runs.window_start, Utc(2024, 5, 1, 10, 5));
  EXPECT_EQ(runs.most_recent, std::nullopt);
  EXPECT_EQ(runs.missed, 0);
  EXPECT_FALSE(runs.too_many);
  EXPECT_THAT(runs.next, Optional(Utc(2024, 5, 1, 11, 0)));
}

TEST(ComputeMissedRunsTest, OneDueSinceCreation) {
  const CronSchedule hourly = MustParse("0 * * * *");
  const MissedRuns runs = ComputeMissedRuns(hourly, kUtc, Utc(2024, 5, 1, 9, 30), std::nullopt,
                                            std::nullopt, Utc(2024, 5, 1, 10, 30));
  EXPECT_THAT(runs.most_recent, Optional(Utc(2024, 5, 1, 10, 0)));
  EXPECT_EQ(runs.missed, 1);
  EXPECT_FALSE(runs.too_many);
  EXPECT_THAT(runs.next, Optional(Utc(2024, 5, 1, 11, 0)));
}

TEST(ComputeMissedRunsTest, SeveralSinceTheLastScheduleTime) {
  const CronSchedule hourly = MustParse("0 * * * *");
  // The last schedule time takes over from the creation time; the window excludes it and
  // includes `now`: 07:00, 08:00, 09:00, 10:00.
  const MissedRuns runs =
      ComputeMissedRuns(hourly, kUtc, Utc(2024, 4, 1, 0, 0), Utc(2024, 5, 1, 6, 0), std::nullopt,
                        Utc(2024, 5, 1, 10, 0));
  EXPECT_EQ(runs.window_start, Utc(2024, 5, 1, 6, 0));
  EXPECT_THAT(runs.most_recent, Optional(Utc(2024, 5, 1, 10, 0)));
  EXPECT_EQ(runs.missed, 4);
  EXPECT_FALSE(runs.too_many);
  EXPECT_THAT(runs.next, Optional(Utc(2024, 5, 1, 11, 0)));
}

TEST(ComputeMissedRunsTest, ExactlyOneHundredIsNotTooMany) {
  const CronSchedule hourly = MustParse("0 * * * *");
  // Hourly from 01:00 on January 1 through 04:00 on January 5: 23 + 3 * 24 + 5 = 100 runs.
  MissedRuns runs = ComputeMissedRuns(hourly, kUtc, Utc(2024, 1, 1, 0, 30), std::nullopt,
                                      std::nullopt, Utc(2024, 1, 5, 4, 30));
  EXPECT_EQ(runs.missed, 100);
  EXPECT_FALSE(runs.too_many);
  EXPECT_THAT(runs.most_recent, Optional(Utc(2024, 1, 5, 4, 0)));
  runs = ComputeMissedRuns(hourly, kUtc, Utc(2024, 1, 1, 0, 30), std::nullopt, std::nullopt,
                           Utc(2024, 1, 5, 5, 0));
  EXPECT_EQ(runs.missed, 101);
  EXPECT_TRUE(runs.too_many);
  EXPECT_THAT(runs.most_recent, Optional(Utc(2024, 1, 5, 5, 0)));
}

TEST(ComputeMissedRunsTest, TooManyIsCappedAndStillNamesTheMostRecent) {
  const CronSchedule hourly = MustParse("0 * * * *");
  const MissedRuns runs = ComputeMissedRuns(hourly, kUtc, Utc(2024, 1, 1, 0, 30), std::nullopt,
                                            std::nullopt, Utc(2024, 1, 10, 0, 30));
  EXPECT_EQ(runs.missed, MissedRuns::kMaxCounted);
  EXPECT_TRUE(runs.too_many);
  EXPECT_THAT(runs.most_recent, Optional(Utc(2024, 1, 10, 0, 0)));
  EXPECT_THAT(runs.next, Optional(Utc(2024, 1, 10, 1, 0)));
}

TEST(ComputeMissedRunsTest, StartingDeadlineCutsTheWindow) {
  const CronSchedule hourly = MustParse("0 * * * *");
  const absl::Time last = Utc(2024, 5, 1, 6, 0);
  const absl::Time now = Utc(2024, 5, 1, 10, 30);

  MissedRuns runs = ComputeMissedRuns(hourly, kUtc, last, last, 3600, now);
  EXPECT_EQ(runs.window_start, Utc(2024, 5, 1, 9, 30));
  EXPECT_THAT(runs.most_recent, Optional(Utc(2024, 5, 1, 10, 0)));
  EXPECT_EQ(runs.missed, 1);

  // 10:00 is 30 minutes late, past a 10-minute deadline.
  runs = ComputeMissedRuns(hourly, kUtc, last, last, 600, now);
  EXPECT_EQ(runs.window_start, Utc(2024, 5, 1, 10, 20));
  EXPECT_EQ(runs.most_recent, std::nullopt);
  EXPECT_EQ(runs.missed, 0);
  EXPECT_THAT(runs.next, Optional(Utc(2024, 5, 1, 11, 0)));

  // A deadline reaching past the last run changes nothing.
  runs = ComputeMissedRuns(hourly, kUtc, last, last, 86400, now);
  EXPECT_EQ(runs.window_start, last);
  EXPECT_EQ(runs.missed, 4);

  // Zero, and a negative value taken as zero: nothing is ever on time.
  for (int64_t deadline : {0, -5}) {
    runs = ComputeMissedRuns(hourly, kUtc, last, last, deadline, Utc(2024, 5, 1, 10, 0));
    EXPECT_EQ(runs.most_recent, std::nullopt) << deadline;
    EXPECT_EQ(runs.missed, 0) << deadline;
    EXPECT_THAT(runs.next, Optional(Utc(2024, 5, 1, 11, 0))) << deadline;
  }

  // A huge deadline does not overflow.
  runs = ComputeMissedRuns(hourly, kUtc, last, last, INT64_MAX, now);
  EXPECT_EQ(runs.window_start, last);
  EXPECT_EQ(runs.missed, 4);
}

TEST(ComputeMissedRunsTest, LastScheduleTimeInTheFuture) {
  // Clock skew: the recorded run is later than `now`. Nothing is due, and the next run comes
  // after the recorded one, so it is not repeated.
  const CronSchedule hourly = MustParse("0 * * * *");
  const MissedRuns runs =
      ComputeMissedRuns(hourly, kUtc, Utc(2024, 5, 1, 0, 0), Utc(2024, 5, 1, 12, 0), std::nullopt,
                        Utc(2024, 5, 1, 10, 30));
  EXPECT_EQ(runs.most_recent, std::nullopt);
  EXPECT_EQ(runs.missed, 0);
  EXPECT_FALSE(runs.too_many);
  EXPECT_THAT(runs.next, Optional(Utc(2024, 5, 1, 13, 0)));

  // The same for a creation time in the future.
  const MissedRuns created_later = ComputeMissedRuns(hourly, kUtc, Utc(2024, 5, 1, 12, 0),
                                                     std::nullopt, 3600, Utc(2024, 5, 1, 10, 30));
  EXPECT_EQ(created_later.most_recent, std::nullopt);
  EXPECT_EQ(created_later.missed, 0);
  EXPECT_THAT(created_later.next, Optional(Utc(2024, 5, 1, 13, 0)));
}

TEST(ComputeMissedRunsTest, AYearOfAnEveryMinuteSchedule) {
  const CronSchedule every_minute = MustParse("* * * * *");
  const MissedRuns runs = ComputeMissedRuns(every_minute, kUtc, Utc(2023, 1, 1, 0, 0), std::nullopt,
                                            std::nullopt, Utc(2024, 1, 1, 0, 0, 30));
  EXPECT_THAT(runs.most_recent, Optional(Utc(2024, 1, 1, 0, 0)));
  EXPECT_EQ(runs.missed, MissedRuns::kMaxCounted);
  EXPECT_TRUE(runs.too_many);
  EXPECT_THAT(runs.next, Optional(Utc(2024, 1, 1, 0, 1)));
}

TEST(ComputeMissedRunsTest, ScheduleThatNeverFires) {
  const MissedRuns runs = ComputeMissedRuns(MustParse("0 0 30 2 *"), kUtc, Utc(2000, 1, 1, 0, 0),
                                            std::nullopt, std::nullopt, Utc(2024, 1, 1, 0, 0));
  EXPECT_EQ(runs.most_recent, std::nullopt);
  EXPECT_EQ(runs.missed, 0);
  EXPECT_FALSE(runs.too_many);
  EXPECT_EQ(runs.next, std::nullopt);
}

TEST(ComputeMissedRunsTest, CountsWallClockRunsAcrossFallBack) {
  ZONE_OR_SKIP(ny, "America/New_York");
  // After 01:00 EDT (05:00Z): 01:30 EDT fires, the repeated 01:00 and 01:30 EST do not, then
  // 02:00 EST (07:00Z) and 02:30 EST (07:30Z).
  const MissedRuns runs =
      ComputeMissedRuns(MustParse("*/30 * * * *"), ny, Utc(2024, 11, 1, 0, 0),
                        Utc(2024, 11, 3, 5, 0), std::nullopt, Utc(2024, 11, 3, 7, 30));
  EXPECT_EQ(runs.missed, 3);
  EXPECT_THAT(runs.most_recent, Optional(Utc(2024, 11, 3, 7, 30)));
  EXPECT_THAT(runs.next, Optional(Utc(2024, 11, 3, 8, 0)));
}

}  // namespace
}  // namespace clusterprof::controllers
