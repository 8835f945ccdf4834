// ResponseStream against a scripted HTTP server on loopback: chunked bodies arrive as they are
// sent, Cancel() ends a blocked read from another thread, silence past the idle limit and broken
// connections are errors, and error answers can be read whole.
#include "common/http/stream.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <thread>

#include "common/base/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::http {
namespace {

using ::testing::HasSubstr;

// Accepts one connection, reads the request head, then runs `script` with the socket.
class OneShotServer {
 public:
  explicit OneShotServer(std::function<void(int fd, const std::string& request)> script) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    listen(listen_fd_, 1);
    socklen_t size = sizeof(address);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &size);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this, script = std::move(script)] {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      std::string request;
      char buffer[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
        if (got <= 0) break;
        request.append(buffer, static_cast<size_t>(got));
      }
      script(fd, request);
      close(fd);
    });
  }
  ~OneShotServer() {
    shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    close(listen_fd_);
  }
  std::string server() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

void Send(int fd, const std::string& data) { send(fd, data.data(), data.size(), MSG_NOSIGNAL); }

StreamRequest RequestTo(const OneShotServer& server) {
  StreamRequest request;
  request.server = server.server();
  request.target = "/api/v1/pods?watch=true";
  request.headers = {{"Authorization", "Bearer t"}};
  request.connect_timeout_ns = 10 * kNanosPerSecond;
  return request;
}

TEST(ResponseStreamTest, ReadsAChunkedBodyAsItArrives) {
  Notification second_chunk;
  std::string seen_request;
  OneShotServer server([&](int fd, const std::string& request) {
    seen_request = request;
    Send(fd,
         "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
         "Transfer-Encoding: chunked\r\n\r\n6\r\nevent1\r\n");
    second_chunk.WaitForNotification();
    Send(fd, "6\r\nevent2\r\n0\r\n\r\n");
  });
  absl::StatusOr<std::unique_ptr<ResponseStream>> stream = ResponseStream::Open(RequestTo(server));
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->status_code(), 200);
  EXPECT_EQ((*stream)->Header("Content-Type"), "application/json");
  EXPECT_EQ(*(*stream)->Read(), "event1") << "the first chunk, before the second is sent";
  second_chunk.Notify();
  EXPECT_EQ(*(*stream)->Read(), "event2");
  EXPECT_EQ(*(*stream)->Read(), "") << "the end of the body";
  EXPECT_THAT(seen_request, HasSubstr("GET /api/v1/pods?watch=true HTTP/1.1\r\n"));
  EXPECT_THAT(seen_request, HasSubstr("Authorization: Bearer t\r\n"));
}

TEST(ResponseStreamTest, CancelEndsABlockedReadFromAnotherThread) {
  Notification done;
  OneShotServer server([&](int fd, const std::string&) {
    Send(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    done.WaitForNotification();  // never sends a byte of the body
  });
  absl::StatusOr<std::unique_ptr<ResponseStream>> stream = ResponseStream::Open(RequestTo(server));
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::thread canceller([&] { (*stream)->Cancel(); });
  const absl::StatusOr<std::string> read = (*stream)->Read();
  canceller.join();
  EXPECT_EQ(read.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(read.status().message(), HasSubstr("cancelled"));
  EXPECT_EQ((*stream)->Read().status().code(), absl::StatusCode::kUnavailable);
  done.Notify();
}

TEST(ResponseStreamTest, SilencePastTheIdleLimitIsDeadlineExceeded) {
  Notification done;
  OneShotServer server([&](int fd, const std::string&) {
    Send(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    done.WaitForNotification();
  });
  StreamRequest request = RequestTo(server);
  request.idle_timeout_ns = 50 * kNanosPerMilli;
  absl::StatusOr<std::unique_ptr<ResponseStream>> stream = ResponseStream::Open(request);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->Read().status().code(), absl::StatusCode::kDeadlineExceeded);
  done.Notify();
}

TEST(ResponseStreamTest, AConnectionClosedInsideTheBodyIsUnavailable) {
  OneShotServer server([&](int fd, const std::string&) {
    Send(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nevent1\r\n");
  });
  absl::StatusOr<std::unique_ptr<ResponseStream>> stream = ResponseStream::Open(RequestTo(server));
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(*(*stream)->Read(), "event1");
  const absl::StatusOr<std::string> read = (*stream)->Read();
  EXPECT_EQ(read.status().code(), absl::StatusCode::kUnavailable) << read.status();
}

TEST(ResponseStreamTest, AnErrorAnswerIsReadWhole) {
  OneShotServer server([&](int fd, const std::string&) {
    Send(fd,
         "HTTP/1.1 410 Gone\r\nContent-Length: 16\r\nRetry-After: 3\r\n\r\n{\"reason\":\"Gone\"");
  });
  absl::StatusOr<std::unique_ptr<ResponseStream>> stream = ResponseStream::Open(RequestTo(server));
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->status_code(), 410);
  EXPECT_EQ((*stream)->Header("Retry-After"), "3");
  EXPECT_EQ(*(*stream)->ReadAll(), "{\"reason\":\"Gone\"");
}

TEST(ResponseStreamTest, NobodyListeningIsUnavailableAndABadUrlIsInvalid) {
  StreamRequest request;
  request.server = "http://127.0.0.1:1";
  request.target = "/";
  EXPECT_EQ(ResponseStream::Open(request).status().code(), absl::StatusCode::kUnavailable);
  request.server = "ftp://example";
  EXPECT_EQ(ResponseStream::Open(request).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace clusterprof::http
