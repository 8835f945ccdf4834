#include "sidecar/services.h"

#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "common/base/grpc_status.h"
#include "common/base/mutex.h"
#include "common/base/strings.h"
#include "proto/profile_options.h"
#include "spdlog/spdlog.h"

namespace clusterprof::sidecar {
namespace {

// The files of a finished capture, as a serialized GetSessionResponse with only `files` set.
std::string ResultTrailer(const CaptureResult& result) {
  clusterprof::v1alpha1::GetSessionResponse response;
  for (const storage::ObjectInfo& info : result.files) {
    SetFileResult(info, response.add_files());
  }
  return response.SerializeAsString();
}

// A capture whose upload failed for good is an error for the client: its files are not where
// it will look. One still uploading is not: it arrives shortly, and GetSession follows it.
grpc::Status UploadStatus(const std::vector<storage::ObjectInfo>& files) {
  for (const storage::ObjectInfo& info : files) {
    if (info.state != storage::UploadState::kFailed) continue;
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        StrCat("the capture was recorded, but uploading ", info.uri, " failed: ",
                               info.error, ". The sidecar keeps the file in its spool (",
                               info.spool_path, ") and uploads it again when it restarts"));
  }
  return grpc::Status::OK;
}

// One Profile call. The session thread completes it, or the client's cancellation does; whichever
// comes first finishes the RPC, exactly once.
class ProfileCall final : public grpc::ServerUnaryReactor {
 public:
  struct State {
    Mutex mu;
    bool finished ABSL_GUARDED_BY(mu) = false;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
    ProfileCall* call ABSL_GUARDED_BY(mu) = nullptr;
    tensorflow::ProfileResponse* response ABSL_GUARDED_BY(mu) = nullptr;
    grpc::CallbackServerContext* context ABSL_GUARDED_BY(mu) = nullptr;
    std::shared_ptr<CaptureSession> session ABSL_GUARDED_BY(mu);
    CaptureSession::ClientId client ABSL_GUARDED_BY(mu) = 0;
  };

  // `calls` counts the calls in progress; this one is counted already and leaves it in OnDone.
  ProfileCall(grpc::CallbackServerContext* context, tensorflow::ProfileResponse* response,
              std::atomic<int>* calls, SidecarMetrics* metrics)
      : state_(std::make_shared<State>()), calls_(calls), metrics_(metrics) {
    MutexLock lock(&state_->mu);
    state_->call = this;
    state_->response = response;
    state_->context = context;
  }

  // Called by the session with its outcome.
  static void Complete(const std::shared_ptr<State>& state,
                       const absl::StatusOr<CaptureResult>& result);

  const std::shared_ptr<State>& state() const { return state_; }

  // Finishes at once (a refused request).
  void FinishNow(const grpc::Status& status) {
    {
      MutexLock lock(&state_->mu);
      state_->finished = true;
    }
    Finish(status);
  }

  // Records the session and client; a client that went away meanwhile detaches at once.
  void Joined(std::shared_ptr<CaptureSession> session, CaptureSession::ClientId client) {
    bool cancelled;
    {
      MutexLock lock(&state_->mu);
      state_->session = session;
      state_->client = client;
      cancelled = state_->cancelled;
    }
    if (cancelled) session->Detach(client);
  }

  // Tells a client that asked the capture to outlive it that the request is taken: the session
  // exists and records to its planned end whether or not the call stays (kAcceptedHeader).
  void Announce(const std::string& session_id) {
    MutexLock lock(&state_->mu);
    // Initial metadata must go before Finish, which follows `finished`.
    if (state_->finished) return;
    state_->context->AddInitialMetadata(proto::kAcceptedHeader, session_id);
    StartSendInitialMetadata();
  }

 private:
  void OnCancel() override {
    std::shared_ptr<CaptureSession> session;
    CaptureSession::ClientId client;
    {
      MutexLock lock(&state_->mu);
      state_->cancelled = true;
      if (state_->finished) return;
      state_->finished = true;
      session = state_->session;
      client = state_->client;
    }
    if (session != nullptr) session->Detach(client);
    Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                        "the client cancelled; the capture's files are still written"));
  }
  void OnDone() override {
    calls_->fetch_sub(1, std::memory_order_relaxed);
    if (metrics_ != nullptr) metrics_->ProfileCallEnded();
    delete this;
  }

  std::shared_ptr<State> state_;
  std::atomic<int>* const calls_;
  SidecarMetrics* const metrics_;
};

void ProfileCall::Complete(const std::shared_ptr<State>& state,
                           const absl::StatusOr<CaptureResult>& result) {
  ProfileCall* call;
  grpc::Status status = ToGrpcStatus(result.status());
  {
    MutexLock lock(&state->mu);
    if (state->finished) return;
    state->finished = true;
    call = state->call;
    if (result.ok()) {
      state->response->set_empty_trace(result->empty_trace);
      if (result->xspace != nullptr) *state->response->mutable_xspace() = *result->xspace;
      // Where each file's upload stands, for clients that look (upstream ones ignore it). The
      // digest is not here: a 1,000-step one is tens of KiB, past what gRPC peers accept in
      // metadata (8 KiB by default); GetSession carries it.
      if (!result->files.empty()) {
        state->context->AddTrailingMetadata(kResultTrailer, ResultTrailer(*result));
      }
      status = UploadStatus(result->files);
    }
  }
  // After `finished` is set nothing else touches the call; Finish may run OnDone inline.
  call->Finish(status);
}

grpc::ServerUnaryReactor* FinishedReactor(grpc::CallbackServerContext* context,
                                          const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

// A finished reactor refusing the call when `auth` requires a token the call lacks; else null.
grpc::ServerUnaryReactor* RefuseUnauthenticated(TokenAuth* auth,
                                                grpc::CallbackServerContext* context) {
  if (auth == nullptr) return nullptr;
  grpc::Status denied = auth->Check(*context);
  if (denied.ok()) return nullptr;
  spdlog::warn("call from {} refused: {}", context->peer(), denied.error_message());
  return FinishedReactor(context, denied);
}

}  // namespace

grpc::ServerUnaryReactor* ProfilerServiceImpl::Profile(grpc::CallbackServerContext* context,
                                                       const tensorflow::ProfileRequest* request,
                                                       tensorflow::ProfileResponse* response) {
  if (grpc::ServerUnaryReactor* refused = RefuseUnauthenticated(auth_, context)) {
    if (metrics_ != nullptr) metrics_->RequestRefused("UNAUTHENTICATED");
    return refused;
  }
  // Counted from here until gRPC is done with the call; past the cap the call costs nothing more.
  const int calls = profile_calls_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (max_profile_calls_ > 0 && calls > max_profile_calls_) {
    profile_calls_.fetch_sub(1, std::memory_order_relaxed);
    const grpc::Status busy(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        StrCat("this sidecar is already serving ", max_profile_calls_,
               " Profile calls (--max-profile-calls); retry when they have been answered"));
    spdlog::warn("Profile from {} refused: {}", context->peer(), busy.error_message());
    if (metrics_ != nullptr) metrics_->RequestRefused("RESOURCE_EXHAUSTED");
    return FinishedReactor(context, busy);
  }
  if (metrics_ != nullptr) metrics_->ProfileCallStarted();
  auto* call = new ProfileCall(context, response, &profile_calls_, metrics_);
  absl::StatusOr<CaptureRequest> parsed = ParseCaptureRequest(*request, policy_, clock_.WallNs());
  absl::Status status = parsed.status();
  if (status.ok()) {
    std::shared_ptr<ProfileCall::State> state = call->state();
    const bool announce = parsed->outlive_client;
    const std::string session_id = parsed->session_id;
    auto started = sessions_.StartOrJoin(std::move(*parsed),
                                         [state](const absl::StatusOr<CaptureResult>& result) {
                                           ProfileCall::Complete(state, result);
                                         });
    if (started.ok()) {
      call->Joined(started->first, started->second);
      if (announce) call->Announce(session_id);
      return call;
    }
    status = started.status();
  }
  spdlog::warn("Profile from {} refused: {}", context->peer(), status.ToString());
  if (metrics_ != nullptr) metrics_->RequestRefused(absl::StatusCodeToString(status.code()));
  call->FinishNow(ToGrpcStatus(status));
  return call;
}

grpc::ServerUnaryReactor* ProfilerServiceImpl::Terminate(
    grpc::CallbackServerContext* context, const tensorflow::TerminateRequest* request,
    tensorflow::TerminateResponse*) {
  if (grpc::ServerUnaryReactor* refused = RefuseUnauthenticated(auth_, context)) return refused;
  sessions_.Terminate(request->session_id());
  return FinishedReactor(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* ProfilerServiceImpl::Monitor(grpc::CallbackServerContext* context,
                                                       const tensorflow::MonitorRequest*,
                                                       tensorflow::MonitorResponse*) {
  // Every call needs the token, this one too: without it the answer is UNAUTHENTICATED.
  if (grpc::ServerUnaryReactor* refused = RefuseUnauthenticated(auth_, context)) return refused;
  return FinishedReactor(context, grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                               "Monitor is not implemented by clusterprof-sidecar "
                                               "(upstream profiler servers do not implement it "
                                               "either)"));
}

grpc::ServerUnaryReactor* SidecarServiceImpl::GetInfo(
    grpc::CallbackServerContext* context, const clusterprof::v1alpha1::GetInfoRequest*,
    clusterprof::v1alpha1::GetInfoResponse* response) {
  if (grpc::ServerUnaryReactor* refused = RefuseUnauthenticated(auth_, context)) return refused;
  // The clock reading first: it is what the caller's round trip brackets.
  response->set_wall_time_ns(clock_.WallNs());
  response->set_monotonic_time_ns(clock_.MonotonicNs());
  response->set_version(CLUSTERPROF_VERSION);
  response->set_host_name(host_name_);
  for (const Tracer* tracer : tracers_) {
    const TracerStatus status = tracer->Status();
    clusterprof::v1alpha1::TracerInfo* info = response->add_tracers();
    info->set_name(std::string(tracer->name()));
    info->set_ready(status.ready);
    info->set_reason(status.reason);
  }
  response->set_active_session_id(sessions_.ActiveSessionId());
  response->set_announces_accepted(true);
  return FinishedReactor(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* SidecarServiceImpl::GetSession(
    grpc::CallbackServerContext* context, const clusterprof::v1alpha1::GetSessionRequest* request,
    clusterprof::v1alpha1::GetSessionResponse* response) {
  if (grpc::ServerUnaryReactor* refused = RefuseUnauthenticated(auth_, context)) return refused;
  std::shared_ptr<CaptureSession> session = sessions_.Find(request->session_id());
  if (session == nullptr) {
    return FinishedReactor(
        context, grpc::Status(grpc::StatusCode::NOT_FOUND,
                              StrCat("no session '", request->session_id(),
                                     "' on this sidecar (running, or among the last finished)")));
  }
  *response = session->Snapshot();
  return FinishedReactor(context, grpc::Status::OK);
}

namespace {

// One WatchSteps stream. A thread of its own waits for steps (or a second without any), writes
// one message at a time, and finishes the call once the client is gone; the reactor deletes
// itself when gRPC is done with it.
class WatchStepsReactor final
    : public grpc::ServerWriteReactor<clusterprof::v1alpha1::WatchStepsResponse> {
 public:
  WatchStepsReactor(const LiveStepsSource& source, std::string host_name, Clock& clock, int history,
                    std::atomic<int>* streams)
      : source_(source),
        host_name_(std::move(host_name)),
        clock_(clock),
        history_(history),
        streams_(streams) {
    std::thread([this] { Run(); }).detach();
  }

  void OnWriteDone(bool ok) override {
    MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) done_ = true;
  }
  void OnCancel() override {
    MutexLock lock(&mu_);
    done_ = true;
  }
  void OnDone() override {
    streams_->fetch_sub(1, std::memory_order_relaxed);
    delete this;
  }

 private:
  static constexpr absl::Duration kHeartbeat = absl::Seconds(1);

  void Run() {
    int64_t last_sent = -1;
    bool first = true;
    uint64_t sequence = 0;
    while (true) {
      const StepTelemetry::Snapshot snapshot =
          first ? source_.telemetry->Get(-1, static_cast<size_t>(history_))
                : source_.telemetry->Get(last_sent);
      sequence = snapshot.sequence;
      Fill(snapshot);
      if (!snapshot.steps.empty()) last_sent = snapshot.steps.back().step;
      first = false;
      {
        MutexLock lock(&mu_);
        if (done_) break;
        writing_ = true;
        StartWrite(&response_);
        mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !writing_; });
        if (done_) break;
      }
      // Steps, or a heartbeat a second after the last message.
      const absl::Time deadline = absl::Now() + kHeartbeat;
      while (absl::Now() < deadline) {
        sequence = source_.telemetry->WaitForChange(sequence, absl::Milliseconds(200));
        if (source_.telemetry->Get(last_sent, 1).steps.size() > 0) break;
        MutexLock lock(&mu_);
        if (done_) break;
      }
    }
    // Nothing of `this` is touched after Finish: OnDone may delete it at once.
    Finish(grpc::Status::OK);
  }

  void Fill(const StepTelemetry::Snapshot& snapshot) {
    response_.Clear();
    for (const LiveStep& step : snapshot.steps) {
      clusterprof::v1alpha1::LiveStep* out = response_.add_steps();
      out->set_step(step.step);
      out->set_start_ns(step.start_ns);
      out->set_end_ns(step.end_ns);
      out->set_collective_entry_ns(step.collective_entry_ns);
    }
    response_.set_wall_time_ns(clock_.WallNs());
    response_.set_host_name(host_name_);
    response_.set_steps_total(snapshot.steps_total);
    response_.set_last_step_end_ns(snapshot.last_step_end_ns);
    response_.set_processes(snapshot.processes);
    response_.set_processes_with_steps(snapshot.processes_with_steps);
    response_.set_step_source(snapshot.step_source);
    if (source_.annotations != nullptr) {
      const AnnotationTracer::RecorderStatus recorder = source_.annotations->Recorder();
      response_.set_recorder_level(recorder.on ? static_cast<int32_t>(recorder.level) : 0);
      response_.set_recorder_window_ms(recorder.window_ms);
      response_.set_recorder_covered_since_ns(recorder.covered_since_ns);
      response_.set_recorder_bytes(recorder.bytes);
    }
  }

  const LiveStepsSource source_;
  const std::string host_name_;
  Clock& clock_;
  const int history_;
  std::atomic<int>* const streams_;
  clusterprof::v1alpha1::WatchStepsResponse response_;
  Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// A WatchSteps call refused at once.
class RefusedStream final
    : public grpc::ServerWriteReactor<clusterprof::v1alpha1::WatchStepsResponse> {
 public:
  explicit RefusedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<clusterprof::v1alpha1::WatchStepsResponse>* SidecarServiceImpl::WatchSteps(
    grpc::CallbackServerContext* context, const clusterprof::v1alpha1::WatchStepsRequest* request) {
  if (auth_ != nullptr) {
    if (grpc::Status denied = auth_->Check(*context); !denied.ok()) {
      spdlog::warn("call from {} refused: {}", context->peer(), denied.error_message());
      return new RefusedStream(denied);
    }
  }
  if (live_steps_.telemetry == nullptr) {
    return new RefusedStream(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                          "this sidecar has no live step telemetry"));
  }
  if (request->history() < 0 || request->history() > 1024) {
    return new RefusedStream(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     StrCat("history ", request->history(), " is out of range: give 0 to 1024")));
  }
  const int streams = streams_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (streams > live_steps_.max_streams) {
    streams_.fetch_sub(1, std::memory_order_relaxed);
    return new RefusedStream(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        StrCat("this sidecar already serves ", live_steps_.max_streams,
               " WatchSteps streams; close one (clusterprof top, an operator) and retry")));
  }
  return new WatchStepsReactor(live_steps_, host_name_, clock_,
                               request->history() == 0 ? 64 : request->history(), &streams_);
}

namespace {

// Answers `status` at once, then deletes itself.
class RefusingReactor final : public grpc::ServerGenericBidiReactor {
 public:
  explicit RefusingReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerGenericBidiReactor* UnknownMethodService::CreateReactor(
    grpc::GenericCallbackServerContext* context) {
  grpc::Status status = auth_ != nullptr ? auth_->Check(*context) : grpc::Status::OK;
  if (status.ok()) {
    status = grpc::Status(
        grpc::StatusCode::UNIMPLEMENTED,
        StrCat("clusterprof-sidecar serves no method ", context->method(),
               " (it serves tensorflow.ProfilerService and clusterprof.v1alpha1.Sidecar)"));
  }
  return new RefusingReactor(status);
}

}  // namespace clusterprof::sidecar
