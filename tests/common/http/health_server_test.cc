// http::HealthServer over a real socket: /healthz, /readyz following a readiness check,
// /metrics from a Prometheus registry, and the answers to other paths and methods.
#include "common/http/health_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "common/base/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace clusterprof::http {
namespace {

using ::testing::HasSubstr;

struct HttpReply {
  int code = 0;
  std::string headers;  // the status line and headers
  std::string body;
  std::string error;  // set when the exchange failed
};

// Sends `method` `path` to 127.0.0.1:`port` over a plain socket (HTTP/1.1, Connection: close)
// and reads the whole reply. Socket timeouts keep a broken server from hanging the test.
HttpReply Request(int port, const std::string& method, const std::string& path) {
  HttpReply reply;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    reply.error = "socket failed";
    return reply;
  }
  timeval timeout{};
  timeout.tv_sec = 30;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    reply.error = "connect failed";
    close(fd);
    return reply;
  }
  const std::string request =
      method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    reply.error = "send failed";
    close(fd);
    return reply;
  }
  std::string raw;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) raw.append(buffer, static_cast<size_t>(n));
  if (n < 0) reply.error = "recv failed or timed out";
  close(fd);
  const size_t end_of_headers = raw.find("\r\n\r\n");
  if (end_of_headers == std::string::npos || raw.compare(0, 9, "HTTP/1.1 ") != 0) {
    reply.error += " malformed reply: " + raw;
    return reply;
  }
  reply.headers = raw.substr(0, end_of_headers);
  reply.body = raw.substr(end_of_headers + 4);
  reply.code = std::stoi(raw.substr(9, 3));
  return reply;
}

// A readiness check the test flips; civetweb calls it from its worker threads.
class Readiness {
 public:
  void Set(std::string reason) {
    MutexLock lock(&mu_);
    reason_ = std::move(reason);
  }
  std::string Get() const {
    MutexLock lock(&mu_);
    return reason_;
  }

 private:
  mutable Mutex mu_;
  std::string reason_ ABSL_GUARDED_BY(mu_);
};

// One server for the suite: civetweb takes up to two seconds to stop.
class HealthServerTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    server_.reset();
    registry_.reset();
  }

  void SetUp() override {
    readiness_.Set("");
    if (server_ != nullptr) return;
    registry_ = std::make_shared<prometheus::Registry>();
    prometheus::BuildCounter()
        .Name("clusterprof_health_test_requests_total")
        .Help("Requests seen by the test")
        .Register(*registry_)
        .Add({{"kind", "probe"}})
        .Increment(3);
    auto server = HealthServer::Start(
        "127.0.0.1", 0, [] { return readiness_.Get(); }, registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
  }

  static Readiness readiness_;
  static std::shared_ptr<prometheus::Registry> registry_;
  static std::unique_ptr<HealthServer> server_;
};

Readiness HealthServerTest::readiness_;
std::shared_ptr<prometheus::Registry> HealthServerTest::registry_;
std::unique_ptr<HealthServer> HealthServerTest::server_;

TEST_F(HealthServerTest, HealthzIsOk) {
  const HttpReply reply = Request(server_->port(), "GET", "/healthz");
  ASSERT_EQ(reply.error, "");
  EXPECT_EQ(reply.code, 200);
  EXPECT_EQ(reply.body, "ok\n");
  EXPECT_THAT(reply.headers, HasSubstr("Content-Type: text/plain"));
  EXPECT_THAT(reply.headers, HasSubstr("Content-Length: 3"));
}

TEST_F(HealthServerTest, ReadyzFollowsTheReadinessCheck) {
  HttpReply reply = Request(server_->port(), "GET", "/readyz");
  ASSERT_EQ(reply.error, "");
  EXPECT_EQ(reply.code, 200);
  EXPECT_EQ(reply.body, "ok\n");

  readiness_.Set("annotation tracer: cannot open /var/run/clusterprof");
  reply = Request(server_->port(), "GET", "/readyz");
  ASSERT_EQ(reply.error, "");
  EXPECT_EQ(reply.code, 503);
  EXPECT_EQ(reply.body, "annotation tracer: cannot open /var/run/clusterprof\n");
  // Liveness does not depend on readiness.
  EXPECT_EQ(Request(server_->port(), "GET", "/healthz").code, 200);

  readiness_.Set("");
  EXPECT_EQ(Request(server_->port(), "GET", "/readyz").code, 200);
}

TEST_F(HealthServerTest, MetricsServesTheRegistryInTheTextFormat) {
  const HttpReply reply = Request(server_->port(), "GET", "/metrics");
  ASSERT_EQ(reply.error, "");
  EXPECT_EQ(reply.code, 200);
  EXPECT_THAT(reply.headers, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(reply.body, HasSubstr("# TYPE clusterprof_health_test_requests_total counter"));
  EXPECT_THAT(reply.body, HasSubstr("clusterprof_health_test_requests_total{kind=\"probe\"} 3"));
}

TEST_F(HealthServerTest, UnknownPathIsNotFound) {
  const HttpReply reply = Request(server_->port(), "GET", "/nope");
  ASSERT_EQ(reply.error, "");
  EXPECT_EQ(reply.code, 404);
  EXPECT_THAT(reply.body, HasSubstr("/healthz"));
}

TEST_F(HealthServerTest, OnlyGetAndHeadAreServed) {
  const HttpReply post = Request(server_->port(), "POST", "/healthz");
  ASSERT_EQ(post.error, "");
  EXPECT_EQ(post.code, 405);

  const HttpReply head = Request(server_->port(), "HEAD", "/healthz");
  ASSERT_EQ(head.error, "");
  EXPECT_EQ(head.code, 200);
  EXPECT_THAT(head.headers, HasSubstr("Content-Length: 3"));
  EXPECT_EQ(head.body, "");
}

TEST(HealthServerStartTest, NoRegistryMeansNoMetricsAndNoCheckMeansReady) {
  auto server = HealthServer::Start("127.0.0.1", 0, nullptr, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(Request((*server)->port(), "GET", "/readyz").code, 200);
  EXPECT_EQ(Request((*server)->port(), "GET", "/metrics").code, 404);
}

TEST(HealthServerStartTest, PortInUseIsUnavailable) {
  auto first = HealthServer::Start("127.0.0.1", 0, nullptr, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = HealthServer::Start("127.0.0.1", (*first)->port(), nullptr, nullptr);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("127.0.0.1:" + std::to_string((*first)->port())));
}

}  // namespace
}  // namespace clusterprof::http
