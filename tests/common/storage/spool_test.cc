#include "common/storage/spool.h"

#include <sys/stat.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::storage {
namespace {

using ::clusterprof::testing::FileExists;
using ::clusterprof::testing::ListFilesRecursively;
using ::clusterprof::testing::TempDir;
using ::clusterprof::testing::WriteFileOrDie;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

SpoolRecord Record(std::string id, uint64_t bytes) {
  SpoolRecord record;
  record.id = std::move(id);
  record.uri = "gs://bucket/logs/plugins/profile/run/host.xplane.pb";
  record.content_type = "application/octet-stream";
  record.bytes = bytes;
  record.crc32c = 0xE3069283u;
  record.created_wall_ns = 1'767'225'600'000'000'000;
  return record;
}

TEST(SpoolRecordTest, RoundTripsThroughJson) {
  SpoolRecord record = Record("1-2-3", 1ull << 40);
  record.session_uri = "http://127.0.0.1:1/upload/storage/v1/b/bucket/o?upload_id=x&a=\"b\"";
  record.committed = 8 << 20;
  record.failed = true;
  record.error = "HTTP 403 Forbidden: \"no\"\n";
  absl::StatusOr<SpoolRecord> back = SpoolRecordFromJson(SpoolRecordToJson(record));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->id, record.id);
  EXPECT_EQ(back->uri, record.uri);
  EXPECT_EQ(back->bytes, record.bytes);
  EXPECT_EQ(back->crc32c, record.crc32c);
  EXPECT_EQ(back->created_wall_ns, record.created_wall_ns);
  EXPECT_EQ(back->session_uri, record.session_uri);
  EXPECT_EQ(back->committed, record.committed);
  EXPECT_TRUE(back->failed);
  EXPECT_EQ(back->error, record.error);
}

TEST(SpoolRecordTest, RejectsBrokenRecordsSayingWhy) {
  EXPECT_THAT(SpoolRecordFromJson("{").status().message(), HasSubstr("not JSON"));
  EXPECT_THAT(SpoolRecordFromJson("{}").status().message(), HasSubstr("\"id\""));
  std::string json = SpoolRecordToJson(Record("a", 10));
  std::string bad_uri = json;
  bad_uri.replace(bad_uri.find("gs://"), 5, "s3://");
  EXPECT_THAT(SpoolRecordFromJson(bad_uri).status().message(), HasSubstr("not a gs:// URI"));
  SpoolRecord over = Record("a", 10);
  over.committed = 11;
  EXPECT_THAT(SpoolRecordFromJson(SpoolRecordToJson(over)).status().message(),
              HasSubstr("exceeds"));
}

TEST(SpoolTest, EntriesSurviveReopeningAndAbandonedWritesDoNot) {
  TempDir dir;
  const std::string spool_dir = dir.Join("spool");
  std::string kept_id;
  {
    auto spool = Spool::Open(spool_dir, 1000);
    ASSERT_TRUE(spool.ok()) << spool.status();
    auto kept = (*spool)->CreateDataFile();
    ASSERT_TRUE(kept.ok());
    ASSERT_EQ(write(kept->second, "0123456789", 10), 10);
    close(kept->second);
    kept_id = kept->first;
    ASSERT_TRUE((*spool)->WriteRecord(Record(kept_id, 10)).ok());
    // A write that never committed, and a record rewrite that died half-way.
    auto abandoned = (*spool)->CreateDataFile();
    ASSERT_TRUE(abandoned.ok());
    close(abandoned->second);
    WriteFileOrDie(spool_dir + "/x.json.tmp", "{");
  }
  auto spool = Spool::Open(spool_dir, 1000);
  ASSERT_TRUE(spool.ok()) << spool.status();
  EXPECT_EQ((*spool)->used_bytes(), 10u);
  std::vector<SpoolRecord> recovered = (*spool)->TakeRecovered();
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_EQ(recovered[0].id, kept_id);
  EXPECT_TRUE((*spool)->TakeRecovered().empty());
  EXPECT_THAT(ListFilesRecursively(spool_dir), ElementsAre(kept_id + ".data", kept_id + ".json"));

  ASSERT_TRUE((*spool)->Remove(kept_id).ok());
  EXPECT_TRUE(ListFilesRecursively(spool_dir).empty());
}

TEST(SpoolTest, ARecordWhoseDataIsWrongIsSetAsideNotUploaded) {
  TempDir dir;
  const std::string spool_dir = dir.Join("spool");
  {
    auto spool = Spool::Open(spool_dir, 1000);
    ASSERT_TRUE(spool.ok());
    auto file = (*spool)->CreateDataFile();
    ASSERT_TRUE(file.ok());
    ASSERT_EQ(write(file->second, "short", 5), 5);
    close(file->second);
    ASSERT_TRUE((*spool)->WriteRecord(Record(file->first, 10)).ok());  // claims 10 bytes
  }
  auto spool = Spool::Open(spool_dir, 1000);
  ASSERT_TRUE(spool.ok());
  EXPECT_TRUE((*spool)->TakeRecovered().empty());
  // Nothing is deleted: the bytes stay for a person to look at.
  std::vector<std::string> files = ListFilesRecursively(spool_dir);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_THAT(files[1], HasSubstr(".json.bad"));
}

TEST(SpoolTest, TheCapIsAClearError) {
  TempDir dir;
  auto spool = Spool::Open(dir.Join("spool"), 100);
  ASSERT_TRUE(spool.ok());
  ASSERT_TRUE((*spool)->Reserve(60, "gs://b/one").ok());
  absl::Status full = (*spool)->Reserve(50, "gs://b/two");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("gs://b/two"));
  EXPECT_THAT(full.message(), HasSubstr("60 of its 100 bytes"));
  EXPECT_THAT(full.message(), HasSubstr("--spool-max-bytes"));
  (*spool)->Release(60);
  EXPECT_TRUE((*spool)->Reserve(100, "gs://b/two").ok());
}

TEST(SpoolTest, AnUnusableDirectoryIsAClearError) {
  TempDir dir;
  WriteFileOrDie(dir.Join("file"), "x");
  EXPECT_THAT(Spool::Open(dir.Join("file/spool"), 1).status().message(),
              AllOf(HasSubstr(dir.Join("file")), HasSubstr("--spool-dir")));
  EXPECT_THAT(Spool::Open("relative/spool", 1).status().message(), HasSubstr("absolute"));
  if (geteuid() != 0) {
    ASSERT_EQ(chmod(dir.path().c_str(), 0500), 0);
    EXPECT_FALSE(Spool::Open(dir.Join("spool"), 1).ok());
    chmod(dir.path().c_str(), 0700);
  }
}

}  // namespace
}  // namespace clusterprof::storage
