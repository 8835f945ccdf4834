// A gtest fixture for the Kubernetes client's tests against a real control plane
// (tests/support/kube_control_plane.h): one control plane per test binary (a start takes
// seconds; register the binary ONE_PROCESS), REST clients for the admin and the unprivileged
// user, and a fresh namespace per test so tests never see each other's objects. Skips, with the
// reason, where the control plane's binaries are not installed.
#ifndef CLUSTERPROF_TESTS_OPERATOR_KUBE_KUBE_FIXTURE_H_
#define CLUSTERPROF_TESTS_OPERATOR_KUBE_KUBE_FIXTURE_H_

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "gtest/gtest.h"
#include "operator/kube/config.h"
#include "operator/kube/resource.h"
#include "operator/kube/rest_client.h"
#include "tests/support/kube_control_plane.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::kube {

class KubeFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { StartPlane({}); }

  // For suites that need other server flags: call from their own SetUpTestSuite.
  static void StartPlane(const testing::KubeControlPlaneOptions& options) {
    absl::StatusOr<std::unique_ptr<testing::KubeControlPlane>> plane =
        testing::KubeControlPlane::Start(options);
    start_status_ = new absl::Status(plane.status());
    if (plane.ok()) plane_ = plane->release();
  }

  static void TearDownTestSuite() {
    delete plane_;
    plane_ = nullptr;
    delete start_status_;
    start_status_ = nullptr;
  }

  void SetUp() override {
    if (absl::IsNotFound(*start_status_)) {
      GTEST_SKIP() << "no Kubernetes control plane to test against: " << *start_status_;
    }
    ASSERT_TRUE(start_status_->ok()) << *start_status_;
    admin_ = NewClient(plane_->admin_token(), Unlimited());
    ASSERT_NE(admin_, nullptr);
    ns_ = NewNamespace();
  }

  void TearDown() override {
    if (plane_ != nullptr) {
      EXPECT_EQ(kill(plane_->apiserver_pid(), 0), 0) << "kube-apiserver died; the end of its log:\n"
                                                     << plane_->ApiserverLogTail();
    }
  }

  // The config of a client that reaches the control plane with `token`.
  static RestConfig ConfigFor(const std::string& token) {
    RestConfig config;
    config.server = plane_->url();
    config.ca_pem = testing::ReadFileOrDie(plane_->ca_file());
    config.token = StaticToken(token);
    config.description = "the test control plane";
    return config;
  }

  // Tests write thousands of objects: no client-side rate limit.
  static RestClientOptions Unlimited() {
    RestClientOptions options;
    options.qps = 0;
    return options;
  }

  std::unique_ptr<RestClient> NewClient(const std::string& token, RestClientOptions options = {}) {
    absl::StatusOr<std::unique_ptr<RestClient>> client =
        RestClient::Create(ConfigFor(token), &clock_, options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Creates a namespace named after the running test; returns its name.
  std::string NewNamespace() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = StrCat("t", ++namespaces_, "-", info->name());
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) {
      return std::isalnum(c) ? static_cast<char>(std::tolower(c)) : '-';
    });
    if (name.size() > 60) name.resize(60);
    while (!name.empty() && name.back() == '-') name.pop_back();
    web::json::value object = web::json::value::object();
    object["metadata"]["name"] = web::json::value(name);
    absl::StatusOr<web::json::value> created = admin_->Create(Namespaces(), "", object);
    EXPECT_TRUE(created.ok()) << created.status();
    return name;
  }

  // A ConfigMap object named `name` with `data` under key "v".
  static web::json::value ConfigMap(const std::string& name, const std::string& data = "") {
    web::json::value object = web::json::value::object();
    object["metadata"]["name"] = web::json::value(name);
    object["data"]["v"] = web::json::value(data);
    return object;
  }

  // Polls `condition` (wall time; for changes the server applies asynchronously).
  static bool Eventually(const std::function<bool()>& condition,
                         std::chrono::seconds timeout = std::chrono::seconds(30)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!condition()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  static inline testing::KubeControlPlane* plane_ = nullptr;
  static inline absl::Status* start_status_ = nullptr;
  static inline int namespaces_ = 0;

  RealClock clock_;
  std::unique_ptr<RestClient> admin_;
  std::string ns_;
};

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_TESTS_OPERATOR_KUBE_KUBE_FIXTURE_H_
