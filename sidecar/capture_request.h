// What a Profile request asks of this sidecar, checked once: PROTOCOL.md's server rules
// (version 0 means defaults, duration from opts with the request field as fallback, the host
// name's precedence) and ours on top (files only under --allowed-logdir prefixes, run and host
// names that are single safe path components).
#ifndef CLUSTERPROF_SIDECAR_CAPTURE_REQUEST_H_
#define CLUSTERPROF_SIDECAR_CAPTURE_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/storage/logdir.h"
#include "sidecar/tracers/tracer.h"
#include "tsl/profiler/protos/profiler_service.pb.h"

namespace clusterprof::sidecar {

struct RequestPolicy {
  // Prefixes files may be written under. Empty: no files at all (emit_xspace still works).
  std::vector<storage::Logdir> allowed_logdirs;
  // Host name used when the request names none.
  std::string default_host_name;
  // Longest capture accepted.
  int64_t max_duration_ms = 10 * 60 * 1000;
};

// The advanced_configuration key of CaptureRequest::outlive_client.
inline constexpr char kOutliveClientKey[] = "clusterprof_outlive_client";
// Upstream's GPU keys (int64, int64, bool).
inline constexpr char kGpuMaxActivityEventsKey[] = "gpu_max_activity_api_events";
inline constexpr char kGpuMaxApiEventsKey[] = "gpu_max_callback_api_events";
inline constexpr char kGpuEnableNvtxKey[] = "gpu_enable_nvtx_tracking";
// Ours: which CUDA calls are recorded beside the GPU activity, a string_value of "runtime,driver"
// (the default), "runtime", "driver" or "none".
inline constexpr char kGpuApiTracingKey[] = "clusterprof_gpu_api_tracing";

struct CaptureRequest {
  std::string session_id;
  // The host file stem (':' already replaced).
  std::string host_name;
  // Where the files go; unset with emit_xspace.
  std::optional<storage::RunLayout> layout;
  bool emit_xspace = false;
  // Wall-clock start asked for (ns since the epoch); 0 = at once.
  int64_t start_timestamp_ns = 0;
  int64_t duration_ns = 0;
  uint64_t max_events = 0;
  // advanced_configuration["clusterprof_outlive_client"] = true: the capture runs to its planned
  // end even when every client has gone (a coordinator that restarts rejoins it by session id,
  // or reads its results back with GetSession). Without it, the capture stops early then, as
  // upstream servers do.
  bool outlive_client = false;
  // GPU tracing caps per process (0 = the default) and NVTX ranges.
  uint64_t gpu_max_activity_events = 0;
  uint64_t gpu_max_api_events = 0;
  bool gpu_nvtx = false;
  bool gpu_runtime_api = true;
  bool gpu_driver_api = true;
  // The options in effect (upstream defaults applied for version 0).
  tensorflow::ProfileOptions options;

  CaptureWindow Window(int64_t start_ns) const;
};

// Upstream's defaults for a request with opts.version == 0.
tensorflow::ProfileOptions DefaultProfileOptions();

// Checks `request` against `policy`. Errors are INVALID_ARGUMENT (bad names, durations, roots)
// or PERMISSION_DENIED (a repository_root outside the allowed prefixes), with the reason.
// `now_wall_ns` names the run when the request has no session_id.
absl::StatusOr<CaptureRequest> ParseCaptureRequest(const tensorflow::ProfileRequest& request,
                                                   const RequestPolicy& policy,
                                                   int64_t now_wall_ns);

// Whether `root` (a parsed repository root) lies inside `allowed`. Local paths compare whole
// components after resolving symbolic links of the parts that exist, so a link inside an allowed
// directory cannot lead out of it.
bool IsUnderPrefix(const storage::Logdir& root, const storage::Logdir& allowed);

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_CAPTURE_REQUEST_H_
