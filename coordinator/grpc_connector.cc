#include <arpa/inet.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/grpc_status.h"
#include "common/base/mutex.h"
#include "common/base/strings.h"
#include "coordinator/connector.h"
#include "grpcpp/grpcpp.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"

namespace clusterprof::coordinator {
namespace {

// The largest answer taken from a clusterprof sidecar (GetInfo, GetSession, ...).
constexpr int64_t kMaxSidecarResponseBytes = 64 << 20;

// An IP literal (a pod IP) goes straight to gRPC's ipv4:/ipv6: resolver, with no DNS resolver
// and its machinery per channel; a name keeps the default (DNS).
std::string ChannelTarget(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return address;
  const std::string host = address.substr(0, colon);
  unsigned char buffer[sizeof(in6_addr)];
  if (inet_pton(AF_INET, host.c_str(), buffer) == 1) return "ipv4:" + address;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']' &&
      inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buffer) == 1) {
    return "ipv6:" + address;
  }
  return address;
}

class GrpcConnection final : public ProfilerConnection {
 public:
  GrpcConnection(const std::string& address, std::string auth_token)
      : auth_token_(std::move(auth_token)) {
    grpc::ChannelArguments args;
    // A TF/JAX server answers Profile with the whole XSpace: no bound but gRPC's own. A
    // clusterprof sidecar's answers are small (a session's digest is at most 8 MiB,
    // analysis/digest_proto.h): one over kMaxSidecarResponseBytes is refused before it is held,
    // and the target's session is named as unread, its capture kept.
    args.SetMaxReceiveMessageSize(INT32_MAX);
    args.SetServiceConfigJSON(
        StrCat(R"({"methodConfig": [{"name": [{"service": "clusterprof.v1alpha1.Sidecar"}], )",
               R"("maxResponseMessageBytes": )", kMaxSidecarResponseBytes, "}]}"));
    channel_ =
        grpc::CreateCustomChannel(ChannelTarget(address), grpc::InsecureChannelCredentials(), args);
    profiler_ = tensorflow::ProfilerService::NewStub(channel_);
    sidecar_ = v1alpha1::Sidecar::NewStub(channel_);
  }

  ~GrpcConnection() override {
    // Waits until every call's state, its ClientContext with it, is gone: a context holds the
    // channel, and the channel must go here, on the owner's thread. The last reference to a
    // gRPC 1.51 channel dropped on one of its callback threads, as a call's callback ends, frees
    // the callback queue twice (a crash seen under ASan).
    MutexLock lock(&mu_);
    mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return calls_ == 0; });
  }

  void GetInfo(int64_t timeout_ns, Done<v1alpha1::GetInfoResponse> done) override {
    Call<v1alpha1::GetInfoRequest, v1alpha1::GetInfoResponse>(
        v1alpha1::GetInfoRequest(), timeout_ns, std::move(done),
        [this](grpc::ClientContext* context, const v1alpha1::GetInfoRequest* request,
               v1alpha1::GetInfoResponse* response, std::function<void(grpc::Status)> reactor) {
          sidecar_->async()->GetInfo(context, request, response, std::move(reactor));
        });
  }

  void GetSession(const std::string& session_id, int64_t timeout_ns,
                  Done<v1alpha1::GetSessionResponse> done) override {
    v1alpha1::GetSessionRequest request;
    request.set_session_id(session_id);
    Call<v1alpha1::GetSessionRequest, v1alpha1::GetSessionResponse>(
        request, timeout_ns, std::move(done),
        [this](grpc::ClientContext* context, const v1alpha1::GetSessionRequest* request,
               v1alpha1::GetSessionResponse* response, std::function<void(grpc::Status)> reactor) {
          sidecar_->async()->GetSession(context, request, response, std::move(reactor));
        });
  }

  void Profile(const tensorflow::ProfileRequest& request, int64_t timeout_ns,
               Done<tensorflow::ProfileResponse> done) override {
    Call<tensorflow::ProfileRequest, tensorflow::ProfileResponse>(
        request, timeout_ns, std::move(done),
        [this](grpc::ClientContext* context, const tensorflow::ProfileRequest* request,
               tensorflow::ProfileResponse* response, std::function<void(grpc::Status)> reactor) {
          profiler_->async()->Profile(context, request, response, std::move(reactor));
        });
  }

  void Warm() override { channel_->GetState(/*try_to_connect=*/true); }

  void CancelCalls() override {
    // TryCancel outside the mutex (a call's callback takes it), on contexts kept alive by the
    // copies taken under it.
    std::vector<std::shared_ptr<grpc::ClientContext>> live;
    {
      MutexLock lock(&mu_);
      cancelled_ = true;
      for (const auto& [raw, context] : live_) live.push_back(context);
    }
    for (const std::shared_ptr<grpc::ClientContext>& context : live) context->TryCancel();
  }

 private:
  // Counts a call's state from its making to its end.
  class CallTracker {
   public:
    explicit CallTracker(GrpcConnection* connection) : connection_(connection) {
      MutexLock lock(&connection_->mu_);
      ++connection_->calls_;
    }
    ~CallTracker() {
      MutexLock lock(&connection_->mu_);
      --connection_->calls_;
    }
    CallTracker(const CallTracker&) = delete;
    CallTracker& operator=(const CallTracker&) = delete;

   private:
    GrpcConnection* const connection_;
  };

  template <typename Request, typename Response, typename Start>
  void Call(const Request& request, int64_t timeout_ns, Done<Response> done, Start start) {
    struct State {
      explicit State(GrpcConnection* connection) : tracker(connection) {}
      // First, so that it is destroyed last, after the context.
      CallTracker tracker;
      grpc::ClientContext context;
      Request request;
      Response response;
    };
    auto state = std::make_shared<State>(this);
    state->request = request;
    if (!auth_token_.empty()) {
      state->context.AddMetadata("authorization", "Bearer " + auth_token_);
    }
    state->context.set_deadline(GrpcTimeout(timeout_ns));
    {
      MutexLock lock(&mu_);
      if (cancelled_) {
        done(absl::CancelledError("the capture was cancelled"));
        return;
      }
      live_.emplace(&state->context, std::shared_ptr<grpc::ClientContext>(state, &state->context));
    }
    start(&state->context, &state->request, &state->response,
          [this, state, done = std::move(done)](grpc::Status status) mutable {
            if (status.ok()) {
              done(std::move(state->response));
            } else {
              done(FromGrpcStatus(status));
            }
            grpc::ClientContext* key = &state->context;
            MutexLock lock(&mu_);
            live_.erase(key);
            // The state goes with this lambda, or with CancelCalls' copy of its context.
          });
  }

  const std::string auth_token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tensorflow::ProfilerService::Stub> profiler_;
  std::unique_ptr<v1alpha1::Sidecar::Stub> sidecar_;
  Mutex mu_;
  // The calls in flight, each context kept alive by its call's state.
  std::map<grpc::ClientContext*, std::shared_ptr<grpc::ClientContext>> live_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Call states alive (CallTracker).
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::unique_ptr<ProfilerConnection> GrpcConnector::Connect(const std::string& address) {
  return std::make_unique<GrpcConnection>(address, auth_token_);
}

}  // namespace clusterprof::coordinator
