// A ProfileTrigger end to end on this machine: four real sidecars, four train_loop ranks in
// lockstep (one of which degrades mid-run), the trigger controller following their live steps
// over Sidecar.WatchSteps (real gRPC, the in-memory API for the objects), and the capture its
// ProfileJob asks for, run by the coordinator as the ProfileJob controller would. The trigger
// must fire once, on the straggler rule, naming the degraded rank; the capture's trace must
// reach back before the onset; the report must name the same rank; and nothing more may fire
// within the cooldown.
#include <fstream>
#include <iostream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "analysis/report.h"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"
#include "common/xspace/xspace_io.h"
#include "coordinator/coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/api/trigger.h"
#include "operator/controllers/profiletrigger_controller.h"
#include "operator/kube/informer.h"
#include "tests/support/fake_api_client.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::controllers {
namespace {

using testing::Subprocess;
using testing::TempDir;
using web::json::value;

constexpr char kSidecar[] = CLUSTERPROF_SIDECAR_PATH;
constexpr char kTrainLoop[] = CLUSTERPROF_TRAIN_LOOP_PATH;
constexpr int kRanks = 4;
constexpr int kSlowRank = 2;

class ProfileTriggerIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Sidecars on tmpfs when there is one (annotations are slower on disk, not wrong).
    for (int r = 0; r < kRanks; ++r) {
      const std::string shm = root_.Join(StrCat("shm", r));
      const std::string ports = root_.Join(StrCat("ports", r));
      sidecars_.push_back(std::make_unique<Subprocess>(
          std::vector<std::string>{kSidecar, "--port", "0", "--http-port", "-1", "--shm-dir", shm,
                                   "--port-file", ports, "--allowed-logdir", root_.path(),
                                   "--host-name", StrCat("rank-", r), "--no-gpu"},
          std::map<std::string, std::string>{}, root_.Join(StrCat("sidecar", r, ".log"))));
      const int port = testing::ReadGrpcPort(ports);
      ASSERT_NE(port, 0) << "sidecar " << r << " did not start";
      addresses_.push_back(StrCat("127.0.0.1:", port));
    }
    // 50 ms steps in lockstep; rank 2 computes 40 ms more per step from 6 s on (well above what a
    // loaded 2-core machine adds at random).
    for (int r = 0; r < kRanks; ++r) {
      std::vector<std::string> argv = {kTrainLoop,  "--sync-dir", root_.Join("sync"),
                                       "--world",   "4",          "--rank",
                                       StrCat(r),   "--step-ms",  "50",
                                       "--seconds", "60",         "--busy-percent",
                                       "30"};
      if (r == kSlowRank) {
        for (const char* arg : {"--straggle-ms", "40", "--straggle-after-seconds", "6"}) {
          argv.push_back(arg);
        }
      }
      workloads_.push_back(std::make_unique<Subprocess>(
          argv,
          std::map<std::string, std::string>{{"CLUSTERPROF_DIR", root_.Join(StrCat("shm", r))}},
          root_.Join(StrCat("rank", r, ".log"))));
    }
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
  }

  void TearDown() override {
    controller_.reset();
    for (kube::Informer* informer : {triggers_.get(), jobs_.get(), pods_.get()}) {
      if (informer != nullptr) informer->Stop();
    }
    workloads_.clear();
    sidecars_.clear();
  }

  std::vector<std::string> Jobs() {
    std::vector<std::string> names;
    absl::StatusOr<kube::ObjectList> listed = api_.List(api::ProfileJobs(), ns_);
    if (listed.ok()) {
      for (const value& job : listed->items) {
        names.push_back(job.at("metadata").at("name").as_string());
      }
    }
    return names;
  }

  // The step from which the slow rank said it slowed down; -1 before it did.
  int64_t OnsetStep() {
    std::ifstream log(root_.Join(StrCat("rank", kSlowRank, ".log")));
    const std::regex said("slows down by [0-9]+ ms per step from step ([0-9]+)");
    std::string line;
    std::smatch match;
    while (std::getline(log, line)) {
      if (std::regex_search(line, match, said)) return std::stoll(match[1]);
    }
    return -1;
  }

  TempDir root_;
  std::vector<std::unique_ptr<Subprocess>> sidecars_;
  std::vector<std::unique_ptr<Subprocess>> workloads_;
  std::vector<std::string> addresses_;
  RealClock clock_;
  SimulatedClock api_clock_{SimulatedClock::kDefaultWallNs};
  testing::FakeApiClient api_{&api_clock_};
  std::string ns_ = "training";
  std::unique_ptr<kube::Informer> triggers_, jobs_, pods_;
  std::unique_ptr<ProfileTriggerController> controller_;
};

TEST_F(ProfileTriggerIntegrationTest, ADegradingRankFiresOnceAndItsCaptureReachesBackToTheOnset) {
  value spec = value::object();
  for (size_t i = 0; i < addresses_.size(); ++i) {
    spec["targets"]["addresses"][i] = value::string(addresses_[i]);
  }
  spec["rules"][0]["straggler"]["steps"] = value::number(20);
  // The first 3 s are not judged: on a loaded machine the ranks' start is uneven.
  spec["warmupSteps"] = value::number(60);
  spec["capture"]["logdir"] = value::string(root_.Join("logs"));
  spec["capture"]["durationMs"] = value::number(1000);
  spec["capture"]["lookbackMs"] = value::number(10000);
  spec["cooldownSeconds"] = value::number(1800);
  value trigger = value::object();
  trigger["metadata"]["name"] = value::string("degrade");
  trigger["spec"] = spec;
  ASSERT_TRUE(api_.Create(api::ProfileTriggers(), ns_, trigger).ok());

  ProfileTriggerControllerOptions options;
  options.status_interval_ms = 1000;
  // The ranks are local sidecars named by address, with no pod objects behind them.
  options.allow_external_addresses = true;
  controller_ = std::make_unique<ProfileTriggerController>(
      &api_, &clock_, triggers_.get(), jobs_.get(), pods_.get(), nullptr, nullptr, options);
  controller_->Start();  // the workers and the evaluator, as in the operator

  // Until it fires (bounded by a guard, not a timing assertion: the rank degrades after 6 s).
  const int64_t guard = clock_.MonotonicNs() + 50 * kNanosPerSecond;
  while (Jobs().empty() && clock_.MonotonicNs() < guard) clock_.SleepForNs(100 * kNanosPerMilli);
  const std::vector<std::string> jobs = Jobs();
  ASSERT_EQ(jobs.size(), 1u) << "the trigger did not fire; rank logs in " << root_.path();
  const int64_t onset = OnsetStep();
  ASSERT_GE(onset, 0) << "the slow rank never slowed down";

  // The firing is in the status before its job exists; read it as the server has it.
  value trigger_now = *api_.Get(api::ProfileTriggers(), ns_, "degrade");
  ASSERT_TRUE(trigger_now.has_field("status") &&
              trigger_now.at("status").has_array_field("recentFirings") &&
              trigger_now.at("status").at("recentFirings").size() > 0)
      << trigger_now.serialize();
  const value status = trigger_now.at("status");
  const value firing = status.at("recentFirings").at(0);
  EXPECT_EQ(firing.at("rule").as_string(), "straggler") << firing.serialize();
  ASSERT_TRUE(firing.has_array_field("pods")) << firing.serialize();
  ASSERT_EQ(firing.at("pods").size(), 1u) << firing.serialize();
  EXPECT_EQ(firing.at("pods").at(0).as_string(), StrCat("rank-", kSlowRank)) << firing.serialize();
  EXPECT_GE(firing.at("lastStep").as_integer(), onset);

  // The capture the job asks for, as the ProfileJob controller runs it.
  const value job = *api_.Get(api::ProfileJobs(), ns_, jobs[0]);
  absl::StatusOr<api::ProfileJobSpec> job_spec = api::ParseProfileJobSpec(job.at("spec"));
  ASSERT_TRUE(job_spec.ok()) << job_spec.status();
  EXPECT_EQ(job_spec->lookback_ms, 10000);
  coordinator::CaptureOptions capture;
  for (const std::string& address : addresses_) capture.targets.push_back({address, ""});
  capture.layout =
      *storage::RunLayout::Create(job_spec->logdir, storage::DefaultRunName(clock_.WallNs()));
  capture.duration_ms = job_spec->duration_ms;
  capture.profile = job_spec->profile_options;
  absl::StatusOr<coordinator::RunResult> run = coordinator::Capture(capture, clock_);
  ASSERT_TRUE(run.ok()) << run.status();
  // Detection to capture, for bench/RESULTS.md: from the end of the step that completed the
  // rule's window to the firing, and to the capture's T0 (this test starts the capture itself
  // once it sees the job, as the ProfileJob controller does from its informer).
  const int64_t detected = firing.at("detectedNs").as_number().to_int64();
  const int64_t fired = status.at("lastFiredNs").as_number().to_int64();
  std::cout << "onset at step " << onset << ", fired over steps "
            << firing.at("firstStep").as_integer() << "-" << firing.at("lastStep").as_integer()
            << "\n";
  std::cout << "detection to firing: " << (fired - detected) / 1e6
            << " ms; detection to the capture's T0: " << (run->t0_ns - detected) / 1e6 << " ms\n";
  ASSERT_EQ(run->succeeded, kRanks);
  for (const coordinator::TargetResult& target : run->targets) {
    EXPECT_GT(target.lookback_ns, 5 * kNanosPerSecond) << target.host_name;
  }
  // The slow rank's trace holds the step it slowed down at, from before the capture began.
  const coordinator::TargetResult& slow = run->targets[kSlowRank];
  ASSERT_EQ(slow.host_name, StrCat("rank-", kSlowRank));
  absl::StatusOr<std::unique_ptr<xspace::LoadedXSpace>> loaded =
      xspace::ReadXSpaceFile(slow.files.at(0));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  int64_t first_step = INT64_MAX;
  const auto* plane = xspace::FindPlaneWithName((*loaded)->space(), xspace::kHostThreadsPlaneName);
  ASSERT_NE(plane, nullptr);
  for (const auto& line : plane->lines()) {
    for (const auto& event : line.events()) {
      for (const auto& stat : event.stats()) {
        if (plane->stat_metadata().at(stat.metadata_id()).name() == xspace::kStepNum) {
          first_step = std::min<int64_t>(first_step, stat.int64_value());
        }
      }
    }
  }
  EXPECT_LE(first_step, onset) << "the lookback reaches the onset step";
  // The report of the capture names the same rank.
  ASSERT_NE(run->report, nullptr);
  const std::vector<const analysis::HostVerdict*> stragglers = run->report->analysis.stragglers();
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_EQ(stragglers[0]->host, StrCat("rank-", kSlowRank));

  // Nothing more within the cooldown, though the rank stays slow.
  clock_.SleepForNs(3 * kNanosPerSecond);
  EXPECT_EQ(Jobs().size(), 1u);
}

}  // namespace
}  // namespace clusterprof::controllers
