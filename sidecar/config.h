// clusterprof-sidecar's settings: flags, or a YAML file (--config) with the same names in
// snake_case; a flag given on the command line wins over the file. Each is declared once, in
// config.cc's table, which makes the flags, the YAML reader and docs/sidecar.md's table.
#ifndef CLUSTERPROF_SIDECAR_CONFIG_H_
#define CLUSTERPROF_SIDECAR_CONFIG_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/settings/settings.h"

namespace clusterprof::sidecar {

struct SidecarConfig {
  std::string address = "0.0.0.0";
  int port = 8466;
  // /healthz, /readyz, /metrics; -1 turns the HTTP server off.
  int http_port = 8467;
  // Reported in XSpace.hostnames and GetInfo; default: $POD_NAME, else the system host name.
  std::string host_name;
  // Logdir prefixes Profile may write under (repeatable flag; a list in YAML).
  std::vector<std::string> allowed_logdirs;
  // The shared-memory directory; default: $CLUSTERPROF_DIR, else /var/run/clusterprof.
  std::string shm_dir;
  int64_t max_duration_ms = 10 * 60 * 1000;
  // Profile calls served at once (joined ones wait for their capture); more are refused with
  // RESOURCE_EXHAUSTED, so a flood of calls cannot grow the sidecar without bound. 0: no limit.
  int max_profile_calls = 64;
  // Events kept per capture when a request does not say.
  uint64_t max_events = 4'000'000;
  // The flight recorder and live step telemetry (docs/triggers.md). Between captures the
  // workloads' annotations up to recorder_level are recorded all the time: their steps are the
  // live telemetry (/metrics, WatchSteps), and the last recorder_window_ms of them (at most
  // recorder_max_bytes) are kept so a capture can reach back (lookback). Level 0: nothing is
  // recorded between captures; window 0: steps only, no lookback.
  int recorder_level = 2;
  int64_t recorder_window_ms = 30'000;
  uint64_t recorder_max_bytes = uint64_t{64} << 20;
  // What the live telemetry takes for step markers and collectives (the digest's patterns):
  // empty step pattern: events with a step_num stat; empty collective pattern: the default.
  std::string step_pattern;
  std::string collective_pattern;
  std::string log_format = "text";
  std::string log_level = "info";
  // When set, the bound ports are written here as `grpc=<port>` and `http=<port>` lines once the
  // servers listen (for scripts and tests that ask for port 0).
  std::string port_file;
  // Where files bound for gs:// wait until they are uploaded and verified; default:
  // $CLUSTERPROF_SPOOL_DIR, else /var/lib/clusterprof/spool. Use a volume that outlives the
  // container (an emptyDir), so a restarted sidecar finishes what its predecessor spooled.
  std::string spool_dir;
  uint64_t spool_max_bytes = uint64_t{8} << 30;
  // How long a Profile request waits for its gs:// uploads before answering; they go on
  // in the background after that (GetSession follows them).
  int64_t upload_wait_ms = 120'000;
  // GPU tracing: CUDA processes that load libclusterprof_cupti, and NVML counters.
  bool gpu = true;
  // How long a capture's stop waits for each CUDA process to hand over its last GPU records.
  int64_t gpu_flush_timeout_ms = 3000;
  // The NVML library for GPU counters (loaded at run time; absent: no counters).
  std::string nvml_library = "libnvidia-ml.so.1";
  // The workload's own TF/JAX profiler server (host:port) that captures are forwarded to; empty:
  // none.
  std::string framework_profiler;
  // How long after a capture's end the framework's answer is awaited.
  int64_t framework_grace_ms = 30'000;
  // A file holding the bearer token every gRPC call must carry (a mounted Secret); empty: no
  // token required (TF/JAX clients send none).
  std::string auth_token_file;
  // With a token: calls from the pod's own loopback (127.0.0.0/8, ::1) need none. That is where
  // `kubectl port-forward` arrives, which Kubernetes RBAC already guards (pods/portforward), so
  // XProf's capture button and jax.collect_profile, which send no token, can reach the sidecar
  // that way. The pod's other containers share that loopback too.
  bool allow_loopback_without_token = false;
  // After the token file changes, the token it held before is still accepted this long, so
  // that clients that read the old one (a capture under way, an operator whose copy of the
  // Secret is updated later than the sidecar's) are not refused. 0: at once.
  int64_t token_grace_seconds = 300;
  // TLS on the gRPC port (docs/security.md): a PEM certificate and its key (a mounted Secret,
  // reread when it changes). Both or neither. With TLS the port also takes plaintext on the
  // pod's loopback (127.0.0.1 and ::1, the same port number), where kubectl port-forward
  // arrives, so XProf and JAX clients, which speak plaintext, still reach the sidecar that way.
  std::string tls_cert_file;
  std::string tls_key_file;
  // How long a connection may take to finish its handshakes (TLS, then HTTP/2's) before it is
  // closed, so that connections that never finish cannot pile up.
  int64_t handshake_timeout_ms = 10'000;
  // Connections to the gRPC port kept open at once, per peer address and in all; the newest
  // beyond either are closed (sidecar/connection_guard.h). 0: no limit.
  int max_connections_per_peer = 64;
  int max_connections = 512;
  // A copy of the GPU tracing library (libclusterprof_cupti.so) to place in shm_dir at start,
  // where the pod's CUDA processes load it (CUDA_INJECTION64_PATH, set by the injection
  // webhook); empty: none.
  std::string install_injection_library;
  // How a capture meets its start instant when the workloads keep every CPU busy
  // (bench/RESULTS.md, "start instant under load"). The capture thread waits under SCHED_FIFO
  // where the sidecar may (CAP_SYS_NICE in its container; refused: it says so once and waits in
  // the normal class), and spins on the clock for the last start_spin_us before the instant.
  bool start_realtime = true;
  int64_t start_spin_us = 0;
};

// Every setting: its flag, YAML key, help and docs.
std::span<const settings::Setting<SidecarConfig>> SidecarSettings();

// Reads a YAML mapping into `config`, keeping what the file does not set. Unknown keys and
// values of the wrong type are errors that name the key and the file.
absl::Status LoadSidecarConfigFile(const std::string& path, SidecarConfig* config);

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_CONFIG_H_
