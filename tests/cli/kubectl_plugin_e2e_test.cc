// `kubectl clusterprof` end to end: the plugin binary (kubectl-clusterprof) against a real
// kube-apiserver, with the operator and real sidecars running as local processes
// (tests/operator/operator_e2e_fixture.h). Capture, report and pull as a user runs them, and each
// bad input with its message and exit code.
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/operator/operator_e2e_fixture.h"
#include "tests/support/gcs_test_server.h"
#include "tests/support/kube_control_plane.h"

namespace clusterprof {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using web::json::value;

constexpr char kPlugin[] = CLUSTERPROF_KUBECTL_PLUGIN_PATH;

class KubectlPluginTest : public OperatorE2eTest {
 protected:
  // Runs the plugin with the test's kubeconfig (and -n <test namespace> unless `args` name one).
  testing::CommandResult Plugin(std::vector<std::string> args, bool with_namespace = true) {
    std::vector<std::string> argv = {kPlugin};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--kubeconfig", *kubeconfig_});
    if (with_namespace) argv.insert(argv.end(), {"-n", ns_});
    absl::StatusOr<testing::CommandResult> result =
        testing::RunCommand(argv, std::chrono::seconds(120));
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : testing::CommandResult{};
  }

  static std::string JobName(const std::string& out) {
    std::smatch match;
    static const std::regex kCreated(R"(profilejob\.clusterprof\.io/(\S+) created)");
    return std::regex_search(out, match, kCreated) ? match[1].str() : "";
  }

  int CountJobs() {
    absl::StatusOr<kube::ObjectList> jobs = admin_->List(api::ProfileJobs(), ns_, {});
    return jobs.ok() ? static_cast<int>(jobs->items.size()) : -1;
  }
};

TEST_F(KubectlPluginTest, CaptureFollowsTheJobThenReportAndPullReadItsRun) {
  auto hosts = StartHosts({"trainer-0", "trainer-1"});
  for (const auto& host : hosts) CreateRunningPod(host->name(), host->port());
  auto op = StartOperator("a");

  const testing::CommandResult capture =
      Plugin({"capture", "-l", "app=trainer", "--duration", "1s", "--delay", "500ms", "--logdir",
              logs_, "--device-tracer-level", "0"});
  ASSERT_EQ(capture.exit_code, 0) << capture.out << capture.err;
  const std::string name = JobName(capture.out);
  ASSERT_THAT(name, ::testing::StartsWith("capture-")) << capture.out;
  // Not a terminal: plain progress lines as the phase changes, then the verdict on stdout.
  EXPECT_THAT(capture.err, AllOf(HasSubstr("2 pod(s) match app=trainer in namespace " + ns_ +
                                           ", 2 ready with a clusterprof sidecar"),
                                 HasSubstr(name + ": Capturing · 2 target(s)\n")));
  EXPECT_THAT(capture.out, AllOf(HasSubstr("profilejob/" + name +
                                           ": Succeeded, 2/2 target(s) captured, start skew "),
                                 HasSubstr("  run: " + logs_ + "/plugins/profile/"),
                                 HasSubstr("next: kubectl clusterprof pull " + name)));

  // The job is what the flags say.
  const value job = GetJob(name);
  const value& spec = job.at("spec");
  EXPECT_EQ(spec.at("durationMs").as_integer(), 1000);
  EXPECT_EQ(spec.at("delayMs").as_integer(), 500);
  EXPECT_EQ(spec.at("targets").at("selector").at("matchLabels").at("app").as_string(), "trainer");
  EXPECT_EQ(spec.at("options").at("deviceTracerLevel").as_integer(), 0);
  EXPECT_EQ(job.at("metadata").at("labels").at("app.kubernetes.io/created-by").as_string(),
            "kubectl-clusterprof");
  const std::string run_uri = job.at("status").at("runURI").as_string();
  const std::string run = job.at("status").at("runName").as_string();

  // Completion of `kubectl clusterprof report <TAB>` lists it (and namespaces for -n).
  absl::StatusOr<testing::CommandResult> names = testing::RunCommand(
      {kPlugin, "__complete", "report", "--kubeconfig", *kubeconfig_, "-n", ns_, "cap"});
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(names->out, name + "\n:4\n");
  absl::StatusOr<testing::CommandResult> namespaces =
      testing::RunCommand({kPlugin, "__complete", "pull", "--kubeconfig", *kubeconfig_, "-n", ""});
  ASSERT_TRUE(namespaces.ok()) << namespaces.status();
  EXPECT_THAT(namespaces->out, HasSubstr(ns_ + "\n"));

  // report: the verdict again, and the report files when the run has them.
  testing::TempDir here;
  const testing::CommandResult report = Plugin({"report", name, "-o", here.Join("report")});
  EXPECT_EQ(report.exit_code, 0) << report.out << report.err;
  EXPECT_THAT(report.out, HasSubstr("profilejob/" + name + ": Succeeded"));
  const bool has_report = job.at("status").has_field("analysis") &&
                          job.at("status").at("analysis").has_field("reportURI");
  EXPECT_EQ(std::filesystem::exists(here.Join("report/clusterprof_report.html")), has_report)
      << report.out << report.err;

  // pull: every file of the run directory, byte for byte, as a logdir of its own.
  const testing::CommandResult pull = Plugin({"pull", name, "-o", here.Join("runs")});
  ASSERT_EQ(pull.exit_code, 0) << pull.out << pull.err;
  const std::filesystem::path local = here.Join("runs/plugins/profile/" + run);
  EXPECT_THAT(pull.out, AllOf(HasSubstr("into " + local.string()),
                              HasSubstr("xprof --logdir " + here.Join("runs")),
                              HasSubstr("clusterprof convert --run " + local.string())));
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(run_uri)) {
    ++files;
    const std::filesystem::path copy = local / entry.path().filename();
    ASSERT_TRUE(std::filesystem::exists(copy)) << copy;
    EXPECT_EQ(testing::ReadFileOrDie(copy.string()), testing::ReadFileOrDie(entry.path().string()))
        << copy;
  }
  for (const char* file : {"trainer-0.xplane.pb", "trainer-1.xplane.pb", "clusterprof_run.json"}) {
    EXPECT_TRUE(std::filesystem::exists(local / file)) << file;
  }
  EXPECT_THAT(pull.out, HasSubstr(StrCat("pulled ", files, " file(s)")));
}

TEST_F(KubectlPluginTest, BadInputIsNamedAndNothingIsCreated) {
  const testing::CommandResult context =
      Plugin({"capture", "-l", "app=trainer", "--logdir", logs_, "--context", "nope"});
  EXPECT_NE(context.exit_code, 0);
  EXPECT_THAT(context.err, HasSubstr("context \"nope\" is not in kubeconfig"));

  const testing::CommandResult ns =
      Plugin({"capture", "-l", "app=trainer", "--logdir", logs_, "-n", "no-such-namespace"}, false);
  EXPECT_NE(ns.exit_code, 0);
  EXPECT_THAT(ns.err, HasSubstr("namespace \"no-such-namespace\" not found"));

  const testing::CommandResult nobody = Plugin({"capture", "-l", "app=nobody", "--logdir", logs_});
  EXPECT_NE(nobody.exit_code, 0);
  EXPECT_THAT(nobody.err, HasSubstr("no pods in namespace " + ns_ +
                                    " match app=nobody; nothing created (--force"));
  EXPECT_EQ(CountJobs(), 0);

  const testing::CommandResult duration =
      Plugin({"capture", "-l", "app=trainer", "--logdir", logs_, "--duration", "5"});
  EXPECT_EQ(duration.exit_code, 2) << duration.err;
  EXPECT_THAT(duration.err, HasSubstr("a number needs a unit"));

  const testing::CommandResult logdir = Plugin({"capture", "-l", "app=trainer"});
  EXPECT_EQ(logdir.exit_code, 2);
  EXPECT_THAT(logdir.err, HasSubstr("--logdir is required"));

  const testing::CommandResult missing = Plugin({"report", "no-such-job"});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_THAT(missing.err, HasSubstr("profilejob \"no-such-job\" not found in namespace " + ns_));
  const testing::CommandResult pull = Plugin({"pull", "no-such-job"});
  EXPECT_NE(pull.exit_code, 0);
  EXPECT_THAT(pull.err, HasSubstr("not found"));
  EXPECT_EQ(CountJobs(), 0);
}

TEST_F(KubectlPluginTest, AJobThatFailsExitsNonZeroWithItsReason) {
  auto op = StartOperator("a");
  // --force: created with no pod; it waits a second (--wait 1) for one, then fails.
  const testing::CommandResult capture = Plugin(
      {"capture", "-l", "app=nobody", "--logdir", logs_, "--force", "--wait", "1", "--name", "j"});
  EXPECT_EQ(capture.exit_code, 1) << capture.out << capture.err;
  EXPECT_THAT(capture.err, HasSubstr("j: Pending"));
  EXPECT_THAT(capture.out, AllOf(HasSubstr("profilejob/j: Failed"),
                                 HasSubstr("no pods in namespace " + ns_ +
                                           " match the selector \"app=nobody\"")));
}

TEST_F(KubectlPluginTest, AJobDeletedWhileFollowedEndsThePluginWithAMessage) {
  auto op = StartOperator("a");
  testing::TempDir here;
  const std::string log = here.Join("plugin.log");
  testing::Subprocess plugin({kPlugin, "capture", "-l", "app=nobody", "--logdir", logs_, "--force",
                              "--name", "doomed", "--kubeconfig", *kubeconfig_, "-n", ns_},
                             {}, log);
  ASSERT_TRUE(Eventually([&] { return GetJob("doomed").is_object(); }));
  ASSERT_TRUE(admin_->Delete(api::ProfileJobs(), ns_, "doomed").ok());
  const std::optional<int> status = plugin.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << testing::ReadFileOrDie(log);
  EXPECT_THAT(testing::ReadFileOrDie(log), HasSubstr("profilejob doomed was deleted while it ran"));
}

TEST_F(KubectlPluginTest, CancelledBeforeItStartsTheJobFailsAsCancelled) {
  auto op = StartOperator("a");
  value spec = JobSpec();
  spec["targets"]["selector"]["matchLabels"]["app"] = value::string("later");
  ASSERT_TRUE(CreateJob("waits", spec).ok());
  ASSERT_TRUE(Eventually([&] {
    const value job = GetJob("waits");
    return job.has_field("status") && job.at("status").has_field("message");
  }));
  // What the plugin writes when Ctrl-C is confirmed (kubectl annotate does the same).
  value patch = value::object();
  patch["metadata"]["annotations"]["clusterprof.io/cancel"] = value::string("true");
  ASSERT_TRUE(admin_->Patch(api::ProfileJobs(), ns_, "waits", kube::PatchType::kMerge, patch).ok());
  const value job = WaitForFinish("waits");
  EXPECT_EQ(Phase(job), "Failed");
  EXPECT_THAT(job.at("status").at("message").as_string(),
              HasSubstr("cancelled before it started (annotation clusterprof.io/cancel=true)"));
}

TEST_F(KubectlPluginTest, CancelledWhileCapturingTheSidecarsStopAndKeepWhatTheyRecorded) {
  auto hosts = StartHosts({"trainer-0", "trainer-1"});
  for (const auto& host : hosts) CreateRunningPod(host->name(), host->port());
  auto op = StartOperator("a");
  ASSERT_TRUE(CreateJob("long", JobSpec(/*duration_ms=*/60'000, /*delay_ms=*/500)).ok());
  value capturing = WaitForPhase("long", {"Capturing"});
  const int64_t t0 = capturing.at("status").at("startTimeNs").as_number().to_int64();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // into the window
  value patch = value::object();
  patch["metadata"]["annotations"]["clusterprof.io/cancel"] = value::string("true");
  ASSERT_TRUE(admin_->Patch(api::ProfileJobs(), ns_, "long", kube::PatchType::kMerge, patch).ok());
  const value job =
      WaitForPhase("long", {"Succeeded", "PartiallySucceeded", "Failed"}, std::chrono::seconds(45));
  ASSERT_EQ(Phase(job), "Succeeded") << job.serialize();
  const value& status = job.at("status");
  EXPECT_THAT(status.at("message").as_string(),
              AllOf(HasSubstr("stopped early on request (clusterprof.io/cancel), "),
                    HasSubstr(" ms into the window")));
  // It ended long before its planned end, with each host's file written.
  const absl::StatusOr<int64_t> completed = api::ParseTime(status.at("completionTime").as_string());
  ASSERT_TRUE(completed.ok());
  EXPECT_LT(*completed, t0 + 30 * kNanosPerSecond);
  for (const char* host : {"trainer-0", "trainer-1"}) {
    EXPECT_TRUE(
        std::filesystem::exists(StrCat(status.at("runURI").as_string(), "/", host, ".xplane.pb")))
        << host;
  }
}

TEST_F(KubectlPluginTest, ABucketTheUserCannotReadIsNamedAndNothingIsWrittenHere) {
  absl::StatusOr<std::unique_ptr<testing::GcsTestServer>> gcs = testing::GcsTestServer::Start();
  ASSERT_TRUE(gcs.ok()) << gcs.status();
  (*gcs)->PutObject("team-only", "tb/plugins/profile/r1/trainer-0.xplane.pb", "x");
  (*gcs)->SetAuthorizer([](std::string_view, std::string_view bucket) {
    return bucket == "team-only" ? testing::GcsAuthDecision::kForbidden
                                 : testing::GcsAuthDecision::kAllow;
  });
  // A finished job whose run is in that bucket.
  ASSERT_TRUE(CreateJob("theirs", JobSpec()).ok());
  value job = GetJob("theirs");
  api::ProfileJobStatus status;
  status.phase = api::JobPhase::kSucceeded;
  status.run_name = "r1";
  status.run_uri = "gs://team-only/tb/plugins/profile/r1";
  job["status"] = api::ProfileJobStatusToJson(status);
  ASSERT_TRUE(admin_->UpdateStatus(api::ProfileJobs(), ns_, job).ok());

  testing::TempDir here;
  for (const char* verb : {"pull", "report"}) {
    const std::string log = here.Join(StrCat(verb, ".log"));
    testing::Subprocess plugin(
        {kPlugin, verb, "theirs", "-o", here.Join(verb), "--kubeconfig", *kubeconfig_, "-n", ns_},
        {{"STORAGE_EMULATOR_HOST", (*gcs)->endpoint()}}, log);
    const std::optional<int> exit = plugin.Wait(std::chrono::seconds(60));
    ASSERT_TRUE(exit.has_value()) << verb;
    const std::string output = testing::ReadFileOrDie(log);
    EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 1) << verb << ": " << output;
    EXPECT_THAT(output, AllOf(HasSubstr(StrCat("kubectl clusterprof ", verb, ": ")),
                              HasSubstr("gs://team-only/tb/plugins/profile/r1"),
                              ::testing::ContainsRegex("403|[Ff]orbidden|[Pp]ermission")))
        << verb;
    // Nothing under a name that looks complete.
    if (std::filesystem::exists(here.Join(verb))) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(here.Join(verb))) {
        EXPECT_FALSE(entry.is_regular_file()) << entry.path();
      }
    }
  }
}

}  // namespace
}  // namespace clusterprof
