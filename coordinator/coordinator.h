// The capture coordinator: one synchronized capture across profiler servers (clusterprof
// sidecars, or TF/JAX profiler servers), shared by `clusterprof capture` and the operator.
// docs/architecture.md, "Capture semantics", steps 2 to 6:
//
//   probe clocks (Sidecar.GetInfo, the sample with the smallest round trip)
//   T0 = now + max(delay, fan-out lead); target i starts at T0 + offset_i on its own clock
//   Profile RPCs to every target at once (gRPC callback API, one channel per target)
//   retry what came back UNAVAILABLE / ALREADY_EXISTS / "Stream removed", with a fresh T0
//   per-target results (Sidecar.GetSession), and the run manifest clusterprof_run.json
#ifndef CLUSTERPROF_COORDINATOR_COORDINATOR_H_
#define CLUSTERPROF_COORDINATOR_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/storage/logdir.h"
#include "proto/profile_options.h"

namespace clusterprof {
class CancelToken;
}  // namespace clusterprof

namespace clusterprof::storage {
class StorageSet;
}  // namespace clusterprof::storage

namespace clusterprof::tls {
class ChannelSecurity;
}  // namespace clusterprof::tls

namespace clusterprof::analysis {
struct HostDigest;
class PackedDigest;
struct RunReport;
}  // namespace clusterprof::analysis

namespace clusterprof::coordinator {

class ChannelPool;
class ProfilerConnector;

struct Target {
  // host:port (a grpc:// prefix is accepted and stripped).
  std::string address;
  // The host's name in the run (its file stem). Empty: the name a clusterprof sidecar reports,
  // when the sidecars' names are distinct; else the address, as upstream clients do.
  std::string host_name;
  // The machine the target runs on (a Kubernetes node name). Targets on one node read one wall
  // clock, so their clock offset can be probed once for all of them (clock_probe_per_node).
  // Empty: unknown; the target's own clock is probed.
  std::string node;
};

struct CaptureOptions {
  std::vector<Target> targets;
  // Where the run goes: made by whoever names the run (the ProfileJob controller from its start
  // instant, `clusterprof capture` from --run or the time). Required.
  std::optional<storage::RunLayout> layout;
  int64_t duration_ms = 2000;
  int64_t delay_ms = 0;
  // The least time between sending the requests and the start, so every target has its
  // request before T0 (a delay larger than this replaces it). 0.2 ms per target is added for
  // sending the requests; when before_attempt leaves less than half the lead, T0 is picked again
  // with the time it took added.
  int64_t fan_out_lead_ms = 200;
  int num_tracing_attempts = 3;
  // Pause before a retry, doubled each time: a busy server (ALREADY_EXISTS) needs its running
  // capture to end, a restarting one a moment to come back.
  int64_t retry_backoff_ms = 1000;
  // What every server is asked to record: tracer levels and advanced_configuration for the
  // servers' tracers ("gpu_max_activity_api_events", "tpu_trace_mode", ...). Each request sends
  // these with its own version, duration, start instant, session id and host name set.
  tensorflow::ProfileOptions profile = proto::DefaultProfileOptions();
  // Ask clusterprof sidecars to capture to the planned end even if this coordinator goes away
  // (advanced_configuration "clusterprof_outlive_client"), so that a restarted one can rejoin or
  // read the results back (see `resume`). TF/JAX servers ignore it and stop as before.
  bool outlive_client = false;
  // GetInfo round trips per target; the one with the smallest RTT sets the offset.
  int clock_probes = 5;
  // Targets that name a node (and a host_name) share their node's clock: two of them are probed
  // (the second is the check), and the node's offset, from the probes of both, is given to the
  // rest. When the two disagree beyond their uncertainties, or neither answers as a sidecar,
  // every target of the node is probed itself. After the capture, each target that was given its
  // node's offset is asked the time once (beside Sidecar.GetSession, on its open connection); one
  // whose clock disagrees with its node's has its start judged on its own clock, with a warning.
  // Targets without a node are probed one by one either way. false: every target is probed.
  bool clock_probe_per_node = true;
  // Extra time allowed after the capture's end for collecting and writing.
  int64_t grace_ms = 30'000;
  bool write_manifest = true;
  // The cross-host report (clusterprof_report.json and .html) from the sidecars' digests, into
  // the run directory next to the manifest.
  bool write_report = true;
  // Sent as "authorization: Bearer <token>" on every call, for sidecars started with
  // --auth-token-file; empty: none. Only for the default connector.
  std::string auth_token;
  // Tried when a sidecar refuses auth_token (UNAUTHENTICATED): the token before a rotation, which
  // a sidecar whose copy of the Secret is not updated yet still holds. Empty: none.
  std::string previous_auth_token;
  // Plaintext or TLS to the servers (common/grpc/tls.h); null: plaintext. Only for the default
  // connector.
  std::shared_ptr<const tls::ChannelSecurity> security;
  // Channels kept across captures (connector.h; the operator's): with it, the default connector
  // takes its channels, and its security, from there. nullptr: a channel per connection.
  ChannelPool* channel_pool = nullptr;
  // How the servers are reached (connector.h); nullptr: gRPC (GrpcConnector with auth_token and
  // security).
  ProfilerConnector* connector = nullptr;
  // Cancel() ends the capture early: calls in flight are cancelled and Capture returns
  // CANCELLED, writing no manifest. nullptr: not cancellable.
  CancelToken* cancel = nullptr;
  // Cancel() stops the recording early, everywhere: every target is sent
  // ProfilerService.Terminate for the run's session (a sidecar then collects and writes what it
  // recorded so far; one still waiting for its start records nothing), what they recorded is
  // collected as usual, with the manifest, and nothing is retried. RunResult.stopped_ns says
  // when. nullptr: not stoppable.
  CancelToken* stop = nullptr;
  // Where the manifest is written (storage_set.h); nullptr: a set made for this capture.
  storage::StorageSet* storages = nullptr;

  // For a caller that persists its progress and may be restarted mid-capture (the operator).
  //
  // T0 of the first attempt (wall clock, ns since the epoch, our clock), used when it is still
  // at least fan_out_lead_ms ahead; otherwise a fresh T0 is picked. 0: pick one.
  int64_t start_at_ns = 0;
  // Attempts an earlier coordinator already made for this run: attempts are numbered from
  // attempts_used + 1, and at least one is made even when that exceeds num_tracing_attempts.
  int attempts_used = 0;
  // Resume the run `run` that an earlier coordinator began: before any Profile request, ask
  // every clusterprof sidecar for the session (Sidecar.GetSession). A finished session gives its
  // results and is not captured again; a running one is joined (same session id, so the sidecar
  // does not start a second capture), its start judged against start_at_ns; a sidecar that never
  // heard of the run is captured as in a fresh attempt. TF/JAX servers cannot be asked and are
  // captured again.
  bool resume = false;
  // Called before each attempt's requests are sent, with its number and T0. An error aborts the
  // capture there (returned by Capture; no request of that attempt is sent), so a caller can
  // refuse to start what it could not record.
  std::function<absl::Status(int attempt, int64_t t0_ns)> before_attempt;
};

enum class Outcome { kPending, kOk, kEmpty, kFailed };
std::string_view OutcomeName(Outcome outcome);

// Where a target is, for progress displays.
enum class Phase { kProbing, kWaiting, kCapturing, kCollecting, kDone };

struct TargetResult {
  std::string address;
  std::string host_name;
  Outcome outcome = Outcome::kPending;
  Phase phase = Phase::kProbing;
  int attempts = 0;
  // Found finished on the sidecar when resuming: its results come from that earlier capture.
  bool recovered = false;
  // A clusterprof sidecar (answers Sidecar.GetInfo); TF/JAX servers are not.
  bool is_sidecar = false;
  // Target wall clock minus ours, and half the probe's round trip; unknown (-1) for servers
  // that are not clusterprof sidecars, which get offset 0.
  int64_t clock_offset_ns = 0;
  int64_t clock_uncertainty_ns = -1;
  // Whether start times were corrected by the offset: only when |offset| > uncertainty (below
  // that the clocks agree better than the probe can tell, and the target's own clock is used).
  bool clock_offset_applied = false;
  // Target.node, and the address of the target whose probe gave this one its node's offset;
  // empty when the target was probed itself (or found, after the capture, to keep a clock of its
  // own: then the offset is its own and its start was judged with it).
  std::string node;
  std::string clock_probed_via;
  // The start sent (on the target's clock) and the start it achieved, mapped onto our clock
  // (assuming the clocks agree when the offset was not applied);
  // start_error_ns = achieved - T0 (0 and unknown for non-sidecars).
  int64_t requested_start_ns = 0;
  int64_t achieved_start_ns = 0;
  int64_t start_error_ns = 0;
  // When the sidecar woke and started its tracers, minus T0 (from GetSession's wake_error_ns):
  // equal to start_error_ns, or later when the host's data reaches back to T0 from its flight
  // recorder (docs/sidecar.md, "Start").
  int64_t wake_error_ns = 0;
  bool start_known = false;
  uint64_t events = 0;
  uint64_t dropped_events = 0;
  // How far before the start the host's trace reaches (the flight recorder's lookback; 0: none).
  int64_t lookback_ns = 0;
  uint64_t bytes = 0;
  bool stats_known = false;  // events/dropped/bytes came from the sidecar
  std::vector<std::string> files;
  // Where each file's upload stands, as the sidecar reported it (GetSession).
  struct Upload {
    std::string uri;
    uint64_t bytes = 0;
    std::string state;  // "committed", "spooled", "uploading", "failed"
    uint64_t bytes_committed = 0;
    std::string crc32c;
    std::string error;
  };
  std::vector<Upload> uploads;
  std::vector<std::string> warnings;
  // The last error, with its gRPC code name ("UNAVAILABLE: ...").
  std::string message;
  // The capture's digest for the cross-host analysis (Sidecar.GetSession), its steps packed (a
  // coordinator of 10,000 targets holds every one until the report); null with why in
  // digest_note ("a TF/JAX profiler server: it makes no digest").
  std::shared_ptr<const analysis::PackedDigest> digest;
  std::string digest_note;
};

struct RunResult {
  std::string run;
  std::string run_dir;
  std::string manifest_uri;  // empty when not written
  // T0 of the last attempt (wall clock, ns since the epoch, our clock), and its number.
  int64_t t0_ns = 0;
  int attempt = 0;
  std::vector<TargetResult> targets;
  // The largest |start_error_ns| among targets with a known start.
  int64_t max_start_skew_ns = 0;
  int succeeded = 0;
  int empty = 0;
  int failed = 0;
  // When CaptureOptions.stop ended the recording (wall clock, ns); 0: it ran its course.
  int64_t stopped_ns = 0;
  // The cross-host analysis of the targets' digests (docs/analysis.md), once the capture is
  // over; null before, and when no target returned data.
  std::shared_ptr<const analysis::RunReport> report;
  // Where it was written; empty when it was not.
  std::string report_json_uri;
  std::string report_html_uri;
};

// Called (from the coordinating thread) whenever a target's state changes, and about every
// 100 ms while waiting, with the current state of every target.
using ProgressFn = std::function<void(const RunResult& state, int64_t now_ns)>;

// A target that started farther than this from T0 (either way) needs attention: the operator's
// status and `clusterprof capture`'s summary list it.
inline constexpr int64_t kLateStartNs = 1'000'000;

// The targets with data whose known start was farther than kLateStartNs from T0, farthest
// first, at most `limit`.
std::vector<const TargetResult*> LatestStarts(const RunResult& result, size_t limit);

// Runs one capture. Fails (UNAVAILABLE, with upstream's message) when no target returned data;
// the RunResult is then still reported through `progress` and written to the manifest. Bad
// options are INVALID_ARGUMENT; a cancelled capture is CANCELLED. Every deadline and pause is
// taken from `clock`.
absl::StatusOr<RunResult> Capture(const CaptureOptions& options, Clock& clock,
                                  const ProgressFn& progress = nullptr);

// Upstream's retry rule, UNAVAILABLE, ALREADY_EXISTS, and UNKNOWN "Stream removed"; and
// RESOURCE_EXHAUSTED, a clusterprof sidecar with too many calls waiting (--max-profile-calls).
bool IsRetryable(const absl::Status& status);

// Parses "grpc://a:8466,b:8466" into targets (an empty entry is an error).
absl::StatusOr<std::vector<Target>> ParseServiceAddresses(std::string_view text);

// The manifest as JSON (docs/cli.md shows it).
std::string ManifestJson(const CaptureOptions& options, const RunResult& result,
                         int64_t created_ns);

// One clock sample: our wall clock when sending, the round trip (monotonic) and the target's
// wall clock in its reply.
struct ClockSample {
  int64_t local_send_wall_ns = 0;
  int64_t rtt_ns = 0;
  int64_t remote_wall_ns = 0;
};
struct ClockEstimate {
  int64_t offset_ns = 0;
  int64_t uncertainty_ns = 0;
};
// The sample with the smallest round trip: offset = remote - (send + rtt/2), uncertainty =
// rtt/2. `samples` must not be empty.
ClockEstimate EstimateClockOffset(const std::vector<ClockSample>& samples);

}  // namespace clusterprof::coordinator

#endif  // CLUSTERPROF_COORDINATOR_COORDINATOR_H_
