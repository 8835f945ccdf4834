// ProfileJobController on the in-memory API and in-process sidecars, on a simulated clock: every
// phase transition, conflict, retry, resume, TTL and shutdown case, with no process spawned and
// no sleep. operator_e2e_test covers the same controller in the real binary against a real API
// server.
#include "operator/controllers/profilejob_controller.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "analysis/digest_proto.h"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "coordinator/coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/api/types.h"
#include "operator/kube/event_recorder.h"
#include "operator/kube/informer.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "tests/analysis/synthetic_run.h"
#include "tests/support/clock_advancer.h"
#include "tests/support/fake_api_client.h"
#include "tests/support/fake_profilers.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::controllers {
namespace {

using ::testing::AllOf;
using testing::FakeApiClient;
using testing::FakeProfilers;
using ::testing::HasSubstr;
using ::testing::Not;
using web::json::value;

constexpr char kNs[] = "team";

std::string Phase(const std::optional<value>& job) {
  if (!job.has_value() || !job->has_object_field("status") ||
      !job->at("status").has_string_field("phase")) {
    return "";
  }
  return job->at("status").at("phase").as_string();
}

bool Finished(const std::optional<value>& job) {
  const std::string phase = Phase(job);
  return phase == "Succeeded" || phase == "PartiallySucceeded" || phase == "Failed";
}

class ProfileJobControllerTest : public ::testing::Test {
 protected:
  ProfileJobControllerTest() : api_(&clock_), servers_(&clock_) {}

  void SetUp() override {
    kube::InformerOptions job_options;
    job_options.type = api::ProfileJobs();
    job_options.namespace_ = kNs;
    jobs_ = std::make_unique<kube::Informer>(&api_, &clock_, job_options);
    kube::InformerOptions pod_options;
    pod_options.type = kube::Pods();
    pod_options.namespace_ = kNs;
    pod_options.decoder = kube::PodDecoder();
    pods_ = std::make_unique<kube::Informer>(&api_, &clock_, pod_options);
  }

  void TearDown() override {
    StopAdvancing();
    if (controller_ != nullptr) controller_->Stop(0);
    events_.reset();
    jobs_->Stop();
    pods_->Stop();
  }

  void StartController(ProfileJobControllerOptions options = {}) {
    jobs_->Start();
    pods_->Start();
    ASSERT_TRUE(jobs_->WaitForSync());
    ASSERT_TRUE(pods_->WaitForSync());
    options.connector = &servers_;
    options.workers = 2;
    options.clock_probes = 1;
    if (record_events_) {
      events_ = std::make_unique<kube::EventRecorder>(&api_, &clock_, "clusterprof-operator", "op");
    }
    controller_ = std::make_unique<ProfileJobController>(&api_, &clock_, jobs_.get(), pods_.get(),
                                                         events_.get(), &metrics_, options);
    controller_->Start();
  }

  // Moves the simulated clock on whenever a thread sleeps on it (retry pauses, backoff).
  void StartAdvancing() {
    advancer_ = std::make_unique<testing::ClockAdvancer>(&clock_, 10 * kNanosPerMilli);
  }
  void StopAdvancing() { advancer_.reset(); }

  // A Running, Ready pod with a sidecar at `ip`, and its sidecar among the servers.
  void AddPod(const std::string& name, const std::string& ip, bool ready = true,
              FakeProfilers::Script script = {}) {
    value pod = value::parse(R"({
      "metadata": {"labels": {"app": "train"}},
      "spec": {"nodeName": "node-1", "containers": [
        {"name": "trainer"},
        {"name": "clusterprof-sidecar", "ports": [{"name": "clusterprof", "containerPort": 8466}]}
      ]}})");
    pod["metadata"]["name"] = value::string(name);
    absl::StatusOr<value> created = api_.Create(kube::Pods(), kNs, pod);
    ASSERT_TRUE(created.ok()) << created.status();
    (*created)["status"] = value::parse(R"({"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}]})");
    (*created)["status"]["podIP"] = value::string(ip);
    if (!ready) (*created)["status"]["conditions"][0]["status"] = value::string("False");
    ASSERT_TRUE(api_.UpdateStatus(kube::Pods(), kNs, *created).ok());
    if (script.host_name.empty()) script.host_name = name;
    servers_.Add(ip + ":8466", std::move(script));
  }

  value JobSpec(const std::string& extra = "") {
    value spec = value::parse(R"({"targets": {"selector": {"matchLabels": {"app": "train"}}},
                                  "durationMs": 1000, "delayMs": 0, "tracingAttempts": 1})");
    spec["logdir"] = value::string(dir_.path());
    if (!extra.empty()) {
      const value fields = value::parse(extra);
      for (const auto& [key, field] : fields.as_object()) spec[key] = field;
    }
    return spec;
  }

  value CreateJob(const std::string& name, const value& spec) {
    value job = value::object();
    job["metadata"] = value::object();
    job["metadata"]["name"] = value::string(name);
    job["spec"] = spec;
    absl::StatusOr<value> created = api_.Create(api::ProfileJobs(), kNs, job);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? *created : value();
  }

  // The status an earlier operator leaves behind while capturing run `run` from `t0`.
  static api::ProfileJobStatus Capturing(const std::string& run, int64_t t0) {
    api::ProfileJobStatus status;
    status.phase = api::JobPhase::kCapturing;
    status.run_name = run;
    status.start_time_ns = t0;
    status.start_time = api::FormatTime(t0);
    status.attempt = 1;
    return status;
  }
  void WriteStatus(value job, const api::ProfileJobStatus& status) {
    job["status"] = api::ProfileJobStatusToJson(status);
    ASSERT_TRUE(api_.UpdateStatus(api::ProfileJobs(), kNs, job).ok());
  }

  value WaitForJob(const std::string& name,
                   const std::function<bool(const std::optional<value>&)>& predicate) {
    absl::StatusOr<std::optional<value>> job =
        api_.WaitFor(api::ProfileJobs(), kNs, name, predicate);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() && job->has_value() ? **job : value();
  }
  value WaitForFinish(const std::string& name) { return WaitForJob(name, Finished); }

  std::vector<value> EventsWithReason(const std::string& reason) {
    std::vector<value> found;
    absl::StatusOr<kube::ObjectList> events = api_.List(kube::Events(), kNs, {});
    EXPECT_TRUE(events.ok()) << events.status();
    if (!events.ok()) return found;
    for (const value& event : events->items) {
      if (event.at("reason").as_string() == reason) found.push_back(event);
    }
    return found;
  }

  SimulatedClock clock_;
  FakeApiClient api_;
  FakeProfilers servers_;
  testing::TempDir dir_;
  std::unique_ptr<kube::Informer> jobs_;
  std::unique_ptr<kube::Informer> pods_;
  bool record_events_ = false;
  std::unique_ptr<kube::EventRecorder> events_;
  OperatorMetrics metrics_;
  std::unique_ptr<ProfileJobController> controller_;
  std::unique_ptr<testing::ClockAdvancer> advancer_;
};

// The series of `name` whose label `key` is `value` in `metrics`' registry (a test failure when
// there is none).
prometheus::ClientMetric Series(const OperatorMetrics& metrics, const std::string& name,
                                const std::string& key, const std::string& value) {
  for (const prometheus::MetricFamily& family : metrics.registry()->Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == key && label.value == value) return metric;
      }
    }
  }
  ADD_FAILURE() << "no series " << name << "{" << key << "=\"" << value << "\"}";
  return {};
}

TEST_F(ProfileJobControllerTest, APendingJobIsScheduledCapturedAndSucceeds) {
  AddPod("worker-0", "10.0.0.1");
  AddPod("worker-1", "10.0.0.2");
  StartController();
  CreateJob("job", JobSpec());
  const value job = WaitForFinish("job");
  const value& status = job.at("status");
  ASSERT_EQ(status.at("phase").as_string(), "Succeeded") << job.serialize();
  EXPECT_THAT(status.at("message").as_string(), HasSubstr("all 2 target(s) captured"));
  const value& targets = status.at("targets");
  ASSERT_EQ(targets.size(), 2u);
  for (const value& target : targets.as_array()) {
    EXPECT_EQ(target.at("phase").as_string(), "Succeeded");
    EXPECT_EQ(target.at("node").as_string(), "node-1");
    EXPECT_THAT(target.at("file").as_string(), HasSubstr(".xplane.pb"));
  }
  EXPECT_EQ(status.at("summary").at("succeeded").as_integer(), 2);
  // Both sidecars were asked for the one T0 the status recorded.
  const int64_t t0 = status.at("startTimeNs").as_number().to_int64();
  for (const char* address : {"10.0.0.1:8466", "10.0.0.2:8466"}) {
    const auto requests = servers_.ProfileRequests(address);
    ASSERT_EQ(requests.size(), 1u) << address;
    EXPECT_EQ(static_cast<int64_t>(requests[0].opts().start_timestamp_ns()), t0);
    EXPECT_EQ(requests[0].session_id(), status.at("runName").as_string());
  }
  // Scheduled (whole status), Capturing (a JSON patch), then the final status.
  EXPECT_GE(api_.CountActions("patch", "profilejobs", "status"), 1);
  bool completed = false;
  for (const value& condition : status.at("conditions").as_array()) {
    completed = completed || condition.at("type").as_string() == "Complete";
  }
  EXPECT_TRUE(completed);
}

TEST_F(ProfileJobControllerTest, AStragglerIsInTheStatusAndAnEventNamesItsPodAndNode) {
  // Three sidecars' digests of a job where worker-2 computes 30% slower.
  analysis::testing::RunSpec spec;
  spec.hosts.resize(3);
  spec.hosts[2].compute_scale = 1.3;
  std::vector<tensorflow::profiler::XSpace> spaces = analysis::testing::MakeRun(spec);
  for (int i = 0; i < 3; ++i) {
    FakeProfilers::Script script;
    script.digest.emplace();
    analysis::DigestToProto(*analysis::DigestXSpace(spaces[i], StrCat("worker-", i)),
                            &*script.digest);
    AddPod(StrCat("worker-", i), StrCat("10.0.0.", i + 1), true, std::move(script));
  }
  record_events_ = true;
  StartController();
  CreateJob("job", JobSpec());
  const value job = WaitForFinish("job");
  const value& analysis = job.at("status").at("analysis");
  EXPECT_EQ(analysis.at("stragglers").as_string(), "worker-2") << job.serialize();
  EXPECT_EQ(analysis.at("comparedSteps").as_integer(), spec.steps);
  ASSERT_EQ(analysis.at("hosts").size(), 3u);
  const value& straggler = analysis.at("hosts").at(2);
  EXPECT_EQ(straggler.at("host").as_string(), "worker-2");
  EXPECT_EQ(straggler.at("node").as_string(), "node-1");
  EXPECT_TRUE(straggler.at("straggler").as_bool());
  EXPECT_EQ(straggler.at("cause").as_string(), "compute");
  EXPECT_THAT(analysis.at("reportJSONURI").as_string(), HasSubstr("/clusterprof_report.json"));

  // The Event follows the final status.
  std::vector<std::string> stragglers;
  for (int i = 0; i < 1000 && stragglers.empty(); ++i) {
    ASSERT_TRUE(events_->Flush(10 * kNanosPerSecond));
    for (const value& event : EventsWithReason("StragglerDetected")) {
      EXPECT_EQ(event.at("type").as_string(), "Warning");
      stragglers.push_back(event.at("message").as_string());
    }
    if (stragglers.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_THAT(stragglers[0],
              HasSubstr("pod worker-2 on node node-1 holds the job back (compute): enters the "
                        "collectives"));
}

// The WaitingForTargets condition of `job`, if it has one.
std::optional<value> WaitingCondition(const std::optional<value>& job) {
  if (!job.has_value() || !job->has_field("status") || !job->at("status").has_field("conditions")) {
    return std::nullopt;
  }
  for (const value& condition : job->at("status").at("conditions").as_array()) {
    if (condition.at("type").as_string() == "WaitingForTargets") return condition;
  }
  return std::nullopt;
}

bool Waiting(const std::optional<value>& job) {
  const std::optional<value> condition = WaitingCondition(job);
  return condition.has_value() && condition->at("status").as_string() == "True";
}

// docs/security.md: a job reaches only its own namespace's pods, and writes only under the
// sidecars' allowed logdirs; the operator checks both before anything is sent or written.
TEST_F(ProfileJobControllerTest, AJobThatNamesAnotherNamespacesServerFailsAndSendsNothing) {
  AddPod("worker-0", "10.0.0.1");
  servers_.Add("10.9.9.9:8466", {});
  StartController();
  CreateJob("outside",
            JobSpec(R"({"targets": {"addresses": ["10.0.0.1:8466", "10.9.9.9:8466"]}})"));
  const value job = WaitForFinish("outside");
  EXPECT_EQ(Phase(job), "Failed");
  EXPECT_THAT(job.at("status").at("message").as_string(),
              AllOf(HasSubstr("10.9.9.9:8466 is not the address of a pod in namespace"),
                    Not(HasSubstr("10.0.0.1:8466 is"))));
  EXPECT_TRUE(servers_.ProfileRequests("10.9.9.9:8466").empty());
  EXPECT_TRUE(servers_.ProfileRequests("10.0.0.1:8466").empty());
}

TEST_F(ProfileJobControllerTest, AnExternalAddressIsCapturedWhenTheOperatorAllowsIt) {
  AddPod("worker-0", "10.0.0.1");
  servers_.Add("10.9.9.9:8466", {});
  ProfileJobControllerOptions options;
  options.allow_external_addresses = true;
  StartController(options);
  CreateJob("outside", JobSpec(R"({"targets": {"addresses": ["10.9.9.9:8466"]}})"));
  const value job = WaitForFinish("outside");
  EXPECT_NE(Phase(job), "Failed") << job.serialize();
  EXPECT_EQ(servers_.ProfileRequests("10.9.9.9:8466").size(), 1u);
}

TEST_F(ProfileJobControllerTest, ALogdirOutsideTheAllowlistFailsBeforeAnythingIsWritten) {
  AddPod("worker-0", "10.0.0.1");
  ProfileJobControllerOptions options;
  options.allowed_logdirs.push_back(*storage::ParseLogdir(dir_.Join("allowed")));
  StartController(options);
  CreateJob("elsewhere", JobSpec(StrCat(R"({"logdir": ")", dir_.Join("allowed-not"), R"("})")));
  const value job = WaitForFinish("elsewhere");
  EXPECT_EQ(Phase(job), "Failed");
  EXPECT_THAT(job.at("status").at("message").as_string(),
              AllOf(HasSubstr("is outside the logdirs the sidecars may write"),
                    HasSubstr(dir_.Join("allowed"))));
  EXPECT_TRUE(servers_.ProfileRequests("10.0.0.1:8466").empty());
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("allowed-not")));
  CreateJob("inside", JobSpec(StrCat(R"({"logdir": ")", dir_.Join("allowed/team"), R"("})")));
  EXPECT_EQ(Phase(WaitForFinish("inside")), "Succeeded");
}

TEST_F(ProfileJobControllerTest, TooFewReadyTargetsFailsNamingTheOnesLeftOut) {
  AddPod("worker-0", "10.0.0.1");
  AddPod("worker-1", "10.0.0.2", /*ready=*/false);
  StartController();
  CreateJob("job", JobSpec(R"({"targets": {"selector": {"matchLabels": {"app": "train"}},
                                           "minReady": 2, "waitSeconds": 3}})"));
  const value waiting = WaitForJob("job", Waiting);
  EXPECT_EQ(Phase(waiting), "Pending");
  EXPECT_THAT(waiting.at("status").at("message").as_string(),
              HasSubstr("waiting for targets: 1 target(s) ready, 2 needed; waiting on readiness "
                        "(1: worker-1)"));
  StartAdvancing();  // past the 3 s
  const value job = WaitForFinish("job");
  StopAdvancing();
  EXPECT_EQ(Phase(job), "Failed");
  EXPECT_THAT(job.at("status").at("message").as_string(),
              AllOf(HasSubstr("1 target(s) ready, 2 needed"), HasSubstr("worker-1"),
                    HasSubstr(", after waiting "), HasSubstr(" s (spec.targets.waitSeconds: 3)")));
  const std::optional<value> condition = WaitingCondition(job);
  ASSERT_TRUE(condition.has_value()) << job.serialize();
  EXPECT_EQ(condition->at("status").as_string(), "False");
  EXPECT_EQ(condition->at("reason").as_string(), "WaitTimeout");
  EXPECT_TRUE(servers_.ProfileRequests("10.0.0.1:8466").empty()) << "nothing captured";
}

TEST_F(ProfileJobControllerTest, WithoutAWaitTooFewReadyTargetsFailAtOnce) {
  AddPod("worker-0", "10.0.0.1", /*ready=*/false);
  StartController();
  CreateJob("job", JobSpec(R"({"targets": {"selector": {"matchLabels": {"app": "train"}},
                                           "waitSeconds": 0}})"));
  const value job = WaitForFinish("job");
  EXPECT_EQ(Phase(job), "Failed");
  EXPECT_THAT(job.at("status").at("message").as_string(),
              AllOf(HasSubstr("0 target(s) ready, 1 needed"), HasSubstr("worker-0: not Ready")));
  EXPECT_FALSE(WaitingCondition(job).has_value()) << job.serialize();
}

TEST_F(ProfileJobControllerTest, AJobAppliedBeforeItsPodsWaitsForThemThenCapturesThemAll) {
  StartController();
  CreateJob("job", JobSpec());
  // No pod yet (a StatefulSet applied in the same `kubectl apply`).
  const value empty = WaitForJob("job", Waiting);
  EXPECT_THAT(empty.at("status").at("message").as_string(),
              HasSubstr("no pods in namespace team match the selector \"app=train\" yet"));
  // One pod ready, the other still starting: the job waits for it rather than capture one.
  // (Both pods exist before either is Ready, as a StatefulSet's pods with
  // podManagementPolicy: Parallel, or a Job's; one that comes after the others are Ready is
  // not waited for.)
  AddPod("worker-1", "10.0.0.2", /*ready=*/false);
  AddPod("worker-0", "10.0.0.1");
  const value one = WaitForJob("job", [](const std::optional<value>& job) {
    // Its pods' changes wake it: a pod seen before its status says Running waits on its
    // containers first.
    return Waiting(job) && absl::StrContains(job->at("status").at("message").as_string(),
                                             "1 target(s) ready, 1 needed; waiting on readiness");
  });
  EXPECT_THAT(one.at("status").at("message").as_string(),
              HasSubstr("waiting on readiness (1: worker-1)"));
  EXPECT_TRUE(servers_.ProfileRequests("10.0.0.1:8466").empty());
  // Ready: both are captured.
  absl::StatusOr<value> pod = api_.Get(kube::Pods(), kNs, "worker-1");
  ASSERT_TRUE(pod.ok()) << pod.status();
  (*pod)["status"]["conditions"][0]["status"] = value::string("True");
  ASSERT_TRUE(api_.UpdateStatus(kube::Pods(), kNs, *pod).ok());
  const value job = WaitForFinish("job");
  ASSERT_EQ(Phase(job), "Succeeded") << job.serialize();
  EXPECT_EQ(job.at("status").at("targetsSucceeded").as_string(), "2/2");
  const std::optional<value> condition = WaitingCondition(job);
  ASSERT_TRUE(condition.has_value());
  EXPECT_EQ(condition->at("status").as_string(), "False");
  EXPECT_EQ(condition->at("reason").as_string(), "TargetsReady");
}

TEST_F(ProfileJobControllerTest, AnInvalidSpecFailsNamingTheField) {
  StartController();
  CreateJob("job", JobSpec(R"({"durationMs": -5})"));
  const value job = WaitForFinish("job");
  EXPECT_EQ(Phase(job), "Failed");
  EXPECT_THAT(job.at("status").at("message").as_string(), HasSubstr("spec.durationMs"));
}

TEST_F(ProfileJobControllerTest, ASidecarDownIsPartiallySucceededNamingThePod) {
  AddPod("worker-0", "10.0.0.1");
  AddPod("worker-1", "10.0.0.2", true, {.reachable = false});
  StartController();
  CreateJob("job", JobSpec());
  const value job = WaitForFinish("job");
  ASSERT_EQ(Phase(job), "PartiallySucceeded") << job.serialize();
  EXPECT_THAT(job.at("status").at("message").as_string(), HasSubstr("worker-1 (10.0.0.2:8466)"));
  for (const value& target : job.at("status").at("targets").as_array()) {
    if (target.at("name").as_string() == "worker-1") {
      EXPECT_EQ(target.at("phase").as_string(), "Failed");
      EXPECT_THAT(target.at("message").as_string(), HasSubstr("UNAVAILABLE"));
    }
  }
}

TEST_F(ProfileJobControllerTest, RetriesAnUnavailableTargetWithinTracingAttempts) {
  AddPod("worker-0", "10.0.0.1", true,
         {.profile_errors = {absl::UnavailableError("sidecar restarting")}});
  StartAdvancing();  // the retry waits its backoff on the clock
  StartController();
  CreateJob("job", JobSpec(R"({"tracingAttempts": 3})"));
  const value job = WaitForFinish("job");
  ASSERT_EQ(Phase(job), "Succeeded") << job.serialize();
  EXPECT_EQ(job.at("status").at("targets").at(0).at("attempts").as_integer(), 2);
  EXPECT_EQ(job.at("status").at("attempt").as_integer(), 2);
  EXPECT_EQ(servers_.ProfileRequests("10.0.0.1:8466").size(), 2u);
}

TEST_F(ProfileJobControllerTest, ConflictsOnStatusWritesAreRetriedFromTheLatestCopy) {
  AddPod("worker-0", "10.0.0.1");
  // The Scheduled write is optimistic (a conflict requeues the job); the final one re-reads.
  api_.FailNext("update", "profilejobs", 409, 3, "status");
  StartAdvancing();  // conflict retries and requeues pause on the clock
  StartController();
  CreateJob("job", JobSpec());
  const value job = WaitForFinish("job");
  EXPECT_EQ(Phase(job), "Succeeded") << job.serialize();
  EXPECT_GE(api_.CountActions("update", "profilejobs", "status"), 5);
  EXPECT_EQ(servers_.ProfileRequests("10.0.0.1:8466").size(), 1u) << "captured once";
}

TEST_F(ProfileJobControllerTest, TheFinalStatusOutlastsAnApiServerOutage) {
  AddPod("worker-0", "10.0.0.1");
  // Every status write after the capture fails for a while (the API server away), then works.
  std::atomic<int> refusals{0};
  std::atomic<bool> captured{false};
  api_.AddReactor([&](const FakeApiClient::Action& action) -> std::optional<absl::Status> {
    if (action.verb == "patch" && action.resource == "profilejobs") captured = true;
    if (captured && action.verb == "get" && action.resource == "profilejobs" &&
        refusals.fetch_add(1) < 4) {
      return FakeApiClient::ApiError(503, "", "the API server is restarting");
    }
    return std::nullopt;
  });
  StartAdvancing();
  StartController();
  CreateJob("job", JobSpec());
  const value job = WaitForFinish("job");
  EXPECT_EQ(Phase(job), "Succeeded") << job.serialize();
  EXPECT_GE(refusals.load(), 4);
}

TEST_F(ProfileJobControllerTest, AJobFoundCapturingIsResumedAndReadBackNotCapturedAgain) {
  AddPod("worker-0", "10.0.0.1");
  // An earlier operator captured run "r1" and stopped before writing the final status.
  coordinator::CaptureOptions earlier;
  earlier.targets = {{"10.0.0.1:8466", "worker-0"}};
  earlier.layout = *storage::RunLayout::Create(*storage::ParseLogdir(dir_.path()), "r1");
  earlier.connector = &servers_;
  earlier.write_manifest = false;
  ASSERT_TRUE(coordinator::Capture(earlier, clock_).ok());
  const int64_t t0 = servers_.ProfileRequests("10.0.0.1:8466").at(0).opts().start_timestamp_ns();

  api::ProfileJobStatus status = Capturing("r1", t0);
  status.targets = {api::TargetStatus{.name = "worker-0", .address = "10.0.0.1:8466"}};
  WriteStatus(CreateJob("job", JobSpec()), status);

  StartController();
  const value finished = WaitForFinish("job");
  ASSERT_EQ(Phase(finished), "Succeeded") << finished.serialize();
  EXPECT_THAT(finished.at("status").at("targets").at(0).at("message").as_string(),
              HasSubstr("read back"));
  EXPECT_EQ(servers_.ProfileRequests("10.0.0.1:8466").size(), 1u) << "not captured again";
}

// A job larger than the status lists (api::kMaxListedTargets), found Capturing after a restart:
// its status has no target list, so the operator resolves the targets again and asks each
// sidecar for the run's session. What an earlier operator captured is read back; the rest is
// captured now; no target is captured twice.
TEST_F(ProfileJobControllerTest, ALargeJobResumesFromTheSidecarsSessionsNotFromAList) {
  constexpr int kPods = 300;
  std::vector<coordinator::Target> first_half;
  for (int i = 0; i < kPods; ++i) {
    const std::string ip = StrCat("10.0.", i / 200, ".", i % 200 + 1);
    AddPod(StrCat("worker-", i), ip);
    if (i % 2 == 0) first_half.push_back({ip + ":8466", StrCat("worker-", i)});
  }
  // The earlier operator reached every other pod before it stopped.
  coordinator::CaptureOptions earlier;
  earlier.targets = first_half;
  earlier.layout = *storage::RunLayout::Create(*storage::ParseLogdir(dir_.path()), "r1");
  earlier.connector = &servers_;
  earlier.write_manifest = false;
  earlier.write_report = false;
  earlier.clock_probes = 1;
  ASSERT_TRUE(coordinator::Capture(earlier, clock_).ok());
  const int64_t t0 =
      servers_.ProfileRequests(first_half[0].address).at(0).opts().start_timestamp_ns();

  api::ProfileJobStatus status = Capturing("r1", t0);
  status.targets_not_listed = kPods;
  status.summary = api::JobSummary{.targets = kPods};
  WriteStatus(CreateJob("big", JobSpec()), status);

  StartController();
  const value finished = WaitForFinish("big");
  ASSERT_EQ(Phase(finished), "Succeeded") << finished.serialize();
  for (int i = 0; i < kPods; ++i) {
    const std::string address = StrCat("10.0.", i / 200, ".", i % 200 + 1, ":8466");
    EXPECT_EQ(servers_.ProfileRequests(address).size(), 1u) << "worker-" << i;
  }
  const value& final_status = finished.at("status");
  EXPECT_EQ(final_status.at("summary").at("succeeded").as_integer(), kPods);
  EXPECT_EQ(final_status.at("targetsSucceeded").as_string(), "300/300");
  EXPECT_LE(final_status.serialize().size(), api::kMaxStatusBytes);
  EXPECT_FALSE(final_status.has_field("targets") &&
               final_status.at("targets").size() > api::kMaxListedTargets);
}

TEST_F(ProfileJobControllerTest, ManyFailedTargetsAreOneEventAndTheStatusListsThemCapped) {
  record_events_ = true;
  constexpr int kPods = 150;
  for (int i = 0; i < kPods; ++i) {
    AddPod(StrCat("worker-", i), StrCat("10.0.1.", i + 1), true, {.reachable = i < 10});
  }
  AddPod("worker-late", "10.0.2.1", /*ready=*/false);
  StartController();
  CreateJob("job", JobSpec(R"({"targets": {"selector": {"matchLabels": {"app": "train"}},
                                           "waitSeconds": 0}})"));
  const value job = WaitForFinish("job");
  ASSERT_EQ(Phase(job), "PartiallySucceeded") << job.serialize();
  const value& status = job.at("status");
  ASSERT_EQ(status.at("targets").size(), api::kMaxListedTargets);
  EXPECT_EQ(status.at("targets").at(0).at("phase").as_string(), "Failed");
  EXPECT_EQ(status.at("targetsNotListed").as_integer(),
            kPods + 1 - static_cast<int>(api::kMaxListedTargets));
  EXPECT_EQ(status.at("summary").at("failed").as_integer(), kPods - 10);
  EXPECT_EQ(status.at("summary").at("skipped").as_integer(), 1);
  // The Events follow the final status.
  std::vector<value> failed;
  for (int i = 0; i < 1000 && failed.empty(); ++i) {
    ASSERT_TRUE(events_->Flush(10 * kNanosPerSecond));
    failed = EventsWithReason("TargetFailed");
    if (failed.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(failed.size(), 1u) << "one Event for all of them";
  EXPECT_THAT(failed[0].at("message").as_string(),
              HasSubstr("140 of 150 target(s) have no data: UNAVAILABLE (140): worker-10"));
  const std::vector<value> skipped = EventsWithReason("TargetSkipped");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0].at("message").as_string(),
              HasSubstr("1 matching pod(s) left out: worker-late: not Ready"));
}

TEST_F(ProfileJobControllerTest, MoreReadyPodsThanMaxTargetsFailsNamingBothCounts) {
  for (int i = 0; i < 5; ++i) AddPod(StrCat("worker-", i), StrCat("10.0.0.", i + 1));
  StartController();
  value spec = JobSpec();
  spec["targets"]["maxTargets"] = value::number(4);
  CreateJob("job", spec);
  const value job = WaitForFinish("job");
  ASSERT_EQ(Phase(job), "Failed") << job.serialize();
  EXPECT_THAT(job.at("status").at("message").as_string(),
              HasSubstr("5 target(s) are ready, more than spec.targets.maxTargets (4)"));
  EXPECT_EQ(servers_.ProfileRequests("10.0.0.1:8466").size(), 0u);
}

// The Queued condition of a job, or null.
const value* QueuedCondition(const value& job) {
  if (!job.has_field("status") || !job.at("status").has_field("conditions")) return nullptr;
  for (const value& condition : job.at("status").at("conditions").as_array()) {
    if (condition.at("type").as_string() == "Queued") return &condition;
  }
  return nullptr;
}

bool Queued(const std::optional<value>& job) {
  const value* condition = job.has_value() ? QueuedCondition(*job) : nullptr;
  return condition != nullptr && condition->at("status").as_string() == "True";
}

TEST_F(ProfileJobControllerTest, AJobWhoseTargetsAreBusyWaitsItsTurnThenCaptures) {
  AddPod("worker-0", "10.0.0.1", true, {.hold_profile = true});
  AddPod("worker-1", "10.0.0.2");
  record_events_ = true;
  StartController();
  CreateJob("first", JobSpec(R"({"targets": {"addresses": ["10.0.0.1:8466"]}})"));
  servers_.WaitForHeld(1);
  CreateJob("second", JobSpec());  // both pods: worker-0 is busy
  const value queued = WaitForJob("second", Queued);
  EXPECT_EQ(Phase(queued), "Pending");
  EXPECT_THAT(
      queued.at("status").at("message").as_string(),
      AllOf(HasSubstr("waiting for ProfileJob first ("), HasSubstr("), which holds worker-0")));
  EXPECT_EQ(QueuedCondition(queued)->at("reason").as_string(), "TargetsBusy");
  EXPECT_EQ(servers_.ProfileRequests("10.0.0.2:8466").size(), 0u) << "nothing captured yet";

  servers_.Update("10.0.0.1:8466",
                  [](FakeProfilers::Script& script) { script.hold_profile = false; });
  servers_.Release();
  // No clock moves: the first job's end wakes the queued one.
  EXPECT_EQ(Phase(WaitForFinish("first")), "Succeeded");
  const value second = WaitForFinish("second");
  ASSERT_EQ(Phase(second), "Succeeded") << second.serialize();
  EXPECT_EQ(QueuedCondition(second)->at("status").as_string(), "False");
  EXPECT_EQ(QueuedCondition(second)->at("reason").as_string(), "TargetsFree");
  // Each job captured worker-0 once: the second never ran into the first's capture.
  EXPECT_EQ(servers_.ProfileRequests("10.0.0.1:8466").size(), 2u);
  ASSERT_TRUE(events_->Flush(10 * kNanosPerSecond));
  const std::vector<value> queued_events = EventsWithReason("Queued");
  ASSERT_EQ(queued_events.size(), 1u);
  EXPECT_EQ(queued_events[0].at("involvedObject").at("name").as_string(), "second");
}

TEST_F(ProfileJobControllerTest, ABusyTargetFailsAJobThatMayNotWait) {
  AddPod("worker-0", "10.0.0.1", true, {.hold_profile = true});
  StartController();
  CreateJob("first", JobSpec());
  servers_.WaitForHeld(1);
  CreateJob("impatient", JobSpec(R"({"queueTimeoutSeconds": 0})"));
  const value job = WaitForFinish("impatient");
  ASSERT_EQ(Phase(job), "Failed");
  // first is Scheduled or Capturing by now (its Capturing write runs beside the requests).
  EXPECT_THAT(job.at("status").at("message").as_string(),
              AllOf(HasSubstr("its targets are busy: ProfileJob first ("),
                    HasSubstr("), which holds worker-0; spec.queueTimeoutSeconds is 0")));
  servers_.Release();
}

TEST_F(ProfileJobControllerTest, AQueuedJobFailsOnceItWaitedPastItsTimeout) {
  AddPod("worker-0", "10.0.0.1", true, {.hold_profile = true});
  StartController();
  CreateJob("first", JobSpec());
  servers_.WaitForHeld(1);
  CreateJob("second", JobSpec(R"({"queueTimeoutSeconds": 3})"));
  WaitForJob("second", Queued);
  StartAdvancing();
  const value job = WaitForFinish("second");
  ASSERT_EQ(Phase(job), "Failed");
  // How long past 3 s depends on how far the advancing clock ran ahead of the worker.
  EXPECT_THAT(job.at("status").at("message").as_string(),
              AllOf(HasSubstr("waited "), HasSubstr(" s for ProfileJob first ("),
                    HasSubstr("), which holds worker-0 (spec.queueTimeoutSeconds: 3)")));
  bool timed_out = false;
  for (const value& condition : job.at("status").at("conditions").as_array()) {
    timed_out = timed_out || condition.at("reason").as_string() == "QueueTimeout";
  }
  EXPECT_TRUE(timed_out);
  StopAdvancing();
  servers_.Release();
}

TEST_F(ProfileJobControllerTest, StopCancelsARunningCaptureAndJoinsIt) {
  AddPod("worker-0", "10.0.0.1", true, {.hold_profile = true});
  StartController();
  CreateJob("job", JobSpec());
  servers_.WaitForHeld(1);
  EXPECT_EQ(controller_->RunningCaptures(), 1);
  EXPECT_FALSE(controller_->Stop(0)) << "a capture was still running";
  EXPECT_EQ(controller_->RunningCaptures(), 0);
  // Left for a successor: not marked finished.
  const std::optional<value> job = api_.Peek(api::ProfileJobs(), kNs, "job");
  EXPECT_FALSE(Finished(job)) << job->serialize();
}

TEST_F(ProfileJobControllerTest, AFinishedJobIsDeletedOnceItsTtlPasses) {
  AddPod("worker-0", "10.0.0.1");
  StartController();
  CreateJob("job", JobSpec(R"({"ttlSecondsAfterFinished": 60})"));
  ASSERT_EQ(Phase(WaitForFinish("job")), "Succeeded");
  EXPECT_TRUE(api_.Peek(api::ProfileJobs(), kNs, "job").has_value()) << "kept until the TTL";
  // Moved on while the controller sleeps (its TTL timer may be set after this point).
  StartAdvancing();
  const absl::StatusOr<std::optional<value>> gone = api_.WaitFor(
      api::ProfileJobs(), kNs, "job", [](const std::optional<value>& job) { return !job; });
  EXPECT_TRUE(gone.ok()) << gone.status();
}

TEST_F(ProfileJobControllerTest, ADeletedAndRecreatedJobIsANewJob) {
  AddPod("worker-0", "10.0.0.1");
  StartController();
  CreateJob("job", JobSpec());
  ASSERT_EQ(Phase(WaitForFinish("job")), "Succeeded");
  ASSERT_TRUE(api_.Delete(api::ProfileJobs(), kNs, "job").ok());
  CreateJob("job", JobSpec());
  const value again = WaitForFinish("job");
  EXPECT_EQ(Phase(again), "Succeeded");
  EXPECT_EQ(servers_.ProfileRequests("10.0.0.1:8466").size(), 2u);
}

TEST_F(ProfileJobControllerTest, TargetsWhoseFilesDidNotReachTheLogdirCountAsUploadFailures) {
  AddPod("worker-0", "10.0.0.1", true,
         {.upload_state = v1alpha1::UPLOAD_STATE_FAILED, .upload_error = "HTTP 403 Forbidden"});
  AddPod("worker-1", "10.0.0.2", true, {.upload_state = v1alpha1::UPLOAD_STATE_SPOOLED});
  AddPod("worker-2", "10.0.0.3");
  StartController();
  CreateJob("job", JobSpec());
  WaitForFinish("job");
  // The metrics are recorded after the final status: Stop joins the capture's thread.
  controller_->Stop(0);
  constexpr char kUploadFailures[] = "clusterprof_operator_upload_failures_total";
  EXPECT_EQ(Series(metrics_, kUploadFailures, "state", "failed").counter.value, 1);
  EXPECT_EQ(Series(metrics_, kUploadFailures, "state", "pending").counter.value, 1);
  // A job that never waited for other jobs observes no queue wait.
  constexpr char kQueueWait[] = "clusterprof_operator_queue_wait_seconds";
  EXPECT_EQ(Series(metrics_, kQueueWait, "outcome", "scheduled").histogram.sample_count, 0u);
  EXPECT_EQ(Series(metrics_, kQueueWait, "outcome", "timeout").histogram.sample_count, 0u);
}

TEST_F(ProfileJobControllerTest, AQueuedJobObservesHowLongItWaitedOnceScheduled) {
  AddPod("worker-0", "10.0.0.1", true, {.hold_profile = true});
  StartController();
  CreateJob("first", JobSpec());
  servers_.WaitForHeld(1);
  CreateJob("second", JobSpec());
  WaitForJob("second", Queued);
  clock_.AdvanceNs(5 * kNanosPerSecond);
  servers_.Update("10.0.0.1:8466",
                  [](FakeProfilers::Script& script) { script.hold_profile = false; });
  servers_.Release();
  ASSERT_EQ(Phase(WaitForFinish("second")), "Succeeded");
  controller_->Stop(0);
  const prometheus::ClientMetric scheduled =
      Series(metrics_, "clusterprof_operator_queue_wait_seconds", "outcome", "scheduled");
  EXPECT_EQ(scheduled.histogram.sample_count, 1u) << "once, for the second job only";
  EXPECT_GE(scheduled.histogram.sample_sum, 5.0);
  EXPECT_LT(scheduled.histogram.sample_sum, 6.0);
  EXPECT_EQ(Series(metrics_, "clusterprof_operator_queue_wait_seconds", "outcome", "timeout")
                .histogram.sample_count,
            0u);
  // Every file was committed.
  EXPECT_EQ(Series(metrics_, "clusterprof_operator_upload_failures_total", "state", "failed")
                .counter.value,
            0);
}

TEST_F(ProfileJobControllerTest, AQueuedJobThatTimesOutObservesItsWait) {
  AddPod("worker-0", "10.0.0.1", true, {.hold_profile = true});
  StartController();
  CreateJob("first", JobSpec());
  servers_.WaitForHeld(1);
  CreateJob("second", JobSpec(R"({"queueTimeoutSeconds": 3})"));
  WaitForJob("second", Queued);
  StartAdvancing();
  ASSERT_EQ(Phase(WaitForFinish("second")), "Failed");
  StopAdvancing();
  // Observed after the Failed status is written, on a worker: Stop joins the workers (and
  // cancels the first job's capture).
  controller_->Stop(0);
  const prometheus::ClientMetric timeout =
      Series(metrics_, "clusterprof_operator_queue_wait_seconds", "outcome", "timeout");
  EXPECT_EQ(timeout.histogram.sample_count, 1u);
  EXPECT_GE(timeout.histogram.sample_sum, 3.0);
  EXPECT_EQ(Series(metrics_, "clusterprof_operator_queue_wait_seconds", "outcome", "scheduled")
                .histogram.sample_count,
            0u);
}

}  // namespace
}  // namespace clusterprof::controllers
