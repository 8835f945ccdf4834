#include "operator/manager/manager.h"

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/http/health_server.h"
#include "common/storage/dirs.h"
#include "common/storage/storage_set.h"
#include "operator/api/trigger.h"
#include "operator/api/types.h"
#include "operator/controllers/connection_warmer.h"
#include "operator/controllers/metrics.h"
#include "operator/kube/event_recorder.h"
#include "operator/kube/informer.h"
#include "operator/kube/leader_election.h"
#include "operator/kube/rest_client.h"
#include "spdlog/spdlog.h"

namespace clusterprof::manager {

using controllers::OperatorMetrics;
using controllers::ProfileJobController;
using controllers::ProfileJobControllerOptions;
using controllers::ProfileScheduleController;

namespace {

std::string DefaultIdentity() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return StrCat(host[0] != '\0' ? host : "clusterprof-operator", "_", getpid());
}

// Fails with what to do when the CRDs are not installed or the operator may not read them.
absl::Status CheckApiAccess(kube::RestClient& client, const std::string& ns) {
  for (const kube::ResourceType& type : {api::ProfileJobs(), api::ProfileSchedules()}) {
    kube::ListOptions options;
    options.limit = 1;
    absl::StatusOr<kube::ObjectList> listed = client.List(type, ns, options);
    if (listed.ok()) continue;
    if (absl::IsNotFound(listed.status())) {
      return absl::FailedPreconditionError(
          StrCat("the ", type.Describe(), " custom resource is not installed on ",
                 client.config().server, ": apply the CRDs first (kubectl apply -f crds/)"));
    }
    return Annotate(listed.status(),
                    StrCat("cannot list ", type.Describe(), " on ", client.config().server, " (",
                           client.config().description, ")"));
  }
  return absl::OkStatus();
}

// Whether ProfileTriggers can be listed: FailedPrecondition saying how to install the CRD when
// it is not installed.
absl::Status CheckTriggerApi(kube::RestClient& client, const std::string& ns) {
  kube::ListOptions options;
  options.limit = 1;
  absl::StatusOr<kube::ObjectList> listed = client.List(api::ProfileTriggers(), ns, options);
  if (listed.ok()) return absl::OkStatus();
  if (absl::IsNotFound(listed.status())) {
    return absl::FailedPreconditionError(
        "the ProfileTrigger custom resource is not installed: kubectl apply --server-side -f "
        "crds/profiletrigger.yaml (helm upgrade does not update CRDs), then restart the operator");
  }
  return Annotate(listed.status(), "cannot list ProfileTriggers");
}

// The API server's /version, or "" when it cannot be read.
std::string ServerVersion(kube::RestClient& client) {
  absl::StatusOr<kube::RestResponse> response = client.Raw("GET", "/version");
  if (!response.ok() || response->http_code != 200) {
    spdlog::warn("cannot read the API server's version: {}",
                 response.ok() ? StrCat("HTTP ", response->http_code, ": ", response->body)
                               : std::string(response.status().message()));
    return "";
  }
  return response->body;
}

kube::InformerOptions InformerOptionsFor(kube::ResourceType type, const std::string& ns,
                                         std::string name, kube::Decoder decoder = nullptr) {
  kube::InformerOptions options;
  options.type = std::move(type);
  options.namespace_ = ns;
  options.name = std::move(name);
  if (decoder) options.decoder = std::move(decoder);
  return options;
}

// /healthz, /readyz (ready once every cache synced) and /metrics; null when turned off.
absl::StatusOr<std::unique_ptr<http::HealthServer>> StartHealthServer(
    const ManagerOptions& options, const std::vector<const kube::Informer*>& informers,
    OperatorMetrics& metrics, controllers::ProfileTriggerController* triggers) {
  if (options.health_port < 0) return nullptr;
  auto ready = [informers]() -> std::string {
    for (const kube::Informer* informer : informers) {
      if (!informer->HasSynced()) {
        const std::string error = informer->last_error();
        return StrCat("caches not synced yet", error.empty() ? "" : StrCat(": ", error));
      }
    }
    return "";
  };
  // /triggers/<namespace>/<name>: the live steps a trigger follows (clusterprof top
  // --operator-addr), on the replica that leads.
  auto extra = [triggers](const std::string& path) -> std::optional<http::HealthAnswer> {
    constexpr std::string_view kPrefix = "/triggers/";
    if (!StartsWith(path, kPrefix)) return std::nullopt;
    const std::string key = path.substr(kPrefix.size());
    if (triggers == nullptr) {
      return http::HealthAnswer{404, "text/plain; charset=utf-8",
                                "ProfileTriggers are off on this operator\n"};
    }
    std::optional<std::string> json = triggers->StepsJson(key);
    if (!json.has_value()) {
      return http::HealthAnswer{
          404, "text/plain; charset=utf-8",
          StrCat("this replica follows no ProfileTrigger ", key,
                 " (give <namespace>/<name>; only the leading replica follows triggers, and not "
                 "suspended ones)\n")};
    }
    return http::HealthAnswer{200, "application/json", *std::move(json)};
  };
  absl::StatusOr<std::unique_ptr<http::HealthServer>> started = http::HealthServer::Start(
      options.health_address, options.health_port, ready, metrics.registry(), extra);
  if (!started.ok()) {
    return absl::Status(started.status().code(),
                        StrCat(started.status().message(),
                               ": choose another port with --health-port (0 picks a free one)"));
  }
  std::unique_ptr<http::HealthServer> health = *std::move(started);
  spdlog::info("serving /healthz, /readyz and /metrics on {}:{}", options.health_address,
               health->port());
  return health;
}

// The sidecar-injection webhook; null when turned off. A native sidecar asked of an API
// server older than 1.29 becomes a regular container, with a warning.
absl::StatusOr<std::unique_ptr<webhook::WebhookServer>> StartWebhook(const ManagerOptions& options,
                                                                     kube::RestClient& client,
                                                                     OperatorMetrics& metrics) {
  if (options.webhook.port < 0) return nullptr;
  webhook::WebhookServerOptions webhook_options = options.webhook;
  webhook_options.registry = metrics.registry();
  if (webhook_options.injection.native_sidecar) {
    const std::string version = ServerVersion(client);
    const std::optional<int> minor = webhook::KubernetesMinorVersion(version);
    if (!minor.has_value()) {
      spdlog::warn(
          "cannot tell the API server's Kubernetes version from /version ({}): injecting "
          "native sidecars as configured, which needs 1.29; on an older cluster set "
          "native_sidecar: false in the injection config",
          version);
    } else if (*minor < 29) {
      spdlog::warn(
          "the API server is Kubernetes 1.{}: native sidecars (restartPolicy: Always on an "
          "init container) need 1.29, so the sidecar is injected as a regular container; "
          "set native_sidecar: false in the injection config to say so",
          *minor);
      webhook_options.injection.native_sidecar = false;
    }
  }
  const char* mode = webhook_options.injection.native_sidecar ? "native" : "regular";
  absl::StatusOr<std::unique_ptr<webhook::WebhookServer>> started =
      webhook::WebhookServer::Start(std::move(webhook_options));
  if (!started.ok()) {
    return absl::Status(
        started.status().code(),
        StrCat(started.status().message(),
               absl::IsUnavailable(started.status())
                   ? ": choose another port with --webhook-port (0 picks a free one)"
                   : ""));
  }
  std::unique_ptr<webhook::WebhookServer> server = *std::move(started);
  spdlog::info("serving the sidecar-injection webhook on https://{}:{}/mutate-pods ({} sidecar)",
               options.webhook.address, server->port(), mode);
  return server;
}

// "http=N" and "webhook=N", whole or not at all (readers poll for the file).
void WritePortFile(const std::string& path, const http::HealthServer* health,
                   const webhook::WebhookServer* webhook_server) {
  if (path.empty()) return;
  std::string ports;
  if (health != nullptr) StrAppend(&ports, "http=", health->port(), "\n");
  if (webhook_server != nullptr) StrAppend(&ports, "webhook=", webhook_server->port(), "\n");
  if (absl::Status written = storage::WriteFileDurably(path, ports, 0644); !written.ok()) {
    spdlog::warn("cannot write the port file: {}", std::string(written.message()));
  }
}

// Leadership of the Lease: campaigns on a thread and client of its own (renewals must not wait
// behind the controllers' requests, and must time out well within the renew deadline). Without
// leader election this process leads at once.
class Leadership {
 public:
  Leadership(const ManagerOptions& options, Clock& clock, std::string identity)
      : options_(options), clock_(clock), identity_(std::move(identity)) {}
  ~Leadership() { Stop(); }

  absl::Status Start(const kube::RestClientOptions& client_options) {
    if (!options_.leader_elect) {
      leading_ = true;
      return absl::OkStatus();
    }
    kube::RestClientOptions election_options = client_options;
    election_options.request_timeout_ns = options_.renew_deadline_ns / 2;
    CLUSTERPROF_ASSIGN_OR_RETURN(
        client_, kube::RestClient::Create(options_.rest_config, &clock_, election_options));
    kube::LeaderElectionConfig config;
    config.lease_namespace = options_.leader_election_namespace;
    config.lease_name = options_.leader_election_id;
    config.identity = identity_;
    config.lease_duration_ns = options_.lease_duration_ns;
    config.renew_deadline_ns = options_.renew_deadline_ns;
    config.retry_period_ns = options_.retry_period_ns;
    config.on_started_leading = [this] {
      spdlog::info("became the leader ({} in Lease {})", identity_, Lease());
      leading_ = true;
      clock_.Wake();
    };
    config.on_stopped_leading = [this] {
      spdlog::error("lost the leadership; stopping");
      lost_ = true;
      clock_.Wake();
    };
    config.on_new_leader = [this](const std::string& holder) {
      if (holder != identity_ && !holder.empty()) spdlog::info("the leader is {}", holder);
    };
    CLUSTERPROF_ASSIGN_OR_RETURN(elector_,
                                 kube::LeaderElector::Create(client_.get(), &clock_, config));
    spdlog::info("waiting to lead (Lease {}, identity {})", Lease(), identity_);
    thread_ = std::thread([this] {
      status_ = elector_->Run();
      if (!status_.ok()) lost_ = true;
      clock_.Wake();
    });
    return absl::OkStatus();
  }

  bool leading() const { return leading_; }
  bool lost() const { return lost_; }

  // Releases the Lease (after the controllers stopped, so that terms never overlap).
  void Stop() {
    if (elector_ != nullptr) elector_->Stop();
    if (thread_.joinable()) thread_.join();
  }

  absl::Status LostError() const {
    return absl::AbortedError(
        StrCat("lost the leadership of Lease ", Lease(),
               status_.ok() ? std::string() : StrCat(": ", status_.message())));
  }

 private:
  std::string Lease() const {
    return StrCat(options_.leader_election_namespace, "/", options_.leader_election_id);
  }

  const ManagerOptions& options_;
  Clock& clock_;
  const std::string identity_;
  std::atomic<bool> leading_{false};
  std::atomic<bool> lost_{false};
  std::unique_ptr<kube::RestClient> client_;
  std::unique_ptr<kube::LeaderElector> elector_;
  std::thread thread_;
  absl::Status status_;
};

// The API client's limits, identity and request metrics.
kube::RestClientOptions ClientOptions(const ManagerOptions& options, OperatorMetrics& metrics) {
  kube::RestClientOptions client_options;
  client_options.qps = options.qps;
  client_options.burst = options.burst;
  client_options.user_agent = StrCat("clusterprof-operator/", CLUSTERPROF_VERSION);
  client_options.observe_request = [&metrics](std::string_view method, int code,
                                              int64_t latency_ns) {
    metrics.ApiRequest(method, code, latency_ns);
  };
  return client_options;
}

// The trigger controller's options: what it shares with the job controller (the token, the
// sidecars' TLS, the address rule) comes from there unless set.
controllers::ProfileTriggerControllerOptions TriggerOptions(const ManagerOptions& options) {
  controllers::ProfileTriggerControllerOptions trigger_options = options.triggers;
  if (trigger_options.sidecar_token_file.empty()) {
    trigger_options.sidecar_token_file = options.jobs.sidecar_token_file;
  }
  trigger_options.allow_external_addresses = options.jobs.allow_external_addresses;
  if (trigger_options.sidecar_security == nullptr) {
    trigger_options.sidecar_security = options.jobs.sidecar_security;
  }
  return trigger_options;
}

// Until every informer has its first list (or `stop`).
void WaitForSync(const std::vector<kube::Informer*>& informers, Clock& clock,
                 const std::atomic<bool>& stop) {
  while (!stop && !std::all_of(informers.begin(), informers.end(),
                               [](const kube::Informer* i) { return i->HasSynced(); })) {
    clock.SleepForNs(50 * kNanosPerMilli);
  }
}

// The leader's connections to the sidecars, kept across captures and warmed as pods become
// Ready (none with a connector or pool given, or --sidecar-connections 0).
struct KeptConnections {
  std::unique_ptr<coordinator::ChannelPool> pool;
  std::unique_ptr<controllers::ConnectionWarmer> warmer;
};
KeptConnections KeepConnections(const ManagerOptions& options) {
  KeptConnections kept;
  if (options.jobs.connector != nullptr || options.jobs.channel_pool != nullptr ||
      options.sidecar_connections == 0) {
    return kept;
  }
  kept.pool = std::make_unique<coordinator::ChannelPool>(coordinator::ChannelPool::Options{
      .security = options.jobs.sidecar_security, .max_channels = options.sidecar_connections});
  kept.warmer = std::make_unique<controllers::ConnectionWarmer>(kept.pool.get());
  return kept;
}

// Shut down: the controllers first (a lost leader cancels its captures at once; the next leader
// resumes them), then the Lease, so that terms never overlap.
void Shutdown(const ManagerOptions& options, OperatorMetrics& metrics,
              ProfileJobController& job_controller, ProfileScheduleController& schedule_controller,
              controllers::ProfileTriggerController* trigger_controller, Leadership& leadership,
              kube::EventRecorder& recorder, const std::vector<kube::Informer*>& informers) {
  spdlog::info("shutting down");
  metrics.SetLeader(false);
  if (!job_controller.Stop(leadership.lost() ? 0 : options.shutdown_grace_ns)) {
    spdlog::warn(
        "captures still running at shutdown were cancelled; the sidecars finish them and the "
        "next operator reads them back from the jobs' status");
  }
  schedule_controller.Stop();
  if (trigger_controller != nullptr) trigger_controller->Stop();
  leadership.Stop();
  recorder.Flush(2 * kNanosPerSecond);
  for (kube::Informer* informer : informers) informer->Stop();
}

}  // namespace

absl::Status RunManager(const ManagerOptions& options, Clock& clock,
                        const std::atomic<bool>& stop) {
  OperatorMetrics metrics;
  const kube::RestClientOptions client_options = ClientOptions(options, metrics);
  CLUSTERPROF_ASSIGN_OR_RETURN(
      std::unique_ptr<kube::RestClient> client,
      kube::RestClient::Create(options.rest_config, &clock, client_options));
  CLUSTERPROF_RETURN_IF_ERROR(CheckApiAccess(*client, options.namespace_));
  const std::string identity = options.identity.empty() ? DefaultIdentity() : options.identity;

  const std::string& ns = options.namespace_;
  // Declared before the informers, which call the warmer, and the controllers, which use the pool.
  KeptConnections kept = KeepConnections(options);
  coordinator::ChannelPool* const channel_pool = kept.pool.get();
  controllers::ConnectionWarmer* const warmer = kept.warmer.get();
  kube::Informer jobs(client.get(), &clock,
                      InformerOptionsFor(api::ProfileJobs(), ns, "profilejobs"));
  kube::Informer schedules(client.get(), &clock,
                           InformerOptionsFor(api::ProfileSchedules(), ns, "profileschedules"));
  kube::Informer pods(client.get(), &clock,
                      InformerOptionsFor(kube::Pods(), ns, "pods", kube::PodDecoder()));
  kube::EventRecorder recorder(client.get(), &clock, "clusterprof-operator", identity);
  // Run manifests go through one storage set (for gs://: one token cache, spool and uploader).
  storage::StorageSet storages(storage::StorageSetOptions{.clock = &clock});
  ProfileJobControllerOptions job_options = options.jobs;
  if (job_options.storages == nullptr) job_options.storages = &storages;
  if (channel_pool != nullptr) {
    job_options.channel_pool = channel_pool;
    pods.AddEventHandler(warmer);
  }
  ProfileJobController job_controller(client.get(), &clock, &jobs, &pods, &recorder, &metrics,
                                      job_options);
  ProfileScheduleController schedule_controller(client.get(), &clock, &schedules, &jobs, &recorder,
                                                &metrics, options.schedules);
  // ProfileTriggers when their CRD is installed (a cluster upgraded from a chart without it
  // runs the other controllers, with a warning that says how to add it).
  std::unique_ptr<kube::Informer> triggers;
  std::unique_ptr<controllers::ProfileTriggerController> trigger_controller;
  if (absl::Status installed = CheckTriggerApi(*client, ns); installed.ok()) {
    triggers = std::make_unique<kube::Informer>(
        client.get(), &clock, InformerOptionsFor(api::ProfileTriggers(), ns, "profiletriggers"));
    trigger_controller = std::make_unique<controllers::ProfileTriggerController>(
        client.get(), &clock, triggers.get(), &jobs, &pods, &recorder, &metrics,
        TriggerOptions(options));
  } else {
    spdlog::warn("ProfileTriggers are off: {}", std::string(installed.message()));
  }
  std::vector<kube::Informer*> informers = {&jobs, &schedules, &pods};
  if (triggers != nullptr) informers.push_back(triggers.get());

  CLUSTERPROF_ASSIGN_OR_RETURN(std::unique_ptr<http::HealthServer> health,
                               StartHealthServer(options, {informers.begin(), informers.end()},
                                                 metrics, trigger_controller.get()));
  CLUSTERPROF_ASSIGN_OR_RETURN(std::unique_ptr<webhook::WebhookServer> webhook_server,
                               StartWebhook(options, *client, metrics));
  WritePortFile(options.port_file, health.get(), webhook_server.get());

  for (kube::Informer* informer : informers) informer->Start();
  spdlog::info("watching ProfileJobs, ProfileSchedules, {}pods in {}",
               triggers != nullptr ? "ProfileTriggers and " : "",
               ns.empty() ? std::string("every namespace") : StrCat("namespace ", ns));
  WaitForSync(informers, clock, stop);

  Leadership leadership(options, clock, identity);
  if (!stop) CLUSTERPROF_RETURN_IF_ERROR(leadership.Start(client_options));
  bool started = false;
  int64_t next_refresh_ns = 0;
  while (!stop && !leadership.lost()) {
    if (leadership.leading() && !started) {
      spdlog::info("starting the controllers");
      metrics.SetLeader(true);
      job_controller.Start();
      schedule_controller.Start();
      if (trigger_controller != nullptr) trigger_controller->Start();
      if (warmer != nullptr) warmer->Activate(pods.List());
      started = true;
    }
    if (clock.MonotonicNs() >= next_refresh_ns) {
      job_controller.RefreshMetrics();
      next_refresh_ns = clock.MonotonicNs() + kNanosPerSecond;
    }
    clock.SleepForNs(100 * kNanosPerMilli);
  }

  Shutdown(options, metrics, job_controller, schedule_controller, trigger_controller.get(),
           leadership, recorder, informers);
  return leadership.lost() ? leadership.LostError() : absl::OkStatus();
}

}  // namespace clusterprof::manager
