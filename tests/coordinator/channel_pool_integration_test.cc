// ChannelPool against a server in another process, so that no thread of this one polls gRPC's
// sockets but the pool's own: a warmed connection must be ready before any call is made on it.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "common/base/strings.h"
#include "coordinator/connector.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::coordinator {
namespace {

using testing::Subprocess;
using testing::TempDir;

constexpr char kStandIn[] = CLUSTERPROF_STAND_IN_PATH;

// gRPC advances a connection (its TCP connect, TLS handshake, HTTP/2 settings) only while some
// thread polls. Without the pool's poller, a warmed connection would sit half made until the
// first capture's calls polled (then paying the handshakes on the capture's path) or gRPC's
// backup poller came by, every 5 s by default; pushed far off here so that it cannot pass this
// test in the pool's stead.
TEST(ChannelPoolIntegrationTest, AWarmedConnectionIsReadyBeforeAnyCall) {
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "600000", /*overwrite=*/1);
  TempDir root;
  Subprocess server({kStandIn, "--port-file", root.Join("server.port")}, {},
                    root.Join("server.log"));
  const int port = testing::ReadGrpcPort(root.Join("server.port"));
  ASSERT_GT(port, 0);
  const std::string address = StrCat("127.0.0.1:", port);

  ChannelPool pool({});
  ASSERT_TRUE(pool.Warm(address));
  std::shared_ptr<grpc::Channel> channel = pool.Get(address);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/false);
  while (state != GRPC_CHANNEL_READY && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    state = channel->GetState(/*try_to_connect=*/false);  // reads the state; polls nothing
  }
  EXPECT_EQ(state, GRPC_CHANNEL_READY) << "the warmed connection was not made while idle";
}

}  // namespace
}  // namespace clusterprof::coordinator
