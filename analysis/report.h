// A run's cross-host report: every host's file of a run directory digested one at a time (never
// two traces in memory), the clock offsets from the run's manifest, the straggler verdict, and
// the report as text for a terminal and as JSON (schema: docs/analysis.md, "The JSON report").
#ifndef CLUSTERPROF_ANALYSIS_REPORT_H_
#define CLUSTERPROF_ANALYSIS_REPORT_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/digest.h"
#include "analysis/stragglers.h"

namespace clusterprof::storage {
class Storage;
}  // namespace clusterprof::storage

namespace clusterprof::analysis {

inline constexpr int kReportSchemaVersion = 1;

struct RunReport {
  std::string run_dir;
  std::string run;  // the directory's last component
  DigestOptions options;
  Analysis analysis;
  // Each analyzed host's digest and clock offset, in the order of analysis.hosts.
  std::vector<HostRun> runs;
  // Whether clusterprof_run.json was there (clock offsets); without it offsets are taken as 0.
  bool manifest_found = false;
};

// The report of digests already made (by the sidecars, or read here): the verdict over `runs`,
// with `left_out` (hosts without a digest, each with why) put first among the left out.
// `verdict_from_ns` (reference clock; 0: none) is the start instant of a capture that reached
// back (a lookback): the verdict is then over the steps from that instant on, the capture
// window, and the steps of the lookback stay in the digests for context. A trigger's capture
// holds seconds of healthy steps before the slowdown it fired on, which would outvote it.
RunReport MakeRunReport(std::string run_dir, const DigestOptions& options,
                        std::vector<HostRun> runs, const std::vector<std::string>& left_out,
                        bool offsets_known, int64_t verdict_from_ns = 0);

// The hosts of a run directory (its <host>.xplane.pb files, by name) and each one's clock offset
// from the run's manifest (host clock minus the coordinator's; hosts it does not name: 0).
struct RunHosts {
  std::vector<std::string> hosts;
  std::map<std::string, int64_t> clock_offsets_ns;
  bool manifest_found = false;
  // The capture's start when a host's trace reaches back before it (a lookback); 0 otherwise.
  int64_t lookback_start_ns = 0;
  int64_t OffsetOf(const std::string& host) const {
    auto it = clock_offsets_ns.find(host);
    return it == clock_offsets_ns.end() ? 0 : it->second;
  }
};
// NotFound when the directory holds no host file; the listing's error when it cannot be listed.
absl::StatusOr<RunHosts> ListRunHosts(storage::Storage& storage, const std::string& run_dir);

// Reads the run directory `run_dir` through `storage`: each <host>.xplane.pb in turn, and the
// manifest. A file that cannot be read is left out with its reason; `progress` (may be null) is
// told of each host as it is read. An error only when the directory cannot be listed or holds no
// host file.
absl::StatusOr<RunReport> AnalyzeRunDirectory(
    storage::Storage& storage, const std::string& run_dir, const DigestOptions& options,
    const std::function<void(const std::string& host, int index, int total)>& progress = nullptr);

// The verdict in lines: each straggler with its cause and evidence, or that there is none, then
// the notes.
std::string FormatVerdictText(const Analysis& analysis);
// The report for a terminal: the verdict first, then one row per host.
std::string FormatReportText(const RunReport& report);
// The report as JSON, kind clusterprof.io/v1alpha1/RunReport, schema_version kReportSchemaVersion.
std::string ReportJson(const RunReport& report);

}  // namespace clusterprof::analysis

#endif  // CLUSTERPROF_ANALYSIS_REPORT_H_
