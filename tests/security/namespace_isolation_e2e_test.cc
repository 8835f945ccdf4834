// A ProfileJob reaches only the pods of its own namespace (docs/security.md, "A user with
// ProfileJob rights in one namespace"). The operator binary watches every namespace, as the
// chart's ClusterRoleBinding lets it, against a real kube-apiserver (tests/support); two
// namespaces hold a pod of the same name with the same labels, each with a real sidecar of its
// own; a third holds none. A job in one namespace captures that namespace's pod only: the other
// sidecar is never called for a capture. A job in the empty namespace finds nothing, however
// many pods elsewhere match its selector.
#include <memory>
#include <string>
#include <vector>

#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/api/types.h"
#include "tests/operator/operator_e2e_fixture.h"
#include "tests/support/temp_dir.h"

namespace clusterprof {
namespace {

using ::testing::HasSubstr;
using web::json::value;

class NamespaceIsolationTest : public OperatorE2eTest {
 protected:
  // A pod named `name`, labelled app=trainer, Running and Ready at 127.0.0.1 in `ns`, whose
  // sidecar listens on `port`.
  void CreateRunningPodIn(const std::string& ns, const std::string& name, int port) {
    value pod = value::object();
    pod["metadata"]["name"] = value::string(name);
    pod["metadata"]["labels"]["app"] = value::string("trainer");
    pod["metadata"]["annotations"]["clusterprof.io/port"] = value::string(std::to_string(port));
    pod["spec"]["nodeName"] = value::string("node-a");
    pod["spec"]["containers"][0]["name"] = value::string("trainer");
    pod["spec"]["containers"][0]["image"] = value::string("trainer:latest");
    absl::StatusOr<value> created = admin_->Create(kube::Pods(), ns, pod);
    ASSERT_TRUE(created.ok()) << created.status();
    value status = value::object();
    status["phase"] = value::string("Running");
    status["podIP"] = value::string("127.0.0.1");
    status["hostIP"] = value::string("127.0.0.1");
    status["conditions"][0]["type"] = value::string("Ready");
    status["conditions"][0]["status"] = value::string("True");
    (*created)["status"] = status;
    ASSERT_TRUE(admin_->UpdateStatus(kube::Pods(), ns, *created).ok());
  }

  // Creates a ProfileJob selecting app=trainer in `ns` and waits for its end.
  value RunJob(const std::string& ns, const std::string& name, const std::string& run) {
    value spec = JobSpec();
    spec["runName"] = value::string(run);
    spec["tracingAttempts"] = value::number(1);
    spec["targets"]["waitSeconds"] = value::number(0);
    value job = value::object();
    job["metadata"]["name"] = value::string(name);
    job["spec"] = spec;
    EXPECT_TRUE(admin_->Create(api::ProfileJobs(), ns, job).ok());
    value got;
    EXPECT_TRUE(Eventually(
        [&] {
          absl::StatusOr<value> current = admin_->Get(api::ProfileJobs(), ns, name);
          if (!current.ok()) return false;
          got = *current;
          const std::string phase = Phase(got);
          return phase == "Succeeded" || phase == "PartiallySucceeded" || phase == "Failed";
        },
        std::chrono::seconds(90)))
        << ns << "/" << name << ": " << got.serialize();
    return got;
  }
};

TEST_F(NamespaceIsolationTest, AProfileJobCapturesOnlyThePodsOfItsOwnNamespace) {
  const std::string team_a = ns_;
  const std::string team_b = NewNamespace();
  const std::string empty = NewNamespace();
  // The same pod in two namespaces: same name, same labels, each with its own sidecar.
  Host sidecar_a(root_, "a-trainer-0", logs_);
  Host sidecar_b(root_, "b-trainer-0", logs_);
  CreateRunningPodIn(team_a, "trainer-0", sidecar_a.port());
  CreateRunningPodIn(team_b, "trainer-0", sidecar_b.port());
  // Every namespace, as the chart's ClusterRoleBinding has it.
  OperatorProcess op(root_, "all-namespaces", *kubeconfig_, /*ns=*/"");

  const value job_a = RunJob(team_a, "capture", "team_a_run");
  ASSERT_EQ(Phase(job_a), "Succeeded") << job_a.serialize() << "\n" << op.Log();
  ASSERT_EQ(job_a.at("status").at("targets").size(), 1u) << job_a.serialize();
  EXPECT_EQ(job_a.at("status").at("targets").at(0).at("address").as_string(),
            StrCat("127.0.0.1:", sidecar_a.port()));
  EXPECT_EQ(sidecar_a.Captures(), 1);
  EXPECT_EQ(sidecar_b.Captures(), 0) << "team B's sidecar captured for team A's job";
  EXPECT_TRUE(
      testing::FileExists(StrCat(logs_, "/plugins/profile/team_a_run/trainer-0.xplane.pb")));

  const value job_b = RunJob(team_b, "capture", "team_b_run");
  ASSERT_EQ(Phase(job_b), "Succeeded") << job_b.serialize() << "\n" << op.Log();
  ASSERT_EQ(job_b.at("status").at("targets").size(), 1u) << job_b.serialize();
  EXPECT_EQ(job_b.at("status").at("targets").at(0).at("address").as_string(),
            StrCat("127.0.0.1:", sidecar_b.port()));
  EXPECT_EQ(sidecar_a.Captures(), 1) << "team A's sidecar captured for team B's job";
  EXPECT_EQ(sidecar_b.Captures(), 1);

  // A namespace without such pods: nothing, though two namespaces have matching ones.
  const value job_empty = RunJob(empty, "capture", "empty_run");
  ASSERT_EQ(Phase(job_empty), "Failed") << job_empty.serialize();
  EXPECT_THAT(job_empty.at("status").at("message").as_string(),
              HasSubstr(StrCat("no pods in namespace ", empty)));
  EXPECT_EQ(sidecar_a.Captures(), 1);
  EXPECT_EQ(sidecar_b.Captures(), 1);
  EXPECT_FALSE(testing::FileExists(StrCat(logs_, "/plugins/profile/empty_run")));
}

}  // namespace
}  // namespace clusterprof
