// kube config loading: the kubeconfig shapes real clusters hand out (tests/data/kubeconfig),
// KUBECONFIG merging, relative file references, the errors people meet (each naming the file,
// the field and the user), and in-cluster config from a fixture tree laid out as kubelet lays
// out a projected service-account volume, token rotation included.
#include "operator/kube/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "cpprest/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::kube {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using testing::ReadFileOrDie;
using testing::TempDir;
using testing::WriteFileOrDie;

std::string Fixture(std::string_view relative) {
  return StrCat(CLUSTERPROF_SOURCE_DIR, "/tests/data/kubeconfig/", relative);
}

// The message as a std::string: gMock prints Debian's absl::string_view character by character.
std::string Message(const absl::Status& status) {
  return {status.message().data(), status.message().size()};
}

std::string TokenOf(const RestConfig& config) {
  if (config.token == nullptr) return "(none)";
  absl::StatusOr<std::string> token = config.token->Token();
  return token.ok() ? *token : token.status().ToString();
}

class KubeconfigTest : public ::testing::Test {
 protected:
  KubeconfigTest() {
    // Exec plugins are looked up in plugins_ only (empty unless a test writes one), so that a
    // plugin installed on the machine never runs.
    exec_.search_path = plugins_.path();
    exec_.stdin_is_terminal = [] { return false; };
  }

  absl::StatusOr<RestConfig> LoadFile(const std::string& path, std::string context = "") {
    return LoadKubeconfig({.paths = {path}, .context = std::move(context), .exec = exec_}, env_,
                          &clock_);
  }
  absl::StatusOr<RestConfig> LoadText(std::string_view yaml, std::string_view context = "") {
    return LoadKubeconfigFromString(yaml, "/configs/team.yaml", context, &clock_, exec_);
  }

  // Writes an executable /bin/sh script named `name` into plugins_; returns its path.
  std::string WritePlugin(std::string_view name, std::string_view body) {
    const std::string path = plugins_.Join(name);
    WriteFileOrDie(path, StrCat("#!/bin/sh\n", body));
    EXPECT_EQ(chmod(path.c_str(), 0755), 0);
    return path;
  }

  SimulatedClock clock_;
  MapEnvironment env_{{}};
  TempDir plugins_;
  ExecOptions exec_;
};

// A minimal valid kubeconfig with `user_body` as the user's fields (indented four spaces).
std::string WithUser(std::string_view user_body) {
  return StrCat(
      "clusters:\n"
      "- name: c\n"
      "  cluster:\n"
      "    server: https://c.example.com\n"
      "users:\n"
      "- name: u\n"
      "  user:\n",
      user_body,
      "contexts:\n"
      "- name: ctx\n"
      "  context: {cluster: c, user: u}\n"
      "current-context: ctx\n");
}

TEST_F(KubeconfigTest, KindClientCertificateData) {
  absl::StatusOr<RestConfig> config = LoadFile(Fixture("kind.yaml"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://127.0.0.1:35275");
  EXPECT_EQ(config->ca_pem, ReadFileOrDie(Fixture("certs/ca.crt")));
  EXPECT_EQ(config->client_cert_pem, ReadFileOrDie(Fixture("certs/client.crt")));
  EXPECT_EQ(config->client_key_pem, ReadFileOrDie(Fixture("certs/client.key")));
  EXPECT_FALSE(config->insecure_skip_tls_verify);
  EXPECT_EQ(config->token, nullptr);
  EXPECT_EQ(config->namespace_, "default");
  EXPECT_TRUE(config->impersonate.empty());
  EXPECT_EQ(config->description,
            StrCat("kubeconfig ", Fixture("kind.yaml"),
                   ", context \"kind-kind\", cluster \"kind-kind\", user \"kind-kind\""));
}

// --- Exec credential plugins (the plugins themselves: exec_credential_test.cc) ---------------

TEST_F(KubeconfigTest, GkeExecPluginGivesTheTokenAndTheClusterInfo) {
  // A stand-in for gke-gcloud-auth-plugin, found on the search path as the real one is.
  WritePlugin("gke-gcloud-auth-plugin",
              StrCat("printf '%s' \"$KUBERNETES_EXEC_INFO\" > '", plugins_.Join("info.json"),
                     "'\n"
                     "printf '%s' '{\"kind\":\"ExecCredential\",\"apiVersion\":"
                     "\"client.authentication.k8s.io/v1beta1\",\"spec\":{\"interactive\":false},"
                     "\"status\":{\"expirationTimestamp\":\"2026-01-01T01:00:00Z\","
                     "\"token\":\"ya29.gke-token\"}}'\n"));
  absl::StatusOr<RestConfig> config = LoadFile(Fixture("gke.yaml"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://34.118.20.7");
  EXPECT_EQ(TokenOf(*config), "ya29.gke-token");
  EXPECT_EQ(config->client_cert_pem, "");
  // provideClusterInfo: the plugin was told which cluster, with its CA.
  const std::string info = ReadFileOrDie(plugins_.Join("info.json"));
  EXPECT_THAT(info, AllOf(HasSubstr("\"apiVersion\":\"client.authentication.k8s.io/v1beta1\""),
                          HasSubstr("\"server\":\"https://34.118.20.7\""),
                          HasSubstr("\"certificate-authority-data\":\"LS0tLS1CRUdJTi"),
                          HasSubstr("\"interactive\":false")));
}

TEST_F(KubeconfigTest, GkeExecPluginNotInstalledNamesUserContextAndInstallHint) {
  absl::StatusOr<RestConfig> config = LoadFile(Fixture("gke.yaml"));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(
      Message(config.status()),
      AllOf(HasSubstr(Fixture("gke.yaml")), HasSubstr("users[0].user.exec (line 19, column 7)"),
            HasSubstr("user \"gke_acme-ml_us-central1_training\""),
            HasSubstr("context \"gke_acme-ml_us-central1_training\""),
            HasSubstr("exec plugin \"gke-gcloud-auth-plugin\""), HasSubstr("not found on PATH"),
            HasSubstr("Install gke-gcloud-auth-plugin for use with kubectl by following "
                      "https://cloud.google.com/kubernetes-engine/docs/how-to/"
                      "cluster-access-for-kubectl#install_plugin")));
}

TEST_F(KubeconfigTest, EksAwsGetTokenGetsItsArgumentsAndEnvironment) {
  WritePlugin("aws",
              "[ \"$*\" = '--region us-west-2 eks get-token --cluster-name training "
              "--output json' ] || { echo \"unexpected arguments: $*\" >&2; exit 2; }\n"
              "[ \"$AWS_PROFILE\" = ml ] || { echo 'no AWS_PROFILE' >&2; exit 3; }\n"
              "printf '%s' '{\"kind\":\"ExecCredential\",\"apiVersion\":"
              "\"client.authentication.k8s.io/v1beta1\",\"spec\":{},\"status\":{"
              "\"expirationTimestamp\":\"2026-01-01T00:14:00Z\",\"token\":"
              "\"k8s-aws-v1.aHR0cHM6Ly9zdHM\"}}'\n");
  absl::StatusOr<RestConfig> config = LoadFile(Fixture("eks.yaml"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(TokenOf(*config), "k8s-aws-v1.aHR0cHM6Ly9zdHM");
  EXPECT_EQ(config->namespace_, "ml");
}

TEST_F(KubeconfigTest, ExecPluginFailureNamesThePluginAndItsStderr) {
  WritePlugin("aws",
              "echo 'Unable to locate credentials. You can configure credentials by "
              "running \"aws configure\".' >&2\nexit 253\n");
  absl::StatusOr<RestConfig> config = LoadFile(Fixture("eks.yaml"));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(Message(config.status()),
              AllOf(HasSubstr("user \"arn:aws:eks:us-west-2:111122223333:cluster/training\""),
                    HasSubstr("exec plugin \"aws\""), HasSubstr("exit code 253"),
                    HasSubstr("Unable to locate credentials")));
}

TEST_F(KubeconfigTest, ExecCommandWithASlashIsRelativeToTheKubeconfig) {
  TempDir dir;
  ASSERT_EQ(mkdir(dir.Join("bin").c_str(), 0755), 0);
  WriteFileOrDie(dir.Join("bin/token-plugin"),
                 "#!/bin/sh\nprintf '%s' '{\"kind\":\"ExecCredential\",\"apiVersion\":"
                 "\"client.authentication.k8s.io/v1\",\"status\":{\"token\":\"relative\"}}'\n");
  ASSERT_EQ(chmod(dir.Join("bin/token-plugin").c_str(), 0755), 0);
  WriteFileOrDie(dir.Join("config"), WithUser("    exec:\n"
                                              "      apiVersion: client.authentication.k8s.io/v1\n"
                                              "      command: ./bin/token-plugin\n"
                                              "      interactiveMode: Never\n"));
  absl::StatusOr<RestConfig> config = LoadFile(dir.Join("config"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(TokenOf(*config), "relative");
}

TEST_F(KubeconfigTest, ExecClientCertificateFromThePlugin) {
  const std::string cert = ReadFileOrDie(Fixture("certs/client.crt"));
  const std::string key = ReadFileOrDie(Fixture("certs/client.key"));
  WritePlugin("cert-plugin",
              StrCat("cat <<'EOF'\n{\"kind\":\"ExecCredential\",\"apiVersion\":"
                     "\"client.authentication.k8s.io/v1\",\"status\":{\"clientCertificateData\":",
                     web::json::value::string(cert).serialize(), ",\"clientKeyData\":",
                     web::json::value::string(key).serialize(), "}}\nEOF\n"));
  absl::StatusOr<RestConfig> config =
      LoadText(WithUser("    exec: {apiVersion: client.authentication.k8s.io/v1, command: "
                        "cert-plugin, interactiveMode: Never}\n"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->client_cert_pem, cert);
  EXPECT_EQ(config->client_key_pem, key);
  EXPECT_EQ(config->token, nullptr) << "the plugin gave no token";
}

TEST_F(KubeconfigTest, ATokenInTheKubeconfigWinsOverTheExecBlock) {
  // As client-go: the plugin does not run at all (it is not even installed here).
  absl::StatusOr<RestConfig> config =
      LoadText(WithUser("    token: static\n"
                        "    exec: {apiVersion: client.authentication.k8s.io/v1, command: "
                        "not-installed, interactiveMode: Never}\n"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(TokenOf(*config), "static");
}

TEST_F(KubeconfigTest, ClusterExtensionReachesThePlugin) {
  WritePlugin("ext-plugin",
              StrCat("printf '%s' \"$KUBERNETES_EXEC_INFO\" > '", plugins_.Join("info.json"),
                     "'\nprintf '%s' '{\"kind\":\"ExecCredential\",\"apiVersion\":"
                     "\"client.authentication.k8s.io/v1\",\"status\":{\"token\":\"t\"}}'\n"));
  absl::StatusOr<RestConfig> config = LoadText(
      "clusters:\n"
      "- name: c\n"
      "  cluster:\n"
      "    server: https://c.example.com\n"
      "    extensions:\n"
      "    - name: other\n"
      "      extension: {ignored: true}\n"
      "    - name: client.authentication.k8s.io/exec\n"
      "      extension:\n"
      "        audience: 'sts.example.com'\n"
      "        retries: 3\n"
      "        verbose: false\n"
      "        version: '3'\n"
      "        scopes: [a, \"b c\"]\n"
      "users:\n"
      "- name: u\n"
      "  user:\n"
      "    exec:\n"
      "      apiVersion: client.authentication.k8s.io/v1\n"
      "      command: ext-plugin\n"
      "      interactiveMode: IfAvailable\n"
      "      provideClusterInfo: true\n"
      "contexts: [{name: ctx, context: {cluster: c, user: u}}]\n"
      "current-context: ctx\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(ReadFileOrDie(plugins_.Join("info.json")),
              HasSubstr("\"cluster\":{\"server\":\"https://c.example.com\",\"config\":{"
                        "\"audience\":\"sts.example.com\",\"retries\":3,\"verbose\":false,"
                        "\"version\":\"3\",\"scopes\":[\"a\",\"b c\"]}}"));
}

TEST_F(KubeconfigTest, ExecBlockMistakesNameTheField) {
  struct Case {
    std::string exec;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"{apiVersion: client.authentication.k8s.io/v1, interactiveMode: Never}",
       "without a command"},
      {"{command: p}", "without apiVersion; set it to client.authentication.k8s.io/v1"},
      {"{command: p, apiVersion: client.authentication.k8s.io/v1alpha1}",
       "no longer supported (Kubernetes 1.24 removed it)"},
      {"{command: p, apiVersion: v1}", "\"v1\" is not an exec credential apiVersion"},
      {"{command: p, apiVersion: client.authentication.k8s.io/v1}",
       "without interactiveMode, which that version requires"},
      {"{command: p, apiVersion: client.authentication.k8s.io/v1, interactiveMode: Sometimes}",
       "users[0].user.exec.interactiveMode (line 8, column 86): \"Sometimes\" is not an "
       "interactiveMode"},
      {"{command: p, args: x}", "users[0].user.exec.args (line 8, column 30): must be a list"},
      {"{command: p, env: [{value: x}]}", "users[0].user.exec.env[0]"},
      {"{command: p, provideClusterInfo: maybe}", "provideClusterInfo"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<RestConfig> config = LoadText(WithUser(StrCat("    exec: ", c.exec, "\n")));
    ASSERT_FALSE(config.ok()) << c.exec;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
    EXPECT_THAT(Message(config.status()), HasSubstr(c.expected)) << c.exec;
  }
}

TEST_F(KubeconfigTest, ExecTurnedOffIsAnErrorAndRunsNothing) {
  WritePlugin("p", StrCat("touch '", plugins_.Join("ran"), "'\n"));
  exec_.allow = false;
  absl::StatusOr<RestConfig> config =
      LoadText(WithUser("    exec: {apiVersion: client.authentication.k8s.io/v1, command: p, "
                        "interactiveMode: Never}\n"));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(testing::FileExists(plugins_.Join("ran")));
}

TEST_F(KubeconfigTest, LegacyGcpAuthProviderNamesTheExecPluginToInstall) {
  absl::StatusOr<RestConfig> config = LoadFile(Fixture("gcp-auth-provider.yaml"));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Message(config.status()),
              AllOf(HasSubstr("users[0].user.auth-provider"),
                    HasSubstr("user \"gke_acme-ml_us-central1-a_legacy\""),
                    HasSubstr("context \"gke_acme-ml_us-central1-a_legacy\""),
                    HasSubstr("auth-provider \"gcp\""), HasSubstr("Install gke-gcloud-auth-plugin"),
                    HasSubstr("gcloud container clusters get-credentials")));
}

TEST_F(KubeconfigTest, AuthProviderAndExecTogetherIsAnError) {
  absl::StatusOr<RestConfig> config =
      LoadText(WithUser("    auth-provider: {name: gcp}\n"
                        "    exec: {apiVersion: client.authentication.k8s.io/v1, command: p, "
                        "interactiveMode: Never}\n"));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(config.status()), HasSubstr("keep only the exec block"));
}

TEST_F(KubeconfigTest, ExecUserInAnotherContextDoesNotMatter) {
  const std::string list = StrCat(
      "clusters: [{name: c, cluster: {server: https://c}}]\n"
      "users:\n"
      "- {name: u, user: {token: t}}\n"
      "- {name: gke, user: {exec: {command: gke-gcloud-auth-plugin}}}\n"
      "contexts: [{name: ctx, context: {cluster: c, user: u}}]\n"
      "current-context: ctx\n");
  absl::StatusOr<RestConfig> config = LoadText(list);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(TokenOf(*config), "t");
}

TEST_F(KubeconfigTest, TokenInsecureImpersonationAndNamespace) {
  absl::StatusOr<RestConfig> config = LoadFile(Fixture("token.yaml"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://lab.example.com:6443");  // trailing slash dropped
  EXPECT_TRUE(config->insecure_skip_tls_verify);
  EXPECT_THAT(config->ca_pem, IsEmpty());
  EXPECT_EQ(config->tls_server_name, "kubernetes.default.svc");
  EXPECT_TRUE(config->disable_compression);
  EXPECT_EQ(TokenOf(*config), "eyJhbGciOiJSUzI1NiJ9.static-token.sig");
  EXPECT_EQ(config->namespace_, "profiling");
  EXPECT_EQ(config->impersonate.user, "alice");
  EXPECT_EQ(config->impersonate.uid, "1234");
  EXPECT_THAT(config->impersonate.groups, ElementsAre("ml-team", "system:authenticated"));
  ASSERT_EQ(config->impersonate.extra.count("reason"), 1u);
  EXPECT_THAT(config->impersonate.extra.at("reason"), ElementsAre("profiling"));
}

TEST_F(KubeconfigTest, ContextFlagOverridesCurrentContext) {
  absl::StatusOr<RestConfig> config = LoadFile(Fixture("token.yaml"), "lab-anonymous");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->token, nullptr);
  EXPECT_EQ(config->namespace_, "default");
  EXPECT_THAT(config->description, HasSubstr("context \"lab-anonymous\""));
  EXPECT_THAT(config->description, HasSubstr("user (none)"));
}

TEST_F(KubeconfigTest, TokenFileAndCertificateAuthorityResolveAgainstTheFile) {
  absl::StatusOr<RestConfig> config = LoadFile(Fixture("token-file/config"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(TokenOf(*config), "token-from-file");
  EXPECT_EQ(config->ca_pem, ReadFileOrDie(Fixture("certs/ca.crt")));
}

TEST_F(KubeconfigTest, ClientCertificateFilesAndIpv6Server) {
  absl::StatusOr<RestConfig> config = LoadFile(Fixture("cert-files/config"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://[fd00::10]:6443");
  EXPECT_EQ(config->tls_server_name, "api.on-prem.internal");
  EXPECT_EQ(config->client_cert_pem, ReadFileOrDie(Fixture("certs/client.crt")));
  EXPECT_EQ(config->client_key_pem, ReadFileOrDie(Fixture("certs/client.key")));
  EXPECT_EQ(config->ca_pem, ReadFileOrDie(Fixture("certs/ca.crt")));
}

class KubeconfigMergeTest : public KubeconfigTest {
 protected:
  absl::StatusOr<RestConfig> LoadMerged(std::string kubeconfig, std::string context = "") {
    MapEnvironment env({{"KUBECONFIG", std::move(kubeconfig)}, {"HOME", "/nonexistent"}});
    return LoadKubeconfig({.context = std::move(context)}, env, &clock_);
  }
  const std::string first_ = Fixture("merge/first.yaml");
  const std::string second_ = Fixture("merge/team/second.yaml");
  const std::string third_ = Fixture("merge/third.yaml");
  const std::string all_ = StrCat(first_, ":", second_, ":", third_);
};

TEST_F(KubeconfigMergeTest, FirstCurrentContextAndFirstDefinitionWin) {
  absl::StatusOr<RestConfig> config = LoadMerged(all_);
  ASSERT_TRUE(config.ok()) << config.status();
  // current-context "dev" from the first file; its context "dev" too (not the third file's).
  EXPECT_EQ(config->server, "https://dev.example.com");
  EXPECT_EQ(config->namespace_, "dev-ns");
  EXPECT_EQ(TokenOf(*config), "dev-token");
  EXPECT_THAT(config->description, HasSubstr(first_));
}

TEST_F(KubeconfigMergeTest, ClusterAndUserNamesDefinedTwiceKeepTheFirst) {
  absl::StatusOr<RestConfig> config = LoadMerged(all_, "shared");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://shared-from-first.example.com");
  EXPECT_EQ(TokenOf(*config), "dev-token");  // not second.yaml's "second-dev-token"
}

TEST_F(KubeconfigMergeTest, RelativePathsResolveAgainstTheDefiningFile) {
  absl::StatusOr<RestConfig> config = LoadMerged(all_, "prod");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://prod.example.com");
  EXPECT_EQ(config->ca_pem, ReadFileOrDie(Fixture("merge/team/ca.crt")));
  EXPECT_EQ(TokenOf(*config), "prod-token");
  EXPECT_THAT(config->description, HasSubstr(second_));
}

TEST_F(KubeconfigMergeTest, ContextFromALaterFileUsesEntriesFromEarlierOnes) {
  absl::StatusOr<RestConfig> config = LoadMerged(all_, "staging");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://shared-from-first.example.com");
  EXPECT_EQ(config->namespace_, "staging");
}

TEST_F(KubeconfigMergeTest, OrderDecides) {
  absl::StatusOr<RestConfig> config = LoadMerged(StrCat(third_, ":", first_, ":", second_));
  ASSERT_TRUE(config.ok()) << config.status();
  // current-context "staging" now comes from third.yaml.
  EXPECT_EQ(config->namespace_, "staging");
  config = LoadMerged(StrCat(third_, ":", first_, ":", second_), "dev");
  ASSERT_TRUE(config.ok()) << config.status();
  // third.yaml's "dev" context: cluster "shared", no user.
  EXPECT_EQ(config->server, "https://shared-from-first.example.com");
  EXPECT_EQ(config->namespace_, "third-ns");
  EXPECT_EQ(config->token, nullptr);
}

TEST_F(KubeconfigMergeTest, MissingFilesInKubeconfigAreSkippedAndDuplicatesIgnored) {
  absl::StatusOr<RestConfig> config =
      LoadMerged(StrCat("/nonexistent/a.yaml::", first_, ":", first_, ":/nonexistent/b.yaml"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://dev.example.com");
}

TEST_F(KubeconfigMergeTest, NoFileInKubeconfigExists) {
  absl::StatusOr<RestConfig> config = LoadMerged("/nonexistent/a.yaml:/nonexistent/b.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(config.status()),
              AllOf(HasSubstr("/nonexistent/a.yaml"), HasSubstr("/nonexistent/b.yaml")));
}

TEST_F(KubeconfigTest, ExplicitMissingPathIsAnError) {
  absl::StatusOr<RestConfig> config = LoadFile("/nonexistent/kubeconfig");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(config.status()), HasSubstr("/nonexistent/kubeconfig"));
}

TEST_F(KubeconfigTest, HomeKubeConfigWhenKubeconfigIsUnset) {
  TempDir home;
  ASSERT_EQ(mkdir(home.Join(".kube").c_str(), 0755), 0);
  WriteFileOrDie(home.Join(".kube/config"), WithUser("    token: home-token\n"));
  MapEnvironment env({{"HOME", home.path()}});
  absl::StatusOr<RestConfig> config = LoadKubeconfig({}, env, &clock_);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(TokenOf(*config), "home-token");

  MapEnvironment empty_home({{"HOME", "/nonexistent"}});
  config = LoadKubeconfig({}, empty_home, &clock_);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(config.status()),
              AllOf(HasSubstr("/nonexistent/.kube/config"), HasSubstr("--kubeconfig")));
}

TEST_F(KubeconfigTest, MissingContextListsTheAvailableOnes) {
  absl::StatusOr<RestConfig> config = LoadFile(Fixture("token.yaml"), "production");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(config.status()),
              AllOf(HasSubstr("context \"production\""), HasSubstr(Fixture("token.yaml")),
                    HasSubstr("available contexts: \"lab-anonymous\", \"lab-profiling\"")));
}

TEST_F(KubeconfigTest, NoCurrentContext) {
  absl::StatusOr<RestConfig> config = LoadText(
      "clusters: [{name: c, cluster: {server: https://c}}]\n"
      "contexts: [{name: a, context: {cluster: c}}, {name: b, context: {cluster: c}}]\n");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(config.status()), AllOf(HasSubstr("--context"), HasSubstr("\"a\", \"b\"")));
  EXPECT_TRUE(LoadText("clusters: [{name: c, cluster: {server: https://c}}]\n"
                       "contexts: [{name: a, context: {cluster: c}}]\n",
                       "a")
                  .ok());
}

TEST_F(KubeconfigTest, EmptyFileHasNoContexts) {
  absl::StatusOr<RestConfig> config = LoadText("");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(Message(config.status()), HasSubstr("defines no contexts"));
}

TEST_F(KubeconfigTest, BrokenYamlNamesFileAndLine) {
  TempDir dir;
  const std::string path = dir.Join("config");
  WriteFileOrDie(path,
                 "apiVersion: v1\n"
                 "clusters:\n"
                 "- name: c\n"
                 "  cluster: {server: https://c\n"
                 "users: []\n");
  absl::StatusOr<RestConfig> config = LoadFile(path);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  // yaml-cpp notices the unclosed flow mapping where the next key starts.
  EXPECT_THAT(Message(config.status()),
              HasSubstr(StrCat("kubeconfig ", path,
                               ": not valid YAML at line 5, column 6: end of map flow not found")));
}

TEST_F(KubeconfigTest, DeepNestingIsAnErrorNotAStackOverflow) {
  absl::StatusOr<RestConfig> config = LoadText(StrCat("clusters: ", std::string(100000, '[')));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(config.status()), HasSubstr("not valid YAML at line 1, column "));
  EXPECT_THAT(Message(config.status()), HasSubstr("nested too deeply"));
}

TEST_F(KubeconfigTest, BadBase64NamesTheField) {
  absl::StatusOr<RestConfig> config = LoadText(
      "clusters:\n"
      "- name: a\n"
      "  cluster: {server: https://a}\n"
      "- name: b\n"
      "  cluster:\n"
      "    server: https://b\n"
      "    certificate-authority-data: /etc/kubernetes/pki/ca.crt\n");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(config.status()),
              AllOf(HasSubstr("kubeconfig /configs/team.yaml: "
                              "clusters[1].cluster.certificate-authority-data (line 7, column 33)"),
                    HasSubstr("not valid base64"), HasSubstr("certificate-authority)")));
}

TEST_F(KubeconfigTest, Base64ThatIsNotPem) {
  absl::StatusOr<RestConfig> config = LoadText(WithUser(
      StrCat("    client-certificate-data: ", absl::Base64Escape("not a certificate"), "\n")));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(Message(config.status()),
              AllOf(HasSubstr("users[0].user.client-certificate-data"), HasSubstr("PEM")));
}

TEST_F(KubeconfigTest, CertificateWithoutKeyNamesTheUser) {
  absl::StatusOr<RestConfig> config = LoadText(
      WithUser(StrCat("    client-certificate-data: ",
                      absl::Base64Escape(ReadFileOrDie(Fixture("certs/client.crt"))), "\n")));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(config.status()), AllOf(HasSubstr("users[0].user.client-certificate-data"),
                                              HasSubstr("user \"u\" (context \"ctx\")"),
                                              HasSubstr("client certificate but no key")));

  config = LoadText(WithUser(StrCat("    client-key: ", Fixture("certs/client.key"), "\n")));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(Message(config.status()),
              AllOf(HasSubstr("users[0].user.client-key"), HasSubstr("key but no certificate")));
}

TEST_F(KubeconfigTest, DataAndFileTogetherIsAnError) {
  absl::StatusOr<RestConfig> config =
      LoadText(WithUser(StrCat("    client-certificate-data: ",
                               absl::Base64Escape(ReadFileOrDie(Fixture("certs/client.crt"))), "\n",
                               "    client-certificate: ", Fixture("certs/client.crt"), "\n",
                               "    client-key: ", Fixture("certs/client.key"), "\n")));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(Message(config.status()),
              HasSubstr("both client-certificate-data and client-certificate are set"));
}

TEST_F(KubeconfigTest, MissingReferencedFileNamesFieldAndPath) {
  absl::StatusOr<RestConfig> config = LoadText(
      "clusters: [{name: c, cluster: {server: https://c, certificate-authority: pki/ca.crt}}]\n"
      "contexts: [{name: ctx, context: {cluster: c}}]\n"
      "current-context: ctx\n");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(config.status()),
              AllOf(HasSubstr("clusters[0].cluster.certificate-authority"),
                    HasSubstr("/configs/pki/ca.crt")));

  config = LoadText(WithUser("    tokenFile: robot-token\n"));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(config.status()),
              AllOf(HasSubstr("users[0].user.tokenFile"), HasSubstr("/configs/robot-token")));
}

TEST_F(KubeconfigTest, InsecureWithCertificateAuthorityIsAnError) {
  absl::StatusOr<RestConfig> config =
      LoadText(StrCat("clusters:\n"
                      "- name: c\n"
                      "  cluster:\n"
                      "    server: https://c\n"
                      "    insecure-skip-tls-verify: true\n"
                      "    certificate-authority: ",
                      Fixture("certs/ca.crt"),
                      "\n"
                      "contexts: [{name: ctx, context: {cluster: c}}]\n"
                      "current-context: ctx\n"));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(Message(config.status()),
              AllOf(HasSubstr("insecure-skip-tls-verify"), HasSubstr("keep one")));
}

TEST_F(KubeconfigTest, BasicAuthIsUnsupported) {
  absl::StatusOr<RestConfig> config =
      LoadText(WithUser("    username: admin\n"
                        "    password: hunter2\n"));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Message(config.status()),
              AllOf(HasSubstr("users[0].user.username"), HasSubstr("user \"u\""),
                    HasSubstr("basic authentication"), Not(HasSubstr("hunter2"))));
}

TEST_F(KubeconfigTest, ProxyUrlIsUnsupported) {
  absl::StatusOr<RestConfig> config = LoadText(
      "clusters: [{name: c, cluster: {server: https://c, proxy-url: 'socks5://localhost:1080'}}]\n"
      "contexts: [{name: ctx, context: {cluster: c}}]\n"
      "current-context: ctx\n");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Message(config.status()), HasSubstr("clusters[0].cluster.proxy-url"));
}

TEST_F(KubeconfigTest, ContextNamingAMissingClusterOrUser) {
  absl::StatusOr<RestConfig> config = LoadText(
      "clusters: [{name: c, cluster: {server: https://c}}]\n"
      "contexts: [{name: ctx, context: {cluster: gone, user: u}}]\n"
      "current-context: ctx\n");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(Message(config.status()),
              AllOf(HasSubstr("cluster \"gone\""), HasSubstr("clusters: \"c\"")));
  config = LoadText(
      "clusters: [{name: c, cluster: {server: https://c}}]\n"
      "contexts: [{name: ctx, context: {cluster: c, user: gone}}]\n"
      "current-context: ctx\n");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(Message(config.status()),
              AllOf(HasSubstr("user \"gone\""), HasSubstr("defines no users")));
}

TEST_F(KubeconfigTest, StructuralMistakesNameTheField) {
  struct Case {
    std::string yaml;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"- just a list\n", "the document (line 1, column 1): must be a mapping"},
      {"kind: Pod\n", "kind (line 1, column 7): is \"Pod\", not \"Config\""},
      {"clusters: {c: {server: https://c}}\n", "clusters (line 1, column 11): must be a list"},
      {"clusters: [{cluster: {server: https://c}}]\n",
       "clusters[0] (line 1, column 12): has no name"},
      {"clusters: [{name: c, cluster: {server: [a]}}]\n",
       "clusters[0].cluster.server (line 1, column 40): must be a string"},
      {"clusters: [{name: c, cluster: {insecure-skip-tls-verify: maybe}}]\n",
       "clusters[0].cluster.insecure-skip-tls-verify (line 1, column 58): must be true or false"},
      {"clusters: [{name: c, cluster: {server: https://a}}, {name: c, cluster: {}}]\n",
       "clusters[1].name (line 1, column 60): the name \"c\" is also used by clusters[0]"},
      {"current-context: a\ncurrent-context: b\n",
       "current-context (line 2, column 1): is set twice (first at line 1, column 1)"},
      {"clusters: [{name: c, cluster: {server: https://a, server: https://b}}]\n",
       "clusters[0].cluster.server (line 1, column 51): is set twice (first at line 1, column 32)"},
      {"users: [{name: u, user: {as-groups: admins}}]\n",
       "users[0].user.as-groups (line 1, column 37): must be a list of strings"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<RestConfig> config = LoadText(c.yaml);
    ASSERT_FALSE(config.ok()) << c.yaml;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_THAT(Message(config.status()),
                HasSubstr(StrCat("kubeconfig /configs/team.yaml: ", c.expected)))
        << c.yaml;
  }
}

TEST_F(KubeconfigTest, ServerUrls) {
  auto server = [&](std::string_view url) -> absl::StatusOr<std::string> {
    absl::StatusOr<RestConfig> config =
        LoadText(StrCat("clusters: [{name: c, cluster: {server: '", url,
                        "'}}]\ncontexts: [{name: x, context: {cluster: c}}]\n"),
                 "x");
    if (!config.ok()) return config.status();
    return config->server;
  };
  EXPECT_EQ(server("https://h:6443").value_or("error"), "https://h:6443");
  EXPECT_EQ(server("h.example.com:6443").value_or("error"), "https://h.example.com:6443");
  EXPECT_EQ(server("http://127.0.0.1:8080//").value_or("error"), "http://127.0.0.1:8080");
  EXPECT_EQ(server("https://rancher/k8s/clusters/c-1/").value_or("error"),
            "https://rancher/k8s/clusters/c-1");
  EXPECT_THAT(Message(server("ftp://h").status()), HasSubstr("not an http:// or https:// URL"));
  EXPECT_EQ(server("https://[fd00::1]:6443/").value_or("error"), "https://[fd00::1]:6443");
  EXPECT_EQ(server("[::1]").value_or("error"), "https://[::1]");
  EXPECT_THAT(Message(server("https://").status()), HasSubstr("has no host"));
  EXPECT_THAT(Message(server("https://:443").status()), HasSubstr("has no host"));
  EXPECT_THAT(Message(server("https://fd00::1:6443").status()),
              HasSubstr("IPv6 address without brackets"));
  EXPECT_THAT(Message(server("https://[fd00::1:6443").status()), HasSubstr("without ']'"));
  EXPECT_THAT(Message(server("https://h:0").status()), HasSubstr("from 1 to 65535"));
  EXPECT_THAT(Message(server("https://h:65536").status()), HasSubstr("from 1 to 65535"));
  EXPECT_THAT(Message(server("https://h:").status()), HasSubstr("empty port"));
  EXPECT_THAT(Message(server("https://admin@h").status()), HasSubstr("user information"));
  EXPECT_THAT(Message(server("https://h t").status()), HasSubstr("spaces or control characters"));
  EXPECT_THAT(Message(server("https://ho[st/").status()), HasSubstr("not allowed"));
  EXPECT_THAT(Message(server("").status()), HasSubstr("has no server"));
}

// ---------------------------------------------------------------------------------------------
// In-cluster.

// A service-account JWT (not signed: nothing here checks signatures).
std::string ServiceAccountJwt(std::string_view ns, std::string_view name, std::string_view nonce) {
  return StrCat(absl::WebSafeBase64Escape(R"({"alg":"RS256","kid":"k"})"), ".",
                absl::WebSafeBase64Escape(StrCat(R"({"aud":["https://kubernetes.default.svc"],)",
                                                 R"("sub":"system:serviceaccount:)", ns, ":", name,
                                                 R"(","nonce":")", nonce, R"("})")),
                ".c2lnbmF0dXJl");
}

// A projected service-account volume as kubelet writes it: the files live in a timestamped
// directory, `..data` links to it, and each name links through `..data`. Rotate() writes a new
// directory and swaps `..data` atomically.
class ServiceAccountVolume {
 public:
  ServiceAccountVolume() {
    Write("..2026_01_01_00_00_00.000000001", ServiceAccountJwt("profiling", "operator", "1"));
    for (const char* name : {"token", "ca.crt", "namespace"}) {
      EXPECT_EQ(symlink(StrCat("..data/", name).c_str(), dir_.Join(name).c_str()), 0);
    }
  }

  void Rotate(const std::string& token) {
    const std::string version = StrCat("..2026_01_01_00_00_00.00000000", ++versions_);
    Write(version, token);
  }

  InClusterPaths paths() const {
    return {dir_.Join("token"), dir_.Join("ca.crt"), dir_.Join("namespace")};
  }
  const TempDir& dir() const { return dir_; }

 private:
  void Write(const std::string& version, const std::string& token) {
    ASSERT_EQ(mkdir(dir_.Join(version).c_str(), 0755), 0);
    WriteFileOrDie(dir_.Join(version + "/token"), token);
    WriteFileOrDie(dir_.Join(version + "/ca.crt"), ReadFileOrDie(Fixture("certs/ca.crt")));
    WriteFileOrDie(dir_.Join(version + "/namespace"), "profiling");
    ASSERT_EQ(symlink(version.c_str(), dir_.Join("..data_tmp").c_str()), 0);
    ASSERT_EQ(rename(dir_.Join("..data_tmp").c_str(), dir_.Join("..data").c_str()), 0);
  }

  TempDir dir_;
  int versions_ = 1;
};

class InClusterTest : public ::testing::Test {
 protected:
  SimulatedClock clock_;
  ServiceAccountVolume volume_;
  MapEnvironment env_ = MapEnvironment(
      {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}});
};

TEST_F(InClusterTest, ReadsTheServiceAccount) {
  absl::StatusOr<RestConfig> config = LoadInClusterConfig(env_, volume_.paths(), &clock_);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.96.0.1:443");
  EXPECT_EQ(config->ca_pem, ReadFileOrDie(Fixture("certs/ca.crt")));
  EXPECT_EQ(TokenOf(*config), ServiceAccountJwt("profiling", "operator", "1"));
  EXPECT_EQ(config->namespace_, "profiling");
  EXPECT_EQ(config->description, "in-cluster (service account \"profiling/operator\")");
  EXPECT_FALSE(config->insecure_skip_tls_verify);
}

TEST_F(InClusterTest, SeesTokenRotationThroughTheDataSymlink) {
  absl::StatusOr<RestConfig> config = LoadInClusterConfig(env_, volume_.paths(), &clock_);
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string before = ServiceAccountJwt("profiling", "operator", "1");
  EXPECT_EQ(TokenOf(*config), before);
  clock_.AdvanceNs(kNanosPerSecond);
  // Same length as the first token, so only the inode tells them apart.
  const std::string after = ServiceAccountJwt("profiling", "operator", "2");
  ASSERT_EQ(after.size(), before.size());
  volume_.Rotate(after);
  EXPECT_EQ(TokenOf(*config), after);
}

TEST_F(InClusterTest, Ipv6Host) {
  MapEnvironment env(
      {{"KUBERNETES_SERVICE_HOST", "fd00:10:96::1"}, {"KUBERNETES_SERVICE_PORT", "443"}});
  absl::StatusOr<RestConfig> config = LoadInClusterConfig(env, volume_.paths(), &clock_);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://[fd00:10:96::1]:443");
}

TEST_F(InClusterTest, PodNamespaceVariableAndMissingNamespaceFile) {
  MapEnvironment env({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                      {"KUBERNETES_SERVICE_PORT", "443"},
                      {"POD_NAMESPACE", "from-env"}});
  absl::StatusOr<RestConfig> config = LoadInClusterConfig(env, volume_.paths(), &clock_);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->namespace_, "from-env");

  InClusterPaths paths = volume_.paths();
  paths.namespace_file = volume_.dir().Join("no-such-file");
  config = LoadInClusterConfig(env_, paths, &clock_);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->namespace_, "default");
}

TEST_F(InClusterTest, NotInAPod) {
  absl::StatusOr<RestConfig> config = LoadInClusterConfig(
      MapEnvironment({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}}), volume_.paths(), &clock_);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(config.status()), HasSubstr("KUBERNETES_SERVICE_PORT"));
}

TEST_F(InClusterTest, MissingTokenOrCaNamesThePath) {
  InClusterPaths paths = volume_.paths();
  paths.token_file = volume_.dir().Join("missing-token");
  absl::StatusOr<RestConfig> config = LoadInClusterConfig(env_, paths, &clock_);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(config.status()), HasSubstr(paths.token_file));

  paths = volume_.paths();
  paths.ca_file = volume_.dir().Join("missing-ca.crt");
  config = LoadInClusterConfig(env_, paths, &clock_);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(config.status()), HasSubstr(paths.ca_file));
}

// ---------------------------------------------------------------------------------------------
// FileToken.

class FileTokenTest : public ::testing::Test {
 protected:
  // Rewrites the file in place with the same size and mtime: stat sees no change.
  void RewriteUnseen(const std::string& contents) {
    struct stat before;
    ASSERT_EQ(stat(path_.c_str(), &before), 0);
    WriteFileOrDie(path_, contents);
    const struct timespec times[2] = {before.st_atim, before.st_mtim};
    ASSERT_EQ(utimensat(AT_FDCWD, path_.c_str(), times, 0), 0);
  }

  SimulatedClock clock_;
  TempDir dir_;
  const std::string path_ = dir_.Join("token");
};

TEST_F(FileTokenTest, RereadsAfterMaxAgeAndAfterInvalidate) {
  WriteFileOrDie(path_, "  aaaa\n");
  std::shared_ptr<TokenSource> source = FileToken(path_, &clock_, 60 * kNanosPerSecond);
  EXPECT_EQ(source->Token().value_or("error"), "aaaa");

  RewriteUnseen("  bbbb\n");
  clock_.AdvanceNs(59 * kNanosPerSecond);
  EXPECT_EQ(source->Token().value_or("error"), "aaaa");  // cached: nothing stat can see
  clock_.AdvanceNs(kNanosPerSecond);
  EXPECT_EQ(source->Token().value_or("error"), "bbbb");  // max age reached

  RewriteUnseen("  cccc\n");
  EXPECT_EQ(source->Token().value_or("error"), "bbbb");
  source->Invalidate();
  EXPECT_EQ(source->Token().value_or("error"), "cccc");
}

TEST_F(FileTokenTest, ASizeChangeIsSeenAtOnce) {
  WriteFileOrDie(path_, "short");
  std::shared_ptr<TokenSource> source = FileToken(path_, &clock_);
  EXPECT_EQ(source->Token().value_or("error"), "short");
  RewriteUnseen("much-longer");
  EXPECT_EQ(source->Token().value_or("error"), "much-longer");
}

TEST_F(FileTokenTest, MissingOrEmptyFileIsAnErrorNamingThePath) {
  std::shared_ptr<TokenSource> source = FileToken(path_, &clock_);
  absl::StatusOr<std::string> token = source->Token();
  ASSERT_FALSE(token.ok());
  EXPECT_EQ(token.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(token.status()), HasSubstr(path_));

  WriteFileOrDie(path_, "\n");
  token = source->Token();
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(Message(token.status()), AllOf(HasSubstr(path_), HasSubstr("empty")));

  WriteFileOrDie(path_, "good");
  EXPECT_EQ(source->Token().value_or("error"), "good");
  ASSERT_EQ(unlink(path_.c_str()), 0);
  token = source->Token();  // the old token is not used once its file is gone
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(Message(token.status()), HasSubstr(path_));
}

TEST_F(FileTokenTest, ConcurrentCallersSeeWholeTokens) {
  WriteFileOrDie(path_, "token-1");
  std::shared_ptr<TokenSource> source = FileToken(path_, &clock_, /*max_age_ns=*/0);
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&source] {
      for (int i = 0; i < 200; ++i) {
        absl::StatusOr<std::string> token = source->Token();
        ASSERT_TRUE(token.ok()) << token.status();
        ASSERT_THAT(*token, ::testing::StartsWith("token-"));
        source->Invalidate();
      }
    });
  }
  for (auto& thread : threads) thread.join();
}

// ---------------------------------------------------------------------------------------------
// LoadDefaultConfig.

TEST_F(InClusterTest, DefaultConfigPrefersInClusterWithoutKubeconfig) {
  absl::StatusOr<RestConfig> config = LoadDefaultConfig({}, env_, volume_.paths(), &clock_);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(config->description, HasSubstr("in-cluster"));

  MapEnvironment with_kubeconfig({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                                  {"KUBERNETES_SERVICE_PORT", "443"},
                                  {"KUBECONFIG", Fixture("token.yaml")}});
  config = LoadDefaultConfig({}, with_kubeconfig, volume_.paths(), &clock_);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://lab.example.com:6443");

  config = LoadDefaultConfig({.paths = {Fixture("kind.yaml")}}, env_, volume_.paths(), &clock_);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://127.0.0.1:35275");
}

TEST(DefaultConfigTest, OutsideAPodUsesHomeKubeconfig) {
  SimulatedClock clock;
  MapEnvironment env({{"HOME", "/nonexistent"}});
  absl::StatusOr<RestConfig> config = LoadDefaultConfig({}, env, {}, &clock);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(Message(config.status()), HasSubstr("/nonexistent/.kube/config"));
}

}  // namespace
}  // namespace clusterprof::kube
