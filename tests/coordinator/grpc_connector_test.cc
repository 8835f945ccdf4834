// GrpcConnector against a real gRPC server on loopback: relative deadlines, cancellation, the
// bearer token, and a server without the Sidecar service (a TF/JAX profiler server).
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "coordinator/connector.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/profile_options.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"

namespace clusterprof::coordinator {
namespace {

// A gRPC server of `services` on a free loopback port (null when it did not start); `address`
// gets its host:port. `max_send_bytes` >= 0 replaces gRPC's limit on its answers.
std::unique_ptr<grpc::Server> StartServer(const std::vector<grpc::Service*>& services,
                                          std::string* address, int max_send_bytes = -1) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  if (max_send_bytes >= 0) builder.SetMaxSendMessageSize(max_send_bytes);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  *address = "127.0.0.1:" + std::to_string(port);
  return server;
}

// Profile waits until the client gives up (deadline or cancel); it records the authorization
// metadata it saw.
class HangingProfiler final : public tensorflow::ProfilerService::Service {
 public:
  grpc::Status Profile(grpc::ServerContext* context, const tensorflow::ProfileRequest*,
                       tensorflow::ProfileResponse*) override {
    {
      MutexLock lock(&mu_);
      auto it = context->client_metadata().find("authorization");
      if (it != context->client_metadata().end()) {
        authorization_ = std::string(it->second.data(), it->second.size());
      }
      ++started_;
    }
    while (!context->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return grpc::Status::CANCELLED;
  }

  void WaitForStarted(int count) {
    MutexLock lock(&mu_);
    mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return started_ >= count; });
  }
  std::string authorization() {
    MutexLock lock(&mu_);
    return authorization_;
  }

 private:
  Mutex mu_;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  std::string authorization_ ABSL_GUARDED_BY(mu_);
};

class GrpcConnectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartServer({&service_}, &address_);
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  // Waits for one call's answer.
  template <typename Response>
  struct Answer {
    Notification done;
    absl::StatusOr<Response> value;
    Done<Response> Callback() {
      return [this](absl::StatusOr<Response> response) {
        value = std::move(response);
        done.Notify();
      };
    }
  };

  HangingProfiler service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(GrpcConnectorTest, ATimeoutEndsTheCallWithDeadlineExceeded) {
  GrpcConnector connector;
  std::unique_ptr<ProfilerConnection> connection = connector.Connect(address_);
  Answer<tensorflow::ProfileResponse> answer;
  connection->Profile(tensorflow::ProfileRequest(), 200'000'000, answer.Callback(), nullptr);
  answer.done.WaitForNotification();
  EXPECT_EQ(answer.value.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(GrpcConnectorTest, CancelCallsEndsCallsInFlightAndLaterOnes) {
  GrpcConnector connector("s3cret");
  std::unique_ptr<ProfilerConnection> connection = connector.Connect(address_);
  Answer<tensorflow::ProfileResponse> answer;
  connection->Profile(tensorflow::ProfileRequest(), 600'000'000'000, answer.Callback(), nullptr);
  service_.WaitForStarted(1);
  EXPECT_EQ(service_.authorization(), "Bearer s3cret");
  connection->CancelCalls();
  answer.done.WaitForNotification();
  EXPECT_EQ(answer.value.status().code(), absl::StatusCode::kCancelled);

  Answer<v1alpha1::GetInfoResponse> later;
  connection->GetInfo(600'000'000'000, later.Callback());
  later.done.WaitForNotification();
  EXPECT_EQ(later.value.status().code(), absl::StatusCode::kCancelled);
}

TEST_F(GrpcConnectorTest, AServerWithoutTheSidecarServiceIsUnimplemented) {
  GrpcConnector connector;
  std::unique_ptr<ProfilerConnection> connection = connector.Connect(address_);
  Answer<v1alpha1::GetInfoResponse> info;
  connection->GetInfo(5'000'000'000, info.Callback());
  info.done.WaitForNotification();
  EXPECT_EQ(info.value.status().code(), absl::StatusCode::kUnimplemented);
  Answer<v1alpha1::GetSessionResponse> session;
  connection->GetSession("run", 5'000'000'000, session.Callback());
  session.done.WaitForNotification();
  EXPECT_EQ(session.value.status().code(), absl::StatusCode::kUnimplemented);
}

// Says it took the request (initial metadata `clusterprof-accepted`), then holds the call until
// the client lets it go.
class AnnouncingProfiler final : public tensorflow::ProfilerService::CallbackService {
 public:
  grpc::ServerUnaryReactor* Profile(grpc::CallbackServerContext* context,
                                    const tensorflow::ProfileRequest* request,
                                    tensorflow::ProfileResponse*) override {
    class Reactor final : public grpc::ServerUnaryReactor {
     public:
      void OnCancel() override { Finish(grpc::Status::CANCELLED); }
      void OnDone() override { delete this; }
    };
    auto* reactor = new Reactor();
    if (request->session_id() == "announce") {
      context->AddInitialMetadata(proto::kAcceptedHeader, request->session_id());
      reactor->StartSendInitialMetadata();
    }
    return reactor;
  }
};

TEST(GrpcConnectorAcceptedTest, TheAcceptedCallbackRunsBeforeDoneOnlyWhenTheServerSaysSo) {
  AnnouncingProfiler service;
  std::string address;
  std::unique_ptr<grpc::Server> server = StartServer({&service}, &address);
  ASSERT_NE(server, nullptr);
  GrpcConnector connector;
  std::unique_ptr<ProfilerConnection> connection = connector.Connect(address);

  Notification accepted;
  Notification done;
  std::atomic<bool> accepted_before_done{false};
  tensorflow::ProfileRequest request;
  request.set_session_id("announce");
  connection->Profile(
      request, 60'000'000'000,
      [&](absl::StatusOr<tensorflow::ProfileResponse> response) {
        EXPECT_EQ(response.status().code(), absl::StatusCode::kCancelled);
        done.Notify();
      },
      [&] {
        accepted_before_done = !done.HasBeenNotified();
        accepted.Notify();
      });
  accepted.WaitForNotification();
  EXPECT_TRUE(accepted_before_done);
  connection->CancelCalls();  // let it go
  done.WaitForNotification();

  // A server that does not say so (a TF/JAX server): the call is held to its end.
  std::unique_ptr<ProfilerConnection> other = connector.Connect(address);
  std::atomic<bool> said{false};
  Notification other_done;
  request.set_session_id("quiet");
  other->Profile(
      request, 300'000'000,
      [&](absl::StatusOr<tensorflow::ProfileResponse> response) {
        EXPECT_EQ(response.status().code(), absl::StatusCode::kDeadlineExceeded);
        other_done.Notify();
      },
      [&] { said = true; });
  other_done.WaitForNotification();
  EXPECT_FALSE(said);
  server->Shutdown();
}

// Answers with `bytes` of payload: GetSession in a warning, Profile in the XSpace's hostnames.
class HugeAnswers final : public v1alpha1::Sidecar::Service,
                          public tensorflow::ProfilerService::Service {
 public:
  explicit HugeAnswers(size_t bytes) : bytes_(bytes) {}
  grpc::Status GetSession(grpc::ServerContext*, const v1alpha1::GetSessionRequest*,
                          v1alpha1::GetSessionResponse* response) override {
    response->add_warnings(std::string(bytes_, 'w'));
    return grpc::Status::OK;
  }
  grpc::Status Profile(grpc::ServerContext*, const tensorflow::ProfileRequest*,
                       tensorflow::ProfileResponse* response) override {
    response->mutable_xspace()->add_hostnames(std::string(bytes_, 'x'));
    return grpc::Status::OK;
  }

 private:
  size_t bytes_;
};

// A sidecar's answer is bounded (a session's digest is at most 8 MiB): a huge one is refused
// before it is held. A TF/JAX server's Profile answer, the whole XSpace, is not.
TEST(GrpcConnectorLimitsTest, AHugeSidecarAnswerIsRefusedAHugeXSpaceIsNot) {
  HugeAnswers service(80 << 20);
  std::string address;
  std::unique_ptr<grpc::Server> server =
      StartServer({static_cast<v1alpha1::Sidecar::Service*>(&service),
                   static_cast<tensorflow::ProfilerService::Service*>(&service)},
                  &address, INT32_MAX);
  ASSERT_NE(server, nullptr);
  GrpcConnector connector;
  std::unique_ptr<ProfilerConnection> connection = connector.Connect(address);

  Notification session_done;
  absl::StatusOr<v1alpha1::GetSessionResponse> session;
  connection->GetSession("run", 60'000'000'000, [&](auto response) {
    session = std::move(response);
    session_done.Notify();
  });
  session_done.WaitForNotification();
  EXPECT_EQ(session.status().code(), absl::StatusCode::kResourceExhausted) << session.status();

  Notification profile_done;
  absl::StatusOr<tensorflow::ProfileResponse> profile;
  connection->Profile(
      tensorflow::ProfileRequest(), 60'000'000'000,
      [&](auto response) {
        profile = std::move(response);
        profile_done.Notify();
      },
      nullptr);
  profile_done.WaitForNotification();
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->xspace().hostnames(0).size(), size_t{80} << 20);
  server->Shutdown();
}

TEST(GrpcConnectorNoServerTest, NobodyListeningIsUnavailable) {
  GrpcConnector connector;
  // Port 1 on loopback: nothing listens there.
  std::unique_ptr<ProfilerConnection> connection = connector.Connect("127.0.0.1:1");
  Notification done;
  absl::Status status;
  connection->GetInfo(5'000'000'000, [&](absl::StatusOr<v1alpha1::GetInfoResponse> response) {
    status = response.status();
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
}

// GetInfo answers with the peer it saw: one connection keeps one client port.
class PeerEcho final : public v1alpha1::Sidecar::Service {
  grpc::Status GetInfo(grpc::ServerContext* context, const v1alpha1::GetInfoRequest*,
                       v1alpha1::GetInfoResponse* response) override {
    response->set_host_name(context->peer());
    return grpc::Status::OK;
  }
};

std::string PeerSeenBy(ProfilerConnector& connector, const std::string& address) {
  std::unique_ptr<ProfilerConnection> connection = connector.Connect(address);
  std::promise<absl::StatusOr<v1alpha1::GetInfoResponse>> answered;
  connection->GetInfo(5 * kNanosPerSecond, [&](absl::StatusOr<v1alpha1::GetInfoResponse> info) {
    answered.set_value(std::move(info));
  });
  absl::StatusOr<v1alpha1::GetInfoResponse> info = answered.get_future().get();
  return info.ok() ? info->host_name() : std::string(info.status().message());
}

TEST(ChannelPoolTest, ConnectionsOfAPoolOutliveTheirCapturesConnections) {
  PeerEcho service;
  std::string address;
  std::unique_ptr<grpc::Server> server = StartServer({&service}, &address);
  ChannelPool pool({});
  GrpcConnector pooled("", nullptr, "", &pool);
  const std::string first = PeerSeenBy(pooled, address);
  ASSERT_EQ(first.rfind("ipv4:127.0.0.1:", 0), 0u) << first;
  EXPECT_EQ(PeerSeenBy(pooled, address), first) << "the same connection, no new handshake";
  EXPECT_EQ(pool.size(), 1u);
  // Without a pool, each connection makes its own.
  GrpcConnector fresh;
  const std::string a = PeerSeenBy(fresh, address);
  EXPECT_NE(PeerSeenBy(fresh, address), a);
}

TEST(ChannelPoolTest, WarmingConnectsAheadAndNeverDropsAnother) {
  PeerEcho service;
  std::string address;
  std::unique_ptr<grpc::Server> server = StartServer({&service}, &address);
  ChannelPool pool({.max_channels = 2});
  EXPECT_TRUE(pool.Warm(address));
  std::shared_ptr<grpc::Channel> channel = pool.Get(address);
  EXPECT_TRUE(
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)))
      << "a warmed channel connects without a call";
  EXPECT_TRUE(pool.Warm("127.0.0.1:1"));
  EXPECT_FALSE(pool.Warm("127.0.0.1:2")) << "full: warming drops nothing";
  EXPECT_TRUE(pool.Warm(address)) << "already there";
  EXPECT_EQ(pool.size(), 2u);
  // A capture's own connection does take the place of the least recently used.
  pool.Get("127.0.0.1:3");
  EXPECT_EQ(pool.size(), 2u);
  EXPECT_EQ(pool.Get(address), channel) << "used last, kept";
  pool.Forget(address);
  EXPECT_EQ(pool.size(), 1u);
  EXPECT_NE(pool.Get(address), channel) << "made again after Forget";
}

// A sidecar that restarts: the pool's channel, failed meanwhile, is replaced at the next use
// instead of failing the capture's calls while it waits out its reconnect backoff.
TEST(ChannelPoolTest, AChannelWhoseServerWasDownIsReplaced) {
  PeerEcho service;
  std::string address;
  std::unique_ptr<grpc::Server> server = StartServer({&service}, &address);
  ChannelPool pool({});
  GrpcConnector pooled("", nullptr, "", &pool);
  ASSERT_EQ(PeerSeenBy(pooled, address).rfind("ipv4:", 0), 0u);
  std::shared_ptr<grpc::Channel> before = pool.Get(address);
  server->Shutdown();
  server->Wait();
  server.reset();
  EXPECT_NE(PeerSeenBy(pooled, address).rfind("ipv4:", 0), 0u) << "down: the call fails";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (before->GetState(false) != GRPC_CHANNEL_TRANSIENT_FAILURE &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(before->GetState(false), GRPC_CHANNEL_TRANSIENT_FAILURE);
  // Back on the same port.
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(PeerSeenBy(pooled, address).rfind("ipv4:", 0), 0u) << "answered at once";
  EXPECT_NE(pool.Get(address), before);
}

}  // namespace
}  // namespace clusterprof::coordinator
