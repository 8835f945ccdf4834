// A run's cross-host report: every host's file of a run directory digested one at a time (never
// two traces in memory, each digest packed as it comes), the clock offsets from the run's
// manifest, the straggler verdict, and the report as text for a terminal and as JSON (schema:
// docs/analysis.md, "The JSON report"). Made for 10,000 hosts: docs/analysis.md, "At scale".
#ifndef CLUSTERPROF_ANALYSIS_REPORT_H_
#define CLUSTERPROF_ANALYSIS_REPORT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <ostream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/digest.h"
#include "analysis/digest_pack.h"
#include "analysis/stragglers.h"

namespace clusterprof::storage {
class Storage;
}  // namespace clusterprof::storage

namespace clusterprof::analysis {

inline constexpr int kReportSchemaVersion = 1;

// An op of a host's top ops (HostDigest::top_ops), its name an index into RunReport::op_names:
// 10,000 hosts share their ops' names, which are long (C++ kernel names).
struct ReportOp {
  uint32_t name = 0;
  bool device = false;
  int64_t count = 0;
  int64_t total_ns = 0;
};

// One host of a report: what the text, the JSON and the page need of its digest, its steps packed
// (about 30 bytes a step: 10,000 hosts of 1,000 steps hold some 300 MB).
struct ReportHost {
  std::string host;
  int64_t clock_offset_ns = 0;
  PackedSteps steps;
  std::vector<ReportOp> top_ops;
  // Device work in a step, or a device op among the top ops (the page's breakdown).
  bool has_device = false;
  std::string step_source;
};

struct RunReport {
  std::string run_dir;
  std::string run;  // the directory's last component
  DigestOptions options;
  Analysis analysis;
  // Each analyzed host, in the order of analysis.hosts (natural order of names: h2 before h10).
  std::vector<ReportHost> runs;
  std::vector<std::string> op_names;
  // Whether clusterprof_run.json was there (clock offsets); without it offsets are taken as 0.
  bool manifest_found = false;
};

// Whether `a` comes before `b` in natural order: runs of digits compare as numbers (h2 before
// h10, trainer-9 before trainer-10), the rest byte by byte.
bool NaturalLess(std::string_view a, std::string_view b);

// Builds a report one host at a time: each digest is packed as it is added and released, so a
// report of 10,000 hosts never holds their digests together. Not thread-safe.
class RunReportBuilder {
 public:
  RunReportBuilder(std::string run_dir, DigestOptions options);

  // A host with steps or without (then left out, naming the markers looked for). A digest of
  // more than kMaxDigestSteps steps is left out by name: it is no capture a sidecar makes.
  void Add(HostDigest digest, int64_t clock_offset_ns);
  // A host without a digest, with why ("host-3: unreadable: ...").
  void LeaveOut(std::string why);

  // The verdict over the hosts added (see MakeRunReport for `verdict_from_ns`).
  RunReport Finish(bool offsets_known, int64_t verdict_from_ns = 0) &&;

 private:
  RunReport report_;
  std::vector<std::string> left_out_;
  std::unordered_map<std::string, uint32_t> op_index_;
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

// The analyzed hosts, worst first: stragglers, then by lateness over the compared steps (its
// median), steps late, and step time; ties in natural order of names. Indexes into
// analysis.hosts.
std::vector<size_t> HostsWorstFirst(const Analysis& analysis);

// The hosts of a run directory (its <host>.xplane.pb files, in natural order of names) and each
// one's clock offset from the run's manifest (host clock minus the coordinator's; hosts it does not
// name: 0).
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

// Reads the run directory `run_dir` through `storage`: each <host>.xplane.pb in turn (its digest
// packed and its trace released before the next is read), and the manifest. A file that cannot be
// read is left out with its reason; `progress` (may be null) is told of each host as it is read. An
// error only when the directory cannot be listed or holds no host file.
absl::StatusOr<RunReport> AnalyzeRunDirectory(
    storage::Storage& storage, const std::string& run_dir, const DigestOptions& options,
    const std::function<void(const std::string& host, int index, int total)>& progress = nullptr);

// The verdict in lines: each straggler with its cause and evidence (the first `max_stragglers`,
// then how many more), or that there is none, then the notes.
std::string FormatVerdictText(const Analysis& analysis,
                              size_t max_stragglers = std::numeric_limits<size_t>::max());

// Hosts up to this many get a row each in the terminal; more, and the table shows the
// kTextWorstHosts worst and one line for the rest (FormatReportText's `all` lists every host).
inline constexpr size_t kTextAllHostsUpTo = 25;
inline constexpr size_t kTextWorstHosts = 20;

// The report for a terminal: the verdict first, then the table: every host in natural order of
// names when they are kTextAllHostsUpTo or fewer, or `all`; otherwise the worst hosts, worst
// first, and a summary line of the others. Hosts left out likewise.
std::string FormatReportText(const RunReport& report, bool all = false);

// The report as JSON, kind clusterprof.io/v1alpha1/RunReport, schema_version kReportSchemaVersion:
// every host's verdict, written to `out` as it goes (about 400 bytes a host).
void WriteReportJson(const RunReport& report, std::ostream& out);
std::string ReportJson(const RunReport& report);

}  // namespace clusterprof::analysis

#endif  // CLUSTERPROF_ANALYSIS_REPORT_H_
