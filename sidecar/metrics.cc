#include "sidecar/metrics.h"

#include <cmath>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace clusterprof::sidecar {

SidecarMetrics::SidecarMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  captures_ = &prometheus::BuildCounter()
                   .Name("clusterprof_sidecar_captures_total")
                   .Help("Captures finished, by outcome (ok, empty, failed, cancelled)")
                   .Register(*registry_);
  refused_ = &prometheus::BuildCounter()
                  .Name("clusterprof_sidecar_refused_requests_total")
                  .Help("Profile requests refused before capturing, by gRPC status code")
                  .Register(*registry_);
  events_ = &prometheus::BuildCounter()
                 .Name("clusterprof_sidecar_events_total")
                 .Help("Events collected into XSpaces")
                 .Register(*registry_)
                 .Add({});
  dropped_ = &prometheus::BuildCounter()
                  .Name("clusterprof_sidecar_dropped_events_total")
                  .Help("Events lost (full rings, event caps)")
                  .Register(*registry_)
                  .Add({});
  bytes_ = &prometheus::BuildCounter()
                .Name("clusterprof_sidecar_written_bytes_total")
                .Help("Bytes of trace files committed")
                .Register(*registry_)
                .Add({});
  latency_ = &prometheus::BuildHistogram()
                  .Name("clusterprof_sidecar_capture_latency_seconds")
                  .Help("From the end of recording to the files committed (collect and write)")
                  .Register(*registry_)
                  .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.05, 0.1, 0.25, 0.5, 1,
                                                                   2.5, 5, 10, 30});
  start_error_ = &prometheus::BuildHistogram()
                      .Name("clusterprof_sidecar_start_error_seconds")
                      .Help(
                          "|actual start - requested start_timestamp_ns| of captures that "
                          "asked for a start time")
                      .Register(*registry_)
                      .Add({}, prometheus::Histogram::BucketBoundaries{1e-5, 5e-5, 1e-4, 2e-4, 5e-4,
                                                                       1e-3, 5e-3, 1e-2, 0.1, 1});
}

SidecarMetrics::~SidecarMetrics() = default;

void SidecarMetrics::RequestRefused(std::string_view code) {
  refused_->Add({{"code", std::string(code)}}).Increment();
}

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

}  // namespace clusterprof::sidecar
