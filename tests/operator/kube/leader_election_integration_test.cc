// Leader election against a real kube-apiserver: acquiring and releasing the Lease, one leader
// among candidates at a time, takeover after expiry and at once after a release, stepping down
// when the Lease is taken or the API server stops answering, and RBAC refusals.
#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/api_error.h"
#include "operator/kube/leader_election.h"
#include "operator/kube/rest_client.h"
#include "tests/operator/kube/kube_fixture.h"

namespace clusterprof::kube {
namespace {

using ::testing::HasSubstr;

constexpr char kLease[] = "clusterprof-operator";

// Under a sanitizer, on a machine shared with others, one HTTPS request can take seconds: the
// durations stretch so a healthy leader still renews within its deadline.
constexpr int64_t kSlowdown = std::string_view(CLUSTERPROF_SANITIZE).empty() ? 1 : 4;

// A token that can be revoked: afterwards the server answers 401 to every request, as it would
// to a candidate cut off from it.
class RevocableToken : public TokenSource {
 public:
  explicit RevocableToken(std::string token) : token_(std::move(token)) {}
  absl::StatusOr<std::string> Token() override {
    return revoked_ ? std::string("revoked-token") : token_;
  }
  void Revoke() { revoked_ = true; }

 private:
  const std::string token_;
  std::atomic<bool> revoked_{false};
};

// A candidate running LeaderElector::Run() on a thread of its own.
class Candidate {
 public:
  Candidate(RestClient* client, Clock* clock, LeaderElectionConfig config) {
    config.on_started_leading = [this] { ++started_; };
    config.on_stopped_leading = [this] { ++stopped_; };
    absl::StatusOr<std::unique_ptr<LeaderElector>> elector =
        LeaderElector::Create(client, clock, std::move(config));
    EXPECT_TRUE(elector.ok()) << elector.status();
    elector_ = *std::move(elector);
  }
  ~Candidate() { StopAndJoin(); }

  void Start() {
    thread_ = std::thread([this] {
      result_ = elector_->Run();
      done_ = true;
    });
  }
  void StopAndJoin() {
    elector_->Stop();
    if (thread_.joinable()) thread_.join();
  }

  LeaderElector& elector() { return *elector_; }
  bool IsLeader() const { return elector_->IsLeader(); }
  const std::string& identity() const { return elector_->config().identity; }
  int started() const { return started_; }
  int stopped() const { return stopped_; }
  bool done() const { return done_; }
  // Valid once done().
  const absl::Status& result() const { return result_; }

 private:
  std::unique_ptr<LeaderElector> elector_;
  std::thread thread_;
  std::atomic<int> started_{0};
  std::atomic<int> stopped_{0};
  std::atomic<bool> done_{false};
  absl::Status result_;
};

// Watches candidates on a thread of its own and counts the moments when more than one leads.
class OneLeaderMonitor {
 public:
  explicit OneLeaderMonitor(std::vector<Candidate*> candidates)
      : candidates_(std::move(candidates)), thread_([this] {
          while (!stop_) {
            int leaders = 0;
            for (Candidate* candidate : candidates_) leaders += candidate->IsLeader() ? 1 : 0;
            if (leaders > 1) ++violations_;
            ++checks_;
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
        }) {}
  ~OneLeaderMonitor() { Finish(); }
  void Finish() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int violations() const { return violations_; }
  int checks() const { return checks_; }

 private:
  const std::vector<Candidate*> candidates_;
  std::atomic<bool> stop_{false};
  std::atomic<int> violations_{0};
  std::atomic<int> checks_{0};
  std::thread thread_;
};

class LeaderElectionTest : public KubeFixture {
 protected:
  // Short durations, so tests take seconds: lease 2 s, renew deadline 1.5 s, retry 0.3 s (times
  // kSlowdown).
  LeaderElectionConfig Fast(const std::string& identity) const {
    LeaderElectionConfig config;
    config.lease_namespace = ns_;
    config.lease_name = kLease;
    config.identity = identity;
    config.lease_duration_ns = 2 * kNanosPerSecond * kSlowdown;
    config.renew_deadline_ns = 1500 * kNanosPerMilli * kSlowdown;
    config.retry_period_ns = 300 * kNanosPerMilli * kSlowdown;
    return config;
  }

  std::unique_ptr<Candidate> NewCandidate(RestClient* client, LeaderElectionConfig config) {
    return std::make_unique<Candidate>(client, &clock_, std::move(config));
  }

  web::json::value LeaseSpec() {
    absl::StatusOr<web::json::value> lease = admin_->Get(Leases(), ns_, kLease);
    EXPECT_TRUE(lease.ok()) << lease.status();
    return lease.ok() && lease->has_field("spec") ? lease->at("spec") : web::json::value::object();
  }
  std::string Holder() {
    web::json::value spec = LeaseSpec();
    return spec.has_field("holderIdentity") ? spec.at("holderIdentity").as_string() : "";
  }
  int Transitions() {
    web::json::value spec = LeaseSpec();
    return spec.has_field("leaseTransitions") ? spec.at("leaseTransitions").as_integer() : 0;
  }
};

TEST_F(LeaderElectionTest, ConfigIsValidated) {
  EXPECT_TRUE(LeaderElector::Create(admin_.get(), &clock_, Fast("a")).ok());
  LeaderElectionConfig no_identity = Fast("");
  EXPECT_THAT(LeaderElector::Create(admin_.get(), &clock_, no_identity).status().message(),
              HasSubstr("identity"));
  LeaderElectionConfig no_lease = Fast("a");
  no_lease.lease_name.clear();
  EXPECT_EQ(LeaderElector::Create(admin_.get(), &clock_, no_lease).status().code(),
            absl::StatusCode::kInvalidArgument);
  LeaderElectionConfig renew_too_long = Fast("a");
  renew_too_long.renew_deadline_ns = renew_too_long.lease_duration_ns;
  EXPECT_THAT(LeaderElector::Create(admin_.get(), &clock_, renew_too_long).status().message(),
              HasSubstr("lease duration > renew deadline"));
  // The renew deadline must exceed 1.2 retry periods.
  LeaderElectionConfig retry_too_long = Fast("a");
  retry_too_long.retry_period_ns = retry_too_long.renew_deadline_ns * 5 / 6 + 1;
  EXPECT_EQ(LeaderElector::Create(admin_.get(), &clock_, retry_too_long).status().code(),
            absl::StatusCode::kInvalidArgument);
  LeaderElectionConfig retry_just_short_enough = Fast("a");
  retry_just_short_enough.retry_period_ns = retry_just_short_enough.renew_deadline_ns * 5 / 6 - 1;
  EXPECT_TRUE(LeaderElector::Create(admin_.get(), &clock_, retry_just_short_enough).ok());
  const LeaderElectionConfig defaults;
  EXPECT_EQ(defaults.lease_duration_ns, 15 * kNanosPerSecond);
  EXPECT_EQ(defaults.renew_deadline_ns, 10 * kNanosPerSecond);
  EXPECT_EQ(defaults.retry_period_ns, 2 * kNanosPerSecond);
  EXPECT_TRUE(defaults.release_on_cancel);
}

TEST_F(LeaderElectionTest, OneCandidateAcquiresRenewsAndReleasesOnStop) {
  std::vector<std::string> leaders;
  Mutex leaders_mu;
  LeaderElectionConfig config = Fast("host-a_1");
  config.on_new_leader = [&](const std::string& identity) {
    MutexLock lock(&leaders_mu);
    leaders.push_back(identity);
  };
  std::unique_ptr<Candidate> a = NewCandidate(admin_.get(), config);
  EXPECT_FALSE(a->IsLeader());
  a->Start();
  ASSERT_TRUE(Eventually([&] { return a->IsLeader(); }));
  EXPECT_EQ(a->started(), 1);
  EXPECT_EQ(a->elector().GetLeader(), "host-a_1");

  web::json::value spec = LeaseSpec();
  EXPECT_EQ(spec.at("holderIdentity").as_string(), "host-a_1");
  EXPECT_EQ(spec.at("leaseDurationSeconds").as_integer(), 2 * kSlowdown);
  EXPECT_EQ(spec.at("leaseTransitions").as_integer(), 0);
  const std::string acquired = spec.at("acquireTime").as_string();
  // RFC 3339 micro time in UTC: 2006-01-02T15:04:05.000000Z.
  EXPECT_THAT(acquired, ::testing::MatchesRegex(
                            "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{6}Z"));

  // Renewals move renewTime and keep acquireTime.
  const std::string first_renew = spec.at("renewTime").as_string();
  ASSERT_TRUE(Eventually([&] { return LeaseSpec().at("renewTime").as_string() != first_renew; }));
  EXPECT_EQ(LeaseSpec().at("acquireTime").as_string(), acquired);
  EXPECT_TRUE(a->IsLeader());

  a->StopAndJoin();
  ASSERT_TRUE(a->done());
  EXPECT_TRUE(a->result().ok()) << a->result();
  EXPECT_FALSE(a->IsLeader());
  EXPECT_EQ(a->stopped(), 1);
  // Released: no holder, a one-second lease, the transition count kept.
  spec = LeaseSpec();
  EXPECT_EQ(spec.at("holderIdentity").as_string(), "");
  EXPECT_EQ(spec.at("leaseDurationSeconds").as_integer(), 1);
  EXPECT_EQ(spec.at("leaseTransitions").as_integer(), 0);
  MutexLock lock(&leaders_mu);
  EXPECT_THAT(leaders, ::testing::ElementsAre("host-a_1", ""));
}

TEST_F(LeaderElectionTest, OneOfTwoLeadsAtATimeAndTheOtherTakesOverWhenTheLeaseExpires) {
  LeaderElectionConfig config_a = Fast("a");
  LeaderElectionConfig config_b = Fast("b");
  config_a.release_on_cancel = config_b.release_on_cancel = false;
  std::unique_ptr<RestClient> client_b = NewClient(plane_->admin_token(), Unlimited());
  std::unique_ptr<Candidate> a = NewCandidate(admin_.get(), config_a);
  std::unique_ptr<Candidate> b = NewCandidate(client_b.get(), config_b);
  OneLeaderMonitor monitor({a.get(), b.get()});
  a->Start();
  b->Start();
  ASSERT_TRUE(Eventually([&] { return a->IsLeader() || b->IsLeader(); }));
  // Both campaign for a few lease durations while the monitor checks that they never both lead.
  std::this_thread::sleep_for(std::chrono::seconds(5));
  Candidate* leader = nullptr;
  ASSERT_TRUE(Eventually([&] {
    leader = a->IsLeader() ? a.get() : (b->IsLeader() ? b.get() : nullptr);
    return leader != nullptr;
  }));
  Candidate* follower = leader == a.get() ? b.get() : a.get();
  EXPECT_FALSE(follower->IsLeader());
  EXPECT_EQ(follower->started(), 0);
  const int64_t follower_attempts = follower->elector().attempts();
  EXPECT_TRUE(Eventually([&] { return follower->elector().attempts() > follower_attempts; }))
      << "the follower stopped trying";
  EXPECT_EQ(follower->elector().GetLeader(), leader->identity());
  EXPECT_EQ(Holder(), leader->identity());

  // The leader stops without releasing: the follower waits out the lease, then takes it.
  leader->StopAndJoin();
  EXPECT_EQ(Holder(), leader->identity());
  ASSERT_TRUE(Eventually([&] { return follower->IsLeader(); }));
  EXPECT_EQ(Holder(), follower->identity());
  EXPECT_EQ(Transitions(), 1);
  EXPECT_EQ(follower->started(), 1);
  EXPECT_EQ(leader->stopped(), 1);
  monitor.Finish();
  EXPECT_EQ(monitor.violations(), 0) << "two leaders at once, in " << monitor.checks() << " checks";
  EXPECT_GT(monitor.checks(), 100);
}

TEST_F(LeaderElectionTest, AReleaseLetsTheNextCandidateTakeOverAtOnce) {
  // A 60-second lease: a takeover within the 30 s the test waits can only come from the release.
  LeaderElectionConfig config_a = Fast("a");
  config_a.lease_duration_ns = 60 * kNanosPerSecond;
  config_a.renew_deadline_ns = 40 * kNanosPerSecond;
  LeaderElectionConfig config_b = config_a;
  config_b.identity = "b";
  std::unique_ptr<RestClient> client_b = NewClient(plane_->admin_token(), Unlimited());
  std::unique_ptr<Candidate> a = NewCandidate(admin_.get(), config_a);
  std::unique_ptr<Candidate> b = NewCandidate(client_b.get(), config_b);
  a->Start();
  ASSERT_TRUE(Eventually([&] { return a->IsLeader(); }));
  b->Start();
  ASSERT_TRUE(Eventually([&] { return b->elector().attempts() >= 2; }));
  EXPECT_EQ(b->elector().GetLeader(), "a");
  EXPECT_FALSE(b->IsLeader());
  EXPECT_TRUE(absl::IsFailedPrecondition(b->elector().last_error())) << b->elector().last_error();

  a->StopAndJoin();
  EXPECT_TRUE(a->result().ok()) << a->result();
  ASSERT_TRUE(Eventually([&] { return b->IsLeader(); }));
  EXPECT_EQ(Holder(), "b");
  EXPECT_EQ(Transitions(), 1);
  EXPECT_EQ(LeaseSpec().at("leaseDurationSeconds").as_integer(), 60);
}

TEST_F(LeaderElectionTest, ALeaderWhoseLeaseIsTakenStepsDown) {
  std::unique_ptr<Candidate> a = NewCandidate(admin_.get(), Fast("a"));
  a->Start();
  ASSERT_TRUE(Eventually([&] { return a->IsLeader(); }));

  // Someone else writes the Lease (as a candidate of another build could).
  absl::StatusOr<web::json::value> lease = absl::UnavailableError("not read");
  absl::StatusOr<web::json::value> taken = absl::UnavailableError("not written");
  ASSERT_TRUE(Eventually([&] {
    lease = admin_->Get(Leases(), ns_, kLease);
    if (!lease.ok()) return false;
    (*lease)["spec"]["holderIdentity"] = web::json::value("intruder");
    (*lease)["spec"]["leaseDurationSeconds"] = web::json::value(3600);
    taken = admin_->Update(Leases(), ns_, *lease);
    return taken.ok();  // a Conflict with a's renewal: read again
  }));

  ASSERT_TRUE(Eventually([&] { return a->done(); }));
  EXPECT_FALSE(a->IsLeader());
  EXPECT_EQ(a->stopped(), 1);
  EXPECT_EQ(a->result().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(a->result().message(), HasSubstr("lost the leadership"));
  EXPECT_THAT(a->result().message(), HasSubstr("intruder"));
  EXPECT_EQ(a->elector().GetLeader(), "intruder");
  // A leader that lost does not release what is not its own.
  EXPECT_EQ(Holder(), "intruder");
}

TEST_F(LeaderElectionTest, ALeaderCutOffFromTheServerStepsDownBeforeAnotherTakesOver) {
  auto token = std::make_shared<RevocableToken>(plane_->admin_token());
  RestConfig config = ConfigFor("");
  config.token = token;
  absl::StatusOr<std::unique_ptr<RestClient>> client_a =
      RestClient::Create(config, &clock_, Unlimited());
  ASSERT_TRUE(client_a.ok());
  std::unique_ptr<Candidate> a = NewCandidate(client_a->get(), Fast("a"));
  std::unique_ptr<Candidate> b = NewCandidate(admin_.get(), Fast("b"));
  OneLeaderMonitor monitor({a.get(), b.get()});
  a->Start();
  ASSERT_TRUE(Eventually([&] { return a->IsLeader(); }));
  b->Start();
  ASSERT_TRUE(Eventually([&] { return b->elector().attempts() >= 2; }));
  EXPECT_FALSE(b->IsLeader());

  token->Revoke();
  ASSERT_TRUE(Eventually([&] { return b->IsLeader(); }));
  ASSERT_TRUE(Eventually([&] { return a->done(); }));
  EXPECT_EQ(a->stopped(), 1);
  EXPECT_TRUE(IsUnauthorized(a->elector().last_error())) << a->elector().last_error();
  EXPECT_THAT(a->result().message(), HasSubstr("lost the leadership"));
  EXPECT_EQ(Holder(), "b");
  monitor.Finish();
  EXPECT_EQ(monitor.violations(), 0) << "two leaders at once, in " << monitor.checks() << " checks";
}

TEST_F(LeaderElectionTest, AnUnreachableServerNeverLeads) {
  RestConfig config = ConfigFor(plane_->admin_token());
  config.server = "https://127.0.0.1:1";  // nothing listens on port 1
  absl::StatusOr<std::unique_ptr<RestClient>> unreachable = RestClient::Create(config, &clock_);
  ASSERT_TRUE(unreachable.ok());
  std::unique_ptr<Candidate> a = NewCandidate(unreachable->get(), Fast("a"));
  a->Start();
  ASSERT_TRUE(Eventually([&] { return a->elector().attempts() >= 3; }));
  EXPECT_FALSE(a->IsLeader());
  EXPECT_EQ(a->started(), 0);
  EXPECT_TRUE(IsRetryable(a->elector().last_error())) << a->elector().last_error();
  a->StopAndJoin();
  EXPECT_TRUE(a->result().ok());
  EXPECT_EQ(a->stopped(), 0);
}

TEST_F(LeaderElectionTest, WithoutRbacACandidateSaysWhyAndNeverLeads) {
  std::unique_ptr<RestClient> user = NewClient(plane_->user_token(), Unlimited());
  std::unique_ptr<Candidate> a = NewCandidate(user.get(), Fast("a"));
  a->Start();
  ASSERT_TRUE(Eventually([&] { return a->elector().attempts() >= 3; }));
  const absl::Status error = a->elector().last_error();
  EXPECT_TRUE(IsForbidden(error)) << error;
  EXPECT_THAT(error.message(), HasSubstr(testing::KubeControlPlane::kUser));
  EXPECT_THAT(error.message(), HasSubstr("leases"));
  EXPECT_FALSE(a->IsLeader());
  EXPECT_EQ(a->started(), 0);
  EXPECT_EQ(a->elector().GetLeader(), "");
  a->StopAndJoin();
  EXPECT_TRUE(absl::IsNotFound(admin_->Get(Leases(), ns_, kLease).status()));
}

}  // namespace
}  // namespace clusterprof::kube
