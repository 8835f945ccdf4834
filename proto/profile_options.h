// tensorflow::ProfileOptions as clusterprof fills it in. One ProfileOptions travels the whole way:
// from a ProfileJob's spec.options (or the flags of `clusterprof capture`) through the
// coordinator's Profile requests to each sidecar tracer, which reads its own level and keys.
#ifndef CLUSTERPROF_PROTO_PROFILE_OPTIONS_H_
#define CLUSTERPROF_PROTO_PROFILE_OPTIONS_H_

#include <string_view>

#include "absl/status/status.h"
#include "tsl/profiler/protos/profiler_options.pb.h"

namespace clusterprof::proto {

// advanced_configuration keys read outside the tracers. Ours: a sidecar captures to the planned
// end even when every client has gone (a restarted coordinator rejoins). Upstream's: the host
// name for the files.
inline constexpr char kOutliveClientKey[] = "clusterprof_outlive_client";
inline constexpr char kOverrideHostnameKey[] = "override_hostname";
// The initial metadata a clusterprof sidecar sends on a Profile call asked to outlive its client,
// once it has taken the request (its session exists and will capture to the planned end without
// the call): its value is the session id. A coordinator may then let the call go and read the
// results with Sidecar.GetSession (docs/protocol.md).
inline constexpr char kAcceptedHeader[] = "clusterprof-accepted";
// The names the cross-host analysis looks for (docs/analysis.md), as regular expressions: step
// markers (default: events with a step_num stat), collectives and input waits (defaults cover
// NCCL, XLA and common data loaders). A sidecar digests its capture with them.
inline constexpr char kStepPatternKey[] = "clusterprof_step_pattern";
inline constexpr char kCollectivePatternKey[] = "clusterprof_collective_pattern";
inline constexpr char kInputPatternKey[] = "clusterprof_input_pattern";
// How far before the start instant the capture reaches back, in ms (int64_value): the sidecar's
// flight recorder hands over the annotations it kept from then on (docs/triggers.md).
inline constexpr char kLookbackMsKey[] = "clusterprof_lookback_ms";

// Upstream's defaults (what a server uses for a request with version 0): version 1, host tracer
// level 2, device 1, Python 0, HLO protos and dataset ops included.
tensorflow::ProfileOptions DefaultProfileOptions();

// Sets advanced_configuration from "KEY=VALUE": "true"/"false" as a bool_value, a decimal
// integer as an int64_value, anything else as a string_value. INVALID_ARGUMENT without a '=' or
// with an empty key.
absl::Status SetAdvancedOption(std::string_view key_equals_value,
                               tensorflow::ProfileOptions* options);

}  // namespace clusterprof::proto

#endif  // CLUSTERPROF_PROTO_PROFILE_OPTIONS_H_
