// The CRDs of crds/ and the manifests of examples/ against a real kube-apiserver (tests/support/
// kube_control_plane.h): they install with kubectl, the examples apply as they are, the server
// fills in the defaults, prunes unknown fields, rejects out-of-range values with errors that
// name the field, keeps status behind its subresource, and kubectl prints the printer columns.
//
// The control plane is Kubernetes 1.20, which drops the CEL rules (x-kubernetes-validations)
// silently: crd_schema_test.cc checks their shape, and the operator applies the same checks.
#include <chrono>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/api_error.h"
#include "operator/kube/resource.h"
#include "operator/kube/rest_client.h"
#include "tests/operator/kube/kube_fixture.h"
#include "tests/support/kube_control_plane.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::kube {
namespace {

using ::testing::AllOf;
using testing::CommandResult;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kSourceDir[] = CLUSTERPROF_SOURCE_DIR;

const ResourceType& ProfileJobs() {
  static const ResourceType* type =
      new ResourceType{"clusterprof.io", "v1alpha1", "profilejobs", "ProfileJob", true};
  return *type;
}
const ResourceType& ProfileSchedules() {
  static const ResourceType* type =
      new ResourceType{"clusterprof.io", "v1alpha1", "profileschedules", "ProfileSchedule", true};
  return *type;
}

web::json::value Json(const std::string& text) { return web::json::value::parse(text); }

// The value at a dotted path ("spec.targets.minReady"); null when a step is missing.
web::json::value At(const web::json::value& object, const std::string& path) {
  web::json::value node = object;
  for (std::string_view step : SplitSkipEmpty(path, '.')) {
    const std::string key(step);
    if (!node.is_object() || !node.has_field(key)) return web::json::value::null();
    node = node.at(key);
  }
  return node;
}

std::string Describe(const CommandResult& result) {
  return StrCat("exit code ", result.exit_code, "\nstdout: ", result.out, "\nstderr: ", result.err);
}

// The words of the first line of `text`: kubectl's table header.
std::vector<std::string> HeaderWords(const std::string& text) {
  std::istringstream lines(text);
  std::string header;
  std::getline(lines, header);
  std::istringstream words(header);
  std::vector<std::string> out;
  for (std::string word; words >> word;) out.push_back(word);
  return out;
}

// A ProfileJob with only what is required.
web::json::value MinimalProfileJob(const std::string& name) {
  web::json::value job = Json(R"({"spec": {
      "targets": {"selector": {"matchLabels": {"app": "llama-trainer"}}},
      "logdir": "gs://my-bucket/tensorboard/llama"}})");
  job["metadata"]["name"] = web::json::value(name);
  return job;
}

web::json::value MinimalProfileSchedule(const std::string& name) {
  web::json::value schedule = Json(R"({"spec": {
      "schedule": "*/30 * * * *",
      "jobTemplate": {"spec": {
        "targets": {"addresses": ["10.0.0.5:8466"]},
        "logdir": "/data/tensorboard"}}}})");
  schedule["metadata"]["name"] = web::json::value(name);
  return schedule;
}

class CrdApplyTest : public KubeFixture {
 protected:
  static void SetUpTestSuite() {
    StartPlane({});
    install_status_ = new absl::Status(start_status_->ok() ? Install() : *start_status_);
  }

  static void TearDownTestSuite() {
    KubeFixture::TearDownTestSuite();
    delete install_status_;
    install_status_ = nullptr;
    delete kubectl_;
    kubectl_ = nullptr;
  }

  void SetUp() override {
    KubeFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (absl::IsNotFound(*install_status_)) GTEST_SKIP() << *install_status_;
    ASSERT_TRUE(install_status_->ok()) << *install_status_;
  }

  // Finds kubectl, writes an admin kubeconfig, applies crds/ and waits until both CRDs are
  // Established and served. NotFound when kubectl is not installed.
  static absl::Status Install() {
    absl::StatusOr<std::string> kubectl = testing::FindProgram("kubectl");
    if (!kubectl.ok()) return kubectl.status();
    kubectl_ = new std::string(*kubectl);
    CLUSTERPROF_RETURN_IF_ERROR(plane_->WriteKubeconfig(Kubeconfig(), plane_->admin_token()));

    // The CEL rules are unknown to a 1.20 server: kubectl's client-side validation would refuse
    // them, and the server drops them.
    const CommandResult applied =
        Kubectl({"apply", "--validate=false", "-f", StrCat(kSourceDir, "/crds/")});
    if (applied.exit_code != 0) {
      return absl::InternalError(StrCat("kubectl apply -f crds/ failed: ", Describe(applied)));
    }
    for (const char* name : {"profilejobs.clusterprof.io", "profileschedules.clusterprof.io",
                             "profiletriggers.clusterprof.io"}) {
      const bool established = Eventually([&] {
        absl::StatusOr<testing::HttpResponse> response =
            plane_->Get(StrCat("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/", name),
                        plane_->admin_token());
        if (!response.ok() || response->status_code != 200) return false;
        const web::json::value conditions = At(Json(response->body), "status.conditions");
        if (!conditions.is_array()) return false;
        for (const web::json::value& condition : conditions.as_array()) {
          if (At(condition, "type").as_string() == "Established") {
            return At(condition, "status").as_string() == "True";
          }
        }
        return false;
      });
      if (!established) {
        return absl::DeadlineExceededError(StrCat("CRD ", name, " never became Established"));
      }
    }
    // Established means served; discovery (what kubectl resolves kinds with) follows shortly.
    const bool discovered = Eventually([] {
      absl::StatusOr<testing::HttpResponse> response =
          plane_->Get("/apis/clusterprof.io/v1alpha1", plane_->admin_token());
      return response.ok() && response->status_code == 200 &&
             response->body.find("\"profilejobs\"") != std::string::npos &&
             response->body.find("\"profileschedules\"") != std::string::npos;
    });
    if (!discovered) return absl::DeadlineExceededError("clusterprof.io/v1alpha1 not discovered");
    return absl::OkStatus();
  }

  static std::string Kubeconfig() { return plane_->dir() + "/admin.kubeconfig"; }

  // kubectl as the admin, with a discovery cache of its own in the control plane's directory.
  static CommandResult Kubectl(std::vector<std::string> args) {
    std::vector<std::string> argv = {*kubectl_,
                                     "--kubeconfig",
                                     Kubeconfig(),
                                     "--cache-dir",
                                     plane_->dir() + "/kubectl-cache",
                                     "--request-timeout=30s"};
    argv.insert(argv.end(), args.begin(), args.end());
    absl::StatusOr<CommandResult> result = testing::RunCommand(argv);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *std::move(result) : CommandResult{};
  }

  // Creating `object` fails with 422 Invalid, and the message names `field`.
  void ExpectInvalid(const ResourceType& type, const web::json::value& object,
                     const std::string& field) {
    const absl::Status status = admin_->Create(type, ns_, object).status();
    EXPECT_TRUE(IsInvalid(status)) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(field));
    const std::string name = At(object, "metadata.name").as_string();
    EXPECT_TRUE(absl::IsNotFound(admin_->Get(type, ns_, name).status())) << name << " was created";
  }

  static inline absl::Status* install_status_ = nullptr;
  static inline std::string* kubectl_ = nullptr;
};

TEST_F(CrdApplyTest, CrdsAreEstablishedWithTheirNames) {
  for (const auto& [name, short_name] : std::vector<std::pair<std::string, std::string>>{
           {"profilejobs.clusterprof.io", "pj"},
           {"profileschedules.clusterprof.io", "psched"},
           {"profiletriggers.clusterprof.io", "ptrig"}}) {
    SCOPED_TRACE(name);
    absl::StatusOr<web::json::value> crd = admin_->Get(CustomResourceDefinitions(), "", name);
    ASSERT_TRUE(crd.ok()) << crd.status();
    const web::json::value accepted = At(*crd, "status.acceptedNames");
    ASSERT_TRUE(accepted.is_object()) << crd->serialize();
    EXPECT_EQ(At(accepted, "shortNames").serialize(), StrCat("[\"", short_name, "\"]"));
    EXPECT_EQ(At(accepted, "categories").serialize(), "[\"clusterprof\"]");
    // A schema the server found non-structural shows up as a condition, not as an error.
    const web::json::value conditions = At(*crd, "status.conditions");
    ASSERT_TRUE(conditions.is_array()) << crd->serialize();
    for (const web::json::value& condition : conditions.as_array()) {
      const std::string type = At(condition, "type").as_string();
      if (type == "Established" || type == "NamesAccepted") {
        EXPECT_EQ(At(condition, "status").as_string(), "True") << type;
      } else {
        EXPECT_NE(At(condition, "status").as_string(), "True")
            << type << ": " << At(condition, "message").as_string();
      }
    }
  }
}

TEST_F(CrdApplyTest, ExampleProfileJobAppliesAsItIs) {
  const CommandResult applied =
      Kubectl({"apply", "-n", ns_, "-f", StrCat(kSourceDir, "/examples/profilejob.yaml")});
  ASSERT_EQ(applied.exit_code, 0) << Describe(applied);
  absl::StatusOr<web::json::value> job = admin_->Get(ProfileJobs(), ns_, "llama-step-1200");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(At(*job, "spec.targets.selector.matchLabels.app").as_string(), "llama-trainer");
  EXPECT_EQ(At(*job, "spec.durationMs").as_integer(), 2000);
  EXPECT_EQ(At(*job, "spec.delayMs").as_integer(), 1000);
  EXPECT_EQ(At(*job, "spec.logdir").as_string(), "gs://my-bucket/tensorboard/llama");
  // Unknown to the schema, kept: advancedConfiguration preserves what it is given.
  EXPECT_EQ(At(*job, "spec.options.advancedConfiguration.gpu_max_activity_api_events")
                .as_number()
                .to_int64(),
            4194304);
  EXPECT_EQ(At(*job, "spec.ttlSecondsAfterFinished").as_integer(), 86400);
}

TEST_F(CrdApplyTest, ExampleProfileScheduleAppliesAsItIs) {
  const CommandResult applied =
      Kubectl({"apply", "-n", ns_, "-f", StrCat(kSourceDir, "/examples/profileschedule.yaml")});
  ASSERT_EQ(applied.exit_code, 0) << Describe(applied);
  absl::StatusOr<web::json::value> schedule =
      admin_->Get(ProfileSchedules(), ns_, "llama-every-30m");
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_EQ(At(*schedule, "spec.schedule").as_string(), "*/30 * * * *");
  EXPECT_EQ(At(*schedule, "spec.timeZone").as_string(), "Etc/UTC");
  EXPECT_EQ(At(*schedule, "spec.concurrencyPolicy").as_string(), "Forbid");
  EXPECT_EQ(At(*schedule, "spec.jobTemplate.spec.targets.selector.matchLabels.app").as_string(),
            "llama-trainer");
  EXPECT_EQ(At(*schedule, "spec.jobTemplate.metadata.labels.app").as_string(), "llama-trainer");
}

TEST_F(CrdApplyTest, ExampleProfileTriggerAppliesAsItIsWithTheTriggersDefaults) {
  const CommandResult applied =
      Kubectl({"apply", "-n", ns_, "-f", StrCat(kSourceDir, "/examples/profiletrigger.yaml")});
  ASSERT_EQ(applied.exit_code, 0) << Describe(applied);
  absl::StatusOr<web::json::value> trigger = admin_->Get(
      ResourceType{"clusterprof.io", "v1alpha1", "profiletriggers", "ProfileTrigger", true}, ns_,
      "llama-slowdown");
  ASSERT_TRUE(trigger.ok()) << trigger.status();
  EXPECT_EQ(At(*trigger, "spec.targets.selector.matchLabels.app").as_string(), "llama-trainer");
  EXPECT_EQ(At(*trigger, "spec.rules").size(), 3u);
  // The server fills in what the example leaves out, with the trigger's own defaults.
  EXPECT_EQ(At(*trigger, "spec.capture.delayMs").as_integer(), 0);
  EXPECT_EQ(At(*trigger, "spec.capture.queueTimeoutSeconds").as_integer(), 60);
  EXPECT_EQ(At(*trigger, "spec.successfulJobsHistoryLimit").as_integer(), 3);
  EXPECT_FALSE(At(*trigger, "spec.suspend").as_bool());
}

TEST_F(CrdApplyTest, ServerFillsInProfileJobDefaults) {
  absl::StatusOr<web::json::value> job =
      admin_->Create(ProfileJobs(), ns_, MinimalProfileJob("minimal"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(At(*job, "spec.targets.minReady").as_integer(), 1);
  EXPECT_EQ(At(*job, "spec.durationMs").as_integer(), 2000);
  EXPECT_EQ(At(*job, "spec.delayMs").as_integer(), 1000);
  EXPECT_EQ(At(*job, "spec.tracingAttempts").as_integer(), 3);
  EXPECT_EQ(At(*job, "spec.options.hostTracerLevel").as_integer(), 2);
  EXPECT_EQ(At(*job, "spec.options.deviceTracerLevel").as_integer(), 1);
  EXPECT_EQ(At(*job, "spec.options.pythonTracerLevel").as_integer(), 0);
  // No server default: the operator decides these.
  EXPECT_TRUE(At(*job, "spec.targets.port").is_null()) << job->serialize();
  EXPECT_TRUE(At(*job, "spec.runName").is_null()) << job->serialize();
  EXPECT_TRUE(At(*job, "spec.ttlSecondsAfterFinished").is_null()) << job->serialize();
  EXPECT_TRUE(At(*job, "status").is_null()) << job->serialize();

  // The same through a read, from storage.
  absl::StatusOr<web::json::value> read = admin_->Get(ProfileJobs(), ns_, "minimal");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(At(*read, "spec").serialize(), At(*job, "spec").serialize());
}

TEST_F(CrdApplyTest, ServerFillsInProfileScheduleDefaults) {
  absl::StatusOr<web::json::value> schedule =
      admin_->Create(ProfileSchedules(), ns_, MinimalProfileSchedule("minimal"));
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_EQ(At(*schedule, "spec.concurrencyPolicy").as_string(), "Forbid");
  EXPECT_FALSE(At(*schedule, "spec.suspend").as_bool());
  EXPECT_EQ(At(*schedule, "spec.successfulJobsHistoryLimit").as_integer(), 3);
  EXPECT_EQ(At(*schedule, "spec.failedJobsHistoryLimit").as_integer(), 1);
  EXPECT_TRUE(At(*schedule, "spec.timeZone").is_null());
  EXPECT_TRUE(At(*schedule, "spec.startingDeadlineSeconds").is_null());
  // The template's spec is defaulted like a ProfileJob's.
  EXPECT_EQ(At(*schedule, "spec.jobTemplate.spec.targets.minReady").as_integer(), 1);
  EXPECT_EQ(At(*schedule, "spec.jobTemplate.spec.durationMs").as_integer(), 2000);
  EXPECT_EQ(At(*schedule, "spec.jobTemplate.spec.tracingAttempts").as_integer(), 3);
  EXPECT_EQ(At(*schedule, "spec.jobTemplate.spec.options.hostTracerLevel").as_integer(), 2);
}

TEST_F(CrdApplyTest, ServerRejectsInvalidProfileJobsNamingTheField) {
  struct Case {
    std::string name;
    std::function<void(web::json::value&)> change;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"negative-duration", [](auto& j) { j["spec"]["durationMs"] = web::json::value(-5); },
       "spec.durationMs"},
      {"zero-duration", [](auto& j) { j["spec"]["durationMs"] = web::json::value(0); },
       "spec.durationMs"},
      {"long-duration", [](auto& j) { j["spec"]["durationMs"] = web::json::value(600001); },
       "spec.durationMs"},
      {"string-duration", [](auto& j) { j["spec"]["durationMs"] = web::json::value("2000"); },
       "spec.durationMs"},
      {"negative-delay", [](auto& j) { j["spec"]["delayMs"] = web::json::value(-1); },
       "spec.delayMs"},
      {"s3-logdir", [](auto& j) { j["spec"]["logdir"] = web::json::value("s3://x"); },
       "spec.logdir"},
      {"relative-logdir", [](auto& j) { j["spec"]["logdir"] = web::json::value("tb/run"); },
       "spec.logdir"},
      {"uppercase-bucket",
       [](auto& j) { j["spec"]["logdir"] = web::json::value("gs://My_Bucket/x"); }, "spec.logdir"},
      {"empty-logdir", [](auto& j) { j["spec"]["logdir"] = web::json::value(""); }, "spec.logdir"},
      {"no-logdir", [](auto& j) { j["spec"].erase("logdir"); }, "spec.logdir: Required value"},
      {"no-targets", [](auto& j) { j["spec"].erase("targets"); }, "spec.targets: Required value"},
      {"run-name-escapes", [](auto& j) { j["spec"]["runName"] = web::json::value("../x"); },
       "spec.runName"},
      {"run-name-with-slash", [](auto& j) { j["spec"]["runName"] = web::json::value("a/b"); },
       "spec.runName"},
      {"zero-attempts", [](auto& j) { j["spec"]["tracingAttempts"] = web::json::value(0); },
       "spec.tracingAttempts"},
      {"eleven-attempts", [](auto& j) { j["spec"]["tracingAttempts"] = web::json::value(11); },
       "spec.tracingAttempts"},
      {"host-level-4",
       [](auto& j) { j["spec"]["options"]["hostTracerLevel"] = web::json::value(4); },
       "spec.options.hostTracerLevel"},
      {"python-level-2",
       [](auto& j) { j["spec"]["options"]["pythonTracerLevel"] = web::json::value(2); },
       "spec.options.pythonTracerLevel"},
      {"port-70000", [](auto& j) { j["spec"]["targets"]["port"] = web::json::value(70000); },
       "spec.targets.port"},
      {"negative-min-ready",
       [](auto& j) { j["spec"]["targets"]["minReady"] = web::json::value(-1); },
       "spec.targets.minReady"},
      {"address-without-port",
       [](auto& j) { j["spec"]["targets"]["addresses"] = Json(R"(["10.0.0.5"])"); },
       "spec.targets.addresses"},
      {"unknown-operator",
       [](auto& j) {
         j["spec"]["targets"]["selector"]["matchExpressions"] =
             Json(R"([{"key": "app", "operator": "Like", "values": ["x"]}])");
       },
       // 1.20 leaves the index out of the path: spec.targets.selector.matchExpressions.operator.
       "spec.targets.selector.matchExpressions"},
      {"negative-ttl", [](auto& j) { j["spec"]["ttlSecondsAfterFinished"] = web::json::value(-1); },
       "spec.ttlSecondsAfterFinished"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    web::json::value job = MinimalProfileJob(c.name);
    c.change(job);
    ExpectInvalid(ProfileJobs(), job, c.field);
  }
}

TEST_F(CrdApplyTest, ServerRejectsInvalidProfileSchedulesNamingTheField) {
  struct Case {
    std::string name;
    std::function<void(web::json::value&)> change;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"no-schedule", [](auto& s) { s["spec"].erase("schedule"); },
       "spec.schedule: Required value"},
      {"empty-schedule", [](auto& s) { s["spec"]["schedule"] = web::json::value(""); },
       "spec.schedule"},
      {"no-template", [](auto& s) { s["spec"].erase("jobTemplate"); },
       "spec.jobTemplate: Required value"},
      {"policy-sometimes",
       [](auto& s) { s["spec"]["concurrencyPolicy"] = web::json::value("Sometimes"); },
       "spec.concurrencyPolicy"},
      {"negative-history",
       [](auto& s) { s["spec"]["successfulJobsHistoryLimit"] = web::json::value(-1); },
       "spec.successfulJobsHistoryLimit"},
      {"negative-deadline",
       [](auto& s) { s["spec"]["startingDeadlineSeconds"] = web::json::value(-1); },
       "spec.startingDeadlineSeconds"},
      {"zone-escapes", [](auto& s) { s["spec"]["timeZone"] = web::json::value("../etc/passwd"); },
       "spec.timeZone"},
      {"template-zero-duration",
       [](auto& s) { s["spec"]["jobTemplate"]["spec"]["durationMs"] = web::json::value(0); },
       "spec.jobTemplate.spec.durationMs"},
      {"template-no-logdir", [](auto& s) { s["spec"]["jobTemplate"]["spec"].erase("logdir"); },
       "spec.jobTemplate.spec.logdir: Required value"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    web::json::value schedule = MinimalProfileSchedule(c.name);
    c.change(schedule);
    ExpectInvalid(ProfileSchedules(), schedule, c.field);
  }
}

TEST_F(CrdApplyTest, UnknownFieldsArePrunedExceptInAdvancedConfiguration) {
  web::json::value job = MinimalProfileJob("pruned");
  job["spec"]["durationMS"] = web::json::value(5000);  // a typo
  job["spec"]["targets"]["podSelector"] = Json(R"({"app": "x"})");
  job["spec"]["options"]["advancedConfiguration"] =
      Json(R"({"gpu_max_activity_api_events": 4194304, "trace_mode": "full", "flag": true})");
  absl::StatusOr<web::json::value> created = admin_->Create(ProfileJobs(), ns_, job);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(At(*created, "spec.durationMS").is_null());
  EXPECT_EQ(At(*created, "spec.durationMs").as_integer(), 2000);
  EXPECT_TRUE(At(*created, "spec.targets.podSelector").is_null());
  EXPECT_EQ(At(*created, "spec.options.advancedConfiguration").serialize(),
            At(job, "spec.options.advancedConfiguration").serialize());
}

// A status as the operator writes it, every field set.
web::json::value FullStatus() {
  return Json(R"({
    "phase": "PartiallySucceeded",
    "message": "3 of 4 targets wrote a profile",
    "runName": "2024_01_02_03_04_05",
    "runURI": "gs://my-bucket/tensorboard/llama/plugins/profile/2024_01_02_03_04_05",
    "targetsSucceeded": "3/4",
    "startTime": "2024-01-02T03:04:05Z",
    "startTimeNs": 1704164645123456789,
    "completionTime": "2024-01-02T03:04:09Z",
    "attempt": 2,
    "observedGeneration": 1,
    "conditions": [{"type": "Complete", "status": "True", "observedGeneration": 1,
                    "lastTransitionTime": "2024-01-02T03:04:09Z", "reason": "PartiallySucceeded",
                    "message": "3 of 4 targets wrote a profile"}],
    "targets": [
      {"name": "trainer-0", "address": "10.1.0.4:8466", "node": "gpu-node-1",
       "phase": "Succeeded", "attempts": 1, "events": 123456, "droppedEvents": 0,
       "bytes": 9876543, "file": "gs://my-bucket/x/trainer-0.xplane.pb",
       "clockOffsetNs": -1250000, "clockUncertaintyNs": 41000, "startErrorNs": -3100,
       "message": "GPU tracer: no CUDA process in the pod"},
      {"name": "trainer-3", "address": "10.1.0.7:8466", "phase": "Empty", "attempts": 3}],
    "summary": {"targets": 4, "succeeded": 3, "empty": 1, "failed": 0,
                "maxStartSkewNs": 142000, "maxStartSkew": "142us"},
    "analysis": {"firstStep": 100, "lastStep": 149, "steps": 50, "comparedSteps": 50,
                 "stragglers": "trainer-2",
                 "hosts": [{"host": "trainer-2", "node": "gpu-7", "steps": 50,
                            "stepP50Ns": 27500000, "stepP90Ns": 28000000, "stepMaxNs": 31000000,
                            "stepP50": "27.5ms", "straggler": true, "lateSteps": 45,
                            "medianLatenessNs": 6000000, "othersWaitNs": 810000000,
                            "cause": "compute", "evidence": "enters the collectives late"}],
                 "leftOut": ["trainer-3: an empty trace"], "notes": [],
                 "reportURI": "gs://my-bucket/x/clusterprof_report.html",
                 "reportJSONURI": "gs://my-bucket/x/clusterprof_report.json"},
    "manifestURI": "gs://my-bucket/x/clusterprof_run.json"})");
}

TEST_F(CrdApplyTest, StatusIsWrittenThroughItsSubresourceOnly) {
  absl::StatusOr<web::json::value> created =
      admin_->Create(ProfileJobs(), ns_, MinimalProfileJob("status"));
  ASSERT_TRUE(created.ok()) << created.status();

  web::json::value with_status = *created;
  with_status["status"] = FullStatus();
  absl::StatusOr<web::json::value> updated = admin_->UpdateStatus(ProfileJobs(), ns_, with_status);
  ASSERT_TRUE(updated.ok()) << updated.status();
  // Every field survives pruning, and the nanosecond start is exact (no float on the way).
  EXPECT_EQ(At(*updated, "status").serialize(), FullStatus().serialize());
  EXPECT_EQ(At(*updated, "status.startTimeNs").as_number().to_int64(), 1704164645123456789);

  // A write to the main resource leaves status as it was.
  web::json::value overwrite = *updated;
  overwrite["status"]["phase"] = web::json::value("Failed");
  overwrite["metadata"]["labels"]["touched"] = web::json::value("yes");
  absl::StatusOr<web::json::value> main_write = admin_->Update(ProfileJobs(), ns_, overwrite);
  ASSERT_TRUE(main_write.ok()) << main_write.status();
  EXPECT_EQ(At(*main_write, "metadata.labels.touched").as_string(), "yes");
  EXPECT_EQ(At(*main_write, "status.phase").as_string(), "PartiallySucceeded");
  absl::StatusOr<web::json::value> read = admin_->Get(ProfileJobs(), ns_, "status");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(At(*read, "status").serialize(), FullStatus().serialize());

  // The status schema is enforced too.
  web::json::value bad_phase = *read;
  bad_phase["status"]["phase"] = web::json::value("Exploded");
  absl::Status status = admin_->UpdateStatus(ProfileJobs(), ns_, bad_phase).status();
  EXPECT_TRUE(IsInvalid(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("status.phase"));
  web::json::value bad_condition = *read;
  bad_condition["status"]["conditions"][0]["status"] = web::json::value("Maybe");
  status = admin_->UpdateStatus(ProfileJobs(), ns_, bad_condition).status();
  EXPECT_TRUE(IsInvalid(status)) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("status.conditions"), HasSubstr("Maybe")));
}

TEST_F(CrdApplyTest, ScheduleStatusIsWrittenThroughItsSubresource) {
  absl::StatusOr<web::json::value> created =
      admin_->Create(ProfileSchedules(), ns_, MinimalProfileSchedule("status"));
  ASSERT_TRUE(created.ok()) << created.status();
  web::json::value with_status = *created;
  with_status["status"] = Json(R"({
    "active": [{"apiVersion": "clusterprof.io/v1alpha1", "kind": "ProfileJob",
                "name": "status-28421280", "namespace": "x", "uid": "1234"}],
    "activeCount": 1,
    "lastScheduleTime": "2024-01-02T03:00:00Z",
    "lastSuccessfulTime": "2024-01-02T02:30:04Z",
    "observedGeneration": 1,
    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime":
                    "2024-01-02T02:00:00Z", "reason": "Scheduled", "message": "next at 03:30"}],
    "message": "next at 2024-01-02T03:30:00Z"})");
  absl::StatusOr<web::json::value> updated =
      admin_->UpdateStatus(ProfileSchedules(), ns_, with_status);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(At(*updated, "status").serialize(), At(with_status, "status").serialize());
}

TEST_F(CrdApplyTest, KubectlPrintsThePrinterColumns) {
  absl::StatusOr<web::json::value> job =
      admin_->Create(ProfileJobs(), ns_, MinimalProfileJob("columns"));
  ASSERT_TRUE(job.ok()) << job.status();
  (*job)["status"] = FullStatus();
  ASSERT_TRUE(admin_->UpdateStatus(ProfileJobs(), ns_, *job).ok());
  ASSERT_TRUE(admin_->Create(ProfileSchedules(), ns_, MinimalProfileSchedule("columns")).ok());

  CommandResult result = Kubectl({"get", "pj", "-n", ns_});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  EXPECT_THAT(HeaderWords(result.out),
              ElementsAre("NAME", "PHASE", "SUCCEEDED", "SKEW", "STRAGGLERS", "RUN", "AGE"));
  EXPECT_THAT(result.out,
              AllOf(HasSubstr("columns"), HasSubstr("PartiallySucceeded"), HasSubstr("3/4"),
                    HasSubstr("142us"), HasSubstr("trainer-2"), HasSubstr("2024_01_02_03_04_05")));

  result = Kubectl({"get", "profilejobs", "-n", ns_, "-o", "wide"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  EXPECT_THAT(HeaderWords(result.out), ElementsAre("NAME", "PHASE", "SUCCEEDED", "SKEW",
                                                   "STRAGGLERS", "RUN", "LOGDIR", "AGE"));
  EXPECT_THAT(result.out, HasSubstr("gs://my-bucket/tensorboard/llama"));

  result = Kubectl({"get", "psched", "-n", ns_});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  EXPECT_THAT(HeaderWords(result.out), ElementsAre("NAME", "SCHEDULE", "TIMEZONE", "SUSPEND",
                                                   "ACTIVE", "LAST", "SCHEDULE", "AGE"));
  EXPECT_THAT(result.out, AllOf(HasSubstr("*/30 * * * *"), HasSubstr("false")));

  // The category lists both kinds.
  result = Kubectl({"get", "clusterprof", "-n", ns_, "-o", "name"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  EXPECT_THAT(result.out, AllOf(HasSubstr("profilejob.clusterprof.io/columns"),
                                HasSubstr("profileschedule.clusterprof.io/columns")));
}

TEST_F(CrdApplyTest, KubectlExplainShowsTheDescriptions) {
  CommandResult result = Kubectl({"explain", "profilejob.spec.targets"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  EXPECT_THAT(result.out, AllOf(HasSubstr("Which profiler servers capture"), HasSubstr("selector"),
                                HasSubstr("addresses"), HasSubstr("minReady")));
  result = Kubectl({"explain", "profilejob.spec.durationMs"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  EXPECT_THAT(result.out, HasSubstr("How long every target traces"));
  result = Kubectl({"explain", "profileschedule.spec.concurrencyPolicy"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  EXPECT_THAT(result.out, HasSubstr("one capture at a time"));
}

}  // namespace
}  // namespace clusterprof::kube
