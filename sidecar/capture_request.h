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
#include "analysis/digest.h"
#include "common/storage/logdir.h"
#include "proto/profile_options.h"
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
  // The sidecar's tracers: each checks the advanced_configuration keys it owns, and a key none
  // owns is named in a warning.
  std::vector<const Tracer*> tracers;
};

// The advanced_configuration keys the sidecar itself reads (the tracers own the others):
// CaptureRequest::outlive_client, upstream's way to name the host, and the digest's patterns.
using proto::kCollectivePatternKey;
using proto::kInputPatternKey;
using proto::kOutliveClientKey;
using proto::kOverrideHostnameKey;
using proto::kStepPatternKey;

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
  // advanced_configuration["clusterprof_outlive_client"] = true: the capture runs to its planned
  // end even when every client has gone (a coordinator that restarts rejoins it by session id,
  // or reads its results back with GetSession). Without it, the capture stops early then, as
  // upstream servers do.
  bool outlive_client = false;
  // What the tracers get: the options in effect (upstream defaults applied for version 0) and
  // the event cap.
  CaptureConfig config;
  // What the capture's digest looks for (advanced_configuration's clusterprof_*_pattern keys).
  analysis::DigestOptions digest_options;
  // What the request asked that this sidecar ignores (advanced_configuration keys no tracer
  // reads), for the XSpace's warnings.
  std::vector<std::string> warnings;
};

// Checks `request` against `policy`. Errors are INVALID_ARGUMENT (bad names, durations, roots,
// a value a tracer refuses for one of its keys) or PERMISSION_DENIED (a repository_root outside the
// allowed prefixes), with the reason. `now_wall_ns` names the run when the request has no
// session_id.
absl::StatusOr<CaptureRequest> ParseCaptureRequest(const tensorflow::ProfileRequest& request,
                                                   const RequestPolicy& policy,
                                                   int64_t now_wall_ns);

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_CAPTURE_REQUEST_H_
