// A readable summary of an XSpace, for `clusterprof inspect`: planes, lines, event counts,
// time span and the events that took the most time.
#ifndef CLUSTERPROF_COMMON_XSPACE_SUMMARY_H_
#define CLUSTERPROF_COMMON_XSPACE_SUMMARY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof::xspace {

struct LineSummary {
  int64_t id = 0;
  std::string name;
  int64_t events = 0;
};

struct EventTotal {
  std::string name;
  int64_t count = 0;
  int64_t total_ps = 0;
};

struct PlaneSummary {
  int64_t id = 0;
  std::string name;
  int64_t events = 0;
  std::vector<LineSummary> lines;
};

struct SpaceSummary {
  std::vector<std::string> hostnames;
  std::vector<std::string> errors;
  std::vector<std::string> warnings;
  std::vector<PlaneSummary> planes;
  int64_t events = 0;
  // Earliest start and latest end over all events (ns since the Unix epoch); 0 when empty.
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  // Capture window from the Task Environment plane, when present.
  int64_t profile_start_ns = 0;
  int64_t profile_stop_ns = 0;
  // The events with the largest total duration over all planes, largest first.
  std::vector<EventTotal> top_events;
};

SpaceSummary Summarize(const tensorflow::profiler::XSpace& space, int top_n = 10);

// Renders the summary as aligned text tables. `source` heads the output (a file name).
std::string FormatSummary(const SpaceSummary& summary, const std::string& source,
                          int max_lines_per_plane = 20);

// "1.234 ms", "12.5 us", "3.2 s".
std::string FormatDurationPs(int64_t ps);
// The same for nanoseconds (saturating: any int64 is fine).
std::string FormatDurationNs(int64_t ns);

}  // namespace clusterprof::xspace

#endif  // CLUSTERPROF_COMMON_XSPACE_SUMMARY_H_
