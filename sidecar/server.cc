#include "sidecar/server.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/time/time.h"
#include "common/base/env.h"
#include "common/base/file_stamp.h"
#include "common/base/grpc_status.h"
#include "common/base/mutex.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/grpc/log_bridge.h"
#include "common/grpc/tls.h"
#include "common/http/health_server.h"
#include "common/storage/dirs.h"
#include "common/storage/storage_set.h"
#include "grpcpp/grpcpp.h"
#include "sidecar/connection_guard.h"
#include "sidecar/metrics.h"
#include "sidecar/services.h"
#include "sidecar/session.h"
#include "sidecar/tracers/annotation_tracer.h"
#include "sidecar/tracers/framework_tracer.h"
#include "sidecar/tracers/gpu_metrics.h"
#include "sidecar/tracers/gpu_tracer.h"
#include "sidecar/tracers/nvml_api.h"
#include "sidecar/tracers/shm_transport.h"
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

absl::Status WritePortFile(const std::string& path, int grpc_port, int http_port,
                           int loopback_port) {
  std::string text = StrCat("grpc=", grpc_port, "\nhttp=", http_port, "\n");
  if (loopback_port > 0) text += StrCat("grpc_loopback=", loopback_port, "\n");
  return storage::WriteFileDurably(path, text, 0644);
}

// Whether ::1 can be bound (pods of IPv4-only clusters may have IPv6 off).
bool LoopbackV6Available() {
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 address = {};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return bound;
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

absl::Status ValidateConfig(const SidecarConfig& config) {
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
  if (config.max_profile_calls < 0) {
    return absl::InvalidArgumentError(
        StrCat("--max-profile-calls ", config.max_profile_calls, " is negative (0: no limit)"));
  }
  if (config.upload_wait_ms < 0) {
    return absl::InvalidArgumentError("--upload-wait-ms must not be negative");
  }
  if (config.tls_cert_file.empty() != config.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert-file and --tls-key-file go together: give both, or neither for plaintext");
  }
  if (config.token_grace_seconds < 0 || config.token_grace_seconds > 7 * 86400) {
    return absl::InvalidArgumentError(StrCat("--token-grace-seconds ", config.token_grace_seconds,
                                             " is out of range: give 0 to 604800 (a week)"));
  }
  if (config.handshake_timeout_ms < 100 || config.handshake_timeout_ms > 600'000) {
    return absl::InvalidArgumentError(StrCat("--handshake-timeout-ms ", config.handshake_timeout_ms,
                                             " is out of range: give 100 to 600000"));
  }
  if (config.max_connections_per_peer < 0 || config.max_connections < 0) {
    return absl::InvalidArgumentError(
        "--max-connections-per-peer and --max-connections must not be negative (0: no limit)");
  }
  if (config.recorder_level < 0 || config.recorder_level > 3) {
    return absl::InvalidArgumentError(StrCat("--recorder-level ", config.recorder_level,
                                             " is not a host level: give 0 (off) to 3"));
  }
  if (config.recorder_window_ms < 0 || config.recorder_window_ms > 3'600'000) {
    return absl::InvalidArgumentError(StrCat("--recorder-window-ms ", config.recorder_window_ms,
                                             " is out of range: give 0 (keep none) to 3600000"));
  }
  if (config.recorder_window_ms > 0 && config.recorder_max_bytes < (uint64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        StrCat("--recorder-max-bytes ", config.recorder_max_bytes,
               " is below 1 MiB, too little to keep a window of annotations (or set "
               "--recorder-window-ms 0)"));
  }
  return absl::OkStatus();
}

// What Profile requests may ask, from the flags (the tracers are added once they exist).
absl::StatusOr<RequestPolicy> MakeRequestPolicy(const SidecarConfig& config) {
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
  return policy;
}

}  // namespace

struct SidecarServer::Impl {
  Clock* clock = nullptr;
  std::unique_ptr<ShmTransport> shm;
  std::unique_ptr<StepTelemetry> telemetry;
  std::unique_ptr<AnnotationTracer> annotations;
  std::unique_ptr<NvmlApi> nvml;               // null without libnvidia-ml
  std::unique_ptr<GpuTracer> gpu;              // null with --no-gpu
  std::unique_ptr<FrameworkTracer> framework;  // null without --framework-profiler
  std::unique_ptr<TokenAuth> auth;             // null without --auth-token-file
  std::vector<Tracer*> tracers;
  std::unique_ptr<SidecarMetrics> metrics;
  std::string spool_dir;
  std::unique_ptr<storage::StorageSet> storages;
  // Resumes what an earlier sidecar left in the spool without holding up the start.
  std::thread resume_spool;
  std::unique_ptr<SessionManager> sessions;
  std::unique_ptr<ProfilerServiceImpl> profiler_service;
  std::unique_ptr<SidecarServiceImpl> sidecar_service;
  std::unique_ptr<UnknownMethodService> unknown_methods;
  std::unique_ptr<grpc::Server> grpc_server;
  // gRPC's own log lines into ours, its failed handshakes counted (null when another bridge of
  // this process has gRPC's log).
  std::unique_ptr<grpclog::LogBridge> log_bridge;
  std::unique_ptr<ConnectionGuard> connection_guard;
  std::unique_ptr<http::HealthServer> health;
  int grpc_port = 0;
  // The plaintext listener on loopback beside a TLS port (0: none).
  int loopback_port = 0;
  std::atomic<bool> shut_down{false};

  // Watches the serving certificate for the log and /metrics (gRPC rereads it by itself).
  std::thread certificate_watch;
  Mutex watch_mu;
  bool stop_watch ABSL_GUARDED_BY(watch_mu) = false;

  ~Impl() {
    StopCertificateWatch();
    if (resume_spool.joinable()) resume_spool.join();
  }

  void StartCertificateWatch(const SidecarConfig& config);
  void StopCertificateWatch() {
    {
      MutexLock lock(&watch_mu);
      stop_watch = true;
    }
    if (certificate_watch.joinable()) certificate_watch.join();
  }

  // The shared memory and the annotation and GPU tracers that read it.
  absl::Status StartShmTracers(const SidecarConfig& config);
  // The storages of the logdirs, with the spool an earlier sidecar left resumed in the background.
  // Local files go only beneath the policy's local prefixes.
  void StartStorage(const SidecarConfig& config, const RequestPolicy& policy);
  absl::Status StartFrameworkTracer(const SidecarConfig& config);
  // The sessions, the gRPC services and the server.
  absl::Status StartGrpc(const SidecarConfig& config, RequestPolicy policy);
  // The bearer token check of --auth-token-file (none without it).
  absl::Status LoadTokenAuth(const SidecarConfig& config);
  // gRPC's log lines into ours, failed handshakes counted.
  void InstallLogBridge();
  // Closes connections beyond --max-connections-per-peer and --max-connections.
  absl::Status StartConnectionGuard(const SidecarConfig& config);
  absl::Status StartHealth(const SidecarConfig& config);
};

absl::Status SidecarServer::Impl::StartShmTracers(const SidecarConfig& config) {
  ShmTransport::Options shm_options;
  shm_options.dir = config.shm_dir.empty() ? DefaultShmDir() : config.shm_dir;
  if (!config.install_injection_library.empty()) {
    // Not fatal: the sidecar still serves annotations, and a native sidecar that failed here
    // would hold the pod's containers back.
    if (absl::Status installed =
            InstallInjectionLibrary(config.install_injection_library, shm_options.dir);
        installed.ok()) {
      spdlog::info("installed the GPU tracing library as {}/{}", shm_options.dir,
                   shm::kInjectionLibraryFileName);
    } else {
      spdlog::error("{}; GPU activity will not be traced", std::string(installed.message()));
    }
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(shm, ShmTransport::Create(shm_options));
  StepTelemetry::Options telemetry_options;
  telemetry_options.step_pattern = config.step_pattern;
  telemetry_options.collective_pattern = config.collective_pattern;
  absl::StatusOr<std::unique_ptr<StepTelemetry>> made_telemetry =
      StepTelemetry::Create(telemetry_options);
  if (!made_telemetry.ok()) {
    return absl::InvalidArgumentError(
        StrCat("--step-pattern or --collective-pattern: ", made_telemetry.status().message()));
  }
  telemetry = std::move(*made_telemetry);
  telemetry->SetStepObserver([metrics = metrics.get()](const LiveStep& step) {
    metrics->StepFinished(step.step, step.start_ns, step.end_ns);
  });
  AnnotationTracer::Options annotation_options;
  annotation_options.default_max_events = config.max_events;
  annotation_options.recorder_level = static_cast<uint32_t>(config.recorder_level);
  annotation_options.recorder_window_ms = config.recorder_window_ms;
  annotation_options.recorder_max_bytes = config.recorder_max_bytes;
  annotation_options.telemetry = telemetry.get();
  CLUSTERPROF_ASSIGN_OR_RETURN(annotations,
                               AnnotationTracer::Create(shm.get(), annotation_options));
  tracers.push_back(annotations.get());
  if (!config.gpu) return absl::OkStatus();
  GpuTracer::Options gpu_options;
  gpu_options.flush_timeout_ms = config.gpu_flush_timeout_ms;
  std::unique_ptr<GpuMetricsSampler> gpu_metrics;
  if (absl::StatusOr<std::unique_ptr<NvmlApi>> loaded = LoadNvmlApi(config.nvml_library);
      loaded.ok()) {
    nvml = std::move(*loaded);
    gpu_metrics = std::make_unique<GpuMetricsSampler>(*nvml, *clock, GpuMetricsSampler::Options());
  } else {
    spdlog::info("no GPU counters: {}", std::string(loaded.status().message()));
  }
  gpu_options.host_has_gpus = HostHasNvidiaDevices(nvml.get());
  if (!gpu_options.host_has_gpus) {
    spdlog::info("no NVIDIA device here: captures without a CUDA process carry no GPU warning");
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(gpu,
                               GpuTracer::Create(shm.get(), gpu_options, std::move(gpu_metrics)));
  tracers.push_back(gpu.get());
  return absl::OkStatus();
}

void SidecarServer::Impl::StartStorage(const SidecarConfig& config, const RequestPolicy& policy) {
  spool_dir = config.spool_dir.empty() ? storage::DefaultSpoolDir(GetEnv, storage::kSidecarSpoolDir)
                                       : config.spool_dir;
  storage::StorageSetOptions storage_options;
  storage_options.clock = clock;
  // The prefix check of a request comes before its capture and the write after it: the write
  // itself must not be led out of the prefixes by a link swapped in meanwhile.
  storage_options.local.write_roots.emplace();
  for (const storage::Logdir& logdir : policy.allowed_logdirs) {
    if (logdir.kind == storage::Logdir::Kind::kLocal) {
      storage_options.local.write_roots->push_back(logdir.uri);
    }
  }
  storage_options.gcs.spool_dir = spool_dir;
  storage_options.gcs.spool_max_bytes = config.spool_max_bytes;
  storage_options.gcs.commit_wait_ns = config.upload_wait_ms * kNanosPerMilli;
  storage_options.gcs.observer = [metrics = metrics.get()](const storage::UploadEvent& event) {
    metrics->UploadEvent(event);
  };
  storages = std::make_unique<storage::StorageSet>(std::move(storage_options));
  resume_spool = std::thread([storages = storages.get()] {
    if (absl::Status resumed = storages->ResumeSpool(); !resumed.ok()) {
      spdlog::error("cannot resume the uploads left in spool {}: {}", storages->spool_dir(),
                    std::string(resumed.message()));
    }
  });
}

absl::Status SidecarServer::Impl::StartFrameworkTracer(const SidecarConfig& config) {
  if (config.framework_profiler.empty()) return absl::OkStatus();
  FrameworkTracer::Options framework_options;
  framework_options.address = config.framework_profiler;
  framework_options.work_dir = StrCat(spool_dir, "/framework");
  framework_options.grace_ms = config.framework_grace_ms;
  CLUSTERPROF_ASSIGN_OR_RETURN(framework, FrameworkTracer::Create(framework_options));
  tracers.push_back(framework.get());
  spdlog::info("captures are forwarded to the TF/JAX profiler at {}", config.framework_profiler);
  return absl::OkStatus();
}

absl::Status SidecarServer::Impl::StartGrpc(const SidecarConfig& config, RequestPolicy policy) {
  sessions = std::make_unique<SessionManager>(*clock, tracers, metrics.get(), storages.get());
  CLUSTERPROF_RETURN_IF_ERROR(LoadTokenAuth(config));
  const std::vector<const Tracer*> all(tracers.begin(), tracers.end());
  const std::string host_name = policy.default_host_name;
  policy.tracers = all;
  profiler_service = std::make_unique<ProfilerServiceImpl>(
      *sessions, std::move(policy), *clock, metrics.get(), auth.get(), config.max_profile_calls);
  LiveStepsSource live_steps;
  live_steps.telemetry = telemetry.get();
  live_steps.annotations = annotations.get();
  sidecar_service = std::make_unique<SidecarServiceImpl>(*sessions, all, host_name, *clock,
                                                         auth.get(), live_steps);

  InstallLogBridge();

  grpc::ServerBuilder builder;
  const std::string address = config.address.find(':') != std::string::npos
                                  ? StrCat("[", config.address, "]:", config.port)
                                  : StrCat(config.address, ":", config.port);
  if (config.tls_cert_file.empty()) {
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &grpc_port);
  } else {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        tls::MakeServerCredentials(config.tls_cert_file, config.tls_key_file);
    if (!credentials.ok()) {
      return absl::InvalidArgumentError(
          StrCat("--tls-cert-file/--tls-key-file: ", credentials.status().message()));
    }
    builder.AddListeningPort(address, *credentials, &grpc_port);
    // Plaintext on the pod's loopback, where kubectl port-forward arrives: the more specific
    // binds take loopback's connections from the wildcard one (gRPC binds with SO_REUSEPORT).
    // With port 0 (tests) the loopback listener gets a free port of its own.
    builder.AddListeningPort(StrCat("127.0.0.1:", config.port), grpc::InsecureServerCredentials(),
                             &loopback_port);
    if (config.port != 0 && LoopbackV6Available()) {
      builder.AddListeningPort(StrCat("[::1]:", config.port), grpc::InsecureServerCredentials());
    }
  }
  // The operator keeps its connections between captures and pings them while idle (at most every
  // 2 minutes: coordinator/grpc_connector.cc, kPoolKeepaliveMs).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 60'000);
  // Connections that never finish their handshakes are closed after this (default 120 s).
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(config.handshake_timeout_ms));
  builder.RegisterService(profiler_service.get());
  builder.RegisterService(sidecar_service.get());
  unknown_methods = std::make_unique<UnknownMethodService>(auth.get());
  builder.RegisterCallbackGenericService(unknown_methods.get());
  // An XSpace in a response (emit_xspace) can be large; requests are small.
  builder.SetMaxSendMessageSize(INT32_MAX);
  grpc_server = builder.BuildAndStart();
  if (grpc_server == nullptr || grpc_port == 0 ||
      (!config.tls_cert_file.empty() && loopback_port == 0)) {
    return absl::UnavailableError(
        StrCat("cannot serve gRPC on ", address,
               " (port in use, or not an address of this host?): choose another port with --port "
               "(0 picks a free one) or another address with --address"));
  }
  return StartConnectionGuard(config);
}

absl::Status SidecarServer::Impl::LoadTokenAuth(const SidecarConfig& config) {
  if (config.auth_token_file.empty()) return absl::OkStatus();
  TokenAuth::Options auth_options;
  auth_options.path = config.auth_token_file;
  auth_options.allow_loopback = config.allow_loopback_without_token;
  auth_options.grace_ns = config.token_grace_seconds * kNanosPerSecond;
  auth_options.clock = clock;
  auth_options.on_refused = [metrics = metrics.get()](std::string_view reason) {
    metrics->CallUnauthenticated(reason);
  };
  auth_options.on_reload = [metrics = metrics.get()](std::string_view result) {
    metrics->CredentialReloaded("token", result);
  };
  absl::StatusOr<std::unique_ptr<TokenAuth>> loaded = TokenAuth::Create(std::move(auth_options));
  if (!loaded.ok()) {
    return absl::InvalidArgumentError(StrCat("--auth-token-file: ", loaded.status().message()));
  }
  auth = std::move(*loaded);
  spdlog::info("gRPC calls must carry the bearer token of {}{}", config.auth_token_file,
               config.allow_loopback_without_token ? " (calls from loopback need none)" : "");
  return absl::OkStatus();
}

void SidecarServer::Impl::InstallLogBridge() {
  grpclog::LogBridge::Options bridge_options;
  bridge_options.clock = clock;
  bridge_options.on_handshake_failure =
      [metrics = metrics.get()](const grpclog::HandshakeFailure& failure) {
        if (failure.reason != grpclog::HandshakeFailureReason::kServerShutdown) {
          metrics->HandshakeFailed(grpclog::HandshakeFailureReasonName(failure.reason));
        }
      };
  log_bridge = std::make_unique<grpclog::LogBridge>(std::move(bridge_options));
  if (absl::Status installed = log_bridge->Install(); !installed.ok()) log_bridge.reset();
}

absl::Status SidecarServer::Impl::StartConnectionGuard(const SidecarConfig& config) {
  if (config.max_connections_per_peer <= 0 && config.max_connections <= 0) {
    return absl::OkStatus();
  }
  ConnectionGuard::Options guard_options;
  guard_options.port = grpc_port;
  guard_options.max_per_peer =
      config.max_connections_per_peer > 0 ? config.max_connections_per_peer : INT32_MAX;
  guard_options.max_total = config.max_connections > 0 ? config.max_connections : INT32_MAX;
  guard_options.interval_ns = kNanosPerSecond;
  guard_options.clock = clock;
  guard_options.on_refused = [metrics = metrics.get()](std::string_view reason, int count) {
    metrics->ConnectionsClosed(reason, count);
  };
  connection_guard = std::make_unique<ConnectionGuard>(std::move(guard_options));
  return connection_guard->Start();
}

void SidecarServer::Impl::StartCertificateWatch(const SidecarConfig& config) {
  if (config.tls_cert_file.empty()) return;
  const auto describe = [](const tls::CertificateInfo& info) {
    std::string names;
    for (const std::string& name : info.dns_names) names += StrCat(names.empty() ? "" : ", ", name);
    return StrCat(info.subject, " (", names.empty() ? "no DNS name" : names, "), valid until ",
                  absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(info.not_after_s),
                                   absl::UTCTimeZone()));
  };
  std::optional<FileStamp> seen = StampFile(config.tls_cert_file);
  absl::StatusOr<tls::CertificateInfo> served = tls::ReadCertificate(config.tls_cert_file);
  if (served.ok()) {
    spdlog::info("serving TLS with the certificate {}", describe(*served));
    metrics->SetCertificateExpiry(static_cast<double>(served->not_after_s));
  }
  certificate_watch = std::thread([this, config, describe, seen, served]() mutable {
    int64_t expired_logged_for = 0;
    while (true) {
      {
        MutexLock lock(&watch_mu);
        if (watch_mu.AwaitWithTimeout([this]()
                                          ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_watch; },
                                      std::chrono::seconds(tls::kDefaultReloadSeconds))) {
          return;
        }
      }
      // The certificate is read again only when its file changed.
      const std::optional<FileStamp> now = StampFile(config.tls_cert_file);
      if (now.has_value() && now != seen) {
        seen = now;
        served = tls::ReadCertificate(config.tls_cert_file);
        if (absl::Status pair = tls::CheckKeyPair(config.tls_cert_file, config.tls_key_file);
            !pair.ok() || !served.ok()) {
          spdlog::error("the TLS files changed but cannot be served: {}",
                        std::string(!pair.ok() ? pair.message() : served.status().message()));
          metrics->CredentialReloaded("certificate", "invalid");
          continue;
        }
        spdlog::info("the serving certificate changed: new connections get {}", describe(*served));
        metrics->CredentialReloaded("certificate", "ok");
        metrics->SetCertificateExpiry(static_cast<double>(served->not_after_s));
      }
      if (served.ok() && served->not_after_s < clock->WallNs() / kNanosPerSecond &&
          expired_logged_for != served->not_after_s) {
        expired_logged_for = served->not_after_s;
        spdlog::error(
            "the serving certificate {} has expired: clients refuse it until it is "
            "renewed",
            describe(*served));
      }
    }
  });
}

absl::Status SidecarServer::Impl::StartHealth(const SidecarConfig& config) {
  if (config.http_port < 0) return absl::OkStatus();
  auto ready = [this]() -> std::string {
    if (shut_down) return "shutting down";
    const TracerStatus status = annotations->Status();
    return status.ready ? "" : StrCat("annotation tracer: ", status.reason);
  };
  absl::StatusOr<std::unique_ptr<http::HealthServer>> started =
      http::HealthServer::Start(config.address, config.http_port, ready, metrics->registry());
  if (!started.ok()) {
    return absl::Status(started.status().code(),
                        StrCat(started.status().message(),
                               ": choose another port with --http-port (0 picks a free one, -1 "
                               "serves no HTTP)"));
  }
  health = *std::move(started);
  return absl::OkStatus();
}

SidecarServer::SidecarServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SidecarServer::~SidecarServer() { Shutdown(); }

int SidecarServer::grpc_port() const { return impl_->grpc_port; }
int SidecarServer::loopback_grpc_port() const { return impl_->loopback_port; }
int SidecarServer::http_port() const {
  return impl_->health != nullptr ? impl_->health->port() : -1;
}

absl::StatusOr<std::unique_ptr<SidecarServer>> SidecarServer::Start(const SidecarConfig& config,
                                                                    Clock& clock) {
  CLUSTERPROF_RETURN_IF_ERROR(ValidateConfig(config));
  CLUSTERPROF_ASSIGN_OR_RETURN(RequestPolicy policy, MakeRequestPolicy(config));
  auto impl = std::make_unique<Impl>();
  impl->clock = &clock;
  impl->metrics = std::make_unique<SidecarMetrics>();
  CLUSTERPROF_RETURN_IF_ERROR(impl->StartShmTracers(config));
  impl->StartStorage(config, policy);
  CLUSTERPROF_RETURN_IF_ERROR(impl->StartFrameworkTracer(config));
  const std::string host_name = policy.default_host_name;
  CLUSTERPROF_RETURN_IF_ERROR(impl->StartGrpc(config, std::move(policy)));
  CLUSTERPROF_RETURN_IF_ERROR(impl->StartHealth(config));
  impl->StartCertificateWatch(config);
  const std::string shm_dir = impl->shm->dir();
  std::unique_ptr<SidecarServer> server(new SidecarServer(std::move(impl)));
  spdlog::info(
      "clusterprof-sidecar {} serving gRPC on {}:{}{}, host name '{}', shared memory in "
      "{}",
      CLUSTERPROF_VERSION, config.address, server->grpc_port(),
      server->http_port() >= 0 ? StrCat(", HTTP on port ", server->http_port()) : "", host_name,
      shm_dir);
  if (!config.port_file.empty()) {
    CLUSTERPROF_RETURN_IF_ERROR(WritePortFile(config.port_file, server->grpc_port(),
                                              server->http_port(), server->loopback_grpc_port()));
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
  if (impl_->connection_guard != nullptr) impl_->connection_guard->Stop();
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
  impl_->StopCertificateWatch();
  impl_->log_bridge.reset();
}

}  // namespace clusterprof::sidecar
