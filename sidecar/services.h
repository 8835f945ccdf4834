// The sidecar's gRPC services: tensorflow.ProfilerService (what TF/JAX clients and XProf call)
// and clusterprof.v1alpha1.Sidecar (clock probes and session status for the coordinator).
#ifndef CLUSTERPROF_SIDECAR_SERVICES_H_
#define CLUSTERPROF_SIDECAR_SERVICES_H_

#include <atomic>
#include <string>
#include <vector>

#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/clock.h"
#include "sidecar/capture_request.h"
#include "sidecar/metrics.h"
#include "sidecar/session.h"
#include "sidecar/token_auth.h"
#include "sidecar/tracers/annotation_tracer.h"
#include "sidecar/tracers/step_telemetry.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"

namespace clusterprof::sidecar {

// Trailing metadata of a Profile response that wrote files: a serialized
// clusterprof.v1alpha1.GetSessionResponse with only `files` set (each file's upload state).
inline constexpr char kResultTrailer[] = "clusterprof-files-bin";

// The profiler service. Thread-safe. At most `max_profile_calls` Profile calls are served at once
// (joined ones wait for their capture to end, holding a little memory each, and a copy of the
// XSpace with emit_xspace); more are refused with RESOURCE_EXHAUSTED, so a flood of calls cannot
// grow the sidecar without bound.
class ProfilerServiceImpl final : public tensorflow::ProfilerService::CallbackService {
 public:
  // `auth` (may be null: no token required) must outlive the service. `max_profile_calls` 0: no
  // limit.
  ProfilerServiceImpl(SessionManager& sessions, RequestPolicy policy, Clock& clock,
                      SidecarMetrics* metrics, TokenAuth* auth = nullptr, int max_profile_calls = 0)
      : sessions_(sessions),
        policy_(std::move(policy)),
        clock_(clock),
        metrics_(metrics),
        auth_(auth),
        max_profile_calls_(max_profile_calls) {}

  grpc::ServerUnaryReactor* Profile(grpc::CallbackServerContext* context,
                                    const tensorflow::ProfileRequest* request,
                                    tensorflow::ProfileResponse* response) override;
  grpc::ServerUnaryReactor* Terminate(grpc::CallbackServerContext* context,
                                      const tensorflow::TerminateRequest* request,
                                      tensorflow::TerminateResponse* response) override;
  grpc::ServerUnaryReactor* Monitor(grpc::CallbackServerContext* context,
                                    const tensorflow::MonitorRequest* request,
                                    tensorflow::MonitorResponse* response) override;

 private:
  SessionManager& sessions_;
  const RequestPolicy policy_;
  Clock& clock_;
  SidecarMetrics* const metrics_;
  TokenAuth* const auth_;
  const int max_profile_calls_;
  // Profile calls from their arrival until gRPC is done with them.
  std::atomic<int> profile_calls_{0};
};

// What WatchSteps streams: the live steps and the flight recorder that feeds them.
struct LiveStepsSource {
  const StepTelemetry* telemetry = nullptr;
  const AnnotationTracer* annotations = nullptr;
  // Streams served at once; more are refused with RESOURCE_EXHAUSTED.
  int max_streams = 16;
};

class SidecarServiceImpl final : public clusterprof::v1alpha1::Sidecar::CallbackService {
 public:
  SidecarServiceImpl(SessionManager& sessions, std::vector<const Tracer*> tracers,
                     std::string host_name, Clock& clock, TokenAuth* auth = nullptr,
                     LiveStepsSource live_steps = {})
      : sessions_(sessions),
        tracers_(std::move(tracers)),
        host_name_(std::move(host_name)),
        clock_(clock),
        auth_(auth),
        live_steps_(live_steps) {}

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const clusterprof::v1alpha1::GetInfoRequest* request,
                                    clusterprof::v1alpha1::GetInfoResponse* response) override;
  grpc::ServerUnaryReactor* GetSession(
      grpc::CallbackServerContext* context, const clusterprof::v1alpha1::GetSessionRequest* request,
      clusterprof::v1alpha1::GetSessionResponse* response) override;
  grpc::ServerWriteReactor<clusterprof::v1alpha1::WatchStepsResponse>* WatchSteps(
      grpc::CallbackServerContext* context,
      const clusterprof::v1alpha1::WatchStepsRequest* request) override;

 private:
  SessionManager& sessions_;
  const std::vector<const Tracer*> tracers_;
  const std::string host_name_;
  Clock& clock_;
  TokenAuth* const auth_;
  const LiveStepsSource live_steps_;
  std::atomic<int> streams_{0};
};

// Every method that no service here serves (another service's, a misspelled one): the token is
// checked first, as for every method, and only then is the answer UNIMPLEMENTED, naming the
// method. Without it gRPC answers UNIMPLEMENTED before any check.
class UnknownMethodService final : public grpc::CallbackGenericService {
 public:
  // `auth`: null when no token is required.
  explicit UnknownMethodService(TokenAuth* auth) : auth_(auth) {}
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override;

 private:
  TokenAuth* const auth_;
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_SERVICES_H_
