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
#include "operator/kube/config.h"
#include "operator/manager/manager.h"
#include "operator/manager/operator_config.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  // Many threads and a large pod cache: see common/base/process.h.
  clusterprof::ApplyProcessSettings({.malloc_arenas = 2});
  CLI::App app{
      "clusterprof-operator: synchronized profiling captures across the pods a ProfileJob "
      "selects, and ProfileSchedules that repeat them"};
  app.set_version_flag("--version", std::string("clusterprof-operator ") + CLUSTERPROF_VERSION);
  app.name("clusterprof-operator");
  clusterprof::settings::CommandLine<clusterprof::manager::OperatorConfig> command_line(
      &app, clusterprof::manager::OperatorSettings(), {.config_file = true});
  int exit_code = 0;
  const std::optional<clusterprof::manager::OperatorConfig> settings =
      command_line.Parse(argc, argv, &exit_code);
  if (!settings) return exit_code;
  absl::StatusOr<clusterprof::LogFormat> format = clusterprof::ParseLogFormat(settings->log_format);
  absl::Status logging =
      format.ok() ? clusterprof::InitLogging(*format, settings->log_level) : format.status();
  if (!logging.ok()) {
    std::cerr << "clusterprof-operator: " << logging.message() << "\n";
    return 2;
  }
  // gRPC's own lines (a sidecar's refused certificate, as its client sees it) into our log,
  // rate-limited.
  clusterprof::grpclog::LogBridge grpc_log({});
  (void)grpc_log.Install();
  absl::StatusOr<clusterprof::manager::ManagerOptions> manager_options =
      clusterprof::manager::ManagerOptionsFrom(*settings, clusterprof::GetEnv("POD_NAMESPACE"));
  if (!manager_options.ok()) {
    spdlog::error("{}", std::string(manager_options.status().message()));
    return 2;
  }
  clusterprof::manager::ManagerOptions& options = *manager_options;

  // Signals are taken by sigwait below; every thread started from here on inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  clusterprof::RealClock clock;
  clusterprof::kube::KubeconfigOptions kubeconfig_options;
  if (!settings->kubeconfig.empty()) kubeconfig_options.paths = {settings->kubeconfig};
  kubeconfig_options.context = settings->context;
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
