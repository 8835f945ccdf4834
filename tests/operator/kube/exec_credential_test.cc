// Exec credential plugins run for real: small /bin/sh plugins written into a temporary directory
// print ExecCredentials (tokens, expiry, client certificates) or misbehave (missing, failing,
// printing the wrong thing, hanging), and RunExecPlugin and ExecTokenSource are checked against
// what client-go does with them. Expiry runs on a SimulatedClock; the plugins run in real time.
#include "operator/kube/exec_credential.h"

#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "common/base/strings.h"
#include "cpprest/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::kube {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReadFileOrDie;
using testing::TempDir;
using testing::WriteFileOrDie;

// 2026-01-01T00:00:00Z, SimulatedClock's default wall time.
constexpr char kStartTime[] = "2026-01-01T00:00:00Z";
constexpr char kTestCert[] = "-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\\n";
constexpr char kTestKey[] = "-----BEGIN PRIVATE KEY-----\\nMIIE\\n-----END PRIVATE KEY-----\\n";

std::string Message(const absl::Status& status) {
  return {status.message().data(), status.message().size()};
}

// An ExecCredential document with `status` (JSON object text) as its status.
std::string Credential(std::string_view status, std::string_view api_version = kExecApiV1) {
  return StrCat(R"({"apiVersion":")", api_version, R"(","kind":"ExecCredential","status":)", status,
                "}");
}

// Shell text that prints `text` (no single quotes in it) on stdout.
std::string Print(std::string_view text) { return StrCat("printf '%s' '", text, "'\n"); }

web::json::value ParseJson(const std::string& text) {
  std::error_code error;
  web::json::value json = web::json::value::parse(text, error);
  EXPECT_FALSE(error) << text;
  return json;
}

class ExecPluginTest : public ::testing::Test {
 protected:
  ExecPluginTest() {
    options_.timeout_ns = 20 * kNanosPerSecond;
    options_.stdin_is_terminal = [] { return false; };
    options_.search_path = dir_.Join("bin");
    mkdir(dir_.Join("bin").c_str(), 0755);
  }

  // Writes an executable /bin/sh script at `relative` under the temporary directory; returns
  // its path.
  std::string WritePlugin(std::string_view relative, std::string_view body) {
    const std::string path = dir_.Join(relative);
    WriteFileOrDie(path, StrCat("#!/bin/sh\n", body));
    EXPECT_EQ(chmod(path.c_str(), 0755), 0);
    return path;
  }

  // A plugin whose runs are numbered 1, 2, ... (in the file `count`); `body` sees $n.
  std::string WriteCountingPlugin(std::string_view body) {
    return WritePlugin("counting-plugin", StrCat("n=$(( $(cat '", dir_.Join("count"),
                                                 "' 2>/dev/null || echo 0) + 1 ))\n"
                                                 "echo $n > '",
                                                 dir_.Join("count"), "'\n", body));
  }

  static ExecConfig ConfigFor(std::string command, std::string api_version = kExecApiV1) {
    ExecConfig config;
    config.command = std::move(command);
    config.api_version = std::move(api_version);
    config.interactive_mode = ExecInteractiveMode::kNever;
    config.description = "exec plugin \"test\" of user \"u\"";
    return config;
  }

  absl::StatusOr<ExecCredential> Run(std::string_view body) {
    return RunExecPlugin(ConfigFor(WritePlugin("plugin", body)), options_);
  }

  absl::Status RunError(std::string_view body) {
    absl::StatusOr<ExecCredential> credential = Run(body);
    EXPECT_FALSE(credential.ok());
    return credential.status();
  }

  TempDir dir_;
  ExecOptions options_;
};

// --- A plugin's answer ------------------------------------------------------------------------

TEST_F(ExecPluginTest, TokenFromAV1Plugin) {
  absl::StatusOr<ExecCredential> credential = Run(Print(Credential(R"({"token":"tok-1"})")));
  ASSERT_TRUE(credential.ok()) << credential.status();
  EXPECT_EQ(credential->token, "tok-1");
  EXPECT_FALSE(credential->expires_wall_ns.has_value());
  EXPECT_EQ(credential->client_cert_pem, "");
}

TEST_F(ExecPluginTest, TokenFromAV1Beta1Plugin) {
  const std::string plugin =
      WritePlugin("plugin", Print(Credential(R"({"token":"tok-b"})", kExecApiV1Beta1)));
  absl::StatusOr<ExecCredential> credential =
      RunExecPlugin(ConfigFor(plugin, kExecApiV1Beta1), options_);
  ASSERT_TRUE(credential.ok()) << credential.status();
  EXPECT_EQ(credential->token, "tok-b");
}

TEST_F(ExecPluginTest, ExpirationTimestampIsRead) {
  absl::StatusOr<ExecCredential> credential = Run(
      Print(Credential(R"({"token":"t","expirationTimestamp":"2026-01-01T01:00:00.5+00:00"})")));
  ASSERT_TRUE(credential.ok()) << credential.status();
  ASSERT_TRUE(credential->expires_wall_ns.has_value());
  EXPECT_EQ(*credential->expires_wall_ns,
            SimulatedClock::kDefaultWallNs + 3600 * kNanosPerSecond + 500 * kNanosPerMilli);
}

TEST_F(ExecPluginTest, ClientCertificateAndKey) {
  absl::StatusOr<ExecCredential> credential = Run(Print(Credential(StrCat(
      R"({"clientCertificateData":")", kTestCert, R"(","clientKeyData":")", kTestKey, R"("})"))));
  ASSERT_TRUE(credential.ok()) << credential.status();
  EXPECT_EQ(credential->token, "");
  EXPECT_THAT(credential->client_cert_pem, HasSubstr("-----BEGIN CERTIFICATE-----\nMIIB\n"));
  EXPECT_THAT(credential->client_key_pem, HasSubstr("-----BEGIN PRIVATE KEY-----\n"));
}

TEST_F(ExecPluginTest, TheRequestIsInKubernetesExecInfo) {
  absl::StatusOr<ExecCredential> credential =
      Run(StrCat("printf '%s' \"$KUBERNETES_EXEC_INFO\" > '", dir_.Join("info.json"), "'\n",
                 Print(Credential(R"({"token":"t"})"))));
  ASSERT_TRUE(credential.ok()) << credential.status();
  const web::json::value info = ParseJson(ReadFileOrDie(dir_.Join("info.json")));
  EXPECT_EQ(info.at("kind").as_string(), "ExecCredential");
  EXPECT_EQ(info.at("apiVersion").as_string(), kExecApiV1);
  EXPECT_FALSE(info.at("spec").at("interactive").as_bool());
  EXPECT_FALSE(info.at("spec").has_field("cluster")) << "only with provideClusterInfo";
}

TEST_F(ExecPluginTest, ClusterInfoWhenTheKubeconfigProvidesIt) {
  ExecConfig config = ConfigFor("unused");
  config.cluster = ExecClusterInfo{.server = "https://10.0.0.1:6443",
                                   .tls_server_name = "kubernetes",
                                   .ca_pem = "-----BEGIN CERTIFICATE-----\nCA\n",
                                   .disable_compression = true,
                                   .config_json = R"({"audience":"x","n":3})"};
  const web::json::value info = ParseJson(ExecInfoJson(config, /*interactive=*/true));
  const web::json::value& cluster = info.at("spec").at("cluster");
  EXPECT_EQ(cluster.at("server").as_string(), "https://10.0.0.1:6443");
  EXPECT_EQ(cluster.at("tls-server-name").as_string(), "kubernetes");
  EXPECT_EQ(cluster.at("certificate-authority-data").as_string(),
            "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCkNBCg==");
  EXPECT_TRUE(cluster.at("disable-compression").as_bool());
  EXPECT_FALSE(cluster.has_field("insecure-skip-tls-verify")) << "false is left out, as in Go";
  EXPECT_EQ(cluster.at("config").at("audience").as_string(), "x");
  EXPECT_EQ(cluster.at("config").at("n").as_integer(), 3);
  EXPECT_TRUE(info.at("spec").at("interactive").as_bool());
}

TEST_F(ExecPluginTest, ArgumentsAndEnvironmentReachThePlugin) {
  ExecConfig config = ConfigFor(WritePlugin(
      "plugin", StrCat("printf '%s\\n' \"$1\" \"$2\" \"$PLUGIN_REGION\" "
                       "\"$PLUGIN_TWICE\" \"${HOME:+home-set}\" > '",
                       dir_.Join("seen"), "'\n", Print(Credential(R"({"token":"t"})")))));
  config.args = {"--region", "us west"};
  config.env = {{"PLUGIN_REGION", "eu"}, {"PLUGIN_TWICE", "first"}, {"PLUGIN_TWICE", "second"}};
  absl::StatusOr<ExecCredential> credential = RunExecPlugin(config, options_);
  ASSERT_TRUE(credential.ok()) << credential.status();
  // This process's environment is passed on (HOME), the exec block's added, the last of two
  // definitions winning.
  EXPECT_EQ(ReadFileOrDie(dir_.Join("seen")), "--region\nus west\neu\nsecond\nhome-set\n");
}

TEST_F(ExecPluginTest, ABareCommandIsLookedUpOnThePath) {
  WritePlugin("bin/my-auth-plugin", Print(Credential(R"({"token":"from-path"})")));
  options_.search_path = StrCat(dir_.Join("empty"), "::", dir_.Join("bin"));
  absl::StatusOr<ExecCredential> credential = RunExecPlugin(ConfigFor("my-auth-plugin"), options_);
  ASSERT_TRUE(credential.ok()) << credential.status();
  EXPECT_EQ(credential->token, "from-path");
}

TEST_F(ExecPluginTest, StdinIsEmptyWhenNotInteractive) {
  // A plugin that reads stdin gets end-of-file at once instead of waiting on the test's stdin.
  absl::StatusOr<ExecCredential> credential =
      Run(StrCat("if read line; then exit 3; fi\n", Print(Credential(R"({"token":"t"})"))));
  ASSERT_TRUE(credential.ok()) << credential.status();
}

// --- Interactive modes ------------------------------------------------------------------------

class InteractiveTest : public ExecPluginTest {
 protected:
  // Runs a plugin that records spec.interactive; returns it ("true"/"false"), or the error.
  std::string InteractiveSeen(ExecInteractiveMode mode, bool terminal) {
    ExecConfig config = ConfigFor(WritePlugin(
        "plugin", StrCat("case \"$KUBERNETES_EXEC_INFO\" in *'\"interactive\":true'*) echo true;; "
                         "*) echo false;; esac > '",
                         dir_.Join("seen"), "'\n", Print(Credential(R"({"token":"t"})")))));
    config.interactive_mode = mode;
    options_.stdin_is_terminal = [terminal] { return terminal; };
    absl::StatusOr<ExecCredential> credential = RunExecPlugin(config, options_);
    if (!credential.ok()) return credential.status().ToString();
    return std::string(StripAsciiWhitespace(ReadFileOrDie(dir_.Join("seen"))));
  }
};

TEST_F(InteractiveTest, NeverIsNeverInteractive) {
  EXPECT_EQ(InteractiveSeen(ExecInteractiveMode::kNever, true), "false");
}

TEST_F(InteractiveTest, IfAvailableFollowsTheTerminal) {
  EXPECT_EQ(InteractiveSeen(ExecInteractiveMode::kIfAvailable, true), "true");
  EXPECT_EQ(InteractiveSeen(ExecInteractiveMode::kIfAvailable, false), "false");
}

TEST_F(InteractiveTest, AlwaysNeedsATerminal) {
  EXPECT_EQ(InteractiveSeen(ExecInteractiveMode::kAlways, true), "true");
  const std::string error = InteractiveSeen(ExecInteractiveMode::kAlways, false);
  EXPECT_THAT(error, AllOf(HasSubstr("FAILED_PRECONDITION"), HasSubstr("exec plugin \"test\""),
                           HasSubstr("interactiveMode: Always"),
                           HasSubstr("standard input is not a terminal")));
}

// --- Errors -----------------------------------------------------------------------------------

TEST_F(ExecPluginTest, ACommandNotOnThePathNamesTheInstallHint) {
  ExecConfig config = ConfigFor("gke-gcloud-auth-plugin");
  config.install_hint =
      "Install gke-gcloud-auth-plugin for use with kubectl by following\n"
      "https://cloud.google.com/kubernetes-engine/docs/how-to/cluster-access";
  absl::StatusOr<ExecCredential> credential = RunExecPlugin(config, options_);
  ASSERT_FALSE(credential.ok());
  EXPECT_TRUE(absl::IsNotFound(credential.status())) << credential.status();
  EXPECT_THAT(Message(credential.status()),
              AllOf(HasSubstr("exec plugin \"test\" of user \"u\""),
                    HasSubstr("\"gke-gcloud-auth-plugin\" was not found on PATH"),
                    HasSubstr(dir_.Join("bin")), HasSubstr("Install gke-gcloud-auth-plugin"),
                    HasSubstr("client-go-credential-plugins")));
}

TEST_F(ExecPluginTest, ACommandNotOnThePathWithoutAHintSaysItMustBeInstalled) {
  absl::StatusOr<ExecCredential> credential =
      RunExecPlugin(ConfigFor("kubelogin-missing"), options_);
  ASSERT_FALSE(credential.ok());
  EXPECT_TRUE(absl::IsNotFound(credential.status())) << credential.status();
  EXPECT_THAT(Message(credential.status()),
              AllOf(HasSubstr("\"kubelogin-missing\" was not found on PATH"),
                    HasSubstr("must be installed")));
}

TEST_F(ExecPluginTest, AMissingPathIsNotFound) {
  absl::StatusOr<ExecCredential> credential =
      RunExecPlugin(ConfigFor(dir_.Join("bin/absent")), options_);
  ASSERT_FALSE(credential.ok());
  EXPECT_TRUE(absl::IsNotFound(credential.status())) << credential.status();
  EXPECT_THAT(Message(credential.status()),
              AllOf(HasSubstr(dir_.Join("bin/absent")), HasSubstr("No such file")));
}

TEST_F(ExecPluginTest, AFileThatIsNotExecutable) {
  const std::string path = dir_.Join("not-executable");
  WriteFileOrDie(path, "#!/bin/sh\n");
  absl::StatusOr<ExecCredential> credential = RunExecPlugin(ConfigFor(path), options_);
  ASSERT_FALSE(credential.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(credential.status())) << credential.status();
  EXPECT_THAT(Message(credential.status()), HasSubstr("not an executable file"));
}

TEST_F(ExecPluginTest, ANonZeroExitQuotesStderrTrimmed) {
  const absl::Status status = RunError(
      "echo 'ERROR: gcloud crashed (RefreshError): Reauthentication required.' >&2\n"
      "echo '  run gcloud auth login  ' >&2\nexit 1\n");
  EXPECT_TRUE(absl::IsUnauthenticated(status)) << status;
  EXPECT_THAT(
      Message(status),
      AllOf(HasSubstr("exec plugin \"test\" of user \"u\": the plugin failed (exit code 1)"),
            HasSubstr("it said: ERROR: gcloud crashed (RefreshError): Reauthentication "
                      "required.\n  run gcloud auth login")));
  EXPECT_THAT(Message(status), Not(HasSubstr("login  ")));
}

TEST_F(ExecPluginTest, ANonZeroExitWithoutStderrSaysSo) {
  const absl::Status status = RunError("exit 7\n");
  EXPECT_THAT(Message(status), AllOf(HasSubstr("exit code 7"), HasSubstr("printed nothing")));
}

TEST_F(ExecPluginTest, LongStderrIsCutToItsEnd) {
  const absl::Status status =
      RunError("i=0; while [ $i -lt 3000 ]; do echo \"line $i\" >&2; i=$((i+1)); done\nexit 2\n");
  EXPECT_THAT(Message(status), AllOf(HasSubstr("line 2999"), Not(HasSubstr("line 10\n"))));
  EXPECT_LT(status.message().size(), 3000u);
}

TEST_F(ExecPluginTest, APluginKilledByASignal) {
  const absl::Status status = RunError("kill -KILL $$\n");
  EXPECT_TRUE(absl::IsUnauthenticated(status)) << status;
  EXPECT_THAT(Message(status), HasSubstr("killed by"));
}

TEST_F(ExecPluginTest, OutputThatIsNotJsonIsNotQuoted) {
  const absl::Status status = RunError("echo 'token: s3cr3t-t0ken-value'\n");
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(Message(status),
              AllOf(HasSubstr("not JSON"), HasSubstr("ExecCredential"), Not(HasSubstr("s3cr3t"))));
}

TEST_F(ExecPluginTest, EmptyOutput) {
  EXPECT_THAT(Message(RunError("exit 0\n")), HasSubstr("printed nothing"));
}

TEST_F(ExecPluginTest, AnotherApiVersionIsAMismatch) {
  const absl::Status status = RunError(Print(Credential(R"({"token":"s3cr3t"})", kExecApiV1Beta1)));
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(Message(status), AllOf(HasSubstr(StrCat("asks for apiVersion ", kExecApiV1)),
                                     HasSubstr(StrCat("answered with ", kExecApiV1Beta1)),
                                     Not(HasSubstr("s3cr3t"))));
}

TEST_F(ExecPluginTest, AnotherKind) {
  EXPECT_THAT(Message(RunError(Print(StrCat(R"({"apiVersion":")", kExecApiV1,
                                            R"(","kind":"Secret","status":{"token":"t"}})")))),
              HasSubstr("kind \"Secret\", not ExecCredential"));
}

TEST_F(ExecPluginTest, NoStatus) {
  EXPECT_THAT(Message(RunError(Print(StrCat(R"({"apiVersion":")", kExecApiV1,
                                            R"(","kind":"ExecCredential","spec":{}})")))),
              HasSubstr("no status"));
}

TEST_F(ExecPluginTest, NeitherTokenNorCertificate) {
  EXPECT_THAT(Message(RunError(Print(Credential(R"({"token":""})")))),
              HasSubstr("neither a token nor a client certificate and key"));
}

TEST_F(ExecPluginTest, ACertificateWithoutItsKey) {
  EXPECT_THAT(Message(RunError(
                  Print(Credential(StrCat(R"({"clientCertificateData":")", kTestCert, R"("})"))))),
              HasSubstr("client certificate but no key"));
}

TEST_F(ExecPluginTest, ABadExpirationTimestamp) {
  EXPECT_THAT(
      Message(RunError(Print(Credential(R"({"token":"t","expirationTimestamp":"tomorrow"})")))),
      AllOf(HasSubstr("\"tomorrow\""), HasSubstr("RFC 3339")));
}

TEST_F(ExecPluginTest, APluginThatHangsIsKilledAtTheTimeout) {
  options_.timeout_ns = 300 * kNanosPerMilli;
  RealClock clock;
  const int64_t start = clock.MonotonicNs();
  // The plugin and the child it waits for both hold stdout: the whole group is killed.
  const absl::Status status =
      RunError("echo 'waiting for the browser login...' >&2\nsleep 30 &\nwait\n");
  EXPECT_LT(clock.MonotonicNs() - start, 10 * kNanosPerSecond);
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(Message(status), AllOf(HasSubstr("did not finish within 300 ms"),
                                     HasSubstr("waiting for the browser login")));
}

TEST_F(ExecPluginTest, AChildLeftHoldingStdoutDoesNotHoldTheAnswer) {
  RealClock clock;
  const int64_t start = clock.MonotonicNs();
  absl::StatusOr<ExecCredential> credential =
      Run(StrCat("(sleep 30 & echo $! > '", dir_.Join("child"), "')\n",
                 Print(Credential(R"({"token":"t"})"))));
  ASSERT_TRUE(credential.ok()) << credential.status();
  EXPECT_LT(clock.MonotonicNs() - start, 10 * kNanosPerSecond);
  const std::string child(StripAsciiWhitespace(ReadFileOrDie(dir_.Join("child"))));
  ASSERT_FALSE(child.empty());
  kill(std::stoi(child), SIGKILL);
}

TEST_F(ExecPluginTest, TurnedOffRunsNothing) {
  options_.allow = false;
  const absl::Status status = RunError(StrCat("touch '", dir_.Join("ran"), "'\n"));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_FALSE(testing::FileExists(dir_.Join("ran")));
}

// --- ExecTokenSource: caching, expiry, 401 ----------------------------------------------------

class ExecTokenSourceTest : public ExecPluginTest {
 protected:
  std::unique_ptr<ExecTokenSource> SourceFor(std::string plugin) {
    return std::make_unique<ExecTokenSource>(ConfigFor(std::move(plugin)), options_, &clock_);
  }
  SimulatedClock clock_;
};

TEST_F(ExecTokenSourceTest, ATokenWithoutExpiryIsKeptUntilInvalidated) {
  auto source = SourceFor(
      WriteCountingPlugin(StrCat("printf '%s' '", Credential(R"({"token":"tok-'$n'"})"), "'\n")));
  EXPECT_EQ(source->Token().value_or("error"), "tok-1");
  clock_.AdvanceNs(30LL * 24 * 3600 * kNanosPerSecond);
  EXPECT_EQ(source->Token().value_or("error"), "tok-1");
  EXPECT_EQ(source->runs(), 1);
  // A 401: the REST client invalidates, and the next request runs the plugin again.
  source->Invalidate();
  EXPECT_EQ(source->Token().value_or("error"), "tok-2");
  EXPECT_EQ(source->runs(), 2);
}

TEST_F(ExecTokenSourceTest, AnExpiredTokenRunsThePluginAgain) {
  // Each token expires an hour after the start, times its run number.
  auto source = SourceFor(WriteCountingPlugin(StrCat(
      "printf '{\"apiVersion\":\"", kExecApiV1,
      "\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"tok-%s\",\"expirationTimestamp\":"
      "\"2026-01-01T0%s:00:00Z\"}}' $n $n\n")));
  EXPECT_EQ(source->Token().value_or("error"), "tok-1");
  clock_.AdvanceNs(3599 * kNanosPerSecond);
  EXPECT_EQ(source->Token().value_or("error"), "tok-1") << "not expired yet: no early refresh";
  EXPECT_EQ(source->runs(), 1);
  clock_.AdvanceNs(1 * kNanosPerSecond);
  EXPECT_EQ(source->Token().value_or("error"), "tok-1") << "expired only after the instant";
  clock_.AdvanceNs(1);
  EXPECT_EQ(source->Token().value_or("error"), "tok-2");
  EXPECT_EQ(source->Token().value_or("error"), "tok-2");
  EXPECT_EQ(source->runs(), 2);
}

TEST_F(ExecTokenSourceTest, AFailedRunIsNotCached) {
  auto source = SourceFor(
      WriteCountingPlugin(StrCat("if [ $n -eq 1 ]; then echo 'not logged in' >&2; exit 1; fi\n",
                                 Print(Credential(R"({"token":"after-login"})")))));
  absl::StatusOr<std::string> first = source->Token();
  ASSERT_FALSE(first.ok());
  EXPECT_THAT(Message(first.status()), HasSubstr("not logged in"));
  EXPECT_EQ(source->Token().value_or("error"), "after-login");
  EXPECT_EQ(source->runs(), 2);
}

TEST_F(ExecTokenSourceTest, ACertificateOnlyAnswerHasNoToken) {
  auto source = SourceFor(WritePlugin(
      "plugin", Print(Credential(StrCat(R"({"clientCertificateData":")", kTestCert,
                                        R"(","clientKeyData":")", kTestKey, R"("})")))));
  absl::StatusOr<ExecCredential> credential = source->Credential();
  ASSERT_TRUE(credential.ok()) << credential.status();
  EXPECT_FALSE(credential->client_cert_pem.empty());
  absl::StatusOr<std::string> token = source->Token();
  EXPECT_TRUE(absl::IsUnauthenticated(token.status())) << token.status();
  EXPECT_EQ(source->runs(), 1) << "the certificate answer stays cached";
}

TEST_F(ExecTokenSourceTest, ConcurrentCallersShareOneRun) {
  auto source = SourceFor(WriteCountingPlugin(
      StrCat("sleep 0.2\nprintf '%s' '", Credential(R"({"token":"tok-'$n'"})"), "'\n")));
  std::vector<std::thread> threads;
  std::atomic<int> right{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] { right += source->Token().value_or("") == "tok-1"; });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(right.load(), 8);
  EXPECT_EQ(source->runs(), 1);
}

}  // namespace
}  // namespace clusterprof::kube
