// The real control plane that the operator's tests run against (tests/support/
// kube_control_plane.h): kube-apiserver and etcd on loopback, driven with kubectl and plain
// HTTPS. Skipped, with a message, where scripts/install-kube-control-plane has not installed
// the binaries; scripts/test installs them, so CI runs these.
#include <errno.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/kube_control_plane.h"
#include "tests/support/temp_dir.h"

// cpprestsdk's U() macro collides with gtest's templates unless turned off.
#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/json.h>

namespace clusterprof {
namespace {

using testing::CommandResult;
using ::testing::Contains;
using ::testing::HasSubstr;
using testing::HttpResponse;
using testing::KubeControlPlane;
using ::testing::Not;
using testing::WriteFileOrDie;

constexpr char kTestCrd[] = R"(apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.test.clusterprof.dev
spec:
  group: test.clusterprof.dev
  scope: Namespaced
  names:
    plural: widgets
    singular: widget
    kind: Widget
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources:
      status: {}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size:
                type: integer
                minimum: 1
          status:
            type: object
            properties:
              phase:
                type: string
)";

// spec.color is not in the schema: the server prunes it.
constexpr char kWidget[] = R"(apiVersion: test.clusterprof.dev/v1alpha1
kind: Widget
metadata:
  name: small
  namespace: widgets
spec:
  size: 3
  color: blue
)";

constexpr char kZeroWidget[] = R"(apiVersion: test.clusterprof.dev/v1alpha1
kind: Widget
metadata:
  name: empty
  namespace: widgets
spec:
  size: 0
)";

// Polls `condition` until it holds or `timeout` passes: for changes the API server applies
// asynchronously (RBAC's authorizer sees a new binding through its informer).
bool Eventually(const std::function<bool()>& condition,
                std::chrono::seconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}

web::json::value ParseJson(const std::string& text) {
  try {
    return web::json::value::parse(text);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON (" << e.what() << "): " << text;
    return web::json::value::null();
  }
}

std::string StringField(const web::json::value& object, const char* key) {
  if (!object.is_object() || !object.has_string_field(key)) return "";
  return object.at(key).as_string();
}

// One control plane for every test of the suite: a start takes seconds, and ctest runs the
// binary as one test (ONE_PROCESS in tests/CMakeLists.txt).
class ControlPlaneTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<KubeControlPlane>> plane = KubeControlPlane::Start();
    start_status_ = new absl::Status(plane.status());
    if (!plane.ok()) return;
    plane_ = plane->release();
    absl::StatusOr<std::string> kubectl = testing::FindProgram("kubectl");
    if (kubectl.ok()) kubectl_ = new std::string(*kubectl);
    admin_kubeconfig_ = new std::string(plane_->dir() + "/admin.kubeconfig");
    user_kubeconfig_ = new std::string(plane_->dir() + "/user.kubeconfig");
    *start_status_ = plane_->WriteKubeconfig(*admin_kubeconfig_, plane_->admin_token());
    if (start_status_->ok()) {
      *start_status_ = plane_->WriteKubeconfig(*user_kubeconfig_, plane_->user_token());
    }
  }

  static void TearDownTestSuite() {
    delete plane_;
    plane_ = nullptr;
    delete start_status_;
    start_status_ = nullptr;
    delete kubectl_;
    kubectl_ = nullptr;
    delete admin_kubeconfig_;
    admin_kubeconfig_ = nullptr;
    delete user_kubeconfig_;
    user_kubeconfig_ = nullptr;
  }

  void SetUp() override {
    if (absl::IsNotFound(*start_status_)) {
      GTEST_SKIP() << "no Kubernetes control plane to test against: " << *start_status_;
    }
    ASSERT_TRUE(start_status_->ok()) << *start_status_;
    if (kubectl_ == nullptr) GTEST_SKIP() << "kubectl is not on PATH";
  }

  void TearDown() override {
    if (plane_ != nullptr) {
      // A test that crashed the server would otherwise show up as failures of the next ones.
      EXPECT_EQ(kill(plane_->apiserver_pid(), 0), 0) << "kube-apiserver died; the end of its log:\n"
                                                     << plane_->ApiserverLogTail();
    }
  }

  // kubectl with `kubeconfig` and `args`; its own discovery cache, in the control plane's
  // directory.
  static CommandResult Kubectl(const std::string& kubeconfig, std::vector<std::string> args) {
    std::vector<std::string> argv = {*kubectl_,
                                     "--kubeconfig",
                                     kubeconfig,
                                     "--cache-dir",
                                     plane_->dir() + "/kubectl-cache",
                                     "--request-timeout=30s"};
    argv.insert(argv.end(), args.begin(), args.end());
    absl::StatusOr<CommandResult> result = testing::RunCommand(argv);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *std::move(result) : CommandResult{};
  }
  static CommandResult AdminKubectl(std::vector<std::string> args) {
    return Kubectl(*admin_kubeconfig_, std::move(args));
  }
  static CommandResult UserKubectl(std::vector<std::string> args) {
    return Kubectl(*user_kubeconfig_, std::move(args));
  }

  // Writes `text` into the control plane's directory; the path.
  static std::string WriteManifest(const std::string& name, const std::string& text) {
    std::string path = plane_->dir() + "/" + name;
    WriteFileOrDie(path, text);
    return path;
  }

  static inline KubeControlPlane* plane_ = nullptr;
  static inline absl::Status* start_status_ = nullptr;
  static inline std::string* kubectl_ = nullptr;
  static inline std::string* admin_kubeconfig_ = nullptr;
  static inline std::string* user_kubeconfig_ = nullptr;
};

// Prints what kubectl said when it failed.
std::string Describe(const CommandResult& result) {
  return StrCat("exit code ", result.exit_code, "\nstdout: ", result.out, "\nstderr: ", result.err);
}

TEST_F(ControlPlaneTest, KubectlListsTheBuiltInNamespaces) {
  const CommandResult result =
      AdminKubectl({"get", "namespaces", "-o", "jsonpath={.items[*].metadata.name}"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  std::vector<std::string> names;
  for (std::string_view name : SplitSkipEmpty(result.out, ' ')) names.emplace_back(name);
  EXPECT_THAT(names, Contains("default"));
  EXPECT_THAT(names, Contains("kube-system"));
}

TEST_F(ControlPlaneTest, KubectlCreatesANamespaceAndAConfigMap) {
  CommandResult result = AdminKubectl({"create", "namespace", "settings"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  result =
      AdminKubectl({"create", "configmap", "tuning", "-n", "settings", "--from-literal=mode=fast"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);

  result =
      AdminKubectl({"get", "configmap", "tuning", "-n", "settings", "-o", "jsonpath={.data.mode}"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  EXPECT_EQ(result.out, "fast");

  // The same object over plain HTTPS, verified against the generated CA.
  absl::StatusOr<HttpResponse> response =
      plane_->Get("/api/v1/namespaces/settings/configmaps/tuning", plane_->admin_token());
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->status_code, 200) << response->body;
  const web::json::value config_map = ParseJson(response->body);
  EXPECT_EQ(StringField(config_map, "kind"), "ConfigMap");
  ASSERT_TRUE(config_map.has_object_field("data")) << response->body;
  EXPECT_EQ(StringField(config_map.at("data"), "mode"), "fast");
}

TEST_F(ControlPlaneTest, ARestartedApiServerKeepsItsPortAndEtcdsObjects) {
  const std::string url = plane_->url();
  const pid_t before = plane_->apiserver_pid();
  ASSERT_EQ(AdminKubectl({"create", "namespace", "survives-restart"}).exit_code, 0);
  ASSERT_TRUE(plane_->RestartApiserver().ok());
  EXPECT_EQ(plane_->url(), url);
  EXPECT_NE(plane_->apiserver_pid(), before);
  absl::StatusOr<HttpResponse> response =
      plane_->Get("/api/v1/namespaces/survives-restart", plane_->admin_token());
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status_code, 200) << response->body;
}

TEST_F(ControlPlaneTest, UnknownTokenIsUnauthorized) {
  absl::StatusOr<HttpResponse> response = plane_->Get("/api/v1/namespaces", "not-a-token");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status_code, 401) << response->body;
}

TEST_F(ControlPlaneTest, RbacForbidsTheUnprivilegedUserUntilARoleIsBound) {
  absl::StatusOr<HttpResponse> response =
      plane_->Get("/api/v1/namespaces/default/pods", plane_->user_token());
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->status_code, 403) << response->body;
  const web::json::value status = ParseJson(response->body);
  EXPECT_EQ(StringField(status, "kind"), "Status");
  EXPECT_EQ(StringField(status, "reason"), "Forbidden");
  EXPECT_THAT(StringField(status, "message"), HasSubstr(StrCat("User \"", KubeControlPlane::kUser,
                                                               "\" cannot list resource "
                                                               "\"pods\"")));

  CommandResult result = UserKubectl({"get", "pods", "-n", "default"});
  EXPECT_NE(result.exit_code, 0) << Describe(result);
  EXPECT_THAT(result.err, HasSubstr("Forbidden"));

  // A Role bound in one namespace opens that namespace only.
  result = AdminKubectl({"create", "namespace", "readable"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  result = AdminKubectl({"create", "role", "pod-reader", "-n", "readable", "--verb=get,list,watch",
                         "--resource=pods"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  result = AdminKubectl({"create", "rolebinding", "pod-reader", "-n", "readable",
                         "--role=pod-reader", StrCat("--user=", KubeControlPlane::kUser)});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);

  EXPECT_TRUE(Eventually([] {
    absl::StatusOr<HttpResponse> allowed =
        plane_->Get("/api/v1/namespaces/readable/pods", plane_->user_token());
    return allowed.ok() && allowed->status_code == 200;
  })) << "the user still cannot list pods in the namespace with the binding";
  result = UserKubectl({"get", "pods", "-n", "readable"});
  EXPECT_EQ(result.exit_code, 0) << Describe(result);

  response = plane_->Get("/api/v1/namespaces/default/pods", plane_->user_token());
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status_code, 403) << response->body;
}

TEST_F(ControlPlaneTest, CustomResourceWithStructuralSchemaAndStatusSubresource) {
  CommandResult result = AdminKubectl({"apply", "-f", WriteManifest("crd.yaml", kTestCrd)});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  result = AdminKubectl(
      {"wait", "--for=condition=Established", "--timeout=60s", "crd/widgets.test.clusterprof.dev"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  result = AdminKubectl({"create", "namespace", "widgets"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);

  // --validate=false: the unknown field reaches the server, which prunes it. (Creating a custom
  // resource is also where a kube-apiserver built with the old vendored reflect2 crashes.)
  result = AdminKubectl({"apply", "--validate=false", "-f", WriteManifest("widget.yaml", kWidget)});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  result = AdminKubectl({"get", "widget", "small", "-n", "widgets", "-o", "json"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  web::json::value widget = ParseJson(result.out);
  ASSERT_TRUE(widget.has_object_field("spec")) << result.out;
  EXPECT_EQ(widget.at("spec").at("size").as_integer(), 3);
  EXPECT_FALSE(widget.at("spec").has_field("color")) << "not pruned: " << result.out;

  // The schema's minimum is enforced by the server.
  result = AdminKubectl(
      {"apply", "--validate=false", "-f", WriteManifest("zero-widget.yaml", kZeroWidget)});
  EXPECT_NE(result.exit_code, 0) << Describe(result);
  EXPECT_THAT(result.err, HasSubstr("spec.size"));

  // Status is written through the subresource only.
  result = AdminKubectl({"patch", "widget", "small", "-n", "widgets", "--subresource=status",
                         "--type=merge", "-p", R"({"status":{"phase":"Ready"}})"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  result = AdminKubectl({"patch", "widget", "small", "-n", "widgets", "--type=merge", "-p",
                         R"({"status":{"phase":"Broken"}})"});
  EXPECT_EQ(result.exit_code, 0) << Describe(result);
  result =
      AdminKubectl({"get", "widget", "small", "-n", "widgets", "-o", "jsonpath={.status.phase}"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  EXPECT_EQ(result.out, "Ready");

  result = AdminKubectl({"delete", "widget", "small", "-n", "widgets"});
  EXPECT_EQ(result.exit_code, 0) << Describe(result);
  result = AdminKubectl({"get", "widgets", "-n", "widgets", "-o", "name"});
  ASSERT_EQ(result.exit_code, 0) << Describe(result);
  EXPECT_THAT(result.out, Not(HasSubstr("small")));
}

TEST(KubeControlPlaneLifecycleTest, DestructionStopsBothProcessesAndRemovesTheDirectory) {
  absl::StatusOr<std::unique_ptr<KubeControlPlane>> plane = KubeControlPlane::Start();
  if (absl::IsNotFound(plane.status())) {
    GTEST_SKIP() << "no Kubernetes control plane to test against: " << plane.status();
  }
  ASSERT_TRUE(plane.ok()) << plane.status();
  const pid_t apiserver = (*plane)->apiserver_pid();
  const pid_t etcd = (*plane)->etcd_pid();
  const std::string dir = (*plane)->dir();
  EXPECT_EQ(kill(apiserver, 0), 0);
  EXPECT_EQ(kill(etcd, 0), 0);

  plane->reset();
  // Both were children of this process, reaped by the destructor: the pids are gone.
  EXPECT_EQ(kill(apiserver, 0), -1);
  EXPECT_EQ(errno, ESRCH);
  EXPECT_EQ(kill(etcd, 0), -1);
  EXPECT_EQ(errno, ESRCH);
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// Sets an environment variable for the scope; restores the old value (or its absence) after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = getenv(name); old != nullptr) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_.has_value()) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

void WriteExecutable(const std::string& path) {
  WriteFileOrDie(path, "#!/bin/sh\n");
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
}

TEST(FindKubeApiserverTest, TakesTheNewestVersionInTheCacheAndSkipsBuildDirectories) {
  testing::TempDir cache;
  WriteExecutable(cache.Join("kube-1.20.5+really1.20.2-1.1+deb12u9/kube-apiserver"));
  WriteExecutable(cache.Join("kube-1.20.5+really1.20.2-1.1+deb12u10/kube-apiserver"));
  WriteExecutable(cache.Join("kube-1.20.5+really1.20.2-1.1+deb12u11.build/kube-apiserver"));
  // Not executable: an interrupted copy.
  WriteFileOrDie(cache.Join("kube-1.20.5+really1.20.2-1.1+deb12u12/kube-apiserver"), "");
  ScopedEnv no_override("CLUSTERPROF_KUBE_APISERVER", "");
  ScopedEnv cache_dir("CLUSTERPROF_KUBE_CACHE", cache.path());

  absl::StatusOr<std::string> found = testing::FindKubeApiserver();
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, cache.Join("kube-1.20.5+really1.20.2-1.1+deb12u10/kube-apiserver"));
}

TEST(FindKubeApiserverTest, NamesTheInstallScriptWhenThereIsNone) {
  testing::TempDir cache;
  ScopedEnv no_override("CLUSTERPROF_KUBE_APISERVER", "");
  ScopedEnv cache_dir("CLUSTERPROF_KUBE_CACHE", cache.path());
  ScopedEnv path("PATH", cache.path());

  absl::StatusOr<std::string> found = testing::FindKubeApiserver();
  EXPECT_TRUE(absl::IsNotFound(found.status())) << found.status();
  EXPECT_THAT(std::string(StdView(found.status().message())),
              HasSubstr("scripts/install-kube-control-plane"));
}

TEST(FindKubeApiserverTest, AnExplicitPathThatIsNotExecutableIsAnError) {
  ScopedEnv apiserver("CLUSTERPROF_KUBE_APISERVER", "/nonexistent/kube-apiserver");
  absl::StatusOr<std::string> found = testing::FindKubeApiserver();
  EXPECT_EQ(found.status().code(), absl::StatusCode::kFailedPrecondition) << found.status();
}

}  // namespace
}  // namespace clusterprof
