// manager::OperatorConfig: the operator's settings table, and what ManagerOptionsFrom makes of it.
#include "operator/manager/operator_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

namespace clusterprof::manager {
namespace {

using ::testing::HasSubstr;

TEST(OperatorConfigTest, DefaultsAreManagerOptionsOwn) {
  absl::StatusOr<ManagerOptions> options = ManagerOptionsFrom(OperatorConfig{}, std::nullopt);
  ASSERT_TRUE(options.ok()) << options.status();
  const ManagerOptions defaults;
  EXPECT_EQ(options->leader_election_namespace, defaults.leader_election_namespace);
  EXPECT_EQ(options->lease_duration_ns, defaults.lease_duration_ns);
  EXPECT_EQ(options->jobs.workers, defaults.jobs.workers);
  EXPECT_EQ(options->webhook.port, -1);
  EXPECT_EQ(options->jobs.sidecar_security, nullptr);  // plaintext without a CA file
  EXPECT_TRUE(options->jobs.allowed_logdirs.empty());
}

TEST(OperatorConfigTest, TheLeaseNamespaceIsTheFlagsElseThePodsElseTheDefault) {
  OperatorConfig config;
  EXPECT_EQ(ManagerOptionsFrom(config, "training")->leader_election_namespace, "training");
  config.leader_election_namespace = "ops";
  EXPECT_EQ(ManagerOptionsFrom(config, "training")->leader_election_namespace, "ops");
}

TEST(OperatorConfigTest, AllowedLogdirsAreParsedAndABadOneNamesTheFlag) {
  OperatorConfig config;
  config.allowed_logdirs = {"gs://bucket/runs", "/data/tb"};
  absl::StatusOr<ManagerOptions> options = ManagerOptionsFrom(config, std::nullopt);
  ASSERT_TRUE(options.ok()) << options.status();
  ASSERT_EQ(options->jobs.allowed_logdirs.size(), 2u);
  EXPECT_EQ(options->jobs.allowed_logdirs[0].bucket, "bucket");

  config.allowed_logdirs = {"s3://bucket/runs"};
  options = ManagerOptionsFrom(config, std::nullopt);
  ASSERT_FALSE(options.ok());
  EXPECT_THAT(options.status().message(), HasSubstr("--allowed-logdir: "));
}

TEST(OperatorConfigTest, AnUnreadableCaFileNamesTheFlag) {
  OperatorConfig config;
  config.sidecar_tls_ca_file = "/nonexistent/ca.crt";
  absl::StatusOr<ManagerOptions> options = ManagerOptionsFrom(config, std::nullopt);
  ASSERT_FALSE(options.ok());
  EXPECT_THAT(options.status().message(), HasSubstr("--sidecar-tls-ca-file: "));
}

TEST(OperatorConfigTest, EverySettingHasAUniqueFlagAndYamlKey) {
  OperatorConfig config;
  std::vector<settings::Bound> bound = settings::Bind(OperatorSettings(), &config);
  std::set<std::string> names, keys;
  for (const settings::Bound& s : bound) {
    EXPECT_TRUE(names.insert(std::string(s.name)).second) << s.name;
    EXPECT_TRUE(keys.insert(s.yaml_key).second) << s.yaml_key;
    EXPECT_FALSE(s.help.empty()) << s.name;
  }
}

TEST(OperatorConfigTest, AYamlFileSetsNestedAndConvertedSettings) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("operator_config_test_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(path) << "workers: 9\nlease_duration_seconds: 1.5\nwebhook_port: 9443\n"
                         "allowed_logdirs: [gs://b/p]\n";
  OperatorConfig config;
  ASSERT_TRUE(
      settings::LoadYamlFile(path.string(), settings::Bind(OperatorSettings(), &config)).ok());
  std::filesystem::remove(path);
  EXPECT_EQ(config.manager.jobs.workers, 9);
  EXPECT_EQ(config.manager.lease_duration_ns, 1'500'000'000);
  EXPECT_EQ(config.manager.webhook.port, 9443);
  EXPECT_EQ(config.allowed_logdirs, (std::vector<std::string>{"gs://b/p"}));
}

}  // namespace
}  // namespace clusterprof::manager
