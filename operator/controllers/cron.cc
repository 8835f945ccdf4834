#include "operator/controllers/cron.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "common/base/strings.h"

namespace clusterprof::controllers {
namespace {

constexpr std::string_view kFieldsHint = "(minute hour day-of-month month day-of-week)";
constexpr std::string_view kWhitespace = " \t\n\r\f\v";

constexpr std::array<std::string_view, 12> kMonthNames = {"jan", "feb", "mar", "apr", "may", "jun",
                                                          "jul", "aug", "sep", "oct", "nov", "dec"};
constexpr std::array<std::string_view, 7> kDayNames = {"sun", "mon", "tue", "wed",
                                                       "thu", "fri", "sat"};

// One of the five fields.
struct Field {
  std::string_view name;
  // `*` and "a/step" cover [min, max].
  int min;
  int max;
  // The largest value accepted explicitly (7 for day-of-week, where it means Sunday).
  int max_value;
  // Names for min, min + 1, ... (null when the field takes numbers only).
  const std::string_view* names;
  int name_count;
  std::string_view names_hint;
  bool allows_question_mark;
};

constexpr Field kMinuteField = {"minute", 0, 59, 59, nullptr, 0, "", false};
constexpr Field kHourField = {"hour", 0, 23, 23, nullptr, 0, "", false};
constexpr Field kDayOfMonthField = {"day-of-month", 1, 31, 31, nullptr, 0, "", true};
constexpr Field kMonthField = {
    "month", 1, 12, 12, kMonthNames.data(), kMonthNames.size(), "a month name (JAN-DEC)", false};
constexpr Field kDayOfWeekField = {
    "day-of-week", 0, 6, 7, kDayNames.data(), kDayNames.size(), "a day name (SUN-SAT)", true};
constexpr std::array<const Field*, 5> kFieldOrder = {&kMinuteField, &kHourField, &kDayOfMonthField,
                                                     &kMonthField, &kDayOfWeekField};

struct ParsedField {
  uint64_t bits = 0;
  // Some element was `*` or `?` with no step or step 1 (robfig's "star bit").
  bool unrestricted = false;
};

// Splits on `separator`, keeping empty pieces (an empty list element is an error to report).
std::vector<std::string_view> Split(std::string_view text, char separator) {
  std::vector<std::string_view> pieces;
  for (size_t start = 0;;) {
    const size_t end = text.find(separator, start);
    pieces.push_back(text.substr(start, end - start));
    if (end == std::string_view::npos) return pieces;
    start = end + 1;
  }
}

// Splits on runs of ASCII whitespace.
std::vector<std::string_view> SplitWhitespace(std::string_view text) {
  std::vector<std::string_view> pieces;
  for (size_t start = text.find_first_not_of(kWhitespace); start != std::string_view::npos;) {
    const size_t end = text.find_first_of(kWhitespace, start);
    pieces.push_back(text.substr(start, end - start));
    start = text.find_first_not_of(kWhitespace, end);
  }
  return pieces;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (absl::ascii_tolower(static_cast<unsigned char>(a[i])) !=
        absl::ascii_tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

bool StartsWithIgnoreCase(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && EqualsIgnoreCase(text.substr(0, prefix.size()), prefix);
}

std::string AsciiLower(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = absl::ascii_tolower(static_cast<unsigned char>(c));
  return lower;
}

// Digits only; saturates instead of overflowing so that "99999999999" reports out of range.
std::optional<int64_t> ParseDigits(std::string_view text) {
  if (text.empty()) return std::nullopt;
  int64_t value = 0;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    value = std::min<int64_t>(value * 10 + (c - '0'), int64_t{1} << 40);
  }
  return value;
}

absl::Status FieldError(const Field& field, std::string_view message) {
  return absl::InvalidArgumentError(StrCat(field.name, " field: ", message));
}

std::string Quoted(std::string_view text) {
  return StrCat("\"", absl::CEscape(AbslView(text)), "\"");
}

absl::StatusOr<int> ParseValue(const Field& field, std::string_view text) {
  if (std::optional<int64_t> number = ParseDigits(text)) {
    if (*number < field.min || *number > field.max_value) {
      return FieldError(field, StrCat(text, " is out of range ", field.min, "-", field.max_value));
    }
    return static_cast<int>(*number);
  }
  for (int i = 0; i < field.name_count; ++i) {
    if (EqualsIgnoreCase(text, field.names[i])) return field.min + i;
  }
  if (field.name_count > 0) {
    return FieldError(field, StrCat(Quoted(text), " is not a number or ", field.names_hint));
  }
  return FieldError(field, StrCat(Quoted(text), " is not a number"));
}

// Parses one list element: "*", "?", "v", "a-b", each optionally followed by "/step".
absl::Status ParseElement(const Field& field, std::string_view element, ParsedField* out) {
  const std::vector<std::string_view> range_and_step = Split(element, '/');
  if (range_and_step.size() > 2) {
    return FieldError(field, StrCat(Quoted(element), " has more than one \"/\""));
  }
  std::optional<int64_t> step;
  if (range_and_step.size() == 2) {
    std::string_view step_text = range_and_step[1];
    if (step_text.empty()) {
      return FieldError(field, StrCat(Quoted(element), " is missing the step after \"/\""));
    }
    step = ParseDigits(step_text);
    if (!step) {
      return FieldError(
          field, StrCat("step ", Quoted(step_text), " in ", Quoted(element), " is not a number"));
    }
    if (*step == 0) {
      return FieldError(field, StrCat("step 0 in ", Quoted(element), " must be at least 1"));
    }
  }

  std::string_view range = range_and_step[0];
  int start;
  int end;
  if (range == "*" || range == "?") {
    if (range == "?" && !field.allows_question_mark) {
      return FieldError(field, "\"?\" is only allowed in the day-of-month and day-of-week fields");
    }
    start = field.min;
    end = field.max;
    if (step.value_or(1) == 1) out->unrestricted = true;
  } else {
    const std::vector<std::string_view> bounds = Split(range, '-');
    if (bounds.size() > 2) {
      return FieldError(field, StrCat(Quoted(element), " has more than one \"-\""));
    }
    if (bounds.size() == 2 && bounds[0].empty()) {
      return FieldError(field, StrCat(Quoted(element), " is missing a value before \"-\""));
    }
    if (bounds.size() == 2 && bounds[1].empty()) {
      return FieldError(field, StrCat(Quoted(element), " is missing a value after \"-\""));
    }
    absl::StatusOr<int> first = ParseValue(field, bounds[0]);
    if (!first.ok()) return first.status();
    start = *first;
    if (bounds.size() == 2) {
      absl::StatusOr<int> last = ParseValue(field, bounds[1]);
      if (!last.ok()) return last.status();
      end = *last;
      if (start > end) {
        return FieldError(field, StrCat("range ", Quoted(range),
                                        " runs backwards; the start must not be greater "
                                        "than the end"));
      }
    } else {
      // "a/step" runs to the field's maximum, as in robfig/cron.
      end = step ? std::max(start, field.max) : start;
    }
  }

  const int64_t increment = step.value_or(1);
  for (int64_t value = start; value <= end; value += increment) {
    // Only day-of-week goes past its maximum: 7 is Sunday.
    out->bits |= uint64_t{1} << (value > field.max ? field.min : value);
  }
  return absl::OkStatus();
}

absl::StatusOr<ParsedField> ParseField(const Field& field, std::string_view text) {
  ParsedField parsed;
  for (std::string_view element : Split(text, ',')) {
    if (element.empty()) {
      return FieldError(field, StrCat("empty element in list ", Quoted(text)));
    }
    absl::Status status = ParseElement(field, element, &parsed);
    if (!status.ok()) return status;
  }
  return parsed;
}

// The 5-field equivalent of a descriptor, or nullopt when `name` (lower case) is not one.
std::optional<std::string_view> ExpandDescriptor(std::string_view name) {
  if (name == "@yearly" || name == "@annually") return "0 0 1 1 *";
  if (name == "@monthly") return "0 0 1 * *";
  if (name == "@weekly") return "0 0 * * 0";
  if (name == "@daily" || name == "@midnight") return "0 0 * * *";
  if (name == "@hourly") return "0 * * * *";
  return std::nullopt;
}

// Cron's day-of-week number: 0 = Sunday.
int CronWeekday(absl::CivilDay day) {
  // absl::Weekday runs monday = 0 ... sunday = 6.
  return (static_cast<int>(absl::GetWeekday(day)) + 1) % 7;
}

int DaysInMonthAtMost(int month) {
  static constexpr std::array<int, 13> kDays = {0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return kDays[month];
}

// The smallest set bit >= `from`, or -1.
int NextBit(uint64_t bits, int from) {
  const uint64_t rest = bits >> from;
  return rest == 0 ? -1 : from + std::countr_zero(rest);
}

// The largest set bit <= `from` (from < 63), or -1.
int PrevBit(uint64_t bits, int from) {
  const uint64_t rest = bits & ((uint64_t{2} << from) - 1);
  return rest == 0 ? -1 : 63 - std::countl_zero(rest);
}

bool HasBit(uint64_t bits, int i) { return ((bits >> i) & 1) != 0; }

bool IsInfinite(absl::Time t) { return t == absl::InfiniteFuture() || t == absl::InfinitePast(); }

// Whether `name` has the shape of a tz database name: '/'-separated components that start with
// a letter and hold only letters, digits, '_', '-', '+' and '.' ("America/Port-au-Prince",
// "Etc/GMT+5"). This excludes paths, "." and "..", and abseil's "Fixed/UTC+01:00:00" and
// "libc:" forms.
bool HasTzDatabaseNameShape(std::string_view name) {
  for (std::string_view component : Split(name, '/')) {
    if (component.empty() || !absl::ascii_isalpha(static_cast<unsigned char>(component[0]))) {
      return false;
    }
    for (char c : component) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '+' &&
          c != '.') {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<CronSchedule> CronSchedule::Parse(std::string_view spec) {
  const std::string quoted_spec = Quoted(spec);
  auto error = [&](std::string_view message) {
    return absl::InvalidArgumentError(StrCat("schedule ", quoted_spec, ": ", message));
  };

  std::string_view text = StripAsciiWhitespace(spec);
  if (text.empty()) {
    return error(
        StrCat("empty; expected 5 fields ", kFieldsHint, " or a descriptor such as @daily"));
  }

  for (std::string_view prefix : {"CRON_TZ=", "TZ="}) {
    if (StartsWithIgnoreCase(text, prefix)) {
      std::string_view zone = text.substr(prefix.size());
      zone = zone.substr(0, zone.find_first_of(kWhitespace));
      return error(StrCat("a ", prefix, " prefix is not supported; remove it and set ",
                          "spec.timeZone to ", Quoted(zone)));
    }
  }

  std::vector<std::string_view> fields = SplitWhitespace(text);
  if (text.front() == '@') {
    const std::string descriptor = AsciiLower(fields[0]);
    if (descriptor == "@every" || descriptor == "@reboot") {
      return error(StrCat(descriptor,
                          " is not supported by ProfileSchedule (nor by Kubernetes "
                          "CronJob); write a 5-field schedule such as \"*/5 * * * *\""));
    }
    std::optional<std::string_view> expansion = ExpandDescriptor(descriptor);
    if (!expansion) {
      return error(StrCat("unknown descriptor ", Quoted(fields[0]),
                          "; use one of @yearly, @annually, @monthly, @weekly, @daily, "
                          "@midnight, @hourly, or 5 fields ",
                          kFieldsHint));
    }
    if (fields.size() > 1) {
      return error(StrCat("descriptor ", descriptor, " takes nothing after it"));
    }
    fields = SplitWhitespace(*expansion);
  }

  if (fields.size() != 5) {
    return error(StrCat("expected 5 fields ", kFieldsHint, ", got ", fields.size(),
                        fields.size() == 6 ? "; a seconds field is not supported" : ""));
  }

  CronSchedule schedule;
  schedule.spec_ = std::string(spec);
  std::array<ParsedField, 5> parsed;
  for (size_t i = 0; i < kFieldOrder.size(); ++i) {
    absl::StatusOr<ParsedField> field = ParseField(*kFieldOrder[i], fields[i]);
    if (!field.ok()) return error(StdView(field.status().message()));
    parsed[i] = *field;
  }
  schedule.minutes_ = parsed[0].bits;
  schedule.hours_ = static_cast<uint32_t>(parsed[1].bits);
  schedule.days_of_month_ = static_cast<uint32_t>(parsed[2].bits);
  schedule.day_of_month_unrestricted_ = parsed[2].unrestricted;
  schedule.months_ = static_cast<uint16_t>(parsed[3].bits);
  schedule.days_of_week_ = static_cast<uint8_t>(parsed[4].bits);
  schedule.day_of_week_unrestricted_ = parsed[4].unrestricted;

  // Every month has at least 28 days and so every weekday; the only days that never come are
  // days of the month that the chosen months lack, when day-of-week does not widen the choice.
  if (!schedule.day_of_month_unrestricted_ && schedule.day_of_week_unrestricted_) {
    schedule.can_fire_ = false;
    for (int month = 1; month <= 12; ++month) {
      if (!HasBit(schedule.months_, month)) continue;
      const int first_day = NextBit(schedule.days_of_month_, 1);
      if (first_day != -1 && first_day <= DaysInMonthAtMost(month)) schedule.can_fire_ = true;
    }
  }
  return schedule;
}

bool CronSchedule::DayMatches(absl::CivilDay day) const {
  const bool dom = HasBit(days_of_month_, day.day());
  const bool dow = HasBit(days_of_week_, CronWeekday(day));
  if (day_of_month_unrestricted_ || day_of_week_unrestricted_) return dom && dow;
  return dom || dow;
}

bool CronSchedule::Matches(absl::CivilMinute minute) const {
  return HasBit(months_, minute.month()) && DayMatches(absl::CivilDay(minute)) &&
         HasBit(hours_, minute.hour()) && HasBit(minutes_, minute.minute());
}

std::optional<absl::CivilMinute> CronSchedule::NextMatch(absl::CivilMinute from,
                                                         int64_t last_year) const {
  absl::CivilMinute t = from;
  while (t.year() <= last_year) {
    if (!HasBit(months_, t.month())) {
      const int month = NextBit(months_, t.month());
      t = month == -1 ? absl::CivilMinute(absl::CivilYear(t.year() + 1))
                      : absl::CivilMinute(t.year(), month, 1, 0, 0);
      continue;
    }
    if (!DayMatches(absl::CivilDay(t))) {
      t = absl::CivilMinute(absl::CivilDay(t) + 1);
      continue;
    }
    if (!HasBit(hours_, t.hour())) {
      const int hour = NextBit(hours_, t.hour());
      t = hour == -1 ? absl::CivilMinute(absl::CivilDay(t) + 1)
                     : absl::CivilMinute(t.year(), t.month(), t.day(), hour, 0);
      continue;
    }
    if (!HasBit(minutes_, t.minute())) {
      const int minute = NextBit(minutes_, t.minute());
      t = minute == -1 ? absl::CivilMinute(absl::CivilHour(t) + 1)
                       : absl::CivilMinute(t.year(), t.month(), t.day(), t.hour(), minute);
      continue;
    }
    return t;
  }
  return std::nullopt;
}

std::optional<absl::CivilMinute> CronSchedule::PrevMatch(absl::CivilMinute from,
                                                         int64_t first_year) const {
  absl::CivilMinute t = from;
  while (t.year() >= first_year) {
    if (!HasBit(months_, t.month())) {
      const int month = PrevBit(months_, t.month());
      // The last minute of `month`, or of the previous year.
      t = month == -1 ? absl::CivilMinute(absl::CivilYear(t.year())) - 1
                      : absl::CivilMinute(absl::CivilMonth(t.year(), month) + 1) - 1;
      continue;
    }
    if (!DayMatches(absl::CivilDay(t))) {
      t = absl::CivilMinute(absl::CivilDay(t)) - 1;
      continue;
    }
    if (!HasBit(hours_, t.hour())) {
      const int hour = PrevBit(hours_, t.hour());
      t = hour == -1 ? absl::CivilMinute(absl::CivilDay(t)) - 1
                     : absl::CivilMinute(t.year(), t.month(), t.day(), hour, 59);
      continue;
    }
    if (!HasBit(minutes_, t.minute())) {
      const int minute = PrevBit(minutes_, t.minute());
      t = minute == -1 ? absl::CivilMinute(absl::CivilHour(t)) - 1
                       : absl::CivilMinute(t.year(), t.month(), t.day(), t.hour(), minute);
      continue;
    }
    return t;
  }
  return std::nullopt;
}

// A matching civil minute fires at its first occurrence (TimeInfo::pre), so fire times increase
// with civil time, and skipped civil minutes do not fire. Every civil minute before
// ToCivilMinute(after) therefore fires at or before `after`, and the search starts just past it.
std::optional<absl::Time> CronSchedule::Next(absl::Time after, absl::TimeZone zone) const {
  if (!can_fire_ || IsInfinite(after)) return std::nullopt;
  absl::CivilMinute from = absl::ToCivilMinute(after, zone) + 1;
  const int64_t last_year = from.year() + kSearchYears;
  while (std::optional<absl::CivilMinute> candidate = NextMatch(from, last_year)) {
    const absl::TimeZone::TimeInfo info = zone.At(absl::CivilSecond(*candidate));
    if (info.kind == absl::TimeZone::TimeInfo::SKIPPED) {
      // Resume at the first wall-clock minute after the gap.
      from = std::max(*candidate + 1, absl::ToCivilMinute(info.trans, zone));
      continue;
    }
    if (info.pre > after) return info.pre;
    // `after` lies in the second pass through a repeated hour, whose minutes have all fired
    // already: resume after its last minute.
    from = *candidate + 1;
    if (info.kind == absl::TimeZone::TimeInfo::REPEATED) {
      from = std::max(from, absl::ToCivilMinute(info.trans - absl::Nanoseconds(1), zone) + 1);
    }
  }
  return std::nullopt;
}

std::optional<absl::Time> CronSchedule::Prev(absl::Time at, absl::TimeZone zone) const {
  if (!can_fire_ || IsInfinite(at)) return std::nullopt;
  absl::CivilMinute from = absl::ToCivilMinute(at, zone);
  // In the second pass through a repeated hour, the later minutes of that hour first occurred
  // before `at`, so they are candidates too.
  const absl::TimeZone::TimeInfo at_info = zone.At(absl::CivilSecond(from));
  if (at_info.kind == absl::TimeZone::TimeInfo::REPEATED && at >= at_info.trans) {
    from = std::max(from, absl::ToCivilMinute(at_info.trans - absl::Nanoseconds(1), zone));
  }
  const int64_t first_year = from.year() - kSearchYears;
  while (std::optional<absl::CivilMinute> candidate = PrevMatch(from, first_year)) {
    const absl::TimeZone::TimeInfo info = zone.At(absl::CivilSecond(*candidate));
    if (info.kind == absl::TimeZone::TimeInfo::SKIPPED) {
      // Resume at the last wall-clock minute before the gap.
      from = std::min(*candidate - 1, absl::ToCivilMinute(info.trans - absl::Nanoseconds(1), zone));
      continue;
    }
    if (info.pre <= at) return info.pre;
    from = *candidate - 1;
  }
  return std::nullopt;
}

absl::StatusOr<absl::TimeZone> LoadScheduleTimeZone(std::string_view name) {
  if (name.empty() || name == "UTC") return absl::UTCTimeZone();
  const std::string hint =
      "; use an IANA name such as \"Europe/Berlin\" or \"America/New_York\", or \"UTC\"";
  if (!HasTzDatabaseNameShape(name) || EqualsIgnoreCase(name, "local") ||
      EqualsIgnoreCase(name, "localtime")) {
    return absl::InvalidArgumentError(
        StrCat("time zone ", Quoted(name),
               " is not in the tz database: fixed offsets, \"Local\" and file paths are not "
               "time zone names",
               hint));
  }
  absl::TimeZone zone;
  if (!absl::LoadTimeZone(AbslView(name), &zone)) {
    return absl::InvalidArgumentError(StrCat(
        "time zone ", Quoted(name),
        " is not in the tz database (names are case-sensitive; is the tzdata package installed?)",
        hint));
  }
  return zone;
}

MissedRuns ComputeMissedRuns(const CronSchedule& schedule, absl::TimeZone zone, absl::Time creation,
                             std::optional<absl::Time> last_schedule_time,
                             std::optional<int64_t> starting_deadline_seconds, absl::Time now) {
  MissedRuns runs;
  const absl::Time last_run = last_schedule_time.value_or(creation);
  runs.window_start = last_run;
  if (starting_deadline_seconds) {
    const int64_t deadline = std::max<int64_t>(*starting_deadline_seconds, 0);
    runs.window_start = std::max(runs.window_start, now - absl::Seconds(deadline));
  }
  runs.next = schedule.Next(std::max(now, last_run), zone);
  if (runs.window_start >= now) return runs;

  runs.most_recent = schedule.Prev(now, zone);
  if (!runs.most_recent || *runs.most_recent <= runs.window_start) {
    runs.most_recent.reset();
    return runs;
  }
  for (std::optional<absl::Time> t = schedule.Next(runs.window_start, zone);
       t && *t <= now && runs.missed < MissedRuns::kMaxCounted; t = schedule.Next(*t, zone)) {
    ++runs.missed;
  }
  runs.too_many = runs.missed > MissedRuns::kTooMany;
  return runs;
}

}  // namespace clusterprof::controllers
