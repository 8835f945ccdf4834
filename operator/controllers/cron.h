// Cron schedules for the ProfileSchedule custom resource, with the semantics of a Kubernetes
// CronJob: the 5-field syntax of the robfig/cron v3 standard parser, evaluated on wall-clock time
// in an IANA time zone, and the CronJob controller's rule for runs missed while the operator was
// not looking.
#ifndef CLUSTERPROF_OPERATOR_CONTROLLERS_CRON_H_
#define CLUSTERPROF_OPERATOR_CONTROLLERS_CRON_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"

namespace clusterprof::controllers {

// A parsed cron expression: "minute hour day-of-month month day-of-week".
//
// Syntax (what Kubernetes CronJob accepts, with the differences noted):
//   - minute 0-59, hour 0-23, day-of-month 1-31, month 1-12 or JAN-DEC, day-of-week 0-6 or
//     SUN-SAT (0 is Sunday). 7 is also accepted as Sunday, as Vixie cron does, though only as a
//     value or the end of a range ("5-7"); `*` and "N/step" stop at 6. Names are
//     case-insensitive three-letter abbreviations.
//   - Each field is a comma list of: `*`; `?` (day-of-month and day-of-week only, same as `*`);
//     a value; a range "a-b" with a <= b; and any of those followed by "/step" (step >= 1), where
//     "a/step" runs from a to the field's maximum. Empty list elements are rejected.
//   - Fields are separated by any run of whitespace; leading and trailing whitespace is ignored.
//   - Descriptors @yearly (@annually), @monthly, @weekly, @daily (@midnight) and @hourly, in any
//     letter case. @every and @reboot are rejected, as are TZ= and CRON_TZ= prefixes: the time
//     zone comes from spec.timeZone.
//
// Day matching follows robfig/cron (and so Kubernetes): a day-of-month or day-of-week field is
// "unrestricted" when one of its list elements is `*` or `?` without a step, or with step 1. If
// either field is unrestricted, a day fires when both fields match it; if both are restricted,
// a day fires when either matches ("0 0 13 * 5": every 13th and every Friday). Note that
// "*/2" counts as restricted, unlike in Vixie cron.
//
// Time zones: a schedule fires at the wall-clock minutes it matches in the zone. A wall-clock
// time that a daylight-saving transition skips does not fire that day (with New York's clocks
// jumping from 02:00 to 03:00, "30 2 * * *" does not fire on that day). A wall-clock time that
// occurs twice fires once, at its first occurrence (when New York's clocks go back from 02:00 to
// 01:00, "30 1 * * *" fires at 01:30 EDT and not at 01:30 EST; "*/15 * * * *" fires at 01:00,
// 01:15, 01:30 and 01:45 EDT and next at 02:00 EST).
//
// Next and Prev search field by field on civil time, skipping months, days and hours that cannot
// match, so each call costs at most a few hundred calendar steps. A schedule that can never fire
// ("0 0 30 2 *") is recognised when parsed and answers nullopt at once.
//
// Thread-safety: immutable after Parse; all methods may be called concurrently.
class CronSchedule {
 public:
  // How far Next and Prev look. Any schedule that fires at all fires at least every 8 years
  // (February 29 across 2100), so within this window only daylight-saving gaps can hide every
  // fire time, which takes a pathological schedule.
  static constexpr int64_t kSearchYears = 10;

  // Parses `spec`. On failure returns InvalidArgument naming the schedule, the field and the
  // offending token, e.g. `schedule "61 * * * *": minute field: 61 is out of range 0-59`.
  static absl::StatusOr<CronSchedule> Parse(std::string_view spec);

  // The first fire time strictly after `after`, in `zone`. nullopt when the schedule never fires,
  // when nothing fires within kSearchYears, or when `after` is infinite.
  std::optional<absl::Time> Next(absl::Time after, absl::TimeZone zone) const;

  // The last fire time at or before `at`, in `zone`. nullopt when the schedule never fires, when
  // nothing fired within kSearchYears before `at`, or when `at` is infinite.
  std::optional<absl::Time> Prev(absl::Time at, absl::TimeZone zone) const;

  // Whether the wall-clock minute matches all five fields, regardless of time zone.
  bool Matches(absl::CivilMinute minute) const;

  // The text given to Parse, unchanged.
  const std::string& spec() const { return spec_; }

 private:
  CronSchedule() = default;

  bool DayMatches(absl::CivilDay day) const;
  // The first matching civil minute >= `from` in a year <= `last_year`.
  std::optional<absl::CivilMinute> NextMatch(absl::CivilMinute from, int64_t last_year) const;
  // The last matching civil minute <= `from` in a year >= `first_year`.
  std::optional<absl::CivilMinute> PrevMatch(absl::CivilMinute from, int64_t first_year) const;

  std::string spec_;
  // Bit i set: value i matches. Day-of-week uses 0-6 with 0 = Sunday (7 is folded into 0).
  uint64_t minutes_ = 0;
  uint32_t hours_ = 0;
  uint32_t days_of_month_ = 0;
  uint16_t months_ = 0;
  uint8_t days_of_week_ = 0;
  bool day_of_month_unrestricted_ = false;
  bool day_of_week_unrestricted_ = false;
  // False for schedules like "0 0 30 2 *" whose days never exist.
  bool can_fire_ = true;
};

// Loads the time zone named by a ProfileSchedule's spec.timeZone: an IANA tz database name such
// as "Europe/Berlin", read from the system tz database; "" and "UTC" mean UTC. Names that abseil
// would also accept but that are not tz database names are rejected: fixed offsets ("+01:00",
// "Fixed/UTC+01:00:00"), "Local"/"localtime", file paths and names containing "." or ".."
// components. Returns InvalidArgument naming the zone otherwise.
absl::StatusOr<absl::TimeZone> LoadScheduleTimeZone(std::string_view name);

// The schedule times a CronJob-style controller has to act on at `now`.
struct MissedRuns {
  // At most this many schedule times are counted.
  static constexpr int64_t kMaxCounted = 101;
  // More than this many is "too many missed start times" (the CronJob controller's limit).
  static constexpr int64_t kTooMany = 100;

  // Schedule times in (window_start, now] are due. window_start is the last schedule time if
  // set, else the creation time, moved up to now - startingDeadlineSeconds when that is later.
  absl::Time window_start;
  // The latest schedule time in (window_start, now]: the one run to start, if any.
  std::optional<absl::Time> most_recent;
  // How many schedule times fall in (window_start, now], counted up to kMaxCounted.
  int64_t missed = 0;
  // missed > kTooMany: the controller should warn "too many missed start times" (and still
  // start most_recent).
  bool too_many = false;
  // The first schedule time after both `now` and the last schedule time, i.e. when to look again.
  std::optional<absl::Time> next;
};

// The Kubernetes CronJob controller's missed-run rule (mostRecentScheduleTime in
// pkg/controller/cronjob), counting exactly rather than by the controller's approximation.
// A negative starting_deadline_seconds is treated as 0 (nothing is ever late enough to start);
// the CRD's validation rejects it. A last_schedule_time or creation time after `now` (clock skew)
// yields no runs. Costs one Prev and at most kMaxCounted + 1 Next calls, however long the window.
MissedRuns ComputeMissedRuns(const CronSchedule& schedule, absl::TimeZone zone, absl::Time creation,
                             std::optional<absl::Time> last_schedule_time,
                             std::optional<int64_t> starting_deadline_seconds, absl::Time now);

}  // namespace clusterprof::controllers

#endif  // CLUSTERPROF_OPERATOR_CONTROLLERS_CRON_H_
