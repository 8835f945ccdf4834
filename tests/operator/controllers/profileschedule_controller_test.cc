// The ProfileSchedule controller's cases (profileschedule_cases.h) on the in-memory API: the
// same cases as profileschedule_integration_test, in milliseconds and with no server.
#include <thread>

#include "operator/kube/api_error.h"
#include "tests/operator/controllers/profileschedule_cases.h"
#include "tests/support/fake_api_client.h"

namespace clusterprof::controllers {
namespace {

class InMemoryApi : public ::testing::Test {
 protected:
  kube::ApiClient& Api() { return api_; }
  testing::FakeApiClient& fake() { return api_; }
  const std::string& Ns() const { return ns_; }
  Clock& InformerClock() { return api_clock_; }

  // The informers apply the fake's watch events on their own threads: look again until they
  // have (bounded by a guard, not a timing assertion).
  static bool Eventually(const std::function<bool()>& condition) {
    RealClock real;
    const int64_t guard = real.MonotonicNs() + 30 * kNanosPerSecond;
    while (!condition()) {
      if (real.MonotonicNs() > guard) return false;
      std::this_thread::yield();
    }
    return true;
  }

  // Creation times come from this clock (a few minutes into 2026).
  SimulatedClock api_clock_{SimulatedClock::kDefaultWallNs + 123 * kNanosPerSecond};
  testing::FakeApiClient api_{&api_clock_};
  std::string ns_ = "team";
};

using ProfileScheduleControllerTest = ScheduleFixture<InMemoryApi>;

}  // namespace
}  // namespace clusterprof::controllers

#define CLUSTERPROF_SCHEDULE_TEST ProfileScheduleControllerTest
#include "tests/operator/controllers/profileschedule_cases.h"

namespace clusterprof::controllers {
namespace {

// Cases only the in-memory API can stage.
TEST_F(ProfileScheduleControllerTest,
       AConflictingStatusWriteIsReturnedAndTheRetryCreatesNothingTwice) {
  value spec = value::object();
  spec["schedule"] = value::string("*/5 * * * *");
  CreateSchedule("conflict", spec);
  fake().FailNext("update", "profileschedules", 409, 1, "status");
  const absl::Status first = controller_->Reconcile(kube::ObjectKey(Ns(), name_));
  EXPECT_TRUE(kube::IsConflict(first)) << first;
  EXPECT_EQ(Children().size(), 1u) << "the job was created before the status write";
  // The requeued reconcile finds the job by its name and records it.
  WaitForCaches();
  Reconcile();
  EXPECT_EQ(Children().size(), 1u);
  EXPECT_EQ(Schedule().at("status").at("lastScheduleTime").as_string(),
            api::FormatTime(first_time_ns_));
  EXPECT_EQ(fake().CountActions("create", "profilejobs"), 1);
}

TEST_F(ProfileScheduleControllerTest, AFailedCreateIsReturnedForARetry) {
  value spec = value::object();
  spec["schedule"] = value::string("*/5 * * * *");
  CreateSchedule("unavailable", spec);
  fake().FailNext("create", "profilejobs", 503);
  EXPECT_TRUE(kube::IsRetryable(controller_->Reconcile(kube::ObjectKey(Ns(), name_))));
  EXPECT_TRUE(Children().empty());
  Reconcile();
  EXPECT_EQ(Children(), std::set<std::string>{ChildName(first_time_ns_)});
}

}  // namespace
}  // namespace clusterprof::controllers
