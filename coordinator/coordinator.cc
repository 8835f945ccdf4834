#include "coordinator/coordinator.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "analysis/digest_proto.h"
#include "analysis/report.h"
#include "analysis/report_html.h"
#include "clusterprof/v1alpha1/sidecar.pb.h"
#include "common/base/cancel.h"
#include "common/base/json_escape.h"
#include "common/base/mutex.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/retry/backoff.h"
#include "common/storage/storage.h"
#include "common/storage/storage_set.h"
#include "coordinator/connector.h"
#include "spdlog/spdlog.h"
#include "tsl/profiler/protos/profiler_service.pb.h"

namespace clusterprof::coordinator {
namespace {

std::string UploadStateName(clusterprof::v1alpha1::UploadState state) {
  switch (state) {
    case clusterprof::v1alpha1::UPLOAD_STATE_SPOOLED:
      return "spooled";
    case clusterprof::v1alpha1::UPLOAD_STATE_UPLOADING:
      return "uploading";
    case clusterprof::v1alpha1::UPLOAD_STATE_COMMITTED:
      return "committed";
    case clusterprof::v1alpha1::UPLOAD_STATE_FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

using clusterprof::v1alpha1::GetInfoRequest;
using clusterprof::v1alpha1::GetInfoResponse;
using clusterprof::v1alpha1::GetSessionRequest;
using clusterprof::v1alpha1::GetSessionResponse;

constexpr int64_t kProbeTimeoutMs = 2000;
constexpr int64_t kSessionQueryTimeoutMs = 5000;
// Released calls (CaptureOptions::outlive_client): at most this many targets at once have a
// Profile call open (connecting, waiting for the sidecar to take it, or being let go), or a read
// of their session. Each holds a connection (about 50 KiB of gRPC state): with the clock probes'
// two targets a node, this bounds the coordinator's memory whatever the number of targets.
constexpr size_t kOpenWindow = 512;
// A windowed call not taken within this long leaves the window and is held.
constexpr int64_t kAcceptWaitNs = 1'000'000'000;
// A released target's session that is not finished yet is read again after this pause.
constexpr int64_t kSessionPollNs = 200'000'000;
// How long a Terminate (CaptureOptions.stop) may take.
constexpr int64_t kStopTimeoutNs = 5'000'000'000;
// Sending one Profile request (serializing, queueing on its channel): about 0.1 ms measured at
// 1,000 targets on a 2-vCPU VM; counted twice for slower machines.
constexpr int64_t kSendNsPerTarget = 200'000;
// The most a target's connection may add to the lead (a first probe round slowed by something
// else: a target timing out is left out of the measure, a machine paused is not).
constexpr int64_t kMaxConnectNsPerTarget = 1'000'000;
// The same over TLS, whose handshake costs the client about 1 ms of CPU more per connection with
// OpenSSL 3 (bench/RESULTS.md, "TLS to every sidecar"): with the plaintext bound, the requests
// of targets connecting as they go out reached some after T0.
constexpr int64_t kMaxTlsConnectNsPerTarget = 4'000'000;
constexpr auto kProgressInterval = std::chrono::milliseconds(100);
constexpr char kNoTraceMessage[] =
    "No trace event was collected because there were no responses from clients or the responses "
    "did not have trace data.";

// "UNAVAILABLE: ...", as upstream's clients print a failed call.
std::string Describe(const absl::Status& status) {
  return StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

int64_t AppliedOffset(const TargetResult& result) {
  return result.clock_offset_applied ? result.clock_offset_ns : 0;
}

// One target's connection and the state of its current call.
struct TargetState {
  TargetResult result;
  // Made when first needed (Run::Conn); with released calls, closed once the target's request
  // is taken and again once its session is read.
  std::unique_ptr<ProfilerConnection> connection;
  std::string reported_name;
  std::vector<ClockSample> samples;
  bool probing = true;  // false once the target answered UNIMPLEMENTED or failed
  bool down = false;
  // The last Profile failed with a code upstream clients retry.
  bool retryable = false;
  // T0 (our clock) of the session the target's current attempt runs: the attempt's T0, or, for
  // a running session joined on resume, the T0 it was started for.
  int64_t t0_ns = 0;
  // GetSession's wake_error_ns - start_error_ns: how long after its data's start it woke.
  int64_t wake_after_start_ns = 0;
  // The start its session reported (its own clock); 0: none yet.
  int64_t session_start_ns = 0;
  // Given its node's offset: one clock sample of its own, taken after the capture to check it.
  bool clock_checked = false;
  std::optional<ClockSample> check_sample;
  // Released calls: the sidecar took the request (Profile's `accepted`) and captures without
  // the call; the target's results come from its session (Run::Collect).
  bool released = false;
  // Released calls: this attempt's Profile call is counted in the open window (until its
  // callback has run, the connection then closing); calls still open on the target (a session read,
  // and a clock check); and whether the last session read found it finished.
  bool in_window = false;
  int calls_open = 0;
  bool settled = false;
  // Released calls: the sidecar says when it took a request (GetInfo's announces_accepted, its
  // own or its node's probed sidecar's); one that does not has its call held.
  bool announces = false;
  int64_t sent_mono_ns = 0;
};

// The offset interval [offset - uncertainty, offset + uncertainty] holds the true offset (the
// remote clock was read between sending and receiving). Two estimates of one clock overlap.
bool Overlap(const ClockEstimate& a, const ClockEstimate& b) {
  return std::abs(a.offset_ns - b.offset_ns) <= a.uncertainty_ns + b.uncertainty_ns;
}

// The common part of two overlapping estimates of one clock.
ClockEstimate Intersect(const ClockEstimate& a, const ClockEstimate& b) {
  const int64_t low = std::max(a.offset_ns - a.uncertainty_ns, b.offset_ns - b.uncertainty_ns);
  const int64_t high = std::min(a.offset_ns + a.uncertainty_ns, b.offset_ns + b.uncertainty_ns);
  return {low + (high - low) / 2, (high - low) / 2};
}

std::string DescribeEstimate(const ClockEstimate& estimate) {
  return StrCat(estimate.offset_ns / 1000, " us +- ", estimate.uncertainty_ns / 1000, " us");
}

// Counts outstanding callbacks; the coordinating thread waits for zero. Callbacks record their
// results under the same mutex, so the coordinating thread reads them safely.
class Pending {
 public:
  void Add(int n) {
    MutexLock lock(&mu_);
    count_ += n;
  }
  // Runs `record` under the mutex and counts the call done.
  void Complete(const std::function<void()>& record) {
    MutexLock lock(&mu_);
    record();
    --count_;
  }
  // Waits for every callback, calling `tick` (without the mutex) about every 100 ms meanwhile.
  void Wait(const std::function<void()>& tick) {
    while (true) {
      {
        MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return count_ == 0; },
                                 kProgressInterval)) {
          return;
        }
      }
      if (tick) tick();
    }
  }
  Mutex& mu() { return mu_; }
  int count() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return count_; }

 private:
  Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

class Run {
 public:
  Run(const CaptureOptions& options, Clock& clock, const ProgressFn& progress)
      : options_(options), clock_(clock), progress_(progress) {}
  ~Run() {
    if (stopper_.joinable()) stopper_.join();
    // Connections wait for their calls in flight; every Wait above saw them all answered.
    targets_.clear();
  }

  absl::StatusOr<RunResult> Execute();

 private:
  void Connect();
  // Target i's connection, made now if it has none. The coordinating thread only.
  ProfilerConnection& Conn(size_t i);
  // Closes target i's connection (its calls are answered). The coordinating thread only.
  void Close(size_t i);
  // Ends every call in flight, and those made later (the cancel token's callback).
  void CancelAll();
  bool cancelled() const { return options_.cancel != nullptr && options_.cancel->cancelled(); }
  bool stopped() const { return stopped_ns_.load(std::memory_order_acquire) != 0; }
  // CaptureOptions.stop: Terminate to every target, on connections of its own (the
  // coordinating thread may be waiting on its calls), kOpenWindow at a time.
  void SendStops();
  // Sleeps until `wake_ns` on the monotonic clock; false when cancelled first.
  bool SleepUntilMonotonic(int64_t wake_ns);
  // Released calls: the targets whose calls have all been answered (closable_), taken; waits up
  // to kProgressInterval for one first when `wait`.
  std::vector<size_t> TakeClosable(bool wait);
  // Checks the open-file limit against the targets (a connection each), raising the soft limit
  // when it is too low, and says so when even the hard limit is.
  void CheckFileLimit() const;
  void ProbeClocks();
  // GetInfo round trips to `subset` (clock_probes rounds, or until each stopped answering);
  // the connections of `warm` are started once the first round is sent.
  void ProbeRounds(const std::vector<size_t>& subset, const std::vector<size_t>& warm = {});
  // Sends one timed Sidecar.GetInfo to target `i` (counted in pending_ by the caller): `record`
  // gets the answer and, when it came, its clock sample, under pending_.mu().
  void AskTime(
      size_t i,
      std::function<void(TargetState&, const absl::StatusOr<GetInfoResponse>&, const ClockSample&)>
          record);
  // Gives `target` the clock estimate `estimate`.
  void SetClock(TargetState& target, const ClockEstimate& estimate);
  // Judges again, on its own clock, a target whose clock (checked after the capture) disagrees
  // with its node's.
  void CheckNodeClock(TargetState& target);
  void ChooseHostNames();
  // Sends Sidecar.GetSession for the run to each of `targets` at once and waits for every
  // answer; `record` gets each one under pending_.mu().
  void AskSessions(
      const std::vector<size_t>& targets,
      const std::function<void(size_t, const absl::StatusOr<GetSessionResponse>&)>& record);
  // Asks the sidecars in `subset` for the run's session (resume); returns the targets still to
  // capture.
  std::vector<size_t> Recover(const std::vector<size_t>& subset);
  void Attempt(const std::vector<size_t>& subset);
  // The request for target i in this attempt.
  tensorflow::ProfileRequest MakeRequest(size_t i) const;
  // Sends target i its Profile request (counted in pending_); `windowed`: released calls.
  void SendProfile(size_t i, int64_t deadline_ns, bool windowed);
  // Attempt with released calls: requests go out with at most kOpenWindow targets waiting for
  // acceptance, and each accepted call is let go, its connection closed.
  void AttemptReleased(const std::vector<size_t>& subset);
  // Reads back the sessions of the released targets of `subset` once they end, kOpenWindow at a
  // time, re-reading those not finished yet until the deadline.
  void Collect(const std::vector<size_t>& subset);
  // Records target i's session read in Collect (under pending_.mu()); sets `settled` when the
  // target needs no more reads.
  void ApplyCollected(size_t i, const absl::StatusOr<GetSessionResponse>& response,
                      int64_t deadline_ns);
  void QuerySessions(const std::vector<size_t>& subset);
  // Records a session's results in `target` (under pending_.mu()).
  void ApplySession(const GetSessionResponse& session, TargetState& target);
  static void ApplyUploads(const GetSessionResponse& session, TargetResult& result);
  void Report();
  // Adds to the message of failed targets that could not be reached what the connector can
  // tell of the cause (a TLS certificate not accepted, and why), for a few of them at once.
  void ExplainConnectFailures();
  // Report, at most once a kProgressInterval (a loop that wakes often at 10,000 targets).
  void ReportEvery();
  RunResult Snapshot();
  // Checks the options (the run's layout given among them); an INVALID_ARGUMENT names what is
  // wrong.
  absl::Status Prepare();
  // Sleeps the backoff before attempt `attempt` of `last`; CANCELLED when cancelled meanwhile.
  absl::Status PauseBeforeRetry(Backoff& backoff, int attempt, int last, size_t targets);
  // Picks T0 for `targets` targets and tells before_attempt, picking again (a later T0) when
  // before_attempt left too little of the lead.
  absl::Status PickStart(int attempt, bool first_attempt, const std::vector<size_t>& subset);
  // The targets of `subset` to capture again: retryable failures; and, while no target has data
  // at all, the empty ones too (upstream retries the whole capture then).
  std::vector<size_t> ToRetry(const std::vector<size_t>& subset) const;
  // Writes `content` as `name` in the run directory, its URI into `uri`; a failure is a
  // warning naming `what` (the captures are written whatever happens here).
  void WriteRunFile(std::string_view name, std::string_view what, const std::string& content,
                    std::string* uri);
  void WriteManifest(RunResult* result, int64_t created_ns);
  // The cross-host report of the targets' digests.
  std::shared_ptr<const analysis::RunReport> MakeReport(const RunResult& result) const;
  void WriteReport(RunResult* result);
  storage::StorageSet& Storages();
  absl::Status Cancelled() const {
    return absl::CancelledError(
        StrCat("the capture of run ", options_.layout->run(), " was cancelled"));
  }

  const CaptureOptions& options_;
  Clock& clock_;
  const ProgressFn& progress_;
  std::unique_ptr<ProfilerConnector> own_connector_;
  ProfilerConnector* connector_ = nullptr;
  std::atomic<int64_t> stopped_ns_{0};
  std::thread stopper_;
  // Calls are let go once a sidecar has taken the request, and sessions read back
  // (outlive_client: the sidecars capture without their client).
  const bool release_calls_ = options_.outlive_client;
  // Guards making and closing connections against the cancel token's callback, which cancels
  // the calls of every connection there is.
  Mutex connections_mu_;
  bool connections_cancelled_ ABSL_GUARDED_BY(connections_mu_) = false;
  Pending pending_;
  // Released calls, under pending_.mu(): targets in the open window, targets whose request was
  // taken (their call to cancel), and targets whose calls are all answered (their connection to
  // close).
  size_t in_window_ = 0;
  int64_t last_report_mono_ns_ = 0;
  // What connecting and one call cost a target in the first probe round, on this machine with
  // this many targets at once: the 90th percentile answer's time over its rank. 0: unmeasured.
  int64_t connect_ns_per_target_ = 0;
  std::vector<size_t> accepted_;
  std::vector<size_t> closable_;
  // Written by callbacks under pending_.mu(); read by the coordinating thread under it, or
  // with no call in flight.
  std::vector<TargetState> targets_;
  analysis::DigestOptions digest_options_;
  std::unique_ptr<storage::StorageSet> own_storages_;
  int64_t t0_ns_ = 0;
  int attempt_ = 0;
};

void Run::Connect() {
  connector_ = options_.connector;
  if (connector_ == nullptr) {
    own_connector_ =
        std::make_unique<GrpcConnector>(options_.auth_token, options_.security,
                                        options_.previous_auth_token, options_.channel_pool);
    connector_ = own_connector_.get();
  }
  targets_.reserve(options_.targets.size());
  for (const Target& target : options_.targets) {
    TargetState state;
    std::string_view address = target.address;
    ConsumePrefix(&address, "grpc://");  // as ParseServiceAddresses does
    state.result.address = std::string(address);
    state.result.host_name = target.host_name;
    state.result.node = target.node;
    targets_.push_back(std::move(state));
  }
}

ProfilerConnection& Run::Conn(size_t i) {
  TargetState& target = targets_[i];
  if (target.connection == nullptr) {
    std::unique_ptr<ProfilerConnection> connection = connector_->Connect(target.result.address);
    MutexLock lock(&connections_mu_);
    if (connections_cancelled_) connection->CancelCalls();
    target.connection = std::move(connection);
  }
  return *target.connection;
}

void Run::Close(size_t i) {
  std::unique_ptr<ProfilerConnection> closing;
  {
    MutexLock lock(&connections_mu_);
    closing = std::move(targets_[i].connection);
  }
  // Waits for its calls' callbacks, which take pending_.mu(): not held here.
}

void Run::CancelAll() {
  MutexLock lock(&connections_mu_);
  connections_cancelled_ = true;
  for (TargetState& target : targets_) {
    if (target.connection != nullptr) target.connection->CancelCalls();
  }
}

void Run::CheckFileLimit() const {
  // A connection per target, and what the process holds besides (the API server's connections,
  // logs, the storage's files): about this much room. Released calls: the probes' connections
  // (two a node, or the target's own) and the open window.
  constexpr rlim_t kOtherFiles = 256;
  size_t connections = options_.targets.size();
  if (release_calls_) {
    std::map<std::string_view, size_t> nodes;
    size_t probed = 0;
    for (const Target& target : options_.targets) {
      if (options_.clock_probe_per_node && !target.node.empty() && !target.host_name.empty()) {
        if (++nodes[target.node] <= 2) ++probed;
      } else {
        ++probed;
      }
    }
    connections = std::min(connections, probed + kOpenWindow);
  }
  const rlim_t needed = static_cast<rlim_t>(connections) + kOtherFiles;
  struct rlimit files {};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur >= needed) return;
  const rlim_t was = files.rlim_cur;
  files.rlim_cur = std::min(needed, files.rlim_max);
  if (files.rlim_cur > was && setrlimit(RLIMIT_NOFILE, &files) == 0) {
    spdlog::info("raised the open-file limit from {} to {} for {} targets (a connection each)", was,
                 files.rlim_cur, options_.targets.size());
  } else {
    files.rlim_cur = was;
  }
  if (files.rlim_cur < needed) {
    spdlog::warn(
        "the open-file limit is {} (hard limit {}), too low for {} targets ({} connections at "
        "once, about {} files in all): targets past it fail with \"Too many open files\". Raise "
        "the hard limit (ulimit -Hn, or the container runtime's LimitNOFILE)",
        files.rlim_cur, files.rlim_max, options_.targets.size(), connections, needed);
  }
}

void Run::ProbeRounds(const std::vector<size_t>& subset, const std::vector<size_t>& warm) {
  bool warmed = false;
  for (int round = 0; round < std::max(1, options_.clock_probes); ++round) {
    std::vector<size_t> probing;
    for (size_t i : subset) {
      if (targets_[i].probing) probing.push_back(i);
    }
    if (probing.empty()) break;
    // The first round connects: when its answers came says what a connection costs here.
    const bool measure = round == 0 && connect_ns_per_target_ == 0;
    const int64_t round_start_ns = clock_.MonotonicNs();
    std::vector<int64_t> answered_ns;
    if (measure) answered_ns.reserve(probing.size());
    pending_.Add(static_cast<int>(probing.size()));
    for (size_t i : probing) {
      AskTime(i, [&, measure](TargetState& target, const absl::StatusOr<GetInfoResponse>& response,
                              const ClockSample& sample) {
        if (measure && response.ok()) answered_ns.push_back(clock_.MonotonicNs() - round_start_ns);
        if (response.ok()) {
          target.result.is_sidecar = true;
          target.announces = response->announces_accepted();
          target.reported_name = response->host_name();
          target.samples.push_back(sample);
          return;
        }
        target.probing = false;
        if (!absl::IsUnimplemented(response.status())) {
          // Down or unreachable; its Profile call will say so, and be retried.
          target.down = true;
          target.result.message = Describe(response.status());
        }
        // UNIMPLEMENTED: a TF/JAX profiler server; offset 0, uncertainty unknown.
      });
    }
    if (!warmed) {
      for (size_t i : warm) Conn(i).Warm();
      warmed = true;
    }
    pending_.Wait([this] { Report(); });
    if (measure && !answered_ns.empty()) {
      std::sort(answered_ns.begin(), answered_ns.end());
      const size_t rank = (answered_ns.size() * 9 + 9) / 10;  // 1-based, the 90th percentile
      connect_ns_per_target_ = std::max<int64_t>(1, answered_ns[rank - 1] / rank);
    }
  }
  if (!warmed) {
    for (size_t i : warm) Conn(i).Warm();
  }
}

void Run::AskTime(
    size_t i,
    std::function<void(TargetState&, const absl::StatusOr<GetInfoResponse>&, const ClockSample&)>
        record) {
  const int64_t send_wall = clock_.WallNs();
  const int64_t send_mono = clock_.MonotonicNs();
  Conn(i).GetInfo(
      kProbeTimeoutMs * kNanosPerMilli, [this, i, send_wall, send_mono, record = std::move(record)](
                                            absl::StatusOr<GetInfoResponse> response) {
        const int64_t rtt = clock_.MonotonicNs() - send_mono;
        const ClockSample sample{send_wall, rtt, response.ok() ? response->wall_time_ns() : 0};
        pending_.Complete([&] { record(targets_[i], response, sample); });
      });
}

void Run::SetClock(TargetState& target, const ClockEstimate& estimate) {
  target.result.clock_offset_ns = estimate.offset_ns;
  target.result.clock_uncertainty_ns = estimate.uncertainty_ns;
  // An offset within its own uncertainty cannot be told from zero: the clocks agree better than
  // the probe can measure (same host, or good NTP/PTP), and the target's own clock is the better
  // reference. A larger one is corrected for.
  target.result.clock_offset_applied = std::abs(estimate.offset_ns) > estimate.uncertainty_ns;
}

void Run::ProbeClocks() {
  // Per node: the first two targets are probed (the second checks that the node has one clock);
  // the rest wait for their node's answer. Targets without a node, or without a host name (they
  // need GetInfo for the name they report), are probed themselves.
  std::vector<size_t> probe;
  std::map<std::string, std::vector<size_t>> nodes;
  for (size_t i = 0; i < targets_.size(); ++i) {
    const Target& target = options_.targets[i];
    if (options_.clock_probe_per_node && !target.node.empty() && !target.host_name.empty()) {
      std::vector<size_t>& members = nodes[target.node];
      members.push_back(i);
      if (members.size() <= 2) probe.push_back(i);
    } else {
      probe.push_back(i);
    }
  }
  // Their connections are made while the first probes are answered; with released calls, only
  // the first window's (the rest connect as their requests go out, a window at a time).
  std::vector<size_t> warm;
  for (const auto& [node, members] : nodes) {
    for (size_t k = 2; k < members.size(); ++k) warm.push_back(members[k]);
  }
  if (release_calls_ && warm.size() > kOpenWindow) {
    std::sort(warm.begin(), warm.end());  // the dispatch's order
    warm.resize(kOpenWindow);
  }
  ProbeRounds(probe, warm);

  std::vector<size_t> more;
  for (const auto& [node, members] : nodes) {
    std::vector<std::pair<size_t, ClockEstimate>> probed;
    for (size_t k = 0; k < std::min<size_t>(2, members.size()); ++k) {
      const TargetState& target = targets_[members[k]];
      if (!target.samples.empty()) {
        probed.emplace_back(members[k], EstimateClockOffset(target.samples));
      }
    }
    const bool disagree = probed.size() == 2 && !Overlap(probed[0].second, probed[1].second);
    if (probed.empty() || disagree) {
      if (disagree) {
        spdlog::warn(
            "node {}: {} and {} disagree on its clock ({} against {}): each of its {} targets is "
            "probed itself",
            node, targets_[probed[0].first].result.address,
            targets_[probed[1].first].result.address, DescribeEstimate(probed[0].second),
            DescribeEstimate(probed[1].second), members.size());
      }
      // No sidecar answered for the node (down, or TF/JAX servers), or its clocks differ.
      for (size_t k = 2; k < members.size(); ++k) more.push_back(members[k]);
      continue;
    }
    const ClockEstimate estimate =
        probed.size() == 2 ? Intersect(probed[0].second, probed[1].second) : probed[0].second;
    const std::string& via = targets_[probed[0].first].result.address;
    for (size_t k = 0; k < members.size(); ++k) {
      TargetState& target = targets_[members[k]];
      if (k < 2 && target.samples.empty()) continue;  // a probe that failed stands for itself
      SetClock(target, estimate);
      if (k >= 2) {
        target.probing = false;
        target.result.is_sidecar = true;  // until it says otherwise (GetSession)
        target.announces = targets_[probed[0].first].announces;  // one image on the node
        target.result.clock_probed_via = via;
      }
    }
  }
  ProbeRounds(more);

  for (TargetState& target : targets_) {
    if (!target.samples.empty() && target.result.clock_uncertainty_ns < 0) {
      SetClock(target, EstimateClockOffset(target.samples));
    }
  }
}

void Run::ChooseHostNames() {
  // A sidecar's own name (its pod or --host-name) makes the nicest file name, but only when the
  // sidecars' names tell them apart (several local sidecars may share the machine's name).
  std::multiset<std::string> reported;
  for (const TargetState& target : targets_) {
    if (!target.reported_name.empty()) reported.insert(target.reported_name);
  }
  for (TargetState& target : targets_) {
    if (!target.result.host_name.empty()) continue;
    const bool usable = !target.reported_name.empty() &&
                        reported.count(target.reported_name) == 1 &&
                        storage::HostFileStem(target.reported_name).ok();
    target.result.host_name = usable ? target.reported_name : target.result.address;
  }
}

void Run::AskSessions(
    const std::vector<size_t>& targets,
    const std::function<void(size_t, const absl::StatusOr<GetSessionResponse>&)>& record) {
  if (!release_calls_) {
    pending_.Add(static_cast<int>(targets.size()));
    for (size_t i : targets) {
      Conn(i).GetSession(options_.layout->run(), kSessionQueryTimeoutMs * kNanosPerMilli,
                         [this, i, &record](absl::StatusOr<GetSessionResponse> response) {
                           pending_.Complete([&] { record(i, response); });
                         });
    }
    pending_.Wait(nullptr);
    return;
  }
  // Released calls: kOpenWindow at a time, each connection closed once answered (a resumed
  // run of 10,000 targets reads them all here).
  size_t next = 0;
  size_t open = 0;
  while (next < targets.size() || open > 0) {
    for (; next < targets.size() && open < kOpenWindow; ++next, ++open) {
      const size_t i = targets[next];
      pending_.Add(1);
      Conn(i).GetSession(options_.layout->run(), kSessionQueryTimeoutMs * kNanosPerMilli,
                         [this, i, &record](absl::StatusOr<GetSessionResponse> response) {
                           pending_.Complete([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                             record(i, response);
                             closable_.push_back(i);
                           });
                         });
    }
    for (size_t i : TakeClosable(/*wait=*/true)) {
      --open;
      Close(i);
    }
  }
}

std::vector<size_t> Run::Recover(const std::vector<size_t>& subset) {
  std::vector<size_t> sidecars;
  for (size_t i : subset) {
    if (targets_[i].result.is_sidecar) sidecars.push_back(i);
  }
  std::vector<bool> settled(targets_.size(), false);
  AskSessions(sidecars, [&](size_t i, const absl::StatusOr<GetSessionResponse>& answer) {
    TargetState& target = targets_[i];
    // Not found, or not reachable now: captured (or retried) like any target.
    if (!answer.ok()) return;
    const GetSessionResponse& response = *answer;
    switch (response.state()) {
      case clusterprof::v1alpha1::SESSION_STATE_DONE:
      case clusterprof::v1alpha1::SESSION_STATE_FAILED:
        settled[i] = true;
        target.result.recovered = true;
        target.result.attempts = std::max(target.result.attempts, 1);
        target.t0_ns = options_.start_at_ns;
        target.result.outcome = response.state() == clusterprof::v1alpha1::SESSION_STATE_FAILED
                                    ? Outcome::kFailed
                                : response.empty_trace() ? Outcome::kEmpty
                                                         : Outcome::kOk;
        target.result.message = response.error();
        target.result.phase = Phase::kDone;
        ApplySession(response, target);
        break;
      default:
        // Still running: the attempt joins it, and judges its start against the T0 it was
        // started for.
        target.t0_ns = options_.start_at_ns;
        break;
    }
  });
  std::vector<size_t> rest;
  for (size_t i : subset) {
    if (!settled[i]) rest.push_back(i);
  }
  return rest;
}

tensorflow::ProfileRequest Run::MakeRequest(size_t i) const {
  const TargetResult& result = targets_[i].result;
  tensorflow::ProfileRequest request;
  request.set_duration_ms(options_.duration_ms);
  request.set_repository_root(options_.layout->RepositoryRoot());
  request.set_session_id(options_.layout->run());
  request.set_host_name(result.address);
  tensorflow::ProfileOptions* opts = request.mutable_opts();
  *opts = options_.profile;
  opts->set_version(1);  // 0 would make the server ignore every option below
  opts->set_duration_ms(options_.duration_ms);
  opts->set_start_timestamp_ns(static_cast<uint64_t>(result.requested_start_ns));
  opts->set_session_id(options_.layout->run());
  if (options_.outlive_client) {
    (*opts->mutable_advanced_configuration())[proto::kOutliveClientKey].set_bool_value(true);
  }
  if (result.host_name != result.address) {
    opts->set_override_hostname(result.host_name);
    (*opts->mutable_advanced_configuration())[proto::kOverrideHostnameKey].set_string_value(
        result.host_name);
  }
  return request;
}

void Run::SendProfile(size_t i, int64_t deadline_ns, bool windowed) {
  TargetState& target = targets_[i];
  TargetResult& result = target.result;
  {
    MutexLock lock(&pending_.mu());
    ++result.attempts;
    result.outcome = Outcome::kPending;
    result.phase = Phase::kWaiting;
    target.released = false;
    target.settled = false;
    target.retryable = false;
    // A joined session keeps the T0 it was started for (set by Recover).
    if (target.t0_ns == 0) target.t0_ns = t0_ns_;
    result.requested_start_ns = target.t0_ns + AppliedOffset(result);
    target.in_window = windowed;
    target.sent_mono_ns = clock_.MonotonicNs();
    if (windowed) ++in_window_;
  }
  pending_.Add(1);
  std::function<void()> accepted;
  if (windowed) {
    accepted = [this, i] {
      MutexLock lock(&pending_.mu());
      targets_[i].released = true;
      accepted_.push_back(i);
    };
  }
  Conn(i).Profile(
      MakeRequest(i), deadline_ns - clock_.WallNs(),
      [this, i, windowed](absl::StatusOr<tensorflow::ProfileResponse> response) {
        pending_.Complete([&] {
          TargetState& target = targets_[i];
          if (target.in_window) {
            target.in_window = false;
            --in_window_;
          }
          if (windowed) closable_.push_back(i);
          // Let go once taken: the session, read back later, has the results.
          if (target.released) return;
          TargetResult& result = target.result;
          result.phase = Phase::kCollecting;  // kDone once its session status is in
          target.retryable = !response.ok() && IsRetryable(response.status());
          if (response.ok()) {
            result.outcome = response->empty_trace() ? Outcome::kEmpty : Outcome::kOk;
            result.message.clear();
          } else {
            result.outcome = Outcome::kFailed;
            result.message = Describe(response.status());
          }
        });
      },
      std::move(accepted));
}

void Run::Attempt(const std::vector<size_t>& subset) {
  if (release_calls_) {
    AttemptReleased(subset);
    return;
  }
  const int64_t deadline_ns = t0_ns_ + (options_.duration_ms + options_.grace_ms) * kNanosPerMilli;
  for (size_t i : subset) SendProfile(i, deadline_ns, /*windowed=*/false);
  pending_.Wait([this] { Report(); });
}

void Run::AttemptReleased(const std::vector<size_t>& subset) {
  const int64_t deadline_ns = t0_ns_ + (options_.duration_ms + options_.grace_ms) * kNanosPerMilli;
  // The window bounds memory, never lateness: this close to T0 every request left goes out.
  const int64_t open_all_ns = t0_ns_ - options_.fan_out_lead_ms * kNanosPerMilli / 2;
  // Windowed calls in the order sent: one not taken within kAcceptWaitNs leaves the window and
  // is held (a sidecar that should have said so and did not).
  std::deque<size_t> sent;
  int held_unannounced = 0;
  size_t next = 0;
  while (true) {
    std::vector<size_t> to_cancel;
    std::vector<size_t> to_close;
    size_t room = 0;
    bool finished = false;
    {
      MutexLock lock(&pending_.mu());
      const bool sending = next < subset.size() && !cancelled() && !stopped();
      const auto ready = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return !accepted_.empty() || !closable_.empty() ||
               (sending && (in_window_ < kOpenWindow || clock_.WallNs() >= open_all_ns)) ||
               (!sending && pending_.count() == 0);
      };
      pending_.mu().AwaitWithTimeout(ready, kProgressInterval);
      to_cancel.swap(accepted_);
      to_close.swap(closable_);
      const int64_t now = clock_.MonotonicNs();
      while (!sent.empty()) {
        TargetState& target = targets_[sent.front()];
        if (target.in_window && target.sent_mono_ns + kAcceptWaitNs > now) break;
        if (target.in_window) {
          target.in_window = false;
          --in_window_;
          ++held_unannounced;
        }
        sent.pop_front();
      }
      if (sending) {
        room = clock_.WallNs() >= open_all_ns ? subset.size() - next
                                              : kOpenWindow - std::min(kOpenWindow, in_window_);
      }
      finished = !sending && pending_.count() == 0;
    }
    // Accepted: the call is let go (the sidecar records without it); its connection closes
    // once the call's callback has run.
    for (size_t i : to_cancel) {
      if (targets_[i].connection != nullptr) targets_[i].connection->CancelCalls();
    }
    for (size_t i : to_close) Close(i);
    if (finished) break;
    // A server that does not say when it took the request (TF/JAX, or a sidecar of before
    // that) has its call held to the end, outside the window.
    for (; next < subset.size() && !cancelled() && !stopped(); ++next) {
      const size_t i = subset[next];
      const bool windowed = targets_[i].result.is_sidecar && targets_[i].announces;
      if (windowed && room == 0) break;
      if (windowed) {
        --room;
        sent.push_back(i);
      }
      SendProfile(i, deadline_ns, windowed);
    }
    ReportEvery();
  }
  if (held_unannounced > 0) {
    spdlog::warn(
        "{} target(s) did not say within {} ms that they took their request: their calls are "
        "held to the end of the capture",
        held_unannounced, kAcceptWaitNs / kNanosPerMilli);
  }
}

void Run::ApplyCollected(size_t i, const absl::StatusOr<GetSessionResponse>& response,
                         int64_t deadline_ns) {
  TargetState& target = targets_[i];
  TargetResult& result = target.result;
  const auto fail = [&](const absl::Status& status) {
    result.outcome = Outcome::kFailed;
    result.message = Describe(status);
    target.retryable = IsRetryable(status);
    target.settled = true;
  };
  if (!response.ok()) {
    if (absl::IsNotFound(response.status())) {
      // It took the request and has no session now: it restarted and lost it.
      fail(absl::UnavailableError(
          StrCat("the sidecar took the request, then lost session ", options_.layout->run(),
                 " (it restarted during the capture?): ", response.status().message())));
    } else if (clock_.WallNs() >= deadline_ns) {
      fail(response.status());
    }
    return;  // not reachable now: read again until the deadline
  }
  switch (response->state()) {
    case clusterprof::v1alpha1::SESSION_STATE_DONE:
      result.outcome = response->empty_trace() ? Outcome::kEmpty : Outcome::kOk;
      result.message.clear();
      target.settled = true;
      ApplySession(*response, target);
      // As its Profile call would have ended: a file whose upload failed for good is not where
      // the run will be read.
      for (const auto& file : response->files()) {
        if (file.upload_state() != clusterprof::v1alpha1::UPLOAD_STATE_FAILED) continue;
        result.outcome = Outcome::kFailed;
        result.message = Describe(absl::InternalError(StrCat(
            "the capture was recorded, but uploading ", file.uri(), " failed: ", file.error())));
        break;
      }
      return;
    case clusterprof::v1alpha1::SESSION_STATE_FAILED: {
      const auto code = response->error_code() != 0
                            ? static_cast<absl::StatusCode>(response->error_code())
                            : absl::StatusCode::kInternal;
      fail(absl::Status(code, response->error()));
      ApplyUploads(*response, result);
      return;
    }
    default:
      // Still waiting, capturing or collecting: read again, until the deadline.
      if (clock_.WallNs() >= deadline_ns) {
        fail(absl::DeadlineExceededError(
            StrCat("the session did not finish within the grace period (state ",
                   clusterprof::v1alpha1::SessionState_Name(response->state()), ")")));
      }
      return;
  }
}

void Run::Collect(const std::vector<size_t>& subset) {
  std::vector<size_t> released;
  int64_t end_ns = 0;
  for (size_t i : subset) {
    if (!targets_[i].released) continue;
    released.push_back(i);
    end_ns = std::max(end_ns, targets_[i].t0_ns + options_.duration_ms * kNanosPerMilli);
  }
  if (released.empty()) return;
  const int64_t deadline_ns = end_ns + options_.grace_ms * kNanosPerMilli;
  // The sessions end at their planned end; reading them earlier finds them running.
  const int64_t now_wall = clock_.WallNs();
  const int64_t first_read_mono = clock_.MonotonicNs() + std::max<int64_t>(0, end_ns - now_wall);
  // Released targets, in order of when they are to be read next (monotonic ns).
  std::multimap<int64_t, size_t> queue;
  for (size_t i : released) queue.emplace(first_read_mono, i);
  size_t open = 0;
  bool reads_moved_up = false;
  while (!queue.empty() || open > 0) {
    if (stopped() && !reads_moved_up) {
      // Stopped early: the sessions end now, not at their planned end.
      reads_moved_up = true;
      std::multimap<int64_t, size_t> now_due;
      for (const auto& [due, i] : queue) now_due.emplace(clock_.MonotonicNs() + kSessionPollNs, i);
      queue.swap(now_due);
    }
    if (cancelled()) {
      // Every call in flight is being cancelled; wait for their callbacks.
      pending_.Wait(nullptr);
      for (size_t i : released) Close(i);
      return;
    }
    // Send what is due, within the window.
    const int64_t now = clock_.MonotonicNs();
    while (!queue.empty() && queue.begin()->first <= now && open < kOpenWindow) {
      const size_t i = queue.begin()->second;
      queue.erase(queue.begin());
      TargetState& target = targets_[i];
      // Given its node's offset: asked the time once, on this connection (see QuerySessions).
      const bool check = !target.result.clock_probed_via.empty() && !target.clock_checked;
      {
        MutexLock lock(&pending_.mu());
        target.calls_open = check ? 2 : 1;
      }
      ++open;
      pending_.Add(target.calls_open);
      // Under pending_.mu(), from a call's callback.
      const auto answered = [this, i]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        if (--targets_[i].calls_open == 0) closable_.push_back(i);
      };
      if (check) {
        target.clock_checked = true;
        AskTime(i, [answered](TargetState& target, const absl::StatusOr<GetInfoResponse>& response,
                              const ClockSample& sample) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          if (response.ok()) target.check_sample = sample;
          answered();
        });
      }
      Conn(i).GetSession(
          options_.layout->run(), kSessionQueryTimeoutMs * kNanosPerMilli,
          [this, i, deadline_ns, answered](absl::StatusOr<GetSessionResponse> response) {
            pending_.Complete([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
              ApplyCollected(i, response, deadline_ns);
              answered();
            });
          });
    }
    // Wait for answers, or until the next read is due.
    for (size_t i : TakeClosable(/*wait=*/open > 0)) {
      --open;
      if (targets_[i].settled) {
        // Finished: its connection goes; a target read again keeps it.
        Close(i);
      } else {
        queue.emplace(clock_.MonotonicNs() + kSessionPollNs, i);
      }
    }
    if (open == 0 && !queue.empty() && queue.begin()->first > clock_.MonotonicNs()) {
      // A cancel or a stop is seen at the loop's top (a stop within kSessionPollNs).
      SleepUntilMonotonic(
          std::min(queue.begin()->first, reads_moved_up || options_.stop == nullptr
                                             ? queue.begin()->first
                                             : clock_.MonotonicNs() + kSessionPollNs));
    }
    ReportEvery();
  }
  for (size_t i : released) {
    CheckNodeClock(targets_[i]);
    targets_[i].result.phase = Phase::kDone;
  }
}

void Run::QuerySessions(const std::vector<size_t>& all) {
  // Released targets were read back by Collect.
  std::vector<size_t> subset;
  for (size_t i : all) {
    if (!targets_[i].released) subset.push_back(i);
  }
  std::vector<size_t> sidecars;
  for (size_t i : subset) {
    // Failed ones too: a capture whose upload failed is a failed Profile call with files.
    if (targets_[i].result.is_sidecar) sidecars.push_back(i);
  }
  // Targets given their node's offset are asked the time once, beside their session, on the
  // connection the capture opened: a clock of their own shows here.
  std::vector<size_t> checks;
  for (size_t i : sidecars) {
    const TargetState& target = targets_[i];
    if (!target.result.clock_probed_via.empty() && !target.clock_checked) checks.push_back(i);
  }
  pending_.Add(static_cast<int>(checks.size()));
  for (size_t i : checks) {
    targets_[i].clock_checked = true;
    AskTime(i, [](TargetState& target, const absl::StatusOr<GetInfoResponse>& response,
                  const ClockSample& sample) {
      if (response.ok()) target.check_sample = sample;
    });
  }
  AskSessions(sidecars, [&](size_t i, const absl::StatusOr<GetSessionResponse>& response) {
    TargetResult& result = targets_[i].result;
    if (!result.clock_probed_via.empty() && absl::IsUnimplemented(response.status())) {
      // Given its node's offset unasked, and not a clusterprof sidecar after all.
      result.is_sidecar = false;
      return;
    }
    if (result.outcome == Outcome::kFailed) {
      if (response.ok()) ApplyUploads(*response, result);
      return;
    }
    if (!response.ok()) {
      result.warnings.push_back(
          StrCat("session status unavailable: ", Describe(response.status())));
      result.digest_note =
          StrCat("no digest: its session status was not read (", Describe(response.status()), ")");
      return;
    }
    ApplySession(*response, targets_[i]);
  });
  for (size_t i : checks) CheckNodeClock(targets_[i]);
  for (size_t i : subset) targets_[i].result.phase = Phase::kDone;
  // Servers that are not sidecars: the file upstream's layout puts them in.
  for (size_t i : subset) {
    TargetResult& result = targets_[i].result;
    if (result.is_sidecar || result.outcome == Outcome::kFailed) continue;
    result.digest_note =
        "a TF/JAX profiler server: it makes no digest (`clusterprof report` on "
        "the run directory reads its file)";
    absl::StatusOr<std::string> stem = storage::HostFileStem(result.host_name);
    if (stem.ok()) result.files = {options_.layout->XPlanePath(*stem)};
  }
}

void Run::CheckNodeClock(TargetState& target) {
  if (!target.check_sample.has_value()) return;
  TargetResult& result = target.result;
  const ClockEstimate node{result.clock_offset_ns, result.clock_uncertainty_ns};
  const ClockEstimate own = EstimateClockOffset({*target.check_sample});
  if (Overlap(node, own)) return;
  // Its request asked for T0 on its node's clock, not its own: what it achieved is mapped onto
  // ours with its own offset, and judged against T0 like any start.
  result.warnings.push_back(StrCat(
      "its clock disagrees with node ", result.node, "'s (", DescribeEstimate(own), " against ",
      DescribeEstimate(node), ", probed through ", result.clock_probed_via,
      "): it was asked to start at the wrong instant; its start is judged on its own clock"));
  spdlog::warn("{} ({}): {}", result.host_name, result.address, result.warnings.back());
  result.clock_probed_via.clear();
  SetClock(target, own);
  if (result.start_known) {
    result.achieved_start_ns = target.session_start_ns - AppliedOffset(result);
    result.start_error_ns = result.achieved_start_ns - target.t0_ns;
    result.wake_error_ns = result.start_error_ns + target.wake_after_start_ns;
  }
}

void Run::ApplyUploads(const GetSessionResponse& session, TargetResult& result) {
  result.uploads.clear();
  for (const auto& file : session.files()) {
    TargetResult::Upload upload;
    upload.uri = file.uri();
    upload.bytes = file.bytes();
    upload.state = UploadStateName(file.upload_state());
    upload.bytes_committed = file.bytes_committed();
    upload.crc32c = file.crc32c();
    upload.error = file.error();
    if (file.upload_state() != clusterprof::v1alpha1::UPLOAD_STATE_COMMITTED) {
      result.warnings.push_back(StrCat(file.uri(), " is not uploaded yet (", upload.state, ", ",
                                       file.bytes_committed(), " of ", file.bytes(), " bytes)",
                                       file.error().empty() ? "" : StrCat(": ", file.error())));
    }
    result.uploads.push_back(std::move(upload));
  }
}

void Run::ApplySession(const GetSessionResponse& session, TargetState& target) {
  TargetResult& result = target.result;
  result.stats_known = true;
  result.events = session.events();
  result.dropped_events = session.dropped_events();
  result.lookback_ns = session.lookback_ns();
  result.bytes = 0;
  result.files.clear();
  for (const auto& file : session.files()) {
    result.files.push_back(file.uri());
    result.bytes += file.bytes();
  }
  ApplyUploads(session, result);
  result.warnings.assign(session.warnings().begin(), session.warnings().end());
  result.digest = nullptr;
  if (session.has_digest()) {
    absl::StatusOr<analysis::HostDigest> digest = analysis::DigestFromProto(session.digest());
    if (digest.ok()) {
      result.digest = std::make_shared<const analysis::PackedDigest>(*std::move(digest));
      result.digest_note.clear();
    } else {
      result.digest_note = std::string(digest.status().message());
    }
  } else {
    result.digest_note = session.digest_error().empty()
                             ? std::string("the sidecar returned no digest")
                             : StrCat("no digest: ", session.digest_error());
  }
  target.session_start_ns = session.start_time_ns();
  // How long after its data's start the sidecar woke (0 for a sidecar of before the field).
  target.wake_after_start_ns =
      session.wake_error_ns() != 0 ? session.wake_error_ns() - session.start_error_ns() : 0;
  if (session.start_time_ns() > 0) {
    result.start_known = true;
    result.achieved_start_ns = session.start_time_ns() - AppliedOffset(result);
    result.start_error_ns = result.achieved_start_ns - target.t0_ns;
    result.wake_error_ns = result.start_error_ns + target.wake_after_start_ns;
  }
}

RunResult Run::Snapshot() {
  RunResult snapshot;
  snapshot.run = options_.layout.has_value() ? options_.layout->run() : "";
  snapshot.run_dir = options_.layout.has_value() ? options_.layout->RunDir() : "";
  snapshot.t0_ns = t0_ns_;
  snapshot.attempt = attempt_;
  {
    MutexLock lock(&pending_.mu());
    for (const TargetState& target : targets_) snapshot.targets.push_back(target.result);
  }
  for (const TargetResult& result : snapshot.targets) {
    switch (result.outcome) {
      case Outcome::kOk:
        ++snapshot.succeeded;
        break;
      case Outcome::kEmpty:
        ++snapshot.empty;
        break;
      case Outcome::kFailed:
        ++snapshot.failed;
        break;
      case Outcome::kPending:
        break;
    }
    if (result.start_known) {
      snapshot.max_start_skew_ns =
          std::max(snapshot.max_start_skew_ns, std::abs(result.start_error_ns));
    }
  }
  return snapshot;
}

void Run::Report() {
  if (!progress_) return;
  const int64_t now = clock_.WallNs();
  RunResult snapshot = Snapshot();
  for (TargetResult& result : snapshot.targets) {
    // Until a target replies, its phase follows the clock.
    if (result.phase != Phase::kWaiting && result.phase != Phase::kCapturing) continue;
    const int64_t start = t0_ns_;
    result.phase = now < start                                      ? Phase::kWaiting
                   : now < start + options_.duration_ms * 1'000'000 ? Phase::kCapturing
                                                                    : Phase::kCollecting;
  }
  progress_(snapshot, now);
}

void Run::ReportEvery() {
  const int64_t now = clock_.MonotonicNs();
  if (now - last_report_mono_ns_ < std::chrono::nanoseconds(kProgressInterval).count()) return;
  last_report_mono_ns_ = now;
  Report();
}

absl::Status Run::Prepare() {
  if (options_.targets.empty()) {
    return absl::InvalidArgumentError("no targets: give at least one host:port");
  }
  if (options_.duration_ms <= 0) {
    return absl::InvalidArgumentError(
        StrCat("duration_ms must be positive (got ", options_.duration_ms, ")"));
  }
  if (options_.delay_ms < 0) {
    return absl::InvalidArgumentError(
        StrCat("delay_ms must not be negative (got ", options_.delay_ms, ")"));
  }
  if (options_.num_tracing_attempts < 1) {
    return absl::InvalidArgumentError("num_tracing_attempts must be at least 1");
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(digest_options_,
                               analysis::DigestOptionsFromProfile(options_.profile));
  if (!options_.layout.has_value()) {
    return absl::InvalidArgumentError(
        "no run layout: CaptureOptions.layout names the logdir and run");
  }
  for (const Target& target : options_.targets) {
    std::string_view address = target.address;
    ConsumePrefix(&address, "grpc://");
    if (address.empty()) return absl::InvalidArgumentError("a target has an empty address");
    if (!target.host_name.empty()) {
      CLUSTERPROF_RETURN_IF_ERROR(storage::HostFileStem(target.host_name).status());
    }
  }
  return absl::OkStatus();
}

absl::Status Run::PauseBeforeRetry(Backoff& backoff, int attempt, int last, size_t targets) {
  const int64_t pause_ns = backoff.NextDelayNs();
  spdlog::info("retrying {} target(s) in {} ms, attempt {} of {}", targets,
               pause_ns / kNanosPerMilli, attempt, last);
  if (!SleepUntilMonotonic(clock_.MonotonicNs() + pause_ns)) return Cancelled();
  return absl::OkStatus();
}

bool Run::SleepUntilMonotonic(int64_t wake_ns) {
  if (options_.cancel == nullptr) {
    clock_.SleepUntilMonotonicNs(wake_ns);
    return true;
  }
  return clock_.SleepUntilMonotonicNsUnless(wake_ns, options_.cancel->flag());
}

std::vector<size_t> Run::TakeClosable(bool wait) {
  std::vector<size_t> taken;
  MutexLock lock(&pending_.mu());
  if (wait) {
    pending_.mu().AwaitWithTimeout(
        [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !closable_.empty(); }, kProgressInterval);
  }
  taken.swap(closable_);
  return taken;
}

absl::Status Run::PickStart(int attempt, bool first_attempt, const std::vector<size_t>& subset) {
  // The lead must cover sending every request (about kSendNsPerTarget each, measured at 1,000
  // targets). When the caller's before_attempt leaves less than half of it, T0 is picked again
  // with the time before_attempt took added.
  int64_t lead_ns =
      options_.fan_out_lead_ms * 1'000'000 + static_cast<int64_t>(subset.size()) * kSendNsPerTarget;
  // Released calls connect as they send: a target without a connection costs what one took in
  // the first probe round (connecting and a call), and more for its request taken, let go and
  // its connection closed: 1.6 times at 10,000 targets here; twice, to spare.
  if (release_calls_ && connect_ns_per_target_ > 0) {
    const bool tls = ConnectionSecurity(options_.channel_pool, options_.security)->tls();
    const int64_t extra_ns =
        std::min<int64_t>(tls ? kMaxTlsConnectNsPerTarget : kMaxConnectNsPerTarget,
                          connect_ns_per_target_ * 2 - kSendNsPerTarget);
    if (extra_ns > 0) {
      int64_t unconnected = 0;
      for (size_t i : subset) unconnected += targets_[i].connection == nullptr ? 1 : 0;
      lead_ns += unconnected * extra_ns;
      if (unconnected > static_cast<int64_t>(kOpenWindow)) {
        spdlog::info(
            "attempt {}: {} targets to connect as their requests go out, about {} us each (the "
            "first probe round's {} us, twice): T0 {} ms ahead",
            attempt, unconnected, (extra_ns + kSendNsPerTarget) / 1000,
            connect_ns_per_target_ / 1000, lead_ns / kNanosPerMilli);
      }
    }
  }
  int64_t extra_ns = 0;
  for (int pick = 0;; ++pick) {
    const int64_t now = clock_.WallNs();
    if (pick == 0 && first_attempt && options_.start_at_ns > 0 &&
        options_.start_at_ns >= now + lead_ns) {
      t0_ns_ = options_.start_at_ns;
    } else {
      t0_ns_ = now + std::max(options_.delay_ms * 1'000'000, lead_ns + extra_ns);
    }
    attempt_ = attempt;
    if (!options_.before_attempt) return absl::OkStatus();
    const int64_t called_ns = clock_.MonotonicNs();
    CLUSTERPROF_RETURN_IF_ERROR(options_.before_attempt(attempt, t0_ns_));
    // Half the lead left is still enough (the lead has room to spare); less is picked again.
    if (clock_.WallNs() + lead_ns / 2 <= t0_ns_ || pick == 2) return absl::OkStatus();
    extra_ns = 2 * (clock_.MonotonicNs() - called_ns);
    spdlog::info("attempt {}: recording the start took {} ms, too close to T0; picking a later one",
                 attempt, (clock_.MonotonicNs() - called_ns) / 1'000'000);
  }
}

std::vector<size_t> Run::ToRetry(const std::vector<size_t>& subset) const {
  if (stopped()) return {};
  bool any_data = false;
  for (const TargetState& target : targets_) {
    any_data = any_data || target.result.outcome == Outcome::kOk;
  }
  std::vector<size_t> retry;
  for (size_t i : subset) {
    const TargetState& target = targets_[i];
    if (target.retryable || (!any_data && target.result.outcome == Outcome::kEmpty)) {
      retry.push_back(i);
    }
  }
  return retry;
}

storage::StorageSet& Run::Storages() {
  if (options_.storages != nullptr) return *options_.storages;
  if (own_storages_ == nullptr) {
    own_storages_ =
        std::make_unique<storage::StorageSet>(storage::StorageSetOptions{.clock = &clock_});
  }
  return *own_storages_;
}

void Run::WriteRunFile(std::string_view name, std::string_view what, const std::string& content,
                       std::string* uri) {
  absl::StatusOr<storage::Storage*> store = Storages().For(options_.layout->logdir());
  absl::StatusOr<storage::ObjectInfo> written =
      store.ok()
          ? storage::WriteObject(**store, StrCat(options_.layout->RunDir(), "/", name), content)
          : absl::StatusOr<storage::ObjectInfo>(store.status());
  absl::Status committed = written.ok() ? storage::CheckCommitted(*written) : written.status();
  if (written.ok()) *uri = written->uri;
  if (!committed.ok()) {
    spdlog::warn("{} was not written: {}", what, std::string(committed.message()));
  }
}

void Run::WriteManifest(RunResult* result, int64_t created_ns) {
  WriteRunFile(storage::kManifestName, "the run manifest",
               ManifestJson(options_, *result, created_ns), &result->manifest_uri);
}

std::shared_ptr<const analysis::RunReport> Run::MakeReport(const RunResult& result) const {
  // One host at a time: at 10,000 targets the digests unpacked all at once would be gigabytes.
  analysis::RunReportBuilder builder(options_.layout->RunDir(), digest_options_);
  for (const TargetResult& target : result.targets) {
    if (target.outcome == Outcome::kFailed || target.outcome == Outcome::kPending) {
      builder.LeaveOut(StrCat(target.host_name, ": no capture (", target.message, ")"));
    } else if (target.outcome == Outcome::kEmpty) {
      builder.LeaveOut(StrCat(target.host_name, ": an empty trace"));
    } else if (target.digest == nullptr) {
      builder.LeaveOut(StrCat(target.host_name, ": ", target.digest_note));
    } else {
      builder.Add(target.digest->Unpack(), target.clock_offset_ns);
    }
  }
  // A capture that reached back is judged over its window (MakeRunReport).
  const bool lookback =
      std::any_of(result.targets.begin(), result.targets.end(),
                  [](const TargetResult& target) { return target.lookback_ns > 0; });
  // Offsets are known when every digest came from a sidecar, which is always probed.
  return std::make_shared<const analysis::RunReport>(
      std::move(builder).Finish(/*offsets_known=*/true, lookback ? result.t0_ns : 0));
}

void Run::WriteReport(RunResult* result) {
  // Best effort: the captures are in whatever happens here, and `clusterprof report` can make
  // the report again from the run directory.
  WriteRunFile(storage::kReportJsonName, storage::kReportJsonName,
               analysis::ReportJson(*result->report), &result->report_json_uri);
  WriteRunFile(storage::kReportHtmlName, storage::kReportHtmlName,
               analysis::ReportHtml(*result->report), &result->report_html_uri);
}

void Run::SendStops() {
  spdlog::info("run {}: stopping the recording of {} target(s) early", options_.layout->run(),
               targets_.size());
  for (size_t begin = 0; begin < targets_.size(); begin += kOpenWindow) {
    const size_t end = std::min(targets_.size(), begin + kOpenWindow);
    std::vector<std::unique_ptr<ProfilerConnection>> connections;
    Mutex mu;
    size_t answered = 0;
    for (size_t i = begin; i < end; ++i) {
      connections.push_back(connector_->Connect(targets_[i].result.address));
      connections.back()->Terminate(options_.layout->run(), kStopTimeoutNs,
                                    [&mu, &answered, address = targets_[i].result.address](
                                        absl::StatusOr<tensorflow::TerminateResponse> response) {
                                      if (!response.ok()) {
                                        spdlog::warn("stopping {}: {}", address,
                                                     response.status().ToString());
                                      }
                                      MutexLock lock(&mu);
                                      ++answered;
                                    });
    }
    MutexLock lock(&mu);
    mu.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return answered >= end - begin; });
  }
}

void Run::ExplainConnectFailures() {
  // The same fault (one CA, one certificate) usually fails every target alike: a few are looked
  // at, in parallel, and their finding is given to the others whose error reads the same.
  constexpr size_t kExplained = 8;
  // The failed targets grouped by what their error says, the groups in target order.
  std::vector<std::vector<size_t>> groups;
  {
    std::map<std::string, size_t> group_of;
    MutexLock lock(&pending_.mu());
    for (size_t i = 0; i < targets_.size(); ++i) {
      const TargetResult& result = targets_[i].result;
      if (result.outcome != Outcome::kFailed || !StartsWith(result.message, "UNAVAILABLE")) {
        continue;
      }
      // "UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: ipv4:ADDR: why":
      // the part after the address is what the targets share.
      std::string_view why = result.message;
      if (const size_t at = why.find(result.address); at != std::string_view::npos) {
        why.remove_prefix(at + result.address.size());
      }
      const auto [it, added] = group_of.emplace(std::string(why), groups.size());
      if (added) groups.emplace_back();
      groups[it->second].push_back(i);
    }
  }
  // The first target of each of the first kExplained groups is looked at.
  const size_t explained = std::min(groups.size(), kExplained);
  if (explained == 0) return;
  std::vector<std::string> found(explained);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < explained; ++k) {
    threads.emplace_back([this, &found, k, address = targets_[groups[k].front()].result.address] {
      found[k] = connector_->ExplainConnectFailure(address);
    });
  }
  for (std::thread& thread : threads) thread.join();
  MutexLock lock(&pending_.mu());
  for (size_t k = 0; k < explained; ++k) {
    if (found[k].empty()) continue;
    const size_t first = groups[k].front();
    for (size_t i : groups[k]) {
      TargetResult& result = targets_[i].result;
      result.message = i == first ? StrCat(result.message, " (", found[k], ")")
                                  : StrCat(result.message, " (as for ",
                                           targets_[first].result.address, ": ", found[k], ")");
    }
  }
}

absl::StatusOr<RunResult> Run::Execute() {
  const int64_t created_ns = clock_.WallNs();
  CLUSTERPROF_RETURN_IF_ERROR(Prepare());
  CheckFileLimit();
  Connect();
  CancelToken::Registration on_stop;
  if (options_.stop != nullptr) {
    on_stop = options_.stop->OnCancel([this] {
      int64_t expected = 0;
      if (!stopped_ns_.compare_exchange_strong(expected, clock_.WallNs())) return;
      stopper_ = std::thread([this] { SendStops(); });
      clock_.Wake();
    });
  }
  // Cancelling ends the calls in flight and the backoff sleep; the capture then returns
  // CANCELLED without a manifest (sidecars asked to outlive their client finish the capture, and
  // a later coordinator resumes the run).
  CancelToken::Registration on_cancel;
  if (options_.cancel != nullptr) {
    on_cancel = options_.cancel->OnCancel([this] {
      CancelAll();
      clock_.Wake();
    });
  }
  Report();
  ProbeClocks();
  ChooseHostNames();

  std::vector<size_t> subset(targets_.size());
  for (size_t i = 0; i < subset.size(); ++i) subset[i] = i;
  if (options_.resume) {
    subset = Recover(subset);
    Report();
  }
  const int first = std::max(0, options_.attempts_used) + 1;
  // Doubling from retry_backoff_ms, without jitter: a busy server (ALREADY_EXISTS) needs its
  // running capture to end, a restarting one a moment to come back.
  Backoff backoff({.initial_ns = options_.retry_backoff_ms * kNanosPerMilli,
                   .max_ns = (options_.retry_backoff_ms << 10) * kNanosPerMilli,
                   .multiplier = 2,
                   .jitter = 0});
  const int last = std::max(first, options_.num_tracing_attempts);
  for (int attempt = first; attempt <= last && !subset.empty(); ++attempt) {
    if (cancelled()) return Cancelled();
    if (stopped()) break;
    if (attempt > first) {
      CLUSTERPROF_RETURN_IF_ERROR(PauseBeforeRetry(backoff, attempt, last, subset.size()));
    }
    CLUSTERPROF_RETURN_IF_ERROR(PickStart(attempt, attempt == first, subset));
    for (size_t i : subset) {
      // A session joined on resume keeps its T0 only in the first attempt.
      if (attempt > first || targets_[i].t0_ns != options_.start_at_ns) targets_[i].t0_ns = 0;
    }
    Attempt(subset);
    if (stopped()) {
      // Requests that went out while the first Terminates did are stopped too.
      if (stopper_.joinable()) stopper_.join();
      SendStops();
    }
    Collect(subset);
    QuerySessions(subset);
    Report();
    subset = ToRetry(subset);
  }

  if (stopper_.joinable()) stopper_.join();
  if (cancelled()) return Cancelled();
  ExplainConnectFailures();
  RunResult result = Snapshot();
  result.stopped_ns = stopped_ns_.load(std::memory_order_acquire);
  if (options_.write_manifest) WriteManifest(&result, created_ns);
  if (result.succeeded > 0) {
    result.report = MakeReport(result);
    if (options_.write_report) WriteReport(&result);
  }
  if (progress_) progress_(result, clock_.WallNs());
  if (result.succeeded == 0) return absl::UnavailableError(kNoTraceMessage);
  return result;
}

}  // namespace

std::vector<const TargetResult*> LatestStarts(const RunResult& result, size_t limit) {
  std::vector<const TargetResult*> late;
  for (const TargetResult& target : result.targets) {
    if (target.outcome == Outcome::kOk && target.start_known &&
        std::llabs(target.start_error_ns) > kLateStartNs) {
      late.push_back(&target);
    }
  }
  const auto farther = [](const TargetResult* a, const TargetResult* b) {
    return std::llabs(a->start_error_ns) > std::llabs(b->start_error_ns);
  };
  if (late.size() > limit) {
    std::partial_sort(late.begin(), late.begin() + static_cast<std::ptrdiff_t>(limit), late.end(),
                      farther);
    late.resize(limit);
  } else {
    std::sort(late.begin(), late.end(), farther);
  }
  return late;
}

std::string_view OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kPending:
      return "pending";
    case Outcome::kOk:
      return "ok";
    case Outcome::kEmpty:
      return "empty";
    case Outcome::kFailed:
      return "failed";
  }
  return "?";
}

bool IsRetryable(const absl::Status& status) {
  // A certificate that is not accepted stays so: retrying would only delay the verdict.
  if (tls::IsTlsVerificationFailure(StdView(status.message()))) return false;
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kAlreadyExists ||
         status.code() == absl::StatusCode::kResourceExhausted ||
         (status.code() == absl::StatusCode::kUnknown &&
          status.message().find("Stream removed") != absl::string_view::npos);
}

absl::StatusOr<std::vector<Target>> ParseServiceAddresses(std::string_view text) {
  std::vector<Target> targets;
  for (std::string_view part : SplitSkipEmpty(text, ',')) {
    part = StripAsciiWhitespace(part);
    ConsumePrefix(&part, "grpc://");
    if (part.empty()) {
      return absl::InvalidArgumentError(StrCat("empty address in '", text, "'"));
    }
    const size_t colon = part.rfind(':');
    if (colon == std::string_view::npos || colon + 1 == part.size() ||
        part.substr(colon + 1).find_first_not_of("0123456789") != std::string_view::npos) {
      return absl::InvalidArgumentError(
          StrCat("address '", part, "' is not host:port (e.g. 10.0.0.2:8466)"));
    }
    targets.push_back({std::string(part), ""});
  }
  if (targets.empty()) {
    return absl::InvalidArgumentError(
        StrCat("no addresses in '", text, "': give host:port[,host:port...]"));
  }
  return targets;
}

ClockEstimate EstimateClockOffset(const std::vector<ClockSample>& samples) {
  const ClockSample& best = *std::min_element(
      samples.begin(), samples.end(),
      [](const ClockSample& a, const ClockSample& b) { return a.rtt_ns < b.rtt_ns; });
  return {best.remote_wall_ns - (best.local_send_wall_ns + best.rtt_ns / 2), best.rtt_ns / 2};
}

absl::StatusOr<RunResult> Capture(const CaptureOptions& options, Clock& clock,
                                  const ProgressFn& progress) {
  Run run(options, clock, progress);
  return run.Execute();
}

}  // namespace clusterprof::coordinator
