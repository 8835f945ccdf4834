#include "common/xspace/summary.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/base/saturating.h"
#include "common/base/strings.h"
#include "common/xspace/schema.h"

namespace clusterprof::xspace {

using ::tensorflow::profiler::XEvent;
using ::tensorflow::profiler::XLine;
using ::tensorflow::profiler::XPlane;
using ::tensorflow::profiler::XSpace;
using ::tensorflow::profiler::XStat;

namespace {

int64_t StatAsInt(const XStat& stat) {
  switch (stat.value_case()) {
    case XStat::kInt64Value:
      return stat.int64_value();
    case XStat::kUint64Value:
      return static_cast<int64_t>(stat.uint64_value());
    case XStat::kDoubleValue:
      return SaturatingCast(stat.double_value());
    default:
      return 0;
  }
}

std::string FormatInstant(int64_t ns) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%E6S UTC", absl::FromUnixNanos(ns), absl::UTCTimeZone());
}

}  // namespace

std::string FormatDurationPs(int64_t ps) {
  const double v = static_cast<double>(ps);
  if (ps >= 1'000'000'000'000) return absl::StrFormat("%.3f s", v / 1e12);
  if (ps >= 1'000'000'000) return absl::StrFormat("%.3f ms", v / 1e9);
  if (ps >= 1'000'000) return absl::StrFormat("%.3f us", v / 1e6);
  if (ps >= 1'000) return absl::StrFormat("%.3f ns", v / 1e3);
  return absl::StrFormat("%d ps", ps);
}

std::string FormatDurationNs(int64_t ns) { return FormatDurationPs(SaturatingMul(ns, 1000)); }

SpaceSummary Summarize(const XSpace& space, int top_n) {
  SpaceSummary summary;
  summary.hostnames.assign(space.hostnames().begin(), space.hostnames().end());
  summary.errors.assign(space.errors().begin(), space.errors().end());
  summary.warnings.assign(space.warnings().begin(), space.warnings().end());
  int64_t begin_ps_line_ns = std::numeric_limits<int64_t>::max();
  int64_t end_ns = std::numeric_limits<int64_t>::min();
  absl::flat_hash_map<std::string, EventTotal> totals;
  for (const XPlane& plane : space.planes()) {
    PlaneSummary ps;
    ps.id = plane.id();
    ps.name = plane.name();
    if (plane.name() == kTaskEnvPlaneName) {
      for (const XStat& stat : plane.stats()) {
        auto it = plane.stat_metadata().find(stat.metadata_id());
        if (it == plane.stat_metadata().end()) continue;
        if (it->second.name() == kProfileStartTime) summary.profile_start_ns = StatAsInt(stat);
        if (it->second.name() == kProfileStopTime) summary.profile_stop_ns = StatAsInt(stat);
      }
    }
    for (const XLine& line : plane.lines()) {
      LineSummary ls;
      ls.id = line.display_id() != 0 ? line.display_id() : line.id();
      ls.name = line.display_name().empty() ? line.name() : line.display_name();
      ls.events = line.events_size();
      ps.events += ls.events;
      for (const XEvent& event : line.events()) {
        if (event.data_case() == XEvent::kNumOccurrences) continue;
        const int64_t start_ns = SaturatingAdd(line.timestamp_ns(), event.offset_ps() / 1000);
        const int64_t stop_ns = SaturatingAdd(start_ns, event.duration_ps() / 1000);
        begin_ps_line_ns = std::min(begin_ps_line_ns, start_ns);
        end_ns = std::max(end_ns, stop_ns);
        if (IsCounterLine(line.name())) continue;
        auto md = plane.event_metadata().find(event.metadata_id());
        const std::string& name =
            md == plane.event_metadata().end()
                ? std::string()
                : (md->second.display_name().empty() ? md->second.name()
                                                     : md->second.display_name());
        EventTotal& total = totals[StrCat(plane.name(), "\t", name)];
        if (total.count == 0) total.name = name;
        ++total.count;
        total.total_ps = SaturatingAdd(total.total_ps, std::max<int64_t>(0, event.duration_ps()));
      }
      ps.lines.push_back(std::move(ls));
    }
    summary.events += ps.events;
    summary.planes.push_back(std::move(ps));
  }
  if (summary.events > 0 && begin_ps_line_ns <= end_ns) {
    summary.begin_ns = begin_ps_line_ns;
    summary.end_ns = end_ns;
  }
  for (auto& [key, total] : totals) summary.top_events.push_back(std::move(total));
  std::sort(summary.top_events.begin(), summary.top_events.end(),
            [](const EventTotal& a, const EventTotal& b) {
              if (a.total_ps != b.total_ps) return a.total_ps > b.total_ps;
              return a.name < b.name;
            });
  if (static_cast<int>(summary.top_events.size()) > top_n) summary.top_events.resize(top_n);
  return summary;
}

std::string FormatSummary(const SpaceSummary& s, const std::string& source,
                          int max_lines_per_plane) {
  std::string out = StrCat(source, "\n");
  StrAppend(&out, "  hosts:    ", s.hostnames.empty() ? "(none recorded)" : "");
  for (size_t i = 0; i < s.hostnames.size(); ++i) {
    StrAppend(&out, i > 0 ? ", " : "", s.hostnames[i]);
  }
  StrAppend(&out, "\n  events:   ", s.events, "\n");
  if (s.events > 0) {
    StrAppend(&out, "  span:     ", FormatInstant(s.begin_ns), " + ",
              FormatDurationPs(SaturatingMul(SaturatingSub(s.end_ns, s.begin_ns), 1000)), "\n");
  }
  if (s.profile_start_ns != 0) {
    StrAppend(
        &out, "  capture:  ", FormatInstant(s.profile_start_ns), " + ",
        FormatDurationPs(SaturatingMul(SaturatingSub(s.profile_stop_ns, s.profile_start_ns), 1000)),
        "\n");
  }
  for (const std::string& w : s.warnings) StrAppend(&out, "  warning:  ", w, "\n");
  for (const std::string& e : s.errors) StrAppend(&out, "  error:    ", e, "\n");

  StrAppend(&out, "\n  ",
            absl::StrFormat("%-6s %-32s %8s %10s", "plane", "name", "lines", "events"), "\n");
  for (const PlaneSummary& p : s.planes) {
    StrAppend(&out, "  ",
              absl::StrFormat("%-6d %-32s %8d %10d", p.id, p.name, p.lines.size(), p.events), "\n");
    int shown = 0;
    for (const LineSummary& l : p.lines) {
      if (shown++ == max_lines_per_plane) {
        StrAppend(&out, "           ... ", p.lines.size() - max_lines_per_plane, " more lines\n");
        break;
      }
      // Lines with no thread behind them (async lanes, GPU synchronization) have ids from
      // 2^40 up: they show as short lane numbers.
      constexpr int64_t kLaneIds = int64_t{1} << 40;
      const std::string id =
          l.id >= kLaneIds ? StrCat("lane ", l.id - kLaneIds) : StrCat("line ", l.id);
      StrAppend(&out, "    ",
                absl::StrFormat("%-15s %-30s %10d", id, l.name.empty() ? "-" : l.name, l.events),
                "\n");
    }
  }
  if (!s.top_events.empty()) {
    StrAppend(&out, "\n  top events by total time\n  ",
              absl::StrFormat("%-40s %10s %14s %14s", "name", "count", "total", "average"), "\n");
    for (const EventTotal& e : s.top_events) {
      std::string name = e.name.size() > 40 ? e.name.substr(0, 37) + "..." : e.name;
      StrAppend(&out, "  ",
                absl::StrFormat("%-40s %10d %14s %14s", name.empty() ? "-" : name, e.count,
                                FormatDurationPs(e.total_ps),
                                FormatDurationPs(e.count ? e.total_ps / e.count : 0)),
                "\n");
    }
  }
  return out;
}

}  // namespace clusterprof::xspace
