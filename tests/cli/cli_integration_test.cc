// Runs the clusterprof binary as a user would, on good and bad files.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "common/io/byte_sink.h"
#include "common/io/gzip_sink.h"
#include "common/xspace/xspace_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "tests/support/xspace_samples.h"

namespace clusterprof::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::TempDir;

struct Result {
  int exit_code = -1;
  bool signaled = false;
  std::string output;  // stdout and stderr together
};

Result RunShell(const std::string& command) {
  Result result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.signaled = WIFSIGNALED(status);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

Result Cli(const std::string& args) {
  return RunShell(std::string(CLUSTERPROF_CLI_PATH) + " " + args);
}

std::string Golden() {
  return testing::ReadFileOrDie(std::string(CLUSTERPROF_SOURCE_DIR) +
                                "/tests/data/golden/small_xspace.trace.json");
}

void WriteSmallXSpace(const std::string& path) {
  io::StringSink sink;
  ASSERT_TRUE(xspace::WriteXSpace(testing::SmallXSpace(), &sink).ok());
  testing::WriteFileOrDie(path, sink.data());
}

TEST(CliConvertTest, DefaultOutputIsGzippedTraceJsonBesideTheInput) {
  TempDir dir;
  const std::string input = dir.Join("run/worker-0.xplane.pb");
  WriteSmallXSpace(input);
  const Result r = Cli("convert " + input);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("worker-0.trace.json.gz"));
  EXPECT_THAT(r.output, HasSubstr("6 events"));
  std::string json;
  ASSERT_TRUE(
      io::GunzipString(testing::ReadFileOrDie(dir.Join("run/worker-0.trace.json.gz")), &json).ok());
  EXPECT_EQ(json, Golden());
}

TEST(CliConvertTest, UncompressedAndStdoutAndPerfettoShape) {
  TempDir dir;
  const std::string input = dir.Join("h.xplane.pb");
  WriteSmallXSpace(input);
  ASSERT_EQ(Cli("convert " + input + " -o " + dir.Join("out/h.json")).exit_code, 0);
  EXPECT_EQ(testing::ReadFileOrDie(dir.Join("out/h.json")), Golden());

  const Result r = RunShell(std::string(CLUSTERPROF_CLI_PATH) + " convert " + input + " -o -");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, Golden());

  const Result p =
      RunShell(std::string(CLUSTERPROF_CLI_PATH) + " convert --perfetto " + input + " -o -");
  ASSERT_EQ(p.exit_code, 0);
  EXPECT_THAT(p.output, Not(HasSubstr("\"metadata\"")));
}

TEST(CliConvertTest, OutputIsValidJsonForPython) {
  TempDir dir;
  const std::string input = dir.Join("h.xplane.pb");
  WriteSmallXSpace(input);
  ASSERT_EQ(Cli("convert " + input).exit_code, 0);
  const Result r = RunShell("/usr/bin/python3 -c \"import gzip,json,sys; d=json.load(gzip.open('" +
                            dir.Join("h.trace.json.gz") +
                            "')); print(len(d['traceEvents']), d['displayTimeUnit'])\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "19 ns\n");
}

struct BadInput {
  const char* name;
  std::string content;
  const char* message;
};

TEST(CliBadInputTest, ClearErrorsAndNoCrash) {
  TempDir dir;
  io::StringSink good;
  ASSERT_TRUE(xspace::WriteXSpace(testing::SmallXSpace(), &good).ok());
  const std::vector<BadInput> cases = {
      {"empty.xplane.pb", "", "is empty"},
      {"truncated.xplane.pb", good.data().substr(0, good.data().size() - 7),
       "truncated or corrupt"},
      {"garbage.xplane.pb", std::string("\xff\xfe\x00\x01garbage", 11), "truncated or corrupt"},
      {"json.xplane.pb", "{\"traceEvents\":[]}", "not"},
      // A ProfileRequest: duration_ms=2000, session_id="run".
      {"request.xplane.pb", std::string("\x08\xd0\x0f\x32\x03run", 8), "not an XSpace"},
  };
  for (const BadInput& c : cases) {
    const std::string path = dir.Join(c.name);
    testing::WriteFileOrDie(path, c.content);
    for (const std::string& command : {"convert " + path, "inspect " + path}) {
      const Result r = Cli(command);
      EXPECT_FALSE(r.signaled) << command;
      EXPECT_EQ(r.exit_code, 1) << command << "\n" << r.output;
      EXPECT_THAT(r.output, HasSubstr(path)) << command;
      EXPECT_THAT(r.output, HasSubstr(c.message)) << command;
    }
  }
  EXPECT_FALSE(testing::FileExists(dir.Join("empty.trace.json.gz")));
}

TEST(CliBadInputTest, MissingFileAndUsage) {
  const Result missing = Cli("convert /nonexistent/h.xplane.pb");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.output, HasSubstr("/nonexistent/h.xplane.pb"));
  EXPECT_THAT(missing.output, HasSubstr("No such file"));
  const Result inspect_missing = Cli("inspect /nonexistent/run");
  EXPECT_EQ(inspect_missing.exit_code, 1);
  EXPECT_THAT(inspect_missing.output, HasSubstr("/nonexistent/run"));
  EXPECT_NE(Cli("frobnicate").exit_code, 0);
  EXPECT_NE(Cli("convert --perfetto").exit_code, 0) << "an input is still required";
}

TEST(CliHelpTest, NoArgumentsPrintTheHelpWithAnExamplePerSubcommand) {
  const Result bare = Cli("");
  EXPECT_EQ(bare.exit_code, 0);
  EXPECT_EQ(bare.output, Cli("--help").output);
  for (const std::string command : {"capture", "inspect", "report", "convert"}) {
    SCOPED_TRACE(command);
    EXPECT_THAT(bare.output, HasSubstr("  " + command));
    EXPECT_THAT(bare.output, HasSubstr("  clusterprof " + command + " "));
    const Result sub = Cli(command);
    EXPECT_EQ(sub.exit_code, 0);
    EXPECT_EQ(sub.output, Cli(command + " --help").output);
    EXPECT_THAT(sub.output, HasSubstr("Example:\n  clusterprof " + command + " "));
  }
}

TEST(CliInspectTest, FileRunDirAndLogdir) {
  TempDir dir;
  const std::string run = dir.Join("plugins/profile/2026_01_01_00_00_00");
  WriteSmallXSpace(run + "/worker-0.xplane.pb");
  WriteSmallXSpace(run + "/worker-1.xplane.pb");

  const Result file = Cli("inspect " + run + "/worker-0.xplane.pb");
  ASSERT_EQ(file.exit_code, 0) << file.output;
  EXPECT_THAT(file.output, HasSubstr("/device:GPU:0"));
  EXPECT_THAT(file.output, HasSubstr("train_step"));

  const Result run_dir = Cli("inspect " + run);
  ASSERT_EQ(run_dir.exit_code, 0) << run_dir.output;
  EXPECT_THAT(run_dir.output, HasSubstr("2 hosts"));
  EXPECT_THAT(run_dir.output, HasSubstr("worker-0"));
  EXPECT_THAT(run_dir.output, HasSubstr("worker-1"));

  const Result logdir = Cli("inspect " + dir.path());
  ASSERT_EQ(logdir.exit_code, 0) << logdir.output;
  EXPECT_THAT(logdir.output, HasSubstr("2026_01_01_00_00_00"));

  const Result empty = Cli("inspect " + dir.Join("plugins"));
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_THAT(empty.output, HasSubstr("no .xplane.pb files"));
}

TEST(CliInspectTest, RunWithOneBadHostStillShowsTheOthers) {
  TempDir dir;
  WriteSmallXSpace(dir.Join("run/good.xplane.pb"));
  testing::WriteFileOrDie(dir.Join("run/bad.xplane.pb"), "\xff\xff");
  const Result r = Cli("inspect " + dir.Join("run"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("good"));
  EXPECT_THAT(r.output, HasSubstr("bad"));
  EXPECT_THAT(r.output, HasSubstr("unreadable"));
  EXPECT_THAT(r.output, HasSubstr("1 of 2 host files could not be read"));
}

// A file written by Python's pure-Python protobuf, from stubs that protoc generates out of our
// .proto files: what TensorFlow or JAX would write.
TEST(CliInteropTest, ReadsXSpaceWrittenByPythonProtobuf) {
  TempDir dir;
  const std::string proto_dir = std::string(CLUSTERPROF_SOURCE_DIR) + "/proto";
  const Result gen =
      RunShell(std::string(CLUSTERPROF_PROTOC) + " -I" + proto_dir + " --python_out=" + dir.path() +
               " " + proto_dir + "/tsl/profiler/protos/xplane.proto");
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  const std::string file = dir.Join("py/py-writer.xplane.pb");
  testing::WriteFileOrDie(file, "");
  const Result py = RunShell("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python /usr/bin/python3 " +
                             std::string(CLUSTERPROF_SOURCE_DIR) + "/tests/cli/write_xspace.py " +
                             dir.path() + " " + file);
  ASSERT_EQ(py.exit_code, 0) << py.output;
  EXPECT_THAT(py.output, HasSubstr("implementation=python"));

  const Result inspect = Cli("inspect " + dir.Join("py"));
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_THAT(inspect.output, HasSubstr("py-writer"));
  EXPECT_THAT(inspect.output, HasSubstr("MainThread"));
  EXPECT_THAT(inspect.output, HasSubstr("python_step"));
  EXPECT_THAT(inspect.output, HasSubstr("20"));  // events

  const Result convert = RunShell(std::string(CLUSTERPROF_CLI_PATH) + " convert " + file + " -o -");
  ASSERT_EQ(convert.exit_code, 0) << convert.output;
  EXPECT_THAT(convert.output,
              HasSubstr("{\"ph\":\"X\",\"pid\":701,\"tid\":77,\"ts\":1767225600000010,\"dur\":9,"
                        "\"name\":\"python_step\",\"args\":{\"step_num\":\"1\"}}"));
}

}  // namespace
}  // namespace clusterprof::cli
