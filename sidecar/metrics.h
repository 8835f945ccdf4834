// The sidecar's Prometheus metrics (docs/sidecar.md lists them).
#ifndef CLUSTERPROF_SIDECAR_METRICS_H_
#define CLUSTERPROF_SIDECAR_METRICS_H_

#include <memory>

#include "common/storage/gcs_storage.h"
#include "sidecar/session.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace clusterprof::sidecar {

class SidecarMetrics final : public SessionObserver {
 public:
  SidecarMetrics();
  ~SidecarMetrics() override;

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // Profile requests refused before a session started, by gRPC code name.
  void RequestRefused(std::string_view code);
  // A Profile call came in / was answered (the calls in progress; thread-safe).
  void ProfileCallStarted();
  void ProfileCallEnded();

  void CaptureFinished(std::string_view outcome, const TracerStats& stats, uint64_t bytes_written,
                       double start_error_seconds, double latency_seconds) override;

  // A step the live telemetry saw finish (from the annotation tracer's drainer).
  void StepFinished(int64_t step, int64_t start_ns, int64_t end_ns);

  // What the gs:// uploader did (GcsStorageOptions::observer); thread-safe.
  void UploadEvent(const storage::UploadEvent& event);

  // The gRPC port's guards (docs/security.md); thread-safe. A call refused for its bearer token,
  // by reason (TokenAuth::Options::on_refused).
  void CallUnauthenticated(std::string_view reason);
  // A connection whose handshake failed on the server, by cause (common/grpc/log_bridge.h).
  void HandshakeFailed(std::string_view reason);
  // Connections closed for being over a limit (ConnectionGuard), by which.
  void ConnectionsClosed(std::string_view reason, int count);
  // A credential file ("token", "certificate") changed and was read: "ok" or why not.
  void CredentialReloaded(std::string_view file, std::string_view result);
  // The serving certificate's notAfter, in seconds since the epoch (0: no TLS).
  void SetCertificateExpiry(double not_after_seconds);

 private:
  // The families, by what they watch; each metric declared once with its name and help.
  void RegisterSecurityMetrics(prometheus::Registry& registry);
  void RegisterCaptureMetrics(prometheus::Registry& registry);
  void RegisterStepMetrics(prometheus::Registry& registry);
  void RegisterUploadMetrics(prometheus::Registry& registry);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* captures_;
  prometheus::Family<prometheus::Counter>* refused_;
  prometheus::Gauge* profile_calls_;
  prometheus::Counter* events_;
  prometheus::Counter* dropped_;
  prometheus::Counter* bytes_;
  prometheus::Histogram* latency_;
  prometheus::Histogram* start_error_;
  prometheus::Histogram* step_duration_;
  prometheus::Counter* steps_;
  prometheus::Gauge* last_step_;
  prometheus::Gauge* last_step_end_;
  prometheus::Family<prometheus::Counter>* uploads_;
  prometheus::Counter* uploaded_bytes_;
  prometheus::Counter* upload_retries_;
  prometheus::Counter* spool_full_;
  prometheus::Gauge* spool_bytes_;
  prometheus::Family<prometheus::Gauge>* spool_files_;
  prometheus::Family<prometheus::Counter>* unauthenticated_;
  prometheus::Family<prometheus::Counter>* handshake_failures_;
  prometheus::Family<prometheus::Counter>* connections_closed_;
  prometheus::Family<prometheus::Counter>* credential_reloads_;
  prometheus::Gauge* certificate_expiry_;
};

}  // namespace clusterprof::sidecar

#endif  // CLUSTERPROF_SIDECAR_METRICS_H_
