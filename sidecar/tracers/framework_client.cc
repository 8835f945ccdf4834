#include "sidecar/tracers/framework_client.h"

#include <chrono>
#include <climits>

#include "absl/base/thread_annotations.h"
#include "common/base/grpc_status.h"
#include "common/base/mutex.h"
#include "grpcpp/grpcpp.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"

namespace clusterprof::sidecar {
namespace {

std::chrono::system_clock::time_point WallTime(int64_t ns) {
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::nanoseconds(ns)));
}

class GrpcFrameworkClient final : public FrameworkClient {
 public:
  explicit GrpcFrameworkClient(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(INT_MAX);
    stub_ = tensorflow::ProfilerService::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }

  absl::StatusOr<tensorflow::ProfileResponse> Profile(const tensorflow::ProfileRequest& request,
                                                      int64_t deadline_ns) override {
    grpc::ClientContext context;
    context.set_deadline(WallTime(deadline_ns));
    {
      MutexLock lock(&mu_);
      if (cancelled_) return absl::CancelledError("the framework tracer went away");
      context_ = &context;
    }
    tensorflow::ProfileResponse response;
    const grpc::Status status = stub_->Profile(&context, request, &response);
    MutexLock lock(&mu_);
    context_ = nullptr;
    if (!status.ok()) return FromGrpcStatus(status);
    return response;
  }

  absl::Status Terminate(const std::string& session_id, int64_t timeout_ns) override {
    tensorflow::TerminateRequest request;
    request.set_session_id(session_id);
    tensorflow::TerminateResponse response;
    grpc::ClientContext context;
    context.set_deadline(GrpcTimeout(timeout_ns));
    return FromGrpcStatus(stub_->Terminate(&context, request, &response));
  }

  void Cancel() override {
    MutexLock lock(&mu_);
    cancelled_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }

 private:
  std::unique_ptr<tensorflow::ProfilerService::Stub> stub_;
  Mutex mu_;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::unique_ptr<FrameworkClient> MakeGrpcFrameworkClient(const std::string& address) {
  return std::make_unique<GrpcFrameworkClient>(address);
}

}  // namespace clusterprof::sidecar
