#include "tests/chaos/ledger.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::chaos {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(CheckPhaseHistoryTest, OneFinalPhaseAtTheEndIsEndingOnce) {
  EXPECT_THAT(CheckPhaseHistory("a", {"Pending", "Scheduled", "Capturing", "Succeeded"}),
              IsEmpty());
  EXPECT_THAT(CheckPhaseHistory("a", {"Failed"}), IsEmpty());
}

TEST(CheckPhaseHistoryTest, NoFinalPhaseTwoFinalPhasesOrLeavingOneAreEachNamed) {
  EXPECT_THAT(CheckPhaseHistory("a", {"Pending", "Capturing"}),
              ElementsAre(HasSubstr("job a never reached a final phase (Pending -> Capturing)")));
  EXPECT_THAT(CheckPhaseHistory("b", {}), ElementsAre(HasSubstr("no phase seen")));
  EXPECT_THAT(CheckPhaseHistory("c", {"Capturing", "Succeeded", "Failed"}),
              ElementsAre(HasSubstr("job c reached a final phase 2 times")));
  EXPECT_THAT(CheckPhaseHistory("d", {"Capturing", "Succeeded", "Capturing"}),
              ElementsAre(HasSubstr("job d left its final phase Succeeded")));
}

JobEntry Job(const std::string& name, std::vector<FileEntry> files,
             std::vector<std::string> phases = {"Capturing", "Succeeded"}) {
  JobEntry job;
  job.name = name;
  job.phases = std::move(phases);
  job.files = std::move(files);
  return job;
}

FileEntry File(const std::string& uri, bool found, bool intact, int64_t writes,
               const std::string& phase = "Succeeded", bool pending = false,
               int64_t contents = -1) {
  FileEntry file;
  file.contents = contents >= 0 ? contents : writes;
  file.uri = uri;
  file.target_phase = phase;
  file.found = found;
  file.intact = intact;
  file.writes = writes;
  file.pending = pending;
  return file;
}

TEST(LedgerTest, ASucceededFileMissingOrCorruptIsLostAndASecondWriteIsADuplicate) {
  Ledger ledger;
  TrialRecord trial;
  trial.scenario = "operator-kill";
  trial.faults = {"operator killed"};
  trial.jobs = {Job("j", {File("gs://b/ok", true, true, 1), File("gs://b/gone", false, false, 0),
                          File("gs://b/bad", true, false, 1), File("gs://b/twice", true, true, 2),
                          // The same bytes uploaded again: not a second capture.
                          File("gs://b/again", true, true, 2, "Succeeded", false, 1),
                          // A failed target's file is not promised.
                          File("gs://b/failed", false, false, 0, "Failed")})};
  const std::vector<std::string> found = ledger.Add(trial);
  EXPECT_THAT(found, ElementsAre(HasSubstr("gs://b/gone is Succeeded in the status but is not in"),
                                 HasSubstr("gs://b/bad is Succeeded in the status but its content"),
                                 HasSubstr("gs://b/twice was written 2 times with different")));
  const std::vector<ScenarioFigures> figures = ledger.Figures();
  ASSERT_EQ(figures.size(), 2u);
  EXPECT_EQ(figures[0].scenario, "operator-kill");
  EXPECT_EQ(figures[0].files, 6);
  EXPECT_EQ(figures[0].files_lost, 2);
  EXPECT_EQ(figures[0].duplicates, 1);
  EXPECT_EQ(figures[0].rewrites, 1);
  EXPECT_EQ(figures[0].jobs_ended_once, 1);
  EXPECT_EQ(ledger.violations(), 3);
}

TEST(LedgerTest, FiguresAddUpPerScenarioAndInAll) {
  Ledger ledger;
  for (int i = 0; i < 3; ++i) {
    TrialRecord trial;
    trial.scenario = i < 2 ? "a" : "b";
    trial.trial = i;
    trial.faults = {"one", "two"};
    trial.bulk_faults = 10;
    trial.recovery_s = i + 0.5;
    trial.jobs = {Job(
        "j", {File("f", true, true, 1, "Succeeded", /*pending=*/i == 1)},
        i == 2 ? std::vector<std::string>{"Capturing"} : std::vector<std::string>{"Succeeded"})};
    if (i == 1) trial.extra_captures = 1;
    ledger.Add(trial);
  }
  ledger.SetRss("a", 20480, 21504);
  const std::vector<ScenarioFigures> figures = ledger.Figures();
  ASSERT_EQ(figures.size(), 3u);
  EXPECT_EQ(figures[0].trials, 2);
  EXPECT_EQ(figures[0].faults, 24);
  EXPECT_EQ(figures[0].duplicates, 1);
  EXPECT_EQ(figures[0].files_pending, 1);
  EXPECT_DOUBLE_EQ(figures[0].max_recovery_s, 1.5);
  EXPECT_EQ(figures[0].rss_before_kib, 20480);
  EXPECT_EQ(figures[1].jobs_ended_once, 0);
  EXPECT_EQ(figures[2].scenario, "all");
  EXPECT_EQ(figures[2].trials, 3);
  EXPECT_EQ(figures[2].jobs, 3);
  EXPECT_EQ(figures[2].jobs_ended_once, 2);
  EXPECT_DOUBLE_EQ(figures[2].max_recovery_s, 2.5);
  EXPECT_THAT(ledger.Table(),
              HasSubstr("| a | 2 | 24 | 2 of 2 | 1 | 2 (1) | 0 | 0 | 1.5 s | 20 → 21 MiB |"));
  EXPECT_THAT(ledger.JsonLines(), HasSubstr("\"phases\":[\"Capturing\"]"));
}

}  // namespace
}  // namespace clusterprof::chaos
