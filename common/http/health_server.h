// A small HTTP server for /healthz, /readyz and Prometheus /metrics (the sidecar's and the
// operator's), on civetweb. Handlers run on civetweb's worker threads and must be thread-safe.
#ifndef CLUSTERPROF_COMMON_HTTP_HEALTH_SERVER_H_
#define CLUSTERPROF_COMMON_HTTP_HEALTH_SERVER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

struct mg_context;

namespace clusterprof::http {

struct HealthAnswer {
  int code = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Why the process is not ready, or "" when it is.
using ReadinessCheck = std::function<std::string()>;
// More GET paths: an answer for the paths it serves, nullopt for the others (404).
using ExtraRoutes = std::function<std::optional<HealthAnswer>(const std::string& path)>;

class HealthServer {
 public:
  // Serves on `address`:`port` (port 0 picks a free one):
  //   /healthz  200 "ok" while the process serves at all
  //   /readyz   200 "ok", or 503 with the reason `ready` gives
  //   /metrics  the registry in the Prometheus text format
  //   anything else: `extra`, when given
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(
      const std::string& address, int port, ReadinessCheck ready,
      std::shared_ptr<prometheus::Registry> registry, ExtraRoutes extra = nullptr);
  ~HealthServer();
  HealthServer(const HealthServer&) = delete;
  HealthServer& operator=(const HealthServer&) = delete;

  int port() const { return port_; }

  // Public for civetweb's C callback.
  HealthAnswer Handle(const std::string& path) const;

 private:
  HealthServer(ReadinessCheck ready, std::shared_ptr<prometheus::Registry> registry,
               ExtraRoutes extra)
      : ready_(std::move(ready)), registry_(std::move(registry)), extra_(std::move(extra)) {}

  ReadinessCheck ready_;
  std::shared_ptr<prometheus::Registry> registry_;
  ExtraRoutes extra_;
  mg_context* context_ = nullptr;
  int port_ = 0;
};

}  // namespace clusterprof::http

#endif  // CLUSTERPROF_COMMON_HTTP_HEALTH_SERVER_H_
