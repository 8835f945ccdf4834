#include "analysis/digest.h"

#include <algorithm>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/strings/numbers.h"
#include "common/base/saturating.h"
#include "common/base/strings.h"
#include "common/xspace/schema.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::analysis {
namespace {

using tensorflow::profiler::XEvent;
using tensorflow::profiler::XLine;
using tensorflow::profiler::XPlane;
using tensorflow::profiler::XSpace;
using Interval = std::pair<int64_t, int64_t>;

absl::StatusOr<std::regex> Compile(const std::string& pattern, std::string_view what) {
  try {
    return std::regex(pattern, std::regex::ECMAScript | std::regex::icase | std::regex::optimize);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(
        StrCat("the ", what, " pattern '", pattern, "' is not a regular expression: ", e.what()));
  }
}

bool IsDevicePlane(const XPlane& plane) { return StartsWith(plane.name(), "/device:"); }

// The time an event starts and ends, ns since the epoch.
Interval Span(const XLine& line, const XEvent& event) {
  const int64_t start = SaturatingAdd(line.timestamp_ns(), event.offset_ps() / 1000);
  return {start, SaturatingAdd(start, event.duration_ps() / 1000)};
}

// The union of `intervals`' lengths.
int64_t UnionLength(std::vector<Interval>& intervals) {
  std::sort(intervals.begin(), intervals.end());
  int64_t total = 0;
  int64_t covered_to = INT64_MIN;
  for (const auto& [start, end] : intervals) {
    const int64_t from = std::max(start, covered_to);
    if (end > from) total = SaturatingAdd(total, SaturatingSub(end, from));
    covered_to = std::max(covered_to, end);
  }
  return total;
}

// The step number an event carries in its stat `step_stat` (on the event or its metadata).
std::optional<int64_t> StepNumber(const XPlane& plane, const XEvent& event, int64_t step_stat) {
  auto read = [step_stat](const auto& stats) -> std::optional<int64_t> {
    for (const auto& stat : stats) {
      if (stat.metadata_id() != step_stat) continue;
      switch (stat.value_case()) {
        case tensorflow::profiler::XStat::kInt64Value:
          return stat.int64_value();
        case tensorflow::profiler::XStat::kUint64Value:
          return static_cast<int64_t>(stat.uint64_value());
        case tensorflow::profiler::XStat::kDoubleValue:
          return SaturatingCast(stat.double_value());
        case tensorflow::profiler::XStat::kStrValue: {
          int64_t value = 0;
          if (absl::SimpleAtoi(stat.str_value(), &value)) return value;
          return std::nullopt;
        }
        default:
          return std::nullopt;
      }
    }
    return std::nullopt;
  };
  if (std::optional<int64_t> own = read(event.stats())) return own;
  auto it = plane.event_metadata().find(event.metadata_id());
  if (it == plane.event_metadata().end()) return std::nullopt;
  return read(it->second.stats());
}

int64_t StepStatId(const XPlane& plane) {
  for (const auto& [id, metadata] : plane.stat_metadata()) {
    if (metadata.name() == xspace::kStepNum) return id;
  }
  return -1;
}

// Whether metadata names match a pattern, asked once per name of a plane.
class NameMatcher {
 public:
  explicit NameMatcher(const std::regex& re) : re_(re) {}
  bool Matches(const XPlane& plane, int64_t metadata_id) {
    auto [it, inserted] = cache_.try_emplace(metadata_id, false);
    if (inserted) {
      auto metadata = plane.event_metadata().find(metadata_id);
      if (metadata != plane.event_metadata().end()) {
        const std::string& name = metadata->second.name().empty()
                                      ? metadata->second.display_name()
                                      : metadata->second.name();
        it->second = std::regex_search(name, re_);
      }
    }
    return it->second;
  }
  void Reset() { cache_.clear(); }

 private:
  const std::regex& re_;
  std::unordered_map<int64_t, bool> cache_;
};

struct Marker {
  Interval span;
  std::optional<int64_t> step;
};

// The lines (plane index, line id) that carry step markers: the threads that run the steps.
using LineKey = std::pair<int, int64_t>;

// The step markers of `space`, outermost per step number, in time order; the lines they are on
// go into `step_lines`.
std::vector<StepDigest> FindSteps(const XSpace& space, const std::regex* step_re,
                                  std::set<LineKey>* step_lines) {
  std::vector<Marker> markers;
  for (int p = 0; p < space.planes_size(); ++p) {
    const XPlane& plane = space.planes(p);
    if (IsDevicePlane(plane)) continue;
    const int64_t step_stat = StepStatId(plane);
    if (step_re == nullptr && step_stat < 0) continue;
    std::optional<NameMatcher> names;
    if (step_re != nullptr) names.emplace(*step_re);
    for (const XLine& line : plane.lines()) {
      if (xspace::IsCounterLine(line.name())) continue;
      for (const XEvent& event : line.events()) {
        const std::optional<int64_t> step =
            step_stat >= 0 ? StepNumber(plane, event, step_stat) : std::nullopt;
        const bool marker = step_re != nullptr ? names->Matches(plane, event.metadata_id())
                                               : step.has_value();
        if (marker) {
          markers.push_back({Span(line, event), step});
          step_lines->emplace(p, line.id());
        }
      }
    }
  }
  std::sort(markers.begin(), markers.end(),
            [](const Marker& a, const Marker& b) { return a.span < b.span; });
  // Markers without a number (a name pattern on events without step_num) count in time order.
  std::map<int64_t, StepDigest> by_number;
  int64_t sequence = 0;
  for (const Marker& marker : markers) {
    const int64_t number = marker.step.value_or(sequence++);
    auto [it, inserted] = by_number.try_emplace(number);
    StepDigest& step = it->second;
    if (inserted) {
      step.step = number;
      step.start_ns = marker.span.first;
      step.end_ns = marker.span.second;
    } else {
      step.start_ns = std::min(step.start_ns, marker.span.first);
      step.end_ns = std::max(step.end_ns, marker.span.second);
    }
  }
  std::vector<StepDigest> steps;
  for (auto& [number, step] : by_number) steps.push_back(step);
  std::sort(steps.begin(), steps.end(),
            [](const StepDigest& a, const StepDigest& b) { return a.start_ns < b.start_ns; });
  return steps;
}

struct StepIntervals {
  std::vector<Interval> collective, device, host, input;
};

}  // namespace

absl::StatusOr<HostDigest> DigestXSpace(const XSpace& space, std::string host,
                                        const DigestOptions& options) {
  std::optional<std::regex> step_re;
  if (!options.step_pattern.empty()) {
    absl::StatusOr<std::regex> compiled = Compile(options.step_pattern, "step");
    if (!compiled.ok()) return compiled.status();
    step_re = std::move(*compiled);
  }
  absl::StatusOr<std::regex> collective_re = Compile(options.collective_pattern, "collective");
  if (!collective_re.ok()) return collective_re.status();
  absl::StatusOr<std::regex> input_re = Compile(options.input_pattern, "input");
  if (!input_re.ok()) return input_re.status();

  HostDigest digest;
  digest.host = std::move(host);
  digest.step_source = step_re.has_value() ? StrCat("events named like '", options.step_pattern,
                                                    "'")
                                           : StrCat("events with a ", xspace::kStepNum, " stat");
  std::set<LineKey> step_lines;
  digest.steps = FindSteps(space, step_re.has_value() ? &*step_re : nullptr, &step_lines);
  if (digest.steps.empty()) return digest;

  std::vector<StepIntervals> intervals(digest.steps.size());
  // The step whose span holds `start`, if any (steps in time order; the last that starts at or
  // before it).
  auto step_of = [&](int64_t start) -> int {
    auto it = std::upper_bound(digest.steps.begin(), digest.steps.end(), start,
                               [](int64_t t, const StepDigest& s) { return t < s.start_ns; });
    if (it == digest.steps.begin()) return -1;
    --it;
    return start < it->end_ns ? static_cast<int>(it - digest.steps.begin()) : -1;
  };
  for (int p = 0; p < space.planes_size(); ++p) {
    const XPlane& plane = space.planes(p);
    const bool device = IsDevicePlane(plane);
    const int64_t step_stat = device ? -1 : StepStatId(plane);
    NameMatcher collective(*collective_re);
    NameMatcher input(*input_re);
    std::optional<NameMatcher> marker_names;
    if (step_re.has_value()) marker_names.emplace(*step_re);
    for (const XLine& line : plane.lines()) {
      if (xspace::IsCounterLine(line.name())) continue;
      // Host work counts on the threads that run the steps; elsewhere (a loader thread, async
      // lanes such as a batch's time in a queue) only input waits and collectives do.
      const bool step_thread = !device && step_lines.count({p, line.id()}) > 0;
      for (const XEvent& event : line.events()) {
        ++digest.events;
        if (!device) {
          const bool marker = marker_names.has_value()
                                  ? marker_names->Matches(plane, event.metadata_id())
                                  : step_stat >= 0 && StepNumber(plane, event, step_stat);
          if (marker) continue;
        }
        auto [start, end] = Span(line, event);
        const int index = step_of(start);
        if (index < 0) continue;
        StepDigest& step = digest.steps[index];
        end = std::min(end, step.end_ns);
        StepIntervals& into = intervals[index];
        if (collective.Matches(plane, event.metadata_id())) {
          into.collective.emplace_back(start, end);
          if (step.collective_entry_ns == 0 || start < step.collective_entry_ns) {
            step.collective_entry_ns = start;
          }
        } else if (input.Matches(plane, event.metadata_id())) {
          into.input.emplace_back(start, end);
        } else if (device) {
          into.device.emplace_back(start, end);
        } else if (step_thread) {
          into.host.emplace_back(start, end);
        }
      }
    }
  }
  for (size_t i = 0; i < digest.steps.size(); ++i) {
    StepDigest& step = digest.steps[i];
    step.collective_ns = UnionLength(intervals[i].collective);
    step.device_busy_ns = UnionLength(intervals[i].device);
    step.host_busy_ns = UnionLength(intervals[i].host);
    step.input_ns = UnionLength(intervals[i].input);
  }
  std::sort(digest.steps.begin(), digest.steps.end(),
            [](const StepDigest& a, const StepDigest& b) { return a.step < b.step; });
  return digest;
}

}  // namespace clusterprof::analysis
