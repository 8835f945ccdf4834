#include "tests/support/fake_profilers.h"

#include <algorithm>
#include <utility>

#include "common/base/check.h"
#include "common/base/strings.h"
#include "proto/profile_options.h"

namespace clusterprof::testing {

class FakeProfilers::Connection final : public coordinator::ProfilerConnection {
 public:
  Connection(FakeProfilers* owner, std::string address)
      : owner_(owner), address_(std::move(address)) {
    MutexLock lock(&owner_->mu_);
    owner_->max_connections_ = std::max(owner_->max_connections_, ++owner_->connections_);
  }
  ~Connection() override { owner_->Forget(this); }

  void GetInfo(int64_t timeout_ns, coordinator::Done<v1alpha1::GetInfoResponse> done) override {
    absl::StatusOr<v1alpha1::GetInfoResponse> answer;
    {
      MutexLock lock(&owner_->mu_);
      Server* server = Find();
      if (server != nullptr) ++server->get_info_calls;
      if (absl::Status refused = Refusal(server, /*sidecar_call=*/true); !refused.ok()) {
        answer = refused;
      } else {
        v1alpha1::GetInfoResponse response;
        response.set_version("0.1.0");
        response.set_host_name(server->script.host_name);
        response.set_announces_accepted(server->script.announce_accept);
        response.set_wall_time_ns(owner_->clock_->WallNs() + server->script.clock_offset_ns);
        response.set_monotonic_time_ns(owner_->clock_->MonotonicNs());
        answer = std::move(response);
      }
    }
    done(std::move(answer));
  }

  void GetSession(const std::string& session_id, int64_t timeout_ns,
                  coordinator::Done<v1alpha1::GetSessionResponse> done) override {
    absl::StatusOr<v1alpha1::GetSessionResponse> answer;
    {
      MutexLock lock(&owner_->mu_);
      Server* server = Find();
      if (server != nullptr) ++server->get_session_calls;
      if (absl::Status refused = Refusal(server, /*sidecar_call=*/true); !refused.ok()) {
        answer = refused;
      } else if (auto running = server->running.find(session_id);
                 running != server->running.end()) {
        const tensorflow::ProfileRequest& request = running->second;
        const int64_t end = static_cast<int64_t>(request.opts().start_timestamp_ns()) +
                            static_cast<int64_t>(request.opts().duration_ms()) * kNanosPerMilli;
        if (server->script.restarts_during_capture) {
          server->script.restarts_during_capture = false;
          server->running.clear();
          server->sessions.clear();
          answer = absl::NotFoundError(StrCat("no session ", session_id));
        } else if (server->terminated.count(session_id) == 0 &&
                   owner_->clock_->WallNs() + server->script.clock_offset_ns < end) {
          v1alpha1::GetSessionResponse response;
          response.set_session_id(session_id);
          response.set_state(v1alpha1::SESSION_STATE_WAITING);
          answer = std::move(response);
        } else {
          if (server->script.session_failure.has_value()) {
            v1alpha1::GetSessionResponse& response = server->sessions[session_id];
            response.set_session_id(session_id);
            response.set_state(v1alpha1::SESSION_STATE_FAILED);
            response.set_error(std::string(server->script.session_failure->message()));
            response.set_error_code(static_cast<int32_t>(server->script.session_failure->code()));
          } else {
            (void)owner_->FinishProfile(address_, request);
          }
          server->running.erase(running);
          answer = server->sessions[session_id];
        }
      } else if (auto it = server->sessions.find(session_id); it == server->sessions.end()) {
        answer = absl::NotFoundError(StrCat("no session ", session_id));
      } else {
        answer = it->second;
      }
    }
    done(std::move(answer));
  }

  void Profile(const tensorflow::ProfileRequest& request, int64_t timeout_ns,
               coordinator::Done<tensorflow::ProfileResponse> done,
               std::function<void()> accepted) override {
    absl::StatusOr<tensorflow::ProfileResponse> answer;
    bool announced = false;
    bool held = false;
    {
      MutexLock lock(&owner_->mu_);
      Server* server = Find();
      if (server != nullptr) server->profiles.push_back(request);
      if (absl::Status refused = Refusal(server, /*sidecar_call=*/false); !refused.ok()) {
        answer = refused;
      } else if (!server->script.profile_errors.empty()) {
        answer = server->script.profile_errors.front();
        server->script.profile_errors.pop_front();
        if (answer.ok()) answer = owner_->FinishProfile(address_, request);
      } else if (server->script.is_sidecar && server->script.announce_accept && Outlives(request)) {
        server->running[request.opts().session_id()] = request;
        owner_->held_.push_back({this, address_, request, std::move(done)});
        announced = true;
      } else if (server->script.hold_profile) {
        owner_->held_.push_back({this, address_, request, std::move(done)});
        held = true;
      } else {
        answer = owner_->FinishProfile(address_, request);
      }
    }
    if (announced) {
      if (accepted) accepted();
    } else if (!held) {
      done(std::move(answer));
    }
    if (owner_->on_profile_) owner_->on_profile_(address_);
  }

  void Terminate(const std::string& session_id, int64_t timeout_ns,
                 coordinator::Done<tensorflow::TerminateResponse> done) override {
    absl::StatusOr<tensorflow::TerminateResponse> answer = tensorflow::TerminateResponse();
    std::vector<std::pair<Held, absl::StatusOr<tensorflow::ProfileResponse>>> ended;
    {
      MutexLock lock(&owner_->mu_);
      Server* server = Find();
      if (server != nullptr) ++server->terminate_calls;
      if (absl::Status refused = Refusal(server, /*sidecar_call=*/false); !refused.ok()) {
        answer = refused;
      } else {
        if (server->running.count(session_id) > 0) server->terminated.insert(session_id);
        // A held call of the session is answered with what was recorded.
        for (auto it = owner_->held_.begin(); it != owner_->held_.end();) {
          if (it->address != address_ || it->request.opts().session_id() != session_id ||
              server->running.count(session_id) > 0) {
            ++it;
            continue;
          }
          absl::StatusOr<tensorflow::ProfileResponse> profile =
              owner_->FinishProfile(address_, it->request);
          ended.emplace_back(std::move(*it), std::move(profile));
          it = owner_->held_.erase(it);
        }
      }
    }
    for (auto& [held, profile] : ended) held.done(std::move(profile));
    done(std::move(answer));
  }

  void CancelCalls() override {
    {
      MutexLock lock(&owner_->mu_);
      cancelled_ = true;
    }
    owner_->CancelHeld(this);
  }

 private:
  Server* Find() ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner_->mu_) {
    auto it = owner_->servers_.find(address_);
    return it == owner_->servers_.end() ? nullptr : &it->second;
  }

  static bool Outlives(const tensorflow::ProfileRequest& request) {
    auto it = request.opts().advanced_configuration().find(proto::kOutliveClientKey);
    return it != request.opts().advanced_configuration().end() && it->second.bool_value();
  }

  absl::Status Refusal(const Server* server, bool sidecar_call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner_->mu_) {
    if (cancelled_) return absl::CancelledError("Cancelled");
    if (server == nullptr || !server->script.reachable) {
      return absl::UnavailableError(StrCat(
          "failed to connect to all addresses; last error: ", address_, ": Connection refused"));
    }
    if (sidecar_call && !server->script.is_sidecar) {
      return absl::UnimplementedError("unknown service clusterprof.v1alpha1.Sidecar");
    }
    return absl::OkStatus();
  }

  FakeProfilers* const owner_;
  const std::string address_;
  bool cancelled_ ABSL_GUARDED_BY(owner_->mu_) = false;
};

FakeProfilers::~FakeProfilers() {
  MutexLock lock(&mu_);
  CLUSTERPROF_CHECK(held_.empty()) << "a held Profile call was neither released nor cancelled";
}

void FakeProfilers::Add(const std::string& address, Script script) {
  MutexLock lock(&mu_);
  servers_[address].script = std::move(script);
}

void FakeProfilers::Update(const std::string& address, const std::function<void(Script&)>& change) {
  MutexLock lock(&mu_);
  change(servers_[address].script);
}

absl::StatusOr<tensorflow::ProfileResponse> FakeProfilers::FinishProfile(
    const std::string& address, const tensorflow::ProfileRequest& request) {
  Server& server = servers_[address];
  const std::string host =
      request.opts().override_hostname().empty() ? address : request.opts().override_hostname();
  tensorflow::ProfileResponse response;
  response.set_empty_trace(server.script.empty_trace);
  if (server.script.is_sidecar) {
    v1alpha1::GetSessionResponse& session = server.sessions[request.session_id()];
    session.set_session_id(request.session_id());
    session.set_state(v1alpha1::SESSION_STATE_DONE);
    // Started exactly when asked, on its own clock.
    const int64_t start = static_cast<int64_t>(request.opts().start_timestamp_ns());
    session.set_start_time_ns(start);
    session.set_stop_time_ns(start + static_cast<int64_t>(request.duration_ms()) * kNanosPerMilli);
    session.set_empty_trace(server.script.empty_trace);
    session.set_events(server.script.empty_trace ? 0 : server.script.events);
    session.clear_files();
    if (!server.script.empty_trace) {
      v1alpha1::FileResult* file = session.add_files();
      file->set_uri(
          StrCat(request.repository_root(), "/", request.session_id(), "/", host, ".xplane.pb"));
      file->set_bytes(server.script.bytes);
      const bool committed = server.script.upload_state == v1alpha1::UPLOAD_STATE_COMMITTED;
      file->set_bytes_committed(committed ? server.script.bytes : 0);
      file->set_upload_state(server.script.upload_state);
      file->set_error(server.script.upload_error);
    }
    session.clear_digest();
    session.clear_digest_error();
    if (!server.script.empty_trace && server.script.digest.has_value()) {
      *session.mutable_digest() = *server.script.digest;
    } else if (!server.script.empty_trace) {
      session.set_digest_error(server.script.digest_error);
    }
  }
  return response;
}

void FakeProfilers::ForgetSessions(const std::string& address) {
  MutexLock lock(&mu_);
  Server& server = servers_[address];
  server.sessions.clear();
  server.running.clear();
}

void FakeProfilers::Release() {
  std::vector<std::pair<Held, absl::StatusOr<tensorflow::ProfileResponse>>> answers;
  {
    MutexLock lock(&mu_);
    for (Held& held : held_) {
      servers_[held.address].running.erase(held.request.opts().session_id());
      absl::StatusOr<tensorflow::ProfileResponse> answer =
          FinishProfile(held.address, held.request);
      answers.emplace_back(std::move(held), std::move(answer));
    }
    held_.clear();
  }
  for (auto& [held, answer] : answers) held.done(std::move(answer));
}

void FakeProfilers::WaitForHeld(int count) {
  MutexLock lock(&mu_);
  mu_.Await([&]()
                ABSL_NO_THREAD_SAFETY_ANALYSIS { return static_cast<int>(held_.size()) >= count; });
}

void FakeProfilers::WaitForHeld(const std::string& address) {
  MutexLock lock(&mu_);
  mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return std::any_of(held_.begin(), held_.end(),
                       [&](const Held& held) { return held.address == address; });
  });
}

void FakeProfilers::CancelHeld(Connection* connection) {
  std::vector<Held> cancelled;
  {
    MutexLock lock(&mu_);
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->connection == connection) {
        cancelled.push_back(std::move(*it));
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Held& held : cancelled) held.done(absl::CancelledError("Cancelled"));
}

void FakeProfilers::Forget(Connection* connection) {
  MutexLock lock(&mu_);
  --connections_;
  for (const Held& held : held_) {
    CLUSTERPROF_CHECK(held.connection != connection)
        << "a held Profile call was neither released nor cancelled";
  }
}

std::vector<tensorflow::ProfileRequest> FakeProfilers::ProfileRequests(
    const std::string& address) const {
  MutexLock lock(&mu_);
  auto it = servers_.find(address);
  return it == servers_.end() ? std::vector<tensorflow::ProfileRequest>() : it->second.profiles;
}

int FakeProfilers::GetInfoCalls(const std::string& address) const {
  MutexLock lock(&mu_);
  auto it = servers_.find(address);
  return it == servers_.end() ? 0 : it->second.get_info_calls;
}

int FakeProfilers::TerminateCalls(const std::string& address) const {
  MutexLock lock(&mu_);
  auto it = servers_.find(address);
  return it == servers_.end() ? 0 : it->second.terminate_calls;
}

int FakeProfilers::GetSessionCalls(const std::string& address) const {
  MutexLock lock(&mu_);
  auto it = servers_.find(address);
  return it == servers_.end() ? 0 : it->second.get_session_calls;
}

int FakeProfilers::MaxConnections() const {
  MutexLock lock(&mu_);
  return max_connections_;
}

std::unique_ptr<coordinator::ProfilerConnection> FakeProfilers::Connect(
    const std::string& address) {
  return std::make_unique<Connection>(this, address);
}

}  // namespace clusterprof::testing
