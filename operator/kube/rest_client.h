// A REST client for the Kubernetes API over cpprestsdk: get, list (selectors, paging), create,
// update, patch (merge, JSON, strategic merge), the status subresource, delete, and watch.
// Failed requests come back as absl::Status built from the server's Status body
// (operator/kube/api_error.h). Requests go through a client-side token bucket (QPS and burst,
// as client-go's rest.Config), carry the bearer token of the config (re-asked of its
// TokenSource for every request, so rotated service-account tokens are picked up; after a 401
// the source is invalidated and the request tried once more), and present the client
// certificate when the config has one.
#ifndef CLUSTERPROF_OPERATOR_KUBE_REST_CLIENT_H_
#define CLUSTERPROF_OPERATOR_KUBE_REST_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "cpprest/json.h"
#include "operator/kube/api_client.h"
#include "operator/kube/config.h"
#include "operator/kube/resource.h"

namespace clusterprof::http {
class Transport;
}  // namespace clusterprof::http

namespace clusterprof::kube {

class TokenBucket;

struct RestClientOptions {
  // Client-side rate limit over every request but watches' streaming (client-go's QPS and
  // Burst; its defaults of 5 and 10 are too low for an operator that writes status often).
  // qps <= 0 turns the limit off.
  double qps = 20;
  int burst = 40;
  // Deadline of one request (watch streams excepted: they end by their timeoutSeconds).
  int64_t request_timeout_ns = 30 * kNanosPerSecond;
  // How long a watch may stay silent before the client gives up on it: the server's
  // timeoutSeconds plus this margin.
  int64_t watch_idle_margin_ns = 60 * kNanosPerSecond;
  // The User-Agent header; the config's user_agent wins when set.
  std::string user_agent = "clusterprof";
  // Told of every request but watches (for latency metrics): the HTTP method, the status code
  // (0 when no response came back) and the time from sending to the whole body, rate-limit
  // waits excluded. Called on the requesting thread; must be thread-safe and quick.
  std::function<void(std::string_view method, int code, int64_t latency_ns)> observe_request;
  // What requests go over; nullptr: cpprestsdk with the config's TLS material. Must outlive the
  // client. Watches stream over connections of their own.
  http::Transport* transport = nullptr;
};

// A raw response, for callers that need more than the JSON body.
struct RestResponse {
  int http_code = 0;
  std::string body;
};

// The ApiClient over HTTP. Thread-safe: any number of threads may issue requests at once
// (connections are pooled).
class RestClient final : public ApiClient {
 public:
  // InvalidArgument when the config cannot work (no server, a bad URL, a certificate that does
  // not load); no request is made.
  static absl::StatusOr<std::unique_ptr<RestClient>> Create(RestConfig config, Clock* clock,
                                                            RestClientOptions options = {});
  ~RestClient();
  RestClient(const RestClient&) = delete;
  RestClient& operator=(const RestClient&) = delete;

  const RestConfig& config() const;

  using ApiClient::Delete;
  using ApiClient::Get;
  using ApiClient::List;
  using ApiClient::Patch;
  using ApiClient::Update;
  absl::StatusOr<web::json::value> Get(const ResourceType& type, std::string_view ns,
                                       std::string_view name,
                                       std::string_view subresource) override;
  absl::StatusOr<ObjectList> List(const ResourceType& type, std::string_view ns,
                                  const ListOptions& options) override;
  absl::StatusOr<web::json::value> Create(const ResourceType& type, std::string_view ns,
                                          const web::json::value& object) override;
  absl::StatusOr<web::json::value> Update(const ResourceType& type, std::string_view ns,
                                          const web::json::value& object,
                                          std::string_view subresource) override;
  absl::StatusOr<web::json::value> Patch(const ResourceType& type, std::string_view ns,
                                         std::string_view name, PatchType patch_type,
                                         const web::json::value& patch,
                                         std::string_view subresource) override;
  absl::Status Delete(const ResourceType& type, std::string_view ns, std::string_view name,
                      const DeleteOptions& options) override;
  absl::StatusOr<std::unique_ptr<WatchStream>> Watch(const ResourceType& type, std::string_view ns,
                                                     const ListOptions& options) override;

  // Any request: `path_and_query` starts with "/". `body` may be empty. For tests and the odd
  // endpoint the typed calls do not cover (/version, /readyz).
  absl::StatusOr<RestResponse> Raw(std::string_view method, std::string_view path_and_query,
                                   std::string_view body = "",
                                   std::string_view content_type = "application/json");

  // Requests made (retries after a 401 included) and how long the rate limiter held them.
  int64_t requests() const { return requests_.load(std::memory_order_relaxed); }
  int64_t throttled_ns() const { return throttled_ns_.load(std::memory_order_relaxed); }

  class Impl;

 private:
  RestClient(std::unique_ptr<Impl> impl, Clock* clock, std::unique_ptr<TokenBucket> limiter);

  // Sends a request with a JSON body and returns the JSON response, or the API error.
  absl::StatusOr<web::json::value> DoJson(std::string_view method,
                                          const std::string& path_and_query,
                                          const web::json::value* body,
                                          std::string_view content_type);
  void Throttle();

  std::unique_ptr<Impl> impl_;
  Clock* const clock_;
  std::unique_ptr<TokenBucket> limiter_;
  std::atomic<int64_t> requests_{0};
  std::atomic<int64_t> throttled_ns_{0};
};

// Builds a query string ("?a=b&c=d", "" when empty) from `options`, with `watch` set for
// watches.
std::string EncodeListOptions(const ListOptions& options, bool watch);

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_REST_CLIENT_H_
