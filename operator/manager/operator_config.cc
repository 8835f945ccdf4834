#include "operator/manager/operator_config.h"

#include "common/base/strings.h"
#include "common/grpc/tls.h"
#include "common/storage/logdir.h"
#include "operator/webhook/injection.h"
#include "spdlog/spdlog.h"

namespace clusterprof::manager {
namespace {

using settings::Field;
using Setting = settings::Setting<OperatorConfig>;

// Every setting of clusterprof-operator, in the order --help and docs/operator.md list them.
constexpr Setting kSettings[] = {
    {.name = "kubeconfig",
     .field = [](auto& c) -> Field { return &c.kubeconfig; },
     .help = "kubeconfig file",
     .default_text = "in-cluster, else `$KUBECONFIG`, else `~/.kube/config`"},
    {.name = "context",
     .field = [](auto& c) -> Field { return &c.context; },
     .help = "kubeconfig context",
     .default_text = "the current one"},
    {.name = "namespace",
     .field = [](auto& c) -> Field { return &c.manager.namespace_; },
     .help = "watch only this namespace",
     .default_text = "every namespace"},
    {.name = "leader-elect",
     .field = [](auto& c) -> Field { return &c.manager.leader_elect; },
     .help = "run the controllers only while holding the Lease (for several replicas)"},
    {.name = "recorder-window-ms",
     .field = [](auto& c) -> Field { return &c.manager.triggers.recorder_window_ms; },
     .help = "How long the sidecars' flight recorders keep annotations (the chart's "
             "sidecar.recorder.windowMs): a ProfileTrigger asking a longer lookback is refused",
     .doc = "how long the sidecars' flight recorders keep annotations (the chart sets it from "
            "`sidecar.recorder.windowMs`): a ProfileTrigger asking a longer "
            "`capture.lookbackMs` is refused"},
    {.name = "sidecar-token-file",
     .field = [](auto& c) -> Field { return &c.manager.jobs.sidecar_token_file; },
     .help = "File with the bearer token the sidecars require (their --auth-token-file); read "
             "for each capture",
     .doc = "a file (a mounted Secret) with the bearer token that sidecars started with "
            "`--auth-token-file` require; read for each capture (and by ProfileTriggers each "
            "time a stream to a sidecar opens), so a rotated token is used"},
    {.name = "sidecar-tls-ca-file",
     .field = [](auto& c) -> Field { return &c.sidecar_tls_ca_file; },
     .help = "Reach the sidecars over TLS, verifying their certificate against this CA file (a "
             "mounted Secret, reread when it changes); without it, plaintext",
     .doc = "reach the sidecars over TLS, verifying their certificate against this CA file (a "
            "mounted Secret, reread when it changes); without it, plaintext, with a warning at "
            "start. A target whose certificate is refused fails with the cause (\"the "
            "certificate of 10.0.0.2:8466 (...) expired at ...\", \"... is not signed by a CA "
            "in ...\", \"... names DNS:x, not clusterprof-sidecar\", \"... answered a TLS "
            "handshake in plaintext\"; without the flag, a sidecar that serves TLS: \"... "
            "serves TLS, and this client spoke plaintext\"), is not retried, and is counted in "
            "`clusterprof_operator_sidecar_refusals_total{reason}` (`certificate_expired`, "
            "`certificate_unknown_ca`, `certificate_wrong_name`, `plaintext_peer`, `tls_peer`, "
            "`tls_other`, `token`)"},
    {.name = "sidecar-tls-server-name",
     .field = [](auto& c) -> Field { return &c.sidecar_tls_server_name; },
     .help = "The name verified in the sidecars' certificate in place of the pod IP (the "
             "chart's sidecar.tls.serverName)",
     .doc = "the name verified in the sidecars' certificate in place of the pod IP (the "
            "chart's `sidecar.tls.serverName`)"},
    {.name = "allowed-logdir",
     .field = [](auto& c) -> Field { return &c.allowed_logdirs; },
     .help = "A logdir prefix ProfileJobs may write under (repeatable); a job whose logdir lies "
             "elsewhere fails before anything is captured or written",
     .doc = "logdir prefixes jobs may write under: a job whose `spec.logdir` lies elsewhere "
            "fails `LogdirNotAllowed` before anything is captured, and the operator writes no "
            "run manifest there (it writes with its own credentials, which may reach more than "
            "the sidecars'). Empty (no flag, no injection config): no check",
     .default_text = "the injection config's `allowed_logdirs`",
     .yaml_key = "allowed_logdirs"},
    {.name = "allow-external-addresses",
     .field = [](auto& c) -> Field { return &c.manager.jobs.allow_external_addresses; },
     .help = "Let spec.targets.addresses name servers that are not pods of the job's namespace "
             "(TF/JAX servers outside the cluster); off, such jobs fail AddressNotAllowed and "
             "nothing is sent to them",
     .doc = "let `spec.targets.addresses` (of ProfileJobs and ProfileTriggers) name servers "
            "that are not pods of the job's namespace: TF/JAX servers outside the cluster. Off, "
            "such a ProfileJob fails `AddressNotAllowed` and nothing is sent to those addresses "
            "(the sidecar token included); a ProfileTrigger does not follow them"},
    {.name = "sidecar-connections",
     .field = [](auto& c) -> Field { return &c.manager.sidecar_connections; },
     .help = "Connections to sidecars the leader keeps across captures, made (TLS handshake "
             "included) as their pods become Ready, so that no capture waits for them (0: each "
             "capture connects anew)",
     .doc = "connections to sidecars the leader keeps across captures: made, TLS handshake "
            "included, as their pods become Running and Ready (and dropped as they go), reused "
            "by every capture and session read, with keepalive pings every 2 minutes while "
            "idle, so that no capture makes a handshake. Beyond the number, warming stops and a "
            "capture's own connections replace the least recently used. Each costs the "
            "operator about 80 KiB with TLS (bench/RESULTS.md, \"TLS to every sidecar\"). 0: "
            "each capture connects anew"},
    {.name = "leader-election-namespace",
     .field = [](auto& c) -> Field { return &c.leader_election_namespace; },
     .help = "namespace of the Lease (default: $POD_NAMESPACE, else clusterprof-system)",
     .doc = "namespace of the Lease",
     .default_text = "`$POD_NAMESPACE`, else `clusterprof-system`"},
    {.name = "leader-election-id",
     .field = [](auto& c) -> Field { return &c.manager.leader_election_id; },
     .help = "name of the Lease"},
    {.name = "leader-election-identity",
     .field = [](auto& c) -> Field { return &c.manager.identity; },
     .help = "this replica's identity in the Lease",
     .default_text = "`<hostname>_<pid>`"},
    {.name = "lease-duration-seconds",
     .field = [](auto& c) -> Field { return settings::Seconds{&c.manager.lease_duration_ns}; },
     .help = "Lease duration"},
    {.name = "renew-deadline-seconds",
     .field = [](auto& c) -> Field { return settings::Seconds{&c.manager.renew_deadline_ns}; },
     .help = "a leader that has not renewed within this steps down"},
    {.name = "retry-period-seconds",
     .field = [](auto& c) -> Field { return settings::Seconds{&c.manager.retry_period_ns}; },
     .help = "how often to try to take or renew the Lease"},
    {.name = "health-address",
     .field = [](auto& c) -> Field { return &c.manager.health_address; },
     .help = "address of /healthz, /readyz and /metrics",
     .doc = "address of `/healthz`, `/readyz` and `/metrics`"},
    {.name = "health-port",
     .field = [](auto& c) -> Field { return &c.manager.health_port; },
     .help = "port of /healthz, /readyz and /metrics (0 picks one, -1 turns them off)",
     .doc = "their port; 0 picks one, -1 turns them off"},
    {.name = "port-file",
     .field = [](auto& c) -> Field { return &c.manager.port_file; },
     .help = "write the bound ports here (http=N, webhook=N) once serving",
     .doc = "once serving, write `http=N` (and `webhook=N`) here (for port 0)"},
    {.name = "webhook-port",
     .field = [](auto& c) -> Field { return &c.manager.webhook.port; },
     .help = "HTTPS port of the sidecar-injection webhook, POST /mutate-pods (0 picks one; -1, "
             "the default, turns it off)",
     .doc = "HTTPS port of the sidecar-injection webhook, `POST /mutate-pods`; the chart uses "
            "9443 (docs/webhook.md)",
     .default_text = "-1 (off)"},
    {.name = "webhook-address",
     .field = [](auto& c) -> Field { return &c.manager.webhook.address; },
     .help = "address of the webhook"},
    {.name = "webhook-cert-dir",
     .field = [](auto& c) -> Field { return &c.manager.webhook.cert_dir; },
     .help = "directory with the webhook's tls.crt and tls.key (re-read when they change)",
     .doc = "`tls.crt` and `tls.key`, re-read when they change"},
    {.name = "injection-config",
     .field = [](auto& c) -> Field { return &c.injection_config; },
     .help = "YAML file with the sidecar-injection settings (docs/webhook.md; default: the "
             "built-in ones)",
     .doc = "YAML with the injection settings (image, native sidecar, ports, resources, token "
            "Secret, logdirs; docs/webhook.md)",
     .default_text = "built-in defaults"},
    {.name = "workers",
     .field = [](auto& c) -> Field { return &c.manager.jobs.workers; },
     .help = "ProfileJob reconcile workers (ProfileSchedules have one)"},
    {.name = "fan-out-lead-ms",
     .field = [](auto& c) -> Field { return &c.manager.jobs.fan_out_lead_ms; },
     .help = "least time between sending the Profile requests and the start instant (T0)"},
    {.name = "retry-backoff-ms",
     .field = [](auto& c) -> Field { return &c.manager.jobs.retry_backoff_ms; },
     .help = "pause before a capture's first retry (doubled after)"},
    {.name = "qps",
     .field = [](auto& c) -> Field { return &c.manager.qps; },
     .help = "API requests per second (client-side token bucket)"},
    {.name = "burst",
     .field = [](auto& c) -> Field { return &c.manager.burst; },
     .help = "API request burst"},
    {.name = "shutdown-grace-seconds",
     .field = [](auto& c) -> Field { return settings::Seconds{&c.manager.shutdown_grace_ns}; },
     .help = "on SIGTERM, how long running captures may take to finish"},
    {.name = "log-format",
     .field = [](auto& c) -> Field { return &c.log_format; },
     .help = "auto, text or json",
     .doc = "`auto`, `text` or `json`"},
    {.name = "log-level",
     .field = [](auto& c) -> Field { return &c.log_level; },
     .help = "trace, debug, info, warn or error",
     .doc = "`trace`, `debug`, `info`, `warn` or `error`"},
};

}  // namespace

OperatorConfig::OperatorConfig() : sidecar_tls_server_name(tls::kDefaultServerName) {}

std::span<const settings::Setting<OperatorConfig>> OperatorSettings() { return kSettings; }

absl::StatusOr<ManagerOptions> ManagerOptionsFrom(const OperatorConfig& config,
                                                  const std::optional<std::string>& pod_namespace) {
  ManagerOptions options = config.manager;
  if (!config.injection_config.empty()) {
    absl::StatusOr<webhook::InjectionConfig> injection =
        webhook::LoadInjectionConfig(config.injection_config);
    if (!injection.ok()) return injection.status();
    options.webhook.injection = *std::move(injection);
  }
  if (!config.sidecar_tls_ca_file.empty()) {
    absl::StatusOr<std::shared_ptr<const tls::ChannelSecurity>> security =
        tls::ChannelSecurity::Tls(config.sidecar_tls_ca_file, config.sidecar_tls_server_name);
    if (!security.ok()) {
      return absl::InvalidArgumentError(
          StrCat("--sidecar-tls-ca-file: ", security.status().message()));
    }
    options.jobs.sidecar_security = *std::move(security);
    spdlog::info(
        "sidecars are reached over TLS, their certificate verified against {} for the name {}",
        config.sidecar_tls_ca_file, config.sidecar_tls_server_name);
  } else {
    spdlog::warn(
        "sidecars are reached in plaintext (no --sidecar-tls-ca-file): their bearer token "
        "crosses the pod network readable");
  }
  const std::vector<std::string>& allowed = config.allowed_logdirs.empty()
                                                ? options.webhook.injection.allowed_logdirs
                                                : config.allowed_logdirs;
  for (const std::string& prefix : allowed) {
    absl::StatusOr<storage::Logdir> logdir = storage::ParseLogdir(prefix);
    if (!logdir.ok()) {
      return absl::InvalidArgumentError(StrCat("--allowed-logdir: ", logdir.status().message()));
    }
    options.jobs.allowed_logdirs.push_back(*std::move(logdir));
  }
  if (!config.leader_election_namespace.empty()) {
    options.leader_election_namespace = config.leader_election_namespace;
  } else if (pod_namespace) {
    options.leader_election_namespace = *pod_namespace;
  }
  return options;
}

}  // namespace clusterprof::manager
