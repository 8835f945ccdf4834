// The admission webhook's HTTPS server (Boost.Beast over Boost.Asio and OpenSSL): POST /mutate-pods
// answers AdmissionReviews with webhook::Review (injection.h). The certificate and key (tls.crt,
// tls.key in a mounted Secret) are re-read when they change, so a rotated certificate is served
// without a restart. Runs on every operator replica, leader or not.
#ifndef CLUSTERPROF_OPERATOR_WEBHOOK_WEBHOOK_SERVER_H_
#define CLUSTERPROF_OPERATOR_WEBHOOK_WEBHOOK_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "operator/webhook/injection.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace clusterprof::webhook {

struct WebhookServerOptions {
  std::string address = "0.0.0.0";
  // 0 picks a free port.
  int port = 9443;
  // Holds tls.crt (the certificate, then any intermediates) and tls.key (PEM).
  std::string cert_dir = "/etc/clusterprof/webhook";
  InjectionConfig injection;
  // clusterprof_webhook_admissions_total{outcome} and the latency histogram go here; may be null.
  std::shared_ptr<prometheus::Registry> registry;
  // Times requests and the certificate re-reads; nullptr: the system clocks.
  Clock* clock = nullptr;
};

class WebhookServer {
 public:
  // Fails when the certificate or key cannot be read, or the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<WebhookServer>> Start(WebhookServerOptions options);
  ~WebhookServer();
  WebhookServer(const WebhookServer&) = delete;
  WebhookServer& operator=(const WebhookServer&) = delete;

  int port() const { return port_; }

  class Impl;

 private:
  struct Network;  // Boost.Asio and Beast stay out of this header
  explicit WebhookServer(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  std::unique_ptr<Network> network_;
  int port_ = 0;
};

}  // namespace clusterprof::webhook

#endif  // CLUSTERPROF_OPERATOR_WEBHOOK_WEBHOOK_SERVER_H_
