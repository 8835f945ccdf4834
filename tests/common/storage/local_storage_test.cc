#include "common/storage/local_storage.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::storage {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TempDir;

// Everything under `dir`, directories and links included.
std::vector<std::string> ListEverything(const std::string& dir) {
  std::vector<std::string> entries;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    entries.push_back(std::filesystem::relative(it->path(), dir).string());
  }
  return entries;
}

std::unique_ptr<Storage> ConfinedStorage(std::vector<std::string> roots) {
  LocalStorageOptions options;
  options.sync = false;
  options.write_roots = std::move(roots);
  return NewLocalStorage(options);
}

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

TEST(LocalStorageTest, ConfinedWritesStayBeneathTheirRoots) {
  TempDir root;
  TempDir outside;
  auto storage = ConfinedStorage({root.Join("logs")});
  ASSERT_TRUE(WriteObject(*storage, root.Join("logs/a/b/f"), "in").ok())
      << "the root and what is below it are created";
  EXPECT_EQ(testing::ReadFileOrDie(root.Join("logs/a/b/f")), "in");

  absl::StatusOr<ObjectInfo> written = WriteObject(*storage, outside.Join("f"), "out");
  EXPECT_EQ(written.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(written.status().message(), HasSubstr(root.Join("logs")));
  written = WriteObject(*storage, root.Join("logs-evil/f"), "out");
  EXPECT_EQ(written.status().code(), absl::StatusCode::kPermissionDenied) << "whole components";
  EXPECT_EQ(WriteObject(*storage, root.Join("logs/../f"), "out").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteObject(*ConfinedStorage({}), root.Join("logs/f"), "x").status().code(),
            absl::StatusCode::kPermissionDenied)
      << "no roots: nothing may be written";

  // Links that stay beneath the root are followed, relative or absolute.
  ASSERT_EQ(symlink("a/b", root.Join("logs/relative").c_str()), 0);
  ASSERT_EQ(symlink(root.Join("logs/a").c_str(), root.Join("logs/absolute").c_str()), 0);
  ASSERT_EQ(symlink("../../a", root.Join("logs/a/b/up").c_str()), 0);
  ASSERT_TRUE(WriteObject(*storage, root.Join("logs/relative/g"), "1").ok());
  ASSERT_TRUE(WriteObject(*storage, root.Join("logs/absolute/h"), "2").ok());
  ASSERT_TRUE(WriteObject(*storage, root.Join("logs/a/b/up/i"), "3").ok());
  EXPECT_EQ(testing::ReadFileOrDie(root.Join("logs/a/b/g")), "1");
  EXPECT_EQ(testing::ReadFileOrDie(root.Join("logs/a/h")), "2");
  EXPECT_EQ(testing::ReadFileOrDie(root.Join("logs/a/i")), "3");

  // Links that lead out are refused, naming the link.
  ASSERT_EQ(symlink(outside.path().c_str(), root.Join("logs/out").c_str()), 0);
  ASSERT_EQ(symlink("../..", root.Join("logs/a/above").c_str()), 0);
  written = WriteObject(*storage, root.Join("logs/out/run/f"), "x");
  EXPECT_EQ(written.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(written.status().message(),
              HasSubstr(StrCat(root.Join("logs/out"), " is a symbolic link to ", outside.path())));
  written = WriteObject(*storage, root.Join("logs/a/above/f"), "x");
  EXPECT_EQ(written.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(written.status().message(), HasSubstr("leads above"));
  EXPECT_THAT(ListEverything(outside.path()), ::testing::IsEmpty());
  EXPECT_FALSE(testing::FileExists(root.Join("f")));
}

TEST(LocalStorageTest, ARootNamedThroughALinkOrByItsRealPathIsTheSameRoot) {
  TempDir dir;
  ASSERT_EQ(mkdir(dir.Join("real").c_str(), 0755), 0);
  ASSERT_EQ(symlink(dir.Join("real").c_str(), dir.Join("alias").c_str()), 0);
  auto storage = ConfinedStorage({dir.Join("alias")});
  EXPECT_TRUE(WriteObject(*storage, dir.Join("alias/x/f"), "1").ok());
  EXPECT_TRUE(WriteObject(*storage, dir.Join("real/x/g"), "2").ok());
  EXPECT_THAT(testing::ListFilesRecursively(dir.Join("real")), ElementsAre("x/f", "x/g"));
}

TEST(LocalStorageTest, ALinkAtTheFinalNameIsReplacedNotFollowed) {
  TempDir root;
  TempDir outside;
  const std::string victim = outside.Join("victim");
  testing::WriteFileOrDie(victim, "precious");
  auto storage = ConfinedStorage({root.path()});
  ASSERT_EQ(symlink(victim.c_str(), root.Join("f").c_str()), 0);
  ASSERT_TRUE(WriteObject(*storage, root.Join("f"), "new").ok());
  EXPECT_EQ(testing::ReadFileOrDie(victim), "precious");
  struct stat st;
  ASSERT_EQ(lstat(root.Join("f").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(testing::ReadFileOrDie(root.Join("f")), "new");
}

// A process sharing the logdir swaps a directory on the way for a link to elsewhere, again and
// again, while files are written: every write lands beneath the root or fails saying why, and
// nothing ever appears outside.
TEST(LocalStorageTest, ALinkSwappedInDuringWritesNeverRedirectsThem) {
  TempDir root;
  TempDir outside;
  const std::string logs = root.Join("logs");
  const std::string plugins = StrCat(logs, "/tb/plugins");
  const std::string link = StrCat(logs, "/tb/link");
  ASSERT_EQ(std::filesystem::create_directories(StrCat(plugins, "/profile")), true);
  ASSERT_EQ(symlink(outside.path().c_str(), link.c_str()), 0);
  // RENAME_EXCHANGE swaps the directory and the link in one step, so `plugins` is always one of
  // the two.
  if (renameat2(AT_FDCWD, plugins.c_str(), AT_FDCWD, link.c_str(), RENAME_EXCHANGE) != 0) {
    GTEST_SKIP() << "this file system cannot exchange names: " << std::strerror(errno);
  }
  std::atomic<bool> stop{false};
  std::atomic<int> swaps{0};
  std::thread swapper([&] {
    while (!stop.load()) {
      if (renameat2(AT_FDCWD, plugins.c_str(), AT_FDCWD, link.c_str(), RENAME_EXCHANGE) == 0) {
        swaps.fetch_add(1);
      }
    }
  });

  auto storage = ConfinedStorage({logs});
  int landed = 0;
  int refused = 0;
  for (int i = 0; i < 2000; ++i) {
    const std::string path = StrCat(plugins, "/profile/run", i % 7, "/host", i, ".xplane.pb");
    absl::StatusOr<ObjectInfo> written = WriteObject(*storage, path, "xplane");
    if (written.ok()) {
      ++landed;
      continue;
    }
    ++refused;
    EXPECT_EQ(written.status().code(), absl::StatusCode::kPermissionDenied) << written.status();
    EXPECT_THAT(written.status().message(),
                HasSubstr(StrCat(" is a symbolic link to ", outside.path(), ", outside ", logs)));
  }
  stop = true;
  swapper.join();
  std::printf("%d writes landed, %d refused, %d swaps\n", landed, refused, swaps.load());

  EXPECT_THAT(ListEverything(outside.path()), ::testing::IsEmpty()) << "written outside";
  // Every write that succeeded is in one of the two names the directory had.
  EXPECT_EQ(testing::ListFilesRecursively(logs).size(), static_cast<size_t>(landed));
}

}  // namespace
}  // namespace clusterprof::storage
