#include "sidecar/capture_request.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "absl/strings/str_join.h"
#include "analysis/digest_proto.h"
#include "common/base/status.h"
#include "common/base/strings.h"

namespace clusterprof::sidecar {
namespace {

// Lets each tracer check its own keys, and names the keys nobody reads: ignored, unless a tracer
// that takes part hands the options on whole (the framework proxy).
absl::Status CheckTracerOptions(const std::vector<const Tracer*>& tracers,
                                const tensorflow::ProfileOptions& options,
                                std::vector<std::string>* warnings) {
  std::set<std::string, std::less<>> owned = {kOutliveClientKey, kOverrideHostnameKey,
                                              kStepPatternKey, kCollectivePatternKey,
                                              kInputPatternKey};
  bool forwarded = false;
  for (const Tracer* tracer : tracers) {
    CLUSTERPROF_RETURN_IF_ERROR(tracer->Validate(options));
    for (std::string_view key : tracer->OwnedKeys()) owned.emplace(key);
    forwarded = forwarded || (tracer->ForwardsOptions() && tracer->EnabledFor(options));
  }
  if (forwarded) return absl::OkStatus();
  std::vector<std::string> unknown;
  for (const auto& [key, value] : options.advanced_configuration()) {
    if (owned.count(key) == 0) unknown.push_back(key);
  }
  std::sort(unknown.begin(), unknown.end());
  for (const std::string& key : unknown) {
    warnings->push_back(StrCat("advanced_configuration[\"", key,
                               "\"] is read by none of this sidecar's tracers and was ignored "
                               "(keys read: ",
                               absl::StrJoin(owned, ", "), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CaptureRequest> ParseCaptureRequest(const tensorflow::ProfileRequest& request,
                                                   const RequestPolicy& policy,
                                                   int64_t now_wall_ns) {
  CaptureRequest out;
  const tensorflow::ProfileOptions& opts = request.opts();
  // Upstream: version 0 means "defaults", and every other option is discarded.
  const bool defaults = opts.version() == 0;
  tensorflow::ProfileOptions& options = out.config.options;
  options = defaults ? proto::DefaultProfileOptions() : opts;

  uint64_t duration_ms = defaults ? 0 : opts.duration_ms();
  if (duration_ms == 0) duration_ms = request.duration_ms();
  if (duration_ms == 0) {
    return absl::InvalidArgumentError(
        "duration_ms is 0 in both ProfileRequest.opts and ProfileRequest; give a capture length");
  }
  if (duration_ms > static_cast<uint64_t>(policy.max_duration_ms)) {
    return absl::InvalidArgumentError(StrCat("duration_ms ", duration_ms,
                                             " is longer than this sidecar accepts (",
                                             policy.max_duration_ms, " ms)"));
  }
  out.duration_ns = static_cast<int64_t>(duration_ms) * 1'000'000;
  options.set_duration_ms(duration_ms);

  if (!defaults && opts.start_timestamp_ns() > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(
        StrCat("start_timestamp_ns ", opts.start_timestamp_ns(), " is out of range"));
  }
  out.start_timestamp_ns = defaults ? 0 : static_cast<int64_t>(opts.start_timestamp_ns());
  out.config.max_events = request.max_events();
  if (auto it = opts.advanced_configuration().find(kOutliveClientKey);
      !defaults && it != opts.advanced_configuration().end()) {
    out.outlive_client = it->second.bool_value();
  }
  CLUSTERPROF_RETURN_IF_ERROR(CheckTracerOptions(policy.tracers, options, &out.warnings));
  CLUSTERPROF_ASSIGN_OR_RETURN(out.digest_options, analysis::DigestOptionsFromProfile(options));
  out.emit_xspace = request.emit_xspace();

  out.session_id =
      !defaults && !opts.session_id().empty() ? opts.session_id() : request.session_id();
  if (out.session_id.empty()) out.session_id = storage::DefaultRunName(now_wall_ns);
  if (absl::Status status = storage::ValidatePathComponent("session_id", out.session_id);
      !status.ok()) {
    return status;
  }

  std::string host;
  if (!defaults && !opts.override_hostname().empty()) {
    host = opts.override_hostname();
  } else if (auto it = opts.advanced_configuration().find(kOverrideHostnameKey);
             !defaults && it != opts.advanced_configuration().end() &&
             !it->second.string_value().empty()) {
    host = it->second.string_value();
  } else if (!request.host_name().empty()) {
    host = request.host_name();
  } else {
    host = policy.default_host_name;
  }
  CLUSTERPROF_ASSIGN_OR_RETURN(out.host_name, storage::HostFileStem(host));

  if (out.emit_xspace) return out;

  const std::string& root_text = request.repository_root();
  if (root_text.empty()) {
    return absl::InvalidArgumentError(
        "repository_root is empty: give <logdir>/plugins/profile, or set emit_xspace to get the "
        "XSpace in the response instead of files");
  }
  absl::StatusOr<storage::Logdir> root = storage::ParseAbsoluteLogdir(root_text);
  if (!root.ok()) {
    return absl::InvalidArgumentError(StrCat("repository_root: ", root.status().message()));
  }
  absl::StatusOr<storage::RunLayout> layout =
      storage::RunLayout::FromRepositoryRoot(*root, out.session_id);
  if (!layout.ok()) return absl::InvalidArgumentError(layout.status().message());
  if (policy.allowed_logdirs.empty()) {
    return absl::PermissionDeniedError(
        StrCat("this sidecar writes no files: it was started without --allowed-logdir, so '",
               root_text, "' is refused (emit_xspace still works)"));
  }
  // The run directory is checked, not the logdir: a symbolic link at plugins/, profile/ or
  // <run>/ must not lead out of the allowed prefixes either.
  const storage::Logdir run_dir = layout->RunDirLogdir();
  bool allowed = false;
  std::string prefixes;
  for (const storage::Logdir& prefix : policy.allowed_logdirs) {
    allowed = allowed || storage::IsUnderPrefix(run_dir, prefix);
    StrAppend(&prefixes, prefixes.empty() ? "" : ", ", prefix.uri);
  }
  if (!allowed) {
    return absl::PermissionDeniedError(StrCat("repository_root '", root_text,
                                              "' is outside the logdirs this sidecar may write "
                                              "to (--allowed-logdir: ",
                                              prefixes, ")"));
  }
  out.layout = std::move(*layout);
  return out;
}

}  // namespace clusterprof::sidecar
