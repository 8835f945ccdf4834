#include "sidecar/metrics.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace clusterprof::sidecar {

void SidecarMetrics::StepFinished(int64_t step, int64_t start_ns, int64_t end_ns) {
  step_duration_->Observe(static_cast<double>(end_ns - start_ns) / 1e9);
  steps_->Increment();
  if (static_cast<double>(step) >= last_step_->Value() || steps_->Value() <= 1) {
    last_step_->Set(static_cast<double>(step));
  }
  last_step_end_->Set(std::max(last_step_end_->Value(), static_cast<double>(end_ns) / 1e9));
}

void SidecarMetrics::CallUnauthenticated(std::string_view reason) {
  unauthenticated_->Add({{"reason", std::string(reason)}}).Increment();
}

void SidecarMetrics::HandshakeFailed(std::string_view reason) {
  handshake_failures_->Add({{"reason", std::string(reason)}}).Increment();
}

void SidecarMetrics::ConnectionsClosed(std::string_view reason, int count) {
  connections_closed_->Add({{"reason", std::string(reason)}}).Increment(count);
}

void SidecarMetrics::CredentialReloaded(std::string_view file, std::string_view result) {
  credential_reloads_->Add({{"file", std::string(file)}, {"result", std::string(result)}})
      .Increment();
}

void SidecarMetrics::SetCertificateExpiry(double not_after_seconds) {
  certificate_expiry_->Set(not_after_seconds);
}

namespace {

// A metric family of `registry`: its name and help, declared in one line each below.
prometheus::Family<prometheus::Counter>& Counters(prometheus::Registry& registry,
                                                  const std::string& name,
                                                  const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}
prometheus::Family<prometheus::Gauge>& Gauges(prometheus::Registry& registry,
                                              const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}
prometheus::Histogram* Histogram(prometheus::Registry& registry, const std::string& name,
                                 const std::string& help,
                                 prometheus::Histogram::BucketBoundaries buckets) {
  return &prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add(
      {}, std::move(buckets));
}

}  // namespace

SidecarMetrics::SidecarMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  RegisterSecurityMetrics(*registry_);
  RegisterCaptureMetrics(*registry_);
  RegisterStepMetrics(*registry_);
  RegisterUploadMetrics(*registry_);
}

void SidecarMetrics::RegisterSecurityMetrics(prometheus::Registry& r) {
  unauthenticated_ = &Counters(r, "clusterprof_sidecar_unauthenticated_calls_total",
                               "gRPC calls refused for their bearer token, by reason (missing, "
                               "malformed, wrong, rotated_out)");
  handshake_failures_ = &Counters(r, "clusterprof_sidecar_handshake_failures_total",
                                  "Connections to the gRPC port whose handshake failed, by cause "
                                  "(timeout, plaintext_client, closed, tls_error, other)");
  connections_closed_ = &Counters(r, "clusterprof_sidecar_connections_closed_total",
                                  "gRPC connections closed for being over a limit (per_peer: "
                                  "--max-connections-per-peer, total: --max-connections)");
  credential_reloads_ = &Counters(r, "clusterprof_sidecar_credential_reloads_total",
                                  "Changes of the token or certificate files seen, by file and "
                                  "result (ok; unreadable, empty, invalid: the one before stays)");
  certificate_expiry_ = &Gauges(r, "clusterprof_sidecar_tls_certificate_expiry_timestamp_seconds",
                                "When the serving certificate expires (notAfter, seconds since "
                                "the epoch; 0: no TLS)")
                             .Add({});
}

void SidecarMetrics::RegisterCaptureMetrics(prometheus::Registry& r) {
  captures_ = &Counters(r, "clusterprof_sidecar_captures_total",
                        "Captures finished, by outcome (ok, empty, failed, cancelled)");
  refused_ = &Counters(r, "clusterprof_sidecar_refused_requests_total",
                       "Profile requests refused before capturing, by gRPC status code");
  profile_calls_ = &Gauges(r, "clusterprof_sidecar_profile_calls",
                           "Profile calls in progress (most wait for their capture to end); "
                           "at --max-profile-calls more are refused")
                        .Add({});
  events_ =
      &Counters(r, "clusterprof_sidecar_events_total", "Events collected into XSpaces").Add({});
  dropped_ = &Counters(r, "clusterprof_sidecar_dropped_events_total",
                       "Events lost (full rings, event caps)")
                  .Add({});
  bytes_ = &Counters(r, "clusterprof_sidecar_written_bytes_total", "Bytes of trace files committed")
                .Add({});
  latency_ = Histogram(r, "clusterprof_sidecar_capture_latency_seconds",
                       "From the end of recording to the files committed (collect and write)",
                       {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30});
  start_error_ = Histogram(r, "clusterprof_sidecar_start_error_seconds",
                           "|actual start - requested start_timestamp_ns| of captures that "
                           "asked for a start time",
                           {1e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 5e-3, 1e-2, 0.1, 1});
}

void SidecarMetrics::RegisterStepMetrics(prometheus::Registry& r) {
  step_duration_ =
      Histogram(r, "clusterprof_step_duration_seconds",
                "Duration of the workloads' steps (step markers, live: no capture needed)",
                {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
  steps_ = &Counters(r, "clusterprof_steps_total",
                     "Steps the workloads finished, as seen by the live step telemetry")
                .Add({});
  last_step_ =
      &Gauges(r, "clusterprof_last_step", "Number of the last step a workload finished").Add({});
  last_step_end_ = &Gauges(r, "clusterprof_last_step_end_timestamp_seconds",
                           "When the last step ended (wall clock, seconds since the epoch)")
                        .Add({});
}

void SidecarMetrics::RegisterUploadMetrics(prometheus::Registry& r) {
  uploads_ = &Counters(r, "clusterprof_sidecar_uploads_total",
                       "gs:// uploads by outcome: uploaded (verified), deferred (transient "
                       "errors outlasted the retry deadline; tried again later), failed "
                       "(permanent error; kept in the spool)");
  uploaded_bytes_ = &Counters(r, "clusterprof_sidecar_uploaded_bytes_total",
                              "Bytes uploaded to gs:// and verified")
                         .Add({});
  upload_retries_ = &Counters(r, "clusterprof_sidecar_upload_retries_total",
                              "GCS requests retried after a transient error (408, 429, 5xx, "
                              "broken connections)")
                         .Add({});
  spool_full_ = &Counters(r, "clusterprof_sidecar_spool_full_total",
                          "Writes refused because the upload spool was at --spool-max-bytes")
                     .Add({});
  spool_bytes_ = &Gauges(r, "clusterprof_sidecar_spool_bytes",
                         "Bytes in the upload spool (files waiting for upload)")
                      .Add({});
  spool_files_ = &Gauges(r, "clusterprof_sidecar_spool_files",
                         "Files in the upload spool by state (spooled, uploading, failed)");
}

SidecarMetrics::~SidecarMetrics() = default;

void SidecarMetrics::RequestRefused(std::string_view code) {
  refused_->Add({{"code", std::string(code)}}).Increment();
}

void SidecarMetrics::ProfileCallStarted() { profile_calls_->Increment(); }

void SidecarMetrics::ProfileCallEnded() { profile_calls_->Decrement(); }

void SidecarMetrics::CaptureFinished(std::string_view outcome, const TracerStats& stats,
                                     uint64_t bytes_written, double start_error_seconds,
                                     double latency_seconds) {
  captures_->Add({{"outcome", std::string(outcome)}}).Increment();
  events_->Increment(static_cast<double>(stats.events));
  dropped_->Increment(static_cast<double>(stats.dropped_events));
  bytes_->Increment(static_cast<double>(bytes_written));
  latency_->Observe(latency_seconds);
  if (start_error_seconds != 0) start_error_->Observe(std::fabs(start_error_seconds));
}

void SidecarMetrics::UploadEvent(const storage::UploadEvent& event) {
  using Kind = storage::UploadEvent::Kind;
  switch (event.kind) {
    case Kind::kUploaded:
      uploads_->Add({{"outcome", "uploaded"}}).Increment();
      uploaded_bytes_->Increment(static_cast<double>(event.bytes));
      break;
    case Kind::kDeferred:
      uploads_->Add({{"outcome", "deferred"}}).Increment();
      break;
    case Kind::kFailed:
      uploads_->Add({{"outcome", "failed"}}).Increment();
      break;
    case Kind::kRetry:
      upload_retries_->Increment();
      return;  // carries no spool state
    case Kind::kSpoolFull:
      spool_full_->Increment();
      break;
  }
  spool_bytes_->Set(static_cast<double>(event.spool.used_bytes));
  spool_files_->Add({{"state", "spooled"}}).Set(event.spool.spooled);
  spool_files_->Add({{"state", "uploading"}}).Set(event.spool.uploading);
  spool_files_->Add({{"state", "failed"}}).Set(event.spool.failed);
}

}  // namespace clusterprof::sidecar
