#include "common/storage/local_storage.h"

#include <sys/stat.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::storage {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TempDir;

TEST(LocalStorageTest, WriteCreatesDirectoriesAndCommitsAtomically) {
  TempDir dir;
  auto storage = NewLocalStorage();
  const std::string path = dir.Join("a/b/c/file.bin");
  auto writer = storage->NewWriter(path);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append("hello ").ok());
  ASSERT_TRUE((*writer)->Append(std::string(3 << 20, 'x')).ok());  // larger than the buffer
  EXPECT_FALSE(testing::FileExists(path)) << "nothing visible before commit";
  auto info = (*writer)->Commit();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->bytes, 6u + (3 << 20));
  EXPECT_EQ(info->uri, path);
  const std::string content = testing::ReadFileOrDie(path);
  EXPECT_EQ(content.size(), 6u + (3 << 20));
  EXPECT_EQ(content.substr(0, 6), "hello ");
  EXPECT_THAT(testing::ListFilesRecursively(dir.path()), ElementsAre("a/b/c/file.bin"))
      << "no temporary file left behind";
}

TEST(LocalStorageTest, CommitReplacesExistingFile) {
  TempDir dir;
  auto storage = NewLocalStorage();
  ASSERT_TRUE(WriteObject(*storage, dir.Join("f"), "old").ok());
  ASSERT_TRUE(WriteObject(*storage, dir.Join("f"), "new").ok());
  EXPECT_EQ(*ReadObject(*storage, dir.Join("f")), "new");
}

TEST(LocalStorageTest, AbortAndDestroyLeaveNothing) {
  TempDir dir;
  auto storage = NewLocalStorage();
  {
    auto writer = storage->NewWriter(dir.Join("aborted"));
    ASSERT_TRUE((*writer)->Append("data").ok());
    (*writer)->Abort();
    (*writer)->Abort();
    EXPECT_FALSE((*writer)->Append("more").ok());
  }
  {
    auto writer = storage->NewWriter(dir.Join("dropped"));
    ASSERT_TRUE((*writer)->Append("data").ok());
  }
  EXPECT_TRUE(testing::ListFilesRecursively(dir.path()).empty());
}

TEST(LocalStorageTest, AbortKeepsThePreviousVersion) {
  TempDir dir;
  auto storage = NewLocalStorage();
  ASSERT_TRUE(WriteObject(*storage, dir.Join("f"), "committed").ok());
  auto writer = storage->NewWriter(dir.Join("f"));
  ASSERT_TRUE((*writer)->Append("partial").ok());
  (*writer)->Abort();
  EXPECT_EQ(*ReadObject(*storage, dir.Join("f")), "committed");
}

TEST(LocalStorageTest, FileInTheWayOfADirectory) {
  TempDir dir;
  auto storage = NewLocalStorage();
  ASSERT_TRUE(WriteObject(*storage, dir.Join("blocker"), "x").ok());
  auto writer = storage->NewWriter(dir.Join("blocker/child"));
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(writer.status().message(), HasSubstr("blocker"));
}

TEST(LocalStorageTest, UnwritableDirectoryIsPermissionDenied) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  TempDir dir;
  ASSERT_EQ(mkdir(dir.Join("ro").c_str(), 0555), 0);
  auto writer = NewLocalStorage()->NewWriter(dir.Join("ro/f"));
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(LocalStorageTest, RelativePathIsRejected) {
  auto writer = NewLocalStorage()->NewWriter("relative/f");
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LocalStorageTest, ListAndStat) {
  TempDir dir;
  auto storage = NewLocalStorage();
  ASSERT_TRUE(WriteObject(*storage, dir.Join("run/b.xplane.pb"), "bb").ok());
  ASSERT_TRUE(WriteObject(*storage, dir.Join("run/a.xplane.pb"), "a").ok());
  ASSERT_TRUE(WriteObject(*storage, dir.Join("run/sub/x"), "").ok());
  auto entries = storage->List(dir.Join("run"));
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].name, "a.xplane.pb");
  EXPECT_EQ((*entries)[0].bytes, 1u);
  EXPECT_EQ((*entries)[1].name, "b.xplane.pb");
  EXPECT_EQ((*entries)[2].name, "sub");
  EXPECT_TRUE((*entries)[2].is_directory);
  EXPECT_TRUE(storage->Stat(dir.Join("run"))->is_directory);
  EXPECT_EQ(storage->Stat(dir.Join("run/b.xplane.pb"))->bytes, 2u);
  EXPECT_EQ(storage->Stat(dir.Join("missing")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(storage->List(dir.Join("missing")).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace clusterprof::storage
