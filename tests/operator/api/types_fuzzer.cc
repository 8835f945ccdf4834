// Fuzzes the clusterprof.io/v1alpha1 types as the controllers read them from the API server
// (operator/api/types.h). The input is JSON text, read by every parser in turn as a ProfileJob
// spec, a ProfileSchedule spec, a ProfileJob status and a ProfileSchedule status (a spec that
// predates a schema change, or that an API server without CEL let through, can hold anything).
// Each parser gives a Status or a value, never a crash or an exception, and:
//   - an accepted ProfileJob spec is within the bounds the CRD states (types.h);
//   - an accepted ProfileSchedule spec holds a job template that is an accepted ProfileJob spec;
//   - a status written back to JSON reads again and writes the same JSON (the controllers
//     rewrite what they read: one write must normalize it for good).
#include <cstddef>
#include <cstdint>
#include <string>

#include "cpprest/json.h"
#include "operator/api/types.h"
#include "tests/support/fuzz_check.h"

namespace {

namespace api = clusterprof::api;

void CheckJobSpec(const web::json::value& json) {
  absl::StatusOr<api::ProfileJobSpec> spec = api::ParseProfileJobSpec(json);
  if (!spec.ok()) {
    FUZZ_CHECK(!spec.status().message().empty());
    return;
  }
  FUZZ_CHECK(spec->selector.has_value() || !spec->addresses.empty());
  FUZZ_CHECK(spec->addresses.size() <= api::kMaxAddresses);
  FUZZ_CHECK(spec->duration_ms >= 1 && spec->duration_ms <= api::kMaxDurationMs);
  FUZZ_CHECK(spec->delay_ms >= 0 && spec->delay_ms <= api::kMaxDelayMs);
  FUZZ_CHECK(spec->tracing_attempts >= 1 && spec->tracing_attempts <= api::kMaxTracingAttempts);
  FUZZ_CHECK(spec->queue_timeout_seconds >= 0 &&
             spec->queue_timeout_seconds <= api::kMaxQueueTimeoutSeconds);
  FUZZ_CHECK(spec->min_ready >= 0 && spec->port >= 0);
  FUZZ_CHECK(!spec->ttl_seconds_after_finished.has_value() ||
             *spec->ttl_seconds_after_finished >= 0);
  FUZZ_CHECK(!spec->logdir.uri.empty());
}

void CheckScheduleSpec(const web::json::value& json) {
  absl::StatusOr<api::ProfileScheduleSpec> spec = api::ParseProfileScheduleSpec(json);
  if (!spec.ok()) return;
  FUZZ_CHECK(!spec->schedule.empty());
  FUZZ_CHECK(spec->successful_jobs_history_limit >= 0 && spec->failed_jobs_history_limit >= 0);
  FUZZ_CHECK(!spec->starting_deadline_seconds.has_value() || *spec->starting_deadline_seconds >= 0);
  // The schedule controller creates ProfileJobs from the template: they must be valid.
  FUZZ_CHECK(api::ParseProfileJobSpec(spec->job_spec, "spec.jobTemplate.spec").ok());
}

// Written once, read and written again: the same JSON. (Writing normalizes: ConditionsToJson
// fills an empty reason with "Unknown" and an empty message with that reason, at once.)
template <typename Status>
void CheckStatusRoundTrip(const web::json::value& json,
                          absl::StatusOr<Status> (*parse)(const web::json::value&),
                          web::json::value (*write)(const Status&)) {
  absl::StatusOr<Status> status = parse(json);
  if (!status.ok()) return;
  const web::json::value written = write(*status);
  absl::StatusOr<Status> again = parse(written);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(write(*again) == written);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  web::json::value json;
  try {
    json = web::json::value::parse(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const web::json::json_exception&) {
    return 0;  // not JSON: the API server sends none such
  }
  CheckJobSpec(json);
  CheckScheduleSpec(json);
  CheckStatusRoundTrip(json, &api::ParseProfileJobStatus, &api::ProfileJobStatusToJson);
  CheckStatusRoundTrip(json, &api::ParseProfileScheduleStatus, &api::ProfileScheduleStatusToJson);
  return 0;
}
