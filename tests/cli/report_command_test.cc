// `clusterprof report` on run directories written to disk: synthetic hosts (one straggling, with
// clock offsets known only from the manifest), a corrupt host file, and bad input.
#include <map>
#include <sstream>

#include "cli/commands.h"
#include "common/base/strings.h"
#include "cpprest/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/analysis/synthetic_run.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::cli {
namespace {

using ::testing::HasSubstr;

struct Output {
  int code = 0;
  std::string out;
  std::string err;
};

Output Report(ReportOptions options) {
  options.progress = false;
  std::ostringstream out, err;
  Output result;
  result.code = RunReport(options, out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

// Writes a run of `spec` as <dir>/host-N.xplane.pb files and a manifest with the offsets.
void WriteRun(const analysis::testing::RunSpec& spec, const std::string& dir) {
  const std::vector<tensorflow::profiler::XSpace> spaces = analysis::testing::MakeRun(spec);
  std::string manifest = R"({"kind":"clusterprof.io/v1alpha1/CaptureRun","targets":[)";
  for (size_t h = 0; h < spaces.size(); ++h) {
    testing::WriteFileOrDie(StrCat(dir, "/host-", h, ".xplane.pb"), spaces[h].SerializeAsString());
    StrAppend(&manifest, h == 0 ? "" : ",", R"({"host":"host-)", h, R"(","clock_offset_ns":)",
              spec.hosts[h].clock_offset_ns, "}");
  }
  manifest += "]}";
  testing::WriteFileOrDie(StrCat(dir, "/clusterprof_run.json"), manifest);
}

TEST(ReportCommandTest, NamesTheStragglerUsingTheManifestsClockOffsets) {
  testing::TempDir dir;
  analysis::testing::RunSpec spec;
  spec.hosts.resize(6);
  spec.hosts[4].compute_scale = 1.3;
  for (size_t h = 0; h < spec.hosts.size(); ++h) {
    spec.hosts[h].clock_offset_ns = (h % 2 == 0 ? 4 : -4) * 1'000'000;
  }
  WriteRun(spec, dir.path());
  Output result = Report({.path = dir.path(), .json = dir.Join("report.json")});
  ASSERT_EQ(result.code, kExitOk) << result.err;
  EXPECT_THAT(result.out, HasSubstr("STRAGGLER host-4 (compute): enters the collectives"));
  EXPECT_THAT(result.out, HasSubstr("6 hosts, steps 100-149 in common (50 compared)"));
  const web::json::value json =
      web::json::value::parse(testing::ReadFileOrDie(dir.Join("report.json")));
  EXPECT_EQ(json.at("kind").as_string(), "clusterprof.io/v1alpha1/RunReport");
  EXPECT_EQ(json.at("schema_version").as_integer(), 1);
  ASSERT_EQ(json.at("stragglers").size(), 1u);
  EXPECT_EQ(json.at("stragglers").at(0).as_string(), "host-4");
  EXPECT_EQ(json.at("hosts").at(4).at("cause").as_string(), "compute");
  EXPECT_TRUE(json.at("hosts").at(4).at("straggler").as_bool());
  EXPECT_FALSE(json.at("hosts").at(0).at("straggler").as_bool());
}

TEST(ReportCommandTest, WritesTheHtmlReport) {
  testing::TempDir dir;
  analysis::testing::RunSpec spec;
  spec.hosts.resize(3);
  spec.hosts[2].compute_scale = 1.3;
  WriteRun(spec, dir.path());
  Output result = Report({.path = dir.path(), .html = dir.Join("report.html")});
  ASSERT_EQ(result.code, kExitOk) << result.err;
  EXPECT_THAT(result.out, HasSubstr(StrCat("\nHTML report: ", dir.Join("report.html"), "\n")));
  const std::string html = testing::ReadFileOrDie(dir.Join("report.html"));
  EXPECT_TRUE(html.starts_with("<!DOCTYPE html>"));
  EXPECT_THAT(html, HasSubstr("<span class=\"host\">host-2</span>"));

  Output unwritable = Report({.path = dir.path(), .html = dir.Join("no/such/dir/report.html")});
  EXPECT_EQ(unwritable.code, kExitFailure);
  EXPECT_THAT(unwritable.err, HasSubstr("cannot write"));
}

TEST(ReportCommandTest, ManyHostsTheWorstAndASummaryLineOrWithAllEveryHostInNaturalOrder) {
  testing::TempDir dir;
  analysis::testing::RunSpec spec;
  spec.hosts.resize(30);
  spec.steps = 20;
  spec.hosts[17].compute_scale = 1.3;
  WriteRun(spec, dir.path());
  Output result = Report({.path = dir.path()});
  ASSERT_EQ(result.code, kExitOk) << result.err;
  EXPECT_THAT(result.out, HasSubstr("verdict\n  host-17 "));
  EXPECT_THAT(result.out, HasSubstr("\n  ... 10 more hosts "));
  EXPECT_THAT(result.out, HasSubstr("(--all lists every host)\n"));

  result = Report({.path = dir.path(), .all = true});
  ASSERT_EQ(result.code, kExitOk) << result.err;
  EXPECT_THAT(result.out, ::testing::Not(HasSubstr("more hosts")));
  size_t last = 0;
  for (int h = 0; h < 30; ++h) {
    const size_t at = result.out.find(StrCat("\n  host-", h, " "));
    ASSERT_NE(at, std::string::npos) << h;
    EXPECT_GT(at, last) << "host-" << h << ": not in natural order (host-2 before host-10)";
    last = at;
  }
}

TEST(ReportCommandTest, ACorruptHostFileIsLeftOutAndTheRestAnalyzed) {
  testing::TempDir dir;
  analysis::testing::RunSpec spec;
  spec.hosts.resize(4);
  spec.hosts[1].compute_scale = 1.3;
  WriteRun(spec, dir.path());
  testing::WriteFileOrDie(dir.Join("host-3.xplane.pb"), "\xff\xfe garbage");
  Output result = Report({.path = dir.path()});
  ASSERT_EQ(result.code, kExitOk) << result.err;
  EXPECT_THAT(result.out, HasSubstr("left out: host-3: unreadable"));
  EXPECT_THAT(result.out, HasSubstr("STRAGGLER host-1"));
}

TEST(ReportCommandTest, NoStepsSaysWhatWasLookedFor) {
  testing::TempDir dir;
  analysis::testing::RunSpec spec;
  spec.hosts.resize(2);
  WriteRun(spec, dir.path());
  Output result = Report({.path = dir.path(), .step_pattern = "^NoSuchStep$"});
  EXPECT_EQ(result.code, kExitFailure) << "no host could be analyzed";
  EXPECT_THAT(result.err, HasSubstr("no host could be analyzed"));
  EXPECT_THAT(result.out, HasSubstr("host-0: no steps found (looked for events named like "
                                    "'^NoSuchStep$')"));
  EXPECT_THAT(result.out, HasSubstr("nothing to compare"));
}

TEST(ReportCommandTest, BadInputGetsAClearError) {
  testing::TempDir dir;
  Output empty = Report({.path = dir.path()});
  EXPECT_EQ(empty.code, kExitFailure);
  EXPECT_THAT(empty.err, HasSubstr("holds no .xplane.pb files"));

  analysis::testing::RunSpec spec;
  spec.hosts.resize(2);
  WriteRun(spec, dir.path());
  Output pattern = Report({.path = dir.path(), .collective_pattern = "all(reduce"});
  EXPECT_EQ(pattern.code, kExitUsage);
  EXPECT_THAT(pattern.err, HasSubstr("collective pattern 'all(reduce'"));

  Output missing = Report({.path = dir.Join("nope")});
  EXPECT_EQ(missing.code, kExitFailure);
  EXPECT_THAT(missing.err, HasSubstr("nope"));
}

TEST(ConvertRunTest, EveryHostInOneTraceOnTheCoordinatorsClock) {
  testing::TempDir dir;
  analysis::testing::RunSpec spec;
  spec.hosts.resize(3);
  spec.steps = 5;
  spec.hosts[1].clock_offset_ns = 4'000'000;
  spec.hosts[2].clock_offset_ns = -7'000'000;
  WriteRun(spec, dir.path());
  ConvertOptions options;
  options.input = dir.path();
  options.run = true;
  options.output = dir.Join("all.trace.json");
  std::ostringstream out, err;
  ASSERT_EQ(RunConvert(options, out, err), kExitOk) << err.str();
  const web::json::value trace =
      web::json::value::parse(testing::ReadFileOrDie(dir.Join("all.trace.json")));
  std::map<std::string, int> pid_of;  // process name -> pid
  std::map<int, double> first_train_us;
  for (const web::json::value& event : trace.at("traceEvents").as_array()) {
    if (!event.has_field("ph")) continue;
    const std::string ph = event.at("ph").as_string();
    if (ph == "M" && event.at("name").as_string() == "process_name") {
      pid_of[event.at("args").at("name").as_string()] = event.at("pid").as_integer();
    }
    if (ph == "X" && event.at("name").as_string() == "train") {
      const int pid = event.at("pid").as_integer();
      const double ts = event.at("ts").as_double();
      if (!first_train_us.count(pid) || ts < first_train_us[pid]) first_train_us[pid] = ts;
    }
  }
  ASSERT_EQ(pid_of.size(), 6u) << "a /host:CPU and a /device:GPU:0 process per host";
  EXPECT_EQ(pid_of.count("host-1 /host:CPU"), 1u);
  EXPECT_NE(pid_of["host-0 /host:CPU"], pid_of["host-1 /host:CPU"]);
  ASSERT_EQ(first_train_us.size(), 3u);
  // The hosts' clocks disagreed by up to 11 ms; on the coordinator's clock their first steps start
  // together, as they did.
  const double t0 = first_train_us.begin()->second;
  for (const auto& [pid, ts] : first_train_us) EXPECT_NEAR(ts, t0, 1.0) << "pid " << pid;
}

TEST(ConvertRunTest, ADirectoryWithoutHostsIsAnError) {
  testing::TempDir dir;
  ConvertOptions options;
  options.input = dir.path();
  options.run = true;
  options.output = dir.Join("all.trace.json");
  std::ostringstream out, err;
  EXPECT_EQ(RunConvert(options, out, err), kExitFailure);
  EXPECT_THAT(err.str(), HasSubstr("holds no .xplane.pb files"));
}

}  // namespace
}  // namespace clusterprof::cli
