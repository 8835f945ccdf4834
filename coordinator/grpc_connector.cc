#include <cstdint>
#include <memory>
#include <map>
#include <vector>
#include <string>

#include "absl/base/thread_annotations.h"
#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/grpc_status.h"
#include "common/base/mutex.h"
#include "coordinator/connector.h"
#include "grpcpp/grpcpp.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"

namespace clusterprof::coordinator {
namespace {

class GrpcConnection final : public ProfilerConnection {
 public:
  GrpcConnection(const std::string& address, std::string auth_token)
      : auth_token_(std::move(auth_token)) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(INT32_MAX);
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    profiler_ = tensorflow::ProfilerService::NewStub(channel_);
    sidecar_ = v1alpha1::Sidecar::NewStub(channel_);
  }

  ~GrpcConnection() override {
    // Calls hold `this` until their callback ran; the owner waits for them (or cancels) first.
    MutexLock lock(&mu_);
    mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return live_.empty(); });
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
  template <typename Request, typename Response, typename Start>
  void Call(const Request& request, int64_t timeout_ns, Done<Response> done, Start start) {
    struct State {
      grpc::ClientContext context;
      Request request;
      Response response;
    };
    auto state = std::make_shared<State>();
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
          [this, state, done = std::move(done)](grpc::Status status) {
            {
              MutexLock lock(&mu_);
              live_.erase(&state->context);
            }
            // `this` may be gone from here on: the owner only waits for calls in flight.
            if (status.ok()) {
              done(std::move(state->response));
            } else {
              done(FromGrpcStatus(status));
            }
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
};

}  // namespace

std::unique_ptr<ProfilerConnection> GrpcConnector::Connect(const std::string& address) {
  return std::make_unique<GrpcConnection>(address, auth_token_);
}

}  // namespace clusterprof::coordinator
