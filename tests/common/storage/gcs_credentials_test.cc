// gcs::Credentials against local stand-ins of Google's OAuth token endpoint (which checks the
// JWT's RS256 signature and claims for real) and of the GCE/GKE metadata server: the order of
// the credential chain, key-file errors, token caching, refresh, invalidation, one fetch for
// concurrent callers, retries, and a metadata server that is not there; user credentials from
// `gcloud auth application-default login` (the refresh_token grant) and where the chain finds
// them.
#include "common/storage/gcs_credentials.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fake_http_transport.h"
#include "tests/support/gcs_token_servers.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::storage::gcs {
namespace {

using ::clusterprof::testing::MakeTestServiceAccountKey;
using ::clusterprof::testing::MetadataServer;
using ::clusterprof::testing::OAuthTokenServer;
using ::clusterprof::testing::TempDir;
using ::clusterprof::testing::TestServiceAccountKey;
using ::clusterprof::testing::WriteFileOrDie;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

using Env = std::map<std::string, std::string>;

constexpr int64_t kMaxBackoffNs = kNanosPerSecond;
constexpr int64_t kClockStepNs = 20 * kNanosPerMilli;

CredentialsOptions OptionsFor(Clock* clock, Env env) {
  CredentialsOptions options;
  options.clock = clock;
  options.getenv = [env = std::move(env)](std::string_view name) -> std::optional<std::string> {
    const auto it = env.find(std::string(name));
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  // One attempt unless a test says otherwise: a retry sleeps on the simulated clock, which only
  // RunAdvancingClock moves.
  options.max_attempts = 1;
  options.initial_backoff_ns = 100 * kNanosPerMilli;
  options.max_backoff_ns = kMaxBackoffNs;
  return options;
}

// Options for tests of the retries (run the calls under RunAdvancingClock).
CredentialsOptions RetryingOptionsFor(Clock* clock, Env env = {}) {
  CredentialsOptions options = OptionsFor(clock, std::move(env));
  options.max_attempts = 4;
  return options;
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// The token of a "Bearer <token>" header.
std::string TokenOf(const absl::StatusOr<std::string>& header) {
  EXPECT_TRUE(header.ok()) << header.status();
  if (!header.ok()) return "";
  EXPECT_THAT(*header, StartsWith("Bearer "));
  return header->substr(std::string_view("Bearer ").size());
}

// Runs `fn` on a thread, and moves `clock` on in small steps while that thread sleeps on it (the
// backoff between retries), until `fn` returns. The steps overshoot a sleep's deadline by a few
// steps at most.
template <typename Fn>
auto RunAdvancingClock(SimulatedClock& clock, Fn fn) -> decltype(fn()) {
  std::atomic<bool> done{false};
  std::optional<decltype(fn())> result;
  std::thread thread([&] {
    result.emplace(fn());
    done.store(true);
  });
  while (!done.load()) {
    if (clock.sleepers() > 0) clock.AdvanceNs(kClockStepNs);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  thread.join();
  return std::move(*result);
}

// A port on 127.0.0.1 that nothing listens on.
int UnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

// A listener on 127.0.0.1 that never accepts, with its accept queue filled: the kernel drops
// further SYNs, so a connection to it neither succeeds nor fails until the client gives up (as
// with 169.254.169.254 off GCE).
class BlackholeListener {
 public:
  BlackholeListener() {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listener_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(listen(listener_, 0), 0);
    socklen_t length = sizeof(address);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    for (int i = 0; i < 3; ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
      fillers_.push_back(fd);
    }
  }
  ~BlackholeListener() {
    for (const int fd : fillers_) close(fd);
    close(listener_);
  }
  int port() const { return port_; }

 private:
  int listener_ = -1;
  int port_ = 0;
  std::vector<int> fillers_;
};

// A token endpoint that trusts one service-account key, and that key's file.
class ServiceAccountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<OAuthTokenServer>> server =
        OAuthTokenServer::Start({.clock = &clock_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    key_ = MakeTestServiceAccountKey(server_->token_uri());
    ASSERT_TRUE(server_->TrustKey(key_).ok());
    key_path_ = temp_.Join("key.json");
    WriteFileOrDie(key_path_, key_.json_key);
  }

  std::unique_ptr<Credentials> FromKeyFile(CredentialsOptions options) {
    absl::StatusOr<std::unique_ptr<Credentials>> credentials =
        ServiceAccountKeyCredentials(key_path_, options);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return credentials.ok() ? std::move(*credentials) : nullptr;
  }
  std::unique_ptr<Credentials> FromKeyFile() { return FromKeyFile(OptionsFor(&clock_, {})); }

  SimulatedClock clock_;
  TempDir temp_;
  std::unique_ptr<OAuthTokenServer> server_;
  TestServiceAccountKey key_;
  std::string key_path_;
};

std::unique_ptr<MetadataServer> StartMetadataServer(Clock* clock) {
  absl::StatusOr<std::unique_ptr<MetadataServer>> server = MetadataServer::Start({.clock = clock});
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

// --- The chain --------------------------------------------------------------------------------

using ChainTest = ServiceAccountTest;

TEST_F(ChainTest, EmulatorHostBeatsKeyFileAndMetadataServer) {
  std::unique_ptr<MetadataServer> metadata = StartMetadataServer(&clock_);
  absl::StatusOr<std::unique_ptr<Credentials>> credentials =
      DefaultCredentials(OptionsFor(&clock_, {{"STORAGE_EMULATOR_HOST", "localhost:9023"},
                                              {"GOOGLE_APPLICATION_CREDENTIALS", key_path_},
                                              {"GCE_METADATA_HOST", metadata->host()}}));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ((*credentials)->Identity(), "anonymous (STORAGE_EMULATOR_HOST=localhost:9023)");
  absl::StatusOr<std::string> header = (*credentials)->AuthorizationHeader();
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(*header, "");
  (*credentials)->Invalidate();
  EXPECT_EQ((*credentials)->token_fetches(), 0);
  EXPECT_EQ(server_->requests(), 0);
  EXPECT_EQ(metadata->requests(), 0);
}

TEST_F(ChainTest, KeyFileBeatsMetadataServer) {
  std::unique_ptr<MetadataServer> metadata = StartMetadataServer(&clock_);
  absl::StatusOr<std::unique_ptr<Credentials>> credentials =
      DefaultCredentials(OptionsFor(&clock_, {{"GOOGLE_APPLICATION_CREDENTIALS", key_path_},
                                              {"GCE_METADATA_HOST", metadata->host()}}));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ((*credentials)->Identity(),
            StrCat("service account ", key_.client_email, " (key file ", key_path_, ")"));
  const std::string token = TokenOf((*credentials)->AuthorizationHeader());
  EXPECT_TRUE(server_->IsValidToken(token, clock_.WallNs()));
  EXPECT_EQ(server_->grants(), 1);
  EXPECT_EQ(metadata->requests(), 0);
}

TEST_F(ChainTest, MetadataServerWhenNothingElseIsSet) {
  std::unique_ptr<MetadataServer> metadata = StartMetadataServer(&clock_);
  // Empty variables count as unset.
  absl::StatusOr<std::unique_ptr<Credentials>> credentials =
      DefaultCredentials(OptionsFor(&clock_, {{"STORAGE_EMULATOR_HOST", ""},
                                              {"GOOGLE_APPLICATION_CREDENTIALS", ""},
                                              {"GCE_METADATA_HOST", metadata->host()}}));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  // DefaultCredentials asked the server who we are.
  EXPECT_EQ((*credentials)->Identity(),
            StrCat(::clusterprof::testing::kTestServiceAccountEmail,
                   " from the metadata server at ", metadata->host(), " (Workload Identity)"));
  const std::string token = TokenOf((*credentials)->AuthorizationHeader());
  EXPECT_TRUE(metadata->IsValidToken(token, clock_.WallNs()));
  EXPECT_EQ(metadata->token_requests(), 1);
  // Every request carried Metadata-Flavor: Google (the server answers 403 otherwise).
  EXPECT_EQ(metadata->rejected_requests(), 0);
  EXPECT_EQ(server_->requests(), 0);
}

TEST_F(ChainTest, UnusableKeyFileIsAnErrorNotAFallThrough) {
  std::unique_ptr<MetadataServer> metadata = StartMetadataServer(&clock_);
  const std::string missing = temp_.Join("missing.json");
  absl::StatusOr<std::unique_ptr<Credentials>> credentials =
      DefaultCredentials(OptionsFor(&clock_, {{"GOOGLE_APPLICATION_CREDENTIALS", missing},
                                              {"GCE_METADATA_HOST", metadata->host()}}));
  ASSERT_FALSE(credentials.ok());
  EXPECT_TRUE(absl::IsNotFound(credentials.status())) << credentials.status();
  EXPECT_THAT(Message(credentials.status()),
              AllOf(HasSubstr(StrCat("GOOGLE_APPLICATION_CREDENTIALS=", missing)),
                    HasSubstr("No such file")));
  EXPECT_EQ(metadata->requests(), 0);
}

// --- Service-account keys ---------------------------------------------------------------------

TEST_F(ServiceAccountTest, SignedJwtIsAcceptedByTheTokenEndpoint) {
  std::unique_ptr<Credentials> credentials = FromKeyFile();
  ASSERT_NE(credentials, nullptr);
  const std::string token = TokenOf(credentials->AuthorizationHeader());
  EXPECT_THAT(token, StartsWith("ya29.test-"));
  EXPECT_TRUE(server_->IsValidToken(token, clock_.WallNs()));
  EXPECT_EQ(server_->grants(), 1);
  EXPECT_EQ(server_->last_error(), "");
  EXPECT_EQ(server_->last_scope(), kDefaultScope);
  EXPECT_EQ(credentials->token_fetches(), 1);
}

TEST_F(ServiceAccountTest, ScopeIsConfigurable) {
  CredentialsOptions options = OptionsFor(&clock_, {});
  options.scope = "https://www.googleapis.com/auth/devstorage.read_only";
  std::unique_ptr<Credentials> credentials = FromKeyFile(options);
  ASSERT_NE(credentials, nullptr);
  TokenOf(credentials->AuthorizationHeader());
  EXPECT_EQ(server_->last_scope(), options.scope);
}

TEST_F(ServiceAccountTest, KeyFromJsonNamesItsSource) {
  absl::StatusOr<std::unique_ptr<Credentials>> credentials = ServiceAccountKeyCredentialsFromJson(
      key_.json_key, "secret default/gcs-key", OptionsFor(&clock_, {}));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ((*credentials)->Identity(),
            StrCat("service account ", key_.client_email, " (key file secret default/gcs-key)"));
  EXPECT_TRUE(
      server_->IsValidToken(TokenOf((*credentials)->AuthorizationHeader()), clock_.WallNs()));
}

TEST_F(ServiceAccountTest, KeyNotMatchingTheServersIsRejectedAtOnceNamingTheIdentity) {
  // The token endpoint knows another public key under this key's id (a key rotated or
  // re-created): the signature cannot verify.
  const TestServiceAccountKey other =
      MakeTestServiceAccountKey(server_->token_uri(), "other@test-project.iam.gserviceaccount.com");
  ASSERT_TRUE(
      server_->TrustKey(key_.public_key_pem, other.private_key_id, other.client_email).ok());
  const std::string other_path = temp_.Join("other.json");
  WriteFileOrDie(other_path, other.json_key);
  absl::StatusOr<std::unique_ptr<Credentials>> credentials =
      ServiceAccountKeyCredentials(other_path, RetryingOptionsFor(&clock_));
  ASSERT_TRUE(credentials.ok()) << credentials.status();

  absl::StatusOr<std::string> header =
      RunAdvancingClock(clock_, [&] { return (*credentials)->AuthorizationHeader(); });
  ASSERT_FALSE(header.ok());
  EXPECT_TRUE(absl::IsUnauthenticated(header.status())) << header.status();
  EXPECT_THAT(
      Message(header.status()),
      AllOf(HasSubstr(StrCat("cannot get an access token for service account ", other.client_email,
                             " (key file ", other_path, ") from ", server_->token_uri())),
            HasSubstr("400 invalid_grant: Invalid JWT Signature."),
            HasSubstr(StrCat("Check that the key file ", other_path, " is current"))));
  EXPECT_EQ(server_->last_error(), "Invalid JWT Signature.");
  // A 400 is not retried.
  EXPECT_EQ(server_->requests(), 1);
  EXPECT_EQ((*credentials)->token_fetches(), 1);
  EXPECT_EQ(server_->grants(), 0);
}

TEST_F(ServiceAccountTest, JwtOutsideTheServersTimeIsRejected) {
  std::unique_ptr<Credentials> credentials = FromKeyFile();
  ASSERT_NE(credentials, nullptr);
  // The machine's clock is 10 minutes ahead of Google's.
  clock_.StepWallNs(10 * 60 * kNanosPerSecond);
  SimulatedClock server_time;
  absl::StatusOr<std::unique_ptr<OAuthTokenServer>> server =
      OAuthTokenServer::Start({.clock = &server_time});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->TrustKey(key_).ok());
  // The same key, pointed at the server that keeps the right time.
  std::string json = key_.json_key;
  const std::string old_uri = server_->token_uri();
  json.replace(json.find(old_uri), old_uri.size(), (*server)->token_uri());
  absl::StatusOr<std::unique_ptr<Credentials>> skewed =
      ServiceAccountKeyCredentialsFromJson(json, key_path_, OptionsFor(&clock_, {}));
  ASSERT_TRUE(skewed.ok()) << skewed.status();
  absl::StatusOr<std::string> header = (*skewed)->AuthorizationHeader();
  ASSERT_FALSE(header.ok());
  EXPECT_THAT(Message(header.status()),
              AllOf(HasSubstr("invalid_grant"), HasSubstr("iat and exp"), HasSubstr("clock")));
}

class KeyFileErrorTest : public ServiceAccountTest {
 protected:
  absl::Status LoadError(std::string_view text) {
    const std::string path = temp_.Join("bad.json");
    WriteFileOrDie(path, text);
    absl::StatusOr<std::unique_ptr<Credentials>> credentials =
        ServiceAccountKeyCredentials(path, OptionsFor(&clock_, {}));
    EXPECT_FALSE(credentials.ok());
    return credentials.ok() ? absl::OkStatus() : credentials.status();
  }
  std::string BadPath() { return temp_.Join("bad.json"); }
};

TEST_F(KeyFileErrorTest, NotJson) {
  const absl::Status status = LoadError("this is not JSON {");
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(Message(status), AllOf(HasSubstr(BadPath()), HasSubstr("not a JSON object")));
}

TEST_F(KeyFileErrorTest, UserCredentialsAreNotAServiceAccountKey) {
  const absl::Status status = LoadError(R"({
    "client_id": "764086051850-6qr4p6gpi6hn506pt8ejuq83di341hur.apps.googleusercontent.com",
    "client_secret": "d-FL95Q19q7MQmFpd7hHD0Ty",
    "refresh_token": "1//0e-refresh",
    "type": "authorized_user"
  })");
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(Message(status),
              AllOf(HasSubstr(BadPath()), HasSubstr("\"type\": \"authorized_user\""),
                    HasSubstr("service_account"), HasSubstr("gcloud auth application-default")));
}

TEST_F(KeyFileErrorTest, MissingPrivateKey) {
  const absl::Status status = LoadError(R"({
    "type": "service_account",
    "project_id": "test-project",
    "private_key_id": "0123456789abcdef",
    "client_email": "sa@test-project.iam.gserviceaccount.com",
    "token_uri": "https://oauth2.googleapis.com/token"
  })");
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(Message(status), AllOf(HasSubstr(BadPath()), HasSubstr("\"private_key\"")));
}

TEST_F(KeyFileErrorTest, MissingClientEmail) {
  std::string json = key_.json_key;
  json.replace(json.find("\"client_email\""), std::string_view("\"client_email\"").size(),
               "\"email\"");
  const absl::Status status = LoadError(json);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(Message(status), AllOf(HasSubstr(BadPath()), HasSubstr("\"client_email\"")));
}

TEST_F(KeyFileErrorTest, PrivateKeyThatIsNotAKey) {
  std::string json = key_.json_key;
  const size_t begin = json.find("-----BEGIN PRIVATE KEY-----");
  ASSERT_NE(begin, std::string::npos);
  json.insert(begin + std::string_view("-----BEGIN PRIVATE KEY-----\\n").size(), "garbage");
  const absl::Status status = LoadError(json);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(Message(status), AllOf(HasSubstr(BadPath()), HasSubstr("\"private_key\""),
                                     HasSubstr("not a PEM private key")));
}

TEST_F(KeyFileErrorTest, MissingFile) {
  const std::string path = temp_.Join("nowhere.json");
  absl::StatusOr<std::unique_ptr<Credentials>> credentials =
      ServiceAccountKeyCredentials(path, OptionsFor(&clock_, {}));
  ASSERT_FALSE(credentials.ok());
  EXPECT_TRUE(absl::IsNotFound(credentials.status())) << credentials.status();
  EXPECT_THAT(Message(credentials.status()), HasSubstr(path));
}

// --- Caching and refresh ----------------------------------------------------------------------

TEST_F(ServiceAccountTest, TokenIsCachedAcrossCalls) {
  std::unique_ptr<Credentials> credentials = FromKeyFile();
  ASSERT_NE(credentials, nullptr);
  const std::string first = TokenOf(credentials->AuthorizationHeader());
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(TokenOf(credentials->AuthorizationHeader()), first);
    clock_.AdvanceNs(60 * kNanosPerSecond);  // 20 minutes in all: far from expiry
  }
  EXPECT_EQ(server_->grants(), 1);
  EXPECT_EQ(credentials->token_fetches(), 1);
}

TEST_F(ServiceAccountTest, HourLongTokenIsRefreshedFiveMinutesBeforeExpiry) {
  std::unique_ptr<Credentials> credentials = FromKeyFile();
  ASSERT_NE(credentials, nullptr);
  const std::string first = TokenOf(credentials->AuthorizationHeader());
  clock_.AdvanceNs(3299 * kNanosPerSecond);
  EXPECT_EQ(TokenOf(credentials->AuthorizationHeader()), first);
  EXPECT_EQ(server_->grants(), 1);
  clock_.AdvanceNs(2 * kNanosPerSecond);
  const std::string second = TokenOf(credentials->AuthorizationHeader());
  EXPECT_NE(second, first);
  EXPECT_EQ(server_->grants(), 2);
  // Refreshed before the old one expired; the new one is good.
  EXPECT_TRUE(server_->IsValidToken(first, clock_.WallNs()));
  EXPECT_TRUE(server_->IsValidToken(second, clock_.WallNs()));
}

TEST_F(ServiceAccountTest, ShortLivedTokenIsRefreshedAtHalfItsLifetime) {
  server_->set_expires_in_s(120);
  std::unique_ptr<Credentials> credentials = FromKeyFile();
  ASSERT_NE(credentials, nullptr);
  const std::string first = TokenOf(credentials->AuthorizationHeader());
  clock_.AdvanceNs(59 * kNanosPerSecond);
  EXPECT_EQ(TokenOf(credentials->AuthorizationHeader()), first);
  clock_.AdvanceNs(2 * kNanosPerSecond);
  const std::string second = TokenOf(credentials->AuthorizationHeader());
  EXPECT_NE(second, first);
  EXPECT_EQ(server_->grants(), 2);
  EXPECT_TRUE(server_->IsValidToken(second, clock_.WallNs()));
}

TEST_F(ServiceAccountTest, InvalidateForcesANewToken) {
  std::unique_ptr<Credentials> credentials = FromKeyFile();
  ASSERT_NE(credentials, nullptr);
  const std::string first = TokenOf(credentials->AuthorizationHeader());
  credentials->Invalidate();
  const std::string second = TokenOf(credentials->AuthorizationHeader());
  EXPECT_NE(second, first);
  EXPECT_EQ(TokenOf(credentials->AuthorizationHeader()), second);
  EXPECT_EQ(server_->grants(), 2);
  EXPECT_EQ(credentials->token_fetches(), 2);
}

TEST_F(ServiceAccountTest, ConcurrentCallersShareOneFetch) {
  std::unique_ptr<Credentials> credentials = FromKeyFile();
  ASSERT_NE(credentials, nullptr);
  constexpr int kCallers = 8;
  std::vector<std::string> tokens(kCallers);
  std::vector<std::thread> callers;
  server_->HoldRequests();
  callers.emplace_back([&] { tokens[0] = TokenOf(credentials->AuthorizationHeader()); });
  // The first caller's fetch is in flight; the others arrive while it is.
  server_->WaitForHeldRequests(1);
  for (int i = 1; i < kCallers; ++i) {
    callers.emplace_back([&, i] { tokens[i] = TokenOf(credentials->AuthorizationHeader()); });
  }
  server_->ReleaseRequests();
  for (std::thread& caller : callers) caller.join();
  for (const std::string& token : tokens) EXPECT_EQ(token, tokens[0]);
  EXPECT_EQ(server_->grants(), 1);
  EXPECT_EQ(server_->requests(), 1);
  EXPECT_EQ(credentials->token_fetches(), 1);
}

// --- Retries ----------------------------------------------------------------------------------

TEST_F(ServiceAccountTest, ServerErrorsAreRetried) {
  std::unique_ptr<Credentials> credentials = FromKeyFile(RetryingOptionsFor(&clock_));
  ASSERT_NE(credentials, nullptr);
  server_->FailNextRequests(2, 503);
  absl::StatusOr<std::string> header =
      RunAdvancingClock(clock_, [&] { return credentials->AuthorizationHeader(); });
  EXPECT_TRUE(server_->IsValidToken(TokenOf(header), clock_.WallNs()));
  EXPECT_EQ(server_->requests(), 3);
  EXPECT_EQ(server_->grants(), 1);
  EXPECT_EQ(credentials->token_fetches(), 3);
}

TEST_F(ServiceAccountTest, RetriesEndAfterMaxAttempts) {
  CredentialsOptions options = RetryingOptionsFor(&clock_);
  options.max_attempts = 3;
  std::unique_ptr<Credentials> credentials = FromKeyFile(options);
  ASSERT_NE(credentials, nullptr);
  server_->FailNextRequests(100, 500);
  absl::StatusOr<std::string> header =
      RunAdvancingClock(clock_, [&] { return credentials->AuthorizationHeader(); });
  ASSERT_FALSE(header.ok());
  EXPECT_TRUE(absl::IsUnavailable(header.status())) << header.status();
  EXPECT_THAT(Message(header.status()),
              AllOf(HasSubstr(StrCat("service account ", key_.client_email)),
                    HasSubstr("500 internal_failure"), HasSubstr("(3 attempts)")));
  EXPECT_EQ(server_->requests(), 3);
}

TEST_F(ServiceAccountTest, ClientErrorsAreNotRetried) {
  std::unique_ptr<Credentials> credentials = FromKeyFile(RetryingOptionsFor(&clock_));
  ASSERT_NE(credentials, nullptr);
  server_->FailNextRequests(1, 403);
  absl::StatusOr<std::string> header =
      RunAdvancingClock(clock_, [&] { return credentials->AuthorizationHeader(); });
  ASSERT_FALSE(header.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(header.status())) << header.status();
  EXPECT_EQ(server_->requests(), 1);
  // The next call tries again (and succeeds).
  EXPECT_TRUE(server_->IsValidToken(TokenOf(credentials->AuthorizationHeader()), clock_.WallNs()));
}

TEST_F(ServiceAccountTest, CurrentTokenServesWhileRefreshesFail) {
  server_->set_expires_in_s(600);
  CredentialsOptions options = RetryingOptionsFor(&clock_);
  options.max_attempts = 2;
  std::unique_ptr<Credentials> credentials = FromKeyFile(options);
  ASSERT_NE(credentials, nullptr);
  const std::string first = TokenOf(credentials->AuthorizationHeader());
  clock_.AdvanceNs(301 * kNanosPerSecond);  // due for refresh (300 s before expiry)
  server_->FailNextRequests(1000, 503);
  absl::StatusOr<std::string> header =
      RunAdvancingClock(clock_, [&] { return credentials->AuthorizationHeader(); });
  EXPECT_EQ(TokenOf(header), first);
  // For the next 10 s callers take it without waiting on another refresh.
  const int requests = server_->requests();
  header = RunAdvancingClock(clock_, [&] { return credentials->AuthorizationHeader(); });
  EXPECT_EQ(TokenOf(header), first);
  EXPECT_EQ(server_->requests(), requests);
  // Too close to expiry (within 10 s; it was fetched at monotonic 0) to send it any more.
  clock_.AdvanceNs(591 * kNanosPerSecond - clock_.MonotonicNs());
  header = RunAdvancingClock(clock_, [&] { return credentials->AuthorizationHeader(); });
  EXPECT_FALSE(header.ok());
  EXPECT_TRUE(absl::IsUnavailable(header.status())) << header.status();
}

// --- The metadata server ----------------------------------------------------------------------

// The requests the metadata credentials send, and what they make of odd answers, through the
// in-process transport: no server needed to see exactly what goes out.
TEST(MetadataOverTransportTest, SendsTheMetadataFlavorAndReadsTheTokenAndEmail) {
  SimulatedClock clock;
  testing::FakeHttpTransport transport;
  transport.Route("http://metadata.test/computeMetadata/v1/instance/service-accounts/default/email",
                  [](const http::Request&) {
                    return testing::Reply(200, "sa@p.iam.gserviceaccount.com\n",
                                          {{"Metadata-Flavor", "Google"}});
                  });
  transport.Route("http://metadata.test/computeMetadata/v1/instance/service-accounts/default/token",
                  [](const http::Request&) {
                    return testing::Reply(
                        200, R"({"access_token":"ya29.x","expires_in":3600,"token_type":"Bearer"})",
                        {{"Metadata-Flavor", "Google"}});
                  });
  CredentialsOptions options = OptionsFor(&clock, {});
  options.transport = &transport;
  std::unique_ptr<Credentials> credentials = MetadataServerCredentials("metadata.test", options);
  absl::StatusOr<std::string> header = credentials->AuthorizationHeader();
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(*header, "Bearer ya29.x");
  EXPECT_THAT(credentials->Identity(), StartsWith("sa@p.iam.gserviceaccount.com from"));
  const std::vector<testing::RecordedRequest> sent = transport.Requests();
  ASSERT_EQ(sent.size(), 2u);
  for (const testing::RecordedRequest& request : sent) {
    EXPECT_EQ(request.Header("Metadata-Flavor"), "Google") << request.url;
  }
  EXPECT_EQ(sent[0].timeout_ns, options.metadata_connect_timeout_ns)
      << "the first request only looks for the server: a short limit";
  EXPECT_EQ(sent[1].timeout_ns, options.request_timeout_ns);
}

TEST(MetadataOverTransportTest, AnAnswerWithoutTheFlavorIsNotAMetadataServer) {
  SimulatedClock clock;
  testing::FakeHttpTransport transport;
  transport.Route("http://metadata.test",
                  [](const http::Request&) { return testing::Reply(200, "<html>captive portal"); });
  CredentialsOptions options = OptionsFor(&clock, {});
  options.transport = &transport;
  absl::StatusOr<std::string> header =
      MetadataServerCredentials("metadata.test", options)->AuthorizationHeader();
  ASSERT_FALSE(header.ok());
  EXPECT_THAT(Message(header.status()), HasSubstr("it is not a metadata server"));
}

class MetadataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metadata_ = StartMetadataServer(&clock_);
    ASSERT_NE(metadata_, nullptr);
  }

  SimulatedClock clock_;
  std::unique_ptr<MetadataServer> metadata_;
};

TEST_F(MetadataTest, TokenAndEmailFromTheMetadataServer) {
  std::unique_ptr<Credentials> credentials =
      MetadataServerCredentials(StrCat("http://", metadata_->host()), OptionsFor(&clock_, {}));
  // Nothing asked yet.
  EXPECT_EQ(credentials->Identity(),
            StrCat("the default service account of the metadata server at ", metadata_->host(),
                   " (Workload Identity)"));
  EXPECT_EQ(metadata_->requests(), 0);
  const std::string token = TokenOf(credentials->AuthorizationHeader());
  EXPECT_TRUE(metadata_->IsValidToken(token, clock_.WallNs()));
  EXPECT_THAT(credentials->Identity(),
              StartsWith(StrCat(::clusterprof::testing::kTestServiceAccountEmail,
                                " from the metadata server at ", metadata_->host())));
  EXPECT_EQ(metadata_->rejected_requests(), 0);
  EXPECT_EQ(credentials->token_fetches(), 1);
}

TEST_F(MetadataTest, TokenIsCachedRefreshedAndInvalidated) {
  metadata_->set_expires_in_s(120);
  std::unique_ptr<Credentials> credentials =
      MetadataServerCredentials(metadata_->host(), OptionsFor(&clock_, {}));
  const std::string first = TokenOf(credentials->AuthorizationHeader());
  clock_.AdvanceNs(59 * kNanosPerSecond);
  EXPECT_EQ(TokenOf(credentials->AuthorizationHeader()), first);
  EXPECT_EQ(metadata_->token_requests(), 1);
  clock_.AdvanceNs(2 * kNanosPerSecond);
  const std::string second = TokenOf(credentials->AuthorizationHeader());
  EXPECT_NE(second, first);
  EXPECT_EQ(metadata_->token_requests(), 2);
  credentials->Invalidate();
  EXPECT_NE(TokenOf(credentials->AuthorizationHeader()), second);
  EXPECT_EQ(metadata_->token_requests(), 3);
  EXPECT_EQ(credentials->token_fetches(), 3);
}

TEST_F(MetadataTest, ServerErrorsAreRetried) {
  std::unique_ptr<Credentials> credentials =
      MetadataServerCredentials(metadata_->host(), RetryingOptionsFor(&clock_));
  metadata_->FailNextRequests(2, 503);
  absl::StatusOr<std::string> header =
      RunAdvancingClock(clock_, [&] { return credentials->AuthorizationHeader(); });
  EXPECT_TRUE(metadata_->IsValidToken(TokenOf(header), clock_.WallNs()));
}

TEST_F(MetadataTest, NoServiceAccountIsExplained) {
  std::unique_ptr<Credentials> credentials =
      MetadataServerCredentials(metadata_->host(), RetryingOptionsFor(&clock_));
  metadata_->FailNextRequests(100, 404);
  absl::StatusOr<std::string> header =
      RunAdvancingClock(clock_, [&] { return credentials->AuthorizationHeader(); });
  ASSERT_FALSE(header.ok());
  EXPECT_TRUE(absl::IsNotFound(header.status())) << header.status();
  EXPECT_THAT(Message(header.status()), AllOf(HasSubstr(metadata_->host()), HasSubstr("404"),
                                              HasSubstr("iam.gke.io/gcp-service-account")));
  EXPECT_EQ(metadata_->requests(), 1);
}

TEST(MetadataAbsentTest, NothingListeningMeansNoCredentials) {
  RealClock clock;
  const std::string host = StrCat("127.0.0.1:", UnusedPort());
  CredentialsOptions options = RetryingOptionsFor(&clock, {{"GCE_METADATA_HOST", host}});
  options.initial_backoff_ns = 10 * kNanosPerMilli;
  const int64_t start_ns = clock.MonotonicNs();
  absl::StatusOr<std::unique_ptr<Credentials>> credentials = DefaultCredentials(options);
  EXPECT_LT(clock.MonotonicNs() - start_ns, 10 * kNanosPerSecond);
  ASSERT_FALSE(credentials.ok());
  EXPECT_TRUE(absl::IsNotFound(credentials.status())) << credentials.status();
  EXPECT_THAT(Message(credentials.status()),
              AllOf(StartsWith("no Google Cloud credentials found"), HasSubstr(host),
                    HasSubstr("(4 attempts)"), HasSubstr("STORAGE_EMULATOR_HOST"),
                    HasSubstr("GOOGLE_APPLICATION_CREDENTIALS"), HasSubstr("Workload Identity")));
}

TEST(MetadataAbsentTest, NoAnswerWithinTheConnectTimeoutMeansNoCredentials) {
  RealClock clock;
  BlackholeListener blackhole;
  const std::string host = StrCat("127.0.0.1:", blackhole.port());
  CredentialsOptions options = OptionsFor(&clock, {{"GCE_METADATA_HOST", host}});
  options.metadata_connect_timeout_ns = 300 * kNanosPerMilli;
  options.max_attempts = 2;
  options.initial_backoff_ns = 10 * kNanosPerMilli;
  const int64_t start_ns = clock.MonotonicNs();
  absl::StatusOr<std::unique_ptr<Credentials>> credentials = DefaultCredentials(options);
  const int64_t elapsed_ns = clock.MonotonicNs() - start_ns;
  ASSERT_FALSE(credentials.ok());
  EXPECT_GE(elapsed_ns, 2 * options.metadata_connect_timeout_ns);
  EXPECT_LT(elapsed_ns, 10 * kNanosPerSecond);
  EXPECT_TRUE(absl::IsNotFound(credentials.status())) << credentials.status();
  EXPECT_THAT(Message(credentials.status()),
              AllOf(StartsWith("no Google Cloud credentials found"), HasSubstr(host),
                    HasSubstr("within 300 ms"), HasSubstr("(2 attempts)"),
                    HasSubstr("GOOGLE_APPLICATION_CREDENTIALS")));

  // Made directly, the credentials say the same when asked for a token.
  std::unique_ptr<Credentials> direct = MetadataServerCredentials(host, options);
  absl::StatusOr<std::string> header = direct->AuthorizationHeader();
  ASSERT_FALSE(header.ok());
  EXPECT_THAT(Message(header.status()), StartsWith("no Google Cloud credentials found"));
  EXPECT_EQ(direct->token_fetches(), 0);
}

TEST_F(ServiceAccountTest, ServerThatIsNotAMetadataServerIsNoCredentials) {
  // The token endpoint answers, but not as a metadata server does.
  const std::string host = StrCat("127.0.0.1:", server_->port());
  std::unique_ptr<Credentials> credentials =
      MetadataServerCredentials(host, OptionsFor(&clock_, {}));
  absl::StatusOr<std::string> header = credentials->AuthorizationHeader();
  ASSERT_FALSE(header.ok());
  EXPECT_THAT(Message(header.status()), AllOf(StartsWith("no Google Cloud credentials found"),
                                              HasSubstr("not a metadata server")));
}

// --- User credentials (gcloud auth application-default login) --------------------------------

constexpr char kClientId[] =
    "764086051850-6qr4p6gpi6hn506pt8ejuq83di341hur.apps.googleusercontent.com";
constexpr char kClientSecret[] = "d-FL95Q19q7MQmFpd7hHD0Ty";
constexpr char kRefreshToken[] = "1//0e-test-refresh-token";

// The file `gcloud auth application-default login` writes, with the stand-in's token endpoint.
std::string UserCredentialsJson(std::string_view token_uri, std::string_view quota_project = "") {
  return StrCat(
      "{\n  \"account\": \"\",\n  \"client_id\": \"", kClientId, "\",\n  \"client_secret\": \"",
      kClientSecret, "\",\n",
      quota_project.empty() ? "" : StrCat("  \"quota_project_id\": \"", quota_project, "\",\n"),
      "  \"refresh_token\": \"", kRefreshToken, "\",\n  \"token_uri\": \"", token_uri,
      "\",\n  \"type\": \"authorized_user\",\n  \"universe_domain\": \"googleapis.com\"\n}\n");
}

// A token endpoint that knows one user's refresh token (and the service-account key of
// ServiceAccountTest), and a home directory with gcloud's file in it.
class UserCredentialsTest : public ServiceAccountTest {
 protected:
  void SetUp() override {
    ServiceAccountTest::SetUp();
    server_->TrustRefreshToken(kClientId, kClientSecret, kRefreshToken);
    ASSERT_EQ(mkdir(temp_.Join("home").c_str(), 0755), 0);
    ASSERT_EQ(mkdir(temp_.Join("home/.config").c_str(), 0755), 0);
    ASSERT_EQ(mkdir(temp_.Join("home/.config/gcloud").c_str(), 0755), 0);
    adc_path_ = temp_.Join("home/.config/gcloud/application_default_credentials.json");
    WriteFileOrDie(adc_path_, UserCredentialsJson(server_->token_uri(), "billing-project"));
  }

  std::unique_ptr<Credentials> FromJson(std::string_view json) {
    absl::StatusOr<std::unique_ptr<Credentials>> credentials =
        CredentialsFromJson(json, "adc.json", OptionsFor(&clock_, {}));
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return credentials.ok() ? std::move(*credentials) : nullptr;
  }

  std::string adc_path_;
};

TEST_F(UserCredentialsTest, GcloudFileWhenNoVariableIsSet) {
  std::unique_ptr<MetadataServer> metadata = StartMetadataServer(&clock_);
  absl::StatusOr<std::unique_ptr<Credentials>> credentials = DefaultCredentials(
      OptionsFor(&clock_, {{"HOME", temp_.Join("home")}, {"GCE_METADATA_HOST", metadata->host()}}));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_EQ((*credentials)->Identity(), StrCat("the user credentials in ", adc_path_,
                                               " (gcloud auth application-default login)"));
  EXPECT_EQ((*credentials)->QuotaProject(), "billing-project");
  const std::string token = TokenOf((*credentials)->AuthorizationHeader());
  EXPECT_TRUE(server_->IsValidToken(token, clock_.WallNs()));
  EXPECT_EQ(server_->last_grant_type(), "refresh_token");
  EXPECT_EQ(metadata->requests(), 0);
}

TEST_F(UserCredentialsTest, CloudsdkConfigNamesGcloudsDirectory) {
  TempDir config;
  const std::string path = config.Join("application_default_credentials.json");
  WriteFileOrDie(path, UserCredentialsJson(server_->token_uri()));
  const Env env = {{"HOME", temp_.Join("home")}, {"CLOUDSDK_CONFIG", config.path()}};
  EXPECT_EQ(GcloudAdcFilePath([&env](std::string_view name) -> std::optional<std::string> {
              auto it = env.find(std::string(name));
              return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
            }),
            path);
  absl::StatusOr<std::unique_ptr<Credentials>> credentials =
      DefaultCredentials(OptionsFor(&clock_, env));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_THAT((*credentials)->Identity(), HasSubstr(path));
  EXPECT_EQ((*credentials)->QuotaProject(), "") << "this file has no quota_project_id";
}

TEST_F(UserCredentialsTest, TheVariableBeatsTheGcloudFile) {
  absl::StatusOr<std::unique_ptr<Credentials>> credentials = DefaultCredentials(OptionsFor(
      &clock_, {{"HOME", temp_.Join("home")}, {"GOOGLE_APPLICATION_CREDENTIALS", key_path_}}));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_THAT((*credentials)->Identity(), StartsWith("service account "));
}

TEST_F(UserCredentialsTest, TheVariableMayNameUserCredentials) {
  absl::StatusOr<std::unique_ptr<Credentials>> credentials =
      DefaultCredentials(OptionsFor(&clock_, {{"GOOGLE_APPLICATION_CREDENTIALS", adc_path_}}));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_TRUE(
      server_->IsValidToken(TokenOf((*credentials)->AuthorizationHeader()), clock_.WallNs()));
}

TEST_F(UserCredentialsTest, MetadataServerWhenThereIsNoGcloudFile) {
  std::unique_ptr<MetadataServer> metadata = StartMetadataServer(&clock_);
  TempDir empty_home;
  absl::StatusOr<std::unique_ptr<Credentials>> credentials = DefaultCredentials(
      OptionsFor(&clock_, {{"HOME", empty_home.path()}, {"GCE_METADATA_HOST", metadata->host()}}));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_THAT((*credentials)->Identity(), HasSubstr("metadata server"));
}

TEST_F(UserCredentialsTest, NothingAnywhereSaysToLogIn) {
  TempDir empty_home;
  CredentialsOptions options = OptionsFor(
      &clock_,
      {{"HOME", empty_home.path()}, {"GCE_METADATA_HOST", StrCat("127.0.0.1:", UnusedPort())}});
  absl::StatusOr<std::unique_ptr<Credentials>> credentials = DefaultCredentials(options);
  ASSERT_FALSE(credentials.ok());
  EXPECT_TRUE(absl::IsNotFound(credentials.status())) << credentials.status();
  EXPECT_THAT(Message(credentials.status()),
              AllOf(StartsWith("no Google Cloud credentials found"),
                    HasSubstr("gcloud auth application-default login"),
                    HasSubstr(StrCat("there is no ", empty_home.path(),
                                     "/.config/gcloud/application_default_credentials.json"))));
}

TEST_F(UserCredentialsTest, AnUnusableGcloudFileIsAnErrorNotAFallThrough) {
  std::unique_ptr<MetadataServer> metadata = StartMetadataServer(&clock_);
  WriteFileOrDie(adc_path_, "{\"type\": \"authorized_user\", \"client_id\": \"x\"");
  absl::StatusOr<std::unique_ptr<Credentials>> credentials = DefaultCredentials(
      OptionsFor(&clock_, {{"HOME", temp_.Join("home")}, {"GCE_METADATA_HOST", metadata->host()}}));
  ASSERT_FALSE(credentials.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(credentials.status())) << credentials.status();
  EXPECT_THAT(Message(credentials.status()),
              AllOf(HasSubstr("application-default credentials of `gcloud auth "
                              "application-default login`"),
                    HasSubstr(adc_path_), HasSubstr("not a JSON object")));
  EXPECT_EQ(metadata->requests(), 0);
}

TEST_F(UserCredentialsTest, AnExpiredOrRevokedRefreshTokenSaysToLogInAgain) {
  server_->RevokeRefreshToken(kRefreshToken);
  std::unique_ptr<Credentials> credentials = FromJson(UserCredentialsJson(server_->token_uri()));
  ASSERT_NE(credentials, nullptr);
  absl::StatusOr<std::string> header = credentials->AuthorizationHeader();
  ASSERT_FALSE(header.ok());
  EXPECT_TRUE(absl::IsUnauthenticated(header.status())) << header.status();
  EXPECT_THAT(Message(header.status()),
              AllOf(HasSubstr("the user credentials in adc.json"),
                    HasSubstr("400 invalid_grant: Token has been expired or revoked."),
                    HasSubstr("run `gcloud auth application-default login` to sign in again"),
                    Not(HasSubstr(kRefreshToken)), Not(HasSubstr(kClientSecret))));
  EXPECT_EQ(credentials->token_fetches(), 1) << "not retried";
}

TEST_F(UserCredentialsTest, AWrongClientSecretIsInvalidClient) {
  std::string json = UserCredentialsJson(server_->token_uri());
  json.replace(json.find(kClientSecret), std::string_view(kClientSecret).size(), "wrong-secret");
  std::unique_ptr<Credentials> credentials = FromJson(json);
  ASSERT_NE(credentials, nullptr);
  absl::StatusOr<std::string> header = credentials->AuthorizationHeader();
  ASSERT_FALSE(header.ok());
  EXPECT_THAT(Message(header.status()), AllOf(HasSubstr("401 invalid_client"), HasSubstr(kClientId),
                                              HasSubstr("gcloud auth application-default login")));
}

TEST_F(UserCredentialsTest, TheTokenIsRefreshedFiveMinutesBeforeItExpires) {
  std::unique_ptr<Credentials> credentials = FromJson(UserCredentialsJson(server_->token_uri()));
  ASSERT_NE(credentials, nullptr);
  const std::string first = TokenOf(credentials->AuthorizationHeader());
  clock_.AdvanceNs(3299 * kNanosPerSecond);
  EXPECT_EQ(TokenOf(credentials->AuthorizationHeader()), first);
  EXPECT_EQ(server_->grants(), 1);
  clock_.AdvanceNs(2 * kNanosPerSecond);
  const std::string second = TokenOf(credentials->AuthorizationHeader());
  EXPECT_NE(second, first);
  EXPECT_TRUE(server_->IsValidToken(second, clock_.WallNs()));
  // After the first has expired, the second still serves.
  clock_.AdvanceNs(600 * kNanosPerSecond);
  EXPECT_FALSE(server_->IsValidToken(first, clock_.WallNs()));
  EXPECT_EQ(TokenOf(credentials->AuthorizationHeader()), second);
  EXPECT_EQ(server_->grants(), 2);
}

TEST_F(UserCredentialsTest, ServerErrorsAreRetried) {
  CredentialsOptions options = RetryingOptionsFor(&clock_);
  absl::StatusOr<std::unique_ptr<Credentials>> credentials = AuthorizedUserCredentialsFromJson(
      UserCredentialsJson(server_->token_uri()), "adc.json", options);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  server_->FailNextRequests(2, 503);
  const std::string token =
      RunAdvancingClock(clock_, [&] { return TokenOf((*credentials)->AuthorizationHeader()); });
  EXPECT_TRUE(server_->IsValidToken(token, clock_.WallNs()));
  EXPECT_EQ((*credentials)->token_fetches(), 3);
}

TEST_F(UserCredentialsTest, MissingFieldsNameTheFieldAndTheFile) {
  absl::StatusOr<std::unique_ptr<Credentials>> credentials =
      CredentialsFromJson(R"({"type": "authorized_user", "client_id": "c", "client_secret": "s"})",
                          "adc.json", OptionsFor(&clock_, {}));
  ASSERT_FALSE(credentials.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(credentials.status())) << credentials.status();
  EXPECT_THAT(Message(credentials.status()),
              AllOf(HasSubstr("adc.json"), HasSubstr("no field \"refresh_token\""),
                    HasSubstr("gcloud auth application-default login")));
}

TEST_F(UserCredentialsTest, ExternalAccountIsUnimplementedNamingFileAndType) {
  const std::string path = temp_.Join("wif.json");
  WriteFileOrDie(path, R"({"type": "external_account", "audience": "//iam.googleapis.com/x",
    "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
    "token_url": "https://sts.googleapis.com/v1/token", "credential_source": {"file": "/t"}})");
  absl::StatusOr<std::unique_ptr<Credentials>> credentials =
      DefaultCredentials(OptionsFor(&clock_, {{"GOOGLE_APPLICATION_CREDENTIALS", path}}));
  ASSERT_FALSE(credentials.ok());
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kUnimplemented) << credentials.status();
  EXPECT_THAT(Message(credentials.status()),
              AllOf(HasSubstr(StrCat("GOOGLE_APPLICATION_CREDENTIALS=", path)), HasSubstr(path),
                    HasSubstr("\"type\": \"external_account\""), HasSubstr("does not support")));
}

TEST_F(UserCredentialsTest, AnUnknownTypeIsInvalid) {
  absl::StatusOr<std::unique_ptr<Credentials>> credentials =
      CredentialsFromJson(R"({"type": "api_key"})", "k.json", OptionsFor(&clock_, {}));
  ASSERT_FALSE(credentials.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(credentials.status())) << credentials.status();
  EXPECT_THAT(Message(credentials.status()),
              AllOf(HasSubstr("\"type\": \"api_key\""), HasSubstr("\"authorized_user\"")));
}

TEST(AnonymousTest, NoHeaderAndTheGivenIdentity) {
  std::unique_ptr<Credentials> credentials = AnonymousCredentials("anonymous (test)");
  absl::StatusOr<std::string> header = credentials->AuthorizationHeader();
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(*header, "");
  EXPECT_EQ(credentials->Identity(), "anonymous (test)");
  EXPECT_THAT(credentials->Identity(), Not(HasSubstr("Bearer")));
}

}  // namespace
}  // namespace clusterprof::storage::gcs
