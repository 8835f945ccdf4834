#include "common/http/transport.h"

#include <chrono>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/mutex.h"
#include "cpprest/http_client.h"
#include "cpprest/rawptrstream.h"

namespace clusterprof::http {

std::string Response::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, absl::string_view(name.data(), name.size()))) return value;
  }
  return "";
}

namespace {

namespace rest = web::http;

class CppRestTransport final : public Transport {
 public:
  explicit CppRestTransport(CppRestTransportOptions options) : options_(std::move(options)) {}

  absl::StatusOr<Response> Send(const Request& request) override {
    // "scheme://authority" and the path with its query.
    const size_t scheme_end = request.url.find("://");
    const size_t path_start =
        scheme_end == std::string::npos ? std::string::npos : request.url.find('/', scheme_end + 3);
    const std::string base =
        path_start == std::string::npos ? request.url : request.url.substr(0, path_start);
    const std::string path = path_start == std::string::npos ? "/" : request.url.substr(path_start);
    const int64_t timeout_ns = request.timeout_ns > 0 ? request.timeout_ns : options_.timeout_ns;
    try {
      rest::http_request out(request.method);
      out.set_request_uri(path);
      for (const auto& [name, value] : request.headers) out.headers().add(name, value);
      if (request.body.has_value()) {
        // Straight from the caller's buffer: no copy. Bytes, not a std::string: cpprestsdk's
        // string body path reads a char buffer through an unsigned char stream buffer, which
        // UBSan's vptr check rejects.
        out.set_body(
            concurrency::streams::rawptr_stream<uint8_t>::open_istream(
                reinterpret_cast<const uint8_t*>(request.body->data()), request.body->size()),
            request.body->size(), request.content_type);
      } else if (request.method == "PUT" || request.method == "POST") {
        out.headers().set_content_length(0);
      }
      rest::http_response answer = ClientFor(base, timeout_ns).request(out).get();
      Response response;
      response.status = answer.status_code();
      for (const auto& [name, value] : answer.headers()) response.headers.emplace_back(name, value);
      const std::vector<unsigned char> bytes = answer.extract_vector().get();
      response.body.assign(bytes.begin(), bytes.end());
      return response;
    } catch (const rest::http_exception& e) {
      if (e.error_code() == std::errc::timed_out) {
        return absl::DeadlineExceededError(
            absl::StrCat("no answer within ", timeout_ns / 1'000'000, " ms"));
      }
      return absl::UnavailableError(e.what());
    } catch (const std::exception& e) {
      return absl::UnavailableError(e.what());
    }
  }

 private:
  rest::client::http_client& ClientFor(const std::string& base, int64_t timeout_ns) {
    MutexLock lock(&mu_);
    std::unique_ptr<rest::client::http_client>& client = clients_[{base, timeout_ns}];
    if (client == nullptr) {
      rest::client::http_client_config config;
      config.set_timeout(std::chrono::microseconds(std::max<int64_t>(timeout_ns / 1000, 1)));
      config.set_max_redirects(0);
      if (options_.chunk_size > 0) config.set_chunksize(options_.chunk_size);
      config.set_validate_certificates(options_.validate_certificates);
      if (options_.configure_tls) config.set_ssl_context_callback(options_.configure_tls);
      client = std::make_unique<rest::client::http_client>(base, config);
    }
    return *client;
  }

  const CppRestTransportOptions options_;
  Mutex mu_;
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<rest::client::http_client>> clients_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Transport> NewCppRestTransport(CppRestTransportOptions options) {
  return std::make_unique<CppRestTransport>(std::move(options));
}

}  // namespace clusterprof::http
