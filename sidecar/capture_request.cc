#include "sidecar/capture_request.h"

#include <filesystem>

#include "common/base/status.h"
#include "common/base/strings.h"

namespace clusterprof::sidecar {
namespace {

constexpr char kOverrideHostnameKey[] = "override_hostname";

// The real path of `path`: symbolic links resolved in the longest part that exists, the rest
// appended as written.
std::string ResolveExisting(const std::string& path) {
  std::filesystem::path existing(path);
  std::filesystem::path rest;
  std::error_code ec;
  while (!existing.empty() && existing != existing.root_path() &&
         !std::filesystem::exists(existing, ec)) {
    rest = existing.filename() / rest;
    existing = existing.parent_path();
  }
  std::filesystem::path resolved = std::filesystem::canonical(existing, ec);
  if (ec) resolved = existing;
  if (!rest.empty()) resolved /= rest;
  std::string out = resolved.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

bool HasPathPrefix(std::string_view path, std::string_view prefix) {
  if (prefix == "/") return StartsWith(path, "/");
  return path == prefix || (StartsWith(path, prefix) && path[prefix.size()] == '/');
}

}  // namespace

tensorflow::ProfileOptions DefaultProfileOptions() {
  tensorflow::ProfileOptions options;
  options.set_version(1);
  options.set_host_tracer_level(2);
  options.set_device_tracer_level(1);
  options.set_python_tracer_level(0);
  options.set_enable_hlo_proto(true);
  options.set_include_dataset_ops(true);
  return options;
}

namespace {

// The GPU options of advanced_configuration, typed as upstream types them (int64 caps, a bool
// for NVTX); a value of another type, or a cap that is not positive, is refused.
absl::Status ParseGpuOptions(const tensorflow::ProfileOptions& opts, CaptureRequest* out) {
  const auto& config = opts.advanced_configuration();
  for (const auto& [key, field] :
       {std::pair<const char*, uint64_t CaptureRequest::*>{
            kGpuMaxActivityEventsKey, &CaptureRequest::gpu_max_activity_events},
        std::pair<const char*, uint64_t CaptureRequest::*>{kGpuMaxApiEventsKey,
                                                           &CaptureRequest::gpu_max_api_events}}) {
    auto it = config.find(key);
    if (it == config.end()) continue;
    if (it->second.value_case() != tensorflow::ProfileOptions::AdvancedConfigValue::kInt64Value ||
        it->second.int64_value() <= 0) {
      return absl::InvalidArgumentError(
          StrCat("advanced_configuration[\"", key, "\"] must be a positive int64_value"));
    }
    out->*field = static_cast<uint64_t>(it->second.int64_value());
  }
  if (auto it = config.find(kGpuEnableNvtxKey); it != config.end()) {
    if (it->second.value_case() != tensorflow::ProfileOptions::AdvancedConfigValue::kBoolValue) {
      return absl::InvalidArgumentError(
          StrCat("advanced_configuration[\"", kGpuEnableNvtxKey, "\"] must be a bool_value"));
    }
    out->gpu_nvtx = it->second.bool_value();
  }
  if (auto it = config.find(kGpuApiTracingKey); it != config.end()) {
    const std::string& value = it->second.string_value();
    if (value == "runtime,driver" || value == "driver,runtime") {
      out->gpu_runtime_api = out->gpu_driver_api = true;
    } else if (value == "runtime" || value == "driver" || value == "none") {
      out->gpu_runtime_api = value == "runtime";
      out->gpu_driver_api = value == "driver";
    } else {
      return absl::InvalidArgumentError(
          StrCat("advanced_configuration[\"", kGpuApiTracingKey,
                 "\"] must be a string_value of \"runtime,driver\", \"runtime\", \"driver\" or "
                 "\"none\", not \"",
                 value, "\""));
    }
  }
  return absl::OkStatus();
}

}  // namespace

CaptureWindow CaptureRequest::Window(int64_t start_ns) const {
  CaptureWindow window;
  window.start_ns = start_ns;
  window.planned_stop_ns = start_ns + duration_ns;
  window.host_tracer_level = options.host_tracer_level();
  window.device_tracer_level = options.device_tracer_level();
  window.python_tracer_level = options.python_tracer_level();
  window.max_events = max_events;
  window.gpu_max_activity_events = gpu_max_activity_events;
  window.gpu_max_api_events = gpu_max_api_events;
  window.gpu_nvtx = gpu_nvtx;
  window.gpu_runtime_api = gpu_runtime_api;
  window.gpu_driver_api = gpu_driver_api;
  window.options = std::make_shared<const tensorflow::ProfileOptions>(options);
  return window;
}

bool IsUnderPrefix(const storage::Logdir& root, const storage::Logdir& allowed) {
  if (root.kind != allowed.kind) return false;
  if (root.kind == storage::Logdir::Kind::kGcs) return HasPathPrefix(root.uri, allowed.uri);
  return HasPathPrefix(ResolveExisting(root.uri), ResolveExisting(allowed.uri));
}

absl::StatusOr<CaptureRequest> ParseCaptureRequest(const tensorflow::ProfileRequest& request,
                                                   const RequestPolicy& policy,
                                                   int64_t now_wall_ns) {
  CaptureRequest out;
  const tensorflow::ProfileOptions& opts = request.opts();
  // Upstream: version 0 means "defaults", and every other option is discarded.
  const bool defaults = opts.version() == 0;
  out.options = defaults ? DefaultProfileOptions() : opts;

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
  out.options.set_duration_ms(duration_ms);

  if (!defaults && opts.start_timestamp_ns() > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(
        StrCat("start_timestamp_ns ", opts.start_timestamp_ns(), " is out of range"));
  }
  out.start_timestamp_ns = defaults ? 0 : static_cast<int64_t>(opts.start_timestamp_ns());
  out.max_events = request.max_events();
  if (auto it = opts.advanced_configuration().find(kOutliveClientKey);
      !defaults && it != opts.advanced_configuration().end()) {
    out.outlive_client = it->second.bool_value();
  }
  if (!defaults) {
    CLUSTERPROF_RETURN_IF_ERROR(ParseGpuOptions(opts, &out));
  }
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
  if (!StartsWith(root_text, "/") && !StartsWith(root_text, "file://") &&
      !StartsWith(root_text, "gs://")) {
    return absl::InvalidArgumentError(
        StrCat("repository_root '", root_text,
               "' is relative; the sidecar needs an absolute path, file:// or gs:// location"));
  }
  absl::StatusOr<storage::RunLayout> layout =
      storage::RunLayout::FromRepositoryRoot(root_text, out.session_id);
  if (!layout.ok()) return absl::InvalidArgumentError(layout.status().message());
  if (policy.allowed_logdirs.empty()) {
    return absl::PermissionDeniedError(
        StrCat("this sidecar writes no files: it was started without --allowed-logdir, so '",
               root_text, "' is refused (emit_xspace still works)"));
  }
  // The run directory is checked, not the logdir: a symbolic link at plugins/, profile/ or
  // <run>/ must not lead out of the allowed prefixes either.
  CLUSTERPROF_ASSIGN_OR_RETURN(const storage::Logdir root, storage::ParseLogdir(layout->RunDir()));
  bool allowed = false;
  std::string prefixes;
  for (const storage::Logdir& prefix : policy.allowed_logdirs) {
    allowed = allowed || IsUnderPrefix(root, prefix);
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
