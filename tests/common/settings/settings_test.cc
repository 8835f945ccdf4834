// settings: one declaration per setting makes the flags, the YAML reader and the docs table.
#include "common/settings/settings.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "CLI/CLI.hpp"

namespace clusterprof::settings {
namespace {

using ::testing::HasSubstr;

struct Options {
  std::string address = "0.0.0.0";
  int port = 8466;
  uint64_t max_bytes = uint64_t{64} << 20;
  bool gpu = true;
  bool verbose = false;
  double qps = 50;
  int64_t lease_ns = 15'000'000'000;
  int64_t spin_us = 0;
  std::vector<std::string> logdirs;
  std::string host;
};

constexpr Setting<Options> kTable[] = {
    {.name = "address", .field = [](auto& c) -> Field { return &c.address; }, .help = "Address"},
    {.name = "port", .field = [](auto& c) -> Field { return &c.port; }, .help = "Port to bind"},
    {.name = "max-bytes",
     .field = [](auto& c) -> Field { return &c.max_bytes; },
     .help = "Most memory"},
    {.name = "gpu",
     .field = [](auto& c) -> Field { return &c.gpu; },
     .help = "GPU tracing",
     .negatable = true},
    {.name = "verbose", .field = [](auto& c) -> Field { return &c.verbose; }, .help = "Chatty"},
    {.name = "qps", .field = [](auto& c) -> Field { return &c.qps; }, .help = "Requests"},
    {.name = "lease-seconds",
     .field = [](auto& c) -> Field { return Seconds{&c.lease_ns}; },
     .help = "Lease"},
    {.name = "spin-us",
     .field = [](auto& c) -> Field { return &c.spin_us; },
     .help = "Spin",
     .range = Range{0, 10'000}},
    {.name = "allowed-logdir",
     .field = [](auto& c) -> Field { return &c.logdirs; },
     .help = "A prefix",
     .doc = "logdir prefixes, in `docs`",
     .yaml_key = "allowed_logdirs"},
    {.name = "host-name",
     .field = [](auto& c) -> Field { return &c.host; },
     .help = "Host",
     .default_text = "`$POD_NAME`"},
};

class SettingsTest : public ::testing::Test {
 protected:
  std::string WriteYaml(const std::string& text) {
    const std::string path = (dir_ / "settings.yaml").string();
    std::ofstream(path) << text;
    return path;
  }

  // Parses `args` as the program's command line and resolves the settings.
  absl::StatusOr<Options> Parse(std::vector<std::string> args, bool* table = nullptr) {
    CLI::App app{"test"};
    CommandLine<Options> command_line(&app, kTable, {.config_file = true});
    args.insert(args.begin(), "program");
    std::vector<const char*> argv;
    for (const std::string& arg : args) argv.push_back(arg.c_str());
    app.parse(static_cast<int>(argv.size()), argv.data());
    if (table != nullptr) *table = command_line.table_requested();
    return command_line.Resolve();
  }

  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("settings_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
};

TEST_F(SettingsTest, NothingGivenKeepsTheStructsDefaults) {
  absl::StatusOr<Options> options = Parse({});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->port, 8466);
  EXPECT_TRUE(options->gpu);
  EXPECT_EQ(options->lease_ns, 15'000'000'000);
  EXPECT_TRUE(options->logdirs.empty());
}

TEST_F(SettingsTest, FlagsSetEveryKindOfField) {
  absl::StatusOr<Options> options =
      Parse({"--address", "127.0.0.1", "--port", "9", "--max-bytes", "1024", "--no-gpu",
             "--verbose", "--qps", "2.5", "--lease-seconds", "0.25", "--allowed-logdir", "/a",
             "--allowed-logdir", "gs://b/c", "--host-name", "h"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->address, "127.0.0.1");
  EXPECT_EQ(options->port, 9);
  EXPECT_EQ(options->max_bytes, 1024u);
  EXPECT_FALSE(options->gpu);
  EXPECT_TRUE(options->verbose);
  EXPECT_DOUBLE_EQ(options->qps, 2.5);
  EXPECT_EQ(options->lease_ns, 250'000'000);
  EXPECT_EQ(options->logdirs, (std::vector<std::string>{"/a", "gs://b/c"}));
  EXPECT_EQ(options->host, "h");
}

TEST_F(SettingsTest, TheFileSetsWhatNoFlagGives) {
  const std::string path =
      WriteYaml("port: 1234\ngpu: false\nlease_seconds: 2\nallowed_logdirs: [/x, /y]\nqps: 7\n");
  absl::StatusOr<Options> options = Parse({"--config", path, "--port", "99", "--gpu"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->port, 99);  // the flag wins
  EXPECT_TRUE(options->gpu);     // so does a bool flag given over the file's false
  EXPECT_EQ(options->lease_ns, 2'000'000'000);
  EXPECT_EQ(options->logdirs, (std::vector<std::string>{"/x", "/y"}));
  EXPECT_DOUBLE_EQ(options->qps, 7);
  EXPECT_EQ(options->address, "0.0.0.0");  // neither: the default
}

TEST_F(SettingsTest, AListKeyTakesOneScalarToo) {
  absl::StatusOr<Options> options = Parse({"--config", WriteYaml("allowed_logdirs: /only\n")});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->logdirs, (std::vector<std::string>{"/only"}));
}

TEST_F(SettingsTest, FileMistakesNameTheKeyAndTheFile) {
  const std::string unknown = WriteYaml("prot: 1\n");
  absl::StatusOr<Options> options = Parse({"--config", unknown});
  ASSERT_FALSE(options.ok());
  EXPECT_THAT(options.status().message(), HasSubstr("unknown setting 'prot'"));
  EXPECT_THAT(options.status().message(), HasSubstr("port"));  // the known ones are listed
  EXPECT_THAT(options.status().message(), HasSubstr(unknown));

  options = Parse({"--config", WriteYaml("port: [1, 2]\n")});
  ASSERT_FALSE(options.ok());
  EXPECT_THAT(options.status().message(),
              HasSubstr("setting 'port' has a value of the wrong type (line 1)"));

  options = Parse({"--config", WriteYaml("spin_us: 20000\n")});
  ASSERT_FALSE(options.ok());
  EXPECT_THAT(options.status().message(),
              HasSubstr("spin_us is 20000; it must be between 0 and 10000"));

  options = Parse({"--config", (dir_ / "absent.yaml").string()});
  ASSERT_FALSE(options.ok());
  EXPECT_THAT(options.status().message(), HasSubstr("cannot read the config file"));
}

TEST_F(SettingsTest, AFlagOutOfRangeIsAUsageError) {
  EXPECT_THROW((void)Parse({"--spin-us", "20000"}), CLI::ValidationError);
  absl::StatusOr<Options> options = Parse({"--spin-us", "10000"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->spin_us, 10'000);
}

TEST_F(SettingsTest, SettingsTableFlagAsksForTheTable) {
  bool table = false;
  ASSERT_TRUE(Parse({"--settings-table"}, &table).ok());
  EXPECT_TRUE(table);
  ASSERT_TRUE(Parse({}, &table).ok());
  EXPECT_FALSE(table);
}

// What a main gets: the settings, or the exit code of a program that is done.
TEST_F(SettingsTest, ParseGivesTheSettingsOrTheExitCode) {
  auto parse = [](std::vector<std::string> args, int* exit_code) {
    CLI::App app{"test"};
    app.name("program");
    CommandLine<Options> command_line(&app, kTable, {.config_file = true});
    args.insert(args.begin(), "program");
    std::vector<const char*> argv;
    for (const std::string& arg : args) argv.push_back(arg.c_str());
    return command_line.Parse(static_cast<int>(argv.size()), argv.data(), exit_code);
  };
  int exit_code = -1;
  std::optional<Options> options = parse({"--port", "7"}, &exit_code);
  ASSERT_TRUE(options.has_value());
  EXPECT_EQ(options->port, 7);
  EXPECT_FALSE(parse({"--port", "seven"}, &exit_code).has_value());
  EXPECT_EQ(exit_code, kExitUsage);
  exit_code = -1;
  EXPECT_FALSE(parse({"--settings-table"}, &exit_code).has_value());
  EXPECT_EQ(exit_code, 0);
  exit_code = -1;
  EXPECT_FALSE(parse({"--help"}, &exit_code).has_value());
  EXPECT_EQ(exit_code, 0);
  exit_code = -1;
  EXPECT_FALSE(parse({"--config", WriteYaml("port: x\n")}, &exit_code).has_value());
  EXPECT_EQ(exit_code, kExitUsage);
}

TEST_F(SettingsTest, TheDocsTableShowsEachSettingOnce) {
  Options defaults;
  const std::string table = MarkdownTable(Bind<Options>(kTable, &defaults), /*yaml=*/true);
  EXPECT_THAT(table, HasSubstr("| flag | YAML | default | meaning |\n"));
  EXPECT_THAT(table, HasSubstr("| `--address` | `address` | `0.0.0.0` | address |\n"));
  EXPECT_THAT(table, HasSubstr("| `--port` | `port` | 8466 | port to bind |\n"));
  EXPECT_THAT(table, HasSubstr("| `--max-bytes` | `max_bytes` | 64 MiB | most memory |\n"));
  // A name's capital stays: "GPU" is not "gPU".
  EXPECT_THAT(table, HasSubstr("| `--gpu` / `--no-gpu` | `gpu` | on | GPU tracing |\n"));
  EXPECT_THAT(table, HasSubstr("| `--verbose` | `verbose` | off | chatty |\n"));
  EXPECT_THAT(table, HasSubstr("| `--lease-seconds` | `lease_seconds` | 15 | lease |\n"));
  EXPECT_THAT(table, HasSubstr("| `--spin-us` | `spin_us` | 0 | spin (0-10000) |\n"));
  EXPECT_THAT(table, HasSubstr("| `--allowed-logdir` (repeatable) | `allowed_logdirs` (list) | "
                               "none | logdir prefixes, in `docs` |\n"));
  EXPECT_THAT(table, HasSubstr("| `--host-name` | `host_name` | `$POD_NAME` | host |\n"));
  const std::string flags_only = MarkdownTable(Bind<Options>(kTable, &defaults), false);
  EXPECT_THAT(flags_only, HasSubstr("| `--port` | 8466 | port to bind |\n"));
  EXPECT_THAT(flags_only, ::testing::Not(HasSubstr("--config")));
}

}  // namespace
}  // namespace clusterprof::settings
