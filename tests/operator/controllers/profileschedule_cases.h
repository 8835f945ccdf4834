// The ProfileSchedule controller's cases, run twice: against the in-memory API
// (profileschedule_controller_test.cc, a unit test) and against a real API server
// (profileschedule_integration_test.cc). The controller's time is a SimulatedClock; each case
// reconciles at chosen instants and plays the ProfileJob controller itself (writing the
// children's phases), so CronJob semantics are checked minute by minute without waiting.
//
// Include it after defining CLUSTERPROF_SCHEDULE_TEST as a ScheduleFixture<Backend>, where
// Backend is a gtest fixture with Api() (kube::ApiClient&), Ns(), InformerClock() and
// Eventually(condition).
#ifndef CLUSTERPROF_TESTS_OPERATOR_CONTROLLERS_PROFILESCHEDULE_CASES_H_
#define CLUSTERPROF_TESTS_OPERATOR_CONTROLLERS_PROFILESCHEDULE_CASES_H_

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/api/types.h"
#include "operator/controllers/profileschedule_controller.h"
#include "operator/kube/informer.h"

namespace clusterprof::controllers {

inline constexpr int64_t kMinute = 60 * kNanosPerSecond;

template <typename Backend>
class ScheduleFixture : public Backend {
 protected:
  using value = web::json::value;

  void SetUp() override {
    Backend::SetUp();
    if (this->IsSkipped() || this->HasFatalFailure()) return;
    kube::InformerOptions options;
    options.namespace_ = this->Ns();
    options.type = api::ProfileSchedules();
    schedules_ = std::make_unique<kube::Informer>(&this->Api(), &this->InformerClock(), options);
    options.type = api::ProfileJobs();
    jobs_ = std::make_unique<kube::Informer>(&this->Api(), &this->InformerClock(), options);
    schedules_->Start();
    jobs_->Start();
    ASSERT_TRUE(schedules_->WaitForSync() && jobs_->WaitForSync());
  }

  void TearDown() override {
    controller_.reset();
    if (schedules_) schedules_->Stop();
    if (jobs_) jobs_->Stop();
    Backend::TearDown();
  }

  // Creates the schedule and starts the simulated clock 10 s after the first time of the
  // schedule after its creation.
  void CreateSchedule(const std::string& name, value spec) {
    name_ = name;
    value schedule = value::object();
    schedule["metadata"]["name"] = value::string(name);
    spec["jobTemplate"]["spec"]["targets"]["addresses"][0] = value::string("127.0.0.1:1");
    spec["jobTemplate"]["spec"]["logdir"] = value::string("/tmp/clusterprof-schedule-test");
    schedule["spec"] = spec;
    absl::StatusOr<value> created =
        this->Api().Create(api::ProfileSchedules(), this->Ns(), schedule);
    ASSERT_TRUE(created.ok()) << created.status();
    const int64_t creation =
        *api::ParseTime(created->at("metadata").at("creationTimestamp").as_string());
    // Schedules here are */5: the next whole 5 minutes after the creation.
    const int64_t five = 5 * kMinute;
    first_time_ns_ = (creation / five + 1) * five;
    sim_ = std::make_unique<SimulatedClock>(first_time_ns_ + 10 * kNanosPerSecond);
    controller_ = std::make_unique<ProfileScheduleController>(
        &this->Api(), sim_.get(), schedules_.get(), jobs_.get(), nullptr, nullptr);
    ASSERT_TRUE(this->Eventually([&] { return schedules_->Get(this->Ns(), name) != nullptr; }));
  }

  void Reconcile() {
    absl::Status status = controller_->Reconcile(kube::ObjectKey(this->Ns(), name_));
    kube::ObjectPtr cached = schedules_->Get(this->Ns(), name_);
    ASSERT_TRUE(status.ok()) << status << " at " << api::FormatTime(sim_->WallNs())
                             << "; the cached schedule is at resourceVersion "
                             << (cached ? cached->metadata.resource_version : "none") << ", "
                             << Schedule().at("metadata").at("resourceVersion").as_string()
                             << " on the server";
  }

  // The schedule's children on the server, by name.
  std::set<std::string> Children() {
    std::set<std::string> names;
    absl::StatusOr<kube::ObjectList> listed = this->Api().List(api::ProfileJobs(), this->Ns());
    EXPECT_TRUE(listed.ok());
    for (const value& job : listed->items) {
      names.insert(job.at("metadata").at("name").as_string());
    }
    return names;
  }

  std::string ChildName(int64_t time_ns) const {
    return StrCat(name_, "-", time_ns / kNanosPerSecond / 60);
  }

  value Schedule() { return *this->Api().Get(api::ProfileSchedules(), this->Ns(), name_); }

  // Plays the ProfileJob controller: sets the child's phase, then waits for both caches to see
  // every change.
  void Finish(const std::string& child, const std::string& phase) {
    absl::StatusOr<value> job = this->Api().Get(api::ProfileJobs(), this->Ns(), child);
    ASSERT_TRUE(job.ok()) << job.status();
    (*job)["status"]["phase"] = value::string(phase);
    (*job)["status"]["completionTime"] = value::string(api::FormatTime(sim_->WallNs()));
    ASSERT_TRUE(this->Api().UpdateStatus(api::ProfileJobs(), this->Ns(), *job).ok());
    WaitForCaches();
  }

  // Waits until the informers have caught up with the server.
  void WaitForCaches() {
    ASSERT_TRUE(this->Eventually([&] {
      absl::StatusOr<kube::ObjectList> listed = this->Api().List(api::ProfileJobs(), this->Ns());
      if (!listed.ok() || listed->items.size() != jobs_->List(this->Ns()).size()) return false;
      for (const value& job : listed->items) {
        kube::ObjectPtr cached = jobs_->Get(this->Ns(), job.at("metadata").at("name").as_string());
        if (cached == nullptr || cached->metadata.resource_version !=
                                     job.at("metadata").at("resourceVersion").as_string()) {
          return false;
        }
      }
      absl::StatusOr<value> schedule = this->Api().Get(api::ProfileSchedules(), this->Ns(), name_);
      kube::ObjectPtr cached = schedules_->Get(this->Ns(), name_);
      return schedule.ok() && cached != nullptr &&
             cached->metadata.resource_version ==
                 schedule->at("metadata").at("resourceVersion").as_string();
    }));
  }

  void AdvanceTo(int64_t wall_ns) { sim_->AdvanceNs(wall_ns - sim_->WallNs()); }

  std::unique_ptr<SimulatedClock> sim_;
  std::unique_ptr<kube::Informer> schedules_;
  std::unique_ptr<kube::Informer> jobs_;
  std::unique_ptr<ProfileScheduleController> controller_;
  std::string name_;
  int64_t first_time_ns_ = 0;
};

}  // namespace clusterprof::controllers

#endif  // CLUSTERPROF_TESTS_OPERATOR_CONTROLLERS_PROFILESCHEDULE_CASES_H_

// The cases (outside the include guard: each test file defines its own fixture name).
#ifdef CLUSTERPROF_SCHEDULE_TEST
namespace clusterprof::controllers {
namespace {

using web::json::value;

TEST_F(CLUSTERPROF_SCHEDULE_TEST, CreatesOneJobPerTimeNeverTwiceAndPrunesHistory) {
  value spec = value::object();
  spec["schedule"] = value::string("*/5 * * * *");
  spec["concurrencyPolicy"] = value::string("Allow");
  spec["successfulJobsHistoryLimit"] = value::number(2);
  spec["failedJobsHistoryLimit"] = value::number(1);
  spec["jobTemplate"]["metadata"]["labels"]["team"] = value::string("llm");
  CreateSchedule("every5", spec);

  Reconcile();
  const std::string first = ChildName(first_time_ns_);
  EXPECT_EQ(Children(), std::set<std::string>{first});
  absl::StatusOr<value> child = this->Api().Get(api::ProfileJobs(), this->Ns(), first);
  ASSERT_TRUE(child.ok());
  const value& metadata = child->at("metadata");
  EXPECT_EQ(metadata.at("labels").at("team").as_string(), "llm");
  EXPECT_EQ(metadata.at("labels").at("clusterprof.io/schedule").as_string(), "every5");
  EXPECT_EQ(metadata.at("annotations").at("clusterprof.io/scheduled-at").as_string(),
            api::FormatTime(first_time_ns_));
  EXPECT_EQ(metadata.at("ownerReferences").at(0).at("kind").as_string(), "ProfileSchedule");
  EXPECT_TRUE(metadata.at("ownerReferences").at(0).at("controller").as_bool());
  EXPECT_EQ(Schedule().at("status").at("lastScheduleTime").as_string(),
            api::FormatTime(first_time_ns_));
  EXPECT_EQ(Schedule().at("status").at("activeCount").as_integer(), 1);

  // Again at the same instant, and after a crash that lost lastScheduleTime: no second job.
  WaitForCaches();
  Reconcile();
  value schedule = Schedule();
  schedule["status"].erase("lastScheduleTime");
  ASSERT_TRUE(this->Api().UpdateStatus(api::ProfileSchedules(), this->Ns(), schedule).ok());
  WaitForCaches();
  Reconcile();
  EXPECT_EQ(Children().size(), 1u);

  // Five more times, every job succeeding: two are kept.
  std::vector<std::string> names = {first};
  for (int i = 1; i <= 5; ++i) {
    Finish(names.back(), "Succeeded");
    AdvanceTo(first_time_ns_ + i * 5 * kMinute + kNanosPerSecond);
    Reconcile();
    names.push_back(ChildName(first_time_ns_ + i * 5 * kMinute));
    WaitForCaches();
  }
  Finish(names.back(), "Succeeded");
  Reconcile();
  EXPECT_EQ(Children(), (std::set<std::string>{names[4], names[5]}));
  EXPECT_EQ(Schedule().at("status").at("lastSuccessfulTime").as_string(),
            api::FormatTime(sim_->WallNs()));

  // Failures: one is kept, beside the successes.
  for (int i = 6; i <= 7; ++i) {
    WaitForCaches();  // the last reconcile wrote the status: a stale cache would conflict
    AdvanceTo(first_time_ns_ + i * 5 * kMinute + kNanosPerSecond);
    Reconcile();
    names.push_back(ChildName(first_time_ns_ + i * 5 * kMinute));
    WaitForCaches();
    Finish(names.back(), "Failed");
  }
  Reconcile();
  EXPECT_EQ(Children(), (std::set<std::string>{names[4], names[5], names[7]}));
}

TEST_F(CLUSTERPROF_SCHEDULE_TEST, ForbidSkipsWhileAJobRunsThenRunsTheMissedTime) {
  value spec = value::object();
  spec["schedule"] = value::string("*/5 * * * *");
  spec["startingDeadlineSeconds"] = value::number(200);
  CreateSchedule("forbid", spec);  // Forbid is the default
  Reconcile();
  const std::string first = ChildName(first_time_ns_);
  WaitForCaches();

  // The next time comes while the first job still runs: skipped.
  AdvanceTo(first_time_ns_ + 5 * kMinute + kNanosPerSecond);
  Reconcile();
  EXPECT_EQ(Children(), std::set<std::string>{first});
  // The first job ends within the starting deadline of the skipped time: it runs now.
  Finish(first, "Succeeded");
  AdvanceTo(first_time_ns_ + 5 * kMinute + 100 * kNanosPerSecond);
  Reconcile();
  const std::string second = ChildName(first_time_ns_ + 5 * kMinute);
  EXPECT_EQ(Children(), (std::set<std::string>{first, second}));

  // A time whose starting deadline passed while a job ran is missed for good.
  WaitForCaches();
  AdvanceTo(first_time_ns_ + 10 * kMinute + kNanosPerSecond);
  Reconcile();
  Finish(second, "Succeeded");
  AdvanceTo(first_time_ns_ + 10 * kMinute + 250 * kNanosPerSecond);
  Reconcile();
  EXPECT_EQ(Children(), (std::set<std::string>{first, second}));
}

TEST_F(CLUSTERPROF_SCHEDULE_TEST, ReplaceDeletesTheActiveJobAndSuspendStopsNewOnes) {
  value spec = value::object();
  spec["schedule"] = value::string("*/5 * * * *");
  spec["concurrencyPolicy"] = value::string("Replace");
  CreateSchedule("replace", spec);
  Reconcile();
  const std::string first = ChildName(first_time_ns_);
  WaitForCaches();
  AdvanceTo(first_time_ns_ + 5 * kMinute + kNanosPerSecond);
  Reconcile();
  const std::string second = ChildName(first_time_ns_ + 5 * kMinute);
  EXPECT_EQ(Children(), std::set<std::string>{second}) << "the active job is replaced";

  value schedule = Schedule();
  schedule["spec"]["suspend"] = value::boolean(true);
  ASSERT_TRUE(this->Api().Update(api::ProfileSchedules(), this->Ns(), schedule).ok());
  WaitForCaches();
  AdvanceTo(first_time_ns_ + 10 * kMinute + kNanosPerSecond);
  Reconcile();
  EXPECT_EQ(Children(), std::set<std::string>{second}) << "suspended";
}

TEST_F(CLUSTERPROF_SCHEDULE_TEST, AnInvalidScheduleSaysWhatIsWrong) {
  value spec = value::object();
  spec["schedule"] = value::string("*/5 * * *");
  CreateSchedule("short", spec);
  Reconcile();
  const value condition = Schedule().at("status").at("conditions").at(0);
  EXPECT_EQ(condition.at("type").as_string(), "Valid");
  EXPECT_EQ(condition.at("status").as_string(), "False");
  EXPECT_THAT(condition.at("message").as_string(), ::testing::HasSubstr("spec.schedule"));
  EXPECT_TRUE(Children().empty());
}

TEST_F(CLUSTERPROF_SCHEDULE_TEST, AScheduleThatNeverFiresIsInvalid) {
  value spec = value::object();
  spec["schedule"] = value::string("0 0 30 2 *");
  CreateSchedule("february30", spec);
  Reconcile();
  const value condition = Schedule().at("status").at("conditions").at(0);
  EXPECT_EQ(condition.at("status").as_string(), "False");
  EXPECT_THAT(condition.at("message").as_string(), ::testing::HasSubstr("never fires"));
}

}  // namespace
}  // namespace clusterprof::controllers
#endif  // CLUSTERPROF_SCHEDULE_TEST
