// A kubeconfig whose user is an exec credential plugin, against a real kube-apiserver: the
// plugin (a /bin/sh script) prints a token the server's static token file knows, and requests
// through the REST client succeed; a plugin that prints a token the server does not know gets a
// clear 401; a plugin whose first token the server refuses is run again after the 401 and the
// request goes through with the new one.
#include <sys/stat.h>

#include <string>

#include "absl/status/status.h"
#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "operator/kube/api_error.h"
#include "operator/kube/config.h"
#include "operator/kube/rest_client.h"
#include "tests/operator/kube/kube_fixture.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::kube {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

class ExecCredentialIntegrationTest : public KubeFixture {
 protected:
  // Writes a plugin that prints the token `token_shell` expands to (it may use $n, the run's
  // number, and $CLUSTERPROF_TEST_TOKEN, which the kubeconfig's exec env sets to the admin
  // token), and a kubeconfig whose user runs it; returns the kubeconfig's path.
  std::string WriteKubeconfig(std::string_view token_shell) {
    const std::string plugin = dir_.Join("token-plugin");
    testing::WriteFileOrDie(
        plugin,
        StrCat("#!/bin/sh\n"
               "n=$(( $(cat '",
               dir_.Join("runs"), "' 2>/dev/null || echo 0) + 1 ))\necho $n > '", dir_.Join("runs"),
               "'\n"
               "case \"$KUBERNETES_EXEC_INFO\" in *'\"server\":\"",
               plane_->url(),
               "\"'*) ;; *) echo 'no cluster info' >&2; exit 9;; esac\n"
               "printf '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":"
               "\"ExecCredential\",\"status\":{\"token\":\"%s\"}}' \"",
               token_shell, "\"\n"));
    EXPECT_EQ(chmod(plugin.c_str(), 0755), 0);
    const std::string kubeconfig = dir_.Join("kubeconfig");
    testing::WriteFileOrDie(kubeconfig, StrCat("apiVersion: v1\n"
                                               "kind: Config\n"
                                               "clusters:\n"
                                               "- name: test\n"
                                               "  cluster:\n"
                                               "    server: \"",
                                               plane_->url(),
                                               "\"\n"
                                               "    certificate-authority: \"",
                                               plane_->ca_file(),
                                               "\"\n"
                                               "users:\n"
                                               "- name: plugin-user\n"
                                               "  user:\n"
                                               "    exec:\n"
                                               "      apiVersion: client.authentication.k8s.io/v1\n"
                                               "      command: ./token-plugin\n"
                                               "      interactiveMode: Never\n"
                                               "      provideClusterInfo: true\n"
                                               "      env:\n"
                                               "      - name: CLUSTERPROF_TEST_TOKEN\n"
                                               "        value: \"",
                                               plane_->admin_token(),
                                               "\"\n"
                                               "contexts:\n"
                                               "- name: test\n"
                                               "  context: {cluster: test, user: plugin-user}\n"
                                               "current-context: test\n"));
    return kubeconfig;
  }

  // The REST client the kubeconfig describes.
  std::unique_ptr<RestClient> ClientFor(const std::string& kubeconfig) {
    KubeconfigOptions options{.paths = {kubeconfig}};
    options.exec.stdin_is_terminal = [] { return false; };
    absl::StatusOr<RestConfig> config = LoadKubeconfig(options, MapEnvironment{{}}, &clock_);
    EXPECT_TRUE(config.ok()) << config.status();
    if (!config.ok()) return nullptr;
    absl::StatusOr<std::unique_ptr<RestClient>> client =
        RestClient::Create(*std::move(config), &clock_, Unlimited());
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  int Runs() {
    return std::stoi(std::string(StripAsciiWhitespace(testing::ReadFileOrDie(dir_.Join("runs")))));
  }

  testing::TempDir dir_;
};

TEST_F(ExecCredentialIntegrationTest, ThePluginsTokenListsNamespaces) {
  std::unique_ptr<RestClient> client = ClientFor(WriteKubeconfig("$CLUSTERPROF_TEST_TOKEN"));
  ASSERT_NE(client, nullptr);
  absl::StatusOr<ObjectList> namespaces = client->List(Namespaces(), "");
  ASSERT_TRUE(namespaces.ok()) << namespaces.status();
  bool found = false;
  for (const web::json::value& item : namespaces->items) {
    found |= item.at("metadata").at("name").as_string() == ns_;
  }
  EXPECT_TRUE(found) << "the test's namespace " << ns_ << " is listed";
  // A second request uses the cached token: the plugin ran once, when the config was loaded.
  ASSERT_TRUE(client->List(Namespaces(), "").ok());
  EXPECT_EQ(Runs(), 1);
}

TEST_F(ExecCredentialIntegrationTest, ATokenTheServerDoesNotKnowIsAClear401) {
  std::unique_ptr<RestClient> client = ClientFor(WriteKubeconfig("not-a-known-token"));
  ASSERT_NE(client, nullptr);
  const absl::Status status = client->List(Namespaces(), "").status();
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(IsUnauthorized(status)) << status;
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("Unauthorized"), Not(HasSubstr("not-a-known-token"))));
  // After the 401 the plugin ran again (its token might have been revoked), once.
  EXPECT_EQ(Runs(), 2);
}

TEST_F(ExecCredentialIntegrationTest, AFirstTokenRefusedWith401IsReplacedByRunningThePluginAgain) {
  std::unique_ptr<RestClient> client = ClientFor(
      WriteKubeconfig("$(if [ $n -eq 1 ]; then echo revoked; else echo $CLUSTERPROF_TEST_TOKEN; "
                      "fi)"));
  ASSERT_NE(client, nullptr);
  absl::StatusOr<ObjectList> namespaces = client->List(Namespaces(), "");
  ASSERT_TRUE(namespaces.ok()) << namespaces.status();
  EXPECT_EQ(Runs(), 2);
}

}  // namespace
}  // namespace clusterprof::kube
