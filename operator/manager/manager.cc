#include "operator/manager/manager.h"

#include <unistd.h>

#include <memory>
#include <thread>

#include "common/http/health_server.h"
#include "common/status.h"
#include "common/storage/dirs.h"
#include "common/storage/storage_set.h"
#include "common/strings.h"
#include "operator/api/types.h"
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

}  // namespace

absl::Status RunManager(const ManagerOptions& options, Clock& clock,
                        const std::atomic<bool>& stop) {
  OperatorMetrics metrics;
  kube::RestClientOptions client_options;
  client_options.qps = options.qps;
  client_options.burst = options.burst;
  client_options.user_agent = StrCat("clusterprof-operator/", CLUSTERPROF_VERSION);
  client_options.observe_request = [&metrics](std::string_view method, int code,
                                              int64_t latency_ns) {
    metrics.ApiRequest(method, code, latency_ns);
  };
  CLUSTERPROF_ASSIGN_OR_RETURN(
      std::unique_ptr<kube::RestClient> client,
      kube::RestClient::Create(options.rest_config, &clock, client_options));
  CLUSTERPROF_RETURN_IF_ERROR(CheckApiAccess(*client, options.namespace_));
  const std::string identity = options.identity.empty() ? DefaultIdentity() : options.identity;

  kube::InformerOptions job_options;
  job_options.type = api::ProfileJobs();
  job_options.namespace_ = options.namespace_;
  job_options.name = "profilejobs";
  kube::Informer jobs(client.get(), &clock, job_options);
  kube::InformerOptions schedule_options;
  schedule_options.type = api::ProfileSchedules();
  schedule_options.namespace_ = options.namespace_;
  schedule_options.name = "profileschedules";
  kube::Informer schedules(client.get(), &clock, schedule_options);
  kube::InformerOptions pod_options;
  pod_options.type = kube::Pods();
  pod_options.namespace_ = options.namespace_;
  pod_options.decoder = kube::PodDecoder();
  pod_options.name = "pods";
  kube::Informer pods(client.get(), &clock, pod_options);

  kube::EventRecorder recorder(client.get(), &clock, "clusterprof-operator", identity);
  // Run manifests go through one storage set (for gs://: one token cache, spool and uploader).
  storage::StorageSet storages(storage::StorageSetOptions{.clock = &clock});
  ProfileJobControllerOptions job_options_with_storage = options.jobs;
  if (job_options_with_storage.storages == nullptr) job_options_with_storage.storages = &storages;
  ProfileJobController job_controller(client.get(), &clock, &jobs, &pods, &recorder, &metrics,
                                      job_options_with_storage);
  ProfileScheduleController schedule_controller(client.get(), &clock, &schedules, &jobs, &recorder,
                                                &metrics, options.schedules);

  std::unique_ptr<http::HealthServer> health;
  if (options.health_port >= 0) {
    auto ready = [&]() -> std::string {
      for (const kube::Informer* informer : {&jobs, &schedules, &pods}) {
        if (!informer->HasSynced()) {
          const std::string error = informer->last_error();
          return StrCat("caches not synced yet", error.empty() ? "" : StrCat(": ", error));
        }
      }
      return "";
    };
    CLUSTERPROF_ASSIGN_OR_RETURN(
        health, http::HealthServer::Start(options.health_address, options.health_port, ready,
                                          metrics.registry()));
    spdlog::info("serving /healthz, /readyz and /metrics on {}:{}", options.health_address,
                 health->port());
  }

  std::unique_ptr<webhook::WebhookServer> webhook_server;
  if (options.webhook.port >= 0) {
    webhook::WebhookServerOptions webhook_options = options.webhook;
    webhook_options.registry = metrics.registry();
    if (webhook_options.injection.native_sidecar) {
      const std::string version = ServerVersion(*client);
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
    CLUSTERPROF_ASSIGN_OR_RETURN(webhook_server,
                                 webhook::WebhookServer::Start(std::move(webhook_options)));
    spdlog::info("serving the sidecar-injection webhook on https://{}:{}/mutate-pods ({} sidecar)",
                 options.webhook.address, webhook_server->port(), mode);
  }
  if (!options.port_file.empty()) {
    // Whole or not at all: readers poll for the file.
    std::string ports;
    if (health != nullptr) StrAppend(&ports, "http=", health->port(), "\n");
    if (webhook_server != nullptr) StrAppend(&ports, "webhook=", webhook_server->port(), "\n");
    if (absl::Status written = storage::WriteFileDurably(options.port_file, ports, 0644);
        !written.ok()) {
      spdlog::warn("cannot write the port file: {}", std::string(written.message()));
    }
  }

  jobs.Start();
  schedules.Start();
  pods.Start();
  spdlog::info("watching ProfileJobs, ProfileSchedules and pods in {}",
               options.namespace_.empty() ? std::string("every namespace")
                                          : StrCat("namespace ", options.namespace_));
  while (!stop && !(jobs.HasSynced() && schedules.HasSynced() && pods.HasSynced())) {
    clock.SleepForNs(50 * kNanosPerMilli);
  }

  std::atomic<bool> leading{false};
  std::atomic<bool> lost{false};
  std::unique_ptr<kube::RestClient> election_client;
  std::unique_ptr<kube::LeaderElector> elector;
  std::thread election;
  absl::Status election_status;
  const auto start_controllers = [&] {
    spdlog::info("starting the controllers");
    metrics.SetLeader(true);
    job_controller.Start();
    schedule_controller.Start();
  };
  if (!stop) {
    if (!options.leader_elect) {
      leading = true;
      start_controllers();
    } else {
      // Renewals must not wait behind the controllers' requests, and must time out well within
      // the renew deadline.
      kube::RestClientOptions election_options = client_options;
      election_options.request_timeout_ns = options.renew_deadline_ns / 2;
      CLUSTERPROF_ASSIGN_OR_RETURN(
          election_client, kube::RestClient::Create(options.rest_config, &clock, election_options));
      kube::LeaderElectionConfig config;
      config.lease_namespace = options.leader_election_namespace;
      config.lease_name = options.leader_election_id;
      config.identity = identity;
      config.lease_duration_ns = options.lease_duration_ns;
      config.renew_deadline_ns = options.renew_deadline_ns;
      config.retry_period_ns = options.retry_period_ns;
      config.on_started_leading = [&] {
        spdlog::info("became the leader ({} in Lease {}/{})", identity,
                     options.leader_election_namespace, options.leader_election_id);
        leading = true;
        clock.Wake();
      };
      config.on_stopped_leading = [&] {
        spdlog::error("lost the leadership; stopping");
        lost = true;
        clock.Wake();
      };
      config.on_new_leader = [&](const std::string& holder) {
        if (holder != identity && !holder.empty()) spdlog::info("the leader is {}", holder);
      };
      CLUSTERPROF_ASSIGN_OR_RETURN(
          elector, kube::LeaderElector::Create(election_client.get(), &clock, config));
      spdlog::info("waiting to lead (Lease {}/{}, identity {})", options.leader_election_namespace,
                   options.leader_election_id, identity);
      election = std::thread([&] {
        election_status = elector->Run();
        if (!election_status.ok()) lost = true;
        clock.Wake();
      });
    }
  }

  bool started = leading.load();
  int64_t next_refresh_ns = 0;
  while (!stop && !lost) {
    if (leading && !started) {
      start_controllers();
      started = true;
    }
    if (clock.MonotonicNs() >= next_refresh_ns) {
      job_controller.RefreshMetrics();
      next_refresh_ns = clock.MonotonicNs() + kNanosPerSecond;
    }
    clock.SleepForNs(100 * kNanosPerMilli);
  }

  // Shut down: the controllers first (a lost leader abandons its captures to the next one),
  // then the Lease, so that terms never overlap.
  spdlog::info("shutting down");
  metrics.SetLeader(false);
  const bool finished = job_controller.Stop(lost ? 0 : options.shutdown_grace_ns);
  if (!finished) {
    spdlog::warn(
        "captures still running at shutdown; the next operator resumes them from the "
        "jobs' status");
  }
  schedule_controller.Stop();
  if (elector != nullptr) {
    elector->Stop();
    if (election.joinable()) election.join();
  }
  recorder.Flush(2 * kNanosPerSecond);
  jobs.Stop();
  schedules.Stop();
  pods.Stop();
  if (lost) {
    return absl::AbortedError(
        StrCat("lost the leadership of Lease ", options.leader_election_namespace, "/",
               options.leader_election_id,
               election_status.ok() ? std::string() : StrCat(": ", election_status.message())));
  }
  return absl::OkStatus();
}

}  // namespace clusterprof::manager
