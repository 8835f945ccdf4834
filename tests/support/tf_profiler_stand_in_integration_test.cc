// The stand-in keeps the upstream server's quirks (docs/protocol.md), since the tests that use it
// rely on them.
#include <chrono>
#include <filesystem>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tf_profiler_stand_in.h"

namespace clusterprof::testing {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

grpc::Status Profile(const TfProfilerStandIn& server, const tensorflow::ProfileRequest& request,
                     tensorflow::ProfileResponse* response) {
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  return tensorflow::ProfilerService::NewStub(channel)->Profile(&context, request, response);
}

TEST(TfProfilerStandInTest, VersionZeroDiscardsEveryOptionStartTimeIncluded) {
  auto server = TfProfilerStandIn::Start({});
  ASSERT_NE(server, nullptr);
  tensorflow::ProfileRequest request;
  request.set_duration_ms(50);
  request.mutable_opts()->set_start_timestamp_ns(NowNs() + 3'600'000'000'000);  // in an hour
  request.set_emit_xspace(true);
  tensorflow::ProfileResponse response;
  ASSERT_TRUE(Profile(*server, request, &response).ok()) << "returned long before the hour";
  EXPECT_FALSE(response.empty_trace());
  EXPECT_GT(response.xspace().planes_size(), 0);
}

TEST(TfProfilerStandInTest, ASecondSessionIsInternalAndTheFileGoesUnderTheRepositoryRoot) {
  TempDir dir;
  auto server = TfProfilerStandIn::Start({});
  ASSERT_NE(server, nullptr);
  tensorflow::ProfileRequest request;
  request.mutable_opts()->set_version(1);
  request.mutable_opts()->set_duration_ms(300);
  request.set_session_id("run1");
  request.set_host_name("10.0.0.2:8466");
  request.set_repository_root(dir.Join("plugins/profile"));
  std::thread first([&] {
    tensorflow::ProfileResponse response;
    EXPECT_TRUE(Profile(*server, request, &response).ok());
    EXPECT_FALSE(response.has_xspace()) << "emit_xspace false: a file, no XSpace";
  });
  ASSERT_TRUE(server->WaitUntilCapturing(30'000));
  tensorflow::ProfileResponse busy;
  const grpc::Status second = Profile(*server, request, &busy);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(second.error_message(), "Another profiling session active.");
  first.join();
  EXPECT_TRUE(FileExists(dir.Join("plugins/profile/run1/10.0.0.2_8466.xplane.pb")));
}

TEST(TfProfilerStandInTest, AnOlderServerWritesItsFileEvenWhenAskedForTheXSpace) {
  TempDir dir;
  auto server = TfProfilerStandIn::Start({.ignore_emit_xspace = true});
  ASSERT_NE(server, nullptr);
  tensorflow::ProfileRequest request;
  request.mutable_opts()->set_version(1);
  request.mutable_opts()->set_duration_ms(20);
  request.mutable_opts()->set_override_hostname("worker");
  request.set_session_id("run2");
  request.set_repository_root(dir.path());
  request.set_emit_xspace(true);
  tensorflow::ProfileResponse response;
  ASSERT_TRUE(Profile(*server, request, &response).ok());
  EXPECT_FALSE(response.has_xspace());
  EXPECT_TRUE(FileExists(dir.Join("run2/worker.xplane.pb")));
}

}  // namespace
}  // namespace clusterprof::testing
