#include "sidecar/connection_guard.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::sidecar {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

constexpr auto kWait = std::chrono::seconds(20);

// GetInfo answers OK; enough for a real call to go through.
class InfoOnly final : public v1alpha1::Sidecar::Service {
  grpc::Status GetInfo(grpc::ServerContext*, const v1alpha1::GetInfoRequest*,
                       v1alpha1::GetInfoResponse* response) override {
    response->set_version("test");
    return grpc::Status::OK;
  }
};

// A TCP socket bound to `source` (IPv4 or IPv6), connected to `destination`:`port`; -1 on failure.
int ConnectFrom(const std::string& source, const std::string& destination, int port) {
  const bool v6 = destination.find(':') != std::string::npos;
  const int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_storage from = {};
  sockaddr_storage to = {};
  socklen_t length = 0;
  if (v6) {
    auto& from6 = reinterpret_cast<sockaddr_in6&>(from);
    auto& to6 = reinterpret_cast<sockaddr_in6&>(to);
    from6.sin6_family = to6.sin6_family = AF_INET6;
    inet_pton(AF_INET6, source.c_str(), &from6.sin6_addr);
    inet_pton(AF_INET6, destination.c_str(), &to6.sin6_addr);
    to6.sin6_port = htons(port);
    length = sizeof(sockaddr_in6);
  } else {
    auto& from4 = reinterpret_cast<sockaddr_in&>(from);
    auto& to4 = reinterpret_cast<sockaddr_in&>(to);
    from4.sin_family = to4.sin_family = AF_INET;
    inet_pton(AF_INET, source.c_str(), &from4.sin_addr);
    inet_pton(AF_INET, destination.c_str(), &to4.sin_addr);
    to4.sin_port = htons(port);
    length = sizeof(sockaddr_in);
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), length) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&to), length) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the server has ended the connection: reads what is there (gRPC's server sends its
// SETTINGS frame first) and reports EOF or a reset.
bool Ended(int fd) {
  char buffer[512];
  while (true) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n > 0) continue;
    if (n == 0) return true;
    if (errno == EINTR) continue;
    return errno != EAGAIN && errno != EWOULDBLOCK;
  }
}

// How many of `fds` the server has ended, once that is at least `count` or after kWait: poll()
// on those still open, so this returns as soon as the last of them ends.
int AwaitEnded(const std::vector<int>& fds, int count) {
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (true) {
    std::vector<pollfd> open;
    int ended = 0;
    for (int fd : fds) {
      if (Ended(fd)) {
        ++ended;
      } else {
        open.push_back({.fd = fd, .events = POLLIN, .revents = 0});
      }
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (ended >= count || left.count() <= 0 || open.empty()) return ended;
    poll(open.data(), open.size(), static_cast<int>(left.count()));
  }
}

int CountEnded(const std::vector<int>& fds) {
  int ended = 0;
  for (int fd : fds) ended += Ended(fd) ? 1 : 0;
  return ended;
}

class ConnectionGuardTest : public ::testing::Test {
 protected:
  void StartServer(const std::string& address = "127.0.0.1:0") {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port_, 0);
  }

  void TearDown() override {
    for (int fd : fds_) close(fd);
    if (server_) server_->Shutdown();
  }

  // `n` idle connections from `source`.
  std::vector<int> Connect(const std::string& source, int n,
                           const std::string& destination = "127.0.0.1") {
    std::vector<int> fds;
    for (int i = 0; i < n; ++i) {
      const int fd = ConnectFrom(source, destination, port_);
      EXPECT_GE(fd, 0) << "connect from " << source;
      if (fd < 0) continue;
      fds.push_back(fd);
      fds_.push_back(fd);
    }
    return fds;
  }

  // A sweep that shuts nothing down, once it sees `count` connections (gRPC accepts them on its
  // own threads) or after kWait.
  ConnectionSweep AwaitConnections(int count) {
    ConnectionGuard counter({.port = port_, .max_per_peer = 1 << 30, .max_total = 1 << 30});
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (true) {
      absl::StatusOr<ConnectionSweep> sweep = counter.Sweep();
      EXPECT_TRUE(sweep.ok()) << sweep.status();
      if (!sweep.ok()) return {};
      if (sweep->connections >= count || std::chrono::steady_clock::now() > deadline) {
        return *sweep;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  // GetInfo over a real gRPC channel from 127.0.0.1, which stays open until the test ends.
  grpc::Status CallGetInfo() {
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
    auto stub = v1alpha1::Sidecar::NewStub(channel_);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kWait);
    v1alpha1::GetInfoResponse response;
    return stub->GetInfo(&context, v1alpha1::GetInfoRequest(), &response);
  }

  InfoOnly service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::vector<int> fds_;
};

TEST_F(ConnectionGuardTest, ShutsDownTheExcessOfOnePeer) {
  StartServer();
  const std::vector<int> crowd = Connect("127.0.0.2", 10);
  const std::vector<int> modest = Connect("127.0.0.3", 3);
  ASSERT_EQ(AwaitConnections(13).connections, 13);

  Mutex mu;
  std::vector<std::pair<std::string, int>> refused;
  ConnectionGuard guard(
      {.port = port_, .max_per_peer = 4, .on_refused = [&](std::string_view reason, int n) {
         MutexLock lock(&mu);
         refused.emplace_back(reason, n);
       }});
  absl::StatusOr<ConnectionSweep> sweep = guard.Sweep();
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_EQ(sweep->connections, 13);
  EXPECT_THAT(sweep->per_peer, ElementsAre(Pair("127.0.0.2", 10), Pair("127.0.0.3", 3)));
  EXPECT_EQ(sweep->shut_down_per_peer, 6);
  EXPECT_EQ(sweep->shut_down_total, 0);
  EXPECT_EQ(guard.refused(kRefusedPerPeer), 6);
  EXPECT_EQ(guard.refused(kRefusedTotal), 0);
  {
    MutexLock lock(&mu);
    EXPECT_THAT(refused, ElementsAre(Pair("per_peer", 6)));
  }

  EXPECT_EQ(AwaitEnded(crowd, 6), 6);
  // The guard's view afterwards: the four left to 127.0.0.2 and all of 127.0.0.3's.
  const ConnectionSweep after = AwaitConnections(7);
  EXPECT_EQ(after.connections, 7);
  EXPECT_THAT(after.per_peer, ElementsAre(Pair("127.0.0.2", 4), Pair("127.0.0.3", 3)));
  EXPECT_EQ(CountEnded(crowd), 6);
  EXPECT_EQ(CountEnded(modest), 0);

  // The server still serves: a real call from 127.0.0.1.
  EXPECT_TRUE(CallGetInfo().ok());
  // A second sweep finds nothing over the cap (the call's connection is one of 127.0.0.1's).
  sweep = guard.Sweep();
  ASSERT_TRUE(sweep.ok());
  EXPECT_EQ(sweep->shut_down_per_peer + sweep->shut_down_total, 0);
  EXPECT_EQ(sweep->per_peer["127.0.0.1"], 1);
}

TEST_F(ConnectionGuardTest, ShutsDownTheNewestBeyondTheTotal) {
  StartServer();
  ConnectionGuard guard({.port = port_, .max_per_peer = 64, .max_total = 6});
  const std::vector<int> first = Connect("127.0.0.2", 5);
  ASSERT_EQ(AwaitConnections(5).connections, 5);
  absl::StatusOr<ConnectionSweep> sweep = guard.Sweep();
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_EQ(sweep->shut_down_total, 0);

  const std::vector<int> second = Connect("127.0.0.3", 5);
  ASSERT_EQ(AwaitConnections(10).connections, 10);
  sweep = guard.Sweep();
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_EQ(sweep->connections, 10);
  EXPECT_EQ(sweep->shut_down_per_peer, 0);
  EXPECT_EQ(sweep->shut_down_total, 4);
  EXPECT_EQ(guard.refused(kRefusedTotal), 4);

  // The four shut down are the second peer's, which the guard saw after the first's.
  EXPECT_EQ(AwaitEnded(second, 4), 4);
  EXPECT_EQ(AwaitConnections(6).connections, 6);
  EXPECT_EQ(CountEnded(first), 0);
  EXPECT_EQ(CountEnded(second), 4);
  EXPECT_TRUE(CallGetInfo().ok());
}

TEST_F(ConnectionGuardTest, PerPeerCapFirstThenTotal) {
  StartServer();
  const std::vector<int> crowd = Connect("127.0.0.2", 10);
  const std::vector<int> modest = Connect("127.0.0.3", 3);
  ASSERT_EQ(AwaitConnections(13).connections, 13);

  ConnectionGuard guard({.port = port_, .max_per_peer = 4, .max_total = 5});
  absl::StatusOr<ConnectionSweep> sweep = guard.Sweep();
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_EQ(sweep->shut_down_per_peer, 6);
  EXPECT_EQ(sweep->shut_down_total, 2);
  std::vector<int> all = crowd;
  all.insert(all.end(), modest.begin(), modest.end());
  EXPECT_EQ(AwaitEnded(all, 8), 8);
  EXPECT_EQ(AwaitConnections(5).connections, 5);
}

TEST_F(ConnectionGuardTest, IgnoresListenersAndClientSockets) {
  StartServer();
  // Only the listener: nothing to count.
  ConnectionGuard guard({.port = port_, .max_per_peer = 1, .max_total = 1});
  absl::StatusOr<ConnectionSweep> sweep = guard.Sweep();
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_EQ(sweep->connections, 0);
  // One connection: its server side counts, its client side (this process's too, but its local
  // port is not the server's) does not.
  const std::vector<int> one = Connect("127.0.0.2", 1);
  ASSERT_EQ(AwaitConnections(1).connections, 1);
  sweep = guard.Sweep();
  ASSERT_TRUE(sweep.ok());
  EXPECT_EQ(sweep->connections, 1);
  EXPECT_EQ(sweep->shut_down_per_peer + sweep->shut_down_total, 0);
  EXPECT_EQ(guard.sweeps(), 2);
}

TEST_F(ConnectionGuardTest, IPv6AndMappedPeers) {
  StartServer("[::]:0");
  const std::vector<int> v4 = Connect("127.0.0.2", 2);
  const std::vector<int> v6 = Connect("::1", 3, "::1");
  const ConnectionSweep sweep = AwaitConnections(5);
  EXPECT_EQ(sweep.connections, 5);
  EXPECT_THAT(sweep.per_peer, ElementsAre(Pair("127.0.0.2", 2), Pair("::1", 3)));

  ConnectionGuard guard({.port = port_, .max_per_peer = 1});
  absl::StatusOr<ConnectionSweep> capped = guard.Sweep();
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->shut_down_per_peer, 3);
  EXPECT_EQ(AwaitEnded(v6, 2), 2);
  EXPECT_EQ(AwaitEnded(v4, 1), 1);
}

TEST_F(ConnectionGuardTest, UnreadableProcIsAnError) {
  ConnectionGuard guard({.port = 1, .proc_dir = "/nonexistent/proc"});
  absl::StatusOr<ConnectionSweep> sweep = guard.Sweep();
  EXPECT_EQ(sweep.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(sweep.status().message()), ::testing::HasSubstr("/nonexistent/proc"));
}

TEST_F(ConnectionGuardTest, StartValidatesOptions) {
  EXPECT_EQ(ConnectionGuard({.port = 0}).Start().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConnectionGuard({.port = 80, .max_per_peer = 0}).Start().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConnectionGuard({.port = 80, .interval_ns = 0}).Start().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ConnectionGuardTest, ThreadSweepsEveryIntervalUntilStopped) {
  StartServer();
  const std::vector<int> crowd = Connect("127.0.0.2", 3);
  ASSERT_EQ(AwaitConnections(3).connections, 3);

  SimulatedClock clock;
  ConnectionGuard guard(
      {.port = port_, .max_per_peer = 2, .interval_ns = 10 * kNanosPerSecond, .clock = &clock});
  ASSERT_TRUE(guard.Start().ok());
  EXPECT_EQ(guard.Start().code(), absl::StatusCode::kFailedPrecondition);
  // The first sweep runs at once, then the thread sleeps out the interval.
  clock.WaitForSleepers(1);
  EXPECT_EQ(guard.sweeps(), 1);
  EXPECT_EQ(guard.refused(kRefusedPerPeer), 1);
  EXPECT_EQ(AwaitEnded(crowd, 1), 1);

  const std::vector<int> more = Connect("127.0.0.2", 2);
  ASSERT_EQ(AwaitConnections(4).connections, 4);
  clock.AdvanceNs(10 * kNanosPerSecond);
  // The second sweep: it saw the two new connections first, so they are the ones that go.
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (guard.sweeps() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  clock.WaitForSleepers(1);
  EXPECT_EQ(guard.sweeps(), 2);
  EXPECT_EQ(guard.refused(kRefusedPerPeer), 3);
  EXPECT_EQ(AwaitEnded(more, 2), 2);
  guard.Stop();
  guard.Stop();
  EXPECT_EQ(guard.sweeps(), 2);
}

}  // namespace
}  // namespace clusterprof::sidecar
