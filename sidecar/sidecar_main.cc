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
  using clusterprof::sidecar::SidecarConfig;
  CLI::App app{
      "clusterprof-sidecar: a profiler server (the TensorFlow/JAX ProfilerService protocol) that "
      "captures the annotations of the processes beside it"};
  app.set_version_flag("--version", std::string("clusterprof-sidecar ") + CLUSTERPROF_VERSION);
  SidecarConfig flags;
  std::string config_file;
  app.add_option("--config", config_file,
                 "YAML file with these settings in snake_case (flags given here win)");
  app.add_option("--address", flags.address, "Address to bind")->capture_default_str();
  app.add_option("--port", flags.port, "gRPC port (0 picks a free one)")->capture_default_str();
  app.add_option("--http-port", flags.http_port,
                 "Port of /healthz, /readyz and /metrics (0 picks one, -1 turns it off)")
      ->capture_default_str();
  app.add_option("--host-name", flags.host_name,
                 "Host name in traces (default: $POD_NAME, else the system host name)");
  app.add_option("--allowed-logdir", flags.allowed_logdirs,
                 "A logdir prefix Profile may write under (repeatable); requests for other "
                 "places are refused")
      ->take_all();
  app.add_option("--shm-dir", flags.shm_dir,
                 "Shared-memory directory of the workloads (default: $CLUSTERPROF_DIR, else "
                 "/var/run/clusterprof)");
  app.add_option("--max-duration-ms", flags.max_duration_ms, "Longest capture accepted")
      ->capture_default_str();
  app.add_option("--max-profile-calls", flags.max_profile_calls,
                 "Profile calls served at once (joined ones wait for their capture); more are "
                 "refused with RESOURCE_EXHAUSTED (0: no limit)")
      ->capture_default_str();
  app.add_option("--max-events", flags.max_events,
                 "Events kept per capture when the request does not say")
      ->capture_default_str();
  app.add_option("--recorder-level", flags.recorder_level,
                 "Host level recorded between captures, for live steps and lookback (0: none)")
      ->capture_default_str();
  app.add_option("--recorder-window-ms", flags.recorder_window_ms,
                 "How long the flight recorder keeps annotations for a capture's lookback (0: "
                 "none kept)")
      ->capture_default_str();
  app.add_option("--recorder-max-bytes", flags.recorder_max_bytes,
                 "Most memory the flight recorder's annotations take (64 bytes each)")
      ->capture_default_str();
  app.add_option("--step-pattern", flags.step_pattern,
                 "Live steps: step markers are events named like this (default: events with a "
                 "step_num stat)");
  app.add_option("--collective-pattern", flags.collective_pattern,
                 "Live steps: collectives are events named like this (default: NCCL, XLA and "
                 "common all-reduce names)");
  app.add_option("--log-format", flags.log_format, "text or json")->capture_default_str();
  app.add_option("--log-level", flags.log_level, "trace, debug, info, warn or error")
      ->capture_default_str();
  app.add_option("--port-file", flags.port_file,
                 "Write the bound ports here (grpc=N, http=N lines) once serving");
  app.add_option("--spool-dir", flags.spool_dir,
                 "Where files bound for gs:// wait until uploaded and verified (default: "
                 "$CLUSTERPROF_SPOOL_DIR, else /var/lib/clusterprof/spool); put it on a volume "
                 "that outlives the container");
  app.add_option("--spool-max-bytes", flags.spool_max_bytes,
                 "Cap on the spool's size; captures that do not fit are refused")
      ->capture_default_str();
  app.add_option("--upload-wait-ms", flags.upload_wait_ms,
                 "How long a Profile request waits for its uploads before answering (they go "
                 "on in the background)")
      ->capture_default_str();
  app.add_flag("--gpu,!--no-gpu", flags.gpu,
               "Trace the GPU activity of CUDA processes that load libclusterprof_cupti "
               "(CUDA_INJECTION64_PATH), with NVML counters")
      ->capture_default_str();
  app.add_option("--gpu-flush-timeout-ms", flags.gpu_flush_timeout_ms,
                 "How long a capture's stop waits for each CUDA process's last GPU records")
      ->capture_default_str();
  app.add_option("--nvml-library", flags.nvml_library,
                 "NVML library for GPU utilization, memory, power and clock counters")
      ->capture_default_str();
  app.add_option("--framework-profiler", flags.framework_profiler,
                 "host:port of the workload's TF/JAX profiler server (jax.profiler.start_server, "
                 "tf.profiler.experimental.server.start): captures are forwarded to it and its "
                 "trace merged");
  app.add_option("--framework-grace-ms", flags.framework_grace_ms,
                 "How long after a capture's end the framework profiler's answer is awaited")
      ->capture_default_str();
  app.add_option("--auth-token-file", flags.auth_token_file,
                 "Require every gRPC call to carry \"authorization: Bearer <token>\" with the "
                 "token in this file (a mounted Secret, re-read when it changes)");
  app.add_flag("--allow-loopback-without-token", flags.allow_loopback_without_token,
               "With --auth-token-file: calls from the pod's loopback (kubectl port-forward, "
               "XProf's capture button through it) need no token");
  app.add_option("--token-grace-seconds", flags.token_grace_seconds,
                 "After the token file changes, the previous token is still accepted this long")
      ->capture_default_str();
  app.add_option("--tls-cert-file", flags.tls_cert_file,
                 "Serve TLS on --port with this PEM certificate (a mounted Secret, reread when "
                 "it changes); plaintext is then served on the pod's loopback only (127.0.0.1 "
                 "and ::1, same port: kubectl port-forward)");
  app.add_option("--tls-key-file", flags.tls_key_file, "The PEM key of --tls-cert-file");
  app.add_option("--handshake-timeout-ms", flags.handshake_timeout_ms,
                 "Connections that have not finished their handshakes by then are closed")
      ->capture_default_str();
  app.add_option("--max-connections-per-peer", flags.max_connections_per_peer,
                 "gRPC connections kept open per peer address; the newest beyond are closed (0: "
                 "no limit)")
      ->capture_default_str();
  app.add_option("--max-connections", flags.max_connections,
                 "gRPC connections kept open in all; the newest beyond are closed (0: no limit)")
      ->capture_default_str();
  app.add_option("--install-injection-library", flags.install_injection_library,
                 "Copy this libclusterprof_cupti.so into the shared-memory directory at start, "
                 "for the pod's CUDA processes to load (CUDA_INJECTION64_PATH)");
  app.add_flag("--start-realtime,!--no-start-realtime", flags.start_realtime,
               "Wait for a capture's start instant under SCHED_FIFO where permitted "
               "(CAP_SYS_NICE), so busy workloads cannot delay the start by a scheduler tick")
      ->capture_default_str();
  app.add_option("--start-spin-us", flags.start_spin_us,
                 "Spin on the clock for this long before a start instant instead of sleeping to "
                 "it (costs as much CPU per capture; 0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{10'000}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  SidecarConfig config;
  if (!config_file.empty()) {
    if (absl::Status status = clusterprof::sidecar::LoadSidecarConfigFile(config_file, &config);
        !status.ok()) {
      std::cerr << "clusterprof-sidecar: " << status.message() << "\n";
      return 2;
    }
  }
  // Flags given on the command line override the file.
  auto given = [&app](const char* name) { return app.count(name) > 0; };
  if (given("--address")) config.address = flags.address;
  if (given("--port")) config.port = flags.port;
  if (given("--http-port")) config.http_port = flags.http_port;
  if (given("--host-name")) config.host_name = flags.host_name;
  if (given("--allowed-logdir")) config.allowed_logdirs = flags.allowed_logdirs;
  if (given("--shm-dir")) config.shm_dir = flags.shm_dir;
  if (given("--max-duration-ms")) config.max_duration_ms = flags.max_duration_ms;
  if (given("--max-profile-calls")) config.max_profile_calls = flags.max_profile_calls;
  if (given("--max-events")) config.max_events = flags.max_events;
  if (given("--recorder-level")) config.recorder_level = flags.recorder_level;
  if (given("--recorder-window-ms")) config.recorder_window_ms = flags.recorder_window_ms;
  if (given("--recorder-max-bytes")) config.recorder_max_bytes = flags.recorder_max_bytes;
  if (given("--step-pattern")) config.step_pattern = flags.step_pattern;
  if (given("--collective-pattern")) config.collective_pattern = flags.collective_pattern;
  if (given("--log-format")) config.log_format = flags.log_format;
  if (given("--log-level")) config.log_level = flags.log_level;
  if (given("--port-file")) config.port_file = flags.port_file;
  if (given("--spool-dir")) config.spool_dir = flags.spool_dir;
  if (given("--spool-max-bytes")) config.spool_max_bytes = flags.spool_max_bytes;
  if (given("--upload-wait-ms")) config.upload_wait_ms = flags.upload_wait_ms;
  if (given("--gpu") || given("--no-gpu")) config.gpu = flags.gpu;
  if (given("--gpu-flush-timeout-ms")) config.gpu_flush_timeout_ms = flags.gpu_flush_timeout_ms;
  if (given("--nvml-library")) config.nvml_library = flags.nvml_library;
  if (given("--framework-profiler")) config.framework_profiler = flags.framework_profiler;
  if (given("--framework-grace-ms")) config.framework_grace_ms = flags.framework_grace_ms;
  if (given("--auth-token-file")) config.auth_token_file = flags.auth_token_file;
  if (given("--allow-loopback-without-token")) {
    config.allow_loopback_without_token = flags.allow_loopback_without_token;
  }
  if (given("--token-grace-seconds")) config.token_grace_seconds = flags.token_grace_seconds;
  if (given("--tls-cert-file")) config.tls_cert_file = flags.tls_cert_file;
  if (given("--tls-key-file")) config.tls_key_file = flags.tls_key_file;
  if (given("--handshake-timeout-ms")) config.handshake_timeout_ms = flags.handshake_timeout_ms;
  if (given("--max-connections-per-peer")) {
    config.max_connections_per_peer = flags.max_connections_per_peer;
  }
  if (given("--max-connections")) config.max_connections = flags.max_connections;
  if (given("--install-injection-library")) {
    config.install_injection_library = flags.install_injection_library;
  }
  if (given("--start-realtime") || given("--no-start-realtime")) {
    config.start_realtime = flags.start_realtime;
  }
  if (given("--start-spin-us")) config.start_spin_us = flags.start_spin_us;

  absl::StatusOr<clusterprof::LogFormat> format = clusterprof::ParseLogFormat(config.log_format);
  absl::Status logging =
      format.ok() ? clusterprof::InitLogging(*format, config.log_level) : format.status();
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

  if (config.start_spin_us < 0 || config.start_spin_us > 10'000) {
    std::cerr << "clusterprof-sidecar: start_spin_us is " << config.start_spin_us
              << "; it must be between 0 and 10000 (10 ms)\n";
    return 2;
  }
  clusterprof::RealClock::StartOptions start_options;
  start_options.spin_ns = config.start_spin_us * clusterprof::kNanosPerMicro;
  if (config.start_realtime) {
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
  auto server = clusterprof::sidecar::SidecarServer::Start(config, clock);
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
