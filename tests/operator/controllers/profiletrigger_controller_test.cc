// The ProfileTrigger controller on the in-memory API, with the pods' live steps from a fake
// StepSource and time from a SimulatedClock: when a rule fires, what holds it back (cooldown,
// daily cap, a running job, suspend), what survives a restart, and what it says about pods
// without steps.
#include "operator/controllers/profiletrigger_controller.h"

#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/api/trigger.h"
#include "operator/kube/api_error.h"
#include "operator/kube/informer.h"
#include "tests/support/fake_api_client.h"

namespace clusterprof::controllers {
namespace {

using ::testing::HasSubstr;
using web::json::value;

constexpr int64_t kMs = 1'000'000;
constexpr char kPodA[] = "10.0.0.1:8466";
constexpr char kPodB[] = "10.0.0.2:8466";

// Steps the test sets for each address, as a StepWatcher would report them.
class FakeSteps final : public coordinator::StepSource {
 public:
  void SetTargets(const std::vector<std::string>& addresses) override {
    MutexLock lock(&mu_);
    targets_ = addresses;
  }
  std::vector<coordinator::WatchedSidecar> Snapshot() const override {
    MutexLock lock(&mu_);
    std::vector<coordinator::WatchedSidecar> out;
    for (const std::string& address : targets_) {
      auto it = sidecars_.find(address);
      coordinator::WatchedSidecar sidecar;
      if (it != sidecars_.end()) sidecar = it->second;
      sidecar.address = address;
      out.push_back(sidecar);
    }
    return out;
  }
  void Set(const std::string& address, coordinator::WatchedSidecar sidecar) {
    MutexLock lock(&mu_);
    sidecars_[address] = std::move(sidecar);
  }
  std::vector<std::string> targets() const {
    MutexLock lock(&mu_);
    return targets_;
  }

 private:
  mutable Mutex mu_;
  std::vector<std::string> targets_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, coordinator::WatchedSidecar> sidecars_ ABSL_GUARDED_BY(mu_);
};

// `steps` steps of `step_ms` each, ending at `end_ns`, the last `slow` of them `slow_ms` long,
// with a collective 10 ms before each step's end.
coordinator::WatchedSidecar Steps(const std::string& host, int steps, int64_t step_ms, int slow,
                                  int64_t slow_ms, int64_t end_ns) {
  coordinator::WatchedSidecar sidecar;
  sidecar.host_name = host;
  sidecar.connected = true;
  sidecar.last_message_ns = end_ns;
  sidecar.processes = 1;
  sidecar.processes_with_steps = 1;
  sidecar.clock_uncertainty_ns = 0;
  int64_t t = end_ns;
  std::vector<analysis::StepDigest> reversed;
  for (int i = steps - 1; i >= 0; --i) {
    const int64_t ms = i >= steps - slow ? slow_ms : step_ms;
    analysis::StepDigest step;
    step.step = i;
    step.end_ns = t;
    step.start_ns = t - ms * kMs;
    step.collective_entry_ns = t - 10 * kMs;
    reversed.push_back(step);
    t = step.start_ns;
  }
  sidecar.steps.assign(reversed.rbegin(), reversed.rend());
  sidecar.steps_total = static_cast<uint64_t>(steps);
  sidecar.last_step_end_ns = end_ns;
  return sidecar;
}

class ProfileTriggerControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kube::InformerOptions options;
    options.namespace_ = ns_;
    options.type = api::ProfileTriggers();
    triggers_ = std::make_unique<kube::Informer>(&api_, &api_clock_, options);
    options.type = api::ProfileJobs();
    jobs_ = std::make_unique<kube::Informer>(&api_, &api_clock_, options);
    options.type = kube::Pods();
    options.decoder = kube::PodDecoder();
    pods_ = std::make_unique<kube::Informer>(&api_, &api_clock_, options);
    for (kube::Informer* informer : {triggers_.get(), jobs_.get(), pods_.get()}) {
      informer->Start();
      ASSERT_TRUE(informer->WaitForSync());
    }
    NewController();
  }
  void TearDown() override {
    controller_.reset();
    for (kube::Informer* informer : {triggers_.get(), jobs_.get(), pods_.get()}) {
      informer->Stop();
    }
  }

  // A controller as a (re)started operator makes one: no memory of earlier firings.
  void NewController() {
    controller_.reset();
    steps_ = nullptr;  // went with the controller
    ProfileTriggerControllerOptions options;
    options.recorder_window_ms = 30'000;
    // The pods' addresses stand for them here, with no pod objects behind them.
    options.allow_external_addresses = true;
    options.step_source = [this] {
      auto source = std::make_unique<FakeSteps>();
      steps_ = source.get();
      for (const auto& [address, sidecar] : pending_) source->Set(address, sidecar);
      return source;
    };
    controller_ = std::make_unique<ProfileTriggerController>(
        &api_, &clock_, triggers_.get(), jobs_.get(), pods_.get(), nullptr, nullptr, options);
  }

  static bool Eventually(const std::function<bool()>& condition) {
    RealClock real;
    const int64_t guard = real.MonotonicNs() + 30 * kNanosPerSecond;
    while (!condition()) {
      if (real.MonotonicNs() > guard) return false;
      std::this_thread::yield();
    }
    return true;
  }

  value RegressionSpec() {
    value spec = value::object();
    spec["targets"]["addresses"][0] = value::string(kPodA);
    spec["targets"]["addresses"][1] = value::string(kPodB);
    spec["rules"][0]["stepTimeRegression"]["percent"] = value::number(20);
    spec["rules"][0]["stepTimeRegression"]["steps"] = value::number(10);
    spec["capture"]["logdir"] = value::string("gs://bucket/profiles");
    spec["cooldownSeconds"] = value::number(1800);
    spec["maxCapturesPerDay"] = value::number(10);
    return spec;
  }

  void CreateTrigger(const std::string& name, const value& spec) {
    name_ = name;
    value trigger = value::object();
    trigger["metadata"]["name"] = value::string(name);
    trigger["spec"] = spec;
    absl::StatusOr<value> created = api_.Create(api::ProfileTriggers(), ns_, trigger);
    ASSERT_TRUE(created.ok()) << created.status();
    ASSERT_TRUE(Eventually([&] { return triggers_->Get(ns_, name) != nullptr; }));
  }

  // The pods' steps: healthy (100 ms) or with the last 10 steps slow (150 ms).
  void SetSteps(bool slow) {
    const int64_t end = clock_.WallNs() - 50 * kMs;
    for (const char* address : {kPodA, kPodB}) {
      pending_[address] = Steps(address == std::string(kPodA) ? "pod-a" : "pod-b", 200, 100,
                                slow ? 10 : 0, 150, end);
      if (steps_ != nullptr) steps_->Set(address, pending_[address]);
    }
  }

  // Reconciles (which starts following), evaluates, and reconciles again to act on it; then
  // waits for the caches to see what was written.
  void Cycle() {
    ASSERT_TRUE(Reconcile().ok());
    WaitForCaches();
    controller_->EvaluateAll();
    absl::Status status = Reconcile();
    ASSERT_TRUE(status.ok()) << status;
    WaitForCaches();
  }
  absl::Status Reconcile() { return controller_->Reconcile(kube::ObjectKey(ns_, name_)); }

  void WaitForCaches() {
    ASSERT_TRUE(Eventually([&] {
      absl::StatusOr<value> trigger = api_.Get(api::ProfileTriggers(), ns_, name_);
      kube::ObjectPtr cached = triggers_->Get(ns_, name_);
      if (!trigger.ok() || cached == nullptr) return false;
      if (cached->metadata.resource_version !=
          trigger->at("metadata").at("resourceVersion").as_string()) {
        return false;
      }
      absl::StatusOr<kube::ObjectList> jobs = api_.List(api::ProfileJobs(), ns_);
      if (!jobs.ok() || jobs_->List(ns_).size() != jobs->items.size()) return false;
      for (const value& job : jobs->items) {
        kube::ObjectPtr cached_job = jobs_->Get(ns_, job.at("metadata").at("name").as_string());
        if (cached_job == nullptr || cached_job->metadata.resource_version !=
                                         job.at("metadata").at("resourceVersion").as_string()) {
          return false;
        }
      }
      return true;
    }));
  }

  std::set<std::string> Jobs() {
    std::set<std::string> names;
    absl::StatusOr<kube::ObjectList> listed = api_.List(api::ProfileJobs(), ns_);
    EXPECT_TRUE(listed.ok());
    for (const value& job : listed->items) names.insert(job.at("metadata").at("name").as_string());
    return names;
  }
  value Trigger() { return *api_.Get(api::ProfileTriggers(), ns_, name_); }
  value Status() { return Trigger().at("status"); }
  std::string Condition(const std::string& type, std::string* message = nullptr) {
    const value status = Status();
    if (!status.has_field("conditions")) return "";
    for (const value& c : status.at("conditions").as_array()) {
      if (c.at("type").as_string() != type) continue;
      if (message != nullptr) *message = c.at("message").as_string();
      return c.at("status").as_string();
    }
    return "";
  }
  void FinishJob(const std::string& job_name, const std::string& phase) {
    absl::StatusOr<value> job = api_.Get(api::ProfileJobs(), ns_, job_name);
    ASSERT_TRUE(job.ok()) << job.status();
    (*job)["status"]["phase"] = value::string(phase);
    (*job)["status"]["completionTime"] = value::string(api::FormatTime(clock_.WallNs()));
    ASSERT_TRUE(api_.UpdateStatus(api::ProfileJobs(), ns_, *job).ok());
    WaitForCaches();
  }

  SimulatedClock api_clock_{SimulatedClock::kDefaultWallNs};
  SimulatedClock clock_{SimulatedClock::kDefaultWallNs + 3600 * kNanosPerSecond};
  testing::FakeApiClient api_{&api_clock_};
  std::string ns_ = "training";
  std::string name_;
  std::unique_ptr<kube::Informer> triggers_, jobs_, pods_;
  std::unique_ptr<ProfileTriggerController> controller_;
  FakeSteps* steps_ = nullptr;
  std::map<std::string, coordinator::WatchedSidecar> pending_;
};

TEST_F(ProfileTriggerControllerTest, ARegressionCreatesOneOwnedJobWithTheEvidence) {
  SetSteps(/*slow=*/true);
  CreateTrigger("llama-slowdown", RegressionSpec());
  Cycle();
  EXPECT_THAT(steps_->targets(), ::testing::UnorderedElementsAre(kPodA, kPodB));
  const std::set<std::string> jobs = Jobs();
  ASSERT_EQ(jobs.size(), 1u);
  const std::string job_name = *jobs.begin();
  EXPECT_THAT(job_name, ::testing::StartsWith("llama-slowdown-"));
  const value job = *api_.Get(api::ProfileJobs(), ns_, job_name);
  EXPECT_EQ(job.at("metadata").at("labels").at("clusterprof.io/trigger").as_string(),
            "llama-slowdown");
  EXPECT_EQ(job.at("metadata").at("ownerReferences").at(0).at("kind").as_string(),
            "ProfileTrigger");
  EXPECT_EQ(job.at("spec").at("lookbackMs").as_integer(), 10000);
  EXPECT_EQ(job.at("spec").at("durationMs").as_integer(), 5000);
  EXPECT_EQ(job.at("spec").at("targets").at("addresses").size(), 2u);
  EXPECT_EQ(job.at("spec").at("targets").at("waitSeconds").as_integer(), 0)
      << "a firing captures the pods ready at that instant";
  const std::string evidence =
      job.at("metadata").at("annotations").at("clusterprof.io/trigger-evidence").as_string();
  EXPECT_THAT(evidence, HasSubstr("+50%"));

  const value status = Status();
  EXPECT_EQ(status.at("lastJob").as_string(), job_name);
  EXPECT_TRUE(status.at("lastJobCreated").as_bool());
  EXPECT_EQ(status.at("capturesToday").as_integer(), 1);
  EXPECT_EQ(status.at("recentFirings").at(0).at("rule").as_string(), "stepTimeRegression");
  EXPECT_EQ(status.at("recentFirings").at(0).at("evidence").as_string(), evidence);
  EXPECT_EQ(status.at("stepTime").as_string(), "150ms");
  EXPECT_EQ(status.at("baseline").as_string(), "100ms");
  EXPECT_EQ(status.at("pods").as_integer(), 2);
  EXPECT_EQ(Condition("CooldownActive"), "True");
  EXPECT_EQ(Condition("NoStepTelemetry"), "False");
}

TEST_F(ProfileTriggerControllerTest, TheOperatorsViewOfATriggersPodsIsJsonForTop) {
  SetSteps(/*slow=*/false);
  CreateTrigger("view", RegressionSpec());
  EXPECT_FALSE(controller_->StepsJson(kube::ObjectKey(ns_, "view")).has_value())
      << "not followed before its first reconcile";
  ASSERT_TRUE(Reconcile().ok());
  const std::optional<std::string> json = controller_->StepsJson(kube::ObjectKey(ns_, "view"), 5);
  ASSERT_TRUE(json.has_value());
  const value view = value::parse(*json);
  EXPECT_EQ(view.at("trigger").as_string(), "training/view");
  ASSERT_EQ(view.at("sidecars").size(), 2u);
  const value& a = view.at("sidecars").at(0);
  EXPECT_EQ(a.at("address").as_string(), kPodA);
  EXPECT_EQ(a.at("pod").as_string(), "pod-a") << "the name the sidecar reports, for addresses";
  ASSERT_EQ(a.at("steps").size(), 5u) << "the last 5";
  EXPECT_EQ(a.at("steps").at(4).at(0).as_integer(), 199);
  EXPECT_FALSE(controller_->StepsJson("training/none").has_value());
}

TEST_F(ProfileTriggerControllerTest, HealthyStepsFireNothingButShowTheirTelemetry) {
  SetSteps(/*slow=*/false);
  CreateTrigger("quiet", RegressionSpec());
  Cycle();
  EXPECT_TRUE(Jobs().empty());
  EXPECT_EQ(Status().at("stepTime").as_string(), "100ms");
  EXPECT_FALSE(Status().has_field("lastFiredTime"));
}

TEST_F(ProfileTriggerControllerTest, TheCooldownAndARunningJobHoldTheNextFiringBack) {
  SetSteps(/*slow=*/true);
  CreateTrigger("cool", RegressionSpec());
  Cycle();
  ASSERT_EQ(Jobs().size(), 1u);
  const std::string first = *Jobs().begin();
  // The slowdown goes on: nothing more within the cooldown.
  clock_.AdvanceNs(60 * kNanosPerSecond);
  SetSteps(/*slow=*/true);
  Cycle();
  EXPECT_EQ(Jobs().size(), 1u);
  std::string message;
  EXPECT_EQ(Condition("CooldownActive", &message), "True");
  EXPECT_THAT(message, HasSubstr("cooldownSeconds 1800"));
  // Past the cooldown, but the first job still runs: still nothing.
  clock_.AdvanceNs(1800 * kNanosPerSecond);
  SetSteps(/*slow=*/true);
  Cycle();
  EXPECT_EQ(Jobs().size(), 1u);
  // Once it finished, the next firing goes ahead.
  FinishJob(first, "Succeeded");
  Cycle();
  EXPECT_EQ(Jobs().size(), 2u);
  EXPECT_EQ(Status().at("capturesToday").as_integer(), 2);
}

TEST_F(ProfileTriggerControllerTest, TheDailyCapHoldsUntilTheNextUtcDay) {
  value spec = RegressionSpec();
  spec["cooldownSeconds"] = value::number(0);
  spec["maxCapturesPerDay"] = value::number(1);
  SetSteps(/*slow=*/true);
  CreateTrigger("capped", spec);
  Cycle();
  ASSERT_EQ(Jobs().size(), 1u);
  FinishJob(*Jobs().begin(), "Succeeded");
  clock_.AdvanceNs(60 * kNanosPerSecond);
  SetSteps(/*slow=*/true);
  Cycle();
  EXPECT_EQ(Jobs().size(), 1u);
  EXPECT_EQ(Condition("DailyCapReached"), "True");
  clock_.AdvanceNs(24 * 3600 * kNanosPerSecond);
  SetSteps(/*slow=*/true);
  Cycle();
  EXPECT_EQ(Jobs().size(), 2u);
  EXPECT_EQ(Condition("DailyCapReached"), "True") << "1 of 1 again, on the new day";
  EXPECT_EQ(Status().at("capturesToday").as_integer(), 1);
}

TEST_F(ProfileTriggerControllerTest, ARestartedOperatorDoesNotFireTwiceForOneEpisode) {
  SetSteps(/*slow=*/true);
  CreateTrigger("restart", RegressionSpec());
  Cycle();
  ASSERT_EQ(Jobs().size(), 1u);
  FinishJob(*Jobs().begin(), "Succeeded");
  // A new leader: nothing in memory, the same steps from the sidecars.
  NewController();
  clock_.AdvanceNs(10 * kNanosPerSecond);
  SetSteps(/*slow=*/true);
  Cycle();
  EXPECT_EQ(Jobs().size(), 1u) << "the cooldown in the status holds across the restart";
  EXPECT_EQ(api_.CountActions("create", "profilejobs"), 1);
}

TEST_F(ProfileTriggerControllerTest, AFiringWhoseJobWasNotCreatedIsFinishedUnderItsName) {
  SetSteps(/*slow=*/true);
  CreateTrigger("interrupted", RegressionSpec());
  ASSERT_TRUE(Reconcile().ok());
  WaitForCaches();
  controller_->EvaluateAll();
  // The operator stops between recording the firing and creating its job.
  api_.FailNext("create", "profilejobs", 503);
  EXPECT_FALSE(Reconcile().ok());
  WaitForCaches();
  ASSERT_TRUE(Jobs().empty());
  const std::string recorded = Status().at("lastJob").as_string();
  EXPECT_FALSE(Status().at("lastJobCreated").as_bool());
  // The next leader creates it, and records no second firing.
  NewController();
  SetSteps(/*slow=*/true);
  Cycle();
  EXPECT_EQ(Jobs(), std::set<std::string>{recorded});
  EXPECT_TRUE(Status().at("lastJobCreated").as_bool());
  EXPECT_EQ(Status().at("recentFirings").size(), 1u);
}

TEST_F(ProfileTriggerControllerTest, PodsWithoutStepsAreNamedInACondition) {
  SetSteps(/*slow=*/false);
  coordinator::WatchedSidecar silent;
  silent.host_name = "pod-b";
  silent.connected = true;
  silent.last_message_ns = clock_.WallNs();
  silent.processes = 2;
  silent.step_source = "events with a step_num stat";
  pending_[kPodB] = silent;
  CreateTrigger("silent", RegressionSpec());
  Cycle();
  std::string message;
  EXPECT_EQ(Condition("NoStepTelemetry", &message), "True");
  EXPECT_THAT(message, HasSubstr("pod-b")) << "the name its sidecar reports";
  EXPECT_THAT(message, HasSubstr("2 process(es) attached, none marks steps"));
}

TEST_F(ProfileTriggerControllerTest, BadSpecsAreRefusedNamingTheField) {
  value spec = RegressionSpec();
  spec["rules"][0]["stepTimeRegression"]["percent"] = value::number(-5);
  CreateTrigger("negative", spec);
  ASSERT_TRUE(Reconcile().ok());
  WaitForCaches();
  std::string message;
  EXPECT_EQ(Condition("Valid", &message), "False");
  EXPECT_THAT(message, HasSubstr("spec.rules[0].stepTimeRegression.percent"));

  value longer = RegressionSpec();
  longer["capture"]["lookbackMs"] = value::number(60'000);
  CreateTrigger("too-far", longer);
  ASSERT_TRUE(Reconcile().ok());
  WaitForCaches();
  EXPECT_EQ(Condition("Valid", &message), "False");
  EXPECT_THAT(message, HasSubstr("spec.capture.lookbackMs: 60000 is longer than the sidecars' "
                                 "flight recorder keeps (30000 ms"));

  value zero = RegressionSpec();
  zero["rules"][0] = value::object();
  zero["rules"][0]["straggler"]["steps"] = value::number(0);
  CreateTrigger("zero-steps", zero);
  ASSERT_TRUE(Reconcile().ok());
  WaitForCaches();
  EXPECT_EQ(Condition("Valid", &message), "False");
  EXPECT_THAT(message, HasSubstr("spec.rules[0].straggler.steps"));

  value warmup = RegressionSpec();
  warmup["warmupSteps"] = value::number(5000);
  CreateTrigger("long-warmup", warmup);
  ASSERT_TRUE(Reconcile().ok());
  WaitForCaches();
  EXPECT_EQ(Condition("Valid", &message), "False");
  EXPECT_THAT(message, HasSubstr("spec.warmupSteps"));
  EXPECT_TRUE(Jobs().empty());
}

TEST_F(ProfileTriggerControllerTest, ASuspendedTriggerFollowsNothingAndFiresNothing) {
  value spec = RegressionSpec();
  spec["suspend"] = value::boolean(true);
  SetSteps(/*slow=*/true);
  CreateTrigger("paused", spec);
  Cycle();
  EXPECT_TRUE(Jobs().empty());
  EXPECT_EQ(Condition("Watching"), "False");
}

TEST_F(ProfileTriggerControllerTest, FinishedJobsBeyondTheHistoryLimitsAreDeleted) {
  value spec = RegressionSpec();
  spec["cooldownSeconds"] = value::number(0);
  spec["successfulJobsHistoryLimit"] = value::number(1);
  SetSteps(/*slow=*/true);
  CreateTrigger("history", spec);
  for (int i = 0; i < 3; ++i) {
    Cycle();
    for (const std::string& job : Jobs()) {
      const value j = *api_.Get(api::ProfileJobs(), ns_, job);
      if (!j.has_field("status")) FinishJob(job, "Succeeded");
    }
    clock_.AdvanceNs(10 * kNanosPerSecond);
    SetSteps(/*slow=*/true);
  }
  SetSteps(/*slow=*/false);  // the episode is over: nothing fires in the last reconcile
  controller_->EvaluateAll();
  ASSERT_TRUE(Reconcile().ok());
  WaitForCaches();
  EXPECT_EQ(Jobs().size(), 1u);
  EXPECT_EQ(Status().at("capturesToday").as_integer(), 3);
}

}  // namespace
}  // namespace clusterprof::controllers
