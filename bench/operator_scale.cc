// clusterprof-operator at scale, against a real kube-apiserver and etcd on loopback
// (tests/support/kube_control_plane.h), with the operator binary as users run it.
//
// Fan-out: N pods, each Running and Ready at 127.0.0.1 with its own port in the
// clusterprof.io/port annotation, served by simulated sidecars multiplexed into a few
// fake_sidecars processes (bench/fake_sidecars.cc). One ProfileJob over all of them (durationMs
// 1000; delayMs 0 unless --delay-ms, so T0 is the operator's fan-out lead, 200 ms after it picks
// T0 once the clocks are probed). Measured:
//   - the time from creating the ProfileJob to the last Profile request's arrival at a sidecar
//     (every RPC dispatched), and its parts (clock probes, the status write before the attempt);
//   - the margin left between that arrival and T0;
//   - |achieved start - requested start| on the sidecars, and status.targets[].startErrorNs;
//   - the time to Succeeded.
//
// With --tls the simulated sidecars serve TLS (a CA and a certificate for the sidecars' fixed
// name, made in process, in the work directory) and the operator (or the coordinator part)
// verifies them with --sidecar-tls-ca-file, as a cluster with the chart's sidecar.tls does; run
// it against a run without to see what the handshakes cost. The fan-out also reports the
// operator's CPU time (from /proc, sampled with the job's status) and the simulated sidecars'.
//
// Memory: M realistic pods (bench/realistic_pod.h) and J ProfileJobs in the namespace the
// operator watches (most finished, with a status of K targets each; a tenth with selectors
// that match nothing, which the operator fails), then the operator's VmRSS and VmHWM once its
// caches synced and its metrics count every job with none left Pending.
//
//   eval "$(scripts/install-kube-control-plane)"
//   export CLUSTERPROF_KUBE_APISERVER CLUSTERPROF_ETCD
//   build/bench/operator_scale                     # 1,000 targets; 10,000 pods and 100 jobs
//   build/bench/operator_scale --quick             # 50 targets; 500 pods and 10 jobs
//   build/bench/operator_scale --only fanout --tls # 1,000 targets over TLS
//
// Exits 1 when something did not work (a job not Succeeded, a Profile request missing, the
// metrics never counting the jobs), 77 when the control plane's binaries are not installed. It
// checks no timing: the figures are for people.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/realistic_pod.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "common/base/process.h"
#include "common/base/strings.h"
#include "common/grpc/tls.h"
#include "common/storage/logdir.h"
#include "coordinator/coordinator.h"
#include "cpprest/http_client.h"
#include "operator/api/types.h"
#include "operator/kube/rest_client.h"
#include "spdlog/spdlog.h"
#include "tests/operator/crd_fixture.h"
#include "tests/support/kube_control_plane.h"
#include "tests/support/local_http.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_pki.h"

namespace clusterprof::bench {
namespace {

using testing::HttpGet;
using testing::MetricSum;

using api::ProfileJobStatus;
using testing::Subprocess;
using web::json::value;

constexpr char kSourceDir[] = CLUSTERPROF_SOURCE_DIR;
constexpr char kOperator[] = CLUSTERPROF_OPERATOR_PATH;
constexpr char kFakeSidecars[] = CLUSTERPROF_FAKE_SIDECARS_PATH;
constexpr int kSkipped = 77;

struct Options {
  bool fanout = true;
  bool memory = true;
  // The coordinator alone, in a child process as `clusterprof capture` runs it (no Kubernetes).
  bool coordinator = false;
  // Per-node clock probing in the coordinator part: "on", "off", or "both" (off, then on).
  std::string per_node = "on";
  // Released calls in the coordinator part (outlive_client: each call let go once the sidecar
  // took it, sessions read back a window at a time): "on", "off", or "both" (off, then on).
  std::string release = "both";
  // Fail unless every target was captured, each once (a functional run in ctest).
  bool require_all = false;
  int targets = 1000;
  int sidecar_processes = 4;
  int pods_per_node = 8;
  int64_t node_offset_ms = 20;
  std::string operator_path = kOperator;
  std::string fake_sidecars_path = kFakeSidecars;
  int64_t duration_ms = 1000;
  int64_t delay_ms = 0;
  // How long the operator runs, its pods' connections warming, before the job is created.
  int64_t settle_ms = 500;
  int pods = 10000;
  int jobs = 100;
  int job_targets = 64;
  int writers = 8;
  std::string work_dir;
  // Added to the operator's environment (experiments: LD_PRELOAD, MALLOC_ARENA_MAX, ...).
  std::map<std::string, std::string> operator_env;
  // TLS to every simulated sidecar; the files are made by Run (MakeTlsFiles).
  bool tls = false;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
};

double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

// Appends each flag and its value to a command line.
void AddFlags(std::vector<std::string>& args,
              const std::vector<std::pair<std::string, std::string>>& flags) {
  for (const auto& [flag, value] : flags) {
    args.push_back(flag);
    args.push_back(value);
  }
}

// Runs fn(0..n-1) on `threads` threads; the first error, if any.
absl::Status ParallelFor(int n, int threads, const std::function<absl::Status(int)>& fn) {
  std::atomic<int> next{0};
  Mutex mu;
  absl::Status first;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = next++; i < n; i = next++) {
        absl::Status status = fn(i);
        if (!status.ok()) {
          MutexLock lock(&mu);
          if (first.ok()) first = status;
        }
      }
    });
  }
  for (std::thread& thread : pool) thread.join();
  return first;
}

absl::Status CreateNamespace(kube::RestClient& client, const std::string& name) {
  value object = value::object();
  object["metadata"]["name"] = value::string(name);
  return client.Create(kube::Namespaces(), "", object).status();
}

// Creates the pod, then reports it Running and Ready with `status`.
absl::Status CreateRunningPod(kube::RestClient& client, const std::string& ns, const value& pod,
                              const value& status) {
  absl::StatusOr<value> created = client.Create(kube::Pods(), ns, pod);
  if (!created.ok()) return created.status();
  (*created)["status"] = status;
  return client.UpdateStatus(kube::Pods(), ns, *created).status();
}

// A number field of /proc/<pid>/status: KiB for "VmRSS", "VmHWM", "RssAnon"; a count for
// "Threads". -1 when absent.
int64_t ProcStatusKib(pid_t pid, const std::string& field) {
  std::ifstream in(StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (StartsWith(line, field + ":")) return std::atoll(line.c_str() + field.size() + 1);
  }
  return -1;
}

// User plus system CPU time of process `pid` so far, in ms (clock-tick resolution); -1 when it
// cannot be read.
int64_t ProcCpuMs(pid_t pid) {
  std::ifstream in(StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(in, line)) return -1;
  // Fields after the command name (which may hold spaces), from the third: state, ppid, ...,
  // utime (14th) and stime (15th).
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(line.substr(paren + 2));
  std::string field;
  int64_t utime = 0;
  int64_t stime = 0;
  for (int k = 3; k <= 15 && fields >> field; ++k) {
    if (k == 14) utime = std::atoll(field.c_str());
    if (k == 15) stime = std::atoll(field.c_str());
  }
  return (utime + stime) * 1000 / sysconf(_SC_CLK_TCK);
}

// Waits until `done()`, checking every `interval`; false after `timeout`.
bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout,
             std::chrono::milliseconds interval = std::chrono::milliseconds(50)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(interval);
  }
  return done();
}

// Nearest-rank percentile of `values` (sorted here).
int64_t Percentile(std::vector<int64_t> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * values.size()));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

// A clusterprof-operator process watching one namespace.
class OperatorProcess {
 public:
  OperatorProcess(const std::string& binary, const std::string& dir, const std::string& name,
                  const std::string& kubeconfig, const std::string& ns,
                  const std::map<std::string, std::string>& env,
                  const std::vector<std::string>& more_args = {})
      : log_(StrCat(dir, "/operator-", name, ".log")),
        port_file_(StrCat(dir, "/operator-", name, ".ports")) {
    std::vector<std::string> args{binary};
    AddFlags(args, {{"--kubeconfig", kubeconfig},
                    {"--namespace", ns},
                    {"--health-port", "0"},
                    {"--health-address", "127.0.0.1"},
                    {"--port-file", port_file_},
                    {"--log-format", "text"},
                    {"--log-level", "info"}});
    args.insert(args.end(), more_args.begin(), more_args.end());
    process_ = std::make_unique<Subprocess>(args, env, log_);
  }

  // Waits for /readyz and the controllers (the leader gauge turns 1 as they start).
  absl::Status WaitUntilRunning(std::chrono::seconds timeout) {
    if (!testing::WaitForFile(port_file_, timeout)) {
      return absl::DeadlineExceededError(StrCat("the operator wrote no port file; ", LogTail()));
    }
    const std::string ports = testing::ReadFileOrDie(port_file_);
    health_port_ = std::atoi(ports.c_str() + ports.find('=') + 1);
    if (!WaitFor([&] { return StripAsciiWhitespace(HttpGet(health_port_, "/readyz")) == "ok"; },
                 timeout)) {
      return absl::DeadlineExceededError(StrCat("the operator is not ready; ", LogTail()));
    }
    if (!WaitFor([&] { return MetricSum(Metrics(), "clusterprof_operator_leader", "") == 1; },
                 timeout)) {
      return absl::DeadlineExceededError(StrCat("the controllers did not start; ", LogTail()));
    }
    return absl::OkStatus();
  }

  std::string Metrics() const { return HttpGet(health_port_, "/metrics"); }
  pid_t pid() const { return process_->pid(); }
  void Terminate() {
    process_->Signal(SIGTERM);
    if (!process_->Wait(std::chrono::seconds(30)).has_value()) {
      process_->Signal(SIGKILL);
      process_->Wait();
    }
  }
  // Warnings and errors in its log.
  std::vector<std::string> Complaints() const {
    std::vector<std::string> lines;
    std::ifstream in(log_);
    std::string line;
    while (std::getline(in, line)) {
      if (line.find(" warning ") != std::string::npos ||
          line.find(" error ") != std::string::npos) {
        lines.push_back(line);
      }
    }
    return lines;
  }
  std::string LogTail(size_t lines = 20) const {
    std::ifstream in(log_);
    std::vector<std::string> all;
    std::string line;
    while (std::getline(in, line)) all.push_back(line);
    std::string out = StrCat("the operator's log (", log_, ") ends:\n");
    for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
      StrAppend(&out, "  ", all[i], "\n");
    }
    return out;
  }

 private:
  std::string log_;
  std::string port_file_;
  int health_port_ = 0;
  std::unique_ptr<Subprocess> process_;
};

// One fake_sidecars process and the ports it serves.
struct SidecarProcess {
  std::unique_ptr<Subprocess> process;
  std::string record;
  std::vector<int> ports;
};

struct ProfileRecord {
  int port = 0;
  std::string host;
  int64_t arrival_ns = 0;
  int64_t requested_ns = 0;
  int64_t achieved_ns = 0;
};

struct InfoRecord {
  int port = 0;
  // Arrival of each GetInfo call, in order.
  std::vector<int64_t> arrivals_ns;
};

// Each port's node clock offset (fake_sidecars --node-offset-ms).
using NodeOffsets = std::map<int, int64_t>;

void ReadRecord(const std::string& path, std::vector<ProfileRecord>& profiles,
                std::vector<InfoRecord>& infos, NodeOffsets& offsets, int64_t& cpu_ms) {
  std::ifstream in(path);
  std::string kind;
  while (in >> kind) {
    if (kind == "profile") {
      ProfileRecord r;
      in >> r.port >> r.host >> r.arrival_ns >> r.requested_ns >> r.achieved_ns;
      profiles.push_back(r);
    } else if (kind == "info") {
      InfoRecord r;
      size_t calls = 0;
      in >> r.port >> calls;
      r.arrivals_ns.resize(calls);
      for (int64_t& ns : r.arrivals_ns) in >> ns;
      infos.push_back(r);
    } else if (kind == "node") {
      int port = 0;
      int node = 0;
      int64_t offset = 0;
      in >> port >> node >> offset;
      offsets[port] = offset;
    } else if (kind == "cpu") {
      int64_t ms = 0;
      in >> ms;
      cpu_ms += ms;
    } else {
      std::string rest;
      std::getline(in, rest);
    }
  }
}

struct FanoutFigures {
  int targets = 0;
  int pods_seconds = 0;
  std::string phase;
  std::string targets_succeeded;
  int64_t profiles = 0;
  int64_t late_arrivals = 0;  // after their requested start
  int64_t info_calls = 0;
  // From the ProfileJob's creation (wall clock, ns). Probe rounds: the first and last arrival of
  // each target's k-th GetInfo call.
  std::vector<std::pair<int64_t, int64_t>> probe_rounds;
  int64_t first_profile_ns = 0;
  int64_t last_profile_ns = 0;
  int64_t t0_ns = 0;
  int64_t scheduled_seen_ns = -1;
  int64_t capturing_seen_ns = -1;
  int64_t finished_seen_ns = 0;
  // |achieved - requested| on the sidecars.
  std::vector<int64_t> sidecar_errors;
  // Achieved start minus the earliest achieved start.
  std::vector<int64_t> spread;
  // |status.targets[].startErrorNs|.
  std::vector<int64_t> status_errors;
  // |achieved start - T0| on the real clock (the sidecars' records and their node offsets).
  std::vector<int64_t> true_errors;
  // The coordinator's clock uncertainty per target (coordinator part).
  std::vector<int64_t> uncertainties;
  int64_t check_calls = 0;
  // status.summary.startErrorP99Ns (operator part); -1: from status_errors.
  int64_t judged_p99_ns = -1;
  int64_t status_max_skew_ns = 0;
  int offsets_applied = 0;
  // Targets given their node's offset, and those found after the capture to keep a clock of
  // their own (coordinator part).
  int offsets_from_node = 0;
  int own_clock_found = 0;
  int64_t operator_hwm_kib = 0;
  // The coordinator's process (coordinator part): its threads and open files at most, sampled
  // every 100 ms.
  int64_t max_threads = 0;
  int64_t max_files = 0;
  // The coordinator's own CPU time (user + system) until T0, and for the whole capture
  // (coordinator part), or the operator's from the job's creation to its first status poll at or
  // after T0 and to the end (operator part): what of the machine's two vCPUs it took, the rest
  // being the simulated sidecars' (and the control plane's). -1: not measured.
  int64_t cpu_to_t0_ms = -1;
  int64_t cpu_ms = -1;
  // The simulated sidecars' CPU time (user + system, every process) from their start to the end.
  int64_t sidecars_cpu_ms = 0;
  bool tls = false;
  std::string label;
  // The job's JSON when it finished, and the operator's API requests (count, mean seconds).
  size_t job_bytes = 0;
  std::map<std::string, std::pair<double, double>> api_requests;
  std::vector<std::string> complaints;
};

// Starts the simulated sidecars: options.targets ports over options.sidecar_processes
// processes, pods numbered across them (port i of all is pod i, on node i / pods_per_node).
absl::StatusOr<std::vector<SidecarProcess>> StartSidecars(const Options& options,
                                                          const std::string& dir,
                                                          const std::string& tag) {
  std::vector<SidecarProcess> sidecars;
  const int processes = std::min(options.sidecar_processes, options.targets);
  int first = 0;
  for (int p = 0; p < processes; ++p) {
    const int count = options.targets / processes + (p < options.targets % processes ? 1 : 0);
    SidecarProcess sidecar;
    const std::string port_file = StrCat(dir, "/sidecars-", tag, "-", p, ".ports");
    sidecar.record = StrCat(dir, "/sidecars-", tag, "-", p, ".record");
    std::vector<std::string> args{options.fake_sidecars_path};
    AddFlags(args, {{"--count", std::to_string(count)},
                    {"--port-file", port_file},
                    {"--record", sidecar.record},
                    {"--first-index", std::to_string(first)},
                    {"--pods-per-node", std::to_string(options.pods_per_node)},
                    {"--node-offset-ms", std::to_string(options.node_offset_ms)}});
    if (options.tls) {
      AddFlags(args, {{"--tls-cert-file", options.tls_cert_file},
                      {"--tls-key-file", options.tls_key_file}});
    }
    const std::string log = StrCat(dir, "/sidecars-", tag, "-", p, ".log");
    sidecar.process = std::make_unique<Subprocess>(args, std::map<std::string, std::string>{}, log);
    if (!testing::WaitForFile(port_file, std::chrono::seconds(60))) {
      return absl::InternalError(
          StrCat("fake_sidecars ", p, " did not start; its log: ", testing::ReadFileOrDie(log)));
    }
    std::istringstream in(testing::ReadFileOrDie(port_file));
    for (int port; in >> port;) sidecar.ports.push_back(port);
    first += count;
    sidecars.push_back(std::move(sidecar));
  }
  std::set<int> ports;
  for (const SidecarProcess& sidecar : sidecars)
    ports.insert(sidecar.ports.begin(), sidecar.ports.end());
  if (static_cast<int>(ports.size()) != options.targets) {
    return absl::InternalError(
        StrCat("the sidecars serve ", ports.size(), " distinct ports, not ", options.targets));
  }
  return sidecars;
}

// Stops the sidecars and adds what they saw to `figures` (times from `created_ns`).
void ReadSidecars(std::vector<SidecarProcess>& sidecars, int64_t created_ns,
                  FanoutFigures& figures) {
  std::vector<ProfileRecord> profiles;
  std::vector<InfoRecord> infos;
  NodeOffsets offsets;
  for (SidecarProcess& sidecar : sidecars) {
    sidecar.process->Signal(SIGTERM);
    sidecar.process->Wait(std::chrono::seconds(30));
    ReadRecord(sidecar.record, profiles, infos, offsets, figures.sidecars_cpu_ms);
  }
  figures.profiles = static_cast<int64_t>(profiles.size());
  figures.first_profile_ns = INT64_MAX;
  figures.last_profile_ns = INT64_MIN;
  // Requested and achieved starts are on the pod's node clock; arrivals on the real one.
  for (const ProfileRecord& r : profiles) {
    const int64_t offset = offsets[r.port];
    figures.first_profile_ns = std::min(figures.first_profile_ns, r.arrival_ns - created_ns);
    figures.last_profile_ns = std::max(figures.last_profile_ns, r.arrival_ns - created_ns);
    if (r.arrival_ns + offset > r.requested_ns) ++figures.late_arrivals;
    if (r.achieved_ns > 0) {
      figures.sidecar_errors.push_back(std::llabs(r.achieved_ns - r.requested_ns));
    }
  }
  int64_t earliest = INT64_MAX;
  for (const ProfileRecord& r : profiles) {
    if (r.achieved_ns > 0) earliest = std::min(earliest, r.achieved_ns - offsets[r.port]);
  }
  for (const ProfileRecord& r : profiles) {
    if (r.achieved_ns > 0) figures.spread.push_back(r.achieved_ns - offsets[r.port] - earliest);
  }
  // The start as it happened on the real clock, against T0 (figures.t0_ns, set by the caller).
  for (const ProfileRecord& r : profiles) {
    if (r.achieved_ns > 0) {
      figures.true_errors.push_back(
          std::llabs(r.achieved_ns - offsets[r.port] - (created_ns + figures.t0_ns)));
    }
  }
  // GetInfo calls before the first Profile request are clock probes; later ones check a clock
  // that was given a node's offset.
  for (const InfoRecord& r : infos) {
    figures.info_calls += static_cast<int64_t>(r.arrivals_ns.size());
    for (size_t k = 0; k < r.arrivals_ns.size(); ++k) {
      const int64_t at = r.arrivals_ns[k] - created_ns;
      if (at >= figures.first_profile_ns) {
        ++figures.check_calls;
        continue;
      }
      if (figures.probe_rounds.size() <= k) figures.probe_rounds.push_back({INT64_MAX, INT64_MIN});
      figures.probe_rounds[k].first = std::min(figures.probe_rounds[k].first, at);
      figures.probe_rounds[k].second = std::max(figures.probe_rounds[k].second, at);
    }
  }
}

absl::StatusOr<FanoutFigures> RunFanout(const Options& options,
                                        const testing::KubeControlPlane& plane,
                                        kube::RestClient& client, const std::string& kubeconfig,
                                        const std::string& dir, const std::string& ns) {
  FanoutFigures figures;
  figures.targets = options.targets;
  figures.tls = options.tls;
  RealClock clock;
  if (absl::Status s = CreateNamespace(client, ns); !s.ok()) return s;

  absl::StatusOr<std::vector<SidecarProcess>> started = StartSidecars(options, dir, "fanout");
  if (!started.ok()) return started.status();
  std::vector<SidecarProcess> sidecars = *std::move(started);
  std::vector<int> ports;
  for (const SidecarProcess& sidecar : sidecars) {
    ports.insert(ports.end(), sidecar.ports.begin(), sidecar.ports.end());
  }

  // Their pods.
  std::fprintf(stderr, "creating %d pods for the fan-out...\n", options.targets);
  const auto pods_start = std::chrono::steady_clock::now();
  absl::Status created = ParallelFor(options.targets, options.writers, [&](int i) {
    value pod = value::object();
    pod["metadata"]["name"] = value::string(StrCat("bench-", i));
    pod["metadata"]["labels"]["app"] = value::string("bench");
    pod["metadata"]["annotations"]["clusterprof.io/port"] = value::string(std::to_string(ports[i]));
    pod["spec"]["nodeName"] = value::string(StrCat("node-", i / options.pods_per_node));
    pod["spec"]["containers"][0]["name"] = value::string("trainer");
    pod["spec"]["containers"][0]["image"] = value::string("trainer:latest");
    value status = value::object();
    status["phase"] = value::string("Running");
    status["podIP"] = value::string("127.0.0.1");
    status["hostIP"] = value::string("127.0.0.1");
    status["conditions"][0]["type"] = value::string("Ready");
    status["conditions"][0]["status"] = value::string("True");
    return CreateRunningPod(client, ns, pod, status);
  });
  if (!created.ok()) return created;
  figures.pods_seconds = static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(
                                              std::chrono::steady_clock::now() - pods_start)
                                              .count());

  std::vector<std::string> operator_args;
  if (options.tls) operator_args = {"--sidecar-tls-ca-file", options.tls_ca_file};
  OperatorProcess op(options.operator_path, dir, "fanout", kubeconfig, ns, options.operator_env,
                     operator_args);
  if (absl::Status running = op.WaitUntilRunning(std::chrono::seconds(120)); !running.ok()) {
    return running;
  }
  // Past the controllers' start, so that the job meets a running controller (and, with
  // --settle-ms, one that has connected to the pods, as pods that ran a while before their
  // capture find it).
  std::this_thread::sleep_for(std::chrono::milliseconds(options.settle_ms));

  value job = value::object();
  job["metadata"]["name"] = value::string("fanout");
  job["spec"]["targets"]["selector"]["matchLabels"]["app"] = value::string("bench");
  job["spec"]["durationMs"] = value::number(options.duration_ms);
  job["spec"]["delayMs"] = value::number(options.delay_ms);
  job["spec"]["tracingAttempts"] = value::number(1);
  job["spec"]["runName"] = value::string("fanout");
  job["spec"]["logdir"] = value::string(StrCat(dir, "/logs"));
  std::fprintf(stderr, "creating the ProfileJob over %d targets...\n", options.targets);
  // The operator's CPU time at each poll of the job: (ns from creation, ms of CPU).
  std::vector<std::pair<int64_t, int64_t>> cpu_samples;
  const int64_t cpu_at_create_ms = ProcCpuMs(op.pid());
  const int64_t created_ns = clock.WallNs();
  if (absl::Status s = client.Create(api::ProfileJobs(), ns, job).status(); !s.ok()) {
    return s;
  }

  // Follow its phases (every 20 ms) to the end.
  ProfileJobStatus status;
  const bool finished = WaitFor(
      [&] {
        absl::StatusOr<value> got = client.Get(api::ProfileJobs(), ns, "fanout");
        const int64_t now = clock.WallNs() - created_ns;
        cpu_samples.emplace_back(now, ProcCpuMs(op.pid()));
        if (!got.ok() || !got->has_field("status")) return false;
        figures.job_bytes = got->serialize().size();
        absl::StatusOr<ProfileJobStatus> parsed = api::ParseProfileJobStatus(got->at("status"));
        if (!parsed.ok()) return false;
        status = *std::move(parsed);
        if (status.phase == api::JobPhase::kScheduled && figures.scheduled_seen_ns < 0) {
          figures.scheduled_seen_ns = now;
        }
        if (status.phase == api::JobPhase::kCapturing && figures.capturing_seen_ns < 0) {
          figures.capturing_seen_ns = now;
        }
        if (api::IsTerminal(status.phase)) {
          figures.finished_seen_ns = now;
          return true;
        }
        return false;
      },
      std::chrono::seconds(180), std::chrono::milliseconds(20));
  figures.operator_hwm_kib = ProcStatusKib(op.pid(), "VmHWM");
  figures.complaints = op.Complaints();
  const std::string metrics = op.Metrics();
  for (const char* method : {"GET", "PUT", "POST", "PATCH"}) {
    const std::string labels = StrCat("method=\"", method, "\"");
    const double count =
        MetricSum(metrics, "clusterprof_operator_api_request_duration_seconds_count", labels);
    const double sum =
        MetricSum(metrics, "clusterprof_operator_api_request_duration_seconds_sum", labels);
    if (count > 0) figures.api_requests[method] = {count, sum / count};
  }
  figures.phase = std::string(api::JobPhaseName(status.phase));
  if (!finished) {
    return absl::DeadlineExceededError(StrCat("the ProfileJob did not finish in 180 s (phase ",
                                              figures.phase, "); ", op.LogTail()));
  }
  op.Terminate();
  // Status lists every target of a small job, and only those that need attention beyond
  // api::kMaxListedTargets; the summary counts them all.
  int succeeded = 0;
  for (const api::TargetStatus& target : status.targets) {
    if (target.phase == "Succeeded") ++succeeded;
    figures.status_errors.push_back(std::llabs(target.start_error_ns));
    if (std::llabs(target.clock_offset_ns) > target.clock_uncertainty_ns) ++figures.offsets_applied;
  }
  if (status.summary.has_value()) {
    succeeded = status.summary->succeeded;
    figures.status_max_skew_ns = status.summary->max_start_skew_ns;
    figures.judged_p99_ns = status.summary->start_error_p99_ns;
  }
  figures.targets_succeeded = StrCat(succeeded, "/", options.targets);
  figures.t0_ns = status.start_time_ns - created_ns;
  // The operator's CPU from the job's creation to the first poll at or after T0, and to the end.
  if (cpu_at_create_ms >= 0 && !cpu_samples.empty()) {
    figures.cpu_ms = cpu_samples.back().second - cpu_at_create_ms;
    for (const auto& [at_ns, cpu_ms] : cpu_samples) {
      if (at_ns >= figures.t0_ns) {
        figures.cpu_to_t0_ms = cpu_ms - cpu_at_create_ms;
        break;
      }
    }
  }

  // What the sidecars saw.
  ReadSidecars(sidecars, created_ns, figures);
  if (status.phase != api::JobPhase::kSucceeded || succeeded != options.targets) {
    return absl::InternalError(StrCat("the ProfileJob ended ", figures.phase, " with ",
                                      figures.targets_succeeded,
                                      " targets succeeded: ", status.message));
  }
  if (figures.profiles != options.targets) {
    return absl::InternalError(StrCat("the sidecars received ", figures.profiles,
                                      " Profile requests for ", options.targets, " targets"));
  }
  return figures;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "operator_scale: %s\n", status.ToString().c_str());
  return 1;
}

// The coordinator part's child process: one capture as `clusterprof capture` makes it (the
// process settings of every clusterprof binary, the gRPC connector, a manifest), over the
// targets in `targets_file` ("address host node" lines), from the instant before Capture.
// Writes to `result_file`:
//   created <ns>  t0 <ns>  threads <max>  files <max>  hwm_kib <VmHWM>
//   target <start_error_ns> <start_known> <offset_applied> <probed_via_node> <own_clock_warning>
int CoordinatorChild(const std::string& targets_file, const std::string& result_file,
                     const std::string& logdir, bool per_node, bool release, int64_t duration_ms,
                     int64_t delay_ms, const std::string& tls_ca_file) {
  // As the operator's main() does (the CLI leaves glibc's arenas alone).
  ApplyProcessSettings({.malloc_arenas = 2});
  spdlog::set_level(spdlog::level::info);
  coordinator::CaptureOptions options;
  std::istringstream in(testing::ReadFileOrDie(targets_file));
  for (coordinator::Target target; in >> target.address >> target.host_name >> target.node;) {
    options.targets.push_back(target);
  }
  absl::StatusOr<storage::Logdir> parsed = storage::ParseLogdir(logdir);
  if (!parsed.ok()) return Fail(parsed.status());
  options.layout = *storage::RunLayout::Create(
      *parsed, StrCat(per_node ? "per_node" : "per_target", release ? "_released" : "_held"));
  options.outlive_client = release;
  options.duration_ms = duration_ms;
  options.delay_ms = delay_ms;
  options.num_tracing_attempts = 1;
  options.clock_probe_per_node = per_node;
  if (!tls_ca_file.empty()) {
    absl::StatusOr<std::shared_ptr<const tls::ChannelSecurity>> security =
        tls::ChannelSecurity::Tls(tls_ca_file);
    if (!security.ok()) return Fail(security.status());
    options.security = *std::move(security);
  }
  int64_t max_threads = 0;
  int64_t max_files = 0;
  const auto sample = [&] {
    max_threads = std::max(max_threads, ProcStatusKib(getpid(), "Threads"));
    int64_t files = 0;
    std::error_code error;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
         !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
      ++files;
    }
    max_files = std::max(max_files, files);
  };
  RealClock clock;
  const int64_t created_ns = clock.WallNs();
  int64_t last_sample_ns = 0;
  const auto cpu_ms = [] {
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000 +
           (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1000;
  };
  int64_t cpu_to_t0_ms = -1;
  absl::StatusOr<coordinator::RunResult> result =
      coordinator::Capture(options, clock, [&](const coordinator::RunResult& state, int64_t now) {
        if (cpu_to_t0_ms < 0 && state.t0_ns > 0 && now >= state.t0_ns) cpu_to_t0_ms = cpu_ms();
        if (now - last_sample_ns < 100 * kNanosPerMilli) return;
        last_sample_ns = now;
        sample();
        // A time line of the resident set, in the child's log.
        std::fprintf(stderr, "%8.1f ms  t0 %8.1f ms  VmRSS %6.1f MiB  threads %lld\n",
                     Ms(now - created_ns), state.t0_ns > 0 ? Ms(state.t0_ns - created_ns) : 0.0,
                     ProcStatusKib(getpid(), "VmRSS") / 1024.0,
                     static_cast<long long>(ProcStatusKib(getpid(), "Threads")));
      });
  if (!result.ok()) return Fail(result.status());
  std::string out =
      StrCat("created ", created_ns, "\nt0 ", result->t0_ns, "\nthreads ", max_threads, "\nfiles ",
             max_files, "\nhwm_kib ", ProcStatusKib(getpid(), "VmHWM"), "\ncpu_to_t0_ms ",
             cpu_to_t0_ms, "\ncpu_ms ", cpu_ms(), "\n");
  for (const coordinator::TargetResult& target : result->targets) {
    bool own_clock = false;
    for (const std::string& warning : target.warnings) {
      own_clock = own_clock || warning.find("its clock disagrees") != std::string::npos;
    }
    StrAppend(&out, "target ", target.outcome == coordinator::Outcome::kOk ? 1 : 0, " ",
              target.start_error_ns, " ", target.clock_uncertainty_ns, " ",
              target.start_known ? 1 : 0, " ", target.clock_offset_applied ? 1 : 0, " ",
              target.clock_probed_via.empty() ? 0 : 1, " ", own_clock ? 1 : 0, "\n");
  }
  std::ofstream(result_file) << out;
  return 0;
}

// The coordinator part: for each probing mode, fresh simulated sidecars and one capture by a
// child process (CoordinatorChild) over all of them.
absl::StatusOr<std::vector<FanoutFigures>> RunCoordinator(const Options& options,
                                                          const std::string& self,
                                                          const std::string& dir) {
  std::vector<std::pair<bool, bool>> modes;  // per node, released
  for (bool per_node : {false, true}) {
    if ((per_node && options.per_node == "off") || (!per_node && options.per_node == "on")) {
      continue;
    }
    for (bool release : {false, true}) {
      if ((release && options.release == "off") || (!release && options.release == "on")) {
        continue;
      }
      modes.emplace_back(per_node, release);
    }
  }
  std::vector<FanoutFigures> all;
  for (const auto& [per_node, release] : modes) {
    const std::string tag =
        StrCat(per_node ? "per-node" : "per-target", release ? "-released" : "-held");
    absl::StatusOr<std::vector<SidecarProcess>> started = StartSidecars(options, dir, tag);
    if (!started.ok()) return started.status();
    std::vector<SidecarProcess> sidecars = *std::move(started);
    std::string lines;
    int index = 0;
    for (const SidecarProcess& sidecar : sidecars) {
      for (int port : sidecar.ports) {
        StrAppend(&lines, "127.0.0.1:", port, " pod-", index, " node-",
                  index / options.pods_per_node, "\n");
        ++index;
      }
    }
    const std::string targets_file = StrCat(dir, "/targets-", tag, ".txt");
    const std::string result_file = StrCat(dir, "/result-", tag, ".txt");
    std::ofstream(targets_file) << lines;
    std::fprintf(stderr, "capturing %d targets, clock probes %s...\n", options.targets,
                 tag.c_str());
    std::vector<std::string> args{self};
    AddFlags(args, {{"--coordinator-child", targets_file},
                    {"--child-result", result_file},
                    {"--child-logdir", StrCat(dir, "/logs-", tag)},
                    {"--child-per-node", per_node ? "1" : "0"},
                    {"--child-release", release ? "1" : "0"},
                    {"--duration-ms", std::to_string(options.duration_ms)},
                    {"--delay-ms", std::to_string(options.delay_ms)}});
    if (options.tls) AddFlags(args, {{"--child-tls-ca-file", options.tls_ca_file}});
    Subprocess child(args, {}, StrCat(dir, "/coordinator-", tag, ".log"));
    const std::optional<int> code = child.Wait(std::chrono::seconds(300));
    if (!code.has_value() || *code != 0) {
      return absl::InternalError(
          StrCat("the coordinator child (", tag, ") failed; its log: ",
                 testing::ReadFileOrDie(StrCat(dir, "/coordinator-", tag, ".log"))));
    }
    FanoutFigures figures;
    figures.targets = options.targets;
    figures.tls = options.tls;
    figures.label =
        StrCat("coordinator, clock probes ", per_node ? "per node" : "per target",
               release ? ", calls released" : ", calls held", options.tls ? ", TLS" : "");
    std::istringstream in(testing::ReadFileOrDie(result_file));
    int64_t created_ns = 0;
    int succeeded = 0;
    for (std::string kind; in >> kind;) {
      if (kind == "created") {
        in >> created_ns;
      } else if (kind == "t0") {
        in >> figures.t0_ns;
      } else if (kind == "threads") {
        in >> figures.max_threads;
      } else if (kind == "files") {
        in >> figures.max_files;
      } else if (kind == "hwm_kib") {
        in >> figures.operator_hwm_kib;
      } else if (kind == "cpu_to_t0_ms") {
        in >> figures.cpu_to_t0_ms;
      } else if (kind == "cpu_ms") {
        in >> figures.cpu_ms;
      } else if (kind == "target") {
        int ok = 0, known = 0, applied = 0, via = 0, own = 0;
        int64_t error = 0;
        int64_t uncertainty = 0;
        in >> ok >> error >> uncertainty >> known >> applied >> via >> own;
        figures.uncertainties.push_back(uncertainty);
        succeeded += ok;
        if (known != 0) figures.status_errors.push_back(std::llabs(error));
        figures.status_max_skew_ns =
            std::max<int64_t>(figures.status_max_skew_ns, std::llabs(error));
        figures.offsets_applied += applied;
        figures.offsets_from_node += via;
        figures.own_clock_found += own;
      }
    }
    figures.t0_ns -= created_ns;
    figures.phase = succeeded == options.targets ? "Succeeded" : "PartiallySucceeded";
    figures.targets_succeeded = StrCat(succeeded, "/", options.targets);
    ReadSidecars(sidecars, created_ns, figures);
    if (figures.profiles != options.targets) {
      return absl::InternalError(StrCat("the sidecars received ", figures.profiles,
                                        " Profile requests for ", options.targets, " targets"));
    }
    if (options.require_all && succeeded != options.targets) {
      return absl::InternalError(StrCat(figures.label, ": ", succeeded, " of ", options.targets,
                                        " targets captured; the coordinator's log: ", dir,
                                        "/coordinator-", tag, ".log"));
    }
    all.push_back(std::move(figures));
  }
  return all;
}

struct MemoryFigures {
  int pods = 0;
  int jobs = 0;
  int failed_jobs = 0;
  int pods_seconds = 0;
  double ready_seconds = 0;
  double settled_seconds = 0;
  int64_t rss_kib = 0;
  int64_t hwm_kib = 0;
  int64_t anon_kib = 0;
  int64_t threads = 0;
  std::map<std::string, double> phases;
};

// A finished ProfileJob's status, as the operator writes it, over `targets` of the pods.
value FinishedJobStatus(int job, int targets, const std::string& logdir) {
  ProfileJobStatus status;
  status.phase = api::JobPhase::kSucceeded;
  status.run_name = StrCat("llama_7b_profile_", job);
  status.run_uri = StrCat(logdir, "/plugins/profile/", status.run_name);
  status.manifest_uri = StrCat(status.run_uri, "/clusterprof_run.json");
  status.start_time_ns = 1'795'327'200LL * kNanosPerSecond + job * 60LL * kNanosPerSecond;
  status.start_time = api::FormatTime(status.start_time_ns);
  status.completion_time = api::FormatTime(status.start_time_ns + 5 * kNanosPerSecond);
  status.attempt = 1;
  status.observed_generation = 1;
  status.message = StrCat("all ", targets, " target(s) captured; max start skew 412us");
  status.conditions.push_back({"TargetsResolved", "True", "Resolved",
                               StrCat(targets, " target(s): llama-trainer-worker-0, ..."), 1,
                               status.start_time});
  status.conditions.push_back(
      {"Complete", "True", "Succeeded", status.message, 1, status.completion_time});
  for (int i = 0; i < targets; ++i) {
    api::TargetStatus target;
    target.name = StrCat("llama-trainer-worker-", i);
    target.address = StrCat("10.64.", i / 250 % 250, ".", i % 250, ":8466");
    target.node = StrCat("gke-llama-h100-pool-7f3a-", i / 8);
    target.phase = "Succeeded";
    target.attempts = 1;
    target.events = 1'200'000 + i;
    target.bytes = 48'000'000 + i;
    target.file = StrCat(status.run_uri, "/", target.name, ".xplane.pb");
    target.clock_offset_ns = 1200 + i;
    target.clock_uncertainty_ns = 85'000;
    target.start_error_ns = 40'000 + i * 97;
    status.targets.push_back(std::move(target));
  }
  api::JobSummary summary;
  summary.targets = targets;
  summary.succeeded = targets;
  summary.max_start_skew_ns = 412'000;
  status.summary = summary;
  return api::ProfileJobStatusToJson(status);
}

absl::StatusOr<MemoryFigures> RunMemory(const Options& options, kube::RestClient& client,
                                        const std::string& kubeconfig, const std::string& dir) {
  MemoryFigures figures;
  figures.pods = options.pods;
  figures.jobs = options.jobs;
  const std::string ns = "training";
  if (absl::Status s = CreateNamespace(client, ns); !s.ok()) return s;

  std::fprintf(stderr, "creating %d realistic pods...\n", options.pods);
  const auto pods_start = std::chrono::steady_clock::now();
  std::atomic<int> done{0};
  absl::Status created = ParallelFor(options.pods, options.writers, [&](int i) {
    value status = value::parse(StrCat("{", RealisticPodStatusJson(i), "}")).at("status");
    absl::Status s = CreateRunningPod(client, ns, value::parse(RealisticPodJson(ns, i)), status);
    if (const int n = ++done; n % 1000 == 0) std::fprintf(stderr, "  %d\n", n);
    return s;
  });
  if (!created.ok()) return created;
  figures.pods_seconds = static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(
                                              std::chrono::steady_clock::now() - pods_start)
                                              .count());

  // The jobs: a tenth select nothing (the operator fails them at once: they do not wait for
  // pods, waitSeconds 0), the rest finished earlier.
  const std::string logdir = StrCat(dir, "/logs");
  absl::Status jobs_created = ParallelFor(options.jobs, options.writers, [&](int j) {
    const bool unmatched = j % 10 == 9;
    value job = value::object();
    job["metadata"]["name"] = value::string(StrCat("llama-7b-profile-", j));
    job["spec"]["targets"]["selector"]["matchLabels"]["app"] =
        value::string(unmatched ? StrCat("nobody-", j) : "llama-trainer");
    job["spec"]["targets"]["selector"]["matchLabels"]["jobset.sigs.k8s.io/jobset-name"] =
        value::string("llama-7b");
    if (unmatched) job["spec"]["targets"]["waitSeconds"] = value::number(0);
    job["spec"]["durationMs"] = value::number(2000);
    job["spec"]["delayMs"] = value::number(1000);
    job["spec"]["logdir"] = value::string(logdir);
    absl::StatusOr<value> made = client.Create(api::ProfileJobs(), ns, job);
    if (!made.ok() || unmatched) return made.status();
    (*made)["status"] = FinishedJobStatus(j, options.job_targets, logdir);
    return client.UpdateStatus(api::ProfileJobs(), ns, *made).status();
  });
  if (!jobs_created.ok()) return jobs_created;
  for (int j = 0; j < options.jobs; ++j) figures.failed_jobs += j % 10 == 9 ? 1 : 0;

  std::fprintf(stderr, "starting the operator over %d pods and %d jobs...\n", options.pods,
               options.jobs);
  const auto start = std::chrono::steady_clock::now();
  OperatorProcess op(options.operator_path, dir, "memory", kubeconfig, ns, options.operator_env);
  if (absl::Status running = op.WaitUntilRunning(std::chrono::seconds(300)); !running.ok()) {
    return running;
  }
  figures.ready_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string gauge = "clusterprof_operator_profilejobs";
  const bool settled = WaitFor(
      [&] {
        const std::string metrics = op.Metrics();
        return MetricSum(metrics, gauge, "") == options.jobs &&
               MetricSum(metrics, gauge, "phase=\"Pending\"") == 0 &&
               MetricSum(metrics, gauge, "phase=\"Failed\"") == figures.failed_jobs;
      },
      std::chrono::seconds(120), std::chrono::milliseconds(100));
  figures.settled_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string metrics = op.Metrics();
  for (const char* phase :
       {"Pending", "Scheduled", "Capturing", "Succeeded", "PartiallySucceeded", "Failed"}) {
    figures.phases[phase] = MetricSum(metrics, gauge, StrCat("phase=\"", phase, "\""));
  }
  if (!settled) {
    return absl::DeadlineExceededError(
        StrCat("the operator's metrics did not count ", options.jobs, " jobs (",
               figures.failed_jobs, " Failed, none Pending) within 120 s; ", op.LogTail()));
  }
  // Let the start-up's transient allocations go before reading the resident set.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  figures.rss_kib = ProcStatusKib(op.pid(), "VmRSS");
  figures.hwm_kib = ProcStatusKib(op.pid(), "VmHWM");
  figures.anon_kib = ProcStatusKib(op.pid(), "RssAnon");
  figures.threads = ProcStatusKib(op.pid(), "Threads");
  op.Terminate();
  return figures;
}

void PrintFanout(const FanoutFigures& f, const Options& options) {
  const auto p = [](const std::vector<int64_t>& v, double q) { return Ms(Percentile(v, q)); };
  std::printf(
      "\nFan-out (%s): %d simulated sidecars (%s) in %d processes, %d pods a node, durationMs "
      "%lld, delayMs %lld\n",
      f.label.c_str(), f.targets, f.tls ? "TLS" : "plaintext",
      std::min(options.sidecar_processes, f.targets), options.pods_per_node,
      static_cast<long long>(options.duration_ms), static_cast<long long>(options.delay_ms));
  std::printf("  (times in ms from the ProfileJob's creation, wall clock)\n");
  std::printf("  %-58s %s, %s targets\n", "job phase", f.phase.c_str(),
              f.targets_succeeded.c_str());
  for (size_t k = 0; k < f.probe_rounds.size(); ++k) {
    std::printf("  %-58s %9.1f .. %.1f\n",
                StrCat("clock probe round ", k + 1, ": GetInfo arrivals").c_str(),
                Ms(f.probe_rounds[k].first), Ms(f.probe_rounds[k].second));
  }
  std::printf("  %-58s %9lld\n", "GetInfo calls", static_cast<long long>(f.info_calls));
  std::printf("  %-58s %9.1f\n", "first Profile request at a sidecar", Ms(f.first_profile_ns));
  std::printf("  %-58s %9.1f  (target <= 1000)\n", "last Profile request: all RPCs dispatched",
              Ms(f.last_profile_ns));
  std::printf("  %-58s %9.1f\n", "T0 (status.startTimeNs)", Ms(f.t0_ns));
  std::printf("  %-58s %9.1f\n", "T0 margin: T0 - last Profile arrival",
              Ms(f.t0_ns - f.last_profile_ns));
  std::printf("  %-58s %9lld\n", "Profile requests that arrived after their start",
              static_cast<long long>(f.late_arrivals));
  std::printf("  %-58s %9.1f\n", "phase Scheduled first seen (20 ms polls)",
              Ms(f.scheduled_seen_ns));
  std::printf("  %-58s %9.1f\n", "phase Capturing first seen", Ms(f.capturing_seen_ns));
  std::printf("  %-58s %9.1f  (T0 + duration = %.1f)\n", "phase Succeeded first seen",
              Ms(f.finished_seen_ns), Ms(f.t0_ns + options.duration_ms * kNanosPerMilli));
  std::printf("  %-58s %9.3f / %.3f / %.3f\n",
              "|achieved - requested start| on sidecars, p50/p99/max", p(f.sidecar_errors, 50),
              p(f.sidecar_errors, 99), p(f.sidecar_errors, 100));
  std::printf("  %-58s %9.3f / %.3f / %.3f\n",
              "achieved start - earliest achieved start, p50/p99/max", p(f.spread, 50),
              p(f.spread, 99), p(f.spread, 100));
  std::printf("  %-58s %9.3f / %.3f / %.3f\n", "|status.targets[].startErrorNs|, p50/p99/max",
              p(f.status_errors, 50), p(f.status_errors, 99), p(f.status_errors, 100));
  std::printf("  %-58s %9.3f\n", "status.summary.maxStartSkewNs", Ms(f.status_max_skew_ns));
  std::printf("  %-58s %9.3f / %.3f / %.3f\n",
              "|achieved start - T0| on the real clock, p50/p99/max", p(f.true_errors, 50),
              p(f.true_errors, 99), p(f.true_errors, 100));
  if (!f.uncertainties.empty()) {
    std::printf("  %-58s %9.3f / %.3f / %.3f\n", "clock uncertainty, p50/p99/max",
                p(f.uncertainties, 50), p(f.uncertainties, 99), p(f.uncertainties, 100));
  }
  std::printf("  %-58s %9lld\n", "GetInfo calls after the Profile requests (clock checks)",
              static_cast<long long>(f.check_calls));
  std::printf("  %-58s %9d\n", "targets whose clock offset was applied", f.offsets_applied);
  std::printf("  %-58s %9d\n", "targets given their node's offset", f.offsets_from_node);
  std::printf("  %-58s %9d\n", "of them found to keep a clock of their own", f.own_clock_found);
  std::printf("  %-58s %9lld / %lld\n", "threads / open files at most (coordinator)",
              static_cast<long long>(f.max_threads), static_cast<long long>(f.max_files));
  if (f.cpu_ms >= 0) {
    std::printf("  %-58s %9lld / %lld ms\n",
                "operator or coordinator CPU (user + system) to T0 / in all",
                static_cast<long long>(f.cpu_to_t0_ms), static_cast<long long>(f.cpu_ms));
  }
  std::printf("  %-58s %9lld ms\n", "simulated sidecars' CPU (all processes, start to end)",
              static_cast<long long>(f.sidecars_cpu_ms));
  std::printf("  %-58s %9.1f MiB\n", "VmHWM (peak) of the operator or coordinator",
              f.operator_hwm_kib / 1024.0);
  std::printf("  %-58s %9zu B\n", "the finished ProfileJob's JSON", f.job_bytes);
  for (const auto& [method, figure] : f.api_requests) {
    std::printf("  %-58s %9.1f ms  (%d requests)\n",
                StrCat("operator API ", method, " requests, mean latency").c_str(),
                figure.second * 1e3, static_cast<int>(figure.first));
  }
  std::printf("  %-58s %9d s\n", "(creating the pods took)", f.pods_seconds);
  if (!f.complaints.empty()) {
    std::printf("  operator warnings and errors: %zu, the first:\n", f.complaints.size());
    for (size_t i = 0; i < f.complaints.size() && i < 10; ++i) {
      std::printf("    %s\n", f.complaints[i].c_str());
    }
  }
}

void PrintMemory(const MemoryFigures& f, const Options& options) {
  std::printf("\nMemory: the operator watching %d realistic pods and %d ProfileJobs\n", f.pods,
              f.jobs);
  std::printf("  (%d finished jobs with %d targets in their status, %d failed by the operator)\n",
              f.jobs - f.failed_jobs, options.job_targets, f.failed_jobs);
  std::printf("  %-58s %9.1f MiB  (target <= 150)\n", "VmRSS", f.rss_kib / 1024.0);
  std::printf("  %-58s %9.1f MiB\n", "VmHWM (peak)", f.hwm_kib / 1024.0);
  std::printf("  %-58s %9.1f MiB\n", "RssAnon", f.anon_kib / 1024.0);
  std::printf("  %-58s %9lld\n", "threads", static_cast<long long>(f.threads));
  std::printf("  %-58s %9.2f s\n", "operator start to /readyz and controllers", f.ready_seconds);
  std::printf("  %-58s %9.2f s\n", "operator start to every job counted, none Pending",
              f.settled_seconds);
  std::string phases;
  for (const auto& [phase, n] : f.phases) {
    if (n > 0) StrAppend(&phases, phases.empty() ? "" : ", ", phase, " ", static_cast<int>(n));
  }
  std::printf("  %-58s %s\n", "clusterprof_operator_profilejobs", phases.c_str());
  std::printf("  %-58s %9d s\n", "(creating the pods took)", f.pods_seconds);
}

// One line per size and part: the scaling table.
void PrintTable(const std::vector<FanoutFigures>& rows) {
  if (rows.size() < 2) return;
  std::printf("\n%-40s %7s %9s %9s %7s %5s %9s %9s %9s %8s %7s %6s\n", "part", "targets",
              "probes_end", "dispatched", "margin", "late", "err_p99", "err_max", "judged_p99",
              "peak_MiB", "threads", "files");
  for (const FanoutFigures& f : rows) {
    const int64_t probes_end = f.probe_rounds.empty() ? 0 : f.probe_rounds.back().second;
    std::printf("%-40s %7d %9.1f %9.1f %7.1f %5lld %9.3f %9.3f %9.3f %8.1f %7lld %6lld\n",
                f.label.c_str(), f.targets, Ms(probes_end), Ms(f.last_profile_ns),
                Ms(f.t0_ns - f.last_profile_ns), static_cast<long long>(f.late_arrivals),
                Ms(Percentile(f.true_errors, 99)), Ms(Percentile(f.true_errors, 100)),
                Ms(f.judged_p99_ns >= 0 ? f.judged_p99_ns : Percentile(f.status_errors, 99)),
                f.operator_hwm_kib / 1024.0, static_cast<long long>(f.max_threads),
                static_cast<long long>(f.max_files));
  }
  std::printf(
      "(ms from the start of the capture or the ProfileJob's creation; err: |achieved start - T0| "
      "on the real clock; judged: |startErrorNs| p99 as the coordinator judged it; peak: VmHWM of "
      "the coordinator's or operator's process)\n");
}

// A CA and the sidecars' serving pair (for tls::kDefaultServerName) under dir/tls, named in
// `options`.
void MakeTlsFiles(const std::string& dir, Options& options) {
  const std::string tls_dir = StrCat(dir, "/tls");
  std::filesystem::create_directories(tls_dir);
  testing::TestCa ca;
  const testing::IssuedPair pair = ca.Issue({tls::kDefaultServerName});
  options.tls_ca_file = StrCat(tls_dir, "/ca.crt");
  options.tls_cert_file = StrCat(tls_dir, "/tls.crt");
  options.tls_key_file = StrCat(tls_dir, "/tls.key");
  testing::WriteFileOrDie(options.tls_ca_file, ca.ca_pem());
  testing::WriteFileOrDie(options.tls_cert_file, pair.cert_pem);
  testing::WriteFileOrDie(options.tls_key_file, pair.key_pem);
}

int Run(Options options, const std::string& self, const std::vector<int>& sizes) {
  std::optional<testing::TempDir> temp;
  std::string dir = options.work_dir;
  if (dir.empty()) {
    temp.emplace();
    dir = temp->path();
  }
  std::filesystem::create_directories(dir);
  if (options.tls) MakeTlsFiles(dir, options);
  std::vector<FanoutFigures> rows;
  if (options.coordinator) {
    for (int size : sizes) {
      options.targets = size;
      const std::string size_dir = StrCat(dir, "/coordinator-", size);
      std::filesystem::create_directories(size_dir);
      absl::StatusOr<std::vector<FanoutFigures>> figures = RunCoordinator(options, self, size_dir);
      if (!figures.ok()) return Fail(figures.status());
      for (FanoutFigures& f : *figures) {
        PrintFanout(f, options);
        rows.push_back(std::move(f));
      }
    }
  }
  if (!options.fanout && !options.memory) {
    PrintTable(rows);
    return 0;
  }

  absl::StatusOr<std::unique_ptr<testing::KubeControlPlane>> plane =
      testing::KubeControlPlane::Start();
  if (absl::IsNotFound(plane.status())) {
    std::fprintf(stderr, "operator_scale: skipped: %s\n",
                 std::string(plane.status().message()).c_str());
    return kSkipped;
  }
  if (!plane.ok()) return Fail(plane.status());
  RealClock clock;
  kube::RestConfig config;
  config.server = (*plane)->url();
  config.ca_pem = testing::ReadFileOrDie((*plane)->ca_file());
  config.token = kube::StaticToken((*plane)->admin_token());
  kube::RestClientOptions unlimited;
  unlimited.qps = 0;
  absl::StatusOr<std::unique_ptr<kube::RestClient>> client =
      kube::RestClient::Create(config, &clock, unlimited);
  if (!client.ok()) return Fail(client.status());
  const std::string kubeconfig = (*plane)->dir() + "/admin.kubeconfig";
  if (absl::Status s = testing::InstallCrds(**plane, kSourceDir, kubeconfig); !s.ok()) {
    return Fail(s);
  }

  std::optional<MemoryFigures> memory;
  if (options.fanout) {
    for (int size : sizes) {
      options.targets = size;
      const std::string size_dir = StrCat(dir, "/fanout-", size);
      std::filesystem::create_directories(size_dir);
      absl::StatusOr<FanoutFigures> figures =
          RunFanout(options, **plane, **client, kubeconfig, size_dir, StrCat("fanout-", size));
      if (!figures.ok()) return Fail(figures.status());
      figures->label = options.tls ? "operator, TLS" : "operator";
      PrintFanout(*figures, options);
      rows.push_back(*std::move(figures));
    }
  }
  if (options.memory) {
    absl::StatusOr<MemoryFigures> figures = RunMemory(options, **client, kubeconfig, dir);
    if (!figures.ok()) return Fail(figures.status());
    memory = *std::move(figures);
  }
  if (memory.has_value()) PrintMemory(*memory, options);
  PrintTable(rows);
  return 0;
}

}  // namespace
}  // namespace clusterprof::bench

int main(int argc, char** argv) {
  CLI::App app{
      "clusterprof-operator's fan-out time, start skew and memory against a real API "
      "server; the coordinator's alone"};
  clusterprof::bench::Options options;
  bool quick = false;
  std::string only;
  std::vector<int> sizes;
  app.add_flag("--quick", quick, "a short functional run: 50 targets, 500 pods, 10 jobs");
  app.add_option("--only", only, "run one part: fanout, memory, or coordinator (no Kubernetes)")
      ->check(CLI::IsMember({"fanout", "memory", "coordinator"}));
  app.add_option("--targets", options.targets, "simulated sidecars in the fan-out")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--sizes", sizes,
                 "run the fan-out or coordinator part once per size, e.g. 1000,2500,5000,10000 "
                 "(instead of --targets), and print a table")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--per-node", options.per_node,
                 "coordinator part: clock probes per node on, off, or both (off, then on)")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
  app.add_option("--release", options.release,
                 "coordinator part: release each Profile call once its sidecar took it and read "
                 "the sessions back (as the operator does), on, off, or both (off, then on)")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
  app.add_flag("--tls", options.tls,
               "the simulated sidecars serve TLS (a CA and certificate made here) and the operator "
               "or coordinator verifies them (--sidecar-tls-ca-file)");
  app.add_flag("--require-all", options.require_all,
               "coordinator part: fail unless every target was captured (a functional check)");
  app.add_option("--sidecar-processes", options.sidecar_processes,
                 "fake_sidecars processes that serve them")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--pods-per-node", options.pods_per_node,
                 "simulated pods per node (one clock per node)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--node-offset-ms", options.node_offset_ms,
                 "each node's clock is off by a fixed amount up to this, either way")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--operator", options.operator_path,
                 "the clusterprof-operator binary to run (to compare builds)")
      ->capture_default_str();
  app.add_option("--fake-sidecars", options.fake_sidecars_path,
                 "the fake_sidecars binary to run (to compare builds)")
      ->capture_default_str();
  app.add_option("--duration-ms", options.duration_ms, "the fan-out job's durationMs")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--settle-ms", options.settle_ms,
                 "how long the operator runs before the fan-out job is created (its connections "
                 "to the pods warming meanwhile)")
      ->capture_default_str();
  app.add_option("--delay-ms", options.delay_ms, "the fan-out job's delayMs")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--pods", options.pods, "realistic pods for the memory figure")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--jobs", options.jobs, "ProfileJobs for the memory figure")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--job-targets", options.job_targets, "targets in each finished job's status")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--writers", options.writers, "threads creating pods")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--work-dir", options.work_dir,
                 "keep logs and records here (default: a temporary directory, removed)");
  std::vector<std::string> operator_env;
  app.add_option("--operator-env", operator_env,
                 "KEY=VALUE added to the operator's environment (repeatable)");
  // The coordinator part's child process (internal).
  std::string child_targets;
  std::string child_result;
  std::string child_logdir;
  int child_per_node = 1;
  int child_release = 0;
  std::string child_tls_ca_file;
  app.add_option("--coordinator-child", child_targets)->group("");
  app.add_option("--child-tls-ca-file", child_tls_ca_file)->group("");
  app.add_option("--child-result", child_result)->group("");
  app.add_option("--child-logdir", child_logdir)->group("");
  app.add_option("--child-per-node", child_per_node)->group("");
  app.add_option("--child-release", child_release)->group("");
  CLI11_PARSE(app, argc, argv);
  if (!child_targets.empty()) {
    return clusterprof::bench::CoordinatorChild(
        child_targets, child_result, child_logdir, child_per_node != 0, child_release != 0,
        options.duration_ms, options.delay_ms, child_tls_ca_file);
  }
  for (const std::string& entry : operator_env) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::fprintf(stderr, "operator_scale: --operator-env wants KEY=VALUE, got '%s'\n",
                   entry.c_str());
      return 2;
    }
    options.operator_env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  if (quick) {
    if (app.count("--targets") == 0) options.targets = 50;
    if (app.count("--sidecar-processes") == 0) options.sidecar_processes = 2;
    if (app.count("--pods") == 0) options.pods = 500;
    if (app.count("--jobs") == 0) options.jobs = 10;
    if (app.count("--job-targets") == 0) options.job_targets = 8;
  }
  if (sizes.empty()) sizes.push_back(options.targets);
  options.fanout = only.empty() || only == "fanout";
  options.memory = only.empty() || only == "memory";
  options.coordinator = only == "coordinator";
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) return 1;
  self[length] = '\0';
  return clusterprof::bench::Run(options, self, sizes);
}
