// `clusterprof inspect` and `convert` on gs:// paths, against the GCS test server.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "common/base/strings.h"
#include "common/io/byte_sink.h"
#include "common/xspace/xspace_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/analysis/synthetic_run.h"
#include "tests/support/gcs_test_server.h"
#include "tests/support/temp_dir.h"
#include "tests/support/xspace_samples.h"
#include "zlib.h"

namespace clusterprof::cli {
namespace {

using ::testing::AllOf;
using testing::GcsTestServer;
using ::testing::HasSubstr;
using testing::TempDir;

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

std::string Gunzip(const std::string& data) {
  z_stream stream{};
  inflateInit2(&stream, 16 + MAX_WBITS);
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  stream.avail_in = static_cast<uInt>(data.size());
  std::string out;
  std::array<char, 65536> buffer;
  int rc = Z_OK;
  while (rc == Z_OK) {
    stream.next_out = reinterpret_cast<Bytef*>(buffer.data());
    stream.avail_out = buffer.size();
    rc = inflate(&stream, Z_NO_FLUSH);
    out.append(buffer.data(), buffer.size() - stream.avail_out);
  }
  inflateEnd(&stream);
  return rc == Z_STREAM_END ? out : "<not gzip>";
}

class CliGcsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = GcsTestServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    io::StringSink sink;
    ASSERT_TRUE(xspace::WriteXSpace(testing::SmallXSpace(), &sink).ok());
    xplane_ = sink.data();
    server_->PutObject("logs", "tb/plugins/profile/run1/worker-0.xplane.pb", xplane_);
    server_->PutObject("logs", "tb/plugins/profile/run1/worker-1.xplane.pb", xplane_);
  }

  Result Cli(const std::string& args) {
    const std::string command = StrCat("STORAGE_EMULATOR_HOST=", server_->endpoint(),
                                       " CLUSTERPROF_SPOOL_DIR=", dir_.Join("spool"), " ",
                                       CLUSTERPROF_CLI_PATH, " ", args, " 2>&1");
    Result result;
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return result;
    std::array<char, 4096> buffer;
    size_t n;
    while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
      result.output.append(buffer.data(), n);
    }
    const int status = pclose(pipe);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return result;
  }

  TempDir dir_;
  std::unique_ptr<GcsTestServer> server_;
  std::string xplane_;
};

TEST_F(CliGcsTest, InspectsARunInABucket) {
  Result run = Cli("inspect --brief gs://logs/tb/plugins/profile/run1");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, AllOf(HasSubstr("run gs://logs/tb/plugins/profile/run1: 2 hosts"),
                                HasSubstr("worker-0"), HasSubstr("worker-1")));
  Result runs = Cli("inspect gs://logs/tb");
  EXPECT_EQ(runs.exit_code, 0) << runs.output;
  EXPECT_THAT(runs.output, HasSubstr("run1"));
  Result file = Cli("inspect gs://logs/tb/plugins/profile/run1/worker-0.xplane.pb");
  EXPECT_EQ(file.exit_code, 0) << file.output;
  EXPECT_THAT(file.output, HasSubstr("gs://logs/tb/plugins/profile/run1/worker-0.xplane.pb"));
}

TEST_F(CliGcsTest, ConvertsFromAndToABucket) {
  Result result =
      Cli("convert gs://logs/tb/plugins/profile/run1/worker-0.xplane.pb -o "
          "gs://logs/out.trace.json.gz");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("wrote gs://logs/out.trace.json.gz"));
  auto object = server_->GetObject("logs", "out.trace.json.gz");
  ASSERT_TRUE(object.has_value());
  EXPECT_THAT(Gunzip(object->data), HasSubstr("\"traceEvents\""));
}

TEST_F(CliGcsTest, ReportsAndMergesARunInABucket) {
  // Four lockstep hosts, host-2 slower to compute, and the manifest with their clock offsets.
  analysis::testing::RunSpec spec;
  spec.hosts.resize(4);
  spec.hosts[2].compute_scale = 1.3;
  spec.hosts[1].clock_offset_ns = 3'000'000;
  std::string manifest = R"({"targets":[)";
  const std::vector<tensorflow::profiler::XSpace> spaces = analysis::testing::MakeRun(spec);
  for (size_t h = 0; h < spaces.size(); ++h) {
    server_->PutObject("logs", StrCat("tb/plugins/profile/lockstep/host-", h, ".xplane.pb"),
                       spaces[h].SerializeAsString());
    StrAppend(&manifest, h == 0 ? "" : ",", R"({"host":"host-)", h, R"(","clock_offset_ns":)",
              spec.hosts[h].clock_offset_ns, "}");
  }
  server_->PutObject("logs", "tb/plugins/profile/lockstep/clusterprof_run.json", manifest + "]}");

  Result report = Cli("report --no-progress gs://logs/tb/plugins/profile/lockstep");
  EXPECT_EQ(report.exit_code, 0) << report.output;
  EXPECT_THAT(report.output, HasSubstr("STRAGGLER host-2 (compute)"));

  Result merged = Cli(StrCat("convert --run gs://logs/tb/plugins/profile/lockstep -o ",
                             dir_.Join("all.trace.json")));
  EXPECT_EQ(merged.exit_code, 0) << merged.output;
  const std::string json = testing::ReadFileOrDie(dir_.Join("all.trace.json"));
  EXPECT_THAT(json, AllOf(HasSubstr("host-0 /host:CPU"), HasSubstr("host-3 /device:GPU:0")));
}

TEST_F(CliGcsTest, MissingObjectsAndBucketsAreClearErrors) {
  Result missing = Cli("inspect gs://logs/tb/plugins/profile/run1/nope.xplane.pb");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.output, HasSubstr("does not exist"));
  Result no_bucket =
      Cli("convert gs://logs/tb/plugins/profile/run1/worker-0.xplane.pb "
          "-o gs://no-such-bucket/out.trace.json.gz");
  EXPECT_EQ(no_bucket.exit_code, 1);
  EXPECT_THAT(no_bucket.output, AllOf(HasSubstr("gs://no-such-bucket/out.trace.json.gz"),
                                      HasSubstr("404"), HasSubstr(dir_.Join("spool"))));
}

}  // namespace
}  // namespace clusterprof::cli
