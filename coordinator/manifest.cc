// The run manifest, clusterprof_run.json: what was asked, and what each target did.
#include <string>
#include <string_view>
#include <vector>

#include "common/base/json_writer.h"
#include "common/base/strings.h"
#include "coordinator/coordinator.h"

namespace clusterprof::coordinator {

namespace {

// `key`: `value`, or null when it is not known.
void FieldOrNull(JsonWriter& json, std::string_view key, bool known, int64_t value) {
  json.Key(key);
  if (known) {
    json.Int(value);
  } else {
    json.Null();
  }
}

void StringArray(JsonWriter& json, std::string_view key, const std::vector<std::string>& values) {
  json.Key(key);
  json.Open('[');
  for (const std::string& value : values) json.String(value);
  json.Close(']');
}

void WriteUploads(JsonWriter& json, const std::vector<TargetResult::Upload>& uploads) {
  if (uploads.empty()) return;
  json.Key("uploads");
  json.Open('[');
  for (const TargetResult::Upload& upload : uploads) {
    json.Open('{');
    json.Field("uri", upload.uri);
    json.Field("bytes", upload.bytes);
    json.Field("state", upload.state);
    json.Field("bytes_committed", upload.bytes_committed);
    if (!upload.crc32c.empty()) json.Field("crc32c", upload.crc32c);
    if (!upload.error.empty()) json.Field("error", upload.error);
    json.Close('}');
  }
  json.Close(']');
}

// One target: where it is, its clock, its start, what it recorded and wrote.
void WriteTarget(JsonWriter& json, const TargetResult& target) {
  json.Open('{');
  json.Field("address", target.address);
  json.Field("host", target.host_name);
  json.Field("outcome", OutcomeName(target.outcome));
  json.Field("attempts", target.attempts);
  json.Field("clusterprof_sidecar", target.is_sidecar);
  json.Field("clock_offset_ns", target.clock_offset_ns);
  FieldOrNull(json, "clock_uncertainty_ns", target.clock_uncertainty_ns >= 0,
              target.clock_uncertainty_ns);
  json.Field("clock_offset_applied", target.clock_offset_applied);
  if (!target.node.empty()) json.Field("node", target.node);
  if (!target.clock_probed_via.empty()) json.Field("clock_probed_via", target.clock_probed_via);
  json.Field("requested_start_ns", target.requested_start_ns);
  FieldOrNull(json, "achieved_start_ns", target.start_known, target.achieved_start_ns);
  FieldOrNull(json, "start_error_ns", target.start_known, target.start_error_ns);
  FieldOrNull(json, "wake_error_ns", target.start_known, target.wake_error_ns);
  if (target.stats_known) {
    json.Field("events", target.events);
    json.Field("dropped_events", target.dropped_events);
    json.Field("lookback_ns", target.lookback_ns);
    json.Field("bytes", target.bytes);
  }
  StringArray(json, "files", target.files);
  WriteUploads(json, target.uploads);
  StringArray(json, "warnings", target.warnings);
  if (!target.message.empty()) json.Field("message", target.message);
  json.Close('}');
}

}  // namespace

std::string ManifestJson(const CaptureOptions& options, const RunResult& result,
                         int64_t created_ns) {
  std::string out;
  JsonWriter json(&out);
  json.Open('{');
  json.Field("kind", std::string_view("clusterprof.io/v1alpha1/CaptureRun"));
  json.Field("run", result.run);
  json.Field("logdir", options.layout.has_value() ? options.layout->logdir().uri : "");
  json.Field("created_ns", created_ns);
  json.Field("t0_ns", result.t0_ns);
  json.Field("duration_ms", options.duration_ms);
  json.Field("delay_ms", options.delay_ms);
  json.Key("options");
  json.Open('{');
  json.Field("host_tracer_level", options.profile.host_tracer_level());
  json.Field("device_tracer_level", options.profile.device_tracer_level());
  json.Field("python_tracer_level", options.profile.python_tracer_level());
  json.Field("num_tracing_attempts", options.num_tracing_attempts);
  json.Close('}');
  json.Key("summary");
  json.Open('{');
  json.Field("targets", static_cast<int64_t>(result.targets.size()));
  json.Field("succeeded", result.succeeded);
  json.Field("empty", result.empty);
  json.Field("failed", result.failed);
  json.Field("max_start_skew_ns", result.max_start_skew_ns);
  json.Close('}');
  json.Key("targets");
  json.Open('[');
  for (const TargetResult& target : result.targets) WriteTarget(json, target);
  json.Close(']');
  json.Close('}');
  out.push_back('\n');
  return out;
}

}  // namespace clusterprof::coordinator
