#include "tests/support/fake_http_transport.h"

#include "absl/strings/match.h"

namespace clusterprof::testing {

std::string RecordedRequest::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, absl::string_view(name.data(), name.size()))) return value;
  }
  return "";
}

http::Response Reply(int status, std::string body, http::Headers headers) {
  http::Response response;
  response.status = status;
  response.body = std::move(body);
  response.headers = std::move(headers);
  return response;
}

void FakeHttpTransport::Route(std::string base, Handler handler) {
  MutexLock lock(&mu_);
  routes_.emplace_back(std::move(base), std::move(handler));
}

void FakeHttpTransport::Enqueue(absl::StatusOr<http::Response> answer) {
  MutexLock lock(&mu_);
  queued_.push_back(std::move(answer));
}

absl::StatusOr<http::Response> FakeHttpTransport::Send(const http::Request& request) {
  Handler handler;
  {
    MutexLock lock(&mu_);
    requests_.push_back({request.method, request.url, request.headers,
                         request.body.has_value() ? std::string(*request.body) : std::string(),
                         request.content_type, request.timeout_ns});
    if (!queued_.empty()) {
      absl::StatusOr<http::Response> answer = std::move(queued_.front());
      queued_.pop_front();
      return answer;
    }
    size_t best = 0;
    for (const auto& [base, route] : routes_) {
      if (request.url.starts_with(base) && base.size() >= best) {
        best = base.size();
        handler = route;
      }
    }
  }
  // Outside the lock: a handler may take its time, or send requests of its own.
  if (!handler) return absl::UnavailableError("connection refused");
  return handler(request);
}

std::vector<RecordedRequest> FakeHttpTransport::Requests() const {
  MutexLock lock(&mu_);
  return requests_;
}

int FakeHttpTransport::count() const {
  MutexLock lock(&mu_);
  return static_cast<int>(requests_.size());
}

}  // namespace clusterprof::testing
