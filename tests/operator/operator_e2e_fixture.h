// The operator end to end, as tests/operator/operator_e2e_test.cc and the kubectl plugin's tests
// run it: a real kube-apiserver (tests/support) with the CRDs applied, pods created and set
// Running/Ready at 127.0.0.1 with per-pod port annotations, a real clusterprof-sidecar beside an
// annotating workload for each pod, and clusterprof-operator processes.
// Needs the compile definitions CLUSTERPROF_SOURCE_DIR, CLUSTERPROF_OPERATOR_PATH,
// CLUSTERPROF_SIDECAR_PATH, CLUSTERPROF_TEST_ANNOTATOR_PATH and CLUSTERPROF_TRAIN_LOOP_PATH.
#ifndef CLUSTERPROF_TESTS_OPERATOR_OPERATOR_E2E_FIXTURE_H_
#define CLUSTERPROF_TESTS_OPERATOR_OPERATOR_E2E_FIXTURE_H_

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/base/strings.h"
#include "cpprest/json.h"
#include "gtest/gtest.h"
#include "operator/api/types.h"
#include "tests/operator/crd_fixture.h"
#include "tests/operator/kube/kube_fixture.h"
#include "tests/operator/local_host.h"
#include "tests/support/local_http.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace clusterprof {

namespace e2e_fixture {
using testing::HttpGet;
using testing::Subprocess;
using testing::TempDir;
using web::json::value;
constexpr char kSourceDir[] = CLUSTERPROF_SOURCE_DIR;
constexpr char kOperator[] = CLUSTERPROF_OPERATOR_PATH;
constexpr char kSidecar[] = CLUSTERPROF_SIDECAR_PATH;
constexpr char kAnnotator[] = CLUSTERPROF_TEST_ANNOTATOR_PATH;
constexpr char kTrainLoop[] = CLUSTERPROF_TRAIN_LOOP_PATH;

// A pod's sidecar and workload, as local processes.
class Host : public testing::LocalHost {
 public:
  Host(const TempDir& root, const std::string& name, const std::string& logs,
       std::vector<std::string> workload = {})
      : LocalHost(root, name, logs, kSidecar, kAnnotator, {}, std::move(workload)) {}
};

// A clusterprof-operator process.
class OperatorProcess {
 public:
  OperatorProcess(const TempDir& root, const std::string& name, const std::string& kubeconfig,
                  const std::string& ns, std::vector<std::string> extra = {})
      : log_(root.Join(StrCat("operator-", name, ".log"))),
        port_file_(root.Join(StrCat("operator-", name, ".ports"))) {
    std::vector<std::string> argv = {
        kOperator,     "--kubeconfig",     kubeconfig,    "--namespace", ns,
        "--port-file", port_file_,         "--log-level", "debug",       "--retry-backoff-ms",
        "300",         "--health-address", "127.0.0.1"};
    if (std::find(extra.begin(), extra.end(), "--health-port") == extra.end()) {
      argv.insert(argv.end(), {"--health-port", "0"});
    }
    if (std::find(extra.begin(), extra.end(), "--log-format") == extra.end()) {
      argv.insert(argv.end(), {"--log-format", "text"});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    process_ = std::make_unique<Subprocess>(argv, std::map<std::string, std::string>{}, log_);
  }
  void Kill() { process_->Signal(SIGKILL), process_->Wait(); }
  void Terminate() {
    process_->Signal(SIGTERM);
    process_->Wait(std::chrono::seconds(60));
  }
  bool running() { return process_->running(); }
  std::optional<int> Wait(std::chrono::milliseconds timeout) { return process_->Wait(timeout); }
  std::string Log() const { return testing::ReadFileOrDie(log_); }
  // GET on the operator's health server ("" until it serves).
  std::string Http(const std::string& path) const {
    if (!testing::FileExists(port_file_)) return "";
    return HttpGet(testing::ReadPortFile(port_file_)["http"], path);
  }

 private:
  std::string log_;
  std::string port_file_;
  std::unique_ptr<Subprocess> process_;
};

class OperatorE2eTest : public kube::KubeFixture {
 protected:
  // Whether the CRDs went in (NotFound: no kubectl on this machine).
  static inline absl::Status* crds_ = nullptr;

  static void SetUpTestSuite() {
    KubeFixture::SetUpTestSuite();
    if (plane_ == nullptr) return;
    kubeconfig_ = new std::string(plane_->dir() + "/admin.kubeconfig");
    crds_ = new absl::Status(testing::InstallCrds(*plane_, kSourceDir, *kubeconfig_));
  }

  void SetUp() override {
    KubeFixture::SetUp();
    if (!IsSkipped() && crds_ != nullptr && absl::IsNotFound(*crds_)) {
      GTEST_SKIP() << *crds_;
    }
    if (!IsSkipped() && crds_ != nullptr) {
      ASSERT_TRUE(crds_->ok()) << *crds_;
    }
    if (IsSkipped()) return;
    logs_ = root_.Join("logs");
  }

  void TearDown() override {
    if (HasFailure()) {
      for (const std::string& log : testing::ListFilesRecursively(root_.path())) {
        if (log.find("operator-") != std::string::npos && EndsWith(log, ".log")) {
          std::cerr << "---- " << log << " ----\n"
                    << testing::ReadFileOrDie(root_.Join(log)) << "\n";
        }
      }
    }
    KubeFixture::TearDown();
  }

  // Starts a sidecar and workload per name.
  std::vector<std::unique_ptr<Host>> StartHosts(const std::vector<std::string>& names) {
    std::vector<std::unique_ptr<Host>> hosts;
    for (const std::string& name : names)
      hosts.push_back(std::make_unique<Host>(root_, name, logs_));
    return hosts;
  }

  // Creates a pod labelled app=<app> and sets it Running and Ready at 127.0.0.1, with its
  // sidecar's port in the clusterprof.io/port annotation.
  void CreateRunningPod(const std::string& name, int port, const std::string& app = "trainer") {
    value pod = value::object();
    pod["metadata"]["name"] = value::string(name);
    pod["metadata"]["labels"]["app"] = value::string(app);
    pod["metadata"]["annotations"]["clusterprof.io/port"] = value::string(std::to_string(port));
    pod["spec"]["nodeName"] = value::string("node-a");
    pod["spec"]["containers"][0]["name"] = value::string("trainer");
    pod["spec"]["containers"][0]["image"] = value::string("trainer:latest");
    absl::StatusOr<value> created = admin_->Create(kube::Pods(), ns_, pod);
    ASSERT_TRUE(created.ok()) << created.status();
    value status = value::object();
    status["phase"] = value::string("Running");
    status["podIP"] = value::string("127.0.0.1");
    status["hostIP"] = value::string("127.0.0.1");
    status["conditions"][0]["type"] = value::string("Ready");
    status["conditions"][0]["status"] = value::string("True");
    (*created)["status"] = status;
    absl::StatusOr<value> updated = admin_->UpdateStatus(kube::Pods(), ns_, *created);
    ASSERT_TRUE(updated.ok()) << updated.status();
  }

  value JobSpec(int64_t duration_ms = 1000, int64_t delay_ms = 500) {
    value spec = value::object();
    spec["targets"]["selector"]["matchLabels"]["app"] = value::string("trainer");
    spec["durationMs"] = value::number(duration_ms);
    spec["delayMs"] = value::number(delay_ms);
    spec["logdir"] = value::string(logs_);
    spec["tracingAttempts"] = value::number(2);
    return spec;
  }

  absl::StatusOr<value> CreateJob(const std::string& name, const value& spec) {
    value job = value::object();
    job["metadata"]["name"] = value::string(name);
    job["spec"] = spec;
    return admin_->Create(api::ProfileJobs(), ns_, job);
  }

  value GetJob(const std::string& name) {
    absl::StatusOr<value> job = admin_->Get(api::ProfileJobs(), ns_, name);
    return job.ok() ? *job : value::null();
  }

  static std::string Phase(const value& job) {
    if (!job.is_object() || !job.has_field("status") || !job.at("status").has_field("phase")) {
      return "";
    }
    return job.at("status").at("phase").as_string();
  }

  // Waits for the job to reach one of `phases`; returns the job.
  value WaitForPhase(const std::string& name, const std::set<std::string>& phases,
                     std::chrono::seconds timeout = std::chrono::seconds(90)) {
    value job;
    const bool reached = Eventually(
        [&] {
          job = GetJob(name);
          return phases.count(Phase(job)) > 0;
        },
        timeout);
    EXPECT_TRUE(reached) << "job " << name << " is " << Phase(job) << ": " << job.serialize();
    return job;
  }

  value WaitForFinish(const std::string& name) {
    return WaitForPhase(name, {"Succeeded", "PartiallySucceeded", "Failed"});
  }

  // The events about `name`: reason -> messages.
  std::multimap<std::string, std::string> Events(const std::string& name) {
    std::multimap<std::string, std::string> events;
    kube::ListOptions options;
    options.field_selector = StrCat("involvedObject.name=", name);
    absl::StatusOr<kube::ObjectList> listed = admin_->List(kube::Events(), ns_, options);
    if (!listed.ok()) return events;
    for (const value& event : listed->items) {
      events.emplace(event.at("reason").as_string(), event.at("message").as_string());
    }
    return events;
  }

  std::unique_ptr<OperatorProcess> StartOperator(const std::string& name,
                                                 std::vector<std::string> extra = {},
                                                 const std::string& kubeconfig = "") {
    return std::make_unique<OperatorProcess>(
        root_, name, kubeconfig.empty() ? *kubeconfig_ : kubeconfig, ns_, std::move(extra));
  }

  static const value& Target(const value& job, const std::string& name) {
    static const value kNull;
    for (const value& target : job.at("status").at("targets").as_array()) {
      if (target.at("name").as_string() == name) return target;
    }
    ADD_FAILURE() << "no target " << name << " in " << job.serialize();
    return kNull;
  }

  static inline std::string* kubeconfig_ = nullptr;
  TempDir root_;
  std::string logs_;
};

}  // namespace e2e_fixture
using e2e_fixture::Host;
using e2e_fixture::kAnnotator;
using e2e_fixture::kOperator;
using e2e_fixture::kSidecar;
using e2e_fixture::kSourceDir;
using e2e_fixture::kTrainLoop;
using e2e_fixture::OperatorE2eTest;
using e2e_fixture::OperatorProcess;

}  // namespace clusterprof

#endif  // CLUSTERPROF_TESTS_OPERATOR_OPERATOR_E2E_FIXTURE_H_
