// The logdir allowlist (docs/security.md, "A user with ProfileJob rights"): whatever a
// ProfileJob's spec.logdir says, or whatever repository_root a caller holding the token sends,
// the sidecar writes only beneath its --allowed-logdir prefixes. Each attempt goes the way a
// real one goes: the operator's spec parser (ParseProfileJobSpec), the repository_root the
// coordinator sends (<logdir>/plugins/profile), the sidecar's check (ParseCaptureRequest), and
// for local paths the confined write itself (LocalStorageOptions::write_roots, as the sidecar
// sets it). An attempt is stopped at one of those steps, or it lands beneath a prefix; nothing
// is ever written outside.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/strings.h"
#include "common/storage/gcs_client.h"
#include "common/storage/gcs_credentials.h"
#include "common/storage/local_storage.h"
#include "common/storage/logdir.h"
#include "common/storage/storage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/api/types.h"
#include "sidecar/capture_request.h"
#include "tests/support/fake_http_transport.h"
#include "tests/support/temp_dir.h"

namespace clusterprof {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::TempDir;

constexpr int64_t kNow = 1'767'225'600LL * 1'000'000'000;  // 2026-01-01T00:00:00Z
constexpr char kRun[] = "run_1";
constexpr char kHost[] = "trainer-0";
constexpr char kBucketPrefix[] = "gs://team-bucket/tb";

// Where an attempt was stopped, or where it would write.
struct Outcome {
  // "operator" (the spec is refused), "sidecar" (the request is refused), "write" (the confined
  // write is refused) or "" (written).
  std::string stopped_by;
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string message;
  // The .xplane.pb the sidecar writes, when it was not stopped before the write.
  std::string file;
};

std::string Describe(const Outcome& outcome) {
  return StrCat(outcome.stopped_by.empty() ? "written" : StrCat("stopped by ", outcome.stopped_by),
                " (", absl::StatusCodeToString(outcome.code), ": ", outcome.message, ") ",
                outcome.file);
}

// Everything under `dir`, links and directories included.
std::vector<std::string> ListEverything(const std::string& dir) {
  std::vector<std::string> entries;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    entries.push_back(std::filesystem::relative(it->path(), dir).string());
  }
  return entries;
}

// Whether `path` is `prefix` or lies beneath it, by whole components.
bool Beneath(const std::string& path, const std::string& prefix) {
  return path == prefix || StartsWith(path, prefix + "/");
}

class LogdirAllowlistTest : public ::testing::Test {
 protected:
  LogdirAllowlistTest() {
    allowed_dir_ = allowed_.Join("tb");
    std::filesystem::create_directories(allowed_dir_);
    // As the chart renders sidecar.allowedLogdirs into --allowed-logdir flags.
    for (const std::string& prefix : {allowed_dir_, std::string(kBucketPrefix)}) {
      absl::StatusOr<storage::Logdir> parsed = storage::ParseLogdir(prefix);
      EXPECT_TRUE(parsed.ok()) << parsed.status();
      policy_.allowed_logdirs.push_back(*parsed);
    }
    policy_.default_host_name = kHost;
  }

  // What the sidecar makes of `repository_root` sent by a caller holding the token; for local
  // paths, the confined write of the host's file too.
  Outcome Send(const std::string& repository_root) {
    tensorflow::ProfileRequest request;
    request.mutable_opts()->set_version(1);
    request.mutable_opts()->set_duration_ms(1000);
    request.mutable_opts()->set_override_hostname(kHost);
    request.set_session_id(kRun);
    request.set_repository_root(repository_root);
    Outcome outcome;
    absl::StatusOr<sidecar::CaptureRequest> parsed =
        sidecar::ParseCaptureRequest(request, policy_, kNow);
    if (!parsed.ok()) {
      outcome.stopped_by = "sidecar";
      outcome.code = parsed.status().code();
      outcome.message = std::string(parsed.status().message());
      return outcome;
    }
    outcome.file = parsed->layout->XPlanePath(parsed->host_name);
    if (parsed->layout->logdir().kind == storage::Logdir::Kind::kLocal) {
      storage::LocalStorageOptions options;
      options.sync = false;
      options.write_roots.emplace();
      for (const storage::Logdir& prefix : policy_.allowed_logdirs) {
        if (prefix.kind == storage::Logdir::Kind::kLocal)
          options.write_roots->push_back(prefix.uri);
      }
      absl::StatusOr<storage::ObjectInfo> written =
          storage::WriteObject(*storage::NewLocalStorage(options), outcome.file, "xplane");
      if (!written.ok()) {
        outcome.stopped_by = "write";
        outcome.code = written.status().code();
        outcome.message = std::string(written.status().message());
      }
    }
    return outcome;
  }

  // A ProfileJob with `logdir`, as the operator reads it and the coordinator then sends it.
  Outcome Apply(const std::string& logdir) {
    web::json::value spec = web::json::value::object();
    spec["targets"]["selector"]["matchLabels"]["app"] = web::json::value::string("trainer");
    spec["logdir"] = web::json::value::string(logdir);
    spec["runName"] = web::json::value::string(kRun);
    absl::StatusOr<api::ProfileJobSpec> parsed = api::ParseProfileJobSpec(spec);
    if (!parsed.ok()) {
      Outcome outcome;
      outcome.stopped_by = "operator";
      outcome.code = parsed.status().code();
      outcome.message = std::string(parsed.status().message());
      return outcome;
    }
    absl::StatusOr<storage::RunLayout> layout =
        storage::RunLayout::Create(parsed->logdir, parsed->run_name);
    EXPECT_TRUE(layout.ok()) << layout.status();
    return Send(layout->RepositoryRoot());
  }

  // Nothing was written outside the allowed directory, and what was written is beneath it.
  void ExpectNothingOutside() {
    EXPECT_THAT(ListEverything(outside_.path()), IsEmpty());
    for (const std::string& entry : ListEverything(allowed_.path())) {
      EXPECT_TRUE(entry == "tb" || StartsWith(entry, "tb/")) << entry;
    }
  }

  TempDir allowed_;
  TempDir outside_;
  std::string allowed_dir_;
  sidecar::RequestPolicy policy_;
};

// Bucket names and prefixes that only look like the allowed ones.
TEST_F(LogdirAllowlistTest, OtherBucketsAndLookAlikePrefixesAreRefusedBySidecar) {
  for (const char* logdir : {
           "gs://team-bucket-evil/tb",          // a bucket whose name starts the same
           "gs://team-bucket.evil.example/tb",  // a domain-named bucket
           "gs://other-bucket/tb",              // another bucket, same prefix
           "gs://team-bucket/tb2",              // a prefix that extends the allowed one
           "gs://team-bucket/tb-other/x",       //
           "gs://team-bucket",                  // the bucket above the allowed prefix
           "gs://team-bucket/t",                // a prefix of the prefix
           "gs://team-bucket/tb%2f..%2fother",  // an encoded separator is not one
           "gs://team-bucket/tb\\..\\other",    // nor is a backslash
           "gs://team-bucket/other/tb",         // the allowed name further down
       }) {
    const Outcome outcome = Apply(logdir);
    EXPECT_EQ(outcome.stopped_by, "sidecar") << logdir << ": " << Describe(outcome);
    EXPECT_EQ(outcome.code, absl::StatusCode::kPermissionDenied) << logdir;
    EXPECT_THAT(outcome.message, HasSubstr("--allowed-logdir")) << logdir;
  }
}

// `..`, `.`, bad bucket names, other schemes and relative paths never get past the operator's
// spec check (nor the sidecar's, for a caller that sends them itself).
TEST_F(LogdirAllowlistTest, DotDotRelativePathsAndSchemeTricksAreRefusedByBoth) {
  for (const char* logdir : {
           "gs://team-bucket/tb/../other", "gs://team-bucket/tb/..", "gs://team-bucket/tb/./x",
           "gs://Team-Bucket/tb",       // not a bucket name: no case folding to the allowed one
           "gs://team-bucket@evil/tb",  //
           "gs:/team-bucket/tb",        // one slash: not gs://, and not absolute
           "GS://team-bucket/tb",       //
           " gs://team-bucket/tb",      // a leading space
           "s3://team-bucket/tb",       //
           "file://team-bucket/tb",     // file:// with a host
           "tb/../../etc",              // relative
           "team-bucket/tb",            //
           "",                          //
       }) {
    const Outcome outcome = Apply(logdir);
    EXPECT_EQ(outcome.stopped_by, "operator") << "'" << logdir << "': " << Describe(outcome);
    EXPECT_EQ(outcome.code, absl::StatusCode::kInvalidArgument) << logdir;
    EXPECT_THAT(outcome.message, HasSubstr("spec.logdir")) << logdir;

    const Outcome sent = Send(StrCat(logdir, "/plugins/profile"));
    EXPECT_EQ(sent.stopped_by, "sidecar") << "'" << logdir << "': " << Describe(sent);
    EXPECT_NE(sent.code, absl::StatusCode::kOk) << logdir;
  }
  for (const std::string& logdir :
       {StrCat(allowed_dir_, "/../../etc"), StrCat(allowed_dir_, "/.."),
        StrCat("file://", allowed_dir_, "/../x"), StrCat(allowed_dir_, "/x/../../../etc")}) {
    const Outcome outcome = Apply(logdir);
    EXPECT_EQ(outcome.stopped_by, "operator") << logdir << ": " << Describe(outcome);
    EXPECT_THAT(outcome.message, HasSubstr("'..'")) << logdir;
    const Outcome sent = Send(StrCat(logdir, "/plugins/profile"));
    EXPECT_EQ(sent.stopped_by, "sidecar") << logdir << ": " << Describe(sent);
    EXPECT_EQ(sent.code, absl::StatusCode::kInvalidArgument) << logdir;
  }
  ExpectNothingOutside();
}

// Local directories beside, above and below nothing: refused whole-component.
TEST_F(LogdirAllowlistTest, LocalPathsOutsideTheAllowedDirectoryAreRefused) {
  for (const std::string& logdir : {std::string("/etc"), allowed_.path(), StrCat(allowed_dir_, "2"),
                                    StrCat(allowed_dir_, "-evil/tb"), outside_.Join("tb"),
                                    StrCat("file://", outside_.Join("tb"))}) {
    const Outcome outcome = Apply(logdir);
    EXPECT_EQ(outcome.stopped_by, "sidecar") << logdir << ": " << Describe(outcome);
    EXPECT_EQ(outcome.code, absl::StatusCode::kPermissionDenied) << logdir;
  }
  // The file system's root leaves no logdir above plugins/profile: refused as malformed.
  const Outcome root = Apply("/");
  EXPECT_EQ(root.stopped_by, "sidecar") << Describe(root);
  EXPECT_EQ(root.code, absl::StatusCode::kInvalidArgument) << Describe(root);
  ExpectNothingOutside();
}

// What is allowed stays beneath the prefix however it is spelled: doubled slashes, `.`
// components of local paths, percent signs (names, not escapes) and a file:// URI.
TEST_F(LogdirAllowlistTest, AllowedSpellingsLandBeneathThePrefix) {
  for (const char* logdir : {
           "gs://team-bucket/tb",
           "gs://team-bucket/tb/",
           "gs://team-bucket//tb//llama",
           "gs://team-bucket/tb/%2e%2e/other",
           "gs://team-bucket/tb/%2E%2E%2Fother",
       }) {
    const Outcome outcome = Apply(logdir);
    EXPECT_EQ(outcome.stopped_by, "") << logdir << ": " << Describe(outcome);
    EXPECT_TRUE(Beneath(outcome.file, kBucketPrefix)) << logdir << " -> " << outcome.file;
  }
  for (const std::string& logdir : {
           allowed_dir_,
           StrCat(allowed_dir_, "/"),
           StrCat(allowed_dir_, "//./llama/./"),
           StrCat(allowed_dir_, "/%2e%2e/x"),
           StrCat("file://", allowed_dir_, "/file-uri"),
       }) {
    const Outcome outcome = Apply(logdir);
    EXPECT_EQ(outcome.stopped_by, "") << logdir << ": " << Describe(outcome);
    EXPECT_TRUE(Beneath(outcome.file, allowed_dir_)) << logdir << " -> " << outcome.file;
    EXPECT_TRUE(testing::FileExists(outcome.file)) << outcome.file;
  }
  EXPECT_TRUE(testing::FileExists(
      StrCat(allowed_dir_, "/%2e%2e/x/plugins/profile/", kRun, "/", kHost, ".xplane.pb")))
      << "%2e%2e is a directory of that name, not '..'";
  ExpectNothingOutside();
}

// The gs:// client sends an object name as a name: '%' and '/' are escaped, so GCS never sees
// "%2e%2e" as "..", nor a prefix as anything but the start of an object's name.
TEST_F(LogdirAllowlistTest, TheGcsClientNeverDecodesAnObjectName) {
  class FixedCredentials final : public storage::gcs::Credentials {
   public:
    absl::StatusOr<std::string> AuthorizationHeader() override { return "Bearer t"; }
    void Invalidate() override {}
    std::string Identity() override { return "test"; }
    int64_t token_fetches() const override { return 1; }
    std::string QuotaProject() override { return ""; }
  };
  testing::FakeHttpTransport transport;
  transport.Route("http://gcs.test", [](const http::Request&) {
    return testing::Reply(403, R"({"error": {"code": 403, "message": "Forbidden"}})");
  });
  SimulatedClock clock;
  storage::gcs::ClientOptions options;
  options.endpoint = "http://gcs.test";
  options.credentials = std::make_shared<FixedCredentials>();
  options.clock = &clock;
  options.transport = &transport;
  absl::StatusOr<std::unique_ptr<storage::gcs::Client>> client =
      storage::gcs::Client::Create(std::move(options));
  ASSERT_TRUE(client.ok()) << client.status();

  const Outcome outcome = Apply("gs://team-bucket/tb/%2e%2e/other");
  ASSERT_EQ(outcome.stopped_by, "") << Describe(outcome);
  absl::StatusOr<storage::Logdir> file = storage::ParseLogdir(outcome.file);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->bucket, "team-bucket");
  EXPECT_TRUE(StartsWith(file->prefix, "tb/%2e%2e/other/plugins/profile/")) << file->prefix;
  const std::string encoded =
      StrCat("tb%2F%252e%252e%2Fother%2Fplugins%2Fprofile%2F", kRun, "%2F", kHost, ".xplane.pb");
  // Where an upload starts (the sidecar's path to the bucket), and an object's address.
  storage::gcs::UploadRequest upload;
  upload.bucket = file->bucket;
  upload.name = file->prefix;
  upload.size = 6;
  (void)(*client)->UploadResumable(
      upload, [](uint64_t, size_t) -> absl::StatusOr<std::string_view> { return "xplane"; }, {},
      256 * 1024, [](const storage::gcs::UploadProgress&) {});
  (void)(*client)->GetObjectMetadata(file->bucket, file->prefix);
  const std::vector<testing::RecordedRequest> requests = transport.Requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].url,
            StrCat("http://gcs.test/upload/storage/v1/b/team-bucket/o?uploadType=resumable&name=",
                   encoded));
  EXPECT_EQ(requests[1].url, StrCat("http://gcs.test/storage/v1/b/team-bucket/o/", encoded));
}

// Symbolic links inside the allowed directory that lead out, at every level of the run layout,
// relative or absolute, chained or dangling: refused before the capture, or by the write; never
// written through.
TEST_F(LogdirAllowlistTest, SymlinksThatLeadOutAreNeverWrittenThrough) {
  auto link = [](const std::string& target, const std::string& at) {
    std::filesystem::create_directories(std::filesystem::path(at).parent_path());
    ASSERT_EQ(symlink(target.c_str(), at.c_str()), 0) << at;
  };
  // At the logdir itself.
  link(outside_.path(), StrCat(allowed_dir_, "/to-outside"));
  // At plugins/, profile/ and the run directory, below a logdir that is a real directory.
  link(outside_.path(), StrCat(allowed_dir_, "/a/plugins"));
  link(outside_.path(), StrCat(allowed_dir_, "/b/plugins/profile"));
  link(outside_.path(), StrCat(allowed_dir_, "/c/plugins/profile/", kRun));
  // Relative, climbing out.
  link("../../..", StrCat(allowed_dir_, "/d/up"));
  // A chain: a link inside to a link inside to outside.
  link(outside_.path(), StrCat(allowed_dir_, "/e2"));
  link("e2", StrCat(allowed_dir_, "/e1"));
  // To the root of the file system.
  link("/", StrCat(allowed_dir_, "/root"));
  // Dangling: to a directory outside that does not exist yet, which a write through the link
  // would create.
  link(outside_.Join("not-yet"), StrCat(allowed_dir_, "/dangling"));

  for (const std::string& logdir : {
           StrCat(allowed_dir_, "/to-outside"),
           StrCat(allowed_dir_, "/to-outside/deeper"),
           StrCat(allowed_dir_, "/a"),
           StrCat(allowed_dir_, "/b"),
           StrCat(allowed_dir_, "/c"),
           StrCat(allowed_dir_, "/d/up/tmp"),
           StrCat(allowed_dir_, "/e1"),
           StrCat(allowed_dir_, "/root/etc"),
           StrCat(allowed_dir_, "/dangling"),
           StrCat("file://", allowed_dir_, "/to-outside"),
       }) {
    const Outcome outcome = Apply(logdir);
    EXPECT_TRUE(outcome.stopped_by == "sidecar" || outcome.stopped_by == "write")
        << logdir << ": " << Describe(outcome);
    EXPECT_EQ(outcome.code, absl::StatusCode::kPermissionDenied) << logdir << Describe(outcome);
  }
  EXPECT_THAT(ListEverything(outside_.path()), IsEmpty());
  EXPECT_FALSE(testing::FileExists(outside_.Join("not-yet")));
}

// Run and host names are single path components wherever they come from: spec.runName, the
// session id a caller sends, or the host name it asks for.
TEST_F(LogdirAllowlistTest, RunAndHostNamesCannotClimbOutOfTheRunDirectory) {
  const std::string root = StrCat(allowed_dir_, "/plugins/profile");
  for (const std::string& name :
       {std::string(".."), std::string("."), std::string("../../x"), std::string("a/b"),
        std::string("a\\b"), std::string("x\n"), std::string("nul\0x", 5), std::string(300, 'r')}) {
    web::json::value spec = web::json::value::object();
    spec["targets"]["selector"]["matchLabels"]["app"] = web::json::value::string("trainer");
    spec["logdir"] = web::json::value::string(allowed_dir_);
    spec["runName"] = web::json::value::string(name);
    EXPECT_FALSE(api::ParseProfileJobSpec(spec).ok()) << "runName " << name;

    tensorflow::ProfileRequest request;
    request.mutable_opts()->set_version(1);
    request.mutable_opts()->set_duration_ms(1000);
    request.set_repository_root(root);
    request.set_session_id(name);
    EXPECT_EQ(sidecar::ParseCaptureRequest(request, policy_, kNow).status().code(),
              absl::StatusCode::kInvalidArgument)
        << "session id " << name;
    request.set_session_id(kRun);
    request.mutable_opts()->set_override_hostname(name);
    EXPECT_EQ(sidecar::ParseCaptureRequest(request, policy_, kNow).status().code(),
              absl::StatusCode::kInvalidArgument)
        << "host name " << name;
  }
  ExpectNothingOutside();
}

}  // namespace
}  // namespace clusterprof
