// The queue's rule for jobs whose targets overlap, by table.
#include "operator/controllers/target_queue.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::controllers {
namespace {

using ::testing::ElementsAre;

JobClaim Claim(std::string name, api::JobPhase phase, std::string created,
               std::vector<std::string> addresses, bool queued = false) {
  return {.name = name,
          .uid = "uid-" + name,
          .phase = phase,
          .created = std::move(created),
          .queued = queued,
          .addresses = std::move(addresses)};
}

constexpr api::JobPhase kPending = api::JobPhase::kPending;
constexpr api::JobPhase kCapturing = api::JobPhase::kCapturing;
constexpr api::JobPhase kScheduled = api::JobPhase::kScheduled;

TEST(FindBlockerTest, AnActiveJobWithASharedTargetBlocksNamingWhatIsShared) {
  const JobClaim self =
      Claim("b", kPending, "2026-01-01T00:00:05Z", {"10.0.0.1:8466", "10.0.0.2:8466"});
  const std::optional<Blocker> blocker = FindBlocker(
      self, {Claim("a", kCapturing, "2026-01-01T00:00:01Z", {"10.0.0.2:8466", "10.0.0.9:8466"})});
  ASSERT_TRUE(blocker.has_value());
  EXPECT_EQ(blocker->job, "a");
  EXPECT_EQ(blocker->phase, kCapturing);
  EXPECT_THAT(blocker->shared, ElementsAre("10.0.0.2:8466"));
}

TEST(FindBlockerTest, DisjointTargetsItselfAndYoungerQueuedJobsDoNotBlock) {
  const JobClaim self = Claim("b", kPending, "2026-01-01T00:00:05Z", {"10.0.0.1:8466"});
  EXPECT_FALSE(
      FindBlocker(
          self,
          {Claim("a", kCapturing, "2026-01-01T00:00:01Z", {"10.0.0.2:8466"}),
           Claim("c", kPending, "2026-01-01T00:00:09Z", {"10.0.0.1:8466"}, /*queued=*/true),
           Claim("d", kPending, "2026-01-01T00:00:01Z", {"10.0.0.1:8466"}, /*queued=*/false), self})
          .has_value());
}

TEST(FindBlockerTest, TheOldestQueuedJobGoesFirstAndAnActiveOneBeforeAnyQueuedOne) {
  const JobClaim self = Claim("z", kPending, "2026-01-01T00:00:05Z", {"10.0.0.1:8466"});
  const JobClaim older = Claim("x", kPending, "2026-01-01T00:00:03Z", {"10.0.0.1:8466"}, true);
  const JobClaim oldest = Claim("y", kPending, "2026-01-01T00:00:02Z", {"10.0.0.1:8466"}, true);
  std::optional<Blocker> blocker = FindBlocker(self, {older, oldest});
  ASSERT_TRUE(blocker.has_value());
  EXPECT_EQ(blocker->job, "y");
  EXPECT_EQ(blocker->phase, kPending);

  blocker =
      FindBlocker(self, {older, Claim("s", kScheduled, "2026-01-01T00:00:09Z", {"10.0.0.1:8466"})});
  ASSERT_TRUE(blocker.has_value());
  EXPECT_EQ(blocker->job, "s") << "a job that holds the target outranks one that waits";

  // Same creation second: by name.
  const JobClaim twin = Claim("a", kPending, "2026-01-01T00:00:05Z", {"10.0.0.1:8466"}, true);
  ASSERT_TRUE(FindBlocker(self, {twin}).has_value());
  EXPECT_FALSE(FindBlocker(twin, {self}).has_value());
}

TEST(ClaimOfTest, ActiveAndQueuedJobsClaimOthersDoNot) {
  api::ProfileJobStatus status;
  status.phase = api::JobPhase::kCapturing;
  std::optional<JobClaim> claim = ClaimOf("a", "u", "2026-01-01T00:00:00Z", status);
  ASSERT_TRUE(claim.has_value());
  EXPECT_EQ(claim->phase, api::JobPhase::kCapturing);
  EXPECT_FALSE(claim->queued);

  status.phase = api::JobPhase::kPending;
  EXPECT_FALSE(ClaimOf("a", "u", "", status).has_value()) << "Pending, not queued";
  api::SetCondition(status.conditions, {"Queued", "True", "TargetsBusy", "m", 1, ""},
                    "2026-01-01T00:00:00Z");
  claim = ClaimOf("a", "u", "", status);
  ASSERT_TRUE(claim.has_value());
  EXPECT_TRUE(claim->queued);
  api::SetCondition(status.conditions, {"Queued", "False", "TargetsFree", "m", 1, ""},
                    "2026-01-01T00:00:01Z");
  EXPECT_FALSE(ClaimOf("a", "u", "", status).has_value());

  status.phase = api::JobPhase::kSucceeded;
  EXPECT_FALSE(ClaimOf("a", "u", "", status).has_value());
}

}  // namespace
}  // namespace clusterprof::controllers
