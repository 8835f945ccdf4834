// gs:// storage end to end against the GCS JSON API test server and the token endpoint
// stand-ins, all on loopback: uploads of every size, the faults GCS produces (503s, 429s,
// connections reset mid-chunk, lost processes), permanent errors, auth by key file, by
// metadata server and by user credentials (gcloud auth application-default login), and reading
// back.
#include <sys/stat.h>

#include <atomic>
#include <random>
#include <thread>

#include "common/base/mutex.h"
#include "common/base/strings.h"
#include "common/io/crc32c.h"
#include "common/storage/gcs_credentials.h"
#include "common/storage/gcs_storage.h"
#include "common/storage/storage_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/gcs_test_server.h"
#include "tests/support/gcs_token_servers.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::storage {
namespace {

using ::clusterprof::testing::GcsAuthDecision;
using ::clusterprof::testing::GcsTestServer;
using ::clusterprof::testing::ListFilesRecursively;
using ::clusterprof::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;

std::string RandomBytes(uint64_t size, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::string data(size, '\0');
  for (char& c : data) c = static_cast<char>(random());
  return data;
}

// Records what the uploader reports.
class Events {
 public:
  std::function<void(const UploadEvent&)> Observer() {
    return [this](const UploadEvent& event) {
      MutexLock lock(&mu_);
      events_.push_back(event);
    };
  }
  int Count(UploadEvent::Kind kind) const {
    MutexLock lock(&mu_);
    int n = 0;
    for (const UploadEvent& event : events_) n += event.kind == kind;
    return n;
  }
  std::vector<std::string> Errors(UploadEvent::Kind kind) const {
    MutexLock lock(&mu_);
    std::vector<std::string> errors;
    for (const UploadEvent& event : events_) {
      if (event.kind == kind) errors.push_back(event.error);
    }
    return errors;
  }

 private:
  mutable Mutex mu_;
  std::vector<UploadEvent> events_;
};

class GcsStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = GcsTestServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    server_->CreateBucket("logs");
    spool_dir_ = dir_.Join("spool");
  }

  gcs::ClientOptions ClientOptions(std::shared_ptr<gcs::Credentials> credentials = nullptr) {
    gcs::ClientOptions options;
    options.endpoint = server_->endpoint();
    options.clock = &clock_;
    options.credentials =
        credentials != nullptr
            ? std::move(credentials)
            : std::shared_ptr<gcs::Credentials>(gcs::AnonymousCredentials("anonymous (test)"));
    // Quick retries: the server fails on purpose, and the tests must not wait seconds.
    options.retry.backoff = {.initial_ns = kNanosPerMilli, .max_ns = 20 * kNanosPerMilli};
    options.retry.deadline_ns = 30 * kNanosPerSecond;
    return options;
  }

  GcsStorageOptions StorageOptions() {
    GcsStorageOptions options;
    options.spool_dir = spool_dir_;
    options.chunk_bytes = 256 * kKiB;
    options.commit_wait_ns = 60 * kNanosPerSecond;
    options.requeue_delay_ns = 10 * kNanosPerMilli;
    options.observer = events_.Observer();
    return options;
  }

  std::unique_ptr<GcsStorage> NewStorage(std::shared_ptr<gcs::Credentials> credentials = nullptr,
                                         GcsStorageOptions options = {},
                                         int64_t retry_deadline_ns = 30 * kNanosPerSecond) {
    if (options.spool_dir.empty()) options = StorageOptions();
    gcs::ClientOptions client_options = ClientOptions(std::move(credentials));
    client_options.retry.deadline_ns = retry_deadline_ns;
    auto storage = GcsStorage::Create(std::move(client_options), std::move(options));
    EXPECT_TRUE(storage.ok()) << storage.status();
    return storage.ok() ? *std::move(storage) : nullptr;
  }

  // The object's content, or "<missing>".
  std::string Stored(std::string_view name) {
    auto object = server_->GetObject("logs", name);
    return object.has_value() ? object->data : "<missing>";
  }

  int CountRequests(std::string_view method, std::string_view fragment) {
    int n = 0;
    for (const auto& request : server_->Requests()) {
      n += request.method == method && request.target.find(fragment) != std::string::npos;
    }
    return n;
  }

  TempDir dir_;
  std::string spool_dir_;
  RealClock clock_;
  Events events_;
  std::unique_ptr<GcsTestServer> server_;
};

TEST_F(GcsStorageTest, ASmallFileGoesInOneRequestAndIsVerified) {
  auto storage = NewStorage();
  const std::string data = RandomBytes(1000, 1);
  auto info = WriteObject(*storage, "gs://logs/tb/plugins/profile/run/h.xplane.pb", data);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state, UploadState::kCommitted) << info->error;
  EXPECT_EQ(info->bytes, 1000u);
  EXPECT_EQ(info->bytes_committed, 1000u);
  EXPECT_EQ(info->crc32c, Crc32cToBase64(Crc32c(data)));
  EXPECT_EQ(Stored("tb/plugins/profile/run/h.xplane.pb"), data);
  EXPECT_EQ(server_->GetObject("logs", "tb/plugins/profile/run/h.xplane.pb")->crc32c, info->crc32c);
  EXPECT_EQ(CountRequests("POST", "uploadType=multipart"), 1);
  EXPECT_EQ(CountRequests("POST", "uploadType=resumable"), 0);
  EXPECT_THAT(ListFilesRecursively(spool_dir_), IsEmpty()) << "verified files leave the spool";
  EXPECT_EQ(events_.Count(UploadEvent::Kind::kUploaded), 1);
}

TEST_F(GcsStorageTest, ALargeFileGoesInChunksOfWholeQuanta) {
  auto storage = NewStorage();
  const std::string data = RandomBytes(3 * kMiB + 1234, 2);
  auto writer = storage->NewWriter("gs://logs/big.bin");
  ASSERT_TRUE(writer.ok());
  // In pieces that do not line up with anything.
  for (size_t offset = 0; offset < data.size(); offset += 100'003) {
    ASSERT_TRUE((*writer)->Append(std::string_view(data).substr(offset, 100'003)).ok());
  }
  auto info = (*writer)->Commit();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state, UploadState::kCommitted) << info->error;
  EXPECT_EQ(Stored("big.bin"), data);
  EXPECT_EQ(CountRequests("POST", "uploadType=resumable"), 1);
  int chunks = 0;
  for (const auto& request : server_->Requests()) {
    if (request.method != "PUT") continue;
    ++chunks;
    EXPECT_EQ(request.code == 308 ? request.body_bytes % (256 * kKiB) : 0, 0u)
        << request.content_range;
  }
  EXPECT_EQ(chunks, 13);  // 12 whole chunks and the 1234-byte tail
  EXPECT_THAT(ListFilesRecursively(spool_dir_), IsEmpty());
}

TEST_F(GcsStorageTest, HalfTheRequestsFailingWith503LosesNothing) {
  auto storage = NewStorage();
  server_->SetFailureRate(0.5, 503, /*seed=*/11);
  std::vector<std::string> contents;
  for (int i = 0; i < 6; ++i) {
    contents.push_back(RandomBytes(i % 2 == 0 ? 10 * kKiB : kMiB + 17 * i, 100 + i));
    auto info = WriteObject(*storage, StrCat("gs://logs/f", i), contents.back());
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->state, UploadState::kCommitted) << info->error;
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(Stored(StrCat("f", i)), contents[i]) << i;
  EXPECT_GT(events_.Count(UploadEvent::Kind::kRetry), 5);
  int failed = 0;
  for (const auto& request : server_->Requests()) failed += request.code == 503;
  EXPECT_GT(failed, 5) << "the fault injection did not bite";
  EXPECT_THAT(ListFilesRecursively(spool_dir_), IsEmpty());
}

TEST_F(GcsStorageTest, AResetMidChunkAndA429ResumeFromWhatTheServerHolds) {
  auto storage = NewStorage();
  const std::string data = RandomBytes(2 * kMiB, 3);
  server_->ResetNextUpload(/*after_body_bytes=*/300 * kKiB);
  server_->FailNext(1, 429, "PUT");
  auto info = WriteObject(*storage, "gs://logs/reset.bin", data);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state, UploadState::kCommitted) << info->error;
  EXPECT_EQ(Stored("reset.bin"), data);
  // After each failure the client asked where the session stands before sending more.
  int queries = 0;
  for (const auto& request : server_->Requests()) {
    queries += request.method == "PUT" && StartsWith(request.content_range, "bytes */");
  }
  EXPECT_GE(queries, 1);
  EXPECT_EQ(CountRequests("POST", "uploadType=resumable"), 1) << "one session throughout";
}

TEST_F(GcsStorageTest, AShortObjectAServerFinalizedIsUploadedAgainInTheSameProcess) {
  auto storage = NewStorage();
  const std::string data = RandomBytes(2 * kMiB, 7);
  // The first chunk fails, and the server answers the status query that follows by finalizing
  // the bytes it holds, none: an empty object.
  server_->FailNext(1, 503, "PUT");
  server_->FinalizeShortOnNextStatusQuery();
  auto info = WriteObject(*storage, "gs://logs/short.bin", data);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state, UploadState::kCommitted) << info->error;
  EXPECT_EQ(Stored("short.bin"), data);
  EXPECT_EQ(server_->Writes("logs", "short.bin"), 2) << "the empty object, then the whole one";
  EXPECT_TRUE(ListFilesRecursively(spool_dir_).empty());
  // Reported, and written over the short object's generation only.
  EXPECT_GE(events_.Count(UploadEvent::Kind::kRetry), 1);
  EXPECT_THAT(events_.Errors(UploadEvent::Kind::kRetry),
              ::testing::Contains(HasSubstr("uploading it again over generation")));
  EXPECT_EQ(CountRequests("POST", "ifGenerationMatch="), 1);
}

TEST_F(GcsStorageTest, AnUploadCutOffByItsProcessEndingResumesInTheNextOne) {
  const std::string data = RandomBytes(4 * kMiB, 4);
  server_->SetBodyReadRate(1 * kMiB);  // about four seconds for the whole file
  {
    GcsStorageOptions options = StorageOptions();
    options.commit_wait_ns = 0;  // return once spooled
    auto storage = NewStorage(nullptr, options);
    auto info = WriteObject(*storage, "gs://logs/cut.bin", data);
    ASSERT_TRUE(info.ok());
    EXPECT_NE(info->state, UploadState::kCommitted);
    EXPECT_EQ(storage->UploadStatus("gs://logs/cut.bin")->bytes, data.size());
    // Wait until the server holds part of it, then go away mid-upload.
    for (int i = 0; i < 2000 && storage->UploadStatus("gs://logs/cut.bin")->bytes_committed == 0;
         ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_GT(storage->UploadStatus("gs://logs/cut.bin")->bytes_committed, 0u);
  }
  EXPECT_EQ(Stored("cut.bin"), "<missing>");
  ASSERT_EQ(ListFilesRecursively(spool_dir_).size(), 2u) << "data and record stay";
  server_->SetBodyReadRate(0);
  server_->ClearRequests();

  auto storage = NewStorage();
  auto resumed = storage->ResumePendingCommits();
  ASSERT_TRUE(resumed.ok());
  ASSERT_EQ(resumed->size(), 1u);
  EXPECT_EQ((*resumed)[0].state, UploadState::kCommitted) << (*resumed)[0].error;
  EXPECT_EQ(Stored("cut.bin"), data);
  EXPECT_EQ(server_->GetObject("logs", "cut.bin")->crc32c, Crc32cToBase64(Crc32c(data)));
  EXPECT_EQ(CountRequests("POST", "uploadType=resumable"), 0) << "the same session goes on";
  uint64_t sent = 0;
  for (const auto& request : server_->Requests()) sent += request.body_bytes;
  EXPECT_LT(sent, data.size()) << "only what the server did not hold was sent again";
  EXPECT_THAT(ListFilesRecursively(spool_dir_), IsEmpty());
}

TEST_F(GcsStorageTest, AnOutageLongerThanTheRetryDeadlineDefersTheUploadUntilGcsIsBack) {
  server_->SetFailureRate(1.0, 503, /*seed=*/2);
  auto storage = NewStorage(nullptr, StorageOptions(), /*retry_deadline_ns=*/100 * kNanosPerMilli);
  const std::string data = RandomBytes(2 * kMiB, 12);
  auto info = WriteObject(*storage, "gs://logs/deferred.bin", data);
  ASSERT_TRUE(info.ok());
  // Waiting for another try (or already in it): not failed, and not given up on.
  EXPECT_TRUE(info->state == UploadState::kSpooled || info->state == UploadState::kUploading)
      << UploadStateName(info->state);
  EXPECT_THAT(info->error, AllOf(HasSubstr("503"), HasSubstr("gave up")));
  EXPECT_GE(events_.Count(UploadEvent::Kind::kDeferred), 1);
  int data_files = 0;
  for (const std::string& file : ListFilesRecursively(spool_dir_)) {
    data_files += EndsWith(file, ".data");
  }
  EXPECT_EQ(data_files, 1) << "the file waits in the spool";

  server_->SetFailureRate(0, 503, 2);  // GCS is back
  std::optional<ObjectInfo> status;
  for (int i = 0; i < 2000; ++i) {
    status = storage->UploadStatus("gs://logs/deferred.bin");
    if (status.has_value() && status->state == UploadState::kCommitted) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->state, UploadState::kCommitted) << status->error;
  EXPECT_EQ(Stored("deferred.bin"), data);
  EXPECT_EQ(events_.Count(UploadEvent::Kind::kUploaded), 1);
}

TEST_F(GcsStorageTest, PermissionDeniedFailsAtOnceAndKeepsTheFileForTheNextProcess) {
  server_->SetAuthorizer(
      [](std::string_view, std::string_view) { return GcsAuthDecision::kForbidden; });
  const std::string data = RandomBytes(5000, 5);
  {
    auto storage = NewStorage();
    auto info = WriteObject(*storage, "gs://logs/denied.xplane.pb", data);
    ASSERT_TRUE(info.ok()) << "the bytes are safe in the spool: " << info.status();
    EXPECT_EQ(info->state, UploadState::kFailed);
    EXPECT_THAT(info->error, AllOf(HasSubstr("403"), HasSubstr("gs://logs/denied.xplane.pb"),
                                   HasSubstr("anonymous (test)")));
    EXPECT_THAT(CheckCommitted(*info).message(), HasSubstr(spool_dir_));
    EXPECT_EQ(server_->Requests().size(), 1u) << "a permanent error is not retried";
    EXPECT_EQ(storage->stats().failed, 1);
    EXPECT_EQ(events_.Count(UploadEvent::Kind::kFailed), 1);
  }
  ASSERT_EQ(ListFilesRecursively(spool_dir_).size(), 2u);
  // Access fixed; the next process uploads it.
  server_->SetAuthorizer(
      [](std::string_view, std::string_view) { return GcsAuthDecision::kAllow; });
  auto storage = NewStorage();
  auto resumed = storage->ResumePendingCommits();
  ASSERT_TRUE(resumed.ok());
  ASSERT_EQ(resumed->size(), 1u);
  EXPECT_EQ((*resumed)[0].state, UploadState::kCommitted);
  EXPECT_EQ(Stored("denied.xplane.pb"), data);
}

TEST_F(GcsStorageTest, AnUploadAnEarlierProcessFinishedBeforeItDiedIsNotWrittenAgain) {
  server_->SetAuthorizer(
      [](std::string_view, std::string_view) { return GcsAuthDecision::kForbidden; });
  const std::string data = RandomBytes(5000, 6);
  {
    auto storage = NewStorage();
    ASSERT_TRUE(WriteObject(*storage, "gs://logs/sent.xplane.pb", data).ok());
  }
  // The earlier process's request did reach the bucket; only the process died before it could
  // remove its spool entry.
  server_->PutObject("logs", "sent.xplane.pb", data);
  server_->SetAuthorizer(
      [](std::string_view, std::string_view) { return GcsAuthDecision::kAllow; });
  auto storage = NewStorage();
  auto resumed = storage->ResumePendingCommits();
  ASSERT_TRUE(resumed.ok());
  ASSERT_EQ(resumed->size(), 1u);
  EXPECT_EQ((*resumed)[0].state, UploadState::kCommitted);
  EXPECT_EQ(server_->Writes("logs", "sent.xplane.pb"), 1) << "checked, not written again";
  EXPECT_TRUE(ListFilesRecursively(spool_dir_).empty());

  // Different bytes under that name are not this upload: they are replaced.
  {
    server_->SetAuthorizer(
        [](std::string_view, std::string_view) { return GcsAuthDecision::kForbidden; });
    auto failing = NewStorage();
    ASSERT_TRUE(WriteObject(*failing, "gs://logs/sent.xplane.pb", data + "more").ok());
  }
  server_->SetAuthorizer(
      [](std::string_view, std::string_view) { return GcsAuthDecision::kAllow; });
  auto next = NewStorage();
  resumed = next->ResumePendingCommits();
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(Stored("sent.xplane.pb"), data + "more");
  EXPECT_EQ(server_->Writes("logs", "sent.xplane.pb"), 2);
}

TEST_F(GcsStorageTest, AMissingBucketIsAClearPermanentError) {
  auto storage = NewStorage();
  auto info = WriteObject(*storage, "gs://no-such-bucket/tb/x", "data");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, UploadState::kFailed);
  EXPECT_THAT(info->error,
              AllOf(HasSubstr("404"), HasSubstr("gs://no-such-bucket/tb/x"), HasSubstr("bucket")));
  EXPECT_EQ(server_->Requests().size(), 1u);
}

TEST_F(GcsStorageTest, AFullSpoolRefusesTheWriteAndKeepsWhatItHolds) {
  GcsStorageOptions options = StorageOptions();
  options.spool_max_bytes = 3 * kMiB;
  server_->SetAuthorizer([](std::string_view, std::string_view) {
    return GcsAuthDecision::kForbidden;  // nothing leaves the spool
  });
  auto storage = NewStorage(nullptr, options);
  auto first = WriteObject(*storage, "gs://logs/first", RandomBytes(2 * kMiB, 6));
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->state, UploadState::kFailed);
  auto writer = storage->NewWriter("gs://logs/second");
  ASSERT_TRUE(writer.ok());
  absl::Status status;
  const std::string piece = RandomBytes(512 * kKiB, 7);
  for (int i = 0; i < 8 && status.ok(); ++i) status = (*writer)->Append(piece);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("spool"), HasSubstr("gs://logs/second")));
  EXPECT_EQ(events_.Count(UploadEvent::Kind::kSpoolFull), 1);
  (*writer)->Abort();
  EXPECT_EQ(ListFilesRecursively(spool_dir_).size(), 2u) << "the first file is intact";
  EXPECT_EQ(storage->stats().used_bytes, 2 * kMiB);
}

TEST_F(GcsStorageTest, ReadsListsAndStatsWhatIsThere) {
  const std::string big = RandomBytes(20 * kMiB + 5, 8);
  server_->PutObject("logs", "tb/plugins/profile/run1/a.xplane.pb", big);
  server_->PutObject("logs", "tb/plugins/profile/run1/b.xplane.pb", "b");
  server_->PutObject("logs", "tb/plugins/profile/run2/c.xplane.pb", "c");
  auto storage = NewStorage();

  auto read = ReadObject(*storage, "gs://logs/tb/plugins/profile/run1/a.xplane.pb");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(*read == big) << "read back " << read->size() << " bytes";

  auto runs = storage->List("gs://logs/tb/plugins/profile");
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ((*runs)[0].name, "run1");
  EXPECT_TRUE((*runs)[0].is_directory);
  auto files = storage->List("gs://logs/tb/plugins/profile/run1/");
  ASSERT_TRUE(files.ok());
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0].name, "a.xplane.pb");
  EXPECT_EQ((*files)[0].bytes, big.size());
  EXPECT_FALSE((*files)[0].is_directory);

  EXPECT_TRUE(storage->Stat("gs://logs/tb/plugins")->is_directory);
  EXPECT_EQ(storage->Stat("gs://logs/tb/plugins/profile/run1/b.xplane.pb")->bytes, 1u);
  EXPECT_EQ(storage->Stat("gs://logs/tb/nothing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(storage->NewReader("gs://logs/nothing").status().code(), absl::StatusCode::kNotFound);

  auto local = LocalCopy::Fetch(*storage, "gs://logs/tb/plugins/profile/run2/c.xplane.pb");
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(testing::ReadFileOrDie((*local)->path()), "c");
}

// Auth against the token endpoint stand-ins: the GCS server accepts only live tokens they
// issued.
class GcsAuthTest : public GcsStorageTest {
 protected:
  void SetUp() override {
    GcsStorageTest::SetUp();
    auto oauth = testing::OAuthTokenServer::Start({.clock = &clock_});
    ASSERT_TRUE(oauth.ok()) << oauth.status();
    oauth_ = *std::move(oauth);
    key_ = testing::MakeTestServiceAccountKey(oauth_->token_uri());
    ASSERT_TRUE(oauth_->TrustKey(key_).ok());
    key_file_ = dir_.Join("key.json");
    testing::WriteFileOrDie(key_file_, key_.json_key);
    auto metadata = testing::MetadataServer::Start({.clock = &clock_});
    ASSERT_TRUE(metadata.ok()) << metadata.status();
    metadata_ = *std::move(metadata);
    server_->SetAuthorizer([this](std::string_view authorization, std::string_view) {
      std::string_view token = authorization;
      if (!ConsumePrefix(&token, "Bearer ")) return GcsAuthDecision::kUnauthenticated;
      const int64_t now = clock_.WallNs();
      return oauth_->IsValidToken(token, now) || metadata_->IsValidToken(token, now)
                 ? GcsAuthDecision::kAllow
                 : GcsAuthDecision::kUnauthenticated;
    });
  }

  // A StorageSet as a process builds it, with this environment.
  std::unique_ptr<StorageSet> NewStorageSet(std::map<std::string, std::string> env) {
    StorageSetOptions options;
    options.clock = &clock_;
    options.getenv = [env](std::string_view name) -> std::optional<std::string> {
      auto it = env.find(std::string(name));
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
    options.gcs = StorageOptions();
    options.gcs_endpoint = server_->endpoint();
    options.retry.backoff = {.initial_ns = kNanosPerMilli, .max_ns = 20 * kNanosPerMilli};
    return std::make_unique<StorageSet>(std::move(options));
  }

  std::unique_ptr<testing::OAuthTokenServer> oauth_;
  std::unique_ptr<testing::MetadataServer> metadata_;
  testing::TestServiceAccountKey key_;
  std::string key_file_;
};

TEST_F(GcsAuthTest, AKeyFileFromGoogleApplicationCredentials) {
  auto storages = NewStorageSet(
      {{"GOOGLE_APPLICATION_CREDENTIALS", key_file_}, {"GCE_METADATA_HOST", "127.0.0.1:1"}});
  auto storage = storages->ForUri("gs://logs/x");
  ASSERT_TRUE(storage.ok()) << storage.status();
  auto info = WriteObject(**storage, "gs://logs/by-key", "data");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, UploadState::kCommitted) << info->error;
  EXPECT_EQ(Stored("by-key"), "data");
  EXPECT_EQ(oauth_->grants(), 1);
  EXPECT_EQ(metadata_->requests(), 0);
}

TEST_F(GcsAuthTest, TheMetadataServerWhenNothingElseIsConfigured) {
  auto storages = NewStorageSet({{"GCE_METADATA_HOST", StrCat("127.0.0.1:", metadata_->port())}});
  auto storage = storages->ForUri("gs://logs/x");
  ASSERT_TRUE(storage.ok()) << storage.status();
  auto info = WriteObject(**storage, "gs://logs/by-metadata", RandomBytes(kMiB, 9));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, UploadState::kCommitted) << info->error;
  EXPECT_GE(metadata_->requests(), 1);
  EXPECT_EQ(oauth_->grants(), 0);
}

TEST_F(GcsAuthTest, TheTokenIsRefreshedDuringALongUpload) {
  oauth_->set_expires_in_s(2);
  server_->SetBodyReadRate(512 * kKiB);  // 3 MiB take about six seconds: three token lifetimes
  auto credentials = gcs::ServiceAccountKeyCredentials(key_file_, {.clock = &clock_});
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  auto storage = NewStorage(std::shared_ptr<gcs::Credentials>(*std::move(credentials)));
  const std::string data = RandomBytes(3 * kMiB, 10);
  auto info = WriteObject(*storage, "gs://logs/long.bin", data);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, UploadState::kCommitted) << info->error;
  EXPECT_EQ(Stored("long.bin"), data);
  EXPECT_GE(oauth_->grants(), 2) << "the first token expired during the upload";
}

TEST_F(GcsAuthTest, AKeyTheServerDoesNotKnowFailsClearlyAndKeepsTheFile) {
  // A key of the same account that was never registered (or was revoked).
  testing::TestServiceAccountKey revoked = testing::MakeTestServiceAccountKey(oauth_->token_uri());
  auto credentials = gcs::ServiceAccountKeyCredentialsFromJson(revoked.json_key, "revoked.json",
                                                               {.clock = &clock_});
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  auto storage = NewStorage(std::shared_ptr<gcs::Credentials>(*std::move(credentials)));
  auto info = WriteObject(*storage, "gs://logs/never", "data");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, UploadState::kFailed);
  EXPECT_THAT(info->error,
              AllOf(HasSubstr(testing::kTestServiceAccountEmail), HasSubstr("invalid_grant")));
  EXPECT_EQ(server_->Requests().size(), 0u) << "no token, no request";
  EXPECT_EQ(ListFilesRecursively(spool_dir_).size(), 2u);
}

TEST_F(GcsAuthTest, ATokenTheServerRejectsIsRefreshedOnceThenReported) {
  auto credentials = gcs::ServiceAccountKeyCredentials(key_file_, {.clock = &clock_});
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  auto storage = NewStorage(std::shared_ptr<gcs::Credentials>(*std::move(credentials)));
  // Every token is refused, as for an account whose tokens were all revoked.
  server_->SetAuthorizer(
      [](std::string_view, std::string_view) { return GcsAuthDecision::kUnauthenticated; });
  auto info = WriteObject(*storage, "gs://logs/x", "data");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, UploadState::kFailed);
  EXPECT_THAT(info->error, AllOf(HasSubstr("401"), HasSubstr(testing::kTestServiceAccountEmail)));
  EXPECT_EQ(oauth_->grants(), 2) << "one fresh token after the first 401, then give up";
  EXPECT_EQ(server_->Requests().size(), 2u);
}

// User credentials as `gcloud auth application-default login` leaves them in $HOME, with the
// stand-in token endpoint as their token_uri.
class GcsUserCredentialsTest : public GcsAuthTest {
 protected:
  void SetUp() override {
    GcsAuthTest::SetUp();
    oauth_->TrustRefreshToken("client-id.apps.googleusercontent.com", "client-secret",
                              "1//refresh-token");
    home_ = dir_.Join("home");
    for (const char* dir : {"", "/.config", "/.config/gcloud"}) {
      ASSERT_EQ(mkdir(StrCat(home_, dir).c_str(), 0755), 0);
    }
    testing::WriteFileOrDie(
        StrCat(home_, "/.config/gcloud/application_default_credentials.json"),
        StrCat(R"({"client_id": "client-id.apps.googleusercontent.com",)"
               R"( "client_secret": "client-secret", "quota_project_id": "billing-project",)"
               R"( "refresh_token": "1//refresh-token", "token_uri": ")",
               oauth_->token_uri(), R"(", "type": "authorized_user"})"));
  }

  // The gs:// storage a process with this HOME (and no metadata server) builds.
  Storage* UserStorage() {
    storages_ = NewStorageSet({{"HOME", home_}, {"GCE_METADATA_HOST", "127.0.0.1:1"}});
    auto storage = storages_->ForUri("gs://logs/x");
    EXPECT_TRUE(storage.ok()) << storage.status();
    return storage.ok() ? *storage : nullptr;
  }

  std::string home_;
  std::unique_ptr<StorageSet> storages_;
};

TEST_F(GcsUserCredentialsTest, AnObjectIsReadWithTheUsersCredentials) {
  server_->PutObject("logs", "tb/plugins/profile/run1/host.xplane.pb", "trace bytes");
  Storage* storage = UserStorage();
  ASSERT_NE(storage, nullptr);
  auto read = ReadObject(*storage, "gs://logs/tb/plugins/profile/run1/host.xplane.pb");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "trace bytes");
  EXPECT_EQ(oauth_->grants(), 1);
  EXPECT_EQ(oauth_->last_grant_type(), "refresh_token");
  EXPECT_EQ(metadata_->requests(), 0);
}

TEST_F(GcsUserCredentialsTest, TheTokenIsRefreshedWhenItExpires) {
  oauth_->set_expires_in_s(2);
  server_->SetBodyReadRate(512 * kKiB);  // 1.5 MiB take about three seconds
  Storage* storage = UserStorage();
  ASSERT_NE(storage, nullptr);
  const std::string data = RandomBytes(3 * kMiB / 2, 11);
  auto info = WriteObject(*storage, "gs://logs/by-user.bin", data);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, UploadState::kCommitted) << info->error;
  EXPECT_EQ(Stored("by-user.bin"), data);
  EXPECT_GE(oauth_->grants(), 2) << "the first token expired during the upload";
}

TEST_F(GcsUserCredentialsTest, ARevokedRefreshTokenSaysToLogInAgain) {
  server_->PutObject("logs", "tb/x", "x");
  oauth_->RevokeRefreshToken("1//refresh-token");
  Storage* storage = UserStorage();
  ASSERT_NE(storage, nullptr);
  auto read = ReadObject(*storage, "gs://logs/tb/x");
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(std::string(read.status().message()),
              AllOf(HasSubstr("invalid_grant"), HasSubstr("expired or was revoked"),
                    HasSubstr("run `gcloud auth application-default login`")));
  EXPECT_EQ(server_->Requests().size(), 0u) << "no token, no request";
}

}  // namespace
}  // namespace clusterprof::storage
