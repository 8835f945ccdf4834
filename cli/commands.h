// The `clusterprof` subcommands as plain functions: main.cc parses flags into these options and
// calls them; tests call them directly. Each returns the process exit code and writes its
// results to `out` and its errors to `err`.
#ifndef CLUSTERPROF_CLI_COMMANDS_H_
#define CLUSTERPROF_CLI_COMMANDS_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "cli/transport.h"
#include "proto/profile_options.h"

namespace clusterprof::coordinator {
struct RunResult;
}  // namespace clusterprof::coordinator

namespace clusterprof::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// What `clusterprof convert` writes.
enum class ConvertFormat {
  kJson,          // Chrome trace JSON (Perfetto, chrome://tracing), with a top-level "metadata"
  kPerfettoJson,  // the same JSON without its "metadata" key (the perfetto_trace.json.gz shape)
  kPerfetto,      // Perfetto's own protobuf trace (docs/trace-format.md)
};

struct ConvertOptions {
  // An .xplane.pb file; with `run`, a run directory whose hosts all go into one trace.
  std::string input;
  // One trace of every host of the run directory `input`: a process per host and plane, on one
  // clock (each host shifted by its clock offset from the run's manifest), streamed. With
  // kPerfetto a host file that cannot be read is named on `err` and left out; the command fails
  // only if no host converted.
  bool run = false;
  // Output path; default: the input with .xplane.pb replaced by .trace.json.gz (kPerfetto:
  // .perfetto-trace), beside it; with `run`: <run>.trace.json.gz (<run>.perfetto-trace) in the
  // current directory. JSON is gzipped unless the name ends in .json; a Perfetto trace only when
  // the name ends in .gz. "-" writes the trace uncompressed to `out`.
  std::string output;
  ConvertFormat format = ConvertFormat::kJson;
  int gzip_level = 1;
};

// clusterprof convert [--run] [--format json|perfetto|perfetto-json] <file.xplane.pb or run dir>
// [-o out]
int RunConvert(const ConvertOptions& options, std::ostream& out, std::ostream& err);

struct InspectOptions {
  // A run directory (<logdir>/plugins/profile/<run>), a logdir, or an .xplane.pb file.
  std::string path;
  int top = 10;
  int max_lines = 20;
  // Only the per-host table for a run directory; no per-host details.
  bool brief = false;
};

// clusterprof inspect <run dir or file>
int RunInspect(const InspectOptions& options, std::ostream& out, std::ostream& err);

struct ReportOptions {
  // A run directory (<logdir>/plugins/profile/<run>), local or gs://.
  std::string path;
  // Where to write the JSON report too ("" for none).
  std::string json;
  // Where to write the HTML report too ("" for none): one self-contained page.
  std::string html;
  // Empty: events with a step_num stat mark the steps.
  std::string step_pattern;
  std::string collective_pattern;  // empty: the default (analysis/digest.h)
  std::string input_pattern;       // empty: the default
  // Per-host progress lines on stderr (only on a terminal).
  bool progress = true;
  // Every host a row in the terminal table; without it, a run of more than
  // analysis::kTextAllHostsUpTo hosts shows the worst and one line for the rest.
  bool all = false;
};

// clusterprof report <run dir>: which host holds the job back (docs/analysis.md).
int RunReport(const ReportOptions& options, std::ostream& out, std::ostream& err);

struct CaptureOptions {
  // host:port[,host:port...]; grpc:// prefixes are accepted.
  std::string service_addr;
  std::string logdir;
  int64_t duration_ms = 2000;
  int64_t delay_ms = 0;
  int num_tracing_attempts = 3;
  // What every host is asked to record: --host/device/python-tracer-level and each --option.
  tensorflow::ProfileOptions profile = proto::DefaultProfileOptions();
  // Empty: YYYY_MM_DD_HH_MM_SS (UTC) of the capture.
  std::string run;
  // Comma list, one per address: the hosts' names in the run.
  std::string host_names;
  // Live progress lines (only on a terminal).
  bool progress = true;
  // A file with the bearer token of sidecars started with --auth-token-file.
  std::string token_file;
  TransportFlags transport;
  // A summary row for every host; without it, a capture of more than
  // analysis::kTextAllHostsUpTo hosts shows those that need attention and one line for the rest.
  bool all = false;
};

// clusterprof capture --service-addr a:8466,b:8466 --logdir DIR [--duration-ms N] ...
int RunCapture(const CaptureOptions& options, std::ostream& out, std::ostream& err);

// The summary table of a capture: a row per host when there are at most
// analysis::kTextAllHostsUpTo of them (or `all`); otherwise the hosts that need attention
// (failed, empty, then the latest starts beyond 1 ms), analysis::kTextWorstHosts at most, and one
// line for the others. Then the outcome counts, and the lookback each host reached.
void PrintCaptureSummary(const coordinator::RunResult& result, bool all, std::ostream& out);

struct TopOptions {
  // host:port[,host:port...]; grpc:// prefixes are accepted.
  std::string service_addr;
  // Or a ProfileTrigger's pods as the operator follows them: its health port (host:port, e.g.
  // through kubectl port-forward) and <namespace>/<name>.
  std::string operator_addr;
  std::string profile_trigger;
  std::string token_file;
  TransportFlags transport;
  // The last this many steps make the step time, the lateness and the verdict.
  int steps = 20;
  // How often the table is drawn again.
  int64_t interval_ms = 1000;
  // Draw one table once every sidecar has sent a step (or after timeout_ms), then exit: for
  // scripts. Without it the table refreshes in place until Ctrl-C.
  bool once = false;
  int64_t timeout_ms = 10'000;
  // Stop after this long (0: until interrupted).
  int64_t seconds = 0;
};

// clusterprof top --service-addr a:8466,b:8466: every host's live step time, how late it enters
// the collectives, and the verdict, refreshing in place (docs/triggers.md).
int RunTop(const TopOptions& options, std::ostream& out, std::ostream& err);

// Where the kubectl plugin's verbs work: the user's kubeconfig and context, as kubectl reads
// them, and the namespace (empty: the context's).
struct KubeFlags {
  std::string kubeconfig;
  std::string context;
  std::string namespace_;
  // Each API request's deadline.
  int64_t request_timeout_ns = 20'000'000'000;
};

struct KubeCaptureOptions {
  KubeFlags kube;
  // The pods, as `kubectl get pods -l` takes them.
  std::string selector;
  int64_t duration_ms = 2000;
  int64_t delay_ms = 1000;
  int64_t lookback_ms = 0;
  // Empty: $CLUSTERPROF_LOGDIR.
  std::string logdir;
  // The ProfileJob's name; empty: generated (capture-xxxxx).
  std::string name;
  // spec.targets.waitSeconds; -1: the CRD's default.
  int64_t wait_seconds = -1;
  int host_tracer_level = 2;
  int device_tracer_level = 1;
  int python_tracer_level = 0;
  // Create the ProfileJob even when no pod matches the selector yet.
  bool force = false;
  // A live progress line on a terminal (plain lines otherwise).
  bool progress = true;
};

// kubectl clusterprof capture -n NS -l SELECTOR --duration 5s: creates a ProfileJob, follows it
// and prints its verdict; non-zero when it fails.
int RunKubeCapture(const KubeCaptureOptions& options, std::ostream& out, std::ostream& err);

struct KubeJobOptions {
  KubeFlags kube;
  std::string job;
  // report: the folder for the report files (default <job>-report); pull: the local logdir
  // (default <job>), the run going to <output>/plugins/profile/<run>.
  std::string output;
};

// kubectl clusterprof report <profilejob>: the verdict, and the report files from the logdir.
int RunKubeReport(const KubeJobOptions& options, std::ostream& out, std::ostream& err);
// kubectl clusterprof pull <profilejob>: the run directory, copied locally.
int RunKubePull(const KubeJobOptions& options, std::ostream& out, std::ostream& err);

// "5s", "500ms", "1m30s", "1.5s" (Go's duration form, as kubectl's flags take it) in ms.
absl::StatusOr<int64_t> ParseDurationMs(std::string_view text);

}  // namespace clusterprof::cli

#endif  // CLUSTERPROF_CLI_COMMANDS_H_
