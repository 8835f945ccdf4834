// Many simulated clusterprof sidecars in one process, for the operator's scale benchmark
// (bench/operator_scale.cc): --count ports of 127.0.0.1, each standing for one pod's sidecar and
// served by a gRPC server of its own, whose services know their port. A server per port, because
// one server on every port cannot tell its ports apart: a TLS client sends the name it verifies
// (the same for every sidecar) as the :authority, not the address it dials, and gRPC 1.51 gives a
// handler no local address. The servers share gRPC's threads, the timer and the record.
//
// With --tls-cert-file and --tls-key-file every port serves TLS with that pair, as a sidecar with
// --tls-cert-file does (common/grpc/tls.h), so clients pay the handshake they pay on a cluster.
//
// Ports stand for pods on nodes: port k of the process is pod --first-index + k, on node
// (--first-index + k) / --pods-per-node, and every pod of a node reads one wall clock, the real
// one shifted by the node's offset (a fixed pseudo-random value in +-(--node-offset-ms)).
//
// Each port answers
//   - tensorflow.ProfilerService.Profile like a sidecar that records nothing: it waits for
//     opts.start_timestamp_ns on its node's clock, takes its start time, waits for the duration
//     and replies with empty_trace = false. One timer thread of the process does the waiting for
//     every session (a condition-variable wait, then clock_nanosleep(CLOCK_REALTIME,
//     TIMER_ABSTIME) with 1 ns timer slack, as the sidecar's session does; RealClock), and takes
//     the start time of each session due in turn. A thread per session, as a real sidecar has,
//     made 10,000 threads wake at one instant on two vCPUs here, and measured that instead;
//   - clusterprof.v1alpha1.Sidecar.GetInfo with its clocks and a host name;
//   - Sidecar.GetSession with the session's achieved start, one event and one (unwritten) file.
//
// On SIGTERM or SIGINT it writes --record, a line per Profile call and per port, and exits:
//   profile <port> <host> <arrival_wall_ns> <requested_start_ns> <achieved_start_ns>
//   info <port> <calls> <arrival_wall_ns of each GetInfo call>...
//   node <port> <node> <offset_ns>
// (arrivals on the real clock, requested and achieved starts on the port's node clock; achieved
// 0: the session had not started yet). --port-file gets the bound ports, one a line,
// written whole (renamed into place) once the server serves.
//
// The record ends with the process's own CPU time, user and system:
//   cpu <ms>
//
//   fake_sidecars --count 250 --port-file ports.txt --record record.txt --first-index 250
//       --pods-per-node 8 --node-offset-ms 20 [--tls-cert-file tls.crt --tls-key-file tls.key]
#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "common/base/strings.h"
#include "common/grpc/tls.h"
#include "grpcpp/grpcpp.h"
#include "proto/profile_options.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"

namespace clusterprof::bench {
namespace {

struct Session {
  std::string host;
  std::string repository_root;
  int64_t arrival_ns = 0;
  int64_t requested_start_ns = 0;
  int64_t achieved_start_ns = 0;
  int64_t duration_ms = 0;
};

struct PortState {
  // By session id; a repeated id (a retry) replaces the earlier session.
  std::map<std::string, Session> sessions;
  // Arrival of every GetInfo call, in order.
  std::vector<int64_t> info_ns;
};

// What every port saw. Thread-safe.
class Recorder {
 public:
  // Port -> (node, offset), for the record.
  void SetNodes(std::map<int, std::pair<int, int64_t>> nodes) {
    MutexLock lock(&mu_);
    nodes_ = std::move(nodes);
  }
  void Info(int port, int64_t now_ns) {
    MutexLock lock(&mu_);
    ports_[port].info_ns.push_back(now_ns);
  }
  void Arrived(int port, const std::string& session_id, Session session) {
    MutexLock lock(&mu_);
    ports_[port].sessions[session_id] = std::move(session);
  }
  void Started(int port, const std::string& session_id, int64_t achieved_ns) {
    MutexLock lock(&mu_);
    ports_[port].sessions[session_id].achieved_start_ns = achieved_ns;
  }
  // The session, if the port has it.
  std::optional<Session> Find(int port, const std::string& session_id) {
    MutexLock lock(&mu_);
    auto port_it = ports_.find(port);
    if (port_it == ports_.end()) return std::nullopt;
    auto it = port_it->second.sessions.find(session_id);
    if (it == port_it->second.sessions.end()) return std::nullopt;
    return it->second;
  }
  std::string Lines() {
    MutexLock lock(&mu_);
    std::string out;
    for (const auto& [port, state] : ports_) {
      for (const auto& [id, session] : state.sessions) {
        StrAppend(&out, "profile ", port, " ", session.host.empty() ? "-" : session.host, " ",
                  session.arrival_ns, " ", session.requested_start_ns, " ",
                  session.achieved_start_ns, "\n");
      }
      if (!state.info_ns.empty()) {
        StrAppend(&out, "info ", port, " ", state.info_ns.size());
        for (int64_t ns : state.info_ns) StrAppend(&out, " ", ns);
        out += "\n";
      }
    }
    for (const auto& [port, node] : nodes_) {
      StrAppend(&out, "node ", port, " ", node.first, " ", node.second, "\n");
    }
    return out;
  }

 private:
  Mutex mu_;
  std::map<int, PortState> ports_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::pair<int, int64_t>> nodes_ ABSL_GUARDED_BY(mu_);
};

// Each port's node clock: the real wall clock plus its node's offset. Set once, after the ports
// are bound and before they are published (the port file): calls read it without a lock.
class NodeClocks {
 public:
  void Set(const std::vector<int>& ports, int first_index, int pods_per_node,
           int64_t max_offset_ns) {
    for (size_t k = 0; k < ports.size(); ++k) {
      const int node = (first_index + static_cast<int>(k)) / pods_per_node;
      // A fixed spread over [-max, max], the same in every process for one node.
      const uint64_t hash = static_cast<uint64_t>(node + 1) * 0x9E3779B97F4A7C15ULL;
      const uint64_t span = static_cast<uint64_t>(2 * max_offset_ns + 1);
      const int64_t offset = static_cast<int64_t>((hash >> 16) % span) - max_offset_ns;
      nodes_[ports[k]] = {node, offset};
    }
  }
  int64_t OffsetNs(int port) const {
    auto it = nodes_.find(port);
    return it == nodes_.end() ? 0 : it->second.second;
  }
  const std::map<int, std::pair<int, int64_t>>& nodes() const { return nodes_; }

 private:
  std::map<int, std::pair<int, int64_t>> nodes_;
};

// Runs actions at wall-clock instants on one thread, in order of their instants. Thread-safe.
class Timer {
 public:
  explicit Timer(Clock* clock) : clock_(clock), thread_([this] { Loop(); }) {}
  ~Timer() = delete;  // lives until the process _Exits

  void At(int64_t wall_ns, std::function<void()> action) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push({wall_ns, next_++, std::move(action)});
    }
    cv_.notify_one();
  }

 private:
  struct Entry {
    int64_t wall_ns;
    uint64_t order;
    std::function<void()> action;
    bool operator>(const Entry& other) const {
      return wall_ns != other.wall_ns ? wall_ns > other.wall_ns : order > other.order;
    }
  };

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (queue_.empty()) {
        cv_.wait(lock);
        continue;
      }
      const int64_t due = queue_.top().wall_ns;
      const int64_t wait_ns = due - RealClock::kFinalSleepNs - clock_->WallNs();
      if (wait_ns > 0) {
        // An earlier entry may come meanwhile: look again after the wait.
        cv_.wait_for(lock, std::chrono::nanoseconds(wait_ns));
        continue;
      }
      lock.unlock();
      clock_->SleepUntilWallNs(due);
      lock.lock();
      // Everything due by now, in order.
      while (!queue_.empty() && queue_.top().wall_ns <= clock_->WallNs()) {
        std::function<void()> action = queue_.top().action;
        queue_.pop();
        lock.unlock();
        action();
        lock.lock();
      }
    }
  }

  Clock* const clock_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue_;
  uint64_t next_ = 0;
  std::thread thread_;
};

// One simulated sidecar's port: 0 until its server bound it, set before the port is published
// (the port file), so no call comes in before.
using PortSlot = std::atomic<int>;

class ProfilerService final : public tensorflow::ProfilerService::CallbackService {
 public:
  ProfilerService(const PortSlot* port, Recorder* recorder, Clock* clock, const NodeClocks* nodes,
                  Timer* timer)
      : port_(port), recorder_(recorder), clock_(clock), nodes_(nodes), timer_(timer) {}

  grpc::ServerUnaryReactor* Profile(grpc::CallbackServerContext* context,
                                    const tensorflow::ProfileRequest* request,
                                    tensorflow::ProfileResponse* response) override {
    const int64_t arrival = clock_->WallNs();
    const int port = port_->load(std::memory_order_relaxed);
    const int64_t offset = nodes_->OffsetNs(port);
    const tensorflow::ProfileOptions& opts = request->opts();
    Session session;
    session.host =
        opts.override_hostname().empty() ? request->host_name() : opts.override_hostname();
    session.repository_root = request->repository_root();
    session.arrival_ns = arrival;
    session.requested_start_ns = static_cast<int64_t>(opts.start_timestamp_ns());
    session.duration_ms =
        static_cast<int64_t>(opts.duration_ms() > 0 ? opts.duration_ms() : request->duration_ms());
    const std::string id = opts.session_id().empty() ? request->session_id() : opts.session_id();
    recorder_->Arrived(port, id, session);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    // As a clusterprof sidecar does: a request asked to outlive its client is announced as
    // taken, and the capture goes on if the client then lets the call go.
    if (auto it = opts.advanced_configuration().find(proto::kOutliveClientKey);
        it != opts.advanced_configuration().end() && it->second.bool_value()) {
      context->AddInitialMetadata(proto::kAcceptedHeader, id);
      reactor->StartSendInitialMetadata();
    }
    // The requested start is on the node's clock.
    timer_->At(session.requested_start_ns - offset,
               [this, reactor, response, port, id, offset, duration_ms = session.duration_ms] {
                 const int64_t achieved = clock_->WallNs() + offset;
                 recorder_->Started(port, id, achieved);
                 timer_->At(achieved - offset + duration_ms * kNanosPerMilli, [reactor, response] {
                   response->set_empty_trace(false);
                   reactor->Finish(grpc::Status::OK);
                 });
               });
    return reactor;
  }

 private:
  const PortSlot* port_;
  Recorder* recorder_;
  Clock* clock_;
  const NodeClocks* nodes_;
  Timer* timer_;
};

class SidecarService final : public clusterprof::v1alpha1::Sidecar::CallbackService {
 public:
  SidecarService(const PortSlot* port, Recorder* recorder, Clock* clock, const NodeClocks* nodes)
      : port_(port), recorder_(recorder), clock_(clock), nodes_(nodes) {}

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const clusterprof::v1alpha1::GetInfoRequest*,
                                    clusterprof::v1alpha1::GetInfoResponse* response) override {
    const int64_t wall = clock_->WallNs();
    const int port = port_->load(std::memory_order_relaxed);
    response->set_wall_time_ns(wall + nodes_->OffsetNs(port));
    response->set_monotonic_time_ns(clock_->MonotonicNs());
    response->set_version("fake");
    response->set_host_name(StrCat("fake-sidecar-", port));
    response->set_announces_accepted(true);
    recorder_->Info(port, wall);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* GetSession(
      grpc::CallbackServerContext* context, const clusterprof::v1alpha1::GetSessionRequest* request,
      clusterprof::v1alpha1::GetSessionResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    const int port = port_->load(std::memory_order_relaxed);
    const std::optional<Session> session = recorder_->Find(port, request->session_id());
    if (!session.has_value()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                   StrCat("no session '", request->session_id(), "'")));
      return reactor;
    }
    response->set_session_id(request->session_id());
    const int64_t offset = nodes_->OffsetNs(port);
    if (session->achieved_start_ns == 0) {
      response->set_state(clusterprof::v1alpha1::SESSION_STATE_WAITING);
    } else if (clock_->WallNs() + offset <
               session->achieved_start_ns + session->duration_ms * kNanosPerMilli) {
      response->set_state(clusterprof::v1alpha1::SESSION_STATE_CAPTURING);
      response->set_start_time_ns(session->achieved_start_ns);
    } else {
      response->set_state(clusterprof::v1alpha1::SESSION_STATE_DONE);
      response->set_start_time_ns(session->achieved_start_ns);
      response->set_stop_time_ns(session->achieved_start_ns +
                                 session->duration_ms * kNanosPerMilli);
      response->set_start_error_ns(session->achieved_start_ns - session->requested_start_ns);
      response->set_events(1);
      clusterprof::v1alpha1::FileResult* file = response->add_files();
      file->set_uri(StrCat(session->repository_root, "/", session->host, ".xplane.pb"));
      file->set_bytes(1);
      file->set_upload_state(clusterprof::v1alpha1::UPLOAD_STATE_COMMITTED);
      file->set_bytes_committed(1);
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  const PortSlot* port_;
  Recorder* recorder_;
  Clock* clock_;
  const NodeClocks* nodes_;
};

// One port's server and the services that answer on it.
struct SimulatedSidecar {
  PortSlot port{0};
  std::unique_ptr<ProfilerService> profiler;
  std::unique_ptr<SidecarService> sidecar;
  std::unique_ptr<grpc::Server> server;
};

// The process's CPU time so far, user and system, in ms.
int64_t CpuMs() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000 +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1000;
}

bool WriteWhole(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.good()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

struct Options {
  int count = 250;
  std::string address = "127.0.0.1";
  std::string port_file;
  std::string record;
  int first_index = 0;
  int pods_per_node = 8;
  int64_t node_offset_ms = 0;
  // Both or neither: TLS on every port.
  std::string tls_cert_file;
  std::string tls_key_file;
};

int Run(const Options& options) {
  const int count = options.count;
  const std::string& address = options.address;
  // Signals are taken by sigwait below; the server's threads inherit the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Debian's abseil is built without NDEBUG, so absl::Mutex (which gRPC uses) runs its deadlock
  // detector; with hundreds of connections that costs these processes CPU that the operator
  // under test would otherwise get on the same machine. Real sidecars sit on other hosts.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!options.tls_cert_file.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> made =
        tls::MakeServerCredentials(options.tls_cert_file, options.tls_key_file);
    if (!made.ok()) {
      std::fprintf(stderr, "fake_sidecars: %s\n", std::string(made.status().message()).c_str());
      return 2;
    }
    credentials = *std::move(made);
  }
  RealClock clock;
  Recorder recorder;
  NodeClocks nodes;
  auto* timer = new Timer(&clock);  // lives until _Exit
  std::vector<std::unique_ptr<SimulatedSidecar>> sidecars;
  std::vector<int> ports;
  std::string lines;
  for (int k = 0; k < count; ++k) {
    auto sidecar = std::make_unique<SimulatedSidecar>();
    sidecar->profiler =
        std::make_unique<ProfilerService>(&sidecar->port, &recorder, &clock, &nodes, timer);
    sidecar->sidecar = std::make_unique<SidecarService>(&sidecar->port, &recorder, &clock, &nodes);
    grpc::ServerBuilder builder;
    // Without SO_REUSEPORT, port 0 is a port no other process listens on (with it, Linux may
    // hand two processes' listeners one port when the ephemeral range is crowded, as 10,000
    // ports and their connections make it).
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    // As the sidecar: the operator's kept connections may ping while idle.
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 60'000);
    int port = 0;
    builder.AddListeningPort(StrCat(address, ":0"), credentials, &port);
    builder.RegisterService(sidecar->profiler.get());
    builder.RegisterService(sidecar->sidecar.get());
    sidecar->server = builder.BuildAndStart();
    if (sidecar->server == nullptr || port == 0) {
      std::fprintf(stderr, "fake_sidecars: a port on %s could not be bound (%d bound)\n",
                   address.c_str(), k);
      return 1;
    }
    sidecar->port.store(port, std::memory_order_relaxed);
    ports.push_back(port);
    StrAppend(&lines, port, "\n");
    sidecars.push_back(std::move(sidecar));
  }
  nodes.Set(ports, options.first_index, options.pods_per_node,
            options.node_offset_ms * kNanosPerMilli);
  recorder.SetNodes(nodes.nodes());
  if (!WriteWhole(options.port_file, lines)) {
    std::fprintf(stderr, "fake_sidecars: cannot write %s\n", options.port_file.c_str());
    return 1;
  }

  int signal = 0;
  sigwait(&signals, &signal);
  if (!options.record.empty() &&
      !WriteWhole(options.record, StrCat(recorder.Lines(), "cpu ", CpuMs(), "\n"))) {
    std::fprintf(stderr, "fake_sidecars: cannot write %s\n", options.record.c_str());
    return 1;
  }
  // Session threads still waiting hold calls that a Shutdown would wait for: leave without.
  std::fflush(nullptr);
  std::_Exit(0);
}

}  // namespace
}  // namespace clusterprof::bench

int main(int argc, char** argv) {
  CLI::App app{"Simulated clusterprof sidecars, one per port, in one process"};
  clusterprof::bench::Options options;
  app.add_option("--count", options.count, "ports (simulated sidecars) to serve")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--address", options.address, "address to listen on")->capture_default_str();
  app.add_option("--port-file", options.port_file, "write the bound ports here, one a line")
      ->required();
  app.add_option("--record", options.record, "on SIGTERM, write what every port received here");
  app.add_option("--first-index", options.first_index,
                 "the pod number of the first port (pods are numbered across processes)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--pods-per-node", options.pods_per_node, "pods that share a node's clock")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--node-offset-ms", options.node_offset_ms,
                 "each node's clock is off the real one by a fixed amount up to this, either way")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  CLI::Option* cert =
      app.add_option("--tls-cert-file", options.tls_cert_file,
                     "serve TLS on every port with this PEM certificate (with --tls-key-file)")
          ->check(CLI::ExistingFile);
  CLI::Option* key = app.add_option("--tls-key-file", options.tls_key_file,
                                    "the certificate's PEM private key (with --tls-cert-file)")
                         ->check(CLI::ExistingFile);
  cert->needs(key);
  key->needs(cert);
  CLI11_PARSE(app, argc, argv);
  return clusterprof::bench::Run(options);
}
