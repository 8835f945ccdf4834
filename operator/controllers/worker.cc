#include "operator/controllers/worker.h"

#include <optional>

#include "spdlog/spdlog.h"

namespace clusterprof::controllers {

void RunWorker(kube::RateLimitingQueue& queue, std::string_view controller,
               OperatorMetrics* metrics,
               const std::function<absl::Status(const std::string& key)>& reconcile) {
  while (std::optional<std::string> key = queue.Get()) {
    const absl::Status status = reconcile(*key);
    if (metrics != nullptr) metrics->ReconcileFinished(controller, status.ok());
    if (status.ok()) {
      queue.Forget(*key);
    } else {
      spdlog::warn("{} {}: {} (retrying)", controller, *key, std::string(status.message()));
      queue.AddRateLimited(*key);
    }
    queue.Done(*key);
  }
}

}  // namespace clusterprof::controllers
