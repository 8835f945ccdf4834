#include "sidecar/config.h"

namespace clusterprof::sidecar {
namespace {

using settings::Field;
using Setting = settings::Setting<SidecarConfig>;

// Every setting of clusterprof-sidecar, in the order --help and docs/sidecar.md list them.
constexpr Setting kSettings[] = {
    {.name = "address",
     .field = [](auto& c) -> Field { return &c.address; },
     .help = "Address to bind (gRPC and HTTP)"},
    {.name = "port",
     .field = [](auto& c) -> Field { return &c.port; },
     .help = "gRPC port (0 picks a free one)"},
    {.name = "http-port",
     .field = [](auto& c) -> Field { return &c.http_port; },
     .help = "Port of /healthz, /readyz and /metrics (0 picks one, -1 turns it off)",
     .doc = "`/healthz`, `/readyz`, `/metrics`; 0 picks one, -1 turns it off"},
    {.name = "host-name",
     .field = [](auto& c) -> Field { return &c.host_name; },
     .help = "Host name in traces (default: $POD_NAME, else the system host name)",
     .doc = "the host in `XSpace.hostnames` and file names, when the request names none",
     .default_text = "`$POD_NAME`, else the host name"},
    {.name = "allowed-logdir",
     .field = [](auto& c) -> Field { return &c.allowed_logdirs; },
     .help = "A logdir prefix Profile may write under (repeatable); requests for other places "
             "are refused",
     .doc = "logdir prefixes Profile may write under; requests for other places are refused",
     .yaml_key = "allowed_logdirs"},
    {.name = "shm-dir",
     .field = [](auto& c) -> Field { return &c.shm_dir; },
     .help = "Shared-memory directory of the workloads (default: $CLUSTERPROF_DIR, else "
             "/var/run/clusterprof)",
     .doc = "shared-memory directory of the workloads",
     .default_text = "`$CLUSTERPROF_DIR`, else `/var/run/clusterprof`"},
    {.name = "max-duration-ms",
     .field = [](auto& c) -> Field { return &c.max_duration_ms; },
     .help = "Longest capture accepted"},
    {.name = "max-profile-calls",
     .field = [](auto& c) -> Field { return &c.max_profile_calls; },
     .help = "Profile calls served at once (joined ones wait for their capture); more are "
             "refused with RESOURCE_EXHAUSTED (0: no limit)",
     .doc = "Profile calls served at once (see \"Many calls at once\"); more are "
            "RESOURCE_EXHAUSTED; 0: no limit"},
    {.name = "max-events",
     .field = [](auto& c) -> Field { return &c.max_events; },
     .help = "Events kept per capture when the request does not say",
     .doc = "events kept per capture when the request's `max_events` is 0"},
    {.name = "recorder-level",
     .field = [](auto& c) -> Field { return &c.recorder_level; },
     .help = "Host level recorded between captures, for live steps and lookback (0: none)",
     .doc = "the host level armed between captures: the flight recorder and the live step "
            "telemetry (docs/triggers.md); 0 arms nothing between captures"},
    {.name = "recorder-window-ms",
     .field = [](auto& c) -> Field { return &c.recorder_window_ms; },
     .help = "How long the flight recorder keeps annotations for a capture's lookback (0: none "
             "kept)",
     .doc = "how long the flight recorder keeps annotations for a capture's lookback "
            "(`clusterprof_lookback_ms`); 0 keeps none (live steps still work)"},
    {.name = "recorder-max-bytes",
     .field = [](auto& c) -> Field { return &c.recorder_max_bytes; },
     .help = "Most memory the flight recorder's annotations take (64 bytes each)",
     .doc = "most memory the kept annotations take (64 bytes each); the oldest go first"},
    {.name = "step-pattern",
     .field = [](auto& c) -> Field { return &c.step_pattern; },
     .help = "Live steps: step markers are events named like this (default: events with a "
             "step_num stat)",
     .doc = "what the live telemetry takes for step markers (a regular expression on event "
            "names)",
     .default_text = "events with a `step_num`"},
    {.name = "collective-pattern",
     .field = [](auto& c) -> Field { return &c.collective_pattern; },
     .help = "Live steps: collectives are events named like this (default: NCCL, XLA and "
             "common all-reduce names)",
     .doc = "what it takes for collectives",
     .default_text = "the digest's"},
    {.name = "log-format",
     .field = [](auto& c) -> Field { return &c.log_format; },
     .help = "text or json",
     .doc = "`text` or `json` (one object per line)"},
    {.name = "log-level",
     .field = [](auto& c) -> Field { return &c.log_level; },
     .help = "trace, debug, info, warn or error",
     .doc = "`trace`, `debug`, `info`, `warn` or `error`"},
    {.name = "port-file",
     .field = [](auto& c) -> Field { return &c.port_file; },
     .help = "Write the bound ports here (grpc=N, http=N lines) once serving",
     .doc = "once listening, write `grpc=N` and `http=N` lines here (for port 0)"},
    {.name = "spool-dir",
     .field = [](auto& c) -> Field { return &c.spool_dir; },
     .help = "Where files bound for gs:// wait until uploaded and verified; put it on a volume "
             "that outlives the container (an emptyDir)",
     .doc = "where files bound for `gs://` wait until uploaded and verified; put it on a volume "
            "that outlives the container (an `emptyDir`)",
     .default_text = "`$CLUSTERPROF_SPOOL_DIR`, else `/var/lib/clusterprof/spool`"},
    {.name = "spool-max-bytes",
     .field = [](auto& c) -> Field { return &c.spool_max_bytes; },
     .help = "Cap on the spool's size; captures that do not fit are refused",
     .doc = "cap on the spool; a capture that does not fit fails with a clear error (files "
            "already spooled are kept)"},
    {.name = "upload-wait-ms",
     .field = [](auto& c) -> Field { return &c.upload_wait_ms; },
     .help = "How long a Profile request waits for its uploads before answering (they go on "
             "in the background)"},
    {.name = "gpu",
     .field = [](auto& c) -> Field { return &c.gpu; },
     .help = "Trace the GPU activity of CUDA processes that load libclusterprof_cupti "
             "(CUDA_INJECTION64_PATH), with NVML counters",
     .doc = "GPU tracing: the CUDA processes that load libclusterprof_cupti, and NVML counters "
            "(`docs/gpu.md`)",
     .negatable = true},
    {.name = "gpu-flush-timeout-ms",
     .field = [](auto& c) -> Field { return &c.gpu_flush_timeout_ms; },
     .help = "How long a capture's stop waits for each CUDA process's last GPU records"},
    {.name = "nvml-library",
     .field = [](auto& c) -> Field { return &c.nvml_library; },
     .help = "NVML library for GPU utilization, memory, power and clock counters",
     .doc = "the NVML library for GPU counters, loaded at start; absent: no counters"},
    {.name = "framework-profiler",
     .field = [](auto& c) -> Field { return &c.framework_profiler; },
     .help = "host:port of the workload's TF/JAX profiler server (jax.profiler.start_server, "
             "tf.profiler.experimental.server.start): captures are forwarded to it and its "
             "trace merged",
     .doc = "`host:port` of the workload's TF/JAX profiler server; captures are forwarded to it "
            "and its XSpace merged (`docs/frameworks.md`)"},
    {.name = "framework-grace-ms",
     .field = [](auto& c) -> Field { return &c.framework_grace_ms; },
     .help = "How long after a capture's end the framework profiler's answer is awaited"},
    {.name = "auth-token-file",
     .field = [](auto& c) -> Field { return &c.auth_token_file; },
     .help = "Require every gRPC call to carry \"authorization: Bearer <token>\" with the token "
             "in this file (a mounted Secret, re-read when it changes)",
     .doc = "require `authorization: Bearer <token>` on every gRPC call, with the token in this "
            "file (see \"Auth\")"},
    {.name = "allow-loopback-without-token",
     .field = [](auto& c) -> Field { return &c.allow_loopback_without_token; },
     .help = "With --auth-token-file: calls from the pod's loopback (kubectl port-forward, "
             "XProf's capture button through it) need no token",
     .doc = "with `--auth-token-file`: calls from the pod's loopback (127.0.0.0/8, ::1; where "
            "`kubectl port-forward` arrives) need no token (see \"Auth\")"},
    {.name = "token-grace-seconds",
     .field = [](auto& c) -> Field { return &c.token_grace_seconds; },
     .help = "After the token file changes, the previous token is still accepted this long",
     .doc = "after the token file changes, the token before is still accepted this long (see "
            "\"Auth\")"},
    {.name = "tls-cert-file",
     .field = [](auto& c) -> Field { return &c.tls_cert_file; },
     .help = "Serve TLS on --port with this PEM certificate (a mounted Secret, reread when it "
             "changes); plaintext is then served on the pod's loopback only (127.0.0.1 and ::1, "
             "same port: kubectl port-forward)",
     .doc = "serve TLS on `--port` with this PEM certificate (reread when it changes); "
            "plaintext is then served on the pod's loopback only (see \"TLS\")"},
    {.name = "tls-key-file",
     .field = [](auto& c) -> Field { return &c.tls_key_file; },
     .help = "The PEM key of --tls-cert-file"},
    {.name = "handshake-timeout-ms",
     .field = [](auto& c) -> Field { return &c.handshake_timeout_ms; },
     .help = "Connections that have not finished their handshakes by then are closed",
     .doc = "connections that have not finished their TLS and HTTP/2 handshakes by then are "
            "closed"},
    {.name = "max-connections-per-peer",
     .field = [](auto& c) -> Field { return &c.max_connections_per_peer; },
     .help = "gRPC connections kept open per peer address; the newest beyond are closed (0: no "
             "limit)"},
    {.name = "max-connections",
     .field = [](auto& c) -> Field { return &c.max_connections; },
     .help = "gRPC connections kept open in all; the newest beyond are closed (0: no limit)"},
    {.name = "install-injection-library",
     .field = [](auto& c) -> Field { return &c.install_injection_library; },
     .help = "Copy this libclusterprof_cupti.so into the shared-memory directory at start, for "
             "the pod's CUDA processes to load (CUDA_INJECTION64_PATH)",
     .doc = "at start, copy this `libclusterprof_cupti.so` into the shared-memory directory "
            "(temporary file, then rename; mode 0755), where the pod's CUDA processes load it "
            "through `CUDA_INJECTION64_PATH`; the injection webhook sets it for pods that "
            "request GPUs (docs/webhook.md). A failed copy is logged and the sidecar serves on "
            "without GPU tracing."},
    {.name = "start-realtime",
     .field = [](auto& c) -> Field { return &c.start_realtime; },
     .help = "Wait for a capture's start instant under SCHED_FIFO where permitted "
             "(CAP_SYS_NICE), so busy workloads cannot delay the start by a scheduler tick",
     .doc = "wait for a capture's start instant under SCHED_FIFO (priority 1, the waiting "
            "thread only, from the wait until the tracers have started), so workloads that "
            "keep every CPU busy cannot delay the start by a scheduler tick or more. Needs "
            "CAP_SYS_NICE (or an RLIMIT_RTPRIO of at least 1), and on cgroup v1 nodes with "
            "real-time group scheduling a `cpu.rt_runtime_us` budget for the container's "
            "cgroup; without them the sidecar logs one warning at start and waits in the "
            "normal class (see \"What a Profile request does\")",
     .negatable = true},
    {.name = "start-spin-us",
     .field = [](auto& c) -> Field { return &c.start_spin_us; },
     .help = "Spin on the clock for this long before a start instant instead of sleeping to it "
             "(costs as much CPU per capture; 0: none)",
     .doc = "spin on the wall clock for this long before a start instant instead of sleeping "
            "to it. Costs up to that much CPU per capture; under SCHED_FIFO it trims the median "
            "start error (about 45 to 25 µs here), in the normal class it does not help on busy "
            "CPUs (bench/RESULTS.md)",
     .range = settings::Range{0, 10'000}},
};

}  // namespace

std::span<const settings::Setting<SidecarConfig>> SidecarSettings() { return kSettings; }

absl::Status LoadSidecarConfigFile(const std::string& path, SidecarConfig* config) {
  return settings::LoadYamlFile(path, settings::Bind(SidecarSettings(), config));
}

}  // namespace clusterprof::sidecar
