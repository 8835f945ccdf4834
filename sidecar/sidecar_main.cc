// clusterprof-sidecar: serves tensorflow.ProfilerService and clusterprof.v1alpha1.Sidecar next to
// a workload and captures its annotations (docs/sidecar.md).
#include <signal.h>

#include <iostream>

#include "CLI/CLI.hpp"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/base/process.h"
#include "pplx/threadpool.h"
#include "sidecar/config.h"
#include "sidecar/server.h"
#include "sidecar/supervisor.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  // --supervise (what the webhook injects): this process only keeps the sidecar running
  // (sidecar/supervisor.h), so that a sidecar that fails never stops its container.
  if (auto command = clusterprof::sidecar::SupervisedCommand(argc, argv)) {
    absl::StatusOr<clusterprof::LogFormat> format =
        clusterprof::ParseLogFormat(clusterprof::sidecar::LogFormatArgument(*command));
    (void)clusterprof::InitLogging(format.ok() ? *format : clusterprof::LogFormat::kText, "info");
    clusterprof::sidecar::SupervisorOptions options;
    options.log = [](const std::string& line) { spdlog::warn("{}", line); };
    return clusterprof::sidecar::RunSupervised(*command, options);
  }
  clusterprof::ApplyProcessSettings();
  // cpprestsdk's HTTP clients (gs:// uploads) run on its thread pool, 40 threads by default; our
  // callers block on them from threads of their own, so 2 do: a 1 GiB upload then holds half the
  // memory, with fewer handoffs between threads (bench/RESULTS.md).
  crossplat::threadpool::initialize_with_threads(2);
  CLI::App app{
      "clusterprof-sidecar: a profiler server (the TensorFlow/JAX ProfilerService protocol) that "
      "captures the annotations of the processes beside it"};
  app.set_version_flag("--version", std::string("clusterprof-sidecar ") + CLUSTERPROF_VERSION);
  app.name("clusterprof-sidecar");
  clusterprof::settings::CommandLine<clusterprof::sidecar::SidecarConfig> command_line(
      &app, clusterprof::sidecar::SidecarSettings(), {.config_file = true});
  int exit_code = 0;
  const std::optional<clusterprof::sidecar::SidecarConfig> config =
      command_line.Parse(argc, argv, &exit_code);
  if (!config) return exit_code;

  absl::StatusOr<clusterprof::LogFormat> format = clusterprof::ParseLogFormat(config->log_format);
  absl::Status logging =
      format.ok() ? clusterprof::InitLogging(*format, config->log_level) : format.status();
  if (!logging.ok()) {
    std::cerr << "clusterprof-sidecar: " << logging.message() << "\n";
    return 2;
  }

  // Signals are taken by sigwait below; every thread started from here on inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  clusterprof::RealClock::StartOptions start_options;
  start_options.spin_ns = config->start_spin_us * clusterprof::kNanosPerMicro;
  if (config->start_realtime) {
    if (absl::Status realtime = clusterprof::RealClock::CheckRealtimePermitted(); realtime.ok()) {
      start_options.realtime = true;
      spdlog::info("start instants: captures wait for their start under SCHED_FIFO");
    } else {
      spdlog::warn(
          "start instants: {}; captures wait for their start in the normal scheduling "
          "class and may start a scheduler tick (about 4 ms) late when the workloads "
          "keep every CPU busy (--no-start-realtime silences this)",
          std::string(realtime.message()));
    }
  }
  clusterprof::RealClock clock(start_options);
  auto server = clusterprof::sidecar::SidecarServer::Start(*config, clock);
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().message()));
    return 1;
  }
  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("received {}; shutting down", signal == SIGTERM ? "SIGTERM" : "SIGINT");
  (*server)->Shutdown();
  return 0;
}
