#include "common/storage/host_files.h"

#include "common/io/gzip_sink.h"
#include "common/storage/local_storage.h"
#include "common/xspace/xspace_io.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "tests/support/xspace_samples.h"

namespace clusterprof::storage {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(HostFilesTest, WritesTheTensorBoardLayout) {
  testing::TempDir dir;
  auto storage = NewLocalStorage();
  auto layout = RunLayout::Create(*ParseLogdir(dir.path()), "2026_01_01_00_00_00");
  ASSERT_TRUE(layout.ok());
  const auto space = testing::SmallXSpace();
  auto files = WriteHostFiles(*storage, *layout, "10.0.0.2:8466", space);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->events, 8);
  EXPECT_THAT(testing::ListFilesRecursively(dir.path()),
              ElementsAre("plugins/profile/2026_01_01_00_00_00/10.0.0.2_8466.trace.json.gz",
                          "plugins/profile/2026_01_01_00_00_00/10.0.0.2_8466.xplane.pb"));
  EXPECT_EQ(files->xplane.uri,
            dir.path() + "/plugins/profile/2026_01_01_00_00_00/10.0.0.2_8466.xplane.pb");

  auto loaded = xspace::ReadXSpaceFile(files->xplane.uri);
  ASSERT_TRUE(loaded.ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals((*loaded)->space(), space));

  std::string json;
  ASSERT_TRUE(io::GunzipString(testing::ReadFileOrDie(files->trace_json.uri), &json).ok());
  EXPECT_EQ(json, testing::ReadFileOrDie(std::string(CLUSTERPROF_SOURCE_DIR) +
                                         "/tests/data/golden/small_xspace.trace.json"));
}

TEST(HostFilesTest, UnsafeHostNameWritesNothing) {
  testing::TempDir dir;
  auto storage = NewLocalStorage();
  auto layout = RunLayout::Create(*ParseLogdir(dir.path()), "run");
  auto files = WriteHostFiles(*storage, *layout, "../../escape", testing::SmallXSpace());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(), HasSubstr("host name"));
  EXPECT_TRUE(testing::ListFilesRecursively(dir.path()).empty());
}

TEST(HostFilesTest, TraceJsonCanBeSkipped) {
  testing::TempDir dir;
  auto storage = NewLocalStorage();
  auto layout = RunLayout::Create(*ParseLogdir(dir.path()), "run");
  auto files =
      WriteHostFiles(*storage, *layout, "h", testing::SmallXSpace(), {.write_trace_json = false});
  ASSERT_TRUE(files.ok());
  EXPECT_TRUE(files->trace_json.uri.empty());
  EXPECT_THAT(testing::ListFilesRecursively(dir.path()),
              ElementsAre("plugins/profile/run/h.xplane.pb"));
}

}  // namespace
}  // namespace clusterprof::storage
