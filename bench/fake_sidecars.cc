// Many simulated clusterprof sidecars in one process, for the operator's scale benchmark
// (bench/operator_scale.cc): one gRPC server listening on --count ports of 127.0.0.1, each port
// standing for one pod's sidecar. A port is told apart by the :authority of the calls made to it
// (the operator dials "127.0.0.1:PORT", and gRPC sends that as the authority).
//
// Each port answers
//   - tensorflow.ProfilerService.Profile like a sidecar that records nothing: a session thread
//     per call waits for opts.start_timestamp_ns on the wall clock (RealClock, as the sidecar's
//     session does: a condition-variable wait, then clock_nanosleep(CLOCK_REALTIME,
//     TIMER_ABSTIME) with 1 ns timer slack), takes its start time, waits for the duration and
//     replies with empty_trace = false;
//   - clusterprof.v1alpha1.Sidecar.GetInfo with its clocks and a host name;
//   - Sidecar.GetSession with the session's achieved start, one event and one (unwritten) file.
//
// On SIGTERM or SIGINT it writes --record, a line per Profile call and per port, and exits:
//   profile <port> <host> <arrival_wall_ns> <requested_start_ns> <achieved_start_ns>
//   info <port> <calls> <arrival_wall_ns of each GetInfo call>...
// (achieved 0: the session had not started yet). --port-file gets the bound ports, one a line,
// written whole (renamed into place) once the server serves.
//
//   fake_sidecars --count 250 --port-file ports.txt --record record.txt
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "common/base/strings.h"
#include "grpcpp/grpcpp.h"
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
    return out;
  }

 private:
  Mutex mu_;
  std::map<int, PortState> ports_ ABSL_GUARDED_BY(mu_);
};

// The port a call came in on, from its authority ("127.0.0.1:PORT"); 0 when there is none.
int PortOf(grpc::CallbackServerContext* context) {
  const grpc::string_ref authority = context->ExperimentalGetAuthority();
  const std::string text(authority.data(), authority.size());
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return 0;
  return std::atoi(text.c_str() + colon + 1);
}

class ProfilerService final : public tensorflow::ProfilerService::CallbackService {
 public:
  ProfilerService(Recorder* recorder, Clock* clock) : recorder_(recorder), clock_(clock) {}

  grpc::ServerUnaryReactor* Profile(grpc::CallbackServerContext* context,
                                    const tensorflow::ProfileRequest* request,
                                    tensorflow::ProfileResponse* response) override {
    const int64_t arrival = clock_->WallNs();
    const int port = PortOf(context);
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
    // A session thread per call, as the sidecar runs one per capture.
    std::thread([this, reactor, response, port, id, session] {
      clock_->SleepUntilWallNs(session.requested_start_ns);
      const int64_t achieved = clock_->WallNs();
      // Every session wakes at the same instant: let the others take their start time.
      std::this_thread::yield();
      recorder_->Started(port, id, achieved);
      clock_->SleepUntilWallNs(achieved + session.duration_ms * kNanosPerMilli);
      response->set_empty_trace(false);
      reactor->Finish(grpc::Status::OK);
    }).detach();
    return reactor;
  }

 private:
  Recorder* recorder_;
  Clock* clock_;
};

class SidecarService final : public clusterprof::v1alpha1::Sidecar::CallbackService {
 public:
  SidecarService(Recorder* recorder, Clock* clock) : recorder_(recorder), clock_(clock) {}

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const clusterprof::v1alpha1::GetInfoRequest*,
                                    clusterprof::v1alpha1::GetInfoResponse* response) override {
    const int64_t wall = clock_->WallNs();
    response->set_wall_time_ns(wall);
    response->set_monotonic_time_ns(clock_->MonotonicNs());
    const int port = PortOf(context);
    response->set_version("fake");
    response->set_host_name(StrCat("fake-sidecar-", port));
    recorder_->Info(port, wall);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* GetSession(
      grpc::CallbackServerContext* context, const clusterprof::v1alpha1::GetSessionRequest* request,
      clusterprof::v1alpha1::GetSessionResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    const std::optional<Session> session = recorder_->Find(PortOf(context), request->session_id());
    if (!session.has_value()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                   StrCat("no session '", request->session_id(), "'")));
      return reactor;
    }
    response->set_session_id(request->session_id());
    if (session->achieved_start_ns == 0) {
      response->set_state(clusterprof::v1alpha1::SESSION_STATE_WAITING);
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
  Recorder* recorder_;
  Clock* clock_;
};

bool WriteWhole(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.good()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

int Run(int count, const std::string& address, const std::string& port_file,
        const std::string& record) {
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
  RealClock clock;
  Recorder recorder;
  ProfilerService profiler(&recorder, &clock);
  SidecarService sidecar(&recorder, &clock);
  grpc::ServerBuilder builder;
  std::vector<int> ports(count, 0);
  for (int& port : ports) {
    builder.AddListeningPort(StrCat(address, ":0"), grpc::InsecureServerCredentials(), &port);
  }
  builder.RegisterService(&profiler);
  builder.RegisterService(&sidecar);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::fprintf(stderr, "fake_sidecars: the server did not start on %s\n", address.c_str());
    return 1;
  }
  std::string lines;
  for (int port : ports) {
    if (port == 0) {
      std::fprintf(stderr, "fake_sidecars: a port on %s could not be bound\n", address.c_str());
      return 1;
    }
    StrAppend(&lines, port, "\n");
  }
  if (!WriteWhole(port_file, lines)) {
    std::fprintf(stderr, "fake_sidecars: cannot write %s\n", port_file.c_str());
    return 1;
  }

  int signal = 0;
  sigwait(&signals, &signal);
  if (!record.empty() && !WriteWhole(record, recorder.Lines())) {
    std::fprintf(stderr, "fake_sidecars: cannot write %s\n", record.c_str());
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
  int count = 250;
  std::string address = "127.0.0.1";
  std::string port_file;
  std::string record;
  app.add_option("--count", count, "ports (simulated sidecars) to serve")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--address", address, "address to listen on")->capture_default_str();
  app.add_option("--port-file", port_file, "write the bound ports here, one a line")->required();
  app.add_option("--record", record, "on SIGTERM, write what every port received here");
  CLI11_PARSE(app, argc, argv);
  return clusterprof::bench::Run(count, address, port_file, record);
}
