// clusterprof-operator end to end, against a real kube-apiserver (tests/support): the CRDs
// applied with kubectl, pods created and set Running/Ready at 127.0.0.1 with per-pod port
// annotations, a real clusterprof-sidecar beside an annotating workload for each pod, and the
// operator binary driving ProfileJobs through their phases. Faults: a sidecar down, the
// operator killed mid-capture, two replicas with leader election, watches dropped by a proxy.
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <thread>

#include "common/base/strings.h"
#include "common/grpc/tls.h"
#include "cpprest/http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/api/trigger.h"
#include "operator/api/types.h"
#include "tests/operator/crd_fixture.h"
#include "tests/operator/kube/kube_fixture.h"
#include "tests/operator/local_host.h"
#include "tests/operator/operator_e2e_fixture.h"
#include "tests/support/kube_fault_proxy.h"
#include "tests/support/local_http.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_pki.h"

namespace clusterprof {
namespace {

using ::testing::HasSubstr;
using testing::HttpGet;
using testing::MetricSum;
using testing::Subprocess;
using testing::TempDir;
using web::json::value;

TEST_F(OperatorE2eTest, FourPodsSucceed) {
  auto hosts = StartHosts({"trainer-0", "trainer-1", "trainer-2", "trainer-3"});
  for (const auto& host : hosts) CreateRunningPod(host->name(), host->port());
  auto op = StartOperator("a");
  value spec = JobSpec();
  spec["runName"] = value::string("four_pods");
  ASSERT_TRUE(CreateJob("four", spec).ok());

  value job = WaitForFinish("four");
  ASSERT_EQ(Phase(job), "Succeeded") << job.serialize();
  const value& status = job.at("status");
  EXPECT_EQ(status.at("runName").as_string(), "four_pods");
  EXPECT_EQ(status.at("runURI").as_string(), StrCat(logs_, "/plugins/profile/four_pods"));
  EXPECT_EQ(status.at("targetsSucceeded").as_string(), "4/4");
  EXPECT_EQ(status.at("summary").at("succeeded").as_integer(), 4);
  EXPECT_GE(status.at("startTimeNs").as_number().to_int64(), 0);
  EXPECT_EQ(status.at("observedGeneration").as_integer(), 1);
  ASSERT_EQ(status.at("targets").size(), 4u);
  for (const auto& host : hosts) {
    SCOPED_TRACE(host->name());
    const value& target = Target(job, host->name());
    EXPECT_EQ(target.at("phase").as_string(), "Succeeded");
    EXPECT_EQ(target.at("address").as_string(), StrCat("127.0.0.1:", host->port()));
    EXPECT_EQ(target.at("node").as_string(), "node-a");
    EXPECT_GT(target.at("events").as_number().to_int64(), 0);
    EXPECT_EQ(target.at("file").as_string(),
              StrCat(logs_, "/plugins/profile/four_pods/", host->name(), ".xplane.pb"));
    EXPECT_TRUE(testing::FileExists(target.at("file").as_string()));
    EXPECT_GE(target.at("clockUncertaintyNs").as_number().to_int64(), 0);
  }
  std::set<std::string> files;
  for (const std::string& file :
       testing::ListFilesRecursively(StrCat(logs_, "/plugins/profile/four_pods"))) {
    files.insert(file.substr(file.rfind('/') + 1));
  }
  EXPECT_EQ(files, (std::set<std::string>{
                       "clusterprof_report.html", "clusterprof_report.json", "clusterprof_run.json",
                       "trainer-0.trace.json.gz", "trainer-0.xplane.pb", "trainer-1.trace.json.gz",
                       "trainer-1.xplane.pb", "trainer-2.trace.json.gz", "trainer-2.xplane.pb",
                       "trainer-3.trace.json.gz", "trainer-3.xplane.pb"}));
  EXPECT_EQ(status.at("manifestURI").as_string(),
            StrCat(logs_, "/plugins/profile/four_pods/clusterprof_run.json"));
  // The story in events, once written.
  EXPECT_TRUE(Eventually([&] {
    auto events = Events("four");
    return events.count("Scheduled") == 1 && events.count("CaptureStarted") == 1 &&
           events.count("CaptureSucceeded") == 1;
  })) << "events: "
      << Events("four").size();
  for (const auto& host : hosts) EXPECT_EQ(host->Captures(), 1) << host->name();

  // The operator's own view: ready, and its metrics.
  EXPECT_EQ(StripAsciiWhitespace(op->Http("/readyz")), "ok");
  std::string metrics;
  EXPECT_TRUE(Eventually([&] {
    metrics = op->Http("/metrics");
    return MetricSum(metrics, "clusterprof_operator_profilejobs", "phase=\"Succeeded\"") == 1;
  })) << metrics;
  EXPECT_EQ(MetricSum(metrics, "clusterprof_operator_targets_total", "outcome=\"succeeded\""), 4);
  EXPECT_EQ(MetricSum(metrics, "clusterprof_operator_capture_duration_seconds_count", ""), 1);
  EXPECT_EQ(MetricSum(metrics, "clusterprof_operator_start_skew_seconds_count", ""), 4);
  EXPECT_GT(MetricSum(metrics, "clusterprof_operator_api_request_duration_seconds_count",
                      "method=\"PUT\""),
            0);
  EXPECT_EQ(MetricSum(metrics, "clusterprof_operator_leader", ""), 1);
  EXPECT_GE(MetricSum(metrics, "clusterprof_operator_reconciles_total", "profilejob"), 1);
  EXPECT_THAT(metrics, HasSubstr("clusterprof_operator_workqueue_depth{name=\"profilejobs\"}"));

  // kubectl's view: the printer columns.
  auto got = testing::RunCommand(
      {"kubectl", "--kubeconfig", *kubeconfig_, "get", "pj", "-n", ns_, "four"});
  ASSERT_TRUE(got.ok());
  EXPECT_THAT(got->out, HasSubstr("Succeeded"));
  EXPECT_THAT(got->out, HasSubstr("4/4"));
  EXPECT_THAT(got->out, HasSubstr("four_pods"));
}

TEST_F(OperatorE2eTest, AStragglingPodIsNamedInTheStatusAnEventAndTheRunsReports) {
  // Three training ranks in lockstep (a file barrier each step); rank 1 computes 40 ms longer,
  // well above what a loaded 2-core machine's scheduling adds at random.
  const std::string sync = root_.Join("sync");
  std::vector<std::unique_ptr<Host>> hosts;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string name = StrCat("rank-", rank);
    hosts.push_back(std::make_unique<Host>(
        root_, name, logs_,
        std::vector<std::string>{kTrainLoop, "--sync-dir", sync, "--world", "3", "--rank",
                                 std::to_string(rank), "--step-ms", "30", "--seconds", "600",
                                 "--straggle-ms", rank == 1 ? "40" : "0"}));
    CreateRunningPod(name, hosts.back()->port());
  }
  auto op = StartOperator("a");
  ASSERT_TRUE(CreateJob("lockstep", JobSpec(3000)).ok());
  const value job = WaitForFinish("lockstep");
  ASSERT_EQ(Phase(job), "Succeeded") << job.serialize();
  const value& analysis = job.at("status").at("analysis");
  EXPECT_EQ(analysis.at("stragglers").as_string(), "rank-1") << analysis.serialize();
  EXPECT_GT(analysis.at("comparedSteps").as_integer(), 10);
  for (const value& host : analysis.at("hosts").as_array()) {
    EXPECT_EQ(host.at("straggler").as_bool(), host.at("host").as_string() == "rank-1");
    EXPECT_EQ(host.at("node").as_string(), "node-a");
  }

  EXPECT_TRUE(Eventually([&] { return Events("lockstep").count("StragglerDetected") == 1; }))
      << "events: " << Events("lockstep").size();
  const auto events = Events("lockstep");
  const auto straggler = events.find("StragglerDetected");
  ASSERT_NE(straggler, events.end());
  EXPECT_THAT(straggler->second,
              HasSubstr("pod rank-1 on node node-a holds the job back (compute)"));

  // Both report files next to the manifest, naming the same pod.
  const std::string run_dir =
      StrCat(logs_, "/plugins/profile/", job.at("status").at("runName").as_string());
  EXPECT_EQ(analysis.at("reportJSONURI").as_string(), run_dir + "/clusterprof_report.json");
  EXPECT_EQ(analysis.at("reportURI").as_string(), run_dir + "/clusterprof_report.html");
  const value report = value::parse(testing::ReadFileOrDie(run_dir + "/clusterprof_report.json"));
  EXPECT_EQ(report.at("stragglers").at(0).as_string(), "rank-1");
  EXPECT_THAT(testing::ReadFileOrDie(run_dir + "/clusterprof_report.html"), HasSubstr("rank-1"));
}

TEST_F(OperatorE2eTest, ATriggerFiresOnceOnADegradingRankAndKilledOperatorsDoNotFireAgain) {
  // Three ranks in lockstep, 100 ms steps; rank 1 computes 50 ms more per step from 12 s after
  // it starts (well above what a loaded 2-core machine's scheduling adds at random).
  const std::string sync = root_.Join("sync");
  std::vector<std::unique_ptr<Host>> hosts;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string name = StrCat("rank-", rank);
    std::vector<std::string> workload = {
        kTrainLoop,           "--sync-dir", sync,  "--world",   "3",  "--rank",
        std::to_string(rank), "--step-ms",  "100", "--seconds", "600"};
    if (rank == 1) {
      workload.insert(workload.end(), {"--straggle-ms", "50", "--straggle-after-seconds", "12"});
    }
    hosts.push_back(std::make_unique<Host>(root_, name, logs_, workload));
    CreateRunningPod(name, hosts.back()->port());
  }
  auto first = StartOperator("a");
  value spec = value::object();
  spec["targets"]["selector"]["matchLabels"]["app"] = value::string("trainer");
  spec["rules"][0]["straggler"]["steps"] = value::number(20);
  spec["capture"]["durationMs"] = value::number(1000);
  spec["capture"]["lookbackMs"] = value::number(10000);
  spec["capture"]["logdir"] = value::string(logs_);
  spec["cooldownSeconds"] = value::number(600);
  value trigger = value::object();
  trigger["metadata"]["name"] = value::string("degrade");
  trigger["spec"] = spec;
  ASSERT_TRUE(admin_->Create(api::ProfileTriggers(), ns_, trigger).ok());
  const auto status = [&]() -> value {
    absl::StatusOr<value> got = admin_->Get(api::ProfileTriggers(), ns_, "degrade");
    return got.ok() && got->has_field("status") ? got->at("status") : value::object();
  };
  std::string fired;
  ASSERT_TRUE(Eventually(
      [&] {
        const value s = status();
        if (s.has_string_field("lastJob")) fired = s.at("lastJob").as_string();
        return !fired.empty();
      },
      std::chrono::seconds(90)))
      << "the trigger did not fire: " << status().serialize();
  // The operator dies at once (kill -9), its job just created; another takes over.
  first->Kill();
  auto second = StartOperator("b");
  const value job = WaitForFinish(fired);
  ASSERT_EQ(Phase(job), "Succeeded") << job.serialize();
  EXPECT_EQ(job.at("status").at("analysis").at("stragglers").as_string(), "rank-1")
      << job.at("status").at("analysis").serialize();
  for (const value& target : job.at("status").at("targets").as_array()) {
    EXPECT_GT(target.at("lookbackMs").as_integer(), 5000) << target.serialize();
  }
  const value firing = status().at("recentFirings").at(0);
  EXPECT_EQ(firing.at("rule").as_string(), "straggler");
  EXPECT_EQ(firing.at("pods").at(0).as_string(), "rank-1");
  // Its Triggered event may be lost with the killed operator (events are sent in the background);
  // the node suite checks it. Never two, though.
  EXPECT_LE(Events("degrade").count("Triggered"), 1u);

  // Rank 1 stays slow: within the cooldown neither this operator nor the next one fires again.
  std::this_thread::sleep_for(std::chrono::seconds(5));
  second->Kill();
  auto third = StartOperator("c");
  std::this_thread::sleep_for(std::chrono::seconds(8));
  kube::ListOptions options;
  options.label_selector = "clusterprof.io/trigger=degrade";
  absl::StatusOr<kube::ObjectList> jobs = admin_->List(api::ProfileJobs(), ns_, options);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->items.size(), 1u);
  const value last = status();
  EXPECT_EQ(last.at("capturesToday").as_integer(), 1);
  std::string cooldown;
  for (const value& c : last.at("conditions").as_array()) {
    if (c.at("type").as_string() == "CooldownActive") cooldown = c.at("status").as_string();
  }
  EXPECT_EQ(cooldown, "True");
  EXPECT_LE(Events("degrade").count("Triggered"), 1u);
}

TEST_F(OperatorE2eTest, ASidecarDownIsPartiallySucceededNamingThePod) {
  auto hosts = StartHosts({"trainer-0", "trainer-1", "trainer-2"});
  for (const auto& host : hosts) CreateRunningPod(host->name(), host->port());
  CreateRunningPod("trainer-down", testing::UnusedPort());
  auto op = StartOperator("a");
  ASSERT_TRUE(CreateJob("partial", JobSpec()).ok());

  value job = WaitForFinish("partial");
  ASSERT_EQ(Phase(job), "PartiallySucceeded") << job.serialize();
  const value& status = job.at("status");
  EXPECT_EQ(status.at("targetsSucceeded").as_string(), "3/4");
  EXPECT_EQ(status.at("summary").at("failed").as_integer(), 1);
  const value& down = Target(job, "trainer-down");
  EXPECT_EQ(down.at("phase").as_string(), "Failed");
  EXPECT_THAT(down.at("message").as_string(), HasSubstr("UNAVAILABLE"));
  EXPECT_EQ(down.at("attempts").as_integer(), 2) << "UNAVAILABLE is retried";
  EXPECT_THAT(status.at("message").as_string(), HasSubstr("trainer-down"));
  EXPECT_TRUE(Eventually([&] {
    auto events = Events("partial");
    auto failed = events.equal_range("TargetFailed");
    return failed.first != failed.second &&
           failed.first->second.find("trainer-down") != std::string::npos;
  }));
}

// The chart's default: sidecars serve TLS with a certificate for the fixed name, the operator
// verifies it against the CA over the pod IP. A sidecar whose certificate another CA signed is
// refused, its target failed with the cause, not retried, and counted.
TEST_F(OperatorE2eTest, OverTlsTheJobSucceedsAndARefusedCertificateIsNamed) {
  testing::TestCa ca;
  testing::TestCa other_ca("another-ca");
  const testing::IssuedPair good_pair = ca.Issue({tls::kDefaultServerName});
  const testing::IssuedPair bad_pair = other_ca.Issue({tls::kDefaultServerName});
  testing::PublishSecret(root_.Join("tls-good"),
                         {{"tls.crt", good_pair.cert_pem}, {"tls.key", good_pair.key_pem}});
  testing::PublishSecret(root_.Join("tls-bad"),
                         {{"tls.crt", bad_pair.cert_pem}, {"tls.key", bad_pair.key_pem}});
  testing::PublishSecret(root_.Join("ca"), {{"ca.crt", ca.ca_pem()}});
  const auto tls_flags = [&](const std::string& dir) {
    return std::vector<std::string>{"--tls-cert-file", root_.Join(dir + "/tls.crt"),
                                    "--tls-key-file", root_.Join(dir + "/tls.key")};
  };
  testing::LocalHost good(root_, "trainer-0", logs_, kSidecar, kAnnotator, tls_flags("tls-good"));
  testing::LocalHost bad(root_, "trainer-1", logs_, kSidecar, kAnnotator, tls_flags("tls-bad"));
  CreateRunningPod(good.name(), good.port());
  CreateRunningPod(bad.name(), bad.port());
  auto op = StartOperator("a", {"--sidecar-tls-ca-file", root_.Join("ca/ca.crt")});
  ASSERT_TRUE(CreateJob("tls", JobSpec()).ok());

  value job = WaitForFinish("tls");
  ASSERT_EQ(Phase(job), "PartiallySucceeded") << job.serialize();
  EXPECT_EQ(Target(job, "trainer-0").at("phase").as_string(), "Succeeded");
  const value& refused = Target(job, "trainer-1");
  EXPECT_EQ(refused.at("phase").as_string(), "Failed");
  EXPECT_THAT(refused.at("message").as_string(), HasSubstr("is not signed by a CA in"));
  EXPECT_THAT(refused.at("message").as_string(), HasSubstr("CN=another-ca"));
  EXPECT_EQ(refused.at("attempts").as_integer(), 1) << "a refused certificate is not retried";
  EXPECT_TRUE(Eventually([&] {
    return op->Http("/metrics")
               .find(
                   "clusterprof_operator_sidecar_refusals_total{reason=\"certificate_unknown_ca\"} "
                   "1") != std::string::npos;
  }));
  EXPECT_THAT(op->Log(), HasSubstr("sidecars are reached over TLS"));
}

TEST_F(OperatorE2eTest, NoMatchingPodsFailsWithAClearCondition) {
  auto op = StartOperator("a");
  value spec = JobSpec();
  spec["targets"]["selector"]["matchLabels"]["app"] = value::string("nobody");
  // It waits a second for pods that may come (spec.targets.waitSeconds), then fails.
  spec["targets"]["waitSeconds"] = value::number(1);
  ASSERT_TRUE(CreateJob("lonely", spec).ok());
  value job = WaitForFinish("lonely");
  ASSERT_EQ(Phase(job), "Failed");
  value condition;
  for (const value& c : job.at("status").at("conditions").as_array()) {
    if (c.at("type").as_string() == "Failed") condition = c;
  }
  ASSERT_TRUE(condition.is_object()) << job.serialize();
  EXPECT_EQ(condition.at("status").as_string(), "True");
  EXPECT_EQ(condition.at("reason").as_string(), "NotEnoughTargets");
  EXPECT_THAT(
      condition.at("message").as_string(),
      HasSubstr(StrCat("no pods in namespace ", ns_, " match the selector \"app=nobody\"")));
  EXPECT_EQ(condition.at("observedGeneration").as_integer(), 1);
}

TEST_F(OperatorE2eTest, InvalidSpecsAreRejectedOrFailedWithAPreciseMessage) {
  // What the schema says, the API server enforces.
  value negative = JobSpec();
  negative["durationMs"] = value::number(-5);
  absl::StatusOr<value> created = CreateJob("negative", negative);
  ASSERT_FALSE(created.ok());
  EXPECT_THAT(std::string(created.status().message()), HasSubstr("durationMs"));
  value bad_logdir = JobSpec();
  bad_logdir["logdir"] = value::string("s3://bucket/x");
  created = CreateJob("badlogdir", bad_logdir);
  ASSERT_FALSE(created.ok());
  EXPECT_THAT(std::string(created.status().message()), HasSubstr("logdir"));

  // What only CEL says (ignored by this server) the operator checks.
  auto op = StartOperator("a");
  value no_targets = JobSpec();
  no_targets["targets"] = value::object();
  ASSERT_TRUE(CreateJob("notargets", no_targets).ok());
  value job = WaitForFinish("notargets");
  ASSERT_EQ(Phase(job), "Failed");
  EXPECT_EQ(job.at("status").at("conditions").at(0).at("reason").as_string(), "InvalidSpec");
  EXPECT_THAT(job.at("status").at("message").as_string(),
              HasSubstr("spec.targets: needs a selector"));
  // Its ttlSecondsAfterFinished still applies.
  no_targets["ttlSecondsAfterFinished"] = value::number(1);
  ASSERT_TRUE(CreateJob("notargets-ttl", no_targets).ok());
  EXPECT_TRUE(Eventually([&] {
    return absl::IsNotFound(admin_->Get(api::ProfileJobs(), ns_, "notargets-ttl").status());
  }));

  // A bad cron expression: the schedule says what is wrong.
  value schedule = value::object();
  schedule["metadata"]["name"] = value::string("badcron");
  schedule["spec"]["schedule"] = value::string("61 * * * *");
  schedule["spec"]["jobTemplate"]["spec"] = JobSpec();
  ASSERT_TRUE(admin_->Create(api::ProfileSchedules(), ns_, schedule).ok());
  std::string message;
  EXPECT_TRUE(Eventually([&] {
    absl::StatusOr<value> got = admin_->Get(api::ProfileSchedules(), ns_, "badcron");
    if (!got.ok() || !got->has_field("status") || !got->at("status").has_field("conditions")) {
      return false;
    }
    const value& condition = got->at("status").at("conditions").at(0);
    message = condition.at("message").as_string();
    return condition.at("status").as_string() == "False";
  })) << message;
  EXPECT_THAT(message, HasSubstr("minute field: 61 is out of range 0-59"));
}

TEST_F(OperatorE2eTest, AnOperatorKilledWhileCapturingIsReplacedAndTheJobCompletesOnce) {
  auto hosts = StartHosts({"trainer-0", "trainer-1"});
  for (const auto& host : hosts) CreateRunningPod(host->name(), host->port());
  auto first = StartOperator("first");
  ASSERT_TRUE(CreateJob("resume", JobSpec(/*duration_ms=*/3000, /*delay_ms=*/300)).ok());
  value capturing = WaitForPhase("resume", {"Capturing"});
  // Killed while the sidecars record: half a second into the window.
  const int64_t start_ns = capturing.at("status").at("startTimeNs").as_number().to_int64();
  RealClock().SleepUntilWallNs(start_ns + 500 * kNanosPerMilli);
  first->Kill();

  auto second = StartOperator("second");
  value job = WaitForFinish("resume");
  ASSERT_EQ(Phase(job), "Succeeded") << job.serialize();
  for (const auto& host : hosts) {
    SCOPED_TRACE(host->name());
    EXPECT_EQ(host->Captures(), 1) << "captured once, never twice\n" << host->Log();
    const value& target = Target(job, host->name());
    EXPECT_EQ(target.at("phase").as_string(), "Succeeded");
    EXPECT_TRUE(testing::FileExists(target.at("file").as_string()));
    EXPECT_THAT(host->Log(), HasSubstr("capturing to the planned end"))
        << "the sidecar kept recording after the operator died";
  }
  EXPECT_THAT(second->Log(), HasSubstr("resuming run"));
  EXPECT_TRUE(Eventually([&] { return Events("resume").count("CaptureResumed") == 1; }));
}

TEST_F(OperatorE2eTest, WithLeaderElectionOneReplicaActsAndTheOtherTakesOver) {
  auto hosts = StartHosts({"trainer-0", "trainer-1"});
  for (const auto& host : hosts) CreateRunningPod(host->name(), host->port());
  const std::vector<std::string> election = {"--leader-elect",
                                             "--leader-election-namespace",
                                             ns_,
                                             "--lease-duration-seconds",
                                             "4",
                                             "--renew-deadline-seconds",
                                             "3",
                                             "--retry-period-seconds",
                                             "0.5"};
  std::vector<std::string> a_args = election, b_args = election;
  a_args.insert(a_args.end(), {"--leader-election-identity", "replica-a"});
  b_args.insert(b_args.end(), {"--leader-election-identity", "replica-b"});
  std::map<std::string, std::unique_ptr<OperatorProcess>> replicas;
  replicas["replica-a"] = StartOperator("replica-a", a_args);
  replicas["replica-b"] = StartOperator("replica-b", b_args);

  std::string leader;
  ASSERT_TRUE(Eventually([&] {
    absl::StatusOr<value> lease = admin_->Get(kube::Leases(), ns_, "clusterprof-operator");
    if (!lease.ok() || !lease->at("spec").has_string_field("holderIdentity")) return false;
    leader = lease->at("spec").at("holderIdentity").as_string();
    return !leader.empty();
  }));
  const std::string follower = leader == "replica-a" ? "replica-b" : "replica-a";
  ASSERT_TRUE(CreateJob("first", JobSpec()).ok());
  ASSERT_EQ(Phase(WaitForFinish("first")), "Succeeded");
  // The leader logs the result just after writing it.
  EXPECT_TRUE(Eventually([&] {
    return replicas[leader]->Log().find("capture") != std::string::npos;
  })) << replicas[leader]->Log();
  EXPECT_THAT(replicas[follower]->Log(), ::testing::Not(HasSubstr("profilejob ")))
      << "the follower must not act";
  EXPECT_THAT(replicas[follower]->Log(), ::testing::Not(HasSubstr("starting the controllers")));

  // The leader dies without releasing the Lease: the follower takes over once it expires.
  replicas[leader]->Kill();
  ASSERT_TRUE(CreateJob("second", JobSpec()).ok());
  value job = WaitForFinish("second");
  ASSERT_EQ(Phase(job), "Succeeded");
  EXPECT_THAT(replicas[follower]->Log(), HasSubstr("became the leader"));
  for (const auto& host : hosts) EXPECT_EQ(host->Captures(), 2) << host->name();
}

TEST_F(OperatorE2eTest, AJobCompletesWhenWatchesAreDropped) {
  auto hosts = StartHosts({"trainer-0", "trainer-1"});
  for (const auto& host : hosts) CreateRunningPod(host->name(), host->port());
  absl::StatusOr<std::unique_ptr<testing::KubeFaultProxy>> proxy =
      testing::KubeFaultProxy::Start(plane_->url(), plane_->ca_file());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  // Every watch breaks after its second event: the status updates of the job arrive over
  // several watches, with relists or resumes between them.
  (*proxy)->SetDropWatchesAfterEvents(2);
  const std::string kubeconfig = root_.Join("proxy.kubeconfig");
  {
    std::ofstream out(kubeconfig);
    out << "apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: "
        << (*proxy)->url()
        << "\nusers:\n- name: admin\n  user:\n    token: " << plane_->admin_token()
        << "\ncontexts:\n- name: proxy\n  context: {cluster: proxy, user: admin}\n"
           "current-context: proxy\n";
  }
  auto op = StartOperator("a", {}, kubeconfig);
  ASSERT_TRUE(CreateJob("dropped", JobSpec()).ok());
  value job = WaitForFinish("dropped");
  EXPECT_EQ(Phase(job), "Succeeded") << job.serialize();
  EXPECT_GT((*proxy)->watches_dropped(), 0);
  for (const auto& host : hosts) EXPECT_EQ(host->Captures(), 1) << host->name();
}

TEST_F(OperatorE2eTest, AHealthPortInUseNamesTheFlagThatMovesIt) {
  testing::HeldPort taken;
  ASSERT_NE(taken.port(), 0);
  const std::string port = std::to_string(taken.port());
  auto op = StartOperator("taken", {"--health-port", port});
  const std::optional<int> status = op->Wait(std::chrono::seconds(60));
  ASSERT_TRUE(status.has_value()) << "the operator kept running:\n" << op->Log();
  EXPECT_NE(*status, 0);
  EXPECT_THAT(op->Log(), HasSubstr(StrCat("cannot serve HTTP on 127.0.0.1:", port)));
  EXPECT_THAT(op->Log(), HasSubstr("choose another port with --health-port (0 picks a free one)"));
}

TEST_F(OperatorE2eTest, AFinishedJobIsDeletedAfterItsTtl) {
  auto hosts = StartHosts({"trainer-0"});
  CreateRunningPod("trainer-0", hosts[0]->port());
  auto op = StartOperator("a", {"--log-format", "json"});
  value spec = JobSpec(/*duration_ms=*/300, /*delay_ms=*/200);
  spec["ttlSecondsAfterFinished"] = value::number(1);
  ASSERT_TRUE(CreateJob("ephemeral", spec).ok());
  EXPECT_TRUE(Eventually([&] {
    return absl::IsNotFound(admin_->Get(api::ProfileJobs(), ns_, "ephemeral").status());
  }));
  EXPECT_EQ(hosts[0]->Captures(), 1);
  // Structured logs: every line one JSON object.
  std::istringstream lines(op->Log());
  std::string line;
  int parsed = 0;
  while (std::getline(lines, line)) {
    std::error_code error;
    value entry = value::parse(line, error);
    ASSERT_FALSE(error) << line;
    EXPECT_TRUE(entry.has_string_field("msg") && entry.has_string_field("level")) << line;
    ++parsed;
  }
  EXPECT_GT(parsed, 3);
}

// A schedule that fires every minute, through the operator binary on the real clock: its job
// is created, captured, and (history limit 0) pruned. The minute-by-minute semantics are in
// profileschedule_integration_test on a simulated clock.
TEST_F(OperatorE2eTest, AProfileScheduleCreatesRunsAndPrunesItsJobs) {
  auto hosts = StartHosts({"trainer-0"});
  CreateRunningPod("trainer-0", hosts[0]->port());
  auto op = StartOperator("a");
  value schedule = value::object();
  schedule["metadata"]["name"] = value::string("minutely");
  schedule["spec"]["schedule"] = value::string("* * * * *");
  schedule["spec"]["successfulJobsHistoryLimit"] = value::number(0);
  schedule["spec"]["jobTemplate"]["spec"] = JobSpec(/*duration_ms=*/300, /*delay_ms=*/200);
  ASSERT_TRUE(admin_->Create(api::ProfileSchedules(), ns_, schedule).ok());

  value status;
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<value> got = admin_->Get(api::ProfileSchedules(), ns_, "minutely");
        if (!got.ok() || !got->has_field("status")) return false;
        status = got->at("status");
        return status.has_string_field("lastSuccessfulTime");
      },
      std::chrono::seconds(150)))
      << status.serialize();
  EXPECT_TRUE(status.has_string_field("lastScheduleTime"));
  EXPECT_EQ(status.at("conditions").at(0).at("status").as_string(), "True");
  // The successful job is pruned (limit 0), after it captured.
  EXPECT_TRUE(Eventually([&] {
    absl::StatusOr<kube::ObjectList> jobs = admin_->List(api::ProfileJobs(), ns_);
    return jobs.ok() && jobs->items.empty();
  }));
  EXPECT_GE(hosts[0]->Captures("ok"), 1);
  EXPECT_TRUE(Eventually([&] {
    auto events = Events("minutely");
    return events.count("SuccessfulCreate") >= 1 && events.count("SuccessfulDelete") >= 1;
  }));
}

}  // namespace
}  // namespace clusterprof
