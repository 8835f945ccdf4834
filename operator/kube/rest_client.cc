#include "operator/kube/rest_client.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <utility>
#include <vector>

#include "boost/asio/ssl.hpp"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/http/stream.h"
#include "common/http/transport.h"
#include "cpprest/base_uri.h"
#include "cpprest/json.h"
#include "operator/kube/api_error.h"
#include "operator/kube/rate_limiter.h"
#include "operator/kube/watch_decoder.h"

namespace clusterprof::kube {
namespace {

// Adds every certificate of a PEM bundle to the context's trust store. Boost's
// add_certificate_authority takes one; kubeconfigs often carry several.
absl::Status AddCertificateAuthorities(boost::asio::ssl::context& context, const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return absl::ResourceExhaustedError("out of memory reading the CA bundle");
  X509_STORE* store = SSL_CTX_get_cert_store(context.native_handle());
  int added = 0;
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store, cert);  // fails only for duplicates, which is harmless
    X509_free(cert);
    ++added;
  }
  // The loop ends on an error (no more PEM blocks) left in this thread's queue; OpenSSL calls
  // later on this thread would read it as theirs.
  ERR_clear_error();
  BIO_free(bio);
  if (added == 0) {
    return absl::InvalidArgumentError("the CA bundle holds no PEM certificate");
  }
  return absl::OkStatus();
}

// Applies the config's TLS material to `context`.
absl::Status ConfigureTls(const RestConfig& config, boost::asio::ssl::context& context) {
  if (!config.ca_pem.empty()) {
    CLUSTERPROF_RETURN_IF_ERROR(AddCertificateAuthorities(context, config.ca_pem));
  }
  if (!config.client_cert_pem.empty() || !config.client_key_pem.empty()) {
    boost::system::error_code error;
    context.use_certificate_chain(
        boost::asio::buffer(config.client_cert_pem.data(), config.client_cert_pem.size()), error);
    if (error) {
      return absl::InvalidArgumentError(
          StrCat("the client certificate does not load: ", error.message()));
    }
    context.use_private_key(
        boost::asio::buffer(config.client_key_pem.data(), config.client_key_pem.size()),
        boost::asio::ssl::context::pem, error);
    if (error) {
      return absl::InvalidArgumentError(StrCat(
          "the client key does not load (or does not match the certificate): ", error.message()));
    }
  }
  return absl::OkStatus();
}

std::string ContentTypeFor(PatchType type) {
  switch (type) {
    case PatchType::kMerge:
      return "application/merge-patch+json";
    case PatchType::kJson:
      return "application/json-patch+json";
    case PatchType::kStrategicMerge:
      return "application/strategic-merge-patch+json";
  }
  return "application/merge-patch+json";
}

std::string EncodeQueryValue(std::string_view value) {
  return web::uri::encode_data_string(std::string(value));
}

absl::StatusOr<web::json::value> ParseJsonBody(std::string_view request, const std::string& body) {
  try {
    std::error_code error;
    web::json::value json = web::json::value::parse(body, error);
    if (error) {
      return absl::InternalError(StrCat(request, ": the response is not JSON (", error.message(),
                                        "): ", body.substr(0, 200)));
    }
    return json;
  } catch (const std::exception& e) {
    return absl::InternalError(
        StrCat(request, ": the response is not JSON (", e.what(), "): ", body.substr(0, 200)));
  }
}

}  // namespace

std::string EncodeListOptions(const ListOptions& options, bool watch) {
  std::vector<std::string> params;
  if (watch) params.push_back("watch=true");
  if (!options.label_selector.empty()) {
    params.push_back(StrCat("labelSelector=", EncodeQueryValue(options.label_selector)));
  }
  if (!options.field_selector.empty()) {
    params.push_back(StrCat("fieldSelector=", EncodeQueryValue(options.field_selector)));
  }
  if (!watch && options.limit > 0) params.push_back(StrCat("limit=", options.limit));
  if (!watch && !options.continue_token.empty()) {
    params.push_back(StrCat("continue=", EncodeQueryValue(options.continue_token)));
  }
  if (!options.resource_version.empty()) {
    params.push_back(StrCat("resourceVersion=", EncodeQueryValue(options.resource_version)));
  }
  if (watch && options.timeout_seconds > 0) {
    params.push_back(StrCat("timeoutSeconds=", options.timeout_seconds));
  }
  if (watch && options.allow_watch_bookmarks) params.push_back("allowWatchBookmarks=true");
  std::string query;
  for (const std::string& param : params) StrAppend(&query, query.empty() ? "?" : "&", param);
  return query;
}

// Requests go over an http::Transport (cpprestsdk unless the options give one), with the
// request deadline. Watches have connections of their own (SocketWatchStream).
class RestClient::Impl {
 public:
  Impl(RestConfig config, const RestClientOptions& options)
      : config_(std::move(config)),
        options_(options),
        user_agent_(config_.user_agent.empty() ? options.user_agent : config_.user_agent),
        owned_transport_(options.transport != nullptr ? nullptr : NewTransport()),
        transport_(options.transport != nullptr ? options.transport : owned_transport_.get()) {}

  const RestConfig& config() const { return config_; }
  const RestClientOptions& options() const { return options_; }
  const std::string& user_agent() const { return user_agent_; }

  // Sends one request, with the current token, and reads the whole response.
  absl::StatusOr<http::Response> Send(const std::string& method, const std::string& path_and_query,
                                      std::string_view body, std::string_view content_type) {
    const std::string what = StrCat(method, " ", path_and_query);
    for (int attempt = 0;; ++attempt) {
      http::Request request;
      request.method = method;
      request.url = config_.server + path_and_query;
      request.headers.emplace_back("Accept", "application/json");
      request.headers.emplace_back("User-Agent", user_agent_);
      if (config_.token != nullptr) {
        absl::StatusOr<std::string> token = config_.token->Token();
        if (!token.ok()) {
          return absl::UnauthenticatedError(StrCat(
              what, ": no bearer token for ", config_.description, ": ", token.status().message()));
        }
        request.headers.emplace_back("Authorization", StrCat("Bearer ", *token));
      }
      if (!body.empty()) {
        request.body = body;
        request.content_type = std::string(content_type);
      }
      absl::StatusOr<http::Response> response = transport_->Send(request);
      if (!response.ok()) {
        if (response.status().code() == absl::StatusCode::kDeadlineExceeded) {
          return absl::DeadlineExceededError(
              StrCat(what, ": no answer from ", config_.server, " in time"));
        }
        return absl::UnavailableError(
            StrCat(what, ": cannot reach ", config_.server, ": ", response.status().message()));
      }
      // A rotated token: ask the source again once.
      if (response->status == 401 && attempt == 0 && config_.token != nullptr) {
        config_.token->Invalidate();
        continue;
      }
      return response;
    }
  }

 private:
  std::unique_ptr<http::Transport> NewTransport() {
    http::CppRestTransportOptions transport;
    transport.timeout_ns = options_.request_timeout_ns;
    transport.validate_certificates = !config_.insecure_skip_tls_verify;
    const RestConfig* rest = &config_;
    transport.configure_tls = [rest](boost::asio::ssl::context& context) {
      // Create() loaded the same material once already, so this cannot fail here.
      (void)ConfigureTls(*rest, context);
    };
    return http::NewCppRestTransport(std::move(transport));
  }

  const RestConfig config_;
  const RestClientOptions options_;
  const std::string user_agent_;
  const std::unique_ptr<http::Transport> owned_transport_;
  http::Transport* const transport_;
};

namespace {

// A watch over a response stream of its own (common/http/stream.h): read on the informer's
// thread, cancelled by shutting its socket down.
class SocketWatchStream final : public WatchStream {
 public:
  SocketWatchStream(std::string what, std::unique_ptr<clusterprof::http::ResponseStream> stream)
      : what_(std::move(what)), stream_(std::move(stream)) {}

  absl::StatusOr<std::optional<WatchEvent>> Next() override {
    while (true) {
      absl::StatusOr<std::optional<WatchEvent>> event = decoder_.Next();
      if (!event.ok()) return Annotate(event.status(), what_);
      if (event->has_value()) return event;
      absl::StatusOr<std::string> bytes = stream_->Read(kChunkBytes);
      if (!bytes.ok()) {
        if (absl::IsDeadlineExceeded(bytes.status())) {
          return absl::UnavailableError(
              StrCat(what_, ": the watch went silent: ", bytes.status().message()));
        }
        return bytes.status();
      }
      if (bytes->empty()) {
        if (decoder_.buffered() > 0) {
          return absl::UnavailableError(StrCat(what_, ": the watch stream ended inside an event"));
        }
        return std::optional<WatchEvent>();
      }
      decoder_.Feed(*bytes);
    }
  }

  void Cancel() override { stream_->Cancel(); }

 private:
  static constexpr size_t kChunkBytes = 64 << 10;

  const std::string what_;
  const std::unique_ptr<clusterprof::http::ResponseStream> stream_;
  WatchDecoder decoder_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RestClient>> RestClient::Create(RestConfig config, Clock* clock,
                                                               RestClientOptions options) {
  if (config.server.empty()) {
    return absl::InvalidArgumentError(
        StrCat("no API server address in ",
               config.description.empty() ? "the client config" : config.description));
  }
  while (EndsWith(config.server, "/")) config.server.pop_back();
  if (!web::uri::validate(config.server) ||
      !(StartsWith(config.server, "https://") || StartsWith(config.server, "http://"))) {
    return absl::InvalidArgumentError(StrCat("the API server address \"", config.server,
                                             "\" is not an http:// or https:// URL (",
                                             config.description, ")"));
  }
  // Load the TLS material once here so that a bad certificate is an error now, with the
  // config's name, rather than a failed handshake on every request.
  try {
    boost::asio::ssl::context context(boost::asio::ssl::context::sslv23);
    if (absl::Status status = ConfigureTls(config, context); !status.ok()) {
      return Annotate(status, config.description);
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(StrCat(config.description, ": TLS setup failed: ", e.what()));
  }
  std::unique_ptr<TokenBucket> limiter;
  if (options.qps > 0) {
    limiter = std::make_unique<TokenBucket>(clock, options.qps, std::max(options.burst, 1));
  }
  try {
    auto impl = std::make_unique<Impl>(std::move(config), options);
    return std::unique_ptr<RestClient>(new RestClient(std::move(impl), clock, std::move(limiter)));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(StrCat("cannot make an HTTP client: ", e.what()));
  }
}

RestClient::RestClient(std::unique_ptr<Impl> impl, Clock* clock,
                       std::unique_ptr<TokenBucket> limiter)
    : impl_(std::move(impl)), clock_(clock), limiter_(std::move(limiter)) {}

RestClient::~RestClient() = default;

const RestConfig& RestClient::config() const { return impl_->config(); }

void RestClient::Throttle() {
  requests_.fetch_add(1, std::memory_order_relaxed);
  if (limiter_ == nullptr) return;
  const int64_t wait_ns = limiter_->ReserveNs();
  if (wait_ns <= 0) return;
  throttled_ns_.fetch_add(wait_ns, std::memory_order_relaxed);
  clock_->SleepForNs(wait_ns);
}

absl::StatusOr<RestResponse> RestClient::Raw(std::string_view method,
                                             std::string_view path_and_query, std::string_view body,
                                             std::string_view content_type) {
  Throttle();
  CLUSTERPROF_ASSIGN_OR_RETURN(
      http::Response response,
      impl_->Send(std::string(method), std::string(path_and_query), body, content_type));
  RestResponse out;
  out.http_code = response.status;
  out.body = std::move(response.body);
  return out;
}

absl::StatusOr<web::json::value> RestClient::DoJson(std::string_view method,
                                                    const std::string& path_and_query,
                                                    const web::json::value* body,
                                                    std::string_view content_type) {
  Throttle();
  const std::string what = StrCat(method, " ", path_and_query);
  const std::string body_text = body == nullptr ? std::string() : body->serialize();
  const int64_t sent_ns = clock_->MonotonicNs();
  int code = 0;
  const auto observe = [&] {
    if (impl_->options().observe_request) {
      impl_->options().observe_request(method, code, clock_->MonotonicNs() - sent_ns);
    }
  };
  absl::StatusOr<http::Response> response =
      impl_->Send(std::string(method), path_and_query, body_text, content_type);
  if (!response.ok()) {
    observe();
    return response.status();
  }
  code = response->status;
  observe();
  const std::string& response_body = response->body;
  if (code < 200 || code > 299) {
    return ApiErrorFromResponse(code, response_body, response->Header("Retry-After"), what);
  }
  return ParseJsonBody(what, response_body);
}

absl::StatusOr<web::json::value> RestClient::Get(const ResourceType& type, std::string_view ns,
                                                 std::string_view name,
                                                 std::string_view subresource) {
  return DoJson("GET", type.ObjectPath(ns, name, subresource), nullptr, "");
}

absl::StatusOr<ObjectList> RestClient::List(const ResourceType& type, std::string_view ns,
                                            const ListOptions& options) {
  const std::string path = StrCat(type.CollectionPath(ns), EncodeListOptions(options, false));
  CLUSTERPROF_ASSIGN_OR_RETURN(web::json::value json, DoJson("GET", path, nullptr, ""));
  ObjectList list;
  if (!json.is_object() || !json.has_object_field("metadata")) {
    return absl::InternalError(StrCat("GET ", path, ": the response is not a list"));
  }
  web::json::value& metadata = json.at("metadata");
  if (metadata.has_string_field("resourceVersion")) {
    list.resource_version = metadata.at("resourceVersion").as_string();
  }
  if (metadata.has_string_field("continue")) {
    list.continue_token = metadata.at("continue").as_string();
  }
  if (json.has_array_field("items")) {
    web::json::array& items = json.at("items").as_array();
    list.items.reserve(items.size());
    for (web::json::value& item : items) list.items.push_back(std::move(item));
  }
  return list;
}

absl::StatusOr<web::json::value> RestClient::Create(const ResourceType& type, std::string_view ns,
                                                    const web::json::value& object) {
  web::json::value body = object;
  if (!body.has_field("apiVersion")) body["apiVersion"] = web::json::value(type.ApiVersion());
  if (!body.has_field("kind") && !type.kind.empty()) body["kind"] = web::json::value(type.kind);
  return DoJson("POST", type.CollectionPath(ns), &body, "application/json");
}

absl::StatusOr<web::json::value> RestClient::Update(const ResourceType& type, std::string_view ns,
                                                    const web::json::value& object,
                                                    std::string_view subresource) {
  if (!object.has_object_field("metadata") || !object.at("metadata").has_string_field("name")) {
    return absl::InvalidArgumentError(
        StrCat("update of ", type.Describe(), ": the object has no metadata.name"));
  }
  const std::string name = object.at("metadata").at("name").as_string();
  web::json::value body = object;
  if (!body.has_field("apiVersion")) body["apiVersion"] = web::json::value(type.ApiVersion());
  if (!body.has_field("kind") && !type.kind.empty()) body["kind"] = web::json::value(type.kind);
  return DoJson("PUT", type.ObjectPath(ns, name, subresource), &body, "application/json");
}

absl::StatusOr<web::json::value> RestClient::Patch(const ResourceType& type, std::string_view ns,
                                                   std::string_view name, PatchType patch_type,
                                                   const web::json::value& patch,
                                                   std::string_view subresource) {
  return DoJson("PATCH", type.ObjectPath(ns, name, subresource), &patch,
                ContentTypeFor(patch_type));
}

absl::Status RestClient::Delete(const ResourceType& type, std::string_view ns,
                                std::string_view name, const DeleteOptions& options) {
  web::json::value body = web::json::value::object();
  body["apiVersion"] = web::json::value("v1");
  body["kind"] = web::json::value("DeleteOptions");
  if (!options.uid.empty() || !options.resource_version.empty()) {
    web::json::value preconditions = web::json::value::object();
    if (!options.uid.empty()) preconditions["uid"] = web::json::value(options.uid);
    if (!options.resource_version.empty()) {
      preconditions["resourceVersion"] = web::json::value(options.resource_version);
    }
    body["preconditions"] = preconditions;
  }
  if (!options.propagation_policy.empty()) {
    body["propagationPolicy"] = web::json::value(options.propagation_policy);
  }
  if (options.grace_period_seconds >= 0) {
    body["gracePeriodSeconds"] = web::json::value(options.grace_period_seconds);
  }
  return DoJson("DELETE", type.ObjectPath(ns, name), &body, "application/json").status();
}

absl::StatusOr<std::unique_ptr<WatchStream>> RestClient::Watch(const ResourceType& type,
                                                               std::string_view ns,
                                                               const ListOptions& options) {
  Throttle();
  const std::string path = StrCat(type.CollectionPath(ns), EncodeListOptions(options, true));
  const std::string what = StrCat("GET ", path);
  const RestConfig& config = impl_->config();
  clusterprof::http::StreamRequest request;
  request.server = config.server;
  request.target = path;
  request.tls = {.ca_pem = config.ca_pem,
                 .client_cert_pem = config.client_cert_pem,
                 .client_key_pem = config.client_key_pem,
                 .insecure_skip_verify = config.insecure_skip_tls_verify};
  request.connect_timeout_ns = impl_->options().request_timeout_ns;
  // The server ends the watch after timeoutSeconds (its default is at most 30 minutes).
  request.idle_timeout_ns =
      (options.timeout_seconds > 0 ? options.timeout_seconds : 1800) * kNanosPerSecond +
      impl_->options().watch_idle_margin_ns;
  for (int attempt = 0;; ++attempt) {
    request.headers = {{"Accept", "application/json"}, {"User-Agent", impl_->user_agent()}};
    if (config.token != nullptr) {
      absl::StatusOr<std::string> token = config.token->Token();
      if (!token.ok()) {
        return absl::UnauthenticatedError(StrCat(what, ": no bearer token for ", config.description,
                                                 ": ", token.status().message()));
      }
      request.headers.emplace_back("Authorization", StrCat("Bearer ", *token));
    }
    CLUSTERPROF_ASSIGN_OR_RETURN(std::unique_ptr<clusterprof::http::ResponseStream> stream,
                                 clusterprof::http::ResponseStream::Open(request));
    const int code = stream->status_code();
    // A rotated token: ask the source again once.
    if (code == 401 && attempt == 0 && config.token != nullptr) {
      config.token->Invalidate();
      continue;
    }
    if (code != 200) {
      CLUSTERPROF_ASSIGN_OR_RETURN(std::string body, stream->ReadAll());
      return ApiErrorFromResponse(code, body, stream->Header("Retry-After"), what);
    }
    return std::unique_ptr<WatchStream>(new SocketWatchStream(what, std::move(stream)));
  }
}

}  // namespace clusterprof::kube
