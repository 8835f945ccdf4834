#include "common/http/health_server.h"

#include <civetweb.h>

#include <mutex>

#include "common/base/strings.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace clusterprof::http {
namespace {

int HandleRequest(mg_connection* connection, void* data) {
  const auto* server = static_cast<const HealthServer*>(data);
  const mg_request_info* info = mg_get_request_info(connection);
  const std::string path = info->local_uri != nullptr ? info->local_uri : "/";
  HealthAnswer response;
  if (std::string_view(info->request_method) != "GET" &&
      std::string_view(info->request_method) != "HEAD") {
    response = {405, "text/plain; charset=utf-8", "only GET and HEAD are served\n"};
  } else {
    response = server->Handle(path);
  }
  mg_printf(connection,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            response.code, mg_get_response_code_text(connection, response.code),
            response.content_type.c_str(), response.body.size());
  if (std::string_view(info->request_method) != "HEAD") {
    mg_write(connection, response.body.data(), response.body.size());
  }
  return response.code;
}

int QuietLog(const mg_connection*, const char*) { return 1; }

}  // namespace

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(
    const std::string& address, int port, ReadinessCheck ready,
    std::shared_ptr<prometheus::Registry> registry, ExtraRoutes extra) {
  static std::once_flag init;
  std::call_once(init, [] { mg_init_library(0); });
  std::unique_ptr<HealthServer> server(
      new HealthServer(std::move(ready), std::move(registry), std::move(extra)));
  const std::string listen = address.find(':') != std::string::npos
                                 ? StrCat("[", address, "]:", port)
                                 : StrCat(address, ":", port);
  const char* options[] = {"listening_ports", listen.c_str(), "num_threads", "2", nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = QuietLog;
  server->context_ = mg_start(&callbacks, nullptr, options);
  if (server->context_ == nullptr) {
    return absl::UnavailableError(StrCat("cannot serve HTTP on ", listen,
                                         " (address in use, or not an address of this host?)"));
  }
  mg_set_request_handler(server->context_, "/", HandleRequest, server.get());
  mg_server_port ports[4];
  const int count = mg_get_server_ports(server->context_, 4, ports);
  if (count < 1) return absl::InternalError(StrCat("HTTP server on ", listen, " has no port"));
  server->port_ = ports[0].port;
  return server;
}

HealthServer::~HealthServer() {
  if (context_ != nullptr) mg_stop(context_);
}

HealthAnswer HealthServer::Handle(const std::string& path) const {
  if (path == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n"};
  if (path == "/readyz") {
    const std::string reason = ready_ ? ready_() : "";
    if (reason.empty()) return {200, "text/plain; charset=utf-8", "ok\n"};
    return {503, "text/plain; charset=utf-8", StrCat(reason, "\n")};
  }
  if (path == "/metrics" && registry_ != nullptr) {
    return {200, "text/plain; version=0.0.4; charset=utf-8",
            prometheus::TextSerializer().Serialize(registry_->Collect())};
  }
  if (extra_) {
    if (std::optional<HealthAnswer> answer = extra_(path)) return *std::move(answer);
  }
  return {404, "text/plain; charset=utf-8", "not found: try /healthz, /readyz or /metrics\n"};
}

}  // namespace clusterprof::http
