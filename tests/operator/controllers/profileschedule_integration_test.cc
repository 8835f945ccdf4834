// The ProfileSchedule controller's cases (profileschedule_cases.h) against a real API server
// with the CRDs installed.
#include "tests/operator/controllers/profileschedule_cases.h"
#include "tests/operator/crd_fixture.h"
#include "tests/operator/kube/kube_fixture.h"

namespace clusterprof::controllers {
namespace {

constexpr char kSourceDir[] = CLUSTERPROF_SOURCE_DIR;

class RealApiServer : public kube::KubeFixture {
 protected:
  // Whether the CRDs went in (NotFound: no kubectl on this machine).
  static inline absl::Status* crds_ = nullptr;

  static void SetUpTestSuite() {
    KubeFixture::SetUpTestSuite();
    if (plane_ == nullptr) return;
    crds_ = new absl::Status(
        testing::InstallCrds(*plane_, kSourceDir, plane_->dir() + "/admin.kubeconfig"));
  }

  void SetUp() override {
    KubeFixture::SetUp();
    if (!IsSkipped() && crds_ != nullptr && absl::IsNotFound(*crds_)) {
      GTEST_SKIP() << *crds_;
    }
    if (!IsSkipped() && crds_ != nullptr) {
      ASSERT_TRUE(crds_->ok()) << *crds_;
    }
  }

  kube::ApiClient& Api() { return *admin_; }
  const std::string& Ns() const { return ns_; }
  Clock& InformerClock() { return clock_; }

  RealClock clock_;
};

using ProfileScheduleIntegrationTest = ScheduleFixture<RealApiServer>;

}  // namespace
}  // namespace clusterprof::controllers

#define CLUSTERPROF_SCHEDULE_TEST ProfileScheduleIntegrationTest
#include "tests/operator/controllers/profileschedule_cases.h"
