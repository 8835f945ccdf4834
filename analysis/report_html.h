// The run report as one self-contained HTML page (docs/analysis.md, "The HTML report"): the
// verdict, a hosts x steps heatmap, where each host's time went, one step of every host on the
// common clock, and the ops whose time differs across hosts; many hosts as their worst and
// percentile bands of the others. The page fetches nothing (inline
// style and script, data in a JSON element, a Content-Security-Policy that forbids fetches), so
// it works opened from a file or from a bucket.
#ifndef CLUSTERPROF_ANALYSIS_REPORT_HTML_H_
#define CLUSTERPROF_ANALYSIS_REPORT_HTML_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "analysis/digest.h"
#include "analysis/report.h"

namespace clusterprof::analysis {

// One step's time split into parts that add up to its duration. The digest keeps sums per kind,
// not their positions, and kinds overlap (the host launches while the device computes), so each
// part takes what the ones before it left, in this order.
struct StepBreakdown {
  int64_t collective_ns = 0;  // inside collectives, waiting for the other hosts included
  // Device busy on a host with devices, host busy on one without.
  int64_t compute_ns = 0;
  // Host busy beyond the device's work, on a host with devices: launch and host-side overhead.
  int64_t gpu_idle_ns = 0;
  int64_t input_ns = 0;      // waiting on the input pipeline
  int64_t host_idle_ns = 0;  // the rest: nothing recorded explains it
};
StepBreakdown BreakDownStep(const StepDigest& step, bool has_device);

// Runs of up to this many hosts show each host in every chart, in natural order of names; larger
// ones the kPageWorstHosts worst (HostsWorstFirst), worst first, and the others as percentile
// bands (per step: max, p99, p90, p50, p10, min), so that the page of 10,000 hosts stays about
// the size of that of 24 and draws as fast.
inline constexpr size_t kPageAllHostsUpTo = 64;
inline constexpr size_t kPageWorstHosts = 24;
// The page lists this many stragglers and hosts left out; the JSON report lists them all.
inline constexpr size_t kPageListed = 20;

// The whole page. Host and op names are escaped wherever they appear.
std::string ReportHtml(const RunReport& report);

}  // namespace clusterprof::analysis

#endif  // CLUSTERPROF_ANALYSIS_REPORT_HTML_H_
