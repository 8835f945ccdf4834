#include "sidecar/server.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/base/env.h"
#include "common/base/grpc_status.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/http/health_server.h"
#include "common/storage/dirs.h"
#include "common/storage/storage_set.h"
#include "grpcpp/grpcpp.h"
#include "sidecar/metrics.h"
#include "sidecar/services.h"
#include "sidecar/session.h"
#include "sidecar/tracers/annotation_tracer.h"
#include "sidecar/tracers/framework_tracer.h"
#include "sidecar/tracers/gpu_metrics.h"
#include "sidecar/tracers/gpu_tracer.h"
#include "sidecar/tracers/nvml_api.h"
#include "spdlog/spdlog.h"

namespace clusterprof::sidecar {
namespace {

std::string DefaultHostName() {
  if (std::optional<std::string> pod = GetEnv("POD_NAME")) return *pod;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') return name;
  return "localhost";
}

std::string DefaultShmDir() { return GetEnv(shm::kDirEnv).value_or(shm::kDefaultDir); }

absl::Status WritePortFile(const std::string& path, int grpc_port, int http_port) {
  return storage::WriteFileDurably(path, StrCat("grpc=", grpc_port, "\nhttp=", http_port, "\n"),
                                   0644);
}

}  // namespace

absl::Status InstallInjectionLibrary(const std::string& source, const std::string& dir) {
  std::ifstream in(source, std::ios::binary);
  std::stringstream bytes;
  if (!in || !(bytes << in.rdbuf())) {
    return absl::NotFoundError(
        StrCat("cannot read the GPU tracing library ", source, " (--install-injection-library)"));
  }
  // A rename: processes that loaded an earlier copy keep it; new ones load this one whole.
  return Annotate(storage::WriteFileDurably(StrCat(dir, "/", shm::kInjectionLibraryFileName),
                                            bytes.str(), 0755),
                  "installing the GPU tracing library");
}

namespace {

// How long a shutdown waits for uploads in flight.
constexpr int64_t kUploadDrainNs = 15 * kNanosPerSecond;

}  // namespace

struct SidecarServer::Impl {
  Clock* clock = nullptr;
  std::unique_ptr<AnnotationTracer> annotations;
  std::unique_ptr<NvmlApi> nvml;               // null without libnvidia-ml
  std::unique_ptr<GpuTracer> gpu;              // null with --no-gpu
  std::unique_ptr<FrameworkTracer> framework;  // null without --framework-profiler
  std::unique_ptr<TokenAuth> auth;             // null without --auth-token-file
  std::vector<Tracer*> tracers;
  std::unique_ptr<SidecarMetrics> metrics;
  std::unique_ptr<storage::StorageSet> storages;
  // Resumes what an earlier sidecar left in the spool without holding up the start.
  std::thread resume_spool;
  std::unique_ptr<SessionManager> sessions;
  std::unique_ptr<ProfilerServiceImpl> profiler_service;
  std::unique_ptr<SidecarServiceImpl> sidecar_service;
  std::unique_ptr<grpc::Server> grpc_server;
  std::unique_ptr<http::HealthServer> health;
  int grpc_port = 0;
  std::atomic<bool> shut_down{false};

  ~Impl() {
    if (resume_spool.joinable()) resume_spool.join();
  }
};

SidecarServer::SidecarServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SidecarServer::~SidecarServer() { Shutdown(); }

int SidecarServer::grpc_port() const { return impl_->grpc_port; }
int SidecarServer::http_port() const {
  return impl_->health != nullptr ? impl_->health->port() : -1;
}

absl::StatusOr<std::unique_ptr<SidecarServer>> SidecarServer::Start(const SidecarConfig& config,
                                                                    Clock& clock) {
  auto impl = std::make_unique<Impl>();
  impl->clock = &clock;
  if (config.port < 0 || config.port > 65535) {
    return absl::InvalidArgumentError(StrCat("--port ", config.port, " is not a port number"));
  }
  if (config.http_port < -1 || config.http_port > 65535) {
    return absl::InvalidArgumentError(
        StrCat("--http-port ", config.http_port, " is not a port number (-1 turns it off)"));
  }
  if (config.max_duration_ms <= 0) {
    return absl::InvalidArgumentError("--max-duration-ms must be positive");
  }

  RequestPolicy policy;
  policy.default_host_name = config.host_name.empty() ? DefaultHostName() : config.host_name;
  policy.max_duration_ms = config.max_duration_ms;
  for (const std::string& prefix : config.allowed_logdirs) {
    absl::StatusOr<storage::Logdir> logdir = storage::ParseLogdir(prefix);
    if (!logdir.ok()) {
      return absl::InvalidArgumentError(StrCat("--allowed-logdir: ", logdir.status().message()));
    }
    policy.allowed_logdirs.push_back(std::move(*logdir));
  }
  for (const storage::Logdir& logdir : policy.allowed_logdirs) {
    spdlog::info("Profile may write under {}", logdir.uri);
  }
  if (policy.allowed_logdirs.empty()) {
    spdlog::warn(
        "no --allowed-logdir given: Profile requests that write files will be refused "
        "(emit_xspace still works)");
  }

  AnnotationTracer::Options annotation_options;
  annotation_options.dir = config.shm_dir.empty() ? DefaultShmDir() : config.shm_dir;
  annotation_options.default_max_events = config.max_events;
  if (!config.install_injection_library.empty()) {
    // Not fatal: the sidecar still serves annotations, and a native sidecar that failed here
    // would hold the pod's containers back.
    if (absl::Status installed =
            InstallInjectionLibrary(config.install_injection_library, annotation_options.dir);
        installed.ok()) {
      spdlog::info("installed the GPU tracing library as {}/{}", annotation_options.dir,
                   shm::kInjectionLibraryFileName);
    } else {
      spdlog::error("{}; GPU activity will not be traced", std::string(installed.message()));
    }
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(impl->annotations, AnnotationTracer::Create(annotation_options));
  impl->tracers.push_back(impl->annotations.get());
  if (config.gpu) {
    GpuTracer::Options gpu_options;
    gpu_options.dir = annotation_options.dir;
    gpu_options.flush_timeout_ms = config.gpu_flush_timeout_ms;
    std::unique_ptr<GpuMetricsSampler> gpu_metrics;
    if (absl::StatusOr<std::unique_ptr<NvmlApi>> nvml = LoadNvmlApi(config.nvml_library);
        nvml.ok()) {
      impl->nvml = std::move(*nvml);
      gpu_metrics =
          std::make_unique<GpuMetricsSampler>(*impl->nvml, clock, GpuMetricsSampler::Options());
    } else {
      spdlog::info("no GPU counters: {}", std::string(nvml.status().message()));
    }
    CLUSTERPROF_ASSIGN_OR_RETURN(
        impl->gpu,
        GpuTracer::Create(gpu_options, impl->annotations->control(), std::move(gpu_metrics)));
    impl->tracers.push_back(impl->gpu.get());
  }

  if (config.upload_wait_ms < 0) {
    return absl::InvalidArgumentError("--upload-wait-ms must not be negative");
  }
  impl->metrics = std::make_unique<SidecarMetrics>();
  const std::string spool_dir = config.spool_dir.empty()
                                    ? storage::DefaultSpoolDir(GetEnv, storage::kSidecarSpoolDir)
                                    : config.spool_dir;
  storage::StorageSetOptions storage_options;
  storage_options.clock = &clock;
  storage_options.gcs.spool_dir = spool_dir;
  storage_options.gcs.spool_max_bytes = config.spool_max_bytes;
  storage_options.gcs.commit_wait_ns = config.upload_wait_ms * kNanosPerMilli;
  storage_options.gcs.observer = [metrics =
                                      impl->metrics.get()](const storage::UploadEvent& event) {
    metrics->UploadEvent(event);
  };
  impl->storages = std::make_unique<storage::StorageSet>(std::move(storage_options));
  impl->resume_spool = std::thread([storages = impl->storages.get()] {
    if (absl::Status resumed = storages->ResumeSpool(); !resumed.ok()) {
      spdlog::error("cannot resume the uploads left in spool {}: {}", storages->spool_dir(),
                    std::string(resumed.message()));
    }
  });
  if (!config.framework_profiler.empty()) {
    FrameworkTracer::Options framework_options;
    framework_options.address = config.framework_profiler;
    framework_options.work_dir = StrCat(spool_dir, "/framework");
    framework_options.grace_ms = config.framework_grace_ms;
    CLUSTERPROF_ASSIGN_OR_RETURN(impl->framework, FrameworkTracer::Create(framework_options));
    impl->tracers.push_back(impl->framework.get());
    spdlog::info("captures are forwarded to the TF/JAX profiler at {}", config.framework_profiler);
  }
  impl->sessions = std::make_unique<SessionManager>(clock, impl->tracers, impl->metrics.get(),
                                                    impl->storages.get());
  const std::string host_name = policy.default_host_name;
  if (!config.auth_token_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenAuth>> auth = TokenAuth::Create(config.auth_token_file);
    if (!auth.ok()) {
      return absl::InvalidArgumentError(StrCat("--auth-token-file: ", auth.status().message()));
    }
    impl->auth = std::move(*auth);
    spdlog::info("gRPC calls must carry the bearer token of {}", config.auth_token_file);
  }
  impl->profiler_service = std::make_unique<ProfilerServiceImpl>(
      *impl->sessions, std::move(policy), clock, impl->metrics.get(), impl->auth.get());
  impl->sidecar_service = std::make_unique<SidecarServiceImpl>(
      *impl->sessions, std::vector<const Tracer*>(impl->tracers.begin(), impl->tracers.end()),
      host_name, clock, impl->auth.get());

  grpc::ServerBuilder builder;
  const std::string address = config.address.find(':') != std::string::npos
                                  ? StrCat("[", config.address, "]:", config.port)
                                  : StrCat(config.address, ":", config.port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &impl->grpc_port);
  builder.RegisterService(impl->profiler_service.get());
  builder.RegisterService(impl->sidecar_service.get());
  // An XSpace in a response (emit_xspace) can be large; requests are small.
  builder.SetMaxSendMessageSize(INT32_MAX);
  impl->grpc_server = builder.BuildAndStart();
  if (impl->grpc_server == nullptr || impl->grpc_port == 0) {
    return absl::UnavailableError(StrCat("cannot serve gRPC on ", address,
                                         " (port in use, or not an address of this host?)"));
  }

  if (config.http_port >= 0) {
    Impl* raw = impl.get();
    auto ready = [raw]() -> std::string {
      if (raw->shut_down) return "shutting down";
      const TracerStatus status = raw->annotations->Status();
      return status.ready ? "" : StrCat("annotation tracer: ", status.reason);
    };
    CLUSTERPROF_ASSIGN_OR_RETURN(impl->health,
                                 http::HealthServer::Start(config.address, config.http_port, ready,
                                                           impl->metrics->registry()));
  }
  std::unique_ptr<SidecarServer> server(new SidecarServer(std::move(impl)));
  spdlog::info(
      "clusterprof-sidecar {} serving gRPC on {}:{}{}, host name '{}', shared memory in "
      "{}",
      CLUSTERPROF_VERSION, config.address, server->grpc_port(),
      server->http_port() >= 0 ? StrCat(", HTTP on port ", server->http_port()) : "", host_name,
      annotation_options.dir);
  if (!config.port_file.empty()) {
    CLUSTERPROF_RETURN_IF_ERROR(
        WritePortFile(config.port_file, server->grpc_port(), server->http_port()));
  }
  return server;
}

void SidecarServer::Shutdown() {
  if (impl_ == nullptr || impl_->shut_down) return;
  impl_->shut_down = true;
  // A capture ending now does not hold the shutdown up on its uploads: its files are safe in
  // the spool.
  impl_->storages->StopWaiting();
  const std::string active = impl_->sessions->ActiveSessionId();
  if (!active.empty()) {
    spdlog::info("shutting down: ending capture {} early; its files are still written", active);
    impl_->sessions->EndActiveForShutdown();
  }
  // In-flight RPCs get a grace period; the terminated capture answers its clients once its
  // files are written.
  impl_->grpc_server->Shutdown(GrpcTimeout(10 * kNanosPerSecond));
  impl_->grpc_server->Wait();
  impl_->sessions.reset();  // joins the session thread
  if (impl_->resume_spool.joinable()) impl_->resume_spool.join();
  // Uploads in flight get a while to finish (the spool may be an emptyDir that goes with the
  // pod), within Kubernetes' default 30 s grace period; what is left stays in the spool for the
  // next start.
  impl_->storages->Shutdown(kUploadDrainNs);
  impl_->storages.reset();
  impl_->health.reset();
}

}  // namespace clusterprof::sidecar
