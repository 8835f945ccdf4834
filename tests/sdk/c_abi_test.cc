// libclusterprof_annotate.so as a C program sees it: called from C (c_abi_calls.c), exporting
// only the C ABI, needing only the C runtime.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/annotate.h"
#include "sdk/clusterprof_annotate.h"
#include "sdk/control_page.h"
#include "tests/sdk/c_abi_calls.h"
#include "tests/sdk/drained_event.h"
#include "tests/support/temp_dir.h"

namespace clusterprof {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;

std::string RunCommand(const std::string& command) {
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0) << command;
  return output;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(CAbiLibraryTest, ExportsOnlyTheCAbi) {
  std::set<std::string> symbols;
  for (const std::string& line : Lines(RunCommand(
           std::string(CLUSTERPROF_NM) + " -D --defined-only " + CLUSTERPROF_ANNOTATE_LIB))) {
    std::istringstream fields(line);
    std::string address, type, name;
    fields >> address >> type >> name;
    if (type == "A") continue;  // the version node itself
    symbols.insert(name.substr(0, name.find('@')));
  }
  EXPECT_THAT(symbols, UnorderedElementsAreArray({
                           "clusterprof_abi_version",
                           "clusterprof_async_begin",
                           "clusterprof_async_end",
                           "clusterprof_attached",
                           "clusterprof_dropped_strings",
                           "clusterprof_now_ns",
                           "clusterprof_record_complete",
                           "clusterprof_ring_path",
                           "clusterprof_set_thread_name",
                           "clusterprof_trace_begin",
                           "clusterprof_trace_end",
                           "clusterprof_tracing_enabled",
                       }));
}

TEST(CAbiLibraryTest, NeedsOnlyTheCRuntime) {
  if (std::string_view(CLUSTERPROF_SANITIZE) != "") {
    GTEST_SKIP() << "a sanitized library also needs the sanitizer's runtime";
  }
  std::set<std::string> needed;
  for (const std::string& line :
       Lines(RunCommand(std::string(CLUSTERPROF_READELF) + " -d " + CLUSTERPROF_ANNOTATE_LIB))) {
    const size_t open = line.find("(NEEDED)");
    if (open == std::string::npos) continue;
    const size_t start = line.find('[');
    const size_t end = line.find(']');
    ASSERT_NE(start, std::string::npos) << line;
    needed.insert(line.substr(start + 1, end - start - 1));
  }
  // The SDK and the C++ runtime are linked in, so the library loads into processes with any (or
  // no) libstdc++.
  for (const std::string& library : needed) {
    EXPECT_TRUE(library.starts_with("libc.so") || library.starts_with("libm.so") ||
                library.starts_with("ld-linux") || library.starts_with("libpthread.so") ||
                library.starts_with("libdl.so"))
        << library;
  }
}

// The library reads CLUSTERPROF_DIR once, at its first call, so one test runs the whole story.
TEST(CAbiFromCTest, RecordsOnlyWhileArmed) {
  testing::TempDir dir;
  ASSERT_EQ(setenv("CLUSTERPROF_DIR", dir.path().c_str(), 1), 0);
  std::string error;
  auto control = shm::ControlWriter::Create(dir.path(), &error);  // disarmed
  ASSERT_NE(control, nullptr) << error;

  EXPECT_EQ(c_abi_tracing_enabled(CLUSTERPROF_LEVEL_CRITICAL), 0);
  EXPECT_EQ(c_abi_record_everything(), 0);
  EXPECT_EQ(c_abi_attached(), 1);
  EXPECT_EQ(c_abi_ring_path(nullptr, 0), 0u);
  EXPECT_THAT(testing::DrainEvents(dir.path()), IsEmpty());

  control->ArmHost(kAnnotationLevelInfo, 0, 0);
  EXPECT_EQ(c_abi_tracing_enabled(CLUSTERPROF_LEVEL_INFO), 1);
  EXPECT_EQ(c_abi_tracing_enabled(CLUSTERPROF_LEVEL_VERBOSE), 0);
  EXPECT_EQ(c_abi_record_everything(), 7);
  EXPECT_EQ(c_abi_dropped_strings(), 0u);
  char path[4096];
  ASSERT_GT(c_abi_ring_path(path, sizeof(path)), 0u);
  EXPECT_TRUE(testing::FileExists(path));

  const auto seen = testing::DrainEvents(dir.path());
  ASSERT_EQ(seen.size(), 5u);
  for (const auto& event : seen) EXPECT_EQ(event.thread, "c_main");
  EXPECT_EQ(seen[0].kind, shm::RecordKind::kComplete);
  EXPECT_EQ(seen[0].name, "forward#layer=dense_1,training=1#");
  EXPECT_EQ(seen[1].kind, shm::RecordKind::kAsyncBegin);
  EXPECT_EQ(seen[1].name, "prefetch");
  EXPECT_EQ(seen[1].async_id, 42u);
  EXPECT_EQ(seen[2].kind, shm::RecordKind::kAsyncEnd);
  EXPECT_EQ(seen[2].async_id, 42u);
  EXPECT_EQ(seen[3].name, "timed");
  EXPECT_EQ(seen[3].end_ns - seen[3].start_ns, 500);
  EXPECT_EQ(seen[4].name, "train");
  EXPECT_THAT(seen[4].args, ElementsAre("step_num=i:3", "_r=i:1"));
  EXPECT_LE(seen[4].start_ns, seen[0].start_ns);
  EXPECT_LE(seen[0].end_ns, seen[4].end_ns);

  control->Disarm();
  EXPECT_EQ(c_abi_record_everything(), 0);
  EXPECT_THAT(testing::DrainEvents(dir.path()), IsEmpty());
}

}  // namespace
}  // namespace clusterprof
