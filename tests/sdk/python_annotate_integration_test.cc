// The Python module (sdk/python/clusterprof) end to end: a Python process annotates
// through libclusterprof_annotate.so while a control page is armed, and the test drains its ring
// as the sidecar would. Also: nothing is recorded while disarmed, and without the library the
// module still runs, records nothing and warns once.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/annotate.h"
#include "sdk/control_page.h"
#include "tests/sdk/drained_event.h"
#include "tests/support/temp_dir.h"

namespace clusterprof {
namespace {

using testing::DrainedEvent;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using testing::TempDir;

struct Result {
  int exit_code = -1;
  std::string output;                         // stdout and stderr together
  std::map<std::string, std::string> values;  // the script's `key=value` lines
};

std::string Quote(const std::string& text) { return "'" + text + "'"; }

// Runs the test script with `python_path` as PYTHONPATH and `library` as
// CLUSTERPROF_ANNOTATE_LIB, recording into `dir`.
Result RunScript(const std::string& dir, const std::string& python_path,
                 const std::string& library) {
  const std::string script =
      std::string(CLUSTERPROF_SOURCE_DIR) + "/tests/sdk/python_annotate_script.py";
  // -B: no bytecode files in the source tree; -s: no user site-packages.
  const std::string command = "env CLUSTERPROF_DIR=" + Quote(dir) +
                              " PYTHONPATH=" + Quote(python_path) +
                              " CLUSTERPROF_ANNOTATE_LIB=" + Quote(library) + " " +
                              CLUSTERPROF_TEST_PYTHON + " -B -s " + Quote(script) + " 2>&1";
  Result result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  size_t start = 0;
  while (start < result.output.size()) {
    size_t end = result.output.find('\n', start);
    if (end == std::string::npos) end = result.output.size();
    const std::string line = result.output.substr(start, end - start);
    if (const size_t eq = line.find('='); eq != std::string::npos) {
      result.values.emplace(line.substr(0, eq), line.substr(eq + 1));
    }
    start = end + 1;
  }
  return result;
}

// One line per event: "C name{stats}" (complete), "B name id" (async begin), "E id".
std::string Describe(const DrainedEvent& event) {
  switch (event.kind) {
    case shm::RecordKind::kComplete: {
      std::string text = "C " + event.BaseName() + "{";
      const std::vector<std::string> stats = event.Stats();
      for (size_t i = 0; i < stats.size(); ++i) text += (i > 0 ? "," : "") + stats[i];
      return text + "}";
    }
    case shm::RecordKind::kAsyncBegin:
      return "B " + event.name + " " + std::to_string(event.async_id);
    case shm::RecordKind::kAsyncEnd:
      return "E " + std::to_string(event.async_id);
  }
  return "?";
}

class PythonAnnotateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string_view(CLUSTERPROF_SANITIZE) != "") {
      // A sanitized library cannot load into an interpreter built without the sanitizer; the C
      // ABI runs under the sanitizers in c_api_test and c_abi_test.
      GTEST_SKIP() << "needs an unsanitized libclusterprof_annotate.so";
    }
    if (!std::filesystem::exists(CLUSTERPROF_TEST_PYTHON)) {
      GTEST_SKIP() << CLUSTERPROF_TEST_PYTHON << " is not installed";
    }
    std::string error;
    control_ = shm::ControlWriter::Create(dir_.path(), &error);
    ASSERT_NE(control_, nullptr) << error;
  }

  TempDir dir_;
  std::unique_ptr<shm::ControlWriter> control_;
};

TEST_F(PythonAnnotateTest, RecordsNestedStepsThreadsAndMetadata) {
  control_->ArmHost(kAnnotationLevelInfo, 0, 0);
  const Result r = RunScript(dir_.path(), CLUSTERPROF_PYTHON_PACKAGE_DIR, CLUSTERPROF_ANNOTATE_LIB);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.values.at("library"), CLUSTERPROF_ANNOTATE_LIB);
  EXPECT_EQ(r.values.at("enabled"), "1");
  EXPECT_EQ(r.values.at("verbose_enabled"), "0");
  EXPECT_EQ(r.values.at("exception"), "propagated");
  EXPECT_EQ(r.values.at("attached"), "1");
  EXPECT_EQ(r.values.at("dropped_strings"), "0");
  EXPECT_THAT(r.values.at("ring_path"), HasSubstr(dir_.path() + "/ring-" + r.values.at("pid")));
  EXPECT_EQ(r.values.at("done"), "1");
  EXPECT_THAT(r.output, Not(HasSubstr("clusterprof: "))) << "no warning expected";

  const auto events = testing::DrainEvents(dir_.path());
  std::vector<std::string> main_thread, loader_thread;
  std::vector<DrainedEvent> steps, forwards, backwards;
  for (const DrainedEvent& e : events) {
    EXPECT_EQ(std::to_string(e.pid), r.values.at("pid"));
    if (e.thread == "py_main") {
      main_thread.push_back(Describe(e));
    } else if (e.thread == "py_loader") {
      loader_thread.push_back(Describe(e));
    } else {
      ADD_FAILURE() << "event on an unnamed thread: " << Describe(e);
    }
    if (e.BaseName() == "train") steps.push_back(e);
    if (e.BaseName() == "forward") forwards.push_back(e);
    if (e.BaseName() == "backward") backwards.push_back(e);
  }
  // The events as the sidecar decodes them: kwargs in order, booleans as 1/0, '#' as '_',
  // set_metadata's pairs after them; no verbose event at the info level.
  EXPECT_THAT(
      main_thread,
      ElementsAre("C forward{layer=s:dense_1,training=i:1}", "C backward{grad_norm=d:0.500000}",
                  "C train{step_num=i:0,_r=i:1,in_cache=i:1}",
                  "C forward{layer=s:dense_1,training=i:1}", "C backward{grad_norm=d:0.500000}",
                  "C train{step_num=i:1,_r=i:1,in_cache=i:0}",
                  "C forward{layer=s:dense_1,training=i:1}", "C backward{grad_norm=d:0.500000}",
                  "C train{step_num=i:2,_r=i:1,in_cache=i:1}", "C optimizer{lr=d:0.250000}",
                  "C keyword_level{level=i:3}", "E 100", "E 101", "C raises{}"));
  EXPECT_THAT(loader_thread, ElementsAre("C load_batch{batch=i:0}", "B batch_in_queue 100",
                                         "C load_batch{batch=i:1}", "B batch_in_queue 101"));
  // Step numbers travel inline: the names interned do not change with every step.
  for (const DrainedEvent& step : steps) {
    EXPECT_THAT(step.name, Not(HasSubstr("step_num"))) << step.name;
    EXPECT_THAT(step.args, ElementsAre(HasSubstr("step_num=i:"), "_r=i:1"));
  }

  // Nesting: each step holds its forward, then its backward.
  ASSERT_EQ(steps.size(), 3u);
  ASSERT_EQ(forwards.size(), 3u);
  ASSERT_EQ(backwards.size(), 3u);
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_LE(steps[i].start_ns, forwards[i].start_ns);
    EXPECT_LE(forwards[i].start_ns, forwards[i].end_ns);
    EXPECT_LE(forwards[i].end_ns, backwards[i].start_ns);
    EXPECT_LE(backwards[i].start_ns, backwards[i].end_ns);
    EXPECT_LE(backwards[i].end_ns, steps[i].end_ns);
    if (i > 0) {
      EXPECT_LE(steps[i - 1].end_ns, steps[i].start_ns);
    }
  }
}

TEST_F(PythonAnnotateTest, RecordsNothingWhileDisarmed) {
  control_->Disarm();
  const Result r = RunScript(dir_.path(), CLUSTERPROF_PYTHON_PACKAGE_DIR, CLUSTERPROF_ANNOTATE_LIB);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.values.at("enabled"), "0");
  EXPECT_EQ(r.values.at("attached"), "1");
  EXPECT_EQ(r.values.at("ring_path"), "");
  EXPECT_EQ(r.values.at("done"), "1");
  EXPECT_THAT(*shm::ListRingFiles(dir_.path()), IsEmpty());
}

TEST_F(PythonAnnotateTest, WithoutTheLibraryTheModuleIsANoOpThatWarnsOnce) {
  // A copy of the package outside the checkout, so no build tree is next to it either.
  TempDir packages;
  std::filesystem::create_directories(packages.Join("clusterprof"));
  std::filesystem::copy_file(
      std::string(CLUSTERPROF_PYTHON_PACKAGE_DIR) + "/clusterprof/__init__.py",
      packages.Join("clusterprof/__init__.py"));
  control_->ArmHost(kAnnotationLevelInfo, 0, 0);
  const std::string missing = dir_.Join("missing/libclusterprof_annotate.so");
  const Result r = RunScript(dir_.path(), packages.path(), missing);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.values.at("library"), "None");
  EXPECT_EQ(r.values.at("enabled"), "0");
  EXPECT_EQ(r.values.at("exception"), "propagated");
  EXPECT_EQ(r.values.at("attached"), "0");
  EXPECT_EQ(r.values.at("done"), "1");
  const std::string warning = "no usable libclusterprof_annotate.so";
  const size_t first = r.output.find(warning);
  ASSERT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(warning, first + 1), std::string::npos) << "warned more than once";
  EXPECT_THAT(r.output, HasSubstr(missing));
  EXPECT_THAT(*shm::ListRingFiles(dir_.path()), IsEmpty());
}

}  // namespace
}  // namespace clusterprof
