// http::Transport: the cpprestsdk transport over real loopback sockets (an answer, a refused
// connection, a server that never answers), and the in-process fake the clients' tests use.
#include "common/http/transport.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/http/health_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/support/fake_http_transport.h"
#include "tests/support/subprocess.h"

namespace clusterprof::http {
namespace {

using ::testing::HasSubstr;

TEST(TransportTest, HeadersAreLookedUpWhateverTheirCase) {
  Response response;
  response.headers = {{"Content-Type", "text/plain"}, {"retry-after", "3"}};
  EXPECT_EQ(response.Header("content-type"), "text/plain");
  EXPECT_EQ(response.Header("Retry-After"), "3");
  EXPECT_EQ(response.Header("Location"), "");
}

TEST(CppRestTransportTest, ReadsAWholeAnswer) {
  auto server = HealthServer::Start(
      "127.0.0.1", 0, [] { return std::string(); }, std::make_shared<prometheus::Registry>());
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<Transport> transport = NewCppRestTransport();
  Request request;
  request.url = "http://127.0.0.1:" + std::to_string((*server)->port()) + "/healthz";
  absl::StatusOr<Response> response = transport->Send(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "ok\n");

  request.url = "http://127.0.0.1:" + std::to_string((*server)->port()) + "/nothing-here";
  response = transport->Send(request);
  ASSERT_TRUE(response.ok()) << "an HTTP error is an answer, not a transport error";
  EXPECT_EQ(response->status, 404);
}

TEST(CppRestTransportTest, NoServerIsUnavailable) {
  std::unique_ptr<Transport> transport = NewCppRestTransport();
  Request request;
  request.url = "http://127.0.0.1:" + std::to_string(testing::UnusedPort()) + "/x";
  absl::StatusOr<Response> response = transport->Send(request);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
}

TEST(CppRestTransportTest, AServerThatNeverAnswersRunsIntoTheRequestsTimeout) {
  // A socket that listens and never accepts: the connection completes in the backlog, and no
  // answer ever comes.
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);

  std::unique_ptr<Transport> transport = NewCppRestTransport({.timeout_ns = 60'000'000'000});
  Request request;
  request.url = "http://127.0.0.1:" + std::to_string(ntohs(address.sin_port)) + "/x";
  request.timeout_ns = 200'000'000;  // the request's own limit wins over the transport's
  absl::StatusOr<Response> response = transport->Send(request);
  close(fd);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kDeadlineExceeded) << response.status();
  EXPECT_THAT(std::string(response.status().message()), HasSubstr("200 ms"));
}

TEST(FakeHttpTransportTest, RoutesByTheLongestBaseAndRecordsEveryRequest) {
  testing::FakeHttpTransport fake;
  fake.Route("http://a", [](const Request&) { return testing::Reply(200, "a"); });
  fake.Route("http://a/special", [](const Request& r) {
    return testing::Reply(201, std::string(r.body.value_or("")));
  });
  Request request;
  request.method = "POST";
  request.url = "http://a/special/1";
  const std::string body = "payload";
  request.body = body;
  request.headers = {{"X-Test", "1"}};
  absl::StatusOr<Response> special = fake.Send(request);
  ASSERT_TRUE(special.ok());
  EXPECT_EQ(special->status, 201);
  EXPECT_EQ(special->body, "payload");
  request.url = "http://a/other";
  EXPECT_EQ(fake.Send(request)->body, "a");
  request.url = "http://b/";
  EXPECT_EQ(fake.Send(request).status().code(), absl::StatusCode::kUnavailable);

  fake.Enqueue(absl::DeadlineExceededError("slow"));
  EXPECT_EQ(fake.Send(request).status().code(), absl::StatusCode::kDeadlineExceeded)
      << "queued answers come first";

  const std::vector<testing::RecordedRequest> sent = fake.Requests();
  ASSERT_EQ(sent.size(), 4u);
  EXPECT_EQ(sent[0].body, "payload");
  EXPECT_EQ(sent[0].Header("x-test"), "1");
}

}  // namespace
}  // namespace clusterprof::http
