#include "analysis/digest.h"

#include <algorithm>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "common/base/saturating.h"
#include "common/base/status.h"
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

constexpr int kPrefetchAhead = 8;

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

// The union of the lengths of `intervals`, which are in order.
int64_t SortedUnionLength(const std::vector<Interval>& intervals) {
  int64_t total = 0;
  int64_t covered_to = INT64_MIN;
  for (const auto& [start, end] : intervals) {
    const int64_t from = std::max(start, covered_to);
    if (end > from) total = SaturatingAdd(total, SaturatingSub(end, from));
    covered_to = std::max(covered_to, end);
  }
  return total;
}

// The step number in `stats` under `step_stat`, if any.
template <typename Stats>
std::optional<int64_t> ReadStepNumber(const Stats& stats, int64_t step_stat) {
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
}

// The step number an event carries in its stat `step_stat`: on the event, else on its metadata
// (looked up once per metadata id).
class StepNumbers {
 public:
  StepNumbers(const XPlane& plane, int64_t step_stat) : plane_(plane), step_stat_(step_stat) {}

  std::optional<int64_t> Of(const XEvent& event) {
    if (std::optional<int64_t> own = ReadStepNumber(event.stats(), step_stat_)) return own;
    const int64_t id = event.metadata_id();
    auto [it, inserted] = by_metadata_.try_emplace(id);
    if (inserted) {
      auto metadata = plane_.event_metadata().find(id);
      if (metadata != plane_.event_metadata().end()) {
        it->second = ReadStepNumber(metadata->second.stats(), step_stat_);
      }
    }
    return it->second;
  }

 private:
  const XPlane& plane_;
  const int64_t step_stat_;
  absl::flat_hash_map<int64_t, std::optional<int64_t>> by_metadata_;
};

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
        const std::string& name = metadata->second.name().empty() ? metadata->second.display_name()
                                                                  : metadata->second.name();
        it->second = std::regex_search(name, re_);
      }
    }
    return it->second;
  }

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
    StepNumbers numbers(plane, step_stat);
    for (const XLine& line : plane.lines()) {
      if (xspace::IsCounterLine(line.name())) continue;
      const int events = line.events_size();
      for (int e = 0; e < events; ++e) {
        if (e + kPrefetchAhead < events) __builtin_prefetch(&line.events(e + kPrefetchAhead));
        const XEvent& event = line.events(e);
        const std::optional<int64_t> step = step_stat >= 0 ? numbers.Of(event) : std::nullopt;
        const bool marker =
            step_re != nullptr ? names->Matches(plane, event.metadata_id()) : step.has_value();
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

enum class EventClass : uint8_t { kUnknown, kMarker, kCollective, kInput, kOther };

// What each event of a plane is, decided once per event metadata (names matched once): a step
// marker, a collective, an input wait, or other work. An event marked by its own step_num stat
// is a marker whatever its metadata.
class EventClasses {
 public:
  EventClasses(const XPlane& plane, const std::regex& collective, const std::regex& input,
               const std::regex* marker, int64_t step_stat)
      : plane_(plane),
        collective_(collective),
        input_(input),
        marker_(marker),
        step_stat_(step_stat) {}

  EventClass Of(const XEvent& event) {
    // The same test as FindSteps: a step number that reads as one.
    if (marker_ == nullptr && step_stat_ >= 0 &&
        ReadStepNumber(event.stats(), step_stat_).has_value()) {
      return EventClass::kMarker;
    }
    const int64_t id = event.metadata_id();
    if (id >= 0 && id < kDense) {
      if (static_cast<size_t>(id) >= dense_.size()) dense_.resize(id + 1, EventClass::kUnknown);
      EventClass& kind = dense_[id];
      if (kind == EventClass::kUnknown) kind = Classify(id);
      return kind;
    }
    auto [it, inserted] = sparse_.try_emplace(id, EventClass::kUnknown);
    if (inserted) it->second = Classify(id);
    return it->second;
  }

 private:
  static constexpr int64_t kDense = 1 << 20;

  EventClass Classify(int64_t id) const {
    auto metadata = plane_.event_metadata().find(id);
    if (metadata == plane_.event_metadata().end()) return EventClass::kOther;
    const std::string& name =
        metadata->second.name().empty() ? metadata->second.display_name() : metadata->second.name();
    if (marker_ != nullptr && std::regex_search(name, *marker_)) return EventClass::kMarker;
    // A step_num stat on the metadata marks every event of it.
    if (marker_ == nullptr && step_stat_ >= 0 &&
        ReadStepNumber(metadata->second.stats(), step_stat_).has_value()) {
      return EventClass::kMarker;
    }
    if (std::regex_search(name, collective_)) return EventClass::kCollective;
    if (std::regex_search(name, input_)) return EventClass::kInput;
    return EventClass::kOther;
  }

  const XPlane& plane_;
  const std::regex& collective_;
  const std::regex& input_;
  const std::regex* marker_;
  const int64_t step_stat_;
  std::vector<EventClass> dense_;
  std::unordered_map<int64_t, EventClass> sparse_;
};

// The intervals of one kind in one step, appended line by line: each line's are in time order
// (XSpace lines are, and are checked), so putting them in order is merging a few sorted runs
// rather than sorting.
class Intervals {
 public:
  void Add(int line_serial, Interval interval) {
    if (line_serial != last_line_) {
      runs_.push_back(intervals_.size());
      last_line_ = line_serial;
    }
    intervals_.push_back(interval);
  }

  // The union of their lengths.
  int64_t UnionLength() {
    runs_.push_back(intervals_.size());
    bool sorted_runs = true;
    for (size_t r = 0; r + 1 < runs_.size() && sorted_runs; ++r) {
      sorted_runs =
          std::is_sorted(intervals_.begin() + runs_[r], intervals_.begin() + runs_[r + 1]);
    }
    if (!sorted_runs) {
      std::sort(intervals_.begin(), intervals_.end());
    } else {
      for (size_t r = 1; r + 1 < runs_.size(); ++r) {
        std::inplace_merge(intervals_.begin(), intervals_.begin() + runs_[r],
                           intervals_.begin() + runs_[r + 1]);
      }
    }
    return SortedUnionLength(intervals_);
  }

 private:
  std::vector<Interval> intervals_;
  std::vector<size_t> runs_;
  int last_line_ = -1;
};

struct StepIntervals {
  Intervals collective, device, host, input;
};

// Time per op of one plane, by event metadata id (dense ids in a vector, as EventClasses).
class OpTotals {
 public:
  void Add(int64_t metadata_id, int64_t duration_ns) {
    Totals* totals;
    if (metadata_id >= 0 && metadata_id < kDense) {
      if (static_cast<size_t>(metadata_id) >= dense_.size()) dense_.resize(metadata_id + 1);
      totals = &dense_[metadata_id];
    } else {
      totals = &sparse_[metadata_id];
    }
    ++totals->count;
    totals->total_ns = SaturatingAdd(totals->total_ns, duration_ns);
  }

  // Folds this plane's totals into `by_name`, by (device, name).
  void FoldInto(const XPlane& plane, bool device,
                std::map<std::pair<bool, std::string>, OpStat>* by_name) const {
    auto fold = [&](int64_t id, const Totals& totals) {
      if (totals.count == 0) return;
      auto metadata = plane.event_metadata().find(id);
      std::string name = metadata == plane.event_metadata().end()
                             ? StrCat("#", id)
                             : (metadata->second.name().empty() ? metadata->second.display_name()
                                                                : metadata->second.name());
      OpStat& op = (*by_name)[{device, name}];
      if (op.count == 0) {
        op.name = std::move(name);
        op.device = device;
      }
      op.count += totals.count;
      op.total_ns = SaturatingAdd(op.total_ns, totals.total_ns);
    };
    for (size_t id = 0; id < dense_.size(); ++id) fold(static_cast<int64_t>(id), dense_[id]);
    for (const auto& [id, totals] : sparse_) fold(id, totals);
  }

 private:
  static constexpr int64_t kDense = 1 << 20;
  struct Totals {
    int64_t count = 0;
    int64_t total_ns = 0;
  };
  std::vector<Totals> dense_;
  std::unordered_map<int64_t, Totals> sparse_;
};

std::vector<OpStat> TopOps(std::map<std::pair<bool, std::string>, OpStat> by_name) {
  std::vector<OpStat> ops;
  ops.reserve(by_name.size());
  for (auto& [key, op] : by_name) ops.push_back(std::move(op));
  auto most_first = [](const OpStat& a, const OpStat& b) {
    if (a.total_ns != b.total_ns) return a.total_ns > b.total_ns;
    if (a.device != b.device) return a.device;
    return a.name < b.name;
  };
  const size_t keep = std::min<size_t>(ops.size(), kMaxTopOps);
  std::partial_sort(ops.begin(), ops.begin() + keep, ops.end(), most_first);
  ops.resize(keep);
  return ops;
}

// The options' patterns, compiled.
struct Patterns {
  std::optional<std::regex> step;  // none: steps are events with a step_num stat
  std::regex collective;
  std::regex input;
};

absl::StatusOr<Patterns> CompilePatterns(const DigestOptions& options) {
  Patterns patterns;
  if (!options.step_pattern.empty()) {
    CLUSTERPROF_ASSIGN_OR_RETURN(patterns.step, Compile(options.step_pattern, "step"));
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(patterns.collective,
                               Compile(options.collective_pattern, "collective"));
  CLUSTERPROF_ASSIGN_OR_RETURN(patterns.input, Compile(options.input_pattern, "input"));
  return patterns;
}

// The step whose span holds an instant, if any, over steps in time order (the last that starts
// at or before it). `hint` is where the line's previous event was: a line's events come in time
// order, so the answer is nearly always there or just after.
class StepLocator {
 public:
  explicit StepLocator(const std::vector<StepDigest>& steps) : steps_(steps) {}
  int Find(int64_t start, int* hint) const {
    const int n = static_cast<int>(steps_.size());
    int i = *hint;
    if (i < 0 || i >= n || start < steps_[i].start_ns) {
      auto it = std::upper_bound(steps_.begin(), steps_.end(), start,
                                 [](int64_t t, const StepDigest& s) { return t < s.start_ns; });
      i = static_cast<int>(it - steps_.begin()) - 1;
    } else {
      while (i + 1 < n && steps_[i + 1].start_ns <= start) ++i;
    }
    *hint = std::max(i, 0);
    return i >= 0 && start < steps_[i].end_ns ? i : -1;
  }

 private:
  const std::vector<StepDigest>& steps_;
};

}  // namespace

absl::Status ValidateDigestOptions(const DigestOptions& options) {
  return CompilePatterns(options).status();
}

absl::StatusOr<HostDigest> DigestXSpace(const XSpace& space, std::string host,
                                        const DigestOptions& options) {
  CLUSTERPROF_ASSIGN_OR_RETURN(const Patterns patterns, CompilePatterns(options));
  const std::optional<std::regex>& step_re = patterns.step;

  HostDigest digest;
  digest.host = std::move(host);
  digest.step_source = step_re.has_value()
                           ? StrCat("events named like '", options.step_pattern, "'")
                           : StrCat("events with a ", xspace::kStepNum, " stat");
  std::set<LineKey> step_lines;
  digest.steps = FindSteps(space, step_re.has_value() ? &*step_re : nullptr, &step_lines);
  if (digest.steps.empty()) return digest;

  std::vector<StepIntervals> intervals(digest.steps.size());
  const StepLocator steps(digest.steps);
  int line_serials = 0;
  std::map<std::pair<bool, std::string>, OpStat> ops_by_name;
  for (int p = 0; p < space.planes_size(); ++p) {
    const XPlane& plane = space.planes(p);
    const bool device = IsDevicePlane(plane);
    OpTotals op_totals;
    const int64_t step_stat = device ? -1 : StepStatId(plane);
    EventClasses classes(plane, patterns.collective, patterns.input,
                         step_re.has_value() && !device ? &*step_re : nullptr, step_stat);
    for (const XLine& line : plane.lines()) {
      if (xspace::IsCounterLine(line.name())) continue;
      // Host work counts on the threads that run the steps; elsewhere (a loader thread, async
      // lanes such as a batch's time in a queue) only input waits and collectives do.
      const bool step_thread = !device && step_lines.count({p, line.id()}) > 0;
      const int line_serial = line_serials++;
      int hint = 0;
      digest.events += line.events_size();
      const int events = line.events_size();
      for (int e = 0; e < events; ++e) {
        // Events are heap objects of their own unless the XSpace was parsed into an arena:
        // fetch the ones a few ahead while this one is worked on.
        if (e + kPrefetchAhead < events) __builtin_prefetch(&line.events(e + kPrefetchAhead));
        const XEvent& event = line.events(e);
        const EventClass kind = classes.Of(event);
        if (kind == EventClass::kMarker) continue;
        if (kind == EventClass::kOther && !device && !step_thread) continue;
        auto [start, end] = Span(line, event);
        const int index = steps.Find(start, &hint);
        if (index < 0) continue;
        StepDigest& step = digest.steps[index];
        end = std::min(end, step.end_ns);
        StepIntervals& into = intervals[index];
        op_totals.Add(event.metadata_id(), SaturatingSub(end, start));
        switch (kind) {
          case EventClass::kCollective:
            into.collective.Add(line_serial, {start, end});
            if (step.collective_entry_ns == 0 || start < step.collective_entry_ns) {
              step.collective_entry_ns = start;
            }
            break;
          case EventClass::kInput:
            into.input.Add(line_serial, {start, end});
            break;
          default:
            (device ? into.device : into.host).Add(line_serial, {start, end});
            break;
        }
      }
    }
    op_totals.FoldInto(plane, device, &ops_by_name);
  }
  digest.top_ops = TopOps(std::move(ops_by_name));
  for (size_t i = 0; i < digest.steps.size(); ++i) {
    StepDigest& step = digest.steps[i];
    step.collective_ns = intervals[i].collective.UnionLength();
    step.device_busy_ns = intervals[i].device.UnionLength();
    step.host_busy_ns = intervals[i].host.UnionLength();
    step.input_ns = intervals[i].input.UnionLength();
  }
  std::sort(digest.steps.begin(), digest.steps.end(),
            [](const StepDigest& a, const StepDigest& b) { return a.step < b.step; });
  return digest;
}

}  // namespace clusterprof::analysis
