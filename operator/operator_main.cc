// clusterprof-operator: runs the ProfileJob and ProfileSchedule controllers (docs/operator.md).
#include <signal.h>

#include <atomic>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "common/base/clock.h"
#include "common/base/env.h"
#include "common/base/logging.h"
#include "common/base/process.h"
#include "common/grpc/log_bridge.h"
#include "common/grpc/tls.h"
#include "common/storage/logdir.h"
#include "operator/kube/config.h"
#include "operator/manager/manager.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  // Many threads and a large pod cache: see common/base/process.h.
  clusterprof::ApplyProcessSettings({.malloc_arenas = 2});
  using clusterprof::kNanosPerMilli;
  using clusterprof::kNanosPerSecond;
  CLI::App app{
      "clusterprof-operator: synchronized profiling captures across the pods a ProfileJob "
      "selects, and ProfileSchedules that repeat them"};
  app.set_version_flag("--version", std::string("clusterprof-operator ") + CLUSTERPROF_VERSION);
  clusterprof::manager::ManagerOptions options;
  std::string kubeconfig, context, log_format = "auto", log_level = "info";
  double lease_s = 15, renew_s = 10, retry_s = 2, shutdown_grace_s = 25;
  app.add_option("--kubeconfig", kubeconfig,
                 "kubeconfig file (default: in-cluster config, else $KUBECONFIG, else "
                 "~/.kube/config)");
  app.add_option("--context", context, "kubeconfig context (default: the current one)");
  app.add_option("--namespace", options.namespace_,
                 "watch only this namespace (default: every namespace)");
  app.add_flag("--leader-elect", options.leader_elect,
               "run controllers only while holding the Lease (for several replicas)");
  app.add_option("--leader-election-namespace", options.leader_election_namespace,
                 "namespace of the Lease (default: $POD_NAMESPACE, else clusterprof-system)");
  app.add_option("--leader-election-id", options.leader_election_id, "name of the Lease")
      ->capture_default_str();
  app.add_option("--leader-election-identity", options.identity,
                 "this replica's identity in the Lease (default: <hostname>_<pid>)");
  app.add_option("--lease-duration-seconds", lease_s)->capture_default_str();
  app.add_option("--renew-deadline-seconds", renew_s)->capture_default_str();
  app.add_option("--retry-period-seconds", retry_s)->capture_default_str();
  app.add_option("--health-address", options.health_address,
                 "address of /healthz, /readyz and /metrics")
      ->capture_default_str();
  app.add_option("--health-port", options.health_port,
                 "port of /healthz, /readyz and /metrics (0 picks one, -1 turns them off)")
      ->capture_default_str();
  app.add_option("--port-file", options.port_file,
                 "write the bound health port here (http=N) once serving");
  app.add_option("--workers", options.jobs.workers, "ProfileJob reconcile workers")
      ->capture_default_str();
  app.add_option("--sidecar-token-file", options.jobs.sidecar_token_file,
                 "File with the bearer token the sidecars require (their --auth-token-file); "
                 "read for each capture");
  std::vector<std::string> allowed_logdirs;
  app.add_option("--allowed-logdir", allowed_logdirs,
                 "A logdir prefix ProfileJobs may write under (repeatable; default: the "
                 "injection config's allowed_logdirs, the sidecars' own); a job whose logdir "
                 "lies elsewhere fails before anything is captured or written")
      ->take_all();
  app.add_flag("--allow-external-addresses", options.jobs.allow_external_addresses,
               "Let spec.targets.addresses name servers that are not pods of the job's "
               "namespace (TF/JAX servers outside the cluster); off, such jobs fail "
               "AddressNotAllowed and nothing is sent to them");
  app.add_option("--sidecar-connections", options.sidecar_connections,
                 "Connections to sidecars the leader keeps across captures, made (TLS handshake "
                 "included) as their pods become Ready, so that no capture waits for them (0: "
                 "each capture connects anew)")
      ->capture_default_str();
  std::string sidecar_tls_ca_file;
  std::string sidecar_tls_server_name = clusterprof::tls::kDefaultServerName;
  app.add_option("--sidecar-tls-ca-file", sidecar_tls_ca_file,
                 "Reach the sidecars over TLS, verifying their certificate against this CA file "
                 "(a mounted Secret, reread when it changes); without it, plaintext");
  app.add_option("--sidecar-tls-server-name", sidecar_tls_server_name,
                 "The name verified in the sidecars' certificate in place of the pod IP (the "
                 "chart's sidecar.tls.serverName)")
      ->capture_default_str();
  app.add_option("--recorder-window-ms", options.triggers.recorder_window_ms,
                 "How long the sidecars' flight recorders keep annotations (the chart's "
                 "sidecar.recorder.windowMs): a ProfileTrigger asking a longer lookback is refused")
      ->capture_default_str();
  std::string injection_config;
  app.add_option("--webhook-port", options.webhook.port,
                 "HTTPS port of the sidecar-injection webhook, POST /mutate-pods (0 picks one; -1, "
                 "the default, turns it off)")
      ->capture_default_str();
  app.add_option("--webhook-address", options.webhook.address, "address of the webhook")
      ->capture_default_str();
  app.add_option("--webhook-cert-dir", options.webhook.cert_dir,
                 "directory with the webhook's tls.crt and tls.key (re-read when they change)")
      ->capture_default_str();
  app.add_option("--injection-config", injection_config,
                 "YAML file with the sidecar-injection settings (docs/webhook.md; default: the "
                 "built-in ones)");
  app.add_option("--fan-out-lead-ms", options.jobs.fan_out_lead_ms,
                 "least time between sending Profile requests and the start instant")
      ->capture_default_str();
  app.add_option("--retry-backoff-ms", options.jobs.retry_backoff_ms,
                 "pause before a capture's first retry (doubles after)")
      ->capture_default_str();
  app.add_option("--qps", options.qps, "API requests per second (client-side limit)")
      ->capture_default_str();
  app.add_option("--burst", options.burst, "API request burst")->capture_default_str();
  app.add_option("--shutdown-grace-seconds", shutdown_grace_s,
                 "on SIGTERM, how long running captures may take to finish")
      ->capture_default_str();
  app.add_option("--log-format", log_format, "auto, text or json")->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<clusterprof::LogFormat> format = clusterprof::ParseLogFormat(log_format);
  absl::Status logging =
      format.ok() ? clusterprof::InitLogging(*format, log_level) : format.status();
  if (!logging.ok()) {
    std::cerr << "clusterprof-operator: " << logging.message() << "\n";
    return 2;
  }
  if (!injection_config.empty()) {
    absl::StatusOr<clusterprof::webhook::InjectionConfig> injection =
        clusterprof::webhook::LoadInjectionConfig(injection_config);
    if (!injection.ok()) {
      spdlog::error("{}", std::string(injection.status().message()));
      return 2;
    }
    options.webhook.injection = *std::move(injection);
  }
  // gRPC's own lines (a sidecar's refused certificate, as its client sees it) into our log,
  // rate-limited.
  clusterprof::grpclog::LogBridge grpc_log({});
  (void)grpc_log.Install();
  if (!sidecar_tls_ca_file.empty()) {
    absl::StatusOr<std::shared_ptr<const clusterprof::tls::ChannelSecurity>> security =
        clusterprof::tls::ChannelSecurity::Tls(sidecar_tls_ca_file, sidecar_tls_server_name);
    if (!security.ok()) {
      spdlog::error("--sidecar-tls-ca-file: {}", std::string(security.status().message()));
      return 2;
    }
    options.jobs.sidecar_security = *std::move(security);
    spdlog::info(
        "sidecars are reached over TLS, their certificate verified against {} for the "
        "name {}",
        sidecar_tls_ca_file, sidecar_tls_server_name);
  } else {
    spdlog::warn(
        "sidecars are reached in plaintext (no --sidecar-tls-ca-file): their bearer token "
        "crosses the pod network readable");
  }
  if (allowed_logdirs.empty()) allowed_logdirs = options.webhook.injection.allowed_logdirs;
  for (const std::string& prefix : allowed_logdirs) {
    absl::StatusOr<clusterprof::storage::Logdir> logdir = clusterprof::storage::ParseLogdir(prefix);
    if (!logdir.ok()) {
      spdlog::error("--allowed-logdir: {}", std::string(logdir.status().message()));
      return 2;
    }
    options.jobs.allowed_logdirs.push_back(*std::move(logdir));
  }
  options.lease_duration_ns = static_cast<int64_t>(lease_s * kNanosPerSecond);
  options.renew_deadline_ns = static_cast<int64_t>(renew_s * kNanosPerSecond);
  options.retry_period_ns = static_cast<int64_t>(retry_s * kNanosPerSecond);
  options.shutdown_grace_ns = static_cast<int64_t>(shutdown_grace_s * kNanosPerSecond);
  if (app.count("--leader-election-namespace") == 0) {
    if (std::optional<std::string> ns = clusterprof::GetEnv("POD_NAMESPACE")) {
      options.leader_election_namespace = *ns;
    }
  }

  // Signals are taken by sigwait below; every thread started from here on inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  clusterprof::RealClock clock;
  clusterprof::kube::KubeconfigOptions kubeconfig_options;
  if (!kubeconfig.empty()) kubeconfig_options.paths = {kubeconfig};
  kubeconfig_options.context = context;
  absl::StatusOr<clusterprof::kube::RestConfig> config = clusterprof::kube::LoadDefaultConfig(
      kubeconfig_options, clusterprof::kube::ProcessEnvironment(), {}, &clock);
  if (!config.ok()) {
    spdlog::error("no Kubernetes API access: {}", std::string(config.status().message()));
    return 1;
  }
  options.rest_config = *std::move(config);

  std::atomic<bool> stop{false};
  std::atomic<bool> finished{false};
  std::thread signal_thread([&] {
    int signal = 0;
    sigwait(&signals, &signal);
    if (finished) return;  // woken by main() below
    spdlog::info("received {}; shutting down", signal == SIGTERM ? "SIGTERM" : "SIGINT");
    stop = true;
    clock.Wake();
  });

  // RunManager returns once every thread it started is joined: running captures were given the
  // shutdown grace, then cancelled (the sidecars finish them; the next operator reads them back).
  absl::Status status = clusterprof::manager::RunManager(options, clock, stop);
  finished = true;
  if (!stop) pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  if (!status.ok()) spdlog::error("{}", std::string(status.message()));
  spdlog::default_logger()->flush();
  return status.ok() ? 0 : 1;
}
