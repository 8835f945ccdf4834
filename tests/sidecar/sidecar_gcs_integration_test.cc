// clusterprof-sidecar with a gs:// logdir, as real processes against the GCS test server on
// loopback: captures land in the bucket with their upload state reported, a failing bucket is a
// clear error that loses nothing, an upload whose process was killed is finished by the next
// sidecar that opens the spool, and 1 GiB goes up with bounded memory.
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/strings.h"
#include "common/io/crc32c.h"
#include "common/storage/storage_set.h"
#include "common/xspace/xspace_io.h"
#include "coordinator/coordinator.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/support/gcs_test_server.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"

namespace clusterprof {
namespace {

using ::clusterprof::v1alpha1::GetSessionResponse;
using ::testing::AllOf;
using testing::GcsTestServer;
using ::testing::HasSubstr;
using testing::ListFilesRecursively;
using testing::Subprocess;
using testing::TempDir;

constexpr char kSidecar[] = CLUSTERPROF_SIDECAR_PATH;
constexpr char kAnnotator[] = CLUSTERPROF_TEST_ANNOTATOR_PATH;
constexpr char kUploader[] = CLUSTERPROF_GCS_UPLOAD_PATH;
constexpr uint64_t kMiB = 1024 * 1024;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// Sanitizers' shadow memory makes RSS meaningless, and their checks make 1 GiB slow: the
// sanitizer pass checks the same path with less.
constexpr bool kSanitized = true;
constexpr uint64_t kBigUpload = 256 * kMiB;
#else
constexpr bool kSanitized = false;
constexpr uint64_t kBigUpload = 1024 * kMiB;
#endif

// What gcs-upload generates for a seed.
std::string GeneratedBytes(uint64_t size, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::string data;
  data.reserve(size);
  while (data.size() < size) {
    const uint64_t word = random();
    data.append(reinterpret_cast<const char*>(&word),
                std::min<size_t>(sizeof(word), size - data.size()));
  }
  return data;
}

class SidecarGcsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = GcsTestServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    server_->CreateBucket("logs");
    spool_ = root_.Join("spool");
    shm_ = root_.Join("shm");
  }

  std::map<std::string, std::string> Env() {
    return {{"STORAGE_EMULATOR_HOST", server_->endpoint()}, {"CLUSTERPROF_DIR", shm_}};
  }

  // Starts a sidecar allowed to write under gs://logs/tb; returns its gRPC address.
  std::string StartSidecar(std::vector<std::string> extra = {}) {
    const std::string port_file = root_.Join(StrCat("ports", sidecars_.size()));
    std::vector<std::string> argv = {
        kSidecar, "--port",      "0",       "--http-port",      "-1",           "--shm-dir",
        shm_,     "--port-file", port_file, "--allowed-logdir", "gs://logs/tb", "--spool-dir",
        spool_,   "--host-name", "host-0",  "--log-level",      "debug"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    sidecars_.push_back(std::make_unique<Subprocess>(argv, Env(), Log()));
    EXPECT_TRUE(testing::WaitForFile(port_file)) << testing::ReadFileOrDie(Log());
    return StrCat("127.0.0.1:", testing::ReadGrpcPort(port_file));
  }

  std::string Log() const { return root_.Join("sidecar.log"); }

  tensorflow::ProfileRequest Request(std::string_view session) {
    tensorflow::ProfileRequest request;
    request.mutable_opts()->set_version(1);
    request.mutable_opts()->set_host_tracer_level(2);
    request.mutable_opts()->set_duration_ms(300);
    request.set_session_id(std::string(session));
    request.set_host_name("host-0");
    request.set_repository_root("gs://logs/tb/plugins/profile");
    return request;
  }

  GetSessionResponse GetSession(const std::string& address, std::string_view session) {
    auto stub = clusterprof::v1alpha1::Sidecar::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    clusterprof::v1alpha1::GetSessionRequest request;
    request.set_session_id(std::string(session));
    GetSessionResponse response;
    grpc::Status status = stub->GetSession(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  TempDir root_;
  std::string spool_;
  std::string shm_;
  std::unique_ptr<GcsTestServer> server_;
  std::vector<std::unique_ptr<Subprocess>> sidecars_;
};

TEST_F(SidecarGcsTest, ACaptureLandsInTheBucketWithItsUploadStateReported) {
  const std::string address = StartSidecar();
  Subprocess workload({kAnnotator}, Env(), Log());
  auto stub = tensorflow::ProfilerService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  tensorflow::ProfileResponse response;
  grpc::Status status = stub->Profile(&context, Request("to_gcs"), &response);
  ASSERT_TRUE(status.ok()) << status.error_message() << "\n" << testing::ReadFileOrDie(Log());
  EXPECT_FALSE(response.empty_trace());

  auto xplane = server_->GetObject("logs", "tb/plugins/profile/to_gcs/host-0.xplane.pb");
  ASSERT_TRUE(xplane.has_value()) << testing::ReadFileOrDie(Log());
  EXPECT_TRUE(
      server_->GetObject("logs", "tb/plugins/profile/to_gcs/host-0.trace.json.gz").has_value());
  tensorflow::profiler::XSpace space;
  ASSERT_TRUE(space.ParseFromString(xplane->data));
  EXPECT_THAT(space.hostnames(), ::testing::ElementsAre("host-0"));

  // The trailer of the Profile call and GetSession agree on each file's state.
  auto trailer = context.GetServerTrailingMetadata().find("clusterprof-files-bin");
  ASSERT_NE(trailer, context.GetServerTrailingMetadata().end());
  GetSessionResponse files;
  ASSERT_TRUE(files.ParseFromString(std::string(trailer->second.data(), trailer->second.size())));
  ASSERT_EQ(files.files_size(), 2);
  const GetSessionResponse session = GetSession(address, "to_gcs");
  ASSERT_EQ(session.files_size(), 2);
  for (const auto& file : session.files()) {
    SCOPED_TRACE(file.uri());
    EXPECT_EQ(file.upload_state(), clusterprof::v1alpha1::UPLOAD_STATE_COMMITTED);
    EXPECT_EQ(file.bytes_committed(), file.bytes());
    EXPECT_TRUE(StartsWith(file.uri(), "gs://logs/tb/plugins/profile/to_gcs/host-0."));
    auto object = server_->GetObject("logs", file.uri().substr(strlen("gs://logs/")));
    ASSERT_TRUE(object.has_value());
    EXPECT_EQ(file.crc32c(), object->crc32c);
  }
  EXPECT_EQ(files.files(0).crc32c(), session.files(0).crc32c());
  EXPECT_TRUE(ListFilesRecursively(spool_).empty());
}

TEST_F(SidecarGcsTest, TheCoordinatorsManifestRecordsEachUpload) {
  const std::string address = StartSidecar();
  Subprocess workload({kAnnotator}, Env(), Log());
  RealClock clock;
  storage::StorageSet storages(storage::StorageSetOptions{
      .clock = &clock,
      .getenv = [this](std::string_view name) -> std::optional<std::string> {
        if (name == "STORAGE_EMULATOR_HOST") return server_->endpoint();
        return std::nullopt;
      },
      .gcs = {.spool_dir = root_.Join("coordinator-spool")}});
  coordinator::CaptureOptions options;
  options.targets.push_back({address, ""});
  options.layout =
      *storage::RunLayout::Create(*storage::ParseLogdir("gs://logs/tb"), "coordinated");
  options.duration_ms = 300;
  options.storages = &storages;
  auto result = coordinator::Capture(options, clock);
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << testing::ReadFileOrDie(Log());
  ASSERT_EQ(result->targets.size(), 1u);
  const coordinator::TargetResult& target = result->targets[0];
  ASSERT_EQ(target.uploads.size(), 2u);
  for (const auto& upload : target.uploads) {
    EXPECT_EQ(upload.state, "committed") << upload.uri;
    EXPECT_EQ(upload.bytes_committed, upload.bytes);
  }
  EXPECT_EQ(result->manifest_uri, "gs://logs/tb/plugins/profile/coordinated/clusterprof_run.json");
  auto manifest = server_->GetObject("logs", "tb/plugins/profile/coordinated/clusterprof_run.json");
  ASSERT_TRUE(manifest.has_value());
  EXPECT_THAT(manifest->data,
              AllOf(HasSubstr("\"uploads\":[{"), HasSubstr("\"state\":\"committed\""),
                    HasSubstr(target.uploads[0].crc32c)));
}

TEST_F(SidecarGcsTest, AMissingBucketFailsTheCallClearlyAndKeepsTheFiles) {
  const std::string address = StartSidecar({"--allowed-logdir", "gs://gone/tb"});
  auto stub = tensorflow::ProfilerService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  tensorflow::ProfileRequest request = Request("no_bucket");
  request.set_repository_root("gs://gone/tb/plugins/profile");
  tensorflow::ProfileResponse response;
  grpc::Status status = stub->Profile(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("gs://gone/tb/plugins/profile/no_bucket/host-0.xplane.pb"),
                    HasSubstr("404"), HasSubstr(spool_)));
  const GetSessionResponse session = GetSession(address, "no_bucket");
  ASSERT_GE(session.files_size(), 1);
  EXPECT_EQ(session.files(0).upload_state(), clusterprof::v1alpha1::UPLOAD_STATE_FAILED);
  EXPECT_THAT(session.files(0).error(), HasSubstr("bucket"));
  EXPECT_EQ(ListFilesRecursively(spool_).size(), 2u * static_cast<size_t>(session.files_size()))
      << "data and record of every file stay in the spool";
}

TEST_F(SidecarGcsTest, AnUploadKilledMidwayIsFinishedByTheNextSidecar) {
  const uint64_t size = 6 * kMiB;
  server_->SetBodyReadRate(1 * kMiB);  // six seconds: time to kill it mid-upload
  Subprocess uploader(
      {kUploader, "--spool-dir", spool_, "--uri", "gs://logs/tb/killed.bin", "--bytes",
       StrCat(size), "--chunk-bytes", StrCat(256 * 1024), "--seed", "42"},
      Env(), Log());
  // Killed once the server holds some of it.
  bool partly_there = false;
  for (int i = 0; i < 3000 && !partly_there; ++i) {
    for (const auto& request : server_->Requests()) partly_there |= request.code == 308;
    if (!partly_there) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(partly_there) << testing::ReadFileOrDie(Log());
  uploader.Signal(SIGKILL);
  uploader.Wait();
  EXPECT_FALSE(server_->GetObject("logs", "tb/killed.bin").has_value());
  // The spooled file and its record (and perhaps a record rewrite the kill cut short).
  int data = 0;
  int records = 0;
  for (const std::string& file : ListFilesRecursively(spool_)) {
    data += EndsWith(file, ".data");
    records += EndsWith(file, ".json");
  }
  ASSERT_EQ(data, 1);
  ASSERT_EQ(records, 1);

  server_->SetBodyReadRate(0);
  server_->ClearRequests();
  StartSidecar();  // resumes the spool when it starts
  std::optional<testing::GcsObjectSnapshot> object;
  for (int i = 0; i < 3000 && !object.has_value(); ++i) {
    object = server_->GetObject("logs", "tb/killed.bin");
    if (!object.has_value()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(object.has_value()) << testing::ReadFileOrDie(Log());
  const std::string expected = GeneratedBytes(size, 42);
  EXPECT_TRUE(object->data == expected) << "content differs";
  EXPECT_EQ(object->crc32c, Crc32cToBase64(Crc32c(expected)));
  for (const auto& request : server_->Requests()) {
    EXPECT_NE(request.method, "POST")
        << "the killed process's session was resumed, not restarted: " << request.target;
  }
  for (int i = 0; i < 500 && !ListFilesRecursively(spool_).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(ListFilesRecursively(spool_).empty());
  EXPECT_THAT(testing::ReadFileOrDie(Log()), HasSubstr("left by an earlier process"));
}

TEST_F(SidecarGcsTest, ASidecarKilledMidUploadFinishesItAfterItsRestart) {
  server_->SetBodyReadRate(8 * 1024);  // a capture's file takes seconds to go up
  const std::string address = StartSidecar();
  Subprocess workload({kAnnotator}, Env(), Log());
  std::thread client([&] {
    auto stub = tensorflow::ProfilerService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    tensorflow::ProfileResponse response;
    // Fails when the sidecar is killed; what matters is what happens to the file.
    (void)stub->Profile(&context, Request("killed_capture"), &response);
  });
  // Killed once the first file is in the spool and going up.
  std::string record;
  for (int i = 0; i < 3000 && record.empty(); ++i) {
    for (const std::string& file : ListFilesRecursively(spool_)) {
      if (EndsWith(file, ".json")) record = file;
    }
    if (record.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_FALSE(record.empty()) << testing::ReadFileOrDie(Log());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  sidecars_.back()->Signal(SIGKILL);
  sidecars_.back()->Wait();
  client.join();
  const std::string xplane = "tb/plugins/profile/killed_capture/host-0.xplane.pb";
  ASSERT_FALSE(server_->GetObject("logs", xplane).has_value()) << "killed before it finished";
  const std::string spooled = testing::ReadFileOrDie(
      StrCat(spool_, "/", record.substr(0, record.size() - strlen(".json")), ".data"));
  ASSERT_FALSE(spooled.empty());

  server_->SetBodyReadRate(0);
  const std::string restarted = StartSidecar();
  std::optional<testing::GcsObjectSnapshot> object;
  for (int i = 0; i < 3000 && !object.has_value(); ++i) {
    object = server_->GetObject("logs", xplane);
    if (!object.has_value()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(object.has_value()) << testing::ReadFileOrDie(Log());
  EXPECT_TRUE(object->data == spooled) << "the object is the bytes the first sidecar spooled";
  EXPECT_EQ(object->crc32c, Crc32cToBase64(Crc32c(spooled)));
  tensorflow::profiler::XSpace space;
  EXPECT_TRUE(space.ParseFromString(object->data));
  EXPECT_THAT(space.hostnames(), ::testing::ElementsAre("host-0"));

  // The client retries the call that broke: it gets the files the first process captured, and
  // the run is not captured a second time over them.
  auto stub = tensorflow::ProfilerService::NewStub(
      grpc::CreateChannel(restarted, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  tensorflow::ProfileResponse response;
  grpc::Status status = stub->Profile(&context, Request("killed_capture"), &response);
  ASSERT_TRUE(status.ok()) << status.error_message() << "\n" << testing::ReadFileOrDie(Log());
  EXPECT_FALSE(response.empty_trace());
  GetSessionResponse session = GetSession(restarted, "killed_capture");
  EXPECT_EQ(session.state(), clusterprof::v1alpha1::SESSION_STATE_DONE);
  EXPECT_THAT(session.warnings(), ::testing::Contains(HasSubstr("earlier process")));
  ASSERT_GE(session.files_size(), 1);
  EXPECT_EQ(session.files(0).uri(), StrCat("gs://logs/", xplane));
  EXPECT_EQ(session.files(0).upload_state(), clusterprof::v1alpha1::UPLOAD_STATE_COMMITTED);
  EXPECT_EQ(server_->Writes("logs", xplane), 1) << "written once";
  const std::string log = testing::ReadFileOrDie(Log());
  size_t captures = 0;
  for (size_t at = log.find("session killed_capture: capturing for"); at != std::string::npos;
       at = log.find("session killed_capture: capturing for", at + 1)) {
    ++captures;
  }
  EXPECT_EQ(captures, 1u) << log;
}

TEST_F(SidecarGcsTest, SigtermDoesNotWaitOutAFailingUploadAndKeepsItsFiles) {
  server_->SetFailureRate(1.0, 503, /*seed=*/1);  // GCS down: retried for minutes
  const std::string address = StartSidecar();
  std::thread client([&] {
    auto stub = tensorflow::ProfilerService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    tensorflow::ProfileResponse response;
    (void)stub->Profile(&context, Request("during_outage"), &response);
  });
  bool retrying = false;
  for (int i = 0; i < 3000 && !retrying; ++i) {
    int failed = 0;
    for (const auto& request : server_->Requests()) failed += request.code == 503;
    retrying = failed >= 2;
    if (!retrying) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(retrying) << testing::ReadFileOrDie(Log());
  sidecars_.back()->Signal(SIGTERM);
  // Well within the kubelet's grace period, not after the retry deadline (minutes).
  std::optional<int> exit = sidecars_.back()->Wait(std::chrono::seconds(40));
  ASSERT_TRUE(exit.has_value()) << "the sidecar did not exit on SIGTERM";
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0);
  client.join();
  int records = 0;
  for (const std::string& file : ListFilesRecursively(spool_)) records += EndsWith(file, ".json");
  EXPECT_GE(records, 1) << "the capture waits in the spool";
  EXPECT_THAT(testing::ReadFileOrDie(Log()), HasSubstr("left for the next start"));

  // GCS is back; the next sidecar uploads it.
  server_->SetFailureRate(0, 503, 1);
  StartSidecar();
  std::optional<testing::GcsObjectSnapshot> object;
  for (int i = 0; i < 3000 && !object.has_value(); ++i) {
    object = server_->GetObject("logs", "tb/plugins/profile/during_outage/host-0.xplane.pb");
    if (!object.has_value()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(object.has_value()) << testing::ReadFileOrDie(Log());
}

TEST_F(SidecarGcsTest, OneGibibyteGoesUpWithBoundedMemory) {
  // Objects on disk, not in this test's memory.
  auto server = GcsTestServer::Start({.data_dir = root_.path(), .compute_md5 = false});
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->CreateBucket("big");
  const std::string report = root_.Join("report.json");
  Subprocess uploader({kUploader, "--spool-dir", spool_, "--uri", "gs://big/one.bin", "--bytes",
                       StrCat(kBigUpload), "--seed", "7"},
                      {{"STORAGE_EMULATOR_HOST", (*server)->endpoint()}}, report,
                      root_.Join("uploader.err"));
  std::optional<int> exit = uploader.Wait(std::chrono::seconds(280));
  ASSERT_TRUE(exit.has_value()) << "the upload did not finish";
  ASSERT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0)
      << testing::ReadFileOrDie(root_.Join("uploader.err"));
  auto object = (*server)->GetObject("big", "one.bin");
  ASSERT_TRUE(object.has_value());
  EXPECT_EQ(object->size, kBigUpload);
  const std::string json = testing::ReadFileOrDie(report);
  EXPECT_THAT(json, HasSubstr("\"state\":\"committed\""));
  EXPECT_THAT(json, HasSubstr(StrCat("\"crc32c\":\"", object->crc32c, "\"")));
  const size_t at = json.find("\"max_rss_kib\":");
  ASSERT_NE(at, std::string::npos);
  const long rss_kib = std::stol(json.substr(at + strlen("\"max_rss_kib\":")));
  if (!kSanitized) {
    EXPECT_LT(rss_kib, 64 * 1024) << "peak RSS of the uploading process";
  }
  EXPECT_TRUE(ListFilesRecursively(spool_).empty());
}

}  // namespace
}  // namespace clusterprof
