// Sidecar injection: what the operator's admission webhook adds to a pod (docs/webhook.md).
//
// A pod selected by the MutatingWebhookConfiguration (label clusterprof.io/inject: "true", or a
// namespace labelled so) gets
//   - the clusterprof-sidecar container: a native sidecar (an init container with
//     restartPolicy: Always, Kubernetes >= 1.29) or, for older clusters, a regular container;
//   - an emptyDir volume in memory, mounted at /var/run/clusterprof in every container, with
//     CLUSTERPROF_DIR pointing at it;
//   - CUDA_INJECTION64_PATH in the containers that request nvidia.com/gpu, naming the GPU tracing
//     library that the sidecar copies into the volume when it starts;
//   - the label clusterprof.io/injected: "true" (which keeps it from being injected twice, and
//     which the chart's NetworkPolicy selects);
//   - with a token Secret or a TLS Secret configured, those Secrets mounted read-only in the
//     sidecar only, as whole volumes (no subPath), so that the kubelet's updates of a rotated
//     Secret reach the files the sidecar rereads.
// Pod annotations set the sidecar's port, the framework profiler address and its resources.
//
// Everything here is a pure function of the settings and the AdmissionReview, so the tests feed
// it real AdmissionReview JSON. The webhook never blocks pod creation: every answer allows the
// pod, and a pod that cannot be injected is admitted unchanged with a warning that says why.
#ifndef CLUSTERPROF_OPERATOR_WEBHOOK_INJECTION_H_
#define CLUSTERPROF_OPERATOR_WEBHOOK_INJECTION_H_

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sdk/shm_format.h"

namespace clusterprof::webhook {

inline constexpr std::string_view kInjectLabel = "clusterprof.io/inject";
inline constexpr std::string_view kInjectedLabel = "clusterprof.io/injected";
inline constexpr std::string_view kFrameworkProfilerAnnotation =
    "clusterprof.io/framework-profiler";
inline constexpr std::string_view kCpuRequestAnnotation = "clusterprof.io/sidecar-cpu-request";
inline constexpr std::string_view kCpuLimitAnnotation = "clusterprof.io/sidecar-cpu-limit";
inline constexpr std::string_view kMemoryRequestAnnotation =
    "clusterprof.io/sidecar-memory-request";
inline constexpr std::string_view kMemoryLimitAnnotation = "clusterprof.io/sidecar-memory-limit";
// The sidecar's flight recorder for one pod (docs/triggers.md): --recorder-window-ms and
// --recorder-max-bytes (an integer, or a quantity such as 64Mi).
inline constexpr std::string_view kRecorderWindowAnnotation = "clusterprof.io/recorder-window-ms";
inline constexpr std::string_view kRecorderMaxBytesAnnotation = "clusterprof.io/recorder-max-bytes";
inline constexpr std::string_view kShmVolumeName = "clusterprof-shm";
inline constexpr std::string_view kSpoolVolumeName = "clusterprof-spool";
inline constexpr std::string_view kTokenVolumeName = "clusterprof-token";
inline constexpr std::string_view kTlsVolumeName = "clusterprof-tls";
inline constexpr std::string_view kShmDir = shm::kDefaultDir;
inline constexpr std::string_view kSpoolDir = "/var/lib/clusterprof/spool";
inline constexpr std::string_view kTokenDir = "/etc/clusterprof/token";
inline constexpr std::string_view kTlsDir = "/etc/clusterprof/tls";
inline constexpr std::string_view kInjectionLibraryName = shm::kInjectionLibraryFileName;
inline constexpr std::string_view kGpuResource = "nvidia.com/gpu";

// The injection settings (--injection-config, a YAML file with these keys in snake_case; the
// chart renders it from its sidecar values).
struct InjectionConfig {
  // "": clusterprof/sidecar:<the operator's version>.
  std::string image;
  std::string image_pull_policy = "IfNotPresent";
  // An init container with restartPolicy: Always (Kubernetes >= 1.29); false: a regular
  // container, for older clusters. The operator turns it off itself on older API servers.
  bool native_sidecar = true;
  int port = 8466;
  int http_port = 8467;
  // Quantities, "" for none: {"requests": {"cpu": "100m"}, "limits": {"memory": "1Gi"}}.
  std::map<std::string, std::string> requests = {{"cpu", "100m"}, {"memory", "128Mi"}};
  std::map<std::string, std::string> limits = {{"memory", "1Gi"}};
  // A Secret with the key "token", mounted in the sidecar, whose token the sidecar requires of
  // every call (--auth-token-file). "": no token. The volume is optional: a namespace without
  // the Secret still starts its pods, and the sidecar serves once the Secret appears.
  std::string token_secret;
  // With token_secret: the sidecar's --token-grace-seconds, how long the previous token is still
  // accepted after the Secret changes, so that calls in flight across a rotation (the kubelet
  // updates the operator's copy and the sidecars' at different instants) are not refused.
  int token_grace_seconds = 300;
  // A Secret of type kubernetes.io/tls (tls.crt, tls.key) in the pod's namespace, mounted in the
  // sidecar, which then serves TLS on its port (--tls-cert-file, --tls-key-file) and rereads the
  // files when the kubelet updates them. "": plaintext. Optional like the token's volume: a
  // namespace without the Secret still starts its pods, and the sidecar serves once it appears.
  std::string tls_secret;
  // Secrets in the pod's namespace for pulling the sidecar image from a private registry; added
  // to the pod's imagePullSecrets (those it names already are kept).
  std::vector<std::string> image_pull_secrets;
  std::vector<std::string> allowed_logdirs;
  // The sidecar's --framework-profiler when the pod has no annotation; "" for none.
  std::string framework_profiler;
  // The GPU tracing library inside the sidecar image, copied into the shared volume at start.
  // "": pods that request GPUs get no CUDA_INJECTION64_PATH.
  std::string gpu_library = "/usr/lib/clusterprof/libclusterprof_cupti.so";
  // Where the sidecar's tmpfs volume is capped ("" for no cap).
  std::string shm_size_limit = "256Mi";
  std::string spool_size_limit = "2Gi";
  std::string log_format = "json";
  // The sidecar's flight recorder (--recorder-level, --recorder-window-ms, --recorder-max-bytes;
  // docs/triggers.md); pods override the window and the bound with annotations.
  int recorder_level = 2;
  int64_t recorder_window_ms = 30'000;
  int64_t recorder_max_bytes = int64_t{64} << 20;
  // Adds CAP_SYS_NICE to the sidecar (all others stay dropped) so that its capture thread may
  // wait for the start instant under SCHED_FIFO (--start-realtime): on nodes whose CPUs the
  // workloads keep busy it then starts within ~0.1 ms instead of a scheduler tick (4 ms) or more
  // late. Off by default: Pod Security's baseline and restricted profiles refuse the capability.
  bool start_realtime = false;
  std::vector<std::string> extra_args;
  // More environment variables for the sidecar (name -> value), e.g. STORAGE_EMULATOR_HOST or
  // an HTTPS proxy for gs:// uploads. The names the sidecar gets anyway (POD_NAME,
  // POD_NAMESPACE, CLUSTERPROF_DIR) are refused.
  std::map<std::string, std::string> env;
};

// Reads an injection config file; unknown keys and bad values are errors that name the key.
absl::StatusOr<InjectionConfig> LoadInjectionConfig(const std::string& path);
absl::StatusOr<InjectionConfig> ParseInjectionConfig(std::string_view yaml);
// Checks the values (ports, quantities, pull policy, absolute paths, Secret names, the token
// grace period).
absl::Status ValidateInjectionConfig(const InjectionConfig& config);

// The minor version of Kubernetes 1.x from the body of the API server's /version ({"major": "1",
// "minor": "29+", "gitVersion": "v1.29.3-gke.1"}); nullopt when it does not say (some builds
// report v0.0.0). Native sidecars need 1.29.
std::optional<int> KubernetesMinorVersion(std::string_view version_json);

// What Inject decided for one pod.
struct InjectionResult {
  // An RFC 6902 JSON Patch (a JSON array), "" when the pod is left as it is.
  std::string patch;
  // Why the pod was left alone, or what it should know ("" when injected without remark); goes
  // to the AdmissionResponse's warnings and the log.
  std::vector<std::string> warnings;
  // "injected", "already-injected", "opted-out", "host-network" (a hostNetwork pod without a
  // clusterprof.io/port annotation) or "invalid".
  std::string outcome;
};

// The patch for one pod (the JSON of a core/v1 Pod).
absl::StatusOr<InjectionResult> Inject(const InjectionConfig& config, std::string_view pod_json);

// Answers an AdmissionReview (admission.k8s.io/v1, the request body of POST /mutate-pods) with
// an AdmissionReview response. Always allows the pod; an error here means the body was not an
// AdmissionReview at all (the server answers 400).
struct ReviewAnswer {
  std::string body;
  InjectionResult result;
  std::string pod;  // "<namespace>/<name or generateName*>", for the log
};
absl::StatusOr<ReviewAnswer> Review(const InjectionConfig& config, std::string_view review_json);

}  // namespace clusterprof::webhook

#endif  // CLUSTERPROF_OPERATOR_WEBHOOK_INJECTION_H_
